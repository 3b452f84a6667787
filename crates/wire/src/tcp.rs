//! TCP segments (RFC 9293) in plain frames: untagged Ethernet, IPv4 with a 20-byte header, TCP.
//! A checked view, the options a handshake carries, and whole segments built with both
//! checksums filled.
//!
//! The view checks every length once; nothing here panics on any input.

use std::net::Ipv4Addr;

use crate::ethernet::{self, EtherType, Mac};
use crate::{checksum, ipv4, Error};

/// Length of a TCP header without options.
pub const HEADER_LEN: usize = 20;
/// Where the TCP header starts in a plain frame.
pub const OFFSET: usize = ethernet::HEADER_LEN + ipv4::HEADER_LEN;

/// The control bits.
pub mod flag {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const PSH: u8 = 0x08;
    pub const ACK: u8 = 0x10;
}

mod field {
    use core::ops::Range;

    pub const IP_CHECKSUM: Range<usize> = 24..26;
    pub const IP_SRC: Range<usize> = 26..30;
    pub const IP_DST: Range<usize> = 30..34;
    pub const SRC_PORT: Range<usize> = 34..36;
    pub const DST_PORT: Range<usize> = 36..38;
    pub const SEQ: Range<usize> = 38..42;
    pub const ACK: Range<usize> = 42..46;
    pub const DATA_OFF: usize = 46;
    pub const FLAGS: usize = 47;
    pub const WINDOW: Range<usize> = 48..50;
    pub const CHECKSUM: Range<usize> = 50..52;
}

/// The options of a SYN that matter to a connection's two ends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    pub mss: Option<u16>,
    /// The shift the sender applies to the windows it advertises (at most 14).
    pub wscale: Option<u8>,
    pub sack_permitted: bool,
    pub timestamps: bool,
}

impl Options {
    /// Reads the option bytes of a header. An unknown option is skipped by its length; a
    /// malformed one ends the list, as if the rest were padding.
    pub fn parse(mut bytes: &[u8]) -> Options {
        let mut o = Options::default();
        while let Some(&kind) = bytes.first() {
            match kind {
                0 => break,
                1 => {
                    bytes = &bytes[1..];
                    continue;
                }
                _ => {}
            }
            let Some(&len) = bytes.get(1) else { break };
            let len = usize::from(len);
            let Some(body) = bytes.get(2..len.max(2)).filter(|_| len >= 2) else {
                break;
            };
            match (kind, body) {
                (2, [a, b]) => o.mss = Some(u16::from_be_bytes([*a, *b])),
                (3, [s]) => o.wscale = Some((*s).min(14)),
                (4, []) => o.sack_permitted = true,
                (8, b) if b.len() == 8 => o.timestamps = true,
                _ => {}
            }
            bytes = &bytes[len..];
        }
        o
    }
}

/// A checked view of the TCP segment in a plain frame.
#[derive(Debug, Clone, Copy)]
pub struct Segment<'a> {
    frame: &'a [u8],
    /// Where the payload starts and ends in `frame`.
    data: usize,
    end: usize,
}

impl<'a> Segment<'a> {
    /// The segment in `frame`, after checking that the frame is plain IPv4 carrying TCP and
    /// that the IP total length and the TCP data offset fit the frame. Bytes past the IP total
    /// length (Ethernet padding) are ignored. The checksum is not verified here.
    pub fn parse(frame: &'a [u8]) -> Result<Segment<'a>, Error> {
        let eth = ethernet::Frame::new_checked(frame)?;
        if eth.ethertype() != EtherType::IPV4 {
            return Err(Error::Malformed);
        }
        let ip = ipv4::Packet::new_checked(&frame[ethernet::HEADER_LEN..])?;
        if ip.header_len() != ipv4::HEADER_LEN
            || ip.is_fragment()
            || ip.protocol() != ipv4::Protocol::TCP
        {
            return Err(Error::Malformed);
        }
        let end = ethernet::HEADER_LEN + usize::from(ip.total_len());
        if end > frame.len() || end < OFFSET + HEADER_LEN {
            return Err(Error::Truncated);
        }
        let data = OFFSET + usize::from(frame[field::DATA_OFF] >> 4) * 4;
        if data < OFFSET + HEADER_LEN || data > end {
            return Err(Error::Malformed);
        }
        Ok(Segment { frame, data, end })
    }

    fn u16_at(&self, r: core::ops::Range<usize>) -> u16 {
        u16::from_be_bytes([self.frame[r.start], self.frame[r.start + 1]])
    }

    fn u32_at(&self, r: core::ops::Range<usize>) -> u32 {
        let b = &self.frame[r];
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }

    pub fn src_mac(&self) -> Mac {
        let mut m = [0u8; 6];
        m.copy_from_slice(&self.frame[6..12]);
        Mac(m)
    }

    pub fn dst_mac(&self) -> Mac {
        let mut m = [0u8; 6];
        m.copy_from_slice(&self.frame[0..6]);
        Mac(m)
    }

    pub fn src_ip(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.u32_at(field::IP_SRC))
    }

