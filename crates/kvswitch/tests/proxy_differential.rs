//! The proxy against memcached itself, on streams of valid and mutated requests: each stream
//! goes on a fresh connection to one memcached directly and through the proxy to three, and the
//! replies (masked for what two memcached processes legitimately differ in) and whether the
//! connection stayed open must be the same. Seeded and bounded; `KVSWITCH_DIFF_SEED` and
//! `KVSWITCH_DIFF_CASES` replay or widen a run. The same check runs unbounded as the
//! `proxy_differential` cargo-fuzz target.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use common::proxy::{show, Cluster, Front, PoolOpts};
use testbed::differential::{case, exchange};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Streams the fuzzer and the seeded cases once found the proxy reading otherwise than
/// memcached: (binary, bytes).
fn regressions() -> Vec<(bool, Vec<u8>)> {
    let mut huge_set = vec![0x80, 0x01, 0x00, 0x05, 0x08, 0, 0, 0];
    huge_set.extend_from_slice(&[0xff; 4 + 4 + 8 + 8 + 5]);
    huge_set.extend_from_slice(&[0x00, 0x00, 0x00, 0x12, 0xda, 0xad, 0xbe, 0xef]);
    huge_set.extend_from_slice(&[0; 14]);
    huge_set.extend_from_slice(b"\x0e\x00\x00\x00keyhel");
    let mut gat_long_body = vec![0x80, 0x1d, 0, 3, 4, 0, 0, 0, 0, 0, 0, 0x20, 0, 0, 0, 1];
    gat_long_body.extend_from_slice(&[0; 12]);
    gat_long_body.extend_from_slice(b"abc");
    gat_long_body.extend_from_slice(&[0x80, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    gat_long_body.extend_from_slice(&[0; 12]);
    let mut unknown_negative_body = vec![0x80, 0x50, 0, 0, 0, 0, 0, 5, 0xde, 0xad, 0xbe, 0xef];
    unknown_negative_body.extend_from_slice(&[0; 8]);
    unknown_negative_body.extend_from_slice(b"key:1");
    vec![
        (true, huge_set),
        (true, unknown_negative_body),
        (true, gat_long_body),
        (false, format!("ms k 7 {}\r\nget u10\r\n", ["T1"; 30].join(" ")).into_bytes()),
        (false, b"ms b!!!! 13 b\r\ndelete victim\r\n".to_vec()),
        (false, b"ms d\0eed.k1 3 c q O42\r\nabc\r\n".to_vec()),
        (false, b"ms ZDVlZWQ\ruOTFrMA== 11 b\r\nabcdefghijk\r\n".to_vec()),
        (false, b"touch x 1\r\nversion\r\nget a kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk\r\n".to_vec()),
        (false, b"gat 100 a b\r\nget kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk\r\nmn\r\n".to_vec()),
        (false, b"set k 0 0 4294967297\r\nx\r\nget k\r\n".to_vec()),
        (false, b"mg YQ==YWJj b k v\r\nmg Y!Q== b k\r\n".to_vec()),
    ]
}

#[test]
fn streams_that_once_differed_are_answered_as_memcached_does() {
    let cluster = Cluster::start(Front::Kvswitch, &PoolOpts::default());
    for (binary, bytes) in regressions() {
        let c = testbed::differential::Case {
            requests: 1,
            bytes,
            binary,
        };
        let want = exchange(cluster.reference.addr(), &c).expect("memcached answers");
        let got = exchange(cluster.addr(), &c).expect("the proxy answers");
        assert!(
            got.matches(&want),
            "{}\n  memcached: {want:?}\n  proxy:     {got:?}",
            show(&c.bytes)
        );
    }
}

#[test]
fn the_proxy_answers_every_stream_as_memcached_does() {
    let seed = env_u64("KVSWITCH_DIFF_SEED", 0x5eed);
    let cases = env_u64("KVSWITCH_DIFF_CASES", 1500);
    let cluster = Arc::new(Cluster::start(Front::Kvswitch, &PoolOpts::default()));
    let next = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (cluster, next, failures) = (cluster.clone(), next.clone(), failures.clone());
            thread::spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= cases {
                    return;
                }
                let c = case(seed, i);
                let want = exchange(cluster.reference.addr(), &c).expect("memcached answers");
                let got = exchange(cluster.addr(), &c).expect("the proxy answers");
                if !got.matches(&want) {
                    let bytes = if c.binary {
                        c.bytes.iter().map(|b| format!("{b:02x}")).collect()
                    } else {
                        show(&c.bytes)
                    };
                    failures.lock().unwrap().push(format!(
                        "case {i} (seed {seed:#x}): {bytes}\n  memcached: {want:?}\n  proxy:     {got:?}"
                    ));
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    let failures = failures.lock().unwrap();
    assert!(cluster.proxy_is_alive(), "{}", cluster.proxy.log_tail());
    assert!(
        failures.is_empty(),
        "{} of {cases} streams differ:\n{}",
        failures.len(),
        failures
            .iter()
            .take(12)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}
