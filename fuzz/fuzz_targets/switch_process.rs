//! The whole switch application: one received frame through `Switch::process`, then `tick`.
//!
//! One switch (3 ports, 3 backends with configured MACs, l3 mode) lives across inputs, so MAC
//! learning, split gets and their timeouts build up state as a real run does; a virtual clock
//! advances 50 ms per input. The first byte of the frame (its destination MAC) also picks:
//! - the input port, `byte % 3`;
//! - bit 2: `csum_ready` (clear: the switch completes the L4 checksum itself, as for frames
//!   whose checksum the kernel left to the device);
//! - bit 3: before processing, set the IPv4 total length and the UDP length from the frame's
//!   size and refill the IPv4 header checksum, so that memcached payloads of any length reach
//!   the key router instead of stopping at a length or checksum check.
//!
//! Contract checked: nothing panics; the frame keeps its length; a frame sent on goes to a
//! port that exists, and every checksum of it that verified still verifies after the rewrites;
//! every frame the switch originates is a whole Ethernet frame of at most 1514 bytes (a
//! 1500-byte MTU), goes to a port that exists, and is a well-formed ARP packet or an IPv4/UDP
//! datagram whose checksums verify.
#![no_main]

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use kv::{Distribution, HashFn, Instant};
use libfuzzer_sys::fuzz_target;
use switch::pool::Pool;
use switch::spec;
use switch::stats::Stats;
use switch::{Dest, Emit, Fate, Switch, SwitchSpec};
use wire::ethernet::Mac;
use wire::ethernet::{self, EtherType};
use wire::{arp, ipv4, udp};

/// Three ports and the local port (`lp`, number 3).
const PORTS: usize = 4;

/// Largest frame the I/O layer hands the switch (its frame slot, `kvio::batch::FRAME_CAP`).
const FRAME_CAP: usize = 2048;

/// Largest frame on a 1500-byte MTU link.
const MTU_FRAME: usize = 1514;

/// Time between two inputs on the virtual clock.
const STEP: Duration = Duration::from_millis(50);

/// The topology of the switch's table tests: a client (10.0.0.1) and three servers (s1, s2,
/// s3), all on memcached's port, and a local port into the host. The agent address is the VIP.
fn spec() -> (SwitchSpec, Pool) {
    let vip = Ipv4Addr::new(10, 0, 0, 100);
    let servers = (0..3u8)
        .map(|i| spec::Server {
            addr: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 11 + i), 11211),
            mac: Some(Mac([2, 0, 0, 0, 0, 0x0b + i])),
        })
        .collect();
    let mut spec = SwitchSpec::new(PORTS, vip, servers);
    spec.local = Some(spec::Local {
        port: 3,
        addrs: vec![vip],
        source: vip,
    });
    spec.mac_table_size = 64;
    spec.mac_age = Duration::from_secs(30);
    let mut pool = spec.pool_spec(Distribution::Ketama, HashFn::Md5);
    for (i, server) in pool.servers.iter_mut().enumerate() {
        server.name = Some(format!("s{}", i + 1));
    }
    (spec, Pool::new(pool).expect("the pool builds"))
}

struct Rig {
    switch: Switch,
    start: Instant,
    elapsed: Duration,
    emit: Vec<Emit>,
}

fn rig() -> &'static Mutex<Rig> {
    static RIG: OnceLock<Mutex<Rig>> = OnceLock::new();
    RIG.get_or_init(|| {
        let (spec, pool) = spec();
        let stats = Arc::new(Stats::new(PORTS, spec.servers.len()));
        let switch = Switch::new(spec, Arc::new(pool), stats).expect("the switch builds");
        Mutex::new(Rig {
            switch,
            start: Instant::from_secs(1),
            elapsed: Duration::ZERO,
            emit: Vec::new(),
        })
    })
}