    pub fn dst_ip(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.u32_at(field::IP_DST))
    }

    pub fn src_port(&self) -> u16 {
        self.u16_at(field::SRC_PORT)
    }

    pub fn dst_port(&self) -> u16 {
        self.u16_at(field::DST_PORT)
    }

    pub fn seq(&self) -> u32 {
        self.u32_at(field::SEQ)
    }

    pub fn ack(&self) -> u32 {
        self.u32_at(field::ACK)
    }

    pub fn flags(&self) -> u8 {
        self.frame[field::FLAGS]
    }

    pub fn has(&self, flag: u8) -> bool {
        self.flags() & flag != 0
    }

    pub fn window(&self) -> u16 {
        self.u16_at(field::WINDOW)
    }

    pub fn options(&self) -> Options {
        Options::parse(&self.frame[OFFSET + HEADER_LEN..self.data])
    }

    pub fn payload(&self) -> &'a [u8] {
        &self.frame[self.data..self.end]
    }

    /// The sequence space the segment takes: its payload, and one each for SYN and FIN.
    pub fn seq_len(&self) -> u32 {
        (self.end - self.data) as u32
            + u32::from(self.has(flag::SYN))
            + u32::from(self.has(flag::FIN))
    }

    /// Whether the TCP checksum (over the pseudo header) is right.
    pub fn verify_checksum(&self) -> bool {
        let tcp = &self.frame[OFFSET..self.end];
        let sum = checksum::pseudo_header_v4(
            self.src_ip(),
            self.dst_ip(),
            ipv4::Protocol::TCP.0,
            tcp.len() as u16,
        ) + checksum::sum(tcp);
        checksum::fold(sum) == 0
    }
}

/// Fills the IPv4 header checksum and the TCP checksum of a plain frame; nothing when the frame
/// is not one.
fn fill_checksums(frame: &mut [u8]) {
    let Ok(seg) = Segment::parse(frame) else {
        return;
    };
    let (src, dst, end) = (seg.src_ip(), seg.dst_ip(), seg.end);
    frame[field::IP_CHECKSUM].copy_from_slice(&[0, 0]);
    let ip_sum = checksum::fold(checksum::sum(&frame[ethernet::HEADER_LEN..OFFSET]));
    frame[field::IP_CHECKSUM].copy_from_slice(&ip_sum.to_be_bytes());
    frame[field::CHECKSUM].copy_from_slice(&[0, 0]);
    let tcp = &frame[OFFSET..end];
    let sum = checksum::pseudo_header_v4(src, dst, ipv4::Protocol::TCP.0, tcp.len() as u16)
        + checksum::sum(tcp);
    frame[field::CHECKSUM].copy_from_slice(&checksum::fold(sum).to_be_bytes());
}

/// A segment's header, for [`Repr::frame`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    pub src_port: u16,
    pub dst_port: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub window: u16,
    /// Options written, in a SYN: the MSS and the window scale.
    pub mss: Option<u16>,
    pub wscale: Option<u8>,
}

/// The Ethernet and IP ends of a segment [`Repr::frame`] builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ends {
    pub src_mac: Mac,
    pub dst_mac: Mac,
    pub src_ip: Ipv4Addr,
    pub dst_ip: Ipv4Addr,
}

impl Repr {
    /// A segment without options (anything but a SYN).
    pub fn plain(src_port: u16, dst_port: u16, seq: u32, ack: u32, flags: u8, window: u16) -> Repr {
        Repr {
            src_port,
            dst_port,
            seq,
            ack,
            flags,
            window,
            mss: None,
            wscale: None,
        }
    }

