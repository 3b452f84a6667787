//! RESP, Redis's protocol: requests read exactly as redis-server 7 reads them, replies framed
//! as they stream in, and the few replies a proxy writes itself.
//!
//! A request is either a *multibulk* (`*2\r\n$3\r\nGET\r\n$1\r\nk\r\n`) or an *inline* line
//! (`GET k\r\n`, split with Redis's quoting rules). [`RequestParser`] accepts and refuses
//! what redis-server does, with its words: a stream a server would answer with
//! `-ERR Protocol error: invalid bulk length` gets that reply here too, after the commands
//! before it. It reads incrementally, so a large argument arriving in pieces is not read
//! again from its start.
//!
//! Replies are framed by [`ReplyFramer`], which knows RESP2 and RESP3's types and resumes
//! where it stopped.

pub mod commands;

use std::fmt;

/// The largest bulk argument a server accepts (`proto-max-bulk-len`).
pub const MAX_BULK: u64 = 512 << 20;
/// The longest inline request, or count line, before its end is seen.
pub const MAX_INLINE: usize = 64 * 1024;
/// The most elements a multibulk may announce.
const MAX_COUNT: i64 = i32::MAX as i64;
/// Past these, a client that has not authenticated is cut off.
const UNAUTH_COUNT: i64 = 10;
const UNAUTH_BULK: i64 = 16384;

/// A stream no server would read further: the reply says why, and the connection is closed
/// after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProtocolError {
    TooBigInline,
    UnbalancedQuotes,
    TooBigCount,
    InvalidCount,
    UnauthenticatedCount,
    TooBigBulkCount,
    /// A multibulk element that is not a bulk string; the byte found instead.
    ExpectedDollar(u8),
    InvalidBulk,
    UnauthenticatedBulk,
}

impl ProtocolError {
    fn text(&self) -> &'static str {
        match self {
            ProtocolError::TooBigInline => "too big inline request",
            ProtocolError::UnbalancedQuotes => "unbalanced quotes in request",
            ProtocolError::TooBigCount => "too big mbulk count string",
            ProtocolError::InvalidCount => "invalid multibulk length",
            ProtocolError::UnauthenticatedCount => "unauthenticated multibulk length",
            ProtocolError::TooBigBulkCount => "too big bulk count string",
            ProtocolError::ExpectedDollar(_) => "expected '$', got '",
            ProtocolError::InvalidBulk => "invalid bulk length",
            ProtocolError::UnauthenticatedBulk => "unauthenticated bulk length",
        }
    }

    /// The error reply, as redis-server writes it.
    pub fn reply(&self) -> Vec<u8> {
        let mut message = b"ERR Protocol error: ".to_vec();
        message.extend_from_slice(self.text().as_bytes());
        if let ProtocolError::ExpectedDollar(found) = self {
            // The server prints the byte as a C character: a NUL ends its message.
            if *found != 0 {
                message.push(*found);
                message.push(b'\'');
            }
        }
        error(&message)
    }
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolError::ExpectedDollar(b) => {
                write!(f, "{}{}'", self.text(), b.escape_ascii())
            }
            _ => f.write_str(self.text()),
        }
    }
}

impl std::error::Error for ProtocolError {}

/// What one step of [`RequestParser::step`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// More bytes are needed.
    More,
    /// A whole command; empty for an empty line or a multibulk of 0 or fewer elements, which a
    /// server skips without a reply.
    Command(Command),
}

/// One command's words, kept in one buffer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Command {
    data: Vec<u8>,
    /// Where each word ends in `data`.
    ends: Vec<usize>,
}

impl Command {
    pub fn from_words<W: AsRef<[u8]>>(words: &[W]) -> Command {
        let mut command = Command::default();
        for w in words {
            command.push(w.as_ref());
        }
        command
    }

    pub fn push(&mut self, word: &[u8]) {
        self.data.extend_from_slice(word);
        self.ends.push(self.data.len());
    }

    /// Words, the name included.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Word `i` (0: the name); empty past the last.
    pub fn word(&self, i: usize) -> &[u8] {
        let Some(&end) = self.ends.get(i) else {
            return &[];
        };
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.data[start..end]
    }

