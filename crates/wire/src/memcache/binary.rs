//! The binary protocol: a 24-byte header, then extras, key and value.
//!
//! A request is checked as memcached 1.6 checks it before acting, in its order: magic, a body
//! that holds the extras and key, a key of at most [`MAX_KEY_LEN`] bytes, a known opcode, and the
//! extras, key and value the opcode expects. The switch only reads; it never rewrites a header.

use super::{Command, Error, KeySpan, Request, MAX_KEY_LEN};

pub const HEADER_LEN: usize = 24;
pub const REQUEST_MAGIC: u8 = 0x80;
pub const RESPONSE_MAGIC: u8 = 0x81;

/// Byte offsets of the header fields (all integers are big-endian).
mod field {
    use core::ops::Range;

    pub const MAGIC: usize = 0;
    pub const OPCODE: usize = 1;
    pub const KEY_LEN: Range<usize> = 2..4;
    pub const EXTRAS_LEN: usize = 4;
    pub const DATA_TYPE: usize = 5;
    /// The vbucket id in a request, the status in a response.
    pub const VBUCKET_OR_STATUS: Range<usize> = 6..8;
    pub const BODY_LEN: Range<usize> = 8..12;
    pub const OPAQUE: Range<usize> = 12..16;
    pub const CAS: Range<usize> = 16..24;
}

/// Opcodes memcached 1.6 implements, and what each carries.
///
/// Quiet opcodes (`*Q`) suppress the success reply, and for gets the miss reply: `GETQ`,
/// `GETKQ`, `SETQ`, `ADDQ`, `REPLACEQ`, `DELETEQ`, `INCREMENTQ`, `DECREMENTQ`, `QUITQ`,
/// `FLUSHQ`, `APPENDQ`, `PREPENDQ`, `GATQ`, `GATKQ`. Opcodes carrying an item key: the gets,
/// stores, `DELETE`, `INCREMENT`/`DECREMENT`, `APPEND`/`PREPEND`, `TOUCH` and the `GAT`s, each
/// with its quiet form. `STAT` may carry a stat group name and the SASL opcodes a mechanism name
/// in the key field; those are not item keys. `VERBOSITY` is defined by the protocol but
/// memcached 1.6 answers it "Unknown command", so it is parsed as an unknown opcode.
pub mod opcode {
    pub const GET: u8 = 0x00;
    pub const SET: u8 = 0x01;
    pub const ADD: u8 = 0x02;
    pub const REPLACE: u8 = 0x03;
    pub const DELETE: u8 = 0x04;
    pub const INCREMENT: u8 = 0x05;
    pub const DECREMENT: u8 = 0x06;
    pub const QUIT: u8 = 0x07;
    pub const FLUSH: u8 = 0x08;
    pub const GETQ: u8 = 0x09;
    pub const NOOP: u8 = 0x0a;
    pub const VERSION: u8 = 0x0b;
    pub const GETK: u8 = 0x0c;
    pub const GETKQ: u8 = 0x0d;
    pub const APPEND: u8 = 0x0e;
    pub const PREPEND: u8 = 0x0f;
    pub const STAT: u8 = 0x10;
    pub const SETQ: u8 = 0x11;
    pub const ADDQ: u8 = 0x12;
    pub const REPLACEQ: u8 = 0x13;
    pub const DELETEQ: u8 = 0x14;
    pub const INCREMENTQ: u8 = 0x15;
    pub const DECREMENTQ: u8 = 0x16;
    pub const QUITQ: u8 = 0x17;
    pub const FLUSHQ: u8 = 0x18;
    pub const APPENDQ: u8 = 0x19;
    pub const PREPENDQ: u8 = 0x1a;
    pub const VERBOSITY: u8 = 0x1b;
    pub const TOUCH: u8 = 0x1c;
    pub const GAT: u8 = 0x1d;
    pub const GATQ: u8 = 0x1e;
    pub const SASL_LIST_MECHS: u8 = 0x20;
    pub const SASL_AUTH: u8 = 0x21;
    pub const SASL_STEP: u8 = 0x22;
    pub const GATK: u8 = 0x23;
    pub const GATKQ: u8 = 0x24;

