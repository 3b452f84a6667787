//! The XDP program against the switch (needs root, through `BPF_PROG_TEST_RUN`): the switch's
//! table of cases (`testkit::table`), a key of every length, the kernel's cache, a pool
//! change, and mutated frames. After the switch has seen a case's frame once and published its
//! tables, the program must either pass the frame up unchanged or do exactly what the switch
//! does with it the second time — the same port, the same bytes.
#![cfg(feature = "bpf")]

use testkit::table::*;

// ---------------------------------------------------------------------------------------------
// The same cases through the XDP fast path (`BPF_PROG_TEST_RUN`): after the switch has seen a
// case's frame once and published its tables, the program must either pass the frame up
// unchanged or do exactly what the switch does with it the second time — the same port, the
// same bytes.

/// The switch ports' stand-in interfaces: the program sends nothing during a test run.
fn fake_ifindex(port: u16) -> u32 {
    1000 + u32::from(port)
}

/// The XDP program, loaded, with every port of the table's switch (and a local port) named.
fn fast_path() -> xdp::FastPath {
    let mut fp = xdp::FastPath::load().expect("the XDP program loads (needs root)");
    fp.set_ports(&stand_in_ports()).expect("ports");
    fp
}

fn stand_in_ports() -> Vec<(u16, u32, bool)> {
    (0..=PORTS as u16)
        .map(|p| (p, fake_ifindex(p), true))
        .collect()
}

/// The files of a fuzz corpus, in name order.
fn corpus_files(name: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(name);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("the fuzz corpus {name}: {e}"))
        .map(|e| e.expect("a corpus entry").path())
        .collect();
    files.sort();
    files
        .iter()
        .map(|f| std::fs::read(f).expect("a corpus file"))
        .collect()
}

/// Runs `cases` through a fresh switch and the fast path; returns the names of the cases the
/// program handled itself.
fn run_xdp(
    fp: &mut xdp::FastPath,
    mode: Mode,
    rig: fn(Mode) -> Rig,
    cases: &[Case],
) -> Vec<&'static str> {
    let fx = Fx::new();
    let mut acted = Vec::new();
    fp.set_ports(&stand_in_ports()).expect("ports");
    for case in cases {
        let what = format!("{mode:?} through XDP: {}", case.name);
        let mut rig = rig(mode);
        rig.sw.set_fast_path(true);
        let input = (case.input)(&fx);
        let mut emit = Vec::new();
        rig.process(case.in_port, &mut input.clone(), &mut emit);
        fp.sync(&rig.sw.fast_tables()).expect("tables");
        let run = fp.test_run(&input, case.in_port).expect("test run");
        let mut frame = input.clone();
        let fate = rig.process(case.in_port, &mut frame, &mut Vec::new());
        match run.verdict {
            xdp::Verdict::Pass => {
                assert_eq!(run.frame, input, "{what}: a passed frame is unchanged")
            }
            xdp::Verdict::Tx | xdp::Verdict::Redirect => {
                let port = run.out_port.expect("a sent frame names its port");
                assert_eq!(
                    fate,
                    Fate::Out(port),
                    "{what}: the switch sends it there too"
                );
                // Redirected even back out of the in-port: a veth wakes its peer for XDP_TX
                // only when the peer runs XDP itself.
                assert_eq!(run.verdict, xdp::Verdict::Redirect, "{what}: redirected");
                assert_bytes(&format!("{what}: output"), &run.frame, &frame);
                acted.push(case.name);
            }
            xdp::Verdict::Drop => panic!("{what}: the program dropped it (a full bucket cannot)"),
            xdp::Verdict::Other(a) => panic!("{what}: the program returned action {a}"),
        }
    }
    acted
}

