//! Cost of `Switch::process` per frame on the paths that matter: plain L2 switching, a
//! single-key request routed by key (ketama, md5), a backend reply rewritten to the VIP and
//! the start of a multi-key get split across servers; with the cache on, a get answered from
//! the cache and one that is not cached.
//!
//! A small timing harness: inputs are built before the clock starts; each figure is the median
//! of 5 runs of `ITERS` frames. Frames the switch rewrites in place are copied from a pristine
//! buffer before every call; that copy is timed on its own and printed so it can be
//! subtracted. Nothing here asserts on time.

use std::hint::black_box;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kv::{Distribution, HashFn};
use switch::cache::{CacheService, CacheSettings};
use switch::pool::Pool;
use switch::spec;
use switch::stats::Stats;
use switch::{Emit, Fate, Switch, SwitchSpec};
use wire::ethernet::Mac;
use wire::mcudp;

const ITERS: u64 = 200_000;
const RUNS: usize = 5;
const PORTS: usize = 3;

const VIP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 100);
const VIP_MAC: Mac = Mac([2, 0, 0, 0, 0, 0x64]);
const CLIENT_MAC: Mac = Mac([2, 0, 0, 0, 0, 1]);
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

/// Backend `i` of a pool: its address, MAC and the port it sits behind (the client is alone
/// on port 0).
fn backend(i: usize) -> (Ipv4Addr, Mac, u16) {
    let ip = Ipv4Addr::new(10, 0, 1 + (i / 200) as u8, 11 + (i % 200) as u8);
    let mac = Mac([2, 0, 0, 1, (i >> 8) as u8, i as u8]);
    (ip, mac, 1 + (i % 2) as u16)
}

/// A switch of three ports in front of `backends` servers with known MACs, `l3` mode; the
/// pool ketama over md5, every server in it.
fn spec(backends: usize) -> (SwitchSpec, Arc<Pool>) {
    let servers = (0..backends)
        .map(|i| {
            let (ip, mac, _) = backend(i);
            spec::Server {
                addr: SocketAddrV4::new(ip, 11211),
                mac: Some(mac),
            }
        })
        .collect();
    let mut spec = SwitchSpec::new(PORTS, VIP, servers);
    spec.vip.mac = VIP_MAC;
    let pool = Pool::new(spec.pool_spec(Distribution::Ketama, HashFn::Md5)).expect("pool");
    (spec, Arc::new(pool))
}

fn udp_frame(
    src_mac: Mac,
    dst_mac: Mac,
    src: (Ipv4Addr, u16),
    dst: (Ipv4Addr, u16),
    payload: &[u8],
) -> Vec<u8> {
    switch::frame::udp_frame(
        &wire::frame::UdpEnds::between((src_mac, src.0, src.1), (dst_mac, dst.0, dst.1)),
        &[payload],
    )
}

/// A single-datagram memcached request from the client to the VIP.
fn request(body: &[u8]) -> Vec<u8> {
    let mut payload = vec![0u8; mcudp::LEN];
    mcudp::Header::single(7).emit(&mut payload);
    payload.extend_from_slice(body);
    udp_frame(
        CLIENT_MAC,
        VIP_MAC,
        (CLIENT_IP, 40000),
        (VIP, 11211),
        &payload,
    )
}

/// A switch over `backends` servers whose MAC table holds the client and every backend.
fn switch(backends: usize) -> (Switch, kv::Instant) {
    switch_with(backends, false)
}

fn switch_with(backends: usize, cache: bool) -> (Switch, kv::Instant) {
    let stats = Arc::new(Stats::new(PORTS, backends));
    let (mut spec, pool) = spec(backends);
    spec.cache = cache;
    let mut sw = Switch::new(spec, pool, stats).expect("switch");
    let now = kv::Instant::from_secs(1);
    let mut emit = Vec::new();
    let hello = |mac: Mac, ip: Ipv4Addr| {
        udp_frame(
            mac,
            Mac::BROADCAST,
            (ip, 9),
            (Ipv4Addr::BROADCAST, 9),
            b"hello",
        )
    };
    sw.process(0, &mut hello(CLIENT_MAC, CLIENT_IP), true, now, &mut emit);
    for i in 0..backends {
        let (ip, mac, port) = backend(i);
        sw.process(port, &mut hello(mac, ip), true, now, &mut emit);
    }
    (sw, now)
}

