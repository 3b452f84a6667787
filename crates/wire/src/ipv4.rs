//! IPv4 headers (RFC 791): a checked view of received packets and a builder for the plain
//! 20-byte headers kvswitch sends.
//!
//! Options are skipped, never interpreted; fragments are visible through `is_fragment` but
//! never reassembled. Nothing here allocates or panics on input.

use core::fmt;
use std::net::Ipv4Addr;

use crate::checksum;
use crate::Error;

/// Length of a header without options, the minimum and the only length `Repr::emit` writes.
pub const HEADER_LEN: usize = 20;

/// The default TTL for packets kvswitch originates (Linux's default).
pub const DEFAULT_TTL: u8 = 64;

/// The IPv4 protocol field: which transport the payload carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Protocol(pub u8);

impl Protocol {
    pub const ICMP: Protocol = Protocol(1);
    pub const TCP: Protocol = Protocol(6);
    pub const UDP: Protocol = Protocol(17);
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Protocol::ICMP => f.write_str("ICMP"),
            Protocol::TCP => f.write_str("TCP"),
            Protocol::UDP => f.write_str("UDP"),
            Protocol(other) => write!(f, "{other}"),
        }
    }
}

mod field {
    use core::ops::Range;

    pub const VER_IHL: usize = 0;
    pub const DSCP_ECN: usize = 1;
    pub const LENGTH: Range<usize> = 2..4;
    pub const IDENT: Range<usize> = 4..6;
    pub const FLG_OFF: Range<usize> = 6..8;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: Range<usize> = 10..12;
    pub const SRC: Range<usize> = 12..16;
    pub const DST: Range<usize> = 16..20;
}

const FLAG_DF: u16 = 0x4000;
const FLAG_MF: u16 = 0x2000;
const OFFSET_MASK: u16 = 0x1fff;

