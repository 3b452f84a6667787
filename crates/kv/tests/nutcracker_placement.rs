//! Pins kvswitch's key placement to real twemproxy.
//!
//! Starts memcached instances and one nutcracker with several pools (distributions, hash
//! functions, weights, explicit names, a server on port 11211), stores keys through each pool,
//! asks every memcached directly which keys it holds, and checks that `Ring::locate` names the
//! same server for every key. Requires `nutcracker` and `memcached`; fails if they are missing.

use std::fmt::Write as _;
use std::fs;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::thread;
use std::time::Instant;

use kv::{ketama_name, Distribution, HashFn, Ring, Server};
use testbed::local::{self, Ports, Proc, TempDir};

/// Keys stored through each pool.
const KEYS_PER_POOL: usize = 10_000;

/// One memcached server, as twemproxy's configuration names it.
#[derive(Clone)]
struct Backend {
    host: &'static str,
    port: u16,
}

impl Backend {
    fn addr(&self) -> SocketAddr {
        let ip: Ipv4Addr = self
            .host
            .parse()
            .unwrap_or_else(|e| panic!("bad host {}: {e}", self.host));
        SocketAddr::from((ip, self.port))
    }
}

/// A pool to compare: a twemproxy pool definition and the same pool as a kvswitch `Ring`.
struct Shape {
    label: String,
    dist: Distribution,
    hash: HashFn,
    /// (backend, weight, explicit name).
    servers: Vec<(Backend, u32, Option<&'static str>)>,
    listen: SocketAddr,
}

impl Shape {
    fn yaml(&self, out: &mut String) {
        let _ = writeln!(out, "{}:", self.label);
        let _ = writeln!(out, "  listen: {}", self.listen);
        let _ = writeln!(out, "  distribution: {}", self.dist);
        let _ = writeln!(out, "  hash: {}", self.hash);
        let _ = writeln!(out, "  timeout: 10000");
        let _ = writeln!(out, "  auto_eject_hosts: false");
        let _ = writeln!(out, "  servers:");
        for (b, weight, name) in &self.servers {
            let _ = write!(out, "   - {}:{}:{weight}", b.host, b.port);
            if let Some(name) = name {
                let _ = write!(out, " {name}");
            }
            out.push('\n');
        }
    }

    fn ring(&self) -> Ring {
        let servers: Vec<Server> = self
            .servers
            .iter()
            .map(|(b, weight, name)| Server::new(ketama_name(b.host, b.port, *name), *weight))
            .collect();
        Ring::new(self.dist, self.hash, &servers)
            .unwrap_or_else(|e| panic!("{}: cannot build ring: {e}", self.label))
    }
}

/// Deterministic keys for pool `pool`: mixed lengths up to 250 bytes, printable ASCII and bytes
/// `0x80..=0xff` (which some of twemproxy's hashes sign-extend), never space or control bytes.
fn keys(pool: usize) -> Vec<Vec<u8>> {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64 ^ (pool as u64).wrapping_mul(0xd1b5_4a32_d192_ed03);
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..KEYS_PER_POOL)
        .map(|i| {
            let mut key = format!("{pool}.{i}:").into_bytes();
            let r = next();
            let len = match r % 10 {
                0 => 200 + (r >> 8) % 40,
                1..=3 => (r >> 8) % 4,
                _ => 4 + (r >> 8) % 40,
            };
            let high = r % 3 == 0;
            for _ in 0..len {
                let x = next();
                let b = if high && x % 4 == 0 {
                    0x80 + (x >> 8) % 0x80
                } else {
                    0x21 + (x >> 8) % 0x5e
                };
                key.push(b as u8);
            }
            key.truncate(250);
            key
        })
        .collect()
}

/// Compares one pool; returns a failure description, or `None` when every key matched.
fn check(shape: &Shape, pool: usize) -> Option<String> {
    let keys = keys(pool);
    if let Err(e) = local::store(shape.listen, &keys) {
        return Some(format!("{}: {e:#}", shape.label));
    }
    let servers: Vec<SocketAddr> = shape.servers.iter().map(|(b, _, _)| b.addr()).collect();
    let owner = match local::owners(&servers, &keys) {
        Ok(owner) => owner,
        Err(e) => return Some(format!("{}: {e:#}", shape.label)),
    };
    let ring = shape.ring();
    let mut bad = 0usize;
    let mut examples = String::new();
    for (key, owner) in keys.iter().zip(&owner) {
        let ours = ring.locate(key);
        if *owner != Some(ours) {
            bad += 1;
            if bad <= 5 {
                let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
                let _ = write!(
                    examples,
                    "\n  key {hex}: twemproxy {owner:?}, kvswitch {ours}"
                );
            }
        }
    }
    eprintln!(
        "{:<30} {:>6} keys, {:>6} mismatches",
        shape.label,
        keys.len(),
        bad
    );
    (bad > 0).then(|| {
        format!(
            "{}: {bad} of {} keys differ{examples}",
            shape.label,
            keys.len()
        )
    })
}

fn start_memcached(bin: &std::path::Path, backend: &Backend) -> Proc {
    local::memcached(bin, backend.addr()).unwrap_or_else(|e| panic!("{e:#}"))
}

