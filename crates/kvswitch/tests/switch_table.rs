//! Table-driven tests of the switch application (katran's fixtures in spirit): each case is a
//! frame and the port it arrives on, and says what must happen — the fate, the frame as it
//! leaves, the frames the switch originates and the one counter that moves. The switch does no
//! I/O, so it is driven directly, as the run loop drives it.
//!
//! Expected frames are built here from the `wire` crate and the ring is computed here from
//! `kv`, never from the switch's own builders.

use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kv::Instant;

use config::{Config, Mode};
use kv::{Distribution, HashFn, Ring, Server};
use switch::stats::{self, Answer, Drop, Stats};
use switch::{Dest, Emit, Fate, Switch};
use wire::ethernet::{self, EtherType, Mac};
use wire::{arp, ipv4, mcudp, udp};

// ---------------------------------------------------------------------------------------------
// The topology: one client on port 0, s1 on port 1, s2 and s3 on port 2; with a local port
// (the host's own stack behind it, with the VIP's MAC), that is port 3.

#[derive(Clone, Copy, Debug)]
struct Host {
    mac: Mac,
    ip: Ipv4Addr,
    port: u16,
}

const fn mac(last: u8) -> Mac {
    Mac([0x02, 0, 0, 0, 0, last])
}

const PORTS: usize = 3;
/// The local port's number when the switch has one (after the configured ports).
const LOCAL: u16 = 3;
/// In l2 mode the host behind the local port speaks to the servers from this address.
const AGENT: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 101);
const VIP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 100);
const VIP_MAC: Mac = mac(0x64);
const MC_PORT: u16 = 11211;
const AGENT_PORT: u16 = 11311;
const CLIENT_UDP_PORT: u16 = 40000;
/// The request id every client request in the table carries.
const REQ_ID: u16 = 0xbeef;

const CLIENT: Host = Host {
    mac: mac(0x01),
    ip: Ipv4Addr::new(10, 0, 0, 1),
    port: 0,
};
const SERVERS: [Host; 3] = [
    Host {
        mac: mac(0x0b),
        ip: Ipv4Addr::new(10, 0, 0, 11),
        port: 1,
    },
    Host {
        mac: mac(0x0c),
        ip: Ipv4Addr::new(10, 0, 0, 12),
        port: 2,
    },
    Host {
        mac: mac(0x0d),
        ip: Ipv4Addr::new(10, 0, 0, 13),
        port: 2,
    },
];
const SERVER_NAMES: [&str; 3] = ["s1", "s2", "s3"];
/// A station the switch has never heard from.
const STRANGER: Mac = mac(0x99);

/// The switch without a local port (TCP to the VIP is dropped).
fn config(mode: Mode) -> Config {
    config_text(mode, "local_port = \"\"", "")
}

/// The switch with a local port `lp` (port 3); in l2 mode with the agent address.
fn config_local(mode: Mode) -> Config {
    let agent = match mode {
        Mode::L3 => String::new(),
        Mode::L2 => format!("agent_ip = \"{AGENT}\"\n"),
    };
    config_text(mode, "local_port = \"lp\"", &agent)
}

fn config_text(mode: Mode, switch_extra: &str, vip_extra: &str) -> Config {
    let mode = match mode {
        Mode::L3 => "l3",
        Mode::L2 => "l2",
    };
    let mut text = format!(
        "[switch]\nports = [\"p0\", \"p1\", \"p2\"]\nmode = \"{mode}\"\n{switch_extra}\n\n\
         [vip]\nip = \"{VIP}\"\nmac = \"{VIP_MAC}\"\nport = {MC_PORT}\n{vip_extra}\
         agent_port = {AGENT_PORT}\nsplit_timeout_ms = 1000\n\n\
         [pool]\ndistribution = \"ketama\"\nhash = \"md5\"\n"
    );
    for (s, name) in SERVERS.iter().zip(SERVER_NAMES) {
        text.push_str(&format!(
            "\n[[pool.servers]]\naddr = \"{}:{MC_PORT}\"\nmac = \"{}\"\nname = \"{name}\"\n",
            s.ip, s.mac
        ));
    }
    Config::parse(&text, Path::new("switch_table.toml")).expect("test configuration parses")
}

/// The pool's ring, built from the names alone.
fn ring() -> Ring {
    let servers: Vec<Server> = SERVER_NAMES.iter().map(|n| Server::new(*n, 1)).collect();
    Ring::new(Distribution::Ketama, HashFn::Md5, &servers).expect("ring")
}

/// Keys whose servers are known in advance, found with the ring above.
struct Fx {
    /// `key_on[s][n]`: the `n`th key of the form `key:<i>` that lives on server `s`.
    key_on: [Vec<String>; 3],
    /// A 250-byte key (memcached's longest) and its server.
    long_key: (String, usize),
}

impl Fx {
    fn new() -> Fx {
        let ring = ring();
        let mut key_on: [Vec<String>; 3] = Default::default();
        let mut i = 0;
        while key_on.iter().any(|k| k.len() < 3) {
            let key = format!("key:{i}");
            key_on[ring.locate(key.as_bytes())].push(key);
            i += 1;
        }
        let long = format!("{:x<250}", "long:");
        let server = ring.locate(long.as_bytes());
        Fx {
            key_on,
            long_key: (long, server),
        }
    }

    fn key(&self, server: usize, n: usize) -> &str {
        &self.key_on[server][n]
    }
}

/// A switch whose MAC table already holds every host (each has sent one frame).
struct Rig {
    sw: Switch,
    stats: Arc<Stats>,
    pool: Arc<switch::pool::Pool>,
    now: Instant,
}

impl Rig {
    fn new(mode: Mode) -> Rig {
        Rig::with(config(mode), PORTS)
    }

    /// With a local port, numbered `LOCAL`.
    fn local(mode: Mode) -> Rig {
        let rig = Rig::with(config_local(mode), PORTS + 1);
        assert_eq!(rig.sw.local_port(), Some(LOCAL));
        rig
    }

    fn with(cfg: Config, ports: usize) -> Rig {
        let stats = Arc::new(Stats::new(ports, SERVERS.len()));
        let pool = Arc::new(cfg.pool().expect("the pool builds"));
        let mut sw =
            Switch::new(cfg.switch_spec(ports, 0), pool.clone(), stats.clone()).expect("switch");
        let now = Instant::from_secs(1_000);
        let mut emit = Vec::new();
        for h in std::iter::once(&CLIENT).chain(&SERVERS) {
            let mut f = arp_request(h, Ipv4Addr::new(10, 0, 0, 250));
            assert_eq!(
                sw.process(h.port, &mut f, true, now, &mut emit),
                Fate::Flood
            );
        }
        assert!(emit.is_empty());
        Rig {
            sw,
            stats,
            pool,
            now,
        }
    }

    fn process(&mut self, in_port: u16, frame: &mut [u8], emit: &mut Vec<Emit>) -> Fate {
        self.sw.process(in_port, frame, true, self.now, emit)
    }
}

// ---------------------------------------------------------------------------------------------
// Frame builders.

const IP_AT: usize = ethernet::HEADER_LEN;
const UDP_AT: usize = IP_AT + ipv4::HEADER_LEN;
const PAYLOAD_AT: usize = UDP_AT + udp::HEADER_LEN;

/// An Ethernet/IPv4/UDP frame with both checksums filled.
fn udp_frame(
    src_mac: Mac,
    dst_mac: Mac,
    src: (Ipv4Addr, u16),
    dst: (Ipv4Addr, u16),
    payload: &[u8],
) -> Vec<u8> {
    let mut buf = vec![0u8; PAYLOAD_AT + payload.len()];
    ethernet::Repr {
        src: src_mac,
        dst: dst_mac,
        ethertype: EtherType::IPV4,
    }
    .emit(&mut buf);
    ipv4::Repr {
        src: src.0,
        dst: dst.0,
        protocol: ipv4::Protocol::UDP,
        payload_len: (udp::HEADER_LEN + payload.len()) as u16,
        ttl: 64,
    }
    .emit(&mut buf[IP_AT..]);
    udp::Repr {
        src_port: src.1,
        dst_port: dst.1,
        payload_len: payload.len() as u16,
    }
    .emit(&mut buf[UDP_AT..]);
    buf[PAYLOAD_AT..].copy_from_slice(payload);
    udp::Packet::new_checked(&mut buf[UDP_AT..])
        .expect("datagram just built")
        .fill_checksum(src.0, dst.0);
    buf
}

/// A memcached UDP frame header followed by `body`.
fn mc(request_id: u16, seq: u16, total: u16, body: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; mcudp::LEN];
    mcudp::Header {
        request_id,
        seq,
        total,
        reserved: 0,
    }
    .emit(&mut out);
    out.extend_from_slice(body);
    out
}

/// A client datagram to the VIP's memcached port carrying `payload` (frame header included).
fn to_vip_raw(payload: &[u8]) -> Vec<u8> {
    udp_frame(
        CLIENT.mac,
        VIP_MAC,
        (CLIENT.ip, CLIENT_UDP_PORT),
        (VIP, MC_PORT),
        payload,
    )
}

/// A single-datagram memcached request from the client to the VIP.
fn to_vip(body: &[u8]) -> Vec<u8> {
    to_vip_raw(&mc(REQ_ID, 0, 1, body))
}

/// The reply the switch sends the client from the VIP for request `REQ_ID`.
fn from_vip(body: &[u8]) -> Emit {
    from_vip_id(REQ_ID, body)
}

fn from_vip_id(request_id: u16, body: &[u8]) -> Emit {
    Emit {
        dest: Dest::Port(CLIENT.port),
        frame: udp_frame(
            VIP_MAC,
            CLIENT.mac,
            (VIP, MC_PORT),
            (CLIENT.ip, CLIENT_UDP_PORT),
            &mc(request_id, 0, 1, body),
        ),
    }
}

/// A datagram from a backend's memcached port to the client.
fn backend_reply(server: usize, src_ip: Ipv4Addr, src_port: u16) -> Vec<u8> {
    udp_frame(
        SERVERS[server].mac,
        CLIENT.mac,
        (src_ip, src_port),
        (CLIENT.ip, CLIENT_UDP_PORT),
        &mc(REQ_ID, 0, 1, b"END\r\n"),
    )
}

fn arp_frame(eth_dst: Mac, repr: &arp::Repr) -> Vec<u8> {
    let mut buf = vec![0u8; ethernet::HEADER_LEN + arp::LEN];
    ethernet::Repr {
        src: repr.sender_mac,
        dst: eth_dst,
        ethertype: EtherType::ARP,
    }
    .emit(&mut buf);
    repr.emit(&mut buf[ethernet::HEADER_LEN..]);
    buf
}

fn arp_request(from: &Host, target: Ipv4Addr) -> Vec<u8> {
    arp_frame(
        Mac::BROADCAST,
        &arp::Repr {
            operation: arp::Operation::Request,
            sender_mac: from.mac,
            sender_ip: from.ip,
            target_mac: Mac::ZERO,
            target_ip: target,
        },
    )
}

/// Sets raw IPv4 header bytes and fixes the header checksum.
fn patch_ipv4(mut frame: Vec<u8>, at: usize, bytes: &[u8]) -> Vec<u8> {
    frame[IP_AT + at..IP_AT + at + bytes.len()].copy_from_slice(bytes);
    ipv4::Packet::new_checked(&mut frame[IP_AT..])
        .expect("valid IPv4 header")
        .fill_checksum();
    frame
}

/// The same datagram with four NOP option bytes in its IPv4 header.
fn with_ipv4_options(frame: &[u8]) -> Vec<u8> {
    let mut out = frame[..UDP_AT].to_vec();
    out.extend_from_slice(&[1, 1, 1, 1]);
    out.extend_from_slice(&frame[UDP_AT..]);
    let total = u16::from_be_bytes([out[IP_AT + 2], out[IP_AT + 3]]) + 4;
    out[IP_AT] = 0x46;
    out[IP_AT + 2..IP_AT + 4].copy_from_slice(&total.to_be_bytes());
    patch_ipv4(out, 0, &[0x46])
}

/// A TCP segment (bare 20-byte header) from the client to the VIP's memcached port.
fn tcp_to_vip() -> Vec<u8> {
    tcp_frame(
        CLIENT.mac,
        VIP_MAC,
        (CLIENT.ip, CLIENT_UDP_PORT),
        (VIP, MC_PORT),
        b"",
    )
}

/// An Ethernet/IPv4/TCP frame (ACK+PSH, 20-byte header) carrying `payload`, checksums filled.
fn tcp_frame(
    src_mac: Mac,
    dst_mac: Mac,
    src: (Ipv4Addr, u16),
    dst: (Ipv4Addr, u16),
    payload: &[u8],
) -> Vec<u8> {
    let mut buf = vec![0u8; UDP_AT + 20 + payload.len()];
    ethernet::Repr {
        src: src_mac,
        dst: dst_mac,
        ethertype: EtherType::IPV4,
    }
    .emit(&mut buf);
    ipv4::Repr {
        src: src.0,
        dst: dst.0,
        protocol: ipv4::Protocol::TCP,
        payload_len: (20 + payload.len()) as u16,
        ttl: 64,
    }
    .emit(&mut buf[IP_AT..]);
    let seg = &mut buf[UDP_AT..];
    seg[0..2].copy_from_slice(&src.1.to_be_bytes());
    seg[2..4].copy_from_slice(&dst.1.to_be_bytes());
    seg[4..8].copy_from_slice(&0x0102_0304u32.to_be_bytes());
    seg[12] = 0x50;
    seg[13] = 0x18;
    seg[14..16].copy_from_slice(&64240u16.to_be_bytes());
    seg[20..].copy_from_slice(payload);
    let sum = tcp_checksum(src.0, dst.0, seg);
    seg[16..18].copy_from_slice(&sum.to_be_bytes());
    buf
}

