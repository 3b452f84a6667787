//! Split-forward-merge of multi-key gets whose keys live on several servers.
//!
//! Two shapes are split: a text `get`/`gets`/`gat`/`gats` with many keys, and a datagram of
//! pipelined binary gets (`GET`, `GETQ`, `GETK`, `GETKQ`, then optionally `NOOP`) or meta gets
//! (`mg`, then optionally `mn`). The switch sends one single-key sub-request per distinct text
//! key, or per pipelined request, from its agent address, collects every reply, and answers the
//! client with one reply in the client's order — byte for byte what a single memcached holding
//! all the keys would send. If any part fails or times out, the client gets that server's error
//! line (text only) or nothing: never a partial answer.
//!
//! Quiet pipelined gets are sent non-quiet, so that a miss is answered too and the switch knows
//! when every part is in; the merge then leaves the miss out and gives a hit back the client's
//! quiet opcode. The trailing `NOOP` or `mn` is answered by the switch, last.
//!
//! Why one key per sub-request: memcached 1.6 answers a multi-key get over UDP with one
//! message per item, every one numbered as its own message (sequence 0 of 1), and datagrams
//! sent back to back may be delivered out of order (a veth hands each to the backlog of the
//! CPU the sender happened to run on). Nothing in those messages says how many items to wait
//! for, so their order cannot be repaired. A single-key get is always answered with exactly
//! one message — the item and `END`, or `END` alone, or an error line — split into numbered
//! datagrams only when it is large, which reassemble in any order.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::Ipv4Addr;
use std::time::Duration;

use kv::Instant;

use wire::memcache::binary::{self, opcode};
use wire::memcache::{self, Command, Protocol, Request};

use crate::frame::UdpEnds;

/// Most split gets in flight at once; more are dropped and counted.
pub const MAX_PENDING: usize = 4096;
/// Most datagrams one reply may span: memcached's largest item (1 MiB by default) takes about
/// 750 datagrams of 1400 bytes.
pub const MAX_PART_DATAGRAMS: u16 = 1024;
/// Most bytes one part's reply may hold before the split is abandoned.
pub const MAX_PART_BYTES: usize = 2 << 20;
/// Most reply bytes all splits in flight may hold together.
pub const MAX_BUFFERED_BYTES: usize = 64 << 20;
/// Most sub-request ids in flight: the 16-bit id space, with room left so that an id is not
/// reused while a late reply to its last use may still arrive.
const MAX_IDS_IN_FLIGHT: usize = 32_768;
/// Largest merged reply: what fits in the datagrams one memcached reply may span, and far more
/// than a real multi-get returns. A get repeating one large key many times must not make the
/// switch build (and send) an answer out of proportion to the request.
pub const MAX_MERGED_BYTES: usize = 16 << 20;

/// Where and how to answer the client once every part is in.
#[derive(Debug, Clone)]
pub struct Client {
    pub ends: UdpEnds,
    pub request_id: u16,
    pub port: u16,
}

/// How a part's reply is checked and folded into the merged answer.
#[derive(Debug, Clone)]
enum Fold {
    /// A text get of `key`: at most one item for it, then `END`; or an error line.
    Text { key: Vec<u8> },
    /// A binary get sent as `sent` with the client's `opaque`: one response to it, a hit or a
    /// miss. A hit is given back the client's opcode; a miss is left out if `quiet`.
    Binary {
        sent: u8,
        client: u8,
        opaque: u32,
        quiet: bool,
    },
    /// A meta `mg` sent without `q`: `VA`, `HD` or `EN`. An `EN` is left out if `quiet`.
    Meta { quiet: bool },
    /// A write sent to one replica of its key: whatever one message the server answers.
    Write,
}

/// One part: the single-key sub-request for one distinct text key or one pipelined get, and its
/// reply as it arrives.
struct Part {
    fold: Fold,
    request_id: u16,
    /// Where the reply must come from: the server's address and memcached port.
    source: (Ipv4Addr, u16),
    /// The reply's datagrams by sequence number; empty until the first arrives.
    pieces: Vec<Option<Vec<u8>>>,
    received: u16,
    bytes: usize,
}

impl Part {
    fn new(fold: Fold, request_id: u16, source: (Ipv4Addr, u16)) -> Part {
        Part {
            fold,
            request_id,
            source,
            pieces: Vec::new(),
            received: 0,
            bytes: 0,
        }
    }

    fn complete(&self) -> bool {
        !self.pieces.is_empty() && usize::from(self.received) == self.pieces.len()
    }

    /// Takes one datagram of the reply; `Err` if it cannot belong to a well-formed reply.
    fn take(&mut self, seq: u16, total: u16, payload: &[u8]) -> Result<(), ()> {
        if total == 0 || total > MAX_PART_DATAGRAMS || seq >= total {
            return Err(());
        }
        if self.pieces.is_empty() {
            self.pieces = vec![None; usize::from(total)];
        } else if self.pieces.len() != usize::from(total) {
            return Err(());
        }
        if self.bytes + payload.len() > MAX_PART_BYTES {
            return Err(());
        }
        let slot = &mut self.pieces[usize::from(seq)];
        if slot.is_none() {
            *slot = Some(payload.to_vec());
            self.received += 1;
            self.bytes += payload.len();
        }
        Ok(())
    }

    fn message(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.bytes);
        for piece in self.pieces.iter().flatten() {
            out.extend_from_slice(piece);
        }
        out
    }
}

struct Pending {
    client: Client,
    /// For each of the client's keys, in order: the part that fetches it.
    order: Vec<usize>,
    parts: Vec<Part>,
    /// Appended after the last answer: `END` for a text get, the answer to a trailing no-op.
    trailer: Vec<u8>,
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
        /// A replicated write's, rather than a split get's.
        write: bool,
    },
    /// A part came back malformed; the split is abandoned.
    BadReply,
    /// No split awaits this request id.
    Stale,
    /// The datagram does not come from the server the request id belongs to.
    Foreign,
}

/// What starting a split with cached keys did.
#[derive(Debug, PartialEq, Eq)]
pub enum Started {
    /// Send these sub-requests; the reply is merged as they come back.
    Sent(Vec<SubRequest>),
    /// The cache answered every key: the merged reply, at once.
    Answered(Vec<u8>),
}

/// Why a multi-key get was not split; the switch counts each as its own drop reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitError {
    /// No room: the split table is full, or too few sub-request ids are free.
    TableFull,
    /// Only `get`, `gets`, `gat` and `gats` (with its exptime), or pipelined binary or meta
    /// gets of one protocol with an optional trailing no-op, can be split.
    NotRetrieval,
}

