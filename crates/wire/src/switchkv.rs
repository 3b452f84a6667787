//! The messages of SwitchKV's cache update protocol (its section 3.2, Figure 4), between a
//! backend and its cache node, over one TCP connection each way. Text lines, so that an
//! operator can read them with `nc`; an item's value travels as a counted block, as in
//! memcached's storage commands. Every request gets exactly one reply.
//!
//! Backend to cache node:
//! - `report <port> <n>\r\n` and `n` lines `<key> <load>\r\n`: the periodic top-k report,
//!   loads in thousandths of a request per second; `port` is the backend's control port, on
//!   the address the report comes from; reply `ok`;
//! - `hot <port> <key> <load> <flags> <bytes>\r\n<data>\r\n`: an instant report of a bursty
//!   key with its load (thousandths of a request per second) and value; reply `ok` (taken:
//!   the cache node fetches it, and the fetch grants the lease) or `no`;
//! - `update <key> <flags> <bytes>\r\n<data>\r\n` and `delete <key>\r\n`: a write to a cached
//!   key, sent before the backend answers its client; reply `ok`;
//! - `reset <port>`: the backend started and holds no leases (nor, perhaps, the values it
//!   had): the cache node drops every key of it; reply `ok`. A backend serves nothing before
//!   this is acknowledged or a whole lease has passed.
//!
//! Cache node to backend:
//! - `fetch <key>\r\n`: the value of a key the cache admits, which the backend then counts as
//!   cached under a lease; reply `value <flags> <bytes>\r\n<data>\r\n` or `miss`;
//! - `renew <n>\r\n` and `n` lines `<key>\r\n`: extend the leases of cached keys; reply `ok`
//!   when every one was extended, else `renewed <m>\r\n` and the `m` keys that were (the
//!   others the backend no longer counts as cached);
//! - `evict <key>\r\n`: the key left the cache (or was not taken); reply `ok`.
//!
//! Either side may reply `error <text>\r\n` to a request it cannot take.
//!
//! Every message, request or reply, travels sealed: behind a line
//! `auth <port> <epoch> <stream> <seq> <mac>\r\n` ([`Seal`]) that names the sender (its
//! control port, on the address the message comes from), its session (`epoch`, 16 hex digits,
//! chosen at random when it starts), the channel (`stream`) and the message's place on it
//! (`seq`, from 1 up), and carries a MAC of the message under the key the nodes share (64 hex
//! digits). A reply's seal repeats its request's epoch, stream and sequence. What the MAC
//! covers and how it is checked is the node's (`node::auth`); this module only reads and
//! writes the line.
//!
//! Pure: [`parse`] reads one message at the front of a buffer, borrowing from it, and never
//! panics; [`write`] appends one message to a buffer; [`parse_seal`] and [`write_seal`] do the
//! same for the seal in front of one.

use std::fmt;

/// Longest key: memcached's.
pub const MAX_KEY_LEN: usize = 250;
/// Largest value carried: memcached's default item size.
pub const MAX_VALUE: usize = 1 << 20;
/// Most keys in one report or renewal.
pub const MAX_KEYS: usize = 10_000;
/// Longest line read before a message is refused.
const MAX_LINE: usize = 512;

/// Length of a seal's MAC (HMAC-SHA256).
pub const MAC_LEN: usize = 32;

/// The line in front of a sealed message: who sent it, where it stands in the sender's
/// session, and its MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seal {
    /// The sender's control port (on the address the message comes from).
    pub port: u16,
    /// The sender's session, chosen at random when it starts.
    pub epoch: u64,
    /// The sender's channel the message travels on.
    pub stream: u8,
    /// The message's place on its channel, from 1; a reply repeats its request's.
    pub seq: u64,
    pub mac: [u8; MAC_LEN],
}

