//! Host identity in the switch: a server's MAC and address are bound to its port, a station's
//! MAC to its port while it is in use, sources outside the clients' networks are refused, and
//! a server removed from the pool takes its entries with it.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

use kv::{Distribution, HashFn, Instant};
use switch::frame::{udp_frame, UdpEnds};
use switch::pool::Pool;
use switch::spec;
use switch::stats::{self, Drop, Stats};
use switch::{Emit, Fate, Switch, SwitchSpec};
use wire::ethernet::Mac;
use wire::mcudp;

const VIP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 100);
const VIP_MAC: Mac = Mac([2, 0, 0, 0, 0, 0x64]);
const CLIENT_MAC: Mac = Mac([2, 0, 0, 0, 0, 1]);
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const OTHER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const NOW: Instant = Instant::from_secs(10);

fn server_mac(i: u8) -> Mac {
    Mac([2, 0, 0, 0, 1, i])
}

fn server_ip(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, 11 + i)
}

/// Four ports: client on 0, servers 0 and 1 on ports 1 and 2 (their MACs resolved from a
/// frame each), another client on 3; the source check on with an age of 60 s.
fn rig_with(change: impl FnOnce(&mut SwitchSpec)) -> (Switch, Arc<Pool>, Arc<Stats>) {
    let servers = (0..2u8)
        .map(|i| spec::Server {
            addr: SocketAddrV4::new(server_ip(i), 11211),
            mac: Some(server_mac(i)),
        })
        .collect();
    let mut spec = SwitchSpec::new(4, VIP, servers);
    spec.source_check = Some(spec::SourceCheck {
        age: Duration::from_secs(60),
        table_size: 64,
        prefixes: Vec::new(),
    });
    change(&mut spec);
    let pool = Arc::new(Pool::new(spec.pool_spec(Distribution::Ketama, HashFn::Md5)).unwrap());
    let stats = Arc::new(Stats::new(4, 2));
    let mut sw = Switch::new(spec, pool.clone(), stats.clone()).unwrap();
    for i in 0..2u8 {
        let f = frame(server_mac(i), server_ip(i), 11211, CLIENT_IP, 40000, b"x");
        process(&mut sw, 1 + u16::from(i), f, NOW);
    }
    (sw, pool, stats)
}

fn rig() -> (Switch, Arc<Pool>, Arc<Stats>) {
    rig_with(|_| {})
}

/// Server `i`'s UDP reply to the client, carrying `payload`.
fn reply(i: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = frame(
        server_mac(i),
        server_ip(i),
        11211,
        CLIENT_IP,
        40000,
        payload,
    );
    f[0..6].copy_from_slice(&CLIENT_MAC.0);
    f
}

fn frame(mac: Mac, ip: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16, payload: &[u8]) -> Vec<u8> {
    let ends = UdpEnds {
        src_mac: mac,
        dst_mac: VIP_MAC,
        src_ip: ip,
        dst_ip: dst,
        src_port: sport,
        dst_port: dport,
    };
    udp_frame(&ends, &[payload])
}

fn request(text: &str) -> Vec<u8> {
    let mut payload = vec![0u8; mcudp::LEN];
    mcudp::Header::single(7).emit(&mut payload);
    payload.extend_from_slice(text.as_bytes());
    payload
}

/// `get key` from `mac`/`ip` to the VIP.
fn get_from(mac: Mac, ip: Ipv4Addr, key: &str) -> Vec<u8> {
    frame(
        mac,
        ip,
        40000,
        VIP,
        11211,
        &request(&format!("get {key}\r\n")),
    )
}

fn process(sw: &mut Switch, port: u16, mut f: Vec<u8>, now: Instant) -> (Fate, Vec<u8>) {
    let mut emit: Vec<Emit> = Vec::new();
    let fate = sw.process(port, &mut f, true, now, &mut emit);
    (fate, f)
}

fn drops(stats: &Stats, reason: Drop) -> u64 {
    stats::get(&stats.drops[reason as usize])
}

/// A key the ring places on server `i`.
fn key_on(sw: &mut Switch, i: u16) -> String {
    (0..1000)
        .map(|n| format!("key{n}"))
        .find(|k| process(sw, 0, get_from(CLIENT_MAC, CLIENT_IP, k), NOW).0 == Fate::Out(1 + i))
        .expect("a key of each server within 1000")
}

