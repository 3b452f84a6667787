//! The proxy under load and abuse: pipelined storms from many connections, multi-gets over all
//! servers, the largest values memcached takes, noreply and quiet commands in long pipelines,
//! malformed requests, clients that vanish mid-request or never read. Where memcached defines
//! the answer, the same bytes go to a reference memcached and the replies (and whether the
//! connection stays open) must match.
//!
//! The `harness_*` tests run the same checks with memcached itself or nutcracker in front.

mod common;

use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use testbed::differential::Rng;

use common::proxy::{
    binary_request, count, ends_with_sentinel, noop_sentinel, normalise_binary, normalise_text,
    packets, set_request, show, spread_keys, stat, text_replies, values_reply, Cluster, Conn,
    Front, PoolOpts,
};

/// A value that names its owner, so a reply crossed between clients is caught.
fn value(conn: usize, round: usize, slot: usize, len: usize) -> Vec<u8> {
    let tag = format!("<{conn}.{round}.{slot}>");
    tag.bytes().cycle().take(len).collect()
}

/// 32 connections, each sending pipelines of sets (some noreply), multi-gets, single gets and
/// deletes over all servers; every reply byte is checked.
fn storm(front: Front) {
    let cluster = Cluster::start(front, &PoolOpts::default());
    let addr = cluster.addr();
    let (conns, rounds, slots) = (32, 15, 8);
    let deadline = Instant::now() + Duration::from_secs(90);
    let workers: Vec<_> = (0..conns)
        .map(|c| {
            thread::spawn(move || {
                let mut rng = Rng::new(c as u64 + 1);
                let mut conn = Conn::open(addr);
                let keys: Vec<String> = (0..slots).map(|j| format!("storm:{c}:{j}")).collect();
                for round in 0..rounds {
                    if Instant::now() > deadline {
                        return Err(format!("conn {c}: out of time at round {round}"));
                    }
                    let mut request = Vec::new();
                    let mut expected = Vec::new();
                    let mut values = Vec::new();
                    for (j, k) in keys.iter().enumerate() {
                        let len = if rng.below(8) == 0 {
                            50_000
                        } else {
                            rng.below(3000)
                        };
                        let v = value(c, round, j, len);
                        if j % 3 == 0 {
                            request.extend_from_slice(
                                format!("set {k} 0 0 {} noreply\r\n", v.len()).as_bytes(),
                            );
                            request.extend_from_slice(&v);
                            request.extend_from_slice(b"\r\n");
                        } else {
                            request.extend(set_request(k, &v));
                            expected.extend_from_slice(b"STORED\r\n");
                        }
                        values.push(v);
                    }
                    let items: Vec<(&str, &[u8])> = keys
                        .iter()
                        .map(String::as_str)
                        .zip(values.iter().map(Vec::as_slice))
                        .collect();
                    request.extend_from_slice(
                        format!("get {} miss:{c}\r\n", keys.join(" ")).as_bytes(),
                    );
                    expected.extend(values_reply(&items));
                    for j in (0..slots).step_by(2) {
                        request.extend_from_slice(format!("get {}\r\n", keys[j]).as_bytes());
                        expected.extend(values_reply(&items[j..j + 1]));
                    }
                    let last = &keys[slots - 1];
                    request
                        .extend_from_slice(format!("delete {last}\r\nget {last}\r\n").as_bytes());
                    expected.extend_from_slice(b"DELETED\r\nEND\r\n");
                    let want = expected.len();
                    let reply = conn.call(&request, |r| r.len() >= want);
                    if reply != expected {
                        return Err(format!(
                            "conn {c} round {round}: got {} want {}",
                            show(&reply),
                            show(&expected)
                        ));
                    }
                }
                Ok(())
            })
        })
        .collect();
    for w in workers {
        if let Err(e) = w.join().expect("storm thread") {
            panic!("{front:?}: {e}\n{}", cluster.proxy.log_tail());
        }
    }
    assert!(cluster.proxy_is_alive(), "{front:?} died in the storm");
}

#[test]
fn pipelined_storm_from_many_connections() {
    storm(Front::Kvswitch);
}

#[test]
fn harness_storm_on_memcached() {
    storm(Front::Direct);
}

#[test]
fn harness_storm_on_nutcracker() {
    storm(Front::Nutcracker);
}

