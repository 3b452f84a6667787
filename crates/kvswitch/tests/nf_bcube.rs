//! BCube1 of n=4 on kvswitches (ServerSwitch 5.1): 16 servers, each a host namespace behind
//! its own kvswitch (the server's card: port 0 to the host, 1 to its level-0 switch, 2 to its
//! level-1 switch), and 8 Linux bridges as the BCube switches. Each card is set up by its
//! agent (`nf::bcube::run_card`) through its control API alone; each host runs the
//! host side (`run_host`) on a TUN device. Packets follow, hop by hop, the path their header
//! encodes (the route entries' counters on every card), a TCP transfer spreads over both
//! parallel paths, bandwidth queries move traffic off a slow path, and the agents leave every
//! switch as they found it.

use std::io::{Read, Write};
use std::net::{SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use api::Client;
use nf::bcube::{self, Card, Geometry, HostConfig};
use nf::cpu::CpuMode;
use serde_json::Value;
use testbed::net::{Net, NetSpec};
use wire::ethernet::Mac;

const PREFIX: &str = "kvbc";
const N: u8 = 4;
const SERVERS: usize = 16;
const DATAGRAMS: u64 = 200;

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(uid, 0, "the BCube network needs root");
}

fn card(id: usize) -> String {
    format!("c{id}")
}

/// Every card's `count` counters (route entries count per NHA, `bcube_local` what reached
/// the host), by card and name.
fn counted(net: &Net) -> std::collections::BTreeMap<(usize, String), u64> {
    let mut out = std::collections::BTreeMap::new();
    for id in 0..SERVERS {
        let counters = net.api(&card(id), "GET", "/api/v1/counters", None).unwrap();
        for c in counters["counters"].as_array().unwrap() {
            let name = c["name"].as_str().unwrap().to_string();
            out.insert((id, name), c["packets"].as_u64().unwrap());
        }
    }
    out
}

fn get(counts: &std::collections::BTreeMap<(usize, String), u64>, id: usize, name: &str) -> u64 {
    counts.get(&(id, name.to_string())).copied().unwrap_or(0)
}

/// Datagrams from server `from` to server `to`; returns how many arrived intact.
fn udp(net: &Net, from: usize, to: usize, count: u64) -> u64 {
    let (a, b) = (
        net.host(&format!("h{from}")).clone(),
        net.host(&format!("h{to}")).clone(),
    );
    let dest = SocketAddrV4::new(b.ip, 9300);
    let (bound_tx, bound_rx) = std::sync::mpsc::channel();
    let receiver = std::thread::spawn(move || {
        testbed::in_netns(&b.netns, || {
            let sock = UdpSocket::bind(("0.0.0.0", 9300)).unwrap();
            sock.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            bound_tx.send(()).unwrap();
            let mut got = 0;
            let mut buf = [0u8; 2048];
            while let Ok(n) = sock.recv(&mut buf) {
                assert_eq!(&buf[..n], &b"through the BCube"[..]);
                got += 1;
                if got == count {
                    break;
                }
            }
            got
        })
        .unwrap()
    });
    bound_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    testbed::in_netns(&a.netns, || {
        let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
        for _ in 0..count {
            sock.send_to(b"through the BCube", dest).unwrap();
            std::thread::sleep(Duration::from_millis(2));
        }
    })
    .unwrap();
    receiver.join().unwrap()
}

/// Sends `len` bytes over TCP from server `from` to server `to`; returns what arrived.
fn tcp(net: &Net, from: usize, to: usize, len: usize) -> Vec<u8> {
    let (a, b) = (
        net.host(&format!("h{from}")).clone(),
        net.host(&format!("h{to}")).clone(),
    );
    let (bound_tx, bound_rx) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        testbed::in_netns(&b.netns, || {
            let listener = TcpListener::bind((b.ip, 9301)).unwrap();
            bound_tx.send(()).unwrap();
            let (mut conn, _) = listener.accept().unwrap();
            conn.set_read_timeout(Some(Duration::from_secs(20)))
                .unwrap();
            let mut got = Vec::new();
            conn.read_to_end(&mut got).unwrap();
            got
        })
        .unwrap()
    });
    bound_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let dest = SocketAddrV4::new(net.host(&format!("h{to}")).ip, 9301);
    testbed::in_netns(&a.netns, || {
        let mut conn = TcpStream::connect_timeout(&dest.into(), Duration::from_secs(5)).unwrap();
        conn.set_write_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
        conn.write_all(&data).unwrap();
    })
    .unwrap();
    server.join().unwrap()
}

