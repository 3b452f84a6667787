//! Coherence under concurrent load: many clients read and write a few hot keys at once, every
//! operation is recorded with its start, end and outcome, and the history is checked
//! (`testbed::history`): no read may return a value that a write acknowledged before the read
//! began had already replaced, nor a value no write produced.
//!
//! Two paths: the standalone proxy in front of three memcached servers on loopback, with TCP
//! clients; and switch mode on the testbed, with clients in both client namespaces sending UDP
//! (routed by the switch) and TCP (spliced by the switch: reads to their servers, writes to the
//! built-in proxy, which invalidates first) to the VIP at the same time, on the same keys.
//! Both run with the configuration [`cache_config`] gives.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::proxy::{Front, Memcached, PoolOpts, Proxy, NAMES};
use common::*;
use testbed::history::{self, Report};
use testbed::history_load::{self, Client, Clock, Load, Mix, Recorded, Transport};

/// The in-network cache under test: a `[cache]` section appended verbatim to the switch's
/// configuration and to the standalone proxy's, so both paths run with it. `None` runs
/// without a cache, where the history must already be coherent (the servers alone are).
/// This is the one place to switch the cache on for these tests.
///
/// The cache holds half the hot keys, so keys keep entering and leaving; rules change at most
/// 50 times a second, so admitted keys wait for their rules and removals wait in the rule
/// buffer; leases are short, so values are refilled all the time.
fn cache_config() -> Option<String> {
    Some(
        "[cache]\nitems = 8\nlease_ms = 300\nrule_rate = 50\nrule_delay_ms = 500\n\
         segment_ms = 200\n"
            .into(),
    )
}

/// The cache's hits and fills on `/metrics`, when it runs: the history must have exercised it.
fn cache_exercised(path: &str, metrics: &str) {
    if cache_config().is_none() {
        return;
    }
    let sample = |name: &str| -> u64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    let (hits, fills, refused) = (
        sample("kvswitch_cache_hits_total"),
        sample("kvswitch_cache_fills_total"),
        sample("kvswitch_cache_fills_refused_total"),
    );
    println!("{path}: cache hits {hits}, fills {fills}, refused fills {refused}");
    // The count follows the run's length (keys wait `rule_delay_ms` for their rules, and
    // leases are short), and the run ends at its operation target: about 300 hits a second of
    // load. The bound asks for a second's worth.
    assert!(hits >= 300, "{path}: the cache answered only {hits} reads");
    assert!(fills >= 100, "{path}: the cache filled only {fills} times");
}

/// Hot keys: few, so that reads and writes of different clients meet on each.
const KEYS: usize = 16;
/// Operations each path records at least, together over 100,000.
const MIN_OPS: usize = 50_000;
/// What each path aims for: a little over [`MIN_OPS`], since the time limit may cut it short.
const TARGET_OPS: usize = 80_000;
/// Bounds each path's load even on a slow machine.
const LOAD_LIMIT: Duration = Duration::from_secs(25);
/// At most this share of operations may go unanswered: each one weakens what the history
/// proves, since its write is only possible.
const MAX_UNANSWERED: f64 = 0.02;
const SEED: u64 = 0x6b76_7377_6974_6368;

fn hot_keys(tag: &str) -> Vec<String> {
    (0..KEYS)
        .map(|i| format!("coh:{tag}:{}:{i}", std::process::id()))
        .collect()
}

fn load(tag: &str, clients: usize) -> Load {
    Load {
        keys: hot_keys(tag),
        ops_per_client: TARGET_OPS.div_ceil(clients),
        duration: LOAD_LIMIT,
        mix: Mix::default(),
        seed: SEED,
    }
}