/// The TCP checksum of `segment` (its checksum field taken as zero).
fn tcp_checksum(src: Ipv4Addr, dst: Ipv4Addr, segment: &[u8]) -> u16 {
    let mut seg = segment.to_vec();
    seg[16..18].copy_from_slice(&[0, 0]);
    let pseudo = wire::checksum::pseudo_header_v4(src, dst, 6, seg.len() as u16);
    wire::checksum::fold(pseudo + wire::checksum::sum(&seg))
}

/// An IPv4 frame of protocol `proto` with `payload` after the header.
fn ip_frame(src_mac: Mac, dst_mac: Mac, src: Ipv4Addr, dst: Ipv4Addr, proto: u8) -> Vec<u8> {
    let payload = [8u8, 0, 0xf7, 0xff, 0, 0, 0, 0];
    let mut buf = vec![0u8; IP_AT + ipv4::HEADER_LEN + payload.len()];
    ethernet::Repr {
        src: src_mac,
        dst: dst_mac,
        ethertype: EtherType::IPV4,
    }
    .emit(&mut buf);
    ipv4::Repr {
        src,
        dst,
        protocol: ipv4::Protocol(proto),
        payload_len: payload.len() as u16,
        ttl: 64,
    }
    .emit(&mut buf[IP_AT..]);
    buf[UDP_AT..].copy_from_slice(&payload);
    buf
}

/// The frame after the rewrites the switch is expected to make: addresses replaced, then
/// both checksums computed from scratch (a UDP checksum of 0, "none", stays 0).
fn rewritten(
    input: &[u8],
    dst_mac: Option<Mac>,
    src_ip: Option<Ipv4Addr>,
    dst_ip: Option<Ipv4Addr>,
) -> Vec<u8> {
    let mut out = input.to_vec();
    if let Some(m) = dst_mac {
        ethernet::Frame::new_checked(&mut out[..])
            .expect("ethernet")
            .set_dst(m);
    }
    let (src, dst) = {
        let mut ip = ipv4::Packet::new_checked(&mut out[IP_AT..]).expect("ipv4");
        if let Some(a) = src_ip {
            ip.set_src(a);
        }
        if let Some(a) = dst_ip {
            ip.set_dst(a);
        }
        ip.fill_checksum();
        (ip.src(), ip.dst())
    };
    let mut u = udp::Packet::new_checked(&mut out[UDP_AT..]).expect("udp");
    if u.checksum() != 0 {
        u.fill_checksum(src, dst);
    }
    out
}

/// A client request as the key router must deliver it to `server`.
fn routed(input: &[u8], mode: Mode, server: usize) -> Vec<u8> {
    let s = &SERVERS[server];
    match mode {
        Mode::L3 => rewritten(input, Some(s.mac), None, Some(s.ip)),
        Mode::L2 => rewritten(input, Some(s.mac), None, None),
    }
}

/// Checks the IPv4 header checksum and, when present, the UDP checksum of a frame.
fn assert_checksums(what: &str, frame: &[u8]) {
    let Ok(eth) = ethernet::Frame::new_checked(frame) else {
        return;
    };
    if eth.ethertype() != EtherType::IPV4 {
        return;
    }
    let ip = ipv4::Packet::new_checked(eth.payload()).expect("IPv4 frame out of the switch");
    assert!(ip.verify_checksum(), "{what}: IPv4 header checksum");
    if ip.protocol() == ipv4::Protocol::UDP && !ip.is_fragment() {
        let u = udp::Packet::new_checked(ip.payload()).expect("UDP datagram out of the switch");
        assert!(
            u.verify_checksum(ip.src(), ip.dst()),
            "{what}: UDP checksum"
        );
    }
    if ip.protocol() == ipv4::Protocol::TCP && !ip.is_fragment() && ip.payload().len() >= 20 {
        let seg = ip.payload();
        assert_eq!(
            u16::from_be_bytes([seg[16], seg[17]]),
            tcp_checksum(ip.src(), ip.dst(), seg),
            "{what}: TCP checksum"
        );
    }
}

fn assert_bytes(what: &str, got: &[u8], want: &[u8]) {
    if got != want {
        let at = got
            .iter()
            .zip(want)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(want.len()));
        panic!(
            "{what}: frames differ at byte {at} (lengths {} and {})\n got: {:02x?}\nwant: {:02x?}",
            got.len(),
            want.len(),
            got,
            want
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Counters.

/// A counter a case expects to move by one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Count {
    Drop(Drop),
    Answer(Answer),
    Switched,
    Flooded,
    ArpReplies,
    KvForwarded,
    KvSplit,
    KvReplicated,
    Requests(usize),
    Replies(usize),
}

impl Count {
    /// Every counter a case is checked against: those it lists move by one each, the others
    /// stay still.
    fn all() -> Vec<Count> {
        let mut all: Vec<Count> = Drop::ALL.iter().map(|d| Count::Drop(*d)).collect();
        all.extend(Answer::ALL.iter().map(|a| Count::Answer(*a)));
        all.extend([
            Count::Switched,
            Count::Flooded,
            Count::ArpReplies,
            Count::KvForwarded,
            Count::KvSplit,
            Count::KvReplicated,
        ]);
        all.extend((0..SERVERS.len()).map(Count::Requests));
        all.extend((0..SERVERS.len()).map(Count::Replies));
        all
    }

    fn read(self, s: &Stats) -> u64 {
        stats::get(match self {
            Count::Drop(d) => &s.drops[d as usize],
            Count::Answer(a) => &s.answers[a as usize],
            Count::Switched => &s.switched,
            Count::Flooded => &s.flooded,
            Count::ArpReplies => &s.arp_replies,
            Count::KvForwarded => &s.kv_forwarded,
            Count::KvSplit => &s.kv_split,
            Count::KvReplicated => &s.kv_replicated,
            Count::Requests(i) => &s.backends[i].requests,
            Count::Replies(i) => &s.backends[i].replies,
        })
    }
}

fn snapshot(s: &Stats) -> Vec<(Count, u64)> {
    Count::all().into_iter().map(|c| (c, c.read(s))).collect()
}

fn assert_counts(what: &str, s: &Stats, before: &[(Count, u64)], expected: &[Count]) {
    for (c, was) in before {
        let want = expected.iter().filter(|e| *e == c).count() as u64;
        let delta = c.read(s) - was;
        assert_eq!(delta, want, "{what}: counter {c:?} moved by {delta}");
    }
}

// ---------------------------------------------------------------------------------------------
// The table.

/// Builds the frame a case expects to leave the switch, from the frame that went in.
type Expected = fn(&Fx, &[u8]) -> Vec<u8>;
/// Builds a case's input frame.
type Input = fn(&Fx) -> Vec<u8>;

struct Case {
    name: &'static str,
    in_port: u16,
    input: Input,
    fate: Fate,
    /// The frame as it leaves, from the input; `None`: unchanged. Only checked when the
    /// frame leaves (`Out` or `Flood`).
    output: Option<Expected>,
    /// The frames the switch originates, in order.
    emits: fn(&Fx) -> Vec<Emit>,
    /// The counters that move, by one each.
    counts: &'static [Count],
}

fn nothing(_: &Fx) -> Vec<Emit> {
    Vec::new()
}

/// The switch's ARP reply for the VIP, to the client, on the client's port.
fn vip_arp_reply(_: &Fx) -> Vec<Emit> {
    vec![Emit {
        dest: Dest::Port(CLIENT.port),
        frame: arp_frame(
            CLIENT.mac,
            &arp::Repr {
                operation: arp::Operation::Reply,
                sender_mac: VIP_MAC,
                sender_ip: VIP,
                target_mac: CLIENT.mac,
                target_ip: CLIENT.ip,
            },
        ),
    }]
}

fn run(mode: Mode, cases: &[Case]) {
    run_on(mode, Rig::new, cases)
}

fn run_on(mode: Mode, rig: fn(Mode) -> Rig, cases: &[Case]) {
    let fx = Fx::new();
    for case in cases {
        let what = format!("{mode:?}: {}", case.name);
        let mut rig = rig(mode);
        let input = (case.input)(&fx);
        let mut frame = input.clone();
        let before = snapshot(&rig.stats);
        let mut emit = Vec::new();
        let fate = rig.process(case.in_port, &mut frame, &mut emit);
        assert_eq!(fate, case.fate, "{what}: fate");
        if fate != Fate::Consumed {
            let want = match case.output {
                Some(f) => f(&fx, &input),
                None => input.clone(),
            };
            assert_bytes(&format!("{what}: output"), &frame, &want);
            assert_checksums(&format!("{what}: output"), &frame);
        }
        let want = (case.emits)(&fx);
        assert_eq!(
            emit.len(),
            want.len(),
            "{what}: frames emitted: {:?}",
            emit.iter().map(|e| e.dest).collect::<Vec<_>>()
        );
        for (i, (got, want)) in emit.iter().zip(&want).enumerate() {
            assert_eq!(got.dest, want.dest, "{what}: emit {i} destination");
            assert_bytes(&format!("{what}: emit {i}"), &got.frame, &want.frame);
            assert_checksums(&format!("{what}: emit {i}"), &got.frame);
        }
        assert_counts(&what, &rig.stats, &before, case.counts);
    }
}

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

fn l3_cases() -> Vec<Case> {
    vec![
        Case {
            name: "ARP request for the VIP is answered on the in-port with the VIP's MAC",
            in_port: CLIENT.port,
            input: |_| arp_request(&CLIENT, VIP),
            fate: Fate::Consumed,
            output: None,
            emits: vip_arp_reply,
            counts: &[Count::ArpReplies],
        },
        Case {
            name: "ARP request for another address is flooded",
            in_port: CLIENT.port,
            input: |_| arp_request(&CLIENT, SERVERS[0].ip),
            fate: Fate::Flood,
            output: None,
            emits: nothing,
            counts: &[Count::Flooded],
        },
        Case {
            name: "unicast to a learned MAC leaves by its port unchanged",
            in_port: SERVERS[0].port,
            input: |_| {
                udp_frame(
                    SERVERS[0].mac,
                    SERVERS[2].mac,
                    (SERVERS[0].ip, 5000),
                    (SERVERS[2].ip, 6000),
                    b"hello",
                )
            },
            fate: Fate::Out(SERVERS[2].port),
            output: None,
            emits: nothing,
            counts: &[Count::Switched],
        },
        Case {
            name: "unicast to a station behind the in-port is not sent back",
            in_port: SERVERS[1].port,
            input: |_| {
                arp_frame(
                    SERVERS[2].mac,
                    &arp::Repr {
                        operation: arp::Operation::Reply,
                        sender_mac: SERVERS[1].mac,
                        sender_ip: SERVERS[1].ip,
                        target_mac: SERVERS[2].mac,
                        target_ip: SERVERS[2].ip,
                    },
                )
            },
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::SamePort)],
        },
        Case {
            name: "unicast to an unknown MAC is flooded",
            in_port: CLIENT.port,
            input: |_| {
                udp_frame(
                    CLIENT.mac,
                    STRANGER,
                    (CLIENT.ip, 5000),
                    (Ipv4Addr::new(10, 0, 0, 99), 6000),
                    b"hello",
                )
            },
            fate: Fate::Flood,
            output: None,
            emits: nothing,
            counts: &[Count::Flooded],
        },
        Case {
            name: "broadcast is flooded",
            in_port: CLIENT.port,
            input: |_| {
                udp_frame(
                    CLIENT.mac,
                    Mac::BROADCAST,
                    (CLIENT.ip, 68),
                    (Ipv4Addr::BROADCAST, 67),
                    b"discover",
                )
            },
            fate: Fate::Flood,
            output: None,
            emits: nothing,
            counts: &[Count::Flooded],
        },
        Case {
            name: "get to the VIP goes to the key's server, destination MAC and IP rewritten",
            in_port: CLIENT.port,
            input: |fx| to_vip(format!("get {}\r\n", fx.key(1, 0)).as_bytes()),
            fate: Fate::Out(SERVERS[1].port),
            output: Some(|_, input| routed(input, Mode::L3, 1)),
            emits: nothing,
            counts: &[Count::KvForwarded, Count::Switched, Count::Requests(1)],
        },
        Case {
            name: "get for a key on the first server leaves by that server's port",
            in_port: CLIENT.port,
            input: |fx| to_vip(format!("get {}\r\n", fx.key(0, 0)).as_bytes()),
            fate: Fate::Out(SERVERS[0].port),
            output: Some(|_, input| routed(input, Mode::L3, 0)),
            emits: nothing,
            counts: &[Count::KvForwarded, Count::Switched, Count::Requests(0)],
        },
        Case {
            name: "set to the VIP is routed by its key, data block and all",
            in_port: CLIENT.port,
            input: |fx| to_vip(format!("set {} 0 0 3\r\nabc\r\n", fx.key(2, 0)).as_bytes()),
            fate: Fate::Out(SERVERS[2].port),
            output: Some(|_, input| routed(input, Mode::L3, 2)),
            emits: nothing,
            counts: &[Count::KvForwarded, Count::Switched, Count::Requests(2)],
        },
        Case {
            name: "get without a UDP checksum is routed and keeps no checksum",
            in_port: CLIENT.port,
            input: |fx| {
                let mut f = to_vip(format!("get {}\r\n", fx.key(1, 1)).as_bytes());
                f[UDP_AT + 6..UDP_AT + 8].copy_from_slice(&[0, 0]);
                f
            },
            fate: Fate::Out(SERVERS[1].port),
            output: Some(|_, input| routed(input, Mode::L3, 1)),
            emits: nothing,
            counts: &[Count::KvForwarded, Count::Switched, Count::Requests(1)],
        },
        Case {
            name: "key of 250 bytes is routed",
            in_port: CLIENT.port,
            input: |fx| to_vip(format!("get {}\r\n", fx.long_key.0).as_bytes()),
            // Checked against the ring in `fixture_keys_land_where_the_table_says`.
            fate: Fate::Out(SERVERS[LONG_KEY_SERVER].port),
            output: Some(|fx, input| routed(input, Mode::L3, fx.long_key.1)),
            emits: nothing,
            counts: &[
                Count::KvForwarded,
                Count::Switched,
                Count::Requests(LONG_KEY_SERVER),
            ],
        },
        Case {
            name: "pipelined requests for one server are forwarded whole",
            in_port: CLIENT.port,
            input: |fx| {
                to_vip(
                    format!(
                        "get {}\r\nset {} 0 0 1\r\nx\r\nget {}\r\n",
                        fx.key(0, 0),
                        fx.key(0, 1),
                        fx.key(0, 2)
                    )
                    .as_bytes(),
                )
            },
            fate: Fate::Out(SERVERS[0].port),
            output: Some(|_, input| routed(input, Mode::L3, 0)),
            emits: nothing,
            counts: &[Count::KvForwarded, Count::Switched, Count::Requests(0)],
        },
        Case {
            name: "pipelined requests for different servers are dropped",
            in_port: CLIENT.port,
            input: |fx| {
                to_vip(format!("get {}\r\nget {}\r\n", fx.key(0, 0), fx.key(1, 0)).as_bytes())
            },
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::PipelinedMultiServer)],
        },
        Case {
            name: "reply from a backend's memcached port leaves with the VIP as source",
            in_port: SERVERS[0].port,
            input: |_| backend_reply(0, SERVERS[0].ip, MC_PORT),
            fate: Fate::Out(CLIENT.port),
            output: Some(|_, input| rewritten(input, None, Some(VIP), None)),
            emits: nothing,
            counts: &[Count::Switched, Count::Replies(0)],
        },
        Case {
            name: "reply from a backend's other port is switched unchanged",
            in_port: SERVERS[2].port,
            input: |_| backend_reply(2, SERVERS[2].ip, MC_PORT + 1),
            fate: Fate::Out(CLIENT.port),
            output: None,
            emits: nothing,
            counts: &[Count::Switched],
        },
        Case {
            name: "key of 251 bytes is answered CLIENT_ERROR from the VIP",
            in_port: CLIENT.port,
            input: |_| to_vip(format!("get {}\r\n", "k".repeat(251)).as_bytes()),
            fate: Fate::Consumed,
            output: None,
            emits: |_| vec![from_vip(b"CLIENT_ERROR bad command line format\r\n")],
            counts: &[Count::Answer(Answer::ClientError)],
        },
        Case {
            name: "unknown command is answered ERROR",
            in_port: CLIENT.port,
            input: |_| to_vip(b"bogus foo\r\n"),
            fate: Fate::Consumed,
            output: None,
            emits: |_| vec![from_vip(b"ERROR\r\n")],
            counts: &[Count::Answer(Answer::UnknownCommand)],
        },
        Case {
            name: "mn is answered MN",
            in_port: CLIENT.port,
            input: |_| to_vip(b"mn\r\n"),
            fate: Fate::Consumed,
            output: None,
            emits: |_| vec![from_vip(b"MN\r\n")],
            counts: &[Count::Answer(Answer::Local)],
        },
        Case {
            name: "version is answered with a VERSION line",
            in_port: CLIENT.port,
            input: |_| to_vip(b"version\r\n"),
            fate: Fate::Consumed,
            output: None,
            emits: |_| {
                let line = format!("VERSION kvswitch-{}\r\n", env!("CARGO_PKG_VERSION"));
                vec![from_vip(line.as_bytes())]
            },
            counts: &[Count::Answer(Answer::Local)],
        },
        Case {
            name: "keyless command other than mn and version is dropped",
            in_port: CLIENT.port,
            input: |_| to_vip(b"stats\r\n"),
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::KeylessCommand)],
        },
        Case {
            name: "frame shorter than an Ethernet header",
            in_port: CLIENT.port,
            input: |_| vec![0x02; 13],
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::BadEthernet)],
        },
        Case {
            name: "datagram shorter than the memcached frame header",
            in_port: CLIENT.port,
            input: |_| to_vip_raw(&[0xbe, 0xef, 0, 0, 0]),
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::BadFrameHeader)],
        },
        Case {
            name: "request spread over two datagrams",
            in_port: CLIENT.port,
            input: |fx| {
                to_vip_raw(&mc(
                    REQ_ID,
                    0,
                    2,
                    format!("get {}\r\n", fx.key(0, 0)).as_bytes(),
                ))
            },
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::MultiDatagramRequest)],
        },
        Case {
            name: "set whose data block is cut short",
            in_port: CLIENT.port,
            input: |fx| to_vip(format!("set {} 0 0 10\r\nabc", fx.key(0, 0)).as_bytes()),
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::IncompleteRequest)],
        },
        Case {
            name: "IP fragment to the VIP",
            in_port: CLIENT.port,
            // More fragments, offset 0.
            input: |fx| {
                patch_ipv4(
                    to_vip(format!("get {}\r\n", fx.key(0, 0)).as_bytes()),
                    6,
                    &[0x20, 0],
                )
            },
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::IpFragment)],
        },
        Case {
            name: "IPv4 header with options to the VIP",
            in_port: CLIENT.port,
            input: |fx| with_ipv4_options(&to_vip(format!("get {}\r\n", fx.key(0, 0)).as_bytes())),
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::Ipv4Options)],
        },
        Case {
            name: "bad UDP checksum to the VIP",
            in_port: CLIENT.port,
            input: |fx| {
                let mut f = to_vip(format!("get {}\r\n", fx.key(0, 0)).as_bytes());
                f[UDP_AT + 6] ^= 0x5a;
                f
            },
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::BadUdpChecksum)],
        },
        Case {
            name: "bad IPv4 header checksum to the VIP",
            in_port: CLIENT.port,
            input: |fx| {
                let mut f = to_vip(format!("get {}\r\n", fx.key(0, 0)).as_bytes());
                f[IP_AT + 10] ^= 0x5a;
                f
            },
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::BadIpv4)],
        },
        Case {
            name: "truncated IPv4 header to the VIP's MAC",
            in_port: CLIENT.port,
            input: |_| to_vip(b"get a\r\n")[..IP_AT + 12].to_vec(),
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::BadIpv4)],
        },
        Case {
            name: "TCP to the VIP is not handled without a local port",
            in_port: CLIENT.port,
            input: |_| tcp_to_vip(),
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::VipUnhandled)],
        },
        Case {
            name: "a server's TCP to the VIP is not handled without a local port",
            in_port: SERVERS[0].port,
            input: |_| server_tcp_to(0, VIP),
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::VipUnhandled)],
        },
        Case {
            name: "an ARP reply to the VIP answers the switch's own request",
            in_port: SERVERS[0].port,
            input: |_| arp_reply_to(0, VIP),
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[],
        },
    ]
}

