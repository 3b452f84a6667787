//! Careless and hostile clients against the proxy: bursts of noreply and quiet requests, data
//! blocks crafted to run as commands on the server, binary bodies that never end, a server that
//! answers out of step, and thousands of malformed requests from one client while another
//! stores and reads its own keys on the same server connections. No client may ever receive a
//! reply that is not its own, and every connection must keep being answered.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::proxy::{set_request, show, Cluster, Conn, Front, PoolOpts, Proxy, REPLY_LIMIT};
use testbed::differential::case;

/// The sum of a Prometheus family's samples on the proxy's API.
fn metric(api: SocketAddr, family: &str) -> u64 {
    let (status, body) = testbed::http_get(api, "/metrics").expect("/metrics");
    assert_eq!(status, 200);
    body.lines()
        .filter(|l| l.starts_with(family) && l[family.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn api_opts(workers: usize) -> PoolOpts {
    PoolOpts {
        api: true,
        workers,
        ..PoolOpts::default()
    }
}

/// What one connection gets for `bytes`, read until `done` holds.
fn exchange(addr: SocketAddr, bytes: &[u8], done: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    let mut conn = Conn::open(addr);
    assert!(conn.send(bytes));
    conn.read_until(done, REPLY_LIMIT).bytes
}

fn binary(op: u8, extras: &[u8], key: &[u8], value: &[u8], opaque: u32) -> Vec<u8> {
    common::proxy::binary_request(op, key, extras, value, opaque, 0)
}

/// When a reply is whole.
type Done = fn(&[u8]) -> bool;

/// 128 or more noreply or quiet requests in a row once left the client's connection waiting
/// for good (and in CLOSE-WAIT after the client left): the reader waited for room that only a
/// reply of some bytes would make.
#[test]
fn bursts_of_noreply_and_quiet_requests_never_stall_a_connection() {
    let opts = api_opts(1);
    let cluster = Cluster::start(Front::Kvswitch, &opts);
    let api = cluster.proxy.api();
    for n in [127usize, 128, 200, 1000] {
        let text: Vec<u8> = (0..n)
            .flat_map(|i| format!("set burst:{n}:{i} 0 0 1 noreply\r\nx\r\n").into_bytes())
            .chain(format!("get burst:{n}:1\r\n").into_bytes())
            .collect();
        let meta: Vec<u8> = (0..n)
            .flat_map(|i| format!("ms mburst:{n}:{i} 1 q\r\ny\r\n").into_bytes())
            .chain(format!("mg mburst:{n}:1 v\r\n").into_bytes())
            .collect();
        let mut bin: Vec<u8> = (0..n)
            .flat_map(|i| binary(0x11, &[0; 8], format!("bburst:{n}:{i}").as_bytes(), b"z", 7))
            .collect();
        bin.extend(binary(
            0x00,
            b"",
            format!("bburst:{n}:1").as_bytes(),
            b"",
            9,
        ));
        let cases: [(&str, Vec<u8>, Done); 3] = [
            ("text noreply", text, |r| r.ends_with(b"END\r\n")),
            ("meta q", meta, |r| r.ends_with(b"\r\n")),
            ("binary SETQ", bin, |r| r.len() >= 25),
        ];
        for (name, bytes, done) in cases {
            let started = Instant::now();
            let got = exchange(cluster.addr(), &bytes, done);
            let want = exchange(cluster.reference.addr(), &bytes, done);
            assert!(
                !got.is_empty(),
                "{name} x{n}: no reply after {:?}",
                started.elapsed()
            );
            if name.starts_with("binary") {
                assert_eq!(
                    common::proxy::normalise_binary(&got),
                    common::proxy::normalise_binary(&want),
                    "{name} x{n}"
                );
                continue;
            }
            let (got, want) = (
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(&want),
            );
            assert_eq!(
                common::proxy::normalise_text(&got),
                common::proxy::normalise_text(&want),
                "{name} x{n}"
            );
        }
    }
    // Every connection above has gone; none may linger in the proxy.
    let deadline = Instant::now() + Duration::from_secs(5);
    while metric(api, "kvswitch_proxy_client_connections") > 0 {
        assert!(Instant::now() < deadline, "client connections left open");
        thread::sleep(Duration::from_millis(50));
    }
}

/// A data block memcached would read as commands once let one client run a command for
/// another's connection, or hand its reply to another client. Each reply must be memcached's
/// own, byte for byte, and the victim's item must survive.
#[test]
fn data_blocks_never_run_as_commands() {
    let opts = api_opts(1);
    let cluster = Cluster::start(Front::Kvswitch, &opts);
    let flags = ["T1"; 30].join(" ");
    let cases: Vec<Vec<u8>> = vec![
        // memcached refuses the line (too many flags) without swallowing the block.
        format!("ms k 7 {flags}\r\nget u10\r\n").into_bytes(),
        // memcached refuses the key and swallows the block.
        b"ms b!!!! 13 b\r\ndelete victim\r\n".to_vec(),
        b"ms k 15 T1 T1\r\ndelete victim\r\n\r\n".to_vec(),
        b"ms k 15 Z\r\ndelete victim\r\n\r\n".to_vec(),
        b"ms k 15 MX\r\ndelete victim\r\n\r\n".to_vec(),
        b"set k 0 0 4294967297\r\nxdelete victim\r\n".to_vec(),
    ];
    for bytes in &cases {
        for addr in [cluster.addr(), cluster.reference.addr()] {
            let setup = exchange(addr, b"set victim 0 0 6\r\nsecret\r\n", |r| {
                r.ends_with(b"\r\n")
            });
            assert_eq!(setup, b"STORED\r\n");
        }
        let mut request = bytes.clone();
        request.extend_from_slice(b"get victim\r\n");
        let done = |r: &[u8]| r.ends_with(b"secret\r\nEND\r\n");
        let got = exchange(cluster.addr(), &request, done);
        let want = exchange(cluster.reference.addr(), &request, done);
        assert_eq!(show(&got), show(&want), "{}", show(bytes));
        assert!(
            got.ends_with(b"VALUE victim 0 6\r\nsecret\r\nEND\r\n"),
            "{}: {}",
            show(bytes),
            show(&got)
        );
    }
}

/// memcached answers an unknown binary opcode at once and throws its body away as it comes,
/// however long the header says it is.
#[test]
fn an_unknown_binary_opcode_with_a_huge_body_is_answered_at_once() {
    let cluster = Cluster::start(Front::Kvswitch, &PoolOpts::default());
    let mut request = binary(0x50, b"", b"", b"", 0x0102_0304);
    request[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
    let done = |r: &[u8]| r.len() >= 24 + 15;
    let got = exchange(cluster.addr(), &request, done);
    let want = exchange(cluster.reference.addr(), &request, done);
    assert_eq!(got, want);
    assert_eq!(&got[..2], &[0x81, 0x50]);
    assert_eq!(&got[6..8], &[0, 0x81], "Unknown command");
    // The body goes on arriving and is thrown away; the connection still answers after it.
    let mut conn = Conn::open(cluster.addr());
    let mut short = binary(0x50, b"", b"", b"", 1);
    short[8..12].copy_from_slice(&1000u32.to_be_bytes());
    conn.send(&short);
    conn.send(&[b'j'; 1000]);
    conn.send(&binary(0x0a, b"", b"", b"", 0xfeed));
    let seen = conn.read_until(|r| r.len() >= 39 + 24, REPLY_LIMIT);
    assert_eq!(&seen.bytes[39..41], &[0x81, 0x0a], "{}", show(&seen.bytes));
}

/// A memcached-protocol server that answers `get poison` twice: a server that reads a request
/// otherwise than the proxy did. Every other key's value is its own name.
fn out_of_step_server(stop: Arc<AtomicBool>) -> (SocketAddr, thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("addr");
    let handle = thread::spawn(move || {
        let mut conns = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((stream, _)) => {
                    let stop = stop.clone();
                    conns.push(thread::spawn(move || serve_out_of_step(stream, &stop)));
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    thread::sleep(Duration::from_millis(5))
                }
                Err(_) => break,
            }
        }
        for c in conns {
            let _ = c.join();
        }
    });
    (addr, handle)
}

fn serve_out_of_step(mut stream: TcpStream, stop: &AtomicBool) {
    let _ = stream.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        match stream.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(_) => return,
        }
        let mut out = Vec::new();
        while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            let line = String::from_utf8_lossy(&line).trim_end().to_string();
            let words: Vec<&str> = line.split(' ').collect();
            match words.as_slice() {
                ["get", "poison"] => out.extend_from_slice(b"END\r\nEND\r\n"),
                ["get", key] => out.extend_from_slice(
                    format!("VALUE {key} 0 {}\r\n{key}\r\nEND\r\n", key.len()).as_bytes(),
                ),
                ["mg", _, opaque] => out.extend_from_slice(format!("EN {opaque}\r\n").as_bytes()),
                ["mn"] => out.extend_from_slice(b"MN\r\n"),
                _ => out.extend_from_slice(b"ERROR\r\n"),
            }
        }
        if stream.write_all(&out).is_err() {
            return;
        }
    }
}

