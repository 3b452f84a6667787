//! The pool changed while traffic flows, through the control API and by reloading the
//! configuration file, on the proxy in front of real memcached servers on loopback:
//!
//! - servers added, removed and reweighted through the API place every key exactly where a
//!   real nutcracker started on the same server list places it (so the keys that move are
//!   exactly those nutcracker would move), while a client reading its own writes never gets a
//!   wrong value;
//! - no request reaches a removed server once the removal is acknowledged;
//! - a nutcracker YAML file edited and signalled with SIGHUP changes the servers; a broken
//!   file (by SIGHUP or `POST /api/v1/reload`) is refused with the file, key and problem
//!   named, and traffic goes on as before.
//!
//! Requires memcached and nutcracker.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use api::Client;
use common::proxy::{free_port, yaml_config, Front, Memcached, PoolOpts, Proxy};
use serde_json::json;
use testbed::local;

/// Keys stored through each front at each step.
const KEYS: usize = 1500;

fn keys(tag: &str) -> Vec<Vec<u8>> {
    (0..KEYS)
        .map(|i| format!("{tag}:{i}").into_bytes())
        .collect()
}

/// Where each of `keys` ends up when stored through `front`: an index into `servers`.
fn placement(front: SocketAddr, servers: &[SocketAddr], keys: &[Vec<u8>]) -> Vec<usize> {
    local::store(front, keys).unwrap_or_else(|e| panic!("store through {front}: {e:#}"));
    local::owners(servers, keys)
        .unwrap_or_else(|e| panic!("{e:#}"))
        .into_iter()
        .zip(keys)
        .map(|(o, k)| {
            o.unwrap_or_else(|| panic!("{:?} is on no server", String::from_utf8_lossy(k)))
        })
        .collect()
}

/// Where nutcracker places `keys` over `list` (name, weight), on the reference servers `refs`
/// (one per name, in `names` order).
fn nutcracker_placement(
    names: &[&str],
    refs: &[Memcached],
    list: &[(&str, u32)],
    keys: &[Vec<u8>],
) -> Vec<String> {
    let servers: Vec<(&str, SocketAddr)> = list
        .iter()
        .map(|(n, _)| {
            let i = names.iter().position(|m| m == n).expect("a known name");
            (*n, refs[i].addr())
        })
        .collect();
    let dir = local::TempDir::new("kvswitch-pool-live").expect("scratch");
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut yaml = yaml_config(listen, &servers, &PoolOpts::default());
    for (name, weight) in list {
        yaml = yaml.replace(&format!(":1 {name}\n"), &format!(":{weight} {name}\n"));
    }
    let conf = dir.path().join("nutcracker.yml");
    std::fs::write(&conf, yaml).expect("write nutcracker.yml");
    let bin = local::require("nutcracker").expect("nutcracker");
    let _n = local::nutcracker(&bin, &conf, dir.path(), free_port(), &[listen])
        .unwrap_or_else(|e| panic!("{e:#}"));
    let addrs: Vec<SocketAddr> = servers.iter().map(|(_, a)| *a).collect();
    placement(listen, &addrs, keys)
        .into_iter()
        .map(|i| servers[i].0.to_string())
        .collect()
}

/// Which of `servers` holds each of `keys`, by name.
fn owners_by_name(names: &[&str], servers: &[Memcached], keys: &[Vec<u8>]) -> Vec<String> {
    let addrs: Vec<SocketAddr> = servers.iter().map(Memcached::addr).collect();
    local::owners(&addrs, keys)
        .unwrap_or_else(|e| panic!("{e:#}"))
        .into_iter()
        .map(|o| o.map_or("none".to_string(), |i| names[i].to_string()))
        .collect()
}

