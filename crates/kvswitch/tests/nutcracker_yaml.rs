//! A nutcracker YAML file read by `load_nutcracker` places keys where nutcracker itself does.
//!
//! Writes one file with three pools (ketama md5 with weights and names; modula fnv1a_64 over
//! servers spelled `localhost` on ports other than 11211; ketama with a `{}` hash tag, with
//! nutcracker's failure and tuning keys spread over them), runs real nutcracker on that file in
//! front of real memcached servers on free loopback ports, stores keys through every pool, asks
//! each memcached which keys it holds, and checks that the ring built from each loaded
//! `PoolSpec` names that server for every key. Requires `nutcracker` and `memcached`.

use std::fmt::Write as _;
use std::fs;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use config::nutcracker::load_nutcracker;
use kv::{Distribution, HashFn};
use switch::pool::{PoolSpec, DEFAULT_TIMEOUT};
use testbed::local::{self, Ports, Proc, TempDir};

/// Keys stored through each pool.
const KEYS_PER_POOL: usize = 3_000;
/// Distinct hash tags in the tagged pool's keys.
const TAGS: usize = 37;

fn must<T>(r: anyhow::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{e:#}"))
}

/// The keys stored through pool `label`: numbered, with lengths that vary.
fn plain_keys(label: &str) -> Vec<Vec<u8>> {
    (0..KEYS_PER_POOL)
        .map(|i| format!("{label}.{i}.{}", "x".repeat(i % 23)).into_bytes())
        .collect()
}

/// Keys for the `{}`-tagged pool: untagged, tagged (twice as many, so the tags matter), with
/// an empty tag, an unclosed tag, and a close before the open; only tagged ones are placed by
/// their tag.
fn tagged_keys() -> Vec<Vec<u8>> {
    (0..KEYS_PER_POOL)
        .map(|i| {
            let tag = i % TAGS;
            match i % 6 {
                0 => format!("tagged.{i}"),
                1 | 2 => format!("tagged.{i}.{{user{tag}}}"),
                3 => format!("tagged{{}}.{i}"),
                4 => format!("tagged{{open.{i}"),
                _ => format!("tagged}}{{user{tag}}}.{i}"),
            }
            .into_bytes()
        })
        .collect()
}

/// Stores `keys` through nutcracker's `pool`, reads back which memcached holds each, and
/// compares with the loaded pool's ring. Returns the owners (indexes into `pool.servers`)
/// and a failure description when any key differs.
fn compare(pool: &PoolSpec, keys: &[Vec<u8>]) -> (Vec<usize>, Option<String>) {
    must(local::store(pool.listen, keys));
    let servers: Vec<SocketAddr> = pool.servers.iter().map(|s| s.addr).collect();
    let owners = must(local::owners(&servers, keys));
    let ring = pool
        .ring()
        .unwrap_or_else(|e| panic!("{}: ring: {e}", pool.name));
    let mut found = Vec::with_capacity(keys.len());
    let mut bad = 0usize;
    let mut examples = String::new();
    for (key, owner) in keys.iter().zip(&owners) {
        let Some(owner) = *owner else {
            panic!(
                "{}: key {:?} is on no server after STORED",
                pool.name,
                String::from_utf8_lossy(key)
            );
        };
        let ours = ring.locate(pool.hashed_key(key));
        if ours != owner {
            bad += 1;
            if bad <= 5 {
                let _ = write!(
                    examples,
                    "\n  key {:?}: nutcracker {owner}, kvswitch {ours}",
                    String::from_utf8_lossy(key)
                );
            }
        }
        found.push(owner);
    }
    eprintln!(
        "{:<10} {:>6} keys, {:>4} mismatches",
        pool.name,
        keys.len(),
        bad
    );
    let failure = (bad > 0).then(|| format!("{}: {bad} keys differ{examples}", pool.name));
    (found, failure)
}

#[test]
fn loaded_pools_place_keys_as_nutcracker() {
    let need = |program| {
        local::require(program)
            .unwrap_or_else(|e| panic!("{e:#}; this test runs real nutcracker and memcached"))
    };
    let nutcracker = need("nutcracker");
    let memcached = need("memcached");
    let dir = must(TempDir::new("kvswitch-nutcracker-yaml"));
    let ports = Ports::default();
    let ip4 = IpAddr::V4(Ipv4Addr::LOCALHOST);
    // `localhost` as this machine resolves it: nutcracker and kvswitch both take the first
    // address the resolver gives.
    let localhost = ("localhost", 1)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .map(|a| a.ip())
        .unwrap_or_else(|| panic!("`localhost` does not resolve on this machine"));

    let pick = |ip| must(ports.pick(ip));
    let on_ip4: Vec<u16> = (0..3).map(|_| pick(ip4)).collect();
    let on_localhost: Vec<u16> = (0..3).map(|_| pick(localhost)).collect();
    let listen = [pick(ip4), pick(localhost), pick(ip4)];
    let stats_port = pick(ip4);

    let yaml = format!(
        "\
# Written by the nutcracker_yaml test.
weighted:
  listen: 127.0.0.1:{l0}
  hash: md5
  distribution: ketama
  timeout: 2000
  auto_eject_hosts: false
  server_retry_timeout: 5000
  server_failure_limit: 3
  server_connections: 2
  backlog: 512
  preconnect: true
  redis: false
  servers:
   - 127.0.0.1:{a0}:1 alpha
   - 127.0.0.1:{a1}:2 beta
   - 127.0.0.1:{a2}:3

hostnames:
  listen: localhost:{l1}
  hash: fnv1a_64
  distribution: modula
  client_connections: 100
  servers:
   - localhost:{b0}:1
   - localhost:{b1}:1
   - localhost:{b2}:2

tagged:
  listen: 127.0.0.1:{l2}
  hash: fnv1a_32
  hash_tag: \"{{}}\"
  distribution: ketama
  timeout: 0
  servers:
   - 127.0.0.1:{a0}:1
   - 127.0.0.1:{a1}:1
   - 127.0.0.1:{a2}:1
",
        l0 = listen[0],
        l1 = listen[1],
        l2 = listen[2],
        a0 = on_ip4[0],
        a1 = on_ip4[1],
        a2 = on_ip4[2],
        b0 = on_localhost[0],
        b1 = on_localhost[1],
        b2 = on_localhost[2],
    );
    let conf = dir.path().join("nutcracker.yml");
    fs::write(&conf, &yaml).unwrap_or_else(|e| panic!("write {conf:?}: {e}"));

    // What kvswitch reads from the file.
    let pools = load_nutcracker(&conf).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["weighted", "hostnames", "tagged"]);
    let [weighted, hostnames, tagged] = &pools[..] else {
        unreachable!()
    };
    assert_eq!(weighted.listen, SocketAddr::new(ip4, listen[0]));
    assert_eq!(
        (weighted.distribution, weighted.hash, weighted.hash_tag),
        (Distribution::Ketama, HashFn::Md5, None)
    );
    assert_eq!(weighted.timeout, Duration::from_millis(2000));
    assert!(!weighted.auto_eject_hosts);
    assert_eq!(weighted.server_retry_timeout, Duration::from_millis(5000));
    assert_eq!(weighted.server_failure_limit, 3);
    assert_eq!(weighted.server_connections, 2);
    let ring_names: Vec<String> = weighted.servers.iter().map(|s| s.ring_name()).collect();
    assert_eq!(
        ring_names,
        ["alpha", "beta", &format!("127.0.0.1:{}", on_ip4[2])]
    );
    assert_eq!(
        weighted
            .servers
            .iter()
            .map(|s| s.weight)
            .collect::<Vec<_>>(),
        [1, 2, 3]
    );

    assert_eq!(hostnames.listen, SocketAddr::new(localhost, listen[1]));
    assert_eq!(
        (hostnames.distribution, hostnames.hash),
        (Distribution::Modula, HashFn::Fnv1a64)
    );
    for (s, &port) in hostnames.servers.iter().zip(&on_localhost) {
        assert_eq!(s.host, "localhost");
        assert_eq!(s.addr, SocketAddr::new(localhost, port));
        assert_eq!(s.ring_name(), format!("localhost:{port}"));
    }

    assert_eq!(tagged.hash_tag, Some(*b"{}"));
    assert_eq!(tagged.hash, HashFn::Fnv1a32);
    // nutcracker's 0 is "no timeout"; kvswitch bounds requests with its default.
    assert_eq!(tagged.timeout, DEFAULT_TIMEOUT);

    // The same file served by nutcracker, in front of real memcached servers.
    ports.release();
    let servers: Vec<SocketAddr> = on_ip4
        .iter()
        .map(|&p| SocketAddr::new(ip4, p))
        .chain(on_localhost.iter().map(|&p| SocketAddr::new(localhost, p)))
        .collect();
    let _memcached: Vec<Proc> = servers
        .iter()
        .map(|&addr| must(local::memcached(&memcached, addr)))
        .collect();
    let listening: Vec<SocketAddr> = pools.iter().map(|p| p.listen).collect();
    let _nutcracker = must(local::nutcracker(
        &nutcracker,
        &conf,
        dir.path(),
        stats_port,
        &listening,
    ));

    let mut failures = Vec::new();
    for pool in [weighted, hostnames] {
        let (owners, failure) = compare(pool, &plain_keys(&pool.name));
        failures.extend(failure);
        // Every server got keys: the placement comparison was not trivially one-sided.
        for i in 0..pool.servers.len() {
            assert!(
                owners.contains(&i),
                "{}: server {i} holds no key",
                pool.name
            );
        }
    }
    let keys = tagged_keys();
    let (owners, failure) = compare(tagged, &keys);
    failures.extend(failure);
    // In nutcracker too, keys with one tag share a server: the tag was in effect on both sides.
    for tag in 0..TAGS {
        let tag_text = format!("{{user{tag}}}");
        let held: Vec<usize> = keys
            .iter()
            .zip(&owners)
            .filter(|(k, _)| String::from_utf8_lossy(k).contains(&tag_text))
            .map(|(_, &o)| o)
            .collect();
        assert!(held.len() > 1, "tag {tag_text} has too few keys");
        assert!(
            held.iter().all(|&o| o == held[0]),
            "keys tagged {tag_text} are spread over servers {held:?}"
        );
    }
    assert!(
        failures.is_empty(),
        "kvswitch placement differs from nutcracker:\n{}",
        failures.join("\n")
    );
}
