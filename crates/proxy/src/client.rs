//! One client connection: requests are read and sent on as they arrive (a client may pipeline
//! as many as it likes, up to the limits), and replies are written back in request order as
//! they complete.
//!
//! Every reply byte that arrives for a client is counted against it until it is written
//! ([`crate::Limits`]): its reading stops while it holds its budget, and a client that holds
//! far more, or more than its share while the proxy's budget is spent, is cut off; what its
//! requests still bring is then thrown away as it arrives.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::{Rc, Weak};
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_rustls::server::TlsStream;
use wire::memcache::reply::{Framer, ReplyKind};
use wire::memcache::{binary, parse_text, recover_binary, recover_text, Command, Request};

use switch::cache::{KeyFill, ReadFill, Served, Writes};

use super::backend::{Awaiting, Framing, Pending, ServerError};
use super::combine::{combine, warm_fill, Outcome};
use super::memory;
use super::plan::{self, sentinel, Bytes, Combine, OnError, Plan, RedisMerge};
use super::pool::{PoolRouter, PoolRt};
use super::stats::{add, memcache_command_index, sub, CutOff, PoolStats, ProxyStats};
use super::Limits;

/// A reply in the making: filled by the servers' replies, read by the client's writer.
pub struct Slot {
    /// Weak: a client that goes away must free its queue, which holds its slots.
    client: Weak<Shared>,
    combine: Combine,
    on_error: OnError,
    outcomes: RefCell<Vec<Outcome>>,
    remaining: Cell<usize>,
    done: RefCell<Option<Vec<u8>>>,
    /// What the cache must hear of this request's reply before the client does.
    cache: RefCell<Option<CacheHook>>,
    /// Taken off the client's queue before it completed: its reply is not written.
    forgotten: Cell<bool>,
    /// A `get` whose owner warms up: the pool and the owner, which is given the item the
    /// server that held the key before had.
    warm: Option<(Rc<PoolRt>, usize)>,
    /// Bytes of its parts' replies held and counted against the client, until it completes.
    held: Cell<usize>,
    /// A Redis Cluster command: its parts follow the cluster's redirections.
    redirect: Option<Redirect>,
    /// Where its time goes when it completes: the pool's counters, the command's index in
    /// [`stats::COMMANDS`](super::stats::COMMANDS), and when it arrived.
    timed: Option<(Arc<PoolStats>, usize, Instant)>,
}

/// What a Redis Cluster command's slot needs to follow a redirection: a part answered with
/// `-MOVED slot node` is sent again to that node (and the worker's slot map learns it), one
/// answered with `-ASK slot node` is sent there after `ASKING`; each part at most
/// [`MAX_HOPS`] times. A part that fails makes the worker ask the cluster for its slots
/// again (a node may be gone).
pub struct Redirect {
    /// The slot itself, to be handed to the next server.
    me: Weak<Slot>,
    pool: Rc<PoolRt>,
    /// Per part, its request, the wire it went on, and the redirections it followed.
    requests: Vec<(Vec<u8>, plan::Wire, Cell<u32>)>,
    /// The client's connection affinity.
    affinity: usize,
}

const MAX_HOPS: u32 = 5;

impl Redirect {
    /// Sends part `part` where `reply` redirects it; false if `reply` is no redirection, or
    /// one that cannot be followed (too many hops, a full pool, a client gone).
    fn follow(&self, part: usize, reply: &[u8]) -> bool {
        let Some(to) = wire::resp::redirection(reply) else {
            return false;
        };
        let (Some(me), Some((request, wire, hops))) = (self.me.upgrade(), self.requests.get(part))
        else {
            return false;
        };
        if hops.get() >= MAX_HOPS {
            return false;
        }
        hops.set(hops.get() + 1);
        let Some(server) = self.pool.server_at(to.to) else {
            return false;
        };
        let stats = &self.pool.stats;
        if to.ask {
            add(&stats.redis_asks, 1);
        } else {
            add(&stats.redis_moved, 1);
            self.pool.learn_slots(to.slot..=to.slot, server);
            self.slots_wanted();
        }
        let conn = self.pool.conn(server, *wire, self.affinity);
        let deadline = Instant::now() + stats.spec.timeout;
        let pending = |slot: Rc<dyn Awaiting>, part| Pending {
            slot,
            part,
            framer: Framing::Resp(Default::default()),
            sentinel: false,
            deadline,
            data: Vec::new(),
            mark: None,
            stats: false,
        };
        if to.ask {
            conn.send(b"*1\r\n$6\r\nASKING\r\n", b"", pending(Rc::new(Ignored), 0));
        }
        conn.send(request, b"", pending(me, part));
        true
    }
}

