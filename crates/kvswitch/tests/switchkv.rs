//! SwitchKV on the testbed (`l3`): three `kvswitch node --role backend` servers, one cache node
//! (`kvswitch node --role cache`) on its own host, and kvswitch steering reads of the cache
//! node's keys to it through `kv_steer` entries the cache node installs over the API.
//!
//! While UDP clients in two namespaces record a history on hot keys:
//! - the backends report the keys, the cache node admits them and installs their entries, and
//!   reads of them are answered by the cache node;
//! - the cache node hangs (SIGSTOP) for longer than its lease: the switch finds it silent and
//!   removes its entries, writes to its keys wait out the lease at their backends, and once it
//!   goes on it serves nothing whose lease ended;
//! - a backend crashes and starts again with nothing (recorded in the history as a write of
//!   "absent" to each of its keys between the crash and its return): its cache node drops its
//!   keys before the backend serves anything;
//! - the cache node dies: its entries are removed and every read is answered by the backends.
//!
//! With two cache nodes, each serves the keys of its own backends; an update or an instant
//! report a client sends to a cache node's control port without the testbed's key is refused,
//! and readers keep getting the real value.
//!
//! The history checker finds no read of a value older than an acknowledged write.
//!
//! Needs root (network namespaces).

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use testbed::history::{Kind, Op};
use testbed::history_load::{self, Clock, Load, Mix, Transport};

/// The testbed's prefix, with a subnet of its own.
const PREFIX: &str = "kskv";
const SERVERS: [&str; 3] = ["s1", "s2", "s3"];
const CACHE: &str = "k1";
/// The backend that crashes.
const VICTIM: &str = "s1";
const LEASE_MS: u64 = 1000;
const SEED: u64 = 0x7377_6974_6368_6b76;

/// The phases, from the start of the load.
const PAUSE_AT: Duration = Duration::from_millis(3500);
const PAUSE_FOR: Duration = Duration::from_millis(2500);
const CRASH_AT: Duration = Duration::from_millis(8000);
const KILL_AT: Duration = Duration::from_millis(11_000);
const LOAD_FOR: Duration = Duration::from_millis(15_000);
/// The most the switch may take to remove a silent cache node's entries (probes every
/// 200 ms, three failures in a row), with room for a loaded machine.
const REMOVED_WITHIN: Duration = Duration::from_secs(5);

/// Clients c1 and c2, the cache hosts `caches`, the backends `servers` (each a backend of the
/// cache hosts in turn), on `prefix`'s own subnet.
fn bed_of(prefix: &str, caches: &[&str], servers: &[&str]) -> testbed::Live {
    require_root();
    let mut topo = testbed::Topology::default_topology()
        .on_subnet(testbed::Subnet::for_prefix(prefix))
        .expect("the default topology fits a /24");
    let host = |name: &str, role| testbed::Host {
        name: name.to_string(),
        role,
        weight: 1,
        memcached_args: Vec::new(),
    };
    topo.hosts = vec![
        host("c1", testbed::Role::Client),
        host("c2", testbed::Role::Client),
    ];
    topo.hosts
        .extend(caches.iter().map(|c| host(c, testbed::Role::Cache)));
    topo.hosts
        .extend(servers.iter().map(|s| host(s, testbed::Role::Server)));
    let state = std::env::temp_dir().join(format!("{prefix}-testbed-{}.json", std::process::id()));
    let _ = testbed::down(&state);
    let _ = testbed::down_prefix(prefix);
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_kvswitch"));
    let lease = vec!["--lease-ms".to_string(), LEASE_MS.to_string()];
    let opts = testbed::UpOptions {
        prefix: prefix.into(),
        kvswitch_bin: Some(bin.clone()),
        state_path: Some(state),
        start_nutcracker: false,
        servers: testbed::ServerProgram::Node {
            bin,
            args: lease.clone(),
        },
        cache_args: lease,
        ..Default::default()
    };
    testbed::up(&topo, &opts).expect("testbed up")
}

