//! Ethernet II frames: MAC addresses, the 14-byte header and its EtherType.
//!
//! The header parsed is the untagged one; a VLAN tag is reported as `EtherType::VLAN` and left
//! to the caller. No FCS is expected in the buffer.

use core::fmt;
use core::str::FromStr;

use crate::Error;

/// Length of an untagged Ethernet II header: destination, source, EtherType.
pub const HEADER_LEN: usize = 14;

/// A 48-bit Ethernet MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Mac(pub [u8; 6]);

impl Mac {
    /// The broadcast address `ff:ff:ff:ff:ff:ff`.
    pub const BROADCAST: Mac = Mac([0xff; 6]);
    /// The all-zero address, used as the unknown target of an ARP request.
    pub const ZERO: Mac = Mac([0; 6]);

    /// The six bytes in wire order.
    pub const fn octets(&self) -> [u8; 6] {
        self.0
    }

    /// True for `ff:ff:ff:ff:ff:ff`.
    pub fn is_broadcast(&self) -> bool {
        *self == Self::BROADCAST
    }

    /// True when the group bit (least significant bit of the first byte) is set; broadcast is
    /// multicast too.
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 0x01 != 0
    }

    /// True when the group bit is clear.
    pub fn is_unicast(&self) -> bool {
        !self.is_multicast()
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

/// A string that is not six colon-separated pairs of hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseMacError;

impl fmt::Display for ParseMacError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "invalid MAC address: expected six colon-separated hex pairs like 02:00:00:00:00:01",
        )
    }
}

impl std::error::Error for ParseMacError {}

impl FromStr for Mac {
    type Err = ParseMacError;

    /// Parses `02:00:00:00:00:01` (either case); every part must be exactly two hex digits.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for byte in out.iter_mut() {
            let part = parts.next().ok_or(ParseMacError)?;
            if part.len() != 2 || !part.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(ParseMacError);
            }
            *byte = u8::from_str_radix(part, 16).map_err(|_| ParseMacError)?;
        }
        if parts.next().is_some() {
            return Err(ParseMacError);
        }
        Ok(Mac(out))
    }
}

/// The EtherType field: which protocol the payload carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EtherType(pub u16);

impl EtherType {
    pub const IPV4: EtherType = EtherType(0x0800);
    pub const ARP: EtherType = EtherType(0x0806);
    /// An 802.1Q tag; kvswitch forwards what it carries unparsed, and the source check looks
    /// beneath it.
    pub const VLAN: EtherType = EtherType(0x8100);
    /// 802.1ad's outer tag (Q-in-Q), looked beneath as [`EtherType::VLAN`] is.
    pub const QINQ: EtherType = EtherType(0x88a8);
    pub const IPV6: EtherType = EtherType(0x86dd);
    /// An MPLS label stack (unicast), which an operator's table may push, swap and pop.
    pub const MPLS: EtherType = EtherType(0x8847);
}

impl fmt::Display for EtherType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            EtherType::IPV4 => f.write_str("IPv4"),
            EtherType::ARP => f.write_str("ARP"),
            EtherType::VLAN => f.write_str("VLAN"),
            EtherType::QINQ => f.write_str("Q-in-Q"),
            EtherType::MPLS => f.write_str("MPLS"),
            EtherType::IPV6 => f.write_str("IPv6"),
            EtherType(other) => write!(f, "0x{other:04x}"),
        }
    }
}

mod field {
    use core::ops::Range;

    pub const DST: Range<usize> = 0..6;
    pub const SRC: Range<usize> = 6..12;
    pub const ETHERTYPE: Range<usize> = 12..14;
    pub const PAYLOAD: usize = 14;
}

