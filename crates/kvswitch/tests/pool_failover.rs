//! One pool state for both transports, end to end: the switch's UDP path and its built-in TCP
//! proxy route by one `switch::pool::Pool`, so when the proxy's failures eject a server, UDP
//! requests follow the new ring too, and a key has one owner whichever transport asks.
//!
//! On the testbed (`l3`, three memcached servers, the cache on, `auto_eject_hosts` with a
//! failure limit of 2 and a retry timeout longer than the test): keys are placed alike over
//! UDP and TCP; then, while UDP and TCP clients record a history on a few hot keys, one
//! server is killed, TCP requests for its keys make the proxy eject it, and the killed
//! server's keys must move to the same next server for both transports, the switch must stop
//! sending it UDP requests, and the history must stay coherent. Every key's owner is checked
//! by asking the servers directly.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::*;
use testbed::history::{self, Kind, Op};
use testbed::history_load::{self, Client, Clock, Load, Mix, Recorded, Transport};

/// The testbed's prefix, with a subnet of its own.
const PREFIX: &str = "kpf";
/// The default topology's servers, in the pool's order.
const SERVERS: [&str; 3] = ["s1", "s2", "s3"];
/// The server killed mid-run.
const VICTIM: &str = "s2";
/// The servers left once it is out.
const SURVIVORS: [&str; 2] = ["s1", "s3"];

/// The pool's failure handling: the second failure in a row ejects a server, for longer
/// than the test runs, so it never comes back while the test looks.
const POOL: &str = "auto_eject_hosts = true\nserver_failure_limit = 2\n\
                    server_retry_timeout_ms = 600000\n";
/// The cache's lease: how long after its last fill a value may still be served from the
/// cache, so also how long a killed server's cached values may outlive it.
const LEASE: Duration = Duration::from_millis(300);

/// The in-network cache: it holds 8 of the 12 hot keys, so keys keep entering and leaving;
/// short leases, so values are refilled all the time.
fn cache_config() -> String {
    format!(
        "[cache]\nitems = 8\nlease_ms = {}\nrule_rate = 50\nrule_delay_ms = 500\n\
         segment_ms = 200\n",
        LEASE.as_millis()
    )
}

/// The history's whole run; the kill comes [`KILL_AFTER`] into it.
const LOAD_FOR: Duration = Duration::from_secs(10);
const KILL_AFTER: Duration = Duration::from_millis(2500);
/// The most the proxy may take to eject the killed server, and the most TCP requests sent
/// to make it do so.
const EJECT_WITHIN: Duration = Duration::from_secs(10);
const EJECT_TRIES: usize = 200;
/// How long after the ejection was seen over TCP the UDP path has to follow it; generous,
/// since it follows at the next frame.
const PROPAGATE: Duration = Duration::from_secs(1);
/// Operations the history must hold at least, and reads per transport of the killed
/// server's keys begun after the failover settled.
const MIN_OPS: usize = 5_000;
const MIN_READS_AFTER: usize = 100;
const SEED: u64 = 0x6b76_7377_6661_696c;
/// A UDP request is sent this many times at most before its loss counts as a failure.
const UDP_TRIES: usize = 3;
const UDP_WAIT: Duration = Duration::from_secs(1);

/// The ring over `names`, built independently of kvswitch (the testbed names servers after
/// their hosts, weight 1, ketama over md5).
fn ring(names: &[&str]) -> kv::Ring {
    let servers: Vec<kv::Server> = names.iter().map(|n| kv::Server::new(*n, 1)).collect();
    kv::Ring::new(kv::Distribution::Ketama, kv::HashFn::Md5, &servers).expect("ring")
}