/// A TCP segment from server `s`'s memcached port to `dst` (the proxy's side of a connection
/// to the server), sent to the VIP's MAC.
fn server_tcp_to(s: usize, dst: Ipv4Addr) -> Vec<u8> {
    tcp_frame(
        SERVERS[s].mac,
        VIP_MAC,
        (SERVERS[s].ip, MC_PORT),
        (dst, 40001),
        b"VERSION 1.6.18\r\n",
    )
}

/// Server `s` answering an ARP request from `target` (at the VIP's MAC).
fn arp_reply_to(s: usize, target: Ipv4Addr) -> Vec<u8> {
    arp_frame(
        VIP_MAC,
        &arp::Repr {
            operation: arp::Operation::Reply,
            sender_mac: SERVERS[s].mac,
            sender_ip: SERVERS[s].ip,
            target_mac: VIP_MAC,
            target_ip: target,
        },
    )
}

/// What the host behind the local port sends: from the VIP's MAC and `src`.
fn from_host(dst_mac: Mac, src: (Ipv4Addr, u16), dst: (Ipv4Addr, u16)) -> Vec<u8> {
    tcp_frame(VIP_MAC, dst_mac, src, dst, b"get k\r\n")
}

/// The switch with a local port, in either mode: what reaches the host's stack and what
/// leaves it. `source` is where the host speaks to the servers from (the VIP in l3 mode, the
/// agent address in l2 mode).
fn local_cases(source: Ipv4Addr) -> Vec<Case> {
    let mut cases = vec![
        Case {
            name: "TCP to the VIP's memcached port goes out of the local port unchanged",
            in_port: CLIENT.port,
            input: |_| tcp_to_vip(),
            fate: Fate::Out(LOCAL),
            output: None,
            emits: nothing,
            counts: &[Count::Switched],
        },
        Case {
            name: "TCP to another port of the VIP is not handled",
            in_port: CLIENT.port,
            input: |_| {
                tcp_frame(
                    CLIENT.mac,
                    VIP_MAC,
                    (CLIENT.ip, CLIENT_UDP_PORT),
                    (VIP, 22),
                    b"",
                )
            },
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::VipUnhandled)],
        },
        Case {
            name: "TCP to the VIP's port with IPv4 options does not reach the host",
            in_port: CLIENT.port,
            input: |_| with_ipv4_options(&tcp_to_vip()),
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::VipUnhandled)],
        },
        Case {
            name: "ICMP to the VIP is not handled",
            in_port: CLIENT.port,
            input: |_| ip_frame(CLIENT.mac, VIP_MAC, CLIENT.ip, VIP, 1),
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::VipUnhandled)],
        },
        Case {
            name: "a client's TCP from port 11211 to the VIP is not mistaken for a server's",
            in_port: CLIENT.port,
            input: |_| tcp_frame(CLIENT.mac, VIP_MAC, (CLIENT.ip, MC_PORT), (VIP, 40001), b""),
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::VipUnhandled)],
        },
        Case {
            name: "the host's TCP to a server leaves by the server's port unchanged",
            in_port: LOCAL,
            input: |_| from_host(SERVERS[1].mac, (VIP, 40001), (SERVERS[1].ip, MC_PORT)),
            fate: Fate::Out(SERVERS[1].port),
            output: None,
            emits: nothing,
            counts: &[Count::Switched],
        },
        Case {
            name: "the proxy's answer to a client leaves by the client's port unchanged",
            in_port: LOCAL,
            input: |_| from_host(CLIENT.mac, (VIP, MC_PORT), (CLIENT.ip, CLIENT_UDP_PORT)),
            fate: Fate::Out(CLIENT.port),
            output: None,
            emits: nothing,
            counts: &[Count::Switched],
        },
        Case {
            name: "the host's ARP request for a server is flooded",
            in_port: LOCAL,
            input: |_| {
                arp_frame(
                    Mac::BROADCAST,
                    &arp::Repr {
                        operation: arp::Operation::Request,
                        sender_mac: VIP_MAC,
                        sender_ip: VIP,
                        target_mac: Mac::ZERO,
                        target_ip: SERVERS[2].ip,
                    },
                )
            },
            fate: Fate::Flood,
            output: None,
            emits: nothing,
            counts: &[Count::Flooded],
        },
        Case {
            name: "a server's ARP reply to the VIP goes out of the local port",
            in_port: SERVERS[0].port,
            input: |_| arp_reply_to(0, VIP),
            fate: Fate::Out(LOCAL),
            output: None,
            emits: nothing,
            counts: &[Count::Switched],
        },
        Case {
            name: "an ARP reply to another address at the VIP's MAC is the switch's own",
            in_port: SERVERS[0].port,
            input: |_| arp_reply_to(0, Ipv4Addr::UNSPECIFIED),
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[],
        },
        Case {
            name: "the switch still answers ARP for the VIP itself",
            in_port: CLIENT.port,
            input: |_| arp_request(&CLIENT, VIP),
            fate: Fate::Consumed,
            output: None,
            emits: vip_arp_reply,
            counts: &[Count::ArpReplies],
        },
    ];
    cases.push(Case {
        name: "UDP gets to the VIP are still routed by key",
        in_port: CLIENT.port,
        input: |fx| to_vip(format!("get {}\r\n", fx.key(2, 0)).as_bytes()),
        fate: Fate::Out(SERVERS[2].port),
        output: if source == VIP {
            Some(|_, input| routed(input, Mode::L3, 2))
        } else {
            Some(|_, input| routed(input, Mode::L2, 2))
        },
        emits: nothing,
        counts: &[Count::KvForwarded, Count::Switched, Count::Requests(2)],
    });
    // The servers' side of the proxy's connections, to wherever the proxy speaks from.
    let to_source: [(Input, u16); 3] = if source == VIP {
        [
            (|_| server_tcp_to(0, VIP), SERVERS[0].port),
            (|_| server_tcp_to(1, VIP), SERVERS[1].port),
            (|_| server_tcp_to(2, VIP), SERVERS[2].port),
        ]
    } else {
        [
            (|_| server_tcp_to(0, AGENT), SERVERS[0].port),
            (|_| server_tcp_to(1, AGENT), SERVERS[1].port),
            (|_| server_tcp_to(2, AGENT), SERVERS[2].port),
        ]
    };
    for (input, in_port) in to_source {
        cases.push(Case {
            name: "TCP from a server's memcached port to the proxy's source goes out of the \
                   local port unchanged",
            in_port,
            input,
            fate: Fate::Out(LOCAL),
            output: None,
            emits: nothing,
            counts: &[Count::Switched],
        });
    }
    cases.push(Case {
        name: "TCP from a server's other port to the proxy's source is not handled",
        in_port: SERVERS[0].port,
        input: if source == VIP {
            |_| {
                tcp_frame(
                    SERVERS[0].mac,
                    VIP_MAC,
                    (SERVERS[0].ip, 22),
                    (VIP, 40001),
                    b"",
                )
            }
        } else {
            |_| {
                tcp_frame(
                    SERVERS[0].mac,
                    VIP_MAC,
                    (SERVERS[0].ip, 22),
                    (AGENT, 40001),
                    b"",
                )
            }
        },
        fate: Fate::Consumed,
        output: None,
        emits: nothing,
        counts: &[Count::Drop(Drop::VipUnhandled)],
    });
    cases
}

