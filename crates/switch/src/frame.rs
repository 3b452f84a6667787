//! Builders for the frames the switch originates itself: ARP replies and requests, and UDP
//! replies from the VIP (error answers and merged multi-key gets).

use wire::ethernet::{self, EtherType, Mac};
use wire::{arp, mcudp};

pub use wire::frame::UdpEnds;
use wire::frame::PAYLOAD_OFFSET;

/// Builds one Ethernet/IPv4/UDP frame carrying `payload`, with both checksums filled. The
/// switch's own frames always fit ([`wire::frame::MAX_PAYLOAD`]): a piece of a reply, or part
/// of a request that came in one datagram; a payload that does not fit gives no frame.
pub fn udp_frame(ends: &UdpEnds, payload: &[&[u8]]) -> Vec<u8> {
    let mut buf =
        Vec::with_capacity(PAYLOAD_OFFSET + payload.iter().map(|p| p.len()).sum::<usize>());
    buf.resize(PAYLOAD_OFFSET, 0);
    for p in payload {
        buf.extend_from_slice(p);
    }
    if !wire::frame::emit_udp_headers(&mut buf, ends) {
        buf.clear();
    }
    buf
}

/// Splits a memcached UDP reply into datagrams of at most [`mcudp::MAX_PAYLOAD`] bytes, each
/// with its own frame header, as memcached does. Returns `None` if it would need more than
/// 65535 datagrams.
pub fn memcached_reply(ends: &UdpEnds, request_id: u16, reply: &[u8]) -> Option<Vec<Vec<u8>>> {
    let frames = mcudp::pieces(request_id, reply)?
        .map(|(header, piece)| {
            let mut bytes = [0u8; mcudp::LEN];
            header.emit(&mut bytes);
            udp_frame(ends, &[&bytes, piece])
        })
        .collect();
    Some(frames)
}

/// Builds an ARP frame (request or reply).
pub fn arp_frame(eth_dst: Mac, repr: &arp::Repr) -> Vec<u8> {
    let mut buf = vec![0u8; ethernet::HEADER_LEN + arp::LEN];
    ethernet::Repr {
        src: repr.sender_mac,
        dst: eth_dst,
        ethertype: EtherType::ARP,
    }
    .emit(&mut buf[..]);
    repr.emit(&mut buf[ethernet::HEADER_LEN..]);
    buf
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use wire::frame::UDP_OFFSET;
    use wire::{ipv4, udp};

    fn ends() -> UdpEnds {
        UdpEnds {
            src_mac: "02:00:00:00:00:64".parse().unwrap(),
            dst_mac: "02:00:00:00:00:01".parse().unwrap(),
            src_ip: Ipv4Addr::new(10, 0, 0, 100),
            dst_ip: Ipv4Addr::new(10, 0, 0, 1),
            src_port: 11211,
            dst_port: 40000,
        }
    }

    #[test]
    fn udp_frame_is_valid() {
        let f = udp_frame(&ends(), &[b"abc", b"de"]);
        let eth = ethernet::Frame::new_checked(&f[..]).unwrap();
        assert_eq!(eth.ethertype(), EtherType::IPV4);
        let ip = ipv4::Packet::new_checked(eth.payload()).unwrap();
        assert!(ip.verify_checksum());
        let u = udp::Packet::new_checked(ip.payload()).unwrap();
        assert!(u.verify_checksum(ip.src(), ip.dst()));
        assert_ne!(u.checksum(), 0);
        assert_eq!(u.payload(), b"abcde");
    }

    #[test]
    fn long_reply_is_split_like_memcached() {
        let reply = vec![b'x'; 3000];
        let frames = memcached_reply(&ends(), 7, &reply).unwrap();
        assert_eq!(frames.len(), 3);
        let mut joined = Vec::new();
        for (i, f) in frames.iter().enumerate() {
            let u = &f[UDP_OFFSET..];
            let u = udp::Packet::new_checked(u).unwrap();
            let (h, p) = mcudp::Header::parse(u.payload()).unwrap();
            assert_eq!((h.request_id, h.seq, h.total), (7, i as u16, 3));
            joined.extend_from_slice(p);
        }
        assert_eq!(joined, reply);
    }
}
