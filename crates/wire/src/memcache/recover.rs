//! How memcached 1.6 answers a request it could not parse, and where it reads the stream again.
//!
//! [`recover`] writes memcached 1.6.18's exact reply for a [`parse`](super::parse) error and says
//! how many bytes memcached skips, so that a server or proxy built on [`parse`](super::parse)
//! resynchronises a TCP stream byte for byte as memcached does. Checked against memcached 1.6.18;
//! nothing here allocates beyond the reply appended to `out`.

use super::binary::{self, Header, HEADER_LEN, REQUEST_MAGIC};
use super::line::{c_strtol32, Tokens};
use super::{line_content, line_len, Command, Error};

/// What [`recover`] did with the bytes at the front of the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recovery {
    /// Bytes of the buffer to drop before the next request; never more than the buffer holds.
    pub consumed: usize,
    /// Bytes still to come that memcached throws away unread after those (the rest of a data
    /// block or body it swallows); the next request starts after them.
    pub skip: usize,
    /// memcached closes the connection here: write the reply (if any), then close.
    pub close: bool,
    /// memcached throws away the replies to earlier requests that it has not written yet and
    /// goes on (a multi-get with a key too long, memcached's `conn_release_items`): a proxy
    /// that wants to answer as memcached does drops the replies still queued.
    pub forget: bool,
}

/// Answers the request at the front of `buf` that [`parse`](super::parse) refused with `error`
/// as memcached 1.6.18 does, appending memcached's reply (possibly nothing) to `out`.
///
/// `None` means memcached would wait for more bytes before answering: call again once more have
/// arrived, with the same error. The buffer must start with the refused request.
///
/// - Text and meta: the error line of [`Error::text_reply`], then the next request is read after
///   the line; a storage line whose data block does not end in `\r\n` skips the announced block
///   too. A classic command whose last token is `noreply` gets no reply for the errors memcached
///   finds after reading that token (bad numbers, key too long, bad data chunk, ...); unknown
///   commands and wrong argument counts are always answered, and meta commands always answer
///   errors. A line too long closes the connection without a reply.
/// - Binary: a response with the request's opcode and opaque, [`Error::binary_status`] and
///   memcached's text for it. memcached reads the header, extras and key first, so it answers
///   once they have arrived. An unknown opcode is then skipped and the stream goes on; memcached
///   skips its whole body length *after* the extras and key, so they are skipped twice and eat
///   into the next request, which is reproduced here. Every other binary error closes the
///   connection.
pub fn recover(error: Error, buf: &[u8], out: &mut Vec<u8>) -> Option<Recovery> {
    if buf.first() == Some(&REQUEST_MAGIC) {
        recover_binary(error, buf, out)
    } else {
        recover_text(error, buf, out)
    }
}

/// [`recover`] for a connection whose protocol is binary.
pub fn recover_binary(error: Error, buf: &[u8], out: &mut Vec<u8>) -> Option<Recovery> {
    if error == Error::BadMagic {
        // Not a binary request at all: memcached closes without a word.
        return Some(Recovery {
            consumed: buf.len(),
            skip: 0,
            close: true,
            forget: false,
        });
    }
    let header = Header::decode(buf)?;
    let head = HEADER_LEN + usize::from(header.extras_len) + usize::from(header.key_len);
    if buf.len() < head {
        return None;
    }
    binary::write_error(header.opcode, error.binary_status(), header.opaque, out);
    if error != Error::UnknownCommand {
        return Some(Recovery {
            consumed: buf.len(),
            skip: 0,
            close: true,
            forget: false,
        });
    }
    // Answered at once; the body is then thrown away as it arrives. memcached passes its
    // length as an `int`: from 2^31 on it is negative and nothing is thrown away.
    let body = if (header.body_len as i32) < 0 {
        0
    } else {
        header.body_len as usize
    };
    let total = head.saturating_add(body);
    let consumed = total.min(buf.len());
    Some(Recovery {
        consumed,
        skip: total - consumed,
        close: false,
        forget: false,
    })
}

