//! memcached requests as the switch sees them: which command, which key(s), how many bytes.
//!
//! [`parse`] reads one request from the front of a buffer (a UDP datagram payload or a TCP
//! stream) in the classic text, meta or binary protocol. It never allocates, never copies and
//! never panics: keys and the request itself are slices of the caller's buffer, so a request can
//! be routed on its key and forwarded byte for byte. [`recover`] answers a request that failed
//! to parse as memcached does. [`reply`] finds where each backend reply ends in a server's
//! stream and reads the backend side of a multi-key get that the switch split across servers;
//! [`stats`] merges the `stats` replies of several servers into one. [`cached`] answers
//! retrievals from a cache as memcached would, and reads cacheable items out of its replies.

pub mod binary;
pub mod cached;
mod line;
pub mod meta;
mod recover;
pub mod reply;
pub mod stats;
mod text;

pub use recover::{data_len, recover, recover_binary, recover_text, Recovery};

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod tests;

use core::fmt;
use core::ops::Range;

/// Longest key memcached accepts (`KEY_MAX_LENGTH` in memcached), in every protocol. For meta
/// base64 keys the limit applies to the encoded token, as memcached checks it before decoding.
pub const MAX_KEY_LEN: usize = 250;

/// Longest text or meta command line, terminator included, except for `get`/`gets`/`gat`/`gats`.
///
/// memcached closes a connection whose pending line has no `\n` within 2048 bytes unless it is a
/// multi-get, and multi-gets are unbounded. We enforce the same 2048 bytes on complete lines too,
/// so that a request and every prefix of it agree; no storage, delete, arithmetic or meta line
/// needs more than a 250-byte key and a few numbers. Retrieval lines are bounded only by the
/// caller's buffer.
pub const MAX_LINE_LEN: usize = 2048;

/// The largest data block memcached accepts in a storage command line (`INT_MAX - 2`).
pub const MAX_DATA_LEN: usize = i32::MAX as usize - 2;

/// Which of memcached's three request protocols a request is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// The classic text protocol (`get`, `set`, `delete`, ...).
    Text,
    /// The meta text protocol (`mg`, `ms`, `md`, `ma`, `mn`, `me`).
    Meta,
    /// The binary protocol (24-byte header, magic 0x80).
    Binary,
}

/// What a request asks memcached to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Get,
    Gets,
    Gat,
    Gats,
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    Cas,
    Delete,
    Incr,
    Decr,
    Touch,
    MetaGet,
    MetaSet,
    MetaDelete,
    MetaArithmetic,
    MetaNoop,
    MetaDebug,
    Version,
    Stats,
    FlushAll,
    Verbosity,
    Quit,
    Shutdown,
    /// Another keyless administrative text command memcached 1.6 knows: `slabs`, `lru`,
    /// `lru_crawler`, `watch`, `cache_memlimit`, `extstore`. Forwarded unchecked.
    Misc,
    /// A binary request, by opcode (see [`binary::opcode`]).
    Binary(u8),
}

impl Command {
    /// The command for a text or meta command name, which is case sensitive as in memcached.
    pub fn from_name(name: &[u8]) -> Option<Command> {
        let command = match name {
            b"get" => Command::Get,
            b"gets" => Command::Gets,
            b"gat" => Command::Gat,
            b"gats" => Command::Gats,
            b"set" => Command::Set,
            b"add" => Command::Add,
            b"replace" => Command::Replace,
            b"append" => Command::Append,
            b"prepend" => Command::Prepend,
            b"cas" => Command::Cas,
            b"delete" => Command::Delete,
            b"incr" => Command::Incr,
            b"decr" => Command::Decr,
            b"touch" => Command::Touch,
            b"mg" => Command::MetaGet,
            b"ms" => Command::MetaSet,
            b"md" => Command::MetaDelete,
            b"ma" => Command::MetaArithmetic,
            b"mn" => Command::MetaNoop,
            b"me" => Command::MetaDebug,
            b"version" => Command::Version,
            b"stats" => Command::Stats,
            b"flush_all" => Command::FlushAll,
            b"verbosity" => Command::Verbosity,
            b"quit" => Command::Quit,
            b"shutdown" => Command::Shutdown,
            b"slabs" | b"lru" | b"lru_crawler" | b"watch" | b"cache_memlimit" | b"extstore" => {
                Command::Misc
            }
            _ => return None,
        };
        Some(command)
    }