    pub fn words(&self) -> impl Iterator<Item = &[u8]> + '_ {
        (0..self.len()).map(|i| self.word(i))
    }

    /// Appends the command as a multibulk request.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.reserve(self.data.len() + 16 * self.len() + 16);
        header(b'*', self.len(), out);
        for word in self.words() {
            bulk(word, out);
        }
    }
}

/// Reads requests from a client's byte stream, keeping a multibulk's elements read so far.
#[derive(Debug, Default)]
pub struct RequestParser {
    /// Elements still to read of the multibulk under way (0: none under way).
    left: usize,
    /// The length of the bulk whose header is read and whose bytes are not.
    bulk: Option<usize>,
    args: Command,
    /// The largest bulk taken (`None`: [`MAX_BULK`], the server's).
    max_bulk: Option<u64>,
}

impl RequestParser {
    /// A parser that refuses bulks over `max` bytes (at most [`MAX_BULK`]) as the server
    /// refuses those over its own limit.
    pub fn with_max_bulk(max: u64) -> RequestParser {
        RequestParser {
            max_bulk: Some(max.min(MAX_BULK)),
            ..RequestParser::default()
        }
    }

    /// Reads from `buf`, the bytes not yet consumed; returns how many it consumed and what it
    /// found. `auth_required`: the client has not authenticated, so long requests are refused
    /// before they are read. After an error the stream is not to be read further.
    pub fn step(
        &mut self,
        buf: &[u8],
        auth_required: bool,
    ) -> Result<(usize, Step), ProtocolError> {
        if self.left == 0 {
            match buf.first() {
                None => return Ok((0, Step::More)),
                Some(b'*') => {}
                Some(_) => return inline(buf),
            }
            let Some(end) = line_end(buf) else {
                return if buf.len() > MAX_INLINE {
                    Err(ProtocolError::TooBigCount)
                } else {
                    Ok((0, Step::More))
                };
            };
            let Some(count) = string2ll(&buf[1..end]).filter(|&n| n <= MAX_COUNT) else {
                return Err(ProtocolError::InvalidCount);
            };
            if count > UNAUTH_COUNT && auth_required {
                return Err(ProtocolError::UnauthenticatedCount);
            }
            if count <= 0 {
                return Ok((end + 2, Step::Command(Command::default())));
            }
            self.left = count as usize;
            self.args = Command {
                data: Vec::new(),
                ends: Vec::with_capacity(self.left.min(1024)),
            };
            let (used, step) = self.elements(&buf[end + 2..], auth_required)?;
            return Ok((end + 2 + used, step));
        }
        self.elements(buf, auth_required)
    }

    fn elements(
        &mut self,
        buf: &[u8],
        auth_required: bool,
    ) -> Result<(usize, Step), ProtocolError> {
        let mut pos = 0;
        while self.left > 0 {
            let rest = &buf[pos..];
            let len = match self.bulk {
                Some(len) => len,
                None => {
                    let Some(end) = line_end(rest) else {
                        if rest.len() > MAX_INLINE {
                            return Err(ProtocolError::TooBigBulkCount);
                        }
                        return Ok((pos, Step::More));
                    };
                    if rest[0] != b'$' {
                        return Err(ProtocolError::ExpectedDollar(rest[0]));
                    }
                    let len = string2ll(&rest[1..end])
                        .filter(|&n| n >= 0 && n as u64 <= self.max_bulk.unwrap_or(MAX_BULK))
                        .ok_or(ProtocolError::InvalidBulk)?;
                    if len > UNAUTH_BULK && auth_required {
                        return Err(ProtocolError::UnauthenticatedBulk);
                    }
                    pos += end + 2;
                    self.bulk = Some(len as usize);
                    len as usize
                }
            };
            let rest = &buf[pos..];
            // The two bytes after the data are skipped unread, as the server skips them.
            if rest.len() < len + 2 {
                return Ok((pos, Step::More));
            }
            if self.args.data.capacity() == 0 {
                self.args.data.reserve(len + 64);
            }
            self.args.push(&rest[..len]);
            pos += len + 2;
            self.bulk = None;
            self.left -= 1;
        }
        Ok((pos, Step::Command(std::mem::take(&mut self.args))))
    }
}

