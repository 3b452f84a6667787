//! The binary protocol: executes one request the `wire` parser has read and writes memcached
//! 1.6's response, header and error strings included.

use wire::memcache::binary::{self, opcode, status, Header, HEADER_LEN, RESPONSE_MAGIC};
use wire::memcache::Request;

use crate::items::{bump, DeleteOutcome, Delta, Mode, Store, StoreOutcome};
use crate::text::After;
use crate::VERSION;

/// One response packet.
#[derive(Debug, Default)]
pub struct Response<'a> {
    pub opcode: u8,
    pub status: u16,
    pub opaque: u32,
    pub cas: u64,
    pub extras: &'a [u8],
    pub key: &'a [u8],
    pub value: &'a [u8],
}

impl Response<'_> {
    pub fn emit(&self, out: &mut Vec<u8>) {
        let body = self.extras.len() + self.key.len() + self.value.len();
        out.reserve(HEADER_LEN + body);
        out.push(RESPONSE_MAGIC);
        out.push(self.opcode);
        out.extend_from_slice(&(self.key.len() as u16).to_be_bytes());
        out.push(self.extras.len() as u8);
        out.push(0);
        out.extend_from_slice(&self.status.to_be_bytes());
        out.extend_from_slice(&(body as u32).to_be_bytes());
        out.extend_from_slice(&self.opaque.to_be_bytes());
        out.extend_from_slice(&self.cas.to_be_bytes());
        out.extend_from_slice(self.extras);
        out.extend_from_slice(self.key);
        out.extend_from_slice(self.value);
    }
}

/// Writes an error response with memcached's error string.
pub fn error(op: u8, status: u16, opaque: u32, out: &mut Vec<u8>) {
    binary::write_error(op, status, opaque, out);
}

fn be32(bytes: &[u8], at: usize) -> u32 {
    bytes
        .get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_be_bytes)
}

fn be64(bytes: &[u8], at: usize) -> u64 {
    bytes
        .get(at..at + 8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_be_bytes)
}

