//! Answering retrievals from a cache exactly as memcached 1.6 answers them, and reading the
//! items a cache may keep out of memcached's own replies.
//!
//! [`servable`] says whether a request can be answered from a cache at all, [`write_hit`]
//! writes memcached's reply for one item byte for byte, and [`read_fills`] takes the items out
//! of a server's reply. Nothing here allocates but the caller's output buffer, and no input can
//! make it panic; it never decides what to cache or for how long.

use super::binary::{self, opcode, status, Header, HEADER_LEN};
use super::line::{parse_u64, Tokens};
use super::meta::decode_base64_key;
use super::reply::parse_retrieval_reply;
use super::{Command, Request, MAX_KEY_LEN};
use std::io::Write as _;

/// Longest `O` token, the `O` included, that memcached 1.6 echoes (`MFLAG_MAX_OPAQUE_LENGTH`);
/// a longer one is answered `CLIENT_ERROR opaque token too long`.
pub const MAX_OPAQUE_LEN: usize = 32;

/// How memcached holds an item's key, which decides how `mg ... k` shows it on a hit.
///
/// An item stored by `ms` with the `b` flag is marked as having a binary key, and memcached
/// echoes its key in base64 followed by a ` b` token (`kZm9v b`); every other item has its raw
/// key echoed (`kfoo`). This is a property of the item, not of the `mg`: `mg Zm9v b k` on an
/// item stored by `set foo` answers `kfoo`, and `mg foo k` on one stored by `ms Zm9v b`
/// answers `kZm9v b`. Only a reply that echoes the key reveals it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyForm {
    /// Not known: the item cannot answer an `mg` with `k`.
    #[default]
    Unknown,
    /// Stored under a plain key (text, binary, or meta without `b`).
    Raw,
    /// Stored by `ms` with `b`.
    Base64,
}

/// An item as a cache holds it: what a reply shows of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CachedItem<'a> {
    /// The client flags.
    pub flags: u32,
    /// The CAS unique, when the reply the item came from showed it.
    pub cas: Option<u64>,
    /// The value.
    pub data: &'a [u8],
    /// How the key was stored; see [`KeyForm`].
    pub key_form: KeyForm,
}

/// What answering a request from a cache takes; see [`servable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Serve {
    /// The reply shows the CAS unique: `gets`, `mg` with `c`, and every binary get (a binary
    /// response always carries it). An item without one cannot answer.
    pub want_cas: bool,
    /// A text get of several keys: one [`write_hit`] per key, in order, then one
    /// [`write_text_end`].
    pub multi: bool,
    /// An `mg` with `k`: the item's [`KeyForm`] must be known.
    pub echo_key: bool,
}

impl Serve {
    /// Whether `item` has all that the reply shows.
    pub fn can_answer(&self, item: &CachedItem<'_>) -> bool {
        (!self.want_cas || item.cas.is_some())
            && (!self.echo_key || item.key_form != KeyForm::Unknown)
    }
}

/// What answering `request` from a cache needs, or `None` when it cannot be answered from one.
///
/// Servable are text `get` and `gets` (any number of keys), binary `GET`, `GETQ`, `GETK` and
/// `GETKQ`, and `mg` whose flags are all among `v`, `k`, `f`, `c`, `s`, `O<opaque>`, `q` and
/// `b`, each at most once and, but for `O`, a single letter. Never servable: `gat`/`gats` and
/// their binary forms (they change the expiry), and `mg` with any other flag (`t`, `h`, `l`
/// show state a cache does not keep; `T`, `N`, `R`, `E` change the item), a repeated flag
/// (memcached answers `CLIENT_ERROR duplicate flag`) or an `O` token longer than
/// [`MAX_OPAQUE_LEN`].
pub fn servable(request: &Request<'_>) -> Option<Serve> {
    match request.command {
        Command::Get | Command::Gets if request.key_count() > 0 => Some(Serve {
            want_cas: request.command == Command::Gets,
            multi: request.key_count() > 1,
            echo_key: false,
        }),
        Command::MetaGet => {
            let ask = MetaAsk::read(request, SERVABLE_FLAGS)?;
            Some(Serve {
                want_cas: ask.cas,
                multi: false,
                echo_key: ask.key,
            })
        }
        Command::Binary(opcode::GET | opcode::GETQ | opcode::GETK | opcode::GETKQ) => Some(Serve {
            want_cas: true,
            multi: false,
            echo_key: false,
        }),
        _ => None,
    }
}

/// Appends memcached's reply to `request` for one hit on `item`, and returns `true`; returns
/// `false` with nothing written when the request is not [`servable`] or the item cannot answer
/// it ([`Serve::can_answer`]).
///
/// `token` is the key as the request names it: for a text get, each key of the line in turn
/// (call once per key, repeated keys included, and skip the misses), then [`write_text_end`]
/// once. The caller guarantees that `token` is a key of `request`; it is written as given.
///
/// - text: `VALUE <key> <flags> <bytes>[ <cas>]\r\n<data>\r\n`;
/// - meta: `VA <bytes> <ret flags>\r\n<data>\r\n` with `v`, `HD <ret flags>\r\n` without, the
///   ret flags in the order the request gives them (`k<key>`, `f<flags>`, `c<cas>`,
///   `s<bytes>`, the `O` token as sent; `q`, `b` and `v` show nothing). `q` hides only misses,
///   so a hit answers as without it;
/// - binary: magic 0x81, the request's opcode and opaque, status 0, 4 bytes of extras holding
///   the flags, the key for `GETK`/`GETKQ` only, the CAS.
#[must_use]
pub fn write_hit(
    request: &Request<'_>,
    token: &[u8],
    item: &CachedItem<'_>,
    out: &mut Vec<u8>,
) -> bool {
    match servable(request) {
        Some(serve) if serve.can_answer(item) => {}
        _ => return false,
    }
    match request.command {
        Command::Get | Command::Gets => {
            let cas = item.cas.filter(|_| request.command == Command::Gets);
            write_text_hit(token, item, cas, out);
            true
        }
        Command::MetaGet => write_meta_hit(request, token, item, out),
        Command::Binary(op) => write_binary_hit(op, request, token, item, out),
        _ => false,
    }
}

/// Appends the `END\r\n` that closes a text get, hits or not.
pub fn write_text_end(out: &mut Vec<u8>) {
    out.extend_from_slice(b"END\r\n");
}

