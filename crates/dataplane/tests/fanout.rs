//! Where frames go, through the real switch and the real driver on in-memory ports: no
//! namespace, no root, no clock. Three ports with hosts behind them and a local port (3); the
//! test holds the far end of every port.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;

use dataplane::Driver;
use kv::{Distribution, HashFn, Instant};
use kvio::{mem_pair, Batch, MemPort, Port};
use switch::frame::{arp_frame, udp_frame, UdpEnds};
use switch::pool::Pool;
use switch::spec::{Local, Server};
use switch::stats::{get, Drop, Stats};
use switch::{Switch, SwitchSpec};
use wire::arp;
use wire::ethernet::Mac;

const PORTS: usize = 4;
const LOCAL: usize = 3;
const VIP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 100);
const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 11);
const SERVER_MAC: Mac = Mac([2, 0, 0, 0, 1, 11]);

fn mac(n: u8) -> Mac {
    Mac([2, 0, 0, 0, 0, n])
}

fn ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, n)
}

struct Rig {
    driver: Driver<Switch>,
    /// The far end of each port.
    far: Vec<MemPort>,
    stats: Arc<Stats>,
    now: Instant,
}

fn rig() -> Rig {
    let mut spec = SwitchSpec::new(
        PORTS,
        VIP,
        vec![Server {
            addr: SocketAddrV4::new(SERVER_IP, 11211),
            mac: Some(SERVER_MAC),
        }],
    );
    spec.local = Some(Local {
        port: LOCAL as u16,
        addrs: vec![VIP],
        source: VIP,
    });
    let pool = Arc::new(Pool::new(spec.pool_spec(Distribution::Ketama, HashFn::Md5)).unwrap());
    let stats = Arc::new(Stats::new(PORTS, 1));
    let switch = Switch::new(spec, pool, stats.clone()).unwrap();
    let mut ports: Vec<Box<dyn Port>> = Vec::new();
    let mut far = Vec::new();
    for _ in 0..PORTS {
        let (near, other) = mem_pair().unwrap();
        ports.push(Box::new(near));
        far.push(other);
    }
    Rig {
        driver: Driver::new(ports, switch, Some(LOCAL), stats.clone()),
        far,
        stats,
        now: Instant::from_secs(10),
    }
}

impl Rig {
    /// Sends `frame` into port `port` and lets the driver take it.
    fn send(&mut self, port: usize, frame: &[u8]) {
        self.far[port].send(&[frame]).unwrap();
        assert_eq!(self.driver.drain(port, self.now), 1);
    }

    /// What came out of each port since the last call.
    fn out(&mut self) -> Vec<Vec<Vec<u8>>> {
        self.far
            .iter_mut()
            .map(|p| {
                let mut batch = Batch::new(64);
                p.recv(&mut batch).unwrap();
                batch.iter().map(<[u8]>::to_vec).collect()
            })
            .collect()
    }

    /// The ports that sent something, and nothing else left anywhere.
    fn out_ports(&mut self) -> Vec<usize> {
        self.out()
            .iter()
            .enumerate()
            .filter(|(_, f)| !f.is_empty())
            .map(|(p, f)| {
                assert_eq!(f.len(), 1, "port {p} sent {} frames", f.len());
                p
            })
            .collect()
    }
}

/// A UDP datagram between two stations (not for the VIP): plain switching.
fn between(src: u8, dst: u8) -> Vec<u8> {
    udp_frame(
        &UdpEnds {
            src_mac: mac(src),
            dst_mac: mac(dst),
            src_ip: ip(src),
            dst_ip: ip(dst),
            src_port: 5000,
            dst_port: 6000,
        },
        &[b"hello"],
    )
}

#[test]
fn unknown_destinations_flood_to_every_port_but_the_in_port_and_the_local_port() {
    let mut rig = rig();
    rig.send(0, &between(1, 9));
    assert_eq!(rig.out_ports(), vec![1, 2]);
    rig.send(2, &between(3, 9));
    assert_eq!(rig.out_ports(), vec![0, 1]);
    assert_eq!(get(&rig.stats.flooded), 2);
}

#[test]
fn a_learned_destination_gets_the_frame_alone_and_never_on_its_own_port() {
    let mut rig = rig();
    rig.send(1, &between(2, 9)); // station 2 learned on port 1
    rig.out();
    rig.send(0, &between(1, 2));
    assert_eq!(rig.out_ports(), vec![1]);
    // Station 1 is on port 0 now: a frame to it from port 0 goes nowhere.
    rig.send(0, &between(5, 1));
    assert_eq!(rig.out_ports(), Vec::<usize>::new());
    assert_eq!(get(&rig.stats.drops[Drop::SamePort as usize]), 1);
    // Counted per port: two frames in on port 0 and one on port 1; the flood out of ports 0
    // and 2, the switched frame out of port 1.
    assert_eq!(get(&rig.stats.ports[0].rx_packets), 2);
    assert_eq!(get(&rig.stats.ports[1].rx_packets), 1);
    assert_eq!(get(&rig.stats.ports[0].tx_packets), 1);
    assert_eq!(get(&rig.stats.ports[1].tx_packets), 1);
    assert_eq!(get(&rig.stats.ports[2].tx_packets), 1);
    assert_eq!(get(&rig.stats.ports[LOCAL].tx_packets), 0);
}