/// memcached's count of commands it has served (gets, sets and the rest).
fn commands(server: SocketAddr) -> u64 {
    let mut s = TcpStream::connect(server).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"stats\r\n").unwrap();
    let mut r = BufReader::new(s);
    let mut total = 0;
    loop {
        let mut line = String::new();
        r.read_line(&mut line).expect("stats");
        if line.starts_with("END") || line.is_empty() {
            return total;
        }
        let mut parts = line.split_whitespace().skip(1);
        if let (Some(name), Some(v)) = (parts.next(), parts.next()) {
            if matches!(
                name,
                "cmd_get" | "cmd_set" | "cmd_touch" | "delete_misses" | "delete_hits"
            ) {
                total += v.parse::<u64>().unwrap_or(0);
            }
        }
    }
}

/// A client that writes its own keys and reads each back, over and over, counting values that
/// are not the one it last wrote (a miss is not wrong: a key may have moved to an empty
/// server). A round that a pool change overlaps is not judged: its `set` may go to the old
/// owner and its `get` to the new one, which may hold the key from an earlier owner's time,
/// as with nutcracker (`changing` is odd while a change is made). Stops when `stop` is set;
/// returns (round trips judged, wrong values).
fn reader_of_own_writes(
    front: SocketAddr,
    stop: Arc<AtomicBool>,
    changing: Arc<AtomicU64>,
) -> thread::JoinHandle<(u64, u64)> {
    thread::spawn(move || {
        let (mut rounds, mut wrong) = (0u64, 0u64);
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let before = changing.load(Ordering::SeqCst);
            let round = || -> std::io::Result<Option<bool>> {
                let key = format!("own:{}", i % 200);
                let value = format!("v{i}");
                let mut s = TcpStream::connect(front)?;
                s.set_read_timeout(Some(Duration::from_secs(5)))?;
                let mut r = BufReader::new(s.try_clone()?);
                let len = value.len();
                write!(s, "set {key} 0 0 {len}\r\n{value}\r\nget {key}\r\n")?;
                let mut line = String::new();
                r.read_line(&mut line)?;
                if line != "STORED\r\n" {
                    // A server error while a server changes is an error, not a wrong value.
                    return Ok(None);
                }
                let mut head = String::new();
                r.read_line(&mut head)?;
                if !head.starts_with("VALUE") {
                    return Ok(Some(true));
                }
                let mut data = String::new();
                r.read_line(&mut data)?;
                Ok(Some(data.trim_end() == value))
            };
            let outcome = round();
            let steady = before.is_multiple_of(2) && changing.load(Ordering::SeqCst) == before;
            if let (Ok(Some(right)), true) = (outcome, steady) {
                rounds += 1;
                wrong += u64::from(!right);
            }
            i += 1;
        }
        (rounds, wrong)
    })
}