/// Calls `each` with every item a server's complete reply to `request` carries that a cache
/// may keep, with the request's key token it belongs to (decode a base64 meta token with
/// [`Request::stored_key`]).
///
/// Read are: text `get`/`gets` replies up to `END` (a CAS only from `gets`), whose items must
/// name the request's keys in order; `mg` replies that carry the value and the client flags (`v`
/// and `f` were asked; the CAS when `c` was, the [`KeyForm`] when `k` was), for an `mg` whose
/// flags are those [`servable`] allows or `t`, `h`, `l`, which only show state, and not for a
/// stale item (`W`, `X` or `Z` in the reply); and binary `GET`, `GETQ`, `GETK`, `GETKQ`
/// success responses with the request's opcode and opaque. Bytes after the reply (the `NOOP`
/// that follows a quiet binary get, a next reply) are left alone, so a quiet get's `NOOP` alone
/// is a miss. Anything else (an error, a miss, a malformed or mismatched reply) yields nothing:
/// a reply is checked whole before its first item is passed on.
pub fn read_fills<'k, 'r>(
    request: &Request<'k>,
    reply: &'r [u8],
    mut each: impl FnMut(&'k [u8], CachedItem<'r>),
) {
    match request.command {
        Command::Get | Command::Gets => read_text_fills(request, reply, &mut each),
        Command::MetaGet => {
            if let (Some(token), Some(item)) = (request.key(), read_meta_fill(request, reply)) {
                each(token, item);
            }
        }
        Command::Binary(opcode::GET | opcode::GETQ | opcode::GETK | opcode::GETKQ) => {
            if let (Some(token), Some(item)) = (request.key(), read_binary_fill(request, reply)) {
                each(token, item);
            }
        }
        _ => {}
    }
}

