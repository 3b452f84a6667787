//! The slice of the memcached binary protocol the load generator speaks: `GET` and `SET`
//! requests with the 24-byte header, and deciding when a reply is complete and what it was.
//! No I/O; the caller owns the buffers.

use crate::text::{write_key, Op, Outcome};

/// Length of the fixed header of every request and response.
pub const HEADER_LEN: usize = 24;
/// First byte of a request.
pub const MAGIC_REQUEST: u8 = 0x80;
/// First byte of a response.
pub const MAGIC_RESPONSE: u8 = 0x81;
/// Opcodes (`protocol_binary_command` in memcached).
pub const OP_GET: u8 = 0x00;
pub const OP_SET: u8 = 0x01;
/// Response statuses; anything else is an error reply.
pub const STATUS_OK: u16 = 0x0000;
pub const STATUS_KEY_NOT_FOUND: u16 = 0x0001;
/// Extras of a SET: 4 bytes of flags, 4 bytes of expiry.
const SET_EXTRAS: usize = 8;
/// Largest response body accepted before the stream is declared garbage; memcached's largest
/// item is 1 MiB by default and 1 GiB at most.
pub const MAX_BODY: usize = 1 << 30;

/// Bytes a request adds around its key and value.
pub const fn overhead(op: Op) -> usize {
    match op {
        Op::Get => HEADER_LEN,
        Op::Set => HEADER_LEN + SET_EXTRAS,
    }
}

mod field {
    use std::ops::Range;
    pub const MAGIC: usize = 0;
    pub const OPCODE: usize = 1;
    pub const KEY_LEN: Range<usize> = 2..4;
    pub const EXTRAS_LEN: usize = 4;
    /// vbucket id in a request, status in a response.
    pub const STATUS: Range<usize> = 6..8;
    pub const BODY_LEN: Range<usize> = 8..12;
    pub const OPAQUE: Range<usize> = 12..16;
}

/// Appends a `GET` of `prefix + index` carrying `opaque`.
pub fn write_get(buf: &mut Vec<u8>, prefix: &str, index: u64, opaque: u32) {
    write_request(buf, OP_GET, prefix, index, &[], opaque);
}

/// Appends a `SET` of `prefix + index` to `value` (flags 0, no expiry) carrying `opaque`.
pub fn write_set(buf: &mut Vec<u8>, prefix: &str, index: u64, value: &[u8], opaque: u32) {
    write_request(buf, OP_SET, prefix, index, value, opaque);
}

fn write_request(
    buf: &mut Vec<u8>,
    opcode: u8,
    prefix: &str,
    index: u64,
    value: &[u8],
    opaque: u32,
) {
    let start = buf.len();
    let extras = if opcode == OP_SET { SET_EXTRAS } else { 0 };
    buf.resize(start + HEADER_LEN + extras, 0);
    write_key(buf, prefix, index);
    // Keys are at most 250 bytes (checked before any load starts), so the casts cannot truncate.
    let key_len = buf.len() - start - HEADER_LEN - extras;
    buf.extend_from_slice(value);
    let body_len = buf.len() - start - HEADER_LEN;
    let h = &mut buf[start..start + HEADER_LEN];
    h[field::MAGIC] = MAGIC_REQUEST;
    h[field::OPCODE] = opcode;
    h[field::KEY_LEN].copy_from_slice(&(key_len as u16).to_be_bytes());
    h[field::EXTRAS_LEN] = extras as u8;
    h[field::BODY_LEN].copy_from_slice(&(body_len as u32).to_be_bytes());
    h[field::OPAQUE].copy_from_slice(&opaque.to_be_bytes());
}

