//! TCP to the VIP over a faulty link made by the switch's own `impair` action (this kernel has
//! no netem): segments both ways between the clients and the switch's splice (and the proxy,
//! for what it answers) are dropped, duplicated, reordered and delayed, seeded. Clients over TCP
//! and UDP run a history-checked load with the cache on meanwhile: every reply is one
//! memcached would give, no read is stale, and the load goes on.
//!
//! An operator's entry turns the XDP fast path off, so the same is done to the path the XDP
//! program carries (spliced replies and `get`s sent on without the user-space switch) with
//! loss made at the hosts' own interfaces (`xdp::Impair`).

mod common;

use std::time::Duration;

use api::Client as Api;
use common::*;
use serde_json::json;
use testbed::history_load::{self, Clock, Load, Mix, Transport};

#[test]
fn tcp_through_the_vip_survives_loss_duplication_and_reordering() {
    let live = testbed_with("ktf", "l3", false, |o| {
        o.extra_config = Some("[cache]\nlease_ms = 2000\n".into());
    });
    let api = Api::new(live.api(), None);
    // Every TCP segment to or from a memcached port, in both directions: client to VIP,
    // proxy to server, and the replies.
    let impair = json!({"impair": {
        "drop_ppm": 20_000, "duplicate_ppm": 10_000, "reorder_ppm": 20_000,
        "reorder_us": 2_000, "delay_us": 100
    }});
    for field in ["l4_dst", "l4_src"] {
        api.call(
            "POST",
            "/api/v1/tables/acl/entries",
            Some(&json!({
                "match": {"ip_proto": 6, field: 11211},
                "actions": [impair.clone()],
            })),
        )
        .expect("an impair entry");
    }
    let entries = api
        .call("GET", "/api/v1/tables/acl/entries", None)
        .expect("acl entries");
    assert!(
        entries.to_string().contains("\"reorder_us\":2000"),
        "{entries}"
    );
    let before = drops(&live, "impaired");
    let clients = history_clients(
        &live,
        &["c1", "c2"],
        &[Transport::Tcp, Transport::Tcp, Transport::Udp],
        Duration::from_secs(2),
    );
    let load = Load {
        keys: (0..16).map(|i| format!("tf:{i}")).collect(),
        ops_per_client: 20_000,
        duration: Duration::from_secs(5),
        mix: Mix::default(),
        seed: 35,
    };
    let recorded = history_load::run(&clients, &load, Clock::start()).expect("load");
    recorded_ok(&recorded);
    no_stale_read(&recorded.ops);
    let impaired = drops(&live, "impaired") - before;
    let text = metrics(&live);
    let duplicated: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("kvswitch_impaired_duplicated_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no duplicates counted in {text}"));
    println!("tcp faults: {impaired} segments dropped, {duplicated} sent twice");
    assert!(impaired > 10, "{impaired} dropped");
    assert!(duplicated > 5.0, "{duplicated} sent twice");
    assert!(
        recorded.ops_over(Transport::Tcp) > 200,
        "too little TCP traffic went through"
    );
    // The TCP clients were spliced: the switch carried their connections itself.
    let tcp = status(&live)["tcp"].clone();
    assert!(
        tcp["connections"]["spliced"].as_u64().unwrap_or(0) > 0,
        "{tcp}"
    );
    assert!(tcp["requests"].as_u64().unwrap_or(0) > 100, "{tcp}");
    // Once the entries go, nothing is impaired any more.
    let doc = api
        .call("GET", "/api/v1/tables/acl/entries", None)
        .expect("acl entries");
    for id in doc["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["id"].as_u64())
    {
        api.call("DELETE", &format!("/api/v1/tables/acl/entries/{id}"), None)
            .expect("delete");
    }
    let still = drops(&live, "impaired");
    for i in 0..20 {
        let key = format!("tf:after:{i}");
        let set = format!("set {key} 0 0 1\r\nx\r\n");
        let reply = tcp_call(&live, "c1", vip(&live), set.as_bytes(), |r| {
            r.ends_with(b"\r\n")
        });
        assert_eq!(reply, b"STORED\r\n");
    }
    assert_eq!(drops(&live, "impaired"), still);
    live.down().expect("down");
}