/// The server of the 250-byte key, fixed so the table can name its port.
const LONG_KEY_SERVER: usize = 0;

#[test]
fn fixture_keys_land_where_the_table_says() {
    let fx = Fx::new();
    let ring = ring();
    for (s, keys) in fx.key_on.iter().enumerate() {
        for k in keys {
            assert_eq!(ring.locate(k.as_bytes()), s, "{k}");
        }
    }
    assert_eq!(fx.long_key.0.len(), 250);
    assert_eq!(
        fx.long_key.1, LONG_KEY_SERVER,
        "the 250-byte key moved; update LONG_KEY_SERVER"
    );
}

/// Plain switching never sends a frame back out of the port it came from, whatever its
/// addresses; only a request the key router rewrote may hairpin.
#[test]
fn plain_frame_between_backends_behind_one_port_is_not_sent_back() {
    let mut rig = Rig::new(Mode::L3);
    let mut frame = udp_frame(
        SERVERS[1].mac,
        SERVERS[2].mac,
        (SERVERS[1].ip, 5000),
        (SERVERS[2].ip, 6000),
        b"hello",
    );
    let before = snapshot(&rig.stats);
    let mut emit = Vec::new();
    assert_eq!(
        rig.process(SERVERS[1].port, &mut frame, &mut emit),
        Fate::Consumed
    );
    assert_counts(
        "same port",
        &rig.stats,
        &before,
        &[Count::Drop(Drop::SamePort)],
    );
}

#[test]
fn l3_table() {
    run(Mode::L3, &l3_cases());
}

#[test]
fn l3_local_port_table() {
    run_on(Mode::L3, Rig::local, &local_cases(VIP));
}

#[test]
fn l2_local_port_table() {
    let mut cases = local_cases(AGENT);
    cases.extend([
        Case {
            name: "a server's ARP reply to the agent address goes out of the local port",
            in_port: SERVERS[1].port,
            input: |_| arp_reply_to(1, AGENT),
            fate: Fate::Out(LOCAL),
            output: None,
            emits: nothing,
            counts: &[Count::Switched],
        },
        Case {
            name: "a server's TCP to the VIP (which it owns) does not reach the host",
            in_port: SERVERS[0].port,
            input: |_| server_tcp_to(0, VIP),
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::VipUnhandled)],
        },
        Case {
            name: "the host's TCP from the agent address to a server is not rewritten",
            in_port: LOCAL,
            input: |_| from_host(SERVERS[0].mac, (AGENT, 40001), (SERVERS[0].ip, MC_PORT)),
            fate: Fate::Out(SERVERS[0].port),
            output: None,
            emits: nothing,
            counts: &[Count::Switched],
        },
        Case {
            name: "ARP for the agent address is answered by the switch",
            in_port: SERVERS[2].port,
            input: |_| arp_request(&SERVERS[2], AGENT),
            fate: Fate::Consumed,
            output: None,
            emits: |_| {
                let s = &SERVERS[2];
                vec![Emit {
                    dest: Dest::Port(s.port),
                    frame: arp_frame(
                        s.mac,
                        &arp::Repr {
                            operation: arp::Operation::Reply,
                            sender_mac: VIP_MAC,
                            sender_ip: AGENT,
                            target_mac: s.mac,
                            target_ip: s.ip,
                        },
                    ),
                }]
            },
            counts: &[Count::ArpReplies],
        },
    ]);
    run_on(Mode::L2, Rig::local, &cases);
}

/// The host's stack may leave the TCP checksum to offload (a veth with transmit checksumming
/// on): the port marks such frames and the switch completes the checksum before they leave.
#[test]
fn unfinished_tcp_checksum_from_the_host_is_completed() {
    let mut rig = Rig::local(Mode::L3);
    let done = from_host(CLIENT.mac, (VIP, MC_PORT), (CLIENT.ip, CLIENT_UDP_PORT));
    let mut partial = done.clone();
    // What offload leaves in the field: the pseudo-header sum, not complemented.
    let len = (done.len() - UDP_AT) as u16;
    let pseudo = wire::checksum::pseudo_header_v4(VIP, CLIENT.ip, 6, len);
    partial[UDP_AT + 16..UDP_AT + 18]
        .copy_from_slice(&(!wire::checksum::fold(pseudo)).to_be_bytes());
    assert_ne!(partial, done);
    let mut emit = Vec::new();
    let fate = rig
        .sw
        .process(LOCAL, &mut partial, false, rig.now, &mut emit);
    assert_eq!(fate, Fate::Out(CLIENT.port));
    assert_bytes("completed", &partial, &done);
    assert_checksums("completed", &partial);
}

/// Without enough ports for the local port after the configured ones, the switch refuses.
#[test]
fn a_local_port_needs_a_port_number() {
    let stats = Arc::new(Stats::new(PORTS, SERVERS.len()));
    let e = new_switch(&config_local(Mode::L3), PORTS, stats)
        .err()
        .expect("too few ports");
    assert!(e.to_string().contains("local port"), "{e}");
}

#[test]
fn l2_table() {
    run(Mode::L2, &l2_cases());
}

fn l2_cases() -> Vec<Case> {
    {
        vec![
            Case {
                name: "ARP request for the VIP is answered",
                in_port: CLIENT.port,
                input: |_| arp_request(&CLIENT, VIP),
                fate: Fate::Consumed,
                output: None,
                emits: vip_arp_reply,
                counts: &[Count::ArpReplies],
            },
            Case {
                name: "get to the VIP: only the destination MAC changes",
                in_port: CLIENT.port,
                input: |fx| to_vip(format!("get {}\r\n", fx.key(1, 0)).as_bytes()),
                fate: Fate::Out(SERVERS[1].port),
                output: Some(|_, input| routed(input, Mode::L2, 1)),
                emits: nothing,
                counts: &[Count::KvForwarded, Count::Switched, Count::Requests(1)],
            },
            Case {
                name: "get for the first server: only the destination MAC changes",
                in_port: CLIENT.port,
                input: |fx| to_vip(format!("get {}\r\n", fx.key(0, 0)).as_bytes()),
                fate: Fate::Out(SERVERS[0].port),
                output: Some(|_, input| routed(input, Mode::L2, 0)),
                emits: nothing,
                counts: &[Count::KvForwarded, Count::Switched, Count::Requests(0)],
            },
            Case {
                name: "reply from a server that owns the VIP leaves unchanged",
                in_port: SERVERS[0].port,
                input: |_| backend_reply(0, VIP, MC_PORT),
                fate: Fate::Out(CLIENT.port),
                output: None,
                emits: nothing,
                counts: &[Count::Switched],
            },
            Case {
                name: "reply from a backend's own address is not rewritten",
                in_port: SERVERS[0].port,
                input: |_| backend_reply(0, SERVERS[0].ip, MC_PORT),
                fate: Fate::Out(CLIENT.port),
                output: None,
                emits: nothing,
                counts: &[Count::Switched, Count::Replies(0)],
            },
            Case {
                name: "multi-server get cannot be split without an agent address",
                in_port: CLIENT.port,
                input: |fx| to_vip(format!("get {} {}\r\n", fx.key(0, 0), fx.key(2, 0)).as_bytes()),
                fate: Fate::Consumed,
                output: None,
                emits: nothing,
                counts: &[Count::Drop(Drop::SplitUnavailable)],
            },
            Case {
                name: "unknown command is answered ERROR",
                in_port: CLIENT.port,
                input: |_| to_vip(b"bogus\r\n"),
                fate: Fate::Consumed,
                output: None,
                emits: |_| vec![from_vip(b"ERROR\r\n")],
                counts: &[Count::Answer(Answer::UnknownCommand)],
            },
        ]
    }
}

// ---------------------------------------------------------------------------------------------
// Split multi-key gets: a sequence of frames, not one.

/// A datagram from `server`'s memcached port to the split agent (the VIP, in l3 mode).
fn to_agent(server: usize, request_id: u16, seq: u16, total: u16, body: &[u8]) -> Vec<u8> {
    let s = &SERVERS[server];
    udp_frame(
        s.mac,
        VIP_MAC,
        (s.ip, MC_PORT),
        (VIP, AGENT_PORT),
        &mc(request_id, seq, total, body),
    )
}

/// The sub-request the switch must send `server` for `keys`, given the id it chose.
fn sub_request(server: usize, request_id: u16, keys: &[&str]) -> Vec<u8> {
    let s = &SERVERS[server];
    udp_frame(
        VIP_MAC,
        s.mac,
        (VIP, AGENT_PORT),
        (s.ip, MC_PORT),
        &mc(
            request_id,
            0,
            1,
            format!("get {}\r\n", keys.join(" ")).as_bytes(),
        ),
    )
}

/// Starts a split get of `keys` from the client and checks the sub-requests: one per server,
/// from the VIP's agent port, each out of its server's port. Returns each server's
/// sub-request id.
/// Sends a get for `keys` and checks the sub-requests: one single-key get per distinct key,
/// to the key's server, in the client's order. Returns each distinct key's sub-request id.
fn start_split(
    rig: &mut Rig,
    request_id: u16,
    keys: &[&str],
) -> std::collections::HashMap<String, u16> {
    let ring = ring();
    let mut frame = to_vip_raw(&mc(
        request_id,
        0,
        1,
        format!("get {}\r\n", keys.join(" ")).as_bytes(),
    ));
    let mut emit = Vec::new();
    let before = snapshot(&rig.stats);
    assert_eq!(
        rig.process(CLIENT.port, &mut frame, &mut emit),
        Fate::Consumed
    );
    let mut distinct: Vec<&str> = Vec::new();
    for k in keys {
        if !distinct.contains(k) {
            distinct.push(k);
        }
    }
    assert_eq!(
        emit.len(),
        distinct.len(),
        "one sub-request per distinct key"
    );
    let mut ids = std::collections::HashMap::new();
    for (e, key) in emit.iter().zip(&distinct) {
        let server = ring.locate(key.as_bytes());
        let (header, _) = mcudp::Header::parse(&e.frame[PAYLOAD_AT..]).expect("frame header");
        assert_eq!(e.dest, Dest::Port(SERVERS[server].port));
        assert_bytes(
            &format!("sub-request for {key}"),
            &e.frame,
            &sub_request(server, header.request_id, &[key]),
        );
        assert_checksums("sub-request", &e.frame);
        ids.insert(key.to_string(), header.request_id);
    }
    let mut expected = vec![Count::KvSplit];
    expected.extend(
        distinct
            .iter()
            .map(|k| Count::Requests(ring.locate(k.as_bytes()))),
    );
    assert_counts("split start", &rig.stats, &before, &expected);
    let unique: std::collections::HashSet<u16> = ids.values().copied().collect();
    assert_eq!(unique.len(), distinct.len(), "sub-request ids are distinct");
    ids
}

/// The server of `key` on the test ring.
fn server_of(key: &str) -> usize {
    ring().locate(key.as_bytes())
}