fn owner(names: &[&'static str], key: &str) -> &'static str {
    names[ring(names).locate(key.as_bytes())]
}

/// Whether a text reply is whole: a retrieval up to its `END`, anything else one line.
fn reply_done(b: &[u8]) -> bool {
    if b.starts_with(b"VALUE ") {
        b.ends_with(b"END\r\n")
    } else {
        b.ends_with(b"\r\n")
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn tcp(live: &testbed::Live, host: &str, request: &str) -> String {
    text(&tcp_call(
        live,
        host,
        vip(live),
        request.as_bytes(),
        reply_done,
    ))
}

/// A UDP request to the VIP from `host`, sent again when no reply comes (a lost datagram);
/// `None` if none of [`UDP_TRIES`] got one.
fn udp(live: &testbed::Live, host: &str, request: &str) -> Option<String> {
    (0..UDP_TRIES).find_map(|_| {
        udp_call(live, host, vip(live), request.as_bytes(), UDP_WAIT).map(|r| text(&r.body))
    })
}

fn set(key: &str, value: &str) -> String {
    format!("set {key} 0 0 {}\r\n{value}\r\n", value.len())
}

fn hit(key: &str, value: &str) -> String {
    format!("VALUE {key} 0 {}\r\n{value}\r\nEND\r\n", value.len())
}

/// The servers among `among` that hold `key`, asked directly, with the value each holds.
fn holders(live: &testbed::Live, among: &[&'static str], key: &str) -> Vec<(&'static str, String)> {
    among
        .iter()
        .filter_map(|s| server_value(live, s, key).map(|v| (*s, text(&v))))
        .collect()
}

/// One sample of `/metrics`, by its full name and labels.
fn sample(metrics: &str, series: &str) -> Option<u64> {
    metrics.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// UDP requests the switch routed to each server so far (`kvswitch_backend_requests_total`).
fn routed(live: &testbed::Live) -> HashMap<&'static str, u64> {
    let m = metrics(live);
    SERVERS
        .iter()
        .map(|s| {
            let series = format!("kvswitch_backend_requests_total{{backend=\"{s}\"}}");
            let n = sample(&m, &series).unwrap_or_else(|| panic!("no {series} in:\n{m}"));
            (*s, n)
        })
        .collect()
}

/// 1. Before any failure: a key written over either transport is on the server the full
///    ring names and on no other, and reads back over both.
fn placed_alike(live: &testbed::Live, keys: &[String]) {
    for (i, key) in keys.iter().enumerate() {
        let expected = owner(&SERVERS, key);
        let (u, t) = (format!("u{i}"), format!("t{i}"));
        assert_eq!(
            udp(live, "c1", &set(key, &u)).as_deref(),
            Some("STORED\r\n"),
            "UDP set {key}"
        );
        assert_eq!(
            holders(live, &SERVERS, key),
            vec![(expected, u.clone())],
            "{key} set over UDP"
        );
        assert_eq!(
            tcp(live, "c2", &set(key, &t)),
            "STORED\r\n",
            "TCP set {key}"
        );
        assert_eq!(
            holders(live, &SERVERS, key),
            vec![(expected, t.clone())],
            "{key} set over TCP: not where UDP put it"
        );
        let want = hit(key, &t);
        assert_eq!(
            udp(live, "c2", &format!("get {key}\r\n")),
            Some(want.clone())
        );
        assert_eq!(tcp(live, "c1", &format!("get {key}\r\n")), want);
    }
}

/// 3. Sends TCP gets of the killed server's keys until the proxy answers one from another
///    server (it answers `SERVER_ERROR` while its connects fail), bounded in count and time.
///    A get the dying server accepted and then reset gets its connection reset (the splice
///    cannot give the reply it promised), which counts as an error too. Returns how many
///    errors came first.
fn eject_over_tcp(live: &testbed::Live, dead_keys: &[String]) -> usize {
    let deadline = Instant::now() + EJECT_WITHIN;
    for n in 0..EJECT_TRIES {
        let key = &dead_keys[n % dead_keys.len()];
        let request = format!("get {key}\r\n");
        let reply = match try_tcp_call(live, "c1", vip(live), request.as_bytes(), reply_done) {
            Ok(reply) => text(&reply),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                format!("SERVER_ERROR (connection reset: {e})")
            }
            Err(e) => panic!("get {key} while {VICTIM} dies: {e}"),
        };
        if !reply.starts_with("SERVER_ERROR") {
            assert!(
                reply == "END\r\n" || reply.starts_with(&format!("VALUE {key} ")),
                "get {key} once {VICTIM} was ejected: {reply:?}"
            );
            return n;
        }
        assert!(
            Instant::now() < deadline,
            "the proxy did not eject {VICTIM} within {EJECT_WITHIN:?}; last reply {reply:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the proxy did not eject {VICTIM} after {EJECT_TRIES} requests");
}

/// 3. After the ejection: each of the killed server's keys has one new owner for both
///    transports, the one the ring over the survivors names; a write over one transport is
///    on it alone and reads back over the other.
fn moved_alike(live: &testbed::Live, dead_keys: &[String]) {
    for (i, key) in dead_keys.iter().enumerate() {
        let next = owner(&SURVIVORS, key);
        let (t, u) = (format!("tx{i}"), format!("ux{i}"));
        assert_eq!(
            tcp(live, "c1", &set(key, &t)),
            "STORED\r\n",
            "TCP set {key}"
        );
        assert_eq!(
            holders(live, &SURVIVORS, key),
            vec![(next, t.clone())],
            "{key} set over TCP after {VICTIM} was ejected"
        );
        let read = udp(live, "c2", &format!("get {key}\r\n"));
        assert_eq!(
            read.as_deref(),
            Some(hit(key, &t).as_str()),
            "UDP get of {key} after a TCP set (no reply: UDP still routes to {VICTIM}?)"
        );
        assert_eq!(
            udp(live, "c2", &set(key, &u)).as_deref(),
            Some("STORED\r\n"),
            "UDP set of {key} after {VICTIM} was ejected (no reply: still routed to it?)"
        );
        assert_eq!(
            holders(live, &SURVIVORS, key),
            vec![(next, u.clone())],
            "{key} set over UDP: not where TCP put it"
        );
        assert_eq!(tcp(live, "c1", &format!("get {key}\r\n")), hit(key, &u));
    }
}

/// The metrics that say the proxy ejected the victim.
fn proxy_ejected(live: &testbed::Live) {
    let m = metrics(live);
    let labels = format!("{{pool=\"default\",server=\"{VICTIM}\"}}");
    assert_eq!(
        sample(&m, &format!("kvswitch_proxy_server_up{labels}")),
        Some(0),
        "the proxy does not show {VICTIM} as out"
    );
    let ejections = sample(
        &m,
        &format!("kvswitch_proxy_server_ejections_total{labels}"),
    );
    assert!(ejections >= Some(1), "{VICTIM} ejections: {ejections:?}");
    // The switch's own view of the same pool: out of the ring for its UDP path too.
    assert_eq!(
        sample(
            &m,
            &format!("kvswitch_backend_in_ring{{backend=\"{VICTIM}\"}}")
        ),
        Some(0),
        "the switch does not show {VICTIM} as out of the ring"
    );
    let version = sample(&m, "kvswitch_pool_version");
    assert!(version >= Some(1), "pool version {version:?}");
}

/// The cache took part: it answered reads and was filled (`/metrics`, summed over its pools).
fn cache_answered(live: &testbed::Live) {
    let m = metrics(live);
    let total = |name: &str| -> u64 {
        m.lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    let (hits, fills) = (
        total("kvswitch_cache_hits_total{"),
        total("kvswitch_cache_fills_total{"),
    );
    println!("cache: {hits} hits, {fills} fills");
    assert!(
        hits >= 300 && fills >= 100,
        "the cache took little part: {hits} hits, {fills} fills"
    );
}

/// 4. The history is coherent across the kill, and says something: enough operations, reads
///    over both transports of the killed server's keys after the failover, and reads of
///    values the other transport wrote.
///
/// A killed server loses what it held: once its keys have moved, they are absent on their
/// new owner. The history records that loss as one acknowledged delete of each of its keys,
/// begun at the kill and ended `settled`, by when the ejection has reached the UDP path and
/// the cache's leases on values filled from the killed server have run out; until then a read
/// may see the old value or absent, after it only what was written since.
fn coherent(
    recorded: &Recorded,
    clients: &[Client],
    dead_keys: &[String],
    killed: u64,
    settled: u64,
) {
    recorded_ok(recorded);
    let mut ops = recorded.ops.clone();
    ops.extend(dead_keys.iter().map(|key| Op {
        client: 0,
        cmd: "kill",
        key: key.clone(),
        start: killed,
        end: settled,
        kind: Kind::Write(None),
    }));
    let report = history::check(&ops);
    println!("history: {}", report.stats);
    if !report.ok() {
        panic!(
            "{} of {} reads violate coherence across the failover (the kill at {killed} ns, \
             settled by {settled} ns); the first:\n{}",
            report.violations.len(),
            report.stats.reads,
            report.first_violations(10)
        );
    }
    assert!(
        recorded.ops.len() >= MIN_OPS,
        "only {} operations recorded",
        recorded.ops.len()
    );

    let transport: HashMap<u32, Transport> = clients.iter().map(|c| (c.id, c.transport)).collect();
    let by = |op: &Op| transport.get(&op.client).copied();
    for t in [Transport::Udp, Transport::Tcp] {
        let after = ops
            .iter()
            .filter(|op| by(op) == Some(t) && op.start > settled && dead_keys.contains(&op.key))
            .filter(|op| matches!(op.kind, Kind::Read(Some(_))))
            .count();
        println!("history: {t:?} hits on {VICTIM}'s keys after the failover: {after}");
        assert!(
            after >= MIN_READS_AFTER,
            "{t:?}: only {after} hits on {VICTIM}'s keys begun after the failover settled"
        );
    }
    let mut crossed: HashMap<(Transport, Transport), usize> = HashMap::new();
    for &(read, write) in &report.sources {
        if let (Some(w), Some(r)) = (by(&ops[write]), by(&ops[read])) {
            *crossed.entry((w, r)).or_default() += 1;
        }
    }
    println!("history: reads by (writer's, reader's) transport: {crossed:?}");
    for pair in [
        (Transport::Udp, Transport::Tcp),
        (Transport::Tcp, Transport::Udp),
    ] {
        assert!(
            crossed.get(&pair).copied().unwrap_or(0) >= 100,
            "few reads of values written over the other transport: {crossed:?}"
        );
    }
}

#[test]
fn an_ejected_server_leaves_both_transports() {
    let started = Instant::now();
    let live = testbed_with(PREFIX, "l3", false, |o| {
        o.pool_config = Some(POOL.into());
        o.extra_config = Some(cache_config());
    });
    let full = ring(&SERVERS);
    let tag = format!("pf:{}", std::process::id());

    // 1. Placement over both transports, some keys on each server.
    let placed = keys_spanning_servers(&full, &format!("{tag}:place:"), 4);
    placed_alike(&live, &placed);
    let dead_keys: Vec<String> = placed
        .iter()
        .filter(|k| owner(&SERVERS, k) == VICTIM)
        .cloned()
        .collect();

    // The hot keys of the history, some on each server. The survivors' ring keeps every other
    // key where it was (ketama moves only the lost server's keys), so the kill loses the
    // victim's keys alone.
    let hot = keys_spanning_servers(&full, &format!("{tag}:hot:"), 4);
    let hot_dead: Vec<String> = hot
        .iter()
        .filter(|k| owner(&SERVERS, k) == VICTIM)
        .cloned()
        .collect();
    for key in hot.iter().chain(&placed) {
        let before = owner(&SERVERS, key);
        if before != VICTIM {
            assert_eq!(
                owner(&SURVIVORS, key),
                before,
                "{key} moves without the victim"
            );
        }
    }

    // In each client namespace two over UDP and two over TCP, on the same keys.
    let clients = history_clients(
        &live,
        &["c1", "c2"],
        &[
            Transport::Udp,
            Transport::Tcp,
            Transport::Udp,
            Transport::Tcp,
        ],
        Duration::from_millis(500),
    );
    let load = Load {
        keys: hot,
        ops_per_client: 200_000,
        duration: LOAD_FOR,
        mix: Mix::default(),
        seed: SEED,
    };
    let clock = Clock::start();
    let (recorded, killed, settled, before, after) = std::thread::scope(|scope| {
        let history = scope.spawn(|| history_load::run(&clients, &load, clock));

        // 2. The kill, mid-run.
        std::thread::sleep(KILL_AFTER);
        let killed = clock.now();
        let pid = live.kill_server(VICTIM).expect("kill the victim");
        println!("killed {VICTIM} (pid {pid}) {KILL_AFTER:.1?} into the run");

        // 3. TCP makes the proxy eject it; both transports then agree on the new owners, and
        // the switch stops routing UDP to it.
        let t0 = Instant::now();
        let errors = eject_over_tcp(&live, &dead_keys);
        let ejected = clock.now();
        println!(
            "{VICTIM} ejected {:.1?} after the kill, {errors} SERVER_ERROR first",
            t0.elapsed()
        );
        proxy_ejected(&live);
        std::thread::sleep(PROPAGATE);
        let settled = ejected + (PROPAGATE + LEASE).as_nanos() as u64;
        let before = routed(&live);
        moved_alike(&live, &dead_keys);

        let recorded = history.join().expect("history thread").expect("load");
        let after = routed(&live);
        (recorded, killed, settled, before, after)
    });

    // 3. No UDP request reached the killed server once the ejection had propagated, while the
    // history's UDP clients kept asking for its keys; the survivors took them.
    println!("UDP requests routed per server: {before:?} then {after:?}");
    assert_eq!(
        after[VICTIM], before[VICTIM],
        "the switch kept routing UDP requests to the ejected {VICTIM}"
    );
    for s in SURVIVORS {
        assert!(
            after[s] > before[s],
            "{s} got no UDP requests after the failover"
        );
    }

    // 4. The history across the kill.
    coherent(&recorded, &clients, &hot_dead, killed, settled);

    cache_answered(&live);

    // The switch's log names no failure to route by the new view.
    assert!(
        !log_tail(&live, 200).contains("routing by the pool's new view failed"),
        "{}",
        log_tail(&live, 20)
    );
    assert_eq!(drops(&live, "vip_unhandled"), 0);
    live.down().expect("down");
    println!("pool failover: {:.1?}", started.elapsed());
}
