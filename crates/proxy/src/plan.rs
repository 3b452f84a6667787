//! What the proxy does with one client request: answer it itself, or send it (whole, split by
//! server, or to every server) and how to turn the servers' replies into the one reply the
//! client expects. Pure: no I/O, no clock.

use std::fmt;
use std::io::Write as _;

use wire::memcache::binary::{opcode, status, write_error, write_response, HEADER_LEN};
use wire::memcache::reply::{write_retrieval_request, ReplyKind};
use wire::memcache::{Command, Protocol, Request, MAX_KEY_LEN, MAX_LINE_LEN};

/// Which kind of server connection a part travels on: memcached fixes a connection's protocol
/// with its first byte, so binary requests need connections of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Wire {
    Text,
    Binary,
    /// Redis's protocol, on a Redis pool's connections: RESP2, and RESP3 for clients that
    /// asked for it (`HELLO 3`), whose replies differ.
    Resp,
    Resp3,
}

impl Wire {
    pub fn is_resp(self) -> bool {
        matches!(self, Wire::Resp | Wire::Resp3)
    }
}

/// The bytes of one part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bytes {
    /// The client's request, unchanged.
    Request,
    /// A request the proxy wrote (a split multi-get's share of the keys).
    Owned(Vec<u8>),
}

/// One request to one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub server: usize,
    pub wire: Wire,
    pub bytes: Bytes,
    pub kind: ReplyKind,
    /// The request may get no reply (noreply, meta `q`, a quiet binary opcode): a no-op is sent
    /// after it, and whatever arrives before the no-op's reply is this request's reply.
    pub sentinel: bool,
}

/// How the replies of the parts become the client's reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Combine {
    /// One part; its reply as it is.
    Single,
    /// A text multi-get split across servers: the items are put back in the client's key order
    /// and one `END` closes the reply.
    Merge(MergeKeys),
    /// As [`Combine::Merge`], where the keys of part [`CACHE_PART`] were answered by the
    /// cache: `cached` is their reply (`VALUE` items in the client's order, then `END`).
    MergeCached { keys: MergeKeys, cached: Vec<u8> },
    /// Sent to every server: the common reply if all agree, else the first that differs from
    /// `OK` (an error).
    Same,
    /// A write sent to every replica of its key, owner first: the common reply if all agree,
    /// else the first error reply (`ERROR`, `CLIENT_ERROR`, `SERVER_ERROR`, a binary status of
    /// 0x80 or more), else the owner's. A replica that fails makes the reply that failure's
    /// error, as for any part. The last `extra` parts (deletes of the key from the server that
    /// held it before a server warming up took it) are not part of the reply.
    Replicated { extra: usize },
    /// A `get` of one key whose owner warms up (part 0), with `mg <key> v f t` to the server
    /// that held the key before (part 1): the owner's reply, unless it misses; then the other
    /// server's item, as a `get` reply for `key` (and the proxy stores it on the owner).
    WarmUp { key: Vec<u8> },
    /// `stats` sent to every server: the replies are added up.
    StatsText,
    /// Binary `STAT` sent to every server: the replies are added up.
    StatsBinary { opaque: u32 },
    /// These bytes, whatever the servers said or whether they answered.
    Fixed(Vec<u8>),
    /// A Redis command's parts.
    Redis(RedisMerge),
}

/// How the replies of a Redis command's parts become its client's reply. A part that failed
/// makes the reply `-ERR` and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisMerge {
    /// One part: its reply as it is.
    Single,
    /// A split `MGET`: per client key, in order, the part that asked for it; each part's
    /// array gives its keys' values in the order it asked for them.
    Array(Vec<u16>),
    /// A split `DEL` and kin: the counts added up.
    Sum,
    /// A split `MSET`: `OK` once every part has said it, else the first other reply.
    AllOk,
}

/// The client's keys of a split multi-get, in order, each with the part that asked for it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MergeKeys {
    bytes: Vec<u8>,
    /// Per key: its part and where it ends in `bytes`.
    keys: Vec<(u16, u32)>,
}

impl MergeKeys {
    fn push(&mut self, part: usize, key: &[u8]) {
        self.bytes.extend_from_slice(key);
        self.keys.push((part as u16, self.bytes.len() as u32));
    }

    /// The keys in the client's order, each with its part.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &[u8])> + '_ {
        let mut start = 0;
        self.keys.iter().map(move |&(part, end)| {
            let key = &self.bytes[start..end as usize];
            start = end as usize;
            (usize::from(part), key)
        })
    }
}

/// The part number a [`MergeKeys`] gives the keys that the cache answered.
pub const CACHE_PART: usize = u16::MAX as usize;

/// What to send the client when a part cannot be answered by its server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OnError {
    pub protocol: Protocol,
    /// Binary: the request's opcode and opaque, echoed in the error packet.
    pub opcode: u8,
    pub opaque: u32,
    /// A text `noreply` request: the client reads no reply, so errors are not sent either.
    pub silent: bool,
}

/// The plan for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Answer at once with these bytes (empty: nothing).
    Local(Vec<u8>),
    /// Send the parts; combine their replies.
    Forward {
        parts: Vec<Part>,
        combine: Combine,
        on_error: OnError,
    },
    /// Answer with these bytes (possibly none), then close the connection.
    Close(Vec<u8>),
}