    /// The text or meta command name; `None` for [`Command::Misc`] and binary opcodes.
    pub fn name(self) -> Option<&'static str> {
        let name = match self {
            Command::Get => "get",
            Command::Gets => "gets",
            Command::Gat => "gat",
            Command::Gats => "gats",
            Command::Set => "set",
            Command::Add => "add",
            Command::Replace => "replace",
            Command::Append => "append",
            Command::Prepend => "prepend",
            Command::Cas => "cas",
            Command::Delete => "delete",
            Command::Incr => "incr",
            Command::Decr => "decr",
            Command::Touch => "touch",
            Command::MetaGet => "mg",
            Command::MetaSet => "ms",
            Command::MetaDelete => "md",
            Command::MetaArithmetic => "ma",
            Command::MetaNoop => "mn",
            Command::MetaDebug => "me",
            Command::Version => "version",
            Command::Stats => "stats",
            Command::FlushAll => "flush_all",
            Command::Verbosity => "verbosity",
            Command::Quit => "quit",
            Command::Shutdown => "shutdown",
            Command::Misc | Command::Binary(_) => return None,
        };
        Some(name)
    }

    /// The protocol a command belongs to.
    pub fn protocol(self) -> Protocol {
        match self {
            Command::MetaGet
            | Command::MetaSet
            | Command::MetaDelete
            | Command::MetaArithmetic
            | Command::MetaNoop
            | Command::MetaDebug => Protocol::Meta,
            Command::Binary(_) => Protocol::Binary,
            _ => Protocol::Text,
        }
    }

    /// Whether the command changes stored items: storage, delete, arithmetic, touch, flush, and
    /// `gat`/`gats`, which also reset the expiry of what they return. A meta get that carries a
    /// `T` or `N` flag changes the item too; that depends on flags and is not reported here.
    pub fn is_write(self) -> bool {
        match self {
            Command::Set
            | Command::Add
            | Command::Replace
            | Command::Append
            | Command::Prepend
            | Command::Cas
            | Command::Delete
            | Command::Incr
            | Command::Decr
            | Command::Touch
            | Command::Gat
            | Command::Gats
            | Command::MetaSet
            | Command::MetaDelete
            | Command::MetaArithmetic
            | Command::FlushAll => true,
            Command::Binary(op) => binary::opcode::is_write(op),
            _ => false,
        }
    }

    /// Whether the command returns item values (and so can be answered from a cache).
    pub fn is_retrieval(self) -> bool {
        match self {
            Command::Get | Command::Gets | Command::Gat | Command::Gats | Command::MetaGet => true,
            Command::Binary(op) => binary::opcode::is_retrieval(op),
            _ => false,
        }
    }

    /// Whether the command names item keys. `gat`/`gats` may still carry zero keys (memcached
    /// answers `END`), so use [`Request::key_count`] for the actual number.
    pub fn has_key(self) -> bool {
        match self {
            Command::Get
            | Command::Gets
            | Command::Gat
            | Command::Gats
            | Command::Set
            | Command::Add
            | Command::Replace
            | Command::Append
            | Command::Prepend
            | Command::Cas
            | Command::Delete
            | Command::Incr
            | Command::Decr
            | Command::Touch
            | Command::MetaGet
            | Command::MetaSet
            | Command::MetaDelete
            | Command::MetaArithmetic
            | Command::MetaDebug => true,
            Command::Binary(op) => binary::opcode::has_key(op),
            _ => false,
        }
    }
}

/// Where the keys of a request are, as offsets into the request bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeySpan {
    None,
    /// One key.
    One(usize, usize),
    /// Space-separated keys filling this part of a text retrieval line.
    Tokens(usize, usize),
}

/// One request, borrowed from the buffer it was parsed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    pub protocol: Protocol,
    pub command: Command,
    /// Bytes of the buffer this request occupies: the command line and its data block, or the
    /// binary header and body. The next request starts at `len`.
    pub len: usize,
    bytes: &'a [u8],
    keys: KeySpan,
    key_count: usize,
    noreply: bool,
    base64_key: bool,
    exptime: Option<(usize, usize)>,
    data: Option<(usize, usize)>,
    opaque: Option<u32>,
}

impl<'a> Request<'a> {
    /// A request with no keys, no data and no flags; the protocol parsers fill in the rest.
    fn new(command: Command, bytes: &'a [u8]) -> Request<'a> {
        Request {
            protocol: command.protocol(),
            command,
            len: bytes.len(),
            bytes,
            keys: KeySpan::None,
            key_count: 0,
            noreply: false,
            base64_key: false,
            exptime: None,
            data: None,
            opaque: None,
        }
    }

    fn slice(&self, (start, end): (usize, usize)) -> &'a [u8] {
        self.bytes.get(start..end).unwrap_or_default()
    }