#[test]
fn tcp_on_the_xdp_path_survives_loss_at_every_host() {
    let live = testbed("ktfx", "l3", false);
    // 2% of the TCP segments arriving at each client and server are lost: requests to the
    // servers, the servers' acknowledgements and replies on their way to the clients.
    let hosts = ["c1", "c2", "s1", "s2", "s3"];
    let impaired: Vec<xdp::Impair> = hosts
        .iter()
        .enumerate()
        .map(|(i, host)| {
            live.in_host(host, move || {
                // SAFETY: a NUL-terminated name, read by the call only.
                let ifindex = unsafe { libc::if_nametoindex(c"eth0".as_ptr()) };
                assert!(ifindex > 0, "the host has an eth0");
                xdp::Impair::attach(ifindex, 20, 0x7cf + i as u64)
            })
            .expect("namespace")
            .expect("the impairment attaches")
        })
        .collect();
    let clients = history_clients(
        &live,
        &["c1", "c2"],
        &[Transport::Tcp, Transport::Tcp, Transport::Tcp],
        Duration::from_secs(2),
    );
    let load = Load {
        keys: (0..16).map(|i| format!("tfx:{i}")).collect(),
        ops_per_client: 20_000,
        duration: Duration::from_secs(5),
        mix: Mix::default(),
        seed: 36,
    };
    let recorded = history_load::run(&clients, &load, Clock::start()).expect("load");
    recorded_ok(&recorded);
    no_stale_read(&recorded.ops);
    let (seen, dropped): (u64, u64) = impaired
        .iter()
        .map(|i| i.counts())
        .fold((0, 0), |(a, b), (c, d)| (a + c, b + d));
    let frames = status(&live)["datapath"]["xdp_frames"].clone();
    println!("xdp path under loss: {dropped} of {seen} segments lost at the hosts; {frames}");
    assert!(dropped > 20, "{dropped} of {seen} dropped");
    assert!(
        recorded.ops_over(Transport::Tcp) > 500,
        "too little TCP traffic went through"
    );
    // The program carried part of it: replies and requests sent on in the kernel.
    for what in ["tcp_replies", "tcp_requests"] {
        assert!(frames[what].as_u64().unwrap_or(0) > 100, "{what}: {frames}");
    }
    // Nothing is kept once the clients have gone, loss or not.
    drop(impaired);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let tcp = status(&live)["tcp"].clone();
        if tcp["flows"].as_u64() == Some(0) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "spliced connections kept after their clients left: {tcp}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    live.down().expect("down");
}

/// A client that goes without a word (its host unplugged: here every segment to it is lost at
/// its own interface) gives its spliced connection back: silent past `switch.tcp_idle_s`, it
/// is sent keepalive probes, and once it has answered none the connection is reset on both
/// sides and forgotten. A client that is silent but there answers the probes and keeps its
/// connection.
#[test]
fn a_client_that_vanishes_gives_its_spliced_connection_back() {
    use std::io::{Read, Write};
    let live = testbed_with("ktfi", "l3", false, |o| {
        o.switch_config = Some("tcp_idle_s = 1\n".into());
    });
    let target = vip(&live);
    // One connection from each client (the first stores the key), each after a get left
    // silent.
    let open = |host: &str, set: bool| {
        live.in_host(host, move || {
            let mut s = std::net::TcpStream::connect_timeout(&target, Duration::from_secs(2))?;
            s.set_read_timeout(Some(Duration::from_secs(3)))?;
            if set {
                s.write_all(b"set ktfi:k 0 0 4\r\nheld\r\n")?;
                let mut stored = [0u8; 8];
                s.read_exact(&mut stored)?;
                assert_eq!(&stored, b"STORED\r\n");
            }
            get_on(&mut s)?;
            std::io::Result::Ok(s)
        })
        .expect("namespace")
        .expect("a get on a new connection")
    };
    fn get_on(s: &mut std::net::TcpStream) -> std::io::Result<()> {
        s.write_all(b"get ktfi:k\r\n")?;
        let mut out = Vec::new();
        let mut buf = [0u8; 512];
        while !ends_with_end(&out) {
            match s.read(&mut buf)? {
                0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                n => out.extend_from_slice(&buf[..n]),
            }
        }
        assert_eq!(out, b"VALUE ktfi:k 0 4\r\nheld\r\nEND\r\n");
        Ok(())
    }
    let gone = open("c1", true);
    let mut there = open("c2", false);
    assert_eq!(status(&live)["tcp"]["flows"].as_u64(), Some(2));
    // c1 hears nothing more.
    let deaf = live
        .in_host("c1", || {
            // SAFETY: a NUL-terminated name, read by the call only.
            let ifindex = unsafe { libc::if_nametoindex(c"eth0".as_ptr()) };
            assert!(ifindex > 0, "the host has an eth0");
            xdp::Impair::attach(ifindex, 1000, 0x1d1e)
        })
        .expect("namespace")
        .expect("the impairment attaches");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let tcp = loop {
        let tcp = status(&live)["tcp"].clone();
        if tcp["idle_resets"].as_u64() == Some(1) && tcp["flows"].as_u64() == Some(1) {
            break tcp;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the silent client's connection is kept: {tcp}"
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    let (_, lost) = deaf.counts();
    assert!(lost >= 3, "the probes reached c1's interface: {lost} lost");
    // Three probes to c1, and at least one to c2 that it answered.
    assert!(tcp["keepalive_probes"].as_u64().unwrap_or(0) >= 4, "{tcp}");
    assert!(metrics(&live).contains("kvswitch_tcp_idle_resets_total 1"));
    // c2 kept its connection through its silence.
    live.in_host("c2", move || get_on(&mut there))
        .expect("namespace")
        .expect("the connection that answered the probes still works");
    // c1, back on the wire, finds its connection gone: a reset, not a reply.
    drop(deaf);
    let mut gone = gone;
    let after = live
        .in_host("c1", move || get_on(&mut gone))
        .expect("namespace");
    assert_eq!(
        after.as_ref().map_err(std::io::Error::kind).err(),
        Some(std::io::ErrorKind::ConnectionReset),
        "a forgotten connection answered: {after:?}"
    );
    live.down().expect("down");
}
