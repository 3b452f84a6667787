//! Split-forward-merge of multi-key gets whose keys live on several servers.
//!
//! The switch sends one sub-request per server from its agent address, collects every part
//! (reassembling multi-datagram replies), and answers the client with one reply whose items are
//! in the client's key order — byte for byte what a single memcached holding all the keys would
//! send. If any part fails or times out, the client gets that server's error line or nothing:
//! never a partial answer.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use wire::memcache::{self, Command};

use crate::frame::UdpEnds;

/// Most split gets in flight at once; more are dropped and counted.
pub const MAX_PENDING: usize = 4096;
/// Most datagrams one part of a reply may span (memcached's replies to a get that fits one
/// request datagram stay far below this unless values are huge).
pub const MAX_PART_DATAGRAMS: u16 = 2048;

/// Where and how to answer the client once every part is in.
#[derive(Debug, Clone)]
pub struct Client {
    pub ends: UdpEnds,
    pub request_id: u16,
    pub port: u16,
}

/// One part: the sub-request sent to one server, and its reply as it arrives.
///
/// memcached 1.6 answers a multi-key get over UDP with one message per item, each numbered as
/// its own message (sequence 0 of 1), and splits only a message larger than a datagram into
/// numbered pieces, which it sends in order. So a part is a byte stream of messages, complete
/// when it holds a whole retrieval reply (`END`) or an error line. Pieces must come in order:
/// with every message under one request id, an out-of-order piece could belong to another
/// message of the same size, so it fails the split rather than risk mixing two values.
struct Part {
    server: usize,
    request_id: u16,
    /// Where the reply must come from: the server's address and memcached port.
    source: (Ipv4Addr, u16),
    /// The message being reassembled: its datagram count, the next piece expected, and the
    /// pieces so far.
    msg_total: u16,
    msg_next: u16,
    msg: Vec<u8>,
    /// Completed messages, in arrival order.
    stream: Vec<u8>,
    complete: bool,
}

/// Most bytes one part's reply may hold before the split is abandoned.
pub const MAX_PART_BYTES: usize = 16 << 20;
/// Most reply bytes all splits in flight may hold together.
pub const MAX_BUFFERED_BYTES: usize = 64 << 20;

impl Part {
    fn new(server: usize, request_id: u16, source: (Ipv4Addr, u16)) -> Part {
        Part {
            server,
            request_id,
            source,
            msg_total: 0,
            msg_next: 0,
            msg: Vec::new(),
            stream: Vec::new(),
            complete: false,
        }
    }

    fn bytes(&self) -> usize {
        self.stream.len() + self.msg.len()
    }

    /// Takes one datagram; `Err` if it cannot belong to a well-formed reply.
    fn take(&mut self, seq: u16, total: u16, payload: &[u8]) -> Result<(), ()> {
        if self.complete || total == 0 || total > MAX_PART_DATAGRAMS {
            return Err(());
        }
        if self.msg_total == 0 {
            self.msg_total = total;
            self.msg_next = 0;
        }
        if total != self.msg_total || seq != self.msg_next {
            return Err(());
        }
        if self.bytes() + payload.len() > MAX_PART_BYTES {
            return Err(());
        }
        self.msg.extend_from_slice(payload);
        self.msg_next += 1;
        if self.msg_next < self.msg_total {
            return Ok(());
        }
        self.stream.append(&mut self.msg);
        self.msg_total = 0;
        match memcache::reply::parse_retrieval_reply(&self.stream) {
            Ok(None) => Ok(()),
            Ok(Some((_, consumed))) if consumed == self.stream.len() => {
                self.complete = true;
                Ok(())
            }
            Err(memcache::reply::ReplyError::ErrorLine { end, .. }) if end == self.stream.len() => {
                self.complete = true;
                Ok(())
            }
            _ => Err(()),
        }
    }
}

struct Pending {
    client: Client,
    /// The client's keys in order, with the server each lives on.
    keys: Vec<(Vec<u8>, usize)>,
    parts: Vec<Part>,
    deadline: Instant,
}

/// A sub-request to send: to which server, with which request id, carrying which bytes.
#[derive(Debug, PartialEq, Eq)]
pub struct SubRequest {
    pub server: usize,
    pub request_id: u16,
    pub payload: Vec<u8>,
}

