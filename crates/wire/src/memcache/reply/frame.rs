//! Where each backend reply ends: a proxy sends requests back to back on one connection and
//! must cut the replies apart, in order, to pass each to its client unchanged.
//!
//! The grammar of each kind of reply is the one memcached 1.6 sends; nothing is copied or
//! allocated, and nothing but framing is checked.

use super::{is_error_line, read_item, ReplyError, END};
use crate::memcache::binary::{self, opcode, status, Header};
use crate::memcache::line::{parse_u64, Tokens};
use crate::memcache::{Command, Request, MAX_DATA_LEN, MAX_LINE_LEN};

/// The shape of the reply a request gets from memcached 1.6, which says where it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyKind {
    /// `VALUE <key> <flags> <bytes> [<cas>]` lines, each with its data block, then `END`; or
    /// one error line (`ERROR`, `CLIENT_ERROR ...`, `SERVER_ERROR ...`). Text `get`, `gets`,
    /// `gat`, `gats`.
    Retrieval,
    /// One line: storage, `delete`, `incr`/`decr`, `touch`, `verbosity`, `flush_all`,
    /// `version`, `ms`, `md`, `mn`, `me`, `stats reset` (`RESET`), `stats detail on|off`
    /// (`OK`) and `stats sizes_enable|sizes_disable` (one `STAT` line, no `END`).
    Line,
    /// `mg` and `ma`: `VA <size> <flag>*` and a data block of `size` bytes, or one line (`HD`,
    /// `EN`, `NF`, `NS`, `EX`, or an error line).
    Meta,
    /// `STAT` lines (`ITEM` lines for `stats cachedump`, `PREFIX` lines for `stats detail
    /// dump`) then `END`; or one error line. Every other `stats` command.
    Stats,
    /// One binary response packet: the 24-byte header and its body length.
    Binary,
    /// Binary `STAT` packets up to one with an empty key, which ends the sequence; an error
    /// status (an unknown group) comes as that one packet.
    BinaryStats,
}

impl ReplyKind {
    /// The kind of reply memcached 1.6 sends to `request`.
    ///
    /// Whether a reply comes at all is another matter: see [`Request::noreply`]. A proxy should
    /// not forward the requests whose reply has no fixed end: `quit` and binary `QUIT`/`QUITQ`
    /// (memcached closes the connection), `shutdown`, `watch` (an endless stream),
    /// `lru_crawler metadump|mgdump` (lines then `END` or `EN`); they are reported as
    /// [`ReplyKind::Line`], which frames only their first line.
    pub fn of(request: &Request<'_>) -> ReplyKind {
        match request.command {
            Command::Get | Command::Gets | Command::Gat | Command::Gats => ReplyKind::Retrieval,
            Command::MetaGet | Command::MetaArithmetic => ReplyKind::Meta,
            Command::Stats => text_stats(request.bytes()),
            Command::Binary(opcode::STAT) => binary_stats(request.bytes()),
            Command::Binary(_) => ReplyKind::Binary,
            _ => ReplyKind::Line,
        }
    }
}

/// `stats [<group> [<arg>]]`: the groups memcached answers with something else than lines and
/// `END`. Groups are compared whole, as memcached does on the text protocol.
fn text_stats(request: &[u8]) -> ReplyKind {
    let line = request.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut args = Tokens::new(line).map(|(_, token)| token).skip(1);
    match (args.next(), args.next()) {
        (Some(b"reset" | b"sizes_enable" | b"sizes_disable"), _) => ReplyKind::Line,
        (Some(b"detail"), Some(b"dump")) => ReplyKind::Stats,
        // `on`, `off`, or memcached's usage error.
        (Some(b"detail"), _) => ReplyKind::Line,
        _ => ReplyKind::Stats,
    }
}

