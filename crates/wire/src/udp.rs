//! UDP datagrams (RFC 768) over IPv4: a checked view, checksum over the pseudo header, and a
//! header builder.
//!
//! The view trusts the UDP length field only after checking it against the buffer; nothing
//! here allocates or panics on input.

use std::net::Ipv4Addr;

use crate::checksum;
use crate::ipv4::Protocol;
use crate::Error;

/// Length of the UDP header.
pub const HEADER_LEN: usize = 8;

mod field {
    use core::ops::Range;

    pub const SRC_PORT: Range<usize> = 0..2;
    pub const DST_PORT: Range<usize> = 2..4;
    pub const LENGTH: Range<usize> = 4..6;
    pub const CHECKSUM: Range<usize> = 6..8;
    pub const PAYLOAD: usize = 8;
}

/// A read (and, on `AsMut` buffers, write) view of a UDP datagram.
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

    /// Wraps a buffer after checking its length; after `Ok`, no accessor panics.
    ///
    /// Fails with `Error::Truncated` if the buffer is shorter than the header or than the
    /// length field, and with `Error::Malformed` if the length field is below 8. Bytes after
    /// the length field are ignored. The checksum is not verified here.
    pub fn new_checked(buffer: T) -> Result<Packet<T>, Error> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// The checks of `new_checked`. `set_len` can invalidate them.
    pub fn check_len(&self) -> Result<(), Error> {
        let buf_len = self.buffer.as_ref().len();
        if buf_len < HEADER_LEN {
            return Err(Error::Truncated);
        }
        let len = usize::from(self.len());
        if len < HEADER_LEN {
            return Err(Error::Malformed);
        }
        if len > buf_len {
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

    pub fn src_port(&self) -> u16 {
        self.be16(field::SRC_PORT)
    }

    pub fn dst_port(&self) -> u16 {
        self.be16(field::DST_PORT)
    }

    /// The length field: header plus payload, in bytes.
    // A datagram always has a header, so an `is_empty` would have no meaning here.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u16 {
        self.be16(field::LENGTH)
    }

    pub fn checksum(&self) -> u16 {
        self.be16(field::CHECKSUM)
    }

    /// The payload: bytes after the header up to the length field.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PAYLOAD..usize::from(self.len())]
    }

    /// The checksum as it should be for this datagram between `src` and `dst`, computed with
    /// the checksum field taken as zero.
    fn compute_checksum(&self, src: Ipv4Addr, dst: Ipv4Addr) -> u16 {
        let len = self.len();
        let data = &self.buffer.as_ref()[..usize::from(len)];
        let sum = checksum::pseudo_header_v4(src, dst, Protocol::UDP.0, len)
            + checksum::sum(&data[..field::CHECKSUM.start])
            + checksum::sum(&data[field::CHECKSUM.end..]);
        match checksum::fold(sum) {
            // Zero on the wire means "no checksum", so a computed zero is sent as its
            // one's-complement twin (RFC 768).
            0 => 0xffff,
            c => c,
        }
    }

    /// True if the checksum is correct for a datagram between `src` and `dst`, or absent
    /// (zero, which IPv4 allows).
    pub fn verify_checksum(&self, src: Ipv4Addr, dst: Ipv4Addr) -> bool {
        let c = self.checksum();
        c == 0 || c == self.compute_checksum(src, dst)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn set_be16(&mut self, r: core::ops::Range<usize>, v: u16) {
        self.buffer.as_mut()[r].copy_from_slice(&v.to_be_bytes());
    }

    pub fn set_src_port(&mut self, v: u16) {
        self.set_be16(field::SRC_PORT, v)
    }

    pub fn set_dst_port(&mut self, v: u16) {
        self.set_be16(field::DST_PORT, v)
    }

    /// Sets the length field. On a checked packet, a value below 8 or beyond the buffer
    /// invalidates `new_checked`'s guarantee; it is meant for building datagrams.
    pub fn set_len(&mut self, v: u16) {
        self.set_be16(field::LENGTH, v)
    }

    pub fn set_checksum(&mut self, v: u16) {
        self.set_be16(field::CHECKSUM, v)
    }

    /// Computes and writes the checksum over the pseudo header, header and payload (up to the
    /// length field). Call it after the payload and addresses are final.
    pub fn fill_checksum(&mut self, src: Ipv4Addr, dst: Ipv4Addr) {
        let c = self.compute_checksum(src, dst);
        self.set_checksum(c);
    }

    /// Mutable payload, bytes after the header up to the length field.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = usize::from(self.len());
        &mut self.buffer.as_mut()[field::PAYLOAD..end]
    }
}