/// Reads the seal at the front of `buf`: `Ok(None)` while its line is incomplete,
/// `Ok(Some((None, 0)))` when the message there has none, else the seal and the bytes its
/// line took (the sealed message follows).
#[allow(clippy::type_complexity)]
pub fn parse_seal(buf: &[u8]) -> Result<Option<(Option<Seal>, usize)>, ProtoError> {
    // A message that cannot start with `auth` has no seal, whole line or not.
    let head = &buf[..buf.len().min(4)];
    if head != &b"auth"[..head.len()] {
        return Ok(Some((None, 0)));
    }
    let Some((first, at)) = line(buf, 0)? else {
        return Ok(None);
    };
    let mut words = first.split(|&b| b == b' ').filter(|w| !w.is_empty());
    if words.next() != Some(&b"auth"[..]) {
        return Ok(Some((None, 0)));
    }
    let mut next = |what: &'static str| words.next().ok_or(ProtoError::BadSeal(what));
    let port = port(next("port")?).map_err(|_| ProtoError::BadSeal("port"))?;
    let epoch = next("epoch")?;
    let epoch = match (epoch.len(), std::str::from_utf8(epoch)) {
        (16, Ok(hex)) if hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
            u64::from_str_radix(hex, 16).map_err(|_| ProtoError::BadSeal("epoch"))?
        }
        _ => return Err(ProtoError::BadSeal("epoch")),
    };
    let stream = number(next("stream")?, "stream")
        .ok()
        .and_then(|n| u8::try_from(n).ok())
        .ok_or(ProtoError::BadSeal("stream"))?;
    let seq = number(next("seq")?, "seq").map_err(|_| ProtoError::BadSeal("seq"))?;
    let mac_hex = next("mac")?;
    if mac_hex.len() != 2 * MAC_LEN {
        return Err(ProtoError::BadSeal("mac"));
    }
    let mut mac = [0u8; MAC_LEN];
    for (byte, pair) in mac.iter_mut().zip(mac_hex.chunks(2)) {
        let digit = |b: u8| (b as char).to_digit(16).ok_or(ProtoError::BadSeal("mac"));
        *byte = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
    }
    if words.next().is_some() {
        return Err(ProtoError::BadSeal("line"));
    }
    Ok(Some((
        Some(Seal {
            port,
            epoch,
            stream,
            seq,
            mac,
        }),
        at,
    )))
}

/// Appends `seal`'s line to `out`; the message it seals goes right after it.
pub fn write_seal(seal: &Seal, out: &mut Vec<u8>) {
    out.extend_from_slice(
        format!(
            "auth {} {:016x} {} {} ",
            seal.port, seal.epoch, seal.stream, seal.seq
        )
        .as_bytes(),
    );
    for b in seal.mac {
        out.extend_from_slice(format!("{b:02x}").as_bytes());
    }
    out.extend_from_slice(b"\r\n");
}

