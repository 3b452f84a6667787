//! Pool changes on the XDP fast path, end to end: while clients record a history on a few hot
//! keys (single-key reads over UDP, which the program in the kernel routes, or answers from its
//! copy of the cache; writes over UDP and TCP, which the switch and its proxy route by the
//! pool's view), a server is taken out of the pool through the API, flushed, and added back,
//! again and again. Once a change is acknowledged no read may be routed by the ring before it:
//! the history must hold no stale read.
//!
//! A change moves keys without their values, which the history is told as a write of "absent"
//! to each moved key that may take effect at any time from the change's start (an uncertain
//! delete): a read of the new owner's nothing is then fine, while a read of the old owner's
//! value after a write to the new owner was acknowledged is stale. So that a returning server
//! holds nothing old, it is flushed while it is out; so that a server that takes a removed
//! server's keys holds nothing old of them the next time, its copies are deleted once the
//! removed server is back and the change has settled.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use api::Client as Api;
use common::*;
use serde_json::json;
use testbed::history::{Kind, Op};
use testbed::history_load::{self, Clock, Load, Mix, Transport};

/// The default topology's servers, in the pool's order.
const SERVERS: [&str; 3] = ["s1", "s2", "s3"];
/// The servers taken out and back, in turn: each cycle is two pool changes.
const CYCLES: [&str; 4] = ["s2", "s3", "s1", "s2"];
/// Hot keys per server (under the full ring): few, so reads and writes meet on each.
const KEYS_PER_SERVER: usize = 3;
/// How long the clients run before the first change: long enough for the switch to hand
/// them to the program (it publishes a sender within 50 ms of its first frame).
const WARM_UP: Duration = Duration::from_millis(800);
/// Between the steps of a cycle: long enough for a change to settle (the program is back
/// in step within a sync, 5 to 50 ms), short enough to keep the test in seconds.
const SETTLE: Duration = Duration::from_millis(250);
/// The history's whole run, which bounds it on a slow machine too.
const LOAD_FOR: Duration = Duration::from_secs(6);
const SEED: u64 = 0x6b76_7870_6f6f_6c21;

