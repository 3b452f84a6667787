//! Connections from one worker to one server: requests from every client of the worker are
//! written down the same connection back to back (pipelined), and replies, which memcached
//! sends in request order, are matched to them in order.
//!
//! Many clients share a connection, so a reply handed to the wrong request would be handed to
//! the wrong client. Every batch of requests written ends with a sentinel that carries a
//! number the connection never used before (`mg` with an opaque on text connections, a binary
//! `NOOP` with that opaque on binary ones), and a batch's replies are handed over only once
//! its sentinel's reply comes exactly where it should. If a server ever reads the requests
//! otherwise than the proxy did (a data block taken for commands, a command taken for data),
//! the sentinel is missing or misplaced, and every request on the connection fails with the
//! proxy's `SERVER_ERROR` instead: the connection is dropped and made again.
//!
//! Redis connections ([`Wire::Resp`], [`Wire::Resp3`]) carry no sentinel: the proxy writes every command as a
//! multibulk it built itself, which a server cannot read otherwise, so the replies framed from
//! one read are handed over at once. A Redis pool's password and database are given to the server
//! (`AUTH`, `SELECT`) when the connection is made, before any client's command; a RESP3
//! connection says `HELLO 3` first, so that its replies are RESP3's.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::Notify;
use tokio::time::{sleep_until, timeout, Instant};
use wire::memcache::binary::{opcode, Header, HEADER_LEN};
use wire::memcache::reply::{Framer, ReplyError};

use super::plan::Wire;
use super::sasl::Sasl;
use super::stats::{add, get, sub, PoolStats};
use super::tls::ServerTls;

/// Where a request's reply goes: the client's reply in the making, which may be waiting on
/// the replies of several servers.
pub trait Awaiting {
    /// Whether a reply of `len` bytes, just framed, is to be kept (and counted against its
    /// client); one nobody will read is thrown away unheld.
    fn keep(&self, len: usize) -> bool;
    /// The outcome of part `part` of the request.
    fn complete(&self, part: usize, outcome: Result<Vec<u8>, ServerError>);
}

/// One request waiting for its reply.
pub struct Pending {
    pub slot: Rc<dyn Awaiting>,
    pub part: usize,
    /// Finds where the reply ends, resuming where it stopped as bytes arrive.
    pub framer: Framing,
    pub sentinel: bool,
    pub deadline: Instant,
    /// The reply, once framed, while its batch waits for its sentinel: copied out of the read
    /// buffer at once (and counted against its client), or left empty when nobody will read
    /// it (see [`Awaiting::keep`]).
    pub data: Vec<u8>,
    /// The last request of a batch: the batch sentinel with this number follows it.
    pub mark: Option<u64>,
    /// A text `stats` request: the reads the proxy's own sentinels made are taken out of it.
    pub stats: bool,
}

/// The framer of a reply, by the server's protocol.
pub enum Framing {
    Memcache(Framer),
    Resp(wire::resp::ReplyFramer),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No connection and no reason not to make one.
    Idle,
    /// Connecting or connected: requests queue.
    Open,
    /// The last attempt failed: requests fail at once until then.
    Down(Instant),
}

/// One connection (made on demand, remade after a failure) to one server.
pub struct Conn {
    pool: Arc<PoolStats>,
    server: usize,
    wire: Wire,
    addr: SocketAddr,
    source: Option<IpAddr>,
    /// TLS towards the server, when the proxy speaks it to servers.
    tls: Option<Arc<ServerTls>>,
    /// SASL towards the server, when it requires it: binary connections only.
    sasl: Option<Arc<Sasl>>,
    state: Cell<State>,
    /// Consecutive failures, for the reconnect backoff.
    streak: Cell<u32>,
    /// Bytes not yet written.
    out: RefCell<Vec<u8>>,
    /// Requests written or queued, oldest first.
    pending: RefCell<VecDeque<Pending>>,
    /// Wakes the writer: bytes to write.
    wake: Notify,
    /// Wakes the reader: a request arrived while none was pending, and has a deadline.
    first: Notify,
    /// The next batch sentinel's number; never repeats on a connection.
    nonce: Cell<u64>,
    /// Requests at the front of `pending` whose replies are framed and held for the sentinel.
    framed: Cell<usize>,
}