impl Redirect {
    /// Wakes the worker's task that asks the cluster for its slots.
    fn slots_wanted(&self) {
        if let Some(cluster) = self.pool.cluster() {
            cluster.wanted.notify_one();
        }
    }
}

/// The reply to a request the proxy makes for itself (`ASKING`): read and dropped.
struct Ignored;

impl Awaiting for Ignored {
    fn keep(&self, _len: usize) -> bool {
        false
    }

    fn complete(&self, _part: usize, _outcome: Result<Vec<u8>, ServerError>) {}
}

/// A forwarded request's business with the cache.
pub enum CacheHook {
    /// A read of cached keys: its reply may fill them.
    Read(Rc<PoolRt>, ReadFill),
    /// A write: closed once its reply is in (or it failed).
    Write(Rc<PoolRt>, Writes),
    /// A Redis `GET` of a cached key: a bulk string in its reply fills it.
    RedisRead(Rc<PoolRt>, KeyFill),
}

impl CacheHook {
    fn finish(self, reply: &[u8]) {
        match self {
            CacheHook::Read(pool, fill) => {
                if let Some(cache) = &pool.cache {
                    cache.after_read(fill, reply, kvio::clock::now());
                }
            }
            CacheHook::Write(pool, writes) => {
                if let Some(cache) = &pool.cache {
                    cache.after_write(writes);
                }
            }
            CacheHook::RedisRead(pool, fill) => {
                let value = super::redis::get_value(reply);
                if let (Some(cache), Some(value)) = (&pool.cache, value) {
                    cache.after_read_key(fill, value, kvio::clock::now());
                }
            }
        }
    }
}

impl Awaiting for Slot {
    fn keep(&self, len: usize) -> bool {
        Slot::keep(self, len)
    }

    fn complete(&self, part: usize, outcome: Result<Vec<u8>, ServerError>) {
        Slot::complete(self, part, outcome)
    }
}

impl Slot {
    /// Whether a part's reply of `len` bytes, just arrived, is to be kept; if so it is counted
    /// against the client (which may cut it off). A reply nobody will read (its client is
    /// gone, cut off, or dropped this request) is thrown away unheld, unless the cache or a
    /// warm-up needs it (one reply at most).
    pub fn keep(&self, len: usize) -> bool {
        let client = self.client.upgrade();
        match client {
            Some(client) if !self.forgotten.get() && client.cut_off.get().is_none() => {
                self.held.set(self.held.get() + len);
                client.charge(len);
                true
            }
            _ => self.cache.borrow().is_some() || self.warm.is_some(),
        }
    }

    /// Records the outcome of part `part`; once every part has one, builds the reply and wakes
    /// the client's writer.
    pub fn complete(&self, part: usize, outcome: Outcome) {
        if let Some(redirect) = &self.redirect {
            match &outcome {
                Ok(reply) if reply.starts_with(b"-") && redirect.follow(part, reply) => return,
                Ok(_) => {}
                Err(_) => redirect.slots_wanted(),
            }
        }
        if let Some(o) = self.outcomes.borrow_mut().get_mut(part) {
            *o = outcome;
        }
        let left = self.remaining.get().saturating_sub(1);
        self.remaining.set(left);
        if left > 0 {
            return;
        }
        if let Some((pool, owner)) = &self.warm {
            if let Some(item) = warm_fill(&self.combine, &self.outcomes.borrow()) {
                store_warm(pool.clone(), *owner, item);
            }
        }
        let mut reply = Vec::new();
        {
            let mut outcomes = self.outcomes.borrow_mut();
            match (&self.combine, &mut outcomes[..]) {
                // The part's reply is the client's: moved, not copied (it may be 1 MiB).
                (Combine::Single | Combine::Redis(RedisMerge::Single), [Ok(only)]) => {
                    reply = std::mem::take(only)
                }
                (how, outcomes) => combine(how, &self.on_error, outcomes, &mut reply),
            }
            outcomes.clear();
        }
        if let Some(hook) = self.cache.borrow_mut().take() {
            hook.finish(&reply);
        }
        if let Some((stats, command, arrived)) = &self.timed {
            stats.commands[*command].observe(arrived.elapsed());
        }
        let held = self.held.replace(0);
        let Some(client) = self.client.upgrade() else {
            return;
        };
        if self.forgotten.get() {
            // Its bytes left the client's count when it was forgotten.
            return;
        }
        client.discharge(held);
        if client.cut_off.get().is_some() {
            return;
        }
        client.charge(reply.len());
        *self.done.borrow_mut() = Some(reply);
        client.wake.notify_one();
    }
}

