//! One step of a client session: read the request at the front of a buffer with the `wire`
//! parser (so requests are read exactly as the switch reads them), execute it, and answer
//! parse errors as memcached does.

use wire::memcache::binary::{Header, HEADER_LEN, REQUEST_MAGIC};
use wire::memcache::{self, Command, Error, Protocol};

use crate::store::{bump, Store};
use crate::text::After;
use crate::{binary, text};

/// What one step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// Bytes of the buffer used up.
    pub consumed: usize,
    pub after: After,
}

/// Size past which a reply in the making is handed to the `spill` callback of [`step`].
pub const SPILL_AT: usize = 1024 * 1024;

/// Executes the request at the front of `buf`, appending the reply to `out`. `None` means the
/// request is incomplete: call again with more bytes.
///
/// `admit` is called with the replies so far once a whole request has arrived and before it is
/// executed; it may wait (and flush those replies first), or refuse, and the request is then
/// skipped without a reply.
///
/// `spill` is called with the replies so far whenever a multi-key retrieval has made them
/// longer than [`SPILL_AT`]; it may send and clear them. If it returns false the retrieval is
/// abandoned: its partial reply is replaced with memcached's out-of-memory error and the step
/// asks for the connection to stop ([`After::Close`]).
pub fn step(
    store: &Store,
    buf: &[u8],
    out: &mut Vec<u8>,
    admit: &mut dyn FnMut(&mut Vec<u8>) -> bool,
    spill: &mut dyn FnMut(&mut Vec<u8>) -> bool,
) -> Option<Step> {
    match memcache::parse(buf) {
        Ok(None) => None,
        Ok(Some(request)) => {
            if !admit(out) {
                return Some(Step {
                    consumed: request.len,
                    after: After::Continue,
                });
            }
            bump(&store.counters.requests);
            let after = match request.protocol {
                Protocol::Binary => binary::execute(store, &request, out),
                Protocol::Text | Protocol::Meta => text::execute(store, &request, out, spill),
            };
            Some(Step {
                consumed: request.len,
                after,
            })
        }
        Err(error) if buf.first() == Some(&REQUEST_MAGIC) => binary_error(error, buf, out),
        Err(error) => text_error(error, buf, out),
    }
}

/// memcached answers a bad binary request with a status and closes the connection, except for
/// an unknown opcode, whose body it skips.
fn binary_error(error: Error, buf: &[u8], out: &mut Vec<u8>) -> Option<Step> {
    let header = Header::decode(buf)?;
    if error == Error::UnknownCommand {
        let len = header.packet_len().max(HEADER_LEN);
        if buf.len() < len {
            return None;
        }
        binary::error(header.opcode, error.binary_status(), header.opaque, out);
        return Some(Step {
            consumed: len,
            after: After::Continue,
        });
    }
    binary::error(header.opcode, error.binary_status(), header.opaque, out);
    Some(Step {
        consumed: buf.len(),
        after: After::Close,
    })
}

/// memcached answers a bad text line with an error line and goes on with the next line; a data
/// block that does not end in `\r\n` is skipped with its line.
fn text_error(error: Error, buf: &[u8], out: &mut Vec<u8>) -> Option<Step> {
    if error.closes_connection() {
        return Some(Step {
            consumed: buf.len(),
            after: After::Close,
        });
    }
    let line = memcache::line_len(buf)?;
    let mut consumed = line;
    if error == Error::BadDataChunk {
        // The parser only reports a bad chunk once the whole block has arrived, so the sum is
        // within the buffer; a length it could not have read is not skipped.
        if let Some(block) = data_len(&buf[..line]).and_then(|n| n.checked_add(2)) {
            consumed = line.saturating_add(block);
        }
    }
    out.extend_from_slice(error.text_reply());
    Some(Step {
        consumed: consumed.min(buf.len()),
        after: After::Continue,
    })
}

