//! One step of a client session: read the request at the front of a buffer with the `wire`
//! parser (so requests are read exactly as the switch reads them), execute it, and answer
//! parse errors as memcached does (`wire::memcache::recover`).

use wire::memcache::{self, Protocol};

use crate::items::{bump, Store};
use crate::text::After;
use crate::{binary, text};

/// What one step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// Bytes of the buffer used up.
    pub consumed: usize,
    /// Bytes still to come that are thrown away unread (a refused request's data block or
    /// body, as memcached swallows it).
    pub skip: usize,
    pub after: After,
}

/// What a node's role adds to serving requests (SwitchKV's backend and cache node).
pub trait Hooks: Send + Sync + std::fmt::Debug {
    /// Every request read, before the capacity limit may drop it: what the node is asked for,
    /// not only what it serves (a backend's hot keys are the ones asked for most).
    fn received(&self, _request: &memcache::Request<'_>) {}
    /// Before `request` is executed: true if the role answered it itself, its reply appended
    /// to `out`.
    fn answer(&self, request: &memcache::Request<'_>, store: &Store, out: &mut Vec<u8>) -> bool;
    /// After `request` was executed, before its reply is sent: the role may hold the reply
    /// back (a backend tells its cache node of a write first).
    fn executed(&self, request: &memcache::Request<'_>, store: &Store);
    /// A UDP datagram's one request, on a node that relays (a look-through cache node): the
    /// role may answer it itself ([`UdpPath::Answered`], its reply appended to `out`) or have
    /// it sent on to its upstream over UDP ([`UdpPath::SendOn`]).
    fn udp(&self, _request: &memcache::Request<'_>, _out: &mut Vec<u8>) -> UdpPath {
        UdpPath::Execute
    }
}

/// Where a UDP request goes on a node that relays (see [`Hooks::udp`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UdpPath {
    /// Executed as any request is.
    Execute,
    /// Answered by the role.
    Answered,
    /// Sent on to the upstream; its reply comes back through the relay.
    SendOn,
}

/// Executes the request at the front of `buf`, appending the reply to `out`. `None` means the
/// request is incomplete: call again with more bytes.
///
/// `admit` is called with the replies so far once a whole request has arrived and before it is
/// executed; it may wait (and flush those replies first), or refuse, and the request is then
/// skipped without a reply.
///
/// `spill` is called with the replies so far whenever a multi-key retrieval has made them
/// longer than [`crate::SPILL_AT`]; it may send and clear them. If it returns false the retrieval is
/// abandoned: its partial reply is replaced with memcached's out-of-memory error and the step
/// asks for the connection to stop ([`After::Close`]).
pub fn step(
    store: &Store,
    buf: &[u8],
    out: &mut Vec<u8>,
    admit: &mut dyn FnMut(&mut Vec<u8>) -> bool,
    spill: &mut dyn FnMut(&mut Vec<u8>) -> bool,
    hooks: Option<&dyn Hooks>,
) -> Option<Step> {
    match memcache::parse(buf) {
        Ok(None) => None,
        Ok(Some(request)) => {
            if let Some(h) = hooks {
                h.received(&request);
            }
            if !admit(out) {
                return Some(Step {
                    consumed: request.len,
                    skip: 0,
                    after: After::Continue,
                });
            }
            bump(&store.counters.requests);
            if hooks.is_some_and(|h| h.answer(&request, store, out)) {
                return Some(Step {
                    consumed: request.len,
                    skip: 0,
                    after: After::Continue,
                });
            }
            let after = match request.protocol {
                Protocol::Binary => binary::execute(store, &request, out),
                Protocol::Text | Protocol::Meta => text::execute(store, &request, out, spill),
            };
            if let Some(h) = hooks {
                h.executed(&request, store);
            }
            Some(Step {
                consumed: request.len,
                skip: 0,
                after,
            })
        }
        Err(error) => memcache::recover(error, buf, out).map(|recovery| Step {
            consumed: recovery.consumed,
            skip: recovery.skip,
            after: if recovery.close {
                After::Close
            } else {
                After::Continue
            },
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::items::Frozen;

    fn run(store: &Store, input: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut at = 0;
        while let Some(step) = step(
            store,
            &input[at..],
            &mut out,
            &mut |_| true,
            &mut |_| true,
            None,
        ) {
            at += step.consumed;
            if step.after == After::Close || at == input.len() {
                break;
            }
        }
        out
    }

    #[test]
    fn text_round_trip() {
        let store = Store::new(None, Box::new(Frozen::default()));
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
        let store = Store::new(None, Box::new(Frozen::default()));
        let out = run(&store, b"bogus\r\nset a 0 0 2\r\nhiX\r\nmn\r\n");
        // As in memcached, the bytes after the announced block are read as the next line.
        assert_eq!(
            out,
            b"ERROR\r\nCLIENT_ERROR bad data chunk\r\nERROR\r\nMN\r\n".to_vec()
        );
    }

    #[test]
    fn incomplete_waits() {
        let store = Store::new(None, Box::new(Frozen::default()));
        let mut out = Vec::new();
        assert_eq!(
            step(
                &store,
                b"set a 0 0 2\r\nh",
                &mut out,
                &mut |_| true,
                &mut |_| true,
                None
            ),
            None
        );
        assert_eq!(
            step(
                &store,
                &[0x80, 0, 0],
                &mut out,
                &mut |_| true,
                &mut |_| true,
                None
            ),
            None
        );
        assert!(out.is_empty());
    }

    #[test]
    fn long_retrievals_spill() {
        let store = Store::new(None, Box::new(Frozen::default()));
        let value = vec![b'x'; 600_000];
        for key in [b"a", b"b", b"c"] {
            store.store(crate::Mode::Set, key, &value, 0, 0, 0);
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
            None,
        )
        .unwrap();
        assert_eq!(done.after, After::Continue);
        assert!(
            largest <= crate::SPILL_AT + value.len() + 64,
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
        let store = Store::new(None, Box::new(Frozen::default()));
        let value = vec![b'x'; 600_000];
        store.store(crate::Mode::Set, b"a", &value, 0, 0, 0);
        let mut out = b"MN\r\n".to_vec();
        let done = step(
            &store,
            b"get a a\r\n",
            &mut out,
            &mut |_| true,
            &mut |_| false,
            None,
        )
        .unwrap();
        assert_eq!(done.after, After::Close);
        assert_eq!(out, [&b"MN\r\n"[..], text::NO_MEMORY_GET].concat());
    }
}
