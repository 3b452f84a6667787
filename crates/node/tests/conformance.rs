//! The node answers like memcached 1.6: the same raw requests go to a real memcached and to the
//! node over TCP, and the replies must be byte-identical once CAS values, TTLs that may tick and
//! version strings are masked.

mod common;

use std::net::{SocketAddr, TcpStream};

use common::{connect, exchange, node, Memcached};
use testbed::replies::{ends_with_sentinel, last_cas, normalise_binary, normalise_text, SENTINEL};

/// Text and meta requests, one exchange each. `{cas}` is replaced by the last CAS value that
/// server returned.
const TEXT: &[&str] = &[
    "get a\r\n",
    "set a 5 0 3\r\nabc\r\n",
    "get a\r\n",
    "gets a\r\n",
    "set b 0 0 1 noreply\r\nx\r\n",
    "get a b c\r\n",
    "gets a zz b\r\n",
    "add a 0 0 1\r\nz\r\n",
    "add c 0 0 1\r\nz\r\n",
    "replace d 0 0 1\r\nz\r\n",
    "replace c 3 0 2\r\nzz\r\n",
    "append a 0 0 2\r\nde\r\n",
    "prepend a 9 0 2\r\n01\r\n",
    "append nope 0 0 1\r\nx\r\n",
    "prepend nope 0 0 1 noreply\r\nx\r\n",
    "get a\r\n",
    "gets c\r\n",
    "cas c 0 0 1 {cas}\r\nq\r\n",
    "cas c 0 0 1 {cas}\r\nr\r\n",
    "cas c 0 0 1 0\r\nr\r\n",
    "cas zz 0 0 1 5\r\nq\r\n",
    "get c\r\n",
    "delete c\r\n",
    "delete c\r\n",
    "delete b noreply\r\n",
    "delete a 0\r\n",
    "delete a 5\r\n",
    "get a b\r\n",
    "set n 0 0 3\r\n100\r\n",
    "incr n 5\r\n",
    "decr n 100\r\n",
    "get n\r\n",
    "decr n 10\r\n",
    "incr n 18446744073709551615\r\n",
    "incr n 2\r\n",
    "incr n 1 noreply\r\n",
    "get n\r\n",
    "incr nope 1\r\n",
    "decr nope 1\r\n",
    "set s 0 0 2\r\nab\r\n",
    "incr s 1\r\n",
    "incr n abc\r\n",
    "touch n 100\r\n",
    "touch zz 10\r\n",
    "gat 100 n s zz\r\n",
    "gats 0 n\r\n",
    "gat 10\r\n",
    "set e 0 -1 1\r\nx\r\n",
    "get e\r\n",
    "set big 4294967295 0 0\r\n\r\n",
    "get big\r\n",
    "bogus\r\n",
    "get\r\n",
    "set k 0 0\r\n",
    "incr n\r\n",
    "touch n abc\r\n",
    "gat abc n\r\n",
    "flush_all abc\r\n",
    "set a 0 0 2\r\nabc\r\n",
    "verbosity 1\r\n",
    "ms m1 3\r\nabc\r\n",
    "ms m1 3 T0 F7 k O123\r\nxyz\r\n",
    "ms m1 3 c\r\nxyz\r\n",
    "mg m1 v\r\n",
    "mg m1 s v f t k O99\r\n",
    "mg m1\r\n",
    "mg m1 c f\r\n",
    "mg miss v\r\n",
    "mg miss v q\r\n",
    "mg miss k O5\r\n",
    "mg m1 q k\r\n",
    "mg m1 q v\r\n",
    "ms m2 2 MA\r\nzz\r\n",
    "ms m1 2 MA\r\nzz\r\n",
    "ms m1 2 MP k\r\naa\r\n",
    "ms m1 1 ME\r\nq\r\n",
    "ms m9 1 MR O1\r\nq\r\n",
    "ms m1 1 q\r\nr\r\n",
    "ms m2 1 q MR\r\nr\r\n",
    "mg m1 v\r\n",
    "ms m3 1 T100\r\nt\r\n",
    "mg m3 t v\r\n",
    "mg m3 T0 t\r\n",
    "ms m1 2 C1\r\nzz\r\n",
    "mg m1 c\r\n",
    "ms m1 2 C{cas}\r\nzz\r\n",
    "ms m4 2 C5\r\nzz\r\n",
    "md m1 q\r\n",
    "md m1\r\n",
    "md m1 q\r\n",
    "md m3 k O1\r\n",
    "md m3 O2 k\r\n",
    "mn\r\n",
    "ms bWtleQ== 2 b\r\nhi\r\n",
    "mg bWtleQ== b v k\r\n",
    "get mkey\r\n",
    "mg a=b v\r\n",
    "set n2 0 0 2\r\n10\r\n",
    "flush_all\r\n",
    "get n2 mkey\r\n",
    "flush_all noreply\r\n",
    "flush_all 0\r\n",
    // Errors on a line ending in noreply are silent once memcached has read that token.
    "set k 0 0 3 noreply\r\nabcd\r\n",
    "set k 0 0 abc noreply\r\n",
    "set k 0 0 3 x noreply\r\n",
    "incr n x noreply\r\n",
    "delete k 1 noreply\r\n",
    "touch n x noreply\r\n",
    "flush_all noreply x\r\n",
    "verbosity x\r\n",
    "verbosity x noreply\r\n",
    "verbosity 1 2 3\r\n",
    "ms k 2 q\r\nhiX\r\n",
    "version\r\n",
];

