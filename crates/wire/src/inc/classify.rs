//! What the fabric makes of one memcached request datagram to a server it carries, and the
//! numbers its compute primitives read.

use super::Command;
use crate::memcache::{self, cached, Command as Mc, Request, MAX_KEY_LEN};

/// The fabric's view of a request datagram's bytes (after the memcached frame header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A text `get` of one key: the fabric's caches may answer it.
    Get(Vec<u8>),
    /// One write of one key: ordered by the key's home. True when the server will not answer
    /// it (`noreply`, meta `q`, a quiet binary opcode).
    Write(Command, Vec<u8>, bool),
    /// Reads the caches do not answer (several keys, `gets`, meta and binary reads, `stats`,
    /// `version`): sent to the server as they are.
    Plain,
    /// Writes the fabric cannot keep coherent (several requests with a write among them,
    /// `flush_all`): refused with this reason.
    Refused(&'static str),
}

/// Classifies the memcached bytes of one request datagram.
pub fn classify(body: &[u8]) -> Kind {
    let mut requests: Vec<Request<'_>> = Vec::new();
    let mut at = 0;
    while at < body.len() {
        match memcache::parse(&body[at..]) {
            Ok(Some(r)) if r.len > 0 => {
                at += r.len;
                requests.push(r);
            }
            // Bytes memcached itself will refuse or wait on: no write among them takes
            // effect before the server has parsed them, which the server answers.
            _ => break,
        }
    }
    let writes: Vec<&Request<'_>> = requests.iter().filter(|r| writes(r)).collect();
    match (requests.as_slice(), writes.as_slice()) {
        ([one], []) if one.command == Mc::Get && one.key_count() == 1 && at == body.len() => {
            match one.key() {
                Some(key) => Kind::Get(key.to_vec()),
                None => Kind::Plain,
            }
        }
        (_, []) if at == body.len() => Kind::Plain,
        // A request cut short or not understood: memcached may read on past it as another
        // request, which could be a write.
        (_, []) if may_hold_write(&body[at..]) => {
            Kind::Refused("a datagram the fabric cannot read")
        }
        (_, []) => Kind::Plain,
        ([one], [_]) if at == body.len() => match write_key(one) {
            Some(key) => Kind::Write(write_command(one.command), key, one.noreply()),
            None => Kind::Refused("a write the fabric cannot read the key of"),
        },
        ([one], [_]) if one.command == Mc::FlushAll => {
            Kind::Refused("flush_all is not carried by the fabric")
        }
        _ if writes.iter().any(|r| is_flush(r)) => {
            Kind::Refused("flush_all is not carried by the fabric")
        }
        _ => Kind::Refused("several requests with a write among them in one datagram"),
    }
}

/// Whether a request may change stored items; a meta get the caches could not answer may
/// carry flags that do (`T`, `N`, `E`).
fn writes(r: &Request<'_>) -> bool {
    match r.command {
        Mc::MetaGet => cached::servable(r).is_none(),
        c => c.is_write(),
    }
}

fn is_flush(r: &Request<'_>) -> bool {
    use memcache::binary::opcode::{FLUSH, FLUSHQ};
    matches!(r.command, Mc::FlushAll | Mc::Binary(FLUSH | FLUSHQ))
}

/// Whether unread bytes could be a write memcached would still execute: anything but blank
/// space could.
fn may_hold_write(rest: &[u8]) -> bool {
    rest.iter().any(|b| !b.is_ascii_whitespace())
}

fn write_command(c: Mc) -> Command {
    use memcache::binary::opcode::{DECREMENT, DECREMENTQ, DELETE, DELETEQ, INCREMENT, INCREMENTQ};
    match c {
        Mc::Delete | Mc::MetaDelete | Mc::Binary(DELETE | DELETEQ) => Command::Del,
        Mc::Incr
        | Mc::Decr
        | Mc::MetaArithmetic
        | Mc::Binary(INCREMENT | INCREMENTQ | DECREMENT | DECREMENTQ) => Command::Increment,
        _ => Command::Set,
    }
}

