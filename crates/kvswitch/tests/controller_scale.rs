//! The pool following its load through the controller (`[scale]`), with a kvswitch proxy in
//! front of memcached servers on loopback, the load read from memcached's own `stats`:
//!
//! - a load past `add_above` per server brings a spare in within a stated time, warming up:
//!   no read of a key stored before is missed while it joins; when the load ends it leaves
//!   again, and a key written while it held it is not read stale from its owner afterwards;
//! - reads skewed onto one server's keys move that server's weight down within its bound, and
//!   once the reads are even again every weight goes back to its own.
//!
//! Requires memcached.

mod common;

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use api::Client;
use common::fleet::{controller_toml, proxies, servers, until_pools};
use common::proxy::{count, Conn, Memcached, PoolOpts};
use serde_json::Value;

fn scale(ctl: &Client) -> Value {
    ctl.call("GET", "/api/v1/status", None).unwrap()["scale"].clone()
}

/// Waits (at most `limit`) until `done` holds of the controller's `scale` status; how long.
fn until(ctl: &Client, limit: Duration, what: &str, done: impl Fn(&Value) -> bool) -> Duration {
    let started = Instant::now();
    loop {
        let s = scale(ctl);
        if done(&s) {
            return started.elapsed();
        }
        assert!(started.elapsed() < limit, "{what} within {limit:?}: {s}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Reads `keys` through `conn`, 100 to a batch; how many were missed, and how many were read
/// with the value `old`.
fn read_all(conn: &mut Conn, keys: &[String]) -> (u64, u64) {
    let (mut missed, mut other) = (0, 0);
    for batch in keys.chunks(100) {
        let mut req = Vec::new();
        for k in batch {
            req.extend_from_slice(format!("get {k}\r\n").as_bytes());
        }
        assert!(conn.send(&req));
        let n = batch.len();
        let seen = conn.read_until(|b| count(b, b"END\r\n") >= n, Duration::from_secs(10));
        assert!(count(&seen.bytes, b"END\r\n") >= n, "replies to a batch");
        let values = count(&seen.bytes, b"VALUE ");
        missed += (n - values) as u64;
        other += count(&seen.bytes, b"\r\nold\r\n") as u64;
    }
    (missed, other)
}

/// A controller of `proxies` and `list` with `scale` as its `[scale]` table.
fn controller(
    proxies: &[Client],
    list: &[(&str, SocketAddr)],
    scale: &str,
) -> (controller::Running, Client) {
    let apis: Vec<SocketAddr> = proxies.iter().map(|c| c.api).collect();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let api = listener.local_addr().unwrap();
    let mut text = controller_toml(api, "probe_interval_ms = 50", &apis, list);
    text.push_str(&format!("[scale]\n{scale}\n"));
    let file = config::controller::parse(&text, Path::new("controller.toml")).unwrap();
    let running = controller::start(file, listener, None, None, None).unwrap();
    (running, Client::new(api, None))
}

#[test]
fn a_spare_joins_under_load_without_a_read_missed_and_leaves_when_the_load_ends() {
    let (_servers, list) = servers(&["s1", "s2"]);
    let spare = Memcached::start();
    let (proxies, clients) = proxies(1, &list, &PoolOpts::default());
    let settings = format!(
        "interval_ms = 250\nsustain = 2\nspares = [\"{}\"]\nadd_above = 1000\n\
         remove_below = 200\nwarm_up_ms = 4000",
        spare.addr()
    );
    let (_controller, ctl) = controller(&clients, &list, &settings);
    until_pools(&clients, &["s1", "s2"], Duration::from_secs(10));
    // The spare holds old values of the keys, as one that left the pool before would.
    let keys: Vec<String> = (0..300).map(|i| format!("sc:{i}")).collect();
    let mut old = Conn::open(spare.addr());
    for k in &keys {
        let set = format!("set {k} 0 0 3\r\nold\r\n");
        assert_eq!(old.text(set.as_bytes()), b"STORED\r\n");
    }
    // And keys the load does not read.
    let unread: Vec<String> = (0..300).map(|i| format!("sd:{i}")).collect();
    let mut conn = Conn::open(proxies[0].addr);
    for k in keys.iter().chain(&unread) {
        let set = format!("set {k} 0 0 3\r\nnew\r\n");
        assert_eq!(conn.text(set.as_bytes()), b"STORED\r\n");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let missed = Arc::new(AtomicU64::new(0));
    let stale = Arc::new(AtomicU64::new(0));
    let loader = {
        let (addr, stop, keys) = (proxies[0].addr, stop.clone(), keys.clone());
        let (missed, stale) = (missed.clone(), stale.clone());
        std::thread::spawn(move || {
            let mut conn = Conn::open(addr);
            let started = Instant::now();
            while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(40) {
                let (m, s) = read_all(&mut conn, &keys);
                missed.fetch_add(m, Ordering::Relaxed);
                stale.fetch_add(s, Ordering::Relaxed);
            }
        })
    };
    // Two readings past the bound (250 ms apart, the first one only where counting starts),
    // then the sync: well within 10 s.
    let joined = until(&ctl, Duration::from_secs(10), "the spare added", |s| {
        s["added"] == 1 && s["spares"][0]["in_pool"] == true
    });
    let spare_label = spare.addr().to_string();
    let mut with_spare = vec!["s1", "s2", spare_label.as_str()];
    with_spare.sort();
    until_pools(&clients, &with_spare, Duration::from_secs(5));
    // Writes while the spare holds its keys, once it is warm (4 s; during the warm-up the proxy
    // moves a key it reads and deletes a key written where it was before), of keys not read
    // meanwhile: afterwards the servers the keys go back to must not answer with what they
    // held before.
    let status = scale(&ctl);
    eprintln!("joined after {joined:?}: {status}");
    assert!(status["per_server"].as_f64() > Some(1000.0), "{status}");
    std::thread::sleep(Duration::from_millis(4500));
    for k in &unread {
        let set = format!("set {k} 0 0 5\r\nnewer\r\n");
        assert_eq!(conn.text(set.as_bytes()), b"STORED\r\n");
    }
    let mut direct = Conn::open(spare.addr());
    let on_spare: Vec<String> = unread
        .iter()
        .filter(|k| {
            direct
                .text(format!("get {k}\r\n").as_bytes())
                .ends_with(b"\r\nnewer\r\nEND\r\n")
        })
        .cloned()
        .collect();
    assert!(!on_spare.is_empty(), "the spare took no key");
    assert_eq!(scale(&ctl)["removed"], 0, "the spare left under load");

    // Reads went on through the change; the spare filled from the keys' previous owners.
    stop.store(true, Ordering::Relaxed);
    loader.join().unwrap();
    assert_eq!(
        missed.load(Ordering::Relaxed),
        0,
        "reads missed while the spare joined"
    );
    // Emptied as it joined: no key is read with the value the spare held before.
    assert_eq!(
        stale.load(Ordering::Relaxed),
        0,
        "reads of the spare's old values"
    );
    assert_eq!(read_all(&mut conn, &keys).1, 0);

    // The load ended: the spare leaves.
    let left = until(&ctl, Duration::from_secs(10), "the spare removed", |s| {
        s["removed"] == 1 && s["spares"][0]["in_pool"] == false
    });
    until_pools(&clients, &["s1", "s2"], Duration::from_secs(5));
    eprintln!("left after {left:?}: {}", scale(&ctl));
    for k in &on_spare {
        let got = conn.text(format!("get {k}\r\n").as_bytes());
        assert!(
            got == b"END\r\n" || got == format!("VALUE {k} 0 5\r\nnewer\r\nEND\r\n").as_bytes(),
            "{k} read as {:?} after the spare left",
            String::from_utf8_lossy(&got)
        );
    }
    let metrics = ctl.call("GET", "/metrics", None).unwrap();
    let metrics = metrics.as_str().unwrap_or_default();
    assert!(
        metrics.contains("kvswitch_controller_scale_changes_total{kind=\"spare_added\"} 1"),
        "{metrics}"
    );
}

#[test]
fn reads_skewed_onto_one_server_move_its_weight_down_and_back_when_they_even_out() {
    let names = ["s1", "s2", "s3"];
    let (_servers, list) = servers(&names);
    let (proxies, clients) = proxies(1, &list, &PoolOpts::default());
    let (_controller, ctl) = controller(
        &clients,
        &list,
        "interval_ms = 250\nsustain = 2\nweights = [0.5, 2.0]\nweight_band = 0.2",
    );
    until_pools(&clients, &names, Duration::from_secs(10));
    let servers: Vec<kv::Server> = names.iter().map(|n| kv::Server::new(*n, 1)).collect();
    let ring = kv::Ring::new(kv::Distribution::Ketama, kv::HashFn::Md5, &servers).unwrap();
    // 900 keys, 300 on each server; the skewed load reads s1's four times as often.
    let keys = common::proxy::spread_keys(&ring, "wt:", 300);
    let mut conn = Conn::open(proxies[0].addr);
    for k in &keys {
        let set = format!("set {k} 0 0 1\r\nx\r\n");
        assert_eq!(conn.text(set.as_bytes()), b"STORED\r\n");
    }
    let on_s1: Vec<String> = keys
        .iter()
        .filter(|k| ring.locate(k.as_bytes()) == 0)
        .cloned()
        .collect();
    let skewed: Vec<String> = keys
        .iter()
        .chain(on_s1.iter())
        .chain(on_s1.iter())
        .chain(on_s1.iter())
        .cloned()
        .collect();
    let weights = |c: &Client| -> Vec<u64> {
        let doc = c.call("GET", "/api/v1/pool", None).unwrap();
        let mut by_name: Vec<(String, u64)> = doc["pools"][0]["servers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["label"].as_str().unwrap().to_string(),
                    s["weight"].as_u64().unwrap(),
                )
            })
            .collect();
        by_name.sort();
        by_name.into_iter().map(|(_, w)| w).collect()
    };
    let load = |keys: Vec<String>, stop: Arc<AtomicBool>| {
        let addr = proxies[0].addr;
        std::thread::spawn(move || {
            let mut conn = Conn::open(addr);
            let started = Instant::now();
            while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(40) {
                read_all(&mut conn, &keys);
            }
        })
    };

    let stop = Arc::new(AtomicBool::new(false));
    let loader = load(skewed, stop.clone());
    let moved = until(&ctl, Duration::from_secs(10), "weights moved", |s| {
        s["weight_changes"].as_u64() >= Some(1)
    });
    let started = Instant::now();
    let w = loop {
        let w = weights(&clients[0]);
        if w[0] < w[1] && w[0] < w[2] {
            break w;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the proxy's weights: {w:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // Within its bound: at least half its own weight (in hundredths), at most twice.
    assert!(w.iter().all(|&x| (50..=200).contains(&x)), "{w:?}");
    stop.store(true, Ordering::Relaxed);
    loader.join().unwrap();
    eprintln!("moved after {moved:?} to {w:?}: {}", scale(&ctl));

    // Even reads: the weights go back to the servers' own.
    let stop = Arc::new(AtomicBool::new(false));
    let loader = load(keys.clone(), stop.clone());
    let back = until(&ctl, Duration::from_secs(15), "weights back", |s| {
        s["weights_restored"].as_u64() >= Some(1)
    });
    let started = Instant::now();
    while weights(&clients[0]) != [1, 1, 1] {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the proxy's weights: {:?}; {}",
            weights(&clients[0]),
            scale(&ctl)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    loader.join().unwrap();
    eprintln!("back after {back:?}: {}", scale(&ctl));
}