/// Stores `add` (a quiet `add` of an item found where a key was before) on `owner`, warming
/// up. Sent from a task of its own: the reply that completed the get may be on the very
/// connection `add` goes out on. No one waits for its answer.
fn store_warm(pool: Rc<PoolRt>, owner: usize, item: Vec<u8>) {
    if pool.sasl().is_some() {
        // The item is a text `add`, which servers that require SASL do not serve: the warm
        // server fills from its own misses instead.
        return;
    }
    add(&pool.stats.warm_fills, 1);
    tokio::task::spawn_local(async move {
        let slot = Rc::new(Slot {
            client: Weak::new(),
            combine: Combine::Fixed(Vec::new()),
            on_error: OnError {
                protocol: wire::memcache::Protocol::Text,
                opcode: 0,
                opaque: 0,
                silent: true,
            },
            outcomes: RefCell::new(vec![Ok(Vec::new())]),
            remaining: Cell::new(1),
            done: RefCell::new(None),
            cache: RefCell::new(None),
            forgotten: Cell::new(false),
            warm: None,
            held: Cell::new(0),
            redirect: None,
            timed: None,
        });
        let wire = plan::Wire::Text;
        pool.conn(owner, wire, 0).send(
            &item,
            sentinel(wire),
            Pending {
                slot,
                part: 0,
                framer: Framing::Memcache(Framer::new(ReplyKind::Line)),
                sentinel: true,
                deadline: Instant::now() + pool.stats.spec.timeout,
                data: Vec::new(),
                mark: None,
                stats: false,
            },
        );
    });
}

pub(crate) enum Entry {
    Ready(Vec<u8>),
    Wait(Rc<Slot>),
    /// Close the connection once everything before has been written.
    Close,
}

/// What the reader and the writer of one client share.
pub(crate) struct Shared {
    queue: RefCell<VecDeque<Entry>>,
    /// Outstanding reply bytes: its requests' replies (or parts) received and not yet
    /// written, whether still held by a server connection or queued here.
    outstanding: Cell<usize>,
    /// The pool's counters; the proxy's, for the total every client holds.
    pool: Arc<PoolStats>,
    proxy: Arc<ProxyStats>,
    /// Set once the client holds more than it may: it is disconnected.
    cut_off: Cell<Option<CutOff>>,
    /// Wakes `serve` to drop the connection at once, even while the writer waits on a client
    /// that does not read.
    kill: Notify,
    /// [`Limits::client_reply_max`], [`Limits::client_reply_bytes`], [`Limits::reply_budget`].
    max_bytes: usize,
    budget_bytes: usize,
    proxy_budget: u64,
    /// The most outstanding bytes the client ever had.
    peak_bytes: Cell<usize>,
    /// Wakes the writer: a reply completed, or the reader stopped.
    wake: Notify,
    /// Wakes the reader: the writer made room.
    room: Notify,
    reader_done: Cell<bool>,
    /// Entries at the front of the queue that memcached would have written by now: it writes
    /// its replies whenever it runs out of complete requests, after a binary `NOOP` or error,
    /// and every 20 requests. Those after them are the ones it drops when a multi-get fails
    /// (see [`Shared::forget`]).
    committed: Cell<usize>,
    /// Which of a server's connections this client's requests take (see [`PoolRt::conn`]):
    /// always the same, so that its requests to one server stay in order.
    affinity: usize,
    /// The client authenticated with SASL (see [`crate::sasl`]).
    authenticated: Cell<bool>,
}

/// Largest value a storage request may carry: memcached's default item size. Larger ones are
/// refused as memcached refuses them, without being buffered.
pub const MAX_VALUE: usize = 1 << 20;
/// Longest multi-get line read; a longer one closes the connection.
pub const MAX_GET_LINE: usize = 1 << 20;

/// Reads the requests of a protocol other than memcached's (Redis's) from the front of a
/// client's unread bytes, and forwards or answers them as the client's reply order says.
pub(crate) trait Requests {
    fn handle(
        &mut self,
        buf: &[u8],
        shared: &Rc<Shared>,
        pool: &Rc<PoolRt>,
        limits: &Limits,
    ) -> Handled;
}