/// The stored key a single-key write changes.
fn write_key(r: &Request<'_>) -> Option<Vec<u8>> {
    if r.key_count() != 1 || is_flush(r) {
        return None;
    }
    let token = r.key()?;
    let mut buf = [0u8; MAX_KEY_LEN];
    r.stored_key(token, &mut buf).ok().map(<[u8]>::to_vec)
}

/// Whether a key can be written into a text command as it is (no space or control byte).
pub fn text_safe(key: &[u8]) -> bool {
    !key.is_empty() && key.iter().all(|&b| b > b' ' && b != 0x7f)
}

/// The number a conditional put stores: the data of its `set`.
pub fn cond_operand(body: &[u8]) -> Option<u64> {
    let request = memcache::parse(body).ok()??;
    parse_number(request.data()?)
}

/// The number in a reply to `get KEY` (`VALUE ...` line, data, `END`); `None` when the value
/// is not one.
pub fn cached_number(reply: &[u8]) -> Option<u64> {
    parse_number(value_parts(reply)?.1)
}

/// A `VALUE ...` reply's first line (without its CR LF) and its data.
fn value_parts(reply: &[u8]) -> Option<(&[u8], &[u8])> {
    let line_end = reply.windows(2).position(|w| w == b"\r\n")?;
    let rest = &reply[line_end + 2..];
    let data_end = rest.windows(2).position(|w| w == b"\r\n")?;
    Some((&reply[..line_end], &rest[..data_end]))
}