/// Replies out of step with requests (here a server answering one request twice) must fail
/// the requests that shared the connection, never hand one client another's reply; the
/// connection is made again and later requests are answered.
#[test]
fn a_server_out_of_step_never_hands_a_reply_to_the_wrong_client() {
    let stop = Arc::new(AtomicBool::new(false));
    let (server, handle) = out_of_step_server(stop.clone());
    let opts = api_opts(1);
    let proxy = Proxy::start(Front::Kvswitch, &[("s1", server)], &opts);
    let api = proxy.api();
    let addr = proxy.addr;
    let poisoner_stop = stop.clone();
    let poisoner = thread::spawn(move || {
        let mut conn = Conn::open(addr);
        while !poisoner_stop.load(Ordering::Relaxed) {
            conn.send(b"get poison\r\n");
            let _ = conn.read_until(|r| r.ends_with(b"\r\n"), Duration::from_millis(200));
            thread::sleep(Duration::from_millis(2));
        }
    });
    let (mut answered, mut failed) = (0u64, 0u64);
    let clients: Vec<_> = (0..3)
        .map(|c| {
            thread::spawn(move || {
                let mut conn = Conn::open(addr);
                let (mut ok, mut errors) = (0u64, 0u64);
                for i in 0..400 {
                    let key = format!("own:{c}:{i}");
                    let want = format!("VALUE {key} 0 {}\r\n{key}\r\nEND\r\n", key.len());
                    // Pipelined, so that requests of several clients share batches.
                    let request = format!("get {key}\r\n").repeat(3);
                    let reply = conn.call(request.as_bytes(), |r| {
                        r.windows(2).filter(|w| w == b"\r\n").count() >= 3 * 3
                            || r.starts_with(b"SERVER_ERROR")
                    });
                    let text = String::from_utf8_lossy(&reply).into_owned();
                    if text == want.repeat(3) {
                        ok += 1;
                        continue;
                    }
                    // Only whole replies of its own key, or the proxy's error, may come back.
                    let mut rest = text.as_str();
                    while !rest.is_empty() {
                        if let Some(r) = rest.strip_prefix(want.as_str()) {
                            rest = r;
                        } else if rest.starts_with("SERVER_ERROR ") {
                            let end = rest.find("\r\n").map_or(rest.len(), |n| n + 2);
                            rest = &rest[end..];
                            errors += 1;
                        } else {
                            return Err(format!("client {c} got {text:?} for {key}"));
                        }
                    }
                    // Errors end the exchange early: read the rest on a fresh connection.
                    conn = Conn::open(addr);
                }
                Ok((ok, errors))
            })
        })
        .collect();
    let mut wrong = Vec::new();
    for c in clients {
        match c.join().expect("client") {
            Ok((ok, errors)) => {
                answered += ok;
                failed += errors;
            }
            Err(e) => wrong.push(e),
        }
    }
    stop.store(true, Ordering::Relaxed);
    poisoner.join().expect("poisoner");
    let out_of_step = metric(api, "kvswitch_proxy_server_out_of_step_total");
    drop(proxy);
    let _ = handle.join();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert!(out_of_step > 0, "the poisoned replies were never noticed");
    assert!(answered > 100, "{answered} answered, {failed} failed");
}