/// Runs `run(ITERS)` (which returns the time its timed part took) `RUNS` times after one
/// warm-up run, and returns the median in nanoseconds per iteration.
fn median_ns(mut run: impl FnMut(u64) -> Duration) -> f64 {
    run(ITERS / 4);
    let mut runs: Vec<f64> = (0..RUNS)
        .map(|_| run(ITERS).as_nanos() as f64 / ITERS as f64)
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[RUNS / 2]
}

/// Times processing a frame that the switch does not change, in place.
fn bench_unchanged(sw: &mut Switch, now: kv::Instant, in_port: u16, frame: &[u8]) -> f64 {
    let mut work = frame.to_vec();
    let mut emit: Vec<Emit> = Vec::new();
    median_ns(|iters| {
        let t = Instant::now();
        for _ in 0..iters {
            black_box(sw.process(in_port, black_box(&mut work[..]), true, now, &mut emit));
        }
        t.elapsed()
    })
}

/// Times copying the pristine frame into the work buffer and processing it there.
fn bench_rewritten(sw: &mut Switch, now: kv::Instant, in_port: u16, frame: &[u8]) -> f64 {
    let mut work = frame.to_vec();
    let mut emit: Vec<Emit> = Vec::new();
    median_ns(|iters| {
        let t = Instant::now();
        for _ in 0..iters {
            work.copy_from_slice(black_box(frame));
            black_box(sw.process(in_port, black_box(&mut work[..]), true, now, &mut emit));
        }
        t.elapsed()
    })
}

/// Times the copy alone, as `bench_rewritten` does it.
fn bench_copy(frame: &[u8]) -> f64 {
    let mut work = frame.to_vec();
    median_ns(|iters| {
        let t = Instant::now();
        for _ in 0..iters {
            work.copy_from_slice(black_box(frame));
            black_box(&mut work[..]);
        }
        t.elapsed()
    })
}

fn report(name: &str, ns: f64, copy: Option<f64>) {
    match copy {
        Some(c) => println!(
            "{name:<44} {ns:>8.1} ns/frame  (incl. {c:.1} ns frame copy; {:.1} ns net)",
            ns - c
        ),
        None => println!("{name:<44} {ns:>8.1} ns/frame"),
    }
}

/// Expected fate of one frame, checked once before timing so the bench measures the path
/// it names.
fn check(sw: &mut Switch, now: kv::Instant, in_port: u16, frame: &[u8], want: Fate) -> Vec<Emit> {
    let mut work = frame.to_vec();
    let mut emit = Vec::new();
    let fate = sw.process(in_port, &mut work, true, now, &mut emit);
    assert_eq!(fate, want, "bench input takes an unexpected path");
    emit
}