/// Where keys go and which servers are up, as the worker sees them now.
pub trait Router {
    /// The server that owns `key`; `None` if no server is available.
    fn locate(&mut self, key: &[u8]) -> Option<usize>;
    /// Servers that are in the ring now, in configuration order.
    fn live(&self) -> Vec<usize>;
    /// The live servers that keep `key`, owner first, into `out` (cleared first): more than
    /// one in a replicated pool. Empty if no server is available.
    fn replicas(&mut self, key: &[u8], out: &mut Vec<usize>) {
        out.clear();
        out.extend(self.locate(key));
    }
    /// When `key`'s owner warms up: the owner and the server that held the key before.
    fn warm_source(&mut self, _key: &[u8]) -> Option<(usize, usize)> {
        None
    }
}

/// The reply memcached 1.6 gives `shutdown` when it was not started with `-A`.
pub const SHUTDOWN_REPLY: &[u8] = b"ERROR: shutdown not enabled\r\n";
/// The text the proxy sends for a write that compares a cas unique in a replicated pool: each
/// replica has its own uniques, so the comparison could succeed on some and fail on others.
pub const REPLICATED_CAS: &str = "cas is not supported by a replicated pool";
/// The text the proxy sends when no server can take a request.
pub const NO_SERVER: &str = "no server available";

/// Plans `request`, read from a client connection of `protocol`.
pub fn plan(request: &Request<'_>, router: &mut dyn Router) -> Plan {
    match request.protocol {
        Protocol::Binary => plan_binary(request, router),
        Protocol::Text | Protocol::Meta => plan_text(request, router),
    }
}

pub(crate) fn on_error(request: &Request<'_>) -> OnError {
    let (opcode, opaque) = match request.command {
        Command::Binary(op) => (op, request.opaque().unwrap_or(0)),
        _ => (0, 0),
    };
    OnError {
        protocol: request.protocol,
        opcode,
        opaque,
        silent: request.protocol == Protocol::Text && request.noreply(),
    }
}

fn single(request: &Request<'_>, server: usize, wire: Wire, kind: ReplyKind) -> Plan {
    Plan::Forward {
        parts: vec![Part {
            server,
            wire,
            bytes: Bytes::Request,
            kind,
            sentinel: request.noreply(),
        }],
        combine: Combine::Single,
        on_error: on_error(request),
    }
}

/// A keyed request: a write goes to every replica of `key`, anything else to its owner.
fn keyed(
    request: &Request<'_>,
    key: &[u8],
    router: &mut dyn Router,
    wire: Wire,
    kind: ReplyKind,
) -> Plan {
    let write = request.command.is_write() && !request.command.is_retrieval();
    if !write {
        return match router.locate(key) {
            Some(server) => single(request, server, wire, kind),
            None => no_server(request),
        };
    }
    let mut servers = Vec::new();
    router.replicas(key, &mut servers);
    if servers.len() > 1 && request.compares_cas() {
        let mut out = Vec::new();
        error_reply(&on_error(request), REPLICATED_CAS, &mut out);
        return Plan::Local(out);
    }
    // While the owner warms up, the write also deletes the key where it was before, so that
    // a later miss on the owner cannot read the value this write replaced there.
    // Not on a server that keeps the key anyway: a replica's copy is the write's own.
    let before = router
        .warm_source(key)
        .map(|(_, before)| before)
        .filter(|before| !servers.contains(before));
    match (&servers[..], before) {
        ([], _) => no_server(request),
        ([server], None) => single(request, *server, wire, kind),
        _ => {
            let mut parts: Vec<Part> = servers
                .iter()
                .map(|&server| Part {
                    server,
                    wire,
                    bytes: Bytes::Request,
                    kind,
                    sentinel: request.noreply(),
                })
                .collect();
            let extra = usize::from(before.is_some());
            if let Some(before) = before {
                parts.push(binary_delete(before, key));
            }
            Plan::Forward {
                parts,
                combine: Combine::Replicated { extra },
                on_error: on_error(request),
            }
        }
    }
}

/// A quiet binary delete of `key` on `server` (binary, so that any key bytes go as they are).
fn binary_delete(server: usize, key: &[u8]) -> Part {
    let mut bytes = Vec::with_capacity(HEADER_LEN + key.len());
    wire::memcache::binary::write_request(opcode::DELETEQ, key, b"", b"", 0, 0, &mut bytes);
    Part {
        server,
        wire: Wire::Binary,
        bytes: Bytes::Owned(bytes),
        kind: ReplyKind::Binary,
        sentinel: true,
    }
}

/// A text `get` of one key whose owner warms up: asked of the owner and, with `mg`, of the
/// server that held the key before (see [`Combine::WarmUp`]).
fn warm_get(request: &Request<'_>, router: &mut dyn Router) -> Option<Plan> {
    if request.command != Command::Get || request.key_count() != 1 {
        return None;
    }
    let key = request.key()?;
    let (owner, before) = router.warm_source(key)?;
    let mut mg = Vec::with_capacity(key.len() + 16);
    mg.extend_from_slice(b"mg ");
    mg.extend_from_slice(key);
    mg.extend_from_slice(b" v f t\r\n");
    Some(Plan::Forward {
        parts: vec![
            Part {
                server: owner,
                wire: Wire::Text,
                bytes: Bytes::Request,
                kind: ReplyKind::Retrieval,
                sentinel: false,
            },
            Part {
                server: before,
                wire: Wire::Text,
                bytes: Bytes::Owned(mg),
                kind: ReplyKind::Meta,
                sentinel: false,
            },
        ],
        combine: Combine::WarmUp { key: key.to_vec() },
        on_error: on_error(request),
    })
}

fn no_server(request: &Request<'_>) -> Plan {
    let mut out = Vec::new();
    error_reply(&on_error(request), NO_SERVER, &mut out);
    Plan::Local(out)
}

/// The key a request is placed by: meta base64 keys are decoded, as memcached stores the item
/// under the decoded bytes.
fn placed<'k>(request: &Request<'k>, scratch: &'k mut [u8; MAX_KEY_LEN]) -> Option<&'k [u8]> {
    request.stored_key(request.key()?, scratch).ok()
}

