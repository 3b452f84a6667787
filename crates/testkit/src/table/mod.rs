//! The switch's table of cases (katran's fixtures in spirit), shared by the switch's own
//! table-driven tests (`crates/kvswitch/tests/switch_table.rs`) and the XDP program's
//! comparison with it (`crates/xdp/tests/fast_path.rs`): the topology (one client on port 0,
//! s1 on port 1, s2 and s3 on port 2, a local port 3), the configurations, the ring, the
//! [`Rig`] that drives a [`Switch`] as its run loop does, the frame builders, and each case: a
//! frame and the port it arrives on, and what must happen — the fate, the frame as it leaves,
//! the frames the switch originates and the one counter that moves.
//!
//! Expected frames are built here from the `wire` crate and the ring is computed here from
//! `kv`, never from the switch's own builders. What it imports it also exports, so that a test
//! file needs only `use testkit::table::*`.
pub use std::net::Ipv4Addr;
pub use std::path::Path;
pub use std::sync::Arc;
pub use std::time::Duration;

pub use kv::Instant;

pub use config::{Config, Mode};
pub use kv::{Distribution, HashFn, Ring, Server};
pub use switch::stats::{self, Answer, Drop, Stats};
pub use switch::{Dest, Emit, Fate, Switch};
pub use wire::ethernet::{self, EtherType, Mac};
pub use wire::{arp, ipv4, mcudp, udp};

// ---------------------------------------------------------------------------------------------
// The topology: one client on port 0, s1 on port 1, s2 and s3 on port 2; with a local port
// (the host's own stack behind it, with the VIP's MAC), that is port 3.

#[derive(Clone, Copy, Debug)]
pub struct Host {
    pub mac: Mac,
    pub ip: Ipv4Addr,
    pub port: u16,
}

pub const fn mac(last: u8) -> Mac {
    Mac([0x02, 0, 0, 0, 0, last])
}

pub const PORTS: usize = 3;
/// The local port's number when the switch has one (after the configured ports).
pub const LOCAL: u16 = 3;
/// In l2 mode the host behind the local port speaks to the servers from this address.
pub const AGENT: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 101);
pub const VIP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 100);
pub const VIP_MAC: Mac = mac(0x64);
pub const MC_PORT: u16 = 11211;
pub const AGENT_PORT: u16 = 11311;
pub const CLIENT_UDP_PORT: u16 = 40000;
/// The request id every client request in the table carries.
pub const REQ_ID: u16 = 0xbeef;

