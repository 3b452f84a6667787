//! The controller driving two kvswitch proxies (each with its control API) in front of real
//! memcached servers on loopback:
//!
//! - of four servers, one killed under load is taken out of both proxies' pools within the
//!   detection window; after that no request fails; restarted, it is put back in both;
//! - a server that hangs (SIGSTOP) under load is taken out the same way, with failures only
//!   before, and put back when it goes on;
//! - failed requests the proxies report take a server out before its probes would (TKO);
//! - a server added with a warm-up is given the items of its keys from where they were;
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

use api::Client;
use common::fleet::{controller_toml, pool_of, proxies, servers, until_pools};
use common::proxy::{Conn, Memcached, PoolOpts, Proxy};
use serde_json::{json, Value};
use testbed::local;

const PROBE_MS: u64 = 50;
const DOWN_AFTER: u32 = 3;

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

/// A controller (in this process) of the switches whose APIs are `apis`, with `settings` in
/// its `[controller]` table, and a client of its API.
fn start_controller(
    apis: &[SocketAddr],
    list: &[(&str, SocketAddr)],
    settings: &str,
) -> (controller::Running, Client) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let api = listener.local_addr().unwrap();
    let text = controller_toml(api, settings, apis, list);
    let file = config::controller::parse(&text, Path::new("controller.toml")).unwrap();
    let running = controller::start(file, listener, None, None, None).unwrap();
    (running, Client::new(api, None))
}

/// What the controller's status says of the server `label`.
fn server_status(ctl: &Client, label: &str) -> Value {
    let status = ctl.call("GET", "/api/v1/status", None).unwrap();
    status["servers"]
        .as_array()
        .and_then(|all| all.iter().find(|s| s["label"] == label))
        .cloned()
        .unwrap_or_else(|| panic!("no {label} in the status: {status}"))
}

/// Runs `fault` while load goes through every proxy, and waits (at most 10 s) until every
/// pool is `want`, then lets the load go on for `after`. Only load rounds begun before the
/// last pool had changed may fail. Returns how long the pools took.
fn fault_under_load(
    proxies: &[Proxy],
    clients: &[Client],
    want: &[&str],
    after: Duration,
    what: &str,
    fault: impl FnOnce(),
) -> Duration {
    let origin = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let (failed, last_failure) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
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
    assert_eq!(failed.load(Ordering::Relaxed), 0, "failures before {what}");
    let fault_at = origin.elapsed();
    fault();
    let took = until_pools(clients, want, Duration::from_secs(10));
    let out_at = origin.elapsed();
    std::thread::sleep(after);
    stop.store(true, Ordering::Relaxed);
    let rounds: u64 = loads.into_iter().map(|l| l.join().unwrap()).sum();
    let last = Duration::from_millis(last_failure.load(Ordering::Relaxed));
    let failed = failed.load(Ordering::Relaxed);
    eprintln!(
        "{what}: the pools are {want:?} after {took:?}; {failed} of {rounds} load rounds \
         failed, the last begun {:?} after it",
        last.saturating_sub(fault_at)
    );
    assert!(
        failed == 0 || last <= out_at,
        "{what}: a round begun {last:?} into the run failed, after the pools changed at \
         {out_at:?}"
    );
    took
}