    /// Whether memcached 1.6 implements the opcode (`VERBOSITY` is not implemented).
    pub fn is_known(op: u8) -> bool {
        matches!(op, GET..=PREPENDQ | TOUCH..=GATQ | SASL_LIST_MECHS..=GATKQ)
    }

    pub fn is_quiet(op: u8) -> bool {
        matches!(
            op,
            GETQ | GETKQ
                | SETQ
                | ADDQ
                | REPLACEQ
                | DELETEQ
                | INCREMENTQ
                | DECREMENTQ
                | QUITQ
                | FLUSHQ
                | APPENDQ
                | PREPENDQ
                | GATQ
                | GATKQ
        )
    }

    /// Whether the key field holds an item key.
    pub fn has_key(op: u8) -> bool {
        is_retrieval(op) || (is_write(op) && !matches!(op, FLUSH | FLUSHQ))
    }

    pub fn is_retrieval(op: u8) -> bool {
        matches!(op, GET | GETQ | GETK | GETKQ | GAT | GATQ | GATK | GATKQ)
    }

    /// Whether the opcode changes stored items (the `GAT`s reset the expiry).
    pub fn is_write(op: u8) -> bool {
        matches!(
            op,
            SET | ADD
                | REPLACE
                | DELETE
                | INCREMENT
                | DECREMENT
                | FLUSH
                | APPEND
                | PREPEND
                | SETQ
                | ADDQ
                | REPLACEQ
                | DELETEQ
                | INCREMENTQ
                | DECREMENTQ
                | FLUSHQ
                | APPENDQ
                | PREPENDQ
                | TOUCH
                | GAT
                | GATQ
                | GATK
                | GATKQ
        )
    }

    /// Whether the key is required (`Some(true)`), forbidden (`Some(false)`) or optional, the
    /// extras lengths allowed, and whether a value may follow; `None` for unknown opcodes.
    pub(super) fn shape(op: u8) -> Option<(Option<bool>, &'static [u8], bool)> {
        let shape: (Option<bool>, &'static [u8], bool) = match op {
            GET | GETQ | GETK | GETKQ | DELETE | DELETEQ => (Some(true), &[0], false),
            SET | SETQ | ADD | ADDQ | REPLACE | REPLACEQ => (Some(true), &[8], true),
            APPEND | APPENDQ | PREPEND | PREPENDQ => (Some(true), &[0], true),
            INCREMENT | INCREMENTQ | DECREMENT | DECREMENTQ => (Some(true), &[20], false),
            TOUCH | GAT | GATQ | GATK | GATKQ => (Some(true), &[4], false),
            QUIT | QUITQ | NOOP | VERSION => (Some(false), &[0], false),
            FLUSH | FLUSHQ => (Some(false), &[0, 4], false),
            STAT => (None, &[0], false),
            SASL_LIST_MECHS => (Some(false), &[0], false),
            SASL_AUTH | SASL_STEP => (Some(true), &[0], true),
            _ => return None,
        };
        Some(shape)
    }
}

/// Response statuses the switch may send or read.
pub mod status {
    pub const NO_ERROR: u16 = 0x0000;
    pub const KEY_NOT_FOUND: u16 = 0x0001;
    pub const KEY_EXISTS: u16 = 0x0002;
    pub const VALUE_TOO_LARGE: u16 = 0x0003;
    pub const INVALID_ARGUMENTS: u16 = 0x0004;
    pub const ITEM_NOT_STORED: u16 = 0x0005;
    pub const NON_NUMERIC_VALUE: u16 = 0x0006;
    /// SASL refused the credentials (or authentication is required first).
    pub const AUTH_ERROR: u16 = 0x0020;
    pub const UNKNOWN_COMMAND: u16 = 0x0081;
    pub const OUT_OF_MEMORY: u16 = 0x0082;
}