    /// A whole frame of this segment carrying `payload`, checksums filled. The payload must
    /// leave room for the headers in an IPv4 packet (at most 65,495 bytes); longer ones are cut.
    pub fn frame(&self, ends: &Ends, payload: &[u8]) -> Vec<u8> {
        let mut options = Vec::with_capacity(8);
        if let Some(mss) = self.mss {
            options.extend_from_slice(&[2, 4]);
            options.extend_from_slice(&mss.to_be_bytes());
        }
        if let Some(shift) = self.wscale {
            options.extend_from_slice(&[1, 3, 3, shift.min(14)]);
        }
        let header = HEADER_LEN + options.len();
        let payload = &payload[..payload
            .len()
            .min(usize::from(u16::MAX) - ipv4::HEADER_LEN - header)];
        let mut frame = vec![0u8; OFFSET + header + payload.len()];
        crate::frame::emit_ipv4_headers(
            &mut frame,
            (ends.src_mac, ends.dst_mac),
            (ends.src_ip, ends.dst_ip),
            ipv4::Protocol::TCP,
            (header + payload.len()) as u16,
        );
        frame[field::SRC_PORT].copy_from_slice(&self.src_port.to_be_bytes());
        frame[field::DST_PORT].copy_from_slice(&self.dst_port.to_be_bytes());
        frame[field::SEQ].copy_from_slice(&self.seq.to_be_bytes());
        frame[field::ACK].copy_from_slice(&self.ack.to_be_bytes());
        frame[field::DATA_OFF] = ((header / 4) as u8) << 4;
        frame[field::FLAGS] = self.flags;
        frame[field::WINDOW].copy_from_slice(&self.window.to_be_bytes());
        frame[OFFSET + HEADER_LEN..OFFSET + header].copy_from_slice(&options);
        frame[OFFSET + header..].copy_from_slice(payload);
        fill_checksums(&mut frame);
        frame
    }
}

/// Whether sequence number `a` comes before `b` (RFC 9293's comparison modulo 2^32).
pub fn before(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ends() -> Ends {
        Ends {
            src_mac: Mac([2, 0, 0, 0, 0, 1]),
            dst_mac: Mac([2, 0, 0, 0, 0, 2]),
            src_ip: Ipv4Addr::new(10, 0, 0, 1),
            dst_ip: Ipv4Addr::new(10, 0, 0, 2),
        }
    }

    fn syn() -> Repr {
        Repr {
            src_port: 40000,
            dst_port: 11211,
            seq: 0xffff_fff0,
            ack: 0,
            flags: flag::SYN,
            window: 64240,
            mss: Some(1460),
            wscale: Some(7),
        }
    }

    #[test]
    fn a_built_segment_reads_back_with_its_options_and_checksums() {
        let frame = syn().frame(&ends(), b"");
        let s = Segment::parse(&frame).unwrap();
        assert_eq!((s.src_port(), s.dst_port()), (40000, 11211));
        assert_eq!(
            (s.seq(), s.flags(), s.window()),
            (0xffff_fff0, flag::SYN, 64240)
        );
        assert_eq!(s.options().mss, Some(1460));
        assert_eq!(s.options().wscale, Some(7));
        assert!(!s.options().sack_permitted);
        assert_eq!(s.seq_len(), 1);
        assert!(s.verify_checksum());
        let ip = ipv4::Packet::new_checked(&frame[ethernet::HEADER_LEN..]).unwrap();
        assert!(ip.verify_checksum());
    }

    #[test]
    fn bad_frames_and_options_are_refused_or_read_safely() {
        let frame = syn().frame(&ends(), b"x");
        for cut in 0..frame.len() {
            let _ = Segment::parse(&frame[..cut]);
        }
        let mut bad = frame.clone();
        bad[46] = 0x10; // a data offset of 4 bytes
        assert!(Segment::parse(&bad).is_err());
        bad[46] = 0xf0; // 60 bytes: past the end
        assert!(Segment::parse(&bad).is_err());
        // Options with lengths 0, 1 and past the end end the list without a panic.
        for opts in [&[2u8, 0][..], &[3, 1, 5], &[2, 9, 1, 1], &[1, 1, 8, 10, 0]] {
            let _ = Options::parse(opts);
        }
        let o = Options::parse(&[1, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 3, 3, 20]);
        assert!(o.sack_permitted && o.timestamps);
        assert_eq!(o.wscale, Some(14));
    }

    #[test]
    fn sequence_numbers_compare_across_the_wrap() {
        assert!(before(0xffff_fff0, 5));
        assert!(!before(5, 0xffff_fff0));
        assert!(!before(5, 5));
    }
}