#[test]
fn a_fleet_follows_its_servers_health_and_the_controllers_changes() {
    let names = ["s1", "s2", "s3", "s4"];
    let (mut servers, list) = servers(&names);
    let (proxies, clients) = proxies(2, &list, &PoolOpts::default());
    let apis: Vec<SocketAddr> = clients.iter().map(|c| c.api).collect();
    let (controller, ctl) = start_controller(
        &apis,
        &list,
        &format!(
            "probe_interval_ms = {PROBE_MS}\nprobe_timeout_ms = 100\ndown_after = {DOWN_AFTER}\n\
                 up_after = 2\nsync_interval_ms = 300"
        ),
    );
    until_pools(&clients, &["s1", "s2", "s3", "s4"], Duration::from_secs(5));

    // A server killed under load: out of both pools within the detection window, and no
    // failure after that.
    fault_under_load(
        &proxies,
        &clients,
        &["s1", "s3", "s4"],
        Duration::from_millis(500),
        "s2 killed",
        || servers[1].kill(),
    );
    let s2 = server_status(&ctl, "s2");
    assert_eq!(s2["up"], json!(false), "{s2}");
    assert!(s2["downs"].as_u64() >= Some(1), "{s2}");

    // Restarted: back in both pools.
    servers[1].restart();
    until_pools(&clients, &["s1", "s2", "s3", "s4"], Duration::from_secs(5));

    // Scaling through the controller's API.
    let s5 = Memcached::start();
    let body = json!({"addr": s5.addr().to_string(), "name": "s5"});
    let added = ctl
        .call("POST", "/api/v1/pool/servers", Some(&body))
        .unwrap();
    until_pools(
        &clients,
        &["s1", "s2", "s3", "s4", "s5"],
        Duration::from_secs(5),
    );
    // The status says when the change reached the last switch (both are in step with it by
    // now, or a later one).
    let started = Instant::now();
    let change = loop {
        let status = ctl.call("GET", "/api/v1/status", None).unwrap();
        let change = status["last_change"].clone();
        if change["reached_every_switch_ms"].is_number() {
            break change;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "{status}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        change["generation"].as_u64() >= added["generation"].as_u64(),
        "{change} {added}"
    );
    assert_eq!(change["switches_reached"], 2, "{change}");
    let metrics = ctl.call("GET", "/metrics", None).unwrap();
    assert!(
        metrics
            .as_str()
            .unwrap_or_default()
            .contains("kvswitch_controller_change_spread_seconds "),
        "{metrics}"
    );
    let e = ctl
        .call("POST", "/api/v1/pool/servers", Some(&body))
        .unwrap_err()
        .to_string();
    assert!(e.contains("409"), "{e}");
    ctl.call("DELETE", "/api/v1/pool/servers/s3", None).unwrap();
    until_pools(&clients, &["s1", "s2", "s4", "s5"], Duration::from_secs(5));

    // A proxy changed behind the controller's back is put right.
    clients[0]
        .call("DELETE", "/api/v1/pool/servers/s1", None)
        .unwrap();
    until_pools(&clients, &["s1", "s2", "s4", "s5"], Duration::from_secs(5));
    let keys: Vec<Vec<u8>> = (0..50).map(|i| format!("after:{i}").into_bytes()).collect();
    for p in &proxies {
        local::store(p.addr, &keys).unwrap();
    }

    // A key of s2's, stored before it hangs.
    let ring = ring_of(&["s1", "s2", "s4", "s5"]);
    let key = (0..1000)
        .map(|i| format!("stale:{i}"))
        .find(|k| ring.locate(k.as_bytes()) == 1)
        .unwrap();
    let mut conn = Conn::open(proxies[0].addr);
    let set = |value: &str| format!("set {key} 0 0 {}\r\n{value}\r\n", value.len());
    assert_eq!(conn.text(set("old").as_bytes()), b"STORED\r\n");

    // A server that hangs (stopped, its port still open) under load is taken out too, with
    // failures only before it is out, and put back when it goes on.
    let pid = servers[1].pid().expect("s2 runs") as libc::pid_t;
    fault_under_load(
        &proxies,
        &clients,
        &["s1", "s4", "s5"],
        Duration::from_millis(1500),
        "s2 stopped",
        // SAFETY: kill takes no pointers; the PID is our own child's.
        || unsafe {
            libc::kill(pid, libc::SIGSTOP);
        },
    );
    // While it is out, its key is written elsewhere.
    assert_eq!(conn.text(set("new").as_bytes()), b"STORED\r\n");
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    until_pools(&clients, &["s1", "s2", "s4", "s5"], Duration::from_secs(5));
    // Back, it owns the key again: emptied before it came back, it does not answer with the
    // value the write replaced.
    assert_eq!(
        String::from_utf8_lossy(&conn.text(format!("get {key}\r\n").as_bytes())),
        "END\r\n",
        "s2 came back with an item replaced while it was out"
    );

    let metrics = ctl.call("GET", "/metrics", None).unwrap();
    let text = metrics.as_str().unwrap_or_default().to_string();
    api::metrics::lint(&text).unwrap_or_else(|e| panic!("the controller's /metrics: {e}"));
    // Killed and stopped: down twice at least (a loaded machine may see more).
    let downs: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("kvswitch_controller_server_downs_total{server=\"s2\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    assert!(downs >= 2, "{text}");
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
    let mut s5 = s5;
    s5.kill();
    servers[0].kill();
    servers[1].kill();
    servers[3].kill();
    // The kills may fall on either side of a probe round, so some may be out for a moment
    // before the last goes down; once all are down, all are kept.
    let all_down = || {
        let status: Value = ctl.call("GET", "/api/v1/status", None).unwrap();
        status["servers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["up"] == false)
    };
    let started = Instant::now();
    while !all_down() {
        assert!(started.elapsed() < Duration::from_secs(5), "not all down");
        std::thread::sleep(Duration::from_millis(20));
    }
    until_pools(&clients, &["s1", "s2", "s4", "s5"], Duration::from_secs(5));
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        assert_eq!(pool_of(&clients[0]), ["s1", "s2", "s4", "s5"]);
        assert_eq!(pool_of(&clients[1]), ["s1", "s2", "s4", "s5"]);
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(controller);
}

/// The address `client`'s pool gives the server `label`.
fn addr_of(client: &Client, label: &str) -> Option<String> {
    let doc = client.call("GET", "/api/v1/pool", None).ok()?;
    doc["pools"][0]["servers"]
        .as_array()?
        .iter()
        .find(|s| s["label"] == label)
        .and_then(|s| s["addr"].as_str().map(str::to_string))
}

#[test]
fn a_dead_servers_place_goes_to_a_spare_until_it_is_back() {
    let names = ["s1", "s2", "s3"];
    let (mut servers, list) = servers(&names);
    let spare = Memcached::start();
    let (proxies, clients) = proxies(2, &list, &PoolOpts::default());
    let apis: Vec<SocketAddr> = clients.iter().map(|c| c.api).collect();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let ctl_api = listener.local_addr().unwrap();
    let settings = format!(
        "probe_interval_ms = {PROBE_MS}\ndown_after = {DOWN_AFTER}\nsync_interval_ms = 300\n\
         failover = [\"{}\"]",
        spare.addr()
    );
    let file = config::controller::parse(
        &controller_toml(ctl_api, &settings, &apis, &list),
        Path::new("controller.toml"),
    )
    .unwrap();
    let _controller = controller::start(file, listener, None, None, None).unwrap();
    until_pools(&clients, &["s1", "s2", "s3"], Duration::from_secs(5));

    // Keys of s2 and of s1, by a ring built apart from kvswitch.
    let ring = kv::Ring::new(
        kv::Distribution::Ketama,
        kv::HashFn::Md5,
        &names.map(|n| kv::Server::new(n, 1)),
    )
    .unwrap();
    let owned_by = |i: usize| -> Vec<Vec<u8>> {
        (0..2000)
            .map(|k| format!("spare:{k}").into_bytes())
            .filter(|k| ring.locate(k) == i)
            .take(20)
            .collect()
    };
    let (of_s1, of_s2) = (owned_by(0), owned_by(1));

    // s2 dies: its place, not its keys' neighbours, takes them: the spare.
    servers[1].kill();
    let started = Instant::now();
    while clients
        .iter()
        .any(|c| addr_of(c, "s2") != Some(spare.addr().to_string()))
    {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the spare never stood in for s2: {:?}",
            clients.iter().map(|c| addr_of(c, "s2")).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    for p in &proxies {
        local::store(p.addr, &of_s2).unwrap();
        local::store(p.addr, &of_s1).unwrap();
    }
    let on_spare = local::owners(&[spare.addr()], &of_s2).unwrap();
    assert!(on_spare.iter().all(|o| *o == Some(0)), "{on_spare:?}");
    let on_s1 = local::owners(&[servers[0].addr()], &of_s1).unwrap();
    assert!(
        on_s1.iter().all(|o| *o == Some(0)),
        "s1's keys moved: {on_s1:?}"
    );

    // s2 back: its own place again, and the spare is free.
    servers[1].restart();
    let started = Instant::now();
    while clients
        .iter()
        .any(|c| addr_of(c, "s2") != Some(servers[1].addr().to_string()))
    {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "s2 never took its place back"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let ctl = Client::new(ctl_api, None);
    let status = ctl.call("GET", "/api/v1/status", None).unwrap();
    assert!(status["spares"][0]["standing_in_for"].is_null(), "{status}");
    assert_eq!(status["spares"][0]["up"], true, "{status}");
}

#[test]
fn changes_to_the_controller_need_its_token_when_it_has_one() {
    let server = Memcached::start();
    let list = [("s1", server.addr())];
    let (_proxies, clients) = proxies(1, &list, &PoolOpts::default());
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let api = listener.local_addr().unwrap();
    let file = config::controller::parse(
        &controller_toml(api, "", &[clients[0].api], &list),
        Path::new("controller.toml"),
    )
    .unwrap();
    let _controller = controller::start(file, listener, Some("sesame".into()), None, None).unwrap();
    let body = json!({"addr": "127.0.0.1:1", "name": "s9"});
    let mut ctl = Client::new(api, None);
    // Reads need none.
    ctl.call("GET", "/api/v1/status", None).unwrap();
    for token in [None, Some("sesame-not".to_string())] {
        ctl.token = token;
        let e = ctl
            .call("POST", "/api/v1/pool/servers", Some(&body))
            .unwrap_err()
            .to_string();
        assert!(e.contains("401"), "{e}");
    }
    ctl.token = Some("sesame".into());
    ctl.call("POST", "/api/v1/pool/servers", Some(&body))
        .unwrap();
    ctl.call("DELETE", "/api/v1/pool/servers/s9", None).unwrap();
}

/// `request` sent to `api` as it is written: the reply's status (0 for none) and body.
fn raw(api: SocketAddr, request: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(api).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    conn.write_all(request.as_bytes()).unwrap();
    let mut reply = String::new();
    let _ = conn.read_to_string(&mut reply);
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, body.to_string())
}

#[test]
fn the_controller_takes_no_change_a_browser_could_send_from_another_origin() {
    let server = Memcached::start();
    let list = [("s1", server.addr())];
    let (_proxies, clients) = proxies(1, &list, &PoolOpts::default());
    let (_controller, ctl) = start_controller(&[clients[0].api], &list, "");
    let api = ctl.api;
    let body = r#"{"addr": "127.0.0.1:1", "name": "s9"}"#;
    let post = |headers: &str| {
        raw(
            api,
            &format!(
                "POST /api/v1/pool/servers HTTP/1.1\r\nConnection: close\r\n{headers}\
                 Content-Length: {}\r\n\r\n{body}",
                body.len()
            ),
        )
    };
    let rebound = format!("evil.example:{}", api.port());
    for (headers, status) in [
        // A page of another origin, no-cors; and curl's default type.
        (
            format!("Host: {api}\r\nOrigin: http://evil.example\r\nContent-Type: text/plain\r\n"),
            403,
        ),
        (
            format!("Host: {api}\r\nContent-Type: application/x-www-form-urlencoded\r\n"),
            415,
        ),
        (
            format!(
                "Host: {api}\r\nOrigin: http://evil.example\r\nContent-Type: application/json\r\n"
            ),
            403,
        ),
        // DNS rebinding: the page's own name, pointed here.
        (
            format!(
                "Host: {rebound}\r\nOrigin: http://{rebound}\r\nContent-Type: application/json\r\n"
            ),
            403,
        ),
    ] {
        let (got, reply) = post(&headers);
        assert_eq!(got, status, "{headers}: {reply}");
        assert!(reply.contains("\"error\""), "{reply}");
    }
    let status = ctl.call("GET", "/api/v1/status", None).unwrap();
    assert_eq!(status["servers"].as_array().unwrap().len(), 1, "{status}");
    // The dashboard from its own origin, and not by another name.
    let (got, page) = raw(
        api,
        &format!("GET / HTTP/1.1\r\nHost: {api}\r\nConnection: close\r\n\r\n"),
    );
    assert_eq!(got, 200);
    assert!(page.contains("/api/v1/fleet"));
    let (got, _) = raw(
        api,
        &format!("GET /api/v1/fleet HTTP/1.1\r\nHost: {rebound}\r\nConnection: close\r\n\r\n"),
    );
    assert_eq!(got, 403);
    let metrics = ctl.call("GET", "/metrics", None).unwrap();
    let metrics = metrics.as_str().unwrap();
    for line in [
        "kvswitch_api_refused_total{reason=\"origin\"} 2",
        "kvswitch_api_refused_total{reason=\"content_type\"} 1",
        "kvswitch_api_refused_total{reason=\"host\"} 2",
    ] {
        assert!(metrics.contains(line), "no {line} in:\n{metrics}");
    }
    // The controller's own client sends JSON, as ever.
    ctl.call(
        "POST",
        "/api/v1/pool/servers",
        Some(&serde_json::from_str(body).unwrap()),
    )
    .unwrap();
    ctl.call("DELETE", "/api/v1/pool/servers/s9", None).unwrap();
}

#[test]
fn a_switch_out_of_reach_does_not_hold_up_the_others() {
    let names = ["s1", "s2"];
    let (mut servers, list) = servers(&names);
    let (_proxies, clients) = proxies(1, &list, &PoolOpts::default());
    // A "switch" that takes connections and never answers.
    let hung = TcpListener::bind("127.0.0.1:0").unwrap();
    let hung_api = hung.local_addr().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let api = listener.local_addr().unwrap();
    let settings = format!("probe_interval_ms = {PROBE_MS}\ndown_after = {DOWN_AFTER}");
    let file = config::controller::parse(
        &controller_toml(api, &settings, &[hung_api, clients[0].api], &list),
        Path::new("controller.toml"),
    )
    .unwrap();
    let _controller = controller::start(file, listener, None, None, None).unwrap();
    until_pools(&clients, &["s1", "s2"], Duration::from_secs(5));
    servers[1].kill();
    let took = until_pools(&clients, &["s1"], Duration::from_secs(5));
    // Detection takes about three probe intervals; waiting on the hung switch would add
    // its 2-second call timeout.
    assert!(took < Duration::from_millis(1500), "{took:?}");
    let ctl = Client::new(api, None);
    let status = ctl.call("GET", "/api/v1/status", None).unwrap();
    assert_eq!(status["switches"][0]["in_step"], false, "{status}");
    assert_eq!(status["switches"][1]["in_step"], true, "{status}");
    drop(hung);
}

#[test]
fn failed_requests_the_switches_report_take_a_server_out_before_its_probes_would() {
    let names = ["s1", "s2", "s3"];
    let (mut servers, list) = servers(&names);
    let (proxies, clients) = proxies(2, &list, &PoolOpts::default());
    let apis: Vec<SocketAddr> = clients.iter().map(|c| c.api).collect();
    // Probes alone would need 10 failures 2 s apart: 20 s. The proxies' reports need two.
    let (_controller, ctl) = start_controller(
        &apis,
        &list,
        "probe_interval_ms = 2000\nprobe_timeout_ms = 100\ndown_after = 10\ntko_after = 2",
    );
    until_pools(&clients, &["s1", "s2", "s3"], Duration::from_secs(10));
    let took = fault_under_load(
        &proxies,
        &clients,
        &["s1", "s3"],
        Duration::ZERO,
        "s2 killed, probes slow",
        || servers[1].kill(),
    );
    eprintln!("s2 killed: out of both pools by TKO in {took:?}");
    let s2 = server_status(&ctl, "s2");
    assert_eq!(s2["up"], json!(false), "{s2}");
    assert!(s2["tkos"].as_u64() >= Some(1), "not by TKO: {s2}");
    let metrics = ctl.call("GET", "/metrics", None).unwrap();
    let text = metrics.as_str().unwrap_or_default();
    assert!(
        text.contains("kvswitch_controller_server_tkos_total{server=\"s2\"} 1"),
        "{text}"
    );
}

/// The ring of `names` (ketama over md5, each named, weight 1), apart from kvswitch's.
fn ring_of(names: &[&str]) -> kv::Ring {
    let servers: Vec<kv::Server> = names.iter().map(|n| kv::Server::new(*n, 1)).collect();
    kv::Ring::new(kv::Distribution::Ketama, kv::HashFn::Md5, &servers).unwrap()
}

#[test]
fn a_server_added_with_a_warm_up_is_filled_from_where_its_keys_were() {
    let names = ["s1", "s2"];
    let (_servers, list) = servers(&names);
    let (proxies, clients) = proxies(2, &list, &PoolOpts::default());
    let apis: Vec<SocketAddr> = clients.iter().map(|c| c.api).collect();
    let (_controller, ctl) = start_controller(&apis, &list, "probe_interval_ms = 50");
    until_pools(&clients, &["s1", "s2"], Duration::from_secs(10));

    // Keys that s3 will own, written before it comes: they are on s1 and s2.
    let after = ring_of(&["s1", "s2", "s3"]);
    let moving: Vec<String> = (0..2000)
        .map(|i| format!("warm:{i}"))
        .filter(|k| after.locate(k.as_bytes()) == 2)
        .take(12)
        .collect();
    let mut conns: Vec<Conn> = proxies.iter().map(|p| Conn::open(p.addr)).collect();
    for (i, key) in moving.iter().enumerate() {
        let set = format!("set {key} {i} 0 2\r\nv{}\r\n", i % 10);
        assert_eq!(conns[0].text(set.as_bytes()), b"STORED\r\n");
    }

    let s3 = Memcached::start();
    let body = json!({"addr": s3.addr().to_string(), "name": "s3", "warm_ms": 60_000});
    ctl.call("POST", "/api/v1/pool/servers", Some(&body))
        .unwrap();
    until_pools(&clients, &["s1", "s2", "s3"], Duration::from_secs(10));

    // A write meanwhile goes to s3 and deletes the key where it was: a later miss on s3
    // does not find the value it replaced.
    let (deleted, rewritten) = (&moving[0], &moving[1]);
    assert_eq!(
        conns[1].text(format!("delete {deleted}\r\n").as_bytes()),
        b"NOT_FOUND\r\n",
        "s3 never had it"
    );
    assert_eq!(
        conns[1].text(format!("set {rewritten} 7 0 3\r\nnew\r\n").as_bytes()),
        b"STORED\r\n"
    );
    assert_eq!(
        conns[0].text(format!("get {deleted}\r\n").as_bytes()),
        b"END\r\n"
    );
    assert_eq!(
        conns[0].text(format!("get {rewritten}\r\n").as_bytes()),
        format!("VALUE {rewritten} 7 3\r\nnew\r\nEND\r\n").as_bytes()
    );
    // The others read as they were, through either proxy, and s3 is given them.
    let mut direct = Conn::open(s3.addr());
    for (i, key) in moving.iter().enumerate().skip(2) {
        let want = format!("VALUE {key} {i} 2\r\nv{}\r\nEND\r\n", i % 10);
        let got = conns[i % 2].text(format!("get {key}\r\n").as_bytes());
        assert_eq!(
            String::from_utf8_lossy(&got),
            want,
            "{key} while s3 warms up"
        );
        let started = Instant::now();
        while direct.text(format!("get {key}\r\n").as_bytes()) != want.as_bytes() {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "s3 was not given {key}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let metrics = clients[0].call("GET", "/metrics", None).unwrap();
    let metrics = metrics.as_str().unwrap_or_default().to_string();
    let fills: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("kvswitch_proxy_warm_fills_total{pool=\"default\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    assert!(fills >= 1, "{metrics}");

    // A warm-up longer than a day is refused, naming the field.
    let s4 = Memcached::start();
    let body = json!({"addr": s4.addr().to_string(), "name": "s4", "warm_ms": 90_000_000u64});
    let e = ctl
        .call("POST", "/api/v1/pool/servers", Some(&body))
        .unwrap_err()
        .to_string();
    assert!(e.contains("400") && e.contains("warm_ms"), "{e}");
}

/// What a proxy's pool shows of its staged change: (id, at, taken), in Unix milliseconds.
fn staged(client: &Client) -> (Option<u64>, Option<f64>, Option<f64>) {
    let doc = client.call("GET", "/api/v1/pool", None).unwrap();
    let s = &doc["pools"][0]["staged"];
    (
        s["id"].as_u64(),
        s["at_unix_ms"].as_f64(),
        s["taken_unix_ms"].as_f64(),
    )
}

#[test]
fn with_changes_taken_together_every_switch_takes_a_change_at_one_instant() {
    let names = ["s1", "s2", "s3"];
    let (_servers, list) = servers(&names);
    let (_proxies, clients) = proxies(3, &list, &PoolOpts::default());
    let apis: Vec<SocketAddr> = clients.iter().map(|c| c.api).collect();
    let (_controller, ctl) = start_controller(
        &apis,
        &list,
        &format!("probe_interval_ms = {PROBE_MS}\npool_changes = \"together\""),
    );
    let status = ctl.call("GET", "/api/v1/status", None).unwrap();
    assert_eq!(status["pool_changes"], "together", "{status}");
    let s4 = Memcached::start();
    let body = json!({"addr": s4.addr().to_string(), "name": "s4"});
    ctl.call("POST", "/api/v1/pool/servers", Some(&body))
        .unwrap();
    until_pools(&clients, &["s1", "s2", "s3", "s4"], Duration::from_secs(5));
    ctl.call("DELETE", "/api/v1/pool/servers/s2", None).unwrap();
    until_pools(&clients, &["s1", "s3", "s4"], Duration::from_secs(5));

    // Every proxy took the last change, the same one, and none before the instant it was
    // given.
    let shown: Vec<_> = clients.iter().map(staged).collect();
    let (id, at, _) = shown[0];
    for (i, (their_id, their_at, taken)) in shown.iter().enumerate() {
        assert_eq!((*their_id, *their_at), (id, at), "proxy {i}: {shown:?}");
        let (at, taken) = (their_at.unwrap(), taken.expect("taken"));
        assert!(
            taken >= at,
            "proxy {i} took the change before its instant: {shown:?}"
        );
    }
    let takens: Vec<f64> = shown.iter().filter_map(|s| s.2).collect();
    let skew = takens.iter().copied().fold(f64::MIN, f64::max)
        - takens.iter().copied().fold(f64::MAX, f64::min);
    // The changer counts a change once every switch has said it took it, just after.
    let started = Instant::now();
    let status = loop {
        let status = ctl.call("GET", "/api/v1/status", None).unwrap();
        if status["together"]["taken"].as_u64().unwrap_or(0) >= 2 {
            break status;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "{status}");
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!(
        "3 proxies took the change within {skew:.2} ms of each other ({})",
        status["together"]
    );
}

/// A "switch" that shows `real`'s pool and takes a staged change, but never answers its
/// commit; every request line it gets is recorded.
fn hangs_on_commit(real: Client) -> (SocketAddr, Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let (real, log) = (real.clone(), log.clone());
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    return;
                }
                let mut length = 0;
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                        break;
                    }
                    if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                }
                let mut body = vec![0; length];
                let _ = reader.read_exact(&mut body);
                let request = line.trim().to_string();
                log.lock().unwrap().push(request.clone());
                let reply = if request.starts_with("GET /api/v1/pool ") {
                    real.call("GET", "/api/v1/pool", None).unwrap().to_string()
                } else if request.starts_with("POST /api/v1/pool/staged/commit") {
                    std::thread::sleep(Duration::from_secs(3));
                    return;
                } else if request.contains("/api/v1/pool/staged") {
                    "{}".to_string()
                } else {
                    let mut c = conn;
                    let _ = c.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}");
                    return;
                };
                let mut c = conn;
                let _ = write!(
                    c,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n{reply}",
                    reply.len()
                );
            });
        }
    });
    (addr, seen)
}

