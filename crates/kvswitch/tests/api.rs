//! The control API over HTTP against a switch forwarding on in-memory ports: every route of
//! the OpenAPI document answers, tables and entries change through it and frames follow at
//! once, refusals are 4xx JSON naming the field and change nothing, changes need the token
//! when one is set, and frames go to and come from the CPU. What a web browser may send from
//! another origin (a `text/plain` POST, a foreign `Origin`, a rebound `Host`) is refused, and
//! slow clients and large bodies cannot hold the API.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ::api::guard::{ApiServing, BODY_BUDGET, MAX_BODY};
use ::api::Client;
use daemon::api::{http::ROUTES, serve, Api, Exporter};
use dataplane::{Driver, RunOptions};
use kv::rules::Change;
use kv::{Distribution, HashFn};
use kvio::{mem_pair, Batch, MemPort, Port};
use serde_json::{json, Value};
use switch::frame::{udp_frame, UdpEnds};
use switch::pool::Pool;
use switch::stats::{self, Stats};
use switch::{spec, Switch, SwitchSpec};
use wire::ethernet::Mac;

const PORTS: usize = 3;

/// Counters and status enough for the routes that read them.
struct Counters(Arc<Stats>);

impl Exporter for Counters {
    fn metrics(&self, m: &mut api::metrics::Exposition) {
        m.single(
            "kvswitch_test_rig",
            api::metrics::Kind::Gauge,
            "A switch under test.",
            1,
        );
    }

    fn status(&self) -> Value {
        json!({ "pool": { "servers": [] } })
    }

    fn ports(&self) -> Value {
        use switch::stats::get;
        self.0
            .ports
            .iter()
            .enumerate()
            .map(|(i, p)| {
                json!(switch::control::PortView {
                    port: i as u16,
                    name: Some(format!("mem{i}")),
                    mac: None,
                    datapath: "memory".into(),
                    rx_packets: get(&p.rx_packets),
                    rx_bytes: get(&p.rx_bytes),
                    tx_packets: get(&p.tx_packets),
                    tx_bytes: get(&p.tx_bytes),
                    tx_dropped: get(&p.tx_dropped),
                    queue_bytes: get(&p.queue_bytes),
                    queue_packets: get(&p.queue_packets),
                    egress_rate_bps: None,
                    egress_depth_bytes: None,
                })
            })
            .collect()
    }
}

/// A switch on three in-memory ports, forwarding on its own thread, with its API.
struct Rig {
    client: Client,
    /// The far ends of the switch's ports.
    hosts: Vec<MemPort>,
    /// The switch's counters.
    stats: Arc<Stats>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn rig(token: Option<&str>) -> Rig {
    rig_with(token, ApiServing::default())
}

/// [`rig`], its API serving as `serving` says.
fn rig_with(token: Option<&str>, serving: ApiServing) -> Rig {
    let servers = vec![spec::Server {
        addr: SocketAddrV4::new(Ipv4Addr::new(10, 0, 1, 1), 11211),
        mac: Some(Mac([2, 0, 0, 0, 1, 1])),
    }];
    let spec = SwitchSpec::new(PORTS, Ipv4Addr::new(10, 0, 0, 100), servers);
    let pool = Arc::new(Pool::new(spec.pool_spec(Distribution::Ketama, HashFn::Md5)).unwrap());
    let stats = Arc::new(Stats::new(PORTS, 1));
    let sw = Switch::new(spec, pool.clone(), stats.clone()).unwrap();
    let mut ports: Vec<Box<dyn Port>> = Vec::new();
    let mut hosts = Vec::new();
    for _ in 0..PORTS {
        let (a, b) = mem_pair().unwrap();
        ports.push(Box::new(a));
        hosts.push(b);
    }
    let (remote, inbox) = dataplane::remote::<Switch>().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let mut driver = Driver::new(ports, sw, None, stats.clone());
    let egress = driver.egress();
    let thread = std::thread::spawn(move || {
        let opts = RunOptions {
            max_sleep: Duration::from_millis(10),
            ..RunOptions::default()
        };
        driver
            .run(
                &opts,
                Some(&inbox),
                &|| stopped.load(Ordering::Relaxed),
                &mut |_| {},
            )
            .unwrap();
    });
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = serve(
        listener,
        Api {
            exporter: Arc::new(Counters(stats.clone())),
            switch: Some(remote),
            token: token.map(str::to_string),
            pools: vec![pool],
            reload: None,
            egress: Some(egress),
            serving,
        },
    )
    .unwrap();
    Rig {
        client: Client::new(addr, token.map(str::to_string)),
        hosts,
        stats,
        stop,
        thread: Some(thread),
    }
}

/// A UDP frame from a host on port 0 to `dst`, for a MAC nobody has.
fn frame(dst: Ipv4Addr) -> Vec<u8> {
    udp_frame(
        &UdpEnds {
            src_mac: Mac([2, 0, 0, 0, 0, 1]),
            dst_mac: Mac([2, 0, 0, 0, 9, 9]),
            src_ip: Ipv4Addr::new(10, 0, 0, 1),
            dst_ip: dst,
            src_port: 40000,
            dst_port: 7,
        },
        &[b"hello"],
    )
}

/// The ports (other than 0) the frame came out of, within a second.
fn outputs(rig: &mut Rig, frame: &[u8]) -> Vec<usize> {
    for h in &mut rig.hosts {
        let mut b = Batch::new(64);
        while h.recv(&mut b).unwrap() > 0 {
            b.clear();
        }
    }
    rig.hosts[0].send(&[frame]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut out = Vec::new();
    while out.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
        for (i, h) in rig.hosts.iter_mut().enumerate().skip(1) {
            let mut b = Batch::new(64);
            let n = h.recv(&mut b).unwrap();
            // The switch's own ARP requests may go out too.
            if (0..n).any(|j| b.frame(j).ends_with(b"hello")) {
                out.push(i);
            }
        }
    }
    out
}

/// The error of a call that must fail: its status and JSON body.
fn refused(rig: &Rig, method: &str, path: &str, body: Option<Value>) -> String {
    rig.client
        .call(method, path, body.as_ref())
        .expect_err("the call is refused")
        .to_string()
}

#[test]
fn every_documented_route_is_served() {
    let rig = rig(None);
    // The dashboard's data, as a fleet of one.
    let fleet = rig.client.call("GET", "/api/v1/fleet", None).unwrap();
    assert_eq!(fleet["controller"]["servers"][0]["up"], true, "{fleet}");
    assert!(fleet["switches"][0]["status"].is_object(), "{fleet}");
    let page = rig.client.call("GET", "/dashboard", None).unwrap();
    assert!(page.as_str().unwrap_or_default().contains("/api/v1/fleet"));
    for (path, methods) in ROUTES {
        let path = path
            .replace("{table}", "acl")
            .replace("{id}", "1")
            .replace("{action}", "pin")
            .replace("{server}", "0")
            .replace("{name}", "user0")
            .replace("/stream", "/stream?ms=50");
        for method in *methods {
            let method = method.to_uppercase();
            let body = (method != "GET").then(|| json!({}));
            if let Err(e) = rig.client.call(&method, &path, body.as_ref()) {
                // Served routes may refuse these made-up arguments, but never as a route
                // that does not exist.
                assert!(!e.to_string().contains("no route"), "{method} {path}: {e}");
            }
        }
    }
    let e = refused(&rig, "GET", "/api/v1/nothing", None);
    assert!(e.contains("404") && e.contains("no route"), "{e}");
    let doc = rig
        .client
        .call("GET", "/api/v1/openapi.json", None)
        .unwrap();
    assert!(doc["paths"]["/api/v1/batch"]["post"].is_object());
}

#[test]
fn tables_change_through_the_api_and_frames_follow_at_once() {
    let mut rig = rig(None);
    let c = &rig.client;
    let t = c
        .call(
            "POST",
            "/api/v1/tables",
            Some(&json!({"name": "steer", "kind": "lpm", "key": ["ip_dst"], "miss": ["drop"]})),
        )
        .unwrap();
    assert_eq!(t["owner"], "operator");
    let applied = c
        .call(
            "POST",
            "/api/v1/batch",
            Some(&json!({"changes": [
                {"op": "add", "table": "acl", "entry": {
                    "match": {"ethertype": "0x0800", "ip_dst": {"value": "10.7.0.0", "mask": "255.255.0.0"}},
                    "actions": [{"goto": "steer"}]}},
                {"op": "add", "table": "steer", "entry": {
                    "match": {"ip_dst": "10.7.0.0"}, "prefix_len": 16, "actions": [{"output": 1}]}},
                {"op": "add", "table": "steer", "entry": {
                    "match": {"ip_dst": "10.7.3.0"}, "prefix_len": 24, "actions": [{"output": 2}]}},
            ]})),
        )
        .unwrap();
    assert_eq!(applied["applied"], 3);
    assert_eq!(outputs(&mut rig, &frame(Ipv4Addr::new(10, 7, 1, 1))), [1]);
    assert_eq!(outputs(&mut rig, &frame(Ipv4Addr::new(10, 7, 3, 1))), [2]);
    // Not steered: the program floods it.
    assert_eq!(
        outputs(&mut rig, &frame(Ipv4Addr::new(10, 8, 0, 1))),
        [1, 2]
    );

    let entries = rig
        .client
        .call("GET", "/api/v1/tables/steer/entries", None)
        .unwrap();
    let entries = entries["entries"].as_array().unwrap();
    let longest = entries
        .iter()
        .find(|e| e["prefix_len"] == 24)
        .expect("the /24 is listed");
    assert_eq!(longest["hits"], 1);
    let id = longest["id"].as_u64().unwrap();
    rig.client
        .call(
            "PUT",
            &format!("/api/v1/tables/steer/entries/{id}"),
            Some(&json!({"actions": [{"output": 1}]})),
        )
        .unwrap();
    assert_eq!(outputs(&mut rig, &frame(Ipv4Addr::new(10, 7, 3, 1))), [1]);
    rig.client
        .call(
            "DELETE",
            &format!("/api/v1/tables/steer/entries/{id}"),
            None,
        )
        .unwrap();
    assert_eq!(outputs(&mut rig, &frame(Ipv4Addr::new(10, 7, 3, 1))), [1]);
}

#[test]
fn refusals_are_json_naming_the_field_and_change_nothing() {
    let rig = rig(None);
    let c = &rig.client;
    c.call(
        "POST",
        "/api/v1/tables",
        Some(&json!({"name": "t", "kind": "exact", "key": ["l4_dst"], "size": 1})),
    )
    .unwrap();
    c.call(
        "POST",
        "/api/v1/tables/t/entries",
        Some(&json!({"match": {"l4_dst": 1}, "actions": ["flood"]})),
    )
    .unwrap();
    let before = c.call("GET", "/api/v1/tables", None).unwrap();
    let cases = [
        (
            "POST",
            "/api/v1/tables/t/entries",
            json!({"match": {"l4_dst": 2}, "actions": ["flood"]}),
            "409",
            "full",
        ),
        (
            "POST",
            "/api/v1/tables/t/entries",
            json!({"match": {"l4_dst": 1}, "actions": ["flood"]}),
            "409",
            "already has this key",
        ),
        (
            "POST",
            "/api/v1/tables/nope/entries",
            json!({"actions": []}),
            "404",
            "no table named \"nope\"",
        ),
        (
            "POST",
            "/api/v1/tables/t/entries",
            json!({"match": {"l4_dst": "x"}, "actions": []}),
            "400",
            "match.l4_dst",
        ),
        (
            "POST",
            "/api/v1/tables/t/entries",
            json!({"match": {"l4_dst": 1}, "actions": [{"teleport": 1}]}),
            "400",
            "actions[0]",
        ),
        (
            "POST",
            "/api/v1/tables/t/entries",
            json!({"match": {"l4_dst": 1}, "actions": [], "colour": 1}),
            "400",
            "colour",
        ),
        (
            "POST",
            "/api/v1/tables/l2/entries",
            json!({"actions": []}),
            "409",
            "belongs to the memcached program",
        ),
        (
            "POST",
            "/api/v1/tables",
            json!({"name": "t", "kind": "exact", "key": ["l4_dst"]}),
            "409",
            "exists",
        ),
        (
            "POST",
            "/api/v1/tables",
            json!({"name": "u", "kind": "fuzzy", "key": ["l4_dst"]}),
            "400",
            "kind",
        ),
        (
            "POST",
            "/api/v1/batch",
            json!({"changes": [
            {"op": "delete", "table": "t", "id": 0},
            {"op": "add", "table": "t", "entry": {"match": {"l4_dst": 5}, "actions": ["to_cpu"]}},
            {"op": "add", "table": "t", "entry": {"match": {"l4_dst": 6}, "actions": ["to_cpu"]}}]}),
            "409",
            "changes[2]",
        ),
        (
            "PUT",
            "/api/v1/tables/t/entries/notanumber",
            json!({"actions": []}),
            "400",
            "not an entry id",
        ),
        (
            "DELETE",
            "/api/v1/tables/t/entries/99",
            json!(null),
            "404",
            "no entry 99",
        ),
        (
            "POST",
            "/api/v1/packets",
            json!({"port": 7, "frame": "00"}),
            "400",
            "port 7",
        ),
    ];
    for (method, path, body, status, text) in cases {
        let body = (!body.is_null()).then_some(body);
        let e = refused(&rig, method, path, body);
        assert!(
            e.contains(status) && e.contains(text),
            "{method} {path}: {e}"
        );
    }
    assert_eq!(c.call("GET", "/api/v1/tables", None).unwrap(), before);
}

#[test]
fn changes_need_the_token_when_one_is_set() {
    let mut rig = rig(Some("sesame"));
    // Reads need none.
    rig.client.token = None;
    rig.client.call("GET", "/api/v1/tables", None).unwrap();
    let e = refused(
        &rig,
        "POST",
        "/api/v1/tables",
        Some(json!({"name": "t", "kind": "exact", "key": ["l4_dst"]})),
    );
    assert!(e.contains("401"), "{e}");
    // Taking the CPU's frames takes them from whoever else reads them: it needs the token.
    for path in ["/api/v1/packets", "/api/v1/packets/stream?ms=10"] {
        let e = refused(&rig, "GET", path, None);
        assert!(e.contains("401"), "{path}: {e}");
    }
    rig.client.token = Some("sesame-not".into());
    let e = refused(&rig, "DELETE", "/api/v1/tables/acl", None);
    assert!(e.contains("401"), "{e}");
    // A host that stages, commits or cancels a pool change with another token, or none, is
    // refused, and the pool neither moves nor holds a staged change.
    let before = rig.client.call("GET", "/api/v1/pool", None).unwrap();
    let staged = json!({"id": 7, "servers": [{"addr": "10.0.1.9:11211"}]});
    for token in [Some("sesame-not"), None] {
        rig.client.token = token.map(str::to_string);
        for (method, path, body) in [
            ("PUT", "/api/v1/pool/staged", Some(staged.clone())),
            ("POST", "/api/v1/pool/staged/commit", Some(json!({"id": 7}))),
            ("DELETE", "/api/v1/pool/staged?id=7", None),
        ] {
            let e = refused(&rig, method, path, body);
            assert!(e.contains("401"), "{method} {path} with {token:?}: {e}");
        }
    }
    // So is one that places the ring's arcs or takes a placement away.
    let placement = json!({"servers": [], "points": 0, "moves": []});
    for token in [Some("sesame-not"), None] {
        rig.client.token = token.map(str::to_string);
        for (method, body) in [("PUT", Some(placement.clone())), ("DELETE", None)] {
            let e = refused(&rig, method, "/api/v1/pool/placement", body);
            assert!(e.contains("401"), "{method} placement with {token:?}: {e}");
        }
    }
    let after = rig.client.call("GET", "/api/v1/pool", None).unwrap();
    assert_eq!(after, before);
    assert_eq!(after["pools"][0]["staged"], Value::Null, "{after}");
    rig.client.token = Some("sesame".into());
    rig.client.call("GET", "/api/v1/packets", None).unwrap();
    rig.client
        .call(
            "POST",
            "/api/v1/tables",
            Some(&json!({"name": "t", "kind": "exact", "key": ["l4_dst"]})),
        )
        .unwrap();
}

#[test]
fn frames_go_out_of_a_port_and_come_to_the_cpu() {
    let mut rig = rig(None);
    let f = frame(Ipv4Addr::new(10, 9, 9, 9));
    rig.client
        .call(
            "POST",
            "/api/v1/packets",
            Some(&json!({"port": 2, "frame": switch::control::hex(&f)})),
        )
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    // The switch's own ARP requests may go out too.
    'sent: loop {
        let mut got = Batch::new(8);
        let n = rig.hosts[2].recv(&mut got).unwrap();
        for j in 0..n {
            if got.frame(j) == &f[..] {
                break 'sent;
            }
        }
        assert!(Instant::now() < deadline, "the frame never left port 2");
        std::thread::sleep(Duration::from_millis(5));
    }

