//! The backend side: where each reply ends in a server's stream ([`reply_len`], [`Framer`]),
//! and for a text retrieval split across servers, reading each server's `VALUE ...` items up to
//! `END` and writing the sub-request for a subset of the keys.
//!
//! Reading never allocates; items are slices of the reply buffer so they can be copied into the
//! merged reply unchanged.

mod frame;

pub use frame::{reply_len, Framer, ReplyKind};

use super::line::{parse_u64, Tokens};
use super::{Command, MAX_DATA_LEN, MAX_LINE_LEN};

const END: &[u8] = b"END\r\n";
const VALUE: &[u8] = b"VALUE ";

/// The one reply a client gets for a write that every replica of its key answered (`replies`,
/// the owner's first, at least one): the common reply if all agree, else the first that says
/// the request failed (`ERROR`, `CLIENT_ERROR`, `SERVER_ERROR`, a binary status of 0x80 or
/// more; `NOT_STORED` and `NOT_FOUND` are answers, not failures), else the owner's.
pub fn replicas_reply<'r>(replies: &[&'r [u8]]) -> &'r [u8] {
    let Some(&owner) = replies.first() else {
        return b"";
    };
    if replies.iter().all(|r| *r == owner) {
        return owner;
    }
    let failed = |r: &[u8]| match r.first() {
        Some(&super::binary::RESPONSE_MAGIC) => {
            r.len() >= 8 && u16::from_be_bytes([r[6], r[7]]) >= 0x80
        }
        _ => {
            r.starts_with(b"ERROR")
                || r.starts_with(b"CLIENT_ERROR")
                || r.starts_with(b"SERVER_ERROR")
        }
    };
    replies.iter().copied().find(|r| failed(r)).unwrap_or(owner)
}

/// One item of a retrieval reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Item<'a> {
    pub key: &'a [u8],
    pub flags: &'a [u8],
    /// Length of the data block.
    pub bytes: usize,
    /// The cas unique, present in replies to `gets` and `gats`.
    pub cas: Option<&'a [u8]>,
    /// The whole item, `VALUE <key> <flags> <bytes> [<cas>]\r\n<data>\r\n`.
    pub raw: &'a [u8],
}

impl<'a> Item<'a> {
    /// The data block, without its `\r\n`.
    pub fn data(&self) -> &'a [u8] {
        let end = self.raw.len().saturating_sub(2);
        let start = end.saturating_sub(self.bytes);
        self.raw.get(start..end).unwrap_or_default()
    }
}

/// Why a backend reply is not the reply expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyError {
    /// The server answered a retrieval with an error line (`ERROR`, `CLIENT_ERROR ...`,
    /// `SERVER_ERROR ...`) at `start..end` of the buffer, possibly after some items; pass it on.
    /// Only [`parse_retrieval_reply`] reports it.
    ErrorLine { start: usize, end: usize },
    /// The bytes cannot be framed as the reply expected, so the connection is out of step with
    /// its requests: an unexpected line, a bad length, a data block without `\r\n`, a line
    /// longer than [`MAX_LINE_LEN`], a bad binary header (see [`reply_len`]).
    Malformed,
}

/// Iterator over the items of a complete retrieval reply, in reply order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Items<'a> {
    /// The items, checked by [`parse_retrieval_reply`]; `END` is not included.
    rest: &'a [u8],
    count: usize,
}

impl<'a> Items<'a> {
    /// Number of items in the reply (not just those left to iterate).
    pub fn count_all(&self) -> usize {
        self.count
    }

    /// The raw bytes of all items, `END` excluded, for copying into a merged reply at once.
    pub fn raw(&self) -> &'a [u8] {
        self.rest
    }
}

impl<'a> Iterator for Items<'a> {
    type Item = Item<'a>;

    fn next(&mut self) -> Option<Item<'a>> {
        let item = match read_item(self.rest) {
            Ok(Some(item)) => item,
            _ => return None,
        };
        self.rest = self.rest.get(item.raw.len()..).unwrap_or_default();
        Some(item)
    }
}

/// Reads a text retrieval reply (`VALUE ...` items, then `END\r\n`) from the front of `buf`.
///
/// Returns the items and the bytes consumed, `END` included; `Ok(None)` until `END` has
/// arrived. The reply of the meta and binary protocols is not read here.
pub fn parse_retrieval_reply(buf: &[u8]) -> Result<Option<(Items<'_>, usize)>, ReplyError> {
    let mut pos = 0;
    let mut count = 0;
    loop {
        let rest = buf.get(pos..).unwrap_or_default();
        if rest.starts_with(END) {
            let items = Items {
                rest: &buf[..pos],
                count,
            };
            return Ok(Some((items, pos + END.len())));
        }
        match read_item(rest).map_err(|e| e.at(pos))? {
            Some(item) => {
                pos += item.raw.len();
                count += 1;
            }
            None => return Ok(None),
        }
    }
}