/// What became of a datagram that arrived at the agent port.
#[derive(Debug, PartialEq, Eq)]
pub enum Arrival {
    /// Stored; more parts are awaited.
    Stored,
    /// The last part arrived: answer the client with `reply` (one memcached reply).
    Done {
        client_port: u16,
        ends: UdpEnds,
        request_id: u16,
        reply: Vec<u8>,
    },
    /// A part came back malformed; the split is abandoned.
    BadReply,
    /// No split awaits this request id.
    Stale,
    /// The datagram does not come from the server the request id belongs to.
    Foreign,
}

#[derive(Debug, PartialEq, Eq)]
pub enum SplitError {
    TableFull,
    /// Only `get`, `gets`, `gat` and `gats` (with its exptime) can be split.
    NotRetrieval,
}

/// The split table. Driven by the switch: no I/O, time passed in.
pub struct Splitter {
    pending: HashMap<u64, Pending>,
    /// Sub-request id → pending split.
    by_request: HashMap<u16, u64>,
    next_split: u64,
    next_request_id: u16,
    timeout: Duration,
    /// Reply bytes held by every part in flight.
    buffered: usize,
}

impl Splitter {
    pub fn new(timeout: Duration) -> Splitter {
        Splitter {
            pending: HashMap::new(),
            by_request: HashMap::new(),
            next_split: 0,
            // Sub-request ids start somewhere unpredictable, so that nobody can guess them
            // from a restart of the switch.
            next_request_id: unpredictable_u16(),
            timeout,
            buffered: 0,
        }
    }

    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    fn allocate_request_id(&mut self) -> u16 {
        loop {
            let id = self.next_request_id;
            self.next_request_id = self.next_request_id.wrapping_add(1);
            if !self.by_request.contains_key(&id) {
                return id;
            }
        }
    }

    /// Starts a split of a retrieval command (`get`, `gets`, `gat`, `gats`) whose keys are
    /// given with the server each lives on. Returns the sub-requests to send.
    pub fn start(
        &mut self,
        now: Instant,
        client: Client,
        command: Command,
        exptime: Option<&[u8]>,
        keys: Vec<(Vec<u8>, usize)>,
        sources: &[(Ipv4Addr, u16)],
    ) -> Result<Vec<SubRequest>, SplitError> {
        let retrieval = matches!(command, Command::Get | Command::Gets)
            || (matches!(command, Command::Gat | Command::Gats) && exptime.is_some());
        if !retrieval || keys.iter().any(|(_, s)| *s >= sources.len()) {
            return Err(SplitError::NotRetrieval);
        }
        let mut servers: Vec<usize> = Vec::new();
        for (_, s) in &keys {
            if !servers.contains(s) {
                servers.push(*s);
            }
        }
        // Every request id of the table plus these must fit in the 16-bit space with room.
        if self.pending.len() >= MAX_PENDING || self.by_request.len() + servers.len() > 60_000 {
            return Err(SplitError::TableFull);
        }
        let split = self.next_split;
        self.next_split += 1;
        let mut subs = Vec::with_capacity(servers.len());
        let mut parts = Vec::with_capacity(servers.len());
        for server in servers {
            let request_id = self.allocate_request_id();
            self.by_request.insert(request_id, split);
            let mut payload = Vec::new();
            let written = memcache::reply::write_retrieval_request(
                command,
                exptime,
                keys.iter()
                    .filter(|(_, s)| *s == server)
                    .map(|(k, _)| k.as_slice()),
                &mut payload,
            );
            debug_assert!(written, "the command was checked above");
            subs.push(SubRequest {
                server,
                request_id,
                payload,
            });
            parts.push(Part::new(server, request_id, sources[server]));
        }
        self.pending.insert(
            split,
            Pending {
                client,
                keys,
                parts,
                deadline: now + self.timeout,
            },
        );
        Ok(subs)
    }