/// A read (and, on `AsMut` buffers, write) view of an IPv4 packet.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking it; accessors may panic unless the caller sized and
    /// filled the buffer itself (e.g. right after `Repr::emit`).
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer after checking its lengths; after `Ok`, no accessor panics.
    ///
    /// Fails with `Error::Truncated` if the buffer is shorter than the minimum header, the
    /// header length or the total length; with `Error::Malformed` if the version is not 4, the
    /// IHL is below 5, or the total length is below the header length. Bytes after the total
    /// length (Ethernet padding) are allowed and ignored. The checksum is not verified here.
    pub fn new_checked(buffer: T) -> Result<Packet<T>, Error> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// The checks of `new_checked`. Setters never change the fields checked here.
    pub fn check_len(&self) -> Result<(), Error> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(Error::Truncated);
        }
        if self.version() != 4 {
            return Err(Error::Malformed);
        }
        let header_len = self.header_len();
        if header_len < HEADER_LEN {
            return Err(Error::Malformed);
        }
        if header_len > len {
            return Err(Error::Truncated);
        }
        let total_len = usize::from(self.total_len());
        if total_len < header_len {
            return Err(Error::Malformed);
        }
        if total_len > len {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// Gives back the wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn be16(&self, r: core::ops::Range<usize>) -> u16 {
        let d = &self.buffer.as_ref()[r];
        u16::from_be_bytes([d[0], d[1]])
    }

    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_IHL] >> 4
    }

    /// Header length in bytes (IHL × 4), options included.
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::VER_IHL] & 0x0f) * 4
    }

    pub fn dscp_ecn(&self) -> u8 {
        self.buffer.as_ref()[field::DSCP_ECN]
    }

    /// The total length field: header plus payload, in bytes.
    pub fn total_len(&self) -> u16 {
        self.be16(field::LENGTH)
    }

    pub fn ident(&self) -> u16 {
        self.be16(field::IDENT)
    }

    pub fn dont_frag(&self) -> bool {
        self.be16(field::FLG_OFF) & FLAG_DF != 0
    }

    pub fn more_frags(&self) -> bool {
        self.be16(field::FLG_OFF) & FLAG_MF != 0
    }

    /// Fragment offset in bytes (the field counts 8-byte units).
    pub fn frag_offset(&self) -> u16 {
        (self.be16(field::FLG_OFF) & OFFSET_MASK) << 3
    }

    /// True for any piece of a fragmented datagram: more fragments follow, or this is not the
    /// first piece.
    pub fn is_fragment(&self) -> bool {
        self.more_frags() || self.frag_offset() != 0
    }

    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }

    pub fn protocol(&self) -> Protocol {
        Protocol(self.buffer.as_ref()[field::PROTOCOL])
    }

    pub fn checksum(&self) -> u16 {
        self.be16(field::CHECKSUM)
    }

    pub fn src(&self) -> Ipv4Addr {
        let d = &self.buffer.as_ref()[field::SRC];
        Ipv4Addr::new(d[0], d[1], d[2], d[3])
    }

    pub fn dst(&self) -> Ipv4Addr {
        let d = &self.buffer.as_ref()[field::DST];
        Ipv4Addr::new(d[0], d[1], d[2], d[3])
    }

    /// True if the header checksum (options included) is correct.
    pub fn verify_checksum(&self) -> bool {
        let header = &self.buffer.as_ref()[..self.header_len()];
        checksum::fold(checksum::sum(header)) == 0
    }

    /// The payload: bytes from the end of the header up to the total length, padding excluded.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..usize::from(self.total_len())]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn set_be16(&mut self, r: core::ops::Range<usize>, v: u16) {
        self.buffer.as_mut()[r].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets version 4 and the header length; `header_len` must be a multiple of 4 in 20..=60.
    /// Changing it on a checked packet invalidates `new_checked`'s guarantee.
    fn set_version_and_header_len(&mut self, header_len: usize) {
        self.buffer.as_mut()[field::VER_IHL] = 0x40 | ((header_len / 4) as u8 & 0x0f);
    }

    /// Sets the total length. Changing it on a checked packet invalidates `new_checked`'s
    /// guarantee, so this is only for building packets.
    fn set_total_len(&mut self, v: u16) {
        self.set_be16(field::LENGTH, v)
    }

    pub fn set_dscp_ecn(&mut self, v: u8) {
        self.buffer.as_mut()[field::DSCP_ECN] = v;
    }

    pub fn set_ident(&mut self, v: u16) {
        self.set_be16(field::IDENT, v)
    }

    /// Writes the flags and fragment offset field: only DF (if asked), MF clear, offset 0.
    pub fn set_unfragmented(&mut self, dont_frag: bool) {
        self.set_be16(field::FLG_OFF, if dont_frag { FLAG_DF } else { 0 })
    }

    pub fn set_ttl(&mut self, v: u8) {
        self.buffer.as_mut()[field::TTL] = v;
    }

    pub fn set_protocol(&mut self, v: Protocol) {
        self.buffer.as_mut()[field::PROTOCOL] = v.0;
    }

    pub fn set_checksum(&mut self, v: u16) {
        self.set_be16(field::CHECKSUM, v)
    }

    pub fn set_src(&mut self, ip: Ipv4Addr) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(&ip.octets());
    }

    pub fn set_dst(&mut self, ip: Ipv4Addr) {
        self.buffer.as_mut()[field::DST].copy_from_slice(&ip.octets());
    }

    /// Recomputes the header checksum; call it after the last header change.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let header_len = self.header_len();
        let sum = checksum::sum(&self.buffer.as_ref()[..header_len]);
        self.set_checksum(checksum::fold(sum));
    }

    /// Mutable payload, bytes from the end of the header up to the total length.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let range = self.header_len()..usize::from(self.total_len());
        &mut self.buffer.as_mut()[range]
    }
}

/// The parsed form of an unfragmented IPv4 header, and what kvswitch needs to build one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub protocol: Protocol,
    /// Bytes after the header (options are not counted in either): total length − header
    /// length.
    pub payload_len: u16,
    pub ttl: u8,
}