/// A multi-get over 150 keys on all servers, in scrambled order with misses and duplicates
/// (unless `distinct`: every key once, all hits), answers in the client's order; the binary
/// `GETKQ` pipeline likewise.
fn multi_get_order(front: Front, binary: bool, distinct: bool) {
    let cluster = Cluster::start(front, &PoolOpts::default());
    let keys = spread_keys(&cluster.ring, "order:", 50);
    let mut conn = Conn::open(cluster.addr());
    let mut request = Vec::new();
    for k in &keys {
        request.extend(set_request(k, k.repeat(3).as_bytes()));
    }
    let reply = conn.call(&request, |r| r.len() >= keys.len() * 8);
    assert_eq!(reply, b"STORED\r\n".repeat(keys.len()));

    let mut rng = Rng::new(7);
    let mut order: Vec<String> = Vec::new();
    while order.len() < 400 {
        let k = match rng.below(10) {
            0 if !distinct => format!("absent:{}", rng.below(1000)),
            _ => keys[rng.below(keys.len())].clone(),
        };
        if !(distinct && order.contains(&k)) {
            order.push(k);
        }
        if distinct && order.len() >= keys.len() {
            break;
        }
    }
    let values: Vec<String> = order.iter().map(|k| k.repeat(3)).collect();
    let hits: Vec<(&str, &[u8])> = order
        .iter()
        .zip(&values)
        .filter(|(k, _)| !k.starts_with("absent:"))
        .map(|(k, v)| (k.as_str(), v.as_bytes()))
        .collect();
    let expected = values_reply(&hits);
    let reply = conn.call(format!("get {}\r\n", order.join(" ")).as_bytes(), |r| {
        r.len() >= expected.len()
    });
    if reply != expected {
        let at = reply
            .iter()
            .zip(&expected)
            .take_while(|(a, b)| a == b)
            .count();
        panic!(
            "{front:?}: differs at byte {at} of {}: got {}, want {}",
            expected.len(),
            show(&reply[at.saturating_sub(100)..]),
            show(&expected[at.saturating_sub(100)..])
        );
    }

    if binary {
        let mut conn = Conn::open(cluster.addr());
        let mut request = Vec::new();
        for (i, k) in order.iter().enumerate() {
            request.extend(binary_request(0x0d, k.as_bytes(), b"", b"", i as u32, 0));
        }
        request.extend(noop_sentinel());
        let reply = conn.call(&request, ends_with_sentinel);
        let got: Vec<(u32, Vec<u8>)> = packets(&reply)
            .iter()
            .filter(|p| p[1] == 0x0d)
            .map(|p| {
                let key_len = u16::from_be_bytes([p[2], p[3]]) as usize;
                let extras = p[4] as usize;
                let opaque = u32::from_be_bytes([p[12], p[13], p[14], p[15]]);
                (opaque, p[24 + extras..24 + extras + key_len].to_vec())
            })
            .collect();
        let want: Vec<(u32, Vec<u8>)> = order
            .iter()
            .enumerate()
            .filter(|(_, k)| !k.starts_with("absent:"))
            .map(|(i, k)| (i as u32, k.as_bytes().to_vec()))
            .collect();
        assert_eq!(got, want, "{front:?}: binary GETKQ order");
    }
}

#[test]
fn multi_gets_answer_in_the_clients_key_order() {
    multi_get_order(Front::Kvswitch, true, false);
}

#[test]
fn harness_multi_get_order_on_memcached_and_nutcracker() {
    multi_get_order(Front::Direct, true, false);
    // nutcracker 0.5.0 answers a multi-get with misses or repeated keys out of order; the
    // proxy must not, so only the plain form proves the harness on it.
    multi_get_order(Front::Nutcracker, false, true);
}

/// The largest value memcached stores under `key` with default settings, found by bisection.
fn largest_value(addr: SocketAddr, key: &str) -> usize {
    let mut conn = Conn::open(addr);
    let (mut ok, mut too_big) = (1000, 1 << 20);
    while too_big - ok > 1 {
        let mid = (ok + too_big) / 2;
        let reply = conn.call(&set_request(key, &vec![b'x'; mid]), |r| {
            r.ends_with(b"\r\n")
        });
        if reply == b"STORED\r\n" {
            ok = mid;
        } else {
            too_big = mid;
        }
    }
    ok
}

