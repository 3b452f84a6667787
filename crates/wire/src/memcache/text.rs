//! The classic text protocol: argument counts, numbers and keys checked as memcached 1.6 checks
//! them, so that the switch can answer a bad request with memcached's own error line.

use super::line::{c_strtol32, c_strtoul32, c_strtoull};
use super::{check_key, Args, Command, Error, KeySpan, Protocol, Request, MAX_DATA_LEN};

pub(super) fn parse(command: Command, args: Args<'_>) -> Result<Option<Request<'_>>, Error> {
    match command {
        Command::Get | Command::Gets | Command::Gat | Command::Gats => retrieval(command, args),
        Command::Set
        | Command::Add
        | Command::Replace
        | Command::Append
        | Command::Prepend
        | Command::Cas => storage(command, args),
        Command::Delete => delete(args),
        Command::Incr | Command::Decr => arithmetic(command, args),
        Command::Touch => touch(args),
        _ => keyless(command, args),
    }
}

/// `get <key>+`, `gets <key>+`, `gat <exptime> <key>*`, `gats <exptime> <key>*`.
///
/// memcached answers `gat <exptime>` without keys with a bare `END`, so zero keys are accepted
/// there; `get` without keys is `ERROR`.
fn retrieval(command: Command, mut args: Args<'_>) -> Result<Option<Request<'_>>, Error> {
    let mut exptime = None;
    if matches!(command, Command::Gat | Command::Gats) {
        let (at, token) = args.tokens.next().ok_or(Error::WrongArgCount)?;
        c_strtol32(token).ok_or(Error::BadExptime)?;
        exptime = Some((at, at + token.len()));
    }
    let keys_start = exptime.map_or(args.name_end, |(_, end)| end);
    let mut count = 0;
    for (_, key) in args.tokens.by_ref() {
        check_key(key, Protocol::Text)?;
        count += 1;
    }
    if count == 0 && exptime.is_none() {
        return Err(Error::WrongArgCount);
    }
    let mut request = args.line_only(command);
    request.keys = KeySpan::Tokens(keys_start, args.line.end);
    request.key_count = count;
    request.exptime = exptime;
    Ok(Some(request))
}

/// `<cmd> <key> <flags> <exptime> <bytes> [noreply]` and
/// `cas <key> <flags> <exptime> <bytes> <cas unique> [noreply]`, then `<data>\r\n`.
///
/// A last argument other than `noreply` is ignored, as memcached does.
fn storage(command: Command, mut args: Args<'_>) -> Result<Option<Request<'_>>, Error> {
    let fixed = if command == Command::Cas { 5 } else { 4 };
    let ([key, flags, exptime, bytes, cas, last], count) = args.collect::<6>();
    if count != fixed && count != fixed + 1 {
        return Err(Error::WrongArgCount);
    }
    let key_range = key.clone();
    let key = args.get(&key);
    check_key(key, Protocol::Text)?;
    // Read as memcached reads them (C's strtol family): a length past 32 bits wraps, and the
    // proxy must frame the data block exactly where memcached will.
    c_strtoul32(args.get(&flags)).ok_or(Error::BadFormat)?;
    c_strtol32(args.get(&exptime)).ok_or(Error::BadFormat)?;
    let data_len = c_strtol32(args.get(&bytes)).ok_or(Error::BadFormat)?;
    let noreply_at = if command == Command::Cas {
        c_strtoull(args.get(&cas)).ok_or(Error::BadFormat)?;
        last
    } else {
        cas
    };
    let data_len = usize::try_from(data_len)
        .ok()
        .filter(|&n| n <= MAX_DATA_LEN)
        .ok_or(Error::BadFormat)?;
    let noreply = count == fixed + 1 && args.get(&noreply_at) == b"noreply";
    let Some(mut request) = args.with_data(command, data_len)? else {
        return Ok(None);
    };
    request.keys = KeySpan::One(key_range.start, key_range.end);
    request.key_count = 1;
    request.noreply = noreply;
    Ok(Some(request))
}

/// `delete <key> [0] [noreply]`; the `0` is memcached's legacy hold time, nothing else is
/// accepted there.
fn delete(mut args: Args<'_>) -> Result<Option<Request<'_>>, Error> {
    let ([key, a, b], count) = args.collect::<3>();
    let (a, b) = (args.get(&a), args.get(&b));
    let noreply = match count {
        1 => false,
        2 if a == b"0" => false,
        2 if a == b"noreply" => true,
        3 if a == b"0" && b == b"noreply" => true,
        2 | 3 => return Err(Error::BadDelete),
        _ => return Err(Error::WrongArgCount),
    };
    keyed(Command::Delete, args, key, noreply)
}

/// `incr <key> <value> [noreply]`, `decr <key> <value> [noreply]`.
fn arithmetic(command: Command, mut args: Args<'_>) -> Result<Option<Request<'_>>, Error> {
    let ([key, delta, last], count) = args.collect::<3>();
    if count != 2 && count != 3 {
        return Err(Error::WrongArgCount);
    }
    check_key(args.get(&key), Protocol::Text)?;
    c_strtoull(args.get(&delta)).ok_or(Error::BadDelta)?;
    let noreply = count == 3 && args.get(&last) == b"noreply";
    keyed(command, args, key, noreply)
}

/// `touch <key> <exptime> [noreply]`.
fn touch(mut args: Args<'_>) -> Result<Option<Request<'_>>, Error> {
    let ([key, exptime, last], count) = args.collect::<3>();
    if count != 2 && count != 3 {
        return Err(Error::WrongArgCount);
    }
    check_key(args.get(&key), Protocol::Text)?;
    c_strtol32(args.get(&exptime)).ok_or(Error::BadExptime)?;
    let noreply = count == 3 && args.get(&last) == b"noreply";
    keyed(Command::Touch, args, key, noreply)
}

/// A one-key request that ends with its command line.
fn keyed<'a>(
    command: Command,
    args: Args<'a>,
    key: core::ops::Range<usize>,
    noreply: bool,
) -> Result<Option<Request<'a>>, Error> {
    check_key(args.get(&key), Protocol::Text)?;
    let mut request = args.line_only(command);
    request.keys = KeySpan::One(key.start, key.end);
    request.key_count = 1;
    request.noreply = noreply;
    Ok(Some(request))
}

/// `version`, `stats [args]`, `flush_all [delay] [noreply]`, `verbosity <level> [noreply]`,
/// `quit`, `shutdown [graceful]` and the administrative commands: no key; only the arguments
/// memcached rejects with a distinct reply are checked.
///
/// As in memcached, `noreply` is the last token whatever comes before it, and any other first
/// argument of `flush_all` is its delay: `flush_all noreply x` has a bad delay.
fn keyless(command: Command, mut args: Args<'_>) -> Result<Option<Request<'_>>, Error> {
    let ([first, second], count) = args.collect::<2>();
    let (first, second) = (args.get(&first), args.get(&second));
    let last = if count >= 2 { second } else { first };
    let noreply = count > 0 && last == b"noreply";
    let has_delay = count > usize::from(noreply);
    match command {
        Command::Verbosity if count == 0 || count > 2 => return Err(Error::WrongArgCount),
        Command::Verbosity if c_strtoul32(first).is_none() => return Err(Error::BadFormat),
        Command::FlushAll if count > 2 => return Err(Error::WrongArgCount),
        Command::FlushAll if has_delay && c_strtol32(first).is_none() => {
            return Err(Error::BadExptime)
        }
        _ => {}
    }
    let mut request = args.line_only(command);
    request.noreply = noreply && matches!(command, Command::FlushAll | Command::Verbosity);
    Ok(Some(request))
}