#[test]
fn split_get_merges_replies_in_client_order() {
    let fx = Fx::new();
    let mut rig = Rig::new(Mode::L3);
    // Keys on every server, interleaved; b is a miss; a is asked twice.
    let (a, b, c, d, e) = (
        fx.key(0, 0),
        fx.key(1, 0),
        fx.key(2, 0),
        fx.key(0, 1),
        fx.key(1, 1),
    );
    let ids = start_split(&mut rig, 0x4242, &[a, b, c, d, e, a]);
    let id = |k: &str| ids[k];

    // Each single-key get is answered with one message; c's spans two datagrams that arrive
    // last piece first, and the replies arrive in no particular order.
    let item_a = format!("VALUE {a} 0 2\r\nA0\r\n");
    let item_d = format!("VALUE {d} 5 3\r\nDDD\r\n");
    let item_c = format!("VALUE {c} 0 1\r\nC\r\n");
    let item_e = format!("VALUE {e} 9 1\r\nE\r\n");
    let reply_c = format!("{item_c}END\r\n");
    let (c_head, c_tail) = reply_c.as_bytes().split_at(7);
    let replies = vec![
        to_agent(
            server_of(d),
            id(d),
            0,
            1,
            format!("{item_d}END\r\n").as_bytes(),
        ),
        to_agent(server_of(c), id(c), 1, 2, c_tail),
        to_agent(server_of(b), id(b), 0, 1, b"END\r\n"),
        to_agent(
            server_of(e),
            id(e),
            0,
            1,
            format!("{item_e}END\r\n").as_bytes(),
        ),
        to_agent(server_of(c), id(c), 0, 2, c_head),
        to_agent(
            server_of(a),
            id(a),
            0,
            1,
            format!("{item_a}END\r\n").as_bytes(),
        ),
    ];
    let last = replies.len() - 1;
    for (i, mut frame) in replies.into_iter().enumerate() {
        let server = SERVERS
            .iter()
            .position(|s| s.mac.0 == frame[6..12])
            .expect("from a server");
        let before = snapshot(&rig.stats);
        let mut emit = Vec::new();
        assert_eq!(
            rig.process(SERVERS[server].port, &mut frame, &mut emit),
            Fate::Consumed,
            "reply {i}"
        );
        if i < last {
            assert!(emit.is_empty(), "reply {i}: nothing before the last part");
            assert_counts(
                &format!("reply {i}"),
                &rig.stats,
                &before,
                &[Count::Replies(server)],
            );
            continue;
        }
        let merged = format!("{item_a}{item_c}{item_d}{item_e}{item_a}END\r\n");
        let want = from_vip_id(0x4242, merged.as_bytes());
        assert_eq!(emit.len(), 1, "one merged reply");
        assert_eq!(emit[0].dest, want.dest);
        assert_bytes("merged reply", &emit[0].frame, &want.frame);
        assert_checksums("merged reply", &emit[0].frame);
        assert_counts(
            "merged reply",
            &rig.stats,
            &before,
            &[Count::Replies(server), Count::Answer(Answer::MergedGet)],
        );
    }
    assert_eq!(rig.sw.snapshot().splits_in_flight, 0);
}

#[test]
fn split_get_passes_on_a_server_error() {
    let fx = Fx::new();
    let mut rig = Rig::new(Mode::L3);
    let (k0, k2) = (fx.key(0, 0), fx.key(2, 0));
    let ids = start_split(&mut rig, 7, &[k0, k2]);
    let mut emit = Vec::new();
    let mut f = to_agent(0, ids[k0], 0, 1, b"END\r\n");
    assert_eq!(rig.process(1, &mut f, &mut emit), Fate::Consumed);
    let mut f = to_agent(2, ids[k2], 0, 1, b"SERVER_ERROR out of memory\r\n");
    assert_eq!(rig.process(2, &mut f, &mut emit), Fate::Consumed);
    assert_eq!(
        emit,
        vec![from_vip_id(7, b"SERVER_ERROR out of memory\r\n")]
    );
}

#[test]
fn split_get_times_out_and_late_replies_are_stale() {
    let fx = Fx::new();
    let mut rig = Rig::new(Mode::L3);
    let (k0, k1) = (fx.key(0, 0), fx.key(1, 0));
    let ids = start_split(&mut rig, 9, &[k0, k1]);
    let mut emit = Vec::new();
    let mut f = to_agent(0, ids[k0], 0, 1, b"END\r\n");
    assert_eq!(rig.process(1, &mut f, &mut emit), Fate::Consumed);

    let before = snapshot(&rig.stats);
    rig.sw.tick(rig.now + Duration::from_millis(500), &mut emit);
    assert_counts("before the deadline", &rig.stats, &before, &[]);
    rig.sw.tick(rig.now + Duration::from_secs(2), &mut emit);
    assert_counts(
        "after the deadline",
        &rig.stats,
        &before,
        &[Count::Drop(Drop::SplitTimeout)],
    );
    // Every backend MAC is configured, so the tick asks nobody for theirs.
    assert!(emit.is_empty());
    assert_eq!(stats::get(&rig.stats.splits_in_flight), 0);

    let before = snapshot(&rig.stats);
    let mut f = to_agent(1, ids[k1], 0, 1, b"END\r\n");
    assert_eq!(rig.process(2, &mut f, &mut emit), Fate::Consumed);
    assert!(emit.is_empty());
    assert_counts(
        "late reply",
        &rig.stats,
        &before,
        &[Count::Replies(1), Count::Drop(Drop::StaleReply)],
    );
}

/// A datagram from the agent port to `server`'s memcached port carrying `body`.
fn to_server(server: usize, request_id: u16, body: &[u8]) -> Vec<u8> {
    let s = &SERVERS[server];
    udp_frame(
        VIP_MAC,
        s.mac,
        (VIP, AGENT_PORT),
        (s.ip, MC_PORT),
        &mc(request_id, 0, 1, body),
    )
}

/// A switch whose pool keeps each key on two servers.
fn replicated() -> Rig {
    let mut cfg = config(Mode::L3);
    cfg.replicas = 2;
    Rig::with(cfg, PORTS)
}

/// The two replicas of `key` on the test ring, owner first.
fn replicas_of(key: &str) -> [usize; 2] {
    let servers: Vec<Server> = SERVER_NAMES.iter().map(|n| Server::new(*n, 1)).collect();
    let ring = Ring::new_stable(HashFn::Md5, &servers).expect("ring");
    let mut out = Vec::new();
    ring.replicas_hash(ring.key_hash(key.as_bytes()), 2, &mut out);
    [out[0], out[1]]
}

/// Sends `body` (one write) to the VIP and checks that it goes, unchanged, to both replicas of
/// `key` from the agent port. Returns the sub-request ids, owner first.
fn start_replicated(rig: &mut Rig, key: &str, body: &[u8]) -> Vec<u16> {
    let mut frame = to_vip_raw(&mc(0x5151, 0, 1, body));
    let mut emit = Vec::new();
    let before = snapshot(&rig.stats);
    assert_eq!(
        rig.process(CLIENT.port, &mut frame, &mut emit),
        Fate::Consumed
    );
    let replicas = replicas_of(key);
    assert_eq!(emit.len(), 2, "one copy per replica");
    let mut ids = Vec::new();
    for (e, server) in emit.iter().zip(replicas) {
        let (header, _) = mcudp::Header::parse(&e.frame[PAYLOAD_AT..]).expect("frame header");
        assert_eq!(e.dest, Dest::Port(SERVERS[server].port));
        assert_bytes(
            "copy of the write",
            &e.frame,
            &to_server(server, header.request_id, body),
        );
        assert_checksums("copy of the write", &e.frame);
        ids.push(header.request_id);
    }
    assert_counts(
        "replicated write",
        &rig.stats,
        &before,
        &[
            Count::KvReplicated,
            Count::Requests(replicas[0]),
            Count::Requests(replicas[1]),
        ],
    );
    ids
}

#[test]
fn a_replicated_write_reaches_every_replica_and_is_answered_once_all_have() {
    let fx = Fx::new();
    let mut rig = replicated();
    let key = fx.key(1, 0);
    let [owner, second] = replicas_of(key);
    let body = format!("set {key} 0 0 2\r\nhi\r\n");
    let ids = start_replicated(&mut rig, key, body.as_bytes());

    // The first answer is held; the second completes the write and the client gets one reply.
    let mut emit = Vec::new();
    let mut f = to_agent(owner, ids[0], 0, 1, b"STORED\r\n");
    assert_eq!(
        rig.process(SERVERS[owner].port, &mut f, &mut emit),
        Fate::Consumed
    );
    assert!(emit.is_empty(), "no reply before every replica answered");
    let before = snapshot(&rig.stats);
    let mut f = to_agent(second, ids[1], 0, 1, b"STORED\r\n");
    assert_eq!(
        rig.process(SERVERS[second].port, &mut f, &mut emit),
        Fate::Consumed
    );
    assert_eq!(emit, vec![from_vip_id(0x5151, b"STORED\r\n")]);
    assert_counts(
        "the last replica's answer",
        &rig.stats,
        &before,
        &[
            Count::Replies(second),
            Count::Answer(Answer::ReplicatedWrite),
        ],
    );

    // Replicas that disagree: an error wins over the owner's answer.
    let ids = start_replicated(&mut rig, key, body.as_bytes());
    let mut emit = Vec::new();
    let mut f = to_agent(second, ids[1], 0, 1, b"SERVER_ERROR out of memory\r\n");
    rig.process(SERVERS[second].port, &mut f, &mut emit);
    let mut f = to_agent(owner, ids[0], 0, 1, b"STORED\r\n");
    rig.process(SERVERS[owner].port, &mut f, &mut emit);
    assert_eq!(
        emit,
        vec![from_vip_id(0x5151, b"SERVER_ERROR out of memory\r\n")]
    );

    // A replica that never answers: no reply, the write times out.
    let ids = start_replicated(&mut rig, key, body.as_bytes());
    let mut emit = Vec::new();
    let mut f = to_agent(owner, ids[0], 0, 1, b"STORED\r\n");
    rig.process(SERVERS[owner].port, &mut f, &mut emit);
    let before = snapshot(&rig.stats);
    rig.sw.tick(rig.now + Duration::from_secs(2), &mut emit);
    assert!(emit.is_empty());
    assert_counts(
        "a replica that never answers",
        &rig.stats,
        &before,
        &[Count::Drop(Drop::SplitTimeout)],
    );

    // Reads go to the owner alone, as without replicas.
    let mut frame = to_vip(format!("get {key}\r\n").as_bytes());
    let before = snapshot(&rig.stats);
    assert_eq!(
        rig.process(CLIENT.port, &mut frame, &mut emit),
        Fate::Out(SERVERS[owner].port)
    );
    assert_counts(
        "a read",
        &rig.stats,
        &before,
        &[Count::KvForwarded, Count::Switched, Count::Requests(owner)],
    );

    // A cas cannot be checked against one unique on every replica: refused.
    let mut frame = to_vip(format!("cas {key} 0 0 2 77\r\nhi\r\n").as_bytes());
    let before = snapshot(&rig.stats);
    let mut emit = Vec::new();
    assert_eq!(
        rig.process(CLIENT.port, &mut frame, &mut emit),
        Fate::Consumed
    );
    assert_eq!(
        emit,
        vec![from_vip(
            b"SERVER_ERROR cas is not supported by a replicated pool\r\n"
        )]
    );
    assert_counts(
        "a cas",
        &rig.stats,
        &before,
        &[Count::Answer(Answer::ClientError)],
    );

    // A write in a datagram with other requests is refused, counted.
    let mut frame = to_vip(format!("{body}get {key}\r\n").as_bytes());
    let before = snapshot(&rig.stats);
    assert_eq!(
        rig.process(CLIENT.port, &mut frame, &mut emit),
        Fate::Consumed
    );
    assert_counts(
        "a pipelined write",
        &rig.stats,
        &before,
        &[Count::Drop(Drop::ReplicatedPipeline)],
    );
}

#[test]
fn a_udp_write_to_a_key_of_a_warming_server_deletes_it_where_it_was() {
    let fx = Fx::new();
    let mut rig = Rig::new(Mode::L3);
    // s3 leaves and comes back warming up: its keys were on s1 and s2 meanwhile.
    let s3 = rig.pool.spec().servers[2].clone();
    rig.pool.remove_server(2).unwrap();
    let until = rig.now + Duration::from_secs(60);
    assert_eq!(rig.pool.add_warming(s3, Some(until)).unwrap().server, 2);
    let without: Vec<Server> = SERVER_NAMES[..2]
        .iter()
        .map(|n| Server::new(*n, 1))
        .collect();
    let cold = Ring::new(Distribution::Ketama, HashFn::Md5, &without).unwrap();
    let key = fx.key(2, 0);
    let before = cold.locate(key.as_bytes());

    let body = format!("set {key} 0 0 2\r\nhi\r\n");
    let mut frame = to_vip(body.as_bytes());
    let mut emit = Vec::new();
    assert_eq!(
        rig.process(CLIENT.port, &mut frame, &mut emit),
        Fate::Out(SERVERS[2].port),
        "the write goes to the warming owner"
    );
    let mut delete = vec![0x80, 0x14, 0, key.len() as u8, 0, 0, 0, 0];
    delete.extend_from_slice(&(key.len() as u32).to_be_bytes());
    delete.extend_from_slice(&[0; 12]);
    delete.extend_from_slice(key.as_bytes());
    assert_eq!(emit.len(), 1, "{emit:?}");
    assert_eq!(emit[0].dest, Dest::Port(SERVERS[before].port));
    assert_bytes(
        "the delete where it was",
        &emit[0].frame,
        &to_server(before, 0, &delete),
    );

    // A read, or a write of a key no warming server owns, sends nothing more.
    for body in [
        format!("get {key}\r\n"),
        format!("set {} 0 0 1\r\nx\r\n", fx.key(0, 0)),
    ] {
        let mut frame = to_vip(body.as_bytes());
        let mut emit = Vec::new();
        rig.process(CLIENT.port, &mut frame, &mut emit);
        assert!(emit.is_empty(), "{body:?}: {emit:?}");
    }
    // Warm: nothing more either.
    rig.now = until;
    let mut frame = to_vip(body.as_bytes());
    let mut emit = Vec::new();
    rig.process(CLIENT.port, &mut frame, &mut emit);
    assert!(emit.is_empty(), "{emit:?}");
}