fn plan_text(request: &Request<'_>, router: &mut dyn Router) -> Plan {
    let kind = ReplyKind::of(request);
    match request.command {
        Command::Get | Command::Gets | Command::Gat | Command::Gats => {
            warm_get(request, router).unwrap_or_else(|| plan_multiget(request, router))
        }
        Command::MetaNoop => Plan::Local(b"MN\r\n".to_vec()),
        Command::Quit => Plan::Close(Vec::new()),
        Command::Shutdown => Plan::Local(SHUTDOWN_REPLY.to_vec()),
        Command::Version => match router.live().first() {
            Some(&server) => single(request, server, Wire::Text, kind),
            None => no_server(request),
        },
        // Settings and connections describe one process: summing them means nothing.
        Command::Stats if stats_group(request.bytes(), &[b"settings", b"conns"]) => {
            match router.live().first() {
                Some(&server) => single(request, server, Wire::Text, kind),
                None => no_server(request),
            }
        }
        Command::Stats => broadcast(request, router, Wire::Text, Combine::StatsText),
        // Streams with no end that one reply could frame: refused rather than let one client
        // tie up a connection that others share.
        Command::Misc if streams(request.bytes()) => {
            let mut out = Vec::new();
            error_reply(&on_error(request), UNSUPPORTED, &mut out);
            Plan::Local(out)
        }
        Command::FlushAll | Command::Verbosity | Command::Misc => {
            broadcast(request, router, Wire::Text, Combine::Same)
        }
        _ => {
            let mut scratch = [0u8; MAX_KEY_LEN];
            let Some(key) = placed(request, &mut scratch) else {
                return no_server(request);
            };
            keyed(request, key, router, Wire::Text, kind)
        }
    }
}

/// The words of a command line: the command's name, then its arguments, of what memcached
/// reads of the line (a NUL ends it).
fn words(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    let line = wire::memcache::line_content(line);
    line.split(|&b| b == b' ' || b == b'\r' || b == b'\n')
        .filter(|t| !t.is_empty())
}

/// The text the proxy answers a command it does not pass on with.
pub const UNSUPPORTED: &str = "command not supported by the proxy";

/// Whether an administrative command answers with a stream rather than one reply: `watch`,
/// `lru_crawler metadump` and `lru_crawler mgdump`.
fn streams(line: &[u8]) -> bool {
    let mut tokens = words(line);
    matches!(
        (tokens.next(), tokens.next()),
        (Some(b"watch"), _) | (Some(b"lru_crawler"), Some(b"metadump" | b"mgdump"))
    )
}

/// Whether a text `stats` line asks for one of `groups`.
fn stats_group(line: &[u8], groups: &[&[u8]]) -> bool {
    let mut tokens = words(line);
    tokens.next();
    tokens.next().is_some_and(|group| groups.contains(&group))
}

fn broadcast(request: &Request<'_>, router: &mut dyn Router, wire: Wire, combine: Combine) -> Plan {
    let kind = ReplyKind::of(request);
    let parts: Vec<Part> = router
        .live()
        .into_iter()
        .map(|server| Part {
            server,
            wire,
            bytes: Bytes::Request,
            kind,
            sentinel: request.noreply(),
        })
        .collect();
    if parts.is_empty() {
        return no_server(request);
    }
    Plan::Forward {
        parts,
        combine,
        on_error: on_error(request),
    }
}

fn plan_multiget(request: &Request<'_>, router: &mut dyn Router) -> Plan {
    plan_multiget_with(request, None, router)
}

/// Plans a text multi-get some of whose keys the cache answered: `hits` says which, in the
/// client's key order, and `cached` is the cache's reply for them (`VALUE` items in the
/// client's order, then `END`). The other keys go to their servers, and the reply merges both
/// in the client's order.
pub fn plan_multiget_cached(
    request: &Request<'_>,
    hits: &[bool],
    cached: Vec<u8>,
    router: &mut dyn Router,
) -> Plan {
    plan_multiget_with(request, Some((hits, cached)), router)
}

fn plan_multiget_with(
    request: &Request<'_>,
    cached: Option<(&[bool], Vec<u8>)>,
    router: &mut dyn Router,
) -> Plan {
    let mut servers: Vec<usize> = Vec::new();
    let mut order: Vec<u16> = Vec::with_capacity(request.key_count());
    let mut merge = MergeKeys::default();
    let hits = cached.as_ref().map_or(&[][..], |(h, _)| h);
    for (i, key) in request.keys().enumerate() {
        if hits.get(i).copied().unwrap_or(false) {
            order.push(CACHE_PART as u16);
            merge.push(CACHE_PART, key);
            continue;
        }
        let Some(server) = router.locate(key) else {
            return no_server(request);
        };
        let part = match servers.iter().position(|&s| s == server) {
            Some(p) => p,
            None => {
                servers.push(server);
                servers.len() - 1
            }
        };
        order.push(part as u16);
        merge.push(part, key);
    }
    match (servers.len(), &cached) {
        // `gat <exptime>` with no key: memcached finds nothing and says so.
        (0, None) => return Plan::Local(b"END\r\n".to_vec()),
        (0, Some((_, reply))) => return Plan::Local(reply.clone()),
        (1, None) => return single(request, servers[0], Wire::Text, ReplyKind::Retrieval),
        _ => {}
    }
    let parts = servers
        .iter()
        .enumerate()
        .map(|(p, &server)| {
            let keys = request
                .keys()
                .zip(order.iter())
                .filter(|(_, &owner)| usize::from(owner) == p)
                .map(|(key, _)| key);
            let mut bytes = Vec::with_capacity(64);
            // Only the four retrieval commands reach here, which it always writes.
            let _ =
                write_retrieval_request(request.command, request.exptime_token(), keys, &mut bytes);
            Part {
                server,
                wire: Wire::Text,
                bytes: Bytes::Owned(bytes),
                kind: ReplyKind::Retrieval,
                sentinel: false,
            }
        })
        .collect();
    let combine = match cached {
        Some((_, cached)) => Combine::MergeCached {
            keys: merge,
            cached,
        },
        None => Combine::Merge(merge),
    };
    Plan::Forward {
        parts,
        combine,
        on_error: on_error(request),
    }
}