    /// Takes one datagram that arrived at the agent port from `source`: its frame header fields
    /// and payload. A datagram that does not come from the server its request id was sent to
    /// is refused without disturbing the split.
    pub fn arrive(
        &mut self,
        source: (Ipv4Addr, u16),
        request_id: u16,
        seq: u16,
        total: u16,
        payload: &[u8],
    ) -> Arrival {
        let Some(&split) = self.by_request.get(&request_id) else {
            return Arrival::Stale;
        };
        let Some(pending) = self.pending.get_mut(&split) else {
            self.by_request.remove(&request_id);
            return Arrival::Stale;
        };
        let Some(part) = pending
            .parts
            .iter_mut()
            .find(|p| p.request_id == request_id)
        else {
            return Arrival::Stale;
        };
        if part.source != source {
            return Arrival::Foreign;
        }
        let before = part.bytes();
        let ok = part.take(seq, total, payload).is_ok();
        self.buffered = self.buffered + part.bytes() - before;
        if !ok || self.buffered > MAX_BUFFERED_BYTES {
            self.abandon(split);
            return Arrival::BadReply;
        }
        if !pending.parts.iter().all(|p| p.complete) {
            return Arrival::Stored;
        }
        let Some(pending) = self.take(split) else {
            return Arrival::Stale;
        };
        match merge(&pending) {
            Some(reply) => Arrival::Done {
                client_port: pending.client.port,
                ends: pending.client.ends,
                request_id: pending.client.request_id,
                reply,
            },
            None => Arrival::BadReply,
        }
    }

    /// Drops every split whose deadline has passed; returns how many.
    pub fn expire(&mut self, now: Instant) -> usize {
        let expired: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in &expired {
            self.abandon(*id);
        }
        expired.len()
    }

    fn take(&mut self, split: u64) -> Option<Pending> {
        let p = self.pending.remove(&split)?;
        for part in &p.parts {
            self.by_request.remove(&part.request_id);
            self.buffered = self.buffered.saturating_sub(part.bytes());
        }
        Some(p)
    }

    fn abandon(&mut self, split: u64) {
        self.take(split);
    }
}

/// A 16-bit value that differs from run to run (the clock's nanoseconds and the process id,
/// mixed); not cryptographic.
fn unpredictable_u16() -> u16 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut x = nanos ^ (u64::from(std::process::id()) << 32);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    (x as u16).max(1)
}

