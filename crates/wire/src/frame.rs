//! Whole Ethernet/IPv4/UDP frames: the headers written in front of a payload, for senders that
//! build frames themselves (the switch's own replies, SwitchKV's clients, a cache node that
//! sends a query back through the switch).

use std::net::Ipv4Addr;

use crate::ethernet::{self, EtherType, Mac};
use crate::{ipv4, udp};

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

/// Where the UDP header starts in a frame.
pub const UDP_OFFSET: usize = ethernet::HEADER_LEN + ipv4::HEADER_LEN;
/// Where the UDP payload starts in a frame.
pub const PAYLOAD_OFFSET: usize = UDP_OFFSET + udp::HEADER_LEN;
/// The longest UDP payload an IPv4 packet holds.
pub const MAX_PAYLOAD: usize = u16::MAX as usize - ipv4::HEADER_LEN - udp::HEADER_LEN;

/// Writes the Ethernet, IPv4 and UDP headers for `ends` in front of the payload that `frame`
/// holds from [`PAYLOAD_OFFSET`] to its end, with both checksums filled. False, and nothing
/// written, when `frame` is shorter than the headers or its payload longer than
/// [`MAX_PAYLOAD`].
pub fn emit_udp_headers(frame: &mut [u8], ends: &UdpEnds) -> bool {
    let Some(payload_len) = frame.len().checked_sub(PAYLOAD_OFFSET) else {
        return false;
    };
    if payload_len > MAX_PAYLOAD {
        return false;
    }
    emit_ipv4_headers(
        frame,
        (ends.src_mac, ends.dst_mac),
        (ends.src_ip, ends.dst_ip),
        ipv4::Protocol::UDP,
        (udp::HEADER_LEN + payload_len) as u16,
    );
    udp::Repr {
        src_port: ends.src_port,
        dst_port: ends.dst_port,
        payload_len: payload_len as u16,
    }
    .emit(&mut frame[UDP_OFFSET..]);
    if let Ok(mut u) = udp::Packet::new_checked(&mut frame[UDP_OFFSET..]) {
        u.fill_checksum(ends.src_ip, ends.dst_ip);
    }
    true
}

/// Writes the Ethernet header and a 20-byte IPv4 header (TTL 64, checksum filled) at the front
/// of `frame`, for an IP payload of `l4_len` bytes of `protocol`. `frame` must hold both
/// headers.
pub(crate) fn emit_ipv4_headers(
    frame: &mut [u8],
    (src_mac, dst_mac): (Mac, Mac),
    (src_ip, dst_ip): (Ipv4Addr, Ipv4Addr),
    protocol: ipv4::Protocol,
    l4_len: u16,
) {
    ethernet::Repr {
        src: src_mac,
        dst: dst_mac,
        ethertype: EtherType::IPV4,
    }
    .emit(&mut frame[..]);
    ipv4::Repr {
        src: src_ip,
        dst: dst_ip,
        protocol,
        payload_len: l4_len,
        ttl: ipv4::DEFAULT_TTL,
    }
    .emit(&mut frame[ethernet::HEADER_LEN..]);
}

impl UdpEnds {
    /// The ends of a frame from `src` (MAC, address and port) to `dst`.
    pub fn between(src: (Mac, Ipv4Addr, u16), dst: (Mac, Ipv4Addr, u16)) -> UdpEnds {
        UdpEnds {
            src_mac: src.0,
            dst_mac: dst.0,
            src_ip: src.1,
            dst_ip: dst.1,
            src_port: src.2,
            dst_port: dst.2,
        }
    }

    /// The same exchange seen from the other end: the addresses of a reply.
    pub fn reversed(&self) -> UdpEnds {
        UdpEnds {
            src_mac: self.dst_mac,
            dst_mac: self.src_mac,
            src_ip: self.dst_ip,
            dst_ip: self.src_ip,
            src_port: self.dst_port,
            dst_port: self.src_port,
        }
    }
}

