//! MPLS tags on a network of four kvswitches (a diamond: s0 joined to s1 and s2, both joined to
//! s3), each programmed through its control API alone: the ingress switch pushes a stack of
//! labels, one per hop, and every switch pops its own and sends the frame where the label says.
//! Datagrams follow exactly the path their stack encodes (a counter on every label entry), reach
//! the other host as plain UDP, and the tables the function made are removed cleanly.

use std::net::{SocketAddrV4, UdpSocket};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use testbed::net::{Net, NetSpec};

const PREFIX: &str = "kvtg";
const PORT: u16 = 7300;
const SENT: u64 = 50;

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(uid, 0, "the network of switches needs root");
}

fn label(l: u32) -> Value {
    json!({"value": l << 12, "mask": "0xfffff000"})
}

/// Every switch: a `labels` table keyed on the top label; labelled frames go to it, and
/// nothing else that comes from another switch goes anywhere (the diamond has a loop).
fn program_labels(net: &Net, sw: &str, routes: &[(u32, u16)]) -> Vec<u64> {
    net.api(
        sw,
        "POST",
        "/api/v1/tables",
        Some(&json!({"name": "labels", "kind": "ternary", "key": ["mpls"], "miss": ["drop"]})),
    )
    .unwrap();
    let mut acl = Vec::new();
    let labelled = json!({"match": {"ethertype": "0x8847"}, "priority": 10,
                          "actions": [{"goto": "labels"}]});
    let made = net
        .api(sw, "POST", "/api/v1/tables/acl/entries", Some(&labelled))
        .unwrap();
    acl.push(made["id"].as_u64().unwrap());
    for (p, port) in net.switch(sw).ports.iter().enumerate() {
        if matches!(port.peer, testbed::net::Peer::Switch { .. }) {
            let guard = json!({"match": {"in_port": p}, "priority": 1, "actions": ["drop"]});
            let made = net
                .api(sw, "POST", "/api/v1/tables/acl/entries", Some(&guard))
                .unwrap();
            acl.push(made["id"].as_u64().unwrap());
        }
    }
    for &(l, out) in routes {
        net.api(
            sw,
            "POST",
            "/api/v1/tables/labels/entries",
            Some(&json!({"match": {"mpls": label(l)},
                         "actions": [{"count": format!("label{l}")}, "pop_label", {"output": out}]})),
        )
        .unwrap();
    }
    acl
}

/// Sends `SENT` datagrams from h0 to h1 and returns how many h1 received as UDP.
fn send(net: &Net) -> u64 {
    let (h0, h1) = (net.host("h0").clone(), net.host("h1").clone());
    let to = SocketAddrV4::new(h1.ip, PORT);
    let (bound_tx, bound_rx) = std::sync::mpsc::channel();
    let receiver = std::thread::spawn(move || {
        testbed::in_netns(&h1.netns, || {
            let sock = UdpSocket::bind(("0.0.0.0", PORT)).unwrap();
            sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            bound_tx.send(()).unwrap();
            let mut got = 0u64;
            let mut buf = [0u8; 2048];
            while let Ok((n, _)) = sock.recv_from(&mut buf) {
                assert_eq!(&buf[..n], b"labelled datagram", "arrives as it was sent");
                got += 1;
                if got == SENT {
                    break;
                }
            }
            got
        })
        .unwrap()
    });
    bound_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    testbed::in_netns(&h0.netns, || {
        let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
        for _ in 0..SENT {
            sock.send_to(b"labelled datagram", to).unwrap();
            std::thread::sleep(Duration::from_millis(2));
        }
    })
    .unwrap();
    receiver.join().unwrap()
}

/// The frames each switch's label entries counted, by label.
fn counted(net: &Net) -> std::collections::HashMap<String, u64> {
    let mut out = std::collections::HashMap::new();
    for sw in ["s0", "s1", "s2", "s3"] {
        let counters = net.api(sw, "GET", "/api/v1/counters", None).unwrap();
        for c in counters["counters"].as_array().unwrap() {
            let name = c["name"].as_str().unwrap().to_string();
            out.insert(format!("{sw}/{name}"), c["packets"].as_u64().unwrap());
        }
    }
    out
}