/// `cas`: the item's CAS for `gets`, `None` for `get`.
fn write_text_hit(token: &[u8], item: &CachedItem<'_>, cas: Option<u64>, out: &mut Vec<u8>) {
    out.reserve(token.len() + item.data.len() + 64);
    out.extend_from_slice(b"VALUE ");
    out.extend_from_slice(token);
    out.push(b' ');
    push_decimal(out, u64::from(item.flags));
    out.push(b' ');
    push_decimal(out, item.data.len() as u64);
    if let Some(cas) = cas {
        out.push(b' ');
        push_decimal(out, cas);
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(item.data);
    out.extend_from_slice(b"\r\n");
}

fn write_meta_hit(
    request: &Request<'_>,
    token: &[u8],
    item: &CachedItem<'_>,
    out: &mut Vec<u8>,
) -> bool {
    let Some(ask) = MetaAsk::read(request, SERVABLE_FLAGS) else {
        return false;
    };
    // The key memcached holds the item under, for the `k` echo.
    let mut decoded = [0u8; MAX_KEY_LEN];
    let Ok(key) = request.stored_key(token, &mut decoded) else {
        return false;
    };
    let start = out.len();
    out.reserve(item.data.len() + 128);
    if ask.value {
        out.extend_from_slice(b"VA ");
        push_decimal(out, item.data.len() as u64);
    } else {
        out.extend_from_slice(b"HD");
    }
    for flag in meta_flags(request) {
        match flag.first() {
            Some(b'k') => {
                out.extend_from_slice(b" k");
                match item.key_form {
                    KeyForm::Raw => out.extend_from_slice(key),
                    KeyForm::Base64 => {
                        push_base64(out, key);
                        out.extend_from_slice(b" b");
                    }
                    KeyForm::Unknown => {
                        out.truncate(start);
                        return false;
                    }
                }
            }
            Some(b'f') => {
                out.extend_from_slice(b" f");
                push_decimal(out, u64::from(item.flags));
            }
            Some(b'c') => {
                out.extend_from_slice(b" c");
                push_decimal(out, item.cas.unwrap_or_default());
            }
            Some(b's') => {
                out.extend_from_slice(b" s");
                push_decimal(out, item.data.len() as u64);
            }
            Some(b'O') => {
                out.push(b' ');
                out.extend_from_slice(flag);
            }
            _ => {}
        }
    }
    out.extend_from_slice(b"\r\n");
    if ask.value {
        out.extend_from_slice(item.data);
        out.extend_from_slice(b"\r\n");
    }
    true
}

fn write_binary_hit(
    op: u8,
    request: &Request<'_>,
    token: &[u8],
    item: &CachedItem<'_>,
    out: &mut Vec<u8>,
) -> bool {
    let key = if matches!(op, opcode::GETK | opcode::GETKQ) {
        token
    } else {
        b""
    };
    let Ok(key_len) = u16::try_from(key.len()) else {
        return false;
    };
    let body = FLAGS_EXTRAS + key.len() + item.data.len();
    let Ok(body_len) = u32::try_from(body) else {
        return false;
    };
    out.reserve(HEADER_LEN + body);
    out.extend_from_slice(&[binary::RESPONSE_MAGIC, op]);
    out.extend_from_slice(&key_len.to_be_bytes());
    // Extras length, then a zero data type.
    out.extend_from_slice(&[FLAGS_EXTRAS as u8, 0]);
    out.extend_from_slice(&status::NO_ERROR.to_be_bytes());
    out.extend_from_slice(&body_len.to_be_bytes());
    out.extend_from_slice(&request.opaque().unwrap_or_default().to_be_bytes());
    out.extend_from_slice(&item.cas.unwrap_or_default().to_be_bytes());
    out.extend_from_slice(&item.flags.to_be_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(item.data);
    true
}

/// Length of the extras of a binary get response: the client flags.
const FLAGS_EXTRAS: usize = 4;

/// The `mg` flags [`servable`] accepts.
const SERVABLE_FLAGS: &[u8] = b"vkfcsOqb";

/// The `mg` flags [`read_fills`] accepts: the servable ones and those that only show the
/// item's state (remaining TTL, whether it was fetched, time since last access).
const READABLE_FLAGS: &[u8] = b"vkfcsOqbthl";

/// What an `mg` asks to see, from flags checked as [`MetaAsk::read`] says.
#[derive(Debug, Clone, Copy, Default)]
struct MetaAsk {
    value: bool,
    flags: bool,
    cas: bool,
    key: bool,
}

impl MetaAsk {
    /// Reads the flags of an `mg`; `None` if one is not in `allowed`, is repeated, is longer
    /// than one letter (but `O`), or is an `O` token longer than [`MAX_OPAQUE_LEN`].
    fn read(request: &Request<'_>, allowed: &[u8]) -> Option<MetaAsk> {
        let mut ask = MetaAsk::default();
        // memcached refuses a repeated flag; bit `b & 63` marks letter `b` as seen, and the
        // letters here are all distinct modulo 64.
        let mut seen = 0u64;
        for flag in meta_flags(request) {
            let (&letter, rest) = flag.split_first()?;
            if !allowed.contains(&letter) || (letter != b'O' && !rest.is_empty()) {
                return None;
            }
            if letter == b'O' && flag.len() > MAX_OPAQUE_LEN {
                return None;
            }
            let bit = 1u64 << (letter & 63);
            if seen & bit != 0 {
                return None;
            }
            seen |= bit;
            match letter {
                b'v' => ask.value = true,
                b'f' => ask.flags = true,
                b'c' => ask.cas = true,
                b'k' => ask.key = true,
                _ => {}
            }
        }
        Some(ask)
    }
}

/// The flag tokens of an `mg` request, after its name and key.
/// Longest exptime memcached reads as relative seconds (30 days); a larger one is a Unix time.
pub const MAX_RELATIVE_EXPTIME: i64 = 60 * 60 * 24 * 30;

/// What a write says of its item's expiry, so that a cache never serves the item past the time
/// memcached would drop it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// The write leaves the expiry as it was (append, prepend, incr, decr, delete, a meta
    /// arithmetic or set in append mode without `T`).
    Unchanged,
    /// The item expires `after` seconds from now (`None`: never; memcached's exptime 0), or
    /// at a time the cache cannot place (`Some(u32::MAX)`: an absolute Unix time, or a number
    /// memcached would read otherwise). `definite`: the write sets it whenever it stores
    /// (set, a meta set, touch, gat); otherwise it sets it only if it stores, which it may
    /// not (add, replace, cas, a meta arithmetic's autovivify).
    Sets { after: Option<u32>, definite: bool },
}

/// Where an item that a cache may not place in time expires: at an unknown time.
pub const UNKNOWN_EXPIRY: u32 = u32::MAX;

/// The [`Expiry`] a write request gives its item, read as memcached reads exptime (a number
/// of seconds; negative: expired at once; above [`MAX_RELATIVE_EXPTIME`]: a Unix time).
pub fn expiry(request: &Request<'_>) -> Expiry {
    let line = || {
        let bytes = request.bytes();
        let line = bytes.split(|&b| b == b'\n').next().unwrap_or_default();
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        Tokens::new(line).map(|(_, t)| t)
    };
    let text = |at: usize, definite: bool| Expiry::Sets {
        after: line().nth(at).map_or(Some(UNKNOWN_EXPIRY), read_exptime),
        definite,
    };
    let meta = |letter: u8| {
        meta_flags(request)
            .find(|f| f.first() == Some(&letter))
            .map(|f| read_exptime(&f[1..]))
    };
    match request.command {
        Command::Set => text(3, true),
        Command::Add | Command::Replace | Command::Cas => text(3, false),
        Command::Touch => text(2, true),
        Command::Gat | Command::Gats => Expiry::Sets {
            after: request
                .exptime_token()
                .map_or(Some(UNKNOWN_EXPIRY), read_exptime),
            definite: true,
        },
        Command::MetaSet => {
            // A mode other than set (E, A, P, R) may store nothing or keep the expiry.
            let mode = meta_flags(request)
                .find(|f| f.first() == Some(&b'M'))
                .and_then(|f| f.get(1).copied());
            let definite = matches!(mode, None | Some(b'S' | b's'));
            match (meta(b'T'), mode) {
                (Some(after), _) => Expiry::Sets { after, definite },
                (None, Some(b'A' | b'a' | b'P' | b'p')) => Expiry::Unchanged,
                (None, _) => Expiry::Sets {
                    after: None,
                    definite,
                },
            }
        }
        Command::MetaGet => match meta(b'T') {
            Some(after) => Expiry::Sets {
                after,
                definite: true,
            },
            None => Expiry::Unchanged,
        },
        Command::MetaArithmetic => match (meta(b'T'), meta(b'N')) {
            (Some(after), _) => Expiry::Sets {
                after,
                definite: true,
            },
            (None, Some(after)) => Expiry::Sets {
                after,
                definite: false,
            },
            (None, None) => Expiry::Unchanged,
        },
        Command::Binary(op) => binary_expiry(request, op),
        _ => Expiry::Unchanged,
    }
}

/// The expiry of a binary write: the extras' last four bytes for the storage commands (after
/// the flags) and the whole four for touch and the GATs.
fn binary_expiry(request: &Request<'_>, op: u8) -> Expiry {
    let definite = match op {
        opcode::SET | opcode::SETQ => true,
        opcode::ADD | opcode::ADDQ | opcode::REPLACE | opcode::REPLACEQ => false,
        opcode::TOUCH | opcode::GAT | opcode::GATQ | opcode::GATK | opcode::GATKQ => true,
        _ => return Expiry::Unchanged,
    };
    let bytes = request.bytes();
    let extras_len = bytes.get(4).copied().map_or(0, usize::from);
    let extras = bytes.get(24..24 + extras_len).unwrap_or_default();
    let after = match extras.len() {
        4 | 8 => {
            let at = extras.len() - 4;
            let raw =
                u32::from_be_bytes([extras[at], extras[at + 1], extras[at + 2], extras[at + 3]]);
            // memcached reads the field as a signed 32-bit number.
            exptime_seconds(i64::from(raw as i32))
        }
        _ => Some(UNKNOWN_EXPIRY),
    };
    Expiry::Sets { after, definite }
}

/// A text or meta exptime token, as memcached's `strtol` reads it; one it refuses never
/// reaches a cache (the request is refused), so an unreadable one is an unknown time.
fn read_exptime(token: &[u8]) -> Option<u32> {
    std::str::from_utf8(token)
        .ok()
        .and_then(|t| t.parse::<i64>().ok())
        .map_or(Some(UNKNOWN_EXPIRY), exptime_seconds)
}

/// Seconds from now to the expiry exptime `n` gives (`None`: never).
fn exptime_seconds(n: i64) -> Option<u32> {
    match n {
        0 => None,
        n if n < 0 => Some(0),
        n if n > MAX_RELATIVE_EXPTIME => Some(UNKNOWN_EXPIRY),
        n => Some(n as u32),
    }
}

fn meta_flags<'a>(request: &Request<'a>) -> impl Iterator<Item = &'a [u8]> {
    let bytes = request.bytes();
    let line = bytes.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    Tokens::new(line).skip(2).map(|(_, token)| token)
}

fn read_text_fills<'k, 'r>(
    request: &Request<'k>,
    reply: &'r [u8],
    each: &mut impl FnMut(&'k [u8], CachedItem<'r>),
) {
    let Ok(Some((items, _))) = parse_retrieval_reply(reply) else {
        return;
    };
    let gets = request.command == Command::Gets;
    // Checked whole first: memcached answers the keys in request order, skipping misses.
    let mut keys = request.keys();
    for item in items.clone() {
        if !keys.any(|key| key == item.key) || text_item(&item, gets).is_none() {
            return;
        }
    }
    let mut keys = request.keys();
    for item in items {
        let (Some(token), Some(cached)) =
            (keys.find(|&key| key == item.key), text_item(&item, gets))
        else {
            return;
        };
        each(token, cached);
    }
}