/// A received Ethernet/IPv4/UDP frame's addresses, seen from its sender, and its UDP payload;
/// `None` for anything else (other protocols, fragments, lengths that disagree). Checksums are
/// not checked.
pub fn parse_udp(frame: &[u8]) -> Option<(UdpEnds, &[u8])> {
    let eth = ethernet::Frame::new_checked(frame).ok()?;
    if eth.ethertype() != EtherType::IPV4 {
        return None;
    }
    let ip = ipv4::Packet::new_checked(frame.get(ethernet::HEADER_LEN..)?).ok()?;
    if ip.is_fragment() || ip.protocol() != ipv4::Protocol::UDP {
        return None;
    }
    let start = ethernet::HEADER_LEN + ip.header_len();
    let end = ethernet::HEADER_LEN + usize::from(ip.total_len());
    let segment = frame.get(start..end)?;
    let u = udp::Packet::new_checked(segment).ok()?;
    let ends = UdpEnds {
        src_mac: eth.src(),
        dst_mac: eth.dst(),
        src_ip: ip.src(),
        dst_ip: ip.dst(),
        src_port: u.src_port(),
        dst_port: u.dst_port(),
    };
    Some((ends, segment.get(udp::HEADER_LEN..usize::from(u.len()))?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_built_frame_parses_back_to_its_ends_and_payload_and_nothing_else_does() {
        let mut frame = vec![0u8; PAYLOAD_OFFSET];
        frame.extend_from_slice(b"hello");
        assert!(emit_udp_headers(&mut frame, &ends()));
        assert_eq!(parse_udp(&frame), Some((ends(), &b"hello"[..])));
        assert_eq!(ends().reversed().reversed(), ends());
        for len in 0..frame.len() {
            assert_eq!(parse_udp(&frame[..len]), None);
        }
        let mut tcp = frame.clone();
        tcp[23] = 6;
        assert_eq!(parse_udp(&tcp), None);
    }

    fn ends() -> UdpEnds {
        UdpEnds {
            src_mac: Mac([2, 0, 0, 0, 0, 1]),
            dst_mac: Mac([2, 0, 0, 0, 0, 2]),
            src_ip: Ipv4Addr::new(10, 0, 0, 1),
            dst_ip: Ipv4Addr::new(10, 0, 0, 2),
            src_port: 4000,
            dst_port: 11211,
        }
    }

    #[test]
    fn the_headers_read_back_with_valid_checksums() {
        let mut frame = vec![0u8; PAYLOAD_OFFSET];
        frame.extend_from_slice(b"hello");
        assert!(emit_udp_headers(&mut frame, &ends()));
        let eth = ethernet::Frame::new_checked(&frame[..]).unwrap();
        assert_eq!(eth.dst(), ends().dst_mac);
        let ip = ipv4::Packet::new_checked(&frame[ethernet::HEADER_LEN..]).unwrap();
        assert!(ip.verify_checksum());
        assert_eq!((ip.src(), ip.dst()), (ends().src_ip, ends().dst_ip));
        let u = udp::Packet::new_checked(ip.payload()).unwrap();
        assert!(u.verify_checksum(ends().src_ip, ends().dst_ip));
        assert_eq!(
            (u.src_port(), u.dst_port(), u.payload()),
            (4000, 11211, &b"hello"[..])
        );
    }

    #[test]
    fn a_frame_too_short_or_too_long_is_left_alone() {
        let mut short = vec![7u8; PAYLOAD_OFFSET - 1];
        assert!(!emit_udp_headers(&mut short, &ends()));
        assert!(short.iter().all(|&b| b == 7));
        let mut long = vec![7u8; PAYLOAD_OFFSET + MAX_PAYLOAD + 1];
        assert!(!emit_udp_headers(&mut long, &ends()));
        assert!(long.iter().all(|&b| b == 7));
        let mut longest = vec![7u8; PAYLOAD_OFFSET + MAX_PAYLOAD];
        assert!(emit_udp_headers(&mut longest, &ends()));
    }
}