#[test]
fn labelled_datagrams_follow_their_label_stack_and_arrive_unlabelled() {
    require_root();
    let net = Net::up(&NetSpec {
        prefix: PREFIX.into(),
        switches: ["s0", "s1", "s2", "s3"].map(String::from).to_vec(),
        hosts: vec![("h0".into(), "s0".into()), ("h1".into(), "s3".into())],
        bridges: Vec::new(),
        links: [("s0", "s1"), ("s0", "s2"), ("s1", "s3"), ("s2", "s3")]
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .to_vec(),
        bin: env!("CARGO_BIN_EXE_kvswitch").into(),
        static_neighbours: true,
    })
    .unwrap();
    let before: Vec<Value> = ["s0", "s1", "s2", "s3"]
        .iter()
        .map(|s| net.programmed(s).unwrap())
        .collect();
    let to = |a: &str, b: &str| net.port_to(a, b).unwrap();
    let h1_port = net.host("h1").port;
    // Labels: 10 and 20 leave s0 for s1 and s2; 11 and 21 leave those for s3; 30 leaves s3
    // for h1 (the bottom label: the frame is IPv4 again).
    let mut acl = std::collections::HashMap::new();
    acl.insert(
        "s0",
        program_labels(&net, "s0", &[(10, to("s0", "s1")), (20, to("s0", "s2"))]),
    );
    acl.insert("s1", program_labels(&net, "s1", &[(11, to("s1", "s3"))]));
    acl.insert("s2", program_labels(&net, "s2", &[(21, to("s2", "s3"))]));
    acl.insert("s3", program_labels(&net, "s3", &[(30, h1_port)]));
    let h1_ip = net.host("h1").ip.to_string();
    let route = |stack: &[u32]| {
        let mut actions: Vec<Value> = stack
            .iter()
            .rev()
            .map(|l| json!({"push_label": l}))
            .collect();
        actions.push(json!({"goto": "labels"}));
        json!({"match": {"ethertype": "0x0800", "ip_dst": h1_ip, "ip_proto": 17, "l4_dst": PORT},
               "priority": 20, "actions": actions})
    };
    // Each route: the counters its labels must move, and those of the other route.
    let via_s1 = ["s0/label10", "s1/label11", "s3/label30"];
    let via_s2 = ["s0/label20", "s2/label21", "s3/label30"];
    for (stack, on, off) in [
        (vec![10, 11, 30], via_s1, ["s0/label20", "s2/label21"]),
        (vec![20, 21, 30], via_s2, ["s0/label10", "s1/label11"]),
    ] {
        let made = net
            .api(
                "s0",
                "POST",
                "/api/v1/tables/acl/entries",
                Some(&route(&stack)),
            )
            .unwrap();
        let before = counted(&net);
        let got = send(&net);
        let after = counted(&net);
        assert_eq!(
            got, SENT,
            "stack {stack:?}: every datagram arrives: {before:?} -> {after:?}"
        );
        let delta =
            |c: &str| after.get(c).copied().unwrap_or(0) - before.get(c).copied().unwrap_or(0);
        // Every hop of the stack's path took every datagram by its own label; the other
        // route's hops took none.
        for c in on {
            assert_eq!(
                delta(c),
                SENT,
                "stack {stack:?}: {c}: {before:?} -> {after:?}"
            );
        }
        for c in off {
            assert_eq!(delta(c), 0, "stack {stack:?}: {c}: {before:?} -> {after:?}");
        }
        net.api(
            "s0",
            "DELETE",
            &format!("/api/v1/tables/acl/entries/{}", made["id"]),
            None,
        )
        .unwrap();
    }
    // The function's tables are listed, and removed cleanly: the memcached program is as it was.
    for (sw, ids) in &acl {
        let tables = net.api(sw, "GET", "/api/v1/tables", None).unwrap();
        assert!(tables.to_string().contains("\"labels\""), "{sw}: {tables}");
        for id in ids {
            net.api(
                sw,
                "DELETE",
                &format!("/api/v1/tables/acl/entries/{id}"),
                None,
            )
            .unwrap();
        }
        net.api(sw, "DELETE", "/api/v1/tables/labels", None)
            .unwrap();
        // Its counters go once their entries have.
        let counters = net.api(sw, "GET", "/api/v1/counters", None).unwrap();
        for c in counters["counters"].as_array().unwrap() {
            let name = c["name"].as_str().unwrap();
            net.api(sw, "DELETE", &format!("/api/v1/counters/{name}"), None)
                .unwrap();
        }
    }
    for (sw, before) in ["s0", "s1", "s2", "s3"].iter().zip(&before) {
        assert_eq!(&net.programmed(sw).unwrap(), before, "{sw}");
    }
    net.down().unwrap();
    assert!(!testbed::net::state_path(PREFIX).exists());
}

#[test]
fn a_network_whose_owner_died_is_taken_down_by_the_next_up_of_its_prefix() {
    require_root();
    let spec = NetSpec {
        prefix: "kvtr".into(),
        switches: vec!["s0".into()],
        hosts: vec![("h0".into(), "s0".into())],
        bridges: Vec::new(),
        links: Vec::new(),
        bin: env!("CARGO_BIN_EXE_kvswitch").into(),
        static_neighbours: true,
    };
    let first = Net::up(&spec).unwrap();
    let pid = first.switches[0].pid.unwrap();
    // Its owner is gone without taking it down.
    std::mem::forget(first);
    let second = Net::up(&spec).unwrap();
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.contains(") Z ")),
        "the first network's switch still runs"
    );
    assert_ne!(second.switches[0].pid, Some(pid));
    second.down().unwrap();
    assert!(!testbed::net::state_path("kvtr").exists());
    let left = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&left.stdout).contains("kvtr-"));
}