/// The reply to a `set` of `len` bytes followed by a `get` of the key, and whether the
/// connection still answers afterwards.
fn set_then_get(addr: SocketAddr, key: &str, len: usize) -> (Vec<u8>, bool) {
    let mut conn = Conn::open(addr);
    let value: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
    let mut request = set_request(key, &value);
    request.extend_from_slice(format!("get {key}\r\n").as_bytes());
    let reply = conn.call(&request, |r| text_replies(r) >= 2);
    let open = conn.call(b"get nothing\r\n", |r| r.ends_with(b"END\r\n")) == b"END\r\n";
    (reply, open)
}

fn large_values(front: Front) {
    let cluster = Cluster::start(front, &PoolOpts::default());
    let keys = spread_keys(&cluster.ring, "big:", 1);
    for key in &keys {
        let max = largest_value(cluster.reference.addr(), key);
        assert!(
            max > 1_000_000 && max < 1 << 20,
            "memcached's largest value {max}"
        );
        // A refused set drops the value it would have replaced: right after a stored one, a
        // value past what the proxy forwards must leave the key empty, as memcached does.
        for len in [max - 1, max, (1 << 20) + 1, max + 1, 1 << 20, (1 << 20) + 1] {
            let want = set_then_get(cluster.reference.addr(), key, len);
            let got = set_then_get(cluster.addr(), key, len);
            assert!(
                got == want,
                "{front:?}: {len} bytes under {key}: got {} (open {}), want {} (open {})",
                show(&got.0),
                got.1,
                show(&want.0),
                want.1
            );
            if len <= max {
                assert!(got.0.starts_with(b"STORED\r\nVALUE "), "{len}");
            } else {
                assert!(
                    got.0
                        .starts_with(b"SERVER_ERROR object too large for cache\r\n"),
                    "{len}"
                );
            }
        }
    }
}

/// Binary SET around the limit: the same status and the same connection state.
fn large_binary_values(front: Front) {
    let cluster = Cluster::start(front, &PoolOpts::default());
    let key = &spread_keys(&cluster.ring, "bbig:", 1)[2];
    let max = largest_value(cluster.reference.addr(), key);
    for len in [max, (1 << 20) + 1, max + 1, max + 2, (1 << 20) + 1] {
        let run = |addr| {
            let mut conn = Conn::open(addr);
            let value = vec![b'b'; len];
            let mut request = binary_request(0x01, key.as_bytes(), &[0; 8], &value, 5, 0);
            request.extend(binary_request(0x00, key.as_bytes(), b"", b"", 6, 0));
            request.extend(noop_sentinel());
            let reply = conn.call(&request, ends_with_sentinel);
            normalise_binary(&reply)
        };
        assert_eq!(
            run(cluster.addr()),
            run(cluster.reference.addr()),
            "{front:?}: {len} bytes"
        );
    }
}

#[test]
fn the_largest_values_and_one_byte_more_are_answered_as_memcached_does() {
    large_values(Front::Kvswitch);
    large_binary_values(Front::Kvswitch);
}

#[test]
fn harness_large_values_on_memcached_and_nutcracker() {
    large_values(Front::Direct);
    large_binary_values(Front::Direct);
    large_values(Front::Nutcracker);
}

/// A long pipeline of random text and meta commands over 24 keys on all servers, many of them
/// noreply or quiet, sent in one write; the whole reply must equal memcached's.
fn text_pipeline(seed: u64, keys: &[String], n: usize) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    for i in 0..n {
        let k = &keys[rng.below(keys.len())];
        let noreply = if rng.below(3) == 0 { " noreply" } else { "" };
        let q = if rng.below(3) == 0 { " q" } else { "" };
        let len = if rng.below(20) == 0 {
            20_000
        } else {
            rng.below(200)
        };
        let v: Vec<u8> = value(0, i, 0, len);
        let line = match rng.below(16) {
            0 | 1 => format!("set {k} {} 0 {len}{noreply}\r\n", rng.below(5)),
            2 => format!("add {k} 0 0 {len}{noreply}\r\n"),
            3 => format!("append {k} 0 0 {len}{noreply}\r\n"),
            4 => format!("delete {k}{noreply}\r\n"),
            5 => format!("incr {k} {}{noreply}\r\n", rng.below(100)),
            6 => format!("touch {k} 1000{noreply}\r\n"),
            7 => {
                let more: Vec<&str> = (0..rng.below(6))
                    .map(|_| keys[rng.below(keys.len())].as_str())
                    .collect();
                format!("get {k} {}\r\n", more.join(" "))
            }
            8 => format!("gets {k} {}\r\n", keys[rng.below(keys.len())]),
            9 => format!("mg {k} v k f{q} O{i}\r\n"),
            10 => format!("mg {k} s{q}\r\n"),
            11 => format!("ms {k} {len} T0 F{i}{q}\r\n"),
            12 => format!("md {k}{q} O{i}\r\n"),
            13 => format!("ma {k} N0 J{i} v{q}\r\n"),
            14 => format!("set {k} 0 0 {len}\r\n"),
            _ => "mn\r\n".to_string(),
        };
        out.extend_from_slice(line.as_bytes());
        if line.starts_with("set")
            || line.starts_with("add")
            || line.starts_with("append")
            || line.starts_with("ms")
        {
            out.extend_from_slice(&v);
            out.extend_from_slice(b"\r\n");
        }
    }
    out
}

