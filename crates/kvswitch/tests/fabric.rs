//! The caching fabric on the testbed: kvswitch processes joined by veth links
//! (`kvswitch fabric run`), memcached servers under their ToRs, unmodified clients.

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{exchange, require_root, udp_call};
use serde_json::Value;
use testbed::history_load::{self, Clock, Mix, Transport};

const TIMEOUT: Duration = Duration::from_secs(2);

fn topology(file: &str, prefix: &str) -> testbed::Topology {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../topologies")
        .join(file);
    testbed::Topology::from_file(&path)
        .expect("shipped topology")
        .on_subnet(testbed::Subnet::for_prefix(prefix))
        .expect("a /24")
}

fn fabric(file: &str, prefix: &str) -> testbed::Live {
    require_root();
    let topo = topology(file, prefix);
    let state = std::env::temp_dir().join(format!("{prefix}-testbed-{}.json", std::process::id()));
    let _ = testbed::down(&state);
    let _ = testbed::down_prefix(prefix);
    let opts = testbed::UpOptions {
        prefix: prefix.into(),
        kvswitch_bin: Some(env!("CARGO_BIN_EXE_kvswitch").into()),
        state_path: Some(state),
        start_nutcracker: false,
        ..Default::default()
    };
    testbed::up(&topo, &opts).expect("fabric testbed up")
}

