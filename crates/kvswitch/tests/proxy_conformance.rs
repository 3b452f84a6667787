//! The proxy answers as one memcached 1.6 would: the same raw requests go to a reference
//! memcached directly and through the proxy to three memcached servers, and the replies must be
//! byte-identical once CAS values, ticking times and version strings are masked. Keys are chosen
//! on the pool's ring so that every multi-key request spans all three servers.
//!
//! The `harness_*` tests run the same scripts with memcached itself (or nutcracker) in the
//! proxy's place, so a failure of the kvswitch tests is the proxy's, not the harness's.

mod common;

use common::proxy::{
    binary_request, ends_with_sentinel, last_cas, noop_sentinel, normalise_binary, normalise_text,
    packets, show, spread_keys, stat, stat_names, Cluster, Conn, Front, PoolOpts, NAMES,
};

/// Text and meta requests, one exchange each (an `mn` sentinel is appended). `{0}`..`{8}` are
/// keys on servers 0, 1, 2, 0, 1, 2, ...; `{cas}` is the last CAS value the target returned.
const TEXT: &[&str] = &[
    "get {0}\r\n",
    "set {0} 5 0 3\r\nabc\r\n",
    "set {1} 6 0 3\r\ndef\r\n",
    "set {2} 7 0 3\r\nghi\r\n",
    "get {0}\r\n",
    "get {0} {1} {2}\r\n",
    "get {2} {1} {0} {3} {4} {5}\r\n",
    "gets {1}\r\n",
    "gets {0} {4} {1} {5} {2}\r\n",
    "get {0} {0} {1} {1}\r\n",
    "set {3} 0 0 1 noreply\r\nx\r\n",
    "set {4} 0 0 1 noreply\r\ny\r\nset {5} 0 0 1 noreply\r\nz\r\nget {3} {4} {5}\r\n",
    "add {0} 0 0 1\r\nz\r\n",
    "add {6} 0 0 1\r\nz\r\n",
    "add {7} 0 0 1 noreply\r\nz\r\nadd {7} 0 0 1 noreply\r\nw\r\nget {7}\r\n",
    "replace {8} 0 0 1\r\nz\r\n",
    "replace {6} 3 0 2\r\nzz\r\n",
    "replace {6} 3 0 2 noreply\r\nyy\r\n",
    "append {0} 0 0 2\r\nde\r\n",
    "prepend {1} 9 0 2\r\n01\r\n",
    "append nope 0 0 1\r\nx\r\n",
    "prepend nope 0 0 1 noreply\r\nx\r\n",
    "append {2} 0 0 1 noreply\r\n!\r\nget {0} {1} {2}\r\n",
    "gets {6}\r\n",
    "cas {6} 0 0 1 {cas}\r\nq\r\n",
    "cas {6} 0 0 1 {cas}\r\nr\r\n",
    "cas {6} 0 0 1 0\r\nr\r\n",
    "cas {8} 0 0 1 5\r\nq\r\n",
    "gets {6}\r\n",
    "cas {6} 0 0 1 {cas} noreply\r\ns\r\nget {6}\r\n",
    "delete {6}\r\n",
    "delete {6}\r\n",
    "delete {3} noreply\r\n",
    "delete {4} 0\r\n",
    "delete {5} 5\r\n",
    "get {3} {4} {5}\r\n",
    "set {3} 0 0 3\r\n100\r\n",
    "incr {3} 5\r\n",
    "decr {3} 100\r\n",
    "decr {3} 10\r\n",
    "incr {3} 18446744073709551615\r\n",
    "incr {3} 2\r\n",
    "incr {3} 1 noreply\r\n",
    "decr {3} 1 noreply\r\nget {3}\r\n",
    "incr nope 1\r\n",
    "decr {8} 1\r\n",
    "incr {0} 1\r\n",
    "incr {3} abc\r\n",
    "incr {3} -1\r\n",
    "touch {3} 100\r\n",
    "touch {8} 10\r\n",
    "touch {0} 100 noreply\r\n",
    "gat 100 {3} {0} {8} {1}\r\n",
    "gats 0 {3} {1} {2}\r\n",
    "gat 10\r\n",
    "gat abc {3}\r\n",
    "touch {3} abc\r\n",
    "set {5} 0 -1 1\r\nx\r\n",
    "get {5}\r\n",
    "set {5} 4294967295 0 0\r\n\r\n",
    "get {5}\r\n",
    "set {4} 0 0 2\r\nabc\r\n",
    "set {4} 0 0 2 noreply\r\nabc\r\n",
    "bogus\r\n",
    "GET {0}\r\n",
    "\r\n",
    "get\r\n",
    "gets\r\n",
    "set {4} 0 0\r\n",
    "set {4} 0 0 -1\r\n",
    "incr {3}\r\n",
    "delete\r\n",
    "verbosity 1\r\n",
    "verbosity 1 noreply\r\n",
    "verbosity\r\n",
    "ms {0} 3\r\nabc\r\n",
    "ms {1} 3 T0 F7 k O123\r\nxyz\r\n",
    "ms {2} 3 c\r\nxyz\r\n",
    "mg {0} v\r\n",
    "mg {1} s v f t k O99\r\n",
    "mg {2}\r\n",
    "mg {2} c f\r\n",
    "mg {8} v\r\n",
    "mg {8} v q\r\n",
    "mg {8} k O5\r\n",
    "mg {0} q k\r\n",
    "mg {1} q v\r\n",
    "mg {8} v q k O1\r\nmg {0} v q k O2\r\nmg {7} v q O3\r\nmg {1} v q k O4\r\n",
    "mg {0} v\r\nmg {1} v\r\nmg {2} v\r\nmg {3} v\r\n",
    "mg {2} s v E99\r\n",
    "mg\r\n",
    "ms {8} 2 MA\r\nzz\r\n",
    "ms {0} 2 MA\r\nzz\r\n",
    "ms {0} 2 MP k\r\naa\r\n",
    "ms {0} 1 ME\r\nq\r\n",
    "ms {8} 1 MR O1\r\nq\r\n",
    "ms {0} 1 q\r\nr\r\n",
    "ms {8} 1 q MR\r\nr\r\n",
    "ms {0} 1 MS I\r\ns\r\n",
    "mg {0} v\r\n",
    "ms {6} 1 T100\r\nt\r\n",
    "mg {6} t v\r\n",
    "mg {6} T0 t\r\n",
    "ms {0} 2 C1\r\nzz\r\n",
    "mg {0} c\r\n",
    "ms {0} 2 C{cas}\r\nzz\r\n",
    "ms {7} 2 C5\r\nzz\r\n",
    "ms {0}\r\n",
    "ms {0} 2 ZZ\r\nab\r\n",
    "ms {0} 2\r\nabc\r\n",
    "md {0} q\r\n",
    "md {0}\r\n",
    "md {0} q\r\n",
    "md {6} k O1\r\n",
    "md {6} O2 k\r\n",
    "md {1} q\r\nmd {2} q\r\nmg {1} v\r\nmg {2} v\r\n",
    "ma {3}\r\n",
    "ma {8}\r\n",
    "ma {8} N0 J13 v\r\n",
    "ma {8} v t c\r\n",
    "ma {8} MD D5 v O9 k\r\n",
    "ma {1} q\r\nma {8} q\r\nma {7} q\r\nma {4} q\r\n",
    "ma {4}\r\n",
    "me {3}\r\n",
    "me {8}\r\n",
    "me nope\r\n",
    "mn\r\n",
    "ms bWtleQ== 2 b\r\nhi\r\n",
    "mg bWtleQ== b v k\r\n",
    "get mkey\r\n",
    "set b64key 0 0 2\r\nyo\r\n",
    "mg YjY0a2V5 b v k O7\r\n",
    "md YjY0a2V5 b q\r\nget b64key\r\n",
    "mg bWtleQ b v\r\n",
    "mg a=b v\r\n",
    "set {7} 0 0 2\r\n10\r\n",
    "flush_all\r\n",
    "get {0} {1} {2} {7} mkey\r\n",
    "set {7} 0 0 2\r\n10\r\n",
    "flush_all noreply\r\n",
    "get {7}\r\n",
    "flush_all 0\r\n",
    "flush_all abc\r\n",
    "version\r\n",
];

