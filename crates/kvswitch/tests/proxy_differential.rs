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
