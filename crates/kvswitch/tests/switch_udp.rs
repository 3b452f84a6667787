//! Switch mode end to end: real memcached servers in namespaces, the real kvswitch daemon on the
//! veth ports, memcached over UDP to the VIP from a client namespace.

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(2);

fn server_names() -> [&'static str; 3] {
    ["s1", "s2", "s3"]
}

/// Every write and read sent to the VIP lands on the ketama server; replies come from the VIP.
fn check_routing(live: &testbed::Live) {
    let ring = default_ring();
    let vip = vip(live);
    let keys = keys_spanning_servers(&ring, "route:", 4);
    for (i, key) in keys.iter().enumerate() {
        let value = format!("v{i}-{key}");
        let set = format!("set {key} 0 0 {}\r\n{value}\r\n", value.len());
        let r = udp_call(live, "c1", vip, set.as_bytes(), T).expect("set reply");
        assert_eq!(r.body, b"STORED\r\n", "set {key}");
        assert_eq!(r.from, vip, "reply must come from the VIP");

        let owner = server_names()[ring.locate(key.as_bytes())];
        for s in server_names() {
            let held = server_value(live, s, key);
            if s == owner {
                assert_eq!(held.as_deref(), Some(value.as_bytes()), "{key} on {s}");
            } else {
                assert_eq!(held, None, "{key} must not be on {s}");
            }
        }
        let r = udp_call(live, "c2", vip, format!("get {key}\r\n").as_bytes(), T).expect("get");
        assert_eq!(
            r.body,
            format!("VALUE {key} 0 {}\r\n{value}\r\nEND\r\n", value.len()).as_bytes()
        );
        assert_eq!(r.from, vip);
    }

    // incr and delete reach the owner too.
    for key in keys.iter().take(3) {
        let owner = server_names()[ring.locate(key.as_bytes())];
        let r = udp_call(
            live,
            "c1",
            vip,
            format!("set {key} 0 0 2\r\n41\r\n").as_bytes(),
            T,
        )
        .expect("set");
        assert_eq!(r.body, b"STORED\r\n");
        let r = udp_call(live, "c1", vip, format!("incr {key} 1\r\n").as_bytes(), T).expect("incr");
        assert_eq!(r.body, b"42\r\n");
        assert_eq!(server_value(live, owner, key).as_deref(), Some(&b"42"[..]));
        let r =
            udp_call(live, "c1", vip, format!("delete {key}\r\n").as_bytes(), T).expect("delete");
        assert_eq!(r.body, b"DELETED\r\n");
        assert_eq!(server_value(live, owner, key), None);
    }

    // Meta and binary requests are routed by their key as well.
    let key = &keys[5];
    let r = udp_call(
        live,
        "c1",
        vip,
        format!("ms {key} 3\r\nabc\r\n").as_bytes(),
        T,
    )
    .expect("ms");
    assert_eq!(r.body, b"HD\r\n");
    let owner = server_names()[ring.locate(key.as_bytes())];
    assert_eq!(server_value(live, owner, key).as_deref(), Some(&b"abc"[..]));
    let r = udp_call(live, "c1", vip, format!("mg {key} v\r\n").as_bytes(), T).expect("mg");
    assert_eq!(r.body, b"VA 3\r\nabc\r\n");
    let mut getk = vec![0x80, 0x0c, 0, key.len() as u8, 0, 0, 0, 0];
    getk.extend_from_slice(&(key.len() as u32).to_be_bytes());
    getk.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0, 0, 0, 0, 0]);
    getk.extend_from_slice(key.as_bytes());
    let r = udp_call(live, "c1", vip, &getk, T).expect("binary getk");
    assert_eq!(r.body[0], 0x81, "binary response magic");
    assert_eq!(&r.body[6..8], &[0, 0], "status: no error");
    assert_eq!(&r.body[12..16], &[0xde, 0xad, 0xbe, 0xef], "opaque echoed");
    assert!(r.body.ends_with(b"abc"));
}