/// Serves one client until it closes, quits or fails: a memcached client, or, with
/// `requests`, one of another protocol. The caller has counted the connection in the pool's
/// and the proxy's gauges; they are counted down here.
pub(crate) async fn serve(
    mut stream: TcpStream,
    pool: Rc<PoolRt>,
    limits: Rc<Limits>,
    requests: Option<Box<dyn Requests>>,
) {
    let _ = stream.set_nodelay(true);
    let (rd, wr) = stream.split();
    serve_halves(rd, wr, pool, limits, requests).await;
}

/// [`serve`] for a client that has finished its TLS handshake.
pub(crate) async fn serve_tls(
    stream: TlsStream<TcpStream>,
    pool: Rc<PoolRt>,
    limits: Rc<Limits>,
    requests: Option<Box<dyn Requests>>,
) {
    let (rd, wr) = tokio::io::split(stream);
    serve_halves(rd, wr, pool, limits, requests).await;
}

/// A client let go before it was served (its TLS handshake failed): the counts [`serve`]
/// would have taken down.
pub(crate) fn gone(pool: &PoolRt) {
    sub(&pool.stats.client_connections, 1);
    sub(&pool.proxy.clients_open, 1);
}

async fn serve_halves(
    rd: impl AsyncRead + Unpin,
    wr: impl AsyncWrite + Unpin,
    pool: Rc<PoolRt>,
    limits: Rc<Limits>,
    requests: Option<Box<dyn Requests>>,
) {
    let stats = pool.stats.clone();
    let shared = Rc::new(Shared {
        affinity: pool.next_affinity(),
        authenticated: Cell::new(false),
        queue: RefCell::new(VecDeque::new()),
        outstanding: Cell::new(0),
        pool: stats.clone(),
        proxy: pool.proxy.clone(),
        cut_off: Cell::new(None),
        kill: Notify::new(),
        max_bytes: limits.client_reply_max,
        budget_bytes: limits.client_reply_bytes,
        proxy_budget: limits.reply_budget as u64,
        peak_bytes: Cell::new(0),
        wake: Notify::new(),
        room: Notify::new(),
        reader_done: Cell::new(false),
        committed: Cell::new(0),
    });
    let reader = read_loop(rd, &shared, &pool, &limits, requests);
    let writer = write_loop(wr, &shared, &pool);
    tokio::pin!(reader, writer);
    tokio::select! {
        _ = &mut writer => {}
        _ = &mut reader => {
            shared.reader_done.set(true);
            shared.wake.notify_one();
            tokio::select! {
                _ = &mut writer => {}
                _ = shared.kill.notified() => {}
            }
        }
        _ = shared.kill.notified() => {}
    }
    // Whatever the client left unread goes with it; replies still on their way are thrown
    // away as they arrive.
    let left: Vec<Entry> = shared.queue.borrow_mut().drain(..).collect();
    drop(left);
    shared.discharge(shared.outstanding.get());
    if shared.peak_bytes.get() > memory::LARGE {
        super::memory::freed_memory();
    }
    drop(stats);
    gone(&pool);
}

impl Shared {
    /// Counts `n` more outstanding reply bytes; cuts the client off past its own limit, or
    /// past its budget while the proxy's whole budget is spent.
    fn charge(&self, n: usize) {
        let mine = self.outstanding.get() + n;
        self.outstanding.set(mine);
        self.peak_bytes.set(self.peak_bytes.get().max(mine));
        add(&self.pool.reply_bytes, n as u64);
        let total = self.proxy.hold(n);
        if mine > self.max_bytes {
            self.cut(CutOff::ReplyLimit);
        } else if total > self.proxy_budget && mine > self.budget_bytes {
            self.cut(CutOff::ReplyBudget);
        }
    }

    /// Counts `n` outstanding reply bytes as written or dropped.
    fn discharge(&self, n: usize) {
        let n = n.min(self.outstanding.get());
        self.outstanding.set(self.outstanding.get() - n);
        sub(&self.pool.reply_bytes, n as u64);
        self.proxy.release(n);
    }

    /// Disconnects the client: `serve` drops it at once, whatever its writer waits for.
    fn cut(&self, why: CutOff) {
        if self.cut_off.get().is_some() {
            return;
        }
        self.cut_off.set(Some(why));
        self.pool.cut_off(why);
        tracing::warn!(
            pool = %self.pool.spec.name, reason = why.label(), held = self.outstanding.get(),
            proxy_held = super::stats::get(&self.proxy.reply_bytes),
            "client cut off: it holds too many unwritten reply bytes"
        );
        self.kill.notify_one();
    }