/// The same for binary: quiet and loud commands mixed, closed by a `NOOP`.
fn binary_pipeline(seed: u64, keys: &[String], n: usize) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    let delta: &[u8] = &[0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];
    for i in 0..n {
        let k = keys[rng.below(keys.len())].as_bytes();
        let v = value(1, i, 0, rng.below(300));
        let o = i as u32;
        let p = match rng.below(14) {
            0 => binary_request(0x01, k, &[0, 0, 0, 9, 0, 0, 0, 0], &v, o, 0),
            1 => binary_request(0x11, k, &[0; 8], &v, o, 0),
            2 => binary_request(0x12, k, &[0; 8], &v, o, 0),
            3 => binary_request(0x13, k, &[0; 8], &v, o, 0),
            4 => binary_request(0x19, k, b"", &v, o, 0),
            5 => binary_request(0x00, k, b"", b"", o, 0),
            6 => binary_request(0x09, k, b"", b"", o, 0),
            7 => binary_request(0x0d, k, b"", b"", o, 0),
            8 => binary_request(0x0c, k, b"", b"", o, 0),
            9 => binary_request(0x14, k, b"", b"", o, 0),
            10 => binary_request(0x15, k, delta, b"", o, 0),
            11 => binary_request(0x1e, k, &[0, 0, 3, 0], b"", o, 0),
            12 => binary_request(0x04, k, b"", b"", o, 0),
            _ => binary_request(0x0a, b"", b"", b"", o, 0),
        };
        out.extend(p);
    }
    out.extend(noop_sentinel());
    out
}

fn pipelines(front: Front) {
    let cluster = Cluster::start(front, &PoolOpts::default());
    let keys = spread_keys(&cluster.ring, "pipe:", 8);
    for seed in 1..=3 {
        let text = text_pipeline(seed, &keys, 1500);
        let sentinels = count(&text, b"mn\r\n") + 1;
        let run = |addr| {
            let mut conn = Conn::open(addr);
            let reply = conn.text(&text);
            assert_eq!(count(&reply, b"MN\r\n") + 1, sentinels);
            normalise_text(&String::from_utf8_lossy(&reply))
        };
        let (want, got) = (run(cluster.reference.addr()), run(cluster.addr()));
        if got != want {
            let at = got
                .bytes()
                .zip(want.bytes())
                .take_while(|(a, b)| a == b)
                .count();
            panic!(
                "{front:?}: text pipeline {seed} differs at byte {at}: got {:?}, want {:?}",
                &got[at.saturating_sub(200)..(at + 200).min(got.len())],
                &want[at.saturating_sub(200)..(at + 200).min(want.len())]
            );
        }
        let binary = binary_pipeline(seed, &keys, 1500);
        let run = |addr| {
            let mut conn = Conn::open(addr);
            normalise_binary(&conn.call(&binary, ends_with_sentinel))
        };
        let (want, got) = (run(cluster.reference.addr()), run(cluster.addr()));
        assert_eq!(
            got.len(),
            want.len(),
            "{front:?}: binary pipeline {seed} reply count"
        );
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "{front:?}: binary pipeline {seed} reply {i}");
        }
    }
}

#[test]
fn noreply_and_quiet_commands_interleave_in_long_pipelines() {
    pipelines(Front::Kvswitch);
}

#[test]
fn harness_pipelines_on_memcached() {
    pipelines(Front::Direct);
}

/// How a connection ends up after a request.
#[derive(Debug, PartialEq)]
struct Outcome {
    reply: String,
    closed: bool,
}