#[test]
fn xdp_fast_path_does_what_the_switch_does() {
    let mut fp = xdp::FastPath::load().expect("the XDP program loads (needs root)");
    let mut acted = run_xdp(&mut fp, Mode::L3, Rig::new, &l3_cases());
    acted.extend(run_xdp(&mut fp, Mode::L2, Rig::new, &l2_cases()));
    acted.extend(run_xdp(&mut fp, Mode::L3, Rig::local, &local_cases(VIP)));
    acted.extend(run_xdp(&mut fp, Mode::L3, checked, &bad_source_cases()));
    // The program is not merely passing everything up: reads to the VIP, replies and plain
    // unicast between stations are its own.
    for name in [
        "get to the VIP goes to the key's server, destination MAC and IP rewritten",
        "get for a key on the first server leaves by that server's port",
        "get without a UDP checksum is routed and keeps no checksum",
        "key of 250 bytes is routed",
        "reply from a backend's memcached port leaves with the VIP as source",
        "unicast to a learned MAC leaves by its port unchanged",
        "get to the VIP: only the destination MAC changes",
        "reply from a server that owns the VIP leaves unchanged",
    ] {
        assert!(
            acted.contains(&name),
            "the fast path passed up {name:?}; it handled {acted:#?}"
        );
    }
}

#[test]
fn xdp_hashes_every_key_length_as_the_ring_does() {
    let mut fp = fast_path();
    for hash in [
        "md5",
        "fnv1a_64",
        "fnv1_64",
        "fnv1a_32",
        "fnv1_32",
        "one_at_a_time",
    ] {
        let mut cfg = config(Mode::L3);
        cfg.hash = hash.parse().expect("a hash nutcracker knows");
        let mut rig = Rig::with(cfg, PORTS);
        rig.sw.set_fast_path(true);
        let mut emit = Vec::new();
        let mut warm = to_vip(b"get warm\r\n");
        assert!(matches!(
            rig.process(CLIENT.port, &mut warm, &mut emit),
            Fate::Out(_)
        ));
        fp.sync(&rig.sw.fast_tables()).expect("tables");
        let mut routed = [0usize; 3];
        for len in 1..=250usize {
            // Text keys of every length, and binary keys with bytes past 0x7f (which
            // nutcracker's hashes widen as a signed char).
            let text: Vec<u8> = (0..len)
                .map(|i| b'!' + ((i * 7 + len) % 94) as u8)
                .collect();
            let binary: Vec<u8> = (0..len)
                .map(|i| 0x80 + ((i * 13 + len) % 128) as u8)
                .collect();
            let mut text_req = b"get ".to_vec();
            text_req.extend_from_slice(&text);
            text_req.extend_from_slice(b"\r\n");
            let mut bin_req = Vec::new();
            wire::memcache::binary::write_request(0x00, &binary, b"", b"", 9, 0, &mut bin_req);
            for body in [text_req, bin_req] {
                let input = to_vip(&body);
                let what = format!("{hash}, a key of {len} bytes");
                let run = fp.test_run(&input, CLIENT.port).expect("test run");
                let mut frame = input.clone();
                let fate = rig.process(CLIENT.port, &mut frame, &mut emit);
                assert_eq!(
                    run.verdict,
                    xdp::Verdict::Redirect,
                    "{what}: routed by the program"
                );
                let port = run.out_port.expect("a port");
                assert_eq!(fate, Fate::Out(port), "{what}: to the switch's server");
                assert_bytes(&what, &run.frame, &frame);
                let server = SERVERS
                    .iter()
                    .position(|s| frame[0..6] == s.mac.0)
                    .expect("a server");
                routed[server] += 1;
            }
        }
        assert!(
            routed.iter().all(|&n| n > 0),
            "{hash}: every server gets keys: {routed:?}"
        );
    }
}

/// The kernel's monotonic clock now, ns: what the XDP program reads leases against.
fn ktime_now() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given, nothing else.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

