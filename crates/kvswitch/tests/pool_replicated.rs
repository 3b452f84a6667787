//! A replicated pool (`replicas = 2`) on the testbed (`l3`, four memcached servers, the
//! built-in proxy behind the local port), driven by the controller:
//!
//! - a write over UDP or TCP lands on both replicas of its key and on no other server;
//! - while UDP and TCP clients record a history on hot keys, one server is killed; the
//!   controller takes it out of the switch's pool, after which every read of its keys is
//!   answered by their second replica with the last acknowledged value, writes reach the
//!   survivors that now hold the keys, and the history checker finds no read of a value older
//!   than an acknowledged write (nothing is lost, so no write is assumed lost at the kill).
//!
//! Needs root (network namespaces) and memcached.

mod common;

use std::time::{Duration, Instant};

use api::Client as Api;
use common::fleet::{in_pool, testbed_controller};
use common::*;
use testbed::history::Kind;
use testbed::history_load::{self, Clock, Load, Mix, Transport};

/// The testbed's prefix, with a subnet of its own.
const PREFIX: &str = "krep";
const SERVERS: [&str; 4] = ["s1", "s2", "s3", "s4"];
const VICTIM: &str = "s2";
const SURVIVORS: [&str; 3] = ["s1", "s3", "s4"];
const REPLICAS: usize = 2;

const LOAD_FOR: Duration = Duration::from_secs(8);
const KILL_AFTER: Duration = Duration::from_millis(2500);
/// The most the controller may take to take the dead server out (its probes every 50 ms,
/// three failures in a row), with room for a loaded machine.
const REMOVED_WITHIN: Duration = Duration::from_secs(10);
const MIN_OPS: usize = 3_000;
const SEED: u64 = 0x7265_706c_6963_6173;