/// A decimal number as memcached's `incr` reads one.
pub fn parse_number(text: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(text).ok()?.trim_end();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// A text `incr KEY DELTA` or `decr KEY DELTA` alone, with a reply: its key, whether it
/// increments, and its delta.
pub fn text_delta(body: &[u8]) -> Option<(&[u8], bool, u64)> {
    let request = memcache::parse(body).ok()??;
    if request.len != body.len() || request.noreply() {
        return None;
    }
    let incr = match request.command {
        Mc::Incr => true,
        Mc::Decr => false,
        _ => return None,
    };
    let line = body.strip_suffix(b"\r\n")?;
    let mut words = line.split(|&b| b == b' ').filter(|w| !w.is_empty());
    let (_, key, delta) = (words.next()?, words.next()?, words.next()?);
    if words.next().is_some() || !text_safe(key) {
        return None;
    }
    Some((key, incr, parse_number(delta)?))
}

/// What a cached `VALUE KEY FLAGS LEN\r\nDATA\r\nEND\r\n` holds after `incr` (or `decr`) by
/// `delta`, as a home that stores it computes it (memcached's `do_add_delta`): increments
/// wrap at 2^64, decrements stop at 0, and a result no longer than the old data is padded
/// with spaces to its length. The new number and the new cached reply; `None` when the
/// value is not a number.
pub fn after_delta(cached: &[u8], incr: bool, delta: u64) -> Option<(u64, Vec<u8>)> {
    let (line, old) = value_parts(cached)?;
    let current = parse_number(old)?;
    let value = if incr {
        current.wrapping_add(delta)
    } else {
        current.saturating_sub(delta)
    };
    let mut data = value.to_string().into_bytes();
    if data.len() <= old.len() {
        data.resize(old.len(), b' ');
    }
    // VALUE key flags (no cas: a cached `get` reply).
    let mut words = line.split(|&b| b == b' ');
    let (value_word, key, flags) = (words.next()?, words.next()?, words.next()?);
    if value_word != b"VALUE" {
        return None;
    }
    let mut out = Vec::with_capacity(cached.len() + 8);
    out.extend_from_slice(b"VALUE ");
    out.extend_from_slice(key);
    out.push(b' ');
    out.extend_from_slice(flags);
    out.extend_from_slice(format!(" {}\r\n", data.len()).as_bytes());
    out.extend_from_slice(&data);
    out.extend_from_slice(b"\r\nEND\r\n");
    Some((value, out))
}

/// The key a single-datagram reply to `get KEY` carries, when it is a hit.
pub fn reply_key(body: &[u8]) -> Option<&[u8]> {
    let rest = body.strip_prefix(b"VALUE ")?;
    let end = rest.iter().position(|&b| b == b' ')?;
    Some(&rest[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_sorted_by_what_the_fabric_does_with_them() {
        assert_eq!(classify(b"get foo\r\n"), Kind::Get(b"foo".to_vec()));
        assert_eq!(classify(b"get foo bar\r\n"), Kind::Plain);
        assert_eq!(classify(b"gets foo\r\n"), Kind::Plain);
        assert_eq!(classify(b"stats\r\n"), Kind::Plain);
        assert_eq!(
            classify(b"set foo 0 0 1\r\nx\r\n"),
            Kind::Write(Command::Set, b"foo".to_vec(), false)
        );
        assert_eq!(
            classify(b"delete foo\r\n"),
            Kind::Write(Command::Del, b"foo".to_vec(), false)
        );
        assert_eq!(
            classify(b"incr n 5\r\n"),
            Kind::Write(Command::Increment, b"n".to_vec(), false)
        );
        assert_eq!(
            classify(b"decr n 5\r\n"),
            Kind::Write(Command::Increment, b"n".to_vec(), false)
        );
        assert_eq!(
            classify(b"ms Zm9v 1 b\r\nx\r\n"),
            Kind::Write(Command::Set, b"foo".to_vec(), false)
        );
        assert_eq!(
            classify(b"set foo 0 0 1 noreply\r\nx\r\n"),
            Kind::Write(Command::Set, b"foo".to_vec(), true)
        );
        assert!(matches!(classify(b"flush_all\r\n"), Kind::Refused(_)));
        assert!(matches!(
            classify(b"get a\r\nset a 0 0 1\r\nx\r\n"),
            Kind::Refused(_)
        ));
        // A meta get that touches is a write.
        assert_eq!(
            classify(b"mg foo v T30\r\n"),
            Kind::Write(Command::Set, b"foo".to_vec(), false)
        );
    }

    #[test]
    fn increments_are_read_and_computed_as_a_storing_home_computes_them() {
        assert_eq!(text_delta(b"incr n 5\r\n"), Some((&b"n"[..], true, 5)));
        assert_eq!(text_delta(b"decr n 7\r\n"), Some((&b"n"[..], false, 7)));
        assert_eq!(text_delta(b"incr n 5 noreply\r\n"), None);
        assert_eq!(text_delta(b"incr n x\r\n"), None);
        assert_eq!(text_delta(b"get n\r\n"), None);
        assert_eq!(text_delta(b"incr n 5\r\nget n\r\n"), None);
        let cached = b"VALUE n 3 3\r\n100\r\nEND\r\n";
        assert_eq!(
            after_delta(cached, true, 5),
            Some((105, b"VALUE n 3 3\r\n105\r\nEND\r\n".to_vec()))
        );
        assert_eq!(
            after_delta(cached, false, 95),
            Some((5, b"VALUE n 3 3\r\n5  \r\nEND\r\n".to_vec())),
            "shorter: padded in place"
        );
        assert_eq!(
            after_delta(cached, false, 500),
            Some((0, b"VALUE n 3 3\r\n0  \r\nEND\r\n".to_vec()))
        );
        assert_eq!(
            after_delta(cached, true, 900),
            Some((1000, b"VALUE n 3 4\r\n1000\r\nEND\r\n".to_vec())),
            "longer: a new length"
        );
        let max = format!("VALUE n 0 20\r\n{}\r\nEND\r\n", u64::MAX);
        assert_eq!(
            after_delta(max.as_bytes(), true, 2).map(|(v, _)| v),
            Some(1),
            "wraps at 2^64"
        );
        assert_eq!(after_delta(b"VALUE n 0 1\r\nx\r\nEND\r\n", true, 1), None);
    }

    #[test]
    fn unreadable_bytes_are_refused_unless_blank() {
        assert!(matches!(
            classify(b"get foo\r\n\x01garbage"),
            Kind::Refused(_)
        ));
        assert_eq!(classify(b""), Kind::Plain);
    }
}