/// A get whose keys live on all three servers returns every value, in the client's order,
/// also when the merged reply needs several datagrams.
fn check_multiget(live: &testbed::Live) {
    let ring = default_ring();
    let vip = vip(live);
    let keys = keys_spanning_servers(&ring, "multi:", 3);
    let mut expected = Vec::new();
    let mut request = String::from("get");
    for (i, key) in keys.iter().enumerate() {
        request.push(' ');
        request.push_str(key);
        if i == 4 {
            continue; // one miss in the middle
        }
        let value = format!("{i}:{}", "x".repeat(300 + i));
        let set = format!("set {key} {i} 0 {}\r\n{value}\r\n", value.len());
        assert_eq!(
            udp_call(live, "c1", vip, set.as_bytes(), T)
                .expect("set")
                .body,
            b"STORED\r\n"
        );
        expected.extend_from_slice(
            format!("VALUE {key} {i} {}\r\n{value}\r\n", value.len()).as_bytes(),
        );
    }
    // The first key again at the end: memcached answers it twice.
    request.push(' ');
    request.push_str(&keys[0]);
    let first = server_value(
        live,
        server_names()[ring.locate(keys[0].as_bytes())],
        &keys[0],
    )
    .expect("first key stored");
    expected.extend_from_slice(format!("VALUE {} 0 {}\r\n", keys[0], first.len()).as_bytes());
    expected.extend_from_slice(&first);
    expected.extend_from_slice(b"\r\nEND\r\n");
    request.push_str("\r\n");

    let before = status(live)["counters"]["kv_split"].as_u64().unwrap();
    let r = udp_call(live, "c2", vip, request.as_bytes(), T).unwrap_or_else(|| {
        panic!(
            "no multi-get reply; switch counters: {}\nswitch log:\n{}",
            status(live)["counters"],
            log_tail(live, 40)
        )
    });
    assert_eq!(r.from, vip);
    assert_eq!(
        String::from_utf8_lossy(&r.body),
        String::from_utf8_lossy(&expected)
    );
    assert!(
        r.datagrams >= 2,
        "the merged reply spans datagrams ({})",
        r.datagrams
    );
    let after = status(live)["counters"]["kv_split"].as_u64().unwrap();
    assert_eq!(after, before + 1);

    // gets carries each server's CAS values through.
    let request = format!("gets {} {} {}\r\n", keys[0], keys[1], keys[2]);
    let r = udp_call(live, "c1", vip, request.as_bytes(), T).expect("gets reply");
    let text = String::from_utf8_lossy(&r.body);
    assert_eq!(text.matches("VALUE ").count(), 3, "{text}");
    assert!(text.ends_with("END\r\n"));
}

/// Sets `key` to `value` with client flags `flags` through the VIP and returns its CAS value.
fn set_and_cas(live: &testbed::Live, key: &str, flags: u32, value: &str) -> u64 {
    let vip = vip(live);
    let set = format!("set {key} {flags} 0 {}\r\n{value}\r\n", value.len());
    let r = udp_call(live, "c1", vip, set.as_bytes(), T).expect("set");
    assert_eq!(r.body, b"STORED\r\n", "set {key}");
    let r = udp_call(live, "c1", vip, format!("gets {key}\r\n").as_bytes(), T).expect("gets");
    let text = String::from_utf8_lossy(&r.body);
    let line = text.lines().next().unwrap_or_default();
    line.split(' ')
        .nth(4)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no CAS in {text:?}"))
}

/// A binary request or response header followed by `extras`, `key` and `value`.
fn binary(magic: u8, op: u8, status: u16, opaque: u32, cas: u64, parts: [&[u8]; 3]) -> Vec<u8> {
    let [extras, key, value] = parts;
    let mut out = vec![magic, op];
    out.extend_from_slice(&(key.len() as u16).to_be_bytes());
    out.extend_from_slice(&[extras.len() as u8, 0]);
    out.extend_from_slice(&status.to_be_bytes());
    out.extend_from_slice(&((extras.len() + key.len() + value.len()) as u32).to_be_bytes());
    out.extend_from_slice(&opaque.to_be_bytes());
    out.extend_from_slice(&cas.to_be_bytes());
    out.extend_from_slice(extras);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
    out
}

/// Sends `request` to the VIP and checks that the reply is `expected` and that one split ran.
fn check_split_reply(live: &testbed::Live, what: &str, request: &[u8], expected: &[u8]) {
    let vip = vip(live);
    let before = status(live)["counters"]["kv_split"].as_u64().unwrap();
    let r = udp_call(live, "c2", vip, request, T).unwrap_or_else(|| {
        panic!(
            "no {what} reply; switch counters: {}\nswitch log:\n{}",
            status(live)["counters"],
            log_tail(live, 40)
        )
    });
    assert_eq!(r.from, vip);
    assert_eq!(r.body, expected, "{what}");
    let after = status(live)["counters"]["kv_split"].as_u64().unwrap();
    assert_eq!(after, before + 1, "{what}: one split");
}