#[test]
fn packets_follow_their_bcube_header_and_tcp_spreads_over_parallel_paths() {
    require_root();
    let g = Geometry::new(N, 2).unwrap();
    // Server i hangs off card ci; bridge l0-a is level-0 switch a (servers a*4 .. a*4+3),
    // l1-b is level-1 switch b (servers b, b+4, b+8, b+12).
    let bridges: Vec<String> = (0..N)
        .flat_map(|i| [format!("l0-{i}"), format!("l1-{i}")])
        .collect();
    let mut links = Vec::new();
    for id in 0..SERVERS {
        links.push((card(id), format!("l0-{}", id / 4)));
        links.push((card(id), format!("l1-{}", id % 4)));
    }
    let net = Net::up(&NetSpec {
        prefix: PREFIX.into(),
        switches: (0..SERVERS).map(card).collect(),
        hosts: (0..SERVERS)
            .map(|id| (format!("h{id}"), card(id)))
            .collect(),
        bridges,
        links,
        bin: env!("CARGO_BIN_EXE_kvswitch").into(),
        static_neighbours: false,
    })
    .unwrap();
    let first_ip = net.host("h0").ip;
    for id in 0..SERVERS {
        assert_eq!(net.host(&format!("h{id}")).ip, bcube::address(first_ip, id));
    }
    let before: Vec<Value> = (0..SERVERS)
        .map(|id| net.programmed(&card(id)).unwrap())
        .collect();

    let stop = Arc::new(AtomicBool::new(false));
    let mut agents = Vec::new();
    for id in 0..SERVERS {
        let c = Card {
            geometry: g,
            id,
            first_ip,
            level_ports: vec![1, 2],
            host_port: 0,
            host_mac: net.host(&format!("h{id}")).mac.parse::<Mac>().unwrap(),
            link_mbps: 1000.0,
            interface_base: 64,
            priority: 100,
        };
        let client = Client::new(net.switch(&card(id)).api, None);
        let stop = stop.clone();
        agents.push(std::thread::spawn(move || {
            // Over the CPU channel of the card's switch: an error if it cannot be opened.
            bcube::run_card(&client, &c, CpuMode::Channel, &|| {
                stop.load(Ordering::Relaxed)
            })
        }));
    }
    let mut hosts = Vec::new();
    for id in 0..SERVERS {
        let cfg = HostConfig {
            geometry: g,
            id,
            first_ip,
            tun: "bc0".into(),
            dev: "eth0".into(),
            max_paths: 0,
            query_every: Duration::from_millis(500),
        };
        let (ns, stop) = (net.host(&format!("h{id}")).netns.clone(), stop.clone());
        hosts.push(std::thread::spawn(move || {
            testbed::in_netns(&ns, || {
                bcube::run_host(&cfg, &|| stop.load(Ordering::Relaxed))
            })
        }));
    }

    // Neighbour discovery fills every card's interface table: 3 neighbours per level.
    let started = Instant::now();
    loop {
        let filled = (0..SERVERS).all(|id| {
            let listed = net
                .api(&card(id), "GET", "/api/v1/interfaces", None)
                .unwrap();
            listed["interfaces"].as_array().map_or(0, Vec::len) == 2 * (N as usize - 1)
        });
        if filled {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "neighbour discovery did not fill the interface tables"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // The card's table is listed through the API: per level port a filter to the host and
    // one for announcements, one for queries, and per neighbour an entry per index.
    for id in 0..SERVERS {
        let table = net
            .api(&card(id), "GET", "/api/v1/tables/bcube", None)
            .unwrap();
        assert_eq!(table["kind"], "ternary");
        assert_eq!(
            table["entries"],
            2 * 2 + 1 + 6 * bcube::MAX_HOPS,
            "card {id}"
        );
    }

    // Server 0 (digits 00) to server 15 (33): two parallel paths, through 12 (30) first
    // correcting level 1, and through 3 (03) first correcting level 0.
    let paths = g.paths(0, 15);
    assert_eq!(
        paths,
        vec![
            vec![g.nha(1, 3), g.nha(0, 3)],
            vec![g.nha(0, 3), g.nha(1, 3)]
        ]
    );
    assert_eq!(g.walk(0, &paths[0]), Some(vec![12, 15]));
    assert_eq!(g.walk(0, &paths[1]), Some(vec![3, 15]));
    let got = udp(&net, 0, 15, DATAGRAMS);
    assert_eq!(got, DATAGRAMS, "datagrams lost on the way");
    let after_udp = counted(&net);
    let nha = |l: u8, d: u8| format!("bcube_nha{}", g.nha(l, d));
    let via12 = get(&after_udp, 0, &nha(1, 3));
    let via3 = get(&after_udp, 0, &nha(0, 3));
    // Hop by hop, each datagram went exactly where its header said: card 0 sent a share to
    // 12 and the rest to 3, 12 and 3 each sent all they got on to 15, which gave them all to
    // its host; no other card's route entries saw any of them.
    assert_eq!(via12 + via3, DATAGRAMS, "{after_udp:?}");
    assert!(via12 > 0 && via3 > 0, "one path only: {after_udp:?}");
    assert_eq!(get(&after_udp, 12, &nha(0, 3)), via12, "{after_udp:?}");
    assert_eq!(get(&after_udp, 3, &nha(1, 3)), via3, "{after_udp:?}");
    assert_eq!(
        get(&after_udp, 15, "bcube_local"),
        DATAGRAMS,
        "{after_udp:?}"
    );
    for ((id, name), n) in &after_udp {
        if ![0, 3, 12, 15].contains(id) {
            assert_eq!(*n, 0, "card {id} counted {name}");
        }
    }
    // The port counters agree: the relays took those datagrams in on one level and out on
    // the other.
    let ports = |id: usize| -> Vec<(u64, u64)> {
        let listed = net.api(&card(id), "GET", "/api/v1/ports", None).unwrap();
        listed["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["rx_packets"].as_u64().unwrap(),
                    p["tx_packets"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let (p12, p3) = (ports(12), ports(3));
    assert!(p12[2].0 >= via12 && p12[1].1 >= via12, "{p12:?}");
    assert!(p3[1].0 >= via3 && p3[2].1 >= via3, "{p3:?}");

    // A TCP transfer from 0 to 15 runs over both paths at once.
    let len = 2 << 20;
    let data = tcp(&net, 0, 15, len);
    assert_eq!(data.len(), len, "the transfer was cut short");
    assert!(
        data.iter()
            .enumerate()
            .all(|(i, &b)| b == (i * 7 + i / 251) as u8),
        "the transfer arrived changed"
    );
    let after_tcp = counted(&net);
    let d12 = get(&after_tcp, 12, &nha(0, 3)) - via12;
    let d3 = get(&after_tcp, 3, &nha(1, 3)) - via3;
    eprintln!("udp: {via12} via 12, {via3} via 3; tcp: {d12} via 12, {d3} via 3");
    let segments = len as u64 / 1448;
    assert!(
        d12 + d3 >= segments,
        "{d12} + {d3} segments for {len} bytes"
    );
    assert!(
        d12 >= (d12 + d3) / 5 && d3 >= (d12 + d3) / 5,
        "the paths carried {d12} and {d3} segments: not both in use"
    );

    // Bandwidth queries steer the spread: with card 3's level-1 port held to 20 Mb/s, the
    // path through 3 answers 2% of what the path through 12 does, and gets about as little.
    let egress = |rate_bps: u64| {
        let body = serde_json::json!({"rate_bps": rate_bps});
        net.api(&card(3), "PUT", "/api/v1/ports/2/egress", Some(&body))
            .unwrap();
    };
    egress(20_000_000);
    // The agent reads the port each second and the host asks every 500 ms.
    std::thread::sleep(Duration::from_millis(2500));
    let ahead = counted(&net);
    assert_eq!(udp(&net, 0, 15, DATAGRAMS), DATAGRAMS);
    let after = counted(&net);
    let slow = get(&after, 3, &nha(1, 3)) - get(&ahead, 3, &nha(1, 3));
    let fast = get(&after, 12, &nha(0, 3)) - get(&ahead, 12, &nha(0, 3));
    eprintln!("with port 2 of card 3 at 20 Mb/s: {fast} via 12, {slow} via 3");
    // (The TCP connection's last segments may still be counted here.)
    assert!(
        (DATAGRAMS..DATAGRAMS + 10).contains(&(slow + fast)),
        "{slow} + {fast}"
    );
    assert!(
        slow <= DATAGRAMS / 10,
        "{slow} of {DATAGRAMS} took the slow path"
    );
    egress(0);

    stop.store(true, Ordering::Relaxed);
    for (id, a) in agents.into_iter().enumerate() {
        let stats = a.join().unwrap().unwrap();
        assert_eq!(stats.neighbours, 2 * (N as u64 - 1), "card {id}: {stats:?}");
    }
    for (id, h) in hosts.into_iter().enumerate() {
        let stats = h.join().unwrap().unwrap().unwrap();
        if id == 0 {
            let sent = &stats.sent[&bcube::address(first_ip, 15).to_string()];
            assert_eq!(sent.len(), 2, "{stats:?}");
            assert!(
                stats.replies > 0,
                "no bandwidth query was answered: {stats:?}"
            );
        }
        assert_eq!(stats.malformed, 0, "host {id}: {stats:?}");
    }
    // Everything the agents made is gone; the memcached program is as it was.
    for (id, before) in before.iter().enumerate() {
        assert_eq!(&net.programmed(&card(id)).unwrap(), before, "card {id}");
    }
    net.down().unwrap();
}

/// `kvswitch nf bcube-card` and `bcube-host` refuse settings that cannot make a BCube, with a
/// message naming what is wrong, before touching a switch or the host.
#[test]
fn bad_bcube_settings_are_refused_clearly() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvswitch"))
            .args(["nf", "--api", "127.0.0.1:9"])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} was taken");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let card = |extra: &[&str]| {
        let mut a = vec![
            "bcube-card",
            "--first-ip",
            "10.9.0.1",
            "--host-port",
            "0",
            "--host-mac",
            "02:00:00:00:00:01",
        ];
        a.extend_from_slice(extra);
        run(&a)
    };
    let e = card(&["--id", "16", "--level-ports", "1,2"]);
    assert!(e.contains("--id 16: 0 to 15"), "{e}");
    let e = card(&["--id", "0", "--n", "1", "--level-ports", "1,2"]);
    assert!(e.contains("n 1: 2 to 16"), "{e}");
    let e = card(&["--id", "0", "--level-ports", "1"]);
    assert!(e.contains("1 level ports for 2 levels"), "{e}");
    let e = card(&["--id", "0", "--level-ports", "0,1"]);
    assert!(e.contains("must all differ"), "{e}");
    let e = card(&["--id", "0", "--level-ports", "1,2", "--link-mbps", "0"]);
    assert!(e.contains("link rate 0"), "{e}");
    let e = run(&[
        "bcube-host",
        "--id",
        "3",
        "--levels",
        "5",
        "--first-ip",
        "10.9.0.1",
    ]);
    assert!(e.contains("levels 5: 1 to 4"), "{e}");
    let e = run(&[
        "bcube-host",
        "--id",
        "0",
        "--first-ip",
        "10.9.0.1",
        "--tun",
        "a/b",
    ]);
    assert!(e.contains("not a valid interface name"), "{e}");
}