/// Why a request got no reply from its server: the connection it was on ended, or the server
/// was down when it was sent. The client reads the message after `SERVER_ERROR `.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ServerError {
    /// The server failed recently and is waiting out its backoff.
    #[error("server unavailable")]
    Unavailable,
    /// Connecting, writing or reading failed; shared by every request the connection fails.
    #[error("{}", os_message(.0))]
    Io(Arc<std::io::Error>),
    #[error("connection closed by server")]
    Closed,
    #[error("timeout")]
    Timeout,
    /// The replies no longer line up with the requests: not the server's health, since a
    /// client's request may be what caused it.
    #[error("reply out of step with requests")]
    OutOfStep,
    /// A server refused what the proxy says before any command (Redis's `AUTH` and `SELECT`,
    /// memcached's SASL).
    #[error("server refused {0}")]
    Refused(Arc<str>),
    /// A text request to servers that require SASL, which memcached takes over its binary
    /// protocol only (and then serves no text request).
    #[error("the servers require SASL, which memcached speaks in its binary protocol only")]
    TextWithSasl,
}

impl From<std::io::Error> for ServerError {
    fn from(e: std::io::Error) -> ServerError {
        ServerError::Io(Arc::new(e))
    }
}

/// "Connection refused", as nutcracker says it, without "(os error 111)".
fn os_message(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.split_once(" (os error") {
        Some((message, _)) => message.to_owned(),
        None => text,
    }
}

/// Longest wait before a failed server is tried again (without ejection).
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// First wait after a failure.
const MIN_BACKOFF: Duration = Duration::from_millis(20);

impl Conn {
    pub fn new(
        pool: Arc<PoolStats>,
        server: usize,
        wire: Wire,
        source: Option<IpAddr>,
        tls: Option<Arc<ServerTls>>,
        sasl: Option<Arc<Sasl>>,
    ) -> Rc<Conn> {
        let addr = pool.pool.spec().servers[server].addr;
        Rc::new(Conn {
            pool,
            server,
            wire,
            addr,
            source,
            tls,
            sasl,
            state: Cell::new(State::Idle),
            streak: Cell::new(0),
            out: RefCell::new(Vec::with_capacity(16 * 1024)),
            pending: RefCell::new(VecDeque::new()),
            wake: Notify::new(),
            first: Notify::new(),
            nonce: Cell::new(random_u64()),
            framed: Cell::new(0),
        })
    }

    /// Queues `bytes` (and the sentinel after it, if any) for the server. Fails the request at
    /// once, through its slot, while the server is known to be down.
    pub fn send(self: &Rc<Self>, bytes: &[u8], sentinel: &[u8], pending: Pending) {
        let stats = &self.pool.servers[self.server];
        if self.wire == Wire::Text && self.sasl.is_some() {
            add(&stats.errors, 1);
            pending
                .slot
                .complete(pending.part, Err(ServerError::TextWithSasl));
            return;
        }
        if let State::Down(until) = self.state.get() {
            if Instant::now() < until {
                add(&stats.errors, 1);
                pending
                    .slot
                    .complete(pending.part, Err(ServerError::Unavailable));
                return;
            }
            self.state.set(State::Idle);
        }
        add(&stats.requests, 1);
        add(&stats.in_flight, 1);
        {
            let mut out = self.out.borrow_mut();
            out.extend_from_slice(bytes);
            out.extend_from_slice(sentinel);
        }
        let was_empty = {
            let mut queue = self.pending.borrow_mut();
            queue.push_back(pending);
            queue.len() == 1
        };
        if was_empty {
            self.first.notify_one();
        }
        if self.state.get() == State::Idle {
            self.state.set(State::Open);
            tokio::task::spawn_local(self.clone().run());
        } else {
            self.wake.notify_one();
        }
    }