    /// The keys in request order. A text `get`/`gets`/`gat`/`gats` may have many; binary `STAT`
    /// and other keyless commands have none.
    pub fn keys(&self) -> Keys<'a> {
        let inner = match self.keys {
            KeySpan::None => KeysInner::One(None),
            KeySpan::One(start, end) => KeysInner::One(Some(self.slice((start, end)))),
            KeySpan::Tokens(start, end) => {
                KeysInner::Tokens(line::Tokens::new(self.slice((start, end))))
            }
        };
        Keys { inner }
    }

    /// The first key, if any.
    pub fn key(&self) -> Option<&'a [u8]> {
        self.keys().next()
    }

    pub fn key_count(&self) -> usize {
        self.key_count
    }

    /// The whole request, `len` bytes, for forwarding unchanged.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Whether the client asked for no reply: text `noreply`, the meta `q` flag or a quiet binary
    /// opcode. What memcached 1.6.18 then leaves out differs:
    ///
    /// - text `noreply`: every reply, errors included, for a request this parser accepts;
    /// - meta `q`: `mg` hides `EN` only (a hit still answers `VA` or `HD`); `ms` and `md` hide
    ///   `HD` (`NS`, `EX`, `NF` are sent); `ma` hides `HD` and `VA` (`NF`, `NS`, `EX` are sent);
    ///   errors are always sent;
    /// - quiet binary opcodes: the success response, and for `GETQ`/`GETKQ`/`GATQ`/`GATKQ` the
    ///   miss; other failures (`DELETEQ` miss, `ADDQ` on an existing key, ...) are answered.
    ///
    /// So whether a reply comes depends on the outcome: a proxy cannot count on one. `mn` (meta
    /// and text) and binary `NOOP` always answer, and in order, so one sent after quiet requests
    /// marks where their replies end.
    pub fn noreply(&self) -> bool {
        self.noreply
    }

    /// Whether the meta key is base64 (flag `b`). The key returned by [`Request::key`] is then
    /// the raw token; memcached stores the item under the decoded bytes, so decode it with
    /// [`meta::decode_base64_key`] before hashing if it must land with the text-protocol key.
    pub fn base64_key(&self) -> bool {
        self.base64_key
    }

    /// The bytes memcached stores an item of this request under, for one of its key tokens:
    /// a base64 meta key decoded into `out`, any other key as it is. Place keys by these bytes,
    /// so that one item lands on one server whichever protocol names it.
    pub fn stored_key<'k>(
        &self,
        token: &'k [u8],
        out: &'k mut [u8; MAX_KEY_LEN],
    ) -> Result<&'k [u8], Error> {
        if self.base64_key {
            return meta::decode_base64_key(token, out);
        }
        Ok(token)
    }

    /// Whether the request takes effect only if the item's cas unique matches one it gives:
    /// text `cas`, a meta `ms`, `md` or `ma` with a `C` flag, a binary write whose header
    /// carries a cas value.
    pub fn compares_cas(&self) -> bool {
        match self.command {
            Command::Cas => true,
            Command::MetaSet | Command::MetaDelete | Command::MetaArithmetic => {
                // The command line only: an `ms` data block may hold anything.
                let bytes = self.bytes();
                let line = &bytes[..line_len(bytes).unwrap_or(bytes.len())];
                line_content(line)
                    .split(|&b| b == b' ')
                    .filter(|t| !t.is_empty())
                    .skip(2)
                    .any(|t| t.first() == Some(&b'C'))
            }
            Command::Binary(op) => {
                binary::opcode::is_write(op)
                    && self
                        .bytes()
                        .get(16..24)
                        .is_some_and(|c| c.iter().any(|&b| b != 0))
            }
            _ => false,
        }
    }

    /// The exptime argument of a text `gat`/`gats`, needed to rebuild a split request.
    pub fn exptime_token(&self) -> Option<&'a [u8]> {
        self.exptime.map(|r| self.slice(r))
    }

    /// The data block of a storage request, without its trailing `\r\n` (text, meta), or the
    /// value of a binary request.
    pub fn data(&self) -> Option<&'a [u8]> {
        self.data.map(|r| self.slice(r))
    }

    /// The opaque field of a binary request, echoed in its response.
    pub fn opaque(&self) -> Option<u32> {
        self.opaque
    }
}