/// The replicas of `key` in a pool of `names` (a replicated pool's stable ketama ring over
/// md5, weight 1), owner first, computed apart from kvswitch's pool.
fn replicas(names: &[&'static str], key: &str) -> Vec<&'static str> {
    let servers: Vec<kv::Server> = names.iter().map(|n| kv::Server::new(*n, 1)).collect();
    let ring = kv::Ring::new_stable(kv::HashFn::Md5, &servers).unwrap();
    let mut out = Vec::new();
    ring.replicas_hash(ring.key_hash(key.as_bytes()), REPLICAS, &mut out);
    out.into_iter().map(|i| names[i]).collect()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn set(key: &str, value: &str) -> String {
    format!("set {key} 0 0 {}\r\n{value}\r\n", value.len())
}

fn hit(key: &str, value: &str) -> String {
    format!("VALUE {key} 0 {}\r\n{value}\r\nEND\r\n", value.len())
}

fn udp(live: &testbed::Live, host: &str, request: &str) -> Option<String> {
    (0..3).find_map(|_| {
        udp_call(
            live,
            host,
            vip(live),
            request.as_bytes(),
            Duration::from_secs(1),
        )
        .map(|r| text(&r.body))
    })
}

fn tcp(live: &testbed::Live, host: &str, request: &str) -> String {
    text(&tcp_call(live, host, vip(live), request.as_bytes(), |b| {
        if b.starts_with(b"VALUE ") {
            b.ends_with(b"END\r\n")
        } else {
            b.ends_with(b"\r\n")
        }
    }))
}

/// The servers among `among` that hold `key`, asked directly, with the value each holds.
fn holders(live: &testbed::Live, among: &[&'static str], key: &str) -> Vec<(&'static str, String)> {
    among
        .iter()
        .filter_map(|s| server_value(live, s, key).map(|v| (*s, text(&v))))
        .collect()
}

/// Writes each key over UDP then over TCP: each time both replicas hold the value and no
/// other server does; it reads back over the other transport.
fn written_to_both_replicas(live: &testbed::Live, names: &[&'static str], keys: &[String]) {
    for (i, key) in keys.iter().enumerate() {
        let mut want: Vec<&str> = replicas(names, key);
        want.sort();
        for (transport, value) in [("UDP", format!("u{i}")), ("TCP", format!("t{i}"))] {
            let reply = match transport {
                "UDP" => udp(live, "c1", &set(key, &value)),
                _ => Some(tcp(live, "c2", &set(key, &value))),
            };
            assert_eq!(
                reply.as_deref(),
                Some("STORED\r\n"),
                "{transport} set {key}"
            );
            let held = holders(live, names, key);
            assert_eq!(
                held.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
                want,
                "{key} set over {transport}: held by {held:?}"
            );
            assert!(held.iter().all(|(_, v)| *v == value), "{key}: {held:?}");
        }
        assert_eq!(
            udp(live, "c2", &format!("get {key}\r\n")),
            Some(hit(key, &format!("t{i}")))
        );
    }
}

#[test]
fn a_dead_replica_loses_nothing() {
    let mut live = testbed_of(PREFIX, "l3", false, &SERVERS, |o| {
        o.pool_config = Some(format!("replicas = {REPLICAS}\n"));
    });
    let switch_api = Api::new(live.api(), None);
    let (_controller, _ctl) = testbed_controller(
        &live,
        &SERVERS,
        "probe_interval_ms = 50\nprobe_timeout_ms = 100\ndown_after = 3\n\
         return_warm_ms = 60000",
    );

    let tag = format!("rep:{}", std::process::id());
    // Keys of every pair of replicas; the victim's own among them.
    let keys: Vec<String> = (0..400)
        .map(|i| format!("{tag}:{i}"))
        .filter(|k| replicas(&SERVERS, k)[0] == VICTIM)
        .take(6)
        .collect();
    assert_eq!(keys.len(), 6);
    let others: Vec<String> = (0..400)
        .map(|i| format!("{tag}:o{i}"))
        .filter(|k| replicas(&SERVERS, k)[0] != VICTIM)
        .take(6)
        .collect();
    written_to_both_replicas(&live, &SERVERS, &keys);
    written_to_both_replicas(&live, &SERVERS, &others);

    // The history: hot keys on every server, the victim's included. No cas: a replicated pool
    // refuses it.
    let hot: Vec<String> = (0..12).map(|i| format!("{tag}:hot:{i}")).collect();
    assert!(hot.iter().any(|k| replicas(&SERVERS, k).contains(&VICTIM)));
    // In each client namespace one over UDP and one over TCP.
    let clients = history_clients(
        &live,
        &["c1", "c2"],
        &[Transport::Udp, Transport::Tcp],
        Duration::from_millis(500),
    );
    let load = Load {
        keys: hot,
        ops_per_client: 200_000,
        duration: LOAD_FOR,
        mix: Mix {
            gets_cas: 0,
            ..Mix::default()
        },
        seed: SEED,
    };
    let clock = Clock::start();
    let (recorded, removed_at) = std::thread::scope(|scope| {
        let history = scope.spawn(|| history_load::run(&clients, &load, clock));
        std::thread::sleep(KILL_AFTER);
        let killed = Instant::now();
        live.kill_server(VICTIM).expect("kill the victim");
        while in_pool(&switch_api, VICTIM) {
            assert!(
                killed.elapsed() < REMOVED_WITHIN,
                "{VICTIM} still in the switch's pool {REMOVED_WITHIN:?} after its death"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let removed = killed.elapsed();
        eprintln!("{VICTIM} out of the switch's pool {removed:?} after its death");
        let removed_at = clock.now();
        (
            history.join().expect("history thread").expect("load"),
            removed_at,
        )
    });

    // Every value written before the kill reads back from the second replica, over both
    // transports; a write now reaches both of the key's replicas among the survivors.
    for (i, key) in keys.iter().chain(&others).enumerate() {
        let last = format!("t{}", i % keys.len());
        assert_eq!(
            udp(&live, "c1", &format!("get {key}\r\n")),
            Some(hit(key, &last)),
            "UDP read of {key} after {VICTIM} died"
        );
        assert_eq!(tcp(&live, "c2", &format!("get {key}\r\n")), hit(key, &last));
    }
    written_to_both_replicas(&live, &SURVIVORS, &keys);

    recorded_ok(&recorded);
    assert!(
        recorded.ops.len() >= MIN_OPS,
        "only {} ops",
        recorded.ops.len()
    );
    no_stale_read(&recorded.ops);
    // Reads went on after the removal, and found values.
    let hits_after = recorded
        .ops
        .iter()
        .filter(|op| op.start > removed_at && matches!(op.kind, Kind::Read(Some(_))))
        .count();
    assert!(
        hits_after >= 100,
        "only {hits_after} hits after the removal"
    );
    // Restarted, the victim comes back empty, owns its keys again, and warms up: a UDP read
    // goes to the keys' other replica; a TCP read misses on it, finds the last value on the
    // other replica, and the victim is given it.
    live.restart_server(VICTIM).expect("restart the victim");
    let started = Instant::now();
    while !in_pool(&switch_api, VICTIM) {
        assert!(
            started.elapsed() < REMOVED_WITHIN,
            "{VICTIM} not back in the pool"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for (i, key) in keys.iter().enumerate() {
        let last = format!("t{i}");
        assert_eq!(replicas(&SERVERS, key)[0], VICTIM);
        assert_eq!(
            udp(&live, "c1", &format!("get {key}\r\n")),
            Some(hit(key, &last)),
            "UDP read of {key} once {VICTIM} is back, warming up (read from the other replica)"
        );
        assert_eq!(
            tcp(&live, "c2", &format!("get {key}\r\n")),
            hit(key, &last),
            "TCP read of {key} once {VICTIM} is back, warming up"
        );
        let started = Instant::now();
        while server_value(&live, VICTIM, key).map(|v| text(&v)) != Some(last.clone()) {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{VICTIM} was not given {key}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    live.down().expect("down");
}