/// One client sends more than 10,000 malformed, mutated and crafted requests (text, meta and
/// binary, valid and not) while another sets and reads back keys of its own over the same
/// server connections: the honest client only ever sees its own replies, and no server
/// connection goes out of step.
#[test]
fn an_honest_client_only_ever_sees_its_own_replies() {
    let opts = api_opts(1);
    let cluster = Cluster::start(Front::Kvswitch, &opts);
    let api = cluster.proxy.api();
    let addr = cluster.addr();
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let hostile: Vec<_> = (0..2u64)
        .map(|h| {
            let (stop, sent) = (stop.clone(), sent.clone());
            thread::spawn(move || {
                let flags = ["T1"; 30].join(" ");
                let crafted = [
                    format!("ms k 7 {flags}\r\nget h:0\r\n").into_bytes(),
                    b"ms b!!!! 13 b\r\ndelete h:1\r\n".to_vec(),
                ];
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) && sent.load(Ordering::Relaxed) < 12_000 {
                    let Ok(mut stream) = TcpStream::connect(addr) else {
                        continue;
                    };
                    let _ = stream.set_read_timeout(Some(Duration::from_millis(2)));
                    let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
                    let mut sink = vec![0u8; 64 * 1024];
                    for _ in 0..20 {
                        i += 1;
                        let (bytes, requests) = if i.is_multiple_of(10) {
                            (crafted[(i / 10 % 2) as usize].clone(), 2)
                        } else {
                            let c = case(0xbad + h, i);
                            (c.bytes, c.requests)
                        };
                        if stream.write_all(&bytes).is_err() {
                            break;
                        }
                        sent.fetch_add(requests as u64, Ordering::Relaxed);
                        // Drain what came back, so the proxy keeps reading.
                        while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
                    }
                }
            })
        })
        .collect();
    let mut conn = Conn::open(addr);
    let mut rounds = 0u64;
    let deadline = Instant::now() + Duration::from_secs(120);
    while sent.load(Ordering::Relaxed) < 10_000 || rounds < 200 {
        assert!(
            Instant::now() < deadline,
            "out of time after {rounds} rounds"
        );
        let key = format!("h:{}", rounds % 4);
        let value = format!("honest-{rounds}");
        let request = format!("set {key} 0 0 {}\r\n{value}\r\nget {key}\r\n", value.len());
        let want = format!(
            "STORED\r\nVALUE {key} 0 {}\r\n{value}\r\nEND\r\n",
            value.len()
        );
        let reply = conn.call(request.as_bytes(), |r| r.ends_with(b"END\r\n"));
        assert_eq!(show(&reply), show(want.as_bytes()), "round {rounds}");
        rounds += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for h in hostile {
        h.join().expect("hostile client");
    }
    assert!(cluster.proxy_is_alive());
    assert_eq!(metric(api, "kvswitch_proxy_server_out_of_step_total"), 0);
    eprintln!(
        "{} hostile requests, {rounds} honest rounds",
        sent.load(Ordering::Relaxed)
    );
}

