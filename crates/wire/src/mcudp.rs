//! The 8-byte frame header memcached puts at the start of every UDP datagram.
//!
//! Requests fit in one datagram; replies longer than `MAX_PAYLOAD` span several, each with its
//! own header. This module reads and writes the header only, never the memcached payload.

use crate::Error;

/// Length of the frame header.
pub const LEN: usize = 8;

/// memcached's `UDP_MAX_PAYLOAD_SIZE`: the reply bytes kvswitch puts in one datagram.
///
/// Replies longer than this are split into several datagrams with sequence numbers
/// `0..total`. Clients join the pieces by sequence number, so split points need not match
/// memcached's byte for byte.
pub const MAX_PAYLOAD: usize = 1400;

mod field {
    use core::ops::Range;

    pub const REQUEST_ID: Range<usize> = 0..2;
    pub const SEQ: Range<usize> = 2..4;
    pub const TOTAL: Range<usize> = 4..6;
    pub const RESERVED: Range<usize> = 6..8;
}

/// A memcached UDP frame header; all fields are big-endian on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Header {
    /// Chosen by the client and echoed in every datagram of the reply.
    pub request_id: u16,
    /// Index of this datagram within the message, `0..total`.
    pub seq: u16,
    /// Number of datagrams in the message.
    pub total: u16,
    /// Reserved; the protocol says it must be 0.
    pub reserved: u16,
}

fn be16(buf: &[u8], r: core::ops::Range<usize>) -> u16 {
    let d = &buf[r];
    u16::from_be_bytes([d[0], d[1]])
}

impl Header {
    /// The header of a single-datagram request (or reply): seq 0, total 1.
    pub const fn single(request_id: u16) -> Header {
        Header {
            request_id,
            seq: 0,
            total: 1,
            reserved: 0,
        }
    }

    /// Splits a datagram into its frame header and the memcached bytes after it.
    ///
    /// Fails only with `Error::Truncated` when `buf` is shorter than `LEN`; field values are
    /// not judged here (see `is_valid_request`), so replies and requests parse alike. An empty
    /// payload is returned as an empty slice.
    pub fn parse(buf: &[u8]) -> Result<(Header, &[u8]), Error> {
        if buf.len() < LEN {
            return Err(Error::Truncated);
        }
        let header = Header {
            request_id: be16(buf, field::REQUEST_ID),
            seq: be16(buf, field::SEQ),
            total: be16(buf, field::TOTAL),
            reserved: be16(buf, field::RESERVED),
        };
        Ok((header, &buf[LEN..]))
    }

    /// True if memcached would take this header as a request: it drops any request that
    /// claims more than one datagram, and the protocol requires the reserved field to be 0.
    pub fn is_valid_request(&self) -> bool {
        self.total == 1 && self.reserved == 0
    }

    /// Writes the header at the start of `buf`, leaving the rest untouched.
    ///
    /// # Panics
    /// If `buf` is shorter than `LEN`; the caller sizes its own output buffer.
    pub fn emit(&self, buf: &mut [u8]) {
        buf[field::REQUEST_ID].copy_from_slice(&self.request_id.to_be_bytes());
        buf[field::SEQ].copy_from_slice(&self.seq.to_be_bytes());
        buf[field::TOTAL].copy_from_slice(&self.total.to_be_bytes());
        buf[field::RESERVED].copy_from_slice(&self.reserved.to_be_bytes());
    }
}

/// Number of datagrams needed to carry a reply of `reply_len` bytes, `MAX_PAYLOAD` per
/// datagram; an empty reply still takes one. The caller must check the result fits the
/// 16-bit `total` field (replies up to about 91 MB do).
pub const fn datagram_count(reply_len: usize) -> usize {
    if reply_len == 0 {
        1
    } else {
        reply_len.div_ceil(MAX_PAYLOAD)
    }
}

