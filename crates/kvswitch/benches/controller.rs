//! The controller's figures, with kvswitch proxies (each with its control API) in front of
//! real memcached servers on loopback:
//!
//! - the time to push a pool change (a server added, then removed, through the controller's
//!   API) to 2 and to 8 switches, until every one lists it: median of 5;
//! - with the default probe settings, the time from a server's death to the last failed
//!   request through the proxies (TCP);
//! - the controller's CPU at idle, as a process of its own driving 8 switches;
//! - a screenshot of its dashboard under load (headless Chromium), kept in
//!   `target/kvswitch-bench/controller-dashboard.png`.
//!
//! Requires memcached. Nothing here asserts on time: `cargo bench -p kvswitch --bench controller`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use api::Client;
use common::fleet::{controller_toml, pool_of, proxies as fleet};
use common::proxy::{free_port, Memcached, PoolOpts, Proxy};
use serde_json::json;
use testbed::local;

const ROUNDS: usize = 5;

/// Waits until `has(labels)` holds on every switch; the time it took.
fn until_all(clients: &[Client], has: impl Fn(&[String]) -> bool) -> Duration {
    let started = Instant::now();
    while !clients.iter().all(|c| has(&pool_of(c))) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the switches never followed"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    started.elapsed()
}

fn file(api: SocketAddr, switches: &[SocketAddr], servers: &[(&str, SocketAddr)]) -> String {
    controller_toml(api, "", switches, servers)
}

fn proxies(n: usize, servers: &[(&str, SocketAddr)]) -> (Vec<Proxy>, Vec<Client>) {
    let opts = PoolOpts {
        workers: 1,
        timeout_ms: 300,
        ..PoolOpts::default()
    };
    fleet(n, servers, &opts)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let mut servers: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let spare = Memcached::start();
    let names = ["s1", "s2", "s3"];
    let list: Vec<(&str, SocketAddr)> = names
        .iter()
        .zip(&servers)
        .map(|(n, m)| (*n, m.addr()))
        .collect();

    println!("a pool change pushed through the controller, until every switch lists it (median of {ROUNDS}):");
    for n in [2usize, 8] {
        let (_procs, clients) = proxies(n, &list);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let api = listener.local_addr().unwrap();
        let apis: Vec<SocketAddr> = clients.iter().map(|c| c.api).collect();
        let cfg = config::controller::parse(&file(api, &apis, &list), Path::new("c.toml")).unwrap();
        let _running = controller::start(cfg, listener, None, None, None).unwrap();
        let ctl = Client::new(api, None);
        until_all(&clients, |l| l.len() == 3);
        let (mut adds, mut removals) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let started = Instant::now();
            let body = json!({"addr": spare.addr().to_string(), "name": "s4"});
            ctl.call("POST", "/api/v1/pool/servers", Some(&body))
                .unwrap();
            until_all(&clients, |l| l.iter().any(|s| s == "s4"));
            adds.push(started.elapsed());
            let started = Instant::now();
            ctl.call("DELETE", "/api/v1/pool/servers/s4", None).unwrap();
            until_all(&clients, |l| !l.iter().any(|s| s == "s4"));
            removals.push(started.elapsed());
        }
        println!(
            "  {n} switches: server added {:>8.1?}, removed {:>8.1?}",
            median(adds),
            median(removals)
        );
    }

    // A server's death under load, default probe settings.
    let (procs, clients) = proxies(2, &list);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let api = listener.local_addr().unwrap();
    let apis: Vec<SocketAddr> = clients.iter().map(|c| c.api).collect();
    let cfg = config::controller::parse(&file(api, &apis, &list), Path::new("c.toml")).unwrap();
    let running = controller::start(cfg, listener, None, None, None).unwrap();
    until_all(&clients, |l| l.len() == 3);
    let origin = Instant::now();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let loads: Vec<_> = procs
        .iter()
        .map(|p| {
            let (front, stop) = (p.addr, stop.clone());
            std::thread::spawn(move || {
                let keys: Vec<Vec<u8>> = (0..20).map(|i| format!("k{i}").into_bytes()).collect();
                let mut last_failed = None;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let began = origin.elapsed();
                    if local::store(front, &keys).is_err() {
                        last_failed = Some(began);
                    }
                }
                last_failed
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let killed = origin.elapsed();
    servers[1].kill();
    until_all(&clients, |l| l.len() == 2);
    let out = origin.elapsed();
    std::thread::sleep(Duration::from_millis(1000));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let last = loads
        .into_iter()
        .filter_map(|l| l.join().ok().flatten())
        .max();
    println!(
        "a server killed under TCP load (probes every 100 ms, down after 3): out of both pools \
         {:.0?} after its death; the last failed request began {}",
        out - killed,
        match last {
            Some(t) => format!("{:.0?} after it", t.saturating_sub(killed)),
            None => "never: none failed".into(),
        }
    );
    drop(running);
    servers[1].restart();

    // The controller's CPU at idle: its own process, 8 switches, 3 servers.
    let (idle_procs, clients) = proxies(8, &list);
    let api = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let apis: Vec<SocketAddr> = clients.iter().map(|c| c.api).collect();
    let dir = local::TempDir::new("kvswitch-controller-bench").unwrap();
    let path = dir.path().join("controller.toml");
    std::fs::write(&path, file(api, &apis, &list)).unwrap();
    let proc = local::Proc::spawn(
        "kvswitch controller",
        Command::new(env!("CARGO_BIN_EXE_kvswitch"))
            .arg("controller")
            .arg("--config")
            .arg(&path),
    )
    .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let ticks = |pid: u32| -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let f: Vec<&str> = after.split_whitespace().collect();
        // utime and stime: fields 14 and 15 of the line, 12 and 13 after the name.
        f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
            + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let before = ticks(proc.pid());
    let window = Duration::from_secs(10);
    std::thread::sleep(window);
    let used = (ticks(proc.pid()) - before) as f64 / hz;
    println!(
        "the controller at idle (8 switches, 3 servers, probes every 100 ms, syncs every 1 s): \
         {:.2}% of one core over {window:?}",
        100.0 * used / window.as_secs_f64()
    );

    // The dashboard under load, as a picture.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let loads: Vec<_> = idle_procs
        .iter()
        .take(4)
        .map(|p| {
            let (front, stop) = (p.addr, stop.clone());
            std::thread::spawn(move || {
                let keys: Vec<Vec<u8>> = (0..50).map(|i| format!("d{i}").into_bytes()).collect();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = local::store(front, &keys);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/kvswitch-bench");
    let _ = std::fs::create_dir_all(&out);
    let shot = out.join("controller-dashboard.png");
    let taken = local::require("chromium").ok().and_then(|bin| {
        Command::new(bin)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
            ])
            .arg("--window-size=1400,900")
            .arg(format!(
                "--user-data-dir={}",
                dir.path().join("profile").display()
            ))
            .arg("--virtual-time-budget=5000")
            .arg(format!("--screenshot={}", shot.display()))
            .arg(format!("http://{api}/"))
            .output()
            .ok()
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for l in loads {
        let _ = l.join();
    }
    match taken {
        Some(o) if o.status.success() && shot.exists() => {
            println!("the dashboard under load: {}", shot.display())
        }
        _ => println!("no screenshot of the dashboard: chromium is missing or failed"),
    }
    drop(proc);
}
