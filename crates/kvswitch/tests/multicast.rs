//! The `multicast` action on real hosts: one kvswitch, four hosts in their own network
//! namespaces. h0 sends IP multicast datagrams that h1, h2 and h3 have all joined; a group
//! of h1's port (the frame as it is) and an interface entry for h3 (its MAC) delivers every
//! datagram to those two and none to h2, where flooding (no entry) reaches all three.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::Duration;

use serde_json::json;
use testbed::net::{Net, NetSpec};

const PREFIX: &str = "kvmc";
const GROUP: Ipv4Addr = Ipv4Addr::new(239, 7, 7, 7);
const PORT: u16 = 7400;
const SENT: u64 = 40;

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(uid, 0, "the network needs root");
}

/// Sends `SENT` datagrams from h0 to the multicast group and returns how many each of h1,
/// h2 and h3 received, each byte for byte as sent.
fn send(net: &Net) -> [u64; 3] {
    let (ready_tx, ready_rx) = mpsc::channel();
    let receivers: Vec<_> = ["h1", "h2", "h3"]
        .iter()
        .map(|name| {
            let host = net.host(name).clone();
            let ready = ready_tx.clone();
            std::thread::spawn(move || {
                testbed::in_netns(&host.netns, || {
                    let sock = UdpSocket::bind(("0.0.0.0", PORT)).unwrap();
                    sock.join_multicast_v4(&GROUP, &host.ip).unwrap();
                    sock.set_read_timeout(Some(Duration::from_millis(1500)))
                        .unwrap();
                    ready.send(()).unwrap();
                    let mut got = 0u64;
                    let mut buf = [0u8; 2048];
                    while let Ok((n, _)) = sock.recv_from(&mut buf) {
                        assert_eq!(&buf[..n], b"to the group", "arrives as it was sent");
                        got += 1;
                    }
                    got
                })
                .unwrap()
            })
        })
        .collect();
    for _ in 0..3 {
        ready_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    }
    let h0 = net.host("h0").clone();
    testbed::in_netns(&h0.netns, || {
        let sock = UdpSocket::bind(SocketAddrV4::new(h0.ip, 0)).unwrap();
        let via = libc::in_addr {
            s_addr: u32::from(h0.ip).to_be(),
        };
        // SAFETY: the option's value is an in_addr of the given size, alive for the call.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::IPPROTO_IP,
                libc::IP_MULTICAST_IF,
                (&via as *const libc::in_addr).cast(),
                std::mem::size_of::<libc::in_addr>() as libc::socklen_t,
            )
        };
        assert_eq!(
            rc,
            0,
            "IP_MULTICAST_IF: {}",
            std::io::Error::last_os_error()
        );
        for _ in 0..SENT {
            sock.send_to(b"to the group", SocketAddrV4::new(GROUP, PORT))
                .unwrap();
            std::thread::sleep(Duration::from_millis(2));
        }
    })
    .unwrap();
    let got: Vec<u64> = receivers.into_iter().map(|r| r.join().unwrap()).collect();
    [got[0], got[1], got[2]]
}

#[test]
fn a_multicast_group_delivers_to_its_members_only() {
    require_root();
    let net = Net::up(&NetSpec {
        prefix: PREFIX.into(),
        switches: vec!["s0".into()],
        hosts: ["h0", "h1", "h2", "h3"]
            .iter()
            .map(|h| (h.to_string(), "s0".to_string()))
            .collect(),
        bridges: Vec::new(),
        links: Vec::new(),
        bin: env!("CARGO_BIN_EXE_kvswitch").into(),
        static_neighbours: true,
    })
    .unwrap();
    // No entry: the group's MAC is unknown, so every joined host gets every datagram.
    assert_eq!(send(&net), [SENT; 3], "flooded to every host");

    let (h1, h3) = (net.host("h1").clone(), net.host("h3").clone());
    net.api(
        "s0",
        "PUT",
        "/api/v1/interfaces/1",
        Some(&json!({"eth_dst": h3.mac, "eth_src": "02:00:00:00:00:fe", "port": h3.port})),
    )
    .unwrap();
    net.api(
        "s0",
        "PUT",
        "/api/v1/groups/1",
        Some(&json!({"members": [{"port": h1.port}, {"interface": 1}]})),
    )
    .unwrap();
    let made = net
        .api(
            "s0",
            "POST",
            "/api/v1/tables/acl/entries",
            Some(
                &json!({"match": {"ethertype": "0x0800", "ip_dst": GROUP.to_string()},
                         "priority": 10, "actions": [{"multicast": 1}]}),
            ),
        )
        .unwrap();
    assert_eq!(send(&net), [SENT, 0, SENT], "h1 and h3 only");
    let status = net.api("s0", "GET", "/api/v1/status", None).unwrap();
    assert_eq!(
        status["counters"]["multicast_copies"].as_u64(),
        Some(2 * SENT),
        "{status}"
    );

    // The group changed: the same entry now copies to h2 alone.
    let h2 = net.host("h2").clone();
    net.api(
        "s0",
        "PUT",
        "/api/v1/groups/1",
        Some(&json!({"members": [{"port": h2.port}]})),
    )
    .unwrap();
    assert_eq!(send(&net), [0, SENT, 0], "h2 only");
    net.api(
        "s0",
        "DELETE",
        &format!("/api/v1/tables/acl/entries/{}", made["id"]),
        None,
    )
    .unwrap();
    net.api("s0", "DELETE", "/api/v1/groups/1", None).unwrap();
    net.down().unwrap();
}