/// Merges the parts of a split in the client's key order. A part that is an error line is
/// passed on whole; a part that is neither items nor an error makes the merge fail.
fn merge(p: &Pending) -> Option<Vec<u8>> {
    // Each part's items, in the order that server returned them (its keys' order).
    type KeyAndRaw<'a> = (&'a [u8], &'a [u8]);
    let mut items: Vec<(usize, Vec<KeyAndRaw>)> = Vec::with_capacity(p.parts.len());
    for part in &p.parts {
        let (server, body) = (&part.server, &part.stream);
        match memcache::reply::parse_retrieval_reply(body) {
            Ok(Some((list, consumed))) if consumed == body.len() => {
                let list: Vec<(&[u8], &[u8])> = list.map(|i| (i.key, i.raw)).collect();
                items.push((*server, list));
            }
            Ok(_) => return None,
            Err(memcache::reply::ReplyError::ErrorLine { start, end }) => {
                // The server refused: pass its answer on, as a direct request would get it.
                return body.get(start..end).map(<[u8]>::to_vec);
            }
            Err(_) => return None,
        }
    }
    let mut cursor = vec![0usize; items.len()];
    let mut out = Vec::new();
    for (key, server) in &p.keys {
        let i = items.iter().position(|(s, _)| s == server)?;
        let list = &items[i].1;
        if let Some((k, raw)) = list.get(cursor[i]) {
            if *k == key.as_slice() {
                out.extend_from_slice(raw);
                cursor[i] += 1;
            }
        }
    }
    // Every item a server returned must have found its key.
    if cursor.iter().zip(&items).any(|(c, (_, l))| *c != l.len()) {
        return None;
    }
    out.extend_from_slice(b"END\r\n");
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn client() -> Client {
        Client {
            ends: UdpEnds {
                src_mac: "02:00:00:00:00:64".parse().unwrap(),
                dst_mac: "02:00:00:00:00:01".parse().unwrap(),
                src_ip: Ipv4Addr::new(10, 0, 0, 100),
                dst_ip: Ipv4Addr::new(10, 0, 0, 1),
                src_port: 11211,
                dst_port: 5000,
            },
            request_id: 42,
            port: 0,
        }
    }

    fn sources() -> Vec<(Ipv4Addr, u16)> {
        (0..3)
            .map(|i| (Ipv4Addr::new(10, 0, 0, 11 + i), 11211))
            .collect()
    }

    fn src(server: usize) -> (Ipv4Addr, u16) {
        sources()[server]
    }

    /// Starts a split for `spec` (key, server) from the test client; panics if refused.
    fn start(
        sp: &mut Splitter,
        now: Instant,
        command: Command,
        exptime: Option<&[u8]>,
        spec: &[(&str, usize)],
    ) -> Vec<SubRequest> {
        sp.start(now, client(), command, exptime, keys(spec), &sources())
            .expect("split starts")
    }

    fn keys(spec: &[(&str, usize)]) -> Vec<(Vec<u8>, usize)> {
        spec.iter()
            .map(|(k, s)| (k.as_bytes().to_vec(), *s))
            .collect()
    }

    #[test]
    fn split_merges_in_client_order() {
        let mut sp = Splitter::new(Duration::from_secs(1));
        let now = Instant::now();
        let subs = start(
            &mut sp,
            now,
            Command::Get,
            None,
            &[("a", 0), ("b", 1), ("c", 0), ("d", 1)],
        );
        assert_eq!(subs.len(), 2);
        assert_eq!(subs[0].payload, b"get a c\r\n");
        assert_eq!(subs[1].payload, b"get b d\r\n");
        // Server 1 answers first; its reply comes in two datagrams.
        let r1 = b"VALUE b 0 1\r\nB\r\nEND\r\n";
        assert_eq!(
            sp.arrive(src(1), subs[1].request_id, 0, 2, &r1[..10]),
            Arrival::Stored
        );
        assert_eq!(
            sp.arrive(src(1), subs[1].request_id, 1, 2, &r1[10..]),
            Arrival::Stored
        );
        let r0 = b"VALUE a 5 1\r\nA\r\nVALUE c 0 2\r\nCC\r\nEND\r\n";
        match sp.arrive(src(0), subs[0].request_id, 0, 1, r0) {
            Arrival::Done {
                request_id, reply, ..
            } => {
                assert_eq!(request_id, 42);
                assert_eq!(
                    reply,
                    b"VALUE a 5 1\r\nA\r\nVALUE b 0 1\r\nB\r\nVALUE c 0 2\r\nCC\r\nEND\r\n"
                );
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(sp.in_flight(), 0);
        assert_eq!(
            sp.arrive(src(0), subs[0].request_id, 0, 1, r0),
            Arrival::Stale
        );
    }

    #[test]
    fn one_message_per_item_as_memcached_sends_them() {
        let mut sp = Splitter::new(Duration::from_secs(1));
        let subs = start(
            &mut sp,
            Instant::now(),
            Command::Get,
            None,
            &[("a", 0), ("b", 1), ("c", 0)],
        );
        let id0 = subs[0].request_id;
        assert_eq!(
            sp.arrive(src(0), id0, 0, 1, b"VALUE a 0 1\r\nA\r\n"),
            Arrival::Stored
        );
        assert_eq!(
            sp.arrive(src(0), id0, 0, 1, b"VALUE c 0 1\r\nC\r\n"),
            Arrival::Stored
        );
        assert_eq!(sp.arrive(src(0), id0, 0, 1, b"END\r\n"), Arrival::Stored);
        // A datagram after the part completed is not part of any reply.
        let Arrival::Done { reply, .. } = sp.arrive(src(1), subs[1].request_id, 0, 1, b"END\r\n")
        else {
            panic!("not done")
        };
        assert_eq!(reply, b"VALUE a 0 1\r\nA\r\nVALUE c 0 1\r\nC\r\nEND\r\n");
    }

    #[test]
    fn foreign_and_out_of_order_datagrams_never_reach_the_client() {
        let mut sp = Splitter::new(Duration::from_secs(1));
        let subs = start(
            &mut sp,
            Instant::now(),
            Command::Get,
            None,
            &[("a", 0), ("b", 1)],
        );
        // Someone else answering for server 0 is refused and the split goes on.
        let evil = b"VALUE a 0 4\r\nEVIL\r\nEND\r\n";
        let stranger = (Ipv4Addr::new(10, 0, 0, 99), 11211);
        assert_eq!(
            sp.arrive(stranger, subs[0].request_id, 0, 1, evil),
            Arrival::Foreign
        );
        assert_eq!(
            sp.arrive(src(1), subs[0].request_id, 0, 1, evil),
            Arrival::Foreign
        );
        assert_eq!(sp.in_flight(), 1);
        // A piece out of order could belong to another message: the split fails instead.
        assert_eq!(
            sp.arrive(src(0), subs[0].request_id, 1, 2, b"x"),
            Arrival::BadReply
        );
        assert_eq!(sp.in_flight(), 0);
        assert_eq!(sp.buffered, 0);
    }

    #[test]
    fn duplicate_keys_come_back_twice() {
        let mut sp = Splitter::new(Duration::from_secs(1));
        let subs = start(
            &mut sp,
            Instant::now(),
            Command::Gets,
            None,
            &[("a", 0), ("b", 1), ("a", 0)],
        );
        assert_eq!(subs[0].payload, b"gets a a\r\n");
        let r0 = b"VALUE a 0 1 9\r\nA\r\nVALUE a 0 1 9\r\nA\r\nEND\r\n";
        assert_eq!(
            sp.arrive(src(0), subs[0].request_id, 0, 1, r0),
            Arrival::Stored
        );
        let Arrival::Done { reply, .. } = sp.arrive(src(1), subs[1].request_id, 0, 1, b"END\r\n")
        else {
            panic!("not done")
        };
        assert_eq!(reply, r0.to_vec());
    }

    #[test]
    fn error_part_is_passed_on_and_garbage_fails() {
        let mut sp = Splitter::new(Duration::from_secs(1));
        let subs = start(
            &mut sp,
            Instant::now(),
            Command::Get,
            None,
            &[("a", 0), ("b", 1)],
        );
        sp.arrive(src(0), subs[0].request_id, 0, 1, b"END\r\n");
        let Arrival::Done { reply, .. } = sp.arrive(
            src(1),
            subs[1].request_id,
            0,
            1,
            b"SERVER_ERROR out of memory\r\n",
        ) else {
            panic!("not done")
        };
        assert_eq!(reply, b"SERVER_ERROR out of memory\r\n");

        let subs = start(
            &mut sp,
            Instant::now(),
            Command::Get,
            None,
            &[("a", 0), ("b", 1)],
        );
        sp.arrive(src(0), subs[0].request_id, 0, 1, b"END\r\n");
        assert_eq!(
            sp.arrive(src(1), subs[1].request_id, 0, 1, b"VALUE zz\r\n"),
            Arrival::BadReply
        );
        // An item for a key that was not asked for is a bad reply, not a wrong answer.
        let subs = start(
            &mut sp,
            Instant::now(),
            Command::Get,
            None,
            &[("a", 0), ("b", 1)],
        );
        sp.arrive(src(0), subs[0].request_id, 0, 1, b"END\r\n");
        assert_eq!(
            sp.arrive(
                src(1),
                subs[1].request_id,
                0,
                1,
                b"VALUE x 0 1\r\nX\r\nEND\r\n"
            ),
            Arrival::BadReply
        );
        assert_eq!(sp.in_flight(), 0);
    }

    #[test]
    fn bad_headers_and_timeouts() {
        let mut sp = Splitter::new(Duration::from_millis(10));
        let t0 = Instant::now();
        let subs = start(&mut sp, t0, Command::Get, None, &[("a", 0), ("b", 1)]);
        assert_eq!(
            sp.arrive(src(0), subs[0].request_id, 3, 2, b"x"),
            Arrival::BadReply
        );
        let subs = start(
            &mut sp,
            t0,
            Command::Gat,
            Some(b"60"),
            &[("a", 0), ("b", 1)],
        );
        assert_eq!(subs[0].payload, b"gat 60 a\r\n");
        assert_eq!(sp.expire(t0), 0);
        assert_eq!(sp.expire(t0 + Duration::from_millis(11)), 1);
        assert_eq!(sp.in_flight(), 0);
    }

    #[test]
    fn table_is_bounded() {
        let mut sp = Splitter::new(Duration::from_secs(1));
        let now = Instant::now();
        for _ in 0..MAX_PENDING {
            start(&mut sp, now, Command::Get, None, &[("a", 0), ("b", 1)]);
        }
        assert_eq!(
            sp.start(
                now,
                client(),
                Command::Get,
                None,
                keys(&[("a", 0), ("b", 1)]),
                &sources(),
            ),
            Err(SplitError::TableFull)
        );
    }
}