#[test]
fn a_request_routed_to_a_server_behind_the_clients_port_goes_back_out_of_it() {
    let mut rig = rig();
    // The server speaks first from port 0, where the client also is.
    rig.send(
        0,
        &udp_frame(
            &UdpEnds {
                src_mac: SERVER_MAC,
                dst_mac: mac(9),
                src_ip: SERVER_IP,
                dst_ip: ip(9),
                src_port: 7000,
                dst_port: 7000,
            },
            &[b"hi"],
        ),
    );
    rig.out();
    let get = udp_frame(
        &UdpEnds {
            src_mac: mac(1),
            dst_mac: Mac([2, 0, 0, 0, 0, 0x64]),
            src_ip: ip(1),
            dst_ip: VIP,
            src_port: 4000,
            dst_port: 11211,
        },
        &[b"\0\x01\0\0\0\x01\0\0get k\r\n"],
    );
    rig.send(0, &get);
    let out = rig.out();
    assert!(out[1].is_empty() && out[2].is_empty() && out[LOCAL].is_empty());
    assert_eq!(out[0].len(), 1, "back out of the port it came in on");
    assert_eq!(&out[0][0][0..6], &SERVER_MAC.0, "to the server");
    assert_eq!(&out[0][0][30..34], &SERVER_IP.octets());
    assert_eq!(switch::stats::get(&rig.stats.backends[0].requests), 1);
}

#[test]
fn arp_for_the_vip_is_answered_out_of_the_asking_port_only() {
    let mut rig = rig();
    let ask = arp_frame(
        Mac::BROADCAST,
        &arp::Repr {
            operation: arp::Operation::Request,
            sender_mac: mac(2),
            sender_ip: ip(2),
            target_mac: Mac([0; 6]),
            target_ip: VIP,
        },
    );
    rig.send(1, &ask);
    let out = rig.out();
    assert!(out[0].is_empty() && out[2].is_empty() && out[LOCAL].is_empty());
    assert_eq!(out[1].len(), 1);
    let answer = arp::Repr::parse(&arp::Packet::new_checked(&out[1][0][14..]).unwrap()).unwrap();
    assert_eq!(answer.operation, arp::Operation::Reply);
    assert_eq!(answer.sender_ip, VIP);
    assert_eq!(answer.target_mac, mac(2));
}

#[test]
fn the_first_tick_asks_for_the_server_out_of_every_port_but_the_local_port() {
    let mut rig = rig();
    // Before the first tick, the switch wants time at once.
    assert!(rig.driver.tick_if_due(rig.now));
    let out = rig.out();
    assert!(out[LOCAL].is_empty(), "floods never reach the local port");
    for (p, frames) in out.iter().enumerate().take(LOCAL) {
        assert_eq!(frames.len(), 1, "port {p}");
        let asked = arp::Repr::parse(&arp::Packet::new_checked(&frames[0][14..]).unwrap()).unwrap();
        assert_eq!(asked.target_ip, SERVER_IP);
    }
    // Not due again until the next ARP round, a second later.
    assert!(!rig.driver.tick_if_due(rig.now));
    let later = rig.now + std::time::Duration::from_millis(999);
    assert!(!rig.driver.tick_if_due(later));
    assert!(
        rig.driver
            .sleep_for(later, std::time::Duration::from_secs(5))
            <= std::time::Duration::from_millis(1)
    );
    assert!(rig
        .driver
        .tick_if_due(rig.now + std::time::Duration::from_secs(1)));
    assert_eq!(rig.out().iter().map(Vec::len).sum::<usize>(), 3);
}

#[test]
fn frames_for_the_vip_from_the_host_reach_a_station_and_floods_from_the_host_skip_it() {
    let mut rig = rig();
    rig.send(2, &between(7, 9)); // station 7 on port 2
    rig.out();
    // The host's end of the local port floods (its ARP, say): every port but itself.
    rig.send(LOCAL, &between(0x64, 9));
    assert_eq!(rig.out_ports(), vec![0, 1, 2]);
    rig.send(LOCAL, &between(0x64, 7));
    assert_eq!(rig.out_ports(), vec![2]);
}
