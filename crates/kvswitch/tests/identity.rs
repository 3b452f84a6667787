//! Nobody speaks for another: an attacker host on the default testbed (XDP fast path in front
//! of the switch, the cache on) runs every identity trick in a loop while an honest client runs
//! history-checked traffic through the VIP. No honest request may reach the attacker, and no
//! reader may see a value nobody wrote or an older one than an acknowledged write.

mod common;

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use api::Client as Api;
use common::*;
use switch::frame::{arp_frame, udp_frame, UdpEnds};
use testbed::history_load::{self, Clock, Load, Mix, Transport};
use wire::arp;
use wire::ethernet::Mac;

/// How long the attacker and the honest client run side by side.
const RUN: Duration = Duration::from_secs(6);
/// How long a UDP request waits for its reply.
const T: Duration = Duration::from_secs(2);

/// Every frame of the attack, as the attacker host writes them whole.
fn attack_frames(live: &testbed::Live, keys: &[String], round: u16) -> Vec<Vec<u8>> {
    let vip = vip(live);
    let SocketAddr::V4(vip) = vip else {
        unreachable!()
    };
    let vip_mac: Mac = live.state.vip_mac.parse().expect("the VIP's MAC");
    let (me, me_ip) = (mac_of(live, "c2"), ip_of(live, "c2"));
    let (victim, victim_ip) = (mac_of(live, "c1"), ip_of(live, "c1"));
    let key = &keys[usize::from(round) % keys.len()];
    let evil = datagram(round, &format!("VALUE {key} 0 4\r\nEVIL\r\nEND\r\n"));
    let get = datagram(round, &format!("get {key}\r\n"));
    let mut frames = Vec::new();
    for s in ["s1", "s2", "s3"] {
        let (server, server_ip) = (mac_of(live, s), ip_of(live, s));
        let ends = |src_mac, src_ip, src_port, dst_mac, dst_ip, dst_port| UdpEnds {
            src_mac,
            dst_mac,
            src_ip,
            dst_ip,
            src_port,
            dst_port,
        };
        // The server's MAC with the attacker's own address: to take the server's port.
        frames.push(udp_frame(
            &ends(server, me_ip, 40_000, vip_mac, *vip.ip(), vip.port()),
            &[&get],
        ));
        // The server's MAC on a frame that is not IPv4.
        let mut other = udp_frame(
            &ends(server, me_ip, 40_000, Mac::BROADCAST, *vip.ip(), 9),
            &[b"x"],
        );
        other[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
        frames.push(other);
        // ARP: the server's address is the attacker's.
        let claim = arp::Repr {
            operation: arp::Operation::Reply,
            sender_mac: me,
            sender_ip: server_ip,
            target_mac: Mac::BROADCAST,
            target_ip: server_ip,
        };
        frames.push(arp_frame(Mac::BROADCAST, &claim));
        // A reply in the server's name, with its MAC and without, to the honest client: sent
        // as the VIP, it would be believed.
        for src in [server, me] {
            for port in [40_000 + round % 64, 11211] {
                frames.push(udp_frame(
                    &ends(src, server_ip, 11211, victim, victim_ip, port),
                    &[&evil],
                ));
            }
        }
    }
    // A request in the honest client's name (its answer would go to it), and from off-net.
    frames.push(udp_frame(
        &UdpEnds {
            src_mac: me,
            dst_mac: vip_mac,
            src_ip: victim_ip,
            dst_ip: *vip.ip(),
            src_port: 40_000,
            dst_port: vip.port(),
        },
        &[&get],
    ));
    frames.push(udp_frame(
        &UdpEnds {
            src_mac: me,
            dst_mac: vip_mac,
            src_ip: Ipv4Addr::new(192, 0, 2, 77),
            dst_ip: *vip.ip(),
            src_port: 40_000,
            dst_port: vip.port(),
        },
        &[&get],
    ));
    frames
}

#[test]
fn an_attacker_host_speaks_for_nobody_while_honest_clients_run() {
    let live = testbed_with("kid", "l3", false, |o| {
        o.datapath = Some("xdp".into());
        o.extra_config = Some(
            "[cache]\nitems = 8\nlease_ms = 300\nrule_rate = 50\nrule_delay_ms = 200\n\
             segment_ms = 200\n"
                .into(),
        );
    });
    let keys: Vec<String> = (0..12).map(|i| format!("id:{i}")).collect();
    let servers: Vec<(Ipv4Addr, Mac)> = ["s1", "s2", "s3"]
        .iter()
        .map(|s| (ip_of(&live, s), mac_of(&live, s)))
        .collect();
    let victim_ip = ip_of(&live, "c1");
    let attacker_ip = ip_of(&live, "c2");
    let before: Vec<u64> = ["source_mac_bound", "source_spoofed", "source_off_net"]
        .iter()
        .map(|r| drops(&live, r))
        .collect();
    // The honest client is on the network before the attack starts, as a client in use is: an
    // address nobody has used yet goes to the first port it is heard on (unless
    // `source_prefixes` binds it), and the attacker claims c1's from its first round.
    // (A datagram may be lost on a loaded machine: a few tries.)
    assert!(
        (0..3).any(|_| udp_call(&live, "c1", vip(&live), b"get id:0\r\n", T).is_some()),
        "c1 reaches the VIP before the attack"
    );
    let clients = history_clients(&live, &["c1"], &[Transport::Udp, Transport::Tcp], T);
    let load = Load {
        keys: keys.clone(),
        ops_per_client: 20_000,
        duration: RUN,
        mix: Mix::default(),
        seed: 34,
    };
    let stop = AtomicBool::new(false);
    let diverted = AtomicU64::new(0);
    let sent = AtomicU64::new(0);
    let recorded = std::thread::scope(|scope| {
        scope.spawn(|| {
            live.in_host("c2", || {
                sniff_diverted(attacker_ip, &servers, victim_ip, &stop, &diverted)
            })
            .expect("c2")
        });
        scope.spawn(|| {
            live.in_host("c2", || {
                let sender = kvio::FrameSender::on_address(attacker_ip).expect("a frame sender");
                let started = Instant::now();
                let mut round = 0u16;
                while started.elapsed() < RUN && !stop.load(Ordering::Relaxed) {
                    for f in attack_frames(&live, &keys, round) {
                        if sender.send(&f).is_ok() {
                            sent.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    round = round.wrapping_add(1);
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
            .expect("c2")
        });
        let recorded = history_load::run(&clients, &load, Clock::start()).expect("load");
        // The sniffer reads on past the load for frames still on their way.
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::Relaxed);
        recorded
    });
    let after: Vec<u64> = ["source_mac_bound", "source_spoofed", "source_off_net"]
        .iter()
        .map(|r| drops(&live, r))
        .collect();
    println!(
        "attack: {} frames sent; dropped as source_mac_bound {}, source_spoofed {}, \
         source_off_net {}; honest requests seen by the attacker: {}",
        sent.load(Ordering::Relaxed),
        after[0] - before[0],
        after[1] - before[1],
        after[2] - before[2],
        diverted.load(Ordering::Relaxed)
    );
    recorded_ok(&recorded);
    no_stale_read(&recorded.ops);
    assert!(recorded.ops.len() > 500, "too little honest traffic");
    assert_eq!(
        diverted.load(Ordering::Relaxed),
        0,
        "honest requests reached the attacker"
    );
    for (i, reason) in ["source_mac_bound", "source_spoofed", "source_off_net"]
        .iter()
        .enumerate()
    {
        assert!(after[i] > before[i], "no frame was dropped as {reason}");
    }
    // Every server still answers UDP, and the VIP still routes to each.
    for s in ["s1", "s2", "s3"] {
        let server = SocketAddr::new(ip_of(&live, s).into(), 11211);
        assert!(
            udp_call(&live, "c1", server, b"version\r\n", T).is_some(),
            "{s} stopped answering UDP"
        );
    }
    for key in &keys {
        let set = format!("set {key} 0 0 4\r\ngood\r\n");
        let r = udp_call(&live, "c1", vip(&live), set.as_bytes(), T).expect("set");
        assert_eq!(r.body, b"STORED\r\n");
        let r = udp_call(
            &live,
            "c1",
            vip(&live),
            format!("get {key}\r\n").as_bytes(),
            T,
        )
        .expect("get");
        assert_eq!(
            r.body,
            format!("VALUE {key} 0 4\r\ngood\r\nEND\r\n").as_bytes()
        );
    }
    // A server taken out of the pool speaks in its own name again: its UDP from the memcached
    // port is no longer sent on as the VIP's, in the kernel or by the switch.
    let api = Api::new(live.api(), None);
    api.call("DELETE", "/api/v1/pool/servers/s3", None)
        .expect("remove s3");
    let listener = live
        .in_host("c1", || {
            UdpSocket::bind(SocketAddr::new(victim_ip.into(), 40_777)).expect("bind")
        })
        .expect("c1");
    listener
        .set_read_timeout(Some(Duration::from_millis(500)))
        .expect("timeout");
    let (s3, s3_mac) = (ip_of(&live, "s3"), mac_of(&live, "s3"));
    let victim_mac = mac_of(&live, "c1");
    let mut from_vip = 0;
    for round in 0..20u16 {
        let forged = udp_frame(
            &UdpEnds {
                src_mac: s3_mac,
                dst_mac: victim_mac,
                src_ip: s3,
                dst_ip: victim_ip,
                src_port: 11211,
                dst_port: 40_777,
            },
            &[&datagram(round, "VALUE id:0 0 4\r\nEVIL\r\nEND\r\n")],
        );
        live.in_host("s3", || {
            let sender = kvio::FrameSender::on_address(s3).expect("a frame sender");
            sender.send(&forged).expect("send");
        })
        .expect("s3");
        let mut buf = [0u8; 256];
        if let Ok((_, from)) = listener.recv_from(&mut buf) {
            if from.ip() == vip(&live).ip() {
                from_vip += 1;
            }
        }
    }
    assert_eq!(
        from_vip, 0,
        "a removed server's datagrams arrived as the VIP's"
    );
    // A second switch on the same ports is refused at start, and the first goes on.
    let second = std::process::Command::new(env!("CARGO_BIN_EXE_kvswitch"))
        .args(["run", "--config"])
        .arg(&live.state.config_path)
        .output()
        .expect("run a second kvswitch");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        !second.status.success(),
        "a second switch started: {stderr}"
    );
    assert!(stderr.contains("owned by another switch"), "{stderr}");
    let r = udp_call(
        &live,
        "c1",
        vip(&live),
        format!("get {}\r\n", keys[0]).as_bytes(),
        T,
    );
    assert!(r.is_some(), "the first switch stopped answering");
    live.down().expect("down");
}