    rig.client
        .call(
            "POST",
            "/api/v1/tables/acl/entries",
            Some(&json!({"match": {"l4_dst": 7}, "actions": ["to_cpu", {"count": "echo"}]})),
        )
        .unwrap();
    rig.hosts[0].send(&[&f[..]]).unwrap();
    let frames = rig
        .client
        .call("GET", "/api/v1/packets?max=10&wait_ms=2000", None)
        .unwrap();
    let frames = frames["frames"].as_array().unwrap();
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0]["in_port"], 0);
    assert_eq!(frames[0]["reason"], "to_cpu");
    assert_eq!(frames[0]["frame"], switch::control::hex(&f));
    let counters = rig.client.call("GET", "/api/v1/counters", None).unwrap();
    assert_eq!(
        counters["counters"],
        json!([{"name": "echo", "packets": 1, "bytes": f.len()}])
    );
    // A counter goes only once nothing feeds it.
    let e = refused(&rig, "DELETE", "/api/v1/counters/echo", None);
    assert!(
        e.contains("409") && e.contains("fed by a count action"),
        "{e}"
    );
    let e = refused(&rig, "DELETE", "/api/v1/counters/nope", None);
    assert!(e.contains("404") && e.contains("no counter"), "{e}");

    // The stream hands over frames as they come, with their in-port, and ends after `count`.
    let client = rig.client.clone();
    let watcher = std::thread::spawn(move || {
        let mut got = Vec::new();
        client
            .stream("/api/v1/packets/stream?count=3", |f| {
                got.push(f);
                true
            })
            .map(|_| got)
    });
    for port in [0usize, 1, 0] {
        std::thread::sleep(Duration::from_millis(30));
        rig.hosts[port].send(&[&f[..]]).unwrap();
    }
    let got = watcher.join().unwrap().unwrap();
    let ports: Vec<u64> = got.iter().filter_map(|f| f["in_port"].as_u64()).collect();
    assert_eq!(ports, [0, 1, 0]);
    assert!(got.iter().all(|g| g["frame"] == switch::control::hex(&f)));
    let e = refused(&rig, "GET", "/api/v1/packets/stream?every=2", None);
    assert!(e.contains("400") && e.contains("every"), "{e}");

    // At most four streams at once; a fifth is refused while they are open.
    let mut open: Vec<_> = (0..4)
        .map(|_| rig.client.open("/api/v1/packets/stream?ms=300").unwrap())
        .collect();
    let e = rig
        .client
        .open("/api/v1/packets/stream?ms=1")
        .err()
        .expect("a fifth stream is refused")
        .to_string();
    assert!(e.contains("503") && e.contains("streams"), "{e}");
    // Streams that end give their places back.
    for s in &mut open {
        assert!(s.next_line().unwrap().is_none());
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while let Err(e) = rig.client.stream("/api/v1/packets/stream?ms=1", |_| true) {
        assert!(Instant::now() < deadline, "no place came back: {e}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn an_egress_queue_holds_its_port_to_its_rate_and_drops_past_its_depth() {
    let mut rig = rig(None);
    // 1 Mbit/s and room for four 1000-byte frames on port 1; port 2 sends at once.
    let set = rig
        .client
        .call(
            "PUT",
            "/api/v1/ports/1/egress",
            Some(&json!({"rate_bps": 1_000_000, "depth_bytes": 4000})),
        )
        .unwrap();
    assert_eq!(set["rate_bps"], 1_000_000);
    let big = udp_frame(
        &UdpEnds {
            src_mac: Mac([2, 0, 0, 0, 0, 1]),
            dst_mac: Mac([2, 0, 0, 0, 9, 9]),
            src_ip: Ipv4Addr::new(10, 0, 0, 1),
            dst_ip: Ipv4Addr::new(10, 9, 9, 9),
            src_port: 40000,
            dst_port: 9,
        },
        &[&[7u8; 958]],
    );
    assert_eq!(big.len(), 1000);
    let frames: Vec<&[u8]> = (0..50).map(|_| &big[..]).collect();
    rig.hosts[0].send(&frames).unwrap();
    // Flooded to both: port 2 gets all fifty; port 1's queue takes what fits.
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut got = [0usize; 3];
    while got[2] < 50 && Instant::now() < deadline {
        for (host, count) in rig.hosts.iter_mut().zip(got.iter_mut()).skip(1) {
            let mut b = Batch::new(64);
            let n = host.recv(&mut b).unwrap();
            *count += (0..n).filter(|&j| b.frame(j).len() == 1000).count();
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(got[2], 50);
    let ports = rig.client.call("GET", "/api/v1/ports", None).unwrap();
    let port1 = &ports["ports"][1];
    assert_eq!(port1["egress_rate_bps"], 1_000_000, "{ports}");
    let dropped = port1["tx_dropped"].as_u64().unwrap();
    assert!(dropped >= 40, "{ports}");
    // What the queue took leaves at the rate: at 1 Mbit/s a 1000-byte frame takes 8 ms.
    assert!(got[1] as u64 + dropped <= 50, "{got:?}");
    let e = refused(
        &rig,
        "PUT",
        "/api/v1/ports/9/egress",
        Some(json!({"rate_bps": 0})),
    );
    assert!(e.contains("404"), "{e}");
    let e = refused(
        &rig,
        "PUT",
        "/api/v1/ports/1/egress",
        Some(json!({"rate_bps": 10})),
    );
    assert!(e.contains("400") && e.contains("too slow"), "{e}");
}

/// The frame as it came out of `port` (other than 0), within a second.
fn received(rig: &mut Rig, port: usize, frame: &[u8]) -> Option<Vec<u8>> {
    for h in &mut rig.hosts {
        let mut b = Batch::new(64);
        while h.recv(&mut b).unwrap() > 0 {
            b.clear();
        }
    }
    rig.hosts[0].send(&[frame]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
        let mut b = Batch::new(64);
        let n = rig.hosts[port].recv(&mut b).unwrap();
        if let Some(j) = (0..n).find(|&j| b.frame(j).ends_with(b"hello")) {
            return Some(b.frame(j).to_vec());
        }
    }
    None
}

#[test]
fn an_interface_entry_sends_every_route_naming_it_and_one_change_moves_them_all() {
    let mut rig = rig(None);
    let c = rig.client.clone();
    // An action may not name an interface that is not there.
    let e = refused(
        &rig,
        "POST",
        "/api/v1/tables/acl/entries",
        Some(json!({"match": {"ip_dst": "10.7.0.1"}, "actions": [{"interface": 4}]})),
    );
    assert!(e.contains("400") && e.contains("no interface 4"), "{e}");
    let e = refused(
        &rig,
        "PUT",
        "/api/v1/interfaces/4",
        Some(json!({"eth_dst": "02:00:00:00:07:07", "eth_src": "nonsense", "port": 1})),
    );
    assert!(e.contains("eth_src"), "{e}");
    let e = refused(
        &rig,
        "PUT",
        "/api/v1/interfaces/4",
        Some(json!({"eth_dst": "02:00:00:00:07:07", "eth_src": "02:00:00:00:00:fe", "port": 9})),
    );
    assert!(e.contains("port 9 does not exist"), "{e}");
    c.call(
        "PUT",
        "/api/v1/interfaces/4",
        Some(&json!({"eth_dst": "02:00:00:00:07:07", "eth_src": "02:00:00:00:00:fe", "port": 1})),
    )
    .unwrap();
    for ip in ["10.7.0.1", "10.7.0.2"] {
        c.call(
            "POST",
            "/api/v1/tables/acl/entries",
            Some(&json!({"match": {"ip_dst": ip}, "actions": [{"interface": 4}]})),
        )
        .unwrap();
    }
    let shown = c.call("GET", "/api/v1/interfaces/4", None).unwrap();
    assert_eq!(
        (shown["port"].as_u64(), shown["used_by"].as_u64()),
        (Some(1), Some(2))
    );
    for last in [1, 2] {
        let out = received(&mut rig, 1, &frame(Ipv4Addr::new(10, 7, 0, last))).expect("on port 1");
        assert_eq!(&out[0..6], &[2, 0, 0, 0, 7, 7]);
        assert_eq!(&out[6..12], &[2, 0, 0, 0, 0, 0xfe]);
    }
    // One change to the interface moves both routes.
    c.call(
        "PUT",
        "/api/v1/interfaces/4",
        Some(&json!({"eth_dst": "02:00:00:00:08:08", "eth_src": "02:00:00:00:00:fe", "port": 2})),
    )
    .unwrap();
    for last in [1, 2] {
        assert_eq!(
            outputs(&mut rig, &frame(Ipv4Addr::new(10, 7, 0, last))),
            [2]
        );
    }
    // Not removed while named.
    let e = refused(&rig, "DELETE", "/api/v1/interfaces/4", None);
    assert!(e.contains("409"), "{e}");
    let listed = c.call("GET", "/api/v1/interfaces", None).unwrap();
    assert_eq!(listed["interfaces"].as_array().map(Vec::len), Some(1));
    let entries = c.call("GET", "/api/v1/tables/acl/entries", None).unwrap();
    for e in entries["entries"].as_array().unwrap() {
        if e["actions"][0]["interface"] == 4 {
            c.call(
                "DELETE",
                &format!("/api/v1/tables/acl/entries/{}", e["id"]),
                None,
            )
            .unwrap();
        }
    }
    c.call("DELETE", "/api/v1/interfaces/4", None).unwrap();
    let e = refused(&rig, "GET", "/api/v1/interfaces/4", None);
    assert!(e.contains("404"), "{e}");
}

/// Runs `kvswitch ctl --api API ARGS` and returns its output, or its error.
fn ctl(rig: &Rig, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvswitch"))
        .args(["ctl", "--api", &rig.client.api.to_string()])
        .args(args)
        .output()
        .expect("run kvswitch ctl");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    match out.status.success() {
        true => Ok(text(&out.stdout)),
        false => Err(text(&out.stderr)),
    }
}

#[test]
fn a_multicast_group_copies_a_frame_out_of_each_member_and_is_kept_while_named() {
    let mut rig = rig(None);
    let c = rig.client.clone();
    // An action may not name a group that is not there; a group may not name a port or an
    // interface that is not there, nor be empty.
    let e = refused(
        &rig,
        "POST",
        "/api/v1/tables/acl/entries",
        Some(json!({"match": {"ip_dst": "10.7.0.9"}, "actions": [{"multicast": 3}]})),
    );
    assert!(
        e.contains("400") && e.contains("no multicast group 3"),
        "{e}"
    );
    for (members, why) in [
        (json!([{"port": 9}]), "port 9 does not exist"),
        (json!([{"interface": 5}]), "no interface 5"),
        (json!([]), "1 to 64 members"),
        (json!([{"vlan": 1}]), "400"),
    ] {
        let e = refused(
            &rig,
            "PUT",
            "/api/v1/groups/3",
            Some(json!({ "members": members })),
        );
        assert!(e.contains(why), "{e}");
    }
    let e = ctl(&rig, &["group", "set", "3", "port:1", "vlan:2"]).expect_err("a bad member");
    assert!(e.contains("write port:N or interface:N"), "{e}");
    // Through ctl: port 0 (where the frame comes in: no copy), port 1 as the frame is, and
    // interface 5, which rewrites the MACs, on port 2.
    c.call(
        "PUT",
        "/api/v1/interfaces/5",
        Some(&json!({"eth_dst": "02:00:00:00:07:07", "eth_src": "02:00:00:00:00:fe", "port": 2})),
    )
    .unwrap();
    let set = ctl(
        &rig,
        &["group", "set", "3", "port:0", "port:1", "interface:5"],
    )
    .unwrap();
    assert_eq!(set, "group 3: port:0 port:1 interface:5\n");
    ctl(
        &rig,
        &[
            "entry",
            "add",
            "acl",
            "--match",
            "ip_dst=10.7.0.9",
            "--action",
            "multicast:3",
        ],
    )
    .unwrap();
    let listed = ctl(&rig, &["groups"]).unwrap();
    assert!(listed.contains("port:0 port:1 interface:5"), "{listed}");
    assert_eq!(c.groups().unwrap()[0].used_by, 1);
    let f = frame(Ipv4Addr::new(10, 7, 0, 9));
    let as_is = received(&mut rig, 1, &f).expect("a copy on port 1");
    assert_eq!(as_is, f);
    let through = received(&mut rig, 2, &f).expect("a copy on port 2");
    assert_eq!(&through[0..6], &[2, 0, 0, 0, 7, 7]);
    assert_eq!(&through[6..12], &[2, 0, 0, 0, 0, 0xfe]);
    assert_eq!(&through[12..], &f[12..]);
    // Two frames, two copies each.
    assert_eq!(stats::get(&rig.stats.multicast), 2);
    assert_eq!(stats::get(&rig.stats.multicast_copies), 4);
    // Neither the group nor its interface goes while named.
    let e = refused(&rig, "DELETE", "/api/v1/groups/3", None);
    assert!(e.contains("409"), "{e}");
    let e = refused(&rig, "DELETE", "/api/v1/interfaces/5", None);
    assert!(e.contains("409") && e.contains("multicast group 3"), "{e}");
    let entries = c.call("GET", "/api/v1/tables/acl/entries", None).unwrap();
    let id = entries["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["actions"][0]["multicast"] == 3)
        .map(|e| e["id"].clone())
        .expect("the entry, described as written");
    c.call("DELETE", &format!("/api/v1/tables/acl/entries/{id}"), None)
        .unwrap();
    assert_eq!(ctl(&rig, &["group", "delete", "3"]).unwrap(), "deleted\n");
    let e = refused(&rig, "GET", "/api/v1/groups/3", None);
    assert!(e.contains("404"), "{e}");
    c.remove_interface(5).unwrap();
}

#[test]
fn registers_are_read_and_written_and_steer_frames() {
    let mut rig = rig(None);
    let c = rig.client.clone();
    // `mode` outputs by metadata register 3, which acl loads from user register 7 and counts
    // in user register 8.
    c.call(
        "POST",
        "/api/v1/tables",
        Some(&json!({"name": "mode", "kind": "exact",
                     "key": [{"name": "mode", "meta": "reg3"}], "miss": ["flood"]})),
    )
    .unwrap();
    c.call(
        "POST",
        "/api/v1/tables/mode/entries",
        Some(&json!({"match": {"mode": 2}, "actions": [{"output": 2}]})),
    )
    .unwrap();
    c.call(
        "POST",
        "/api/v1/tables/acl/entries",
        Some(&json!({"match": {"ip_dst": "10.7.0.1"}, "actions": [
            {"add_register": {"register": 8, "value": 1}},
            {"load_reg": {"reg": 3, "register": 7}},
            {"goto": "mode"}]})),
    )
    .unwrap();
    let f = frame(Ipv4Addr::new(10, 7, 0, 1));
    assert_eq!(outputs(&mut rig, &f), [1, 2]);
    let written = c
        .call("PUT", "/api/v1/registers/user7", Some(&json!({"value": 2})))
        .unwrap();
    assert_eq!(written["value"], 2);
    assert_eq!(outputs(&mut rig, &f), [2]);
    let user8 = c.call("GET", "/api/v1/registers/user8", None).unwrap();
    assert_eq!(user8["value"], 2);
    // The ports' figures are registers too, read-only.
    let all = c.call("GET", "/api/v1/registers", None).unwrap();
    let all = all["registers"].as_array().unwrap();
    assert_eq!(all.iter().filter(|r| r["writable"] == true).count(), 64);
    let rx = all
        .iter()
        .find(|r| r["name"] == "port0.rx_packets")
        .expect("port 0's packets are a register");
    assert!(rx["value"].as_u64() >= Some(2), "{rx}");
    let e = refused(
        &rig,
        "PUT",
        "/api/v1/registers/port0.rx_packets",
        Some(json!({"value": 0})),
    );
    assert!(e.contains("409") && e.contains("read-only"), "{e}");
    let e = refused(
        &rig,
        "PUT",
        "/api/v1/registers/user64",
        Some(json!({"value": 0})),
    );
    assert!(e.contains("404"), "{e}");
    let e = refused(
        &rig,
        "PUT",
        "/api/v1/registers/user1",
        Some(json!({"value": -1})),
    );
    assert!(e.contains("400") && e.contains("value"), "{e}");
    // The program's registers are not an operator's to write.
    let e = refused(
        &rig,
        "POST",
        "/api/v1/tables/acl/entries",
        Some(
            json!({"match": {"ip_dst": "10.7.0.2"}, "actions": [{"set_reg": {"reg": 0, "value": 1}}]}),
        ),
    );
    assert!(e.contains("reg0"), "{e}");
}

#[test]
fn a_large_table_is_listed_a_page_at_a_time() {
    let rig = rig(None);
    let c = &rig.client;
    c.call(
        "POST",
        "/api/v1/tables",
        Some(&json!({"name": "many", "kind": "exact", "key": ["l4_dst"]})),
    )
    .unwrap();
    let changes: Vec<Value> = (0..5)
        .map(|p| json!({"op": "add", "table": "many", "entry": {"match": {"l4_dst": p}, "actions": ["drop"]}}))
        .collect();
    c.call(
        "POST",
        "/api/v1/batch",
        Some(&json!({ "changes": changes })),
    )
    .unwrap();
    let mut seen = Vec::new();
    let mut query = "?limit=2".to_string();
    for _ in 0..5 {
        let page = c
            .call("GET", &format!("/api/v1/tables/many/entries{query}"), None)
            .unwrap();
        let entries = page["entries"].as_array().unwrap();
        assert!(entries.len() <= 2, "{page}");
        seen.extend(entries.iter().filter_map(|e| e["match"]["l4_dst"].as_u64()));
        match page["next"].as_u64() {
            Some(n) => query = format!("?limit=2&after={n}"),
            None => break,
        }
    }
    seen.sort_unstable();
    assert_eq!(seen, [0, 1, 2, 3, 4]);
    // Without a limit, one page holds them all.
    let all = c.call("GET", "/api/v1/tables/many/entries", None).unwrap();
    assert_eq!(all["entries"].as_array().map(Vec::len), Some(5));
    assert!(all["next"].is_null());
    let e = refused(&rig, "GET", "/api/v1/tables/many/entries?page=2", None);
    assert!(e.contains("400"), "{e}");
}

/// The typed client: a table made, entries added alone and in a batch, listed back as they
/// were defined, removed; a refusal decoded into the switch's own error, naming its field.
#[test]
fn the_typed_client_speaks_the_switchs_tables_and_decodes_its_refusals() {
    use switch::control::{
        ActionDef, Change, ControlError, EntryDef, ErrorKind, KeyField, Kind, TableDef, Value as V,
    };
    let rig = rig(None);
    let c = &rig.client;
    c.add_table(&TableDef {
        name: "typed".into(),
        kind: Kind::Exact,
        key: vec![KeyField::Named("l4_dst".into())],
        miss: Vec::new(),
        size: Some(4),
    })
    .unwrap();
    assert!(c.tables().unwrap().iter().any(|t| t.name == "typed"));
    let entry = |port: u64| EntryDef {
        fields: [("l4_dst".to_string(), V::Number(port))].into(),
        priority: 0,
        prefix_len: None,
        actions: vec![ActionDef::Output(1)],
    };
    let first = c.add_entry("typed", &entry(1)).unwrap();
    let ids = c
        .batch(&[
            Change::Add {
                table: "typed".into(),
                entry: entry(2),
            },
            Change::Add {
                table: "typed".into(),
                entry: entry(3),
            },
        ])
        .unwrap();
    assert_eq!(ids.len(), 2);
    let listed = c.table_entries("typed").unwrap();
    let mut ports: Vec<_> = listed.iter().map(|e| e.fields["l4_dst"].clone()).collect();
    ports.sort_by_key(|v| format!("{v:?}"));
    assert_eq!(ports, [V::Number(1), V::Number(2), V::Number(3)]);
    assert!(listed.iter().all(|e| e.actions == [ActionDef::Output(1)]));
    // A batch is all or nothing: the second change is refused, so the first is not made.
    let e = c
        .batch(&[
            Change::Add {
                table: "typed".into(),
                entry: entry(4),
            },
            Change::Add {
                table: "typed".into(),
                entry: entry(1),
            },
        ])
        .unwrap_err();
    let refused = e.downcast_ref::<api::Refused>().expect("a refusal");
    assert_eq!(refused.status, 409, "{refused}");
    assert_eq!(refused.kind, Some(ErrorKind::Conflict), "{refused}");
    assert_eq!(c.table_entries("typed").unwrap().len(), 3);
    // A bad value names its field; the client gives back the switch's own error.
    let mut bad = entry(5);
    bad.fields
        .insert("l4_dst".into(), V::Text("not a port".into()));
    let e = c.add_entry("typed", &bad).unwrap_err();
    let refused = e.downcast_ref::<api::Refused>().expect("a refusal");
    let error: ControlError = refused.control_error().expect("a kind of refusal");
    assert_eq!(error.kind, ErrorKind::Invalid, "{refused}");
    assert_eq!(error.field, "match.l4_dst", "{refused}");
    assert_eq!(
        error.to_string(),
        refused.message,
        "decoded, it displays as sent"
    );
    // Removed once; the second time it is not there, which is not an error.
    assert!(c.remove_entry("typed", first).unwrap());
    assert!(!c.remove_entry("typed", first).unwrap());
    // A table that is not there is an error, not an entry already gone.
    assert!(c.remove_entry("nope", 1).is_err());
    c.remove_table("typed").unwrap();
    assert!(!c.tables().unwrap().iter().any(|t| t.name == "typed"));
}

/// The typed client on the interface table, the counters and the registers: an interface set,
/// named by an entry, its use counted, refused removal while named; a counter fed and read;
/// a user register and a port's figure read.
#[test]
fn the_typed_client_speaks_the_interface_table_counters_and_registers() {
    use switch::control::{ActionDef, EntryDef, ErrorKind, InterfaceDef, InterfaceView, Value};
    let mut rig = rig(None);
    let c = rig.client.clone();
    let def = InterfaceDef {
        eth_dst: "02:00:00:00:07:07".into(),
        eth_src: "02:00:00:00:00:fe".into(),
        port: 1,
    };
    let view = |used_by| InterfaceView {
        id: 4,
        eth_dst: def.eth_dst.clone(),
        eth_src: def.eth_src.clone(),
        port: 1,
        used_by,
    };
    assert_eq!(c.set_interface(4, &def).unwrap(), view(0));
    let entry = EntryDef {
        fields: [("ip_dst".to_string(), Value::Text("10.7.0.1".into()))].into(),
        priority: 0,
        prefix_len: None,
        actions: vec![ActionDef::Count("typed".into()), ActionDef::Interface(4)],
    };
    let id = c.add_entry(switch::control::ACL, &entry).unwrap();
    assert_eq!(c.interfaces().unwrap(), [view(1)]);
    let f = frame(Ipv4Addr::new(10, 7, 0, 1));
    let out = received(&mut rig, 1, &f).expect("sent through interface 4");
    assert_eq!(&out[0..12], &[2, 0, 0, 0, 7, 7, 2, 0, 0, 0, 0, 0xfe]);
    let counters = c.counters().unwrap();
    assert_eq!(counters.len(), 1, "{counters:?}");
    assert_eq!(
        (
            counters[0].name.as_str(),
            counters[0].packets,
            counters[0].bytes
        ),
        ("typed", 1, f.len() as u64)
    );
    // Neither goes while the entry names it: the switch's own refusal, decoded.
    let kind = |e: anyhow::Error| e.downcast_ref::<api::Refused>().and_then(|r| r.kind);
    assert_eq!(
        kind(c.remove_interface(4).unwrap_err()),
        Some(ErrorKind::Conflict)
    );
    assert_eq!(
        kind(c.remove_counter("typed").unwrap_err()),
        Some(ErrorKind::Conflict)
    );
    // A port's figure and a user register.
    let rx = c.register("port0.rx_packets").unwrap();
    assert!(rx.value >= 1 && !rx.writable, "{rx:?}");
    let user = c.register("user5").unwrap();
    assert_eq!((user.value, user.writable), (0, true));
    assert_eq!(
        kind(c.register("user64").unwrap_err()),
        Some(ErrorKind::NotFound)
    );
    // Once the entry is gone, both go; a second time, neither is there.
    assert!(c.remove_entry(switch::control::ACL, id).unwrap());
    c.remove_interface(4).unwrap();
    c.remove_counter("typed").unwrap();
    assert!(c.interfaces().unwrap().is_empty());
    assert!(c.counters().unwrap().is_empty());
    assert_eq!(
        kind(c.remove_interface(4).unwrap_err()),
        Some(ErrorKind::NotFound)
    );
    assert_eq!(
        kind(c.remove_counter("typed").unwrap_err()),
        Some(ErrorKind::NotFound)
    );
}

/// The typed client on the CPU path and the ports: a frame sent out of a port, frames sent to
/// the CPU taken and watched as they come, a port's egress rate set and its counters listed.
#[test]
fn the_typed_client_sends_and_takes_the_cpus_frames_and_reads_the_ports() {
    use switch::control::{ActionDef, CpuFrame, EntryDef, Value};
    let mut rig = rig(None);
    let c = rig.client.clone();
    let f = frame(Ipv4Addr::new(10, 9, 9, 9));
    c.send_frame(2, &f).unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    // The switch's own ARP requests may go out too.
    'sent: loop {
        let mut got = Batch::new(8);
        let n = rig.hosts[2].recv(&mut got).unwrap();
        for j in 0..n {
            if got.frame(j) == &f[..] {
                break 'sent;
            }
        }
        assert!(Instant::now() < deadline, "the frame never left port 2");
        std::thread::sleep(Duration::from_millis(5));
    }

    let to_cpu = EntryDef {
        fields: [("l4_dst".to_string(), Value::Number(7))].into(),
        priority: 0,
        prefix_len: None,
        actions: vec![ActionDef::ToCpu],
    };
    c.add_entry(switch::control::ACL, &to_cpu).unwrap();
    assert!(c.take_packets(10, 0).unwrap().is_empty(), "none queued yet");
    rig.hosts[0].send(&[&f[..]]).unwrap();
    let taken = c.take_packets(10, 2000).unwrap();
    let from = |in_port| CpuFrame {
        in_port,
        reason: "to_cpu".into(),
        frame: switch::control::hex(&f),
    };
    assert_eq!(taken, [from(0)]);

    // Watched as they come, until the watcher has what it wants.
    let watcher = std::thread::spawn(move || {
        let mut got = Vec::new();
        c.watch_packets(Duration::from_secs(5), |frame| {
            got.push(frame);
            got.len() < 2
        })
        .map(|()| got)
    });
    for port in [1usize, 0] {
        std::thread::sleep(Duration::from_millis(50));
        rig.hosts[port].send(&[&f[..]]).unwrap();
    }
    assert_eq!(watcher.join().unwrap().unwrap(), [from(1), from(0)]);

    // A port's egress queue: the depth asked for, or the switch's default.
    let c = &rig.client;
    assert_eq!(c.set_egress(1, 1_000_000, Some(4000)).unwrap(), 4000);
    let ports = c.ports().unwrap();
    assert_eq!(ports.len(), PORTS);
    assert_eq!(ports[1].port, 1);
    assert_eq!(ports[1].name.as_deref(), Some("mem1"));
    assert_eq!(
        (ports[1].egress_rate_bps, ports[1].egress_depth_bytes),
        (Some(1_000_000), Some(4000))
    );
    assert_eq!(ports[2].egress_rate_bps, Some(0));
    assert!(ports[0].rx_packets >= 2, "{:?}", ports[0]);
    assert_eq!(c.set_egress(1, 0, None).unwrap(), dataplane::DEFAULT_DEPTH);
    let e = c.set_egress(1, 10, None).unwrap_err();
    let refused = e.downcast_ref::<api::Refused>().expect("a refusal");
    assert_eq!(refused.field.as_deref(), Some("rate_bps"), "{refused}");
}

/// A client given a limit gives up on a reply that takes longer, typed calls included; one
/// without waits as long as the switch does.
#[test]
fn a_client_with_a_limit_gives_up_on_a_slow_reply() {
    let rig = rig(None);
    let hasty = rig.client.clone().with_limit(Duration::from_millis(200));
    let started = Instant::now();
    let e = hasty.take_packets(1, 3000).unwrap_err();
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(1500),
        "gave up after {took:?}: {e:#}"
    );
    assert!(e.downcast_ref::<api::Refused>().is_none(), "{e:#}");
    let started = Instant::now();
    assert!(rig.client.take_packets(1, 500).unwrap().is_empty());
    assert!(started.elapsed() >= Duration::from_millis(450));
    assert!(
        hasty.tables().is_ok(),
        "a quick reply comes within the limit"
    );
}

#[test]
fn a_dscp_is_written_with_its_checksum_and_one_out_of_range_is_refused() {
    let mut rig = rig(None);
    let c = rig.client.clone();
    let e = refused(
        &rig,
        "POST",
        "/api/v1/tables/acl/entries",
        Some(
            json!({"match": {"ip_dst": "10.7.0.1"}, "actions": [{"set_dscp": 64}, {"output": 1}]}),
        ),
    );
    assert!(
        e.contains("400") && e.contains("actions[0]") && e.contains("0 to 63"),
        "{e}"
    );
    c.call(
        "POST",
        "/api/v1/tables/acl/entries",
        Some(
            &json!({"match": {"ip_dst": "10.7.0.1"}, "actions": [{"set_dscp": 46}, {"output": 1}]}),
        ),
    )
    .unwrap();
    let listed = c.call("GET", "/api/v1/tables/acl/entries", None).unwrap();
    assert_eq!(listed["entries"][0]["actions"][0], json!({"set_dscp": 46}));
    let out = received(&mut rig, 1, &frame(Ipv4Addr::new(10, 7, 0, 1))).expect("on port 1");
    assert_eq!(out[15] >> 2, 46);
    let header = wire::ipv4::Packet::new_checked(&out[14..]).expect("an IPv4 header");
    assert!(header.verify_checksum(), "the header checksum holds");
}

/// Interface-table entry 6: a cache node behind port 2.
fn cache_node_interface(c: &Client) {
    c.call(
        "PUT",
        "/api/v1/interfaces/6",
        Some(&json!({"eth_dst": "02:00:00:00:09:09", "eth_src": "02:00:00:00:00:64", "port": 2})),
    )
    .unwrap();
}

#[test]
fn a_cache_nodes_rules_steer_reads_of_its_keys_through_the_api() {
    let rig = rig(None);
    let c = rig.client.clone();
    cache_node_interface(&c);
    let steer = node::steer::SteerArgs {
        switch_api: Some(c.api),
        switch_token_file: None,
        switch_api_ca: None,
        steer_interface: Some(6),
        vip: Some(Ipv4Addr::new(10, 0, 0, 100)),
    };
    let mut sink = node::steer::rule_sink(&steer, "10.0.1.9:11211".parse().unwrap(), "md5")
        .unwrap()
        .expect("a sink when a switch is named");
    // The cache node's replies leave with the VIP as source.
    let acl = c.call("GET", "/api/v1/tables/acl/entries", None).unwrap();
    assert_eq!(acl["entries"][0]["match"]["ip_src"], "10.0.1.9", "{acl}");
    assert_eq!(
        acl["entries"][0]["actions"][0]["set_ipv4_src"],
        "10.0.0.100"
    );
    let key = |k: &str| -> Box<[u8]> { k.as_bytes().into() };
    sink(vec![Change::Add(key("a")), Change::Add(key("b"))]).unwrap();
    let entries = |c: &Client| {
        c.call("GET", "/api/v1/tables/kv_steer/entries", None)
            .unwrap()
    };
    let listed = entries(&c);
    let hashes: Vec<u64> = listed["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["match"]["key_hash"].as_u64().unwrap())
        .collect();
    let want: Vec<u64> = ["a", "b"]
        .iter()
        .map(|k| u64::from(HashFn::Md5.hash(k.as_bytes())))
        .collect();
    assert_eq!(hashes, want, "{listed}");
    assert_eq!(listed["entries"][0]["actions"][1]["interface"], 6);
    sink(vec![Change::Remove(key("a"))]).unwrap();
    assert_eq!(entries(&c)["entries"].as_array().unwrap().len(), 1);
    // A key added and removed in one batch leaves nothing.
    sink(vec![Change::Add(key("c")), Change::Remove(key("c"))]).unwrap();
    assert_eq!(entries(&c)["entries"].as_array().unwrap().len(), 1);
    // An entry the switch removed (its check found the node silent) is installed again at
    // the next check, and a removal of it then takes the new one.
    let id = entries(&c)["entries"][0]["id"].as_u64().unwrap();
    c.call(
        "DELETE",
        &format!("/api/v1/tables/kv_steer/entries/{id}"),
        None,
    )
    .unwrap();
    sink(Vec::new()).unwrap();
    let listed = entries(&c);
    assert_eq!(
        listed["entries"][0]["match"]["key_hash"].as_u64(),
        Some(want[1]),
        "{listed}"
    );
    sink(vec![Change::Remove(key("b"))]).unwrap();
    assert_eq!(entries(&c)["entries"].as_array().unwrap().len(), 0);
    sink(vec![Change::Add(key("a"))]).unwrap();
    // Started again: its reply entry is kept, not added twice, and its old steering entries
    // (to a node that holds nothing now) are gone.
    drop(sink);
    let again = node::steer::rule_sink(&steer, "10.0.1.9:11211".parse().unwrap(), "md5").unwrap();
    assert!(again.is_some());
    let acl = c.call("GET", "/api/v1/tables/acl/entries", None).unwrap();
    assert_eq!(acl["entries"].as_array().unwrap().len(), 1, "{acl}");
    assert_eq!(entries(&c)["entries"].as_array().unwrap().len(), 0);
    // Without a switch, no sink; with one but no interface, a clear refusal.
    let none = node::steer::SteerArgs {
        switch_api: None,
        ..steer.clone()
    };
    assert!(
        node::steer::rule_sink(&none, "10.0.1.9:11211".parse().unwrap(), "md5")
            .unwrap()
            .is_none()
    );
    let lost = node::steer::SteerArgs {
        steer_interface: None,
        ..steer
    };
    let e = node::steer::rule_sink(&lost, "10.0.1.9:11211".parse().unwrap(), "md5")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("--steer-interface"), "{e}");
}

/// The controller watches the SwitchKV cache nodes its switches steer reads to: a node that
/// does not answer loses its steering entries on the switch, one that answers keeps them, and
/// the controller's status and metrics say so.
#[test]
fn the_controller_removes_the_steering_entries_of_a_cache_node_that_does_not_answer() {
    let rig = rig(None);
    let c = rig.client.clone();
    cache_node_interface(&c);
    // A live cache node on 127.0.0.1; nothing answers on 127.0.0.2 at its port.
    let live = node::Node::start(&node::NodeArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        no_udp: true,
        ..Default::default()
    })
    .unwrap();
    let port = live.tcp_addr().unwrap().port();
    let steer = |hash: u32, to: &str| {
        let entry = json!({
            "match": {"one_read": 1, "key_hash": hash},
            "actions": [{"set_ipv4_dst": to}, {"interface": 6}],
        });
        c.call("POST", "/api/v1/tables/kv_steer/entries", Some(&entry))
            .unwrap();
    };
    steer(1, "127.0.0.1");
    steer(2, "127.0.0.1");
    steer(3, "127.0.0.2");
    let leading_to = |ip: &str| -> usize {
        let listed = c
            .call("GET", "/api/v1/tables/kv_steer/entries", None)
            .unwrap();
        listed["entries"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["actions"][0]["set_ipv4_dst"] == ip)
            .count()
    };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let ctl_api = listener.local_addr().unwrap();
    let text = format!(
        "[controller]\napi = \"{ctl_api}\"\nprobe_interval_ms = 50\nprobe_timeout_ms = 200\n\
         down_after = 3\ncache_node_port = {port}\n\
         [[switches]]\nname = \"sw\"\napi = \"{}\"\n\
         [pool]\ndistribution = \"ketama\"\nhash = \"md5\"\n\
         [[pool.servers]]\naddr = \"127.0.0.1:{port}\"\nname = \"s1\"\n",
        c.api
    );
    let file = config::controller::parse(&text, std::path::Path::new("controller.toml")).unwrap();
    let running = controller::start(file, listener, None, None, None).unwrap();
    let ctl = Client::new(ctl_api, None);
    let within = |what: &str, done: &dyn Fn() -> bool| {
        let started = Instant::now();
        while !done() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{what}: {}",
                ctl.call("GET", "/api/v1/status", None).unwrap()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    within("the dead node's entry removed", &|| {
        leading_to("127.0.0.2") == 0
    });
    // Several rounds later the live node's entries are all there.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(leading_to("127.0.0.1"), 2);
    let status = ctl.call("GET", "/api/v1/status", None).unwrap();
    let node_of = |ip: &str| {
        status["cache_nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["addr"] == ip)
            .cloned()
            .unwrap_or_else(|| panic!("no {ip} in {status}"))
    };
    assert_eq!(node_of("127.0.0.2")["up"], false);
    assert_eq!(node_of("127.0.0.2")["removed_entries"], 1);
    assert_eq!(node_of("127.0.0.1")["up"], true);
    assert_eq!(node_of("127.0.0.1")["entries"], 2);
    let (_, metrics) = testbed::http_get(ctl_api, "/metrics").unwrap();
    assert!(
        metrics.contains("kvswitch_controller_steer_removed_total{cache_node=\"127.0.0.2\"} 1"),
        "{metrics}"
    );
    // The live node stops: its entries go too.
    drop(live);
    within("the stopped node's entries removed", &|| {
        leading_to("127.0.0.1") == 0
    });
    drop(running);
}

#[test]
fn a_cache_node_on_no_one_address_is_refused_its_steering() {
    let rig = rig(None);
    let steer = node::steer::SteerArgs {
        switch_api: Some(rig.client.api),
        switch_token_file: None,
        switch_api_ca: None,
        steer_interface: Some(6),
        vip: Some(Ipv4Addr::new(10, 0, 0, 100)),
    };
    let e = node::steer::rule_sink(&steer, "0.0.0.0:11211".parse().unwrap(), "md5")
        .err()
        .expect("refused");
    assert!(e.to_string().contains("--listen"), "{e}");
    // Nothing was installed for it.
    let acl = rig
        .client
        .call("GET", "/api/v1/tables/acl/entries", None)
        .unwrap();
    assert_eq!(acl["entries"].as_array().map(Vec::len), Some(0), "{acl}");
}

/// The first frame to UDP port `dst_port` that `host` receives within `within`.
fn udp_to(rig: &mut Rig, host: usize, dst_port: u16, within: Duration) -> Option<Vec<u8>> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let mut got = Batch::new(8);
        let n = rig.hosts[host].recv(&mut got).unwrap();
        for j in 0..n {
            let f = got.frame(j);
            if f.len() >= 42
                && f[12..14] == [8, 0]
                && f[23] == 17
                && f[36..38] == dst_port.to_be_bytes()
            {
                return Some(f.to_vec());
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

#[test]
fn the_request_id_cache_answers_hits_itself_and_leaves_the_tables_as_it_found_them() {
    const PORT: u16 = 9100;
    let mut rig = rig(None);
    let tables_before = rig.client.call("GET", "/api/v1/tables", None).unwrap();
    let client_mac = Mac([2, 0, 0, 0, 0, 1]);
    let server_mac = Mac([2, 0, 0, 0, 1, 1]);
    let (client_ip, server_ip) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 1, 1));
    let to_server = UdpEnds {
        src_mac: client_mac,
        dst_mac: server_mac,
        src_ip: client_ip,
        dst_ip: server_ip,
        src_port: 40000,
        dst_port: PORT,
    };
    let to_client = UdpEnds {
        src_mac: server_mac,
        dst_mac: client_mac,
        src_ip: server_ip,
        dst_ip: client_ip,
        src_port: PORT,
        dst_port: 40000,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let agent = {
        let (client, stop) = (rig.client.clone(), stop.clone());
        std::thread::spawn(move || {
            let servers = [Ipv4Addr::new(10, 0, 1, 1)];
            // The rig has no CPU channel: the agent's frames go through HTTP.
            let spec = nf::ReqcacheSpec {
                port: PORT,
                servers: &servers,
                capacity: 16,
                priority: 100,
                report: None,
                cpu: nf::cpu::CpuMode::Http,
            };
            nf::run_reqcache(&client, &spec, &|| stop.load(Ordering::Relaxed))
        })
    };
    let acl_len = |rig: &Rig| {
        rig.client
            .call("GET", "/api/v1/tables/acl/entries", None)
            .unwrap()["entries"]
            .as_array()
            .map_or(0, Vec::len)
    };
    let wait_for = |rig: &Rig, n: usize| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while acl_len(rig) != n {
            assert!(Instant::now() < deadline, "acl never held {n} entries");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_for(&rig, 1);

    // A "reply" from a host that is not the server is not kept (nor answered for).
    let forged = udp_frame(
        &UdpEnds {
            src_mac: Mac([2, 0, 0, 0, 0, 7]),
            src_ip: Ipv4Addr::new(10, 0, 0, 7),
            ..to_client
        },
        &[b"object-1", b" forged"],
    );
    rig.hosts[2].send(&[&forged[..]]).unwrap();
    // The switch forwards it like any frame; the agent never sees it.
    assert_eq!(
        udp_to(&mut rig, 0, 40000, Duration::from_secs(5)),
        Some(forged)
    );

    // A miss: the request reaches the server, whose reply goes to the client and is kept.
    let request = udp_frame(&to_server, &[b"object-1"]);
    let reply = udp_frame(&to_client, &[b"object-1", b" the content of object 1"]);
    rig.hosts[0].send(&[&request[..]]).unwrap();
    let at_server = udp_to(&mut rig, 1, PORT, Duration::from_secs(5)).expect("a miss goes on");
    assert_eq!(at_server, request);
    rig.hosts[1].send(&[&reply[..]]).unwrap();
    assert_eq!(
        udp_to(&mut rig, 0, 40000, Duration::from_secs(5)),
        Some(reply.clone())
    );
    wait_for(&rig, 2);

    // Hits: answered from the CPU path byte for byte, and the server sees none of them.
    for _ in 0..3 {
        rig.hosts[0].send(&[&request[..]]).unwrap();
        let answer = udp_to(&mut rig, 0, 40000, Duration::from_secs(5)).expect("a hit");
        assert_eq!(answer, reply);
    }
    assert_eq!(udp_to(&mut rig, 1, PORT, Duration::from_millis(300)), None);
    // Another id is a miss.
    let other = udp_frame(&to_server, &[b"object-2"]);
    rig.hosts[0].send(&[&other[..]]).unwrap();
    assert_eq!(
        udp_to(&mut rig, 1, PORT, Duration::from_secs(5)),
        Some(other)
    );

    stop.store(true, Ordering::Relaxed);
    let stats = agent.join().unwrap().unwrap();
    assert_eq!((stats.kept, stats.hits), (1, 3), "{stats:?}");
    assert_eq!(acl_len(&rig), 0, "the agent removes its entries");
    let tables_after = rig.client.call("GET", "/api/v1/tables", None).unwrap();
    let shape = |t: &Value| -> Vec<(Value, Value)> {
        t["tables"]
            .as_array()
            .unwrap()
            .iter()
            // `l2` learned the two hosts' MACs meanwhile, as it would without the agent.
            .filter(|t| t["name"] != "l2")
            .map(|t| (t["name"].clone(), t["entries"].clone()))
            .collect()
    };
    assert_eq!(shape(&tables_after), shape(&tables_before));
}

/// Sends `request` to the API byte for byte; the reply's status (0 for none) and body, read
/// until the API closes the connection or for 5 s.
fn raw(rig: &Rig, request: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(rig.client.api).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.write_all(request);
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    split_reply(&reply)
}

fn split_reply(reply: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(reply);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, body.to_string())
}

/// `method path` with `headers` (each `Name: value`) and `body`, as a browser or curl would
/// send it: the status and the body (JSON when it is).
fn request(rig: &Rig, method: &str, path: &str, headers: &[&str], body: &str) -> (u16, Value) {
    let mut text = format!(
        "{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for h in headers {
        text.push_str(h);
        text.push_str("\r\n");
    }
    text.push_str("\r\n");
    text.push_str(body);
    let (status, body) = raw(rig, text.as_bytes());
    (
        status,
        serde_json::from_str(&body).unwrap_or(Value::String(body)),
    )
}

/// The `acl` table's entries.
fn acl(rig: &Rig) -> Value {
    rig.client
        .call("GET", "/api/v1/tables/acl/entries", None)
        .unwrap()["entries"]
        .clone()
}

/// The pool's servers.
fn pool_servers(rig: &Rig) -> Value {
    rig.client.call("GET", "/api/v1/pool", None).unwrap()["pools"][0]["servers"].clone()
}

/// `kvswitch_api_refused_total{reason="why"}` of the API's metrics.
fn refused_for(rig: &Rig, why: &str) -> u64 {
    let text = rig.client.call("GET", "/metrics", None).unwrap();
    let series = format!("kvswitch_api_refused_total{{reason=\"{why}\"}} ");
    text.as_str()
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(&series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in the metrics:\n{text}"))
}

const AN_ENTRY: &str = r#"{"match": {"l4_dst": 4242}, "actions": ["flood"]}"#;
const A_SERVER: &str = r#"{"addr": "10.0.1.9:11211"}"#;

#[test]
fn a_cross_origin_text_plain_post_is_refused_and_changes_nothing() {
    let rig = rig(None);
    let host = format!("Host: {}", rig.client.api);
    let (acl_before, pool_before) = (acl(&rig), pool_servers(&rig));
    // What a page of another origin sends with fetch(url, {method: "POST", mode: "no-cors",
    // headers: {"Content-Type": "text/plain"}, body}): no preflight, so it reaches the API.
    let (status, body) = request(
        &rig,
        "POST",
        "/api/v1/tables/acl/entries",
        &[
            &host,
            "Origin: http://evil.example:8000",
            "Sec-Fetch-Site: cross-site",
            "Content-Type: text/plain;charset=UTF-8",
        ],
        AN_ENTRY,
    );
    assert_eq!(status, 403, "{body}");
    assert!(body["error"].as_str().unwrap().contains("origin"), "{body}");
    // Without an Origin (curl, a form, a browser that leaves it out), the type alone refuses
    // it, as it refuses none at all and a POST without a body.
    for kind in [
        "Content-Type: text/plain",
        "Content-Type: application/x-www-form-urlencoded",
        "Content-Type: multipart/form-data; boundary=x",
        "X-No-Type: 1",
    ] {
        for (path, body) in [
            ("/api/v1/tables/acl/entries", AN_ENTRY),
            ("/api/v1/pool/servers", A_SERVER),
            ("/api/v1/reload", ""),
        ] {
            let (status, reply) = request(&rig, "POST", path, &[&host, kind], body);
            assert_eq!(status, 415, "{kind} {path}: {reply}");
            assert!(
                reply["error"]
                    .as_str()
                    .unwrap()
                    .contains("application/json"),
                "{reply}"
            );
        }
    }
    assert_eq!(acl(&rig), acl_before);
    assert_eq!(pool_servers(&rig), pool_before);
    assert_eq!(refused_for(&rig, "origin"), 1);
    assert_eq!(refused_for(&rig, "content_type"), 12);
}

#[test]
fn a_json_change_from_a_foreign_origin_is_refused() {
    let rig = rig(None);
    let api = rig.client.api;
    let host = format!("Host: {api}");
    let before = acl(&rig);
    let foreign = [
        "Origin: http://evil.example".to_string(),
        "Origin: null".to_string(),
        // The API's address, another port: another origin.
        format!("Origin: http://127.0.0.1:{}", api.port() + 1),
        "Sec-Fetch-Site: cross-site".to_string(),
        "Sec-Fetch-Site: same-site".to_string(),
    ];
    for from in &foreign {
        let (status, body) = request(
            &rig,
            "POST",
            "/api/v1/tables/acl/entries",
            &[&host, from, "Content-Type: application/json"],
            AN_ENTRY,
        );
        assert_eq!(status, 403, "{from}: {body}");
        // Taking the CPU's frames takes them from every other reader: refused as well.
        let (status, body) = request(&rig, "GET", "/api/v1/packets", &[&host, from], "");
        assert_eq!(status, 403, "{from}: {body}");
    }
    // Reads are not changes: a link from another site still shows the status.
    let (status, _) = request(
        &rig,
        "GET",
        "/api/v1/status",
        &[&host, "Sec-Fetch-Site: cross-site"],
        "",
    );
    assert_eq!(status, 200);
    assert_eq!(acl(&rig), before);
    assert_eq!(refused_for(&rig, "origin"), 2 * foreign.len() as u64);
}

#[test]
fn a_request_by_a_rebound_name_is_refused() {
    let rig = rig(None);
    let port = rig.client.api.port();
    let before = acl(&rig);
    // A page of evil.example whose name now points at 127.0.0.1 is, to the browser, of the
    // API's origin: its Origin and Host agree, and name the attacker.
    for name in [
        format!("evil.example:{port}"),
        "evil.example".to_string(),
        format!("127.0.0.1:{}", port + 1),
        format!("localhost.evil.example:{port}"),
    ] {
        let (status, body) = request(
            &rig,
            "POST",
            "/api/v1/tables/acl/entries",
            &[
                &format!("Host: {name}"),
                &format!("Origin: http://{name}"),
                "Content-Type: application/json",
            ],
            AN_ENTRY,
        );
        assert_eq!(status, 403, "{name}: {body}");
        assert!(body["error"].as_str().unwrap().contains("Host"), "{body}");
        let (status, body) = request(
            &rig,
            "GET",
            "/api/v1/status",
            &[&format!("Host: {name}")],
            "",
        );
        assert_eq!(status, 403, "{name}: {body}");
    }
    // No Host at all (HTTP/1.0 allows it): refused too.
    let (status, _) = raw(&rig, b"GET /api/v1/status HTTP/1.0\r\n\r\n");
    assert_eq!(status, 403);
    assert_eq!(acl(&rig), before);
    assert_eq!(refused_for(&rig, "host"), 9);
}

#[test]
fn same_origin_and_programs_json_changes_are_taken() {
    let rig = rig(None);
    let api = rig.client.api;
    let port = api.port();
    // As a page the API serves sends it.
    let (status, body) = request(
        &rig,
        "POST",
        "/api/v1/tables/acl/entries",
        &[
            &format!("Host: {api}"),
            &format!("Origin: http://{api}"),
            "Sec-Fetch-Site: same-origin",
            "Content-Type: application/json",
        ],
        AN_ENTRY,
    );
    assert_eq!(status, 201, "{body}");
    let id = body["id"].as_u64().unwrap();
    // As curl sends it, by localhost, with a charset.
    let (status, body) = request(
        &rig,
        "POST",
        "/api/v1/tables/acl/entries",
        &[
            &format!("Host: localhost:{port}"),
            "Content-Type: application/json; charset=utf-8",
        ],
        r#"{"match": {"l4_dst": 4243}, "actions": ["flood"]}"#,
    );
    assert_eq!(status, 201, "{body}");
    // A DELETE without a body needs no type.
    let (status, body) = request(
        &rig,
        "DELETE",
        &format!("/api/v1/tables/acl/entries/{id}"),
        &[&format!("Host: {api}")],
        "",
    );
    assert_eq!(status, 204, "{body}");
    assert_eq!(acl(&rig).as_array().unwrap().len(), 1);
    // kvswitch ctl's client, as ever (the rig has no file to reload).
    let e = refused(&rig, "POST", "/api/v1/reload", None);
    assert!(e.contains("404"), "{e}");
    for why in ["host", "origin", "content_type"] {
        assert_eq!(refused_for(&rig, why), 0, "{why}");
    }

    // A name the operator lists is the API's too, with its port or none.
    let named = rig_with(
        None,
        ApiServing {
            hosts: vec!["switch1.example".into()],
            ..ApiServing::default()
        },
    );
    let port = named.client.api.port();
    for (l4_dst, host) in [format!("switch1.example:{port}"), "switch1.example".into()]
        .iter()
        .enumerate()
    {
        let (status, body) = request(
            &named,
            "POST",
            "/api/v1/tables/acl/entries",
            &[
                &format!("Host: {host}"),
                &format!("Origin: http://{host}"),
                "Content-Type: application/json",
            ],
            &json!({"match": {"l4_dst": l4_dst}, "actions": ["flood"]}).to_string(),
        );
        assert_eq!(status, 201, "{host}: {body}");
    }
}

/// Whether the API has closed `conn` (read to its end, or reset); what it sent is read.
fn closed(conn: &TcpStream) -> bool {
    conn.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match (&*conn).read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

#[test]
fn slow_clients_cannot_hold_the_api_and_forwarding_goes_on() {
    let cap = 8;
    let timeout = Duration::from_millis(1500);
    let mut rig = rig_with(
        None,
        ApiServing {
            max_connections: cap,
            header_timeout: timeout,
            ..ApiServing::default()
        },
    );
    let host = rig.client.api;
    let started = Instant::now();
    // Slowloris: a request's line and part of its headers, and never the rest.
    let slow: Vec<TcpStream> = (0..3 * cap)
        .map(|_| {
            let mut conn = TcpStream::connect(host).unwrap();
            let _ = conn.write_all(
                format!("GET /api/v1/status HTTP/1.1\r\nHost: {host}\r\nX-Slow: ").as_bytes(),
            );
            conn
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let held = slow.iter().filter(|c| !closed(c)).count();
    assert_eq!(held, cap, "connections past the cap are closed at once");
    // Forwarding never waits on the API.
    assert_eq!(
        outputs(&mut rig, &frame(Ipv4Addr::new(10, 8, 0, 1))),
        [1, 2]
    );

    // A new client is answered once the slow ones' headers are late: within the timeout.
    let bound = timeout + Duration::from_secs(2);
    loop {
        match rig
            .client
            .call_within("GET", "/api/v1/status", None, Duration::from_secs(1))
        {
            Ok(_) => break,
            Err(e) => {
                assert!(
                    started.elapsed() < bound,
                    "no answer within {bound:?} of the slow clients: {e:#}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    // Each slow connection's timer is its own: the first to fire frees the slot the new
    // client took, and the others follow within the bound.
    while !slow.iter().all(closed) {
        assert!(
            started.elapsed() < bound,
            "the slow connections are closed after the header timeout"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(started.elapsed() >= timeout - Duration::from_millis(100));
    assert!(refused_for(&rig, "connections") >= 2 * cap as u64);
    assert_eq!(refused_for(&rig, "header_timeout"), cap as u64);

    // An idle keep-alive connection is closed after as long.
    let mut idle = TcpStream::connect(host).unwrap();
    idle.write_all(format!("GET /api/v1/status HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let mut first = [0u8; 12];
    idle.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    std::thread::sleep(timeout + Duration::from_millis(500));
    assert!(
        closed(&idle),
        "an idle connection is closed after the timeout"
    );
}

#[test]
fn bodies_are_bounded_while_they_are_read() {
    let rig = rig(None);
    let api = rig.client.api;
    let head = |len: usize| {
        format!(
            "POST /api/v1/tables/acl/entries HTTP/1.1\r\nHost: {api}\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
        )
    };
    // Declared past the limit: refused at once, before a byte of it is sent.
    let started = Instant::now();
    let (status, body) = raw(&rig, head(60 << 20).as_bytes());
    assert_eq!(status, 413, "{body}");
    assert!(started.elapsed() < Duration::from_secs(2));

    // Two bodies of the largest size, held unfinished, take the budget: a third body is
    // refused at once rather than held.
    let held: Vec<TcpStream> = (0..BODY_BUDGET / MAX_BODY)
        .map(|_| {
            let mut conn = TcpStream::connect(api).unwrap();
            conn.write_all(head(MAX_BODY).as_bytes()).unwrap();
            conn.write_all(&vec![b' '; MAX_BODY - 1]).unwrap();
            conn
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let (status, body) = request(
        &rig,
        "POST",
        "/api/v1/tables/acl/entries",
        &[&format!("Host: {api}"), "Content-Type: application/json"],
        AN_ENTRY,
    );
    assert_eq!(status, 503, "{body}");
    assert_eq!(refused_for(&rig, "body_budget"), 1);
    // Once they go, their budget is free again.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let (status, body) = request(
            &rig,
            "POST",
            "/api/v1/tables/acl/entries",
            &[&format!("Host: {api}"), "Content-Type: application/json"],
            AN_ENTRY,
        );
        if status == 201 {
            break;
        }
        assert!(Instant::now() < deadline, "{status}: {body}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(refused_for(&rig, "body_too_large"), 1);

    // A batch past its most changes is refused at the first change too many.
    let one = json!({"op": "delete", "table": "acl", "id": 0});
    let changes = vec![one; switch::control::MAX_BATCH + 1];
    let e = refused(
        &rig,
        "POST",
        "/api/v1/batch",
        Some(json!({ "changes": changes })),
    );
    assert!(e.contains("400") && e.contains("more than 10000"), "{e}");
}

/// The page a server of another origin shows: it sends the API, with `fetch` in `no-cors`
/// mode, what a browser sends without a preflight, then says so in the page.
fn hostile_page(api: std::net::SocketAddr) -> String {
    format!(
        r#"<!doctype html><html><body><p id="out">waiting</p><script>
const api = "http://{api}";
const post = (path, body) => fetch(api + path, {{
  method: "POST", mode: "no-cors", headers: {{ "Content-Type": "text/plain" }}, body }});
Promise.allSettled([
  post("/api/v1/tables/acl/entries", '{AN_ENTRY}'),
  post("/api/v1/pool/servers", '{A_SERVER}'),
  fetch(api + "/api/v1/reload", {{ method: "POST", mode: "no-cors" }}),
]).then(r => {{ document.getElementById("out").textContent = "sent " + r.map(x => x.status).join(","); }});
</script></body></html>"#
    )
}

#[test]
fn a_page_of_another_origin_cannot_change_the_switch_in_chromium() {
    let Ok(chromium) = testbed::local::require("chromium") else {
        eprintln!("skipped: chromium is not installed (scripts/setup.sh installs it)");
        return;
    };
    let rig = rig(None);
    let (acl_before, pool_before) = (acl(&rig), pool_servers(&rig));
    // The other origin: a server of its own on another port, serving the page to any request.
    let site = TcpListener::bind("127.0.0.1:0").unwrap();
    let page = hostile_page(rig.client.api);
    let url = format!("http://{}/", site.local_addr().unwrap());
    site.set_nonblocking(true).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let serving = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok((mut conn, _)) = site.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                let _ = conn.set_nonblocking(false);
                let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                let mut head = [0u8; 4096];
                let _ = conn.read(&mut head);
                let _ = conn.write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\n\
                         Connection: close\r\n\r\n{page}",
                        page.len()
                    )
                    .as_bytes(),
                );
            }
        })
    };
    let dir = testbed::local::TempDir::new("kvswitch-api-chromium").unwrap();
    let log = dir.path().join("chromium.log");
    let mut browser = testbed::local::Proc::spawn_logged(
        "chromium",
        std::process::Command::new(chromium)
            .args(["--headless", "--no-sandbox", "--disable-gpu"])
            .arg(format!(
                "--user-data-dir={}",
                dir.path().join("profile").display()
            ))
            .arg("--virtual-time-budget=3000")
            .arg("--dump-dom")
            .arg(&url),
        &log,
    )
    .unwrap();
    let exited = browser.wait_exit(Duration::from_secs(60));
    drop(browser);
    stop.store(true, Ordering::Relaxed);
    serving.join().unwrap();
    exited.expect("chromium renders the page within a minute");
    let dom = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        dom.contains("sent fulfilled"),
        "the page sent nothing:\n{dom}"
    );
    assert_eq!(acl(&rig), acl_before, "the page changed the acl");
    assert_eq!(pool_servers(&rig), pool_before, "the page changed the pool");
    assert_eq!(refused_for(&rig, "origin"), 3, "{dom}");
}