/// Where the line at the front of `buf` ends: the index of its `\r`, when `\n` follows it. A
/// NUL before any `\r` hides the line, as the server's C string search stops there.
fn line_end(buf: &[u8]) -> Option<usize> {
    let cr = buf.iter().position(|&b| b == b'\r' || b == 0)?;
    (buf[cr] == b'\r' && cr + 1 < buf.len()).then_some(cr)
}

/// An inline request: one line, split into arguments.
fn inline(buf: &[u8]) -> Result<(usize, Step), ProtocolError> {
    let Some(nl) = buf
        .iter()
        .position(|&b| b == b'\n' || b == 0)
        .filter(|&i| buf[i] == b'\n')
    else {
        return if buf.len() > MAX_INLINE {
            Err(ProtocolError::TooBigInline)
        } else {
            Ok((0, Step::More))
        };
    };
    if nl > MAX_INLINE {
        return Err(ProtocolError::TooBigInline);
    }
    let line = match buf[..nl].strip_suffix(b"\r") {
        Some(line) => line,
        None => &buf[..nl],
    };
    let args = split_args(line).ok_or(ProtocolError::UnbalancedQuotes)?;
    Ok((nl + 1, Step::Command(Command::from_words(&args))))
}

/// Splits an inline line as the server does: blanks separate arguments; `"..."` holds
/// escapes (`\n`, `\xHH`, ...) and `'...'` only `\'`; a closing quote must end its argument.
/// `None` for unbalanced quotes.
pub fn split_args(line: &[u8]) -> Option<Vec<Vec<u8>>> {
    let at = |i: usize| line.get(i).copied().unwrap_or(0);
    let mut args = Vec::new();
    let mut p = 0;
    loop {
        while p < line.len() && is_space(line[p]) {
            p += 1;
        }
        if p >= line.len() {
            return Some(args);
        }
        let mut current = Vec::new();
        // The quote the argument is in, if any.
        let mut quote: Option<u8> = None;
        loop {
            let c = at(p);
            let escape = c == b'\\' && at(p + 1) != 0;
            match quote {
                Some(b'"')
                    if escape
                        && at(p + 1) == b'x'
                        && hex(at(p + 2)).zip(hex(at(p + 3))).is_some() =>
                {
                    current.push(hex(at(p + 2))? * 16 + hex(at(p + 3))?);
                    p += 3;
                }
                Some(b'"') if escape => {
                    p += 1;
                    current.push(match at(p) {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'b' => 8,
                        b'a' => 7,
                        other => other,
                    });
                }
                Some(b'\'') if escape && at(p + 1) == b'\'' => {
                    p += 1;
                    current.push(b'\'');
                }
                // A closing quote must end its argument.
                Some(q) if c == q => {
                    if at(p + 1) != 0 && !is_space(at(p + 1)) {
                        return None;
                    }
                    p += 1;
                    break;
                }
                Some(_) if c == 0 => return None,
                Some(_) => current.push(c),
                None => match c {
                    b' ' | b'\n' | b'\r' | b'\t' | 0 => {
                        p += 1;
                        break;
                    }
                    b'"' | b'\'' => quote = Some(c),
                    _ => current.push(c),
                },
            }
            p += 1;
        }
        args.push(current);
    }
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// A decimal integer as the server reads one: an optional `-`, no leading zeros or `+`, no
/// blanks, within an `i64`.
pub fn string2ll(text: &[u8]) -> Option<i64> {
    if text.is_empty() || text.len() > 20 {
        return None;
    }
    if text == b"0" {
        return Some(0);
    }
    let (negative, digits) = match text.strip_prefix(b"-") {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    if !matches!(digits.first(), Some(b'1'..=b'9')) || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut value: u64 = 0;
    for &d in digits {
        value = value.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    if negative {
        0i64.checked_sub_unsigned(value)
    } else {
        i64::try_from(value).ok()
    }
}

/// Appends `args` as a multibulk request.
pub fn encode_command<A: AsRef<[u8]>>(args: &[A], out: &mut Vec<u8>) {
    header(b'*', args.len(), out);
    for arg in args {
        bulk(arg.as_ref(), out);
    }
}

/// Appends a bulk string.
pub fn bulk(data: &[u8], out: &mut Vec<u8>) {
    header(b'$', data.len(), out);
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// Appends `kind`, `n` in decimal and a line end.
pub fn header(kind: u8, n: usize, out: &mut Vec<u8>) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.push(kind);
    out.extend_from_slice(&digits[at..]);
    out.extend_from_slice(b"\r\n");
}

/// An error reply: `-` and `message` (its line breaks made blanks, as the server makes them),
/// with `ERR ` put first unless it starts with a code already written by the caller.
pub fn error(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(message.len() + 3);
    out.push(b'-');
    out.extend(message.iter().map(|&b| match b {
        b'\r' | b'\n' => b' ',
        b => b,
    }));
    out.extend_from_slice(b"\r\n");
    out
}

/// The server's reply to a command it does not know: its name and the start of its
/// arguments, each cut at a NUL as the server's C strings are, and at 128 bytes.
pub fn unknown_command(args: &Command) -> Vec<u8> {
    let c_str = |a: &[u8]| -> Vec<u8> {
        let end = a.iter().position(|&b| b == 0).unwrap_or(a.len());
        a[..end].to_vec()
    };
    let mut message = b"ERR unknown command '".to_vec();
    let name = c_str(args.word(0));
    message.extend_from_slice(&name[..name.len().min(128)]);
    message.extend_from_slice(b"', with args beginning with: ");
    let mut listed: Vec<u8> = Vec::new();
    for arg in args.words().skip(1) {
        if listed.len() >= 128 {
            break;
        }
        let arg = c_str(arg);
        let room = 128 - listed.len();
        listed.push(b'\'');
        listed.extend_from_slice(&arg[..arg.len().min(room)]);
        listed.extend_from_slice(b"' ");
    }
    message.extend_from_slice(&listed);
    error(&message)
}

/// A reply that could not be framed: the server's stream is not RESP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyError;

impl fmt::Display for ReplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("malformed RESP reply")
    }
}

impl std::error::Error for ReplyError {}

/// Finds where a reply ends in a server's stream, resuming where it stopped as bytes arrive.
#[derive(Debug, Default, Clone)]
pub struct ReplyFramer {
    /// Bytes of the reply framed so far.
    pos: usize,
    /// Per aggregate open, the elements it still needs.
    open: Vec<u64>,
}

/// The longest reply line (a status, an error, a number): past it without an end, the stream
/// is taken as broken.
const MAX_LINE: usize = 1 << 20;
/// The longest reply: one held whole while it arrives, so a server cannot make it grow for
/// ever.
pub const MAX_REPLY: usize = 512 << 20;

impl ReplyFramer {
    /// The reply's length once `buf` (the reply from its first byte) holds all of it.
    pub fn reply_len(&mut self, buf: &[u8]) -> Result<Option<usize>, ReplyError> {
        loop {
            // Given less than before: not the stream it was framing.
            let Some(rest) = buf.get(self.pos..) else {
                return Err(ReplyError);
            };
            let Some(&kind) = rest.first() else {
                return Ok(None);
            };
            let Some(end) = rest.windows(2).take(MAX_LINE).position(|w| w == b"\r\n") else {
                return if rest.len() > MAX_LINE {
                    Err(ReplyError)
                } else {
                    Ok(None)
                };
            };
            // A line end where the type byte should be.
            if end == 0 {
                return Err(ReplyError);
            }
            let line = &rest[1..end];
            let number = || string2ll(line).ok_or(ReplyError);
            // How many elements the value opens, and how many bytes follow its line.
            let (children, body) = match kind {
                b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => (0, 0),
                b'$' | b'!' | b'=' => match number()? {
                    -1 if kind == b'$' => (0, 0),
                    n if n >= 0 && n as u64 <= MAX_BULK => (0, n as usize + 2),
                    _ => return Err(ReplyError),
                },
                b'*' | b'~' | b'>' | b'%' | b'|' => match number()? {
                    -1 if kind == b'*' => (0, 0),
                    n if n >= 0 => {
                        let n = n as u64;
                        match kind {
                            b'%' => (n * 2, 0),
                            // An attribute's pairs, then the value they describe.
                            b'|' => (n * 2 + 1, 0),
                            _ => (n, 0),
                        }
                    }
                    _ => return Err(ReplyError),
                },
                _ => return Err(ReplyError),
            };
            let size = end + 2 + body;
            if self.pos + size > MAX_REPLY {
                return Err(ReplyError);
            }
            if rest.len() < size {
                return Ok(None);
            }
            if body >= 2 && &rest[size - 2..size] != b"\r\n" {
                return Err(ReplyError);
            }
            self.pos += size;
            if children > 0 {
                self.open.push(children);
                continue;
            }
            // A whole value: it completes its parent, and maybe the parent's parents.
            loop {
                match self.open.last_mut() {
                    None => {
                        let len = self.pos;
                        *self = ReplyFramer::default();
                        return Ok(Some(len));
                    }
                    Some(left) => {
                        *left -= 1;
                        if *left > 0 {
                            break;
                        }
                        self.open.pop();
                    }
                }
            }
        }
    }
}

/// The elements of an array reply (`*n`), each a whole reply; `None` if `reply` is not one
/// whole array.
pub fn array_elements(reply: &[u8]) -> Option<Vec<&[u8]>> {
    let end = reply.windows(2).position(|w| w == b"\r\n")?;
    if reply.first() != Some(&b'*') {
        return None;
    }
    let count = string2ll(&reply[1..end]).filter(|&n| n >= 0)? as usize;
    let mut elements = Vec::with_capacity(count.min(1024));
    let mut pos = end + 2;
    for _ in 0..count {
        let len = ReplyFramer::default().reply_len(&reply[pos..]).ok()??;
        elements.push(&reply[pos..pos + len]);
        pos += len;
    }
    (pos == reply.len()).then_some(elements)
}

/// Slots of a Redis Cluster.
pub const SLOTS: usize = 16384;

/// The cluster slot of `key`: CRC16 (XMODEM) of its hash tag (the bytes between its first `{`
/// and the first `}` after it, when there is at least one) or of the whole key, mod 16384.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    (crc16_xmodem(hashed) as usize % SLOTS) as u16
}

