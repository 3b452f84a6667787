//! The slice of the memcached text protocol the load generator speaks: building `get`/`set`
//! requests and deciding when a reply is complete and what it was. No I/O.

use std::io::Write;

/// Longest reply line accepted before the stream is declared garbage (a VALUE line is at most
/// 250 bytes of key plus a few numbers; error lines are short).
pub const MAX_LINE: usize = 4096;

/// Longest key memcached accepts (`KEY_MAX_LENGTH`).
pub const MAX_KEY: usize = 250;

/// The request kind, which decides how its reply is parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Get,
    Set,
}

/// What a complete reply said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// `VALUE …` then `END`.
    Hit,
    /// A bare `END`.
    Miss,
    /// `STORED`.
    Stored,
    /// Any other well-formed line: `ERROR`, `CLIENT_ERROR …`, `SERVER_ERROR …`, `NOT_STORED`, …
    ErrorReply,
    /// Bytes that are not a memcached reply; a TCP stream is out of sync after this.
    Malformed,
}

/// Appends `get <prefix><index>\r\n`.
pub fn write_get(buf: &mut Vec<u8>, prefix: &str, index: u64) {
    buf.extend_from_slice(b"get ");
    write_key(buf, prefix, index);
    buf.extend_from_slice(b"\r\n");
}

/// Appends `set <prefix><index> 0 0 <len>\r\n<value>\r\n`.
pub fn write_set(buf: &mut Vec<u8>, prefix: &str, index: u64, value: &[u8]) {
    buf.extend_from_slice(b"set ");
    write_key(buf, prefix, index);
    // Writing into a Vec cannot fail.
    let _ = write!(buf, " 0 0 {}\r\n", value.len());
    buf.extend_from_slice(value);
    buf.extend_from_slice(b"\r\n");
}

/// Appends the key name for `index`: the prefix followed by the decimal index.
pub fn write_key(buf: &mut Vec<u8>, prefix: &str, index: u64) {
    buf.extend_from_slice(prefix.as_bytes());
    let _ = write!(buf, "{index}");
}

/// Length of the longest key name in a keyspace of `keys` keys.
pub fn max_key_len(prefix: &str, keys: u64) -> usize {
    prefix.len() + keys.saturating_sub(1).max(1).to_string().len()
}

/// The value stored under every key: `len` deterministic printable bytes.
pub fn value(len: usize) -> Vec<u8> {
    (0..len).map(|i| b'a' + (i % 26) as u8).collect()
}

/// Checks whether `buf` starts with a complete reply to `op`.
///
/// Returns `None` while more bytes are needed, otherwise the outcome and the number of bytes the
/// reply used. A reply that cannot become valid is `Malformed` and consumes all of `buf`.
pub fn check(op: Op, buf: &[u8]) -> Option<(Outcome, usize)> {
    let mut pos = 0;
    let mut hit = false;
    loop {
        let line = match line_at(buf, pos) {
            Line::Incomplete => return None,
            Line::TooLong => return Some((Outcome::Malformed, buf.len())),
            Line::Complete(end) => &buf[pos..end],
        };
        let after = pos + line.len() + 2;
        match op {
            Op::Set => {
                let o = if line == b"STORED" {
                    Outcome::Stored
                } else {
                    Outcome::ErrorReply
                };
                return Some((o, after));
            }
            Op::Get if line == b"END" => {
                let o = if hit { Outcome::Hit } else { Outcome::Miss };
                return Some((o, after));
            }
            Op::Get if line.starts_with(b"VALUE ") => {
                let Some(len) = value_len(line) else {
                    return Some((Outcome::Malformed, buf.len()));
                };
                let data_end = match after.checked_add(len) {
                    Some(e) => e,
                    None => return Some((Outcome::Malformed, buf.len())),
                };
                if buf.len() < data_end + 2 {
                    return None;
                }
                if &buf[data_end..data_end + 2] != b"\r\n" {
                    return Some((Outcome::Malformed, buf.len()));
                }
                hit = true;
                pos = data_end + 2;
            }
            // An error line ends the reply, but only before any VALUE: after one it is garbage.
            Op::Get if !hit => return Some((Outcome::ErrorReply, after)),
            Op::Get => return Some((Outcome::Malformed, buf.len())),
        }
    }
}