    /// Connects, then writes and reads until the connection fails or falls idle.
    async fn run(self: Rc<Self>) {
        let spec = &self.pool.spec;
        let stats = &self.pool.servers[self.server];
        let started = Instant::now();
        let connected = match timeout(spec.timeout, connect(self.addr, self.source)).await {
            Ok(Ok(stream)) => match &self.tls {
                None => Ok(Ok(ServerStream::Plain(stream))),
                Some(tls) => {
                    // The handshake has what is left of the timeout; running out of it is
                    // counted as the handshake's.
                    let host = self.pool.pool.spec().servers[self.server].host.clone();
                    let left = spec.timeout.saturating_sub(started.elapsed());
                    let shaken = timeout(left, tls.connect(&host, stream)).await;
                    if shaken.is_err() {
                        tls.count(crate::tls::Handshake::TimedOut);
                    }
                    shaken.map(|s| s.map(|s| ServerStream::Tls(Box::new(s))))
                }
            },
            Ok(Err(e)) => Ok(Err(e)),
            Err(elapsed) => Err(elapsed),
        };
        let stream = match connected {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return self.lost(ServerError::from(e)),
            Err(_) => return self.lost(ServerError::Timeout),
        };
        add(&stats.connects, 1);
        let mut stream = stream;
        if let Err(e) = self.introduce(&mut stream).await {
            return self.lost(e);
        }
        add(&stats.connections, 1);
        let result = self.serve(stream).await;
        sub(&stats.connections, 1);
        match result {
            // The server closed an idle connection: nothing was lost.
            Err(ServerError::Closed) if self.pending.borrow().is_empty() => {
                self.state.set(State::Idle);
            }
            Err(ServerError::OutOfStep) => self.out_of_step(),
            Err(lost) => self.lost(lost),
            Ok(()) => self.state.set(State::Idle),
        }
    }

    /// Authenticates a binary connection with SASL, when the servers require it; gives a
    /// Redis server the pool's password and database. Reads that the server took them.
    async fn introduce(&self, stream: &mut ServerStream) -> Result<(), ServerError> {
        if let Some(sasl) = self.sasl.as_ref().filter(|_| self.wire == Wire::Binary) {
            return self.authenticate(sasl, stream).await;
        }
        let Some(redis) = self
            .pool
            .spec
            .redis
            .as_ref()
            .filter(|_| self.wire.is_resp())
        else {
            return Ok(());
        };
        let mut hello = Vec::new();
        let mut expected = Vec::new();
        if self.wire == Wire::Resp3 {
            let mut words = vec![&b"HELLO"[..], b"3"];
            if let Some(password) = &redis.auth {
                words.extend([&b"AUTH"[..], b"default", password.as_bytes()]);
            }
            wire::resp::encode_command(&words, &mut hello);
            expected.push("HELLO");
        } else if let Some(password) = &redis.auth {
            wire::resp::encode_command(&[b"AUTH".as_slice(), password.as_bytes()], &mut hello);
            expected.push("AUTH");
        }
        if redis.db != 0 {
            let db = redis.db.to_string();
            wire::resp::encode_command(&[b"SELECT".as_slice(), db.as_bytes()], &mut hello);
            expected.push("SELECT");
        }
        if hello.is_empty() {
            return Ok(());
        }
        let exchange = async {
            stream.write_all(&hello).await?;
            let mut buf = Vec::with_capacity(256);
            for command in expected {
                let reply = read_reply(stream, &mut buf).await?;
                // HELLO is answered with the server's description, the others with OK.
                let taken = if command == "HELLO" {
                    !reply.starts_with(b"-")
                } else {
                    reply == b"+OK\r\n"
                };
                if !taken {
                    let reply = String::from_utf8_lossy(&reply);
                    let reply = reply.trim_start_matches('-').trim_end();
                    return Err(ServerError::Refused(format!("{command}: {reply}").into()));
                }
            }
            Ok(())
        };
        match timeout(self.pool.spec.timeout, exchange).await {
            Ok(result) => result,
            Err(_) => Err(ServerError::Timeout),
        }
    }

