//! Two controllers keeping their pool in a real etcd (Debian's etcd-server) and driving two
//! kvswitch proxies in front of real memcached servers on loopback:
//!
//! - exactly one leads; the other stands by and refuses changes, naming the leader;
//! - a change made through the leader is stored, and survives the leader's death;
//! - the leader killed (SIGKILL), the standby takes over within a few seconds, and a later
//!   server death is still taken out of both proxies' pools;
//! - a leader stopped with SIGTERM exits cleanly and gives up its lease as it goes.
//!
//! Requires memcached and etcd.

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use api::Client;
use common::fleet::{controller_toml, etcd, proxies, servers, until_pools};
use common::proxy::{free_port, Memcached, PoolOpts};
use serde_json::{json, Value};
use testbed::local::{Proc, TempDir};

/// The controllers' roles, by index, once exactly one leads (within `limit`).
fn one_leader(controllers: &[Option<Client>], limit: Duration) -> usize {
    let started = Instant::now();
    loop {
        let roles: Vec<Option<String>> = controllers
            .iter()
            .map(|c| {
                c.as_ref()
                    .and_then(|c| c.call("GET", "/api/v1/status", None).ok())
                    .and_then(|s| s["role"].as_str().map(str::to_string))
            })
            .collect();
        let leaders: Vec<usize> = roles
            .iter()
            .enumerate()
            .filter(|(_, r)| r.as_deref() == Some("leader"))
            .map(|(i, _)| i)
            .collect();
        if leaders.len() == 1 {
            return leaders[0];
        }
        assert!(leaders.len() < 2, "two leaders at once: {roles:?}");
        assert!(
            started.elapsed() < limit,
            "no single leader after {limit:?}: {roles:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Two `kvswitch controller` processes of the same file (but for their own API address),
/// keeping their pool in the etcd at `etcd_addr`.
fn two_controllers(
    dir: &TempDir,
    etcd_addr: SocketAddr,
    apis: &[SocketAddr],
    list: &[(&str, SocketAddr)],
) -> (Vec<Option<Proc>>, Vec<Option<Client>>) {
    let mut procs: Vec<Option<Proc>> = Vec::new();
    let mut controllers: Vec<Option<Client>> = Vec::new();
    for i in 0..2 {
        let api = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let text = controller_toml(
            api,
            "probe_interval_ms = 50\ndown_after = 3\nsync_interval_ms = 300",
            apis,
            list,
        );
        let path = dir.path().join(format!("controller{i}.toml"));
        std::fs::write(&path, text).unwrap();
        let proc = Proc::spawn_logged(
            "kvswitch controller",
            Command::new(env!("CARGO_BIN_EXE_kvswitch"))
                .arg("controller")
                .arg("--config")
                .arg(&path)
                .arg("--store")
                .arg(format!("etcd://{etcd_addr}")),
            &dir.path().join(format!("controller{i}.log")),
        )
        .unwrap();
        procs.push(Some(proc));
        controllers.push(Some(Client::new(api, None)));
    }
    (procs, controllers)
}

/// The values of every etcd key that ends in `/leader`.
fn leader_keys(etcd_addr: SocketAddr) -> Vec<String> {
    values_of(etcd_addr, "/leader")
        .into_iter()
        .map(|v| String::from_utf8_lossy(&v).into_owned())
        .collect()
}

/// The values of every etcd key that ends in `suffix`.
fn values_of(etcd_addr: SocketAddr, suffix: &str) -> Vec<Vec<u8>> {
    let etcd = Client::new(etcd_addr, None);
    // From the key "\0" with range_end "\0": every key.
    let all = etcd
        .call(
            "POST",
            "/v3/kv/range",
            Some(&json!({"key": "AA==", "range_end": "AA=="})),
        )
        .expect("etcd answers");
    all["kvs"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|kv| {
            let key = controller::etcd::decode(kv["key"].as_str()?)?;
            let value = controller::etcd::decode(kv["value"].as_str().unwrap_or(""))?;
            key.ends_with(suffix.as_bytes()).then_some(value)
        })
        .collect()
}

/// A leader stopped with SIGTERM exits cleanly and gives its lease up on the way out: by the
/// time it has exited, etcd no longer names it leader (a leader that dies holds the lead until
/// its lease runs out).
#[test]
fn a_leader_stopped_with_sigterm_gives_up_the_lead_as_it_exits() {
    let dir = TempDir::new("kvswitch-controller-resign").unwrap();
    let (_etcd, etcd_addr) = etcd(&dir);
    let (_servers, list) = servers(&["r1", "r2"]);
    let (_proxies, clients) = proxies(1, &list, &PoolOpts::default());
    let apis: Vec<SocketAddr> = clients.iter().map(|c| c.api).collect();
    let (mut procs, controllers) = two_controllers(&dir, etcd_addr, &apis, &list);
    let leader = one_leader(&controllers, Duration::from_secs(20));
    let leader_api = controllers[leader].as_ref().unwrap().api.to_string();
    assert_eq!(leader_keys(etcd_addr), std::slice::from_ref(&leader_api));
    // The leader keeps its copy of the switch in etcd, taken from the switch's current run.
    let instance = clients[0].call("GET", "/api/v1/status", None).unwrap()["instance"].clone();
    let started = Instant::now();
    loop {
        let copies: Vec<Value> = values_of(etcd_addr, "/copy")
            .iter()
            .filter_map(|v| serde_json::from_slice(v).ok())
            .collect();
        if copies.iter().any(|c| c["instance"] == instance) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no copy of the switch's run {instance} in etcd: {copies:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let proc = procs[leader].as_mut().unwrap();
    // SAFETY: kill takes no pointers; the PID is our own child's, which has not been reaped.
    let sent = unsafe { libc::kill(proc.pid() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(sent, 0, "SIGTERM not sent");
    let status = proc
        .wait_exit(Duration::from_secs(10))
        .expect("the leader exits");
    assert!(
        status.success(),
        "the leader did not stop cleanly: {status}"
    );
    let named = leader_keys(etcd_addr);
    assert!(
        !named.contains(&leader_api),
        "etcd still names the stopped leader {leader_api}: {named:?}"
    );
    assert_eq!(
        one_leader(&controllers, Duration::from_secs(15)),
        1 - leader
    );
}

#[test]
fn a_standby_controller_takes_over_from_a_dead_leader_with_the_pool_it_stored() {
    let dir = TempDir::new("kvswitch-controller-etcd").unwrap();
    let (_etcd, etcd_addr) = etcd(&dir);
    let names = ["s1", "s2", "s3"];
    let (mut servers, list) = servers(&names);
    let (_proxies, clients) = proxies(2, &list, &PoolOpts::default());
    let apis: Vec<SocketAddr> = clients.iter().map(|c| c.api).collect();

    // Two controllers of the same file but for their own API address.
    let (mut procs, mut controllers) = two_controllers(&dir, etcd_addr, &apis, &list);
    let leader = one_leader(&controllers, Duration::from_secs(20));
    let standby = 1 - leader;
    // The standby knows who leads once it has campaigned.
    let leader_api = controllers[leader].as_ref().unwrap().api.to_string();
    let started = Instant::now();
    while controllers[standby]
        .as_ref()
        .unwrap()
        .call("GET", "/api/v1/status", None)
        .map(|s| s["leader"] != leader_api.as_str())
        .unwrap_or(true)
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the standby never named the leader"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    until_pools(&clients, &["s1", "s2", "s3"], Duration::from_secs(10));

    // The standby refuses changes and names the leader.
    let s4 = Memcached::start();
    let body = json!({"addr": s4.addr().to_string(), "name": "s4"});
    let e = controllers[standby]
        .as_ref()
        .unwrap()
        .call("POST", "/api/v1/pool/servers", Some(&body))
        .unwrap_err()
        .to_string();
    assert!(e.contains("503") && e.contains(&leader_api), "{e}");
    // The leader takes it, stores it, and both proxies follow.
    controllers[leader]
        .as_ref()
        .unwrap()
        .call("POST", "/api/v1/pool/servers", Some(&body))
        .unwrap();
    until_pools(&clients, &["s1", "s2", "s3", "s4"], Duration::from_secs(10));

    // The leader dies; the standby takes over with the stored pool.
    let killed = Instant::now();
    procs[leader] = None;
    controllers[leader] = None;
    assert_eq!(one_leader(&controllers, Duration::from_secs(15)), standby);
    let took = killed.elapsed();
    let status: Value = controllers[standby]
        .as_ref()
        .unwrap()
        .call("GET", "/api/v1/status", None)
        .unwrap();
    let mut stored: Vec<&str> = status["servers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["label"].as_str())
        .collect();
    stored.sort();
    assert_eq!(stored, ["s1", "s2", "s3", "s4"], "{status}");

    // A later failure is still handled.
    servers[2].kill();
    let out = until_pools(&clients, &["s1", "s2", "s4"], Duration::from_secs(10));
    eprintln!(
        "the standby led {took:?} after the leader's death; s3 then left both pools in {out:?}"
    );
}
