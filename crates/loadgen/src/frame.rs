//! The 8-byte memcached UDP frame header and reassembly of multi-datagram replies.
//! Pure byte handling; sockets live in `worker`.

use std::fmt;

/// The frame header, as the switch reads and writes it.
pub use wire::mcudp::{Header, LEN as HEADER_LEN};

/// Largest UDP payload over IPv4; memcached takes a request in exactly one datagram.
pub const MAX_DATAGRAM: usize = 65_507;

/// Reads the frame header at the start of `datagram`.
pub fn parse_header(datagram: &[u8]) -> Result<Header, DropReason> {
    Header::parse(datagram)
        .map(|(header, _)| header)
        .map_err(|_| DropReason::Short)
}

/// Why a reply datagram was not used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// Fewer than 8 bytes.
    Short,
    /// Request id of an earlier (timed out) or foreign request.
    Stale,
    /// `total` is 0.
    ZeroTotal,
    /// `seq` is not below `total`.
    SeqOutOfRange,
    /// `total` differs from an earlier datagram of the same reply.
    TotalMismatch,
    /// This `seq` already arrived.
    Duplicate,
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            DropReason::Short => "short_datagram",
            DropReason::Stale => "stale_request_id",
            DropReason::ZeroTotal => "zero_total",
            DropReason::SeqOutOfRange => "seq_out_of_range",
            DropReason::TotalMismatch => "total_mismatch",
            DropReason::Duplicate => "duplicate_seq",
        };
        f.write_str(s)
    }
}

/// What feeding one datagram to a [`Reassembly`] produced.
#[derive(Debug, PartialEq, Eq)]
pub enum Push {
    /// Accepted; more datagrams are needed.
    Incomplete,
    /// Every datagram arrived; the payloads in `seq` order.
    Complete(Vec<u8>),
    /// Ignored, for the reason given.
    Dropped(DropReason),
}

/// Collects the datagrams of one reply, in any order, for one expected request id.
#[derive(Debug, Default)]
pub struct Reassembly {
    request_id: u16,
    total: u16,
    received: u16,
    parts: Vec<Option<Vec<u8>>>,
}

impl Reassembly {
    /// Forgets any partial reply and waits for datagrams carrying `request_id`.
    pub fn expect(&mut self, request_id: u16) {
        self.request_id = request_id;
        self.total = 0;
        self.received = 0;
        self.parts.clear();
    }

    /// Feeds one received datagram (header included).
    pub fn push(&mut self, datagram: &[u8]) -> Push {
        let h = match parse_header(datagram) {
            Ok(h) => h,
            Err(e) => return Push::Dropped(e),
        };
        if h.request_id != self.request_id {
            return Push::Dropped(DropReason::Stale);
        }
        if h.total == 0 {
            return Push::Dropped(DropReason::ZeroTotal);
        }
        if h.seq >= h.total {
            return Push::Dropped(DropReason::SeqOutOfRange);
        }
        let payload = &datagram[HEADER_LEN..];
        if self.total == 0 {
            if h.total == 1 {
                // The common case: no bookkeeping, one copy.
                return Push::Complete(payload.to_vec());
            }
            self.total = h.total;
            self.parts.resize(usize::from(h.total), None);
        } else if h.total != self.total {
            return Push::Dropped(DropReason::TotalMismatch);
        }
        let slot = &mut self.parts[usize::from(h.seq)];
        if slot.is_some() {
            return Push::Dropped(DropReason::Duplicate);
        }
        *slot = Some(payload.to_vec());
        self.received += 1;
        if self.received < self.total {
            return Push::Incomplete;
        }
        let out = self.parts.drain(..).flatten().flatten().collect();
        self.total = 0;
        self.received = 0;
        Push::Complete(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_construct() {
        let mut buf = [0xffu8; 8];
        Header::single(0x1234).emit(&mut buf);
        assert_eq!(buf, [0x12, 0x34, 0, 0, 0, 1, 0, 0]);
    }

    #[test]
    fn header_deconstruct() {
        let h =
            parse_header(&[0xab, 0xcd, 0x00, 0x02, 0x00, 0x03, 0x00, 0x00, b'x']).expect("valid");
        assert_eq!(
            h,
            Header {
                request_id: 0xabcd,
                seq: 2,
                total: 3,
                reserved: 0
            }
        );
    }

    #[test]
    fn header_too_short() {
        assert_eq!(parse_header(&[0, 1, 0, 0, 0, 1, 0]), Err(DropReason::Short));
    }

    fn datagram(id: u16, seq: u16, total: u16, payload: &[u8]) -> Vec<u8> {
        let mut d = vec![0u8; HEADER_LEN];
        Header {
            request_id: id,
            seq,
            total,
            reserved: 0,
        }
        .emit(&mut d);
        d.extend_from_slice(payload);
        d
    }

    #[test]
    fn single_datagram_reply() {
        let mut r = Reassembly::default();
        r.expect(5);
        assert_eq!(
            r.push(&datagram(5, 0, 1, b"END\r\n")),
            Push::Complete(b"END\r\n".to_vec())
        );
    }

    #[test]
    fn out_of_order_reply() {
        let mut r = Reassembly::default();
        r.expect(9);
        assert_eq!(r.push(&datagram(9, 2, 3, b"\r\nEND\r\n")), Push::Incomplete);
        assert_eq!(
            r.push(&datagram(8, 0, 1, b"END\r\n")),
            Push::Dropped(DropReason::Stale)
        );
        assert_eq!(
            r.push(&datagram(9, 0, 3, b"VALUE k 0 3\r\n")),
            Push::Incomplete
        );
        assert_eq!(
            r.push(&datagram(9, 0, 3, b"VALUE k 0 3\r\n")),
            Push::Dropped(DropReason::Duplicate)
        );
        assert_eq!(
            r.push(&datagram(9, 1, 4, b"abc")),
            Push::Dropped(DropReason::TotalMismatch)
        );
        assert_eq!(
            r.push(&datagram(9, 1, 3, b"abc")),
            Push::Complete(b"VALUE k 0 3\r\nabc\r\nEND\r\n".to_vec())
        );
    }

    #[test]
    fn impossible_headers() {
        let mut r = Reassembly::default();
        r.expect(1);
        assert_eq!(
            r.push(&datagram(1, 0, 0, b"")),
            Push::Dropped(DropReason::ZeroTotal)
        );
        assert_eq!(
            r.push(&datagram(1, 3, 3, b"")),
            Push::Dropped(DropReason::SeqOutOfRange)
        );
        assert_eq!(r.push(&[0, 1, 0]), Push::Dropped(DropReason::Short));
    }

    #[test]
    fn expect_discards_partial_reply() {
        let mut r = Reassembly::default();
        r.expect(1);
        assert_eq!(r.push(&datagram(1, 0, 2, b"a")), Push::Incomplete);
        r.expect(2);
        assert_eq!(
            r.push(&datagram(1, 1, 2, b"b")),
            Push::Dropped(DropReason::Stale)
        );
        assert_eq!(r.push(&datagram(2, 1, 2, b"d")), Push::Incomplete);
        assert_eq!(
            r.push(&datagram(2, 0, 2, b"c")),
            Push::Complete(b"cd".to_vec())
        );
    }
}
