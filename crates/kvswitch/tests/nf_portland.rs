//! PortLand on ten kvswitches (a fat-tree of two pods: two edge and two aggregation switches
//! each, two cores), set up through their control APIs by the fabric manager
//! (`nf::portland`): hosts in different pods reach each other by pseudo MAC, ARP is
//! answered by the manager with the target's PMAC, frames reach each host addressed to its real
//! MAC, and a host that moves to another edge gets a new PMAC that the others learn. Everything
//! the manager made is gone when it stops.

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nf::cpu::CpuMode;
use nf::portland::{self, Layout, PortTo, Role, SwitchDef};
use serde_json::Value;
use testbed::net::{Net, NetSpec, Peer};
use wire::ethernet::Mac;

const PREFIX: &str = "kvpl";

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(uid, 0, "the network of switches needs root");
}

fn role(name: &str) -> Role {
    let digit = |i: usize| name.as_bytes()[i] - b'0';
    match name.as_bytes()[0] {
        b'e' => Role::Edge {
            pod: u16::from(digit(1)),
            position: digit(2),
        },
        b'a' => Role::Aggregation {
            pod: u16::from(digit(1)),
            position: digit(2),
        },
        _ => Role::Core,
    }
}

fn layout(net: &Net) -> Layout {
    Layout {
        switches: net
            .switches
            .iter()
            .enumerate()
            .map(|(i, s)| SwitchDef {
                name: s.name.clone(),
                api: s.api,
                role: role(&s.name),
                mac: format!("02:fe:00:00:{i:02x}:64"),
                ports: s
                    .ports
                    .iter()
                    .map(|p| match p.peer {
                        Peer::Host(_) => PortTo::Host,
                        Peer::Switch { switch, .. } => {
                            PortTo::Switch(net.switches[switch].name.clone())
                        }
                        Peer::Bridge(_) => unreachable!("the fat-tree has no bridges"),
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// Whether `from` gets an answer to a ping of `to` within a few seconds (the first ARP for a
/// host the manager has not seen yet goes unanswered; the kernel asks again).
fn reaches(net: &Net, from: &str, to: std::net::Ipv4Addr) -> bool {
    let deadline = Instant::now() + Duration::from_secs(8);
    while Instant::now() < deadline {
        let ok = Command::new("ip")
            .args([
                "netns",
                "exec",
                &net.host(from).netns,
                "ping",
                "-c",
                "1",
                "-W",
                "1",
            ])
            .arg(to.to_string())
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if ok {
            return true;
        }
    }
    false
}

/// The MAC `host` has for `ip` in its neighbour table.
fn neighbour(net: &Net, host: &str, ip: std::net::Ipv4Addr) -> Option<Mac> {
    let out = Command::new("ip")
        .args([
            "-n",
            &net.host(host).netns,
            "neigh",
            "show",
            &ip.to_string(),
        ])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut words = text.split_whitespace();
    words.find(|w| *w == "lladdr")?;
    words.next()?.parse().ok()
}

fn ip_in(net: &Net, host: &str, args: &[&str]) {
    let status = Command::new("ip")
        .args(["-n", &net.host(host).netns])
        .args(args)
        .status()
        .unwrap();
    assert!(status.success(), "ip -n {host} {args:?}");
}

#[test]
fn hosts_reach_each_other_by_pseudo_mac_and_a_moved_host_gets_a_new_one() {
    require_root();
    let names = [
        "e00", "e01", "e10", "e11", "a00", "a01", "a10", "a11", "c0", "c1",
    ];
    let mut links = Vec::new();
    for pod in 0..2 {
        for e in 0..2 {
            for a in 0..2 {
                links.push((format!("e{pod}{e}"), format!("a{pod}{a}")));
            }
        }
        for a in 0..2 {
            links.push((format!("a{pod}{a}"), format!("c{a}")));
        }
    }
    let hosts = [
        ("h0", "e00"),
        ("h1", "e01"),
        ("h2", "e10"),
        ("h3", "e11"),
        ("m", "e11"),
    ];
    let net = Net::up(&NetSpec {
        prefix: PREFIX.into(),
        switches: names.map(String::from).to_vec(),
        hosts: hosts
            .iter()
            .map(|(h, s)| (h.to_string(), s.to_string()))
            .collect(),
        bridges: Vec::new(),
        links,
        bin: env!("CARGO_BIN_EXE_kvswitch").into(),
        static_neighbours: false,
    })
    .unwrap();
    // The spare host stays down until h0 moves there.
    ip_in(&net, "m", &["link", "set", "dev", "eth0", "down"]);
    let before: Vec<Value> = names.iter().map(|s| net.programmed(s).unwrap()).collect();

    let stop = AtomicBool::new(false);
    let lay = layout(&net);
    /// Stops the manager however the scope ends, so a failed assertion cannot hang it.
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    std::thread::scope(|scope| {
        // Over each switch's CPU channel: an error if one cannot be opened.
        let manager = scope.spawn(|| {
            let reach = api::Client::new(lay.switches[0].api, None);
            portland::run(lay, &reach, CpuMode::Channel, &|| {
                stop.load(Ordering::Relaxed)
            })
        });
        let _stop = StopOnDrop(&stop);
        let deadline = Instant::now() + Duration::from_secs(20);
        while names
            .iter()
            .any(|s| net.api(s, "GET", "/api/v1/tables/pmac", None).is_err())
        {
            assert!(
                Instant::now() < deadline,
                "the manager never set the switches up"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(300));
        let ip = |h: &str| net.host(h).ip;
        let port = |h: &str| net.host(h).port as u8;
        // Across pods and within one, both ways.
        for (a, b) in [
            ("h0", "h3"),
            ("h1", "h2"),
            ("h2", "h0"),
            ("h3", "h1"),
            ("h0", "h1"),
        ] {
            assert!(reaches(&net, a, ip(b)), "{a} cannot reach {b}");
        }
        // Each host knows the others by PMAC: pod, position, port, vm id.
        assert_eq!(
            neighbour(&net, "h0", ip("h3")),
            Some(portland::pmac(1, 1, port("h3"), 0))
        );
        assert_eq!(
            neighbour(&net, "h3", ip("h0")),
            Some(portland::pmac(0, 0, port("h0"), 0))
        );
        assert_eq!(
            neighbour(&net, "h2", ip("h1")),
            Some(portland::pmac(0, 1, port("h1"), 0))
        );

        // h0 moves to the spare port of e11 (pod 1), keeping its address and MAC.
        std::thread::sleep(Duration::from_millis(1_100));
        let (h0_mac, h0_cidr) = (net.host("h0").mac.clone(), format!("{}/24", ip("h0")));
        ip_in(&net, "h0", &["link", "set", "dev", "eth0", "down"]);
        ip_in(&net, "m", &["addr", "flush", "dev", "eth0"]);
        ip_in(
            &net,
            "m",
            &["link", "set", "dev", "eth0", "address", &h0_mac],
        );
        ip_in(&net, "m", &["addr", "add", &h0_cidr, "dev", "eth0"]);
        ip_in(&net, "m", &["link", "set", "dev", "eth0", "up"]);
        assert!(
            reaches(&net, "m", ip("h1")),
            "the moved host cannot reach h1"
        );
        let moved = portland::pmac(1, 1, port("m"), 0);
        // Told by the manager, the others now hold the new PMAC, and reach h0 at its new place.
        let deadline = Instant::now() + Duration::from_secs(5);
        while neighbour(&net, "h3", ip("h0")) != Some(moved) {
            assert!(
                Instant::now() < deadline,
                "h3 holds {:?} for h0, not {moved}",
                neighbour(&net, "h3", ip("h0"))
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            reaches(&net, "h1", ip("h0")),
            "h1 cannot reach h0 after the move"
        );
        assert_eq!(neighbour(&net, "h1", ip("h0")), Some(moved));

        stop.store(true, Ordering::Relaxed);
        let stats = manager.join().unwrap().unwrap();
        assert_eq!((stats.hosts, stats.moves), (4, 1), "{stats:?}");
    });
    // The manager's tables and entries are gone; the memcached program is as it was.
    for (s, before) in names.iter().zip(&before) {
        assert_eq!(&net.programmed(s).unwrap(), before, "{s}");
    }
    net.down().unwrap();
}