/// A `VALUE` item as a cache holds it; `None` if its numbers are bad or it shows a CAS when
/// `gets` did not ask for one, or none when it did.
fn text_item<'r>(item: &super::reply::Item<'r>, gets: bool) -> Option<CachedItem<'r>> {
    let flags = parse_u32(item.flags)?;
    let cas = match (gets, item.cas) {
        (true, Some(cas)) => Some(parse_u64(cas)?),
        (false, None) => None,
        _ => return None,
    };
    Some(CachedItem {
        flags,
        cas,
        data: item.data(),
        key_form: KeyForm::Unknown,
    })
}

fn read_meta_fill<'r>(request: &Request<'_>, reply: &'r [u8]) -> Option<CachedItem<'r>> {
    let ask = MetaAsk::read(request, READABLE_FLAGS)?;
    if !ask.value || !ask.flags {
        return None;
    }
    let nl = reply.iter().position(|&b| b == b'\n')?;
    let line = reply.get(..nl)?.strip_suffix(b"\r")?;
    let mut tokens = Tokens::new(line).map(|(_, token)| token);
    if tokens.next()? != b"VA" {
        return None;
    }
    let size = usize::try_from(parse_u64(tokens.next()?)?).ok()?;
    let data_start = nl + 1;
    let data_end = data_start.checked_add(size)?;
    let data = reply.get(data_start..data_end)?;
    if reply.get(data_end..data_end.checked_add(2)?)? != b"\r\n" {
        return None;
    }
    let (mut flags, mut cas, mut key_form) = (None, None, KeyForm::Unknown);
    let mut echo = None;
    let mut tokens = tokens.peekable();
    while let Some(token) = tokens.next() {
        let (&letter, value) = token.split_first()?;
        match letter {
            b'f' => flags = Some(parse_u32(value)?),
            b'c' => cas = Some(parse_u64(value)?),
            b'k' => {
                let base64 = tokens.next_if(|&next| next == b"b").is_some();
                key_form = if base64 {
                    KeyForm::Base64
                } else {
                    KeyForm::Raw
                };
                echo = Some(value);
            }
            // A stale item, or one whose value another client is asked to fetch.
            b'W' | b'X' | b'Z' => return None,
            _ => {}
        }
    }
    if ask.cas != cas.is_some() || ask.key != echo.is_some() {
        return None;
    }
    if let Some(echo) = echo {
        // The echoed key must be the request's: a mismatch means replies are out of step.
        let token = request.key()?;
        let mut stored = [0u8; MAX_KEY_LEN];
        let stored = request.stored_key(token, &mut stored).ok()?;
        let mut shown = [0u8; MAX_KEY_LEN];
        let shown = match key_form {
            KeyForm::Base64 => decode_base64_key(echo, &mut shown).ok()?,
            _ => echo,
        };
        if shown != stored {
            return None;
        }
    }
    Some(CachedItem {
        flags: flags?,
        cas,
        data,
        key_form,
    })
}

fn read_binary_fill<'r>(request: &Request<'_>, reply: &'r [u8]) -> Option<CachedItem<'r>> {
    let Command::Binary(op) = request.command else {
        return None;
    };
    let header: Header = binary::parse_response_header(reply).ok()??;
    let packet = reply.get(..header.packet_len())?;
    if header.opcode != op
        || header.status() != status::NO_ERROR
        || Some(header.opaque) != request.opaque()
        || usize::from(header.extras_len) != FLAGS_EXTRAS
    {
        return None;
    }
    let (key_start, key_end) = header.key_range();
    let want_key = match op {
        opcode::GETK | opcode::GETKQ => request.key()?,
        _ => b"",
    };
    if packet.get(key_start..key_end)? != want_key {
        return None;
    }
    let extras = packet.get(HEADER_LEN..key_start)?;
    let flags = u32::from_be_bytes(extras.try_into().ok()?);
    Some(CachedItem {
        flags,
        cas: Some(header.cas),
        data: packet.get(key_end..)?,
        key_form: KeyForm::Unknown,
    })
}

fn parse_u32(token: &[u8]) -> Option<u32> {
    u32::try_from(parse_u64(token)?).ok()
}

/// Appends `n` in decimal.
fn push_decimal(out: &mut Vec<u8>, n: u64) {
    // Writing to a Vec cannot fail.
    let _ = write!(out, "{n}");
}

/// Appends `bytes` in padded standard base64, as memcached echoes a binary key (and as a meta
/// command's key token with the `b` flag is read).
pub fn push_base64(out: &mut Vec<u8>, bytes: &[u8]) {
    for group in bytes.chunks(3) {
        let mut three = [0u8; 3];
        for (slot, &byte) in three.iter_mut().zip(group) {
            *slot = byte;
        }
        let [first, second, third] = three;
        let bits = u32::from_be_bytes([0, first, second, third]);
        let sextet = |shift: u32| base64_char((bits >> shift) as u8 & 63);
        out.push(sextet(18));
        out.push(sextet(12));
        out.push(if group.len() > 1 { sextet(6) } else { b'=' });
        out.push(if group.len() > 2 { sextet(0) } else { b'=' });
    }
}