/// A read (and, on `AsMut` buffers, write) view of an Ethernet II frame.
#[derive(Debug, Clone)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Wraps a buffer without checking it; accessors panic if it is shorter than `HEADER_LEN`.
    /// Use this only on buffers the caller sized itself (e.g. before `Repr::emit`).
    pub const fn new_unchecked(buffer: T) -> Frame<T> {
        Frame { buffer }
    }

    /// Wraps a buffer after checking it holds a full header; after `Ok`, no accessor panics.
    ///
    /// Fails with `Error::Truncated` if the buffer is shorter than `HEADER_LEN`.
    pub fn new_checked(buffer: T) -> Result<Frame<T>, Error> {
        let frame = Self::new_unchecked(buffer);
        frame.check_len()?;
        Ok(frame)
    }

    /// Checks the buffer holds a full header.
    pub fn check_len(&self) -> Result<(), Error> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    /// Gives back the wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Destination address.
    pub fn dst(&self) -> Mac {
        let mut m = [0u8; 6];
        m.copy_from_slice(&self.buffer.as_ref()[field::DST]);
        Mac(m)
    }

    /// Source address.
    pub fn src(&self) -> Mac {
        let mut m = [0u8; 6];
        m.copy_from_slice(&self.buffer.as_ref()[field::SRC]);
        Mac(m)
    }

    /// The EtherType of the payload.
    pub fn ethertype(&self) -> EtherType {
        let d = &self.buffer.as_ref()[field::ETHERTYPE];
        EtherType(u16::from_be_bytes([d[0], d[1]]))
    }

    /// Everything after the header (the L3 packet, plus any padding up to the minimum frame).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PAYLOAD..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    pub fn set_dst(&mut self, mac: Mac) {
        self.buffer.as_mut()[field::DST].copy_from_slice(&mac.0);
    }

    pub fn set_src(&mut self, mac: Mac) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(&mac.0);
    }

    pub fn set_ethertype(&mut self, ethertype: EtherType) {
        self.buffer.as_mut()[field::ETHERTYPE].copy_from_slice(&ethertype.0.to_be_bytes());
    }

    /// Mutable access to everything after the header.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PAYLOAD..]
    }
}

/// The parsed form of an Ethernet header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    pub src: Mac,
    pub dst: Mac,
    pub ethertype: EtherType,
}