#[derive(Clone, Copy, PartialEq)]
enum Sentinel {
    Text,
    Binary,
    /// Send the bytes alone and wait for a reply or a close.
    None,
}

/// Sends `bytes` (and the sentinel) on a fresh connection and records what comes back. A
/// sentinel swallowed as data is sent once more.
fn outcome(addr: SocketAddr, bytes: &[u8], sentinel: Sentinel) -> Outcome {
    let mut conn = Conn::open(addr);
    type Done = fn(&[u8]) -> bool;
    let (tail, done): (Vec<u8>, Done) = match sentinel {
        Sentinel::Text => (b"mn\r\n".to_vec(), |r| r.ends_with(b"MN\r\n")),
        Sentinel::Binary => (noop_sentinel(), ends_with_sentinel),
        Sentinel::None => (Vec::new(), |_| false),
    };
    let mut request = bytes.to_vec();
    request.extend_from_slice(&tail);
    conn.send(&request);
    let mut seen = conn.read_until(done, Duration::from_millis(1500));
    if seen.timed_out && sentinel != Sentinel::None {
        conn.send(&tail);
        let more = conn.read_until(done, Duration::from_millis(1500));
        seen.bytes.extend(more.bytes);
        seen.closed = more.closed;
    }
    let reply = match sentinel {
        Sentinel::Binary => format!("{:?}", normalise_binary(&seen.bytes)),
        _ => String::from_utf8_lossy(&seen.bytes).into_owned(),
    };
    Outcome {
        reply,
        closed: seen.closed,
    }
}

fn malformed_cases() -> Vec<(&'static str, Vec<u8>, Sentinel)> {
    let long = "k".repeat(251);
    let max = "k".repeat(250);
    let text = |s: String| s.into_bytes();
    let bin = binary_request;
    let mut noop_then = bin(0x0a, b"", b"", b"", 1, 0);
    noop_then.extend_from_slice(b"version\r\nversion\r\nversion\r\n");
    let mut noop_then_bad_magic = bin(0x0a, b"", b"", b"", 1, 0);
    noop_then_bad_magic.extend_from_slice(&[0x81; 24]);
    let mut key_past_body = bin(0x00, b"abcde", b"", b"", 1, 0);
    key_past_body[2..4].copy_from_slice(&10u16.to_be_bytes());
    let mut set_then_binary = text("set k 0 0 1\r\na\r\n".into());
    set_then_binary.extend(bin(0x0a, b"", b"", b"", 1, 0));
    vec![
        ("unknown command", text("bogus\r\n".into()), Sentinel::Text),
        (
            "upper-case command",
            text("GET k\r\n".into()),
            Sentinel::Text,
        ),
        ("empty line", text("\r\n".into()), Sentinel::Text),
        ("key of 250", text(format!("get {max}\r\n")), Sentinel::Text),
        (
            "get key of 251",
            text(format!("get {long}\r\n")),
            Sentinel::Text,
        ),
        (
            "second key of 251",
            text(format!("get a {long}\r\n")),
            Sentinel::Text,
        ),
        (
            "set key of 251",
            text(format!("set {long} 0 0 1\r\na\r\n")),
            Sentinel::Text,
        ),
        (
            "delete key of 251",
            text(format!("delete {long}\r\n")),
            Sentinel::Text,
        ),
        (
            "incr key of 251",
            text(format!("incr {long} 1\r\n")),
            Sentinel::Text,
        ),
        (
            "touch key of 251",
            text(format!("touch {long} 1\r\n")),
            Sentinel::Text,
        ),
        (
            "gat key of 251",
            text(format!("gat 0 {long}\r\n")),
            Sentinel::Text,
        ),
        (
            "mg key of 251",
            text(format!("mg {long} v\r\n")),
            Sentinel::Text,
        ),
        (
            "ms key of 251",
            text(format!("ms {long} 1\r\na\r\n")),
            Sentinel::Text,
        ),
        (
            "md key of 251",
            text(format!("md {long}\r\n")),
            Sentinel::Text,
        ),
        (
            "key of 3000",
            text(format!("get {}\r\n", "k".repeat(3000))),
            Sentinel::Text,
        ),
        (
            "more data than said",
            text("set k 0 0 3\r\nabcd\r\n".into()),
            Sentinel::Text,
        ),
        (
            "less data than said",
            text("set k 0 0 5\r\nabc\r\n".into()),
            Sentinel::Text,
        ),
        (
            "negative length",
            text("set k 0 0 -1\r\n".into()),
            Sentinel::Text,
        ),
        (
            "non-numeric flags",
            text("set k abc 0 1\r\na\r\n".into()),
            Sentinel::Text,
        ),
        (
            "non-numeric exptime",
            text("set k 0 abc 1\r\na\r\n".into()),
            Sentinel::Text,
        ),
        (
            "extra token",
            text("set k 0 0 1 garbage\r\na\r\n".into()),
            Sentinel::Text,
        ),
        (
            "too many tokens",
            text("incr k 1 2 3\r\n".into()),
            Sentinel::Text,
        ),
        (
            "bare line feeds",
            text("set k 0 0 1\na\r\nget k\n".into()),
            Sentinel::Text,
        ),
        (
            "control bytes in key",
            text("get a\x7fb\r\n".into()),
            Sentinel::Text,
        ),
        ("meta bad flag", text("mg k zz\r\n".into()), Sentinel::Text),
        (
            "meta bad base64",
            text("mg bWtleQ b v\r\n".into()),
            Sentinel::Text,
        ),
        (
            "long line ended",
            text(format!("{}\r\n", "x".repeat(3000))),
            Sentinel::Text,
        ),
        (
            "long line without end",
            text("x".repeat(3000)),
            Sentinel::None,
        ),
        ("binary after text", set_then_binary, Sentinel::Text),
        (
            "binary unknown opcode with body",
            bin(0x50, b"", b"", b"body", 1, 0),
            Sentinel::Binary,
        ),
        (
            "binary key of 251",
            bin(0x00, long.as_bytes(), b"", b"", 1, 0),
            Sentinel::Binary,
        ),
        ("binary key past body", key_past_body, Sentinel::Binary),
        (
            "binary set without extras",
            bin(0x01, b"k", b"", b"v", 1, 0),
            Sentinel::Binary,
        ),
        (
            "binary get with extras",
            bin(0x00, b"k", &[0; 4], b"", 1, 0),
            Sentinel::Binary,
        ),
        ("text after binary", noop_then, Sentinel::None),
        (
            "bad magic after binary",
            noop_then_bad_magic,
            Sentinel::None,
        ),
    ]
}

