//! Ethernet → ARP / IPv4 → UDP → memcached frame header, as the switch reads a received frame.
//!
//! Contract checked: `new_checked` accepts exactly what its doc says, after `Ok` no accessor
//! panics and lengths agree with the header fields, a checked view always gives a `Repr` (or the
//! one documented error), and emitting a parsed `Repr` then parsing it again gives the same
//! `Repr`. Each parser is also offered the raw input directly, so short inputs reach every layer
//! without first growing a valid Ethernet header.
#![no_main]

use std::net::Ipv4Addr;

use libfuzzer_sys::fuzz_target;
use wire::ethernet::{self, EtherType};
use wire::{arp, ipv4, mcudp, udp, Error};

fuzz_target!(|data: &[u8]| {
    check_ethernet(data);
    check_arp(data);
    check_ipv4(data);
    check_udp(
        data,
        Ipv4Addr::new(10, 0, 0, 1),
        Ipv4Addr::new(10, 0, 0, 100),
    );
    check_mcudp(data);
});

fn check_ethernet(data: &[u8]) {
    let frame = match ethernet::Frame::new_checked(data) {
        Ok(frame) => frame,
        Err(e) => {
            assert_eq!(e, Error::Truncated);
            assert!(data.len() < ethernet::HEADER_LEN);
            return;
        }
    };
    let (dst, src, ethertype) = (frame.dst(), frame.src(), frame.ethertype());
    let _ = (dst.is_broadcast(), dst.is_multicast(), src.is_unicast());
    let _ = (dst.to_string(), ethertype.to_string());
    assert_eq!(
        frame.payload().len(),
        data.len() - ethernet::HEADER_LEN,
        "the payload is everything after the header"
    );
    let repr = ethernet::Repr::parse(&frame).expect("a checked frame parses");
    assert_eq!((repr.dst, repr.src, repr.ethertype), (dst, src, ethertype));

    // The header holds nothing but the three fields, so emitting must give back its bytes.
    let mut out = data.to_vec();
    out[..ethernet::HEADER_LEN].fill(0);
    repr.emit(&mut out);
    assert_eq!(
        &out[..],
        data,
        "Ethernet emit does not reproduce the header"
    );
    let again = ethernet::Repr::parse(&ethernet::Frame::new_checked(&out[..]).unwrap()).unwrap();
    assert_eq!(again, repr);

    let payload = frame.payload();
    match ethertype {
        EtherType::ARP => check_arp(payload),
        EtherType::IPV4 => check_ipv4(payload),
        _ => {}
    }
}

fn check_arp(data: &[u8]) {
    let packet = match arp::Packet::new_checked(data) {
        Ok(packet) => packet,
        Err(Error::Truncated) => {
            assert!(data.len() < arp::LEN);
            return;
        }
        Err(e) => {
            assert_eq!(
                e,
                Error::Unsupported,
                "ARP rejects only short or non-IPv4 packets"
            );
            assert!(data.len() >= arp::LEN);
            return;
        }
    };
    assert!(data.len() >= arp::LEN);
    let op = packet.operation();
    assert_eq!(arp::Operation::from(u16::from(op)), op);
    let fields = (
        op,
        packet.sender_mac(),
        packet.sender_ip(),
        packet.target_mac(),
        packet.target_ip(),
    );
    let repr = arp::Repr::parse(&packet).expect("a checked ARP packet parses");
    assert_eq!(
        (
            repr.operation,
            repr.sender_mac,
            repr.sender_ip,
            repr.target_mac,
            repr.target_ip
        ),
        fields
    );

    // Every byte of an Ethernet/IPv4 ARP packet is either fixed (and checked) or a field.
    let mut out = [0u8; arp::LEN];
    repr.emit(&mut out);
    assert_eq!(
        &out[..],
        &data[..arp::LEN],
        "ARP emit does not reproduce the packet"
    );
    let again = arp::Repr::parse(&arp::Packet::new_checked(&out[..]).unwrap()).unwrap();
    assert_eq!(again, repr);
}

