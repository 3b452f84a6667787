//! The controller driving two kvswitch proxies (each with its control API) in front of real
//! memcached servers on loopback:
//!
//! - a server killed under load is taken out of both proxies' pools within the detection
//!   window; after that no request fails; restarted, it is put back in both;
//! - a server that hangs (SIGSTOP) is taken out the same way, and put back when it goes on;
//! - servers added and removed through the controller's API reach both proxies;
//! - a proxy whose pool is changed behind the controller's back is put right at the next
//!   sync;
//! - the controller's status and metrics say what happened;
//! - every server failing its probes empties no pool.
//!
//! Requires memcached.

mod common;

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::proxy::{free_port, Front, Memcached, PoolOpts, Proxy};
use kvswitch::ctl::Client;
use serde_json::{json, Value};
use testbed::local;

const PROBE_MS: u64 = 50;
const DOWN_AFTER: u32 = 3;

/// The labels of the servers in `client`'s pool.
fn pool_of(client: &Client) -> Vec<String> {
    let doc = client.call("GET", "/api/v1/pool", None).unwrap();
    let mut labels: Vec<String> = doc["pools"][0]["servers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["label"].as_str().map(str::to_string))
        .collect();
    labels.sort();
    labels
}

/// Waits (at most `limit`) until every proxy's pool is `want`; returns how long it took.
fn until_pools(proxies: &[Client], want: &[&str], limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let pools: Vec<Vec<String>> = proxies.iter().map(pool_of).collect();
        if pools.iter().all(|p| p == want) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "the proxies' pools are {pools:?}, not {want:?}, after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn controller_file(
    api: SocketAddr,
    proxies: &[SocketAddr],
    servers: &[(&str, SocketAddr)],
) -> String {
    let mut text = format!(
        "[controller]\napi = \"{api}\"\nprobe_interval_ms = {PROBE_MS}\nprobe_timeout_ms = 100\n\
         down_after = {DOWN_AFTER}\nup_after = 2\nsync_interval_ms = 300\n\n"
    );
    for (i, p) in proxies.iter().enumerate() {
        text.push_str(&format!("[[switches]]\nname = \"p{i}\"\napi = \"{p}\"\n\n"));
    }
    text.push_str("[pool]\ndistribution = \"ketama\"\nhash = \"md5\"\n");
    for (name, addr) in servers {
        text.push_str(&format!(
            "[[pool.servers]]\naddr = \"{addr}\"\nname = \"{name}\"\n"
        ));
    }
    text
}

/// Sets and reads keys through `front` until told to stop, counting the rounds that failed
/// and when the last of them began.
fn load(
    front: SocketAddr,
    stop: Arc<AtomicBool>,
    failed: Arc<AtomicU64>,
    last_failure: Arc<AtomicU64>,
    origin: Instant,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut done = 0u64;
        let keys: Vec<Vec<u8>> = (0..20).map(|i| format!("load:{i}").into_bytes()).collect();
        while !stop.load(Ordering::Relaxed) {
            let began = origin.elapsed().as_millis() as u64;
            if local::store(front, &keys).is_err() {
                failed.fetch_add(1, Ordering::Relaxed);
                last_failure.fetch_max(began, Ordering::Relaxed);
            }
            done += 1;
            std::thread::sleep(Duration::from_millis(5));
        }
        done
    })
}