/// [`recover`] for a connection whose protocol is text, whatever the first byte.
pub fn recover_text(error: Error, buf: &[u8], out: &mut Vec<u8>) -> Option<Recovery> {
    if error.closes_connection() {
        return Some(Recovery {
            consumed: buf.len(),
            skip: 0,
            close: true,
            forget: false,
        });
    }
    let line_end = line_len(buf)?;
    let line = &buf[..line_end];
    let mut block = 0;
    if error == Error::BadDataChunk || swallows(error, line) {
        // A bad chunk is only reported once the whole block has arrived; an `ms` refused for
        // its flags is answered at once and its block thrown away as it arrives. A length the
        // parser could not have read is not skipped.
        if let Some(n) = data_len(line).and_then(|n| n.checked_add(2)) {
            block = n;
        }
    }
    if !silenced(error, line) {
        out.extend_from_slice(error.text_reply());
    }
    let total = line_end.saturating_add(block);
    let consumed = total.min(buf.len());
    let retrieval = matches!(
        tokens(line)
            .next()
            .and_then(|(_, name)| Command::from_name(name)),
        Some(Command::Get | Command::Gets | Command::Gat | Command::Gats)
    );
    Some(Recovery {
        consumed,
        skip: total - consumed,
        close: false,
        forget: retrieval && error == Error::KeyTooLong,
    })
}

/// The tokens of a command line as memcached's tokenizer splits them: what it reads of the line
/// ([`line_content`]), split at spaces only (a meta key may hold a `\r`).
fn tokens(line: &[u8]) -> Tokens<'_> {
    Tokens::new(line_content(line))
}

/// The data length a storage or `ms` command line announces, read as the parser (and
/// memcached) reads it: a length past 32 bits wraps, a negative one is `None`.
pub fn data_len(line: &[u8]) -> Option<usize> {
    let mut tokens = tokens(line).map(|(_, token)| token);
    let at = match Command::from_name(tokens.next()?)? {
        Command::MetaSet => 1,
        _ => 3,
    };
    usize::try_from(c_strtol32(tokens.nth(at)?)?).ok()
}

/// Whether memcached throws away an `ms` command's data block after refusing it: it does for
/// every failure of its flags, which it finds after reading the block's length, and not for
/// the failures before (no length, a bad length, too many tokens, a key too long).
fn swallows(error: Error, line: &[u8]) -> bool {
    let mut tokens = tokens(line).map(|(_, token)| token);
    tokens.next().and_then(Command::from_name) == Some(Command::MetaSet)
        && matches!(
            error,
            Error::BadBase64Key
                | Error::DuplicateFlag
                | Error::InvalidFlag
                | Error::BadFlagToken
                | Error::BadFlagValue
                | Error::BadModeLength
                | Error::BadInitial
                | Error::BadDeltaFlag
                | Error::OpaqueTooLong
                | Error::BadSetMode
        )
}