    /// SASL PLAIN on a new binary connection, within the pool's timeout.
    async fn authenticate(
        &self,
        sasl: &Sasl,
        stream: &mut ServerStream,
    ) -> Result<(), ServerError> {
        let exchange = async {
            stream.write_all(&sasl.auth_request()).await?;
            stream.flush().await?;
            let mut buf = Vec::with_capacity(64);
            loop {
                if let Some((_, outcome)) = sasl.auth_reply(&buf) {
                    return outcome.map_err(|said| {
                        ServerError::Refused(
                            format!("SASL authentication as {:?}: {said}", sasl.user()).into(),
                        )
                    });
                }
                if buf.len() > 4096 {
                    return Err(ServerError::OutOfStep);
                }
                if stream.read_buf(&mut buf).await? == 0 {
                    return Err(ServerError::Closed);
                }
            }
        };
        match timeout(self.pool.spec.timeout, exchange).await {
            Ok(result) => result,
            Err(_) => Err(ServerError::Timeout),
        }
    }

    async fn serve(&self, stream: ServerStream) -> Result<(), ServerError> {
        match stream {
            ServerStream::Plain(mut stream) => {
                let (rd, wr) = stream.split();
                self.serve_halves(rd, wr).await
            }
            ServerStream::Tls(stream) => {
                let (rd, wr) = tokio::io::split(stream);
                self.serve_halves(rd, wr).await
            }
        }
    }

    async fn serve_halves(
        &self,
        mut rd: impl AsyncRead + Unpin,
        mut wr: impl AsyncWrite + Unpin,
    ) -> Result<(), ServerError> {
        self.framed.set(0);
        let writer = async {
            let mut spare = Vec::with_capacity(16 * 1024);
            loop {
                std::mem::swap(&mut *self.out.borrow_mut(), &mut spare);
                if spare.is_empty() {
                    self.wake.notified().await;
                    continue;
                }
                // Every request now in `spare` is in `pending`, the last one at its back.
                if !self.wire.is_resp() {
                    let nonce = self.nonce.get();
                    self.nonce.set(nonce.wrapping_add(1));
                    if let Some(last) = self.pending.borrow_mut().back_mut() {
                        last.mark = Some(nonce);
                    }
                    write_batch_sentinel(self.wire, nonce, &mut spare);
                }
                wr.write_all(&spare).await.map_err(ServerError::from)?;
                // TLS holds the end of what was written until flushed; TCP has sent it.
                wr.flush().await.map_err(ServerError::from)?;
                add(
                    &self.pool.servers[self.server].bytes_sent,
                    spare.len() as u64,
                );
                spare.clear();
            }
        };
        let reader = async {
            let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
            let mut start = 0;
            loop {
                start += self.deliver(&buf[start..])?;
                if start == buf.len() {
                    buf.clear();
                    start = 0;
                    // A burst of large replies grew the buffer: give it back once drained.
                    if buf.capacity() > super::memory::LARGE {
                        buf = Vec::with_capacity(64 * 1024);
                        super::memory::freed_memory();
                    }
                } else if start > buf.capacity() / 2 {
                    buf.drain(..start);
                    start = 0;
                }
                if buf.capacity() - buf.len() < 16 * 1024 {
                    buf.reserve(64 * 1024);
                }
                let deadline = self.pending.borrow().front().map(|p| p.deadline);
                let read = rd.read_buf(&mut buf);
                let n = match deadline {
                    Some(deadline) => tokio::select! {
                        n = read => n,
                        _ = sleep_until(deadline) => return Err(ServerError::Timeout),
                    },
                    // A request sent while none was pending brings a deadline to watch.
                    None => tokio::select! {
                        n = read => n,
                        _ = self.first.notified() => continue,
                    },
                };
                match n {
                    Ok(0) => return Err(ServerError::Closed),
                    Ok(n) => add(&self.pool.servers[self.server].bytes_received, n as u64),
                    Err(e) => return Err(ServerError::from(e)),
                }
            }
        };
        tokio::select! {
            r = writer => r,
            r = reader => r,
        }
    }