/// The datagrams of one message as memcached sends it: pieces of at most `MAX_PAYLOAD`
/// bytes, each with its header (`seq` 0..`total`); an empty message is one empty datagram.
/// `None` if the message needs more datagrams than the 16-bit `total` field can count.
pub fn pieces(request_id: u16, message: &[u8]) -> Option<impl Iterator<Item = (Header, &[u8])>> {
    let total = u16::try_from(datagram_count(message.len())).ok()?;
    let empty: Option<&[u8]> = message.is_empty().then_some(&[]);
    Some(
        empty
            .into_iter()
            .chain(message.chunks(MAX_PAYLOAD))
            .enumerate()
            .map(move |(seq, piece)| {
                let header = Header {
                    request_id,
                    seq: seq as u16,
                    total,
                    reserved: 0,
                };
                (header, piece)
            }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    // The UDP payload of a client's "get foo" with request id 0x1234.
    static REQUEST: [u8; 17] = [
        0x12, 0x34, // request id
        0x00, 0x00, // seq 0
        0x00, 0x01, // total 1
        0x00, 0x00, // reserved
        b'g', b'e', b't', b' ', b'f', b'o', b'o', b'\r', b'\n',
    ];

    fn lcg(state: &mut u64) -> u64 {
        *state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *state >> 33
    }

    #[test]
    fn deconstruct() {
        let (h, payload) = Header::parse(&REQUEST).unwrap();
        assert_eq!(
            h,
            Header {
                request_id: 0x1234,
                seq: 0,
                total: 1,
                reserved: 0
            }
        );
        assert_eq!(payload, b"get foo\r\n");
        assert!(h.is_valid_request());
    }

    #[test]
    fn construct() {
        let mut buf = [0u8; 17];
        Header::single(0x1234).emit(&mut buf);
        buf[LEN..].copy_from_slice(b"get foo\r\n");
        assert_eq!(buf, REQUEST);
    }

    #[test]
    fn construct_reply_piece() {
        let h = Header {
            request_id: 0xbeef,
            seq: 2,
            total: 3,
            reserved: 0,
        };
        let mut buf = [0xffu8; LEN];
        h.emit(&mut buf);
        assert_eq!(buf, [0xbe, 0xef, 0x00, 0x02, 0x00, 0x03, 0x00, 0x00]);
        assert_eq!(Header::parse(&buf), Ok((h, &[][..])));
        assert!(!h.is_valid_request());
    }

    #[test]
    fn invalid_requests() {
        let multi = Header {
            total: 2,
            ..Header::single(1)
        };
        let reserved = Header {
            reserved: 1,
            ..Header::single(1)
        };
        assert!(!multi.is_valid_request());
        assert!(!reserved.is_valid_request());
    }

    #[test]
    fn truncated() {
        for n in 0..LEN {
            assert_eq!(Header::parse(&REQUEST[..n]), Err(Error::Truncated));
        }
        assert_eq!(Header::parse(&REQUEST[..LEN]).unwrap().1, &[] as &[u8]);
    }

    #[test]
    fn garbage_round_trips() {
        let mut state = 42u64;
        let mut buf = [0u8; 32];
        for _ in 0..4000 {
            for b in buf.iter_mut() {
                *b = lcg(&mut state) as u8;
            }
            let len = lcg(&mut state) as usize % (buf.len() + 1);
            match Header::parse(&buf[..len]) {
                Ok((h, payload)) => {
                    assert_eq!(payload.len(), len - LEN);
                    let mut out = [0u8; LEN];
                    h.emit(&mut out);
                    assert_eq!(out, buf[..LEN]);
                }
                Err(e) => {
                    assert!(len < LEN);
                    assert_eq!(e, Error::Truncated);
                }
            }
        }
    }

    #[test]
    fn message_pieces() {
        let one: Vec<_> = pieces(9, b"").unwrap().collect();
        assert_eq!(one, vec![(Header::single(9), &b""[..])]);
        let message = [7u8; MAX_PAYLOAD + 5];
        let parts: Vec<_> = pieces(3, &message).unwrap().collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(
            (parts[0].0.seq, parts[0].0.total, parts[0].1.len()),
            (0, 2, MAX_PAYLOAD)
        );
        assert_eq!(
            (parts[1].0.seq, parts[1].0.total, parts[1].1.len()),
            (1, 2, 5)
        );
        assert!(parts
            .iter()
            .all(|(h, _)| h.request_id == 3 && h.reserved == 0));
    }

    #[test]
    fn counting_datagrams() {
        assert_eq!(datagram_count(0), 1);
        assert_eq!(datagram_count(1), 1);
        assert_eq!(datagram_count(MAX_PAYLOAD), 1);
        assert_eq!(datagram_count(MAX_PAYLOAD + 1), 2);
        assert_eq!(datagram_count(3 * MAX_PAYLOAD), 3);
    }
}