fn malformed(front: Front) {
    let cluster = Cluster::start(front, &PoolOpts::default());
    let mut failures = Vec::new();
    for (name, bytes, sentinel) in malformed_cases() {
        let want = outcome(cluster.reference.addr(), &bytes, sentinel);
        let got = outcome(cluster.addr(), &bytes, sentinel);
        if got != want {
            failures.push(format!("{name}: got {got:?}, want {want:?}"));
        }
    }
    assert!(failures.is_empty(), "{front:?}:\n{}", failures.join("\n"));
    assert!(cluster.proxy_is_alive());
}

#[test]
fn malformed_requests_get_memcacheds_reply_and_connection_state() {
    malformed(Front::Kvswitch);
}

#[test]
fn harness_malformed_requests_on_memcached() {
    malformed(Front::Direct);
}

/// Clients that send part of a request and hang up: nothing is stored, nothing leaks to the
/// servers, and everyone else is served.
fn half_requests(front: Front) {
    let cluster = Cluster::start(front, &PoolOpts::default());
    let keys = spread_keys(&cluster.ring, "half:", 2);
    let partials: Vec<Vec<u8>> = vec![
        format!("set {} 0 0 10\r\nabc", keys[0]).into_bytes(),
        format!("set {} 0 0 10", keys[1]).into_bytes(),
        format!("get {} {}", keys[2], keys[3]).into_bytes(),
        b"\x80\x01\x00\x05\x08\x00".to_vec(),
        binary_request(0x01, keys[4].as_bytes(), &[0; 8], b"0123456789", 1, 0)[..40].to_vec(),
        format!("ms {} 10 T0\r\n01234", keys[5]).into_bytes(),
    ];
    let mut served = Conn::open(cluster.addr());
    for round in 0..40 {
        for p in &partials {
            let mut c = Conn::open(cluster.addr());
            assert!(c.send(p));
        }
        let v = format!("round{round}");
        let reply = served.call(
            &[
                set_request(&keys[round % 6], v.as_bytes()),
                format!("get {}\r\n", keys[round % 6]).into_bytes(),
            ]
            .concat(),
            |r| r.ends_with(b"END\r\n"),
        );
        assert_eq!(
            reply,
            [
                b"STORED\r\n".to_vec(),
                values_reply(&[(&keys[round % 6], v.as_bytes())])
            ]
            .concat()
        );
    }
    // The partial sets stored nothing: each key holds what the full client set last.
    let mut fresh = Conn::open(cluster.addr());
    for (i, k) in keys.iter().enumerate() {
        let reply = fresh.call(format!("get {k}\r\n").as_bytes(), |r| {
            r.ends_with(b"END\r\n")
        });
        let last = (0..40)
            .rev()
            .find(|r| r % 6 == i)
            .map(|r| format!("round{r}"));
        let want = match &last {
            Some(v) => values_reply(&[(k, v.as_bytes())]),
            None => b"END\r\n".to_vec(),
        };
        assert_eq!(reply, want, "{front:?}: {k}");
    }
    assert!(cluster.proxy_is_alive());
    if front != Front::Direct {
        // 240 abandoned clients must not have become 240 server connections.
        for (i, s) in cluster.servers.iter().enumerate() {
            let stats = Conn::open(s.addr()).call(b"stats\r\n", |r| r.ends_with(b"END\r\n"));
            let open = stat(&stats, "curr_connections").expect("curr_connections");
            assert!(open < 40, "{front:?}: server {i} has {open} connections");
        }
    }
}