impl Repr {
    /// Reads a packet, verifying it as a whole.
    ///
    /// Fails as `Packet::check_len` does, with `Error::BadChecksum` if the header checksum is
    /// wrong and with `Error::Unsupported` for fragments (kvswitch never reassembles).
    /// Options are skipped.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr, Error> {
        packet.check_len()?;
        if !packet.verify_checksum() {
            return Err(Error::BadChecksum);
        }
        if packet.is_fragment() {
            return Err(Error::Unsupported);
        }
        Ok(Repr {
            src: packet.src(),
            dst: packet.dst(),
            protocol: packet.protocol(),
            payload_len: packet.total_len() - packet.header_len() as u16,
            ttl: packet.ttl(),
        })
    }

    /// Bytes `emit` writes (the header only).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes a 20-byte header at the start of `buf`: no options, DSCP/ECN 0, ident 0, DF set,
    /// and a correct checksum. The payload is left for the caller to write after it.
    ///
    /// # Panics
    /// If `buf` is shorter than `HEADER_LEN`, or if `payload_len` exceeds 65 535 − `HEADER_LEN`;
    /// both are the caller's sizing errors, never input.
    pub fn emit(&self, buf: &mut [u8]) {
        let total_len = (HEADER_LEN as u16)
            .checked_add(self.payload_len)
            .expect("IPv4 total length must fit in 16 bits");
        let mut p = Packet::new_unchecked(&mut buf[..HEADER_LEN]);
        p.set_version_and_header_len(HEADER_LEN);
        p.set_dscp_ecn(0);
        p.set_total_len(total_len);
        p.set_ident(0);
        p.set_unfragmented(true);
        p.set_ttl(self.ttl);
        p.set_protocol(self.protocol);
        p.set_src(self.src);
        p.set_dst(self.dst);
        p.fill_checksum();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The classic example header (checksum b861) followed by its 95-byte payload.
    static HEADER: [u8; 20] = [
        0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8, 0x00,
        0x01, 0xc0, 0xa8, 0x00, 0xc7,
    ];

    fn packet() -> [u8; 0x73] {
        let mut buf = [0u8; 0x73];
        buf[..20].copy_from_slice(&HEADER);
        for (i, b) in buf[20..].iter_mut().enumerate() {
            *b = i as u8;
        }
        buf
    }

    fn repr() -> Repr {
        Repr {
            src: Ipv4Addr::new(192, 168, 0, 1),
            dst: Ipv4Addr::new(192, 168, 0, 199),
            protocol: Protocol::UDP,
            payload_len: 0x73 - 20,
            ttl: 64,
        }
    }

    fn lcg(state: &mut u64) -> u64 {
        *state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *state >> 33
    }

    #[test]
    fn deconstruct() {
        let buf = packet();
        let p = Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(p.version(), 4);
        assert_eq!(p.header_len(), 20);
        assert_eq!(p.dscp_ecn(), 0);
        assert_eq!(p.total_len(), 0x73);
        assert_eq!(p.ident(), 0);
        assert!(p.dont_frag());
        assert!(!p.more_frags());
        assert_eq!(p.frag_offset(), 0);
        assert!(!p.is_fragment());
        assert_eq!(p.ttl(), 64);
        assert_eq!(p.protocol(), Protocol::UDP);
        assert_eq!(p.checksum(), 0xb861);
        assert_eq!(p.src(), Ipv4Addr::new(192, 168, 0, 1));
        assert_eq!(p.dst(), Ipv4Addr::new(192, 168, 0, 199));
        assert!(p.verify_checksum());
        assert_eq!(p.payload(), &buf[20..]);
        assert_eq!(Repr::parse(&p), Ok(repr()));
    }

    #[test]
    fn construct() {
        let mut buf = [0xffu8; 20];
        repr().emit(&mut buf);
        assert_eq!(buf, HEADER);
    }

    #[test]
    fn fill_checksum_known_value() {
        let mut buf = packet();
        let mut p = Packet::new_checked(&mut buf[..]).unwrap();
        p.set_checksum(0);
        assert!(!p.verify_checksum());
        p.fill_checksum();
        assert_eq!(p.checksum(), 0xb861);
        assert!(p.verify_checksum());
    }

    #[test]
    fn bad_checksum() {
        let mut buf = packet();
        buf[11] ^= 1;
        let p = Packet::new_checked(&buf[..]).unwrap();
        assert!(!p.verify_checksum());
        assert_eq!(Repr::parse(&p), Err(Error::BadChecksum));
    }

    #[test]
    fn setters_rewrite_and_checksum() {
        let mut buf = packet();
        let mut p = Packet::new_checked(&mut buf[..]).unwrap();
        p.set_src(Ipv4Addr::new(10, 0, 0, 1));
        p.set_dst(Ipv4Addr::new(10, 0, 0, 2));
        p.set_ttl(63);
        p.fill_checksum();
        p.payload_mut()[0] = 0xee;
        let p = Packet::new_checked(&buf[..]).unwrap();
        assert!(p.verify_checksum());
        assert_eq!(p.src(), Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(p.dst(), Ipv4Addr::new(10, 0, 0, 2));
        assert_eq!(p.ttl(), 63);
        assert_eq!(p.payload()[0], 0xee);
    }

    #[test]
    fn padding_after_total_len_is_ignored() {
        let mut buf = [0u8; 60];
        repr_small().emit(&mut buf);
        buf[20..26].copy_from_slice(b"abcdef");
        let p = Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(p.payload(), b"abcdef");
        assert_eq!(Repr::parse(&p), Ok(repr_small()));
    }

    fn repr_small() -> Repr {
        Repr {
            payload_len: 6,
            ..repr()
        }
    }

    #[test]
    fn options_are_skipped() {
        // IHL 6: one 4-byte option (four NOPs) before a 2-byte payload.
        let mut buf = [0u8; 26];
        buf[..20].copy_from_slice(&HEADER);
        buf[0] = 0x46;
        buf[2..4].copy_from_slice(&26u16.to_be_bytes());
        buf[20..24].copy_from_slice(&[1, 1, 1, 1]);
        buf[24..26].copy_from_slice(b"hi");
        let mut p = Packet::new_checked(&mut buf[..]).unwrap();
        p.fill_checksum();
        assert_eq!(p.header_len(), 24);
        assert_eq!(p.payload(), b"hi");
        let r = Repr::parse(&p).unwrap();
        assert_eq!(r.payload_len, 2);
        for n in 0..26 {
            assert!(Packet::new_checked(&buf[..n]).is_err());
        }
    }

    #[test]
    fn fragments() {
        let mut buf = packet();
        // MF set, offset 0: the first fragment.
        buf[6] = 0x20;
        let mut p = Packet::new_checked(&mut buf[..]).unwrap();
        p.fill_checksum();
        assert!(p.more_frags() && p.is_fragment());
        assert_eq!(Repr::parse(&p), Err(Error::Unsupported));
        // MF clear, offset 185 units: the last fragment.
        buf[6] = 0x00;
        buf[7] = 0xb9;
        let p = Packet::new_checked(&buf[..]).unwrap();
        assert!(!p.more_frags() && !p.dont_frag());
        assert_eq!(p.frag_offset(), 185 * 8);
        assert!(p.is_fragment());
    }

    #[test]
    fn truncated() {
        let buf = packet();
        for n in 0..buf.len() {
            assert_eq!(
                Packet::new_checked(&buf[..n]).err(),
                Some(Error::Truncated),
                "{n}"
            );
        }
    }

    #[test]
    fn malformed() {
        let cases: [(usize, u8, Error); 4] = [
            (0, 0x65, Error::Malformed), // version 6
            (0, 0x44, Error::Malformed), // IHL 4
            (0, 0x4f, Error::Malformed), // IHL 15: 60 > total length 20
            (3, 0x13, Error::Malformed), // total length 19 < header
        ];
        for (i, v, e) in cases {
            let mut buf = [0u8; 64];
            buf[..20].copy_from_slice(&HEADER);
            buf[2..4].copy_from_slice(&20u16.to_be_bytes());
            buf[i] = v;
            assert_eq!(Packet::new_checked(&buf[..]).err(), Some(e), "{i} {v:#x}");
        }
        // IHL 15 on a 40-byte buffer: the header itself does not fit.
        let mut buf = [0u8; 40];
        buf[..20].copy_from_slice(&HEADER);
        buf[0] = 0x4f;
        assert_eq!(Packet::new_checked(&buf[..]).err(), Some(Error::Truncated));
    }

    #[test]
    fn garbage() {
        let mut state = 0x0123_4567_89ab_cdefu64;
        let mut buf = [0u8; 96];
        for i in 0..5000 {
            for b in buf.iter_mut() {
                *b = lcg(&mut state) as u8;
            }
            // Make most buffers look like IPv4 so the length checks are exercised.
            if i % 4 != 0 {
                buf[0] = 0x40 | (buf[0] & 0x0f);
                buf[2] = 0;
            }
            let len = lcg(&mut state) as usize % (buf.len() + 1);
            if let Ok(p) = Packet::new_checked(&buf[..len]) {
                assert!(p.header_len() >= HEADER_LEN && p.header_len() <= len);
                assert!(p.payload().len() + p.header_len() == usize::from(p.total_len()));
                let _ = (
                    p.ident(),
                    p.is_fragment(),
                    p.src(),
                    p.dst(),
                    p.verify_checksum(),
                );
                let _ = Repr::parse(&p);
            }
        }
    }
}