fn main() {
    println!("Switch::process, median of {RUNS} runs of {ITERS} frames");

    // Plain L2 switching: backend 0 (port 1) to backend 1 (port 2), not memcached.
    let (mut sw, now) = switch(3);
    let (ip0, mac0, port0) = backend(0);
    let (ip1, mac1, port1) = backend(1);
    let plain = udp_frame(mac0, mac1, (ip0, 5000), (ip1, 6000), &[0u8; 64]);
    check(&mut sw, now, port0, &plain, Fate::Out(port1));
    report(
        "l2 switched frame",
        bench_unchanged(&mut sw, now, port0, &plain),
        None,
    );

    // A single-key get routed by key.
    let get = request(b"get user:1000:profile\r\n");
    let copy = bench_copy(&get);
    for backends in [3, 100] {
        let (mut sw, now) = switch(backends);
        let fate = {
            let mut work = get.clone();
            sw.process(0, &mut work, true, now, &mut Vec::new())
        };
        assert!(matches!(fate, Fate::Out(1 | 2)), "get not routed: {fate:?}");
        report(
            &format!("udp get routed by key, {backends} backends"),
            bench_rewritten(&mut sw, now, 0, &get),
            Some(copy),
        );
    }

    // A reply from backend 0's memcached port, rewritten to come from the VIP.
    let (mut sw, now) = switch(3);
    let mut payload = vec![0u8; mcudp::LEN];
    mcudp::Header::single(7).emit(&mut payload);
    payload.extend_from_slice(b"VALUE user:1000:profile 0 16\r\n0123456789abcdef\r\nEND\r\n");
    let reply = udp_frame(mac0, CLIENT_MAC, (ip0, 11211), (CLIENT_IP, 40000), &payload);
    check(&mut sw, now, port0, &reply, Fate::Out(0));
    report(
        "backend reply rewritten to the VIP",
        bench_rewritten(&mut sw, now, port0, &reply),
        Some(bench_copy(&reply)),
    );

    // A 10-key get split across the servers: the start only (sub-requests built, the split
    // recorded). The split table is emptied by `tick` every batch, outside the clock.
    let (mut sw, now) = switch(3);
    let keys: Vec<String> = (0..10).map(|i| format!("user:{i}:profile")).collect();
    let multi = request(format!("get {}\r\n", keys.join(" ")).as_bytes());
    let parts = check(&mut sw, now, 0, &multi, Fate::Consumed).len();
    assert!(parts > 1, "the bench multi-get must span servers");
    let later = now + Duration::from_secs(60);
    let mut emit = Vec::new();
    sw.tick(later, &mut emit);
    // The split path reads the request and never rewrites it: one buffer serves every call.
    let mut work = multi.clone();
    const BATCH: u64 = 1024;
    let ns = median_ns(|iters| {
        let mut timed = Duration::ZERO;
        let mut left = iters;
        while left > 0 {
            let n = left.min(BATCH);
            let t = Instant::now();
            for _ in 0..n {
                emit.clear();
                black_box(sw.process(0, black_box(&mut work[..]), true, now, &mut emit));
            }
            timed += t.elapsed();
            left -= n;
            sw.tick(later, &mut emit);
        }
        timed
    });
    report(
        &format!("10-key get split start ({parts} servers)"),
        ns,
        None,
    );

    // The cache on: a get of a cached key answered by the switch (reply built and emitted),
    // and a get of a key that is not cached (detection, then routed as before).
    let (mut sw, now) = cached_switch(3);
    let key: &[u8] = b"user:1000:profile";
    let cache = {
        let settings = CacheSettings {
            enabled: true,
            ..CacheSettings::default()
        };
        let service = CacheService::new(settings, 3, now).expect("cache");
        sw.set_cache(service.clone()).expect("cache table");
        service
    };
    {
        let mut c = cache.lock();
        c.pin(key, now).expect("pin");
        let token = c.fill_token(key).expect("cached");
        let value = kv::cache::Value {
            flags: 0,
            cas: Some(1),
            data: b"0123456789abcdef".to_vec().into(),
            key_base64: None,
        };
        c.fill(key, token, value, now);
    }
    sw.tick(now, &mut Vec::new());
    let emitted = check(&mut sw, now, 0, &get, Fate::Consumed);
    assert_eq!(emitted.len(), 1, "the cached get is answered");
    let mut emit = Vec::new();
    let mut work = get.clone();
    let ns = median_ns(|iters| {
        let t = Instant::now();
        for _ in 0..iters {
            emit.clear();
            black_box(sw.process(0, black_box(&mut work[..]), true, now, &mut emit));
        }
        t.elapsed()
    });
    report("udp get answered from the cache", ns, None);
    let other = request(b"get user:2000:profile\r\n");
    report(
        "udp get routed by key, cache on (not cached)",
        bench_rewritten(&mut sw, now, 0, &other),
        Some(copy),
    );
}

/// [`switch`] with the cache turned on in its configuration.
fn cached_switch(backends: usize) -> (Switch, kv::Instant) {
    let (sw, now) = switch_with(backends, true);
    (sw, now)
}