/// The parsed form of a UDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    pub src_port: u16,
    pub dst_port: u16,
    /// Bytes after the header: length field − 8.
    pub payload_len: u16,
}

impl Repr {
    /// Reads a datagram sent from `src` to `dst`.
    ///
    /// Fails as `Packet::check_len` does, and with `Error::BadChecksum` if a checksum is
    /// present and wrong.
    pub fn parse<T: AsRef<[u8]>>(
        packet: &Packet<T>,
        src: Ipv4Addr,
        dst: Ipv4Addr,
    ) -> Result<Repr, Error> {
        packet.check_len()?;
        if !packet.verify_checksum(src, dst) {
            return Err(Error::BadChecksum);
        }
        Ok(Repr {
            src_port: packet.src_port(),
            dst_port: packet.dst_port(),
            payload_len: packet.len() - HEADER_LEN as u16,
        })
    }

    /// Bytes `emit` writes (the header only).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the 8-byte header at the start of `buf` with a zero ("none") checksum.
    ///
    /// Once the payload is in place, call `Packet::fill_checksum` on the datagram to add one.
    ///
    /// # Panics
    /// If `buf` is shorter than `HEADER_LEN`, or if `payload_len` exceeds 65 535 − `HEADER_LEN`;
    /// both are the caller's sizing errors, never input.
    pub fn emit(&self, buf: &mut [u8]) {
        let len = (HEADER_LEN as u16)
            .checked_add(self.payload_len)
            .expect("UDP length must fit in 16 bits");
        let mut p = Packet::new_unchecked(&mut buf[..HEADER_LEN]);
        p.set_src_port(self.src_port);
        p.set_dst_port(self.dst_port);
        p.set_len(len);
        p.set_checksum(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const DST: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    // A memcached UDP request "get foo\r\n" from 10.0.0.1:40000 to 10.0.0.2:11211.
    static DATAGRAM: [u8; 25] = [
        0x9c, 0x40, // src port 40000
        0x2b, 0xcb, // dst port 11211
        0x00, 0x19, // length 25
        0x68, 0xa9, // checksum
        0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, // memcached frame header
        b'g', b'e', b't', b' ', b'f', b'o', b'o', b'\r', b'\n',
    ];

    fn repr() -> Repr {
        Repr {
            src_port: 40000,
            dst_port: 11211,
            payload_len: 17,
        }
    }

    fn lcg(state: &mut u64) -> u64 {
        *state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *state >> 33
    }

    #[test]
    fn checksum_by_hand() {
        // Pseudo header: 0a00 0001 0a00 0002 0011 0019
        // Header without checksum: 9c40 2bcb 0019
        // Payload: 0001 0000 0001 0000 6765 7420 666f 6f0d 0a00
        let words: [u32; 19] = [
            0x0a00, 0x0001, 0x0a00, 0x0002, 0x0011, 0x0019, 0x9c40, 0x2bcb, 0x0019, 0x0001, 0x0000,
            0x0001, 0x0000, 0x6765, 0x7420, 0x666f, 0x6f0d, 0x0a00, 0,
        ];
        let total: u32 = words.iter().sum();
        // 0x29754 folds to 0x9756, whose complement is 0x68a9.
        assert_eq!(total, 0x2_9754);
        assert_eq!(checksum::fold(total), 0x68a9);
    }

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&DATAGRAM[..]).unwrap();
        assert_eq!(p.src_port(), 40000);
        assert_eq!(p.dst_port(), 11211);
        assert_eq!(p.len(), 25);
        assert_eq!(p.checksum(), 0x68a9);
        assert_eq!(p.payload(), &DATAGRAM[8..]);
        assert!(p.verify_checksum(SRC, DST));
        assert!(!p.verify_checksum(DST, Ipv4Addr::new(10, 0, 0, 3)));
        assert_eq!(Repr::parse(&p, SRC, DST), Ok(repr()));
    }