/// The split table. Driven by the switch: no I/O, time passed in.
pub struct Splitter {
    /// Splits in flight by number. Looked up, or scanned for the earliest deadline and for the
    /// expired (which are then sorted by number).
    pending: HashMap<u64, Pending>,
    /// Sub-request id → pending split.
    by_request: HashMap<u16, u64>,
    /// Ids recently freed, and until when they rest: a reply that comes late to an id's last
    /// use must not be taken for the answer to its next use.
    resting: HashMap<u16, Instant>,
    /// The same rests, soonest end first, so that the ones over are forgotten as soon as a
    /// split starts: how many ids rest must not depend on how often the caller ticks. An
    /// entry whose id rests again, or was taken again, until another instant is skipped.
    rest_ends: BinaryHeap<Reverse<(Instant, u16)>>,
    next_split: u64,
    next_request_id: u16,
    timeout: Duration,
    /// Reply bytes held by every part in flight.
    buffered: usize,
}

impl Splitter {
    /// A splitter whose parts wait `timeout` for their replies. Sub-request ids start at
    /// `first_request_id`: the daemon draws it from the switch's seed, which it takes from the
    /// operating system's randomness, so nobody can guess the ids from a restart of the
    /// switch; a test or a simulator gives its own seed and gets the same ids every run.
    pub fn new(timeout: Duration, first_request_id: u16) -> Splitter {
        Splitter {
            pending: HashMap::new(),
            by_request: HashMap::new(),
            resting: HashMap::new(),
            rest_ends: BinaryHeap::new(),
            next_split: 0,
            next_request_id: first_request_id.max(1),
            timeout,
            buffered: 0,
        }
    }

    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// The earliest deadline of a split in flight: [`Splitter::expire`] has work then.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.pending.values().map(|p| p.deadline).min()
    }

    /// Whether `n` more sub-request ids can be had at `now`. Ids in use and resting together
    /// stay under half the id space, so [`Self::allocate_request_id`] always finds a free one.
    fn ids_available(&mut self, n: usize, now: Instant) -> bool {
        self.end_rests(now);
        self.by_request.len() + self.resting.len() + n <= MAX_IDS_IN_FLIGHT
    }

    /// Forgets the rests that are over at `now`. O(log n) per rest over.
    fn end_rests(&mut self, now: Instant) {
        while let Some(&Reverse((until, id))) = self.rest_ends.peek() {
            if until > now {
                break;
            }
            self.rest_ends.pop();
            if self.resting.get(&id) == Some(&until) {
                self.resting.remove(&id);
            }
        }
    }

    /// An id neither in use nor resting. The caller checked [`Self::ids_available`].
    fn allocate_request_id(&mut self, now: Instant) -> u16 {
        loop {
            let id = self.next_request_id;
            self.next_request_id = self.next_request_id.wrapping_add(1);
            // Id 0 belongs to quiet replicated writes, whose replies no one awaits.
            if id == 0 || self.by_request.contains_key(&id) {
                continue;
            }
            match self.resting.get(&id) {
                Some(until) if *until > now => continue,
                Some(_) => {
                    self.resting.remove(&id);
                }
                None => {}
            }
            return id;
        }
    }

    /// Starts a split of a retrieval command (`get`, `gets`, `gat`, `gats`) whose keys are
    /// given in the client's order with the server each lives on; `sources[server]` is the
    /// address its replies come from. Returns the sub-requests to send, one per distinct key.
    pub fn start(
        &mut self,
        now: Instant,
        client: Client,
        command: Command,
        exptime: Option<&[u8]>,
        keys: Vec<(Vec<u8>, usize)>,
        sources: &[(Ipv4Addr, u16)],
    ) -> Result<Vec<SubRequest>, SplitError> {
        match self.start_cached(now, client, command, exptime, keys, sources, &mut |_| None)? {
            Started::Sent(subs) => Ok(subs),
            // Nothing was cached, so every key has a sub-request.
            Started::Answered(_) => Err(SplitError::NotRetrieval),
        }
    }

    /// As [`Splitter::start`], where `cached` answers some keys at once: the text reply for
    /// one key (`VALUE ...` and `END`), as its server would give it. Those keys are not sent.
    #[allow(clippy::too_many_arguments)]
    pub fn start_cached(
        &mut self,
        now: Instant,
        client: Client,
        command: Command,
        exptime: Option<&[u8]>,
        keys: Vec<(Vec<u8>, usize)>,
        sources: &[(Ipv4Addr, u16)],
        cached: &mut dyn FnMut(&[u8]) -> Option<Vec<u8>>,
    ) -> Result<Started, SplitError> {
        let retrieval = matches!(command, Command::Get | Command::Gets)
            || (matches!(command, Command::Gat | Command::Gats) && exptime.is_some());
        if !retrieval || keys.iter().any(|(_, s)| *s >= sources.len()) {
            return Err(SplitError::NotRetrieval);
        }
        let mut distinct: Vec<(&[u8], usize)> = Vec::new();
        let mut order = Vec::with_capacity(keys.len());
        for (key, server) in &keys {
            let at = match distinct.iter().position(|(k, _)| *k == key.as_slice()) {
                Some(at) => at,
                None => {
                    distinct.push((key, *server));
                    distinct.len() - 1
                }
            };
            order.push(at);
        }
        if self.pending.len() >= MAX_PENDING || !self.ids_available(distinct.len(), now) {
            return Err(SplitError::TableFull);
        }
        let split = self.next_split;
        self.next_split += 1;
        let mut subs = Vec::with_capacity(distinct.len());
        let mut parts = Vec::with_capacity(distinct.len());
        for (key, server) in distinct {
            let request_id = self.allocate_request_id(now);
            self.by_request.insert(request_id, split);
            let fold = Fold::Text { key: key.to_vec() };
            if let Some(reply) = cached(key) {
                // Answered already: complete, and never sent (its id rests unused).
                let mut part = Part::new(fold.clone(), request_id, sources[server]);
                if part.take(0, 1, &reply).is_ok() {
                    self.buffered += part.bytes;
                    parts.push(part);
                    continue;
                }
            }
            let mut payload = Vec::with_capacity(key.len() + 16);
            let written = memcache::reply::write_retrieval_request(
                command,
                exptime,
                std::iter::once(key),
                &mut payload,
            );
            debug_assert!(written, "the command was checked above");
            subs.push(SubRequest {
                server,
                request_id,
                payload,
            });
            parts.push(Part::new(fold, request_id, sources[server]));
        }
        self.pending.insert(
            split,
            Pending {
                client,
                order,
                parts,
                trailer: b"END\r\n".to_vec(),
                deadline: now + self.timeout,
            },
        );
        if subs.is_empty() {
            // Every key was answered by the cache: nothing will arrive to finish the split.
            let pending = self.take(split).ok_or(SplitError::TableFull)?;
            return merge(&pending)
                .map(Started::Answered)
                .ok_or(SplitError::NotRetrieval);
        }
        Ok(Started::Sent(subs))
    }

    /// Starts a split of the pipelined requests of one datagram, in the client's order, each
    /// with the server its key lives on (`None` for a keyless request). They must all be binary
    /// `GET`/`GETQ`/`GETK`/`GETKQ`, or all meta `mg`, optionally followed by one `NOOP` or `mn`
    /// of the same protocol. Returns the sub-requests to send, one per get.
    pub fn start_pipeline(
        &mut self,
        now: Instant,
        client: Client,
        requests: &[(Request<'_>, Option<usize>)],
        sources: &[(Ipv4Addr, u16)],
    ) -> Result<Vec<SubRequest>, SplitError> {
        let (gets, trailer) = match requests {
            [gets @ .., (last, None)] => (gets, Some(last)),
            gets => (gets, None),
        };
        let protocol = match gets.first() {
            Some((first, _)) if first.protocol != Protocol::Text => first.protocol,
            _ => return Err(SplitError::NotRetrieval),
        };
        let trailer = match trailer {
            None => Vec::new(),
            Some(noop) => noop_answer(noop, protocol).ok_or(SplitError::NotRetrieval)?,
        };
        let mut planned = Vec::with_capacity(gets.len());
        for (req, server) in gets {
            let server = server.filter(|s| *s < sources.len());
            let (Some(server), true) = (server, req.protocol == protocol) else {
                return Err(SplitError::NotRetrieval);
            };
            let (payload, fold) = sub_request(req).ok_or(SplitError::NotRetrieval)?;
            planned.push((server, payload, fold));
        }
        if self.pending.len() >= MAX_PENDING || !self.ids_available(planned.len(), now) {
            return Err(SplitError::TableFull);
        }
        let split = self.next_split;
        self.next_split += 1;
        let mut subs = Vec::with_capacity(planned.len());
        let mut parts = Vec::with_capacity(planned.len());
        for (server, payload, fold) in planned {
            let request_id = self.allocate_request_id(now);
            self.by_request.insert(request_id, split);
            subs.push(SubRequest {
                server,
                request_id,
                payload,
            });
            parts.push(Part::new(fold, request_id, sources[server]));
        }
        self.pending.insert(
            split,
            Pending {
                client,
                order: (0..parts.len()).collect(),
                parts,
                trailer,
                deadline: now + self.timeout,
            },
        );
        Ok(subs)
    }

    /// Starts a write to every replica of its key (`servers`, owner first): the client's
    /// request `payload` is sent to each as it is. Once every replica has answered, the client
    /// gets one reply: the common one if all agree, else the first error (`ERROR`,
    /// `CLIENT_ERROR`, `SERVER_ERROR`, a binary status of 0x80 or more), else the owner's. A
    /// replica that does not answer in time fails the write: the client gets nothing, as from
    /// a lost datagram. A `quiet` write (noreply, a quiet binary opcode, meta `q`) gets no
    /// reply on success, so nothing is awaited: its sub-requests go out under id 0, and an
    /// error a replica sends back is counted, not passed on.
    pub fn start_write(
        &mut self,
        now: Instant,
        client: Client,
        payload: &[u8],
        servers: &[usize],
        quiet: bool,
        sources: &[(Ipv4Addr, u16)],
    ) -> Result<Vec<SubRequest>, SplitError> {
        if servers.iter().any(|&s| s >= sources.len()) {
            return Err(SplitError::NotRetrieval);
        }
        if quiet {
            return Ok(servers
                .iter()
                .map(|&server| SubRequest {
                    server,
                    request_id: 0,
                    payload: payload.to_vec(),
                })
                .collect());
        }
        if self.pending.len() >= MAX_PENDING || !self.ids_available(servers.len(), now) {
            return Err(SplitError::TableFull);
        }
        let split = self.next_split;
        self.next_split += 1;
        let mut subs = Vec::with_capacity(servers.len());
        let mut parts = Vec::with_capacity(servers.len());
        for &server in servers {
            let request_id = self.allocate_request_id(now);
            self.by_request.insert(request_id, split);
            subs.push(SubRequest {
                server,
                request_id,
                payload: payload.to_vec(),
            });
            parts.push(Part::new(Fold::Write, request_id, sources[server]));
        }
        self.pending.insert(
            split,
            Pending {
                client,
                order: Vec::new(),
                parts,
                trailer: Vec::new(),
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
        let before = part.bytes;
        let ok = part.take(seq, total, payload).is_ok();
        self.buffered = self.buffered + part.bytes - before;
        if !ok || self.buffered > MAX_BUFFERED_BYTES {
            tracing::debug!(
                request_id,
                seq,
                total,
                "split abandoned: a reply datagram does not fit"
            );
            self.abandon(split);
            return Arrival::BadReply;
        }
        if !pending.parts.iter().all(Part::complete) {
            return Arrival::Stored;
        }
        let Some(pending) = self.take(split) else {
            return Arrival::Stale;
        };
        let write = pending
            .parts
            .first()
            .is_some_and(|p| matches!(p.fold, Fold::Write));
        match merge(&pending) {
            Some(reply) => Arrival::Done {
                client_port: pending.client.port,
                ends: pending.client.ends,
                request_id: pending.client.request_id,
                reply,
                write,
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
        let mut expired = expired;
        expired.sort_unstable();
        for id in &expired {
            self.abandon(*id);
        }
        self.end_rests(now);
        expired.len()
    }

    fn take(&mut self, split: u64) -> Option<Pending> {
        let p = self.pending.remove(&split)?;
        // Each id rests for a timeout past its split's deadline before it is used again.
        let until = p.deadline + self.timeout;
        for part in &p.parts {
            self.by_request.remove(&part.request_id);
            self.resting.insert(part.request_id, until);
            self.rest_ends.push(Reverse((until, part.request_id)));
            self.buffered = self.buffered.saturating_sub(part.bytes);
        }
        Some(p)
    }

    fn abandon(&mut self, split: u64) {
        self.take(split);
    }
}

/// What the switch answers for a trailing no-op: memcached's `NOOP` response (the request's
/// opaque, everything else zero) or `MN`. `None` for anything else.
fn noop_answer(req: &Request<'_>, protocol: Protocol) -> Option<Vec<u8>> {
    match req.command {
        Command::Binary(opcode::NOOP) if protocol == Protocol::Binary => {
            let mut out = vec![0u8; binary::HEADER_LEN];
            out[0] = binary::RESPONSE_MAGIC;
            out[1] = opcode::NOOP;
            out[12..16].copy_from_slice(&req.opaque()?.to_be_bytes());
            Some(out)
        }
        Command::MetaNoop if protocol == Protocol::Meta => Some(b"MN\r\n".to_vec()),
        _ => None,
    }
}

/// The single request to send for one pipelined get, made non-quiet so that a miss is answered
/// too, and how its reply folds back; `None` if the request cannot be split.
fn sub_request(req: &Request<'_>) -> Option<(Vec<u8>, Fold)> {
    match req.command {
        Command::Binary(op @ (opcode::GET | opcode::GETQ | opcode::GETK | opcode::GETKQ)) => {
            let sent = match op {
                opcode::GETQ => opcode::GET,
                opcode::GETKQ => opcode::GETK,
                op => op,
            };
            let mut payload = req.bytes().to_vec();
            // The opcode is the second header byte.
            *payload.get_mut(1)? = sent;
            let fold = Fold::Binary {
                sent,
                client: op,
                opaque: req.opaque()?,
                quiet: op != sent,
            };
            Some((payload, fold))
        }
        Command::MetaGet => {
            // `mg <key> <flag>*`: the same line without the quiet flag.
            let line = req.bytes();
            let line = line.strip_suffix(b"\n")?;
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let mut payload = Vec::with_capacity(line.len() + 2);
            // The command and the key stay as they are (a key may begin with `q`); only a flag
            // may be the quiet one.
            for (i, token) in line
                .split(|&b| b == b' ')
                .filter(|t| !t.is_empty())
                .enumerate()
            {
                if i >= 2 && token.first() == Some(&b'q') {
                    continue;
                }
                if !payload.is_empty() {
                    payload.push(b' ');
                }
                payload.extend_from_slice(token);
            }
            payload.extend_from_slice(b"\r\n");
            Some((
                payload,
                Fold::Meta {
                    quiet: req.noreply(),
                },
            ))
        }
        _ => None,
    }
}

/// What one single-key reply held.
enum Answer {
    /// The item, `VALUE ...\r\n<data>\r\n`, or `None` for a miss.
    Item(Option<Vec<u8>>),
    /// The server's error line.
    Error(Vec<u8>),
}

/// Reads one part's reply as its fold says; anything but a well-formed answer is `None`.
fn read_part(part: &Part) -> Option<Answer> {
    let message = part.message();
    match &part.fold {
        Fold::Text { key } => read_text(key, &message),
        Fold::Binary {
            sent,
            client,
            opaque,
            quiet,
        } => read_binary(message, *sent, *client, *opaque, *quiet),
        Fold::Meta { quiet } => read_meta(message, *quiet),
        Fold::Write => Some(Answer::Item(Some(message))),
    }
}

/// A text get's reply: at most one item, for the key that was asked, then `END`; or an error
/// line.
fn read_text(key: &[u8], message: &[u8]) -> Option<Answer> {
    match memcache::reply::parse_retrieval_reply(message) {
        Ok(Some((mut items, consumed))) if consumed == message.len() => {
            let item = items.next();
            if items.next().is_some() {
                return None;
            }
            match item {
                None => Some(Answer::Item(None)),
                Some(item) if item.key == key => Some(Answer::Item(Some(item.raw.to_vec()))),
                Some(_) => None,
            }
        }
        Err(memcache::reply::ReplyError::ErrorLine { start, end }) if end == message.len() => {
            message.get(start..end).map(|l| Answer::Error(l.to_vec()))
        }
        _ => None,
    }
}

/// A binary get's reply: exactly one response to the opcode and opaque that were sent, a hit
/// (status 0) or a miss (status 1). Any other status fails the split.
fn read_binary(
    mut message: Vec<u8>,
    sent: u8,
    client: u8,
    opaque: u32,
    quiet: bool,
) -> Option<Answer> {
    let header = binary::parse_response_header(&message).ok()??;
    if header.packet_len() != message.len() || header.opcode != sent || header.opaque != opaque {
        return None;
    }
    match header.status() {
        binary::status::NO_ERROR => {
            // A quiet get's hit carries the quiet opcode, as memcached echoes the request's.
            message[1] = client;
            Some(Answer::Item(Some(message)))
        }
        binary::status::KEY_NOT_FOUND if quiet => Some(Answer::Item(None)),
        binary::status::KEY_NOT_FOUND => Some(Answer::Item(Some(message))),
        _ => None,
    }
}

/// A meta get's reply: `VA <len> <flag>*` and its data, `HD <flag>*`, or the miss
/// `EN <flag>*`, which a quiet get leaves out.
fn read_meta(message: Vec<u8>, quiet: bool) -> Option<Answer> {
    let line_len = message.windows(2).position(|w| w == b"\r\n")? + 2;
    let line = &message[..line_len - 2];
    let mut tokens = line.split(|&b| b == b' ');
    let code = tokens.next()?;
    let expected = match code {
        b"VA" => {
            let len = std::str::from_utf8(tokens.next()?)
                .ok()?
                .parse::<usize>()
                .ok()?;
            line_len.checked_add(len)?.checked_add(2)?
        }
        b"HD" | b"EN" => line_len,
        _ => return None,
    };
    if message.len() != expected || !message.ends_with(b"\r\n") {
        return None;
    }
    if code == b"EN" && quiet {
        return Some(Answer::Item(None));
    }
    Some(Answer::Item(Some(message)))
}

/// Merges the parts of a split in the client's key order. A part that is an error line is
/// passed on whole, as the client would have had it from that server; a part that is neither
/// makes the merge fail.
fn merge(p: &Pending) -> Option<Vec<u8>> {
    if p.parts
        .first()
        .is_some_and(|part| matches!(part.fold, Fold::Write))
    {
        return Some(merge_write(p));
    }
    let mut answers = Vec::with_capacity(p.parts.len());
    for part in &p.parts {
        match read_part(part) {
            Some(Answer::Error(line)) => return Some(line),
            Some(Answer::Item(item)) => answers.push(item),
            None => {
                tracing::debug!(fold = ?part.fold, "split abandoned: a part's reply is malformed");
                return None;
            }
        }
    }
    let mut total = p.trailer.len();
    for &at in &p.order {
        total += answers.get(at)?.as_ref().map_or(0, Vec::len);
    }
    if total > MAX_MERGED_BYTES {
        tracing::debug!(
            total,
            "split abandoned: the merged reply would be too large"
        );
        return None;
    }
    let mut out = Vec::with_capacity(total);
    for &at in &p.order {
        if let Some(item) = answers.get(at)? {
            out.extend_from_slice(item);
        }
    }
    out.extend_from_slice(&p.trailer);
    Some(out)
}

/// The one reply to a write every replica answered (see [`Splitter::start_write`]).
fn merge_write(p: &Pending) -> Vec<u8> {
    let messages: Vec<Vec<u8>> = p.parts.iter().map(Part::message).collect();
    let replies: Vec<&[u8]> = messages.iter().map(Vec::as_slice).collect();
    memcache::reply::replicas_reply(&replies).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let keys = spec
            .iter()
            .map(|(k, s)| (k.as_bytes().to_vec(), *s))
            .collect();
        sp.start(now, client(), command, exptime, keys, &sources())
            .expect("split starts")
    }

    /// Answers sub-request `sub` with `reply` in one datagram.
    fn answer(sp: &mut Splitter, sub: &SubRequest, reply: &[u8]) -> Arrival {
        sp.arrive(src(sub.server), sub.request_id, 0, 1, reply)
    }

    #[test]
    fn cached_keys_are_not_sent_and_are_merged_in_place() {
        let mut sp = Splitter::new(Duration::from_secs(1), 0x1234);
        let keys = |spec: &[(&str, usize)]| -> Vec<(Vec<u8>, usize)> {
            spec.iter()
                .map(|(k, s)| (k.as_bytes().to_vec(), *s))
                .collect()
        };
        let mut cache = |key: &[u8]| match key {
            b"a" => Some(b"VALUE a 1 1\r\nA\r\nEND\r\n".to_vec()),
            b"c" => Some(b"VALUE c 3 1\r\nC\r\nEND\r\n".to_vec()),
            _ => None,
        };
        let now = Instant::from_secs(1_000);
        let spec = keys(&[("a", 0), ("b", 1), ("c", 2), ("a", 0)]);
        let started = sp
            .start_cached(
                now,
                client(),
                Command::Get,
                None,
                spec,
                &sources(),
                &mut cache,
            )
            .expect("split starts");
        let Started::Sent(subs) = started else {
            panic!("b is not cached: {started:?}");
        };
        assert_eq!(subs.len(), 1);
        assert_eq!(subs[0].payload, b"get b\r\n");
        match answer(&mut sp, &subs[0], b"VALUE b 2 1\r\nB\r\nEND\r\n") {
            Arrival::Done { reply, .. } => assert_eq!(
                reply,
                b"VALUE a 1 1\r\nA\r\nVALUE b 2 1\r\nB\r\nVALUE c 3 1\r\nC\r\n\
                  VALUE a 1 1\r\nA\r\nEND\r\n"
            ),
            other => panic!("{other:?}"),
        }
        // Every key cached: the merged reply at once, nothing left pending.
        let spec = keys(&[("c", 2), ("a", 0)]);
        let started = sp
            .start_cached(
                now,
                client(),
                Command::Get,
                None,
                spec,
                &sources(),
                &mut cache,
            )
            .expect("split starts");
        assert_eq!(
            started,
            Started::Answered(b"VALUE c 3 1\r\nC\r\nVALUE a 1 1\r\nA\r\nEND\r\n".to_vec())
        );
        assert_eq!(sp.in_flight(), 0);
        assert_eq!(sp.buffered, 0);
    }

    #[test]
    fn one_sub_request_per_distinct_key_merged_in_client_order() {
        let mut sp = Splitter::new(Duration::from_secs(1), 0x1234);
        let subs = start(
            &mut sp,
            Instant::from_secs(1_000),
            Command::Get,
            None,
            &[("a", 0), ("b", 1), ("c", 0), ("a", 0), ("d", 2)],
        );
        let payloads: Vec<&[u8]> = subs.iter().map(|s| s.payload.as_slice()).collect();
        assert_eq!(
            payloads,
            [&b"get a\r\n"[..], b"get b\r\n", b"get c\r\n", b"get d\r\n"]
        );
        assert_eq!(
            subs.iter().map(|s| s.server).collect::<Vec<_>>(),
            [0, 1, 0, 2]
        );
        // Replies in any order; c misses; b's reply comes in two datagrams, last piece first.
        assert_eq!(
            answer(&mut sp, &subs[3], b"VALUE d 0 1\r\nD\r\nEND\r\n"),
            Arrival::Stored
        );
        assert_eq!(answer(&mut sp, &subs[2], b"END\r\n"), Arrival::Stored);
        let b = b"VALUE b 7 2\r\nBB\r\nEND\r\n";
        let id = subs[1].request_id;
        assert_eq!(sp.arrive(src(1), id, 1, 2, &b[9..]), Arrival::Stored);
        assert_eq!(sp.arrive(src(1), id, 0, 2, &b[..9]), Arrival::Stored);
        match answer(&mut sp, &subs[0], b"VALUE a 5 1\r\nA\r\nEND\r\n") {
            Arrival::Done {
                request_id, reply, ..
            } => {
                assert_eq!(request_id, 42);
                assert_eq!(
                    String::from_utf8_lossy(&reply),
                    "VALUE a 5 1\r\nA\r\nVALUE b 7 2\r\nBB\r\nVALUE a 5 1\r\nA\r\n\
                     VALUE d 0 1\r\nD\r\nEND\r\n"
                );
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(sp.in_flight(), 0);
        assert_eq!(sp.buffered, 0);
        assert_eq!(answer(&mut sp, &subs[0], b"END\r\n"), Arrival::Stale);
    }

    #[test]
    fn gat_keeps_its_exptime_and_gets_its_cas() {
        let mut sp = Splitter::new(Duration::from_secs(1), 0x1234);
        let now = Instant::from_secs(1_000);
        let subs = start(
            &mut sp,
            now,
            Command::Gat,
            Some(b"60"),
            &[("a", 0), ("b", 1)],
        );
        assert_eq!(subs[0].payload, b"gat 60 a\r\n");
        let subs = start(&mut sp, now, Command::Gets, None, &[("a", 0), ("b", 1)]);
        assert_eq!(subs[1].payload, b"gets b\r\n");
        assert_eq!(
            answer(&mut sp, &subs[0], b"VALUE a 0 1 9\r\nA\r\nEND\r\n"),
            Arrival::Stored
        );
        let Arrival::Done { reply, .. } = answer(&mut sp, &subs[1], b"END\r\n") else {
            panic!("not done")
        };
        assert_eq!(reply, b"VALUE a 0 1 9\r\nA\r\nEND\r\n");
        assert!(sp
            .start(
                now,
                client(),
                Command::Gat,
                None,
                vec![(b"a".to_vec(), 0)],
                &sources()
            )
            .is_err());
        assert!(sp
            .start(
                now,
                client(),
                Command::Set,
                None,
                vec![(b"a".to_vec(), 0)],
                &sources()
            )
            .is_err());
    }

    #[test]
    fn error_part_is_passed_on_and_anything_else_fails() {
        let mut sp = Splitter::new(Duration::from_secs(1), 0x1234);
        let now = Instant::from_secs(1_000);
        let subs = start(&mut sp, now, Command::Get, None, &[("a", 0), ("b", 1)]);
        answer(&mut sp, &subs[0], b"END\r\n");
        let Arrival::Done { reply, .. } =
            answer(&mut sp, &subs[1], b"SERVER_ERROR out of memory\r\n")
        else {
            panic!("not done")
        };
        assert_eq!(reply, b"SERVER_ERROR out of memory\r\n");

        // An item for a key that was not asked for, two items, or garbage: never an answer.
        for bad in [
            &b"VALUE x 0 1\r\nX\r\nEND\r\n"[..],
            b"VALUE b 0 1\r\nB\r\nVALUE b 0 1\r\nB\r\nEND\r\n",
            b"VALUE b 0 1\r\nB\r\n",
            b"VALUE zz\r\n",
            b"STORED\r\n",
        ] {
            let subs = start(&mut sp, now, Command::Get, None, &[("a", 0), ("b", 1)]);
            answer(&mut sp, &subs[0], b"END\r\n");
            assert_eq!(answer(&mut sp, &subs[1], bad), Arrival::BadReply, "{bad:?}");
        }
        assert_eq!(sp.in_flight(), 0);
        assert_eq!(sp.buffered, 0);
    }

    #[test]
    fn foreign_and_malformed_datagrams_never_reach_the_client() {
        let mut sp = Splitter::new(Duration::from_secs(1), 0x1234);
        let subs = start(
            &mut sp,
            Instant::from_secs(1_000),
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
        // Sequence numbers that do not fit the datagram count fail the split.
        assert_eq!(
            sp.arrive(src(0), subs[0].request_id, 3, 2, b"x"),
            Arrival::BadReply
        );
        assert_eq!(sp.in_flight(), 0);
        let subs = start(
            &mut sp,
            Instant::from_secs(1_000),
            Command::Get,
            None,
            &[("a", 0), ("b", 1)],
        );
        assert_eq!(
            sp.arrive(src(0), subs[0].request_id, 0, 2, b"VALUE"),
            Arrival::Stored
        );
        assert_eq!(
            sp.arrive(src(0), subs[0].request_id, 1, 3, b" a"),
            Arrival::BadReply
        );
        assert_eq!(sp.buffered, 0);
    }

    #[test]
    fn timeouts_and_bounds() {
        let mut sp = Splitter::new(Duration::from_millis(10), 0x1234);
        let t0 = Instant::from_secs(1_000);
        start(&mut sp, t0, Command::Get, None, &[("a", 0), ("b", 1)]);
        assert_eq!(sp.expire(t0), 0);
        assert_eq!(sp.expire(t0 + Duration::from_millis(11)), 1);
        assert_eq!(sp.in_flight(), 0);

        let mut sp = Splitter::new(Duration::from_secs(1), 0x1234);
        for _ in 0..MAX_PENDING {
            start(&mut sp, t0, Command::Get, None, &[("a", 0), ("b", 1)]);
        }
        let keys = vec![(b"a".to_vec(), 0), (b"b".to_vec(), 1)];
        assert_eq!(
            sp.start(t0, client(), Command::Get, None, keys, &sources()),
            Err(SplitError::TableFull)
        );
        // A reply larger than a part may hold fails the split instead of growing without bound.
        let mut sp = Splitter::new(Duration::from_secs(1), 0x1234);
        let subs = start(&mut sp, t0, Command::Get, None, &[("a", 0), ("b", 1)]);
        let chunk = vec![b'x'; 60_000];
        let mut last = Arrival::Stored;
        for seq in 0..MAX_PART_DATAGRAMS {
            last = sp.arrive(src(0), subs[0].request_id, seq, MAX_PART_DATAGRAMS, &chunk);
            if last != Arrival::Stored {
                break;
            }
        }
        assert_eq!(last, Arrival::BadReply);
        assert_eq!(sp.buffered, 0);
    }
    /// Starts a split of the pipelined requests in `body`, the `n`th get on `servers[n]`.
    fn start_pipeline(sp: &mut Splitter, body: &[u8], servers: &[usize]) -> Vec<SubRequest> {
        let mut requests = Vec::new();
        let mut offset = 0;
        let mut gets = servers.iter();
        while offset < body.len() {
            let req = memcache::parse(&body[offset..]).unwrap().unwrap();
            let server = req.key().map(|_| *gets.next().expect("a server per get"));
            offset += req.len;
            requests.push((req, server));
        }
        sp.start_pipeline(Instant::from_secs(1_000), client(), &requests, &sources())
            .expect("split starts")
    }

    /// A binary request or response header and key, with no extras.
    fn bin(magic: u8, op: u8, status: u16, opaque: u32, key: &[u8], value: &[u8]) -> Vec<u8> {
        let extras: &[u8] = if magic == 0x81 && status == 0 {
            &[0, 0, 0, 7]
        } else {
            &[]
        };
        let mut out = vec![magic, op];
        out.extend_from_slice(&(key.len() as u16).to_be_bytes());
        out.extend_from_slice(&[extras.len() as u8, 0]);
        out.extend_from_slice(&status.to_be_bytes());
        let body = extras.len() + key.len() + value.len();
        out.extend_from_slice(&(body as u32).to_be_bytes());
        out.extend_from_slice(&opaque.to_be_bytes());
        out.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 9]);
        out.extend_from_slice(extras);
        out.extend_from_slice(key);
        out.extend_from_slice(value);
        out
    }

    #[test]
    fn binary_quiet_gets_are_sent_loud_and_merged_quiet() {
        let mut sp = Splitter::new(Duration::from_secs(1), 0x1234);
        let mut body = Vec::new();
        for (i, key) in [b"a", b"b", b"c"].iter().enumerate() {
            body.extend(bin(0x80, opcode::GETKQ, 0, 10 + i as u32, *key, b""));
        }
        body.extend(bin(0x80, opcode::GET, 0, 20, b"d", b""));
        body.extend(bin(0x80, opcode::NOOP, 0, 99, b"", b""));
        let subs = start_pipeline(&mut sp, &body, &[0, 1, 2, 1]);
        assert_eq!(subs.len(), 4);
        for (i, key) in [b"a", b"b", b"c"].iter().enumerate() {
            // Sent as GETK with the client's opaque.
            assert_eq!(
                subs[i].payload,
                bin(0x80, opcode::GETK, 0, 10 + i as u32, *key, b"")
            );
        }
        assert_eq!(subs[3].payload, bin(0x80, opcode::GET, 0, 20, b"d", b""));
        assert_eq!(
            subs.iter().map(|s| s.server).collect::<Vec<_>>(),
            [0, 1, 2, 1]
        );
        // b misses (left out: it was quiet), d misses (kept: it was not); any order.
        let hit_a = bin(0x81, opcode::GETK, 0, 10, b"a", b"AA");
        let hit_c = bin(0x81, opcode::GETK, 0, 12, b"c", b"C");
        let miss_d = bin(0x81, opcode::GET, 1, 20, b"", b"Not found");
        assert_eq!(answer(&mut sp, &subs[2], &hit_c), Arrival::Stored);
        assert_eq!(answer(&mut sp, &subs[3], &miss_d), Arrival::Stored);
        let miss_b = bin(0x81, opcode::GETK, 1, 11, b"b", b"");
        assert_eq!(answer(&mut sp, &subs[1], &miss_b), Arrival::Stored);
        let Arrival::Done { reply, .. } = answer(&mut sp, &subs[0], &hit_a) else {
            panic!("not done")
        };
        let mut want = bin(0x81, opcode::GETKQ, 0, 10, b"a", b"AA");
        want.extend(bin(0x81, opcode::GETKQ, 0, 12, b"c", b"C"));
        want.extend(&miss_d);
        want.extend([
            0x81,
            opcode::NOOP,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            99,
        ]);
        want.extend([0; 8]);
        assert_eq!(reply, want);
        assert_eq!(sp.in_flight(), 0);
        assert_eq!(sp.buffered, 0);
    }

    #[test]
    fn binary_reply_that_is_not_a_hit_or_miss_fails() {
        let mut body = bin(0x80, opcode::GETQ, 0, 1, b"a", b"");
        body.extend(bin(0x80, opcode::GETQ, 0, 2, b"b", b""));
        let ok = bin(0x81, opcode::GET, 0, 2, b"", b"B");
        for bad in [
            // Out of memory, another opcode, another opaque, a body longer than said.
            bin(0x81, opcode::GET, 0x82, 1, b"", b"Out of memory"),
            bin(0x81, opcode::GETK, 0, 1, b"", b"A"),
            bin(0x81, opcode::GET, 0, 7, b"", b"A"),
            [bin(0x81, opcode::GET, 0, 1, b"", b"A"), b"x".to_vec()].concat(),
            b"END\r\n".to_vec(),
        ] {
            let mut sp = Splitter::new(Duration::from_secs(1), 0x1234);
            let subs = start_pipeline(&mut sp, &body, &[0, 1]);
            assert_eq!(subs[0].payload, bin(0x80, opcode::GET, 0, 1, b"a", b""));
            assert_eq!(answer(&mut sp, &subs[1], &ok), Arrival::Stored);
            assert_eq!(
                answer(&mut sp, &subs[0], &bad),
                Arrival::BadReply,
                "{bad:?}"
            );
            assert_eq!(sp.in_flight(), 0);
        }
    }

    #[test]
    fn meta_gets_drop_q_and_quiet_misses() {
        let mut sp = Splitter::new(Duration::from_secs(1), 0x1234);
        let body = b"mg a v q k\r\nmg b q v\r\nmg c v\r\nmg d q\r\nmn\r\n";
        let subs = start_pipeline(&mut sp, body, &[0, 1, 2, 0]);
        let payloads: Vec<&[u8]> = subs.iter().map(|s| s.payload.as_slice()).collect();
        assert_eq!(
            payloads,
            [
                &b"mg a v k\r\n"[..],
                b"mg b v\r\n",
                b"mg c v\r\n",
                b"mg d\r\n"
            ]
        );
        assert_eq!(answer(&mut sp, &subs[3], b"HD\r\n"), Arrival::Stored);
        assert_eq!(answer(&mut sp, &subs[2], b"EN\r\n"), Arrival::Stored);
        assert_eq!(answer(&mut sp, &subs[1], b"EN\r\n"), Arrival::Stored);
        let Arrival::Done { reply, .. } = answer(&mut sp, &subs[0], b"VA 2 ka\r\nAA\r\n") else {
            panic!("not done")
        };
        // b's quiet miss is left out; c was not quiet, so its miss stays; d's hit stays.
        assert_eq!(
            String::from_utf8_lossy(&reply),
            "VA 2 ka\r\nAA\r\nEN\r\nHD\r\nMN\r\n"
        );

        for bad in [
            &b"VA 3\r\nAA\r\n"[..],
            b"VA 2\r\nAA\r\nEN\r\n",
            b"SERVER_ERROR out of memory\r\n",
            b"HD",
            b"NF\r\n",
        ] {
            let subs = start_pipeline(&mut sp, b"mg a v q\r\nmg b v q\r\n", &[0, 1]);
            assert_eq!(answer(&mut sp, &subs[1], b"EN\r\n"), Arrival::Stored);
            assert_eq!(answer(&mut sp, &subs[0], bad), Arrival::BadReply, "{bad:?}");
        }
        assert_eq!(sp.in_flight(), 0);
    }

    #[test]
    fn only_gets_of_one_protocol_with_a_trailing_noop_are_split() {
        let mut sp = Splitter::new(Duration::from_secs(1), 0x1234);
        let get = bin(0x80, opcode::GETQ, 0, 1, b"a", b"");
        let noop = bin(0x80, opcode::NOOP, 0, 2, b"", b"");
        let set = bin(0x80, opcode::DELETEQ, 0, 3, b"a", b"");
        for body in [
            [&get[..], b"mg b v\r\n"].concat(),
            [&get[..], &noop, &get].concat(),
            [&get[..], &set].concat(),
            b"mg a v\r\nms b 1\r\nB\r\n".to_vec(),
            b"mn\r\n".to_vec(),
            b"get a b\r\n".to_vec(),
        ] {
            let mut requests = Vec::new();
            let mut offset = 0;
            while offset < body.len() {
                let req = memcache::parse(&body[offset..]).unwrap().unwrap();
                offset += req.len;
                requests.push((req, req.key().map(|_| 0)));
            }
            assert_eq!(
                sp.start_pipeline(Instant::from_secs(1_000), client(), &requests, &sources()),
                Err(SplitError::NotRetrieval),
                "{body:?}"
            );
        }
        assert_eq!(sp.in_flight(), 0);
    }

    #[test]
    fn meta_keys_beginning_with_q_are_kept() {
        for (request, sent) in [
            (&b"mg quux v q\r\n"[..], &b"mg quux v\r\n"[..]),
            (b"mg q v\r\n", b"mg q v\r\n"),
            (b"mg qkey q k v\r\n", b"mg qkey k v\r\n"),
        ] {
            let req = memcache::parse(request).unwrap().unwrap();
            let (payload, _) = sub_request(&req).unwrap();
            assert_eq!(
                String::from_utf8_lossy(&payload),
                String::from_utf8_lossy(sent)
            );
        }
    }

    #[test]
    fn a_repeated_large_key_cannot_blow_up_the_merged_reply() {
        let mut sp = Splitter::new(Duration::from_secs(1), 0x1234);
        let mut spec: Vec<(&str, usize)> = vec![("k", 0); 12];
        spec.push(("z", 1));
        let subs = start(
            &mut sp,
            Instant::from_secs(1_000),
            Command::Get,
            None,
            &spec,
        );
        assert_eq!(subs.len(), 2);
        let size = 1_500_000;
        let mut reply = format!("VALUE k 0 {size}\r\n").into_bytes();
        reply.resize(reply.len() + size, b'v');
        reply.extend_from_slice(b"\r\nEND\r\n");
        let chunks: Vec<&[u8]> = reply.chunks(60_000).collect();
        for (seq, chunk) in chunks.iter().enumerate() {
            let got = sp.arrive(
                src(0),
                subs[0].request_id,
                seq as u16,
                chunks.len() as u16,
                chunk,
            );
            assert_eq!(got, Arrival::Stored);
        }
        // Twelve copies of a 1.5 MB item are more than a merged reply may hold.
        assert_eq!(answer(&mut sp, &subs[1], b"END\r\n"), Arrival::BadReply);
        assert_eq!(sp.buffered, 0);
    }

    #[test]
    fn freed_ids_rest_before_they_are_used_again() {
        let timeout = Duration::from_millis(100);
        let mut sp = Splitter::new(timeout, 0x1234);
        let t0 = Instant::from_secs(1_000);
        let subs = start(&mut sp, t0, Command::Get, None, &[("a", 0), ("b", 1)]);
        answer(&mut sp, &subs[0], b"END\r\n");
        assert!(matches!(
            answer(&mut sp, &subs[1], b"END\r\n"),
            Arrival::Done { .. }
        ));
        // The counter comes round to the freed ids at once: they are skipped while resting.
        sp.next_request_id = subs[0].request_id;
        let again = start(&mut sp, t0, Command::Get, None, &[("c", 0), ("d", 1)]);
        for sub in &again {
            assert!(subs.iter().all(|s| s.request_id != sub.request_id));
        }
        // A late reply to the old use is stale, not an answer to the new one.
        assert_eq!(answer(&mut sp, &subs[0], b"END\r\n"), Arrival::Stale);
        // Past the rest, they are free again.
        sp.expire(t0 + 3 * timeout);
        sp.next_request_id = subs[0].request_id;
        let later = start(
            &mut sp,
            t0 + 3 * timeout,
            Command::Get,
            None,
            &[("e", 0), ("f", 1)],
        );
        assert_eq!(later[0].request_id, subs[0].request_id);
    }

    #[test]
    fn resting_ids_are_counted_until_their_rest_ends_whether_or_not_expire_ran() {
        let timeout = Duration::from_millis(100);
        let mut sp = Splitter::new(timeout, 0x1234);
        let t0 = Instant::from_secs(1_000);
        // Every id of the space the splitter may use, in splits of 64 keys, all answered:
        // each id rests until its split's deadline and a timeout more.
        let per_split = 64;
        for split in 0..MAX_IDS_IN_FLIGHT / per_split {
            let names: Vec<String> = (0..per_split).map(|i| format!("k{split}.{i}")).collect();
            let spec: Vec<(&str, usize)> = names.iter().map(|n| (n.as_str(), 0)).collect();
            for sub in start(&mut sp, t0, Command::Get, None, &spec) {
                answer(&mut sp, &sub, b"END\r\n");
            }
        }
        assert_eq!(sp.in_flight(), 0);
        let keys = || vec![(b"a".to_vec(), 0), (b"b".to_vec(), 1)];
        let rest_end = t0 + 2 * timeout;
        let just_before = rest_end - Duration::from_nanos(1);
        assert_eq!(
            sp.start(
                just_before,
                client(),
                Command::Get,
                None,
                keys(),
                &sources()
            ),
            Err(SplitError::TableFull)
        );
        // No expire in between: the rests are over all the same.
        assert!(sp
            .start(rest_end, client(), Command::Get, None, keys(), &sources())
            .is_ok());
        assert_eq!(sp.resting.len(), 0);
    }

    #[test]
    fn a_replicated_write_never_takes_id_zero_which_quiet_writes_use() {
        let now = Instant::from_secs(1);
        let mut sp = Splitter::new(Duration::from_secs(1), 0xffff);
        let subs = sp
            .start_write(
                now,
                client(),
                b"set k 0 0 1\r\nx\r\n",
                &[0, 1],
                false,
                &sources(),
            )
            .unwrap();
        let ids: Vec<u16> = subs.iter().map(|s| s.request_id).collect();
        assert_eq!(ids, [0xffff, 1]);
        // A quiet write's stray error under id 0 is nobody's answer.
        let quiet = sp
            .start_write(
                now,
                client(),
                b"set k 0 0 1 noreply\r\nx\r\n",
                &[0, 1],
                true,
                &sources(),
            )
            .unwrap();
        assert!(quiet.iter().all(|s| s.request_id == 0));
        assert_eq!(
            sp.arrive(src(0), 0, 0, 1, b"SERVER_ERROR out of memory\r\n"),
            Arrival::Stale
        );
        assert_eq!(
            sp.arrive(src(0), 0xffff, 0, 1, b"STORED\r\n"),
            Arrival::Stored
        );
        match sp.arrive(src(1), 1, 0, 1, b"STORED\r\n") {
            Arrival::Done { reply, write, .. } => {
                assert_eq!((reply, write), (b"STORED\r\n".to_vec(), true))
            }
            other => panic!("{other:?}"),
        }
    }
}