#[test]
fn a_clients_frame_with_a_servers_mac_moves_nothing() {
    let (mut sw, _, stats) = rig();
    let key = key_on(&mut sw, 0);
    // The server's MAC with the client's own address, with an address of nobody's, and on
    // frames that are not IPv4 at all.
    let mut forged = vec![
        frame(server_mac(0), CLIENT_IP, 40000, OTHER_IP, 9, b"x"),
        frame(
            server_mac(0),
            Ipv4Addr::new(10, 0, 0, 77),
            1,
            OTHER_IP,
            9,
            b"x",
        ),
    ];
    for ethertype in [0x88b5u16, 0x0806, 0x86dd] {
        let mut f = frame(server_mac(0), CLIENT_IP, 40000, OTHER_IP, 9, b"x");
        f[12..14].copy_from_slice(&ethertype.to_be_bytes());
        forged.push(f);
    }
    for (n, f) in forged.into_iter().enumerate() {
        assert_eq!(process(&mut sw, 0, f, NOW).0, Fate::Consumed, "frame {n}");
        assert_eq!(drops(&stats, Drop::SourceMacBound), n as u64 + 1);
    }
    // Requests for the server still go to the server's port, now and much later.
    assert_eq!(
        process(&mut sw, 0, get_from(CLIENT_MAC, CLIENT_IP, &key), NOW).0,
        Fate::Out(1)
    );
    let later = NOW + Duration::from_secs(3600);
    process(
        &mut sw,
        3,
        frame(server_mac(0), OTHER_IP, 1, CLIENT_IP, 9, b"x"),
        later,
    );
    assert_eq!(drops(&stats, Drop::SourceMacBound), 6);
    assert_eq!(
        process(&mut sw, 0, get_from(CLIENT_MAC, CLIENT_IP, &key), later).0,
        Fate::Out(1)
    );
}

#[test]
fn a_quiet_servers_address_is_never_given_to_a_client() {
    let (mut sw, _, stats) = rig();
    // Long after the server was last heard, a client sends from its address.
    let later = NOW + Duration::from_secs(600);
    sw.tick(later, &mut Vec::new());
    let forged = frame(CLIENT_MAC, server_ip(0), 11211, OTHER_IP, 40000, b"VALUE");
    assert_eq!(process(&mut sw, 0, forged, later).0, Fate::Consumed);
    assert_eq!(drops(&stats, Drop::SourceSpoofed), 1);
    // The server's own replies still go through, re-sourced as the VIP.
    process(&mut sw, 0, get_from(CLIENT_MAC, CLIENT_IP, "a"), later);
    let (fate, out) = process(&mut sw, 1, reply(0, b"END"), later);
    assert_eq!(fate, Fate::Out(0));
    assert_eq!(out[26..30], VIP.octets());
    assert_eq!(drops(&stats, Drop::SourceSpoofed), 1);
}

#[test]
fn a_station_in_use_stays_on_its_port_and_moves_once_silent() {
    let (mut sw, _, stats) = rig();
    assert!(matches!(
        process(&mut sw, 0, get_from(CLIENT_MAC, CLIENT_IP, "a"), NOW).0,
        Fate::Out(1 | 2)
    ));
    // Another port sends from the client's MAC with an address of its own.
    let t = NOW + Duration::from_secs(30);
    let stolen = get_from(CLIENT_MAC, OTHER_IP, "a");
    assert_eq!(process(&mut sw, 3, stolen.clone(), t).0, Fate::Consumed);
    assert_eq!(drops(&stats, Drop::SourceMacMoved), 1);
    // Frames to the client still leave by its port.
    let to_client = reply(1, b"END");
    assert_eq!(process(&mut sw, 2, to_client.clone(), t).0, Fate::Out(0));
    // Silent for longer than the age (and not yet forgotten): the host moved.
    let moved = t + Duration::from_secs(61);
    assert!(matches!(
        process(&mut sw, 3, stolen, moved).0,
        Fate::Out(1 | 2)
    ));
    assert_eq!(drops(&stats, Drop::SourceMacMoved), 1);
    assert_eq!(process(&mut sw, 2, to_client, moved).0, Fate::Out(3));
}