/// One message of the protocol, borrowing its keys and value from the buffer it was read from.
#[derive(Debug, Clone, PartialEq)]
pub enum Message<'a> {
    /// The backend's control port, then keys and their loads, in requests per second.
    Report(u16, Vec<(&'a [u8], f64)>),
    /// The backend's control port, a bursty key, its load in requests per second, and its
    /// value.
    Hot(u16, &'a [u8], f64, Item<'a>),
    Update(&'a [u8], Item<'a>),
    Delete(&'a [u8]),
    Fetch(&'a [u8]),
    Renew(Vec<&'a [u8]>),
    Evict(&'a [u8]),
    /// The backend's control port.
    Reset(u16),
    /// Replies.
    Ok,
    /// The keys of a renewal whose leases were extended, when not all were.
    Renewed(Vec<&'a [u8]>),
    No,
    Miss,
    Value(Item<'a>),
    Error(&'a [u8]),
}

/// An item as memcached keeps it: client flags and value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Item<'a> {
    pub flags: u32,
    pub data: &'a [u8],
}

/// Why bytes are not a message; the connection cannot be read further.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtoError {
    UnknownCommand(String),
    BadKey,
    BadNumber(&'static str),
    TooLong(&'static str),
    /// A value block not followed by `\r\n`.
    BadBlock,
    /// A line longer than any message's.
    LineTooLong,
    /// A seal line whose named field is missing or wrong.
    BadSeal(&'static str),
}

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtoError::UnknownCommand(c) => write!(f, "unknown command {c:?}"),
            ProtoError::BadKey => write!(
                f,
                "a key must be 1 to {MAX_KEY_LEN} bytes without spaces or control bytes"
            ),
            ProtoError::BadNumber(what) => write!(f, "{what} is not a number"),
            ProtoError::TooLong(what) => write!(f, "{what} is too large"),
            ProtoError::BadBlock => write!(f, "a value block must end with \\r\\n"),
            ProtoError::LineTooLong => write!(f, "a line is longer than {MAX_LINE} bytes"),
            ProtoError::BadSeal(what) => write!(f, "the auth line's {what} is malformed"),
        }
    }
}

impl std::error::Error for ProtoError {}

/// Reads the message at the front of `buf`: `Ok(None)` while it is incomplete, else the
/// message and the bytes it took.
pub fn parse(buf: &[u8]) -> Result<Option<(Message<'_>, usize)>, ProtoError> {
    let Some((first, mut at)) = line(buf, 0)? else {
        return Ok(None);
    };
    let mut words = first.split(|&b| b == b' ').filter(|w| !w.is_empty());
    let command = words.next().unwrap_or_default();
    let mut next = |what: &'static str| words.next().ok_or(ProtoError::BadNumber(what));
    let message = match command {
        b"ok" => Message::Ok,
        b"no" => Message::No,
        // A seal where a message must be: one seal a message.
        b"auth" => return Err(ProtoError::UnknownCommand("auth".into())),
        b"miss" => Message::Miss,
        b"error" => Message::Error(first.get(6..).unwrap_or_default()),
        b"delete" => Message::Delete(key(next("key")?)?),
        b"fetch" => Message::Fetch(key(next("key")?)?),
        b"evict" => Message::Evict(key(next("key")?)?),
        b"reset" => Message::Reset(port(next("port")?)?),
        b"hot" | b"update" | b"value" => {
            let port = match command {
                b"hot" => port(next("port")?)?,
                _ => 0,
            };
            let k = match command {
                b"value" => None,
                _ => Some(key(next("key")?)?),
            };
            let load = match command {
                b"hot" => number(next("load")?, "load")? as f64 / 1000.0,
                _ => 0.0,
            };
            let flags = number(next("flags")?, "flags")?;
            let flags = u32::try_from(flags).map_err(|_| ProtoError::BadNumber("flags"))?;
            let len = number(next("bytes")?, "bytes")? as usize;
            if len > MAX_VALUE {
                return Err(ProtoError::TooLong("a value"));
            }
            let end = at + len;
            if buf.len() < end + 2 {
                return Ok(None);
            }
            if &buf[end..end + 2] != b"\r\n" {
                return Err(ProtoError::BadBlock);
            }
            let item = Item {
                flags,
                data: &buf[at..end],
            };
            at = end + 2;
            match (command, k) {
                (b"hot", Some(k)) => Message::Hot(port, k, load, item),
                (b"update", Some(k)) => Message::Update(k, item),
                _ => Message::Value(item),
            }
        }
        b"report" | b"renew" | b"renewed" => {
            let from = match command {
                b"report" => port(next("port")?)?,
                _ => 0,
            };
            let n = number(next("count")?, "count")? as usize;
            if n > MAX_KEYS {
                return Err(ProtoError::TooLong("a key list"));
            }
            let mut keys = Vec::with_capacity(n);
            let mut loads = Vec::with_capacity(n);
            for _ in 0..n {
                let Some((entry, after)) = line(buf, at)? else {
                    return Ok(None);
                };
                at = after;
                let mut words = entry.split(|&b| b == b' ').filter(|w| !w.is_empty());
                let k = key(words.next().unwrap_or_default())?;
                if command == b"report" {
                    let load = number(words.next().unwrap_or_default(), "load")?;
                    loads.push((k, load as f64 / 1000.0));
                } else {
                    keys.push(k);
                }
            }
            match command {
                b"report" => Message::Report(from, loads),
                b"renew" => Message::Renew(keys),
                _ => Message::Renewed(keys),
            }
        }
        other => {
            return Err(ProtoError::UnknownCommand(
                String::from_utf8_lossy(other).into_owned(),
            ))
        }
    };
    Ok(Some((message, at)))
}

/// The line starting at `from` (without `\r\n`) and where the next begins.
fn line(buf: &[u8], from: usize) -> Result<Option<(&[u8], usize)>, ProtoError> {
    let rest = buf.get(from..).unwrap_or_default();
    match rest.iter().position(|&b| b == b'\n') {
        Some(end) if end > MAX_LINE => Err(ProtoError::LineTooLong),
        Some(end) => {
            let text = &rest[..end];
            Ok(Some((
                text.strip_suffix(b"\r").unwrap_or(text),
                from + end + 1,
            )))
        }
        None if rest.len() > MAX_LINE => Err(ProtoError::LineTooLong),
        None => Ok(None),
    }
}

fn key(word: &[u8]) -> Result<&[u8], ProtoError> {
    match word.len() {
        1..=MAX_KEY_LEN if word.iter().all(|&b| b > b' ' && b != 0x7f) => Ok(word),
        _ => Err(ProtoError::BadKey),
    }
}

fn port(word: &[u8]) -> Result<u16, ProtoError> {
    u16::try_from(number(word, "port")?).map_err(|_| ProtoError::BadNumber("port"))
}

fn number(word: &[u8], what: &'static str) -> Result<u64, ProtoError> {
    std::str::from_utf8(word)
        .ok()
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse().ok())
        .ok_or(ProtoError::BadNumber(what))
}

/// Appends `message` to `out`. Keys must be valid (as [`parse`] checks them).
pub fn write(message: &Message<'_>, out: &mut Vec<u8>) {
    let item = |out: &mut Vec<u8>, item: &Item<'_>| {
        out.extend_from_slice(format!(" {} {}\r\n", item.flags, item.data.len()).as_bytes());
        out.extend_from_slice(item.data);
        out.extend_from_slice(b"\r\n");
    };
    let keyed = |out: &mut Vec<u8>, command: &[u8], key: &[u8]| {
        out.extend_from_slice(command);
        out.push(b' ');
        out.extend_from_slice(key);
    };
    match message {
        Message::Ok => out.extend_from_slice(b"ok\r\n"),
        Message::No => out.extend_from_slice(b"no\r\n"),
        Message::Miss => out.extend_from_slice(b"miss\r\n"),
        Message::Error(text) => {
            out.extend_from_slice(b"error ");
            out.extend(text.iter().map(|&b| if b < b' ' { b' ' } else { b }));
            out.extend_from_slice(b"\r\n");
        }
        Message::Delete(k) | Message::Fetch(k) | Message::Evict(k) => {
            let command: &[u8] = match message {
                Message::Delete(_) => b"delete",
                Message::Fetch(_) => b"fetch",
                _ => b"evict",
            };
            keyed(out, command, k);
            out.extend_from_slice(b"\r\n");
        }
        Message::Hot(port, k, load, i) => {
            out.extend_from_slice(format!("hot {port} ").as_bytes());
            out.extend_from_slice(k);
            out.extend_from_slice(format!(" {}", milli(*load)).as_bytes());
            item(out, i);
        }
        Message::Update(k, i) => {
            keyed(out, b"update", k);
            item(out, i);
        }
        Message::Value(i) => {
            out.extend_from_slice(b"value");
            item(out, i);
        }
        Message::Report(port, loads) => {
            out.extend_from_slice(format!("report {port} {}\r\n", loads.len()).as_bytes());
            for (k, load) in loads {
                out.extend_from_slice(k);
                out.extend_from_slice(format!(" {}\r\n", milli(*load)).as_bytes());
            }
        }
        Message::Reset(port) => out.extend_from_slice(format!("reset {port}\r\n").as_bytes()),
        Message::Renew(keys) | Message::Renewed(keys) => {
            let command = match message {
                Message::Renew(_) => "renew",
                _ => "renewed",
            };
            out.extend_from_slice(format!("{command} {}\r\n", keys.len()).as_bytes());
            for k in keys {
                out.extend_from_slice(k);
                out.extend_from_slice(b"\r\n");
            }
        }
    }
}

/// A load in requests per second as the thousandths the messages carry.
fn milli(load: f64) -> u64 {
    (load.max(0.0) * 1000.0).round() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(message: Message<'_>) {
        let mut out = Vec::new();
        write(&message, &mut out);
        let (read, used) = parse(&out).unwrap().unwrap();
        assert_eq!(read, message, "{}", String::from_utf8_lossy(&out));
        assert_eq!(used, out.len());
        // Every shorter prefix is incomplete, never an error or another message.
        for cut in 0..out.len() {
            assert_eq!(parse(&out[..cut]), Ok(None), "cut at {cut}");
        }
    }

    #[test]
    fn every_message_reads_back_as_written() {
        let item = Item {
            flags: 7,
            data: b"a value\r\nwith a line",
        };
        for m in [
            Message::Report(11311, vec![(&b"k1"[..], 12.5), (&b"k2"[..], 0.001)]),
            Message::Report(1, Vec::new()),
            Message::Hot(11311, b"k", 120.5, item),
            Message::Update(
                b"k",
                Item {
                    flags: 0,
                    data: b"",
                },
            ),
            Message::Delete(b"k"),
            Message::Fetch(b"k"),
            Message::Renew(vec![&b"a"[..], &b"b"[..]]),
            Message::Evict(b"k"),
            Message::Reset(11311),
            Message::Renewed(vec![&b"a"[..]]),
            Message::Renewed(Vec::new()),
            Message::Ok,
            Message::No,
            Message::Miss,
            Message::Value(item),
            Message::Error(b"no such key"),
        ] {
            round_trip(m);
        }
    }

    #[test]
    fn a_seal_reads_back_from_its_literal_line() {
        let line: &[u8] = b"auth 11311 00000000deadbeef 2 7 \
            000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\r\nok\r\n";
        let mut mac = [0u8; MAC_LEN];
        for (i, b) in mac.iter_mut().enumerate() {
            *b = i as u8;
        }
        let seal = Seal {
            port: 11311,
            epoch: 0xdead_beef,
            stream: 2,
            seq: 7,
            mac,
        };
        let (read, used) = parse_seal(line).unwrap().unwrap();
        assert_eq!(read, Some(seal));
        assert_eq!(&line[used..], b"ok\r\n");
        let mut out = Vec::new();
        write_seal(&seal, &mut out);
        assert_eq!(out, &line[..used]);
        // Incomplete until its line ends; a message without one has none.
        for cut in 0..used {
            assert_eq!(parse_seal(&line[..cut]), Ok(None), "cut at {cut}");
        }
        assert_eq!(parse_seal(b"update k 0 1\r\nx\r\n"), Ok(Some((None, 0))));
        assert_eq!(parse_seal(b"x"), Ok(Some((None, 0))));
        assert_eq!(parse_seal(b"au"), Ok(None), "perhaps a seal");
        // A seal is never a message of its own.
        assert!(parse(line).is_err());
    }

    #[test]
    fn a_bad_seal_is_refused_never_a_panic() {
        let mac = "00".repeat(MAC_LEN);
        let bad = [
            format!("auth 1 00000000000000001 1 1 {mac}\r\n"),
            format!("auth 1 000000000000000g 1 1 {mac}\r\n"),
            format!("auth 70000 0000000000000001 1 1 {mac}\r\n"),
            format!("auth 1 0000000000000001 256 1 {mac}\r\n"),
            format!("auth 1 0000000000000001 1 -1 {mac}\r\n"),
            format!("auth 1 0000000000000001 1 1 {}\r\n", &mac[1..]),
            format!("auth 1 0000000000000001 1 1 {}zz\r\n", &mac[2..]),
            format!("auth 1 0000000000000001 1 1 {mac} more\r\n"),
            "auth 1 0000000000000001 1 1\r\n".to_string(),
            "auth\r\n".to_string(),
        ];
        for b in &bad {
            assert!(
                matches!(parse_seal(b.as_bytes()), Err(ProtoError::BadSeal(_))),
                "{b:?}"
            );
        }
        let long = [&b"auth "[..], &[b'1'; MAX_LINE + 10]].concat();
        assert_eq!(parse_seal(&long), Err(ProtoError::LineTooLong));
    }

    #[test]
    fn messages_follow_each_other_in_one_buffer() {
        let mut out = Vec::new();
        write(&Message::Fetch(b"a"), &mut out);
        write(&Message::Ok, &mut out);
        let (first, used) = parse(&out).unwrap().unwrap();
        assert_eq!(first, Message::Fetch(b"a"));
        assert_eq!(parse(&out[used..]).unwrap().unwrap().0, Message::Ok);
    }

    #[test]
    fn bad_input_is_refused_never_a_panic() {
        let bad: &[&[u8]] = &[
            b"bogus\r\n",
            b"fetch\r\n",
            b"fetch a\x01b\r\n",
            b"hot 1 k 1 x 2\r\nhi\r\n",
            b"hot 1 k 1 0 2\r\nhiXX",
            b"hot 70000 k 1 0 2\r\nhi\r\n",
            b"update k 4294967296 1\r\nx\r\n",
            b"value 0 99999999999\r\n",
            b"report 1 10001\r\n",
            b"report 1 1\r\nk nan\r\n",
            b"renew 1\r\n\r\n",
            b"reset\r\n",
            b"reset 65536\r\n",
        ];
        for b in bad {
            assert!(parse(b).is_err(), "{:?}", String::from_utf8_lossy(b));
        }
        let long = vec![b'x'; MAX_LINE + 10];
        assert_eq!(parse(&long), Err(ProtoError::LineTooLong));
        // A seeded stream of mutations of valid messages: an error or a message, never a
        // panic, and never more bytes used than there are.
        let mut valid = Vec::new();
        write(&Message::Report(7, vec![(&b"key"[..], 3.0)]), &mut valid);
        write(
            &Message::Hot(
                7,
                b"k",
                9.0,
                Item {
                    flags: 1,
                    data: b"vv",
                },
            ),
            &mut valid,
        );
        let mut seed = 0x5eed_u64;
        for _ in 0..20_000 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let mut m = valid.clone();
            let at = (seed >> 33) as usize % m.len();
            m[at] = (seed >> 17) as u8;
            if let Ok(Some((_, used))) = parse(&m) {
                assert!(used <= m.len());
            }
        }
    }
}
