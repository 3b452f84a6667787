//! Command lines and their space-separated tokens, as memcached's tokenizer sees them.

use super::{Error, MAX_LINE_LEN};

/// Where the first line of a buffer ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Line {
    /// End of the line's content: the `\r\n` or bare `\n` is not part of it, nor anything from a
    /// NUL on.
    pub end: usize,
    /// Offset just past the `\n`, where the data block or the next request starts.
    pub next: usize,
}

impl Line {
    /// Finds the first line; `Ok(None)` if its `\n` has not arrived yet.
    ///
    /// Fails with [`Error::LineTooLong`] when [`MAX_LINE_LEN`] bytes have arrived without a
    /// `\n` and the line is not a multi-get: memcached closes such a connection. A complete line
    /// is read whatever its length, as memcached reads it.
    pub fn find(buf: &[u8]) -> Result<Option<Line>, Error> {
        match buf.iter().position(|&b| b == b'\n') {
            Some(nl) => {
                let next = nl + 1;
                let end = super::line_content(&buf[..next]).len();
                Ok(Some(Line { end, next }))
            }
            None if buf.len() > MAX_LINE_LEN && !is_multiget(buf) => Err(Error::LineTooLong),
            None => Ok(None),
        }
    }
}

/// Whether memcached lets a line without its `\n` grow past [`MAX_LINE_LEN`]: one that starts,
/// after at most 100 spaces, with `get ` or `gets ` (not `gat`, not `gats`).
fn is_multiget(buf: &[u8]) -> bool {
    let spaces = buf.iter().take_while(|&&b| b == b' ').count();
    let rest = &buf[spaces..];
    spaces <= 100 && (rest.starts_with(b"get ") || rest.starts_with(b"gets "))
}

/// Iterator over the space-separated tokens of a line, with their offsets. Runs of spaces count
/// as one separator and leading spaces are skipped; only the space separates, as in memcached.
#[derive(Debug, Clone)]
pub(super) struct Tokens<'a> {
    line: &'a [u8],
    pos: usize,
}

impl<'a> Tokens<'a> {
    pub fn new(line: &'a [u8]) -> Tokens<'a> {
        Tokens { line, pos: 0 }
    }
}

impl<'a> Iterator for Tokens<'a> {
    type Item = (usize, &'a [u8]);

    fn next(&mut self) -> Option<(usize, &'a [u8])> {
        let rest = self.line.get(self.pos..)?;
        let start = self.pos + rest.iter().position(|&b| b != b' ')?;
        let rest = &self.line[start..];
        let len = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
        self.pos = start + len;
        Some((start, &rest[..len]))
    }
}

/// An unsigned decimal as servers write it in replies: an optional `+`, then digits.
pub(super) fn parse_u64(token: &[u8]) -> Option<u64> {
    let digits = token.strip_prefix(b"+").unwrap_or(token);
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &b| {
        let digit = u64::from(b.checked_sub(b'0').filter(|&d| d <= 9)?);
        n.checked_mul(10)?.checked_add(digit)
    })
}

/// A number as C's `strtol` family reads the front of a token, and as memcached's `safe_strto*`
/// wrappers then judge it: leading white space, an optional sign, at least one digit, and then
/// the token's end or white space (anything may follow that). memcached splits lines at spaces
/// only, so a token may hold tabs and the other white space bytes.
struct CNumber {
    negative: bool,
    /// `None` when the digits overflow 64 bits (C sets `ERANGE`).
    magnitude: Option<u64>,
}

fn c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

fn c_number(token: &[u8]) -> Option<CNumber> {
    let mut at = token.iter().position(|&b| !c_space(b))?;
    let negative = match token[at] {
        b'-' => {
            at += 1;
            true
        }
        b'+' => {
            at += 1;
            false
        }
        _ => false,
    };
    let digits = token[at..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .count();
    if digits == 0 {
        return None;
    }
    let end = at + digits;
    if token.get(end).is_some_and(|&b| !c_space(b)) {
        return None;
    }
    let magnitude = token[at..end].iter().try_fold(0u64, |n, &b| {
        n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    });
    Some(CNumber {
        negative,
        magnitude,
    })
}

/// memcached's `safe_strtol` into an `int32_t`: a `long` that fits 64 bits, truncated to 32.
pub(super) fn c_strtol32(token: &[u8]) -> Option<i32> {
    let n = c_number(token)?;
    let magnitude = n.magnitude?;
    let value = if n.negative {
        0i64.checked_sub_unsigned(magnitude)?
    } else {
        i64::try_from(magnitude).ok()?
    };
    Some(value as i32)
}

/// memcached's `safe_strtoull`: a negative number is taken modulo 2^64 unless that looks
/// negative as a signed number and the token holds a `-`.
pub(super) fn c_strtoull(token: &[u8]) -> Option<u64> {
    let n = c_number(token)?;
    let magnitude = n.magnitude?;
    let value = if n.negative {
        magnitude.wrapping_neg()
    } else {
        magnitude
    };
    if (value as i64) < 0 && token.contains(&b'-') {
        return None;
    }
    Some(value)
}

/// memcached's `safe_strtoul` into a `uint32_t`: as [`c_strtoull`], truncated to 32 bits.
pub(super) fn c_strtoul32(token: &[u8]) -> Option<u32> {
    c_strtoull(token).map(|v| v as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_skip_runs_of_spaces() {
        let tokens: Vec<_> = Tokens::new(b"  get  a b ").collect();
        assert_eq!(tokens, [(2, &b"get"[..]), (7, b"a"), (9, b"b")]);
        assert_eq!(Tokens::new(b"   ").next(), None);
        assert_eq!(Tokens::new(b"").next(), None);
    }

    #[test]
    fn c_numbers_read_as_memcached_reads_them() {
        assert_eq!(c_strtol32(b"5"), Some(5));
        assert_eq!(c_strtol32(b"\t+5"), Some(5));
        assert_eq!(c_strtol32(b"5\tjunk"), Some(5));
        assert_eq!(c_strtol32(b"5x"), None);
        assert_eq!(c_strtol32(b"-"), None);
        assert_eq!(c_strtol32(b""), None);
        assert_eq!(c_strtol32(b"4294967297"), Some(1), "truncated to 32 bits");
        assert_eq!(c_strtol32(b"-1"), Some(-1));
        assert_eq!(c_strtol32(b"9223372036854775808"), None, "ERANGE");
        assert_eq!(c_strtoull(b"-0"), Some(0));
        assert_eq!(c_strtoull(b"-1"), None);
        assert_eq!(c_strtoull(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(c_strtoull(b"18446744073709551616"), None);
        assert_eq!(c_strtoul32(b"4294967296"), Some(0));
        assert_eq!(c_strtoul32(b"-4294967295"), None);
    }

    #[test]
    fn numbers() {
        assert_eq!(parse_u64(b"0"), Some(0));
        assert_eq!(parse_u64(b"+3"), Some(3));
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_u64(b"18446744073709551616"), None);
        assert_eq!(parse_u64(b"-1"), None);
        assert_eq!(parse_u64(b"+"), None);
        assert_eq!(parse_u64(b"1x"), None);
    }
}