/// Clients that ask for many large values and leave without reading: the proxy's memory is
/// bounded while they are connected and handed back once they are gone, round after round.
/// Each round, 20 clients with small receive buffers ask for 120 values of 100 KB each.
#[test]
fn clients_that_leave_without_reading_give_their_memory_back() {
    let cluster = Cluster::start(Front::Kvswitch, &PoolOpts::default());
    let value = vec![b'v'; 100_000];
    let mut setup = Conn::open(cluster.addr());
    for i in 0..20 {
        let request = set_request(&format!("big{i}"), &value);
        assert_eq!(
            setup.call(&request, |r| r.ends_with(b"\r\n")),
            b"STORED\r\n"
        );
    }
    drop(setup);
    let request: Vec<u8> = (0..120)
        .flat_map(|i| format!("get big{}\r\n", i % 20).into_bytes())
        .collect();
    let start = cluster.proxy.rss_kib();
    let mut rounds = Vec::new();
    for _ in 0..3 {
        let clients: Vec<TcpStream> = (0..20)
            .map(|_| {
                let socket = std::net::TcpStream::connect(cluster.addr()).expect("connect");
                // A small receive buffer: the replies pile up in the proxy.
                testbed::local::set_recv_buffer(&socket, 4096);
                socket
            })
            .collect();
        for mut c in &clients {
            c.write_all(&request).expect("send");
        }
        thread::sleep(Duration::from_secs(2));
        let peak = cluster.proxy.rss_kib();
        drop(clients);
        thread::sleep(Duration::from_secs(2));
        rounds.push((peak, cluster.proxy.rss_kib()));
    }
    let end = cluster.proxy.rss_kib();
    eprintln!("RSS KiB: start {start}, rounds (peak, after) {rounds:?}, end {end}");
    assert!(cluster.proxy_is_alive());
    for (i, &(peak, after)) in rounds.iter().enumerate() {
        // 20 clients each with at most 128 replies of 100 KB in flight, and copies of them.
        assert!(peak < start + 700 * 1024, "round {i}: peak {peak} KiB");
        assert!(
            after < start + 64 * 1024,
            "round {i}: {after} KiB after the clients left"
        );
    }
}