#[test]
fn clients_that_vanish_mid_request_leave_nothing_behind() {
    half_requests(Front::Kvswitch);
}

#[test]
fn harness_half_requests_on_memcached_and_nutcracker() {
    half_requests(Front::Direct);
    half_requests(Front::Nutcracker);
}

/// Serialises the tests that load the machine with a gigabyte of replies, so that one does not
/// starve the other of CPU and skew its timing.
fn heavy() -> std::sync::MutexGuard<'static, ()> {
    static HEAVY: std::sync::Mutex<()> = std::sync::Mutex::new(());
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a never-reading client did to the proxy.
struct Hogged {
    /// Peak RSS growth while the client was connected, MiB.
    growth_mib: u64,
    /// The slowest set-and-get of another client meanwhile.
    slowest: Duration,
}

/// A client pipelines gets of a 64 KiB value and never reads: the proxy must stop reading it
/// instead of buffering replies without bound, and keep serving everyone else.
fn never_reads(front: Front) -> Hogged {
    let _alone = heavy();
    let cluster = Cluster::start(front, &PoolOpts::default());
    let keys = spread_keys(&cluster.ring, "slow:", 1);
    let big = vec![b'z'; 64 << 10];
    let mut setup = Conn::open(cluster.addr());
    for k in &keys {
        let reply = setup.call(&set_request(k, &big), |r| r.ends_with(b"\r\n"));
        assert_eq!(reply, b"STORED\r\n");
    }
    let before = cluster.proxy.rss_kib();

    // 16,000 gets ask for 1 GiB of replies; the writer stops when the proxy stops reading.
    let mut hog = Conn::open(cluster.addr());
    hog.stream
        .set_write_timeout(Some(Duration::from_secs(2)))
        .expect("write timeout");
    let request = format!("get {}\r\n", keys.join(" ")).repeat(16_000 / keys.len());
    let writer = thread::spawn(move || {
        let _ = std::io::Write::write_all(&mut hog.stream, request.as_bytes());
        hog
    });

    let mut peak = before;
    let mut slowest = Duration::ZERO;
    let until = Instant::now() + Duration::from_secs(4);
    let mut other = Conn::open(cluster.addr());
    let mut n = 0;
    while Instant::now() < until {
        let t = Instant::now();
        let v = n.to_string();
        let mut request = set_request("other", v.as_bytes());
        request.extend_from_slice(b"get other\r\n");
        other.send(&request);
        let reply = other
            .read_until(|r| r.ends_with(b"END\r\n"), common::proxy::REPLY_LIMIT)
            .bytes;
        let want = [
            b"STORED\r\n".to_vec(),
            values_reply(&[("other", v.as_bytes())]),
        ]
        .concat();
        assert!(
            reply == want,
            "{front:?}: another client's set and get, after {:?}: {}",
            t.elapsed(),
            show(&reply)
        );
        slowest = slowest.max(t.elapsed());
        peak = peak.max(cluster.proxy.rss_kib());
        n += 1;
        thread::sleep(Duration::from_millis(100));
    }
    let hog = writer.join().expect("writer");
    peak = peak.max(cluster.proxy.rss_kib());
    drop(hog);
    // Once the hog is gone, the last value written is read back on a new connection.
    let last = (n - 1).to_string();
    let mut after = Conn::open(cluster.addr());
    assert_eq!(
        after.call(b"get other\r\n", |r| r.ends_with(b"END\r\n")),
        values_reply(&[("other", last.as_bytes())])
    );
    assert!(cluster.proxy_is_alive());
    Hogged {
        growth_mib: peak.saturating_sub(before) >> 10,
        slowest,
    }
}