/// Pipelined binary gets (quiet and not, hits and misses, then a NOOP) and meta gets (with and
/// without `q`, then `mn`) on all three servers come back as one memcached would answer them.
fn check_pipelined_multiget(live: &testbed::Live) {
    const GET: u8 = 0x00;
    const GETQ: u8 = 0x09;
    const NOOP: u8 = 0x0a;
    const GETK: u8 = 0x0c;
    const GETKQ: u8 = 0x0d;
    let ring = default_ring();
    let keys = keys_spanning_servers(&ring, "bmulti:", 2);
    // Index 2 (quiet) and 4 (not quiet) miss.
    let ops = [GETKQ, GETQ, GETKQ, GET, GETK, GETKQ];
    let mut request = Vec::new();
    let mut expected = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let opaque = 0x1000 + i as u32;
        request.extend(binary(
            0x80,
            ops[i],
            0,
            opaque,
            0,
            [b"", key.as_bytes(), b""],
        ));
        if i == 2 || i == 4 {
            if i == 4 {
                expected.extend(binary(0x81, GETK, 1, opaque, 0, [b"", key.as_bytes(), b""]));
            }
            continue;
        }
        let value = format!("b{i}:{}", "y".repeat(200 * i));
        let flags = 10 + i as u32;
        let cas = set_and_cas(live, key, flags, &value);
        let with_key = matches!(ops[i], GETK | GETKQ);
        let key_field = if with_key { key.as_bytes() } else { b"" };
        expected.extend(binary(
            0x81,
            ops[i],
            0,
            opaque,
            cas,
            [&flags.to_be_bytes(), key_field, value.as_bytes()],
        ));
    }
    request.extend(binary(0x80, NOOP, 0, 0xfeed, 0, [b"", b"", b""]));
    expected.extend(binary(0x81, NOOP, 0, 0xfeed, 0, [b"", b"", b""]));
    check_split_reply(live, "binary multi-get", &request, &expected);

    let keys = keys_spanning_servers(&ring, "mmulti:", 2);
    let mut request = String::new();
    let mut expected = String::new();
    for (i, key) in keys.iter().enumerate() {
        // Index 1 (quiet) and 3 (not quiet) miss.
        let quiet = if i == 3 { "" } else { " q" };
        request.push_str(&format!("mg {key} f v k{quiet}\r\n"));
        if i == 1 || i == 3 {
            if i == 3 {
                expected.push_str(&format!("EN k{key}\r\n"));
            }
            continue;
        }
        let value = format!("m{i}:{}", "z".repeat(100 * i));
        set_and_cas(live, key, 20 + i as u32, &value);
        expected.push_str(&format!(
            "VA {} f{} k{key}\r\n{value}\r\n",
            value.len(),
            20 + i
        ));
    }
    request.push_str("mn\r\n");
    expected.push_str("MN\r\n");
    check_split_reply(
        live,
        "meta multi-get",
        request.as_bytes(),
        expected.as_bytes(),
    );
}