pub const CLIENT: Host = Host {
    mac: mac(0x01),
    ip: Ipv4Addr::new(10, 0, 0, 1),
    port: 0,
};
pub const SERVERS: [Host; 3] = [
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
pub const SERVER_NAMES: [&str; 3] = ["s1", "s2", "s3"];
/// A station the switch has never heard from.
pub const STRANGER: Mac = mac(0x99);

/// The switch without a local port (TCP to the VIP is dropped).
pub fn config(mode: Mode) -> Config {
    config_text(mode, "local_port = \"\"", "")
}

/// The switch with a local port `lp` (port 3) and TCP to the VIP on the proxy's path (the
/// splice has tests of its own); in l2 mode with the agent address.
pub fn config_local(mode: Mode) -> Config {
    let agent = match mode {
        Mode::L3 => String::new(),
        Mode::L2 => format!("agent_ip = \"{AGENT}\"\n"),
    };
    config_text(mode, "local_port = \"lp\"\ntcp = \"proxy\"", &agent)
}

pub fn config_text(mode: Mode, switch_extra: &str, vip_extra: &str) -> Config {
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
pub fn ring() -> Ring {
    let servers: Vec<Server> = SERVER_NAMES.iter().map(|n| Server::new(*n, 1)).collect();
    Ring::new(Distribution::Ketama, HashFn::Md5, &servers).expect("ring")
}

/// Keys whose servers are known in advance, found with the ring above.
pub struct Fx {
    /// `key_on[s][n]`: the `n`th key of the form `key:<i>` that lives on server `s`.
    pub key_on: [Vec<String>; 3],
    /// A 250-byte key (memcached's longest) and its server.
    pub long_key: (String, usize),
}

impl Default for Fx {
    fn default() -> Fx {
        Fx::new()
    }
}

impl Fx {
    pub fn new() -> Fx {
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

    pub fn key(&self, server: usize, n: usize) -> &str {
        &self.key_on[server][n]
    }
}

/// A switch whose MAC table already holds every host (each has sent one frame).
pub struct Rig {
    pub sw: Switch,
    pub stats: Arc<Stats>,
    pub pool: Arc<switch::pool::Pool>,
    pub now: Instant,
}

impl Rig {
    pub fn new(mode: Mode) -> Rig {
        Rig::with(config(mode), PORTS)
    }

    /// With a local port, numbered `LOCAL`.
    pub fn local(mode: Mode) -> Rig {
        let rig = Rig::with(config_local(mode), PORTS + 1);
        assert_eq!(rig.sw.local_port(), Some(LOCAL));
        rig
    }

    pub fn with(cfg: Config, ports: usize) -> Rig {
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

    pub fn process(&mut self, in_port: u16, frame: &mut [u8], emit: &mut Vec<Emit>) -> Fate {
        self.sw.process(in_port, frame, true, self.now, emit)
    }
}

// ---------------------------------------------------------------------------------------------
// Frame builders.

pub const IP_AT: usize = ethernet::HEADER_LEN;
pub const UDP_AT: usize = IP_AT + ipv4::HEADER_LEN;
pub const PAYLOAD_AT: usize = UDP_AT + udp::HEADER_LEN;

/// An Ethernet/IPv4/UDP frame with both checksums filled.
pub fn udp_frame(
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

/// A memcached UDP frame header followed by `body`.
pub fn mc(request_id: u16, seq: u16, total: u16, body: &[u8]) -> Vec<u8> {
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
pub fn to_vip_raw(payload: &[u8]) -> Vec<u8> {
    udp_frame(
        CLIENT.mac,
        VIP_MAC,
        (CLIENT.ip, CLIENT_UDP_PORT),
        (VIP, MC_PORT),
        payload,
    )
}

/// A single-datagram memcached request from the client to the VIP.
pub fn to_vip(body: &[u8]) -> Vec<u8> {
    to_vip_raw(&mc(REQ_ID, 0, 1, body))
}

/// The reply the switch sends the client from the VIP for request `REQ_ID`.
pub fn from_vip(body: &[u8]) -> Emit {
    from_vip_id(REQ_ID, body)
}

pub fn from_vip_id(request_id: u16, body: &[u8]) -> Emit {
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
pub fn backend_reply(server: usize, src_ip: Ipv4Addr, src_port: u16) -> Vec<u8> {
    udp_frame(
        SERVERS[server].mac,
        CLIENT.mac,
        (src_ip, src_port),
        (CLIENT.ip, CLIENT_UDP_PORT),
        &mc(REQ_ID, 0, 1, b"END\r\n"),
    )
}

pub fn arp_frame(eth_dst: Mac, repr: &arp::Repr) -> Vec<u8> {
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

pub fn arp_request(from: &Host, target: Ipv4Addr) -> Vec<u8> {
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
pub fn patch_ipv4(mut frame: Vec<u8>, at: usize, bytes: &[u8]) -> Vec<u8> {
    frame[IP_AT + at..IP_AT + at + bytes.len()].copy_from_slice(bytes);
    ipv4::Packet::new_checked(&mut frame[IP_AT..])
        .expect("valid IPv4 header")
        .fill_checksum();
    frame
}

/// The same datagram with four NOP option bytes in its IPv4 header.
pub fn with_ipv4_options(frame: &[u8]) -> Vec<u8> {
    let mut out = frame[..UDP_AT].to_vec();
    out.extend_from_slice(&[1, 1, 1, 1]);
    out.extend_from_slice(&frame[UDP_AT..]);
    let total = u16::from_be_bytes([out[IP_AT + 2], out[IP_AT + 3]]) + 4;
    out[IP_AT] = 0x46;
    out[IP_AT + 2..IP_AT + 4].copy_from_slice(&total.to_be_bytes());
    patch_ipv4(out, 0, &[0x46])
}

/// A TCP segment (bare 20-byte header) from the client to the VIP's memcached port.
pub fn tcp_to_vip() -> Vec<u8> {
    tcp_frame(
        CLIENT.mac,
        VIP_MAC,
        (CLIENT.ip, CLIENT_UDP_PORT),
        (VIP, MC_PORT),
        b"",
    )
}

/// An Ethernet/IPv4/TCP frame (ACK+PSH, 20-byte header) carrying `payload`, checksums filled.
pub fn tcp_frame(
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
pub fn tcp_checksum(src: Ipv4Addr, dst: Ipv4Addr, segment: &[u8]) -> u16 {
    let mut seg = segment.to_vec();
    seg[16..18].copy_from_slice(&[0, 0]);
    let pseudo = wire::checksum::pseudo_header_v4(src, dst, 6, seg.len() as u16);
    wire::checksum::fold(pseudo + wire::checksum::sum(&seg))
}

/// An IPv4 frame of protocol `proto` with `payload` after the header.
pub fn ip_frame(src_mac: Mac, dst_mac: Mac, src: Ipv4Addr, dst: Ipv4Addr, proto: u8) -> Vec<u8> {
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
pub fn rewritten(
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
pub fn routed(input: &[u8], mode: Mode, server: usize) -> Vec<u8> {
    let s = &SERVERS[server];
    match mode {
        Mode::L3 => rewritten(input, Some(s.mac), None, Some(s.ip)),
        Mode::L2 => rewritten(input, Some(s.mac), None, None),
    }
}

/// Checks the IPv4 header checksum and, when present, the UDP checksum of a frame.
pub fn assert_checksums(what: &str, frame: &[u8]) {
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

pub fn assert_bytes(what: &str, got: &[u8], want: &[u8]) {
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
pub enum Count {
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
    pub fn all() -> Vec<Count> {
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

    pub fn read(self, s: &Stats) -> u64 {
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

pub fn snapshot(s: &Stats) -> Vec<(Count, u64)> {
    Count::all().into_iter().map(|c| (c, c.read(s))).collect()
}

pub fn assert_counts(what: &str, s: &Stats, before: &[(Count, u64)], expected: &[Count]) {
    for (c, was) in before {
        let want = expected.iter().filter(|e| *e == c).count() as u64;
        let delta = c.read(s) - was;
        assert_eq!(delta, want, "{what}: counter {c:?} moved by {delta}");
    }
}

// ---------------------------------------------------------------------------------------------
// The table.

/// Builds the frame a case expects to leave the switch, from the frame that went in.
pub type Expected = fn(&Fx, &[u8]) -> Vec<u8>;
/// Builds a case's input frame.
pub type Input = fn(&Fx) -> Vec<u8>;

pub struct Case {
    pub name: &'static str,
    pub in_port: u16,
    pub input: Input,
    pub fate: Fate,
    /// The frame as it leaves, from the input; `None`: unchanged. Only checked when the
    /// frame leaves (`Out` or `Flood`).
    pub output: Option<Expected>,
    /// The frames the switch originates, in order.
    pub emits: fn(&Fx) -> Vec<Emit>,
    /// The counters that move, by one each.
    pub counts: &'static [Count],
}

pub fn nothing(_: &Fx) -> Vec<Emit> {
    Vec::new()
}

/// The switch's ARP reply for the VIP, to the client, on the client's port.
pub fn vip_arp_reply(_: &Fx) -> Vec<Emit> {
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

pub fn run(mode: Mode, cases: &[Case]) {
    run_on(mode, Rig::new, cases)
}

pub fn run_on(mode: Mode, rig: fn(Mode) -> Rig, cases: &[Case]) {
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

mod cases;
mod flows;
mod keyed;

pub use cases::*;
pub use flows::*;
pub use keyed::*;
