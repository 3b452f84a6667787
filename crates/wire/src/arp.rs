//! ARP for IPv4 over Ethernet (RFC 826), the only kind kvswitch answers or forwards.
//!
//! Any other hardware or protocol type is reported as `Error::Unsupported`; nothing here
//! allocates or panics on input.

use std::net::Ipv4Addr;

use crate::ethernet::Mac;
use crate::Error;

/// Length of an Ethernet/IPv4 ARP packet.
pub const LEN: usize = 28;

/// Hardware type for Ethernet.
const HTYPE_ETHERNET: u16 = 1;
/// Protocol type for IPv4 (the IPv4 EtherType).
const PTYPE_IPV4: u16 = 0x0800;

mod field {
    use core::ops::Range;

    pub const HTYPE: Range<usize> = 0..2;
    pub const PTYPE: Range<usize> = 2..4;
    pub const HLEN: usize = 4;
    pub const PLEN: usize = 5;
    pub const OPER: Range<usize> = 6..8;
    pub const SHA: Range<usize> = 8..14;
    pub const SPA: Range<usize> = 14..18;
    pub const THA: Range<usize> = 18..24;
    pub const TPA: Range<usize> = 24..28;
}

/// The ARP operation code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    Request,
    Reply,
    /// Any other code (RARP, InARP, ...), kept so it can be counted and forwarded.
    Other(u16),
}

impl From<u16> for Operation {
    fn from(v: u16) -> Self {
        match v {
            1 => Operation::Request,
            2 => Operation::Reply,
            other => Operation::Other(other),
        }
    }
}

impl From<Operation> for u16 {
    fn from(op: Operation) -> u16 {
        match op {
            Operation::Request => 1,
            Operation::Reply => 2,
            Operation::Other(v) => v,
        }
    }
}

/// A read (and, on `AsMut` buffers, write) view of an Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

fn be16(d: &[u8], r: core::ops::Range<usize>) -> u16 {
    let s = &d[r];
    u16::from_be_bytes([s[0], s[1]])
}

fn mac_at(d: &[u8], r: core::ops::Range<usize>) -> Mac {
    let mut m = [0u8; 6];
    m.copy_from_slice(&d[r]);
    Mac(m)
}

fn ip_at(d: &[u8], r: core::ops::Range<usize>) -> Ipv4Addr {
    let s = &d[r];
    Ipv4Addr::new(s[0], s[1], s[2], s[3])
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking it; accessors panic if it is shorter than `LEN`.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer after checking it; after `Ok`, no accessor panics.
    ///
    /// Fails with `Error::Truncated` if the buffer is shorter than `LEN`, and with
    /// `Error::Unsupported` unless it is Ethernet/IPv4 ARP (htype 1, ptype 0x0800, hlen 6,
    /// plen 4). Bytes after `LEN` (Ethernet padding) are ignored.
    pub fn new_checked(buffer: T) -> Result<Packet<T>, Error> {
        let packet = Self::new_unchecked(buffer);
        packet.check()?;
        Ok(packet)
    }

    fn check(&self) -> Result<(), Error> {
        let d = self.buffer.as_ref();
        if d.len() < LEN {
            return Err(Error::Truncated);
        }
        if be16(d, field::HTYPE) != HTYPE_ETHERNET
            || be16(d, field::PTYPE) != PTYPE_IPV4
            || d[field::HLEN] != 6
            || d[field::PLEN] != 4
        {
            return Err(Error::Unsupported);
        }
        Ok(())
    }

    /// Gives back the wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn operation(&self) -> Operation {
        Operation::from(be16(self.buffer.as_ref(), field::OPER))
    }

    pub fn sender_mac(&self) -> Mac {
        mac_at(self.buffer.as_ref(), field::SHA)
    }

    pub fn sender_ip(&self) -> Ipv4Addr {
        ip_at(self.buffer.as_ref(), field::SPA)
    }

    pub fn target_mac(&self) -> Mac {
        mac_at(self.buffer.as_ref(), field::THA)
    }

    pub fn target_ip(&self) -> Ipv4Addr {
        ip_at(self.buffer.as_ref(), field::TPA)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Writes the fixed Ethernet/IPv4 type and length fields.
    fn set_types(&mut self) {
        let d = self.buffer.as_mut();
        d[field::HTYPE].copy_from_slice(&HTYPE_ETHERNET.to_be_bytes());
        d[field::PTYPE].copy_from_slice(&PTYPE_IPV4.to_be_bytes());
        d[field::HLEN] = 6;
        d[field::PLEN] = 4;
    }

    pub fn set_operation(&mut self, op: Operation) {
        self.buffer.as_mut()[field::OPER].copy_from_slice(&u16::from(op).to_be_bytes());
    }

    pub fn set_sender_mac(&mut self, mac: Mac) {
        self.buffer.as_mut()[field::SHA].copy_from_slice(&mac.0);
    }

    pub fn set_sender_ip(&mut self, ip: Ipv4Addr) {
        self.buffer.as_mut()[field::SPA].copy_from_slice(&ip.octets());
    }

    pub fn set_target_mac(&mut self, mac: Mac) {
        self.buffer.as_mut()[field::THA].copy_from_slice(&mac.0);
    }

    pub fn set_target_ip(&mut self, ip: Ipv4Addr) {
        self.buffer.as_mut()[field::TPA].copy_from_slice(&ip.octets());
    }
}