/// Iterator over the keys of a [`Request`], in request order.
#[derive(Debug, Clone)]
pub struct Keys<'a> {
    inner: KeysInner<'a>,
}

#[derive(Debug, Clone)]
enum KeysInner<'a> {
    One(Option<&'a [u8]>),
    Tokens(line::Tokens<'a>),
}

impl<'a> Iterator for Keys<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        match &mut self.inner {
            KeysInner::One(key) => key.take(),
            KeysInner::Tokens(tokens) => tokens.next().map(|(_, token)| token),
        }
    }
}

/// Why a request could not be read. Each variant is a separate drop reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The command name is not one memcached knows, or the line is empty.
    UnknownCommand,
    /// A known command with too few or too many arguments (memcached answers `ERROR`).
    WrongArgCount,
    /// A malformed argument: a bad number in a storage line, a meta `ms` without a length.
    BadFormat,
    /// A key longer than [`MAX_KEY_LEN`].
    KeyTooLong,
    /// A text key containing a control character or DEL (bytes <= 0x20 and 0x7f). memcached
    /// itself only splits on spaces; the switch refuses such keys as the protocol forbids them.
    BadKey,
    /// A meta `b` key that is not valid padded base64 (`mg`, `ms`).
    BadBase64Key,
    /// A meta `md`/`ma` `b` key that is not valid base64, which memcached 1.6 reports as a bad
    /// flag.
    BadMetaFlag,
    /// A meta command with more tokens than memcached takes (`mg`'s wording).
    TooManyGetFlags,
    /// A meta command with more tokens than memcached takes (`ms`, `md`, `ma`).
    TooManyFlags,
    /// A meta flag given twice, or starting with a byte of 127 or above.
    DuplicateFlag,
    /// A meta flag memcached does not know.
    InvalidFlag,
    /// A meta `N`, `T`, `R` or `C` flag whose number does not read.
    BadFlagToken,
    /// A meta `F` flag whose number does not read (memcached gives no message of its own).
    BadFlagValue,
    /// A meta `M` flag that is not one mode character.
    BadModeLength,
    /// A meta `J` flag whose number does not read.
    BadInitial,
    /// A meta `D` flag whose number does not read.
    BadDeltaFlag,
    /// A meta `O` flag longer than memcached echoes.
    OpaqueTooLong,
    /// An `ms` mode memcached does not know.
    BadSetMode,
    /// An `ma` mode memcached does not know.
    BadArithmeticMode,
    /// A data block not followed by `\r\n`.
    BadDataChunk,
    /// A `gat`, `touch` or `flush_all` exptime that is not a number.
    BadExptime,
    /// An `incr`/`decr` delta that is not an unsigned 64-bit number.
    BadDelta,
    /// `delete <key> <x>` with something other than `0` or `noreply`.
    BadDelete,
    /// A command line longer than [`MAX_LINE_LEN`].
    LineTooLong,
    /// A binary request whose first byte is not 0x80.
    BadMagic,
    /// A binary header whose body length is smaller than its extras and key.
    BadBinaryHeader,
    /// A binary request whose extras, key or value do not fit its opcode.
    BadBinaryArgs,
}