#[test]
fn placement_matches_nutcracker() {
    let started = Instant::now();
    let need = |program| {
        local::require(program).unwrap_or_else(|e| {
            panic!("{e:#}; this test pins key placement against real twemproxy and memcached")
        })
    };
    let nutcracker = need("nutcracker");
    let memcached = need("memcached");
    let dir = TempDir::new("kvswitch-nutcracker").unwrap_or_else(|e| panic!("{e:#}"));
    let lo = Ipv4Addr::LOCALHOST;
    let ports = Ports::default();
    let pick = || {
        ports
            .pick(IpAddr::V4(lo))
            .unwrap_or_else(|e| panic!("{e:#}"))
    };

    let on_lo: Vec<Backend> = (0..3)
        .map(|_| Backend {
            host: "127.0.0.1",
            port: pick(),
        })
        .collect();
    // A server on the default port, on another loopback address, exercises the rule that
    // twemproxy leaves port 11211 out of the ketama name.
    let default_port = Backend {
        host: "127.0.0.2",
        port: kv::MEMCACHED_DEFAULT_PORT,
    };
    let have_default_port = TcpListener::bind(default_port.addr()).is_ok();
    if !have_default_port {
        eprintln!(
            "warning: {} is busy; the port-11211 naming pool is skipped",
            default_port.addr()
        );
    }

    let mut backends = on_lo.clone();
    if have_default_port {
        backends.push(default_port.clone());
    }
    ports.release();
    let _memcached: Vec<Proc> = backends
        .iter()
        .map(|b| start_memcached(&memcached, b))
        .collect();

    let equal = |_: usize| 1;
    let weighted = |i: usize| i as u32 + 1;
    let pool = |label: &str, dist, hash, weight: &dyn Fn(usize) -> u32| Shape {
        label: label.to_owned(),
        dist,
        hash,
        servers: on_lo
            .iter()
            .enumerate()
            .map(|(i, b)| (b.clone(), weight(i), None))
            .collect(),
        listen: SocketAddr::from((lo, pick())),
    };
    use Distribution::{Ketama, Modula};
    let mut shapes = vec![
        pool("ketama_md5_equal", Ketama, HashFn::Md5, &equal),
        pool("ketama_md5_weighted", Ketama, HashFn::Md5, &weighted),
        pool("ketama_fnv1a_64_equal", Ketama, HashFn::Fnv1a64, &equal),
        pool("modula_md5_weighted", Modula, HashFn::Md5, &weighted),
        pool("modula_fnv1a_64_equal", Modula, HashFn::Fnv1a64, &equal),
    ];
    let mut named = pool("ketama_md5_named", Ketama, HashFn::Md5, &weighted);
    for (server, name) in named.servers.iter_mut().zip(["alpha", "beta", "gamma"]) {
        server.2 = Some(name);
    }
    shapes.push(named);
    // Modula slots follow twemproxy's name-sorted server order ("mid" < "zeta" < "alpha"),
    // not the listed order.
    let mut modula_named = pool("modula_md5_named", Modula, HashFn::Md5, &weighted);
    for (server, name) in modula_named
        .servers
        .iter_mut()
        .zip(["zeta", "alpha", "mid"])
    {
        server.2 = Some(name);
    }
    shapes.push(modula_named);
    if have_default_port {
        let mut port_rule = pool("ketama_md5_port_11211", Ketama, HashFn::Md5, &equal);
        port_rule.servers[2].0 = default_port.clone();
        shapes.push(port_rule);
    }
    // Every other hash function, on a weighted ketama pool (ketama reads all 32 bits).
    for hash in HashFn::ALL {
        if hash != HashFn::Md5 && hash != HashFn::Fnv1a64 {
            let label = format!("ketama_{hash}_weighted");
            shapes.push(pool(&label, Ketama, hash, &weighted));
        }
    }

    let mut yaml = String::new();
    for shape in &shapes {
        shape.yaml(&mut yaml);
    }
    let conf = dir.path().join("nutcracker.yml");
    fs::write(&conf, &yaml).unwrap_or_else(|e| panic!("write {conf:?}: {e}"));
    let stats_port = pick();
    ports.release();
    let listen: Vec<SocketAddr> = shapes.iter().map(|s| s.listen).collect();
    let _proxy = local::nutcracker(&nutcracker, &conf, dir.path(), stats_port, &listen)
        .unwrap_or_else(|e| panic!("{e:#}"));

    let failures: Vec<String> = thread::scope(|s| {
        let handles: Vec<_> = shapes
            .iter()
            .enumerate()
            .map(|(i, shape)| s.spawn(move || check(shape, i)))
            .collect();
        handles
            .into_iter()
            .filter_map(|h| match h.join() {
                Ok(result) => result,
                Err(_) => Some("a pool check panicked (see above)".to_owned()),
            })
            .collect()
    });

    eprintln!(
        "{} pools, {} keys each, in {:?}",
        shapes.len(),
        KEYS_PER_POOL,
        started.elapsed()
    );
    if !failures.is_empty() {
        panic!(
            "kvswitch placement differs from twemproxy:\n{}",
            failures.join("\n")
        );
    }
}