fn plan_binary(request: &Request<'_>, router: &mut dyn Router) -> Plan {
    let Command::Binary(op) = request.command else {
        return no_server(request);
    };
    let opaque = request.opaque().unwrap_or(0);
    let kind = ReplyKind::of(request);
    match op {
        opcode::NOOP => {
            let mut out = Vec::with_capacity(HEADER_LEN);
            write_response(op, status::NO_ERROR, opaque, b"", b"", &mut out);
            Plan::Local(out)
        }
        opcode::QUIT => {
            let mut out = Vec::with_capacity(HEADER_LEN);
            write_response(op, status::NO_ERROR, opaque, b"", b"", &mut out);
            Plan::Close(out)
        }
        opcode::QUITQ => Plan::Close(Vec::new()),
        opcode::STAT => broadcast(
            request,
            router,
            Wire::Binary,
            Combine::StatsBinary { opaque },
        ),
        opcode::FLUSH | opcode::FLUSHQ | opcode::VERBOSITY => {
            broadcast(request, router, Wire::Binary, Combine::Same)
        }
        _ if opcode::has_key(op) => match request.key() {
            Some(key) => keyed(request, key, router, Wire::Binary, kind),
            None => no_server(request),
        },
        // A client's SASL would authenticate a server connection every client shares: the
        // proxy answers as memcached without SASL does (with SASL towards the servers,
        // `crate::sasl` answers before this).
        opcode::SASL_LIST_MECHS | opcode::SASL_AUTH | opcode::SASL_STEP => {
            let mut out = Vec::with_capacity(HEADER_LEN);
            write_error(op, status::UNKNOWN_COMMAND, opaque, &mut out);
            Plan::Local(out)
        }
        // VERSION: the first server answers.
        _ => match router.live().first() {
            Some(&server) => single(request, server, Wire::Binary, kind),
            None => no_server(request),
        },
    }
}

/// The plan for a refused `set`: drop the item it would have replaced from its server (every
/// replica of it), as memcached does, then answer with the refusal.
pub fn unlink(refused: Refused, binary: bool, router: &mut dyn Router) -> Plan {
    let Some(key) = refused.unlink else {
        return Plan::Local(refused.reply);
    };
    let mut servers = Vec::new();
    router.replicas(&key, &mut servers);
    if servers.is_empty() {
        return Plan::Local(refused.reply);
    }
    let (wire, bytes, kind) = if binary {
        let mut bytes = Vec::with_capacity(HEADER_LEN + key.len());
        wire::memcache::binary::write_request(opcode::DELETEQ, &key, b"", b"", 0, 0, &mut bytes);
        (Wire::Binary, bytes, ReplyKind::Binary)
    } else {
        let mut bytes = Vec::with_capacity(key.len() + 20);
        bytes.extend_from_slice(b"delete ");
        bytes.extend_from_slice(&key);
        bytes.extend_from_slice(b" noreply\r\n");
        (Wire::Text, bytes, ReplyKind::Line)
    };
    Plan::Forward {
        parts: servers
            .into_iter()
            .map(|server| Part {
                server,
                wire,
                bytes: Bytes::Owned(bytes.clone()),
                kind,
                sentinel: true,
            })
            .collect(),
        combine: Combine::Fixed(refused.reply),
        on_error: OnError {
            protocol: if binary {
                Protocol::Binary
            } else {
                Protocol::Text
            },
            opcode: 0,
            opaque: 0,
            silent: true,
        },
    }
}

/// What a text request's command line becomes before it is sent on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compact {
    Unchanged,
    /// The request with its line rewritten to single spaces and no NUL tail.
    Compacted(Vec<u8>),
    /// Longer than memcached takes even so.
    TooLong,
}

/// memcached closes a connection on which a command line (other than `get` and `gets`) runs
/// past [`MAX_LINE_LEN`] bytes before its end has been read, and it reads in chunks: a long
/// line sent down a shared server connection could close it for every client. A longer line
/// is rewritten as memcached reads it (its tokens joined by single spaces, nothing after a
/// NUL), which means the same to memcached; one still too long is refused.
pub fn compact_long_line(request: &Request<'_>) -> Compact {
    let bytes = request.bytes();
    if request.protocol == Protocol::Binary {
        return Compact::Unchanged;
    }
    let Some(line_len) = wire::memcache::line_len(bytes) else {
        return Compact::Unchanged;
    };
    if line_len <= MAX_LINE_LEN || matches!(request.command, Command::Get | Command::Gets) {
        return Compact::Unchanged;
    }
    let line = wire::memcache::line_content(&bytes[..line_len]);
    let mut out: Vec<u8> = Vec::with_capacity(bytes.len().min(MAX_LINE_LEN) + 64);
    let tokens = line.split(|&b| b == b' ').filter(|t| !t.is_empty());
    for (i, word) in tokens.enumerate() {
        if i > 0 {
            out.push(b' ');
        }
        out.extend_from_slice(word);
    }
    out.extend_from_slice(b"\r\n");
    if out.len() > MAX_LINE_LEN {
        return Compact::TooLong;
    }
    out.extend_from_slice(&bytes[line_len..]);
    Compact::Compacted(out)
}