    /// Frames the replies at the front of `buf` and hands over each batch whose sentinel came
    /// where it should; returns the bytes used. A reply is taken out of `buf` as soon as it is
    /// framed, into its request's [`Pending::data`], where it waits for the sentinel; so the
    /// buffer holds at most one reply still arriving, and a reply nobody will read is never
    /// held at all.
    fn deliver(&self, buf: &[u8]) -> Result<usize, ServerError> {
        let delivered = self.frame_replies(buf);
        if self.wire.is_resp() {
            // No sentinel: what is framed is handed over, all of it at once.
            self.release(self.framed.replace(0));
        }
        delivered
    }

    /// [`deliver`](Self::deliver)'s framing: replies framed and held, batches released at
    /// their sentinels.
    fn frame_replies(&self, buf: &[u8]) -> Result<usize, ServerError> {
        let mut base = 0;
        loop {
            let rest = &buf[base..];
            let framed = self.framed.get();
            let mark = framed
                .checked_sub(1)
                .and_then(|last| self.pending.borrow().get(last).and_then(|p| p.mark));
            if let Some(nonce) = mark {
                let Some((n, hit)) = batch_sentinel_len(self.wire, nonce, rest)? else {
                    return Ok(base);
                };
                self.release(framed);
                // Counted after the batch: a `stats` in it was answered before this read.
                if self.wire == Wire::Text {
                    let stats = &self.pool.servers[self.server];
                    add(
                        if hit {
                            &stats.sentinel_hits
                        } else {
                            &stats.sentinel_misses
                        },
                        1,
                    );
                }
                self.framed.set(0);
                base += n;
                continue;
            }
            let framing = {
                let mut queue = self.pending.borrow_mut();
                let Some(next) = queue.get_mut(framed) else {
                    // Bytes no request asked for.
                    return if rest.is_empty() {
                        Ok(base)
                    } else {
                        Err(ServerError::OutOfStep)
                    };
                };
                let framing = frame(&mut next.framer, next.sentinel, self.wire, rest);
                if let Ok(Some(f)) = &framing {
                    let reply = &rest[..f.reply];
                    if next.slot.keep(reply.len()) {
                        next.data = reply.to_vec();
                    } else {
                        add(&self.pool.reply_bytes_discarded, reply.len() as u64);
                    }
                }
                framing
            };
            match framing {
                Ok(Some(f)) => {
                    self.framed.set(framed + 1);
                    base += f.total;
                }
                Ok(None) => return Ok(base),
                Err(_) => return Err(ServerError::OutOfStep),
            }
        }
    }

    /// Hands the first `count` requests their replies.
    fn release(&self, count: usize) {
        let stats = &self.pool.servers[self.server];
        let now = Instant::now();
        for _ in 0..count {
            let Some(pending) = self.pending.borrow_mut().pop_front() else {
                return;
            };
            sub(&stats.in_flight, 1);
            add(&stats.replies, 1);
            // Every request's deadline is its queueing time plus the pool's timeout.
            let queued = pending.deadline.checked_sub(self.pool.spec.timeout);
            if let Some(queued) = queued {
                stats
                    .request_time
                    .observe(now.saturating_duration_since(queued));
            }
            self.streak.set(0);
            self.pool.server_answered(self.server);
            let reply = if pending.stats {
                wire::memcache::stats::discount_reads(
                    &pending.data,
                    get(&stats.sentinel_hits),
                    get(&stats.sentinel_misses),
                )
            } else {
                pending.data
            };
            pending.slot.complete(pending.part, Ok(reply));
        }
    }