fn status(live: &testbed::Live, switch: &str) -> Value {
    let api = live.switch_api(switch).expect("a switch of the fabric");
    let (code, body) = testbed::http_get(api, "/api/v1/fabric").expect("fabric API");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn n(v: &Value, pointer: &str) -> u64 {
    v.pointer(pointer)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{pointer} in {v}"))
}

/// memcached's address on `server`.
fn mc(live: &testbed::Live, server: &str) -> SocketAddr {
    SocketAddr::from((live.host(server).unwrap().ip, 11211))
}

fn call(live: &testbed::Live, host: &str, server: &str, request: &str) -> String {
    let target = mc(live, server);
    let reply = udp_call(live, host, target, request.as_bytes(), TIMEOUT)
        .unwrap_or_else(|| panic!("no reply to {request:?} from {server} at {host}"));
    assert_eq!(
        reply.from, target,
        "the reply comes from the server's address"
    );
    String::from_utf8_lossy(&reply.body).into_owned()
}

/// `kvswitch fabric fault`: switch `switch` drops the next `n` invalidations it receives.
/// The command reads the fabric's token from its file; a change without it is refused.
fn drop_invalidations(live: &testbed::Live, switch: &str, n: u32) {
    let api = live.switch_api(switch).expect("a switch of the fabric");
    let body = format!("{{\"drop_invalidations\": {n}}}");
    let (code, text) =
        testbed::http(api, "PUT", "/api/v1/fabric/faults", None, Some(&body)).unwrap();
    assert_eq!(code, 401, "a change without the fabric's token: {text}");
    let (code, text) = testbed::http(
        api,
        "PUT",
        "/api/v1/fabric/faults",
        Some("not-the-token"),
        Some(&body),
    )
    .unwrap();
    assert_eq!(code, 401, "a change with another token: {text}");
    let out = fabric_command(
        live,
        "fault",
        &["--switch", switch, "--drop-invalidations", &n.to_string()],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `kvswitch fabric ACTION --config FILE ARGS` on the testbed's fabric file.
fn fabric_command(live: &testbed::Live, action: &str, args: &[&str]) -> std::process::Output {
    let cfg = live.state.fabric.as_ref().unwrap().config.clone();
    std::process::Command::new(env!("CARGO_BIN_EXE_kvswitch"))
        .args(["fabric", action, "--config"])
        .arg(&cfg)
        .args(args)
        .output()
        .unwrap()
}

/// `kvswitch inc --server SERVER ARGS` on `host`: its exit code and what it printed.
fn inc(live: &testbed::Live, host: &str, server: &str, args: &[&str]) -> (Option<i32>, String) {
    let server = live.host(server).unwrap().ip.to_string();
    let out = live
        .exec(host, env!("CARGO_BIN_EXE_kvswitch"))
        .args(["inc", "--server", &server])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
    )
}

/// The same requests to a memcached of our own on loopback, for its exact replies.
fn memcached_replies(requests: &[&str]) -> Vec<String> {
    let dir = testbed::local::TempDir::new("kvswitch-fabric").unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut proc = testbed::local::Proc::spawn_logged(
        "memcached",
        std::process::Command::new("memcached").args([
            "-U",
            &port.to_string(),
            "-p",
            &port.to_string(),
            "-l",
            "127.0.0.1",
            "-u",
            "root",
            "-t",
            "1",
        ]),
        &dir.path().join("memcached.log"),
    )
    .unwrap();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    proc.wait_listening(addr, None).unwrap();
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    requests
        .iter()
        .map(|r| {
            let mut d = vec![0u8, 7, 0, 0, 0, 1, 0, 0];
            d.extend_from_slice(r.as_bytes());
            let reply = exchange(&sock, addr, &d, TIMEOUT).expect("memcached answers");
            String::from_utf8_lossy(&reply.body).into_owned()
        })
        .collect()
}

#[test]
fn fabric_two_level_tree_answers_unmodified_clients_as_memcached_and_keeps_hits_below_the_root() {
    let live = fabric("fabric-two-level.toml", "kfa");
    // c1 is under tor0; s2 under tor1: every request crosses root0.
    let requests = [
        "get fab\r\n",
        "set fab 5 0 3\r\nabc\r\n",
        "get fab\r\n",
        "get fab\r\n",
        "append fab 0 0 2\r\nde\r\n",
        "get fab\r\n",
        "set num 0 0 2\r\n10\r\n",
        "incr num 5\r\n",
        "decr num 100\r\n",
        "get num\r\n",
        "mg fab v f\r\n",
        "ms fab 2\r\nxy\r\n",
        "get fab\r\n",
        "delete fab\r\n",
        "get fab\r\n",
        "get fab num\r\n",
        "touch num 100\r\n",
        "flush_all\r\n",
    ];
    let through: Vec<String> = requests
        .iter()
        .map(|r| call(&live, "c1", "s2", r))
        .collect();
    let direct = memcached_replies(&requests[..requests.len() - 1]);
    for (i, (a, b)) in through.iter().zip(&direct).enumerate() {
        assert_eq!(a, b, "request {:?}", requests[i]);
    }
    // The one write the fabric cannot keep coherent is refused, never half done.
    assert!(
        through.last().unwrap().starts_with("SERVER_ERROR"),
        "{:?}",
        through.last()
    );

    // A write with no reply still goes through its home, in order.
    let target = mc(&live, "s2");
    let quiet = udp_call(
        &live,
        "c1",
        target,
        b"set big 0 0 3 noreply\r\nyes\r\n",
        Duration::from_millis(200),
    );
    assert!(quiet.is_none(), "{quiet:?}");
    assert_eq!(
        call(&live, "c1", "s2", "get big\r\n"),
        "VALUE big 0 3\r\nyes\r\nEND\r\n"
    );

    // A key read by c1 is cached at tor0 and at root0; hits at tor0 leave the root alone.
    call(&live, "c1", "s2", "set hot 0 0 5\r\nhello\r\n");
    assert_eq!(
        call(&live, "c1", "s2", "get hot\r\n"),
        "VALUE hot 0 5\r\nhello\r\nEND\r\n"
    );
    let root = status(&live, "root0");
    let tor = status(&live, "tor0");
    for _ in 0..20 {
        assert_eq!(
            call(&live, "c1", "s2", "get hot\r\n"),
            "VALUE hot 0 5\r\nhello\r\nEND\r\n"
        );
    }
    let root_after = status(&live, "root0");
    let tor_after = status(&live, "tor0");
    assert_eq!(n(&tor_after, "/cache/hits") - n(&tor, "/cache/hits"), 20);
    for p in [
        "/stats/messages_in",
        "/stats/routed",
        "/cache/hits",
        "/cache/misses",
    ] {
        assert_eq!(n(&root, p), n(&root_after, p), "{p} at the root moved");
    }
    // c2 reads it under tor1 (the home), which answers from its own copy.
    assert_eq!(
        call(&live, "c2", "s2", "get hot\r\n"),
        "VALUE hot 0 5\r\nhello\r\nEND\r\n"
    );

    // Invalidations dropped on purpose: the home sends them again, and the write is not
    // acknowledged before tor0 took one.
    drop_invalidations(&live, "tor0", 3);
    let home = status(&live, "tor1");
    let started = Instant::now();
    assert_eq!(
        call(&live, "c2", "s2", "set hot 0 0 3\r\nbye\r\n"),
        "STORED\r\n"
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(60),
        "acknowledged after {took:?}"
    );
    let home_after = status(&live, "tor1");
    assert!(n(&home_after, "/directory/retransmits") >= n(&home, "/directory/retransmits") + 3);
    assert_eq!(n(&status(&live, "tor0"), "/stats/invalidations_dropped"), 3);
    assert_eq!(
        call(&live, "c1", "s2", "get hot\r\n"),
        "VALUE hot 0 3\r\nbye\r\nEND\r\n"
    );

    // The fabric's own client library, from the command line, through the same path.
    let inc = |args: &[&str]| inc(&live, "c1", "s2", args);
    assert_eq!(inc(&["set", "score", "40"]), (Some(0), "stored".into()));
    assert_eq!(inc(&["get", "score"]), (Some(0), "40".into()));
    assert_eq!(
        inc(&["cond-put", "score", "30"]),
        (Some(1), "not stored".into())
    );
    assert_eq!(
        inc(&["cond-put", "score", "50"]),
        (Some(0), "stored".into())
    );
    assert_eq!(inc(&["incr", "score", "5"]), (Some(0), "55".into()));
    assert_eq!(
        call(&live, "c2", "s2", "get score\r\n"),
        "VALUE score 0 2\r\n55\r\nEND\r\n"
    );
    assert_eq!(inc(&["del", "score"]), (Some(0), "deleted".into()));
    assert_eq!(inc(&["get", "score"]), (Some(1), "".into()));
    assert_eq!(inc(&["cond-put", "score", "7"]), (Some(0), "stored".into()));

    // The project's load generator: every reply is one memcached would give, and the
    // fabric answers some of the reads.
    let target = mc(&live, "s2").to_string();
    let hits_before = n(&status(&live, "tor0"), "/cache/hits");
    let stored = live
        .in_host("c1", {
            let t = mc(&live, "s2");
            move || loadgen::preload(t, loadgen::Proto::Udp, 200, "lg:", 100)
        })
        .unwrap()
        .unwrap();
    assert_eq!(stored, 200);
    let report = live
        .in_host("c1", move || {
            loadgen::run(&loadgen::LoadArgs {
                keys: 200,
                key_prefix: "lg:".into(),
                dist: loadgen::Dist::Zipf(0.99),
                get_ratio: 0.9,
                value_size: 100,
                concurrency: 4,
                duration: 1.0,
                quiet: true,
                ..loadgen::LoadArgs::new(target)
            })
        })
        .unwrap()
        .unwrap();
    assert_eq!(report.errors, 0, "{report:?}");
    assert!(report.requests > 500, "{} requests", report.requests);
    assert!(n(&status(&live, "tor0"), "/cache/hits") > hits_before + 100);

    // A new registration table reaches every switch; an older one is refused.
    let table = |version: &str| fabric_command(&live, "table", &["--version", version]);
    let out = table("5");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for s in ["tor0", "tor1", "root0"] {
        assert_eq!(n(&status(&live, s), "/registration_version"), 5, "{s}");
    }
    assert!(!table("3").status.success(), "an older table is refused");

    // libmemcached's own client over UDP.
    let file = std::env::temp_dir().join(format!("kfa-memccp-{}", std::process::id()));
    std::fs::write(&file, b"from libmemcached").unwrap();
    let out = live
        .exec("c1", "memccp")
        .arg("--udp")
        .arg(format!("--servers={}", live.host("s2").unwrap().ip))
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = file.file_name().unwrap().to_string_lossy().into_owned();
    let got = call(&live, "c1", "s2", &format!("get {key}\r\n"));
    assert!(got.ends_with("\r\nfrom libmemcached\r\nEND\r\n"), "{got:?}");
    let _ = std::fs::remove_file(file);
    live.down().unwrap();
}

fn no_stale_reads(recorded: &history_load::Recorded) {
    let report = testbed::history::check(&recorded.ops);
    assert!(
        report.violations.is_empty(),
        "{} stale reads; the first: {:?}",
        report.violations.len(),
        report.violations.first()
    );
}

fn clients(live: &testbed::Live, per_host: u32, target: &str) -> Vec<history_load::Client> {
    let target = SocketAddr::from((live.host(target).unwrap().ip, 11211));
    let mut out = Vec::new();
    for h in live.clients() {
        for _ in 0..per_host {
            out.push(history_load::Client {
                id: out.len() as u32 + 1,
                transport: Transport::Udp,
                target,
                timeout: Duration::from_millis(500),
                netns: Some(h.netns.clone()),
            });
        }
    }
    out
}

/// `ops` operations of the history checker on 16 keys of `server` from every client host (2
/// clients each): 60% gets, 5% gets, 15% sets, 5% deletes, 15% increments. Checked for
/// stale reads and replies memcached would not give.
fn shared_history(live: &testbed::Live, server: &str, prefix: &str, ops: usize, seed: u64) {
    let clients = clients(live, 2, server);
    let load = history_load::Load {
        keys: (0..16).map(|i| format!("{prefix}:{i}")).collect(),
        ops_per_client: ops / clients.len() + 1,
        duration: Duration::from_secs(240),
        mix: Mix {
            get: 60,
            gets_cas: 5,
            set: 15,
            delete: 5,
            incr: 15,
        },
        seed,
    };
    let recorded = history_load::run(&clients, &load, Clock::start()).expect("load");
    no_stale_reads(&recorded);
    assert!(
        recorded.bad_replies.is_empty(),
        "{:?}",
        recorded.bad_replies.first()
    );
    assert!(
        recorded.ops.len() >= ops,
        "{} operations",
        recorded.ops.len()
    );
}

/// Increments of `key` from every client host at once; the counter ends at exactly the
/// acknowledged ones (plus at most those not answered).
fn increments_are_never_lost(live: &testbed::Live, server: &str, per_client: u32) {
    let target = SocketAddr::from((live.host(server).unwrap().ip, 11211));
    let first = live.clients()[0].name.clone();
    assert_eq!(
        call(live, &first, server, "set counter 0 0 1\r\n0\r\n"),
        "STORED\r\n"
    );
    let results: Vec<(u64, u64)> = std::thread::scope(|scope| {
        let handles: Vec<_> = live
            .clients()
            .into_iter()
            .map(|h| {
                let ns = h.netns.clone();
                scope.spawn(move || {
                    testbed::in_netns(&ns, move || {
                        let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
                        let (mut acked, mut unknown) = (0, 0);
                        for i in 0..per_client {
                            let mut d = vec![(i >> 8) as u8, i as u8, 0, 0, 0, 1, 0, 0];
                            d.extend_from_slice(b"incr counter 1\r\n");
                            match exchange(&sock, target, &d, Duration::from_millis(500)) {
                                Some(r)
                                    if r.body.ends_with(b"\r\n") && r.body[0].is_ascii_digit() =>
                                {
                                    acked += 1
                                }
                                _ => unknown += 1,
                            }
                        }
                        (acked, unknown)
                    })
                    .unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let acked: u64 = results.iter().map(|r| r.0).sum();
    let unknown: u64 = results.iter().map(|r| r.1).sum();
    let got = call(live, &first, server, "get counter\r\n");
    let value: u64 = got.split("\r\n").nth(1).unwrap().parse().unwrap();
    assert!(
        value >= acked && value <= acked + unknown,
        "counter {value}, acknowledged {acked}, unanswered {unknown}"
    );
    assert!(acked > 0);
}

#[test]
fn fabric_multi_rooted_tree_stays_coherent_across_every_rack() {
    let live = fabric("fabric-multi-root.toml", "kfb");
    shared_history(&live, "s2", "shared", 100_000, 14);
    // Clients of every rack were answered, and the caches took part.
    let hits: u64 = ["tor0", "tor1", "tor3", "root0", "root1"]
        .iter()
        .map(|s| n(&status(&live, s), "/cache/hits"))
        .sum();
    assert!(hits > 1_000, "{hits} hits");
    let home = status(&live, "tor2");
    assert!(n(&home, "/directory/invalidations") > 0, "{home}");
    increments_are_never_lost(&live, "s2", 300);

    // Ordinary traffic between racks is spread over both roots (ECMP by flow).
    let routed = |s: &str| n(&status(&live, s), "/stats/routed");
    let before = (routed("root0"), routed("root1"));
    let c1 = SocketAddr::from((live.host("c1").unwrap().ip, 9));
    live.in_host("c0", move || {
        for _ in 0..64 {
            let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
            sock.send_to(b"spread", c1).unwrap();
        }
    })
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let after = (routed("root0"), routed("root1"));
    assert!(
        after.0 >= before.0 + 8,
        "root0 routed {before:?} then {after:?}"
    );
    assert!(
        after.1 >= before.1 + 8,
        "root1 routed {before:?} then {after:?}"
    );

    // The protocol is a change like any other: a host without the fabric's token, or with
    // another, is refused and changes nothing; a protocol the switch does not know is refused.
    let api = live.switch_api("tor2").expect("a switch of the fabric");
    let path = "/api/v1/fabric/coherence";
    let update = Some(r#"{"protocol": "update"}"#);
    for token in [None, Some("not-the-token")] {
        let (code, text) = testbed::http(api, "PUT", path, token, update).unwrap();
        assert_eq!(code, 401, "{token:?}: {text}");
    }
    let token = live.state.api_token().unwrap();
    let snoop = Some(r#"{"protocol": "snoop"}"#);
    let (code, text) = testbed::http(api, "PUT", path, token.as_deref(), snoop).unwrap();
    assert_eq!(code, 400, "{text}");
    assert_eq!(status(&live, "tor2")["coherence"], "invalidate");

    // Write-update, chosen on every switch by the operator's command: the homes send stored
    // values to the copies' switches, and the histories stay coherent.
    assert!(!fabric_command(&live, "coherence", &["snoop"])
        .status
        .success());
    let out = fabric_command(&live, "coherence", &["update"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(status(&live, "tor2")["coherence"], "update");
    shared_history(&live, "s2", "updated", 30_000, 15);
    let home = status(&live, "tor2");
    assert!(n(&home, "/stats/updates_sent") > 0, "{home}");
    live.down().unwrap();
}

#[test]
fn fabric_survives_a_root_killed_mid_run_and_caches_again_with_a_new_table() {
    let live = fabric("fabric-multi-root.toml", "kfc");
    let clients = clients(&live, 1, "s1");
    let load = history_load::Load {
        keys: (0..16).map(|i| format!("k:{i}")).collect(),
        ops_per_client: usize::MAX,
        duration: Duration::from_secs(8),
        mix: Mix::default(),
        seed: 3,
    };
    let clock = Clock::start();
    let killed_at = std::sync::OnceLock::new();
    // The fabric's table kept by two controllers sharing etcd: one leads, one stands by.
    let cfg = live.state.fabric.as_ref().unwrap().config.clone();
    let dir = testbed::local::TempDir::new("kfc-controllers").unwrap();
    let (etcd_proc, etcd_addr) = common::fleet::etcd(&dir);
    let mut controllers: Vec<(Option<testbed::local::Proc>, SocketAddr)> = (0..2)
        .map(|i| {
            let api = SocketAddr::from(([127, 0, 0, 1], common::proxy::free_port()));
            let file = dir.path().join(format!("controller{i}.toml"));
            let text = format!(
                "[controller]\napi = \"{api}\"\nprobe_interval_ms = 100\ndown_after = 3\n\
                 fabric = \"{}\"\n",
                cfg.display()
            );
            std::fs::write(&file, text).unwrap();
            let proc = testbed::local::Proc::spawn_logged(
                "kvswitch controller",
                std::process::Command::new(env!("CARGO_BIN_EXE_kvswitch"))
                    .args(["controller", "--config"])
                    .arg(&file)
                    .arg("--store")
                    .arg(format!("etcd://{etcd_addr}"))
                    // The controller's own token: the fabric's switches get theirs, from the
                    // fabric file, not this one.
                    .env("KVSWITCH_API_TOKEN", "the-controllers-own-token"),
                &dir.path().join(format!("controller{i}.log")),
            )
            .unwrap();
            (Some(proc), api)
        })
        .collect();
    let fleet = |api: SocketAddr| -> Option<Value> {
        let (code, body) = testbed::http_get(api, "/api/v1/status").ok()?;
        (code == 200).then(|| serde_json::from_str(&body).ok())?
    };
    let leader = |controllers: &[(Option<testbed::local::Proc>, SocketAddr)]| -> Option<usize> {
        controllers
            .iter()
            .position(|(p, api)| p.is_some() && fleet(*api).is_some_and(|v| v["role"] == "leader"))
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while leader(&controllers).is_none() {
        assert!(Instant::now() < deadline, "no controller leads within 20 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let recorded = std::thread::scope(|scope| {
        let run = scope.spawn(|| history_load::run(&clients, &load, clock).expect("load"));
        std::thread::sleep(Duration::from_secs(2));
        live.kill_switch("root0").unwrap();
        let _ = killed_at.set(clock.now());
        // The leading controller notices within a few probes and installs a table without
        // root0 (its first, version 1, named every switch alive once they all answered).
        let deadline = Instant::now() + Duration::from_secs(5);
        while n(&status(&live, "tor0"), "/registration_version") < 2 {
            assert!(Instant::now() < deadline, "no new table within 5 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        let fills = n(&status(&live, "root1"), "/cache/fills");
        let recorded = run.join().unwrap();
        (recorded, fills)
    });
    let (recorded, fills_at_table) = recorded;
    no_stale_reads(&recorded);
    let killed = *killed_at.get().unwrap();
    let answered_after = recorded
        .ops
        .iter()
        .filter(|o| {
            o.start > killed
                && !matches!(
                    o.kind,
                    testbed::history::Kind::MaybeWrite(_) | testbed::history::Kind::MaybeIncr(_)
                )
        })
        .count();
    assert!(
        answered_after > 500,
        "{answered_after} answered after the kill"
    );
    for t in ["tor0", "tor1", "tor2", "tor3"] {
        let v = status(&live, t);
        let up: Vec<&str> = v["links"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| l["up"] == true)
            .filter_map(|l| l["to"].as_str())
            .collect();
        assert_eq!(up, vec!["root1"], "{t}");
        assert_eq!(n(&v, "/registration_version"), 2);
    }
    let fills_end = n(&status(&live, "root1"), "/cache/fills");
    assert!(
        fills_end > fills_at_table,
        "root1 caches again once the table names it: {fills_at_table} then {fills_end}"
    );

    // The leader dies; the standby takes over from the table stored in etcd: root0 stays
    // failed, and no table is installed that names it alive, nor any older one.
    let first = leader(&controllers).expect("a leader");
    let status_of = |v: &Value| {
        (
            v["fabric"]["registration_version"].clone(),
            v["fabric"]["failed"].clone(),
        )
    };
    let before = fleet(controllers[first].1).expect("the leader answers");
    assert_eq!(
        status_of(&before),
        (Value::from(2), serde_json::json!(["root0"])),
        "{before}"
    );
    assert_eq!(
        before["fabric"]["switches"].as_array().unwrap().len(),
        6,
        "{before}"
    );
    drop(controllers[first].0.take());
    let deadline = Instant::now() + Duration::from_secs(20);
    let second = loop {
        if let Some(i) = leader(&controllers) {
            break i;
        }
        assert!(
            Instant::now() < deadline,
            "the standby did not take over within 20 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_ne!(first, second);
    // Several probe rounds under the new leader.
    std::thread::sleep(Duration::from_secs(1));
    let after = fleet(controllers[second].1).expect("the new leader answers");
    assert_eq!(status_of(&after), status_of(&before), "{after}");
    for t in ["tor0", "root1"] {
        assert_eq!(n(&status(&live, t), "/registration_version"), 2, "{t}");
    }
    drop(controllers);
    drop(etcd_proc);
    live.down().unwrap();
}

/// Counter `name` of the `stats` of the memcached-compatible server on `host`.
fn server_stat(live: &testbed::Live, host: &str, name: &'static str) -> u64 {
    let addr = mc(live, host);
    live.in_host(host, move || {
        let stats = testbed::memcached_stats(addr)?;
        testbed::stat_u64(&stats, name, addr)
    })
    .unwrap()
    .unwrap()
}

#[test]
fn a_home_node_keeps_its_own_directory_and_every_copy_coherent() {
    let live = fabric("fabric-home-node.toml", "kfe");
    // s1 (under tor0) is `kvswitch node --role home`; c2 is under tor1, across root0.
    let stat = |name| server_stat(&live, "s1", name);
    // A home takes writes a lease (2 s) after it starts.
    let deadline = Instant::now() + Duration::from_secs(10);
    while stat("uptime") < 3 {
        assert!(Instant::now() < deadline, "the home node does not come up");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        call(&live, "c2", "s1", "set k 3 0 2\r\nv1\r\n"),
        "STORED\r\n"
    );
    for _ in 0..3 {
        assert_eq!(
            call(&live, "c2", "s1", "get k\r\n"),
            "VALUE k 3 2\r\nv1\r\nEND\r\n"
        );
    }
    // The node answered the first read and let tor1 and root0 fill; tor1 answered the rest.
    assert_eq!(stat("get_hits"), 1);
    assert_eq!(stat("home_fills"), 1);
    assert_eq!(n(&status(&live, "tor1"), "/cache/hits"), 2);
    assert_eq!(n(&status(&live, "root0"), "/cache/items"), 1);
    let tor0 = status(&live, "tor0");
    assert_eq!(n(&tor0, "/directory/writes"), 0, "tor0 is no home of s1's");
    assert!(n(&tor0, "/stats/to_home_node") >= 2, "{tor0}");

    // A write from s1's own rack: the node invalidates tor1 and root0 (through tor0) and
    // applies the write only after both acknowledged.
    let invalidations = stat("home_invalidations");
    assert_eq!(
        call(&live, "c1", "s1", "set k 3 0 2\r\nv2\r\n"),
        "STORED\r\n"
    );
    // Two sharers, each invalidated (again if its ACK took longer than 20 ms) and each
    // acknowledging.
    assert!(stat("home_invalidations") >= invalidations + 2);
    assert!(stat("home_acks") >= 2);
    assert_eq!(n(&status(&live, "root0"), "/cache/items"), 0);
    assert_eq!(
        call(&live, "c2", "s1", "get k\r\n"),
        "VALUE k 3 2\r\nv2\r\nEND\r\n"
    );

    // Invalidations dropped at tor1: the node sends them again, and acknowledges the write
    // only once tor1 took one.
    drop_invalidations(&live, "tor1", 3);
    let invalidations = stat("home_invalidations");
    let started = Instant::now();
    assert_eq!(call(&live, "c1", "s1", "delete k\r\n"), "DELETED\r\n");
    assert!(
        started.elapsed() >= Duration::from_millis(60),
        "{:?}",
        started.elapsed()
    );
    assert!(stat("home_invalidations") >= invalidations + 4);
    assert_eq!(n(&status(&live, "tor1"), "/stats/invalidations_dropped"), 3);
    assert_eq!(call(&live, "c2", "s1", "get k\r\n"), "END\r\n");

    // memcached's own increments and the fabric's compute primitives, through the node.
    assert_eq!(
        call(&live, "c2", "s1", "set n 0 0 2\r\n10\r\n"),
        "STORED\r\n"
    );
    assert_eq!(call(&live, "c2", "s1", "incr n 5\r\n"), "15\r\n");
    let inc = |args: &[&str]| inc(&live, "c2", "s1", args);
    assert_eq!(
        inc(&["cond-put", "n", "12"]),
        (Some(1), "not stored".into())
    );
    assert_eq!(inc(&["cond-put", "n", "40"]), (Some(0), "stored".into()));
    assert_eq!(inc(&["incr", "n", "2"]), (Some(0), "42".into()));
    assert_eq!(
        call(&live, "c1", "s1", "get n\r\n"),
        "VALUE n 0 2\r\n42\r\nEND\r\n"
    );

    // An increment of a value tor1 holds is computed there as well; tor1 keeps the new value
    // once the node's result agrees, so the next read is answered at tor1.
    assert_eq!(
        call(&live, "c2", "s1", "set m 0 0 3\r\n100\r\n"),
        "STORED\r\n"
    );
    assert_eq!(
        call(&live, "c2", "s1", "get m\r\n"),
        "VALUE m 0 3\r\n100\r\nEND\r\n"
    );
    let tor1 = status(&live, "tor1");
    let node_reads = stat("get_hits");
    assert_eq!(call(&live, "c2", "s1", "decr m 95\r\n"), "5\r\n");
    assert_eq!(
        call(&live, "c2", "s1", "get m\r\n"),
        "VALUE m 0 3\r\n5  \r\nEND\r\n"
    );
    assert_eq!(call(&live, "c2", "s1", "incr m 7\r\n"), "12\r\n");
    assert_eq!(
        call(&live, "c2", "s1", "get m\r\n"),
        "VALUE m 0 3\r\n12 \r\nEND\r\n"
    );
    let tor1_after = status(&live, "tor1");
    for p in ["/stats/computed", "/stats/computed_kept"] {
        assert_eq!(n(&tor1_after, p) - n(&tor1, p), 2, "{p}");
    }
    assert_eq!(
        stat("get_hits"),
        node_reads,
        "the reads after each increment stayed at tor1"
    );
    // The node holds the very bytes tor1 computed (`gets` is carried to it as it is).
    let held = call(&live, "c2", "s1", "gets m\r\n");
    assert!(
        held.starts_with("VALUE m 0 3 ") && held.ends_with("\r\n12 \r\nEND\r\n"),
        "{held:?}"
    );

    // Clients of both racks reading, writing and incrementing the node's keys at once.
    shared_history(&live, "s1", "h", 20_000, 15);
    assert!(n(&status(&live, "tor1"), "/cache/hits") > 100);
    assert_eq!(stat("home_writes_failed"), 0);
    assert_eq!(stat("home_malformed"), 0);
    increments_are_never_lost(&live, "s1", 200);
    live.down().unwrap();
}

/// An attacker in a server's rack (c2, beside s2) asks s2 for the honest client's keys and
/// sends s2's replies itself, with s2's MAC and address, carrying values nobody wrote, and
/// frames of other kinds with s2's MAC, in a loop, while the honest client in the other rack
/// runs a checked history on those keys through the fabric. Its ToR (their home) refuses every
/// such frame: no reader sees a forged value, and none of the honest client's requests reaches
/// the attacker.
#[test]
fn an_attacker_beside_a_server_can_neither_answer_for_it_nor_draw_its_traffic() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use switch::frame::{udp_frame, UdpEnds};

    let live = fabric("fabric-two-level.toml", "kfa");
    // s2 is heard by its ToR before the attack starts.
    assert_eq!(
        call(&live, "c1", "s2", "version\r\n").split(' ').next(),
        Some("VERSION")
    );
    let keys: Vec<String> = (0..8).map(|i| format!("atk:{i}")).collect();
    let (s2, s2_mac) = (live.host("s2").unwrap().ip, common::mac_of(&live, "s2"));
    let (me, me_mac) = (live.host("c2").unwrap().ip, common::mac_of(&live, "c2"));
    let victim = live.host("c1").unwrap().ip;
    let refused_before = n(&status(&live, "tor1"), "/stats/refused_sources");
    let clients: Vec<history_load::Client> = clients(&live, 2, "s2")
        .into_iter()
        .filter(|c| c.netns.as_deref() == Some(live.host("c1").unwrap().netns.as_str()))
        .collect();
    let load = history_load::Load {
        keys: keys.clone(),
        ops_per_client: 20_000,
        duration: Duration::from_secs(5),
        mix: Mix::default(),
        seed: 34,
    };
    let stop = AtomicBool::new(false);
    let diverted = AtomicU64::new(0);
    let sent = AtomicU64::new(0);
    let recorded = std::thread::scope(|scope| {
        scope.spawn(|| {
            live.in_host("c2", || {
                common::sniff_diverted(me, &[(s2, s2_mac)], victim, &stop, &diverted)
            })
            .expect("c2")
        });
        scope.spawn(|| {
            live.in_host("c2", || {
                let sender = kvio::FrameSender::on_address(me).expect("a frame sender");
                let started = Instant::now();
                let mut round = 0u16;
                while started.elapsed() < Duration::from_secs(5) && !stop.load(Ordering::Relaxed) {
                    let key = &keys[usize::from(round) % keys.len()];
                    let ends = |src_mac, src, dst_mac, dst| UdpEnds {
                        src_mac,
                        dst_mac,
                        src_ip: src,
                        dst_ip: dst,
                        src_port: if src == s2 { 11211 } else { 40_000 },
                        dst_port: if dst == s2 { 11211 } else { 40_000 },
                    };
                    let ask = common::datagram(round, &format!("get {key}\r\n"));
                    let evil =
                        common::datagram(round, &format!("VALUE {key} 0 4\r\nEVIL\r\nEND\r\n"));
                    let mut other = udp_frame(&ends(s2_mac, me, s2_mac, s2), &[b"x"]);
                    other[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
                    let frames = [
                        udp_frame(&ends(me_mac, me, s2_mac, s2), &[&ask]),
                        udp_frame(&ends(s2_mac, s2, me_mac, me), &[&evil]),
                        other,
                    ];
                    for f in &frames {
                        if sender.send(f).is_ok() {
                            sent.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    round = round.wrapping_add(1);
                    std::thread::sleep(Duration::from_millis(2));
                }
            })
            .expect("c2")
        });
        let recorded = history_load::run(&clients, &load, Clock::start()).expect("load");
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::Relaxed);
        recorded
    });
    let refused = n(&status(&live, "tor1"), "/stats/refused_sources") - refused_before;
    // The refusals show on the ToR's /metrics too, as a counter.
    let api = live.switch_api("tor1").expect("tor1");
    let (code, text) = testbed::http_get(api, "/metrics").expect("tor1's metrics");
    assert_eq!(code, 200);
    api::metrics::lint(&text).unwrap_or_else(|e| panic!("the fabric switch's /metrics: {e}"));
    let counted: u64 = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("kvswitch_fabric_stats_refused_sources_total{switch=\"tor1\"} ")
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no refused sources in {text}"));
    assert!(counted >= refused_before + refused, "{counted}");
    println!(
        "fabric attack: {} frames sent, {refused} refused by the home; honest requests seen by \
         the attacker: {}; {} honest operations",
        sent.load(Ordering::Relaxed),
        diverted.load(Ordering::Relaxed),
        recorded.ops.len()
    );
    no_stale_reads(&recorded);
    assert!(
        recorded.bad_replies.is_empty(),
        "{:?}",
        recorded.bad_replies.first()
    );
    assert!(recorded.ops.len() > 500, "too little honest traffic");
    assert_eq!(
        diverted.load(Ordering::Relaxed),
        0,
        "honest requests reached the attacker"
    );
    assert!(refused > 0, "no forged frame was refused");
    // The real values, from every rack.
    for key in &keys {
        call(&live, "c1", "s2", &format!("set {key} 0 0 4\r\ngood\r\n"));
        for host in ["c1", "c2"] {
            assert_eq!(
                call(&live, host, "s2", &format!("get {key}\r\n")),
                format!("VALUE {key} 0 4\r\ngood\r\nEND\r\n")
            );
        }
    }
    live.down().unwrap();
}