    pub fn push(&self, entry: Entry) {
        if let Entry::Ready(bytes) = &entry {
            self.charge(bytes.len());
        }
        self.queue.borrow_mut().push_back(entry);
        self.wake.notify_one();
    }

    /// Marks every entry queued so far as one memcached would have written.
    fn commit(&self) {
        self.committed.set(self.queue.borrow().len());
    }

    /// Drops the replies memcached would not have written yet, as it drops them when a
    /// multi-get fails on a key too long.
    fn forget(&self) {
        let mut queue = self.queue.borrow_mut();
        let keep = self.committed.get().min(queue.len());
        for entry in queue.drain(keep..) {
            if let Entry::Wait(slot) = entry {
                slot.forgotten.set(true);
            }
        }
        let bytes = queue
            .iter()
            .map(|entry| match entry {
                Entry::Ready(bytes) => bytes.len(),
                Entry::Wait(slot) => slot
                    .done
                    .borrow()
                    .as_ref()
                    .map_or(slot.held.get(), Vec::len),
                Entry::Close => 0,
            })
            .sum();
        drop(queue);
        self.discharge(self.outstanding.get().saturating_sub(bytes));
        self.room.notify_one();
    }

    pub fn full(&self, limits: &Limits) -> bool {
        self.queue.borrow().len() >= limits.client_pending
            || self.outstanding.get() >= limits.client_reply_bytes
            || super::stats::get(&self.proxy.reply_bytes) >= limits.reply_budget as u64
    }
}

async fn write_loop(mut wr: impl AsyncWrite + Unpin, shared: &Rc<Shared>, pool: &PoolRt) {
    let mut out: Vec<u8> = Vec::with_capacity(16 * 1024);
    loop {
        if shared.cut_off.get().is_some() {
            // Not reading its replies and past its limit: let it go rather than hold them.
            let _ = wr.shutdown().await;
            return;
        }
        let mut close = false;
        let mut popped = false;
        {
            let mut queue = shared.queue.borrow_mut();
            while let Some(front) = queue.front() {
                match front {
                    Entry::Ready(bytes) => out.extend_from_slice(bytes),
                    Entry::Wait(slot) => match slot.done.borrow_mut().take() {
                        Some(bytes) => out.extend_from_slice(&bytes),
                        None => break,
                    },
                    Entry::Close => {
                        close = true;
                        break;
                    }
                }
                queue.pop_front();
                shared
                    .committed
                    .set(shared.committed.get().saturating_sub(1));
                popped = true;
                if out.len() >= 256 * 1024 {
                    break;
                }
            }
        }
        // Every entry taken off the queue makes room, even a reply of no bytes (a noreply
        // request's): the reader may be waiting on the queue's length alone.
        if popped {
            shared.room.notify_one();
        }
        if !out.is_empty() {
            shared.discharge(out.len());
            // TLS may keep the end of what it took until flushed; TCP has sent it all.
            if wr.write_all(&out).await.is_err() || wr.flush().await.is_err() {
                return;
            }
            add(&pool.stats.bytes_to_clients, out.len() as u64);
            out.clear();
            shared.room.notify_one();
            continue;
        }
        if close || (shared.reader_done.get() && shared.queue.borrow().is_empty()) {
            let _ = wr.shutdown().await;
            return;
        }
        shared.wake.notified().await;
    }
}