/// Reads one `VALUE` item; `Ok(None)` if it has not all arrived. Only the first
/// [`MAX_LINE_LEN`] bytes are searched for the end of its line, not the data after it.
fn read_item(buf: &[u8]) -> Result<Option<Item<'_>>, ReplyError> {
    let window = &buf[..buf.len().min(MAX_LINE_LEN)];
    let Some(nl) = window.iter().position(|&b| b == b'\n') else {
        if buf.len() >= MAX_LINE_LEN || !could_start_reply(buf) {
            return Err(ReplyError::Malformed);
        }
        return Ok(None);
    };
    let line_end = nl + 1;
    if !buf[..line_end].ends_with(b"\r\n") || line_end > MAX_LINE_LEN {
        return Err(ReplyError::Malformed);
    }
    let line = &buf[..nl - 1];
    if is_error_line(line) {
        return Err(ReplyError::ErrorLine {
            start: 0,
            end: line_end,
        });
    }
    let Some(fields) = line.strip_prefix(VALUE) else {
        return Err(ReplyError::Malformed);
    };
    let mut tokens = Tokens::new(fields).map(|(_, token)| token);
    let (Some(key), Some(flags), Some(bytes), cas, None) = (
        tokens.next(),
        tokens.next(),
        tokens.next(),
        tokens.next(),
        tokens.next(),
    ) else {
        return Err(ReplyError::Malformed);
    };
    let bytes = parse_u64(bytes)
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| n <= MAX_DATA_LEN)
        .ok_or(ReplyError::Malformed)?;
    let end = line_end + bytes + 2;
    let Some(raw) = buf.get(..end) else {
        return Ok(None);
    };
    if !raw.ends_with(b"\r\n") {
        return Err(ReplyError::Malformed);
    }
    Ok(Some(Item {
        key,
        flags,
        bytes,
        cas,
        raw,
    }))
}

/// Whether a line (without its `\r\n`) is one of memcached's error lines.
pub(super) fn is_error_line(line: &[u8]) -> bool {
    line == b"ERROR" || line.starts_with(b"CLIENT_ERROR ") || line.starts_with(b"SERVER_ERROR ")
}

/// Whether an incomplete line may still become an item, `END` or an error line.
fn could_start_reply(partial: &[u8]) -> bool {
    [
        &b"VALUE "[..],
        b"END\r",
        b"ERROR\r",
        b"CLIENT_ERROR ",
        b"SERVER_ERROR ",
    ]
    .iter()
    .any(|word| {
        let n = partial.len().min(word.len());
        partial[..n] == word[..n]
    })
}

impl ReplyError {
    /// Moves an [`ReplyError::ErrorLine`] found by [`read_item`] at `pos` of the whole reply.
    fn at(self, pos: usize) -> ReplyError {
        match self {
            ReplyError::ErrorLine { start, end } => ReplyError::ErrorLine {
                start: start + pos,
                end: end + pos,
            },
            other => other,
        }
    }
}

/// Length of a one-line reply (`STORED\r\n`, `DELETED\r\n`, a number, `HD ...\r\n`, an error
/// line) at the front of `buf`, `\r\n` included; `None` until its `\r\n` has arrived. This is the
/// whole reply to every keyed command but the retrievals.
pub fn line_reply_len(buf: &[u8]) -> Option<usize> {
    let nl = buf.iter().position(|&b| b == b'\n')?;
    Some(nl + 1)
}

/// Appends a text retrieval request for `keys` to `out`: `<cmd> [<exptime>] <key>*\r\n`.
///
/// `cmd` must be `Get`, `Gets`, `Gat` or `Gats`, and the `gat`s need `exptime` (from
/// [`super::Request::exptime_token`]); otherwise nothing is written and `false` is returned.
/// Keys are written as given: they come from a request that was parsed, so they are valid.
#[must_use]
pub fn write_retrieval_request<'k>(
    cmd: Command,
    exptime: Option<&[u8]>,
    keys: impl Iterator<Item = &'k [u8]>,
    out: &mut Vec<u8>,
) -> bool {
    let (name, exptime) = match (cmd, exptime) {
        (Command::Get, _) => (&b"get"[..], None),
        (Command::Gets, _) => (&b"gets"[..], None),
        (Command::Gat, Some(exptime)) => (&b"gat"[..], Some(exptime)),
        (Command::Gats, Some(exptime)) => (&b"gats"[..], Some(exptime)),
        _ => return false,
    };
    out.extend_from_slice(name);
    if let Some(exptime) = exptime {
        out.push(b' ');
        out.extend_from_slice(exptime);
    }
    for key in keys {
        out.push(b' ');
        out.extend_from_slice(key);
    }
    out.extend_from_slice(b"\r\n");
    true
}