/// Frames between two hosts that do not concern the VIP are switched like any L2 switch.
fn check_l2(live: &testbed::Live) {
    let c2 = ip_of(live, "c2").to_string();
    let out = live
        .exec("c1", "ping")
        .args(["-c", "3", "-i", "0.2", "-W", "1", &c2])
        .output()
        .expect("ping");
    assert!(
        out.status.success(),
        "ping c1 -> c2: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    // TCP from a client straight to a server's address is switched, not routed by key.
    let s1 = SocketAddr::new(ip_of(live, "s1").into(), 11211);
    let reply = tcp_call(
        live,
        "c1",
        s1,
        b"set plain 0 0 2\r\nok\r\nget plain\r\n",
        ends_with_end,
    );
    assert_eq!(reply, b"STORED\r\nVALUE plain 0 2\r\nok\r\nEND\r\n");
}

/// Malformed requests to the VIP get memcached's answer or a counted drop; none reaches a server.
fn check_malformed(live: &testbed::Live) {
    let vip = vip(live);
    let servers_before: u64 = server_names()
        .iter()
        .map(|s| udp_in_datagrams(live, s))
        .sum();
    let before = status(live);
    let drop_before = |r: &str| before["counters"]["drops"][r].as_u64().unwrap();

    // Too short for a frame header.
    assert!(udp_raw(live, "c1", vip, &[0, 7, 0], Duration::from_millis(300)).is_none());
    // A request claiming to be one of two datagrams.
    assert!(udp_raw(
        live,
        "c1",
        vip,
        b"\0\x07\0\0\0\x02\0\0get a\r\n",
        Duration::from_millis(300)
    )
    .is_none());
    // A storage command cut short.
    assert!(udp_call(
        live,
        "c1",
        vip,
        b"set k 0 0 10\r\nabc",
        Duration::from_millis(300)
    )
    .is_none());
    // Answered as memcached answers them.
    let long_key = "k".repeat(251);
    let r = udp_call(live, "c1", vip, format!("get {long_key}\r\n").as_bytes(), T).expect("reply");
    assert_eq!(r.body, b"CLIENT_ERROR bad command line format\r\n");
    assert_eq!(r.from, vip);
    let r = udp_call(live, "c1", vip, b"bogus command\r\n", T).expect("reply");
    assert_eq!(r.body, b"ERROR\r\n");

    let after = status(live);
    let drop_after = |r: &str| after["counters"]["drops"][r].as_u64().unwrap();
    assert_eq!(
        drop_after("bad_frame_header"),
        drop_before("bad_frame_header") + 1
    );
    assert_eq!(
        drop_after("multi_datagram_request"),
        drop_before("multi_datagram_request") + 1
    );
    assert_eq!(
        drop_after("incomplete_request"),
        drop_before("incomplete_request") + 1
    );
    let servers_after: u64 = server_names()
        .iter()
        .map(|s| udp_in_datagrams(live, s))
        .sum();
    assert_eq!(
        servers_after, servers_before,
        "a malformed request reached a server"
    );
    let m = metrics(live);
    assert!(
        m.contains("kvswitch_drops_total{reason=\"bad_frame_header\"}"),
        "{m}"
    );
}

/// Several clients at once write values and read them back with multi-key gets that span all
/// servers: every answer that arrives is exactly the values last written, never another's or
/// an old one.
fn check_no_wrong_answers_under_concurrency(live: &testbed::Live) {
    const WORKERS: usize = 4;
    const ROUNDS: usize = 150;
    let ring = default_ring();
    let vip = vip(live);
    let (ok, lost, wrong) = live
        .in_host("c1", move || {
            std::thread::scope(|scope| {
                let handles: Vec<_> = (0..WORKERS)
                    .map(|w| {
                        let keys = keys_spanning_servers(&ring, &format!("conc{w}:"), 1);
                        scope.spawn(move || {
                            let sock = std::net::UdpSocket::bind("0.0.0.0:0").expect("socket");
                            let (mut ok, mut lost, mut wrong) = (0, 0, Vec::new());
                            let mut id: u16 = 1;
                            let mut call = |payload: &[u8]| {
                                id = id.wrapping_add(1).max(1);
                                let mut d = vec![(id >> 8) as u8, id as u8, 0, 0, 0, 1, 0, 0];
                                d.extend_from_slice(payload);
                                exchange(&sock, vip, &d, Duration::from_millis(500))
                            };
                            for round in 0..ROUNDS {
                                let mut expected = String::new();
                                let mut stored = true;
                                for key in &keys {
                                    let value = format!("w{w}r{round}-{key}");
                                    let set =
                                        format!("set {key} 0 0 {}\r\n{value}\r\n", value.len());
                                    match call(set.as_bytes()) {
                                        Some(r) if r.body == b"STORED\r\n" => {}
                                        Some(r) => wrong.push(r.body),
                                        None => stored = false,
                                    }
                                    expected.push_str(&format!(
                                        "VALUE {key} 0 {}\r\n{value}\r\n",
                                        value.len()
                                    ));
                                }
                                expected.push_str("END\r\n");
                                if !stored {
                                    lost += 1;
                                    continue;
                                }
                                match call(format!("get {}\r\n", keys.join(" ")).as_bytes()) {
                                    Some(r) if r.body == expected.as_bytes() => ok += 1,
                                    Some(r) => wrong.push(r.body),
                                    None => lost += 1,
                                }
                            }
                            (ok, lost, wrong)
                        })
                    })
                    .collect();
                handles.into_iter().fold((0, 0, Vec::new()), |mut acc, h| {
                    let (ok, lost, wrong) = h.join().expect("worker");
                    acc.0 += ok;
                    acc.1 += lost;
                    acc.2.extend(wrong);
                    acc
                })
            })
        })
        .expect("client namespace");
    assert!(
        wrong.is_empty(),
        "{} wrong answers, first: {:?}",
        wrong.len(),
        String::from_utf8_lossy(&wrong[0])
    );
    // UDP may lose a datagram now and then; nearly every round must complete.
    assert!(
        ok >= WORKERS * ROUNDS * 95 / 100,
        "only {ok} rounds completed, {lost} lost"
    );
}

/// Sends one UDP datagram from inside `host` with any source address and port, through a raw
/// socket (the kernel fills in the IPv4 checksum; the UDP checksum is left at zero, "none").
fn send_forged(live: &testbed::Live, host: &str, src: SocketAddr, dst: SocketAddr, payload: &[u8]) {
    let (SocketAddr::V4(src), SocketAddr::V4(dst)) = (src, dst) else {
        panic!("IPv4 only");
    };
    let udp_len = 8 + payload.len();
    let mut packet = vec![0x45, 0];
    packet.extend_from_slice(&((20 + udp_len) as u16).to_be_bytes());
    packet.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]);
    packet.extend_from_slice(&src.ip().octets());
    packet.extend_from_slice(&dst.ip().octets());
    packet.extend_from_slice(&src.port().to_be_bytes());
    packet.extend_from_slice(&dst.port().to_be_bytes());
    packet.extend_from_slice(&(udp_len as u16).to_be_bytes());
    packet.extend_from_slice(&[0, 0]);
    packet.extend_from_slice(payload);
    live.in_host(host, move || {
        // SAFETY: a raw socket is opened, used with buffers that outlive the calls, and
        // closed; sockaddr_in is fully initialised.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW);
            assert!(fd >= 0, "raw socket");
            let mut to: libc::sockaddr_in = std::mem::zeroed();
            to.sin_family = libc::AF_INET as libc::sa_family_t;
            to.sin_addr.s_addr = u32::from_ne_bytes(dst.ip().octets());
            let sent = libc::sendto(
                fd,
                packet.as_ptr().cast(),
                packet.len(),
                0,
                (&to as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            );
            libc::close(fd);
            assert_eq!(sent, packet.len() as isize, "raw send");
        }
    })
    .expect("client namespace");
}