/// A proxy may hold a few MiB per client and per server connection; a proxy that buffers
/// everything it was asked for grows by hundreds of MiB here.
const GROWTH_LIMIT_MIB: u64 = 200;

/// Another client's set and get may wait this long while the hog is connected.
const SLOWEST_OTHER: Duration = Duration::from_millis(500);

#[test]
fn a_client_that_never_reads_does_not_grow_the_proxy() {
    let h = never_reads(Front::Kvswitch);
    assert!(
        h.growth_mib < GROWTH_LIMIT_MIB,
        "the proxy grew by {} MiB",
        h.growth_mib
    );
    assert!(h.slowest < SLOWEST_OTHER, "others waited {:?}", h.slowest);
}

#[test]
fn harness_never_reading_client_on_memcached() {
    let h = never_reads(Front::Direct);
    assert!(
        h.growth_mib < GROWTH_LIMIT_MIB,
        "memcached grew by {} MiB",
        h.growth_mib
    );
    assert!(h.slowest < SLOWEST_OTHER, "others waited {:?}", h.slowest);
}

/// Hundreds of connections at once: each is answered.
fn many_connections(front: Front) {
    let cluster = Cluster::start(front, &PoolOpts::default());
    let keys = spread_keys(&cluster.ring, "many:", 1);
    let mut setup = Conn::open(cluster.addr());
    for k in &keys {
        assert_eq!(
            setup.call(&set_request(k, k.as_bytes()), |r| r.ends_with(b"\r\n")),
            b"STORED\r\n"
        );
    }
    let mut conns: Vec<Conn> = (0..300).map(|_| Conn::open(cluster.addr())).collect();
    let request = format!("get {}\r\n", keys.join(" "));
    for c in &mut conns {
        assert!(c.send(request.as_bytes()));
    }
    let items: Vec<(&str, &[u8])> = keys.iter().map(|k| (k.as_str(), k.as_bytes())).collect();
    let want = values_reply(&items);
    for (i, c) in conns.iter_mut().enumerate() {
        let got = c.read_until(|r| r.len() >= want.len(), Duration::from_secs(5));
        assert!(
            got.bytes == want,
            "{front:?}: connection {i}: {}",
            show(&got.bytes)
        );
    }
}

#[test]
fn hundreds_of_connections_are_served() {
    many_connections(Front::Kvswitch);
}

#[test]
fn harness_many_connections_on_memcached_and_nutcracker() {
    many_connections(Front::Direct);
    many_connections(Front::Nutcracker);
}

/// The RSS bound catches a proxy that buffers what a client does not read: nutcracker does.
#[test]
fn harness_rss_bound_catches_nutcracker_buffering() {
    let _alone = heavy();
    let cluster = Cluster::start(Front::Nutcracker, &PoolOpts::default());
    let keys = spread_keys(&cluster.ring, "slow:", 1);
    let big = vec![b'z'; 64 << 10];
    let mut setup = Conn::open(cluster.addr());
    for k in &keys {
        setup.call(&set_request(k, &big), |r| r.ends_with(b"\r\n"));
    }
    let before = cluster.proxy.rss_kib();
    let mut hog = Conn::open(cluster.addr());
    hog.stream
        .set_write_timeout(Some(Duration::from_secs(15)))
        .expect("write timeout");
    let request = format!("get {}\r\n", keys.join(" ")).repeat(16_000 / keys.len());
    let writer = thread::spawn(move || {
        let _ = std::io::Write::write_all(&mut hog.stream, request.as_bytes());
        hog
    });
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut growth = 0;
    while growth < GROWTH_LIMIT_MIB && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
        growth = cluster.proxy.rss_kib().saturating_sub(before) >> 10;
    }
    drop(cluster);
    drop(writer.join().expect("writer"));
    assert!(
        growth >= GROWTH_LIMIT_MIB,
        "nutcracker grew by only {growth} MiB"
    );
}
