//! Consistent hashing with bounded loads through the controller (`bounded_loads`): two kvswitch
//! proxies in front of four memcached servers on loopback, a Zipf 0.99 load of reads through
//! both, and the controller placing the ring's arcs by the requests the proxies count.
//!
//! - under ketama alone the hottest server takes well over 1.25 times the mean (checked on the
//!   ring itself); once the controller has placed the arcs, memcached's own counts of the same
//!   load keep every server within 1.25 times the mean (and a margin for the interval the
//!   placement was measured over);
//! - both proxies hold the same placement, and a key written through one is read through the
//!   other;
//! - a placement for another ring, or naming a point past the ring, is refused; deleting it
//!   puts every arc back with its ketama owner.
//!
//! Requires memcached.

mod common;

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use api::Client;
use common::fleet::{controller_toml, proxies, servers, until_pools};
use common::proxy::{count, stat, Conn, Memcached, PoolOpts};
use serde_json::{json, Value};

const EPSILON: f64 = 0.25;
const NAMES: [&str; 4] = ["s1", "s2", "s3", "s4"];

/// One cycle of the load: each of 400 keys read in proportion to its Zipf 0.99 share
/// (at least once), interleaved by a fixed shuffle. Deterministic, so every cycle loads the
/// servers alike.
fn cycle() -> Vec<String> {
    let keys = 400u64;
    let zipf = kv::zipf::Zipf::new(keys, 0.99);
    let mut reads: Vec<(u64, String)> = Vec::new();
    for k in 0..keys {
        let n = ((zipf.share(k + 1) * 6000.0).round() as u64).max(1);
        for j in 0..n {
            let mix = kv::hash::HashFn::Fnv1a64.hash(format!("{k}/{j}").as_bytes());
            reads.push((u64::from(mix), format!("bl:{k}")));
        }
    }
    reads.sort();
    reads.into_iter().map(|(_, k)| k).collect()
}

/// Reads every key of `keys` through `conn`, 100 to a batch.
fn read_all(conn: &mut Conn, keys: &[String]) {
    for batch in keys.chunks(100) {
        let mut req = Vec::new();
        for k in batch {
            req.extend_from_slice(format!("get {k}\r\n").as_bytes());
        }
        assert!(conn.send(&req));
        let n = batch.len();
        let seen = conn.read_until(|b| count(b, b"END\r\n") >= n, Duration::from_secs(10));
        assert!(count(&seen.bytes, b"END\r\n") >= n, "replies to a batch");
    }
}

/// Each server's `get_hits`, read from memcached itself.
fn gets(list: &[(&str, SocketAddr)]) -> Vec<u64> {
    list.iter()
        .map(|(_, a)| {
            let mut c = Conn::open(*a);
            let reply = c.call(b"stats\r\n", |b| b.ends_with(b"END\r\n"));
            stat(&reply, "get_hits").expect("get_hits")
        })
        .collect()
}

fn max_over_mean(loads: &[u64]) -> f64 {
    let total: u64 = loads.iter().sum();
    *loads.iter().max().unwrap() as f64 * loads.len() as f64 / total as f64
}

fn balance(ctl: &Client) -> Value {
    ctl.call("GET", "/api/v1/status", None).unwrap()["balance"].clone()
}