/// Checks the history, prints what it holds and asserts that it is coherent and says
/// something: enough operations, few unanswered, hits on other clients' values.
fn check(path: &str, recorded: &Recorded) -> Report {
    let started = Instant::now();
    let report = history::check(&recorded.ops);
    let took = started.elapsed();
    let ops = recorded.ops.len();
    let per_s = ops as f64 / recorded.elapsed.as_secs_f64().max(1e-9);
    println!(
        "{path}: {} in {:.1?} ({per_s:.0} ops/s), checked in {took:.1?}; {} unanswered, {} \
         SERVER_ERROR, {} reconnects",
        report.stats,
        recorded.elapsed,
        recorded.timeouts(),
        recorded.server_errors(),
        recorded.clients.iter().map(|c| c.reconnects).sum::<usize>()
    );
    assert!(
        recorded.bad_replies.is_empty(),
        "{path}: {} replies memcached would not give, first: {:#?}",
        recorded.bad_replies.len(),
        &recorded.bad_replies[..recorded.bad_replies.len().min(5)]
    );
    if !report.ok() {
        panic!(
            "{path}: {} of {} reads violate coherence; the first:\n{}",
            report.violations.len(),
            report.stats.reads,
            report.first_violations(10)
        );
    }
    assert!(ops >= MIN_OPS, "{path}: only {ops} operations recorded");
    let unanswered = recorded.timeouts() + recorded.server_errors();
    assert!(
        (unanswered as f64) <= MAX_UNANSWERED * ops as f64,
        "{path}: {unanswered} of {ops} operations unanswered"
    );
    // A history whose reads never see another client's writes proves nothing about them.
    assert!(
        report.stats.hits_from_others >= report.stats.reads / 10,
        "{path}: {}",
        report.stats
    );
    report
}

/// (a) `kvswitch proxy` alone, two workers, in front of three memcached servers on loopback;
/// TCP clients, each on its own connection, so that the kernel spreads them over the workers.
#[test]
fn proxy_alone_keeps_reads_coherent() {
    let servers: Vec<Memcached> = NAMES.iter().map(|_| Memcached::start()).collect();
    let pool: Vec<(&str, SocketAddr)> = NAMES
        .iter()
        .zip(&servers)
        .map(|(n, m)| (*n, m.addr()))
        .collect();
    let cache = cache_config().unwrap_or_default();
    let opts = PoolOpts {
        api: true,
        ..PoolOpts::default()
    };
    let proxy = Proxy::start_with(Front::Kvswitch, &pool, &opts, &cache);
    let api = proxy.api();

    let clients: Vec<Client> = (1..=12)
        .map(|id| Client {
            id,
            transport: Transport::Tcp,
            target: proxy.addr,
            // Longer than the pool's server timeout, which answers SERVER_ERROR first.
            timeout: Duration::from_secs(3),
            netns: None,
        })
        .collect();
    let load = load("proxy", clients.len());
    let recorded = history_load::run(&clients, &load, Clock::start()).expect("load");
    assert!(proxy.alive(), "the proxy died:\n{}", proxy.log_tail());
    check("proxy", &recorded);
    let (_, body) = testbed::http_get(api, "/metrics").expect("the proxy's metrics");
    cache_exercised("proxy", &body);
}

/// The check catches incoherence end to end: clients split between two memcached servers that
/// know nothing of each other (as a cache that missed invalidations would) on the same keys
/// must produce stale reads.
#[test]
fn two_unsynchronised_servers_are_caught() {
    let servers = [Memcached::start(), Memcached::start()];
    let clients: Vec<Client> = (1..=8)
        .map(|id| Client {
            id,
            transport: Transport::Tcp,
            target: servers[id as usize % 2].addr(),
            timeout: Duration::from_secs(3),
            netns: None,
        })
        .collect();
    let load = Load {
        ops_per_client: 1_000,
        ..load("split", clients.len())
    };
    let recorded = history_load::run(&clients, &load, Clock::start()).expect("load");
    assert!(
        recorded.bad_replies.is_empty(),
        "{:?}",
        recorded.bad_replies
    );
    let report = history::check(&recorded.ops);
    let stale = report
        .violations
        .iter()
        .filter(|v| matches!(v, history::Violation::Stale { .. }))
        .count();
    println!(
        "split: {}; {stale} stale reads of {} violations",
        report.stats,
        report.violations.len()
    );
    assert!(
        stale > 0,
        "reads from two unsynchronised servers passed: {}",
        report.stats
    );
}