/// The parsed form of an Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    pub operation: Operation,
    pub sender_mac: Mac,
    pub sender_ip: Ipv4Addr,
    pub target_mac: Mac,
    pub target_ip: Ipv4Addr,
}

impl Repr {
    /// Reads a packet; fails as `Packet::new_checked` does if the view was built unchecked.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr, Error> {
        packet.check()?;
        Ok(Repr {
            operation: packet.operation(),
            sender_mac: packet.sender_mac(),
            sender_ip: packet.sender_ip(),
            target_mac: packet.target_mac(),
            target_ip: packet.target_ip(),
        })
    }

    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        LEN
    }

    /// Writes the 28-byte packet at the start of `buf`.
    ///
    /// # Panics
    /// If `buf` is shorter than `LEN`; the caller sizes its own output buffer.
    pub fn emit(&self, buf: &mut [u8]) {
        let mut p = Packet::new_unchecked(buf);
        p.set_types();
        p.set_operation(self.operation);
        p.set_sender_mac(self.sender_mac);
        p.set_sender_ip(self.sender_ip);
        p.set_target_mac(self.target_mac);
        p.set_target_ip(self.target_ip);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // "Who has 10.0.0.2? Tell 10.0.0.1", as it appears after the Ethernet header.
    static REQUEST: [u8; 28] = [
        0x00, 0x01, // htype Ethernet
        0x08, 0x00, // ptype IPv4
        0x06, 0x04, // hlen, plen
        0x00, 0x01, // request
        0x02, 0x00, 0x00, 0x00, 0x00, 0x01, // sender MAC
        0x0a, 0x00, 0x00, 0x01, // sender IP
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // target MAC (unknown)
        0x0a, 0x00, 0x00, 0x02, // target IP
    ];

    fn request_repr() -> Repr {
        Repr {
            operation: Operation::Request,
            sender_mac: Mac([2, 0, 0, 0, 0, 1]),
            sender_ip: Ipv4Addr::new(10, 0, 0, 1),
            target_mac: Mac::ZERO,
            target_ip: Ipv4Addr::new(10, 0, 0, 2),
        }
    }

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&REQUEST[..]).unwrap();
        assert_eq!(p.operation(), Operation::Request);
        assert_eq!(p.sender_mac(), Mac([2, 0, 0, 0, 0, 1]));
        assert_eq!(p.sender_ip(), Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(p.target_mac(), Mac::ZERO);
        assert_eq!(p.target_ip(), Ipv4Addr::new(10, 0, 0, 2));
        assert_eq!(Repr::parse(&p), Ok(request_repr()));
    }

    #[test]
    fn construct() {
        let mut buf = [0xaau8; LEN];
        request_repr().emit(&mut buf);
        assert_eq!(buf, REQUEST);
    }

    #[test]
    fn construct_reply() {
        let reply = Repr {
            operation: Operation::Reply,
            sender_mac: Mac([2, 0, 0, 0, 0, 2]),
            sender_ip: Ipv4Addr::new(10, 0, 0, 2),
            target_mac: Mac([2, 0, 0, 0, 0, 1]),
            target_ip: Ipv4Addr::new(10, 0, 0, 1),
        };
        let mut buf = [0u8; LEN];
        reply.emit(&mut buf);
        assert_eq!(&buf[6..8], &[0x00, 0x02]);
        let p = Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(Repr::parse(&p), Ok(reply));
    }

    #[test]
    fn padding_is_ignored() {
        let mut buf = [0u8; 46];
        buf[..LEN].copy_from_slice(&REQUEST);
        let p = Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(Repr::parse(&p), Ok(request_repr()));
    }

    #[test]
    fn other_operation() {
        let mut buf = REQUEST;
        buf[7] = 3;
        let p = Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(p.operation(), Operation::Other(3));
        assert_eq!(u16::from(Operation::Other(3)), 3);
    }

    #[test]
    fn truncated() {
        for n in 0..LEN {
            assert_eq!(
                Packet::new_checked(&REQUEST[..n]).err(),
                Some(Error::Truncated)
            );
        }
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&REQUEST[..10])),
            Err(Error::Truncated)
        );
    }

    #[test]
    fn unsupported_types() {
        // Each of htype, ptype, hlen, plen changed in turn.
        for (i, v) in [(1, 6u8), (2, 0x86), (4, 8), (5, 16)] {
            let mut buf = REQUEST;
            buf[i] = v;
            assert_eq!(
                Packet::new_checked(&buf[..]).err(),
                Some(Error::Unsupported)
            );
        }
    }

    #[test]
    fn garbage() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut buf = [0u8; 48];
        for i in 0..4000 {
            for b in buf.iter_mut() {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                *b = (state >> 33) as u8;
            }
            // Half the buffers get a valid preamble so the accessors are reached too.
            if i % 2 == 0 {
                buf[..6].copy_from_slice(&REQUEST[..6]);
            }
            let len = (state >> 40) as usize % (buf.len() + 1);
            if let Ok(p) = Packet::new_checked(&buf[..len]) {
                assert!(len >= LEN);
                let r = Repr::parse(&p).unwrap();
                let mut out = [0u8; LEN];
                r.emit(&mut out);
                assert_eq!(out, buf[..LEN]);
            }
        }
    }
}