enum Line {
    /// End of the line's content (the index of its `\r`).
    Complete(usize),
    Incomplete,
    TooLong,
}

fn line_at(buf: &[u8], start: usize) -> Line {
    let rest = &buf[start..];
    let window = &rest[..rest.len().min(MAX_LINE + 2)];
    match window.windows(2).position(|w| w == b"\r\n") {
        Some(i) => Line::Complete(start + i),
        None if rest.len() >= MAX_LINE + 2 => Line::TooLong,
        None => Line::Incomplete,
    }
}

/// The `<bytes>` field of `VALUE <key> <flags> <bytes> [<cas>]`.
fn value_len(line: &[u8]) -> Option<usize> {
    let mut tokens = line.split(|&b| b == b' ').filter(|t| !t.is_empty());
    let _value = tokens.next()?;
    let _key = tokens.next()?;
    let _flags = tokens.next()?;
    let bytes = tokens.next()?;
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests() {
        let mut b = Vec::new();
        write_get(&mut b, "key:", 42);
        assert_eq!(b, b"get key:42\r\n");
        b.clear();
        write_set(&mut b, "k", 7, b"abc");
        assert_eq!(b, b"set k7 0 0 3\r\nabc\r\n");
        assert_eq!(value(3), b"abc");
        assert_eq!(max_key_len("key:", 1000), 7);
        assert_eq!(max_key_len("key:", 1), 5);
    }

    #[test]
    fn get_replies() {
        let hit = b"VALUE key:1 0 5\r\nEND\r\n\r\nEND\r\n";
        assert_eq!(check(Op::Get, hit), Some((Outcome::Hit, hit.len())));
        assert_eq!(check(Op::Get, b"END\r\n"), Some((Outcome::Miss, 5)));
        assert_eq!(
            check(Op::Get, b"SERVER_ERROR out of memory\r\n"),
            Some((Outcome::ErrorReply, 28))
        );
        assert_eq!(
            check(Op::Get, b"VALUE k 0 3 99\r\nabc\r\nEND\r\nxx").map(|r| r.0),
            Some(Outcome::Hit)
        );
    }

    #[test]
    fn get_incomplete() {
        let full = b"VALUE key:1 0 5\r\nhello\r\nEND\r\n";
        for cut in 0..full.len() {
            assert_eq!(check(Op::Get, &full[..cut]), None, "cut at {cut}");
        }
    }

    #[test]
    fn get_malformed() {
        assert_eq!(
            check(Op::Get, b"VALUE k 0 x\r\n").map(|r| r.0),
            Some(Outcome::Malformed)
        );
        assert_eq!(
            check(Op::Get, b"VALUE k 0 1\r\nab\r\n").map(|r| r.0),
            Some(Outcome::Malformed)
        );
        assert_eq!(
            check(Op::Get, b"VALUE k 0 1\r\na\r\nERROR\r\n").map(|r| r.0),
            Some(Outcome::Malformed)
        );
        let long = vec![b'x'; MAX_LINE + 2];
        assert_eq!(check(Op::Get, &long).map(|r| r.0), Some(Outcome::Malformed));
    }

    #[test]
    fn set_replies() {
        assert_eq!(check(Op::Set, b"STORED\r\n"), Some((Outcome::Stored, 8)));
        assert_eq!(
            check(Op::Set, b"NOT_STORED\r\n"),
            Some((Outcome::ErrorReply, 12))
        );
        assert_eq!(
            check(Op::Set, b"CLIENT_ERROR bad data chunk\r\n").map(|r| r.0),
            Some(Outcome::ErrorReply)
        );
        assert_eq!(check(Op::Set, b"STORED\r"), None);
    }
}