/// Whether memcached keeps its error reply to itself: a classic command that takes `noreply`
/// sets it from the line's last token before checking anything else, and its errors are then
/// silent. Errors found before that (unknown command, wrong argument count) are answered.
fn silenced(error: Error, line: &[u8]) -> bool {
    if matches!(error, Error::UnknownCommand | Error::WrongArgCount) {
        return false;
    }
    let mut tokens = tokens(line).map(|(_, token)| token);
    let takes_noreply = matches!(
        tokens.next().and_then(Command::from_name),
        Some(
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
                | Command::FlushAll
                | Command::Verbosity
        )
    );
    takes_noreply && tokens.last() == Some(b"noreply")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memcache::binary::{opcode, status};
    use crate::memcache::parse;

    /// Runs `input` through parse and recover as a server would, returning the error replies
    /// and whether the connection was closed; successful requests are answered with `+`.
    fn run(input: &[u8]) -> (Vec<u8>, bool) {
        let mut out = Vec::new();
        let mut at = 0;
        while at < input.len() {
            let rest = &input[at..];
            match parse(rest) {
                Ok(Some(request)) => {
                    out.push(b'+');
                    at += request.len;
                }
                Ok(None) => break,
                Err(error) => match recover(error, rest, &mut out) {
                    Some(recovery) if recovery.close => return (out, true),
                    Some(recovery) => at += recovery.consumed + recovery.skip,
                    None => break,
                },
            }
        }
        (out, false)
    }

    /// A binary request with opaque 0xdeadbeef.
    fn bin(op: u8, extras: &[u8], key: &[u8], value: &[u8]) -> Vec<u8> {
        let body = extras.len() + key.len() + value.len();
        let mut out = vec![0x80, op];
        out.extend_from_slice(&(key.len() as u16).to_be_bytes());
        out.push(extras.len() as u8);
        out.extend_from_slice(&[0, 0, 0]);
        out.extend_from_slice(&(body as u32).to_be_bytes());
        out.extend_from_slice(&0xdead_beef_u32.to_be_bytes());
        out.extend_from_slice(&[0; 8]);
        out.extend_from_slice(extras);
        out.extend_from_slice(key);
        out.extend_from_slice(value);
        out
    }

    /// memcached's error response to a request with opcode `op` and opaque 0xdeadbeef.
    fn bin_error(op: u8, status: u16) -> Vec<u8> {
        let mut out = Vec::new();
        binary::write_error(op, status, 0xdead_beef, &mut out);
        out
    }

    #[test]
    fn text_errors_resynchronise() {
        // As in memcached, the bytes after the announced block are read as the next line.
        assert_eq!(
            run(b"bogus\r\nset a 0 0 2\r\nhiX\r\nmn\r\n"),
            (
                b"ERROR\r\nCLIENT_ERROR bad data chunk\r\nERROR\r\n+".to_vec(),
                false
            )
        );
        // A refused storage line does not skip its data block: memcached reads it as a command.
        assert_eq!(
            run(b"set a 0 0 -1\r\nx\r\nmn\r\n"),
            (
                b"CLIENT_ERROR bad command line format\r\nERROR\r\n+".to_vec(),
                false
            )
        );
    }

    #[test]
    fn bad_chunk_skips_the_length_the_parser_read() {
        // A meta key may hold a `\r`: the announced length is 2, not the number after it.
        let input = b"ms a\r18446744073709551585 2\r\nhiX\r\nmn\r\n";
        let mut out = Vec::new();
        let recovery = recover(Error::BadDataChunk, input, &mut out).unwrap();
        assert_eq!(
            recovery,
            Recovery {
                consumed: b"ms a\r18446744073709551585 2\r\nhi\r\n".len(),
                skip: 0,
                close: false,
                forget: false
            }
        );
        assert_eq!(out, b"CLIENT_ERROR bad data chunk\r\n");
        assert_eq!(
            run(input).0,
            b"CLIENT_ERROR bad data chunk\r\nERROR\r\n+".to_vec()
        );
    }

    #[test]
    fn data_len_never_overflows() {
        // Read as memcached reads it: past 64 bits is ERANGE, and 2^32 + 1 wraps to 1.
        assert_eq!(data_len(b"set k 0 0 18446744073709551615\r\n"), None);
        assert_eq!(data_len(b"set k 0 0 4294967297\r\n"), Some(1));
        let line = b"set k 0 0 2147483647\r\n";
        assert_eq!(data_len(line), Some(i32::MAX as usize));
        let mut out = Vec::new();
        // Even a length at the top of the range skips within the buffer.
        let recovery = recover(Error::BadDataChunk, line, &mut out).unwrap();
        assert!(recovery.consumed <= line.len());
        assert_eq!(data_len(b"set k 0 0 x\r\n"), None);
        assert_eq!(data_len(b"ms k\r\n"), None);
        assert_eq!(data_len(b"bogus 1 2 3 4\r\n"), None);
    }

    /// memcached 1.6.18's replies (captured) to errors on lines ending in `noreply`.
    #[test]
    fn noreply_silences_errors_after_the_dispatch() {
        let long_key = [b'k'; 251];
        let long_set = [&b"set "[..], &long_key, b" 0 0 1 noreply\r\nx\r\n"].concat();
        let table: &[(&[u8], &[u8])] = &[
            // The bad chunk is silent; the `\n` left after the 3 + 2 bytes read is a command.
            (b"set k 0 0 3 noreply\r\nabcd\r\n", b"ERROR\r\n"),
            (b"set k 0 0 abc noreply\r\n", b""),
            (b"set k 0 0 noreply\r\n", b""),
            (b"cas k 0 0 1 x noreply\r\n", b""),
            (&long_set, b"ERROR\r\n"),
            (b"incr k x noreply\r\n", b""),
            (b"incr k noreply\r\n", b""),
            (b"delete k 1 noreply\r\n", b""),
            (b"touch k x noreply\r\n", b""),
            (b"flush_all x noreply\r\n", b""),
            (b"verbosity x noreply\r\n", b""),
            // Answered: the token count is checked first, or noreply is not the last token.
            (b"set k 0 0 3 x noreply\r\n", b"ERROR\r\n"),
            (b"incr k 1 2 noreply\r\n", b"ERROR\r\n"),
            (b"bogus noreply\r\n", b"ERROR\r\n"),
            (
                b"delete k noreply x\r\n",
                b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n",
            ),
            (
                b"set k 0 0 1 noreplyx\r\nab\r\n",
                b"CLIENT_ERROR bad data chunk\r\nERROR\r\n",
            ),
            // Meta commands have no noreply, and their q flag never hides an error.
            (
                b"ms k 2 q\r\nhiX\r\n",
                b"CLIENT_ERROR bad data chunk\r\nERROR\r\n",
            ),
        ];
        for &(input, reply) in table {
            assert_eq!(
                run(input),
                (reply.to_vec(), false),
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    /// memcached 1.6.18's replies (captured) to `ms` lines it refuses: for its flags it swallows
    /// the data block, before them it does not.
    #[test]
    fn ms_refused_for_its_flags_swallows_its_block() {
        let many = format!("ms k 7 {}\r\nget u10\r\n", ["T1"; 30].join(" "));
        let table: &[(&[u8], &[u8])] = &[
            (
                b"ms b!!!! 13 b\r\ndelete victim\r\n",
                b"CLIENT_ERROR error decoding key\r\n",
            ),
            (many.as_bytes(), b"CLIENT_ERROR options flags too long\r\n+"),
            (
                b"ms k 2 T1 T2\r\nmn\r\n",
                b"CLIENT_ERROR duplicate flag\r\n",
            ),
            (b"ms k 2 Z\r\nmn\r\n", b"CLIENT_ERROR invalid flag\r\n"),
            (
                b"ms k 2 MX\r\nmn\r\n",
                b"CLIENT_ERROR invalid mode for ms M token\r\n",
            ),
            (
                b"ms k 2 Tx F1\r\nmn\r\n",
                b"CLIENT_ERROR bad token in command line format\r\n",
            ),
            (
                b"ms k 2 Fx\r\nmn\r\n",
                b"CLIENT_ERROR bad command line format\r\n",
            ),
            (
                b"ms k x\r\nmn\r\n",
                b"CLIENT_ERROR bad command line format\r\nMN+",
            ),
        ];
        for &(input, reply) in table {
            let mut out = Vec::new();
            let mut at = 0;
            while at < input.len() {
                match parse(&input[at..]) {
                    Ok(Some(r)) => {
                        out.extend_from_slice(if r.command == Command::MetaNoop {
                            b"MN+"
                        } else {
                            b"+"
                        });
                        at += r.len;
                    }
                    Ok(None) => break,
                    Err(e) => {
                        let r = recover(e, &input[at..], &mut out).unwrap();
                        at += r.consumed + r.skip;
                    }
                }
            }
            assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(reply),
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn long_lines_close_without_a_reply() {
        let mut out = Vec::new();
        let line = [b'x'; 3000];
        let recovery = recover(Error::LineTooLong, &line, &mut out).unwrap();
        assert_eq!(
            recovery,
            Recovery {
                consumed: 3000,
                skip: 0,
                close: true,
                forget: false
            }
        );
        assert!(out.is_empty());
    }

    #[test]
    fn incomplete_text_waits() {
        let mut out = Vec::new();
        assert_eq!(recover(Error::UnknownCommand, b"bogus", &mut out), None);
        assert!(out.is_empty());
    }

    #[test]
    fn binary_errors_wait_for_extras_and_key_then_close() {
        // A GET with extras, answered once the extras and key have arrived.
        let request = bin(opcode::GET, &[0; 4], b"k", b"");
        for n in 1..request.len() {
            let mut out = Vec::new();
            assert_eq!(recover(Error::BadBinaryArgs, &request[..n], &mut out), None);
            assert!(out.is_empty());
        }
        let mut input = request.clone();
        input.extend_from_slice(&bin(opcode::NOOP, b"", b"", b""));
        assert_eq!(
            run(&input),
            (bin_error(opcode::GET, status::INVALID_ARGUMENTS), true)
        );
        // A body shorter than its key: "Unknown command", and closed.
        let mut short = bin(opcode::GET, b"", b"key", b"");
        short[11] = 1;
        assert_eq!(
            run(&short),
            (bin_error(opcode::GET, status::UNKNOWN_COMMAND), true)
        );
        assert!(run(&bin(0x50, b"", &[b'k'; 251], b"")).1);
    }

    #[test]
    fn unknown_opcodes_skip_extras_and_key_twice() {
        let noop = bin(opcode::NOOP, b"", b"", b"");
        let unknown = bin(0x50, b"ee", b"key", b"v");
        let mut input = unknown.clone();
        input.extend_from_slice(b"PPPPP");
        input.extend_from_slice(&noop);
        let mut expected = bin_error(0x50, status::UNKNOWN_COMMAND);
        expected.push(b'+');
        assert_eq!(run(&input), (expected, false));
        // Answered once the header, extras and key are in; the rest is skipped as it comes.
        let head = 24 + 2 + 3;
        for n in 0..input.len() {
            let mut out = Vec::new();
            let recovery = recover(Error::UnknownCommand, &input[..n], &mut out);
            if n < head {
                assert_eq!(recovery, None);
            } else {
                let r = recovery.unwrap();
                assert_eq!(r.consumed + r.skip, unknown.len() + 5, "{n}");
                assert!(r.consumed <= n);
                assert_eq!(out, bin_error(0x50, status::UNKNOWN_COMMAND));
            }
        }
        // A body length of 2^31 - 1: answered at once, the body skipped as it arrives.
        let mut huge = bin(0x50, b"", b"", b"");
        huge[8..12].copy_from_slice(&(i32::MAX as u32).to_be_bytes());
        let mut out = Vec::new();
        let r = recover(Error::UnknownCommand, &huge, &mut out).unwrap();
        assert_eq!(
            (r.consumed, r.skip, r.close),
            (24, i32::MAX as usize, false)
        );
        // From 2^31 on memcached reads the length as negative: nothing is skipped.
        let mut negative = huge.clone();
        negative[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
        let r = recover(Error::UnknownCommand, &negative, &mut Vec::new()).unwrap();
        assert_eq!((r.consumed, r.skip), (24, 0));
        assert_eq!(out, bin_error(0x50, status::UNKNOWN_COMMAND));
        // memcached 1.6 has no binary VERBOSITY: the request is an unknown command.
        let mut input = bin(opcode::VERBOSITY, &[0, 0, 0, 1], b"", b"");
        input.extend_from_slice(b"PPPP");
        input.extend_from_slice(&noop);
        let mut expected = bin_error(opcode::VERBOSITY, status::UNKNOWN_COMMAND);
        expected.push(b'+');
        assert_eq!(run(&input), (expected, false));
    }

    #[test]
    fn never_panics() {
        let errors = [
            Error::UnknownCommand,
            Error::WrongArgCount,
            Error::BadFormat,
            Error::BadDataChunk,
            Error::LineTooLong,
            Error::BadMagic,
            Error::BadBinaryHeader,
            Error::BadBinaryArgs,
        ];
        let inputs: &[&[u8]] = &[
            b"",
            b"\n",
            b"\r\n",
            b"set k 0 0 99999999999999999999\r\n",
            b"ms\r\n",
            b"\x80",
            &[0x80; 24],
            &[
                0x80, 0x50, 0xff, 0xff, 0xff, 0, 0, 0, 0xff, 0xff, 0xff, 0xff,
            ],
        ];
        for &error in &errors {
            for input in inputs {
                let mut out = Vec::new();
                if let Some(recovery) = recover(error, input, &mut out) {
                    assert!(recovery.consumed <= input.len());
                }
            }
        }
    }
}