async fn read_loop(
    mut rd: impl AsyncRead + Unpin,
    shared: &Rc<Shared>,
    pool: &Rc<PoolRt>,
    limits: &Limits,
    mut requests: Option<Box<dyn Requests>>,
) {
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut start = 0;
    // Bytes of a refused value still to be thrown away.
    let mut skip = 0usize;
    // memcached fixes a connection's protocol at its first byte; so does the proxy.
    let mut binary = None;
    loop {
        while shared.full(limits) {
            if shared.cut_off.get().is_some() {
                return;
            }
            // Room comes from this client's writer, or, when the worker as a whole holds too
            // much, from other clients': look again now and then.
            tokio::select! {
                _ = shared.room.notified() => {}
                _ = tokio::time::sleep(std::time::Duration::from_millis(10)) => {}
            }
        }
        // Requests already read go first; more is read only once they are all under way.
        if buf.len() > start && skip == 0 {
            let handled = match requests.as_mut() {
                Some(requests) => requests.handle(&buf[start..], shared, pool, limits),
                None => {
                    let binary = *binary.get_or_insert(buf[start] == binary::REQUEST_MAGIC);
                    handle(&buf[start..], binary, shared, pool, limits, &mut skip)
                }
            };
            match handled {
                Handled::Used(used) => start += used,
                Handled::Drain(used) => {
                    start += used;
                    while !shared.queue.borrow().is_empty() {
                        if shared.cut_off.get().is_some() {
                            return;
                        }
                        tokio::select! {
                            _ = shared.room.notified() => {}
                            _ = tokio::time::sleep(std::time::Duration::from_millis(10)) => {}
                        }
                    }
                }
                Handled::Close => {
                    shared.push(Entry::Close);
                    return;
                }
            }
            if start == buf.len() {
                buf.clear();
                start = 0;
                if buf.capacity() > memory::LARGE {
                    buf = Vec::with_capacity(16 * 1024);
                    super::memory::freed_memory();
                }
            } else if start > 0 && (start > buf.len() / 2 || buf.capacity() - buf.len() < 8192) {
                buf.drain(..start);
                start = 0;
            }
            if requests.is_none() && buf.len() - start > MAX_GET_LINE + MAX_VALUE {
                // Only a get line could have grown this far without completing.
                shared.push(Entry::Ready(b"CLIENT_ERROR line too long\r\n".to_vec()));
                shared.push(Entry::Close);
                return;
            }
            if shared.full(limits) {
                continue;
            }
        }
        if buf.capacity() - buf.len() < 8 * 1024 {
            buf.reserve(16 * 1024);
        }
        let n = match rd.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        add(&pool.stats.bytes_from_clients, n as u64);
        if skip > 0 {
            let dropped = skip.min(buf.len() - start);
            start += dropped;
            skip -= dropped;
        }
    }
}

/// Sends the parts of a request to their servers, with a slot in the client's reply order
/// that their replies will fill. `command` is the request's index in
/// [`stats::COMMANDS`](super::stats::COMMANDS), when its time is to be counted.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    command: Option<usize>,
    parts: &[plan::Part],
    combine: Combine,
    on_error: OnError,
    request: &[u8],
    cache: Option<CacheHook>,
    shared: &Rc<Shared>,
    pool: &Rc<PoolRt>,
) {
    let combine_is_warm = matches!(combine, Combine::WarmUp { .. });
    let slot = Rc::new_cyclic(|me| Slot {
        client: Rc::downgrade(shared),
        combine,
        on_error,
        outcomes: RefCell::new(vec![Ok(Vec::new()); parts.len()]),
        remaining: Cell::new(parts.len()),
        done: RefCell::new(None),
        cache: RefCell::new(cache),
        forgotten: Cell::new(false),
        warm: match (&combine_is_warm, parts.first()) {
            (true, Some(owner)) => Some((pool.clone(), owner.server)),
            _ => None,
        },
        held: Cell::new(0),
        redirect: pool.cluster().map(|_| Redirect {
            me: me.clone(),
            pool: pool.clone(),
            requests: parts
                .iter()
                .map(|p| match &p.bytes {
                    Bytes::Request => (request.to_vec(), p.wire, Cell::new(0)),
                    Bytes::Owned(bytes) => (bytes.clone(), p.wire, Cell::new(0)),
                })
                .collect(),
            affinity: shared.affinity,
        }),
        timed: command.map(|c| (pool.stats.clone(), c, Instant::now())),
    });
    shared.push(Entry::Wait(slot.clone()));
    let deadline = Instant::now() + pool.stats.spec.timeout;
    for (i, part) in parts.iter().enumerate() {
        let bytes = match &part.bytes {
            Bytes::Request => request,
            Bytes::Owned(bytes) => bytes,
        };
        let tail: &[u8] = if part.sentinel {
            sentinel(part.wire)
        } else {
            b""
        };
        pool.conn(part.server, part.wire, shared.affinity).send(
            bytes,
            tail,
            Pending {
                slot: slot.clone(),
                part: i,
                framer: match part.wire {
                    plan::Wire::Resp | plan::Wire::Resp3 => Framing::Resp(Default::default()),
                    _ => Framing::Memcache(Framer::new(part.kind)),
                },
                sentinel: part.sentinel,
                deadline,
                data: Vec::new(),
                mark: None,
                stats: part.wire == plan::Wire::Text && part.kind == ReplyKind::Stats,
            },
        );
    }
}