/// The data length a storage or `ms` command line announces, read as the `wire` parser reads
/// it: the line without its `\r\n` (or bare `\n`), split at spaces only (a meta key may hold a
/// `\r`).
fn data_len(line: &[u8]) -> Option<usize> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut tokens = line.split(|&b| b == b' ').filter(|t| !t.is_empty());
    let name = tokens.next()?;
    let at = match Command::from_name(name)? {
        Command::MetaSet => 1,
        _ => 3,
    };
    std::str::from_utf8(tokens.nth(at)?).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(store: &Store, input: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut at = 0;
        while let Some(step) = step(store, &input[at..], &mut out, &mut |_| true, &mut |_| true) {
            at += step.consumed;
            if step.after == After::Close || at == input.len() {
                break;
            }
        }
        out
    }

    #[test]
    fn text_round_trip() {
        let store = Store::new(None);
        let out = run(
            &store,
            b"set a 5 0 2\r\nhi\r\nget a b\r\ndelete a\r\nget a\r\n",
        );
        assert_eq!(
            out,
            b"STORED\r\nVALUE a 5 2\r\nhi\r\nEND\r\nDELETED\r\nEND\r\n".to_vec()
        );
    }

    #[test]
    fn errors_resynchronise() {
        let store = Store::new(None);
        let out = run(&store, b"bogus\r\nset a 0 0 2\r\nhiX\r\nmn\r\n");
        // As in memcached, the bytes after the announced block are read as the next line.
        assert_eq!(
            out,
            b"ERROR\r\nCLIENT_ERROR bad data chunk\r\nERROR\r\nMN\r\n".to_vec()
        );
    }

    #[test]
    fn incomplete_waits() {
        let store = Store::new(None);
        let mut out = Vec::new();
        assert_eq!(
            step(
                &store,
                b"set a 0 0 2\r\nh",
                &mut out,
                &mut |_| true,
                &mut |_| true
            ),
            None
        );
        assert_eq!(
            step(&store, &[0x80, 0, 0], &mut out, &mut |_| true, &mut |_| {
                true
            }),
            None
        );
        assert!(out.is_empty());
    }

    #[test]
    fn bad_chunk_skips_the_length_the_parser_read() {
        // A meta key may hold a `\r`: the announced length is 2, not the number after it.
        let store = Store::new(None);
        let input = b"ms a\r18446744073709551585 2\r\nhiX\r\nmn\r\n";
        let mut out = Vec::new();
        let first = step(&store, input, &mut out, &mut |_| true, &mut |_| true).unwrap();
        assert_eq!(
            first.consumed,
            b"ms a\r18446744073709551585 2\r\nhi\r\n".len()
        );
        assert_eq!(first.after, After::Continue);
        assert_eq!(out, b"CLIENT_ERROR bad data chunk\r\n".to_vec());
        assert_eq!(
            run(&store, input),
            b"CLIENT_ERROR bad data chunk\r\nERROR\r\nMN\r\n"
        );
    }

    #[test]
    fn data_len_never_overflows() {
        assert_eq!(
            data_len(b"set k 0 0 18446744073709551615\r\n"),
            Some(usize::MAX)
        );
        let mut out = Vec::new();
        // Even a length at the top of the range skips within the buffer.
        let line = b"set k 0 0 18446744073709551615\r\n";
        let step = text_error(Error::BadDataChunk, line, &mut out).unwrap();
        assert!(step.consumed <= line.len());
    }

    #[test]
    fn long_retrievals_spill() {
        let store = Store::new(None);
        let value = vec![b'x'; 600_000];
        for key in [b"a", b"b", b"c"] {
            store.store(crate::store::Mode::Set, key, &value, 0, 0, 0);
        }
        let mut out = Vec::new();
        let mut sent = Vec::new();
        let mut largest = 0;
        let mut spill = |out: &mut Vec<u8>| {
            largest = largest.max(out.len());
            sent.append(out);
            true
        };
        let done = step(
            &store,
            b"get a b c\r\n",
            &mut out,
            &mut |_| true,
            &mut spill,
        )
        .unwrap();
        assert_eq!(done.after, After::Continue);
        assert!(
            largest <= SPILL_AT + value.len() + 64,
            "held {largest} bytes"
        );
        sent.extend_from_slice(&out);
        let mut expected = Vec::new();
        for key in ["a", "b", "c"] {
            expected.extend_from_slice(format!("VALUE {key} 0 600000\r\n").as_bytes());
            expected.extend_from_slice(&value);
            expected.extend_from_slice(b"\r\n");
        }
        expected.extend_from_slice(b"END\r\n");
        assert_eq!(sent, expected);
    }

    #[test]
    fn a_refused_spill_ends_the_retrieval() {
        let store = Store::new(None);
        let value = vec![b'x'; 600_000];
        store.store(crate::store::Mode::Set, b"a", &value, 0, 0, 0);
        let mut out = b"MN\r\n".to_vec();
        let done = step(&store, b"get a a\r\n", &mut out, &mut |_| true, &mut |_| {
            false
        })
        .unwrap();
        assert_eq!(done.after, After::Close);
        assert_eq!(out, [&b"MN\r\n"[..], text::NO_MEMORY_GET].concat());
    }
}
