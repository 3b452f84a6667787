//! The keyed ports' cases: datagrams to a VIP port routed by their key-location header
//! (`vip.keyed_ports`), the header removed on the way, and the bad headers that are dropped.

use super::*;

/// The keyed port of these cases.
pub const KEYED_PORT: u16 = 5300;

/// The switch without a local port, with [`KEYED_PORT`] routed by key-location header.
pub fn config_keyed(mode: Mode) -> Config {
    config_text(
        mode,
        "local_port = \"\"",
        &format!("keyed_ports = [{KEYED_PORT}]\n"),
    )
}

impl Rig {
    /// With [`KEYED_PORT`] routed by key-location header.
    pub fn keyed(mode: Mode) -> Rig {
        Rig::with(config_keyed(mode), PORTS)
    }
}

/// A client's datagram to the VIP's keyed port carrying `datagram` as it is (header included).
pub fn to_keyed_raw(datagram: &[u8]) -> Vec<u8> {
    udp_frame(
        CLIENT.mac,
        VIP_MAC,
        (CLIENT.ip, CLIENT_UDP_PORT),
        (VIP, KEYED_PORT),
        datagram,
    )
}

/// A client's request to the keyed port: `payload` with the header for `key` attached.
pub fn to_keyed(payload: &[u8], key: std::ops::Range<usize>) -> Vec<u8> {
    let mut datagram = wire::keyloc::header(key).to_vec();
    datagram.extend_from_slice(payload);
    to_keyed_raw(&datagram)
}

/// A request whose payload is `LOOKUP <key> please`, the key pointed at.
pub fn lookup(key: &str) -> Vec<u8> {
    let payload = format!("LOOKUP {key} please");
    to_keyed(payload.as_bytes(), 7..7 + key.len())
}

/// What `server` must receive for a keyed request: the frame the client would have sent
/// without the header, routed as a memcached request is (checksums computed from scratch).
pub fn keyed_routed(input: &[u8], mode: Mode, server: usize) -> Vec<u8> {
    let udp = udp::Packet::new_checked(&input[UDP_AT..]).expect("udp");
    let datagram = udp.payload();
    let mut plain = udp_frame(
        CLIENT.mac,
        VIP_MAC,
        (CLIENT.ip, CLIENT_UDP_PORT),
        (VIP, KEYED_PORT),
        &datagram[wire::keyloc::LEN..],
    );
    if udp.checksum() == 0 {
        plain[UDP_AT + 6..UDP_AT + 8].copy_from_slice(&[0, 0]);
    }
    routed(&plain, mode, server)
}

/// A frame the switch sends `server` of its own (it changed length), for the first emit.
fn to_server(server: usize, frame: Vec<u8>) -> Vec<Emit> {
    vec![Emit {
        dest: switch::Dest::Port(SERVERS[server].port),
        frame,
    }]
}

fn drop_bad_header() -> &'static [Count] {
    &[Count::Drop(Drop::BadKeyHeader)]
}

/// The keyed cases in `mode`.
pub fn keyed_cases(mode: Mode) -> Vec<Case> {
    let mut cases = match mode {
        Mode::L3 => vec![
            Case {
                name: "keyed request goes to its key's server without its header",
                in_port: CLIENT.port,
                input: |fx| lookup(fx.key(1, 0)),
                fate: Fate::Consumed,
                output: None,
                emits: |fx| to_server(1, keyed_routed(&lookup(fx.key(1, 0)), Mode::L3, 1)),
                counts: &[Count::KvForwarded, Count::Switched, Count::Requests(1)],
            },
            Case {
                name: "keyed request for another server goes there",
                in_port: CLIENT.port,
                input: |fx| lookup(fx.key(2, 1)),
                fate: Fate::Consumed,
                output: None,
                emits: |fx| to_server(2, keyed_routed(&lookup(fx.key(2, 1)), Mode::L3, 2)),
                counts: &[Count::KvForwarded, Count::Switched, Count::Requests(2)],
            },
            Case {
                name: "keyed request with a 250-byte key is routed",
                in_port: CLIENT.port,
                input: |fx| lookup(&fx.long_key.0),
                fate: Fate::Consumed,
                output: None,
                emits: |fx| {
                    let s = fx.long_key.1;
                    to_server(s, keyed_routed(&lookup(&fx.long_key.0), Mode::L3, s))
                },
                counts: &[
                    Count::KvForwarded,
                    Count::Switched,
                    Count::Requests(LONG_KEY_SERVER),
                ],
            },
            Case {
                name: "keyed request without a UDP checksum keeps none",
                in_port: CLIENT.port,
                input: |fx| no_checksum(lookup(fx.key(0, 0))),
                fate: Fate::Consumed,
                output: None,
                emits: |fx| {
                    let input = no_checksum(lookup(fx.key(0, 0)));
                    to_server(0, keyed_routed(&input, Mode::L3, 0))
                },
                counts: &[Count::KvForwarded, Count::Switched, Count::Requests(0)],
            },
            Case {
                name: "keyed request whose key is the whole payload is routed",
                in_port: CLIENT.port,
                input: |fx| {
                    let key = fx.key(1, 1);
                    to_keyed(key.as_bytes(), 0..key.len())
                },
                fate: Fate::Consumed,
                output: None,
                emits: |fx| {
                    let key = fx.key(1, 1);
                    let input = to_keyed(key.as_bytes(), 0..key.len());
                    to_server(1, keyed_routed(&input, Mode::L3, 1))
                },
                counts: &[Count::KvForwarded, Count::Switched, Count::Requests(1)],
            },
            Case {
                name: "reply from a server's keyed port leaves with the VIP as source",
                in_port: SERVERS[0].port,
                input: |_| keyed_reply(SERVERS[0].ip),
                fate: Fate::Out(CLIENT.port),
                output: Some(|_, input| rewritten(input, None, Some(VIP), None)),
                emits: nothing,
                counts: &[Count::Switched, Count::Replies(0)],
            },
        ],
        Mode::L2 => vec![
            Case {
                name: "keyed request in l2 mode: only the MAC changes, and the header goes",
                in_port: CLIENT.port,
                input: |fx| lookup(fx.key(2, 0)),
                fate: Fate::Consumed,
                output: None,
                emits: |fx| to_server(2, keyed_routed(&lookup(fx.key(2, 0)), Mode::L2, 2)),
                counts: &[Count::KvForwarded, Count::Switched, Count::Requests(2)],
            },
            Case {
                name: "reply from the VIP's keyed port in l2 mode leaves unchanged",
                in_port: SERVERS[1].port,
                input: |_| keyed_reply_from(SERVERS[1].mac, VIP),
                fate: Fate::Out(CLIENT.port),
                output: None,
                emits: nothing,
                counts: &[Count::Switched],
            },
        ],
    };
    cases.extend(bad_keyed_cases());
    cases
}

