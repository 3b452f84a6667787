//! The internet checksum (RFC 1071) used by the IPv4 header and UDP.
//!
//! Sums are kept unfolded so that several pieces (pseudo header, header, payload) can be added
//! before a single `fold`; nothing here allocates or panics.

use std::net::Ipv4Addr;

/// One's-complement sum of `data` read as big-endian 16-bit words.
///
/// An odd final byte is padded with a zero low byte, as RFC 1071 specifies. Any length is
/// accepted. The result is folded to at most `0xffff` (but not complemented), so callers may add
/// up to 65 537 such sums in a `u32` without overflow before calling [`fold`].
pub fn sum(data: &[u8]) -> u32 {
    let mut acc: u64 = 0;
    let mut words = data.chunks_exact(2);
    for w in &mut words {
        acc += u64::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        acc += u64::from(*last) << 8;
    }
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    // `acc` is now at most 0xffff, so the conversion is lossless.
    acc as u32
}

/// Folds the carries of an accumulated sum into 16 bits and complements it.
///
/// The result is the value to write in a checksum field; when the summed data already contains
/// a correct checksum the result is 0.
pub fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Sum of the IPv4 pseudo header that UDP and TCP checksums cover (RFC 768).
///
/// `length` is the transport length (UDP header plus payload), not the IP total length.
pub fn pseudo_header_v4(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, length: u16) -> u32 {
    let s = src.octets();
    let d = dst.octets();
    sum(&s) + sum(&d) + u32::from(protocol) + u32::from(length)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc1071_example() {
        // RFC 1071 section 3: the words 0001 f203 f4f5 f6f7 sum to ddf2 (after folding).
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(sum(&data), 0xddf2);
        assert_eq!(fold(sum(&data)), !0xddf2);
    }

    #[test]
    fn odd_length_pads_low_byte() {
        assert_eq!(sum(&[0xab]), 0xab00);
        assert_eq!(sum(&[0x12, 0x34, 0x56]), 0x1234 + 0x5600);
    }

    #[test]
    fn empty_and_zero() {
        assert_eq!(sum(&[]), 0);
        assert_eq!(fold(0), 0xffff);
        assert_eq!(fold(0xffff), 0);
    }

    #[test]
    fn fold_carries() {
        assert_eq!(fold(0x0001_fffe), !0xffffu16);
        assert_eq!(fold(0x0002_0000), !0x0002u16);
        assert_eq!(fold(u32::MAX), !0xffffu16);
    }

    #[test]
    fn large_buffer_does_not_overflow() {
        let data = [0xffu8; 200_000];
        assert_eq!(sum(&data), 0xffff);
    }

    #[test]
    fn known_ipv4_header() {
        // The classic example header: its checksum field holds b861, so the total folds to 0.
        let hdr = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(fold(sum(&hdr)), 0);
        let mut zeroed = hdr;
        zeroed[10] = 0;
        zeroed[11] = 0;
        assert_eq!(fold(sum(&zeroed)), 0xb861);
    }

    #[test]
    fn pseudo_header_sum() {
        let s = pseudo_header_v4(
            Ipv4Addr::new(192, 168, 0, 1),
            Ipv4Addr::new(192, 168, 0, 199),
            17,
            0x5f,
        );
        assert_eq!(s, 0xc0a8 + 0x0001 + 0xc0a8 + 0x00c7 + 17 + 0x5f);
    }
}
