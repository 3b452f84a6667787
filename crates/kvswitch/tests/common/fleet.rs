//! A fleet on loopback for the controller's tests: kvswitch proxies with their control APIs in
//! front of memcached servers, the controller's file for them, and questions to their pools.

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use api::Client;
use serde_json::json;
use testbed::local::{self, Proc, TempDir};

use super::proxy::{free_port, Front, Memcached, PoolOpts, Proxy};

/// memcached servers, one for each of `names`, and their list as (name, address).
pub fn servers(names: &[&'static str]) -> (Vec<Memcached>, Vec<(&'static str, SocketAddr)>) {
    let servers: Vec<Memcached> = names.iter().map(|_| Memcached::start()).collect();
    let list = names
        .iter()
        .zip(&servers)
        .map(|(n, m)| (*n, m.addr()))
        .collect();
    (servers, list)
}

/// `n` kvswitch proxies of `servers`, each with a control API, and a client of each API.
pub fn proxies(
    n: usize,
    servers: &[(&str, SocketAddr)],
    opts: &PoolOpts,
) -> (Vec<Proxy>, Vec<Client>) {
    (0..n)
        .map(|_| {
            let opts = PoolOpts {
                api: true,
                ..opts.clone()
            };
            let proxy = Proxy::start(Front::Kvswitch, servers, &opts);
            let client = Client::new(proxy.api(), None);
            (proxy, client)
        })
        .unzip()
}

/// A controller file for `switches` (named p0, p1, ...) and `servers`, with `settings` added
/// to its `[controller]` table.
pub fn controller_toml(
    api: SocketAddr,
    settings: &str,
    switches: &[SocketAddr],
    servers: &[(&str, SocketAddr)],
) -> String {
    let mut text = format!("[controller]\napi = \"{api}\"\n{settings}\n");
    for (i, s) in switches.iter().enumerate() {
        text.push_str(&format!("[[switches]]\nname = \"p{i}\"\napi = \"{s}\"\n"));
    }
    text.push_str("[pool]\ndistribution = \"ketama\"\nhash = \"md5\"\n");
    for (name, addr) in servers {
        text.push_str(&format!(
            "[[pool.servers]]\naddr = \"{addr}\"\nname = \"{name}\"\n"
        ));
    }
    text
}

/// The labels of the servers in `client`'s pool, sorted.
pub fn pool_of(client: &Client) -> Vec<String> {
    let doc = client.call("GET", "/api/v1/pool", None).unwrap_or_default();
    let mut labels: Vec<String> = doc["pools"][0]["servers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["label"].as_str().map(str::to_string))
        .collect();
    labels.sort();
    labels
}

/// Whether `client`'s pool holds the server `label`.
pub fn in_pool(client: &Client, label: &str) -> bool {
    pool_of(client).iter().any(|l| l == label)
}

/// Waits (at most `limit`) until every proxy's pool is `want`; returns how long it took.
pub fn until_pools(proxies: &[Client], want: &[&str], limit: Duration) -> Duration {
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
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A controller (in this process) of the testbed's switch, whose pool is the servers `names`
/// (the testbed's hosts, on memcached's port), with `settings` added to its `[controller]`
/// table; returned once the switch is in step, with a client of its API.
pub fn testbed_controller(
    live: &testbed::Live,
    names: &[&str],
    settings: &str,
) -> (controller::Running, Client) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let api = listener.local_addr().unwrap();
    let switches = [live.api()];
    let servers: Vec<(&str, SocketAddr)> = names
        .iter()
        .map(|n| (*n, SocketAddr::from((super::ip_of(live, n), 11211))))
        .collect();
    let text = controller_toml(api, settings, &switches, &servers);
    let file = config::controller::parse(&text, std::path::Path::new("controller.toml")).unwrap();
    let running = controller::start(file, listener, None, None, None).unwrap();
    let ctl = Client::new(api, None);
    let started = Instant::now();
    while ctl.call("GET", "/api/v1/status", None).unwrap()["switches"][0]["in_step"] != true {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the switch never came in step: {}",
            ctl.call("GET", "/api/v1/status", None).unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (running, ctl)
}

/// etcd on free loopback ports, its data in `dir`; waits until it answers.
pub fn etcd(dir: &TempDir) -> (Proc, SocketAddr) {
    let bin = local::require("etcd").expect("etcd is installed (scripts/setup.sh)");
    let client = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let peer = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let proc = Proc::spawn_logged(
        "etcd",
        Command::new(bin)
            .arg("--name")
            .arg("kvswitch-test")
            .arg("--data-dir")
            .arg(dir.path().join("etcd"))
            .arg("--listen-client-urls")
            .arg(format!("http://{client}"))
            .arg("--advertise-client-urls")
            .arg(format!("http://{client}"))
            .arg("--listen-peer-urls")
            .arg(format!("http://{peer}"))
            .arg("--initial-advertise-peer-urls")
            .arg(format!("http://{peer}"))
            .arg("--initial-cluster")
            .arg(format!("kvswitch-test=http://{peer}")),
        &dir.path().join("etcd.log"),
    )
    .expect("etcd starts");
    let api = Client::new(client, None);
    let started = Instant::now();
    while api
        .call("POST", "/v3/kv/range", Some(&json!({"key": "eA=="})))
        .is_err()
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "etcd did not answer: {}",
            std::fs::read_to_string(dir.path().join("etcd.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (proc, client)
}