/// Headers the switch never forwards, in either mode.
pub fn bad_keyed_cases() -> Vec<Case> {
    vec![
        Case {
            name: "keyed datagram without the preamble is dropped",
            in_port: CLIENT.port,
            input: |fx| {
                let mut f = lookup(fx.key(0, 0));
                f[PAYLOAD_AT + 2] = b'x';
                refit_udp(f)
            },
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: drop_bad_header(),
        },
        Case {
            name: "keyed datagram of another header version is dropped",
            in_port: CLIENT.port,
            input: |fx| {
                let mut f = lookup(fx.key(0, 0));
                f[PAYLOAD_AT + 3] = 2;
                refit_udp(f)
            },
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: drop_bad_header(),
        },
        Case {
            name: "keyed datagram whose key ends past the payload is dropped",
            in_port: CLIENT.port,
            input: |_| to_keyed(b"LOOKUP abc", 7..11),
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: drop_bad_header(),
        },
        Case {
            name: "keyed datagram whose key starts past its end is dropped",
            in_port: CLIENT.port,
            input: |_| {
                let mut d = wire::keyloc::header(0..1).to_vec();
                d[4..8].copy_from_slice(&9u32.to_be_bytes());
                d[8..12].copy_from_slice(&8u32.to_be_bytes());
                d.extend_from_slice(b"LOOKUP abc");
                to_keyed_raw(&d)
            },
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: drop_bad_header(),
        },
        Case {
            name: "keyed datagram with an empty key is dropped",
            in_port: CLIENT.port,
            input: |_| to_keyed(b"LOOKUP abc", 7..7),
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: drop_bad_header(),
        },
        Case {
            name: "keyed datagram with a 251-byte key is dropped",
            in_port: CLIENT.port,
            input: |_| to_keyed(&[b'k'; 300], 10..261),
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: drop_bad_header(),
        },
        Case {
            name: "keyed datagram shorter than the header is dropped",
            in_port: CLIENT.port,
            input: |_| to_keyed_raw(&wire::keyloc::PREAMBLE),
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: drop_bad_header(),
        },
        Case {
            name: "keyed datagram with offsets past 32 bits' worth is dropped",
            in_port: CLIENT.port,
            input: |_| {
                let mut d = wire::keyloc::header(0..1).to_vec();
                d[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
                d[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
                d.extend_from_slice(b"payload");
                to_keyed_raw(&d)
            },
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: drop_bad_header(),
        },
        Case {
            name: "keyed request with a wrong UDP checksum is dropped",
            in_port: CLIENT.port,
            input: |fx| {
                let mut f = lookup(fx.key(0, 0));
                f[UDP_AT + 6] ^= 0x10;
                f
            },
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::BadUdpChecksum)],
        },
    ]
}

/// The frame with its UDP checksum set to 0 (none).
fn no_checksum(mut frame: Vec<u8>) -> Vec<u8> {
    frame[UDP_AT + 6..UDP_AT + 8].copy_from_slice(&[0, 0]);
    frame
}

/// The frame with its UDP checksum computed again, after its payload was changed.
fn refit_udp(mut frame: Vec<u8>) -> Vec<u8> {
    let (src, dst) = {
        let ip = ipv4::Packet::new_checked(&frame[IP_AT..]).expect("ipv4");
        (ip.src(), ip.dst())
    };
    udp::Packet::new_checked(&mut frame[UDP_AT..])
        .expect("udp")
        .fill_checksum(src, dst);
    frame
}

/// A server's answer from the keyed port at `src` to the client.
fn keyed_reply(src: Ipv4Addr) -> Vec<u8> {
    let server = SERVERS.iter().find(|s| s.ip == src).expect("a server");
    keyed_reply_from(server.mac, src)
}

fn keyed_reply_from(mac: Mac, src: Ipv4Addr) -> Vec<u8> {
    udp_frame(
        mac,
        CLIENT.mac,
        (src, KEYED_PORT),
        (CLIENT.ip, CLIENT_UDP_PORT),
        b"FOUND 10.1.2.3",
    )
}