fuzz_target!(|data: &[u8]| {
    let Some(&first) = data.first() else {
        return;
    };
    if data.len() > FRAME_CAP {
        return;
    }
    let in_port = u16::from(first % PORTS as u8);
    let csum_ready = first & 0x04 != 0;
    let mut frame = data.to_vec();
    if first & 0x08 != 0 {
        normalise_lengths(&mut frame);
    }

    let mut rig = rig().lock().unwrap_or_else(PoisonError::into_inner);
    let Rig {
        switch,
        start,
        elapsed,
        emit,
    } = &mut *rig;
    *elapsed += STEP;
    let now = *start + *elapsed;
    emit.clear();

    let before = checksums(&frame);
    let fate = switch.process(in_port, &mut frame, csum_ready, now, emit);
    assert_eq!(
        frame.len(),
        data.len(),
        "process changed the frame's length"
    );
    if let Fate::Out(port) = fate {
        assert!(usize::from(port) < PORTS, "sent out of port {port}");
    }
    if fate != Fate::Consumed {
        // Rewrites repair the checksums they touch.
        let after = checksums(&frame);
        assert!(
            !before.ip || after.ip,
            "a rewrite broke the IPv4 header checksum"
        );
        if csum_ready {
            assert!(!before.udp || after.udp, "a rewrite broke the UDP checksum");
        }
    }
    switch.tick(now, emit);

    // A frame that arrived within the MTU never makes the switch originate a bigger one; a
    // bigger received frame bounds what may come from it.
    let limit = MTU_FRAME.max(data.len());
    for out in emit.iter() {
        check_emitted(out, limit);
    }
});

fn check_emitted(out: &Emit, limit: usize) {
    let frame = &out.frame;
    assert!(
        frame.len() >= ethernet::HEADER_LEN && frame.len() <= limit,
        "emitted a frame of {} bytes (limit {limit})",
        frame.len()
    );
    if let Dest::Port(port) = out.dest {
        assert!(usize::from(port) < PORTS, "emitted to port {port}");
    }
    let eth = ethernet::Frame::new_checked(&frame[..]).expect("emitted frame has a header");
    match eth.ethertype() {
        EtherType::ARP => {
            let packet = arp::Packet::new_checked(eth.payload()).expect("emitted ARP checks");
            arp::Repr::parse(&packet).expect("emitted ARP parses");
        }
        EtherType::IPV4 => {
            let ip = ipv4::Packet::new_checked(eth.payload()).expect("emitted IPv4 checks");
            let repr = ipv4::Repr::parse(&ip).expect("emitted IPv4 parses, checksum included");
            assert_eq!(repr.protocol, ipv4::Protocol::UDP);
            let datagram = udp::Packet::new_checked(ip.payload()).expect("emitted UDP checks");
            assert_ne!(datagram.checksum(), 0, "emitted UDP without a checksum");
            udp::Repr::parse(&datagram, repr.src, repr.dst).expect("emitted UDP checksum verifies");
        }
        other => panic!("emitted a frame of EtherType {other}"),
    }
}

/// Which checksums of a frame verify (false when there is no such header).
struct Checksums {
    ip: bool,
    /// A UDP checksum is present (not zero) and right.
    udp: bool,
}

fn checksums(frame: &[u8]) -> Checksums {
    let mut out = Checksums {
        ip: false,
        udp: false,
    };
    let Ok(eth) = ethernet::Frame::new_checked(frame) else {
        return out;
    };
    if eth.ethertype() != EtherType::IPV4 {
        return out;
    }
    let Ok(ip) = ipv4::Packet::new_checked(eth.payload()) else {
        return out;
    };
    out.ip = ip.verify_checksum();
    if ip.protocol() == ipv4::Protocol::UDP && !ip.is_fragment() {
        if let Ok(datagram) = udp::Packet::new_checked(ip.payload()) {
            out.udp = datagram.checksum() != 0 && datagram.verify_checksum(ip.src(), ip.dst());
        }
    }
    out
}

/// Makes an IPv4 frame's length fields match its size and its header checksum right.
fn normalise_lengths(frame: &mut [u8]) {
    const IP: usize = ethernet::HEADER_LEN;
    if frame.len() < IP + ipv4::HEADER_LEN || frame[12..14] != EtherType::IPV4.0.to_be_bytes() {
        return;
    }
    let header_len = usize::from(frame[IP] & 0x0f) * 4;
    let Ok(total) = u16::try_from(frame.len() - IP) else {
        return;
    };
    if header_len < ipv4::HEADER_LEN || header_len > usize::from(total) {
        return;
    }
    frame[IP + 2..IP + 4].copy_from_slice(&total.to_be_bytes());
    let udp_at = IP + header_len;
    if frame[IP + 9] == ipv4::Protocol::UDP.0 && frame.len() >= udp_at + udp::HEADER_LEN {
        let udp_len = (frame.len() - udp_at) as u16;
        frame[udp_at + 4..udp_at + 6].copy_from_slice(&udp_len.to_be_bytes());
    }
    if let Ok(mut ip) = ipv4::Packet::new_checked(&mut frame[IP..]) {
        ip.fill_checksum();
    }
}