/// A binary request (magic 0x80) or response (0x81) with `extras`, `key` and `value`.
fn bin(magic: u8, op: u8, status: u16, opaque: u32, parts: [&[u8]; 3]) -> Vec<u8> {
    let [extras, key, value] = parts;
    let mut out = vec![magic, op];
    out.extend_from_slice(&(key.len() as u16).to_be_bytes());
    out.extend_from_slice(&[extras.len() as u8, 0]);
    out.extend_from_slice(&status.to_be_bytes());
    let body = extras.len() + key.len() + value.len();
    out.extend_from_slice(&(body as u32).to_be_bytes());
    out.extend_from_slice(&opaque.to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 5]);
    out.extend_from_slice(extras);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
    out
}

/// Sends the pipelined requests in `body` and checks the sub-requests: `subs[n]` is the
/// server and payload of the `n`th, byte for byte. Returns their request ids, in order.
fn start_pipelined_split(
    rig: &mut Rig,
    request_id: u16,
    body: &[u8],
    subs: &[(usize, Vec<u8>)],
) -> Vec<u16> {
    let mut frame = to_vip_raw(&mc(request_id, 0, 1, body));
    let mut emit = Vec::new();
    let before = snapshot(&rig.stats);
    assert_eq!(
        rig.process(CLIENT.port, &mut frame, &mut emit),
        Fate::Consumed
    );
    assert_eq!(emit.len(), subs.len(), "one sub-request per get");
    let mut ids = Vec::new();
    for (n, (e, (server, payload))) in emit.iter().zip(subs).enumerate() {
        let (header, _) = mcudp::Header::parse(&e.frame[PAYLOAD_AT..]).expect("frame header");
        assert_eq!(e.dest, Dest::Port(SERVERS[*server].port), "sub-request {n}");
        assert_bytes(
            &format!("sub-request {n}"),
            &e.frame,
            &to_server(*server, header.request_id, payload),
        );
        assert_checksums("sub-request", &e.frame);
        ids.push(header.request_id);
    }
    let mut expected = vec![Count::KvSplit];
    expected.extend(subs.iter().map(|(s, _)| Count::Requests(*s)));
    assert_counts("pipelined split start", &rig.stats, &before, &expected);
    ids
}

/// Feeds `replies` (server, request id, body) in the order given and checks that only the
/// last one brings the merged reply `merged` to the client, as request `request_id`.
fn finish_split(rig: &mut Rig, replies: &[(usize, u16, Vec<u8>)], request_id: u16, merged: &[u8]) {
    for (i, (server, id, body)) in replies.iter().enumerate() {
        let mut frame = to_agent(*server, *id, 0, 1, body);
        let before = snapshot(&rig.stats);
        let mut emit = Vec::new();
        assert_eq!(
            rig.process(SERVERS[*server].port, &mut frame, &mut emit),
            Fate::Consumed,
            "reply {i}"
        );
        if i + 1 < replies.len() {
            assert!(emit.is_empty(), "reply {i}: nothing before the last part");
            assert_counts(
                &format!("reply {i}"),
                &rig.stats,
                &before,
                &[Count::Replies(*server)],
            );
            continue;
        }
        let want = from_vip_id(request_id, merged);
        assert_eq!(emit.len(), 1, "one merged reply");
        assert_eq!(emit[0].dest, want.dest);
        assert_bytes("merged reply", &emit[0].frame, &want.frame);
        assert_checksums("merged reply", &emit[0].frame);
        assert_counts(
            "merged reply",
            &rig.stats,
            &before,
            &[Count::Replies(*server), Count::Answer(Answer::MergedGet)],
        );
    }
    assert_eq!(rig.sw.snapshot().splits_in_flight, 0);
}

const GETK: u8 = 0x0c;
const GETKQ: u8 = 0x0d;
const NOOP: u8 = 0x0a;

#[test]
fn binary_getkq_pipeline_across_servers_is_split_and_merged() {
    let fx = Fx::new();
    let mut rig = Rig::new(Mode::L3);
    let keys = [fx.key(2, 0), fx.key(0, 0), fx.key(1, 0)];
    let mut body = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        body.extend(bin(
            0x80,
            GETKQ,
            0,
            0x100 + i as u32,
            [b"", key.as_bytes(), b""],
        ));
    }
    body.extend(bin(0x80, NOOP, 0, 0xabcd, [b"", b"", b""]));
    // Each get goes alone, made GETK so that a miss answers, with the client's opaque.
    let subs: Vec<(usize, Vec<u8>)> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| {
            let get = bin(0x80, GETK, 0, 0x100 + i as u32, [b"", key.as_bytes(), b""]);
            (server_of(key), get)
        })
        .collect();
    let ids = start_pipelined_split(&mut rig, 0x5151, &body, &subs);
    // The middle key misses; replies arrive last first.
    let flags = [0u8, 0, 0, 3];
    let hit = |i: usize, op: u8| {
        let value = format!("value-{i}");
        bin(
            0x81,
            op,
            0,
            0x100 + i as u32,
            [&flags, keys[i].as_bytes(), value.as_bytes()],
        )
    };
    let miss = bin(0x81, GETK, 1, 0x101, [b"", keys[1].as_bytes(), b""]);
    let replies = [
        (server_of(keys[2]), ids[2], hit(2, GETK)),
        (server_of(keys[1]), ids[1], miss),
        (server_of(keys[0]), ids[0], hit(0, GETK)),
    ];
    let mut merged = hit(0, GETKQ);
    merged.extend(hit(2, GETKQ));
    merged.extend([0x81, NOOP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xab, 0xcd]);
    merged.extend([0; 8]);
    finish_split(&mut rig, &replies, 0x5151, &merged);
}

#[test]
fn meta_quiet_mg_pipeline_across_servers_is_split_and_merged() {
    let fx = Fx::new();
    let mut rig = Rig::new(Mode::L3);
    let keys = [fx.key(1, 1), fx.key(2, 1), fx.key(0, 1)];
    let body: String = keys
        .iter()
        .map(|k| format!("mg {k} s v q k\r\n"))
        .chain(["mn\r\n".to_string()])
        .collect();
    // Sent without `q`, so that a miss answers.
    let subs: Vec<(usize, Vec<u8>)> = keys
        .iter()
        .map(|k| (server_of(k), format!("mg {k} s v k\r\n").into_bytes()))
        .collect();
    let ids = start_pipelined_split(&mut rig, 0x6161, body.as_bytes(), &subs);
    let hit = |i: usize| format!("VA 2 s2 k{}\r\nv{i}\r\n", keys[i]).into_bytes();
    let replies = [
        (server_of(keys[0]), ids[0], hit(0)),
        (server_of(keys[2]), ids[2], hit(2)),
        (
            server_of(keys[1]),
            ids[1],
            format!("EN k{}\r\n", keys[1]).into_bytes(),
        ),
    ];
    // The quiet miss is left out; the switch answers `mn` last.
    let merged = [hit(0), hit(2), b"MN\r\n".to_vec()].concat();
    finish_split(&mut rig, &replies, 0x6161, &merged);
}

#[test]
fn pipelined_gets_mixed_with_other_commands_are_not_split() {
    let fx = Fx::new();
    let mut rig = Rig::new(Mode::L3);
    let (a, b) = (fx.key(0, 0), fx.key(1, 0));
    for body in [
        format!("mg {a} v\r\nmd {b} q\r\nmn\r\n"),
        format!("mg {a} v\r\nmn\r\nmg {b} v\r\n"),
        format!("mg {a} v\r\nget {b}\r\n"),
    ] {
        let mut frame = to_vip(body.as_bytes());
        let mut emit = Vec::new();
        let before = snapshot(&rig.stats);
        assert_eq!(
            rig.process(CLIENT.port, &mut frame, &mut emit),
            Fate::Consumed
        );
        assert!(emit.is_empty(), "{body}");
        assert_counts(
            &body,
            &rig.stats,
            &before,
            &[Count::Drop(Drop::PipelinedMultiServer)],
        );
    }
}

#[test]
fn split_reply_without_a_frame_header_is_dropped() {
    let mut rig = Rig::new(Mode::L3);
    let s = &SERVERS[0];
    let mut f = udp_frame(s.mac, VIP_MAC, (s.ip, MC_PORT), (VIP, AGENT_PORT), b"END");
    let before = snapshot(&rig.stats);
    let mut emit = Vec::new();
    assert_eq!(rig.process(s.port, &mut f, &mut emit), Fate::Consumed);
    assert!(emit.is_empty());
    assert_counts(
        "short split reply",
        &rig.stats,
        &before,
        &[Count::Replies(0), Count::Drop(Drop::BadFrameHeader)],
    );
}

// ---------------------------------------------------------------------------------------------
// Robustness: arbitrary bytes never panic and never produce a bad fate.

/// A 64-bit linear congruential generator (Knuth's MMIX constants): deterministic, seeded.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }

    fn below(&mut self, n: usize) -> usize {
        self.next() as usize % n
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            *b = self.next() as u8;
        }
    }
}

fn check_sane(what: &str, ports: usize, fate: Fate, emit: &[Emit]) {
    if let Fate::Out(p) = fate {
        assert!(usize::from(p) < ports, "{what}: out of port {p}");
    }
    for e in emit {
        if let Dest::Port(p) = e.dest {
            assert!(usize::from(p) < ports, "{what}: emitted to port {p}");
        }
        assert!(
            e.frame.len() >= ethernet::HEADER_LEN,
            "{what}: emitted a runt"
        );
        assert_checksums(what, &e.frame);
    }
}

#[test]
fn short_random_frames_never_panic() {
    let mut rng = Lcg(0x5eed_0001);
    let mut rig = Rig::new(Mode::L3);
    for len in 0..=60 {
        for round in 0..64 {
            let mut frame = vec![0u8; len];
            rng.fill(&mut frame);
            // Half of them addressed to the VIP as IPv4, so they get past the first checks.
            if round % 2 == 0 && len >= 14 {
                frame[..6].copy_from_slice(&VIP_MAC.0);
                frame[12..14].copy_from_slice(&EtherType::IPV4.0.to_be_bytes());
                if len > 14 {
                    frame[14] = 0x45;
                }
            }
            let mut emit = Vec::new();
            let in_port = rng.below(PORTS) as u16;
            let fate = rig
                .sw
                .process(in_port, &mut frame, round % 3 != 0, rig.now, &mut emit);
            check_sane(&format!("{len} random bytes"), PORTS, fate, &emit);
        }
    }
}