/// Binary status the proxy answers with when a server fails a request ("internal error").
pub const STATUS_PROXY_ERROR: u16 = 0x0084;

/// Appends the proxy's error reply for a request that its server could not answer.
pub fn error_reply(on: &OnError, message: impl fmt::Display, out: &mut Vec<u8>) {
    if on.silent {
        return;
    }
    match on.protocol {
        Protocol::Binary => {
            let body = format!("SERVER_ERROR {message}");
            write_response(
                on.opcode,
                STATUS_PROXY_ERROR,
                on.opaque,
                b"",
                body.as_bytes(),
                out,
            );
        }
        Protocol::Text | Protocol::Meta => {
            // Writing to a Vec cannot fail.
            let _ = write!(out, "SERVER_ERROR {message}\r\n");
        }
    }
}

/// What is sent after a part that may get no reply: a no-op whose reply marks the end.
pub fn sentinel(wire: Wire) -> &'static [u8] {
    const BINARY_NOOP: [u8; HEADER_LEN] = [
        0x80,
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
        0xff,
        0xff,
        0xff,
        0xff,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
    ];
    match wire {
        Wire::Text => b"mn\r\n",
        Wire::Binary => &BINARY_NOOP,
        Wire::Resp | Wire::Resp3 => b"",
    }
}

/// A storage request whose value is larger than the proxy forwards, refused as memcached
/// refuses it: the reply, the header bytes used, then the value bytes to throw away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub reply: Vec<u8>,
    pub consumed: usize,
    pub skip: usize,
    /// A `set` (text, or binary SET/SETQ) that memcached refuses also drops the item it would
    /// have replaced, so that no stale value outlives the failed write: its key.
    pub unlink: Option<Vec<u8>>,
}

/// memcached's reply to a text or meta storage request whose value does not fit an item.
pub const TOO_LARGE: &[u8] = b"SERVER_ERROR object too large for cache\r\n";