/// Checks whether `buf` starts with a complete response to `op`.
///
/// Returns `None` while more bytes are needed, otherwise the outcome and the number of bytes the
/// response used. A response with the wrong magic or opcode, or an absurd length, is `Malformed`
/// and consumes all of `buf`.
pub fn check(op: Op, buf: &[u8]) -> Option<(Outcome, usize)> {
    if buf.is_empty() {
        return None;
    }
    let expected = match op {
        Op::Get => OP_GET,
        Op::Set => OP_SET,
    };
    if buf[field::MAGIC] != MAGIC_RESPONSE || (buf.len() > 1 && buf[field::OPCODE] != expected) {
        return Some((Outcome::Malformed, buf.len()));
    }
    if buf.len() < HEADER_LEN {
        return None;
    }
    let b = &buf[field::BODY_LEN];
    let body = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
    if body > MAX_BODY {
        return Some((Outcome::Malformed, buf.len()));
    }
    let used = HEADER_LEN + body;
    if buf.len() < used {
        return None;
    }
    let status = u16::from_be_bytes([buf[field::STATUS.start], buf[field::STATUS.start + 1]]);
    let outcome = match (op, status) {
        (Op::Get, STATUS_OK) => Outcome::Hit,
        (Op::Get, STATUS_KEY_NOT_FOUND) => Outcome::Miss,
        (Op::Set, STATUS_OK) => Outcome::Stored,
        _ => Outcome::ErrorReply,
    };
    Some((outcome, used))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_construct() {
        let mut b = vec![0xee];
        write_get(&mut b, "k", 42, 0x0102_0304);
        assert_eq!(
            b,
            [
                0xee, 0x80, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x01,
                0x02, 0x03, 0x04, 0, 0, 0, 0, 0, 0, 0, 0, b'k', b'4', b'2'
            ]
        );
    }

    #[test]
    fn set_construct() {
        let mut b = Vec::new();
        write_set(&mut b, "k", 7, b"abc", 9);
        let mut want = vec![
            0x80, 0x01, 0x00, 0x02, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0d, 0x00, 0x00,
            0x00, 0x09, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        want.extend_from_slice(&[0; 8]);
        want.extend_from_slice(b"k7abc");
        assert_eq!(b, want);
        assert_eq!(b.len(), overhead(Op::Set) + 2 + 3);
    }

    fn response(opcode: u8, status: u16, extras: &[u8], value: &[u8]) -> Vec<u8> {
        let mut r = vec![MAGIC_RESPONSE, opcode, 0, 0, extras.len() as u8, 0];
        r.extend_from_slice(&status.to_be_bytes());
        r.extend_from_slice(&((extras.len() + value.len()) as u32).to_be_bytes());
        r.extend_from_slice(&[0; 12]);
        r.extend_from_slice(extras);
        r.extend_from_slice(value);
        r
    }

    #[test]
    fn replies() {
        let hit = response(OP_GET, 0, &[0, 0, 0, 0], b"hello");
        assert_eq!(check(Op::Get, &hit), Some((Outcome::Hit, 33)));
        let miss = response(OP_GET, 1, &[], b"Not found");
        assert_eq!(check(Op::Get, &miss), Some((Outcome::Miss, 33)));
        let stored = response(OP_SET, 0, &[], b"");
        assert_eq!(check(Op::Set, &stored), Some((Outcome::Stored, 24)));
        let too_big = response(OP_SET, 0x0003, &[], b"Too large.");
        assert_eq!(
            check(Op::Set, &too_big).map(|r| r.0),
            Some(Outcome::ErrorReply)
        );
        // A following response is left for the next call.
        let mut two = hit.clone();
        two.extend_from_slice(&miss);
        assert_eq!(check(Op::Get, &two), Some((Outcome::Hit, 33)));
    }

    #[test]
    fn incomplete() {
        let hit = response(OP_GET, 0, &[0, 0, 0, 0], b"hello");
        for cut in 0..hit.len() {
            assert_eq!(check(Op::Get, &hit[..cut]), None, "cut at {cut}");
        }
    }

    #[test]
    fn malformed() {
        assert_eq!(
            check(Op::Get, b"END\r\n").map(|r| r.0),
            Some(Outcome::Malformed)
        );
        let wrong_op = response(OP_SET, 0, &[], b"");
        assert_eq!(
            check(Op::Get, &wrong_op).map(|r| r.0),
            Some(Outcome::Malformed)
        );
        let mut huge = response(OP_GET, 0, &[], b"");
        huge[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(check(Op::Get, &huge), Some((Outcome::Malformed, 24)));
    }
}