#[test]
fn xdp_kernel_cache_answers_as_the_switch_and_drops_a_key_before_its_write() {
    use switch::cache::{CacheMirror, CacheService};
    let mut fp = fast_path();
    let fx = Fx::new();
    let mut cfg = config(Mode::L3);
    cfg.cache.enabled = true;
    let mut rig = Rig::with(cfg.clone(), PORTS);
    let cache = CacheService::new(cfg.cache.clone(), SERVERS.len(), rig.now).expect("cache");
    rig.sw
        .set_cache(cache.clone())
        .expect("the switch takes the cache");
    rig.sw.set_fast_path(true);
    // Leases on the rig's clock, turned into the kernel's: the rig's now is the kernel's now.
    let (rig_now, kernel_now) = (rig.now, ktime_now());
    let to_ktime = move |t: Instant| kernel_now + t.as_nanos().saturating_sub(rig_now.as_nanos());
    let mirror = fp
        .cache_mirror(HashFn::Md5, Box::new(to_ktime))
        .expect("the kernel cache");
    assert!(
        cache.set_mirror(std::sync::Arc::new(mirror)),
        "the cache's only mirror"
    );

    let key = fx.key(1, 0).to_string();
    cache.lock().pin(key.as_bytes(), rig.now).expect("pinned");
    let mut emit = Vec::new();
    rig.sw.tick(rig.now, &mut emit);
    emit.clear();
    let get = to_vip(format!("get {key}\r\n").as_bytes());
    // The first read goes to the server; its reply fills the cache and the kernel's copy.
    assert_eq!(
        rig.process(CLIENT.port, &mut get.clone(), &mut emit),
        Fate::Out(SERVERS[1].port)
    );
    let mut reply = udp_frame(
        SERVERS[1].mac,
        CLIENT.mac,
        (SERVERS[1].ip, MC_PORT),
        (CLIENT.ip, CLIENT_UDP_PORT),
        &mc(
            REQ_ID,
            0,
            1,
            format!("VALUE {key} 5 3\r\nabc\r\nEND\r\n").as_bytes(),
        ),
    );
    assert_eq!(
        rig.process(SERVERS[1].port, &mut reply, &mut emit),
        Fate::Out(CLIENT.port)
    );
    fp.sync(&rig.sw.fast_tables()).expect("tables");

    // The program answers it, byte for byte as the switch does from its cache.
    let run = fp.test_run(&get, CLIENT.port).expect("test run");
    assert_eq!(
        run.verdict,
        xdp::Verdict::Redirect,
        "a kernel-cache hit goes back out"
    );
    assert_eq!(run.out_port, Some(CLIENT.port));
    emit.clear();
    assert_eq!(
        rig.process(CLIENT.port, &mut get.clone(), &mut emit),
        Fate::Consumed
    );
    assert_eq!(emit.len(), 1, "the switch's own answer from its cache");
    assert_eq!(emit[0].dest, Dest::Port(CLIENT.port));
    assert_bytes("kernel-cache hit", &run.frame, &emit[0].frame);
    assert_checksums("kernel-cache hit", &run.frame);
    assert_eq!(fp.counters().cache_hits, 1);

    // A gets, an mg and a binary get of the same key are the switch's to answer.
    for other in [
        to_vip(format!("gets {key}\r\n").as_bytes()),
        to_vip(format!("mg {key} v\r\n").as_bytes()),
    ] {
        let run = fp.test_run(&other, CLIENT.port).expect("test run");
        assert_eq!(run.verdict, xdp::Verdict::Pass);
        assert_eq!(run.frame, other);
    }
    // Another key, not cached: up to the switch.
    let miss = to_vip(format!("get {}\r\n", fx.key(1, 1)).as_bytes());
    assert_eq!(
        fp.test_run(&miss, CLIENT.port).expect("run").verdict,
        xdp::Verdict::Pass
    );

    // A write to the key: the kernel's copy is gone before the write leaves the switch.
    let mut set = to_vip(format!("set {key} 0 0 3\r\nxyz\r\n").as_bytes());
    assert_eq!(
        rig.process(CLIENT.port, &mut set, &mut emit),
        Fate::Out(SERVERS[1].port)
    );
    let run = fp.test_run(&get, CLIENT.port).expect("test run");
    assert_eq!(
        run.verdict,
        xdp::Verdict::Pass,
        "a written key is not answered in the kernel"
    );
    assert_eq!(run.frame, get);

    // A value whose lease has ended is not answered either.
    let expired = fp
        .cache_mirror(HashFn::Md5, Box::new(|_| 1))
        .expect("the kernel cache");
    expired.fill(
        key.as_bytes(),
        format!("VALUE {key} 0 1\r\nq\r\nEND\r\n").as_bytes(),
        rig.now,
    );
    assert_eq!(
        fp.test_run(&get, CLIENT.port).expect("run").verdict,
        xdp::Verdict::Pass
    );
    expired.drop_all();
}

