//! The meta text protocol: `mg <key> <flag>*`, `ms <key> <datalen> <flag>*` then
//! `<data>\r\n`, `md <key> <flag>*`, `ma <key> <flag>*`, `mn`, `me <key> [b]`.
//!
//! Every flag is checked as memcached checks it, so that a command memcached would refuse is
//! answered by the proxy and never forwarded; of the flags, routing reads `q` (quiet) and `b`
//! (base64 key). Keys are checked for length only: memcached accepts any byte but the space in a
//! meta key.

use super::line::{c_strtol32, c_strtoul32, c_strtoull};
use super::{check_key, Args, Command, Error, KeySpan, Protocol, Request, MAX_DATA_LEN};
use super::{Range, MAX_KEY_LEN};

/// memcached's tokenizer keeps at most this many tokens of a line, its end marker included; the
/// rest of the line is not split.
const MAX_TOKENS: usize = 24;
/// memcached refuses a meta command with more tokens than this (command, key, arguments, flags
/// and the end marker): `MFLAG_MAX_OPT_LENGTH`.
const MAX_META_TOKENS: usize = 20;
/// Longest opaque (`O`) flag memcached echoes, the `O` included.
const MAX_OPAQUE_LEN: usize = 32;

pub(super) fn parse(command: Command, mut args: Args<'_>) -> Result<Option<Request<'_>>, Error> {
    match command {
        Command::MetaNoop => Ok(Some(args.line_only(command))),
        Command::MetaDebug => {
            // `me <key> [b]`: memcached reads the key and whether the next token is exactly
            // `b`, and ignores anything after.
            let ([key, flag], count) = args.collect::<2>();
            if count == 0 {
                return Err(Error::BadFormat);
            }
            let key_token = args.get(&key);
            let base64 = count >= 2 && args.get(&flag) == b"b";
            check_key(key_token, Protocol::Meta)?;
            if base64 && !is_base64(key_token) {
                return Err(Error::BadFormat);
            }
            let flags = Flags {
                quiet: false,
                base64,
            };
            finish(args.line_only(command), key, flags)
        }
        _ => keyed(command, args),
    }
}

/// `mg`, `ms`, `md` and `ma`, judged exactly as memcached 1.6 judges them, in its order, so
/// that the proxy forwards a command only when memcached will read it as the proxy did, and
/// answers every other one with memcached's own error (see [`super::recover`] for what
/// memcached then skips).
fn keyed(command: Command, mut args: Args<'_>) -> Result<Option<Request<'_>>, Error> {
    // The tokens after the command name, at most as many as memcached's tokenizer keeps.
    let mut tokens: [Range<usize>; MAX_TOKENS - 1] = core::array::from_fn(|_| 0..0);
    let mut n = 0;
    for (at, token) in args.tokens.by_ref() {
        if n + 1 == MAX_TOKENS - 1 {
            break;
        }
        tokens[n] = at..at + token.len();
        n += 1;
    }
    // memcached counts the command name and an end marker as tokens too.
    let ntokens = n + 2;
    if n == 0 {
        return Err(Error::WrongArgCount);
    }
    let key = tokens[0].clone();
    check_key(args.get(&key), Protocol::Meta)?;
    let set = command == Command::MetaSet;
    if set && n == 1 {
        return Err(Error::BadFormat);
    }
    if ntokens > MAX_META_TOKENS {
        return Err(match command {
            Command::MetaGet => Error::TooManyGetFlags,
            _ => Error::TooManyFlags,
        });
    }
    let data_len = if set {
        let len = c_strtol32(args.get(&tokens[1])).ok_or(Error::BadFormat)?;
        let len = usize::try_from(len)
            .ok()
            .filter(|&n| n <= MAX_DATA_LEN)
            .ok_or(Error::BadFormat)?;
        Some(len)
    } else {
        None
    };
    let flag_tokens = &tokens[if set { 2 } else { 1 }..n];
    let flags = preparse(&args, args.get(&key), flag_tokens).map_err(|e| match command {
        // memcached words every flag error of these two alike.
        Command::MetaDelete | Command::MetaArithmetic => Error::BadMetaFlag,
        _ => e,
    })?;
    let mut opaque_too_long = false;
    for token in flag_tokens.iter().map(|t| args.get(t)) {
        if token.first() == Some(&b'O') && token.len() > MAX_OPAQUE_LEN {
            opaque_too_long = true;
        }
    }
    let mode = flag_tokens
        .iter()
        .map(|t| args.get(t))
        .find(|t| t.first() == Some(&b'M'))
        .and_then(|t| t.get(1).copied());
    match command {
        Command::MetaSet => {
            // The mode is checked before the opaque, as memcached does.
            if mode.is_some_and(|m| !matches!(m, b'E' | b'A' | b'P' | b'R' | b'S')) {
                return Err(Error::BadSetMode);
            }
            if opaque_too_long {
                return Err(Error::OpaqueTooLong);
            }
        }
        Command::MetaArithmetic
            if mode.is_some_and(|m| !matches!(m, b'I' | b'+' | b'D' | b'-')) =>
        {
            return Err(Error::BadArithmeticMode);
        }
        // A long opaque fails `ma` only after the arithmetic is done: memcached is left to
        // answer it, with one error line.
        Command::MetaArithmetic => {}
        _ if opaque_too_long => return Err(Error::OpaqueTooLong),
        _ => {}
    }
    let request = match data_len {
        Some(len) => match args.with_data(command, len)? {
            Some(request) => request,
            None => return Ok(None),
        },
        None => args.line_only(command),
    };
    finish(request, key, flags)
}

/// The flags routing cares about.
#[derive(Debug, Clone, Copy, Default)]
struct Flags {
    quiet: bool,
    base64: bool,
}

/// memcached's check of a meta command's flags (`_meta_flag_preparse`): each flag is known,
/// seen once (by its first byte), and its number, if it takes one, reads. A repeated or unknown
/// flag stops the check at once; any other failure lets it go on, and the last failure found is
/// the one reported.
fn preparse(args: &Args<'_>, key: &[u8], flag_tokens: &[Range<usize>]) -> Result<Flags, Error> {
    let mut seen = [false; 128];
    let mut flags = Flags::default();
    let mut failed = None;
    for token in flag_tokens.iter().map(|t| args.get(t)) {
        let Some(&o) = token.first() else {
            continue;
        };
        if o >= 127 || seen[usize::from(o)] {
            return Err(Error::DuplicateFlag);
        }
        seen[usize::from(o)] = true;
        let value = &token[1..];
        let bad = match o {
            b'b' => {
                flags.base64 = true;
                (!is_base64(key)).then_some(Error::BadBase64Key)
            }
            b'N' | b'T' | b'R' => c_strtol32(value).is_none().then_some(Error::BadFlagToken),
            b'C' => c_strtoull(value).is_none().then_some(Error::BadFlagToken),
            // memcached keeps its last message here: a bad client flags value has none.
            b'F' => c_strtoul32(value)
                .is_none()
                .then_some(failed.unwrap_or(Error::BadFlagValue)),
            b'M' => (token.len() != 2).then_some(Error::BadModeLength),
            b'J' => c_strtoull(value).is_none().then_some(Error::BadInitial),
            b'D' => c_strtoull(value).is_none().then_some(Error::BadDeltaFlag),
            b'q' => {
                flags.quiet = true;
                None
            }
            b'l' | b'O' | b'P' | b'L' | b'k' | b's' | b't' | b'c' | b'f' | b'v' | b'h' | b'u'
            | b'I' => None,
            _ => return Err(Error::InvalidFlag),
        };
        if bad.is_some() {
            failed = bad;
        }
    }
    match failed {
        Some(error) => Err(error),
        None => Ok(flags),
    }
}

fn finish<'a>(
    mut request: Request<'a>,
    key: Range<usize>,
    flags: Flags,
) -> Result<Option<Request<'a>>, Error> {
    request.keys = KeySpan::One(key.start, key.end);
    request.key_count = 1;
    request.noreply = flags.quiet;
    request.base64_key = flags.base64;
    Ok(Some(request))
}