#[test]
fn mutated_frames_never_panic() {
    let fx = Fx::new();
    let templates: Vec<Vec<u8>> = vec![
        to_vip(format!("get {}\r\n", fx.key(0, 0)).as_bytes()),
        to_vip(format!("get {} {} {}\r\n", fx.key(0, 0), fx.key(1, 0), fx.key(2, 0)).as_bytes()),
        to_vip(format!("gat 10 {} {}\r\n", fx.key(0, 0), fx.key(1, 0)).as_bytes()),
        to_vip(format!("set {} 0 0 3\r\nabc\r\n", fx.key(1, 0)).as_bytes()),
        to_vip(format!("mg {} v\r\n", fx.key(2, 0)).as_bytes()),
        to_vip(b"version\r\n"),
        to_vip(&[0x80, 0x0c, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, b'k']),
        backend_reply(0, SERVERS[0].ip, MC_PORT),
        to_agent(1, 1, 0, 1, b"VALUE x 0 1\r\nX\r\nEND\r\n"),
        arp_request(&CLIENT, VIP),
        tcp_to_vip(),
        server_tcp_to(1, VIP),
        server_tcp_to(1, AGENT),
        arp_reply_to(0, VIP),
        arp_reply_to(0, AGENT),
        from_host(SERVERS[1].mac, (VIP, 40001), (SERVERS[1].ip, MC_PORT)),
    ];
    let mut rng = Lcg(0x5eed_0002);
    let mut rig = Rig::new(Mode::L3);
    let mut l2 = Rig::new(Mode::L2);
    let mut rigs_local = [Rig::local(Mode::L3), Rig::local(Mode::L2)];
    let mut now = rig.now;
    for i in 0..5000 {
        let mut frame = templates[rng.below(templates.len())].clone();
        match rng.below(4) {
            // Flip a few bytes anywhere.
            0 | 1 => {
                for _ in 0..1 + rng.below(6) {
                    let at = rng.below(frame.len());
                    frame[at] = rng.next() as u8;
                }
            }
            // Flip a byte in the headers and fix nothing; or cut the frame short.
            2 => {
                let at = rng.below(PAYLOAD_AT.min(frame.len()));
                frame[at] ^= 1 << rng.below(8);
                frame.truncate(rng.below(frame.len() + 1).max(at));
            }
            // Replace the memcached payload with random bytes, checksums fixed.
            _ => {
                if frame.len() > PAYLOAD_AT && frame[12..14] == EtherType::IPV4.0.to_be_bytes() {
                    let mut payload = vec![0u8; rng.below(300)];
                    rng.fill(&mut payload);
                    let eth = ethernet::Frame::new_checked(&frame[..]).expect("template");
                    let ip = ipv4::Packet::new_checked(eth.payload()).expect("template");
                    let u = udp::Packet::new_checked(ip.payload());
                    if let Ok(u) = u {
                        frame = udp_frame(
                            eth.src(),
                            eth.dst(),
                            (ip.src(), u.src_port()),
                            (ip.dst(), u.dst_port()),
                            &payload,
                        );
                    }
                }
            }
        }
        let in_port = rng.below(PORTS) as u16;
        let csum_ready = rng.below(4) != 0;
        let mut emit = Vec::new();
        let mut copy = frame.clone();
        let fate = rig
            .sw
            .process(in_port, &mut frame, csum_ready, now, &mut emit);
        check_sane(&format!("l3 frame {i}"), PORTS, fate, &emit);
        let fate = l2
            .sw
            .process(in_port, &mut copy, csum_ready, now, &mut emit);
        check_sane(&format!("l2 frame {i}"), PORTS, fate, &emit);
        // With a local port, frames may come from it too.
        let in_port = rng.below(PORTS + 1) as u16;
        for (m, r) in rigs_local.iter_mut().enumerate() {
            let mut copy = frame.clone();
            let fate = r.sw.process(in_port, &mut copy, csum_ready, now, &mut emit);
            check_sane(&format!("local {m} frame {i}"), PORTS + 1, fate, &emit);
        }
        if i % 500 == 499 {
            now += Duration::from_millis(700);
            rig.sw.tick(now, &mut emit);
            l2.sw.tick(now, &mut emit);
            for r in rigs_local.iter_mut() {
                r.sw.tick(now, &mut emit);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Servers whose port is not known yet.

/// A switch that has heard from the client only: the servers' MACs are configured, but no
/// frame from them has told the switch which port they are behind (right after start).
fn fresh_switch(cfg: Config) -> (Switch, Arc<Stats>, Instant) {
    let stats = Arc::new(Stats::new(PORTS, SERVERS.len()));
    let mut sw = new_switch(&cfg, PORTS, stats.clone()).expect("switch");
    let now = Instant::from_secs(1_000);
    let mut emit = Vec::new();
    let mut f = arp_request(&CLIENT, Ipv4Addr::new(10, 0, 0, 250));
    assert_eq!(
        sw.process(CLIENT.port, &mut f, true, now, &mut emit),
        Fate::Flood
    );
    (sw, stats, now)
}

/// The ARP request the switch floods to find server `s`: from the VIP's MAC and the agent
/// address (the VIP in l3 mode).
fn arp_for_server(s: usize) -> Emit {
    Emit {
        dest: Dest::Flood,
        frame: arp_frame(
            Mac::BROADCAST,
            &arp::Repr {
                operation: arp::Operation::Request,
                sender_mac: VIP_MAC,
                sender_ip: VIP,
                target_mac: Mac::ZERO,
                target_ip: SERVERS[s].ip,
            },
        ),
    }
}

fn assert_emits(what: &str, got: &[Emit], want: &[Emit]) {
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: frames emitted: {:?}",
        got.iter().map(|e| e.dest).collect::<Vec<_>>()
    );
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.dest, w.dest, "{what}: emit {i} destination");
        assert_bytes(&format!("{what}: emit {i}"), &g.frame, &w.frame);
    }
}

/// A request carrying a client's data goes to its server or nowhere: before the switch knows
/// the server's port it is dropped and counted, never flooded; the switch asks for its servers
/// with ARP out of every port at its first tick and again while one is unknown; once the
/// server has answered, the request leaves by exactly the server's port.
#[test]
fn routed_request_is_never_flooded_before_its_servers_port_is_known() {
    let fx = Fx::new();
    let (mut sw, stats, now) = fresh_switch(config(Mode::L3));
    let mut emit = Vec::new();
    let input = to_vip(format!("set {} 0 0 6\r\nhunter\r\n", fx.key(1, 0)).as_bytes());

    let before = snapshot(&stats);
    let mut frame = input.clone();
    assert_eq!(
        sw.process(CLIENT.port, &mut frame, true, now, &mut emit),
        Fate::Consumed,
        "a routed request whose server's port is unknown must not leave"
    );
    assert!(emit.is_empty());
    // Held, not dropped: it leaves once its server is heard from.
    assert_counts("set before learning", &stats, &before, &[]);
    assert_eq!(stats::get(&stats.route_held), 1);
    // One for a server that never answers is dropped once held too long.
    let mut lost = to_vip(format!("set {} 0 0 1\r\nx\r\n", fx.key(0, 1)).as_bytes());
    assert_eq!(
        sw.process(CLIENT.port, &mut lost, true, now, &mut emit),
        Fate::Consumed
    );
    assert!(emit.is_empty());

    // A get split across servers sends no part anywhere either.
    let before = snapshot(&stats);
    let mut split = to_vip(format!("get {} {}\r\n", fx.key(0, 0), fx.key(1, 1)).as_bytes());
    assert_eq!(
        sw.process(CLIENT.port, &mut split, true, now, &mut emit),
        Fate::Consumed
    );
    assert!(emit.is_empty(), "no sub-request is flooded");
    assert_counts(
        "split before learning",
        &stats,
        &before,
        &[Count::Drop(Drop::RoutePortUnknown)],
    );

    // The first tick asks for every server; not again before the retry interval, and again
    // after it for those still unknown.
    sw.tick(now, &mut emit);
    assert_emits(
        "first tick",
        &emit,
        &[arp_for_server(0), arp_for_server(1), arp_for_server(2)],
    );
    emit.clear();
    sw.tick(now + Duration::from_millis(10), &mut emit);
    assert!(emit.is_empty(), "asked again too soon");

    let mut answer = arp_reply_to(1, VIP);
    assert_eq!(
        sw.process(SERVERS[1].port, &mut answer, true, now, &mut emit),
        Fate::Consumed
    );
    // The held set goes out of exactly the server's port, rewritten as any routed request.
    assert_eq!(emit.len(), 1, "the held request is released");
    assert_eq!(emit[0].dest, Dest::Port(SERVERS[1].port));
    assert_bytes("held set", &emit[0].frame, &routed(&input, Mode::L3, 1));
    emit.clear();
    let drops_before = stats::get(&stats.drops[Drop::RoutePortUnknown as usize]);
    sw.tick(now + Duration::from_secs(1), &mut emit);
    assert_eq!(
        stats::get(&stats.drops[Drop::RoutePortUnknown as usize]),
        drops_before + 1,
        "the request for the silent server is dropped after a second"
    );
    assert_emits(
        "tick after s2 answered",
        &emit,
        &[arp_for_server(0), arp_for_server(2)],
    );
    emit.clear();

    let before = snapshot(&stats);
    let mut frame = input.clone();
    assert_eq!(
        sw.process(CLIENT.port, &mut frame, true, now, &mut emit),
        Fate::Out(SERVERS[1].port)
    );
    assert_bytes("set after learning", &frame, &routed(&input, Mode::L3, 1));
    assert!(emit.is_empty());
    assert_counts(
        "set after learning",
        &stats,
        &before,
        &[Count::KvForwarded, Count::Switched, Count::Requests(1)],
    );
}

/// A quiet server's port is asked for again before its station would age out, so its
/// requests never meet a MAC table that has forgotten it.
#[test]
fn quiet_servers_are_asked_for_before_they_age_out() {
    let mut rig = Rig::new(Mode::L3);
    let mut emit = Vec::new();
    rig.sw.tick(rig.now + Duration::from_secs(1), &mut emit);
    assert!(emit.is_empty(), "every server was heard from just now");
    // The default ageing time is 300 s: past half of it, each server is asked again.
    rig.sw.tick(rig.now + Duration::from_secs(151), &mut emit);
    assert_emits(
        "half-way to ageing",
        &emit,
        &[arp_for_server(0), arp_for_server(1), arp_for_server(2)],
    );
}

// ---------------------------------------------------------------------------------------------
// Sources no host sends from, and the source-address check.

/// A request to the VIP from `src`, arriving from the client's MAC.
fn to_vip_from(src: (Ipv4Addr, u16)) -> Vec<u8> {
    udp_frame(
        CLIENT.mac,
        VIP_MAC,
        src,
        (VIP, MC_PORT),
        &mc(REQ_ID, 0, 1, b"get key:0\r\n"),
    )
}

/// Requests to the VIP from sources nothing can answer are dropped, each reason counted;
/// whether or not the source check is on.
fn bad_source_cases() -> Vec<Case> {
    let case = |name, input: Input, reason| Case {
        name,
        in_port: CLIENT.port,
        input,
        fate: Fate::Consumed,
        output: None,
        emits: nothing,
        counts: match reason {
            Drop::SourcePortZero => &[Count::Drop(Drop::SourcePortZero)],
            Drop::SourceUnspecified => &[Count::Drop(Drop::SourceUnspecified)],
            Drop::SourceBroadcast => &[Count::Drop(Drop::SourceBroadcast)],
            Drop::SourceMulticast => &[Count::Drop(Drop::SourceMulticast)],
            Drop::SourceLoopback => &[Count::Drop(Drop::SourceLoopback)],
            _ => &[Count::Drop(Drop::SourceVip)],
        },
    };
    vec![
        case(
            "UDP to the VIP from source port 0",
            |_| to_vip_from((CLIENT.ip, 0)),
            Drop::SourcePortZero,
        ),
        case(
            "UDP to the VIP from 0.0.0.0",
            |_| to_vip_from((Ipv4Addr::UNSPECIFIED, CLIENT_UDP_PORT)),
            Drop::SourceUnspecified,
        ),
        case(
            "UDP to the VIP from 255.255.255.255",
            |_| to_vip_from((Ipv4Addr::BROADCAST, CLIENT_UDP_PORT)),
            Drop::SourceBroadcast,
        ),
        case(
            "UDP to the VIP from the VIP network's broadcast address",
            |_| to_vip_from((Ipv4Addr::new(10, 0, 0, 255), CLIENT_UDP_PORT)),
            Drop::SourceBroadcast,
        ),
        case(
            "UDP to the VIP from a multicast address",
            |_| to_vip_from((Ipv4Addr::new(224, 0, 0, 1), CLIENT_UDP_PORT)),
            Drop::SourceMulticast,
        ),
        case(
            "UDP to the VIP from a loopback address",
            |_| to_vip_from((Ipv4Addr::LOCALHOST, CLIENT_UDP_PORT)),
            Drop::SourceLoopback,
        ),
        case(
            "UDP to the VIP from the VIP itself, on a client's port",
            |_| to_vip_from((VIP, CLIENT_UDP_PORT)),
            Drop::SourceVip,
        ),
        case(
            "a split reply to the agent port from port 0",
            |_| {
                udp_frame(
                    SERVERS[0].mac,
                    VIP_MAC,
                    (SERVERS[0].ip, 0),
                    (VIP, AGENT_PORT),
                    &mc(1, 0, 1, b"END\r\n"),
                )
            },
            Drop::SourcePortZero,
        ),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, mut c)| {
        // The split reply comes from the server's port.
        if i == 7 {
            c.in_port = SERVERS[0].port;
        }
        c
    })
    .collect()
}

#[test]
fn requests_from_impossible_sources_are_dropped() {
    run(Mode::L3, &bad_source_cases());
    run(Mode::L2, &bad_source_cases()[..7]);
    run_on(Mode::L3, checked, &bad_source_cases());
    // TCP to the VIP (the proxy's traffic) from port 0 does not reach the host either.
    run_on(
        Mode::L3,
        Rig::local,
        &[Case {
            name: "TCP to the VIP from source port 0",
            in_port: CLIENT.port,
            input: |_| tcp_frame(CLIENT.mac, VIP_MAC, (CLIENT.ip, 0), (VIP, MC_PORT), b""),
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::SourcePortZero)],
        }],
    );
}

/// The switch with `switch.source_check` on and no local port; every host has sent one ARP
/// request from its own port, so its address is bound there.
fn checked(mode: Mode) -> Rig {
    Rig::with(
        config_text(mode, "local_port = \"\"\nsource_check = true", ""),
        PORTS,
    )
}

/// The same with a local port (port 3).
fn checked_local(mode: Mode) -> Rig {
    let agent = match mode {
        Mode::L3 => String::new(),
        Mode::L2 => format!("agent_ip = \"{AGENT}\"\n"),
    };
    Rig::with(
        config_text(
            mode,
            "local_port = \"lp\"\nsource_check = true\nsource_age_s = 5",
            &agent,
        ),
        PORTS + 1,
    )
}