/// From the moment the pool publishes a new version the program hands reads up, and routes
/// them again only by the new version's ring: never by the old one after the switch (or the
/// proxy) can route by the new.
#[test]
fn xdp_hands_reads_up_from_a_pool_change_until_its_ring_is_in_use() {
    let mut fp = fast_path();
    let fx = Fx::new();
    let mut rig = Rig::new(Mode::L3);
    rig.sw.set_fast_path(true);
    assert!(rig.pool.set_fence(Arc::new(fp.pool_fence())));
    let get = to_vip(format!("get {}\r\n", fx.key(1, 0)).as_bytes());
    let mut emit = Vec::new();
    let mut route = |rig: &mut Rig| rig.process(CLIENT.port, &mut get.clone(), &mut emit);
    assert_eq!(route(&mut rig), Fate::Out(SERVERS[1].port));
    let synced = |fp: &mut xdp::FastPath, rig: &mut Rig| {
        rig.sw
            .fast_seen(&switch::fastpath::Seen::default(), rig.now);
        let tables = rig.sw.fast_tables();
        fp.sync(&tables).expect("tables");
        tables
    };
    let held = |fp: &xdp::FastPath| {
        let c = fp.counters();
        let at = xdp::PASS_REASONS
            .iter()
            .position(|(name, _)| *name == "pool_change")
            .expect("the reason");
        c.passed_by[at]
    };
    let old = synced(&mut fp, &mut rig);
    let run = fp.test_run(&get, CLIENT.port).expect("test run");
    assert_eq!(run.verdict, xdp::Verdict::Redirect, "in step: routed here");
    assert_eq!(run.out_port, Some(SERVERS[1].port));

    // The key's server leaves the pool; then it comes back.
    let s2 = rig.pool.spec().servers[1].clone();
    for n in 0..2 {
        let before = held(&fp);
        let changed = match n {
            0 => rig.pool.remove_server(1),
            _ => rig.pool.add_server(s2.clone()),
        };
        assert_eq!(changed.expect("changed").server, 1);
        // Before any path has routed by the new view, and however late the fast path's sync.
        let run = fp.test_run(&get, CLIENT.port).expect("test run");
        assert_eq!(run.verdict, xdp::Verdict::Pass, "change {n}: handed up");
        assert_eq!(run.frame, get, "change {n}: unchanged");
        assert_eq!(held(&fp), before + 1, "change {n}: counted");
        let owner = route(&mut rig);
        // Tables of the old ring change nothing.
        fp.sync(&old).expect("tables");
        assert_eq!(
            fp.test_run(&get, CLIENT.port).expect("run").verdict,
            xdp::Verdict::Pass,
            "change {n}: not by the old ring"
        );
        // In step again: routed where the switch routes it.
        synced(&mut fp, &mut rig);
        let run = fp.test_run(&get, CLIENT.port).expect("test run");
        assert_eq!(
            run.verdict,
            xdp::Verdict::Redirect,
            "change {n}: routed again"
        );
        assert_eq!(
            Fate::Out(run.out_port.expect("a port")),
            owner,
            "change {n}"
        );
    }
    assert_eq!(
        route(&mut rig),
        Fate::Out(SERVERS[1].port),
        "the key is server 1's again"
    );
}

/// A deterministic stream of numbers for the mutations below (xorshift64*).
struct Mutator(u64);