impl Error {
    /// What memcached 1.6 sends back on the text protocol for this error.
    ///
    /// Two variants have no memcached reply: memcached closes the connection on a line too long
    /// (see [`Error::closes_connection`]) and this returns an empty slice; binary errors are
    /// answered with a binary status ([`Error::binary_status`]) and this returns `ERROR`.
    pub fn text_reply(self) -> &'static [u8] {
        match self {
            Error::UnknownCommand | Error::WrongArgCount => b"ERROR\r\n",
            Error::BadFormat | Error::KeyTooLong | Error::BadKey => {
                b"CLIENT_ERROR bad command line format\r\n"
            }
            Error::BadBase64Key => b"CLIENT_ERROR error decoding key\r\n",
            Error::BadMetaFlag => b"CLIENT_ERROR invalid or duplicate flag\r\n",
            Error::TooManyGetFlags => b"CLIENT_ERROR options flags are too long\r\n",
            Error::TooManyFlags => b"CLIENT_ERROR options flags too long\r\n",
            Error::DuplicateFlag => b"CLIENT_ERROR duplicate flag\r\n",
            Error::InvalidFlag => b"CLIENT_ERROR invalid flag\r\n",
            Error::BadFlagToken => b"CLIENT_ERROR bad token in command line format\r\n",
            Error::BadFlagValue => b"CLIENT_ERROR bad command line format\r\n",
            Error::BadModeLength => b"CLIENT_ERROR incorrect length for M token\r\n",
            Error::BadInitial => b"CLIENT_ERROR invalid numeric initial value\r\n",
            Error::BadDeltaFlag => b"CLIENT_ERROR invalid numeric delta value\r\n",
            Error::OpaqueTooLong => b"CLIENT_ERROR opaque token too long\r\n",
            Error::BadSetMode => b"CLIENT_ERROR invalid mode for ms M token\r\n",
            Error::BadArithmeticMode => b"CLIENT_ERROR invalid mode for ma M token\r\n",
            Error::BadDataChunk => b"CLIENT_ERROR bad data chunk\r\n",
            Error::BadExptime => b"CLIENT_ERROR invalid exptime argument\r\n",
            Error::BadDelta => b"CLIENT_ERROR invalid numeric delta argument\r\n",
            Error::BadDelete => {
                b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n"
            }
            Error::LineTooLong => b"",
            Error::BadMagic | Error::BadBinaryHeader | Error::BadBinaryArgs => b"ERROR\r\n",
        }
    }

    /// The binary response status memcached 1.6 answers a binary request with: 0x0081 "Unknown
    /// command" for an unknown opcode and for a body shorter than its extras and key, 0x0004
    /// "Invalid arguments" otherwise. memcached closes the connection after all but the unknown
    /// opcode; see [`recover`].
    pub fn binary_status(self) -> u16 {
        match self {
            Error::UnknownCommand | Error::BadBinaryHeader => binary::status::UNKNOWN_COMMAND,
            _ => binary::status::INVALID_ARGUMENTS,
        }
    }

    /// Whether memcached closes the connection instead of (or after) replying, so that a proxy
    /// cannot resynchronise with the stream. memcached also closes after any error on a binary
    /// request answered "Invalid arguments", a key too long included; check the protocol too.
    pub fn closes_connection(self) -> bool {
        matches!(
            self,
            Error::LineTooLong | Error::BadMagic | Error::BadBinaryHeader | Error::BadBinaryArgs
        )
    }

    /// A short snake_case name, for counters.
    pub fn name(self) -> &'static str {
        match self {
            Error::UnknownCommand => "unknown_command",
            Error::WrongArgCount => "wrong_arg_count",
            Error::BadFormat => "bad_format",
            Error::KeyTooLong => "key_too_long",
            Error::BadKey => "bad_key",
            Error::BadBase64Key => "bad_base64_key",
            Error::BadMetaFlag => "bad_meta_flag",
            Error::TooManyGetFlags | Error::TooManyFlags => "too_many_flags",
            Error::DuplicateFlag => "duplicate_flag",
            Error::InvalidFlag => "invalid_flag",
            Error::BadFlagToken => "bad_flag_token",
            Error::BadFlagValue => "bad_flag_value",
            Error::BadModeLength => "bad_mode_length",
            Error::BadInitial => "bad_initial",
            Error::BadDeltaFlag => "bad_delta_flag",
            Error::OpaqueTooLong => "opaque_too_long",
            Error::BadSetMode => "bad_set_mode",
            Error::BadArithmeticMode => "bad_arithmetic_mode",
            Error::BadDataChunk => "bad_data_chunk",
            Error::BadExptime => "bad_exptime",
            Error::BadDelta => "bad_delta",
            Error::BadDelete => "bad_delete",
            Error::LineTooLong => "line_too_long",
            Error::BadMagic => "bad_magic",
            Error::BadBinaryHeader => "bad_binary_header",
            Error::BadBinaryArgs => "bad_binary_args",
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::error::Error for Error {}

/// Reads the request at the front of `buf`.
///
/// A first byte of 0x80 selects the binary protocol, anything else the text and meta protocols,
/// as memcached decides. `Ok(None)` means the request is incomplete: call again with more bytes.
/// After `Err` the stream cannot be trusted: drop the datagram, or answer and skip as memcached
/// does with [`recover`], or close.
pub fn parse(buf: &[u8]) -> Result<Option<Request<'_>>, Error> {
    match buf.first() {
        None => Ok(None),
        Some(&binary::REQUEST_MAGIC) => binary::parse_request(buf),
        Some(_) => parse_line(buf, false),
    }
}

