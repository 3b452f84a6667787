//! The meta text protocol: `mg <key> <flag>*`, `ms <key> <datalen> <flag>*` then
//! `<data>\r\n`, `md <key> <flag>*`, `ma <key> <flag>*`, `mn`, `me <key> [b]`.
//!
//! Only what routing needs is read from the flags: `q` (quiet) and `b` (base64 key). Other flags
//! are forwarded for memcached to judge. Keys are checked for length only: memcached accepts any
//! byte but the space in a meta key.

use super::line::parse_u64;
use super::{check_key, Args, Command, Error, KeySpan, Protocol, Request, MAX_DATA_LEN};
use super::{Range, MAX_KEY_LEN};

pub(super) fn parse(command: Command, mut args: Args<'_>) -> Result<Option<Request<'_>>, Error> {
    match command {
        Command::MetaNoop => Ok(Some(args.line_only(command))),
        Command::MetaDebug => {
            // `me <key> [b]`: the only flag is base64.
            let ([key, flag], count) = args.collect::<2>();
            let base64 = match (count, args.get(&flag)) {
                (1, _) => false,
                (2, b"b") => true,
                _ => return Err(Error::BadFormat),
            };
            let flags = Flags {
                quiet: false,
                base64,
            };
            finish(command, args.line_only(command), &args, key, flags)
        }
        Command::MetaSet => {
            let (key_at, key) = args.tokens.next().ok_or(Error::WrongArgCount)?;
            let (_, data_len) = args.tokens.next().ok_or(Error::BadFormat)?;
            let data_len = parse_u64(data_len)
                .and_then(|n| usize::try_from(n).ok())
                .filter(|&n| n <= MAX_DATA_LEN)
                .ok_or(Error::BadFormat)?;
            let flags = Flags::read(&mut args);
            let key = key_at..key_at + key.len();
            // Checked before the data block arrives, so that every prefix fails alike.
            check(command, &args, &key, flags)?;
            match args.with_data(command, data_len)? {
                Some(request) => finish(command, request, &args, key, flags),
                None => Ok(None),
            }
        }
        _ => {
            let (at, key) = args.tokens.next().ok_or(Error::WrongArgCount)?;
            let key = at..at + key.len();
            let flags = Flags::read(&mut args);
            finish(command, args.line_only(command), &args, key, flags)
        }
    }
}

/// The flags routing cares about.
#[derive(Debug, Clone, Copy, Default)]
struct Flags {
    quiet: bool,
    base64: bool,
}

impl Flags {
    fn read(args: &mut Args<'_>) -> Flags {
        let mut flags = Flags::default();
        for (_, token) in args.tokens.by_ref() {
            match token.first() {
                Some(b'q') => flags.quiet = true,
                Some(b'b') => flags.base64 = true,
                _ => {}
            }
        }
        flags
    }
}

fn check(command: Command, args: &Args<'_>, key: &Range<usize>, flags: Flags) -> Result<(), Error> {
    let key = args.get(key);
    check_key(key, Protocol::Meta)?;
    if flags.base64 && !is_base64(key) {
        // memcached 1.6 words the same failure differently per command.
        return Err(match command {
            Command::MetaDelete | Command::MetaArithmetic => Error::BadMetaFlag,
            Command::MetaDebug => Error::BadFormat,
            _ => Error::BadBase64Key,
        });
    }
    Ok(())
}

fn finish<'a>(
    command: Command,
    mut request: Request<'a>,
    args: &Args<'a>,
    key: Range<usize>,
    flags: Flags,
) -> Result<Option<Request<'a>>, Error> {
    check(command, args, &key, flags)?;
    request.keys = KeySpan::One(key.start, key.end);
    request.key_count = 1;
    request.noreply = flags.quiet;
    request.base64_key = flags.base64;
    Ok(Some(request))
}

/// The value of a standard base64 character.
fn sextet(b: u8) -> Option<u8> {
    match b {
        b'A'..=b'Z' => Some(b - b'A'),
        b'a'..=b'z' => Some(b - b'a' + 26),
        b'0'..=b'9' => Some(b - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    }
}

/// Whether `token` is padded standard base64 of at least one byte, as memcached requires.
fn is_base64(token: &[u8]) -> bool {
    let mut out = [0u8; MAX_KEY_LEN];
    decode_base64_key(token, &mut out).is_ok()
}

/// Decodes a meta base64 key token (padded standard alphabet) into `out`, returning the key
/// memcached stores the item under. Fails with [`Error::BadBase64Key`] as memcached does, and
/// with [`Error::KeyTooLong`] for a token longer than [`MAX_KEY_LEN`].
pub fn decode_base64_key<'o>(
    token: &[u8],
    out: &'o mut [u8; MAX_KEY_LEN],
) -> Result<&'o [u8], Error> {
    if token.len() > MAX_KEY_LEN {
        return Err(Error::KeyTooLong);
    }
    let chunks = token.chunks_exact(4);
    if token.is_empty() || !chunks.remainder().is_empty() {
        return Err(Error::BadBase64Key);
    }
    let mut len = 0;
    let groups = chunks.len();
    for (i, group) in chunks.enumerate() {
        let pad = match group {
            [_, _, b'=', b'='] => 2,
            [_, _, _, b'='] => 1,
            _ => 0,
        };
        if pad > 0 && i + 1 != groups {
            return Err(Error::BadBase64Key);
        }
        let mut bits = 0u32;
        for &b in &group[..4 - pad] {
            bits = bits << 6 | u32::from(sextet(b).ok_or(Error::BadBase64Key)?);
        }
        bits <<= 6 * pad;
        let bytes = bits.to_be_bytes();
        for &byte in &bytes[1..4 - pad] {
            let slot = out.get_mut(len).ok_or(Error::BadBase64Key)?;
            *slot = byte;
            len += 1;
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
        assert_eq!(decode_base64_key(b"YWJj", &mut out), Ok(&b"abc"[..]));
        assert_eq!(decode_base64_key(b"YWI=", &mut out), Ok(&b"ab"[..]));
        assert_eq!(decode_base64_key(b"YQ==", &mut out), Ok(&b"a"[..]));
        assert_eq!(
            decode_base64_key(b"+/+/", &mut out),
            Ok(&[0xfb, 0xff, 0xbf][..])
        );
        // Rejected by memcached 1.6 with "CLIENT_ERROR error decoding key".
        for bad in [
            &b"YWJ"[..],
            b"YW",
            b"Y",
            b"YWJj=",
            b"====",
            b"YQ==YWJj",
            b"YW!j",
            b"",
        ] {
            assert_eq!(
                decode_base64_key(bad, &mut out),
                Err(Error::BadBase64Key),
                "{bad:?}"
            );
        }
        let long = [b'Q'; 252];
        assert_eq!(decode_base64_key(&long, &mut out), Err(Error::KeyTooLong));
    }
}