fn crc16_xmodem(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// A cluster's redirection: `-MOVED slot host:port` (the slot lives there now) or `-ASK slot
/// host:port` (this one request goes there, after `ASKING`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirection {
    pub ask: bool,
    pub slot: u16,
    pub to: std::net::SocketAddr,
}

/// The redirection `reply` is, if it is one.
pub fn redirection(reply: &[u8]) -> Option<Redirection> {
    let line = reply.strip_suffix(b"\r\n")?;
    let (ask, rest) = match line {
        [b'-', b'M', b'O', b'V', b'E', b'D', b' ', rest @ ..] => (false, rest),
        [b'-', b'A', b'S', b'K', b' ', rest @ ..] => (true, rest),
        _ => return None,
    };
    let text = std::str::from_utf8(rest).ok()?;
    let (slot, to) = text.split_once(' ')?;
    let slot: u16 = slot.parse().ok().filter(|&s| (s as usize) < SLOTS)?;
    // An IPv6 host is written bare (`::1:7000`): the port follows the last colon.
    let (host, port) = to.rsplit_once(':')?;
    let ip: std::net::IpAddr = host.trim_matches(['[', ']']).parse().ok()?;
    Some(Redirection {
        ask,
        slot,
        to: std::net::SocketAddr::new(ip, port.parse().ok()?),
    })
}