pub(crate) enum Handled {
    Used(usize),
    /// These bytes were used; the rest waits until every reply queued so far is written (a
    /// Redis client that changed protocol: its next commands go on other connections, and
    /// must not overtake those before).
    Drain(usize),
    Close,
}

/// When the proxy authenticates to the servers itself: its own answer to a client's SASL
/// request (passed on, it would authenticate a connection every client shares), and, when
/// clients must authenticate, the refusal of any other request before they have.
fn sasl_plan(
    request: &wire::memcache::Request<'_>,
    pool: &PoolRt,
    shared: &Shared,
) -> Option<Plan> {
    let sasl = pool.sasl()?;
    let Command::Binary(op) = request.command else {
        // Servers that require SASL serve no text request: nor does the cache in front of
        // them, which would otherwise answer clients that never authenticated.
        let mut out = Vec::new();
        let message = super::backend::ServerError::TextWithSasl;
        plan::error_reply(&plan::on_error(request), message, &mut out);
        return Some(Plan::Local(out));
    };
    if let Some((reply, taken)) = sasl.answer_client(request.bytes()) {
        if taken {
            shared.authenticated.set(true);
        }
        return Some(Plan::Local(reply));
    }
    // memcached -S answers VERSION before authentication too (health checks use it).
    let open = op == binary::opcode::VERSION;
    (sasl.required_of_clients() && !shared.authenticated.get() && !open)
        .then(|| Plan::Close(sasl.unauthenticated(request.bytes())))
}

/// Acts on every complete request at the front of `buf`.
fn handle(
    buf: &[u8],
    binary: bool,
    shared: &Rc<Shared>,
    pool: &Rc<PoolRt>,
    limits: &Limits,
    skip: &mut usize,
) -> Handled {
    let stats = &pool.stats;
    let mut used = 0;
    let mut router = pool.router();
    // Whether the loop stopped for want of bytes: memcached writes its replies then.
    let mut starved = false;
    let mut handled = 0usize;
    while used < buf.len() && *skip == 0 && !shared.full(limits) {
        handled += 1;
        if handled.is_multiple_of(MEMCACHED_REQS_PER_EVENT) {
            shared.commit();
        }
        let rest = &buf[used..];
        let parsed = if binary {
            binary::parse_request(rest)
        } else {
            parse_text(rest)
        };
        match parsed {
            Ok(Some(request)) => {
                add(&stats.requests, 1);
                let (plan, hook) = match sasl_plan(&request, pool, shared) {
                    Some(plan) => (plan, None),
                    None => match from_cache(&request, pool, &mut router) {
                        Served::All(reply) => {
                            add(&stats.cache_replies, 1);
                            shared.push(Entry::Ready(reply));
                            if request.protocol == wire::memcache::Protocol::Text {
                                shared.commit();
                            }
                            used += request.len;
                            continue;
                        }
                        Served::Some { hits, cached } => {
                            let plan =
                                plan::plan_multiget_cached(&request, &hits, cached, &mut router);
                            let hook = pool.cache.as_ref().and_then(|c| {
                                c.before_read_except(&request, &hits)
                                    .map(|fill| CacheHook::Read(pool.clone(), fill))
                            });
                            (plan, hook)
                        }
                        Served::None => (plan::plan(&request, &mut router), None),
                    },
                };
                match plan {
                    Plan::Local(reply) => {
                        add(&stats.local_replies, 1);
                        if !reply.is_empty() {
                            shared.push(Entry::Ready(reply));
                        }
                        // memcached writes its replies out after `mn` and a binary NOOP.
                        if matches!(
                            request.command,
                            Command::MetaNoop | Command::Binary(binary::opcode::NOOP)
                        ) {
                            shared.commit();
                        }
                    }
                    Plan::Close(reply) => {
                        if !reply.is_empty() {
                            shared.push(Entry::Ready(reply));
                        }
                        return Handled::Close;
                    }
                    Plan::Forward {
                        parts,
                        combine,
                        on_error,
                    } => {
                        let compacted;
                        let bytes = match plan::compact_long_line(&request) {
                            plan::Compact::Unchanged => request.bytes(),
                            plan::Compact::Compacted(bytes) => {
                                compacted = bytes;
                                &compacted
                            }
                            // memcached may close on such a line; a shared server connection
                            // must not, so the client's is closed instead.
                            plan::Compact::TooLong => return Handled::Close,
                        };
                        let hook = hook.or_else(|| cache_hook(&request, pool));
                        let command = memcache_command_index(request.command);
                        forward(
                            Some(command),
                            &parts,
                            combine,
                            on_error,
                            bytes,
                            hook,
                            shared,
                            pool,
                        )
                    }
                }
                // memcached writes its replies out after every text retrieval.
                if request.protocol == wire::memcache::Protocol::Text
                    && request.command.is_retrieval()
                {
                    shared.commit();
                }
                used += request.len;
            }
            Ok(None) => {
                if let Some(refused) = plan::too_large(rest, MAX_VALUE, binary) {
                    add(&stats.client_errors, 1);
                    let (consumed, to_skip) = (refused.consumed, refused.skip);
                    match plan::unlink(refused, binary, &mut router) {
                        Plan::Forward {
                            parts,
                            combine,
                            on_error,
                        } => {
                            // The refused value's old item is deleted: a write like any other.
                            let hook = refused_write_hook(&parts, pool);
                            forward(None, &parts, combine, on_error, b"", hook, shared, pool)
                        }
                        Plan::Local(reply) | Plan::Close(reply) => {
                            if !reply.is_empty() {
                                shared.push(Entry::Ready(reply));
                            }
                        }
                    }
                    let available = rest.len() - consumed.min(rest.len());
                    let skipped = to_skip.min(available);
                    *skip = to_skip - skipped;
                    used += consumed + skipped;
                    continue;
                }
                starved = true;
                break;
            }
            Err(error) => {
                let mut reply = Vec::new();
                let recovered = if binary {
                    recover_binary(error, rest, &mut reply)
                } else {
                    recover_text(error, rest, &mut reply)
                };
                let Some(recovery) = recovered else {
                    starved = true;
                    break;
                };
                add(&stats.client_errors, 1);
                if recovery.forget {
                    shared.forget();
                }
                if !reply.is_empty() {
                    shared.push(Entry::Ready(reply));
                }
                if recovery.close {
                    return Handled::Close;
                }
                // memcached throws away what a refused request announced (an `ms` block, a
                // binary body) and reads on after it; so does the proxy, as it arrives.
                used += recovery.consumed.max(1).min(rest.len());
                *skip = recovery.skip;
                // A binary error with nothing to throw away is written out at once.
                if binary && *skip == 0 && recovery.consumed <= rest.len() {
                    shared.commit();
                }
            }
        }
    }
    // Out of requests, and not throwing a block away: memcached writes what it has.
    if *skip == 0 && (starved || used >= buf.len()) {
        shared.commit();
    }
    Handled::Used(used)
}