/// Reads a text or meta request at the front of `buf`, whatever its first byte: memcached fixes
/// a TCP connection's protocol at its first byte, and reads everything after that as that
/// protocol (a 0x80 on a text connection starts an unknown command).
pub fn parse_text(buf: &[u8]) -> Result<Option<Request<'_>>, Error> {
    if buf.is_empty() {
        return Ok(None);
    }
    parse_line(buf, false)
}

/// Reads the command line of a text or meta request at the front of `buf`, as [`parse_text`]
/// does, without waiting for its data block: `Ok(None)` only until the line has arrived. The
/// request's `len` counts its data block (and the block's `\r\n`) whether or not it is in
/// `buf`; [`Request::bytes`] is the line alone, and the data block is neither read nor
/// checked. For a router that must place a request by its key before all of it has come.
pub fn parse_text_head(buf: &[u8]) -> Result<Option<Request<'_>>, Error> {
    if buf.is_empty() {
        return Ok(None);
    }
    parse_line(buf, true)
}

/// Length of the first line of `buf`, terminator included; `None` if no `\n` has arrived.
pub fn line_len(buf: &[u8]) -> Option<usize> {
    buf.iter().position(|&b| b == b'\n').map(|nl| nl + 1)
}

/// What memcached reads of a command line: the line without its `\n` and a `\r` before it, and
/// nothing from a NUL on (memcached reads a line as a C string).
pub fn line_content(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    &line[..line.iter().position(|&b| b == 0).unwrap_or(line.len())]
}

fn parse_line(buf: &[u8], head: bool) -> Result<Option<Request<'_>>, Error> {
    let Some(line) = line::Line::find(buf)? else {
        return Ok(None);
    };
    let mut tokens = line::Tokens::new(&buf[..line.end]);
    let Some((name_at, name)) = tokens.next() else {
        return Err(Error::UnknownCommand);
    };
    let command = Command::from_name(name).ok_or(Error::UnknownCommand)?;
    let args = Args {
        buf,
        line,
        tokens,
        name_end: name_at + name.len(),
        head,
    };
    match command.protocol() {
        Protocol::Meta => meta::parse(command, args),
        _ => text::parse(command, args),
    }
}

/// The arguments of a text or meta command line after its name.
struct Args<'a> {
    buf: &'a [u8],
    line: line::Line,
    tokens: line::Tokens<'a>,
    /// Offset just past the command name, where the arguments start.
    name_end: usize,
    /// Only the line is read: a data block is counted in the request's length, not awaited.
    head: bool,
}

impl<'a> Args<'a> {
    /// Collects up to `N` argument ranges; the count returned includes arguments past `N`.
    fn collect<const N: usize>(&mut self) -> ([Range<usize>; N], usize) {
        let mut ranges: [Range<usize>; N] = core::array::from_fn(|_| 0..0);
        let mut count = 0;
        for (at, token) in self.tokens.by_ref() {
            if let Some(slot) = ranges.get_mut(count) {
                *slot = at..at + token.len();
            }
            count += 1;
        }
        (ranges, count)
    }

    fn get(&self, range: &Range<usize>) -> &'a [u8] {
        self.buf.get(range.clone()).unwrap_or_default()
    }

    /// The request ending with the command line, nothing after it.
    fn line_only(&self, command: Command) -> Request<'a> {
        Request::new(command, self.buf.get(..self.line.next).unwrap_or_default())
    }

    /// The request ending with a data block of `data_len` bytes after the command line and its
    /// `\r\n`; `Ok(None)` until all of it has arrived.
    fn with_data(&self, command: Command, data_len: usize) -> Result<Option<Request<'a>>, Error> {
        let start = self.line.next;
        let end = start.checked_add(data_len).ok_or(Error::BadFormat)?;
        let Some(total) = end.checked_add(2) else {
            return Err(Error::BadFormat);
        };
        if self.head {
            let mut request = self.line_only(command);
            request.len = total;
            return Ok(Some(request));
        }
        let Some(bytes) = self.buf.get(..total) else {
            return Ok(None);
        };
        if &bytes[end..] != b"\r\n" {
            return Err(Error::BadDataChunk);
        }
        let mut request = Request::new(command, bytes);
        request.data = Some((start, end));
        Ok(Some(request))
    }
}

/// Checks a key's length. memcached splits command lines at spaces only, so any other byte,
/// control characters included, may be part of a key in every protocol.
fn check_key(key: &[u8], _protocol: Protocol) -> Result<(), Error> {
    if key.len() > MAX_KEY_LEN {
        return Err(Error::KeyTooLong);
    }
    Ok(())
}