/// Binary `STAT <group>`: `sizes_enable` and `sizes_disable` answer one packet without the
/// empty-key packet that ends every other group.
fn binary_stats(request: &[u8]) -> ReplyKind {
    let group = Header::decode(request).and_then(|header| {
        let (start, end) = header.key_range();
        request.get(start..end)
    });
    match group {
        Some(b"sizes_enable" | b"sizes_disable") => ReplyKind::Binary,
        _ => ReplyKind::BinaryStats,
    }
}

/// Length of the complete reply of `kind` at the front of `buf`; `Ok(None)` while incomplete.
///
/// Bytes after the reply (the next replies) are left alone. Each call reads the reply from its
/// start: a few header bytes per item, line or packet received so far, never the data blocks.
/// A caller that calls again as bytes arrive should keep a [`Framer`], which goes on from
/// where the previous call stopped.
///
/// [`ReplyError::Malformed`] means the bytes cannot be the reply of `kind`, so the connection
/// is out of step with its requests and cannot be trusted: a line longer than [`MAX_LINE_LEN`]
/// or not ending in `\r\n`, an unexpected line, a bad length, a data block not followed by
/// `\r\n`, a binary packet with a bad magic, a body shorter than its extras and key, or a
/// packet other than `STAT` in a `STAT` sequence. An error line is a complete reply, never an
/// error here; [`ReplyError::ErrorLine`] is not returned.
pub fn reply_len(kind: ReplyKind, buf: &[u8]) -> Result<Option<usize>, ReplyError> {
    Framer::new(kind).reply_len(buf)
}

/// Finds where one reply ends as its bytes arrive, without reading any byte twice but those of
/// the item header, line or packet header still arriving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framer {
    kind: ReplyKind,
    /// Bytes at the front of the reply already read as whole items, lines or packets.
    done: usize,
}

impl Framer {
    /// A framer for one reply of `kind`, before any of its bytes have been read.
    pub fn new(kind: ReplyKind) -> Framer {
        Framer { kind, done: 0 }
    }

    /// The kind of reply being framed.
    pub fn kind(&self) -> ReplyKind {
        self.kind
    }

    /// As [`reply_len`], for a buffer that begins with the same reply on every call and has
    /// only grown since the last one. A buffer shorter than what was already read breaks that
    /// contract and is reported as [`ReplyError::Malformed`].
    pub fn reply_len(&mut self, buf: &[u8]) -> Result<Option<usize>, ReplyError> {
        match self.kind {
            ReplyKind::Retrieval => self.retrieval(buf),
            ReplyKind::Line => one_line(buf),
            ReplyKind::Meta => meta(buf),
            ReplyKind::Stats => self.stats(buf),
            ReplyKind::Binary => Ok(packet(buf)?.map(|(len, _)| len)),
            ReplyKind::BinaryStats => self.binary_stats(buf),
        }
    }

    /// The part of `buf` not yet read.
    fn rest<'b>(&self, buf: &'b [u8]) -> Result<&'b [u8], ReplyError> {
        buf.get(self.done..).ok_or(ReplyError::Malformed)
    }

    fn retrieval(&mut self, buf: &[u8]) -> Result<Option<usize>, ReplyError> {
        loop {
            let rest = self.rest(buf)?;
            if rest.starts_with(END) {
                return Ok(Some(self.done + END.len()));
            }
            match read_item(rest) {
                Ok(Some(item)) => self.done += item.raw.len(),
                Ok(None) => return Ok(None),
                Err(ReplyError::ErrorLine { end, .. }) => return Ok(Some(self.done + end)),
                Err(error) => return Err(error),
            }
        }
    }

    fn stats(&mut self, buf: &[u8]) -> Result<Option<usize>, ReplyError> {
        loop {
            let rest = self.rest(buf)?;
            let Some(len) = line_len(rest)? else {
                return Ok(None);
            };
            let line = &rest[..len - 2];
            if line == b"END" {
                return Ok(Some(self.done + len));
            }
            let is_stat = [&b"STAT "[..], b"ITEM ", b"PREFIX "]
                .iter()
                .any(|word| line.starts_with(word));
            if is_stat {
                self.done += len;
                continue;
            }
            // memcached builds a stats reply before sending it, so an error replaces it whole.
            let one_line = line == b"RESET" || line == b"OK" || is_error_line(line);
            return match self.done {
                0 if one_line => Ok(Some(len)),
                _ => Err(ReplyError::Malformed),
            };
        }
    }

    fn binary_stats(&mut self, buf: &[u8]) -> Result<Option<usize>, ReplyError> {
        loop {
            let rest = self.rest(buf)?;
            let Some(header) = response_header(rest)? else {
                return Ok(None);
            };
            if header.opcode != opcode::STAT {
                return Err(ReplyError::Malformed);
            }
            let len = header.packet_len();
            if rest.len() < len {
                return Ok(None);
            }
            if header.key_len == 0 || header.status() != status::NO_ERROR {
                return Ok(Some(self.done + len));
            }
            self.done += len;
        }
    }
}