/// The body memcached 1.6 sends with an error status (`write_bin_error`); "Unknown command" for
/// statuses it does not name.
pub fn status_text(status: u16) -> &'static [u8] {
    match status {
        status::KEY_NOT_FOUND => b"Not found",
        status::KEY_EXISTS => b"Data exists for key.",
        status::VALUE_TOO_LARGE => b"Too large.",
        status::INVALID_ARGUMENTS => b"Invalid arguments",
        status::ITEM_NOT_STORED => b"Not stored.",
        status::NON_NUMERIC_VALUE => b"Non-numeric server-side value for incr or decr",
        status::AUTH_ERROR => b"Auth failure.",
        status::OUT_OF_MEMORY => b"Out of memory",
        _ => b"Unknown command",
    }
}

/// Appends a request packet: the header, then `extras`, `key` and `value`.
///
/// For clients and tests; lengths that do not fit their header fields are cut as in
/// [`write_response`], so the packet written is always well formed.
pub fn write_request(
    opcode: u8,
    key: &[u8],
    extras: &[u8],
    value: &[u8],
    opaque: u32,
    cas: u64,
    out: &mut Vec<u8>,
) {
    let key = &key[..key.len().min(usize::from(u16::MAX))];
    let extras = &extras[..extras.len().min(usize::from(u8::MAX))];
    let room = (u32::MAX as usize).saturating_sub(key.len() + extras.len());
    let value = &value[..value.len().min(room)];
    let body = extras.len() + key.len() + value.len();
    out.reserve(HEADER_LEN + body);
    out.extend_from_slice(&[REQUEST_MAGIC, opcode]);
    out.extend_from_slice(&(key.len() as u16).to_be_bytes());
    out.extend_from_slice(&[extras.len() as u8, 0, 0, 0]);
    out.extend_from_slice(&(body as u32).to_be_bytes());
    out.extend_from_slice(&opaque.to_be_bytes());
    out.extend_from_slice(&cas.to_be_bytes());
    out.extend_from_slice(extras);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

/// Appends a response packet without extras, with a zero CAS and data type.
///
/// A key longer than 65535 bytes is cut to fit its 16-bit length field, and the value so that
/// the body fits its 32-bit one: the packet written is always well formed.
pub fn write_response(
    opcode: u8,
    status: u16,
    opaque: u32,
    key: &[u8],
    value: &[u8],
    out: &mut Vec<u8>,
) {
    let key = &key[..key.len().min(usize::from(u16::MAX))];
    let room = (u32::MAX as usize).saturating_sub(key.len());
    let value = &value[..value.len().min(room)];
    let body = key.len() + value.len();
    out.reserve(HEADER_LEN + body);
    out.extend_from_slice(&[RESPONSE_MAGIC, opcode]);
    out.extend_from_slice(&(key.len() as u16).to_be_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&status.to_be_bytes());
    out.extend_from_slice(&(body as u32).to_be_bytes());
    out.extend_from_slice(&opaque.to_be_bytes());
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

/// Appends the error response memcached 1.6 sends for a failed request: `status` with
/// [`status_text`] as the value.
pub fn write_error(opcode: u8, status: u16, opaque: u32, out: &mut Vec<u8>) {
    write_response(opcode, status, opaque, b"", status_text(status), out);
}

/// A decoded request or response header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub magic: u8,
    pub opcode: u8,
    pub key_len: u16,
    pub extras_len: u8,
    pub data_type: u8,
    /// The vbucket id of a request, the status of a response.
    pub vbucket_or_status: u16,
    pub body_len: u32,
    pub opaque: u32,
    pub cas: u64,
}

impl Header {
    /// Decodes the first [`HEADER_LEN`] bytes; `None` if fewer have arrived. Nothing is checked.
    pub fn decode(buf: &[u8]) -> Option<Header> {
        let h: &[u8; HEADER_LEN] = buf.get(..HEADER_LEN)?.try_into().ok()?;
        let u16_at = |r: core::ops::Range<usize>| u16::from_be_bytes([h[r.start], h[r.start + 1]]);
        let u32_at = |r: core::ops::Range<usize>| {
            u32::from_be_bytes([h[r.start], h[r.start + 1], h[r.start + 2], h[r.start + 3]])
        };
        let mut cas = [0u8; 8];
        cas.copy_from_slice(&h[field::CAS]);
        Some(Header {
            magic: h[field::MAGIC],
            opcode: h[field::OPCODE],
            key_len: u16_at(field::KEY_LEN),
            extras_len: h[field::EXTRAS_LEN],
            data_type: h[field::DATA_TYPE],
            vbucket_or_status: u16_at(field::VBUCKET_OR_STATUS),
            body_len: u32_at(field::BODY_LEN),
            opaque: u32_at(field::OPAQUE),
            cas: u64::from_be_bytes(cas),
        })
    }

    /// Header and body length: the bytes the whole packet occupies.
    pub fn packet_len(&self) -> usize {
        HEADER_LEN.saturating_add(self.body_len as usize)
    }

    /// Start and end of the key, from the start of the packet.
    pub fn key_range(&self) -> (usize, usize) {
        let start = HEADER_LEN + usize::from(self.extras_len);
        (start, start + usize::from(self.key_len))
    }

    /// Length of the value: the body after extras and key.
    pub fn value_len(&self) -> usize {
        (self.body_len as usize)
            .saturating_sub(usize::from(self.extras_len) + usize::from(self.key_len))
    }

    /// The status of a response.
    pub fn status(&self) -> u16 {
        self.vbucket_or_status
    }

    fn check_body(&self) -> Result<(), Error> {
        let needed = u32::from(self.extras_len) + u32::from(self.key_len);
        if self.body_len < needed {
            return Err(Error::BadBinaryHeader);
        }
        Ok(())
    }
}

/// Reads the binary request at the front of `buf`. Header errors, a bad magic included, are
/// reported as soon as the 24 header bytes have arrived, as memcached reports them; `Ok(None)`
/// until then, and until the whole body has arrived.
pub fn parse_request(buf: &[u8]) -> Result<Option<Request<'_>>, Error> {
    // memcached judges the magic only once the whole header is in.
    let Some(header) = Header::decode(buf) else {
        return Ok(None);
    };
    if header.magic != REQUEST_MAGIC {
        return Err(Error::BadMagic);
    }
    header.check_body()?;
    if usize::from(header.key_len) > MAX_KEY_LEN {
        return Err(Error::KeyTooLong);
    }
    let op = header.opcode;
    let (key, extras, value) = opcode::shape(op).ok_or(Error::UnknownCommand)?;
    let key_ok = !matches!(key, Some(required) if required != (header.key_len > 0));
    // memcached reads no value for these and goes on right after the key, whatever the body
    // length says; so does the parser, so that the next request starts where memcached's does.
    let ignores_value = matches!(
        op,
        opcode::TOUCH | opcode::GAT | opcode::GATQ | opcode::GATK | opcode::GATKQ | opcode::STAT
    );
    let value_ok = value || ignores_value || header.value_len() == 0;
    if !key_ok || !value_ok || !extras.contains(&header.extras_len) {
        return Err(Error::BadBinaryArgs);
    }
    let end = if ignores_value {
        header.key_range().1
    } else {
        header.packet_len()
    };
    let Some(bytes) = buf.get(..end) else {
        return Ok(None);
    };
    let mut request = Request::new(Command::Binary(op), bytes);
    if opcode::has_key(op) {
        let (start, end) = header.key_range();
        request.keys = KeySpan::One(start, end);
        request.key_count = 1;
    }
    request.data = Some((header.key_range().1, end));
    request.noreply = opcode::is_quiet(op);
    request.opaque = Some(header.opaque);
    Ok(Some(request))
}

/// Reads the binary response header at the front of `buf`; `Ok(None)` if fewer than 24 bytes
/// have arrived. The body is not waited for: [`Header::packet_len`] says how long the response is.
pub fn parse_response_header(buf: &[u8]) -> Result<Option<Header>, Error> {
    let Some(header) = Header::decode(buf) else {
        return match buf.first() {
            Some(&magic) if magic != RESPONSE_MAGIC => Err(Error::BadMagic),
            _ => Ok(None),
        };
    };
    if header.magic != RESPONSE_MAGIC {
        return Err(Error::BadMagic);
    }
    header.check_body()?;
    Ok(Some(header))
}
