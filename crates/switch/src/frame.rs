//! Builders for the frames the switch originates itself: ARP replies and requests, and UDP
//! replies from the VIP (error answers and merged multi-key gets).

use std::net::Ipv4Addr;

use wire::ethernet::{self, EtherType, Mac};
use wire::{arp, ipv4, mcudp, udp};

/// Addresses of one UDP exchange, seen from the sender of the frame being built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpEnds {
    pub src_mac: Mac,
    pub dst_mac: Mac,
    pub src_ip: Ipv4Addr,
    pub dst_ip: Ipv4Addr,
    pub src_port: u16,
    pub dst_port: u16,
}

const UDP_OFFSET: usize = ethernet::HEADER_LEN + ipv4::HEADER_LEN;
const PAYLOAD_OFFSET: usize = UDP_OFFSET + udp::HEADER_LEN;

/// Builds one Ethernet/IPv4/UDP frame carrying `payload`, with both checksums filled.
pub fn udp_frame(ends: &UdpEnds, payload: &[&[u8]]) -> Vec<u8> {
    let payload_len: usize = payload.iter().map(|p| p.len()).sum();
    let mut buf = vec![0u8; PAYLOAD_OFFSET + payload_len];
    ethernet::Repr {
        src: ends.src_mac,
        dst: ends.dst_mac,
        ethertype: EtherType::IPV4,
    }
    .emit(&mut buf[..]);
    ipv4::Repr {
        src: ends.src_ip,
        dst: ends.dst_ip,
        protocol: ipv4::Protocol::UDP,
        payload_len: (udp::HEADER_LEN + payload_len) as u16,
        ttl: 64,
    }
    .emit(&mut buf[ethernet::HEADER_LEN..]);
    udp::Repr {
        src_port: ends.src_port,
        dst_port: ends.dst_port,
        payload_len: payload_len as u16,
    }
    .emit(&mut buf[UDP_OFFSET..]);
    let mut at = PAYLOAD_OFFSET;
    for p in payload {
        buf[at..at + p.len()].copy_from_slice(p);
        at += p.len();
    }
    if let Ok(mut u) = udp::Packet::new_checked(&mut buf[UDP_OFFSET..]) {
        u.fill_checksum(ends.src_ip, ends.dst_ip);
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