/// The ring over `names` (the testbed names servers after their hosts, weight 1, ketama over
/// md5), built independently of kvswitch.
fn owner(names: &[&'static str], key: &str) -> &'static str {
    let servers: Vec<kv::Server> = names.iter().map(|n| kv::Server::new(*n, 1)).collect();
    let ring = kv::Ring::new(kv::Distribution::Ketama, kv::HashFn::Md5, &servers).expect("ring");
    names[ring.locate(key.as_bytes())]
}

fn memcached(live: &testbed::Live, server: &str) -> SocketAddr {
    SocketAddr::new(ip_of(live, server).into(), 11211)
}

/// One request straight to `server`'s memcached over TCP (from inside the server's own
/// namespace), bypassing the switch; the reply is one line.
fn direct(live: &testbed::Live, server: &str, request: &str) -> String {
    let reply = tcp_call(
        live,
        server,
        memcached(live, server),
        request.as_bytes(),
        ends_with_line,
    );
    String::from_utf8_lossy(&reply).into_owned()
}

/// What one pool change did to the history: each key it moved may have lost its value (the
/// new owner does not have it) from the change's start on.
fn moved(keys: &[String], server: &str, start: u64, end: u64) -> Vec<Op> {
    keys.iter()
        .filter(|k| owner(&SERVERS, k) == server)
        .map(|key| Op {
            client: 0,
            cmd: "pool change",
            key: key.clone(),
            start,
            end,
            kind: Kind::MaybeWrite(None),
        })
        .collect()
}

/// Takes each server of [`CYCLES`] out of the pool, flushes it, adds it back, and then deletes
/// the copies of its keys the other servers took meanwhile. Returns the pool changes as
/// history operations.
fn change_pool(live: &testbed::Live, keys: &[String], clock: Clock) -> Vec<Op> {
    let api = Api::new(live.api(), None);
    let mut changes = Vec::new();
    std::thread::sleep(WARM_UP);
    for server in CYCLES {
        let start = clock.now();
        api.call("DELETE", &format!("/api/v1/pool/servers/{server}"), None)
            .unwrap_or_else(|e| panic!("remove {server}: {e:#}"));
        changes.extend(moved(keys, server, start, clock.now()));
        std::thread::sleep(SETTLE);
        assert_eq!(direct(live, server, "flush_all\r\n"), "OK\r\n");

        let start = clock.now();
        let back = json!({"addr": memcached(live, server).to_string(), "name": server});
        let added = api
            .call("POST", "/api/v1/pool/servers", Some(&back))
            .unwrap_or_else(|e| panic!("add {server} back: {e:#}"));
        let place = SERVERS.iter().position(|s| *s == server);
        assert_eq!(
            added["server"].as_u64().map(|i| i as usize),
            place,
            "{added}"
        );
        changes.extend(moved(keys, server, start, clock.now()));
        std::thread::sleep(SETTLE);

        // Nothing routes the returned server's keys elsewhere now: what the others hold of
        // them is unreachable, and must not be found the next time they take them.
        let strays: String = keys
            .iter()
            .filter(|k| owner(&SERVERS, k) == server)
            .map(|k| format!("delete {k} noreply\r\n"))
            .collect();
        for other in SERVERS.iter().filter(|s| **s != server) {
            let reply = direct(live, other, &format!("{strays}version\r\n"));
            assert!(reply.starts_with("VERSION"), "{other}: {reply:?}");
        }
    }
    changes
}

/// One run: the history with [`CYCLES`] of pool changes on a testbed with `extra` appended to
/// the switch's configuration. Returns the switch's status after it.
fn history_across_pool_changes(prefix: &str, extra: Option<&str>) -> serde_json::Value {
    let live = testbed_with(prefix, "l3", false, |o| {
        o.datapath = Some("xdp".into());
        o.extra_config = extra.map(str::to_string);
    });
    let st = status(&live);
    assert_eq!(st["datapath"]["xdp"], true, "{}", st["datapath"]);

    let tag = format!("{prefix}:{}", std::process::id());
    let full = kv::Ring::new(
        kv::Distribution::Ketama,
        kv::HashFn::Md5,
        &SERVERS.map(|n| kv::Server::new(n, 1)),
    )
    .expect("ring");
    let keys = keys_spanning_servers(&full, &format!("{tag}:hot:"), KEYS_PER_SERVER);
    // Reads over UDP are the program's; TCP goes through the switch's proxy.
    let clients = history_clients(
        &live,
        &["c1", "c2"],
        &[Transport::Udp, Transport::Udp, Transport::Tcp],
        Duration::from_millis(500),
    );
    let load = Load {
        keys: keys.clone(),
        ops_per_client: 1_000_000,
        duration: LOAD_FOR,
        mix: Mix::default(),
        seed: SEED,
    };
    let clock = Clock::start();
    let (recorded, changes) = std::thread::scope(|scope| {
        let history = scope.spawn(|| history_load::run(&clients, &load, clock));
        let changes = change_pool(&live, &keys, clock);
        let recorded = history.join().expect("history thread").expect("load");
        (recorded, changes)
    });
    recorded_ok(&recorded);
    let mut ops = recorded.ops.clone();
    ops.extend(changes);
    let report = testbed::history::check(&ops);
    let stale = report
        .violations
        .iter()
        .filter(|v| matches!(v, testbed::history::Violation::Stale { .. }))
        .count();
    println!(
        "{prefix}: {stale} stale reads of {} violations, {} pool changes",
        report.violations.len(),
        2 * CYCLES.len()
    );
    no_stale_read(&ops);
    assert!(
        recorded.ops.len() >= 2_000,
        "only {} operations recorded",
        recorded.ops.len()
    );
    let unanswered = recorded.timeouts() + recorded.server_errors();
    assert!(
        unanswered * 50 <= recorded.ops.len(),
        "{unanswered} of {} operations unanswered",
        recorded.ops.len()
    );
    let st = status(&live);
    println!("{prefix}: {}", st["datapath"]);
    // Each change stopped the program routing reads until its ring was in use.
    let held = st["datapath"]["xdp_passed"]["pool_change"]
        .as_u64()
        .expect("the pool_change counter");
    assert!(held > 0, "no read was handed up during a change");
    assert_eq!(drops(&live, "vip_unhandled"), 0);
    live.down().expect("down");
    st
}

/// The cache off: the program routes single-key reads by its copy of the ring.
#[test]
fn xdp_routes_no_read_by_the_ring_before_a_pool_change() {
    let st = history_across_pool_changes("kxpr", None);
    let routed = st["datapath"]["xdp_frames"]["routed"]
        .as_u64()
        .expect("the routed counter");
    assert!(routed > 0, "the program routed no read");
}

/// The cache on: the program answers reads its copy of the cache holds, and hands up the
/// rest, which the switch routes.
#[test]
fn xdp_cache_answers_no_read_from_before_a_pool_change() {
    let cache = "[cache]\nitems = 8\nlease_ms = 300\nrule_rate = 50\nrule_delay_ms = 500\n\
                 segment_ms = 200\n";
    let st = history_across_pool_changes("kxpc", Some(cache));
    let hits = st["datapath"]["xdp_frames"]["cache_hits"]
        .as_u64()
        .expect("the cache_hits counter");
    assert!(hits > 0, "no read was answered from the kernel cache");
}

/// The program counts the reads it routes on the ring's arcs, as the switch counts what it
/// routes itself: every read answered is counted once, whichever routed it. With a placement
/// of the arcs, reads follow it.
#[test]
fn xdp_counts_reads_on_the_rings_arcs_and_routes_by_a_placement() {
    let live = testbed_with("kxar", "l3", false, |o| {
        o.datapath = Some("xdp".into());
    });
    let api = Api::new(live.api(), None);
    let routed = |live: &testbed::Live| {
        status(live)["datapath"]["xdp_frames"]["routed"]
            .as_u64()
            .expect("the routed counter")
    };
    let counted = |api: &Api| -> (u64, serde_json::Value) {
        let arcs = api.call("GET", "/api/v1/pool/arcs", None).expect("arcs");
        let sum = arcs["counts"]
            .as_array()
            .expect("counts")
            .iter()
            .map(|c| c.as_u64().unwrap())
            .sum();
        (sum, arcs)
    };
    let (before, arcs) = counted(&api);
    let routed_before = routed(&live);
    let mut answered = 0u64;
    for i in 0..200 {
        let get = format!("get arc:{i}\r\n");
        if udp_call(
            &live,
            "c1",
            vip(&live),
            get.as_bytes(),
            Duration::from_secs(1),
        )
        .is_some()
        {
            answered += 1;
        }
    }
    // The program's counts are added to the switch's every 50 ms.
    std::thread::sleep(Duration::from_millis(400));
    let (after, _) = counted(&api);
    let by_program = routed(&live) - routed_before;
    println!(
        "{answered} reads answered, {by_program} routed by the program, {} counted",
        after - before
    );
    assert!(by_program > 0, "the program routed no read");
    assert!(answered >= 150, "{answered} of 200 reads answered");
    assert!(
        after - before <= 200,
        "{} counted of 200 reads",
        after - before
    );
    assert!(
        after - before >= answered,
        "{} counted on arcs of {answered} reads answered ({by_program} routed by the program)",
        after - before
    );

    // Every arc to s2: a key only s2 holds is read through the VIP (by the program, or by the
    // switch while the program hands reads up).
    place_every_arc(&api, &arcs, "s2");
    for i in 0..20 {
        let key = format!("placed:{i}");
        assert_eq!(
            direct(&live, "s2", &format!("set {key} 0 0 1\r\nx\r\n")),
            "STORED\r\n"
        );
        let got = (0..5)
            .find_map(|_| {
                udp_call(
                    &live,
                    "c1",
                    vip(&live),
                    format!("get {key}\r\n").as_bytes(),
                    Duration::from_secs(1),
                )
            })
            .map(|r| String::from_utf8_lossy(&r.body).into_owned());
        assert_eq!(
            got.as_deref(),
            Some(format!("VALUE {key} 0 1\r\nx\r\nEND\r\n").as_str()),
            "{key}"
        );
    }
    live.down().expect("down");
}