/// Length of the first line, `\r\n` included; `Ok(None)` until its `\n` has arrived. Only the
/// first [`MAX_LINE_LEN`] bytes are searched.
fn line_len(buf: &[u8]) -> Result<Option<usize>, ReplyError> {
    let window = &buf[..buf.len().min(MAX_LINE_LEN)];
    match window.iter().position(|&b| b == b'\n') {
        Some(nl) if nl > 0 && window[nl - 1] == b'\r' => Ok(Some(nl + 1)),
        Some(_) => Err(ReplyError::Malformed),
        None if buf.len() >= MAX_LINE_LEN => Err(ReplyError::Malformed),
        None => Ok(None),
    }
}

/// A one-line reply. A `VALUE` or `VA` line, which starts a retrieval reply, means the
/// connection is out of step.
fn one_line(buf: &[u8]) -> Result<Option<usize>, ReplyError> {
    let Some(len) = line_len(buf)? else {
        return Ok(None);
    };
    if buf.starts_with(b"VALUE ") || buf.starts_with(b"VA ") {
        return Err(ReplyError::Malformed);
    }
    Ok(Some(len))
}

/// A meta `mg` or `ma` reply.
fn meta(buf: &[u8]) -> Result<Option<usize>, ReplyError> {
    let Some(len) = line_len(buf)? else {
        return Ok(None);
    };
    let line = &buf[..len - 2];
    let mut tokens = Tokens::new(line).map(|(_, token)| token);
    match tokens.next() {
        Some(b"VA") => {
            let size = tokens
                .next()
                .and_then(parse_u64)
                .and_then(|n| usize::try_from(n).ok())
                .filter(|&n| n <= MAX_DATA_LEN)
                .ok_or(ReplyError::Malformed)?;
            let total = len + size + 2;
            match buf.get(..total) {
                None => Ok(None),
                Some(reply) if reply.ends_with(b"\r\n") => Ok(Some(total)),
                Some(_) => Err(ReplyError::Malformed),
            }
        }
        Some(b"HD" | b"EN" | b"NF" | b"NS" | b"EX") => Ok(Some(len)),
        _ if is_error_line(line) => Ok(Some(len)),
        _ => Err(ReplyError::Malformed),
    }
}

/// The response header at the front of `buf`, checked; `Ok(None)` until 24 bytes have arrived.
fn response_header(buf: &[u8]) -> Result<Option<Header>, ReplyError> {
    binary::parse_response_header(buf).map_err(|_| ReplyError::Malformed)
}