    #[test]
    fn construct() {
        let mut buf = [0xaau8; 25];
        repr().emit(&mut buf);
        assert_eq!(&buf[..8], &[0x9c, 0x40, 0x2b, 0xcb, 0x00, 0x19, 0x00, 0x00]);
        let mut p = Packet::new_checked(&mut buf[..]).unwrap();
        p.payload_mut().copy_from_slice(&DATAGRAM[8..]);
        p.fill_checksum(SRC, DST);
        assert_eq!(buf, DATAGRAM);
    }

    #[test]
    fn zero_checksum_means_none() {
        let mut buf = DATAGRAM;
        buf[6] = 0;
        buf[7] = 0;
        let p = Packet::new_checked(&buf[..]).unwrap();
        assert!(p.verify_checksum(SRC, DST));
        assert!(p.verify_checksum(DST, DST));
    }

    #[test]
    fn computed_zero_is_sent_as_ffff() {
        // Choose the source port so that the one's-complement sum is 0xffff, i.e. the
        // complement is 0: the sum of everything else plus the port must be 0xffff.
        let mut buf = [0u8; 8];
        Repr {
            src_port: 0,
            dst_port: 0,
            payload_len: 0,
        }
        .emit(&mut buf);
        let rest = checksum::pseudo_header_v4(SRC, DST, 17, 8) + checksum::sum(&buf);
        let port = 0xffff - (rest % 0xffff);
        let mut p = Packet::new_checked(&mut buf[..]).unwrap();
        p.set_src_port(port as u16);
        p.fill_checksum(SRC, DST);
        assert_eq!(p.checksum(), 0xffff);
        assert!(p.verify_checksum(SRC, DST));
    }

    #[test]
    fn bad_checksum() {
        let mut buf = DATAGRAM;
        buf[20] ^= 0x20; // "foo" -> "fOo"
        let p = Packet::new_checked(&buf[..]).unwrap();
        assert!(!p.verify_checksum(SRC, DST));
        assert_eq!(Repr::parse(&p, SRC, DST), Err(Error::BadChecksum));
    }

    #[test]
    fn trailing_bytes_are_ignored() {
        let mut buf = [0u8; 40];
        buf[..25].copy_from_slice(&DATAGRAM);
        buf[25..].fill(0x5a);
        let p = Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(p.payload(), &DATAGRAM[8..]);
        assert!(p.verify_checksum(SRC, DST));
    }

    #[test]
    fn truncated() {
        for n in 0..DATAGRAM.len() {
            assert_eq!(
                Packet::new_checked(&DATAGRAM[..n]).err(),
                Some(Error::Truncated),
                "{n}"
            );
        }
    }

    #[test]
    fn length_below_header() {
        for l in 0..8u8 {
            let mut buf = DATAGRAM;
            buf[4] = 0;
            buf[5] = l;
            assert_eq!(Packet::new_checked(&buf[..]).err(), Some(Error::Malformed));
        }
    }

    #[test]
    fn garbage() {
        let mut state = 0xdead_beef_cafe_f00du64;
        let mut buf = [0u8; 80];
        for i in 0..5000 {
            for b in buf.iter_mut() {
                *b = lcg(&mut state) as u8;
            }
            if i % 2 == 0 {
                buf[4] = 0; // plausible lengths
            }
            let len = lcg(&mut state) as usize % (buf.len() + 1);
            if let Ok(p) = Packet::new_checked(&buf[..len]) {
                assert_eq!(p.payload().len() + HEADER_LEN, usize::from(p.len()));
                let _ = (p.src_port(), p.dst_port(), p.checksum());
                let _ = Repr::parse(&p, SRC, DST);
                let mut copy = buf;
                let mut q = Packet::new_checked(&mut copy[..len]).unwrap();
                q.fill_checksum(SRC, DST);
                assert!(q.verify_checksum(SRC, DST));
                assert_ne!(q.checksum(), 0);
            }
        }
    }
}