/// A client cannot have the servers' replies sent to another (source check, on in the
/// testbed), and a datagram from port 0 never reaches memcached (which stops answering UDP
/// after one).
fn check_forged_sources(live: &testbed::Live) {
    let vip = vip(live);
    let key = "forged:big";
    let value = "x".repeat(1200);
    let set = format!("set {key} 0 0 {}\r\n{value}\r\n", value.len());
    let r = udp_call(live, "c1", vip, set.as_bytes(), T).expect("set");
    assert_eq!(r.body, b"STORED\r\n");

    // c1 listens where the forged request says it came from; c2 sends it.
    let victim = SocketAddr::new(ip_of(live, "c1").into(), 40_123);
    let spoofed_before = drops(live, "source_spoofed");
    let listener = live
        .in_host("c1", move || {
            UdpSocket::bind(victim).expect("bind the victim's port")
        })
        .expect("c1");
    let mut request = vec![0u8, 9, 0, 0, 0, 1, 0, 0];
    request.extend_from_slice(format!("get {key}\r\n").as_bytes());
    for _ in 0..3 {
        send_forged(live, "c2", victim, vip, &request);
    }
    listener
        .set_read_timeout(Some(Duration::from_millis(500)))
        .expect("timeout");
    let mut buf = [0u8; 2048];
    assert!(
        listener.recv_from(&mut buf).is_err(),
        "the victim received a reply to a request it never sent"
    );
    assert!(drops(live, "source_spoofed") >= spoofed_before + 3);

    // Port 0: dropped and counted; the servers still answer UDP afterwards.
    let zero_before = drops(live, "source_port_zero");
    let own = SocketAddr::new(ip_of(live, "c2").into(), 0);
    send_forged(live, "c2", own, vip, &request);
    // The switch counts it once it has read the frame, which a loaded machine may delay.
    let sent = std::time::Instant::now();
    while drops(live, "source_port_zero") == zero_before {
        assert!(
            sent.elapsed() < Duration::from_secs(5),
            "a request from port 0 was not dropped and counted"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for s in ["s1", "s2", "s3"] {
        let server = SocketAddr::new(ip_of(live, s).into(), 11211);
        let r = udp_call(live, "c1", server, b"version\r\n", T);
        assert!(r.is_some(), "{s} stopped answering UDP");
    }
}

/// A switch killed outright leaves no XDP program on its ports: the kernel releases the
/// program's links with the process, so nothing goes on forwarding on tables nobody keeps.
fn check_no_program_outlives_the_switch(live: &testbed::Live) {
    let pid = live.state.kvswitch_pid.expect("kvswitch runs");
    let ports: Vec<String> = live
        .state
        .hosts
        .iter()
        .map(|h| h.switch_if.clone())
        .collect();
    let has_xdp = |port: &str| {
        let out = std::process::Command::new("ip")
            .args(["-details", "link", "show", "dev", port])
            .output()
            .expect("ip link show");
        String::from_utf8_lossy(&out.stdout).contains("prog/xdp")
    };
    assert!(
        ports.iter().all(|p| has_xdp(p)),
        "the program is not on every port"
    );
    // SAFETY: kill has no memory-safety preconditions; the PID is the testbed's own kvswitch.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let start = std::time::Instant::now();
    while ports.iter().any(|p| has_xdp(p)) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "an XDP program stayed on a port of a killed switch"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn switch_mode_l3_end_to_end() {
    let live = testbed("ku3", "l3", true);
    check_routing(&live);
    check_multiget(&live);
    check_pipelined_multiget(&live);
    check_l2(&live);
    check_malformed(&live);
    check_no_wrong_answers_under_concurrency(&live);
    check_forged_sources(&live);

    // Keys written through nutcracker are found through kvswitch: same placement, warm cache.
    let nut = live.state.nutcracker.as_ref().expect("nutcracker").listen;
    let vip = vip(&live);
    for i in 0..30 {
        let key = format!("nut:{i}");
        let reply = tcp_call(
            &live,
            "c1",
            nut,
            format!("set {key} 0 0 1\r\n{}\r\n", i % 10).as_bytes(),
            ends_with_line,
        );
        assert_eq!(reply, b"STORED\r\n");
        let r = udp_call(&live, "c2", vip, format!("get {key}\r\n").as_bytes(), T).expect("get");
        assert_eq!(
            r.body,
            format!("VALUE {key} 0 1\r\n{}\r\nEND\r\n", i % 10).as_bytes()
        );
    }

    let st = status(&live);
    let per_backend: Vec<u64> = st["pool"]["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["requests"].as_u64().unwrap())
        .collect();
    assert!(per_backend.iter().all(|n| *n > 0), "{per_backend:?}");
    check_fast_path(&live);
    live.down().expect("down");
}

/// The same switch with `switch.datapath = "af_xdp"`: what the XDP program hands to the switch
/// arrives on each port's AF_XDP socket, and the switch sends through it.
#[test]
fn switch_mode_over_af_xdp_end_to_end() {
    let live = testbed_with("kux", "l3", false, |o| o.datapath = Some("af_xdp".into()));
    let st = status(&live);
    for p in st["ports"].as_array().expect("ports") {
        let name = p["name"].as_str().unwrap_or_default();
        if name.ends_with("-local") {
            continue;
        }
        assert_eq!(p["datapath"], "xdp (native) and af_xdp", "{p}");
    }
    check_routing(&live);
    check_multiget(&live);
    check_l2(&live);
    check_malformed(&live);
    check_fast_path(&live);
    // The switch's own traffic (ARP, writes, split gets) crossed the AF_XDP sockets.
    let ports = status(&live)["ports"].clone();
    let moved: u64 = ports
        .as_array()
        .expect("ports")
        .iter()
        .filter(|p| !p["name"].as_str().unwrap_or_default().ends_with("-local"))
        .map(|p| p["rx_packets"].as_u64().unwrap_or(0) + p["tx_packets"].as_u64().unwrap_or(0))
        .sum();
    assert!(moved > 100, "frames through the AF_XDP sockets: {moved}");
    live.down().expect("down");
}

#[test]
fn switch_mode_l2_end_to_end() {
    let live = testbed("ku2", "l2", false);
    check_routing(&live);
    check_l2(&live);
    check_fast_path(&live);
    check_no_program_outlives_the_switch(&live);
    live.down().expect("down");
}