/// The value of an integer reply (`:n`).
pub fn integer(reply: &[u8]) -> Option<i64> {
    let body = reply.strip_prefix(b":")?.strip_suffix(b"\r\n")?;
    string2ll(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(stream: &[u8]) -> (Vec<Command>, Option<ProtocolError>) {
        let mut parser = RequestParser::default();
        let mut commands = Vec::new();
        let mut pos = 0;
        loop {
            match parser.step(&stream[pos..], false) {
                Ok((used, Step::Command(args))) => {
                    pos += used;
                    commands.push(args);
                }
                Ok((_, Step::More)) => return (commands, None),
                Err(e) => return (commands, Some(e)),
            }
        }
    }

    fn args(list: &[&str]) -> Command {
        Command::from_words(list)
    }

    #[test]
    fn multibulk_and_inline_requests_read_as_the_server_reads_them() {
        let (commands, error) =
            parse_all(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\nSET a \"b c\\x41\"\r\n\r\n*0\r\nPING\n");
        assert_eq!(error, None);
        assert_eq!(
            commands,
            vec![
                args(&["GET", "k"]),
                args(&["SET", "a", "b cA"]),
                Command::default(),
                Command::default(),
                args(&["PING"])
            ]
        );
        assert_eq!(
            split_args(b"a 'it\\'s' \"q\\\"\\n\\x4\" b\\c"),
            Some(vec![
                b"a".to_vec(),
                b"it's".to_vec(),
                // An escape that is not one keeps its letter, as the server's does.
                b"q\"\nx4".to_vec(),
                b"b\\c".to_vec()
            ])
        );
        assert_eq!(split_args(b"'a'b"), None);
        // The two bytes after a bulk's data are skipped unread.
        let (commands, _) = parse_all(b"*1\r\n$4\r\nPINGxx");
        assert_eq!(commands, vec![args(&["PING"])]);
    }

    #[test]
    fn a_request_read_in_pieces_is_the_same_request() {
        let stream = b"*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$10\r\n0123456789\r\n";
        let mut parser = RequestParser::default();
        let mut buf = Vec::new();
        let mut found = None;
        for &b in stream.iter() {
            buf.push(b);
            let (used, step) = parser.step(&buf, false).unwrap();
            buf.drain(..used);
            if let Step::Command(args) = step {
                found = Some(args);
            }
        }
        assert_eq!(found, Some(args(&["SET", "key", "0123456789"])));
        assert!(buf.is_empty());
    }

    #[test]
    fn bad_streams_get_the_servers_protocol_errors() {
        let cases: &[(&[u8], &[u8])] = &[
            (
                b"*x\r\n",
                b"-ERR Protocol error: invalid multibulk length\r\n",
            ),
            (
                b"*01\r\n",
                b"-ERR Protocol error: invalid multibulk length\r\n",
            ),
            (
                b"*3000000000\r\n",
                b"-ERR Protocol error: invalid multibulk length\r\n",
            ),
            (
                b"*1\r\n$-1\r\n",
                b"-ERR Protocol error: invalid bulk length\r\n",
            ),
            (
                b"*1\r\n$536870913\r\n",
                b"-ERR Protocol error: invalid bulk length\r\n",
            ),
            (
                b"*1\r\n:1\r\n",
                b"-ERR Protocol error: expected '$', got ':'\r\n",
            ),
            (
                b"*1\r\n\n\r\n",
                b"-ERR Protocol error: expected '$', got ' '\r\n",
            ),
            (
                b"GET \"a\r\n",
                b"-ERR Protocol error: unbalanced quotes in request\r\n",
            ),
            (
                b"GET \"a\"b\r\n",
                b"-ERR Protocol error: unbalanced quotes in request\r\n",
            ),
        ];
        for (stream, reply) in cases {
            let (_, error) = parse_all(stream);
            let error = error.unwrap_or_else(|| panic!("{:?} parsed", stream.escape_ascii()));
            assert_eq!(error.reply(), *reply, "{}", stream.escape_ascii());
        }
        let long = vec![b'a'; MAX_INLINE + 1];
        assert_eq!(parse_all(&long).1, Some(ProtocolError::TooBigInline));
        let mut count = b"*".to_vec();
        count.extend(std::iter::repeat_n(b'1', MAX_INLINE + 1));
        assert_eq!(parse_all(&count).1, Some(ProtocolError::TooBigCount));
    }

    #[test]
    fn an_unauthenticated_client_may_not_announce_much() {
        let mut parser = RequestParser::default();
        assert_eq!(
            parser.step(b"*11\r\n", true),
            Err(ProtocolError::UnauthenticatedCount)
        );
        let mut parser = RequestParser::default();
        assert_eq!(
            parser.step(b"*1\r\n$16385\r\n", true),
            Err(ProtocolError::UnauthenticatedBulk)
        );
    }

    #[test]
    fn integers_read_as_the_server_reads_them() {
        for (text, value) in [
            ("0", Some(0)),
            ("-5", Some(-5)),
            ("9223372036854775807", Some(i64::MAX)),
            ("-9223372036854775808", Some(i64::MIN)),
            ("9223372036854775808", None),
            ("-0", None),
            ("+1", None),
            ("01", None),
            (" 1", None),
            ("", None),
            ("-", None),
        ] {
            assert_eq!(string2ll(text.as_bytes()), value, "{text}");
        }
    }

    #[test]
    fn replies_of_every_type_are_framed_whole_and_in_pieces() {
        let replies: &[&[u8]] = &[
            b"+OK\r\n",
            b"-ERR no\r\n",
            b":42\r\n",
            b"$-1\r\n",
            b"*-1\r\n",
            b"$5\r\nhe\r\no\r\n",
            b"*3\r\n$1\r\na\r\n$-1\r\n*1\r\n:1\r\n",
            b"%1\r\n+k\r\n~2\r\n_\r\n#t\r\n",
            b"|1\r\n+a\r\n:1\r\n$1\r\nx\r\n",
            b"*0\r\n",
        ];
        for reply in replies {
            let mut stream = reply.to_vec();
            stream.extend_from_slice(b"+NEXT\r\n");
            assert_eq!(
                ReplyFramer::default().reply_len(&stream),
                Ok(Some(reply.len())),
                "{}",
                reply.escape_ascii()
            );
            let mut framer = ReplyFramer::default();
            let whole = (1..=stream.len())
                .find_map(|n| framer.reply_len(&stream[..n]).unwrap())
                .unwrap();
            assert_eq!(whole, reply.len(), "{}", reply.escape_ascii());
        }
        for bad in [
            &b"?x\r\n"[..],
            b"$3\r\nabcde\r\n",
            b"*x\r\n",
            b"\r\n+OK\r\n",
            b"*1\r\n\r\n",
        ] {
            assert_eq!(ReplyFramer::default().reply_len(bad), Err(ReplyError));
        }
    }

    #[test]
    fn keys_find_their_cluster_slots_and_redirections_are_read() {
        assert_eq!(crc16_xmodem(b"123456789"), 0x31c3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"{}x"), key_slot(b"{}x"));
        assert_ne!(
            key_slot(b"{}a"),
            key_slot(b"{}b"),
            "an empty tag hashes the whole key"
        );
        assert_eq!(
            redirection(b"-MOVED 3999 127.0.0.1:6381\r\n"),
            Some(Redirection {
                ask: false,
                slot: 3999,
                to: "127.0.0.1:6381".parse().unwrap()
            })
        );
        assert!(redirection(b"-ASK 1 ::1:7000\r\n").is_some_and(|r| r.ask && r.to.port() == 7000));
        assert_eq!(redirection(b"-MOVED 16384 127.0.0.1:1\r\n"), None);
        assert_eq!(redirection(b"-ERR MOVED\r\n"), None);
    }

    #[test]
    fn an_unknown_command_is_named_as_the_server_names_it() {
        assert_eq!(
            unknown_command(&args(&["foo", "a", "b\r\nc"])),
            b"-ERR unknown command 'foo', with args beginning with: 'a' 'b  c' \r\n"
        );
        assert_eq!(
            array_elements(b"*2\r\n$1\r\na\r\n$-1\r\n"),
            Some(vec![&b"$1\r\na\r\n"[..], b"$-1\r\n"])
        );
        assert_eq!(integer(b":-3\r\n"), Some(-3));
    }
}