/// The standard base64 character for a 6-bit value.
fn base64_char(sextet: u8) -> u8 {
    match sextet {
        0..=25 => b'A' + sextet,
        26..=51 => b'a' + (sextet - 26),
        52..=61 => b'0' + (sextet - 52),
        62 => b'+',
        _ => b'/',
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memcache::fixtures::{BIN_GETK, GETS, MG_VA};
    use crate::memcache::parse;

    #[test]
    fn writes_tell_their_items_expiry_as_memcached_reads_it() {
        let sets = |after: Option<u32>, definite: bool| Expiry::Sets { after, definite };
        let mut bin_set = Vec::new();
        binary::write_request(
            opcode::SET,
            b"k",
            &[0, 0, 0, 0, 0, 0, 0, 9],
            b"v",
            0,
            0,
            &mut bin_set,
        );
        let mut bin_touch = Vec::new();
        binary::write_request(
            opcode::TOUCH,
            b"k",
            &[0xff, 0xff, 0xff, 0xff],
            b"",
            0,
            0,
            &mut bin_touch,
        );
        let table: &[(&[u8], Expiry)] = &[
            (b"set a 0 0 1\r\nx\r\n", sets(None, true)),
            (b"set a 0 5 1\r\nx\r\n", sets(Some(5), true)),
            (b"set a 0 -1 1\r\nx\r\n", sets(Some(0), true)),
            (
                b"set a 0 2592001 1\r\nx\r\n",
                sets(Some(UNKNOWN_EXPIRY), true),
            ),
            (b"add a 0 7 1\r\nx\r\n", sets(Some(7), false)),
            (b"cas a 0 7 1 99\r\nx\r\n", sets(Some(7), false)),
            (b"touch a 3\r\n", sets(Some(3), true)),
            (b"gat 4 a b\r\n", sets(Some(4), true)),
            (b"append a 0 5 1\r\nx\r\n", Expiry::Unchanged),
            (b"incr a 1\r\n", Expiry::Unchanged),
            (b"delete a\r\n", Expiry::Unchanged),
            (b"ms a 1\r\nx\r\n", sets(None, true)),
            (b"ms a 1 T6\r\nx\r\n", sets(Some(6), true)),
            (b"ms a 1 ME T6\r\nx\r\n", sets(Some(6), false)),
            (b"ms a 1 MA\r\nx\r\n", Expiry::Unchanged),
            (b"mg a v T8\r\n", sets(Some(8), true)),
            (b"mg a v\r\n", Expiry::Unchanged),
            (b"ma a N9\r\n", sets(Some(9), false)),
            (b"ma a\r\n", Expiry::Unchanged),
            (&bin_set, sets(Some(9), true)),
            (&bin_touch, sets(Some(0), true)),
        ];
        for (bytes, want) in table {
            let request = parse(bytes).unwrap().unwrap();
            assert_eq!(
                expiry(&request),
                *want,
                "{}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    fn request(bytes: &[u8]) -> Request<'_> {
        match parse(bytes) {
            Ok(Some(request)) => request,
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(bytes)),
        }
    }

    fn binary_request(op: u8, key: &[u8], opaque: u32) -> Vec<u8> {
        let mut out = Vec::new();
        binary::write_request(op, key, b"", b"", opaque, 0, &mut out);
        out
    }

    fn item(flags: u32, cas: Option<u64>, data: &[u8], key_form: KeyForm) -> CachedItem<'_> {
        CachedItem {
            flags,
            cas,
            data,
            key_form,
        }
    }

    /// `write_hit` for one key, then `END` for a text get, or `None` if it refused.
    fn hit(request_bytes: &[u8], item: &CachedItem<'_>) -> Option<Vec<u8>> {
        let request = request(request_bytes);
        let mut out = Vec::new();
        if !write_hit(&request, request.key()?, item, &mut out) {
            assert!(out.is_empty(), "a refusal writes nothing");
            return None;
        }
        if request.protocol == crate::memcache::Protocol::Text {
            write_text_end(&mut out);
        }
        Some(out)
    }

    fn fills<'r>(request_bytes: &[u8], reply: &'r [u8]) -> Vec<(Vec<u8>, CachedItem<'r>)> {
        let mut out = Vec::new();
        // A request the parser refuses is never forwarded, so nothing fills from it.
        let Ok(Some(request)) = parse(request_bytes) else {
            return out;
        };
        read_fills(&request, reply, |token, item| {
            out.push((token.to_vec(), item))
        });
        out
    }

    const SERVE: Serve = Serve {
        want_cas: false,
        multi: false,
        echo_key: false,
    };

    #[test]
    fn servable_forms() {
        let cas = Serve {
            want_cas: true,
            ..SERVE
        };
        let key = Serve {
            echo_key: true,
            ..SERVE
        };
        let opaque_32 = format!("mg a O{}\r\n", "9".repeat(31));
        let table: &[(&[u8], Option<Serve>)] = &[
            (b"get a\r\n", Some(SERVE)),
            (
                b"get a b a\r\n",
                Some(Serve {
                    multi: true,
                    ..SERVE
                }),
            ),
            (b"gets a\r\n", Some(cas)),
            (
                b"get a noreply\r\n",
                Some(Serve {
                    multi: true,
                    ..SERVE
                }),
            ),
            (b"mg a\r\n", Some(SERVE)),
            (b"mg a v\r\n", Some(SERVE)),
            (b"mg a v f s q O1\r\n", Some(SERVE)),
            (b"mg a O\r\n", Some(SERVE)),
            (opaque_32.as_bytes(), Some(SERVE)),
            (b"mg a c v\r\n", Some(cas)),
            (b"mg a k\r\n", Some(key)),
            (b"mg YQ== b k v\r\n", Some(key)),
            (b"mg YQ== b\r\n", Some(SERVE)),
            // Change the expiry.
            (b"gat 10 a\r\n", None),
            (b"gats 10 a\r\n", None),
            (b"mg a v T10\r\n", None),
            // Show state a cache does not keep, or change the item.
            (b"mg a v t\r\n", None),
            (b"mg a v h\r\n", None),
            (b"mg a v l\r\n", None),
            (b"mg a v N30\r\n", None),
            (b"mg a v R30\r\n", None),
            (b"mg a v E5\r\n", None),
            (b"mg a v u\r\n", None),
            (b"mg a v x\r\n", None),
            // memcached answers CLIENT_ERROR (the parser refuses these too), or reads `vx` as
            // `v`: forwarded.
            (b"mg a v v\r\n", None),
            (b"mg a O1 O2\r\n", None),
            (b"mg a vx\r\n", None),
            (b"mg a O99999999999999999999999999999999\r\n", None),
            (b"set a 0 0 1\r\nx\r\n", None),
            (b"delete a\r\n", None),
            (b"ms a 1\r\nx\r\n", None),
            (b"mn\r\n", None),
            (b"me a\r\n", None),
        ];
        for &(bytes, want) in table {
            // A request memcached refuses is answered by the parser's recovery, never served.
            let Ok(Some(parsed)) = parse(bytes) else {
                assert_eq!(want, None, "{:?}", String::from_utf8_lossy(bytes));
                continue;
            };
            assert_eq!(
                servable(&parsed),
                want,
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
        }
        for op in [opcode::GET, opcode::GETQ, opcode::GETK, opcode::GETKQ] {
            assert_eq!(servable(&request(&binary_request(op, b"a", 1))), Some(cas));
        }
        let mut gat = Vec::new();
        binary::write_request(opcode::GATK, b"a", &[0; 4], b"", 1, 0, &mut gat);
        assert_eq!(servable(&request(&gat)), None);
        let delete = binary_request(opcode::DELETE, b"a", 1);
        assert_eq!(servable(&request(&delete)), None);
    }

    #[test]
    fn can_answer_needs_cas_and_key_form() {
        let plain = item(0, None, b"x", KeyForm::Unknown);
        let full = item(0, Some(3), b"x", KeyForm::Raw);
        assert!(SERVE.can_answer(&plain));
        let cas = Serve {
            want_cas: true,
            ..SERVE
        };
        assert!(!cas.can_answer(&plain) && cas.can_answer(&full));
        let key = Serve {
            echo_key: true,
            ..SERVE
        };
        assert!(!key.can_answer(&plain) && key.can_answer(&full));
        assert_eq!(hit(b"gets a\r\n", &plain), None);
        assert_eq!(hit(b"mg a c\r\n", &plain), None);
        assert_eq!(hit(b"mg a v k\r\n", &plain), None);
        assert_eq!(hit(&binary_request(opcode::GET, b"a", 1), &plain), None);
        assert_eq!(hit(b"gat 0 a\r\n", &full), None);
        assert_eq!(hit(b"mg a v t\r\n", &full), None);
    }

    #[test]
    fn text_hits() {
        let crlf = item(u32::MAX, Some(1), b"ab\r\nc", KeyForm::Unknown);
        let empty = item(7, Some(0), b"", KeyForm::Unknown);
        let table: &[(&[u8], &CachedItem<'_>, &[u8])] = &[
            (
                b"get foo\r\n",
                &crlf,
                b"VALUE foo 4294967295 5\r\nab\r\nc\r\nEND\r\n",
            ),
            (
                b"gets foo\r\n",
                &crlf,
                b"VALUE foo 4294967295 5 1\r\nab\r\nc\r\nEND\r\n",
            ),
            (b"get e\r\n", &empty, b"VALUE e 7 0\r\n\r\nEND\r\n"),
            (b"gets e\r\n", &empty, b"VALUE e 7 0 0\r\n\r\nEND\r\n"),
        ];
        for &(request_bytes, item, want) in table {
            assert_eq!(
                hit(request_bytes, item).as_deref(),
                Some(want),
                "{:?}",
                String::from_utf8_lossy(request_bytes)
            );
        }
        // Several keys, one repeated and one missing: one hit per key found, then one END.
        let request = request(b"get foo e nope foo\r\n");
        let mut out = Vec::new();
        for token in request.keys() {
            let item = match token {
                b"foo" => &crlf,
                b"e" => &empty,
                _ => continue,
            };
            assert!(write_hit(&request, token, item, &mut out));
        }
        write_text_end(&mut out);
        assert_eq!(
            out,
            b"VALUE foo 4294967295 5\r\nab\r\nc\r\nVALUE e 7 0\r\n\r\n\
              VALUE foo 4294967295 5\r\nab\r\nc\r\nEND\r\n"
        );
    }

    #[test]
    fn large_and_binary_values() {
        let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
        let big = item(42, Some(9), &data, KeyForm::Raw);
        let mut want = b"VALUE big 42 1048576 9\r\n".to_vec();
        want.extend_from_slice(&data);
        want.extend_from_slice(b"\r\nEND\r\n");
        assert_eq!(hit(b"gets big\r\n", &big), Some(want.clone()));
        assert_eq!(
            fills(b"gets big\r\n", &want),
            [(b"big".to_vec(), item(42, Some(9), &data, KeyForm::Unknown))]
        );

        let mut want = b"VA 1048576 f42 s1048576\r\n".to_vec();
        want.extend_from_slice(&data);
        want.extend_from_slice(b"\r\n");
        assert_eq!(hit(b"mg big v f s\r\n", &big), Some(want));

        let get = binary_request(opcode::GET, b"big", 3);
        let reply = hit(&get, &big).unwrap();
        assert_eq!(reply.len(), HEADER_LEN + 4 + data.len());
        assert_eq!(reply[8..12], (4 + data.len() as u32).to_be_bytes());
        assert_eq!(
            fills(&get, &reply),
            [(b"big".to_vec(), item(42, Some(9), &data, KeyForm::Unknown))]
        );
    }

    #[test]
    fn meta_hits() {
        // Captured from memcached 1.6.18 after `set foo 4294967295 0 5` (cas 1).
        let foo = item(u32::MAX, Some(1), b"ab\r\nc", KeyForm::Raw);
        let hi = item(0, Some(2), b"hi", KeyForm::Raw);
        let hi_b64 = item(0, Some(2), b"hi", KeyForm::Base64);
        let a_b64 = item(0, Some(2), b"z", KeyForm::Base64);
        let empty = item(5, Some(8), b"", KeyForm::Raw);
        let table: &[(&[u8], &CachedItem<'_>, &[u8])] = &[
            (b"mg foo\r\n", &foo, b"HD\r\n"),
            (b"mg foo q\r\n", &foo, b"HD\r\n"),
            (b"mg foo v\r\n", &foo, b"VA 5\r\nab\r\nc\r\n"),
            (
                b"mg foo k v c f s O123 q\r\n",
                &foo,
                b"VA 5 kfoo c1 f4294967295 s5 O123\r\nab\r\nc\r\n",
            ),
            (b"mg foo O\r\n", &foo, b"HD O\r\n"),
            (b"mg foo v f k\r\n", &hi, b"VA 2 f0 kfoo\r\nhi\r\n"),
            (b"mg foo k c\r\n", &hi, b"HD kfoo c2\r\n"),
            // The key is echoed as the item was stored, whatever form the request used.
            (b"mg Zm9v b k v\r\n", &hi, b"VA 2 kfoo\r\nhi\r\n"),
            (b"mg Zm9v b v\r\n", &hi, b"VA 2\r\nhi\r\n"),
            (b"mg foo k v\r\n", &hi_b64, b"VA 2 kZm9v b\r\nhi\r\n"),
            (b"mg Zm9v b k v\r\n", &hi_b64, b"VA 2 kZm9v b\r\nhi\r\n"),
            // memcached echoes the canonical encoding of the decoded key.
            (b"mg YR== b k v\r\n", &a_b64, b"VA 1 kYQ== b\r\nz\r\n"),
            (b"mg e v s f\r\n", &empty, b"VA 0 s0 f5\r\n\r\n"),
            (b"mg e s\r\n", &empty, b"HD s0\r\n"),
        ];
        for &(request_bytes, item, want) in table {
            assert_eq!(
                hit(request_bytes, item).as_deref(),
                Some(want),
                "{:?}",
                String::from_utf8_lossy(request_bytes)
            );
        }
    }

    #[test]
    fn base64_encoding() {
        let encode = |bytes: &[u8]| {
            let mut out = Vec::new();
            push_base64(&mut out, bytes);
            out
        };
        assert_eq!(encode(b"a"), b"YQ==");
        assert_eq!(encode(b"ab"), b"YWI=");
        assert_eq!(encode(b"abc"), b"YWJj");
        assert_eq!(encode(&[0xfb, 0xff, 0xbf]), b"+/+/");
        let all: Vec<u8> = (0..=255).collect();
        for chunk in all.chunks(180) {
            let encoded = encode(chunk);
            let mut out = [0u8; MAX_KEY_LEN];
            assert_eq!(decode_base64_key(&encoded, &mut out), Ok(chunk));
        }
    }

    /// Captured from memcached 1.6.18: `set bk 305419896 0 4` with `a\r\nb` (cas 5), binary
    /// gets with opaque 0xdeadbeef, each followed by a `NOOP` with opaque 7.
    const NOOP_7: &[u8] = b"\x81\x0a\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x07\
                            \x00\x00\x00\x00\x00\x00\x00\x00";
    const BIN_GET_BK: &[u8] = b"\x81\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x08\xde\xad\xbe\xef\
                                \x00\x00\x00\x00\x00\x00\x00\x05\x12\x34\x56\x78a\r\nb";
    const BIN_GETK_BK: &[u8] = b"\x81\x0c\x00\x02\x04\x00\x00\x00\x00\x00\x00\x0a\xde\xad\xbe\xef\
                                 \x00\x00\x00\x00\x00\x00\x00\x05\x12\x34\x56\x78bka\r\nb";
    const BIN_GET_MISS: &[u8] = b"\x81\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x09\xde\xad\xbe\xef\
                                  \x00\x00\x00\x00\x00\x00\x00\x00Not found";

    #[test]
    fn binary_hits() {
        let bk = item(0x1234_5678, Some(5), b"a\r\nb", KeyForm::Unknown);
        for (op, key_len) in [
            (opcode::GET, 0),
            (opcode::GETQ, 0),
            (opcode::GETK, 2),
            (opcode::GETKQ, 2),
        ] {
            let get = binary_request(op, b"bk", 0xdead_beef);
            let mut want = if key_len == 0 {
                BIN_GET_BK.to_vec()
            } else {
                BIN_GETK_BK.to_vec()
            };
            want[1] = op;
            assert_eq!(hit(&get, &bk), Some(want.clone()), "opcode {op:#x}");
            let want_fill = [(b"bk".to_vec(), bk)];
            assert_eq!(fills(&get, &want), want_fill, "opcode {op:#x}");
            // A quiet get travels with a NOOP: its reply follows, and alone it is a miss.
            want.extend_from_slice(NOOP_7);
            assert_eq!(fills(&get, &want), want_fill, "opcode {op:#x}");
            assert_eq!(fills(&get, NOOP_7), [], "opcode {op:#x}");
        }
    }

    #[test]
    fn binary_replies_that_fill_nothing() {
        let get = binary_request(opcode::GET, b"bk", 0xdead_beef);
        let mut other_opaque = BIN_GET_BK.to_vec();
        other_opaque[15] = 0xee;
        let mut getk = BIN_GET_BK.to_vec();
        getk[1] = opcode::GETK;
        let mut no_extras = BIN_GET_BK.to_vec();
        no_extras[4] = 0;
        let mut request_magic = BIN_GET_BK.to_vec();
        request_magic[0] = 0x80;
        let mut short = BIN_GET_BK.to_vec();
        short[11] = 3;
        for reply in [
            BIN_GET_MISS,
            &other_opaque,
            &getk,
            &no_extras,
            &request_magic,
            &short,
            BIN_GETK_BK,
            b"END\r\n",
            b"",
        ] {
            assert_eq!(fills(&get, reply), [], "{reply:?}");
        }
        // GETK's key must be the request's.
        let getk = binary_request(opcode::GETK, b"bx", 0xdead_beef);
        assert_eq!(fills(&getk, BIN_GETK_BK), []);
        for n in 0..BIN_GET_BK.len() {
            assert_eq!(fills(&get, &BIN_GET_BK[..n]), [], "{n} bytes");
        }
    }

    #[test]
    fn text_fills() {
        let request = b"gets user:1 session:x missing user:2\r\n";
        let got = fills(request, GETS);
        let want = [
            (
                b"user:1".to_vec(),
                item(0, Some(2), b"hello", KeyForm::Unknown),
            ),
            (
                b"session:x".to_vec(),
                item(7, Some(5), b"a\r\nb", KeyForm::Unknown),
            ),
            (
                b"user:2".to_vec(),
                item(0, Some(3), b"hello", KeyForm::Unknown),
            ),
        ];
        assert_eq!(got, want);
        // Served again, the items give memcached's reply back.
        let parsed = self::request(request);
        let mut out = Vec::new();
        for (token, item) in &got {
            assert!(write_hit(&parsed, token, item, &mut out));
        }
        write_text_end(&mut out);
        assert_eq!(out, GETS);

        let get = b"get a a b\r\n";
        let reply = b"VALUE a 1 1\r\nx\r\nVALUE a 1 1\r\nx\r\nVALUE b 4294967295 0\r\n\r\nEND\r\n";
        assert_eq!(
            fills(get, reply),
            [
                (b"a".to_vec(), item(1, None, b"x", KeyForm::Unknown)),
                (b"a".to_vec(), item(1, None, b"x", KeyForm::Unknown)),
                (b"b".to_vec(), item(u32::MAX, None, b"", KeyForm::Unknown)),
            ]
        );
        let nothing: &[(&[u8], &[u8])] = &[
            (b"get a\r\n", b"END\r\n"),
            (b"get a\r\n", b"ERROR\r\n"),
            (
                b"get a\r\n",
                b"VALUE a 1 1\r\nx\r\nSERVER_ERROR out of memory\r\n",
            ),
            (b"get a\r\n", b"VALUE a 1 1\r\nx\r\n"),
            (b"get a\r\n", b"VALUE a 1 1\r\nxy\r\nEND\r\n"),
            // A CAS where `get` shows none, and none where `gets` shows one.
            (b"get a\r\n", b"VALUE a 1 1 5\r\nx\r\nEND\r\n"),
            (b"gets a\r\n", b"VALUE a 1 1\r\nx\r\nEND\r\n"),
            // Flags past 32 bits, a bad CAS.
            (b"get a\r\n", b"VALUE a 4294967296 1\r\nx\r\nEND\r\n"),
            (b"gets a\r\n", b"VALUE a 1 1 -5\r\nx\r\nEND\r\n"),
            // Keys not asked for, or out of order: the reply is someone else's.
            (b"get a\r\n", b"VALUE b 1 1\r\nx\r\nEND\r\n"),
            (
                b"get a b\r\n",
                b"VALUE b 1 1\r\nx\r\nVALUE a 1 1\r\nx\r\nEND\r\n",
            ),
            (
                b"get a\r\n",
                b"VALUE a 1 1\r\nx\r\nVALUE a 1 1\r\nx\r\nEND\r\n",
            ),
            // Not a get.
            (b"gat 0 a\r\n", b"VALUE a 1 1\r\nx\r\nEND\r\n"),
            (b"set a 1 0 1\r\nx\r\n", b"VALUE a 1 1\r\nx\r\nEND\r\n"),
        ];
        for &(request, reply) in nothing {
            assert_eq!(
                fills(request, reply),
                [],
                "{:?} {:?}",
                String::from_utf8_lossy(request),
                String::from_utf8_lossy(reply)
            );
        }
    }

    #[test]
    fn meta_fills() {
        let got = fills(b"mg session:x v f t c s k O123\r\n", MG_VA);
        let session = item(7, Some(5), b"a\r\nb", KeyForm::Raw);
        assert_eq!(got, [(b"session:x".to_vec(), session)]);

        let table: &[(&[u8], &[u8], CachedItem<'_>)] = &[
            (
                b"mg a v f\r\n",
                b"VA 1 f3\r\nx\r\n",
                item(3, None, b"x", KeyForm::Unknown),
            ),
            (
                b"mg a f v q\r\n",
                b"VA 0 f0\r\n\r\n",
                item(0, None, b"", KeyForm::Unknown),
            ),
            (
                b"mg a v f c h l\r\n",
                b"VA 1 f3 c9 h1 l20\r\nx\r\n",
                item(3, Some(9), b"x", KeyForm::Unknown),
            ),
            (
                b"mg Zm9v b k v f\r\n",
                b"VA 2 kfoo f0\r\nhi\r\n",
                item(0, None, b"hi", KeyForm::Raw),
            ),
            (
                b"mg Zm9v b k v f\r\n",
                b"VA 2 kZm9v b f0\r\nhi\r\n",
                item(0, None, b"hi", KeyForm::Base64),
            ),
            (
                b"mg foo k v f\r\n",
                b"VA 2 kZm9v b f0\r\nhi\r\n",
                item(0, None, b"hi", KeyForm::Base64),
            ),
        ];
        for &(request, reply, want) in table {
            let got = fills(request, reply);
            assert_eq!(got.len(), 1, "{:?}", String::from_utf8_lossy(reply));
            assert_eq!(got[0].1, want, "{:?}", String::from_utf8_lossy(reply));
            assert_eq!(Some(&got[0].0[..]), self::request(request).key());
        }

        let nothing: &[(&[u8], &[u8])] = &[
            // No value or no flags asked.
            (b"mg a v\r\n", b"VA 1\r\nx\r\n"),
            (b"mg a f\r\n", b"HD f3\r\n"),
            (b"mg a\r\n", b"HD\r\n"),
            // Misses and errors.
            (b"mg a v f\r\n", b"EN\r\n"),
            (b"mg a v f q\r\n", b"MN\r\n"),
            (b"mg a v f\r\n", b"CLIENT_ERROR bad command line format\r\n"),
            (b"mg a v f\r\n", b"SERVER_ERROR out of memory\r\n"),
            // Malformed: short data, no `\r\n`, a bad size or bad numbers.
            (b"mg a v f\r\n", b"VA 2 f3\r\nx\r\n"),
            (b"mg a v f\r\n", b"VA 1 f3\r\nxy"),
            (b"mg a v f\r\n", b"VA 1 f3\nx\r\n"),
            (b"mg a v f\r\n", b"VA x f3\r\nx\r\n"),
            (b"mg a v f\r\n", b"VA 1 f4294967296\r\nx\r\n"),
            (b"mg a v f c\r\n", b"VA 1 f3 cx\r\nx\r\n"),
            // What was asked is missing from the reply, or the key is another's.
            (b"mg a v f c\r\n", b"VA 1 f3\r\nx\r\n"),
            (b"mg a v f\r\n", b"VA 1 c2\r\nx\r\n"),
            (b"mg a v f k\r\n", b"VA 1 f3\r\nx\r\n"),
            (b"mg a v f k\r\n", b"VA 1 f3 kb\r\nx\r\n"),
            (b"mg Zm9v b v f k\r\n", b"VA 1 f3 kZm9w b\r\nx\r\n"),
            // A stale item, or a win/recache token.
            (b"mg a v f\r\n", b"VA 1 f3 X W\r\nx\r\n"),
            (b"mg a v f\r\n", b"VA 1 f3 Z\r\nx\r\n"),
            // An mg that may change the item, or a flag memcached refuses.
            (b"mg a v f T30\r\n", b"VA 1 f3\r\nx\r\n"),
            (b"mg a v f N30\r\n", b"VA 1 f3 W\r\nx\r\n"),
            (b"mg a v f f\r\n", b"CLIENT_ERROR duplicate flag\r\n"),
            (b"mg a v f\r\n", b""),
        ];
        for &(request, reply) in nothing {
            assert_eq!(
                fills(request, reply),
                [],
                "{:?} {:?}",
                String::from_utf8_lossy(request),
                String::from_utf8_lossy(reply)
            );
        }
    }

    #[test]
    fn no_input_panics() {
        let requests: Vec<Vec<u8>> = vec![
            b"get a b\r\n".to_vec(),
            b"gets a\r\n".to_vec(),
            b"mg a v f c k s O1\r\n".to_vec(),
            b"mg YQ== b v f k\r\n".to_vec(),
            binary_request(opcode::GETK, b"session:x", 0x77),
            binary_request(opcode::GETQ, b"a", 0),
        ];
        let mut replies: Vec<Vec<u8>> = vec![GETS.to_vec(), MG_VA.to_vec(), BIN_GETK.to_vec()];
        // A little deterministic noise around the real replies.
        let mut state = 0x2545_f491_u32;
        for _ in 0..200 {
            let mut noisy = replies[state as usize % 3].clone();
            for _ in 0..4 {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                if let Some(byte) = noisy.get_mut(state as usize % 64) {
                    *byte = (state >> 24) as u8;
                }
            }
            replies.push(noisy);
        }
        for request_bytes in &requests {
            let request = request(request_bytes);
            for reply in &replies {
                for n in 0..=reply.len() {
                    read_fills(&request, &reply[..n], |_, _| {});
                }
            }
        }
        let anything = item(0, None, b"", KeyForm::Unknown);
        for request_bytes in &requests {
            let request = request(request_bytes);
            let mut out = Vec::new();
            let _ = write_hit(&request, b"", &anything, &mut out);
            let _ = write_hit(&request, &[b'='; 300], &anything, &mut out);
        }
    }
}