/// Checks an incomplete request at the front of `buf` (one the parser is waiting on) for a
/// value longer than `max`; such a request is refused at once instead of buffered.
pub fn too_large(buf: &[u8], max: usize, binary: bool) -> Option<Refused> {
    if binary {
        let header = wire::memcache::binary::Header::decode(buf)?;
        let storage = matches!(
            header.opcode,
            opcode::SET
                | opcode::ADD
                | opcode::REPLACE
                | opcode::APPEND
                | opcode::PREPEND
                | opcode::SETQ
                | opcode::ADDQ
                | opcode::REPLACEQ
                | opcode::APPENDQ
                | opcode::PREPENDQ
        );
        if !storage || header.value_len() <= max {
            return None;
        }
        let (key_start, key_end) = header.key_range();
        // Wait for the key: it names the item a refused SET drops.
        let key = buf.get(key_start..key_end)?;
        // memcached holds the value's length in an `int`: past 2^31 it is negative, refused
        // as too large with nothing thrown away, and the next request is read after the key.
        let value_len = header.value_len() as u32 as i32;
        let skip = if value_len < 0 {
            0
        } else {
            header.body_len as usize - (key_end - HEADER_LEN)
        };
        let unlink = matches!(header.opcode, opcode::SET | opcode::SETQ).then(|| key.to_vec());
        let mut reply = Vec::with_capacity(HEADER_LEN + 16);
        write_error(
            header.opcode,
            status::VALUE_TOO_LARGE,
            header.opaque,
            &mut reply,
        );
        return Some(Refused {
            reply,
            consumed: key_end,
            skip,
            unlink,
        });
    }
    let line = wire::memcache::line_len(buf)?;
    let text = buf[..line].strip_suffix(b"\n")?;
    let text = text.strip_suffix(b"\r").unwrap_or(text);
    let mut tokens = text.split(|&b| b == b' ').filter(|t| !t.is_empty());
    let command = Command::from_name(tokens.next()?)?;
    let tokens: Vec<&[u8]> = tokens.collect();
    let (at, quiet) = match command {
        Command::Set
        | Command::Add
        | Command::Replace
        | Command::Append
        | Command::Prepend
        | Command::Cas => (3, tokens.last() == Some(&&b"noreply"[..])),
        // The meta `q` flag hides only the success reply; errors are still sent.
        Command::MetaSet => (1, false),
        _ => return None,
    };
    // Read as the parser and memcached read it (a length past 32 bits wraps).
    let len = wire::memcache::data_len(&buf[..line])?;
    if tokens.get(at).is_none() || len <= max {
        return None;
    }
    Some(Refused {
        reply: if quiet {
            Vec::new()
        } else {
            TOO_LARGE.to_vec()
        },
        consumed: line,
        skip: len.saturating_add(2),
        // memcached drops the old item of a refused `set`, and of a refused `ms` whatever its
        // mode (a base64 key is left alone: its stored form is not the token).
        unlink: (command == Command::Set
            || (command == Command::MetaSet
                && !tokens.iter().skip(2).any(|t| t.first() == Some(&b'b'))))
        .then(|| tokens[0].to_vec()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::memcache::parse;

    /// Keys starting with `a` live on server 0, `b` on 1, anything else on 2; with
    /// `replicated`, each also on the next server; with `warming`, server 2 warms up, its keys
    /// held by 0 before.
    #[derive(Default)]
    struct ByLetter {
        live: Vec<usize>,
        replicated: bool,
        warming: bool,
    }

    impl Router for ByLetter {
        fn locate(&mut self, key: &[u8]) -> Option<usize> {
            let want = match key.first() {
                Some(b'a') => 0,
                Some(b'b') => 1,
                _ => 2,
            };
            self.live.contains(&want).then_some(want)
        }

        fn live(&self) -> Vec<usize> {
            self.live.clone()
        }

        fn replicas(&mut self, key: &[u8], out: &mut Vec<usize>) {
            out.clear();
            out.extend(self.locate(key));
            if self.replicated {
                out.extend(out.first().map(|s| (s + 1) % 3));
            }
        }

        fn warm_source(&mut self, key: &[u8]) -> Option<(usize, usize)> {
            (self.warming && self.locate(key) == Some(2)).then_some((2, 0))
        }
    }

    fn plan_of(bytes: &[u8]) -> Plan {
        let request = parse(bytes).unwrap().unwrap();
        plan(
            &request,
            &mut ByLetter {
                live: vec![0, 1, 2],
                ..ByLetter::default()
            },
        )
    }

    fn parts_of(plan: &Plan) -> &[Part] {
        parts(plan)
    }

    fn parts(plan: &Plan) -> &[Part] {
        match plan {
            Plan::Forward { parts, .. } => parts,
            other => panic!("not forwarded: {other:?}"),
        }
    }

    #[test]
    fn writes_go_to_every_replica_and_reads_to_the_owner() {
        let mut router = ByLetter {
            live: vec![0, 1, 2],
            replicated: true,
            ..ByLetter::default()
        };
        let mut plan_of = |bytes: &[u8]| plan(&parse(bytes).unwrap().unwrap(), &mut router);
        for write in [
            &b"set b1 0 0 1\r\nx\r\n"[..],
            b"delete b1 noreply\r\n",
            b"incr b1 1\r\n",
            b"ms b1 1 q\r\nx\r\n",
        ] {
            let p = plan_of(write);
            let Plan::Forward { parts, combine, .. } = &p else {
                panic!("{p:?}");
            };
            let servers: Vec<usize> = parts.iter().map(|p| p.server).collect();
            assert_eq!(servers, [1, 2], "{:?}", String::from_utf8_lossy(write));
            assert_eq!(*combine, Combine::Replicated { extra: 0 });
            assert!(parts.iter().all(|p| p.bytes == Bytes::Request));
            assert!(parts.iter().all(|p| p.sentinel == parts[0].sentinel));
        }
        let mut set = vec![0x80, opcode::SET, 0, 2, 8, 0, 0, 0, 0, 0, 0, 11, 0, 0, 0, 0];
        set.extend_from_slice(&[0; 16]);
        set.extend_from_slice(b"a1x");
        assert_eq!(parts(&plan_of(&set)).len(), 2);
        for cas in [&b"cas b1 0 0 1 7\r\nx\r\n"[..], b"md b1 C7\r\n"] {
            assert_eq!(
                plan_of(cas),
                Plan::Local(b"SERVER_ERROR cas is not supported by a replicated pool\r\n".to_vec())
            );
        }
        for read in [&b"get b1\r\n"[..], b"mg b1 v\r\n", b"gat 0 b1\r\n"] {
            let p = plan_of(read);
            let servers: Vec<usize> = parts(&p).iter().map(|p| p.server).collect();
            assert_eq!(servers, [1], "{:?}", String::from_utf8_lossy(read));
        }
    }

    #[test]
    fn a_get_on_a_server_warming_up_also_asks_where_the_key_was() {
        let mut router = ByLetter {
            live: vec![0, 1, 2],
            warming: true,
            ..ByLetter::default()
        };
        let mut plan_of = |bytes: &[u8]| plan(&parse(bytes).unwrap().unwrap(), &mut router);
        let p = plan_of(b"get c1\r\n");
        let Plan::Forward { parts, combine, .. } = &p else {
            panic!("{p:?}");
        };
        assert_eq!((parts[0].server, parts[1].server), (2, 0));
        assert_eq!(parts[1].bytes, Bytes::Owned(b"mg c1 v f t\r\n".to_vec()));
        assert_eq!(
            *combine,
            Combine::WarmUp {
                key: b"c1".to_vec()
            }
        );
        // Not warming, or several keys: as ever.
        assert_eq!(parts_of(&plan_of(b"get a1\r\n")).len(), 1);
        assert!(parts_of(&plan_of(b"get c1 c2\r\n"))
            .iter()
            .all(|p| p.server == 2));
        // A write also deletes the key where it was.
        let p = plan_of(b"set c1 0 0 1\r\nx\r\n");
        let Plan::Forward { parts, combine, .. } = &p else {
            panic!("{p:?}");
        };
        assert_eq!((parts[0].server, parts[1].server), (2, 0));
        assert_eq!((parts[1].wire, parts[1].sentinel), (Wire::Binary, true));
        assert_eq!(*combine, Combine::Replicated { extra: 1 });

        let on_error = on_error(&parse(b"get c1\r\n").unwrap().unwrap());
        let warm = Combine::WarmUp {
            key: b"c1".to_vec(),
        };
        let answer = |owner: &[u8], before: &[u8]| {
            let mut outcomes: Vec<crate::combine::Outcome> =
                vec![Ok(owner.to_vec()), Ok(before.to_vec())];
            let fill = crate::combine::warm_fill(&warm, &outcomes);
            let mut out = Vec::new();
            crate::combine::combine(&warm, &on_error, &mut outcomes, &mut out);
            (
                String::from_utf8(out).unwrap(),
                fill.map(|f| String::from_utf8(f).unwrap()),
            )
        };
        let hit = "VALUE c1 3 2\r\nhi\r\nEND\r\n";
        assert_eq!(answer(hit.as_bytes(), b"EN\r\n"), (hit.into(), None));
        assert_eq!(
            answer(b"END\r\n", b"VA 2 f3 t-1\r\nhi\r\n"),
            (hit.into(), Some("add c1 3 0 2 noreply\r\nhi\r\n".into()))
        );
        assert_eq!(
            answer(b"END\r\n", b"VA 2 f3 t90\r\nhi\r\n").1,
            Some("add c1 3 90 2 noreply\r\nhi\r\n".into())
        );
        assert_eq!(answer(b"END\r\n", b"EN\r\n"), ("END\r\n".into(), None));
        assert_eq!(
            answer(b"END\r\n", b"VA 9 f3\r\nhi\r\n"),
            ("END\r\n".into(), None)
        );
    }

    #[test]
    fn a_replicated_write_answers_as_all_agree_or_with_the_first_error() {
        let on_error = OnError {
            protocol: Protocol::Text,
            opcode: 0,
            opaque: 0,
            silent: false,
        };
        let combined = |outcomes: &[&[u8]]| {
            let mut outcomes: Vec<crate::combine::Outcome> =
                outcomes.iter().map(|o| Ok(o.to_vec())).collect();
            let mut out = Vec::new();
            crate::combine::combine(
                &Combine::Replicated { extra: 0 },
                &on_error,
                &mut outcomes,
                &mut out,
            );
            out
        };
        assert_eq!(combined(&[b"STORED\r\n", b"STORED\r\n"]), b"STORED\r\n");
        assert_eq!(
            combined(&[b"STORED\r\n", b"SERVER_ERROR out of memory\r\n"]),
            b"SERVER_ERROR out of memory\r\n"
        );
        assert_eq!(
            combined(&[b"DELETED\r\n", b"NOT_FOUND\r\n"]),
            b"DELETED\r\n"
        );
        assert_eq!(combined(&[b"", b""]), b"");
        let mut outcomes = vec![
            Ok(b"STORED\r\n".to_vec()),
            Err(crate::backend::ServerError::Timeout),
        ];
        let mut out = Vec::new();
        crate::combine::combine(
            &Combine::Replicated { extra: 0 },
            &on_error,
            &mut outcomes,
            &mut out,
        );
        assert!(
            out.starts_with(b"SERVER_ERROR"),
            "{}",
            String::from_utf8_lossy(&out)
        );
    }

    #[test]
    fn a_single_key_goes_whole_to_its_server() {
        let p = plan_of(b"set b1 0 0 1\r\nx\r\n");
        let parts = parts(&p);
        assert_eq!(parts.len(), 1);
        assert_eq!(
            (parts[0].server, parts[0].bytes.clone()),
            (1, Bytes::Request)
        );
        assert!(!parts[0].sentinel);
        assert_eq!(parts[0].kind, ReplyKind::Line);
    }

    #[test]
    fn quiet_requests_carry_a_sentinel() {
        for bytes in [
            &b"set a 0 0 1 noreply\r\nx\r\n"[..],
            b"mg a v q\r\n",
            b"md b q\r\n",
        ] {
            let p = plan_of(bytes);
            assert!(
                parts(&p)[0].sentinel,
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
        }
        let mut getq = vec![0x80, opcode::GETQ, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 7];
        getq.extend_from_slice(&[0; 8]);
        getq.push(b'c');
        let p = plan_of(&getq);
        assert_eq!(parts(&p)[0].server, 2);
        assert!(parts(&p)[0].sentinel);
        assert_eq!(parts(&p)[0].wire, Wire::Binary);
    }

    #[test]
    fn a_multiget_is_split_in_key_order() {
        let p = plan_of(b"gets a1 b1 a2 c1 b1\r\n");
        let Plan::Forward {
            parts: split,
            combine,
            ..
        } = &p
        else {
            panic!("{p:?}")
        };
        let sent: Vec<(usize, Bytes)> = split.iter().map(|p| (p.server, p.bytes.clone())).collect();
        assert_eq!(
            sent,
            vec![
                (0, Bytes::Owned(b"gets a1 a2\r\n".to_vec())),
                (1, Bytes::Owned(b"gets b1 b1\r\n".to_vec())),
                (2, Bytes::Owned(b"gets c1\r\n".to_vec())),
            ]
        );
        let Combine::Merge(keys) = combine else {
            panic!("{combine:?}")
        };
        let order: Vec<(usize, &[u8])> = keys.iter().collect();
        assert_eq!(
            order,
            vec![
                (0, &b"a1"[..]),
                (1, b"b1"),
                (0, b"a2"),
                (2, b"c1"),
                (1, b"b1")
            ]
        );
        // All keys on one server: forwarded unchanged.
        let p = plan_of(b"gat 10 a1 a2\r\n");
        assert_eq!(parts(&p)[0].bytes, Bytes::Request);
    }

    #[test]
    fn broadcasts_reach_every_live_server() {
        let request = parse(b"flush_all\r\n").unwrap().unwrap();
        let p = plan(
            &request,
            &mut ByLetter {
                live: vec![0, 2],
                ..ByLetter::default()
            },
        );
        let servers: Vec<usize> = parts(&p).iter().map(|p| p.server).collect();
        assert_eq!(servers, vec![0, 2]);
        assert!(matches!(
            p,
            Plan::Forward {
                combine: Combine::Same,
                ..
            }
        ));
        assert!(matches!(
            plan_of(b"stats\r\n"),
            Plan::Forward {
                combine: Combine::StatsText,
                ..
            }
        ));
    }

    #[test]
    fn long_lines_are_sent_as_memcached_reads_them() {
        let long = format!("mg a\r{} v{}\r\n", " ".repeat(3000), " ".repeat(100));
        let request = parse(long.as_bytes()).unwrap().unwrap();
        assert_eq!(
            compact_long_line(&request),
            Compact::Compacted(b"mg a\r v\r\n".to_vec())
        );
        let set = format!("set k{} 0 0 2\r\nhi\r\n", " ".repeat(3000));
        let request = parse(set.as_bytes()).unwrap().unwrap();
        assert_eq!(
            compact_long_line(&request),
            Compact::Compacted(b"set k 0 0 2\r\nhi\r\n".to_vec())
        );
        let number = format!("mg a T{}1\r\n", "0".repeat(3000));
        let request = parse(number.as_bytes()).unwrap().unwrap();
        assert_eq!(compact_long_line(&request), Compact::TooLong);
        let request = parse(b"mg a v\r\n").unwrap().unwrap();
        assert_eq!(compact_long_line(&request), Compact::Unchanged);
    }

    #[test]
    fn local_answers() {
        assert_eq!(plan_of(b"mn\r\n"), Plan::Local(b"MN\r\n".to_vec()));
        assert_eq!(plan_of(b"quit\r\n"), Plan::Close(Vec::new()));
        assert_eq!(
            plan_of(b"shutdown\r\n"),
            Plan::Local(SHUTDOWN_REPLY.to_vec())
        );
        let mut noop = vec![0x80, opcode::NOOP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4];
        noop.extend_from_slice(&[0; 8]);
        let Plan::Local(reply) = plan_of(&noop) else {
            panic!()
        };
        assert_eq!(&reply[..2], &[0x81, opcode::NOOP]);
        assert_eq!(&reply[12..16], &[1, 2, 3, 4]);
        // A client's SASL never reaches the connections every client shares.
        let mut auth = Vec::new();
        wire::memcache::binary::write_request(
            opcode::SASL_AUTH,
            b"PLAIN",
            b"",
            b"\0u\0p",
            7,
            0,
            &mut auth,
        );
        let Plan::Local(reply) = plan_of(&auth) else {
            panic!()
        };
        let header = wire::memcache::binary::Header::decode(&reply).unwrap();
        assert_eq!(header.vbucket_or_status, status::UNKNOWN_COMMAND);
    }

    #[test]
    fn streams_are_refused_however_the_line_ends() {
        let refused = Plan::Local(format!("SERVER_ERROR {UNSUPPORTED}\r\n").into_bytes());
        for line in [
            &b"watch\r\n"[..],
            b"watch\0x\r\n",
            b"lru_crawler metadump\0 all\r\n",
        ] {
            assert_eq!(
                plan_of(line),
                refused,
                "{:?}",
                String::from_utf8_lossy(line)
            );
        }
    }

    #[test]
    fn no_server_is_an_immediate_error() {
        let request = parse(b"get a\r\n").unwrap().unwrap();
        let p = plan(
            &request,
            &mut ByLetter {
                live: vec![1],
                ..ByLetter::default()
            },
        );
        assert_eq!(
            p,
            Plan::Local(format!("SERVER_ERROR {NO_SERVER}\r\n").into_bytes())
        );
        let request = parse(b"set a 0 0 1 noreply\r\nx\r\n").unwrap().unwrap();
        let p = plan(
            &request,
            &mut ByLetter {
                live: vec![1],
                ..ByLetter::default()
            },
        );
        assert_eq!(p, Plan::Local(Vec::new()), "noreply clients read no errors");
    }

    #[test]
    fn oversized_values_are_refused_unbuffered() {
        let refused = too_large(b"set a 0 0 2000000\r\nxx", 1 << 20, false).unwrap();
        assert_eq!(refused.reply, TOO_LARGE);
        assert_eq!(refused.consumed, b"set a 0 0 2000000\r\n".len());
        assert_eq!(refused.skip, 2_000_002);
        assert_eq!(refused.unlink, Some(b"a".to_vec()));
        let quiet = too_large(b"set a 0 0 2000000 noreply\r\n", 1 << 20, false).unwrap();
        assert!(quiet.reply.is_empty());
        assert_eq!(too_large(b"set a 0 0 2000\r\n", 1 << 20, false), None);
        assert_eq!(too_large(b"get a\r\n", 1 << 20, false), None);
        assert_eq!(
            too_large(b"ms a 3000000\r\n", 1 << 20, false)
                .unwrap()
                .reply,
            TOO_LARGE
        );
        let mut set = vec![0x80, opcode::SET, 0, 1, 8, 0, 0, 0];
        set.extend_from_slice(&(3_000_009u32).to_be_bytes());
        set.extend_from_slice(&[0, 0, 0, 9]);
        set.extend_from_slice(&[0; 8]);
        assert_eq!(too_large(&set, 1 << 20, true), None, "waits for the key");
        set.extend_from_slice(&[0; 8]);
        assert_eq!(too_large(&set, 1 << 20, true), None, "waits for the key");
        set.push(b'k');
        let refused = too_large(&set, 1 << 20, true).unwrap();
        assert_eq!(refused.unlink, Some(b"k".to_vec()));
        assert_eq!(refused.consumed, HEADER_LEN + 9);
        assert_eq!(refused.skip, 3_000_000);
        assert_eq!(&refused.reply[6..8], &[0, 3]);
        // A value length past 2^31 is negative to memcached: refused, nothing skipped.
        set[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
        let refused = too_large(&set, 1 << 20, true).unwrap();
        assert_eq!((refused.consumed, refused.skip), (HEADER_LEN + 9, 0));
        // A text length past 32 bits wraps as memcached reads it: 2^32 + 1 is one byte.
        assert_eq!(too_large(b"set a 0 0 4294967297\r\n", 1 << 20, false), None);
    }
}