/// Executes a binary request, appending its response (if any) to `out`.
pub fn execute(store: &Store, request: &Request<'_>, out: &mut Vec<u8>) -> After {
    let bytes = request.bytes();
    let Some(header) = Header::decode(bytes) else {
        return After::Close;
    };
    let op = header.opcode;
    let extras = bytes
        .get(HEADER_LEN..HEADER_LEN + usize::from(header.extras_len))
        .unwrap_or_default();
    let key = request.key().unwrap_or_default();
    let value = request.data().unwrap_or_default();
    let quiet = opcode::is_quiet(op);
    let mut response = Response {
        opcode: op,
        opaque: header.opaque,
        ..Response::default()
    };
    match op {
        opcode::GET
        | opcode::GETQ
        | opcode::GETK
        | opcode::GETKQ
        | opcode::TOUCH
        | opcode::GAT
        | opcode::GATQ
        | opcode::GATK
        | opcode::GATKQ => {
            let touch = matches!(
                op,
                opcode::TOUCH | opcode::GAT | opcode::GATQ | opcode::GATK | opcode::GATKQ
            )
            .then(|| i64::from(be32(extras, 0) as i32));
            let with_key = matches!(
                op,
                opcode::GETK | opcode::GETKQ | opcode::GATK | opcode::GATKQ
            );
            bump(&store.counters.cmd_get);
            match store.get(key, touch) {
                Some(item) => {
                    bump(&store.counters.get_hits);
                    let flags = item.flags.to_be_bytes();
                    response.extras = &flags;
                    response.cas = item.cas;
                    if with_key {
                        response.key = key;
                    }
                    if op != opcode::TOUCH {
                        response.value = &item.value;
                    }
                    response.emit(out);
                }
                None => {
                    bump(&store.counters.get_misses);
                    if quiet {
                    } else if with_key {
                        response.status = status::KEY_NOT_FOUND;
                        response.key = key;
                        response.emit(out);
                    } else {
                        error(op, status::KEY_NOT_FOUND, header.opaque, out);
                    }
                }
            }
        }
        opcode::SET
        | opcode::SETQ
        | opcode::ADD
        | opcode::ADDQ
        | opcode::REPLACE
        | opcode::REPLACEQ
        | opcode::APPEND
        | opcode::APPENDQ
        | opcode::PREPEND
        | opcode::PREPENDQ => {
            let mode = match op {
                opcode::ADD | opcode::ADDQ => Mode::Add,
                opcode::REPLACE | opcode::REPLACEQ => Mode::Replace,
                opcode::APPEND | opcode::APPENDQ => Mode::Append,
                opcode::PREPEND | opcode::PREPENDQ => Mode::Prepend,
                _ => Mode::Set,
            };
            let flags = be32(extras, 0);
            let exptime = i64::from(be32(extras, 4) as i32);
            bump(&store.counters.cmd_set);
            let code = match store.store(mode, key, value, flags, exptime, header.cas) {
                StoreOutcome::Stored(cas) => {
                    if !quiet {
                        response.cas = cas;
                        response.emit(out);
                    }
                    return After::Continue;
                }
                StoreOutcome::Exists => status::KEY_EXISTS,
                StoreOutcome::NotFound => status::KEY_NOT_FOUND,
                StoreOutcome::TooLarge => status::VALUE_TOO_LARGE,
                StoreOutcome::NoMemory => status::OUT_OF_MEMORY,
                StoreOutcome::NotStored => match mode {
                    Mode::Add => status::KEY_EXISTS,
                    Mode::Replace => status::KEY_NOT_FOUND,
                    _ => status::ITEM_NOT_STORED,
                },
            };
            error(op, code, header.opaque, out);
        }
        opcode::DELETE | opcode::DELETEQ => {
            let code = match store.delete(key, header.cas) {
                DeleteOutcome::Deleted => {
                    bump(&store.counters.delete_hits);
                    if !quiet {
                        response.emit(out);
                    }
                    return After::Continue;
                }
                DeleteOutcome::NotFound => {
                    bump(&store.counters.delete_misses);
                    status::KEY_NOT_FOUND
                }
                DeleteOutcome::Exists => status::KEY_EXISTS,
            };
            error(op, code, header.opaque, out);
        }
        opcode::INCREMENT | opcode::INCREMENTQ | opcode::DECREMENT | opcode::DECREMENTQ => {
            let incr = matches!(op, opcode::INCREMENT | opcode::INCREMENTQ);
            let (delta, initial) = (be64(extras, 0), be64(extras, 8));
            let exptime = be32(extras, 16);
            let mut result = store.delta(key, incr, delta, header.cas);
            // An exptime of all ones means "do not create" in memcached's binary protocol.
            if result == Delta::NotFound && exptime != u32::MAX && header.cas == 0 {
                let text = initial.to_string();
                let ttl = i64::from(exptime as i32);
                if let StoreOutcome::Stored(cas) =
                    store.store(Mode::Add, key, text.as_bytes(), 0, ttl, 0)
                {
                    result = Delta::Value(initial, cas);
                }
            }
            let code = match result {
                Delta::Value(value, cas) => {
                    if !quiet {
                        response.cas = cas;
                        let value = value.to_be_bytes();
                        response.value = &value;
                        response.emit(out);
                    }
                    return After::Continue;
                }
                Delta::NotFound => status::KEY_NOT_FOUND,
                Delta::Exists => status::KEY_EXISTS,
                Delta::NonNumeric => status::NON_NUMERIC_VALUE,
            };
            error(op, code, header.opaque, out);
        }
        opcode::FLUSH | opcode::FLUSHQ => {
            bump(&store.counters.cmd_flush);
            store.flush(i64::from(be32(extras, 0) as i32));
            if !quiet {
                response.emit(out);
            }
        }
        opcode::NOOP => response.emit(out),
        opcode::VERSION => {
            response.value = VERSION.as_bytes();
            response.emit(out);
        }
        opcode::QUIT | opcode::QUITQ => {
            if op == opcode::QUIT {
                response.emit(out);
            }
            return After::Close;
        }
        opcode::STAT => {
            let mut text = Vec::new();
            crate::text::stats(store, &mut text);
            for line in text.split(|&b| b == b'\n') {
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                let Some(rest) = line.strip_prefix(b"STAT ") else {
                    continue;
                };
                let at = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
                response.key = &rest[..at];
                response.value = rest.get(at + 1..).unwrap_or_default();
                response.emit(out);
            }
            response.key = b"";
            response.value = b"";
            response.emit(out);
        }
        _ => error(op, status::UNKNOWN_COMMAND, header.opaque, out),
    }
    After::Continue
}