    /// The replies lost step with the requests: every waiting request fails, and the next
    /// request makes a new connection at once. The server's health is not in question.
    fn out_of_step(&self) {
        add(&self.pool.servers[self.server].out_of_step, 1);
        self.state.set(State::Idle);
        let failed = self.fail_waiting(&ServerError::OutOfStep);
        tracing::warn!(
            pool = %self.pool.spec.name, server = %self.pool.pool.spec().servers[self.server].label(),
            waiting = failed, "replies out of step with requests; connection dropped"
        );
    }

    /// Fails every request queued or written on this connection with `why`, and drops the
    /// bytes not yet written; returns how many failed.
    fn fail_waiting(&self, why: &ServerError) -> usize {
        let stats = &self.pool.servers[self.server];
        let waiting: Vec<Pending> = self.pending.borrow_mut().drain(..).collect();
        self.out.borrow_mut().clear();
        sub(&stats.in_flight, waiting.len() as u64);
        add(&stats.errors, waiting.len() as u64);
        let failed = waiting.len();
        for pending in waiting {
            pending.slot.complete(pending.part, Err(why.clone()));
        }
        failed
    }

    /// Fails every waiting request, records the failure and keeps the server down for a
    /// backoff.
    fn lost(&self, why: ServerError) {
        if matches!(why, ServerError::Timeout) {
            add(&self.pool.servers[self.server].timeouts, 1);
        }
        let server = self.pool.pool.spec().servers[self.server].label();
        // A refusal is the operator's to mend (a password, a database): said once a streak.
        if matches!(why, ServerError::Refused(_)) && self.streak.get() == 0 {
            tracing::warn!(pool = %self.pool.spec.name, %server, "{why}; the server counts as failed");
        } else {
            tracing::debug!(
                pool = %self.pool.spec.name, %server,
                waiting = self.pending.borrow().len(), "server connection lost: {why}"
            );
        }
        self.pool.server_failed(self.server, kvio::clock::now());
        let streak = self.streak.get().saturating_add(1);
        self.streak.set(streak);
        let backoff = MIN_BACKOFF
            .saturating_mul(1 << streak.min(10).saturating_sub(1))
            .min(MAX_BACKOFF);
        self.state.set(State::Down(Instant::now() + backoff));
        self.fail_waiting(&why);
    }
}

/// The key a text batch sentinel asks for, chosen at random per process so that no client
/// can aim at it; hit or miss, the reply carries the opaque.
fn sentinel_key() -> &'static str {
    static KEY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    KEY.get_or_init(|| format!("kvswitch:sentinel:{:016x}", random_u64()))
}

/// Appends the batch sentinel numbered `nonce`.
fn write_batch_sentinel(wire: Wire, nonce: u64, out: &mut Vec<u8>) {
    match wire {
        Wire::Text => {
            out.extend_from_slice(b"mg ");
            out.extend_from_slice(sentinel_key().as_bytes());
            out.extend_from_slice(b" O");
            out.extend_from_slice(&hex16(nonce));
            out.extend_from_slice(b"\r\n");
        }
        Wire::Resp | Wire::Resp3 => {}
        Wire::Binary => {
            wire::memcache::binary::write_request(
                opcode::NOOP,
                b"",
                b"",
                b"",
                nonce as u32,
                0,
                out,
            );
        }
    }
}