impl Repr {
    /// Reads the header of a checked frame. Never fails today; `Result` keeps the shape of the
    /// other layers.
    pub fn parse<T: AsRef<[u8]>>(frame: &Frame<T>) -> Result<Repr, Error> {
        frame.check_len()?;
        Ok(Repr {
            src: frame.src(),
            dst: frame.dst(),
            ethertype: frame.ethertype(),
        })
    }

    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the 14-byte header at the start of `buf`, leaving the rest untouched.
    ///
    /// # Panics
    /// If `buf` is shorter than `HEADER_LEN`; the caller sizes its own output buffer.
    pub fn emit(&self, buf: &mut [u8]) {
        let mut frame = Frame::new_unchecked(buf);
        frame.set_dst(self.dst);
        frame.set_src(self.src);
        frame.set_ethertype(self.ethertype);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A broadcast ARP request frame header followed by the first bytes of its payload.
    static FRAME: [u8; 18] = [
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // dst
        0x02, 0x00, 0x00, 0x00, 0x00, 0x01, // src
        0x08, 0x06, // ARP
        0x00, 0x01, 0x08, 0x00, // payload
    ];

    #[test]
    fn deconstruct() {
        let f = Frame::new_checked(&FRAME[..]).unwrap();
        assert_eq!(f.dst(), Mac::BROADCAST);
        assert_eq!(f.src(), Mac([2, 0, 0, 0, 0, 1]));
        assert_eq!(f.ethertype(), EtherType::ARP);
        assert_eq!(f.payload(), &[0x00, 0x01, 0x08, 0x00]);
        let r = Repr::parse(&f).unwrap();
        assert_eq!(
            r,
            Repr {
                src: Mac([2, 0, 0, 0, 0, 1]),
                dst: Mac::BROADCAST,
                ethertype: EtherType::ARP
            }
        );
    }

    #[test]
    fn construct() {
        let mut buf = [0u8; 18];
        let r = Repr {
            src: Mac([2, 0, 0, 0, 0, 1]),
            dst: Mac::BROADCAST,
            ethertype: EtherType::ARP,
        };
        r.emit(&mut buf);
        Frame::new_unchecked(&mut buf[..])
            .payload_mut()
            .copy_from_slice(&[0x00, 0x01, 0x08, 0x00]);
        assert_eq!(buf, FRAME);
    }

    #[test]
    fn setters() {
        let mut buf = FRAME;
        let mut f = Frame::new_checked(&mut buf[..]).unwrap();
        f.set_dst(Mac([2, 0, 0, 0, 0, 2]));
        f.set_src(Mac([2, 0, 0, 0, 0, 3]));
        f.set_ethertype(EtherType::IPV4);
        assert_eq!(f.dst(), Mac([2, 0, 0, 0, 0, 2]));
        assert_eq!(f.src(), Mac([2, 0, 0, 0, 0, 3]));
        assert_eq!(f.ethertype(), EtherType::IPV4);
        assert_eq!(&buf[12..14], &[0x08, 0x00]);
    }

    #[test]
    fn truncated() {
        for n in 0..HEADER_LEN {
            assert_eq!(
                Frame::new_checked(&FRAME[..n]).err(),
                Some(Error::Truncated)
            );
        }
        let f = Frame::new_checked(&FRAME[..HEADER_LEN]).unwrap();
        assert!(f.payload().is_empty());
    }

    #[test]
    fn garbage() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut buf = [0u8; 64];
        for _ in 0..4000 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let len = (state >> 58) as usize; // 0..=63
            for b in buf.iter_mut() {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                *b = (state >> 33) as u8;
            }
            if let Ok(f) = Frame::new_checked(&buf[..len]) {
                let _ = (f.dst(), f.src(), f.ethertype(), f.payload().len());
                assert_eq!(f.payload().len(), len - HEADER_LEN);
            }
        }
    }

    #[test]
    fn mac_display_and_parse() {
        let m = Mac([0x02, 0, 0, 0, 0, 0x01]);
        assert_eq!(m.to_string(), "02:00:00:00:00:01");
        assert_eq!("02:00:00:00:00:01".parse::<Mac>(), Ok(m));
        assert_eq!(
            "AA:bb:CC:dd:EE:ff".parse::<Mac>(),
            Ok(Mac([0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff]))
        );
        for bad in [
            "",
            "02:00:00:00:00",
            "02:00:00:00:00:01:02",
            "2:00:00:00:00:01",
            "02:00:00:00:00:0g",
            "02-00-00-00-00-01",
            "+2:00:00:00:00:01",
            "02:00:00:00:00:01:",
            "002:00:00:00:00:1",
        ] {
            assert_eq!(bad.parse::<Mac>(), Err(ParseMacError), "{bad:?}");
        }
        assert!(ParseMacError.to_string().contains("02:00:00:00:00:01"));
    }

    #[test]
    fn mac_classes() {
        assert!(Mac::BROADCAST.is_broadcast());
        assert!(Mac::BROADCAST.is_multicast());
        assert!(!Mac::BROADCAST.is_unicast());
        let mcast = Mac([0x01, 0x00, 0x5e, 0x00, 0x00, 0x01]);
        assert!(mcast.is_multicast() && !mcast.is_broadcast());
        let ucast = Mac([0x02, 0, 0, 0, 0, 1]);
        assert!(ucast.is_unicast() && !ucast.is_multicast() && !ucast.is_broadcast());
    }

    #[test]
    fn ethertype_display() {
        assert_eq!(EtherType::IPV4.to_string(), "IPv4");
        assert_eq!(EtherType(0x88cc).to_string(), "0x88cc");
    }
}