/// Requests memcached reads from one connection before it writes its replies and turns to
/// others (`-R`, 20 by default).
const MEMCACHED_REQS_PER_EVENT: usize = 20;

/// What the cache answers of a read: all of it, or the cached keys of a text multi-get. The
/// read is shown to hot-key detection either way.
fn from_cache(request: &Request<'_>, pool: &Rc<PoolRt>, router: &mut PoolRouter) -> Served {
    let Some(cache) = pool.cache.as_ref() else {
        return Served::None;
    };
    if !request.command.is_retrieval() {
        return Served::None;
    }
    let now = kvio::clock::now();
    let mut locate = |key: &[u8]| router.peek(key).unwrap_or(0);
    cache.see(request, &mut locate, now);
    cache.serve_parts(request, now)
}

/// What the cache must hear of a request about to be forwarded: fill tokens for a read, opened
/// writes for a write.
fn cache_hook(request: &Request<'_>, pool: &Rc<PoolRt>) -> Option<CacheHook> {
    let cache = pool.cache.as_ref()?;
    if let Some(writes) = cache.before_write(request, kvio::clock::now()) {
        return Some(CacheHook::Write(pool.clone(), writes));
    }
    if request.command.is_retrieval() {
        return cache
            .before_read(request)
            .map(|fill| CacheHook::Read(pool.clone(), fill));
    }
    None
}

/// A value too large to store is refused and its key deleted (see [`plan::unlink`]): the
/// deletion is a write to that key.
fn refused_write_hook(parts: &[plan::Part], pool: &Rc<PoolRt>) -> Option<CacheHook> {
    let cache = pool.cache.as_ref()?;
    let part = parts.first()?;
    let Bytes::Owned(bytes) = &part.bytes else {
        return None;
    };
    let Ok(Some(request)) = wire::memcache::parse(bytes) else {
        return None;
    };
    cache
        .before_write(&request, kvio::clock::now())
        .map(|writes| CacheHook::Write(pool.clone(), writes))
}