#[test]
fn with_changes_taken_together_a_switch_that_does_not_commit_stops_the_change_everywhere() {
    let names = ["s1", "s2"];
    let (_servers, list) = servers(&names);
    let (_proxies, clients) = proxies(1, &list, &PoolOpts::default());
    let (fake, seen) = hangs_on_commit(clients[0].clone());
    let (_controller, ctl) = start_controller(
        &[clients[0].api, fake],
        &list,
        &format!("probe_interval_ms = {PROBE_MS}\npool_changes = \"together\""),
    );
    let s3 = Memcached::start();
    let body = json!({"addr": s3.addr().to_string(), "name": "s3"});
    ctl.call("POST", "/api/v1/pool/servers", Some(&body))
        .unwrap();
    let started = Instant::now();
    loop {
        let status = ctl.call("GET", "/api/v1/status", None).unwrap();
        if status["together"]["stopped"].as_u64().unwrap_or(0) >= 1 {
            assert_eq!(status["switches"][1]["in_step"], false, "{status}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the change was never stopped: {status}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The change was staged and committed on both, then cancelled: the proxy, which
    // answered everything, never takes it, even well past the instant.
    let requests = seen.lock().unwrap().clone();
    for call in [
        "PUT /api/v1/pool/staged",
        "POST /api/v1/pool/staged/commit",
        "DELETE /api/v1/pool/staged",
    ] {
        assert!(
            requests.iter().any(|r| r.starts_with(call)),
            "{call} never reached the hung switch: {requests:?}"
        );
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(pool_of(&clients[0]), ["s1", "s2"]);
    let (_, _, taken) = staged(&clients[0]);
    assert_eq!(taken, None, "the proxy took a cancelled change");
}

#[test]
fn with_changes_taken_together_a_switch_out_of_reach_stops_the_change_everywhere() {
    let names = ["s1", "s2"];
    let (_servers, list) = servers(&names);
    let (_proxies, clients) = proxies(1, &list, &PoolOpts::default());
    // A "switch" that takes connections and never answers, beside the proxy.
    let hung = TcpListener::bind("127.0.0.1:0").unwrap();
    let (_controller, ctl) = start_controller(
        &[clients[0].api, hung.local_addr().unwrap()],
        &list,
        &format!("probe_interval_ms = {PROBE_MS}\npool_changes = \"together\""),
    );
    let s3 = Memcached::start();
    let body = json!({"addr": s3.addr().to_string(), "name": "s3"});
    ctl.call("POST", "/api/v1/pool/servers", Some(&body))
        .unwrap();
    // The change is not taken where it could be: the old pool stays in force, round after
    // round, while the hung switch cannot even be read.
    let started = Instant::now();
    loop {
        let status = ctl.call("GET", "/api/v1/status", None).unwrap();
        if status["switches"][1]["errors"].as_u64().unwrap_or(0) >= 2 {
            assert_eq!(status["switches"][1]["in_step"], false, "{status}");
            assert!(status["switches"][1]["last_error"].is_string(), "{status}");
            assert_eq!(status["together"]["taken"], 0, "{status}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the change was never stopped: {status}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(pool_of(&clients[0]), ["s1", "s2"]);
    let (_, _, taken) = staged(&clients[0]);
    assert_eq!(taken, None, "the proxy took a change");
    drop(hung);
}