/// (b) Switch mode: in each client namespace three UDP clients (to the VIP, routed by key by
/// the switch) and three TCP clients (to the VIP, on the switch's splice: reads go to their
/// servers on legs, writes to the host's leg, where the proxy invalidates before it forwards),
/// all on the same keys at once. Reads over one transport must see writes made over the other.
#[test]
fn switch_udp_and_tcp_keep_reads_coherent() {
    let live = testbed_with("kcoh", "l3", false, |o| o.extra_config = cache_config());
    let vip = vip(&live);
    let mut clients = Vec::new();
    for (n, host) in ["c1", "c2"].iter().enumerate() {
        let netns = live.host(host).expect("client host").netns.clone();
        for i in 0..6u32 {
            // UDP: a lost datagram stays lost, so a short wait; TCP: longer than the proxy's
            // server timeout, which answers SERVER_ERROR first.
            let (transport, timeout) = if i % 2 == 0 {
                (Transport::Udp, Duration::from_millis(500))
            } else {
                (Transport::Tcp, Duration::from_secs(3))
            };
            clients.push(Client {
                id: 1 + n as u32 * 6 + i,
                transport,
                target: vip,
                timeout,
                netns: Some(netns.clone()),
            });
        }
    }
    let recorded =
        history_load::run(&clients, &load("switch", clients.len()), Clock::start()).expect("load");
    let report = check("switch", &recorded);

    // Both transports did their share, and each read the other's writes.
    let transport: HashMap<u32, Transport> = clients.iter().map(|c| (c.id, c.transport)).collect();
    let mut crossed: HashMap<(Transport, Transport), usize> = HashMap::new();
    for &(read, write) in &report.sources {
        let by = |i: usize| transport[&recorded.ops[i].client];
        *crossed.entry((by(write), by(read))).or_default() += 1;
    }
    println!(
        "switch: {} ops over UDP, {} over TCP; reads by (writer's, reader's) transport: {crossed:?}",
        recorded.ops_over(Transport::Udp),
        recorded.ops_over(Transport::Tcp)
    );
    for t in [Transport::Udp, Transport::Tcp] {
        assert!(
            recorded.ops_over(t) >= MIN_OPS / 4,
            "{t:?} did too little: {}",
            recorded.ops_over(t)
        );
    }
    for pair in [
        (Transport::Udp, Transport::Tcp),
        (Transport::Tcp, Transport::Udp),
    ] {
        assert!(
            crossed.get(&pair).copied().unwrap_or(0) >= 100,
            "few reads of values written over the other transport: {crossed:?}"
        );
    }
    cache_exercised("switch", &metrics(&live));
    // Some of those reads were answered by the XDP program from its copy of the cache, and
    // none of them was stale.
    let hits = status(&live)["datapath"]["xdp_frames"]["cache_hits"]
        .as_u64()
        .expect("the XDP counters");
    println!("switch: {hits} reads answered from the kernel cache");
    assert!(hits > 0, "no read was answered from the kernel cache");
    assert_eq!(drops(&live, "vip_unhandled"), 0);
    // The TCP clients were on the splice: requests went to servers on legs, and the writes
    // to the host's leg.
    let tcp = &status(&live)["tcp"];
    println!("switch: tcp {tcp}");
    assert_eq!(tcp["path"], "splice", "{tcp}");
    assert!(tcp["requests"].as_u64().unwrap_or(0) > 0, "{tcp}");
    let handed = tcp["connections"]["handed_over"].as_u64().unwrap_or(0)
        + tcp["connections"]["proxied"].as_u64().unwrap_or(0);
    assert!(handed > 0, "no write reached the host's leg: {tcp}");
    live.down().expect("down");
}
