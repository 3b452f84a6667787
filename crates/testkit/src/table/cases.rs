//! The tables of cases: the l3 and l2 modes, and the local port's.

use super::*;

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