#[test]
fn a_fleet_follows_its_servers_health_and_the_controllers_changes() {
    let names = ["s1", "s2", "s3"];
    let mut servers: Vec<Memcached> = names.iter().map(|_| Memcached::start()).collect();
    let list: Vec<(&str, SocketAddr)> = names
        .iter()
        .zip(&servers)
        .map(|(n, m)| (*n, m.addr()))
        .collect();
    let apis: Vec<SocketAddr> = (0..2)
        .map(|_| SocketAddr::from(([127, 0, 0, 1], free_port())))
        .collect();
    let proxies: Vec<Proxy> = apis
        .iter()
        .map(|&api| {
            let opts = PoolOpts {
                api: Some(api),
                timeout_ms: 300,
                ..PoolOpts::default()
            };
            Proxy::start(Front::Kvswitch, &list, &opts)
        })
        .collect();
    let clients: Vec<Client> = apis
        .iter()
        .map(|&api| Client { api, token: None })
        .collect();

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let ctl_api = listener.local_addr().unwrap();
    let file = config::controller::parse(
        &controller_file(ctl_api, &apis, &list),
        Path::new("controller.toml"),
    )
    .unwrap();
    let controller = kvswitch::controller::start(file, listener, None, None, None).unwrap();
    let ctl = Client {
        api: ctl_api,
        token: None,
    };
    until_pools(&clients, &["s1", "s2", "s3"], Duration::from_secs(5));

    // A server killed under load: out of both pools within the detection window, and no
    // failure after that.
    let origin = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(AtomicU64::new(0));
    let last_failure = Arc::new(AtomicU64::new(0));
    let loads: Vec<_> = proxies
        .iter()
        .map(|p| {
            load(
                p.addr,
                stop.clone(),
                failed.clone(),
                last_failure.clone(),
                origin,
            )
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "failures before the kill"
    );
    let killed_at = origin.elapsed();
    servers[1].kill();
    let took = until_pools(&clients, &["s1", "s3"], Duration::from_secs(5));
    let out_at = origin.elapsed();
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let rounds: u64 = loads.into_iter().map(|l| l.join().unwrap()).sum();
    let last = Duration::from_millis(last_failure.load(Ordering::Relaxed));
    eprintln!(
        "s2 killed: out of both pools in {took:?}; {} of {rounds} load rounds failed, the last \
         begun {:?} after the kill",
        failed.load(Ordering::Relaxed),
        last.saturating_sub(killed_at)
    );
    // Only rounds begun before both pools had let s2 go may fail.
    assert!(
        failed.load(Ordering::Relaxed) == 0 || last <= out_at,
        "a round begun {last:?} into the run failed, after s2 left both pools at {out_at:?}"
    );
    let status = ctl.call("GET", "/api/v1/status", None).unwrap();
    let s2 = status["servers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["label"] == "s2")
        .unwrap()
        .clone();
    assert_eq!(
        (s2["up"].clone(), s2["downs"].clone()),
        (json!(false), json!(1)),
        "{s2}"
    );

    // Restarted: back in both pools.
    servers[1].restart();
    until_pools(&clients, &["s1", "s2", "s3"], Duration::from_secs(5));

    // Scaling through the controller's API.
    let s4 = Memcached::start();
    let body = json!({"addr": s4.addr().to_string(), "name": "s4"});
    ctl.call("POST", "/api/v1/pool/servers", Some(&body))
        .unwrap();
    until_pools(&clients, &["s1", "s2", "s3", "s4"], Duration::from_secs(5));
    let e = ctl
        .call("POST", "/api/v1/pool/servers", Some(&body))
        .unwrap_err()
        .to_string();
    assert!(e.contains("409"), "{e}");
    ctl.call("DELETE", "/api/v1/pool/servers/s3", None).unwrap();
    until_pools(&clients, &["s1", "s2", "s4"], Duration::from_secs(5));

    // A proxy changed behind the controller's back is put right.
    clients[0]
        .call("DELETE", "/api/v1/pool/servers/s1", None)
        .unwrap();
    until_pools(&clients, &["s1", "s2", "s4"], Duration::from_secs(5));
    let keys: Vec<Vec<u8>> = (0..50).map(|i| format!("after:{i}").into_bytes()).collect();
    for p in &proxies {
        local::store(p.addr, &keys).unwrap();
    }

    // A server that hangs (stopped, its port still open) is taken out too, and put back
    // when it goes on.
    let pid = servers[1].pid().expect("s2 runs") as libc::pid_t;
    // SAFETY: kill takes no pointers; the PID is our own child's.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    until_pools(&clients, &["s1", "s4"], Duration::from_secs(5));
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    until_pools(&clients, &["s1", "s2", "s4"], Duration::from_secs(5));

    let metrics = ctl.call("GET", "/metrics", None).unwrap();
    let text = metrics.as_str().unwrap_or_default().to_string();
    assert!(
        text.contains("kvswitch_controller_server_downs_total{server=\"s2\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("kvswitch_controller_switch_in_step{switch=\"p1\"} 1"),
        "{text}"
    );
    let status: Value = ctl.call("GET", "/api/v1/status", None).unwrap();
    assert!(
        status["switches"][0]["changes"].as_u64() >= Some(4),
        "{status}"
    );

    // Every server failing its probes empties no pool: the controller keeps them all.
    let mut s4 = s4;
    s4.kill();
    servers[0].kill();
    servers[1].kill();
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        assert_eq!(pool_of(&clients[0]), ["s1", "s2", "s4"]);
        assert_eq!(pool_of(&clients[1]), ["s1", "s2", "s4"]);
        std::thread::sleep(Duration::from_millis(50));
    }
    let status: Value = ctl.call("GET", "/api/v1/status", None).unwrap();
    assert!(
        status["servers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["up"] == false),
        "{status}"
    );
    drop(controller);
}