#[test]
fn without_the_source_check_stations_move_as_in_a_learning_switch() {
    let (mut sw, _, stats) = rig_with(|spec| spec.source_check = None);
    process(&mut sw, 0, get_from(CLIENT_MAC, CLIENT_IP, "a"), NOW);
    assert!(matches!(
        process(&mut sw, 3, get_from(CLIENT_MAC, OTHER_IP, "a"), NOW).0,
        Fate::Out(1 | 2)
    ));
    assert_eq!(drops(&stats, Drop::SourceMacMoved), 0);
}

#[test]
fn a_configured_servers_mac_is_bound_to_its_configured_port_from_the_start() {
    let servers = vec![spec::Server {
        addr: SocketAddrV4::new(server_ip(0), 11211),
        mac: Some(server_mac(0)),
    }];
    let mut spec = SwitchSpec::new(4, VIP, servers);
    spec.source_check = Some(spec::SourceCheck {
        age: Duration::from_secs(60),
        table_size: 64,
        prefixes: vec![
            vec![],
            vec![format!("{}/32", server_ip(0)).parse().unwrap()],
        ],
    });
    let pool = Arc::new(Pool::new(spec.pool_spec(Distribution::Ketama, HashFn::Md5)).unwrap());
    let stats = Arc::new(Stats::new(4, 1));
    let mut sw = Switch::new(spec, pool, stats.clone()).unwrap();
    // Before the server ever spoke, a client claims its MAC: refused.
    let f = frame(server_mac(0), CLIENT_IP, 40000, OTHER_IP, 9, b"x");
    assert_eq!(process(&mut sw, 0, f, NOW).0, Fate::Consumed);
    assert_eq!(drops(&stats, Drop::SourceMacBound), 1);
    // The server itself is heard on its port, and requests go there.
    let f = frame(server_mac(0), server_ip(0), 11211, OTHER_IP, 9, b"x");
    process(&mut sw, 1, f, NOW);
    assert_eq!(drops(&stats, Drop::SourceMacBound), 1);
    assert_eq!(
        process(&mut sw, 0, get_from(CLIENT_MAC, CLIENT_IP, "a"), NOW).0,
        Fate::Out(1)
    );
}

#[test]
fn requests_from_outside_the_clients_networks_are_dropped() {
    let (mut sw, _, stats) = rig();
    let off_net = get_from(CLIENT_MAC, Ipv4Addr::new(192, 0, 2, 77), "a");
    assert_eq!(process(&mut sw, 0, off_net.clone(), NOW).0, Fate::Consumed);
    assert_eq!(drops(&stats, Drop::SourceOffNet), 1);
    // A network the operator names is accepted.
    let (mut sw, _, stats) = rig_with(|spec| {
        spec.client_networks = vec![
            "10.0.0.0/24".parse().unwrap(),
            "192.0.2.0/24".parse().unwrap(),
        ]
    });
    assert!(matches!(
        process(&mut sw, 0, off_net, NOW).0,
        Fate::Out(1 | 2)
    ));
    assert_eq!(drops(&stats, Drop::SourceOffNet), 0);
}

#[test]
fn a_removed_server_can_no_longer_send_in_the_vips_name() {
    let (mut sw, pool, _) = rig();
    let reply = || reply(0, b"VALUE");
    // Learn the client; the server's replies leave as the VIP.
    process(&mut sw, 0, get_from(CLIENT_MAC, CLIENT_IP, "a"), NOW);
    let (fate, out) = process(&mut sw, 1, reply(), NOW);
    assert_eq!(fate, Fate::Out(0));
    assert_eq!(out[26..30], VIP.octets());
    pool.remove_server(0).unwrap();
    let (fate, out) = process(&mut sw, 1, reply(), NOW);
    assert_eq!(fate, Fate::Out(0));
    assert_eq!(
        out[26..30],
        server_ip(0).octets(),
        "no longer re-sourced as the VIP"
    );
    // Its MAC is no longer bound: it is an ordinary station now. Added back, it is a server
    // again.
    let spec = pool.spec().servers[0].clone();
    pool.add_server(spec).unwrap();
    let (_, out) = process(&mut sw, 1, reply(), NOW);
    assert_eq!(out[26..30], VIP.octets());
}