/// A client that asks for more than the proxy holds for one (32 MiB of replies) and does not
/// read is disconnected, even while the proxy is blocked writing to it, and everything it held
/// is freed.
#[test]
fn a_client_past_its_limit_that_does_not_read_is_let_go() {
    let opts = api_opts(1);
    let cluster = Cluster::start(Front::Kvswitch, &opts);
    let api = cluster.proxy.api();
    let value = vec![b'm'; 1_000_000];
    let mut setup = Conn::open(cluster.addr());
    let request = set_request("huge", &value);
    assert_eq!(
        setup.call(&request, |r| r.ends_with(b"\r\n")),
        b"STORED\r\n"
    );
    drop(setup);
    let hog = TcpStream::connect(cluster.addr()).expect("connect");
    testbed::local::set_recv_buffer(&hog, 4096);
    (&hog).write_all(&b"get huge\r\n".repeat(60)).expect("send");
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(api, "kvswitch_proxy_clients_overflowed_total") == 0 {
        assert!(Instant::now() < deadline, "the hog was never let go");
        thread::sleep(Duration::from_millis(50));
    }
    // Its connection is gone from the proxy although the client never closed it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while metric(api, "kvswitch_proxy_client_connections") > 0 {
        assert!(
            Instant::now() < deadline,
            "the hog's connection is still held"
        );
        thread::sleep(Duration::from_millis(50));
    }
    // Others are served.
    let mut other = Conn::open(cluster.addr());
    let reply = other.call(b"get huge\r\n", |r| r.ends_with(b"END\r\n"));
    assert_eq!(
        reply.len(),
        value.len() + "VALUE huge 0 1000000\r\n\r\nEND\r\n".len()
    );
    drop(hog);
}