#[test]
fn bounded_loads_hold_every_server_within_its_bound_under_a_zipf_load() {
    let (_servers, list) = servers(&NAMES);
    let (proxies, clients) = proxies(2, &list, &PoolOpts::default());
    let apis: Vec<SocketAddr> = clients.iter().map(|c| c.api).collect();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let api = listener.local_addr().unwrap();
    let settings = format!(
        "probe_interval_ms = 50\nbounded_loads = {EPSILON}\nbalance_interval_ms = 1000\n\
         balance_min_requests = 500"
    );
    let text = controller_toml(api, &settings, &apis, &list);
    let file = config::controller::parse(&text, Path::new("controller.toml")).unwrap();
    let _controller = controller::start(file, listener, None, None, None).unwrap();
    let ctl = Client::new(api, None);
    until_pools(&clients, &NAMES, Duration::from_secs(10));

    // Under ketama alone this load is far from even.
    let cycle = cycle();
    let servers: Vec<kv::Server> = NAMES.iter().map(|n| kv::Server::new(*n, 1)).collect();
    let ring = kv::Ring::new(kv::Distribution::Ketama, kv::HashFn::Md5, &servers).unwrap();
    let mut natural = vec![0u64; NAMES.len()];
    for k in &cycle {
        natural[ring.locate(k.as_bytes())] += 1;
    }
    let ketama = max_over_mean(&natural);
    assert!(
        ketama > 1.4,
        "the load must be uneven under ketama: {natural:?}"
    );

    // The load through both proxies until the controller has placed the arcs.
    let stop = Arc::new(AtomicBool::new(false));
    let loaders: Vec<_> = proxies
        .iter()
        .map(|p| {
            let (addr, stop, cycle) = (p.addr, stop.clone(), cycle.clone());
            std::thread::spawn(move || {
                let mut conn = Conn::open(addr);
                let started = Instant::now();
                while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(30) {
                    read_all(&mut conn, &cycle);
                }
            })
        })
        .collect();
    let started = Instant::now();
    while balance(&ctl)["placements"].as_u64() < Some(1) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no placement: {}",
            balance(&ctl)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Both proxies take it (the balancer gives it to each in the same round).
    let started = Instant::now();
    loop {
        let arcs: Vec<Value> = clients
            .iter()
            .map(|c| c.call("GET", "/api/v1/pool/arcs", None).unwrap())
            .collect();
        if arcs.iter().all(|a| a["placed"] == true) && arcs[0]["owners"] == arcs[1]["owners"] {
            assert_eq!(arcs[0]["servers"], json!(NAMES));
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "{arcs:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    for l in loaders {
        l.join().unwrap();
    }

    // One cycle of the same load, counted by memcached: its hits, as every key is stored
    // first (the proxy's sentinel after a batch of gets, a miss, is not the load's). The
    // balancer goes on meanwhile: a cycle during which it placed the arcs again is run again.
    let mut conn = Conn::open(proxies[0].addr);
    let mut placed = Vec::new();
    for attempt in 0..3 {
        let placements = balance(&ctl)["placements"].as_u64();
        for k in 0..400 {
            let set = format!("set bl:{k} 0 0 1\r\nx\r\n");
            assert_eq!(conn.text(set.as_bytes()), b"STORED\r\n");
        }
        let before = gets(&list);
        read_all(&mut conn, &cycle);
        let after = gets(&list);
        placed = after.iter().zip(&before).map(|(a, b)| a - b).collect();
        if balance(&ctl)["placements"].as_u64() == placements {
            break;
        }
        assert!(
            attempt < 2,
            "placed again during every cycle: {}",
            balance(&ctl)
        );
    }
    let bounded = max_over_mean(&placed);
    let status = balance(&ctl);
    eprintln!(
        "max/mean: ketama {ketama:.3} ({natural:?}), bounded loads {bounded:.3} ({placed:?}); \
         {status}"
    );
    assert_eq!(placed.iter().sum::<u64>(), cycle.len() as u64);
    assert!(
        bounded <= 1.0 + EPSILON + 0.05,
        "bounded loads: {placed:?}, {bounded} over the mean; {status}"
    );
    assert!(status["moved_arcs"].as_u64() > Some(0), "{status}");

    // A key written through one proxy is read through the other, moved arcs or not.
    let mut other = Conn::open(proxies[1].addr);
    for i in 0..200 {
        let set = format!("set bl:{i} 0 0 2\r\nv{}\r\n", i % 10);
        assert_eq!(conn.text(set.as_bytes()), b"STORED\r\n");
        let got = other.text(format!("get bl:{i}\r\n").as_bytes());
        assert_eq!(
            got,
            format!("VALUE bl:{i} 0 2\r\nv{}\r\nEND\r\n", i % 10).as_bytes()
        );
    }
    let metrics = ctl.call("GET", "/metrics", None).unwrap();
    let metrics = metrics.as_str().unwrap_or_default();
    assert!(
        metrics.contains("kvswitch_controller_balance_placements_total"),
        "{metrics}"
    );
}

#[test]
fn a_placement_for_another_ring_is_refused_and_one_set_outlives_a_server_added() {
    let (_servers, list) = servers(&NAMES[..2]);
    let (proxies, clients) = proxies(1, &list, &PoolOpts::default());
    let c = &clients[0];
    let arcs = c.call("GET", "/api/v1/pool/arcs", None).unwrap();
    assert_eq!(arcs["placed"], false);
    let points = arcs["points"].as_u64().unwrap() as usize;
    assert_eq!(points, 320, "160 points a server");
    let natural = arcs["owners"].clone();
    let values: Vec<u64> = arcs["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let absent = (0..u64::from(u32::MAX))
        .find(|v| values.binary_search(v).is_err())
        .unwrap();

    let refused = |body: Value, code: &str, field: &str| {
        let e = c
            .call("PUT", "/api/v1/pool/placement", Some(&body))
            .unwrap_err()
            .to_string();
        assert!(e.contains(code) && e.contains(field), "{body}: {e}");
    };
    refused(
        json!({"servers": ["s1", "s3"], "points": points, "moves": []}),
        "409",
        "servers",
    );
    refused(
        json!({"servers": ["s1", "s2"], "points": points + 1, "moves": []}),
        "409",
        "points",
    );
    refused(
        json!({"servers": ["s1", "s2"], "points": points, "moves": [[absent, "s1"]]}),
        "400",
        "moves",
    );
    refused(
        json!({"servers": ["s1", "s2"], "points": points, "moves": [[values[0], "s9"]]}),
        "400",
        "moves",
    );
    assert_eq!(
        c.call("GET", "/api/v1/pool/arcs", None).unwrap()["placed"],
        false,
        "nothing refused changed the pool"
    );

    // Every arc to s2: every key goes there.
    let to_s2: Vec<Value> = values.iter().map(|v| json!([v, "s2"])).collect();
    c.call(
        "PUT",
        "/api/v1/pool/placement",
        Some(&json!({"servers": ["s1", "s2"], "points": points, "moves": to_s2})),
    )
    .unwrap();
    let arcs = c.call("GET", "/api/v1/pool/arcs", None).unwrap();
    assert_eq!(arcs["placed"], true);
    assert!(arcs["owners"].as_array().unwrap().iter().all(|o| o == 1));
    let mut front = Conn::open(proxies[0].addr);
    let mut s2 = Conn::open(list[1].1);
    for i in 0..20 {
        let set = format!("set all:{i} 0 0 1\r\nx\r\n");
        assert_eq!(front.text(set.as_bytes()), b"STORED\r\n");
        assert_eq!(
            s2.text(format!("get all:{i}\r\n").as_bytes()),
            format!("VALUE all:{i} 0 1\r\nx\r\nEND\r\n").as_bytes(),
            "every key is on s2"
        );
    }
    // A server added keeps the placement where its points still are: s1's arcs stay with
    // s2, and the new server takes its own.
    let s3 = Memcached::start();
    c.call(
        "POST",
        "/api/v1/pool/servers",
        Some(&json!({"addr": s3.addr().to_string(), "name": "s3"})),
    )
    .unwrap();
    let arcs = c.call("GET", "/api/v1/pool/arcs", None).unwrap();
    assert_eq!(arcs["servers"], json!(["s1", "s2", "s3"]));
    assert_eq!(arcs["placed"], true);
    for (v, o) in arcs["values"]
        .as_array()
        .unwrap()
        .iter()
        .zip(arcs["owners"].as_array().unwrap())
    {
        let old = values.binary_search(&v.as_u64().unwrap()).is_ok();
        assert_eq!(o, if old { 1 } else { 2 }, "the point {v}");
    }
    c.call("DELETE", "/api/v1/pool/placement", None).unwrap();
    let arcs = c.call("GET", "/api/v1/pool/arcs", None).unwrap();
    assert_eq!(arcs["placed"], false);
    let ring = kv::Ring::new(
        kv::Distribution::Ketama,
        kv::HashFn::Md5,
        &["s1", "s2", "s3"].map(|n| kv::Server::new(n, 1)),
    )
    .unwrap();
    let ketama: Vec<u32> = ring.points().map(|(_, s)| s).collect();
    assert_eq!(arcs["owners"], json!(ketama));
    assert_ne!(arcs["owners"], natural, "the ring of three");
}