fn check_ipv4(data: &[u8]) {
    let packet = match ipv4::Packet::new_checked(data) {
        Ok(packet) => packet,
        Err(e) => {
            assert!(
                matches!(e, Error::Truncated | Error::Malformed),
                "IPv4 new_checked failed with {e:?}"
            );
            return;
        }
    };
    let header_len = packet.header_len();
    let total_len = usize::from(packet.total_len());
    assert_eq!(packet.version(), 4);
    assert!((ipv4::HEADER_LEN..=60).contains(&header_len));
    assert!(header_len <= total_len && total_len <= data.len());
    assert_eq!(packet.payload().len(), total_len - header_len);
    let _ = (
        packet.dscp_ecn(),
        packet.ident(),
        packet.dont_frag(),
        packet.ttl(),
        packet.checksum(),
        packet.protocol().to_string(),
    );
    let fragment = packet.is_fragment();
    assert_eq!(fragment, packet.more_frags() || packet.frag_offset() != 0);
    let checksum_ok = packet.verify_checksum();

    // Filling the checksum on a copy makes it verify, options included. (A header that already
    // verified may still get the other one's-complement zero, so the bytes are not compared.)
    let mut copy = data.to_vec();
    let mut writable = ipv4::Packet::new_checked(&mut copy[..]).expect("same bytes, same check");
    writable.fill_checksum();
    assert!(
        writable.verify_checksum(),
        "fill_checksum left a bad checksum"
    );

    let repr = match ipv4::Repr::parse(&packet) {
        Ok(repr) => repr,
        Err(Error::BadChecksum) => {
            assert!(!checksum_ok);
            return;
        }
        Err(Error::Unsupported) => {
            assert!(checksum_ok && fragment);
            return;
        }
        Err(e) => panic!("IPv4 Repr::parse failed with {e:?} on a checked packet"),
    };
    assert!(checksum_ok && !fragment);
    assert_eq!(usize::from(repr.payload_len), total_len - header_len);
    assert_eq!(
        (repr.src, repr.dst, repr.protocol, repr.ttl),
        (packet.src(), packet.dst(), packet.protocol(), packet.ttl())
    );

    // Emit drops the options; the parsed form must survive that.
    let mut out = vec![0u8; repr.buffer_len() + usize::from(repr.payload_len)];
    repr.emit(&mut out);
    out[ipv4::HEADER_LEN..].copy_from_slice(packet.payload());
    let emitted = ipv4::Packet::new_checked(&out[..]).expect("an emitted header checks");
    assert_eq!(ipv4::Repr::parse(&emitted), Ok(repr));
    assert_eq!(emitted.payload(), packet.payload());

    if repr.protocol == ipv4::Protocol::UDP {
        check_udp(packet.payload(), repr.src, repr.dst);
    }
}

fn check_udp(data: &[u8], src: Ipv4Addr, dst: Ipv4Addr) {
    let packet = match udp::Packet::new_checked(data) {
        Ok(packet) => packet,
        Err(e) => {
            assert!(
                matches!(e, Error::Truncated | Error::Malformed),
                "UDP new_checked failed with {e:?}"
            );
            return;
        }
    };
    let len = usize::from(packet.len());
    assert!(len >= udp::HEADER_LEN && len <= data.len());
    assert_eq!(packet.payload().len(), len - udp::HEADER_LEN);
    let _ = (packet.src_port(), packet.dst_port(), packet.checksum());
    let checksum_ok = packet.verify_checksum(src, dst);

    // A filled checksum always verifies.
    let mut copy = data[..len].to_vec();
    let mut writable = udp::Packet::new_checked(&mut copy[..]).expect("same bytes, same check");
    writable.fill_checksum(src, dst);
    assert!(
        writable.verify_checksum(src, dst),
        "fill_checksum left a bad checksum"
    );

    let repr = match udp::Repr::parse(&packet, src, dst) {
        Ok(repr) => repr,
        Err(Error::BadChecksum) => {
            assert!(!checksum_ok);
            return;
        }
        Err(e) => panic!("UDP Repr::parse failed with {e:?} on a checked datagram"),
    };
    assert!(checksum_ok);
    assert_eq!(usize::from(repr.payload_len), len - udp::HEADER_LEN);
    assert_eq!(
        (repr.src_port, repr.dst_port),
        (packet.src_port(), packet.dst_port())
    );

    // Emit writes the header with no checksum over the same payload.
    let mut out = data[..len].to_vec();
    repr.emit(&mut out);
    let emitted = udp::Packet::new_checked(&out[..]).expect("an emitted header checks");
    assert_eq!(emitted.checksum(), 0);
    assert_eq!(udp::Repr::parse(&emitted, src, dst), Ok(repr));
    assert_eq!(emitted.payload(), packet.payload());

    check_mcudp(packet.payload());
}

fn check_mcudp(data: &[u8]) {
    let (header, body) = match mcudp::Header::parse(data) {
        Ok(parsed) => parsed,
        Err(e) => {
            assert_eq!(e, Error::Truncated);
            assert!(data.len() < mcudp::LEN);
            return;
        }
    };
    assert_eq!(body, &data[mcudp::LEN..]);
    assert_eq!(
        header.is_valid_request(),
        header.total == 1 && header.reserved == 0
    );
    let mut out = [0u8; mcudp::LEN];
    header.emit(&mut out);
    assert_eq!(
        &out[..],
        &data[..mcudp::LEN],
        "mcudp emit does not reproduce the header"
    );
    assert_eq!(mcudp::Header::parse(&out), Ok((header, &[][..])));

    let count = mcudp::datagram_count(body.len());
    assert!(count >= 1 && count * mcudp::MAX_PAYLOAD >= body.len());
}