/// A text request over TCP to `addr` from inside `host`, its reply read up to `END` (or the
/// line of `version`).
fn tcp_to(live: &testbed::Live, host: &str, addr: SocketAddr, request: &[u8]) -> String {
    live.in_host(host, || {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.write_all(request)?;
        let mut reply = Vec::new();
        let mut chunk = [0u8; 8192];
        while !(reply.ends_with(b"END\r\n")
            || (reply.starts_with(b"VERSION") && reply.ends_with(b"\r\n")))
        {
            let n = s.read(&mut chunk)?;
            if n == 0 {
                break;
            }
            reply.extend_from_slice(&chunk[..n]);
        }
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&reply).into_owned())
    })
    .expect("in the host")
    .unwrap_or_else(|e| format!("no answer: {e}"))
}

/// A counter of the cache node's `stats` (`switchkv_<name>`), asked from a client.
fn cache_stat(live: &testbed::Live, name: &str) -> Option<u64> {
    stat_of(live, CACHE, name)
}

/// Counter `switchkv_<name>` of the cache node on `host`.
fn stat_of(live: &testbed::Live, host: &str, name: &str) -> Option<u64> {
    let addr = SocketAddr::from((ip_of(live, host), 11211));
    let stats = tcp_to(live, "c1", addr, b"stats\r\n");
    stats.lines().find_map(|l| {
        l.strip_prefix(&format!("STAT switchkv_{name} "))
            .and_then(|v| v.trim().parse().ok())
    })
}

fn steer_entries(live: &testbed::Live) -> usize {
    steering(live).len()
}

/// The switch's steering entries: key hash and the address each leads to.
fn steering(live: &testbed::Live) -> Vec<(u32, String)> {
    let (_, body) = testbed::http_get(live.api(), "/api/v1/tables/kv_steer/entries")
        .expect("the switch's steering entries");
    let doc: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    doc["entries"]
        .as_array()
        .map(|all| {
            all.iter()
                .map(|e| {
                    let hash = e["match"]["key_hash"].as_u64().unwrap_or_default() as u32;
                    let to = e["actions"][0]["set_ipv4_dst"].as_str().unwrap_or_default();
                    (hash, to.to_string())
                })
                .collect()
        })
        .unwrap_or_default()
}

fn steer_removed(live: &testbed::Live) -> u64 {
    status(live)["steer"]["removed_entries"]
        .as_u64()
        .unwrap_or_default()
}

/// Sleeps until `at` after `start`.
fn until(start: Instant, at: Duration) {
    std::thread::sleep(at.saturating_sub(start.elapsed()));
}