#[test]
fn servers_change_through_the_api_as_nutcracker_would_place_them() {
    let names = ["s1", "s2", "s3", "s4"];
    let servers: Vec<Memcached> = names.iter().map(|_| Memcached::start()).collect();
    let refs: Vec<Memcached> = names.iter().map(|_| Memcached::start()).collect();
    let first: Vec<(&str, SocketAddr)> = names[..3]
        .iter()
        .zip(&servers)
        .map(|(n, m)| (*n, m.addr()))
        .collect();
    let opts = PoolOpts {
        api: true,
        ..PoolOpts::default()
    };
    let proxy = Proxy::start(Front::Kvswitch, &first, &opts);
    let api = proxy.api();
    let client = Client::new(api, None);
    let stop = Arc::new(AtomicBool::new(false));
    let changing = Arc::new(AtomicU64::new(0));
    let load = reader_of_own_writes(proxy.addr, stop.clone(), changing.clone());

    // Each step: the change, then the list nutcracker is started on.
    type Step<'a> = (&'a str, serde_json::Value, Vec<(&'a str, u32)>);
    let steps: Vec<Step> = vec![
        ("start", json!(null), vec![("s1", 1), ("s2", 1), ("s3", 1)]),
        (
            "add s4",
            json!({"op": "add", "addr": servers[3].addr().to_string(), "name": "s4"}),
            vec![("s1", 1), ("s2", 1), ("s3", 1), ("s4", 1)],
        ),
        (
            "remove s2",
            json!({"op": "remove", "server": "s2"}),
            vec![("s1", 1), ("s3", 1), ("s4", 1)],
        ),
        (
            "weight s1 3",
            json!({"op": "weight", "server": "s1", "weight": 3}),
            vec![("s1", 3), ("s3", 1), ("s4", 1)],
        ),
    ];
    let mut s2_commands = None;
    for (step, change, list) in steps {
        changing.fetch_add(1, Ordering::SeqCst);
        match change["op"].as_str() {
            Some("add") => {
                let body = json!({"addr": change["addr"], "name": change["name"]});
                client
                    .call("POST", "/api/v1/pool/servers", Some(&body))
                    .unwrap();
            }
            Some("remove") => {
                let path = format!(
                    "/api/v1/pool/servers/{}",
                    change["server"].as_str().unwrap()
                );
                client.call("DELETE", &path, None).unwrap();
                s2_commands = Some(commands(servers[1].addr()));
            }
            Some("weight") => {
                let path = format!(
                    "/api/v1/pool/servers/{}",
                    change["server"].as_str().unwrap()
                );
                let body = json!({"weight": change["weight"]});
                client.call("PUT", &path, Some(&body)).unwrap();
            }
            _ => {}
        }
        changing.fetch_add(1, Ordering::SeqCst);
        let tag = step.replace(' ', "-");
        let ks = keys(&tag);
        local::store(proxy.addr, &ks).unwrap_or_else(|e| panic!("{step}: {e:#}"));
        if let Some(n) = s2_commands {
            assert_eq!(
                commands(servers[1].addr()),
                n,
                "{step}: a request reached s2 after its removal was acknowledged"
            );
        }
        let ours = owners_by_name(&names, &servers, &ks);
        let theirs = nutcracker_placement(&names, &refs, &list, &ks);
        let differ = ours.iter().zip(&theirs).filter(|(a, b)| a != b).count();
        assert_eq!(
            differ, 0,
            "{step}: {differ} of {KEYS} keys placed unlike nutcracker"
        );
        let share: Vec<String> = names
            .iter()
            .map(|n| format!("{n} {}", ours.iter().filter(|o| o == n).count()))
            .collect();
        eprintln!("{step}: keys per server: {}", share.join(", "));
        // Asking each server directly counts there too.
        if s2_commands.is_some() {
            s2_commands = Some(commands(servers[1].addr()));
        }
    }
    let pool = client.call("GET", "/api/v1/status", None).unwrap();
    assert!(pool.to_string().contains("s4"), "{pool}");
    stop.store(true, Ordering::Relaxed);
    let (rounds, wrong) = load.join().expect("the client thread");
    eprintln!("own-write reads (outside the changes): {rounds}, wrong values: {wrong}");
    assert!(rounds > 0);
    assert_eq!(
        wrong, 0,
        "a read returned a value other than the one last written"
    );
}

#[test]
fn a_yaml_file_is_reloaded_on_sighup_and_a_broken_one_is_refused() {
    let names = ["s1", "s2", "s3", "s4"];
    let servers: Vec<Memcached> = names.iter().map(|_| Memcached::start()).collect();
    let list = |n: usize| -> Vec<(&str, SocketAddr)> {
        names[..n]
            .iter()
            .zip(&servers)
            .map(|(n, m)| (*n, m.addr()))
            .collect()
    };
    let proxy = Proxy::start(Front::KvswitchYaml, &list(3), &PoolOpts::default());
    let path = proxy.config_path();
    let hangup = || {
        // SAFETY: kill with a PID this test started and a valid signal.
        let r = unsafe { libc::kill(proxy.pid() as i32, libc::SIGHUP) };
        assert_eq!(r, 0);
    };
    let addrs: Vec<SocketAddr> = servers.iter().map(Memcached::addr).collect();
    let on_s4 = |tag: &str| {
        placement(proxy.addr, &addrs, &keys(tag))
            .iter()
            .filter(|&&i| i == 3)
            .count()
    };
    assert_eq!(on_s4("before"), 0);

    std::fs::write(
        &path,
        yaml_config(proxy.addr, &list(4), &PoolOpts::default()),
    )
    .unwrap();
    hangup();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut round = 0;
    while on_s4(&format!("after{round}")) == 0 {
        assert!(Instant::now() < deadline, "s4 never got keys after SIGHUP");
        round += 1;
        thread::sleep(Duration::from_millis(50));
    }

    // Broken: the server line has no port. Refused, logged, and the four servers stay.
    std::fs::write(
        &path,
        format!(
            "alpha:\n  listen: {}\n  servers:\n   - 127.0.0.1:1 s1\n   - not-a-server\n",
            proxy.addr
        ),
    )
    .unwrap();
    hangup();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !proxy.log_tail().contains("not reloaded") {
        assert!(
            Instant::now() < deadline,
            "no refusal logged:\n{}",
            proxy.log_tail()
        );
        thread::sleep(Duration::from_millis(50));
    }
    let log = proxy.log_tail();
    assert!(
        log.contains("proxy.yml") && log.contains("servers"),
        "{log}"
    );
    assert!(proxy.alive());
    assert!(on_s4("broken") > 0, "the running servers were not kept");
}

#[test]
fn a_broken_toml_file_is_refused_through_the_api_naming_file_key_and_problem() {
    let servers: Vec<Memcached> = (0..2).map(|_| Memcached::start()).collect();
    let list: Vec<(&str, SocketAddr)> = vec![("s1", servers[0].addr()), ("s2", servers[1].addr())];
    let opts = PoolOpts {
        api: true,
        ..PoolOpts::default()
    };
    let proxy = Proxy::start(Front::Kvswitch, &list, &opts);
    let api = proxy.api();
    let client = Client::new(api, None);
    let path = proxy.config_path();
    let good = std::fs::read_to_string(&path).unwrap();
    let served = AtomicU64::new(0);
    let check_traffic = || {
        let ks = keys(&format!("t{}", served.fetch_add(1, Ordering::Relaxed)));
        local::store(proxy.addr, &ks).unwrap_or_else(|e| panic!("traffic: {e:#}"));
    };
    check_traffic();
    let version = |c: &Client| c.call("GET", "/api/v1/pool", None).unwrap_or_default();
    let before = version(&client);

    std::fs::write(&path, good.replace("weight = 1", "weight = -1")).unwrap();
    let e = client
        .call("POST", "/api/v1/reload", None)
        .expect_err("a broken file is refused")
        .to_string();
    assert!(
        e.contains("400") && e.contains("proxy.toml") && e.contains("weight"),
        "{e}"
    );
    check_traffic();

    std::fs::write(
        &path,
        good.replace("distribution = \"ketama\"", "distribution = \"modula\""),
    )
    .unwrap();
    let e = client
        .call("POST", "/api/v1/reload", None)
        .expect_err("a change that needs a restart is refused")
        .to_string();
    assert!(e.contains("distribution") && e.contains("restart"), "{e}");
    assert_eq!(
        version(&client),
        before,
        "a refused reload changed the pool"
    );

    // The good file again, with a weight changed: applied.
    std::fs::write(&path, good.replacen("weight = 1", "weight = 2", 1)).unwrap();
    let done = client.call("POST", "/api/v1/reload", None).unwrap();
    assert_eq!(done["pools"][0]["servers"], 2, "{done}");
    let pool = version(&client);
    assert_eq!(pool["pools"][0]["servers"][0]["weight"], 2, "{pool}");
    check_traffic();
}