impl Mutator {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Sets the IPv4 and UDP lengths from the frame's size and refills both checksums, so that a
/// mutated payload reaches the key router rather than stopping at a length or checksum check.
fn refit(frame: &mut [u8]) {
    if frame.len() < PAYLOAD_AT {
        return;
    }
    let ip_len = (frame.len() - IP_AT) as u16;
    frame[IP_AT + 2..IP_AT + 4].copy_from_slice(&ip_len.to_be_bytes());
    frame[UDP_AT + 4..UDP_AT + 6].copy_from_slice(&(ip_len - 20).to_be_bytes());
    let addr = |at: usize| Ipv4Addr::from(<[u8; 4]>::try_from(&frame[at..at + 4]).expect("4"));
    let (src, dst) = (addr(IP_AT + 12), addr(IP_AT + 16));
    frame[IP_AT + 10..IP_AT + 12].fill(0);
    let sum = frame[IP_AT..UDP_AT]
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum::<u32>();
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = (sum & 0xffff) + (sum >> 16);
    frame[IP_AT + 10..IP_AT + 12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    if let Ok(mut u) = udp::Packet::new_checked(&mut frame[UDP_AT..]) {
        u.fill_checksum(src, dst);
    }
}

/// Requests that memcached would parse, or nearly: the seeds the mutations start from.
fn request_seeds(fx: &Fx) -> Vec<Vec<u8>> {
    let key = fx.key(1, 0);
    let mut seeds: Vec<Vec<u8>> = [
        format!("get {key}\r\n"),
        format!("gets {key}\r\n"),
        format!("mg {key} v k f t\r\n"),
        format!("mg {key}\r\n"),
        format!("get {key} {}\r\n", fx.key(1, 1)),
        format!("set {key} 0 0 1\r\nx\r\n"),
        format!("get {}\r\n", fx.long_key.0),
        format!("mg {key} v v\r\n"),
        format!("mg {key} b\r\n"),
        format!("get {key}\n"),
    ]
    .into_iter()
    .map(String::into_bytes)
    .collect();
    for op in [0x00u8, 0x09, 0x0c, 0x0d, 0x01] {
        let mut bin = Vec::new();
        wire::memcache::binary::write_request(op, key.as_bytes(), b"", b"", 7, 0, &mut bin);
        seeds.push(bin);
    }
    seeds.extend(corpus_files("memcache_request"));
    seeds
}

/// One mutation of a seed request, as a frame from the client to the VIP.
fn mutate(m: &mut Mutator, seed: &[u8]) -> Vec<u8> {
    let mut frame = to_vip(seed);
    match m.below(8) {
        0 => {}
        1 => {
            let at = PAYLOAD_AT + m.below(frame.len() - PAYLOAD_AT);
            frame[at] = m.next() as u8;
        }
        2 => {
            let at = m.below(frame.len());
            frame[at] ^= 1 << m.below(8);
        }
        3 => {
            let len = m.below(frame.len() + 1);
            frame.truncate(len);
        }
        4 => {
            for _ in 0..1 + m.below(8) {
                frame.push(m.next() as u8);
            }
        }
        5 => {
            // A key byte turned into a space, a control byte or a high byte.
            let at = PAYLOAD_AT + mcudp::LEN + 4 + m.below(4);
            if at < frame.len() {
                frame[at] = [b' ', b'\t', 0, 0x80, 0xff, b'\r', b'\n'][m.below(7)];
            }
        }
        6 => {
            // The memcached frame header's sequence, total or reserved field.
            let at = PAYLOAD_AT + 2 + m.below(6);
            frame[at] = m.next() as u8;
        }
        _ => {
            let at = IP_AT + m.below(PAYLOAD_AT - IP_AT);
            frame[at] = m.next() as u8;
        }
    }
    if m.below(2) == 0 {
        refit(&mut frame);
    }
    frame
}

#[test]
fn xdp_fast_path_forwards_nothing_malformed_the_switch_would_not() {
    let mut fp = fast_path();
    let fx = Fx::new();
    let seeds = request_seeds(&fx);
    // Each corpus frame arrives on the port its first byte picks, as in the fuzz target.
    let mut corpus: Vec<(u16, Vec<u8>)> = corpus_files("switch_process")
        .into_iter()
        .map(|bytes| (bytes.first().map_or(0, |b| u16::from(*b % 3)), bytes))
        .collect();
    let mut m = Mutator(0x6b76_7377_6974_6368);
    for i in 0..3000 {
        corpus.push((CLIENT.port, mutate(&mut m, &seeds[i % seeds.len()])));
    }
    let (mut acted, mut passed) = (0, 0);
    for mode in [Mode::L3, Mode::L2] {
        // One switch that knows the client and every server as senders, as after a first
        // exchange; each frame is judged against it as it stands.
        let mut rig = Rig::new(mode);
        rig.sw.set_fast_path(true);
        let mut emit = Vec::new();
        let mut warm = to_vip(format!("get {}\r\n", fx.key(0, 0)).as_bytes());
        assert!(matches!(
            rig.process(CLIENT.port, &mut warm, &mut emit),
            Fate::Out(_)
        ));
        for (s, server) in SERVERS.iter().enumerate() {
            let src = if mode == Mode::L2 { VIP } else { server.ip };
            let mut reply = backend_reply(s, src, MC_PORT);
            assert!(matches!(
                rig.process(server.port, &mut reply, &mut emit),
                Fate::Out(_)
            ));
        }
        for (n, (port, input)) in corpus.iter().enumerate() {
            let what = format!("{mode:?}: frame {n} ({} bytes) on port {port}", input.len());
            fp.sync(&rig.sw.fast_tables()).expect("tables");
            let run = fp.test_run(input, *port).expect("test run");
            let mut frame = input.clone();
            let fate = rig.process(*port, &mut frame, &mut emit);
            match run.verdict {
                xdp::Verdict::Pass => {
                    assert_eq!(&run.frame, input, "{what}: a passed frame is unchanged");
                    passed += 1;
                }
                xdp::Verdict::Tx | xdp::Verdict::Redirect => {
                    let out = run.out_port.expect("a sent frame names its port");
                    assert_eq!(
                        fate,
                        Fate::Out(out),
                        "{what}: sent where the switch sends it"
                    );
                    assert_bytes(&what, &run.frame, &frame);
                    acted += 1;
                }
                other => panic!("{what}: the program returned {other:?}"),
            }
            emit.clear();
        }
    }
    // Mutations that leave a request valid are routed by the program: it is not passing all.
    assert!(
        acted > 100,
        "the program sent only {acted} of {} frames",
        acted + passed
    );
    assert!(passed > 1000, "the program passed up only {passed} frames");
}

/// Runs the keyed cases through a switch with a keyed port and the fast path: a frame the
/// program sends on must be the one the switch sends (as a frame of its own, shorter by the
/// header), to the same port. Returns the names of the cases the program handled itself.
fn run_xdp_keyed(fp: &mut xdp::FastPath, mode: Mode) -> Vec<&'static str> {
    let fx = Fx::new();
    let mut acted = Vec::new();
    fp.set_ports(&stand_in_ports()).expect("ports");
    for case in keyed_cases(mode) {
        let what = format!("{mode:?} through XDP: {}", case.name);
        let mut rig = Rig::keyed(mode);
        rig.sw.set_fast_path(true);
        let input = (case.input)(&fx);
        rig.process(case.in_port, &mut input.clone(), &mut Vec::new());
        fp.sync(&rig.sw.fast_tables()).expect("tables");
        if keyed_agrees(fp, &mut rig, case.in_port, &input, &what) {
            acted.push(case.name);
        }
    }
    acted
}

/// Runs `input` through the program and then the switch: a frame the program passes must be
/// unchanged, and one it sends must be the frame the switch sends (as it came, or as a frame
/// of its own, shorter by the header), to the same port. Returns whether the program sent it.
fn keyed_agrees(
    fp: &mut xdp::FastPath,
    rig: &mut Rig,
    in_port: u16,
    input: &[u8],
    what: &str,
) -> bool {
    let run = fp.test_run(input, in_port).expect("test run");
    let mut frame = input.to_vec();
    let mut emit = Vec::new();
    let fate = rig.process(in_port, &mut frame, &mut emit);
    match run.verdict {
        xdp::Verdict::Pass => {
            assert_eq!(run.frame, input, "{what}: a passed frame is unchanged");
            false
        }
        xdp::Verdict::Redirect => {
            let port = run.out_port.expect("a sent frame names its port");
            let sent = match fate {
                Fate::Out(p) => (p, frame.clone()),
                Fate::Consumed => match &emit[..] {
                    [Emit {
                        dest: Dest::Port(p),
                        frame,
                    }] => (*p, frame.clone()),
                    _ => panic!("{what}: the program sent it; the switch emitted {emit:?}"),
                },
                Fate::Flood => panic!("{what}: the switch floods it"),
            };
            assert_eq!(port, sent.0, "{what}: the switch sends it there too");
            assert_bytes(&format!("{what}: output"), &run.frame, &sent.1);
            true
        }
        other => panic!("{what}: the program returned {other:?}"),
    }
}

/// 2,000 seeded mutations of keyed datagrams (the header's bytes and offsets, any byte or
/// bit, lengths; half with lengths and checksums made right again) through a switch with a
/// keyed port that knows the client and the servers: the program sends nothing the switch
/// would not send, byte for byte, and the switch drops the bad headers it is given.
#[test]
fn xdp_forwards_no_mutated_keyed_datagram_the_switch_would_not() {
    let mut fp = fast_path();
    let fx = Fx::new();
    let seeds: Vec<Vec<u8>> = vec![
        lookup(fx.key(0, 0)),
        lookup(fx.key(1, 1)),
        lookup(&fx.long_key.0),
        to_keyed(fx.key(2, 0).as_bytes(), 0..fx.key(2, 0).len()),
    ];
    let mut m = Mutator(0x6b65_7965_6421);
    let (mut acted, mut passed) = (0, 0);
    for mode in [Mode::L3, Mode::L2] {
        let mut rig = Rig::keyed(mode);
        rig.sw.set_fast_path(true);
        for seed in &seeds {
            rig.process(CLIENT.port, &mut seed.clone(), &mut Vec::new());
        }
        let bad_before = stats::get(&rig.stats.drops[Drop::BadKeyHeader as usize]);
        for n in 0..1000 {
            let mut frame = seeds[n % seeds.len()].clone();
            match m.below(6) {
                0 => {}
                1 => {
                    // The header: the preamble, the version or an offset's bytes.
                    let at = PAYLOAD_AT + m.below(wire::keyloc::LEN);
                    frame[at] = m.next() as u8;
                }
                2 => {
                    // An offset moved by a little, either way.
                    let at = PAYLOAD_AT + 4 + 4 * m.below(2) + 3;
                    frame[at] = frame[at].wrapping_add(m.below(5) as u8).wrapping_sub(2);
                }
                3 => {
                    let at = m.below(frame.len());
                    frame[at] ^= 1 << m.below(8);
                }
                4 => {
                    let len = m.below(frame.len() + 1);
                    frame.truncate(len);
                }
                _ => {
                    for _ in 0..1 + m.below(8) {
                        frame.push(m.next() as u8);
                    }
                }
            }
            if m.below(2) == 0 {
                refit(&mut frame);
            }
            let what = format!("{mode:?}: mutated keyed frame {n} ({} bytes)", frame.len());
            fp.sync(&rig.sw.fast_tables()).expect("tables");
            match keyed_agrees(&mut fp, &mut rig, CLIENT.port, &frame, &what) {
                true => acted += 1,
                false => passed += 1,
            }
        }
        let bad = stats::get(&rig.stats.drops[Drop::BadKeyHeader as usize]) - bad_before;
        assert!(
            bad > 100,
            "{mode:?}: the switch dropped only {bad} bad headers"
        );
    }
    assert!(
        acted > 200,
        "the program sent only {acted} of {} frames",
        acted + passed
    );
    assert!(passed > 200, "the program passed up only {passed} frames");
}

#[test]
fn xdp_routes_keyed_datagrams_as_the_switch_and_forwards_no_bad_header() {
    let mut fp = fast_path();
    let mut acted = run_xdp_keyed(&mut fp, Mode::L3);
    acted.extend(run_xdp_keyed(&mut fp, Mode::L2));
    for name in [
        "keyed request goes to its key's server without its header",
        "keyed request for another server goes there",
        "keyed request with a 250-byte key is routed",
        "keyed request without a UDP checksum keeps none",
        "keyed request whose key is the whole payload is routed",
        "reply from a server's keyed port leaves with the VIP as source",
        "keyed request in l2 mode: only the MAC changes, and the header goes",
        "reply from the VIP's keyed port in l2 mode leaves unchanged",
    ] {
        assert!(
            acted.contains(&name),
            "the fast path passed up {name:?}; it handled {acted:#?}"
        );
    }
    // Every bad header went up, to be counted and dropped there.
    for case in bad_keyed_cases() {
        assert!(
            !acted.contains(&case.name),
            "{}: sent on by the program",
            case.name
        );
    }
}