/// With the check on, everything legitimate works as before: the whole l3, l2 and local-port
/// tables pass unchanged (the host's stack behind the local port sends from the VIP, servers in
/// l2 mode from the VIP they own).
#[test]
fn source_check_lets_legitimate_traffic_through() {
    run_on(Mode::L3, checked, &l3_cases());
    run_on(Mode::L3, checked_local, &local_cases(VIP));
    run_on(Mode::L2, checked_local, &local_cases(AGENT));
}

/// A client on another port sending with the client's address (to have the reply, up to
/// thousands of times the request's size, land on the client) is dropped and counted, and
/// teaches the switch nothing.
#[test]
fn spoofed_sources_are_dropped() {
    let fx = Fx::new();
    let mut cases = vec![
        Case {
            name: "a request to the VIP from the client's address on a server's port",
            in_port: SERVERS[1].port,
            input: |fx| {
                udp_frame(
                    STRANGER,
                    VIP_MAC,
                    (CLIENT.ip, CLIENT_UDP_PORT),
                    (VIP, MC_PORT),
                    &mc(
                        REQ_ID,
                        0,
                        1,
                        format!("get {}\r\n", fx.long_key.0).as_bytes(),
                    ),
                )
            },
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::SourceSpoofed)],
        },
        Case {
            name: "an ARP reply claiming the client's address from another port",
            in_port: SERVERS[2].port,
            input: |_| {
                arp_frame(
                    SERVERS[0].mac,
                    &arp::Repr {
                        operation: arp::Operation::Reply,
                        sender_mac: STRANGER,
                        sender_ip: CLIENT.ip,
                        target_mac: SERVERS[0].mac,
                        target_ip: SERVERS[0].ip,
                    },
                )
            },
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::SourceSpoofed)],
        },
        Case {
            name: "a server's address from the client's port",
            in_port: CLIENT.port,
            input: |_| {
                udp_frame(
                    CLIENT.mac,
                    SERVERS[2].mac,
                    (SERVERS[0].ip, 5000),
                    (SERVERS[2].ip, 6000),
                    b"hello",
                )
            },
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::SourceSpoofed)],
        },
        Case {
            name: "the VIP as a source on a client's port, to anyone",
            in_port: CLIENT.port,
            input: |_| {
                udp_frame(
                    CLIENT.mac,
                    SERVERS[0].mac,
                    (VIP, MC_PORT),
                    (SERVERS[0].ip, 6000),
                    b"hello",
                )
            },
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::SourceVip)],
        },
        Case {
            name: "the client's own request is still routed",
            in_port: CLIENT.port,
            input: |fx| to_vip(format!("get {}\r\n", fx.key(1, 0)).as_bytes()),
            fate: Fate::Out(SERVERS[1].port),
            output: Some(|_, input| routed(input, Mode::L3, 1)),
            emits: nothing,
            counts: &[Count::KvForwarded, Count::Switched, Count::Requests(1)],
        },
        Case {
            name: "a server's reply still reaches the client from the VIP",
            in_port: SERVERS[0].port,
            input: |_| backend_reply(0, SERVERS[0].ip, MC_PORT),
            fate: Fate::Out(CLIENT.port),
            output: Some(|_, input| rewritten(input, None, Some(VIP), None)),
            emits: nothing,
            counts: &[Count::Switched, Count::Replies(0)],
        },
    ];
    run_on(Mode::L3, checked, &cases);
    cases.truncate(3);
    run_on(Mode::L3, checked_local, &cases);

    // The forged frame's MAC was not learned: a frame for it is still flooded.
    let mut rig = checked(Mode::L3);
    let mut emit = Vec::new();
    let mut forged = udp_frame(
        STRANGER,
        VIP_MAC,
        (CLIENT.ip, CLIENT_UDP_PORT),
        (VIP, MC_PORT),
        &mc(REQ_ID, 0, 1, format!("get {}\r\n", fx.key(0, 0)).as_bytes()),
    );
    assert_eq!(
        rig.process(SERVERS[1].port, &mut forged, &mut emit),
        Fate::Consumed
    );
    let mut to_stranger = udp_frame(
        CLIENT.mac,
        STRANGER,
        (CLIENT.ip, 5000),
        (Ipv4Addr::new(10, 0, 0, 99), 6000),
        b"hi",
    );
    assert_eq!(
        rig.process(CLIENT.port, &mut to_stranger, &mut emit),
        Fate::Flood
    );
}

/// Addresses are learned where first seen, held while seen, and may move once silent for the
/// ageing time (5 s here); a port's configured prefixes bind their addresses from the start.
#[test]
fn source_bindings_are_learned_held_and_aged() {
    let mut rig = checked_local(Mode::L3);
    let newcomer = Host {
        mac: mac(0x50),
        ip: Ipv4Addr::new(10, 0, 0, 50),
        port: 2,
    };
    let mut emit = Vec::new();
    let t0 = rig.now;
    let mut at = |rig: &mut Rig, port: u16, host: &Host, secs: u64| {
        let mut f = arp_request(host, Ipv4Addr::new(10, 0, 0, 250));
        let before = snapshot(&rig.stats);
        let fate = rig.sw.process(
            port,
            &mut f,
            true,
            t0 + Duration::from_secs(secs),
            &mut emit,
        );
        let spoofed = Count::Drop(Drop::SourceSpoofed).read(&rig.stats)
            - before
                .iter()
                .find(|(c, _)| *c == Count::Drop(Drop::SourceSpoofed))
                .map_or(0, |(_, n)| *n);
        (fate, spoofed)
    };
    // First seen on port 2: bound there.
    assert_eq!(at(&mut rig, 2, &newcomer, 0), (Fate::Flood, 0));
    assert_eq!(at(&mut rig, 0, &newcomer, 1), (Fate::Consumed, 1));
    // Seen on port 2 every 3 s: held past the ageing time.
    for t in [3, 6, 9] {
        assert_eq!(at(&mut rig, 2, &newcomer, t), (Fate::Flood, 0));
    }
    assert_eq!(at(&mut rig, 0, &newcomer, 10), (Fate::Consumed, 1));
    // Silent on port 2 for more than 5 s: it has moved, and port 2 is now the wrong one.
    assert_eq!(at(&mut rig, 0, &newcomer, 15), (Fate::Flood, 0));
    assert_eq!(at(&mut rig, 2, &newcomer, 16), (Fate::Consumed, 1));
    // The tick forgets silent addresses too.
    rig.sw.tick(t0 + Duration::from_secs(30), &mut emit);
    assert_eq!(rig.sw.snapshot().source_table, 0);

    // Configured: the client's port alone may send from 10.0.0.0/30, before anything is seen.
    let text = "local_port = \"\"\nsource_check = true\n\n[switch.source_prefixes]\n\
                p0 = [\"10.0.0.0/30\"]";
    let cfg = config_text(Mode::L3, text, "");
    let stats = Arc::new(Stats::new(PORTS, SERVERS.len()));
    let mut sw = new_switch(&cfg, PORTS, stats.clone()).expect("switch");
    let mut f = to_vip_from((Ipv4Addr::new(10, 0, 0, 2), CLIENT_UDP_PORT));
    assert_eq!(sw.process(1, &mut f, true, t0, &mut emit), Fate::Consumed);
    assert_eq!(stats::get(&stats.drops[Drop::SourceSpoofed as usize]), 1);
    // ... and nothing else: a server's address on the client's port is refused.
    let mut f = arp_request(&SERVERS[0], VIP);
    assert_eq!(sw.process(0, &mut f, true, t0, &mut emit), Fate::Consumed);
    assert_eq!(stats::get(&stats.drops[Drop::SourceSpoofed as usize]), 2);
}

#[test]
fn source_check_keys_are_validated() {
    for (extra, key) in [
        ("source_age_s = 0", "switch.source_age_s"),
        ("source_table_size = 0", "switch.source_table_size"),
        (
            "[switch.source_prefixes]\nnope = [\"10.0.0.0/8\"]",
            "switch.source_prefixes.nope",
        ),
        (
            "[switch.source_prefixes]\np1 = [\"10.0.0.0/40\"]",
            "switch.source_prefixes.p1",
        ),
        (
            "udp_reply_burst_bytes = 1500",
            "switch.udp_reply_burst_bytes",
        ),
    ] {
        let text = format!(
            "[switch]\nports = [\"p0\", \"p1\"]\nlocal_port = \"\"\n{extra}\n\n[vip]\nip = \"{VIP}\"\n\
             mac = \"{VIP_MAC}\"\n\n[pool]\n[[pool.servers]]\naddr = \"10.0.0.11:11211\"\n"
        );
        let e = Config::parse(&text, Path::new("t.toml"))
            .err()
            .unwrap_or_else(|| panic!("{extra}: accepted"))
            .to_string();
        assert!(e.contains(key), "{extra}: {e}");
    }
}

// ---------------------------------------------------------------------------------------------
// The limit on reply bytes per client.

/// A reply of `len` payload bytes from server `s`'s memcached port to `client`.
fn big_reply(s: usize, client: Ipv4Addr, len: usize) -> Vec<u8> {
    let mut body = b"VALUE k 0 0\r\n".to_vec();
    body.resize(len, b'x');
    udp_frame(
        SERVERS[s].mac,
        CLIENT.mac,
        (SERVERS[s].ip, MC_PORT),
        (client, CLIENT_UDP_PORT),
        &mc(REQ_ID, 0, 1, &body),
    )
}

/// Payload bytes of a reply whose frame is 2048 bytes long.
const REPLY: usize = 2048 - PAYLOAD_AT - mcudp::LEN;

/// At 1000 bytes a second with a 64 KiB burst, a client gets its burst of server replies and
/// then about 1000 bytes a second; further replies are dropped and counted, the switch's own
/// answers included; another client is not affected.
#[test]
fn udp_reply_bytes_are_limited_per_client() {
    let cfg = config_text(
        Mode::L3,
        "local_port = \"\"\nudp_reply_bytes_per_sec = 1000\nudp_reply_burst_bytes = 65536",
        "",
    );
    let mut rig = Rig::with(cfg, PORTS);
    let mut emit = Vec::new();
    let frame_len = big_reply(0, CLIENT.ip, REPLY).len();
    assert_eq!(65536 % frame_len, 0, "replies fill the burst exactly");
    let fits = 65536 / frame_len;
    for i in 0..fits {
        let mut f = big_reply(0, CLIENT.ip, REPLY);
        assert_eq!(
            rig.process(SERVERS[0].port, &mut f, &mut emit),
            Fate::Out(CLIENT.port),
            "reply {i} within the burst"
        );
    }
    let before = snapshot(&rig.stats);
    let mut f = big_reply(0, CLIENT.ip, REPLY);
    assert_eq!(
        rig.process(SERVERS[0].port, &mut f, &mut emit),
        Fate::Consumed
    );
    assert_counts(
        "over the limit",
        &rig.stats,
        &before,
        &[Count::Replies(0), Count::Drop(Drop::ReplyRateLimited)],
    );
    // The switch's own answer to that client is held to the same limit.
    let before = snapshot(&rig.stats);
    let mut version = to_vip(b"version\r\n");
    assert_eq!(
        rig.process(CLIENT.port, &mut version, &mut emit),
        Fate::Consumed
    );
    assert!(emit.is_empty());
    assert_counts(
        "own answer over the limit",
        &rig.stats,
        &before,
        &[
            Count::Answer(Answer::Local),
            Count::Drop(Drop::ReplyRateLimited),
        ],
    );
    // Another client has its own bucket.
    let other = Ipv4Addr::new(10, 0, 0, 2);
    let mut f = big_reply(0, other, REPLY);
    assert_eq!(
        rig.process(SERVERS[0].port, &mut f, &mut emit),
        Fate::Out(CLIENT.port)
    );
    // Three seconds later the first client may have 3000 bytes more: one reply, not two.
    rig.now += Duration::from_secs(3);
    let mut f = big_reply(0, CLIENT.ip, REPLY);
    assert_eq!(
        rig.process(SERVERS[0].port, &mut f, &mut emit),
        Fate::Out(CLIENT.port)
    );
    let mut f = big_reply(0, CLIENT.ip, REPLY);
    assert_eq!(
        rig.process(SERVERS[0].port, &mut f, &mut emit),
        Fate::Consumed
    );
    assert_eq!(rig.sw.snapshot().reply_buckets, 2);
    // Limit 0 turns it off.
    let cfg = config_text(
        Mode::L3,
        "local_port = \"\"\nudp_reply_bytes_per_sec = 0",
        "",
    );
    let mut rig = Rig::with(cfg, PORTS);
    for _ in 0..2 * fits {
        let mut f = big_reply(0, CLIENT.ip, REPLY);
        assert_eq!(
            rig.process(SERVERS[0].port, &mut f, &mut emit),
            Fate::Out(CLIENT.port)
        );
    }
}

/// The switch a configuration file describes, as the daemon builds it (seed 0).
fn new_switch(cfg: &Config, ports: usize, stats: Arc<Stats>) -> Result<Switch, switch::SpecError> {
    let pool = Arc::new(cfg.pool().expect("the pool builds"));
    Switch::new(cfg.switch_spec(ports, 0), pool, stats)
}
