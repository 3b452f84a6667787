//! TCP to the VIP on the switch's splice (`switch.tcp = "splice"`, the default): the switch
//! answers the handshake with a SYN cookie, carries a connection whose requests stay on one
//! server itself, and hands a connection to the proxy at its first request for another server.
//! Every reply is checked against what one memcached holding every key would send, and the
//! switch's counters say which path each connection took.
//!
//! The clients are the tests' own sockets and memcached clients kvswitch did not write:
//! pymemcache, pylibmc (text and binary), memcslap and memccapable, run in a client namespace.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

fn tcp(live: &testbed::Live) -> serde_json::Value {
    status(live)["tcp"].clone()
}

fn count(live: &testbed::Live, path: &str) -> u64 {
    tcp(live)["connections"][path].as_u64().unwrap_or(0)
}

/// A connection to the VIP opened inside `host`, used from the test's thread.
fn connect(live: &testbed::Live, host: &str) -> TcpStream {
    let vip = vip(live);
    let s = live
        .in_host(host, move || {
            TcpStream::connect_timeout(&vip, Duration::from_secs(3))
        })
        .expect("namespace")
        .expect("connecting to the VIP");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// Sends `request` and reads until `want` has come, which it must be, byte for byte.
fn call(s: &mut TcpStream, request: &[u8], want: &[u8]) {
    s.write_all(request).expect("writing to the VIP");
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    while got.len() < want.len() {
        let n = s.read(&mut buf).unwrap_or_else(|e| {
            panic!(
                "reading after {:?}: {e}; so far {:?}",
                String::from_utf8_lossy(&request[..request.len().min(60)]),
                String::from_utf8_lossy(&got[..got.len().min(200)])
            )
        });
        assert!(n > 0, "the VIP closed the connection");
        got.extend_from_slice(&buf[..n]);
    }
    assert!(
        got == want,
        "after {:?}: got {:?}, want {:?}",
        String::from_utf8_lossy(&request[..request.len().min(60)]),
        String::from_utf8_lossy(&got[..got.len().min(200)]),
        String::from_utf8_lossy(&want[..want.len().min(200)])
    );
}

fn set(key: &str, value: &[u8]) -> Vec<u8> {
    let mut r = format!("set {key} 0 0 {}\r\n", value.len()).into_bytes();
    r.extend_from_slice(value);
    r.extend_from_slice(b"\r\n");
    r
}

fn hit(key: &str, value: &[u8]) -> Vec<u8> {
    let mut r = format!("VALUE {key} 0 {}\r\n", value.len()).into_bytes();
    r.extend_from_slice(value);
    r.extend_from_slice(b"\r\nEND\r\n");
    r
}

fn value(key: &str, i: usize, len: usize) -> Vec<u8> {
    let seed = format!("{key}:{i}:");
    seed.bytes().cycle().take(len).collect()
}

/// Waits until the switch holds no spliced connection any more (closed ones linger 5 s).
fn wait_for_no_flows(live: &testbed::Live) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let flows = tcp(live)["flows"].as_u64().expect("tcp.flows");
        if flows == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{flows} spliced connections kept after their clients left: {}",
            tcp(live)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The XDP program's count of spliced segments it sent on, `tcp_replies` or `tcp_requests`
/// (its counters reach the status API at its next sync with the switch).
fn in_xdp(live: &testbed::Live, what: &str) -> u64 {
    let datapath = status(live)["datapath"].clone();
    assert_eq!(
        datapath["xdp"], true,
        "the XDP program is in use: {datapath}"
    );
    datapath["xdp_frames"][what].as_u64().unwrap_or(0)
}

fn tcp_replies_in_xdp(live: &testbed::Live) -> u64 {
    in_xdp(live, "tcp_replies")
}

/// Repeats `get <key>` (answered `want`) on `s` until the XDP program sends the requests and
/// the replies on: the switch tells it of the client and the server as senders at its next
/// sync.
fn until_replies_in_xdp(live: &testbed::Live, s: &mut TcpStream, key: &str, want: &[u8]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while tcp_replies_in_xdp(live) == 0 || in_xdp(live, "tcp_requests") == 0 {
        assert!(
            Instant::now() < deadline,
            "no spliced reply rewritten in XDP: {}",
            status(live)["datapath"]
        );
        call(s, format!("get {key}\r\n").as_bytes(), want);
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The XDP program's count `what` once it has stopped moving: it reaches the status API at
/// the program's syncs with the switch, a while after the segments it counts.
fn settled_in_xdp(live: &testbed::Live, what: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = in_xdp(live, what);
    loop {
        std::thread::sleep(Duration::from_millis(600));
        let now = in_xdp(live, what);
        if now == last || Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

/// Waits until the XDP program's count of spliced segments `what` reaches `n`.
fn wait_for_in_xdp(live: &testbed::Live, what: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while in_xdp(live, what) < n {
        assert!(
            Instant::now() < deadline,
            "fewer than {n} spliced {what} sent on in XDP: {}",
            status(live)["datapath"]
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn splice_then_hand_over(prefix: &str, mode: &str) {
    let live = testbed(prefix, mode, false);
    assert_eq!(tcp(&live)["path"], "splice", "{}", tcp(&live));
    let ring = default_ring();
    let keys = keys_spanning_servers(&ring, &format!("{prefix}-"), 1);
    let (a, b) = (&keys[0], &keys[1]);
    assert_ne!(ring.locate(a.as_bytes()), ring.locate(b.as_bytes()));

    // One connection whose requests all go to a's server: spliced, never handed over.
    let mut s = connect(&live, "c1");
    for i in 0..50 {
        let v = value(a, i, 10 + i * 7);
        call(&mut s, &set(a, &v), b"STORED\r\n");
        call(&mut s, format!("get {a}\r\n").as_bytes(), &hit(a, &v));
    }
    // Once the switch has told the XDP program of the server, the program sends its
    // replies on, the switch handing it the leg between requests: a value over many
    // segments each way.
    let last = value(a, 49, 10 + 49 * 7);
    until_replies_in_xdp(&live, &mut s, a, &hit(a, &last));
    let big = value(a, 999, 300_000);
    call(&mut s, &set(a, &big), b"STORED\r\n");
    let before = tcp_replies_in_xdp(&live);
    call(&mut s, format!("get {a}\r\n").as_bytes(), &hit(a, &big));
    wait_for_in_xdp(&live, "tcp_replies", before + 100);
    let t = tcp(&live);
    assert_eq!(count(&live, "spliced"), 1, "{t}");
    assert_eq!(count(&live, "handed_over"), 0, "{t}");
    assert!(t["requests"].as_u64().unwrap() >= 103, "{t}");
    assert_eq!(
        server_value(&live, ["s1", "s2", "s3"][ring.locate(a.as_bytes())], a),
        Some(big.clone()),
        "the spliced set reached the key's server"
    );

    // Then requests for b's server too: the connection gets a leg to it, and the replies
    // of both come back in order, nothing lost, with no proxy in the way.
    // (A small value of a's from here, so that the client's acknowledgements of a large
    // reply do not fill the program's count of what it sent on.)
    let vb = value(b, 0, 5000);
    call(&mut s, &set(b, &vb), b"STORED\r\n");
    let small = value(a, 500, 60);
    call(&mut s, &set(a, &small), b"STORED\r\n");
    let requests = settled_in_xdp(&live, "tcp_requests");
    for i in 0..20 {
        call(&mut s, format!("get {a}\r\n").as_bytes(), &hit(a, &small));
        let v = value(b, i + 1, 100 + i);
        call(&mut s, &set(b, &v), b"STORED\r\n");
        call(&mut s, format!("get {b}\r\n").as_bytes(), &hit(b, &v));
    }
    assert_eq!(count(&live, "handed_over"), 0, "{}", tcp(&live));
    assert_eq!(tcp(&live)["legs"], 1, "{}", tcp(&live));
    // Each get of b after its set went on in the program: the switch moved the client's side
    // from the connection's first leg to b's (a store into the first leg's slot, which the
    // program finds the client by).
    wait_for_in_xdp(&live, "tcp_requests", requests + 15);

    // Pipelined on a fresh connection: requests for both servers in one write, and a
    // multi-key get, which the proxy answers on a leg of its own.
    let mut p = connect(&live, "c2");
    let va = value(a, 7, 3000);
    let vb = value(b, 7, 40);
    let mut request = set(a, &va);
    request.extend_from_slice(format!("get {a}\r\nget {b} {a}\r\n").as_bytes());
    request.extend_from_slice(&set(b, &vb));
    request.extend_from_slice(format!("get {b}\r\nget {a}\r\n").as_bytes());
    let mut want = b"STORED\r\n".to_vec();
    want.extend_from_slice(&hit(a, &va));
    let mut both = format!("VALUE {b} 0 {}\r\n", 119).into_bytes();
    both.extend_from_slice(&value(b, 20, 119));
    both.extend_from_slice(format!("\r\nVALUE {a} 0 {}\r\n", va.len()).as_bytes());
    both.extend_from_slice(&va);
    both.extend_from_slice(b"\r\nEND\r\n");
    want.extend_from_slice(&both);
    want.extend_from_slice(b"STORED\r\n");
    want.extend_from_slice(&hit(b, &vb));
    want.extend_from_slice(&hit(a, &va));
    call(&mut p, &request, &want);
    assert_eq!(count(&live, "handed_over"), 1, "{}", tcp(&live));

    // A first request that no one server can answer goes to the proxy from the start.
    let mut q = connect(&live, "c1");
    q.write_all(b"version\r\n").unwrap();
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\r\n") && q.read(&mut byte).expect("version's reply") == 1 {
        line.push(byte[0]);
    }
    assert!(
        line.starts_with(b"VERSION "),
        "{:?}",
        String::from_utf8_lossy(&line)
    );
    assert_eq!(count(&live, "proxied"), 1, "{}", tcp(&live));

    drop((s, p, q));
    wait_for_no_flows(&live);
    let text = metrics(&live);
    assert!(
        text.contains("kvswitch_tcp_connections_total{path=\"spliced\"}"),
        "no TCP path counters in /metrics"
    );
    live.down().expect("down");
}

#[test]
fn a_connection_is_spliced_and_handed_over_in_order_l3() {
    splice_then_hand_over("ktsp", "l3");
}

#[test]
fn a_connection_is_spliced_and_handed_over_in_order_l2() {
    splice_then_hand_over("ktsq", "l2");
}

/// A SYN flood at the VIP: every SYN is answered with a cookie and nothing is kept for it; the
/// honest client next to it still gets through.
#[test]
fn a_syn_flood_allocates_nothing() {
    let live = testbed("ktsf", "l3", false);
    let vip = vip(&live);
    let c1 = ip_of(&live, "c1");
    let before = tcp(&live)["syn_cookies"].as_u64().unwrap();
    const SYNS: u16 = 2000;
    let sent = live
        .in_host("c1", move || -> std::io::Result<u16> {
            // SAFETY: plain socket calls on a descriptor this closure owns and closes.
            unsafe {
                let fd = libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let SocketAddr::V4(v) = vip else {
                    unreachable!()
                };
                let addr = libc::sockaddr_in {
                    sin_family: libc::AF_INET as u16,
                    sin_port: 0,
                    sin_addr: libc::in_addr {
                        s_addr: u32::from(*v.ip()).to_be(),
                    },
                    sin_zero: [0; 8],
                };
                let mut sent = 0;
                for i in 0..SYNS {
                    let syn = wire::tcp::Repr {
                        src_port: 20000 + i,
                        dst_port: v.port(),
                        seq: u32::from(i).wrapping_mul(2_654_435_761),
                        ack: 0,
                        flags: wire::tcp::flag::SYN,
                        window: 64240,
                        mss: Some(1460),
                        wscale: Some(7),
                    };
                    let ends = wire::tcp::Ends {
                        src_mac: wire::ethernet::Mac([0; 6]),
                        dst_mac: wire::ethernet::Mac([0; 6]),
                        src_ip: c1,
                        dst_ip: *v.ip(),
                    };
                    let frame = syn.frame(&ends, &[]);
                    let packet = &frame[wire::ethernet::HEADER_LEN..];
                    let n = libc::sendto(
                        fd,
                        packet.as_ptr().cast(),
                        packet.len(),
                        0,
                        (&addr as *const libc::sockaddr_in).cast(),
                        std::mem::size_of::<libc::sockaddr_in>() as u32,
                    );
                    if n == packet.len() as isize {
                        sent += 1;
                    }
                }
                libc::close(fd);
                Ok(sent)
            }
        })
        .expect("namespace")
        .expect("raw socket");
    assert_eq!(sent, SYNS);
    // The honest client meanwhile.
    let mut s = connect(&live, "c2");
    call(&mut s, &set("flood-key", b"v"), b"STORED\r\n");
    call(&mut s, b"get flood-key\r\n", &hit("flood-key", b"v"));
    drop(s);
    let deadline = Instant::now() + Duration::from_secs(10);
    while tcp(&live)["syn_cookies"].as_u64().unwrap() < before + u64::from(SYNS) {
        assert!(
            Instant::now() < deadline,
            "SYNs not all answered: {}",
            tcp(&live)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // c1's own stack answers each SYN-ACK it never asked for with a reset; nothing is kept.
    let t = tcp(&live);
    assert!(t["flows"].as_u64().unwrap() <= 1, "{t}");
    wait_for_no_flows(&live);
    live.down().expect("down");
}

/// Debian's Python, where python3-pymemcache and python3-pylibmc install.
const PYTHON: &str = "/usr/bin/python3";

/// Runs a Python memcached client script in `host`; it prints "ok" when every check held.
fn python(live: &testbed::Live, host: &str, script: &str) {
    let out = live
        .exec(host, "timeout")
        .args(["60", PYTHON, "-c", script])
        .stdin(Stdio::null())
        .output()
        .expect("python3");
    assert!(
        out.status.success()
            && String::from_utf8_lossy(&out.stdout)
                .trim_end()
                .ends_with("ok"),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

const PYMEMCACHE: &str = r#"
import sys
from pymemcache.client.base import Client
vip = (sys.argv[1] if len(sys.argv) > 1 else "VIP", 11211)
c = Client(vip, connect_timeout=3, timeout=5, default_noreply=False)
for i in range(300):
    k = "pym-%d" % i
    v = ("v%d-" % i).encode() * (1 + i % 50)
    assert c.set(k, v), k
    assert c.get(k) == v, k
got = c.get_many(["pym-%d" % i for i in range(0, 300, 7)])
assert len(got) == len(range(0, 300, 7)), len(got)
for i in range(0, 300, 7):
    assert got["pym-%d" % i] == ("v%d-" % i).encode() * (1 + i % 50)
assert c.add("pym-0", b"x") is False
assert c.delete("pym-1")
assert c.get("pym-1") is None
c.set("pym-n", b"10")
assert c.incr("pym-n", 5) == 15
assert c.decr("pym-n", 3) == 12
v, cas = c.gets("pym-2")
assert c.cas("pym-2", b"new", cas)
assert c.get("pym-2") == b"new"
assert c.append("pym-2", b"+") and c.get("pym-2") == b"new+"
print("ok")
"#;

const PYLIBMC: &str = r#"
import pylibmc
for binary in (False, True):
    c = pylibmc.Client(["VIP:11211"], binary=binary)
    tag = "b" if binary else "t"
    for i in range(300):
        k = "plm-%s-%d" % (tag, i)
        v = ("w%d-" % i).encode() * (1 + i % 40)
        assert c.set(k, v), k
        assert c.get(k) == v, k
    keys = ["plm-%s-%d" % (tag, i) for i in range(0, 300, 5)]
    got = c.get_multi(keys)
    assert len(got) == len(keys), (binary, len(got))
    assert c.delete("plm-%s-3" % tag)
    assert c.get("plm-%s-3" % tag) is None
    c.set("plm-%s-n" % tag, "7")
    assert c.incr("plm-%s-n" % tag, 2) == 9
print("ok")
"#;

/// pymemcache and pylibmc, text and binary, over TCP to the VIP.
#[test]
fn python_memcached_clients_through_the_splice() {
    let live = testbed("ktpy", "l3", false);
    let vip = vip(&live).ip().to_string();
    python(
        &live,
        "c1",
        &PYMEMCACHE.replace("\"VIP\"", &format!("\"{vip}\"")),
    );
    python(&live, "c2", &PYLIBMC.replace("VIP", &vip));
    let t = tcp(&live);
    assert!(
        count(&live, "spliced") + count(&live, "proxied") >= 3,
        "{t}"
    );
    assert!(t["requests"].as_u64().unwrap() > 0, "{t}");
    wait_for_no_flows(&live);
    live.down().expect("down");
}

/// libmemcached's memccapable and memcslap, over TCP to the VIP.
#[test]
fn libmemcached_tools_through_the_splice() {
    let live = testbed("ktlm", "l3", false);
    let vip = vip(&live);
    let out = live
        .exec("c1", "timeout")
        .args([
            "120",
            "memccapable",
            "-h",
            &vip.ip().to_string(),
            "-p",
            "11211",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("memccapable");
    let text = String::from_utf8_lossy(&out.stdout);
    let failed: Vec<&str> = text.lines().filter(|l| l.contains("[FAIL]")).collect();
    assert!(
        out.status.success() && failed.is_empty(),
        "memccapable through the VIP: {failed:?}\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let passed = text.lines().filter(|l| l.contains("[pass]")).count();
    assert!(passed >= 40, "{passed} memccapable tests passed\n{text}");
    let out = live
        .exec("c2", "timeout")
        .args([
            "120",
            "memcslap",
            &format!("--servers={vip}"),
            "--concurrency=4",
            "--execute-number=2000",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("memcslap");
    assert!(
        out.status.success(),
        "memcslap through the VIP: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("memccapable: {passed} passed; tcp: {}", tcp(&live));
    wait_for_no_flows(&live);
    live.down().expect("down");
}

/// The proxy's differential check through the VIP on the splice: seeded streams of valid and
/// mutated requests (text, meta, binary; pipelined, quiet, cut short) go on a fresh connection
/// to one memcached and through the VIP to three, and the answers must be the same bytes
/// (masked as `testbed::differential` says) with the connection closed alike.
#[test]
fn the_vip_answers_every_stream_as_one_memcached_does() {
    use testbed::differential::{case, exchange};
    let live = testbed("ktdf", "l3", false);
    // The reference: one memcached on the client's own loopback.
    let reference: SocketAddr = "127.0.0.1:11299".parse().unwrap();
    let mut memcached = live
        .exec("c1", "memcached")
        .args([
            "-p",
            "11299",
            "-U",
            "0",
            "-l",
            "127.0.0.1",
            "-t",
            "1",
            "-m",
            "64",
            "-u",
            "root",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("memcached in c1");
    let vip = vip(&live);
    let seed = 0x7c95;
    let cases: u64 = 240;
    let failures = live
        .in_host("c1", move || {
            let deadline = Instant::now() + Duration::from_secs(10);
            while TcpStream::connect(reference).is_err() {
                assert!(
                    Instant::now() < deadline,
                    "the reference memcached did not start"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            let workers: Vec<_> = (0..4u64)
                .map(|w| {
                    std::thread::spawn(move || {
                        let mut failures = Vec::new();
                        for i in (w..cases).step_by(4) {
                            let c = case(seed, i);
                            let want = exchange(reference, &c).expect("memcached answers");
                            let got = exchange(vip, &c).expect("the VIP answers");
                            if !got.matches(&want) {
                                failures.push(format!(
                                    "case {i}: {:?}\n  memcached: {want:?}\n  VIP:       {got:?}",
                                    String::from_utf8_lossy(&c.bytes)
                                ));
                            }
                        }
                        failures
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().expect("worker"))
                .collect::<Vec<_>>()
        })
        .expect("namespace");
    memcached.kill().expect("stopping the reference memcached");
    let _ = memcached.wait();
    let t = tcp(&live);
    println!("differential through the VIP: {cases} streams; tcp: {t}");
    assert!(
        failures.is_empty(),
        "{} of {cases} streams differ:\n{}",
        failures.len(),
        failures
            .iter()
            .take(8)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(count(&live, "spliced") > 0, "{t}");
    // Every connection ended at both ends: the switch forgets its flows, and the host's stack
    // (the proxy's side of the host's legs) is left with none still closing.
    wait_for_no_flows(&live);
    wait_for_no_closing_legs(vip);
    live.down().expect("down");
}

/// Waits until the host's stack holds no connection on `vip` that is still closing (waiting
/// for an acknowledgement of its FIN): a leg whose end the switch never acknowledged nor reset
/// would stay so for minutes, and a new leg on its ports would not open.
fn wait_for_no_closing_legs(vip: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let closing = closing_on(vip);
        if closing.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the host's stack still closes {} legs: {closing:?}",
            closing.len()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The host's connections on `vip` in FIN-WAIT-1, CLOSING or LAST-ACK, as /proc/net/tcp
/// lists them (addresses in the host's byte order).
fn closing_on(vip: SocketAddr) -> Vec<String> {
    let SocketAddr::V4(vip) = vip else {
        return Vec::new();
    };
    let local = format!(
        "{:08X}:{:04X}",
        u32::from_ne_bytes(vip.ip().octets()),
        vip.port()
    );
    std::fs::read_to_string("/proc/net/tcp")
        .expect("/proc/net/tcp")
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let closing = matches!(f.get(3), Some(&("04" | "0B" | "09")));
            (f.get(1) == Some(&local.as_str()) && closing).then(|| l.trim().to_string())
        })
        .collect()
}

/// Ends that TCP allows and a splice must carry: a client that half-closes after its request
/// gets the whole reply and then the end; a client that resets in the middle of a request
/// leaves nothing behind; a server killed while it sends a reply that fills the client's
/// window gives the client a prefix of the right bytes and an end, never a wrong byte or a
/// wedged connection, and its keys are answered by the proxy on the next connection.
#[test]
fn half_closes_resets_and_a_killed_server_wedge_nothing() {
    let live = testbed("ktse", "l3", false);
    let ring = default_ring();
    let keys = keys_spanning_servers(&ring, "ktse-", 1);
    let servers = ["s1", "s2", "s3"];

    // A half-close after the request.
    let mut s = connect(&live, "c1");
    let v = value(&keys[0], 0, 3000);
    call(&mut s, &set(&keys[0], &v), b"STORED\r\n");
    s.write_all(format!("get {}\r\n", keys[0]).as_bytes())
        .unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).expect("the reply, then the end");
    assert_eq!(got, hit(&keys[0], &v));

    // A reset in the middle of a request's data block.
    let mut r = connect(&live, "c2");
    r.write_all(format!("set {} 0 0 1000\r\n", keys[1]).as_bytes())
        .unwrap();
    r.write_all(&[b'x'; 400]).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    socket2::SockRef::from(&r)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(r);
    assert_eq!(
        server_value(&live, servers[ring.locate(keys[1].as_bytes())], &keys[1]),
        None,
        "half a set is not a set"
    );

    // A server killed while its reply waits on the client's window.
    let victim = ring.locate(keys[2].as_bytes());
    let big = value(&keys[2], 0, 600_000);
    let mut w = connect(&live, "c1");
    call(&mut w, &set(&keys[2], &big), b"STORED\r\n");
    socket2::SockRef::from(&w)
        .set_recv_buffer_size(4096)
        .unwrap();
    w.write_all(format!("get {}\r\n", keys[2]).as_bytes())
        .unwrap();
    let want = hit(&keys[2], &big);
    let mut got = vec![0u8; 1000];
    w.read_exact(&mut got).expect("the reply's start");
    live.kill_server(servers[victim]).expect("kill the server");
    w.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match w.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
        assert!(got.len() <= want.len(), "more bytes than the reply");
    }
    assert_eq!(
        got,
        want[..got.len()],
        "a wrong byte after the server was killed"
    );
    // The victim's keys now go to the proxy, which answers for them.
    let reply = tcp_call(
        &live,
        "c2",
        vip(&live),
        format!("get {}\r\n", keys[2]).as_bytes(),
        ends_with_line,
    );
    let reply = String::from_utf8_lossy(&reply);
    assert!(
        reply.starts_with("SERVER_ERROR") || reply == "END\r\n",
        "{reply:?}"
    );
    drop((s, w));
    wait_for_no_flows(&live);
    live.down().expect("down");
}

/// memtier_benchmark over TCP to the VIP, text and binary, where it is installed. It is not a
/// Debian package: without it the test says so and checks nothing.
#[test]
fn memtier_benchmark_through_the_splice_where_installed() {
    if !memtier_installed() {
        return;
    }
    let live = testbed("ktmt", "l3", false);
    let vip = vip(&live);
    for protocol in ["memcache_text", "memcache_binary"] {
        let out = live
            .exec("c1", "timeout")
            .args([
                "120",
                "memtier_benchmark",
                "-s",
                &vip.ip().to_string(),
                "-p",
                "11211",
            ])
            .args([
                "-P",
                protocol,
                "--threads",
                "1",
                "--clients",
                "8",
                "--requests",
                "2000",
            ])
            .args([
                "--ratio",
                "1:4",
                "--key-maximum",
                "5000",
                "--hide-histogram",
            ])
            .stdin(Stdio::null())
            .output()
            .expect("memtier_benchmark");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("Totals"),
            "memtier_benchmark {protocol} through the VIP: {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(count(&live, "spliced") + count(&live, "proxied") >= 16);
    wait_for_no_flows(&live);
    live.down().expect("down");
}