/// The length of the batch sentinel's reply at the front of `buf`, and whether memcached found
/// the sentinel's key (`HD`): `Ok(None)` while what has arrived may still become it, an error if
/// it cannot.
fn batch_sentinel_len(
    wire: Wire,
    nonce: u64,
    buf: &[u8],
) -> Result<Option<(usize, bool)>, ServerError> {
    match wire {
        Wire::Text => text_sentinel_len(nonce, buf),
        Wire::Resp | Wire::Resp3 => Err(ServerError::OutOfStep),
        Wire::Binary => {
            let mut reply = [0u8; HEADER_LEN];
            reply[0] = wire::memcache::binary::RESPONSE_MAGIC;
            reply[1] = opcode::NOOP;
            reply[12..16].copy_from_slice(&(nonce as u32).to_be_bytes());
            if buf.starts_with(&reply) {
                Ok(Some((HEADER_LEN, false)))
            } else if reply.starts_with(buf) {
                Ok(None)
            } else {
                Err(ServerError::OutOfStep)
            }
        }
    }
}

/// `n` as 16 lower-case hex digits.
fn hex16(n: u64) -> [u8; 16] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 16];
    for (i, d) in out.iter_mut().enumerate() {
        *d = DIGITS[(n >> (60 - 4 * i) & 0xf) as usize];
    }
    out
}

/// [`batch_sentinel_len`] on a text connection: `EN` or `HD`, the opaque, and then any flags
/// memcached adds on its own (`W`, `X`, `Z` on an item a client has marked), up to the line's
/// end.
fn text_sentinel_len(nonce: u64, buf: &[u8]) -> Result<Option<(usize, bool)>, ServerError> {
    // "EN O" or "HD O", then the number.
    const PREFIX: usize = 4 + 16;
    let mut prefix = [0u8; PREFIX];
    prefix[2..4].copy_from_slice(b" O");
    prefix[4..].copy_from_slice(&hex16(nonce));
    let mut still_possible = false;
    for (status, hit) in [(b"EN", false), (b"HD", true)] {
        prefix[..2].copy_from_slice(status);
        if buf.len() < PREFIX {
            still_possible |= prefix.starts_with(buf);
            continue;
        }
        if !buf.starts_with(&prefix) {
            continue;
        }
        let rest = &buf[PREFIX..];
        let Some(end) = rest.windows(2).position(|w| w == b"\r\n") else {
            // A line of flags is short: one that goes on is not the sentinel's.
            return if rest.len() < 32 && !rest.contains(&b'\n') {
                Ok(None)
            } else {
                Err(ServerError::OutOfStep)
            };
        };
        let flags = &rest[..end];
        let plain = flags
            .split(|&b| b == b' ')
            .skip(1)
            .all(|f| f.len() == 1 && f[0].is_ascii_uppercase());
        if !(flags.is_empty() || flags.first() == Some(&b' ') && plain) {
            return Err(ServerError::OutOfStep);
        }
        return Ok(Some((PREFIX + end + 2, hit)));
    }
    if still_possible {
        Ok(None)
    } else {
        Err(ServerError::OutOfStep)
    }
}

/// A number no one outside the process can guess, from the standard library's hash seeds.
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

/// The next whole RESP reply from `stream`, taken off the front of `buf` (bytes read and not
/// yet used), for the proxy's own exchanges with a Redis server.
pub(crate) async fn read_reply(
    stream: &mut (impl AsyncRead + Unpin),
    buf: &mut Vec<u8>,
) -> Result<Vec<u8>, ServerError> {
    let mut framer = wire::resp::ReplyFramer::default();
    loop {
        if let Some(len) = framer.reply_len(buf).map_err(|_| ServerError::OutOfStep)? {
            return Ok(buf.drain(..len).collect());
        }
        if stream.read_buf(buf).await? == 0 {
            return Err(ServerError::Closed);
        }
    }
}

pub(crate) async fn connect(
    addr: SocketAddr,
    source: Option<IpAddr>,
) -> std::io::Result<TcpStream> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if let Some(source) = source {
        socket.bind(SocketAddr::new(source, 0))?;
    }
    let stream = socket.connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// A connection to a server, in clear or over TLS.
