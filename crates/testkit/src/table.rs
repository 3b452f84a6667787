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

/// The switch with a local port `lp` (port 3); in l2 mode with the agent address.
pub fn config_local(mode: Mode) -> Config {
    let agent = match mode {
        Mode::L3 => String::new(),
        Mode::L2 => format!("agent_ip = \"{AGENT}\"\n"),
    };
    config_text(mode, "local_port = \"lp\"", &agent)
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

pub fn l3_cases() -> Vec<Case> {
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
pub fn server_tcp_to(s: usize, dst: Ipv4Addr) -> Vec<u8> {
    tcp_frame(
        SERVERS[s].mac,
        VIP_MAC,
        (SERVERS[s].ip, MC_PORT),
        (dst, 40001),
        b"VERSION 1.6.18\r\n",
    )
}

/// Server `s` answering an ARP request from `target` (at the VIP's MAC).
pub fn arp_reply_to(s: usize, target: Ipv4Addr) -> Vec<u8> {
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
pub fn from_host(dst_mac: Mac, src: (Ipv4Addr, u16), dst: (Ipv4Addr, u16)) -> Vec<u8> {
    tcp_frame(VIP_MAC, dst_mac, src, dst, b"get k\r\n")
}

/// The switch with a local port, in either mode: what reaches the host's stack and what
/// leaves it. `source` is where the host speaks to the servers from (the VIP in l3 mode, the
/// agent address in l2 mode).
pub fn local_cases(source: Ipv4Addr) -> Vec<Case> {
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
pub const LONG_KEY_SERVER: usize = 0;

pub fn l2_cases() -> Vec<Case> {
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
pub fn to_agent(server: usize, request_id: u16, seq: u16, total: u16, body: &[u8]) -> Vec<u8> {
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
pub fn sub_request(server: usize, request_id: u16, keys: &[&str]) -> Vec<u8> {
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
pub fn start_split(
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
pub fn server_of(key: &str) -> usize {
    ring().locate(key.as_bytes())
}

/// A datagram from the agent port to `server`'s memcached port carrying `body`.
pub fn to_server(server: usize, request_id: u16, body: &[u8]) -> Vec<u8> {
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
pub fn replicated() -> Rig {
    let mut cfg = config(Mode::L3);
    cfg.replicas = 2;
    Rig::with(cfg, PORTS)
}

/// The two replicas of `key` on the test ring, owner first.
pub fn replicas_of(key: &str) -> [usize; 2] {
    let servers: Vec<Server> = SERVER_NAMES.iter().map(|n| Server::new(*n, 1)).collect();
    let ring = Ring::new_stable(HashFn::Md5, &servers).expect("ring");
    let mut out = Vec::new();
    ring.replicas_hash(ring.key_hash(key.as_bytes()), 2, &mut out);
    [out[0], out[1]]
}

/// Sends `body` (one write) to the VIP and checks that it goes, unchanged, to both replicas of
/// `key` from the agent port. Returns the sub-request ids, owner first.
pub fn start_replicated(rig: &mut Rig, key: &str, body: &[u8]) -> Vec<u16> {
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

/// A binary request (magic 0x80) or response (0x81) with `extras`, `key` and `value`.
pub fn bin(magic: u8, op: u8, status: u16, opaque: u32, parts: [&[u8]; 3]) -> Vec<u8> {
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
pub fn start_pipelined_split(
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
pub fn finish_split(
    rig: &mut Rig,
    replies: &[(usize, u16, Vec<u8>)],
    request_id: u16,
    merged: &[u8],
) {
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

pub const GETK: u8 = 0x0c;
pub const GETKQ: u8 = 0x0d;
pub const NOOP: u8 = 0x0a;

// ---------------------------------------------------------------------------------------------
// Robustness: arbitrary bytes never panic and never produce a bad fate.

/// A 64-bit linear congruential generator (Knuth's MMIX constants): deterministic, seeded.
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next_u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }

    pub fn below(&mut self, n: usize) -> usize {
        self.next_u32() as usize % n
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            *b = self.next_u32() as u8;
        }
    }
}

pub fn check_sane(what: &str, ports: usize, fate: Fate, emit: &[Emit]) {
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

// ---------------------------------------------------------------------------------------------
// Servers whose port is not known yet.

/// A switch that has heard from the client only: the servers' MACs are configured, but no
/// frame from them has told the switch which port they are behind (right after start).
pub fn fresh_switch(cfg: Config) -> (Switch, Arc<Stats>, Instant) {
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
pub fn arp_for_server(s: usize) -> Emit {
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

pub fn assert_emits(what: &str, got: &[Emit], want: &[Emit]) {
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

// ---------------------------------------------------------------------------------------------
// Sources no host sends from, and the source-address check.

/// A request to the VIP from `src`, arriving from the client's MAC.
pub fn to_vip_from(src: (Ipv4Addr, u16)) -> Vec<u8> {
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
pub fn bad_source_cases() -> Vec<Case> {
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

/// The switch with `switch.source_check` on and no local port; every host has sent one ARP
/// request from its own port, so its address is bound there.
pub fn checked(mode: Mode) -> Rig {
    Rig::with(
        config_text(mode, "local_port = \"\"\nsource_check = true", ""),
        PORTS,
    )
}

/// The same with a local port (port 3).
pub fn checked_local(mode: Mode) -> Rig {
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

// ---------------------------------------------------------------------------------------------
// The limit on reply bytes per client.

/// A reply of `len` payload bytes from server `s`'s memcached port to `client`.
pub fn big_reply(s: usize, client: Ipv4Addr, len: usize) -> Vec<u8> {
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
pub const REPLY: usize = 2048 - PAYLOAD_AT - mcudp::LEN;

/// The switch a configuration file describes, as the daemon builds it (seed 0).
pub fn new_switch(
    cfg: &Config,
    ports: usize,
    stats: Arc<Stats>,
) -> Result<Switch, switch::SpecError> {
    let pool = Arc::new(cfg.pool().expect("the pool builds"));
    Switch::new(cfg.switch_spec(ports, 0), pool, stats)
}