#[test]
fn reads_steered_to_a_cache_node_stay_coherent_through_a_hang_a_backend_crash_and_its_death() {
    let mut live = bed_of(PREFIX, &[CACHE], &SERVERS);
    let tag = format!("skv:{}", std::process::id());
    let ring = default_ring();
    let victim = SERVERS.iter().position(|s| *s == VICTIM).unwrap();
    // Eight hot keys, two of them on the victim whatever the process id makes of the names.
    let on_victim = |k: &String| ring.locate(k.as_bytes()) == victim;
    let names = (0..).map(|i| format!("{tag}:hot:{i}"));
    let mut keys: Vec<String> = names.clone().filter(on_victim).take(2).collect();
    keys.extend(names.filter(|k| !on_victim(k)).take(6));
    let victims: Vec<String> = keys.iter().filter(|k| on_victim(k)).cloned().collect();
    assert_eq!(victims.len(), 2, "two hot keys on {VICTIM}");
    // Two UDP clients in each client namespace, waiting past a lease: a write to a cached key
    // may wait for one at its backend.
    let clients = history_clients(
        &live,
        &["c1", "c2"],
        &[Transport::Udp, Transport::Udp],
        Duration::from_millis(2 * LEASE_MS),
    );
    let load = Load {
        keys: keys.clone(),
        ops_per_client: 1_000_000,
        duration: LOAD_FOR,
        mix: Mix {
            get: 70,
            gets_cas: 5,
            set: 10,
            delete: 5,
            incr: 10,
        },
        seed: SEED,
    };
    let clock = Clock::start();
    let started = Instant::now();
    struct Seen {
        served_before_pause: Option<u64>,
        served_after_crash: Option<u64>,
        served_before_death: Option<u64>,
        entries_before_pause: usize,
        removed_in_pause: Duration,
        crash: (u64, u64),
        dead_removed_at: u64,
    }
    let (recorded, seen) = std::thread::scope(|scope| {
        let history = scope.spawn(|| history_load::run(&clients, &load, clock));
        // Hot keys are reported, admitted and steered, and the cache node answers reads.
        until(started, PAUSE_AT);
        let served_before_pause = cache_stat(&live, "served");
        let entries_before_pause = steer_entries(&live);
        // It hangs for longer than its lease: the switch removes its entries.
        let removed_before = steer_removed(&live);
        let paused = Instant::now();
        live.pause_server(CACHE, true)
            .expect("pause the cache node");
        while steer_removed(&live) == removed_before && paused.elapsed() < REMOVED_WITHIN {
            std::thread::sleep(Duration::from_millis(20));
        }
        let removed_in_pause = paused.elapsed();
        until(paused, PAUSE_FOR);
        live.pause_server(CACHE, false)
            .expect("let the cache node go on");
        // A backend crashes and comes back with nothing.
        until(started, CRASH_AT);
        let crashed = clock.now();
        live.kill_server(VICTIM).expect("kill the backend");
        live.restart_server(VICTIM).expect("restart the backend");
        let addr = SocketAddr::from((ip_of(&live, VICTIM), 11211));
        let back = Instant::now();
        // A restart on a loaded two-core machine (the whole suite beside it) can take seconds
        // before the backend answers; the bound only catches one that never does.
        while !tcp_to(&live, VICTIM, addr, b"version\r\n").starts_with("VERSION") {
            assert!(
                back.elapsed() < Duration::from_secs(30),
                "{VICTIM} not back"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let crash = (crashed, clock.now());
        let served_after_crash = cache_stat(&live, "served");
        // The cache node dies: its entries go.
        until(started, KILL_AT);
        let served_before_death = cache_stat(&live, "served");
        live.kill_server(CACHE).expect("kill the cache node");
        let killed = Instant::now();
        while steer_entries(&live) > 0 {
            assert!(
                killed.elapsed() < REMOVED_WITHIN,
                "the dead cache node's entries are still there"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let dead_removed_at = clock.now();
        let recorded = history.join().expect("history thread").expect("load");
        (
            recorded,
            Seen {
                served_before_pause,
                served_after_crash,
                served_before_death,
                entries_before_pause,
                removed_in_pause,
                crash,
                dead_removed_at,
            },
        )
    });
    println!(
        "before the hang: {:?} reads served by the cache node, {} steering entries; \
         its entries removed {:?} into the hang",
        seen.served_before_pause, seen.entries_before_pause, seen.removed_in_pause
    );
    assert!(
        seen.served_before_pause.unwrap_or(0) > 100,
        "the cache node served {:?} reads; log:\n{}",
        seen.served_before_pause,
        log_tail(&live, 20)
    );
    assert!(seen.entries_before_pause > 0);
    assert!(
        seen.removed_in_pause < REMOVED_WITHIN,
        "the hung cache node's entries were not removed"
    );
    // After the hang and the backend's crash, the cache node serves again.
    let again = seen
        .served_before_death
        .unwrap_or(0)
        .saturating_sub(seen.served_after_crash.unwrap_or(u64::MAX));
    println!("{again} reads served by the cache node between the backend's return and its death");
    assert!(again > 100, "{again} reads served after the crash");

    recorded_ok(&recorded);
    // The crash lost the victim's values: a write of "absent" to each of its keys, at some
    // instant between the crash and its return.
    let mut ops = recorded.ops.clone();
    for key in &victims {
        ops.push(Op {
            client: 0,
            cmd: "delete",
            key: key.clone(),
            start: seen.crash.0,
            end: seen.crash.1,
            kind: Kind::Write(None),
        });
    }
    no_stale_read(&ops);
    // With the cache node dead, reads are answered by the backends.
    let after: Vec<&Op> = recorded
        .ops
        .iter()
        .filter(|op| op.start > seen.dead_removed_at && op.cmd == "get")
        .collect();
    let answered = after
        .iter()
        .filter(|op| matches!(op.kind, Kind::Read(_)))
        .count();
    assert!(
        after.len() >= 50 && answered * 10 >= after.len() * 9,
        "{answered} of {} reads answered once the dead cache node's entries were gone",
        after.len()
    );
    live.down().expect("down");
}

/// Several cache nodes, each serving its own backends (SwitchKV section 3.4): the backends
/// are given to the cache hosts in turn, and reads of a hot key are steered to the cache node
/// of that key's backend, and answered there.
#[test]
fn each_cache_node_serves_the_keys_of_its_own_backends() {
    const TWO: &str = "kskw";
    const CACHES: [&str; 2] = ["k1", "k2"];
    const BACKENDS: [&str; 4] = ["s1", "s2", "s3", "s4"];
    let live = bed_of(TWO, &CACHES, &BACKENDS);
    let servers: Vec<kv::Server> = BACKENDS.iter().map(|n| kv::Server::new(*n, 1)).collect();
    let ring = kv::Ring::new(kv::Distribution::Ketama, kv::HashFn::Md5, &servers).unwrap();
    let tag = format!("two:{}", std::process::id());
    let keys: Vec<String> = (0..12).map(|i| format!("{tag}:{i}")).collect();
    let hot = |key: &str| {
        for _ in 0..3 {
            let set = format!("set {key} 0 0 1\r\nv\r\n");
            if udp_call(
                &live,
                "c1",
                vip(&live),
                set.as_bytes(),
                Duration::from_secs(1),
            )
            .is_some()
            {
                break;
            }
        }
        for _ in 0..30 {
            let get = format!("get {key}\r\n");
            let _ = udp_call(
                &live,
                "c1",
                vip(&live),
                get.as_bytes(),
                Duration::from_secs(1),
            );
        }
    };
    for key in &keys {
        hot(key);
    }
    // Each key's entry leads to the cache node of its backend: backend i reports to cache
    // host i mod 2.
    let want: Vec<(u32, String)> = keys
        .iter()
        .map(|k| {
            let backend = ring.locate(k.as_bytes());
            let cache = CACHES[backend % CACHES.len()];
            (ring.key_hash(k.as_bytes()), ip_of(&live, cache).to_string())
        })
        .collect();
    let started = std::time::Instant::now();
    loop {
        let have = steering(&live);
        if want.iter().all(|w| have.contains(w)) {
            assert!(have.iter().all(|h| want.contains(h)), "{have:?}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "steering {have:?}, expected {want:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Both cache nodes hold keys, and a steered read is answered by its own node.
    for cache in CACHES {
        let ip = ip_of(&live, cache).to_string();
        assert!(want.iter().any(|(_, to)| *to == ip), "no key for {cache}");
    }
    let before: Vec<u64> = CACHES
        .iter()
        .map(|c| stat_of(&live, c, "served").unwrap_or(0))
        .collect();
    for key in &keys {
        let get = format!("get {key}\r\n");
        let reply = udp_call(
            &live,
            "c2",
            vip(&live),
            get.as_bytes(),
            Duration::from_secs(1),
        )
        .expect("a steered read is answered");
        assert_eq!(
            String::from_utf8_lossy(&reply.body),
            format!("VALUE {key} 0 1\r\nv\r\nEND\r\n")
        );
    }
    let after: Vec<u64> = CACHES
        .iter()
        .map(|c| stat_of(&live, c, "served").unwrap_or(0))
        .collect();
    for (i, cache) in CACHES.iter().enumerate() {
        let theirs = want
            .iter()
            .filter(|(_, to)| *to == ip_of(&live, cache).to_string())
            .count() as u64;
        assert_eq!(after[i] - before[i], theirs, "reads served by {cache}");
    }

    // A client writes to a cache node's control port as if it were a backend: an update of a
    // cached key, and an instant report of its own. Both are refused, and readers keep
    // getting the real value from the cache node.
    for (key, (_, to)) in keys.iter().zip(&want) {
        let control = SocketAddr::new(to.parse().expect("an address"), 11311);
        let forged = [
            format!("update {key} 0 6\r\nforged\r\n"),
            format!("hot 11311 {key} 1000000 0 6\r\nforged\r\n"),
        ];
        for message in forged {
            let reply = live
                .in_host("c1", || {
                    let mut s = TcpStream::connect_timeout(&control, Duration::from_secs(1))?;
                    s.set_read_timeout(Some(Duration::from_secs(2)))?;
                    s.write_all(message.as_bytes())?;
                    let mut reply = String::new();
                    s.read_to_string(&mut reply)?;
                    Ok::<_, std::io::Error>(reply)
                })
                .expect("in the host")
                .unwrap_or_else(|e| format!("no answer: {e}"));
            assert_eq!(reply, "error refused unsigned\r\n", "{message:?}");
        }
    }
    let served: Vec<u64> = CACHES
        .iter()
        .map(|c| stat_of(&live, c, "served").unwrap_or(0))
        .collect();
    for key in &keys {
        let get = format!("get {key}\r\n");
        let reply = udp_call(
            &live,
            "c2",
            vip(&live),
            get.as_bytes(),
            Duration::from_secs(1),
        )
        .expect("a steered read is answered");
        assert_eq!(
            String::from_utf8_lossy(&reply.body),
            format!("VALUE {key} 0 1\r\nv\r\nEND\r\n")
        );
    }
    let mut refused = 0;
    for (i, cache) in CACHES.iter().enumerate() {
        let ip = ip_of(&live, cache).to_string();
        let theirs = want.iter().filter(|(_, to)| *to == ip).count() as u64;
        assert_eq!(
            stat_of(&live, cache, "served").unwrap_or(0) - served[i],
            theirs,
            "reads served by {cache} after the forgeries"
        );
        assert_eq!(stat_of(&live, cache, "updates"), Some(0), "{cache}");
        refused += stat_of(&live, cache, "refused_unsigned").unwrap_or(0);
    }
    assert_eq!(refused, 2 * keys.len() as u64);
    live.down().expect("down");
}

/// SwitchKV's own clients (section 3.1.1, `kvswitch load --switchkv`): each query carries its
/// key's hash in the destination MAC and its backend's address as the destination, and never
/// passes kvswitch's key router. Reads of hot keys are steered by their hash to the cache node
/// and answered there, the rest and every write reach the backend the client named, and every
/// request is answered with the right kind of reply.
#[test]
fn switchkv_clients_queries_reach_the_cache_node_or_their_backend_by_their_mac() {
    const NATIVE: &str = "kskn";
    let live = bed_of(NATIVE, &[CACHE], &SERVERS);
    let mut args = loadgen::LoadArgs::new(vip(&live).to_string());
    args.switchkv = Some(live.state.config_path.clone());
    args.keys = 200;
    args.key_prefix = format!("native:{}:", std::process::id());
    args.dist = "zipf:0.99".parse().expect("dist");
    args.get_ratio = 0.95;
    args.preload = true;
    args.concurrency = 4;
    args.threads = Some(1);
    args.warmup = 1.5;
    args.duration = 3.0;
    args.timeout_ms = 500;
    args.quiet = true;
    let before = status(&live)["counters"].clone();
    let served_before = cache_stat(&live, "served").unwrap_or(0);
    let report = live
        .in_host("c1", move || loadgen::run(&args))
        .expect("in the host")
        .expect("load");
    let after = status(&live)["counters"].clone();
    let grew = |name: &str| after[name].as_u64().unwrap_or(0) - before[name].as_u64().unwrap_or(0);
    let served = cache_stat(&live, "served").unwrap_or(0) - served_before;
    // Every key was set first: every get finds its value, wherever it is answered.
    assert!(report.gets > 100 && report.sets > 0, "{report:?}");
    assert_eq!(report.misses, 0, "{report:?}");
    assert_eq!(report.errors + report.bad_datagrams, 0, "{report:?}");
    assert!(report.timeouts * 50 <= report.requests, "{report:?}");
    // The switch saw them as SwitchKV's queries, not as requests to route by key (only the
    // preload went to the VIP).
    assert!(grew("switchkv_gets") >= report.gets, "{after}");
    assert!(grew("switchkv_others") >= report.sets, "{after}");
    assert!(grew("kv_requests") <= 2 * 200, "{after}");
    // The hot keys' reads were steered to the cache node and answered there.
    assert!(steer_entries(&live) > 0);
    assert!(
        served * 5 >= report.gets,
        "cache node served {served} of {} gets",
        report.gets
    );

    // A read steered to the cache node for a key it does not hold (a rule the switch still
    // has, or another key with the same hash) goes back through the switch with the other
    // prefix and is answered by its backend, straight to the client.
    let key = format!("stale:{}", std::process::id());
    let set = format!("set {key} 0 0 5\r\nfresh\r\n");
    let stored = udp_call(
        &live,
        "c2",
        vip(&live),
        set.as_bytes(),
        Duration::from_secs(1),
    );
    assert_eq!(stored.map(|r| r.body), Some(b"STORED\r\n".to_vec()));
    let (_, listed) = testbed::http_get(live.api(), "/api/v1/tables/kv_steer/entries")
        .expect("the steering entries");
    let listed: serde_json::Value = serde_json::from_str(&listed).expect("JSON");
    let to_cache = listed["entries"][0]["actions"].clone();
    let client = api::Client::new(live.api(), live.state.api_token().expect("token"));
    let entry = serde_json::json!({
        "match": {"one_read": 1, "key_hash": kv::HashFn::Md5.hash(key.as_bytes())},
        "actions": to_cache,
    });
    client
        .call("POST", "/api/v1/tables/kv_steer/entries", Some(&entry))
        .expect("a steering entry for a key the cache node does not hold");
    let bounced = || node_stat(&live, CACHE, "bounced").unwrap_or(0);
    let before = bounced();
    let get = format!("get {key}\r\n");
    let reply = udp_call(
        &live,
        "c2",
        vip(&live),
        get.as_bytes(),
        Duration::from_secs(2),
    )
    .unwrap_or_else(|| {
        panic!(
            "no answer to a read the cache node sent back: bounced {} failed {:?}, \
                 switch {}, cache node log {}",
            bounced() - before,
            node_stat(&live, CACHE, "bounce_failed"),
            status(&live)["counters"],
            std::fs::read_to_string(
                live.host(CACHE)
                    .and_then(|h| h.log.clone())
                    .unwrap_or_default()
            )
            .unwrap_or_default()
        )
    });
    assert_eq!(
        String::from_utf8_lossy(&reply.body),
        format!("VALUE {key} 0 5\r\nfresh\r\nEND\r\n")
    );
    assert_eq!(bounced(), before + 1);
}

/// Counter `name` of the node on `host` (not its role's).
fn node_stat(live: &testbed::Live, host: &str, name: &str) -> Option<u64> {
    let addr = SocketAddr::from((ip_of(live, host), 11211));
    let stats = tcp_to(live, "c1", addr, b"stats\r\n");
    stats.lines().find_map(|l| {
        l.strip_prefix(&format!("STAT {name} "))
            .and_then(|v| v.trim().parse().ok())
    })
}