/// The complete response packet at the front of `buf`: its length and header.
fn packet(buf: &[u8]) -> Result<Option<(usize, Header)>, ReplyError> {
    let Some(header) = response_header(buf)? else {
        return Ok(None);
    };
    let len = header.packet_len();
    Ok((buf.len() >= len).then_some((len, header)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memcache::fixtures::*;
    use crate::memcache::parse;

    /// A binary response with opaque 0x11 and a zero CAS.
    fn response(op: u8, status: u16, key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        binary::write_response(op, status, 0x11, key, value, &mut out);
        out
    }

    /// Replies captured from memcached 1.6.18 or written as it sends them, with their kind.
    fn samples() -> Vec<(ReplyKind, Vec<u8>)> {
        let mut big = b"VALUE big 3 100000\r\n".to_vec();
        big.extend((0..100_000u32).map(|i| (i % 251) as u8));
        big.extend_from_slice(b"\r\nEND\r\n");
        let text: &[(ReplyKind, &[u8])] = &[
            (ReplyKind::Retrieval, GETS),
            (ReplyKind::Retrieval, b"END\r\n"),
            (
                ReplyKind::Retrieval,
                b"CLIENT_ERROR bad command line format\r\n",
            ),
            (
                ReplyKind::Retrieval,
                b"VALUE a 0 1\r\nx\r\nSERVER_ERROR out of memory\r\n",
            ),
            (ReplyKind::Line, b"STORED\r\n"),
            (ReplyKind::Line, b"18446744073709551615\r\n"),
            (ReplyKind::Line, b"VERSION 1.6.18\r\n"),
            (
                ReplyKind::Line,
                b"ME cnt exp=-1 la=2 cas=9 fetch=no cls=1 size=64\r\n",
            ),
            (ReplyKind::Line, b"RESET\r\n"),
            (ReplyKind::Line, b"STAT sizes_status enabled\r\n"),
            (ReplyKind::Line, b"ERROR: shutdown not enabled\r\n"),
            (ReplyKind::Meta, MG_VA),
            (ReplyKind::Meta, MA_VA),
            (ReplyKind::Meta, b"VA 0\r\n\r\n"),
            (ReplyKind::Meta, b"HD kmk\r\n"),
            (ReplyKind::Meta, b"EN\r\n"),
            (ReplyKind::Meta, b"NF\r\n"),
            (ReplyKind::Meta, b"CLIENT_ERROR invalid flag\r\n"),
            (ReplyKind::Stats, STATS_A),
            (ReplyKind::Stats, STATS_SETTINGS),
            (ReplyKind::Stats, STATS_ITEMS_A),
            (ReplyKind::Stats, STATS_SLABS_A),
            (ReplyKind::Stats, STATS_DETAIL_DUMP),
            (ReplyKind::Stats, STATS_CACHEDUMP),
            (ReplyKind::Stats, STATS_SIZES),
            (ReplyKind::Stats, STATS_CONNS),
            (ReplyKind::Stats, b"END\r\n"),
            (ReplyKind::Stats, b"RESET\r\n"),
            (ReplyKind::Stats, b"ERROR\r\n"),
            (
                ReplyKind::Stats,
                b"CLIENT_ERROR stats cachedump not allowed\r\n",
            ),
            (ReplyKind::Binary, BIN_GETK),
            (ReplyKind::Binary, BIN_STATS_BOGUS),
            (ReplyKind::BinaryStats, BIN_STATS_A),
            (ReplyKind::BinaryStats, BIN_STATS_ITEMS),
            (ReplyKind::BinaryStats, BIN_STATS_DETAIL_DUMP),
            (ReplyKind::BinaryStats, BIN_STATS_BOGUS),
            (ReplyKind::BinaryStats, BIN_STATS_RESET),
        ];
        let mut samples: Vec<_> = text.iter().map(|&(k, r)| (k, r.to_vec())).collect();
        samples.push((ReplyKind::Retrieval, big));
        samples.push((ReplyKind::Binary, response(opcode::GET, 0, b"", b"")));
        samples.push((
            ReplyKind::Binary,
            response(opcode::GETK, 0, b"k", &[7; 70_000]),
        ));
        samples
    }

    #[test]
    fn every_strict_prefix_is_incomplete() {
        for (kind, reply) in samples() {
            for n in 0..reply.len() {
                assert_eq!(
                    reply_len(kind, &reply[..n]),
                    Ok(None),
                    "{kind:?}, {n} bytes of {:?}",
                    String::from_utf8_lossy(&reply)
                );
            }
            assert_eq!(reply_len(kind, &reply), Ok(Some(reply.len())), "{kind:?}");
        }
    }

    #[test]
    fn the_next_reply_is_left_alone() {
        for (kind, reply) in samples() {
            for next in [&b"STORED\r\n"[..], BIN_GETK, b"V", b"\x81"] {
                let mut buf = reply.clone();
                buf.extend_from_slice(next);
                assert_eq!(reply_len(kind, &buf), Ok(Some(reply.len())), "{kind:?}");
            }
        }
    }

    #[test]
    fn a_framer_goes_on_where_it_stopped() {
        for (kind, reply) in samples() {
            for chunk in [1, 7, 1000, 65536] {
                let mut framer = Framer::new(kind);
                let mut found = None;
                for end in (chunk..reply.len() + chunk).step_by(chunk) {
                    let end = end.min(reply.len());
                    found = framer.reply_len(&reply[..end]).unwrap();
                    if end < reply.len() {
                        assert_eq!(found, None, "{kind:?} at {end}");
                    }
                }
                assert_eq!(found, Some(reply.len()), "{kind:?} in chunks of {chunk}");
                // Asking again gives the same answer.
                assert_eq!(framer.reply_len(&reply), Ok(Some(reply.len())));
            }
        }
        let mut framer = Framer::new(ReplyKind::Stats);
        assert_eq!(framer.reply_len(&STATS_A[..100]), Ok(None));
        assert_eq!(framer.kind(), ReplyKind::Stats);
        assert_eq!(framer.reply_len(&STATS_A[..10]), Err(ReplyError::Malformed));
    }

    #[test]
    fn pipelined_replies_are_cut_apart() {
        let mut stream = Vec::new();
        let samples = samples();
        for (_, reply) in &samples {
            stream.extend_from_slice(reply);
        }
        let mut at = 0;
        for (kind, reply) in &samples {
            let len = reply_len(*kind, &stream[at..]).unwrap().unwrap();
            assert_eq!(&stream[at..at + len], &reply[..]);
            at += len;
        }
        assert_eq!(at, stream.len());
    }

    #[test]
    fn malformed_replies() {
        let mut long_line = b"STAT ".to_vec();
        long_line.resize(MAX_LINE_LEN, b'x');
        let mut not_stat = BIN_STATS_A[..32].to_vec();
        not_stat[1] = opcode::NOOP;
        let mut short_body = BIN_GETK.to_vec();
        short_body[11] = 3;
        let table: &[(ReplyKind, &[u8])] = &[
            (ReplyKind::Retrieval, b"STORED\r\n"),
            (ReplyKind::Retrieval, b"VALUE a 0 1\r\nxy\r\n"),
            (ReplyKind::Retrieval, b"END\n"),
            (ReplyKind::Line, b"STORED\n"),
            (ReplyKind::Line, b"VALUE a 0 1\r\n"),
            (ReplyKind::Line, b"VA 1\r\n"),
            (ReplyKind::Line, &long_line),
            (ReplyKind::Meta, b"VA\r\n"),
            (ReplyKind::Meta, b"VA x\r\n"),
            (ReplyKind::Meta, b"VA 1 f0\r\nab\r\n"),
            (ReplyKind::Meta, b"STORED\r\n"),
            (ReplyKind::Meta, b"MN\r\n"),
            (ReplyKind::Stats, b"STORED\r\n"),
            (ReplyKind::Stats, b"STAT pid 1\r\nRESET\r\n"),
            (ReplyKind::Stats, b"STAT pid 1\r\nERROR\r\n"),
            (ReplyKind::Stats, b"STAT pid 1\nEND\r\n"),
            (ReplyKind::Stats, &long_line),
            (ReplyKind::Binary, b"\x80"),
            (ReplyKind::Binary, b"STORED\r\n"),
            (ReplyKind::Binary, &short_body),
            (ReplyKind::BinaryStats, &not_stat),
            (ReplyKind::BinaryStats, b"END\r\n"),
        ];
        for &(kind, reply) in table {
            assert_eq!(
                reply_len(kind, reply),
                Err(ReplyError::Malformed),
                "{kind:?} {:?}",
                String::from_utf8_lossy(reply)
            );
        }
        // A line still arriving is not judged before its end or MAX_LINE_LEN bytes.
        assert_eq!(reply_len(ReplyKind::Stats, b"BOGUS"), Ok(None));
        assert_eq!(
            reply_len(ReplyKind::Retrieval, b"BOGUS"),
            Err(ReplyError::Malformed)
        );
    }

    #[test]
    fn kinds_of_requests() {
        let stat = |group: &[u8]| {
            let mut packet = vec![0x80, opcode::STAT];
            packet.extend_from_slice(&(group.len() as u16).to_be_bytes());
            packet.extend_from_slice(&[0, 0, 0, 0]);
            packet.extend_from_slice(&(group.len() as u32).to_be_bytes());
            packet.extend_from_slice(&[0; 12]);
            packet.extend_from_slice(group);
            packet
        };
        let mut getq = stat(b"k");
        getq[1] = opcode::GETQ;
        let table: &[(&[u8], ReplyKind)] = &[
            (b"get a b\r\n", ReplyKind::Retrieval),
            (b"gats 10 a\r\n", ReplyKind::Retrieval),
            (b"gat 10\r\n", ReplyKind::Retrieval),
            (b"set a 0 0 1 noreply\r\nx\r\n", ReplyKind::Line),
            (b"cas a 0 0 1 5\r\nx\r\n", ReplyKind::Line),
            (b"delete a\r\n", ReplyKind::Line),
            (b"incr a 1\r\n", ReplyKind::Line),
            (b"touch a 1\r\n", ReplyKind::Line),
            (b"mg a v\r\n", ReplyKind::Meta),
            (b"ma a v\r\n", ReplyKind::Meta),
            (b"ms a 1\r\nx\r\n", ReplyKind::Line),
            (b"md a q\r\n", ReplyKind::Line),
            (b"mn\r\n", ReplyKind::Line),
            (b"me a\r\n", ReplyKind::Line),
            (b"version\r\n", ReplyKind::Line),
            (b"verbosity 1\r\n", ReplyKind::Line),
            (b"flush_all\r\n", ReplyKind::Line),
            (b"stats\r\n", ReplyKind::Stats),
            (b"stats  \r\n", ReplyKind::Stats),
            (b"stats settings\r\n", ReplyKind::Stats),
            (b"stats items\r\n", ReplyKind::Stats),
            (b"stats cachedump 1 10\r\n", ReplyKind::Stats),
            (b"stats bogus\r\n", ReplyKind::Stats),
            (b"stats detail dump\n", ReplyKind::Stats),
            (b"stats detail on\r\n", ReplyKind::Line),
            (b"stats detail\r\n", ReplyKind::Line),
            (b"stats reset\r\n", ReplyKind::Line),
            (b"stats reset x\r\n", ReplyKind::Line),
            (b"stats sizes_enable\r\n", ReplyKind::Line),
            (b"stats sizes\r\n", ReplyKind::Stats),
            (&stat(b""), ReplyKind::BinaryStats),
            (&stat(b"items"), ReplyKind::BinaryStats),
            (&stat(b"reset"), ReplyKind::BinaryStats),
            (&stat(b"sizes_disable"), ReplyKind::Binary),
            (&getq, ReplyKind::Binary),
        ];
        for &(request, kind) in table {
            let request = match parse(request) {
                Ok(Some(request)) => request,
                other => panic!("{request:?}: {other:?}"),
            };
            assert_eq!(ReplyKind::of(&request), kind, "{request:?}");
        }
    }
}