/// A binary request: opcode, key (a template), extras, value, CAS to send.
type Bin = (u8, &'static str, &'static [u8], &'static [u8], Cas);

#[derive(Clone, Copy)]
enum Cas {
    Zero,
    Wrong,
    /// The CAS in the target's last reply that carried one.
    Last,
}

const FLAGS_EXP: &[u8] = &[0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0];
const FLAGS_TTL100: &[u8] = &[0, 0, 0, 1, 0, 0, 0, 100];
const DELTA_5_INIT_7: &[u8] = &[0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0];
const DELTA_1_NO_CREATE: &[u8] = &[
    0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff,
];
const TTL_100: &[u8] = &[0, 0, 0, 100];

const GET: u8 = 0x00;
const SET: u8 = 0x01;
const ADD: u8 = 0x02;
const REPLACE: u8 = 0x03;
const DELETE: u8 = 0x04;
const INCR: u8 = 0x05;
const DECR: u8 = 0x06;
const QUIT: u8 = 0x07;
const FLUSH: u8 = 0x08;
const GETQ: u8 = 0x09;
const NOOP: u8 = 0x0a;
const VERSION: u8 = 0x0b;
const GETK: u8 = 0x0c;
const GETKQ: u8 = 0x0d;
const APPEND: u8 = 0x0e;
const PREPEND: u8 = 0x0f;
const SETQ: u8 = 0x11;
const ADDQ: u8 = 0x12;
const REPLACEQ: u8 = 0x13;
const DELETEQ: u8 = 0x14;
const INCRQ: u8 = 0x15;
const DECRQ: u8 = 0x16;
const QUITQ: u8 = 0x17;
const FLUSHQ: u8 = 0x18;
const APPENDQ: u8 = 0x19;
const PREPENDQ: u8 = 0x1a;
const VERBOSITY: u8 = 0x1b;
const TOUCH: u8 = 0x1c;
const GAT: u8 = 0x1d;
const GATQ: u8 = 0x1e;
const GATK: u8 = 0x23;
const GATKQ: u8 = 0x24;
const SASL_LIST_MECHS: u8 = 0x20;

/// Binary exchanges: each step's packets are sent together, then a `NOOP` sentinel.
const BINARY: &[&[Bin]] = &[
    &[(GET, "{0}", b"", b"", Cas::Zero)],
    &[(GETK, "{0}", b"", b"", Cas::Zero)],
    &[(GETQ, "{0}", b"", b"", Cas::Zero)],
    &[(GETKQ, "{0}", b"", b"", Cas::Zero)],
    &[(SET, "{0}", FLAGS_EXP, b"hello", Cas::Zero)],
    &[(SET, "{1}", FLAGS_EXP, b"world", Cas::Zero)],
    &[(SET, "{2}", FLAGS_TTL100, b"!", Cas::Zero)],
    &[(GET, "{0}", b"", b"", Cas::Zero)],
    &[(GETK, "{1}", b"", b"", Cas::Zero)],
    &[(GETQ, "{2}", b"", b"", Cas::Zero)],
    &[(GETKQ, "{0}", b"", b"", Cas::Zero)],
    // A multi-get pipeline over all three servers with misses between the hits.
    &[
        (GETKQ, "{0}", b"", b"", Cas::Zero),
        (GETKQ, "{3}", b"", b"", Cas::Zero),
        (GETKQ, "{1}", b"", b"", Cas::Zero),
        (GETQ, "{4}", b"", b"", Cas::Zero),
        (GETQ, "{2}", b"", b"", Cas::Zero),
        (GETK, "{5}", b"", b"", Cas::Zero),
    ],
    &[
        (SETQ, "{3}", FLAGS_EXP, b"q3", Cas::Zero),
        (SETQ, "{4}", FLAGS_EXP, b"q4", Cas::Zero),
        (ADDQ, "{3}", FLAGS_EXP, b"no", Cas::Zero),
        (ADDQ, "{5}", FLAGS_EXP, b"q5", Cas::Zero),
        (REPLACEQ, "{6}", FLAGS_EXP, b"no", Cas::Zero),
        (REPLACEQ, "{4}", FLAGS_EXP, b"r4", Cas::Zero),
        (APPENDQ, "{3}", b"", b"+a", Cas::Zero),
        (PREPENDQ, "{5}", b"", b"p+", Cas::Zero),
        (APPENDQ, "{7}", b"", b"x", Cas::Zero),
        (GETK, "{3}", b"", b"", Cas::Zero),
        (GETK, "{4}", b"", b"", Cas::Zero),
        (GETK, "{5}", b"", b"", Cas::Zero),
    ],
    &[(SET, "{1}", FLAGS_EXP, b"v3", Cas::Wrong)],
    &[(SET, "{8}", FLAGS_EXP, b"v3", Cas::Wrong)],
    &[(GET, "{1}", b"", b"", Cas::Zero)],
    &[(SET, "{1}", FLAGS_EXP, b"v4", Cas::Last)],
    &[(SETQ, "{1}", FLAGS_EXP, b"v5", Cas::Wrong)],
    &[(ADD, "{1}", FLAGS_EXP, b"v3", Cas::Zero)],
    &[(ADD, "{6}", FLAGS_EXP, b"v6", Cas::Zero)],
    &[(REPLACE, "{7}", FLAGS_EXP, b"v3", Cas::Zero)],
    &[(REPLACE, "{6}", FLAGS_EXP, b"v7", Cas::Zero)],
    &[(APPEND, "{1}", b"", b"-a", Cas::Zero)],
    &[(PREPEND, "{1}", b"", b"p-", Cas::Zero)],
    &[(APPEND, "{8}", b"", b"-a", Cas::Zero)],
    &[(PREPEND, "{8}", b"", b"-a", Cas::Zero)],
    &[(GET, "{1}", b"", b"", Cas::Zero)],
    &[(INCR, "{7}", DELTA_5_INIT_7, b"", Cas::Zero)],
    &[(INCR, "{7}", DELTA_5_INIT_7, b"", Cas::Zero)],
    &[(DECR, "{7}", DELTA_5_INIT_7, b"", Cas::Zero)],
    &[(DECR, "{7}", DELTA_5_INIT_7, b"", Cas::Zero)],
    &[(INCR, "{8}", DELTA_1_NO_CREATE, b"", Cas::Zero)],
    &[(DECR, "{8}", DELTA_1_NO_CREATE, b"", Cas::Zero)],
    &[(INCR, "{1}", DELTA_5_INIT_7, b"", Cas::Zero)],
    &[
        (INCRQ, "{7}", DELTA_5_INIT_7, b"", Cas::Zero),
        (DECRQ, "{7}", DELTA_5_INIT_7, b"", Cas::Zero),
        (INCRQ, "{8}", DELTA_1_NO_CREATE, b"", Cas::Zero),
        (INCRQ, "{1}", DELTA_5_INIT_7, b"", Cas::Zero),
        (GET, "{7}", b"", b"", Cas::Zero),
    ],
    &[(TOUCH, "{0}", TTL_100, b"", Cas::Zero)],
    &[(TOUCH, "{8}", TTL_100, b"", Cas::Zero)],
    &[(GAT, "{0}", TTL_100, b"", Cas::Zero)],
    &[(GAT, "{8}", TTL_100, b"", Cas::Zero)],
    &[(GATK, "{1}", TTL_100, b"", Cas::Zero)],
    &[
        (GATQ, "{8}", TTL_100, b"", Cas::Zero),
        (GATQ, "{0}", TTL_100, b"", Cas::Zero),
        (GATKQ, "{8}", TTL_100, b"", Cas::Zero),
        (GATKQ, "{1}", TTL_100, b"", Cas::Zero),
        (GATKQ, "{2}", TTL_100, b"", Cas::Zero),
    ],
    &[(DELETE, "{0}", b"", b"", Cas::Zero)],
    &[(DELETE, "{0}", b"", b"", Cas::Zero)],
    &[(DELETEQ, "{1}", b"", b"", Cas::Zero)],
    &[(DELETEQ, "{1}", b"", b"", Cas::Zero)],
    &[
        (DELETEQ, "{2}", b"", b"", Cas::Zero),
        (DELETEQ, "{3}", b"", b"", Cas::Zero),
        (GETK, "{2}", b"", b"", Cas::Zero),
        (GETK, "{3}", b"", b"", Cas::Zero),
    ],
    &[(VERSION, "", b"", b"", Cas::Zero)],
    // memcached 1.6 has no binary VERBOSITY and no SASL without -S: "Unknown command".
    &[(VERBOSITY, "", b"", b"", Cas::Zero)],
    &[(NOOP, "", b"", b"", Cas::Zero)],
    &[(SASL_LIST_MECHS, "", b"", b"", Cas::Zero)],
    &[(0x50, "", b"", b"", Cas::Zero)],
    &[(0x50, "", b"", b"body", Cas::Zero)],
    &[(SET, "{4}", FLAGS_EXP, b"", Cas::Zero)],
    &[(GET, "{4}", b"", b"", Cas::Zero)],
    &[(FLUSH, "", b"", b"", Cas::Zero)],
    &[
        (GET, "{4}", b"", b"", Cas::Zero),
        (GET, "{5}", b"", b"", Cas::Zero),
    ],
    &[
        (SET, "{4}", FLAGS_EXP, b"a", Cas::Zero),
        (SET, "{5}", FLAGS_EXP, b"b", Cas::Zero),
        (FLUSHQ, "", b"", b"", Cas::Zero),
        (GETK, "{4}", b"", b"", Cas::Zero),
        (GETK, "{5}", b"", b"", Cas::Zero),
    ],
];

/// Requests after which memcached closes the connection (QUIT after its reply, QUITQ silently,
/// invalid arguments after an error reply); nothing after them is answered.
const BINARY_CLOSING: &[&[Bin]] = &[
    &[
        (NOOP, "", b"", b"", Cas::Zero),
        (QUIT, "", b"", b"", Cas::Zero),
        (GET, "{0}", b"", b"", Cas::Zero),
    ],
    &[
        (NOOP, "", b"", b"", Cas::Zero),
        (QUITQ, "", b"", b"", Cas::Zero),
        (GET, "{0}", b"", b"", Cas::Zero),
    ],
    &[(GET, "", b"", b"", Cas::Zero)],
    &[(SET, "{4}", b"", b"noextras", Cas::Zero)],
    &[(GET, "{1}", FLAGS_EXP, b"", Cas::Zero)],
    &[(INCR, "{1}", FLAGS_EXP, b"", Cas::Zero)],
    &[
        (GET, "{0}", b"", b"", Cas::Zero),
        (TOUCH, "{0}", b"", b"", Cas::Zero),
    ],
];

/// Replaces `{i}` with `keys[i]` and `{cas}` with `cas`.
fn fill(template: &str, keys: &[String], cas: &str) -> String {
    let mut out = template.replace("{cas}", cas);
    for (i, k) in keys.iter().enumerate().rev() {
        out = out.replace(&format!("{{{i}}}"), k);
    }
    out
}

/// Runs the text script, returning one normalised reply per step and the state after `quit`.
fn text_script(addr: std::net::SocketAddr, keys: &[String]) -> Vec<String> {
    let mut conn = Conn::open(addr);
    let mut cas = String::from("0");
    let mut replies = Vec::new();
    for step in TEXT {
        let request = fill(step, keys, &cas);
        let reply = match conn.try_text(request.as_bytes()) {
            Ok(reply) => String::from_utf8_lossy(&reply).into_owned(),
            // The stream is out of step from here on: record why and stop.
            Err(e) => {
                replies.push(e);
                return replies;
            }
        };
        if let Some(c) = last_cas(&reply) {
            cas = c;
        }
        replies.push(normalise_text(&reply));
    }
    // `quit` closes the connection without a reply, also after pipelined requests.
    conn.send(format!("get {}\r\nquit\r\nget {}\r\n", keys[0], keys[1]).as_bytes());
    let end = conn.read_until(|_| false, std::time::Duration::from_secs(2));
    replies.push(format!(
        "after quit: {:?} closed={} timed_out={}",
        normalise_text(&String::from_utf8_lossy(&end.bytes)),
        end.closed,
        end.timed_out
    ));
    replies
}

fn binary_script(addr: std::net::SocketAddr, keys: &[String]) -> Vec<Vec<Vec<u8>>> {
    let mut conn = Conn::open(addr);
    let mut last_cas = 0u64;
    let mut replies = Vec::new();
    for (i, step) in BINARY.iter().enumerate() {
        let mut bytes = Vec::new();
        for (j, &(op, key, extras, value, cas)) in step.iter().enumerate() {
            let key = fill(key, keys, "");
            let cas = match cas {
                Cas::Zero => 0,
                Cas::Wrong => 0x1234_5678_9abc,
                Cas::Last => last_cas,
            };
            let opaque = (i * 16 + j) as u32;
            bytes.extend(binary_request(
                op,
                key.as_bytes(),
                extras,
                value,
                opaque,
                cas,
            ));
        }
        bytes.extend(noop_sentinel());
        let reply = match conn.try_call(&bytes, ends_with_sentinel) {
            Ok(reply) => reply,
            Err(e) => {
                replies.push(vec![e.into_bytes()]);
                return replies;
            }
        };
        if let Some(p) = packets(&reply).iter().rev().find(|p| p[16..24] != [0; 8]) {
            last_cas = u64::from_be_bytes(p[16..24].try_into().expect("8 bytes"));
        }
        replies.push(normalise_binary(&reply));
    }
    // Each of these ends the connection; it runs on a connection of its own.
    for (i, step) in BINARY_CLOSING.iter().enumerate() {
        let mut conn = Conn::open(addr);
        let mut bytes = Vec::new();
        for (j, &(op, key, extras, value, _)) in step.iter().enumerate() {
            let key = fill(key, keys, "");
            bytes.extend(binary_request(
                op,
                key.as_bytes(),
                extras,
                value,
                j as u32 + 1,
                0,
            ));
        }
        bytes.extend(noop_sentinel());
        conn.send(&bytes);
        let end = conn.read_until(|_| false, std::time::Duration::from_secs(2));
        let mut r = normalise_binary(&end.bytes);
        r.push(
            format!(
                "closing step {i}: closed={} timed_out={}",
                end.closed, end.timed_out
            )
            .into_bytes(),
        );
        replies.push(r);
    }
    replies
}

fn script_keys(cluster: &Cluster) -> Vec<String> {
    spread_keys(&cluster.ring, "key:", 3)
}

fn check_text(front: Front) {
    let cluster = Cluster::start(front, &PoolOpts::default());
    let keys = script_keys(&cluster);
    let expected = text_script(cluster.reference.addr(), &keys);
    assert_eq!(
        expected.len(),
        TEXT.len() + 1,
        "memcached: {:?}",
        expected.last()
    );
    let actual = text_script(cluster.addr(), &keys);
    for ((step, want), got) in TEXT.iter().zip(&expected).zip(&actual) {
        assert_eq!(
            got,
            want,
            "{front:?}: reply to {:?}",
            fill(step, &keys, "#")
        );
    }
    assert_eq!(actual.last(), expected.last(), "{front:?}: quit");
    assert_eq!(actual.len(), expected.len());
}

fn check_binary(front: Front) {
    let cluster = Cluster::start(front, &PoolOpts::default());
    let keys = script_keys(&cluster);
    let expected = binary_script(cluster.reference.addr(), &keys);
    assert_eq!(expected.len(), BINARY.len() + BINARY_CLOSING.len());
    let actual = binary_script(cluster.addr(), &keys);
    for (i, (want, got)) in expected.iter().zip(&actual).enumerate() {
        let shown = |r: &Vec<Vec<u8>>| r.iter().map(|p| show(p)).collect::<Vec<_>>();
        assert_eq!(
            got,
            want,
            "{front:?}: reply to binary step {i}: got {:?}, want {:?}",
            shown(got),
            shown(want)
        );
    }
    assert_eq!(actual.len(), expected.len());
}

#[test]
fn text_and_meta_through_the_proxy_match_memcached() {
    check_text(Front::Kvswitch);
}

#[test]
fn binary_through_the_proxy_matches_memcached() {
    check_binary(Front::Kvswitch);
}

#[test]
fn harness_text_script_is_deterministic_on_memcached() {
    check_text(Front::Direct);
}

#[test]
fn harness_binary_script_is_deterministic_on_memcached() {
    check_binary(Front::Direct);
}

/// `n` distinct keys stored through `addr` with one pipelined write; returns the keys.
fn store(addr: std::net::SocketAddr, prefix: &str, n: usize) -> Vec<String> {
    let keys: Vec<String> = (0..n).map(|i| format!("{prefix}{i}")).collect();
    let mut request = Vec::new();
    for k in &keys {
        request.extend_from_slice(format!("set {k} 0 0 2\r\nvv\r\n").as_bytes());
    }
    let mut conn = Conn::open(addr);
    let reply = conn.call(&request, |r| r.len() >= n * 8);
    assert_eq!(reply, b"STORED\r\n".repeat(n));
    keys
}

#[test]
fn stats_sum_the_servers_and_keep_memcacheds_fields() {
    let cluster = Cluster::start(Front::Kvswitch, &PoolOpts::default());
    let n = 60;
    let keys = store(cluster.addr(), "stat:", n);
    let mut per_server = [0usize; 3];
    for k in &keys {
        per_server[cluster.server_of(k)] += 1;
    }
    assert!(per_server.iter().all(|&c| c > 0), "{per_server:?}");
    let mut conn = Conn::open(cluster.addr());
    let gets = format!("get {} {} nope\r\n", keys[0], keys[1]);
    conn.call(gets.as_bytes(), |r| r.ends_with(b"END\r\n"));
    let stats = conn.call(b"stats\r\n", |r| r.ends_with(b"END\r\n"));

    // The field names memcached reports, in memcached's order.
    let mut reference = Conn::open(cluster.reference.addr());
    let want = reference.call(b"stats\r\n", |r| r.ends_with(b"END\r\n"));
    assert_eq!(stat_names(&stats), stat_names(&want), "{}", show(&stats));

    for (field, value) in [
        ("cmd_set", n as u64),
        ("curr_items", n as u64),
        ("total_items", n as u64),
        ("cmd_get", 3),
        ("get_hits", 2),
        ("get_misses", 1),
    ] {
        assert_eq!(
            stat(&stats, field),
            Some(value),
            "{field} in {}",
            show(&stats)
        );
    }
    // Each server's own share adds up to the proxy's sum.
    for (i, server) in cluster.servers.iter().enumerate() {
        let own = Conn::open(server.addr()).call(b"stats\r\n", |r| r.ends_with(b"END\r\n"));
        assert_eq!(
            stat(&own, "cmd_set"),
            Some(per_server[i] as u64),
            "server {i}"
        );
    }
}

/// `stats items` and `stats slabs` after the same items are stored through the proxy and in
/// the reference: the same fields, and item counts summed to the reference's.
#[test]
fn stats_items_and_slabs_merge_like_one_memcached() {
    let cluster = Cluster::start(Front::Kvswitch, &PoolOpts::default());
    store(cluster.addr(), "item:", 45);
    store(cluster.reference.addr(), "item:", 45);
    for sub in ["items", "slabs"] {
        let request = format!("stats {sub}\r\n");
        let got = Conn::open(cluster.addr()).call(request.as_bytes(), |r| r.ends_with(b"END\r\n"));
        let want = Conn::open(cluster.reference.addr())
            .call(request.as_bytes(), |r| r.ends_with(b"END\r\n"));
        assert_eq!(
            stat_names(&got),
            stat_names(&want),
            "stats {sub}: {}",
            show(&got)
        );
    }
    let items = |addr| Conn::open(addr).call(b"stats items\r\n", |r| r.ends_with(b"END\r\n"));
    let (got, want) = (items(cluster.addr()), items(cluster.reference.addr()));
    assert_eq!(stat(&got, "items:1:number"), stat(&want, "items:1:number"));
    assert_eq!(stat(&want, "items:1:number"), Some(45));
}

/// The binary STAT reply: (key, value) packets closed by one with an empty key.
fn binary_stats(addr: std::net::SocketAddr) -> Vec<(String, String)> {
    let mut conn = Conn::open(addr);
    let reply = conn.call(&binary_request(0x10, b"", b"", b"", 42, 0), |r| {
        packets(r).last().is_some_and(|p| p[2..4] == [0, 0])
    });
    packets(&reply)
        .iter()
        .filter(|p| p[2..4] != [0, 0])
        .map(|p| {
            assert_eq!(
                (p[0], p[1], &p[12..16]),
                (0x81, 0x10, &42u32.to_be_bytes()[..])
            );
            let key_len = u16::from_be_bytes([p[2], p[3]]) as usize;
            let extras = p[4] as usize;
            let key = &p[24 + extras..24 + extras + key_len];
            let value = &p[24 + extras + key_len..];
            (
                String::from_utf8_lossy(key).into_owned(),
                String::from_utf8_lossy(value).into_owned(),
            )
        })
        .collect()
}

#[test]
fn binary_stats_sum_the_servers() {
    let cluster = Cluster::start(Front::Kvswitch, &PoolOpts::default());
    let n = 30;
    store(cluster.addr(), "bstat:", n);
    let got = binary_stats(cluster.addr());
    let want = binary_stats(cluster.reference.addr());
    let names = |s: &[(String, String)]| s.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
    assert_eq!(names(&got), names(&want));
    let cmd_set = got
        .iter()
        .find(|(k, _)| k == "cmd_set")
        .map(|(_, v)| v.as_str());
    assert_eq!(cmd_set, Some(n.to_string().as_str()));
}

#[test]
fn harness_stats_fields_on_memcached() {
    // memcached's own `stats` against itself: the names match and cmd_set counts the sets.
    let cluster = Cluster::start(Front::Direct, &PoolOpts::default());
    store(cluster.addr(), "stat:", 10);
    let stats = Conn::open(cluster.addr()).call(b"stats\r\n", |r| r.ends_with(b"END\r\n"));
    let want = Conn::open(cluster.reference.addr()).call(b"stats\r\n", |r| r.ends_with(b"END\r\n"));
    assert_eq!(stat_names(&stats), stat_names(&want));
    assert_eq!(stat(&stats, "cmd_set"), Some(10));
    assert_eq!(
        binary_stats(cluster.addr()).len(),
        binary_stats(cluster.reference.addr()).len()
    );
}

/// Keys stored through the front are found on the server the ring names, read directly.
fn check_placement(front: Front) {
    let cluster = Cluster::start(front, &PoolOpts::default());
    let keys = store(cluster.addr(), "place:", 90);
    for k in &keys {
        let want = cluster.server_of(k);
        for (i, server) in cluster.servers.iter().enumerate() {
            let reply = Conn::open(server.addr()).call(format!("get {k}\r\n").as_bytes(), |r| {
                r.ends_with(b"END\r\n")
            });
            let held = reply != b"END\r\n";
            assert_eq!(
                held,
                i == want,
                "{front:?}: key {k} on {} held={held}",
                NAMES[i]
            );
        }
    }
}

#[test]
fn keys_are_placed_as_nutcracker_places_them() {
    check_placement(Front::Kvswitch);
}

#[test]
fn a_nutcracker_yaml_file_serves_the_same_pool() {
    check_placement(Front::KvswitchYaml);
}

#[test]
fn harness_ring_matches_nutcracker() {
    check_placement(Front::Nutcracker);
}

#[test]
fn harness_configs_parse_with_kvswitchs_loaders() {
    use common::proxy::{ring, toml_config, yaml_config};
    use config::{nutcracker::parse_nutcracker, proxy::parse_toml};
    let servers: Vec<(&str, std::net::SocketAddr)> = NAMES
        .iter()
        .enumerate()
        .map(|(i, n)| (*n, ([127, 0, 0, 1], 21001 + i as u16).into()))
        .collect();
    let opts = PoolOpts {
        timeout_ms: 250,
        auto_eject_hosts: true,
        server_failure_limit: 1,
        server_retry_timeout_ms: 1500,
        ..PoolOpts::default()
    };
    let listen: std::net::SocketAddr = ([127, 0, 0, 1], 22122).into();
    let file = parse_toml(&toml_config(&servers, &opts, None), "t.toml".as_ref()).expect("TOML");
    let toml_pool = file.pool_with_listen(Some(listen)).expect("listen");
    let yaml_pools =
        parse_nutcracker(&yaml_config(listen, &servers, &opts), "t.yml".as_ref()).expect("YAML");
    assert_eq!(yaml_pools.len(), 1);
    for pool in [&toml_pool, &yaml_pools[0]] {
        assert_eq!(pool.listen, listen);
        assert_eq!(pool.timeout, std::time::Duration::from_millis(250));
        assert!(pool.auto_eject_hosts);
        assert_eq!(pool.server_failure_limit, 1);
        assert_eq!(
            pool.server_retry_timeout,
            std::time::Duration::from_millis(1500)
        );
        let names: Vec<String> = pool.servers.iter().map(|s| s.ring_name()).collect();
        assert_eq!(names, NAMES);
    }
    // The harness's ring is the one the proxy builds from the file.
    let theirs = toml_pool.ring().expect("ring");
    let ours = ring();
    for i in 0..2000 {
        let k = format!("ringcheck:{i}");
        assert_eq!(
            theirs.locate(k.as_bytes()),
            ours.locate(k.as_bytes()),
            "{k}"
        );
    }
}