/// Binary requests: opcode, key, extras, value, CAS.
type Binary = (u8, &'static [u8], &'static [u8], &'static [u8], u64);

const FLAGS_EXP: &[u8] = &[0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0];
const DELTA_5_INIT_7: &[u8] = &[0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0];
const DELTA_NO_CREATE: &[u8] = &[
    0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff,
];

const BINARY: &[Binary] = &[
    (0x00, b"bk", b"", b"", 0),
    (0x0c, b"bk", b"", b"", 0),
    (0x09, b"bk", b"", b"", 0),
    (0x0d, b"bk", b"", b"", 0),
    (0x01, b"bk", FLAGS_EXP, b"hello", 0),
    (0x00, b"bk", b"", b"", 0),
    (0x0c, b"bk", b"", b"", 0),
    (0x09, b"bk", b"", b"", 0),
    (0x0d, b"bk", b"", b"", 0),
    (0x11, b"bk2", FLAGS_EXP, b"v2", 0),
    (0x00, b"bk2", b"", b"", 0),
    (0x01, b"bk2", FLAGS_EXP, b"v3", 12345),
    (0x01, b"bk3", FLAGS_EXP, b"v3", 12345),
    (0x02, b"bk2", FLAGS_EXP, b"v3", 0),
    (0x03, b"bk9", FLAGS_EXP, b"v3", 0),
    (0x0e, b"bk2", b"", b"-a", 0),
    (0x0f, b"bk2", b"", b"p-", 0),
    (0x0e, b"bk9", b"", b"-a", 0),
    (0x00, b"bk2", b"", b"", 0),
    (0x05, b"ctr", DELTA_5_INIT_7, b"", 0),
    (0x05, b"ctr", DELTA_5_INIT_7, b"", 0),
    (0x06, b"ctr", DELTA_5_INIT_7, b"", 0),
    (0x05, b"ctr2", DELTA_NO_CREATE, b"", 0),
    (0x05, b"bk", DELTA_5_INIT_7, b"", 0),
    (0x04, b"bk", b"", b"", 0),
    (0x04, b"bk", b"", b"", 0),
    (0x14, b"bk2", b"", b"", 0),
    (0x14, b"bk2", b"", b"", 0),
    (0x0a, b"", b"", b"", 0),
    (0x0b, b"", b"", b"", 0),
    (0x08, b"", b"", b"", 0),
    (0x00, b"ctr", b"", b"", 0),
];

fn binary_request(
    op: u8,
    key: &[u8],
    extras: &[u8],
    value: &[u8],
    opaque: u32,
    cas: u64,
) -> Vec<u8> {
    let mut packet = Vec::new();
    wire::memcache::binary::write_request(op, key, extras, value, opaque, cas, &mut packet);
    packet
}

/// Runs the text script against one server, returning each normalised reply.
fn text_script(addr: SocketAddr) -> Vec<String> {
    let mut stream = connect(addr);
    let mut cas = String::from("0");
    let mut replies = Vec::new();
    for step in TEXT {
        let request = step.replace("{cas}", &cas);
        let sentinels = 1 + request.matches("mn\r\n").count();
        let mut bytes = request.into_bytes();
        bytes.extend_from_slice(b"mn\r\n");
        let reply = exchange(&mut stream, &bytes, |r| {
            r.ends_with(b"MN\r\n") && r.windows(4).filter(|w| w == b"MN\r\n").count() >= sentinels
        });
        let reply = String::from_utf8_lossy(&reply).into_owned();
        if let Some(c) = last_cas(&reply) {
            cas = c;
        }
        replies.push(normalise_text(&reply));
    }
    // `quit` closes the connection without a reply.
    let closed = exchange(&mut stream, b"quit\r\n", |_| false);
    replies.push(format!("after quit: {closed:?}"));
    replies
}

fn binary_script(addr: SocketAddr) -> Vec<Vec<Vec<u8>>> {
    let mut stream: TcpStream = connect(addr);
    let mut replies = Vec::new();
    for (i, &(op, key, extras, value, cas)) in BINARY.iter().enumerate() {
        let mut bytes = binary_request(op, key, extras, value, i as u32, cas);
        bytes.extend(binary_request(0x0a, b"", b"", b"", SENTINEL, 0));
        let reply = exchange(&mut stream, &bytes, ends_with_sentinel);
        replies.push(normalise_binary(&reply));
    }
    let bad = binary_request(0x50, b"", b"", b"", 77, 0);
    let mut bytes = bad;
    bytes.extend(binary_request(0x0a, b"", b"", b"", SENTINEL, 0));
    replies.push(normalise_binary(&exchange(
        &mut stream,
        &bytes,
        ends_with_sentinel,
    )));
    // memcached skips an unknown opcode's body after its extras and key, so these are skipped
    // twice: the padding stands for the start of the next request. VERBOSITY is unknown too.
    for (op, extras, key, value) in [
        (0x50, &b"ee"[..], &b"key"[..], &b"v"[..]),
        (0x1b, &[0, 0, 0, 1][..], &b""[..], &b""[..]),
    ] {
        let mut bytes = binary_request(op, key, extras, value, 78, 0);
        bytes.resize(bytes.len() + extras.len() + key.len(), b'P');
        bytes.extend(binary_request(0x0a, b"", b"", b"", SENTINEL, 0));
        replies.push(normalise_binary(&exchange(
            &mut stream,
            &bytes,
            ends_with_sentinel,
        )));
    }
    let quit = binary_request(0x07, b"", b"", b"", 9, 0);
    replies.push(normalise_binary(&exchange(&mut stream, &quit, |_| false)));
    replies
}

#[test]
fn text_and_meta_match_memcached() {
    let Some(memcached) = Memcached::start() else {
        eprintln!("memcached not installed; skipping");
        return;
    };
    let node = node(|_| {});
    let expected = text_script(memcached.addr);
    let actual = text_script(node.tcp_addr().unwrap());
    for ((step, want), got) in TEXT.iter().zip(&expected).zip(&actual) {
        assert_eq!(got, want, "reply to {step:?}");
    }
    assert_eq!(actual.last(), expected.last());
}

#[test]
fn binary_matches_memcached() {
    let Some(memcached) = Memcached::start() else {
        eprintln!("memcached not installed; skipping");
        return;
    };
    let node = node(|_| {});
    let expected = binary_script(memcached.addr);
    let actual = binary_script(node.tcp_addr().unwrap());
    for (i, (want, got)) in expected.iter().zip(&actual).enumerate() {
        assert_eq!(got, want, "reply to binary step {i}: {:?}", BINARY.get(i));
    }
    assert_eq!(actual.len(), expected.len());
}

/// Binary requests after which memcached answers and closes the connection, each on a
/// connection of its own; the replies up to the close are compared.
fn binary_closing_errors(addr: SocketAddr) -> Vec<Vec<u8>> {
    let mut short_body = binary_request(0x00, b"key", b"", b"", 1, 0);
    short_body[11] = 1;
    let requests = [
        short_body,
        binary_request(0x00, &[b'k'; 251], b"", b"", 2, 0),
        binary_request(0x50, &[b'k'; 251], b"", b"", 3, 0),
        binary_request(0x00, b"k", b"eeee", b"", 4, 0),
        binary_request(0x01, b"k", b"", b"v", 5, 0),
    ];
    requests
        .iter()
        .map(|request| {
            let mut stream = connect(addr);
            let mut bytes = request.clone();
            bytes.extend(binary_request(0x0a, b"", b"", b"", SENTINEL, 0));
            exchange(&mut stream, &bytes, |_| false)
        })
        .collect()
}

#[test]
fn binary_errors_close_like_memcached() {
    let Some(memcached) = Memcached::start() else {
        eprintln!("memcached not installed; skipping");
        return;
    };
    let node = node(|_| {});
    let expected = binary_closing_errors(memcached.addr);
    let actual = binary_closing_errors(node.tcp_addr().unwrap());
    assert_eq!(actual, expected);
}

#[test]
fn stats_report_counters() {
    let node = node(|_| {});
    let mut stream = connect(node.tcp_addr().unwrap());
    exchange(&mut stream, b"set a 0 0 1\r\nx\r\nget a b\r\n", |r| {
        r.ends_with(b"END\r\n")
    });
    let stats = exchange(&mut stream, b"stats\r\n", |r| r.ends_with(b"END\r\n"));
    let stats = String::from_utf8(stats).unwrap();
    for line in [
        "STAT cmd_get 2\r\n",
        "STAT get_hits 1\r\n",
        "STAT get_misses 1\r\n",
        "STAT curr_items 1\r\n",
        "STAT capacity_drops 0\r\n",
    ] {
        assert!(stats.contains(line), "{line:?} missing from {stats}");
    }
}

#[test]
fn memory_limit_refuses_stores() {
    let node = node(|args| args.memory_limit_mb = Some(1));
    let mut stream = connect(node.tcp_addr().unwrap());
    let value = vec![b'v'; 600 * 1024];
    let mut set = |key: &str| {
        let mut request = format!("set {key} 0 0 {}\r\n", value.len()).into_bytes();
        request.extend_from_slice(&value);
        request.extend_from_slice(b"\r\n");
        exchange(&mut stream, &request, |r| r.ends_with(b"\r\n"))
    };
    assert_eq!(set("a"), b"STORED\r\n");
    assert_eq!(set("b"), b"SERVER_ERROR out of memory storing object\r\n");
    assert_eq!(set("a"), b"STORED\r\n");
}