pub(crate) enum ServerStream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for ServerStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ServerStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ServerStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ServerStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            ServerStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ServerStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ServerStream::Plain(s) => Pin::new(s).poll_flush(cx),
            ServerStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ServerStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ServerStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Where one request's reply ends in a server's byte stream.
struct Framed {
    /// Bytes of the reply passed on to the client.
    reply: usize,
    /// Bytes used, the sentinel's reply included.
    total: usize,
}

fn frame(
    framer: &mut Framing,
    sentinel: bool,
    wire: Wire,
    buf: &[u8],
) -> Result<Option<Framed>, ReplyError> {
    let framer = match framer {
        Framing::Memcache(framer) => framer,
        Framing::Resp(framer) => {
            return Ok(framer
                .reply_len(buf)
                .map_err(|_| ReplyError::Malformed)?
                .map(|n| Framed { reply: n, total: n }))
        }
    };
    if !sentinel {
        return Ok(framer
            .reply_len(buf)?
            .map(|n| Framed { reply: n, total: n }));
    }
    let sentinel_len = |rest: &[u8]| -> Result<Option<usize>, ReplyError> {
        match wire {
            Wire::Text => {
                const MN: &[u8] = b"MN\r\n";
                if rest.len() < MN.len() {
                    return if MN.starts_with(rest) {
                        Ok(None)
                    } else {
                        Err(ReplyError::Malformed)
                    };
                }
                if rest.starts_with(MN) {
                    Ok(Some(MN.len()))
                } else {
                    Err(ReplyError::Malformed)
                }
            }
            Wire::Resp | Wire::Resp3 => Err(ReplyError::Malformed),
            Wire::Binary => match Header::decode(rest) {
                None => Ok(None),
                Some(h) if h.opcode == opcode::NOOP => {
                    Ok((rest.len() >= h.packet_len()).then_some(h.packet_len()))
                }
                Some(_) => Err(ReplyError::Malformed),
            },
        }
    };
    // What may still be the sentinel's reply (or is) means nothing came before it: the
    // request was answered with silence.
    if let Ok(sentinel) = sentinel_len(buf) {
        return Ok(sentinel.map(|n| Framed { reply: 0, total: n }));
    }
    let Some(n) = framer.reply_len(buf)? else {
        return Ok(None);
    };
    Ok(sentinel_len(&buf[n..])?.map(|m| Framed {
        reply: n,
        total: n + m,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_io_error_reads_as_nutcracker_says_it() {
        let refused = std::io::Error::from_raw_os_error(libc::ECONNREFUSED);
        assert_eq!(ServerError::from(refused).to_string(), "Connection refused");
        let plain = std::io::Error::other("no route");
        assert_eq!(ServerError::from(plain).to_string(), "no route");
        assert_eq!(ServerError::Unavailable.to_string(), "server unavailable");
    }

    #[test]
    fn a_text_sentinel_reply_is_its_opaque_whatever_flags_memcached_adds() {
        let n = 0x1234_u64;
        let ok = |reply: &[u8]| text_sentinel_len(n, reply).ok().flatten();
        assert_eq!(ok(b"EN O0000000000001234\r\nEND\r\n"), Some((22, false)));
        assert_eq!(ok(b"HD O0000000000001234\r\n"), Some((22, true)));
        // A client may mark the key: memcached then adds W, X or Z after the opaque.
        assert_eq!(ok(b"HD O0000000000001234 W Z\r\n"), Some((26, true)));
        // Still arriving.
        assert_eq!(ok(b"EN O00000000000"), None);
        assert!(text_sentinel_len(n, b"EN O0000000000001234 ")
            .unwrap()
            .is_none());
        // Anything else is out of step.
        for bad in [
            &b"END\r\n"[..],
            b"EN O0000000000001235\r\n",
            b"HD O0000000000001234 k\r\n",
            b"VA 1 O0000000000001234\r\nx\r\n",
            b"MN\r\n",
        ] {
            assert!(
                text_sentinel_len(n, bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