/// The value of a base64 character as memcached's decoder reads it (`=` reads as 0); other bytes
/// are skipped.
fn sextet(b: u8) -> Option<u8> {
    match b {
        b'A'..=b'Z' => Some(b - b'A'),
        b'a'..=b'z' => Some(b - b'a' + 26),
        b'0'..=b'9' => Some(b - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        b'=' => Some(0),
        _ => None,
    }
}

/// Whether memcached decodes `token` as a base64 key.
fn is_base64(token: &[u8]) -> bool {
    let mut out = [0u8; MAX_KEY_LEN];
    decode_base64_key(token, &mut out).is_ok()
}

/// Decodes a meta base64 key token into `out`, returning the key memcached stores the item
/// under, exactly as memcached 1.6's decoder does: bytes outside the alphabet are skipped, the
/// rest must come in groups of four, and decoding stops after the first group holding a `=`
/// (one or two of them; three fail). Fails with [`Error::BadBase64Key`] where memcached does,
/// and with [`Error::KeyTooLong`] for a token longer than [`MAX_KEY_LEN`].
pub fn decode_base64_key<'o>(
    token: &[u8],
    out: &'o mut [u8; MAX_KEY_LEN],
) -> Result<&'o [u8], Error> {
    if token.len() > MAX_KEY_LEN {
        return Err(Error::KeyTooLong);
    }
    let count = token.iter().filter(|&&b| sextet(b).is_some()).count();
    if count == 0 || count % 4 != 0 {
        return Err(Error::BadBase64Key);
    }
    let (mut block, mut n, mut pad, mut len) = ([0u8; 4], 0, 0, 0);
    for &b in token {
        let Some(v) = sextet(b) else {
            continue;
        };
        if b == b'=' {
            pad += 1;
        }
        block[n] = v;
        n += 1;
        if n < 4 {
            continue;
        }
        n = 0;
        // At most 3 bytes per 4 characters of at most MAX_KEY_LEN: within `out`.
        let bytes = [
            block[0] << 2 | block[1] >> 4,
            block[1] << 4 | block[2] >> 2,
            block[2] << 6 | block[3],
        ];
        let keep = match pad {
            0 => 3,
            1 => 2,
            2 => 1,
            _ => return Err(Error::BadBase64Key),
        };
        for byte in &bytes[..keep] {
            let slot = out.get_mut(len).ok_or(Error::BadBase64Key)?;
            *slot = *byte;
            len += 1;
        }
        if pad > 0 {
            break;
        }
    }
    Ok(&out[..len])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_keys() {
        let mut out = [0u8; MAX_KEY_LEN];
        // memcached 1.6.18's own readings (captured with `mg <token> b k`).
        let table: &[(&[u8], Option<&[u8]>)] = &[
            (b"YWJj", Some(b"abc")),
            (b"YWI=", Some(b"ab")),
            (b"YQ==", Some(b"a")),
            (b"+/+/", Some(&[0xfb, 0xff, 0xbf])),
            (b"YQ==YWJj", Some(b"a")),
            (b"Y!Q==", Some(b"a")),
            (b"Y\rWJj", Some(b"abc")),
            (b"YQ=x", Some(&[0x61, 0x00])),
            (b"=YWJ", Some(&[0x01, 0x85])),
            (b"YWJ", None),
            (b"YWJj=", None),
            (b"====", None),
            (b"YW!j", None),
            (b"Y===", None),
            (b"", None),
        ];
        for &(token, want) in table {
            let got = decode_base64_key(token, &mut out).ok().map(<[u8]>::to_vec);
            assert_eq!(got.as_deref(), want, "{:?}", String::from_utf8_lossy(token));
        }
        let long = [b'Q'; 252];
        assert_eq!(decode_base64_key(&long, &mut out), Err(Error::KeyTooLong));
    }
}
