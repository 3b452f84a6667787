//! SwitchKV's roles for a node (SwitchKV sections 3.2 and 3.2.4): a backend that reports its
//! hot keys to its cache node and tells it of writes to cached keys before it answers, and a
//! cache node that admits reported keys, fetches their values, serves them under the leases
//! their backends grant, and hands the switch rules that steer reads to it to its owner.
//!
//! The decisions are `kv::switchkv`'s ([`Backend`], [`CacheNode`]); this module moves their
//! messages ([`wire::switchkv`]) over TCP, one control connection each way, and hooks them into
//! the node's request path ([`Hooks`]).

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use kv::rules::Change;
use kv::switchkv::{Backend, BackendConfig, CacheNode, CacheNodeConfig, Fetch};
use wire::memcache::reply::{Framer, ReplyKind};
use wire::memcache::{Command, Request};
use wire::switchkv::{self as proto, Item, Message, Seal};

use crate::auth;
use store::session::{Hooks, UdpPath};
use store::Store;

/// How long a control call may take before its connection is dropped.
const CALL_WAIT: Duration = Duration::from_secs(1);
/// How often the background threads look at the time.
const TICK: Duration = Duration::from_millis(10);
/// Instant reports waiting to be sent, at most.
const INSTANT_QUEUE: usize = 1024;
/// Most fetches a cache node makes before it looks at its leases and rules again.
const MAX_FETCHES_A_TICK: usize = 256;
/// How often, with no rule changes, a cache node's rule sink is asked to check the switch's
/// rules (an empty batch).
const RULE_SYNC: Duration = Duration::from_secs(1);

/// The node's clock, as the pure state reads time.
#[derive(Debug, Clone, Copy)]
struct Clock(Instant);

impl Clock {
    fn now(&self) -> kv::Instant {
        kv::Instant::from_nanos(self.0.elapsed().as_nanos() as u64)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One request-reply connection to a peer's control port, made when first needed and again
/// after a failure. A call whose reply does not come in time leaves the connection open and
/// the reply owed: the next call reads it first. So the peer takes the messages of one link in
/// the order they were sent, a late one included, and a new connection is made only when the
/// peer is gone (nothing sent on the old one can still be taken).
///
/// Every request goes sealed, the next on the link's channel of this node's session
/// ([`auth::Sender`]); a reply is taken only sealed by the peer for that request.
#[derive(Debug)]
struct Link {
    peer: SocketAddr,
    sender: Arc<auth::Sender>,
    stream: u8,
    conn: Option<TcpStream>,
    /// The two ends' addresses, requests' way.
    ends: Option<auth::Ends>,
    buf: Vec<u8>,
    /// The seals of earlier calls whose replies were not read yet, oldest first.
    owed: VecDeque<Seal>,
}

impl Link {
    fn new(peer: SocketAddr, sender: Arc<auth::Sender>, stream: u8) -> Link {
        Link {
            peer,
            sender,
            stream,
            conn: None,
            ends: None,
            buf: Vec::new(),
            owed: VecDeque::new(),
        }
    }

    /// Sends `message` and reads its reply, waiting at most `wait` (replies owed by earlier
    /// calls included); the reply's bytes are returned whole, without their seal (parse them
    /// with [`proto::parse`]). When the wait runs out, the message may have been sent, and may
    /// yet be taken.
    fn call(&mut self, message: &Message<'_>, wait: Duration) -> std::io::Result<Vec<u8>> {
        let outcome = self.try_call(message, wait);
        if let Err(e) = &outcome {
            if !matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) {
                self.drop_conn();
            }
        }
        outcome
    }

    fn drop_conn(&mut self) {
        self.conn = None;
        self.ends = None;
        self.owed.clear();
    }

    /// Whether a reply is still owed (a message sent may not have been taken yet), after
    /// reading the owed replies that have come meanwhile.
    fn behind(&mut self) -> bool {
        while self.conn.is_some() && !self.owed.is_empty() {
            match self.reply(Instant::now() + Duration::from_millis(1)) {
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) => {
                    return true
                }
                // The peer is gone: nothing sent to it can be taken any more.
                Err(_) => self.drop_conn(),
            }
        }
        false
    }

    fn try_call(&mut self, message: &Message<'_>, wait: Duration) -> std::io::Result<Vec<u8>> {
        let wait = wait.max(Duration::from_millis(1));
        let deadline = Instant::now() + wait;
        if self.conn.is_none() {
            let conn = TcpStream::connect_timeout(&self.peer, wait)?;
            conn.set_nodelay(true)?;
            self.ends = Some(auth::Ends::new(
                conn.local_addr()?.ip(),
                conn.peer_addr()?.ip(),
            ));
            self.conn = Some(conn);
            self.buf.clear();
            self.owed.clear();
        }
        while !self.owed.is_empty() {
            self.reply(deadline)?;
        }
        let (Some(conn), Some(ends)) = (self.conn.as_mut(), self.ends) else {
            return Err(ErrorKind::NotConnected.into());
        };
        let mut body = Vec::new();
        proto::write(message, &mut body);
        let seal = self.sender.seal(self.stream, ends, &body);
        let mut out = Vec::with_capacity(body.len() + 128);
        proto::write_seal(&seal, &mut out);
        out.extend_from_slice(&body);
        conn.set_write_timeout(Some(wait))?;
        conn.write_all(&out)?;
        self.owed.push_back(seal);
        self.reply(deadline)
    }

    /// Reads the reply to the oldest call owed one, waiting until `deadline`; a reply not
    /// sealed by the peer for that call is an error (the connection is then dropped).
    fn reply(&mut self, deadline: Instant) -> std::io::Result<Vec<u8>> {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            if let Some((seal, at, used)) = sealed(&self.buf)? {
                let body = &self.buf[at..at + used];
                let Some(asked) = self.owed.front() else {
                    return Err(invalid("a reply to no request"));
                };
                let ends = self.ends.ok_or(ErrorKind::NotConnected)?;
                let back = auth::Ends::new(ends.to, ends.from);
                let theirs = seal.is_some_and(|seal| {
                    (seal.port, seal.epoch, seal.stream, seal.seq)
                        == (self.peer.port(), asked.epoch, asked.stream, asked.seq)
                        && auth::verify(self.sender.key(), auth::Kind::Reply, back, &seal, body)
                });
                if !theirs {
                    let text = String::from_utf8_lossy(body).trim_end().to_owned();
                    tracing::warn!(peer = %self.peer, "a control reply not sealed for its request: {text:?}");
                    return Err(invalid("a control reply not sealed for its request"));
                }
                let body = body.to_vec();
                self.buf.drain(..at + used);
                self.owed.pop_front();
                return Ok(body);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ErrorKind::TimedOut.into());
            }
            let Some(conn) = self.conn.as_mut() else {
                return Err(ErrorKind::NotConnected.into());
            };
            conn.set_read_timeout(Some(left))?;
            let n = match conn.read(&mut chunk) {
                Ok(n) => n,
                // A signal (a stop and a continue, say): the connection is fine.
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    return Err(ErrorKind::TimedOut.into())
                }
                Err(e) => return Err(e),
            };
            if n == 0 {
                return Err(ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(ErrorKind::InvalidData, what.to_owned())
}

/// The sealed message at the front of `buf`, once whole: its seal (if it has one), where
/// the message starts and how long it is.
fn sealed(buf: &[u8]) -> std::io::Result<Option<(Option<Seal>, usize, usize)>> {
    let read = proto::parse_seal(buf).and_then(|s| match s {
        None => Ok(None),
        Some((seal, at)) => Ok(proto::parse(&buf[at..])?.map(|(_, used)| (seal, at, used))),
    });
    read.map_err(|e| invalid(&e.to_string()))
}

/// Answers one control request from a sender (its address and control port) with the reply's
/// bytes (sealed by the server).
type Answer = dyn Fn(SocketAddr, &Message<'_>) -> Vec<u8> + Send + Sync;

/// Serves a control port: each connection's requests pass `guard` and are answered by
/// `answer` in order.
fn serve_control(
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    guard: Arc<auth::Guard>,
    answer: Arc<Answer>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let _ = listener.set_nonblocking(true);
        while !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((conn, peer)) => {
                    let (stop, guard, answer) = (stop.clone(), guard.clone(), answer.clone());
                    thread::spawn(move || control_connection(conn, peer, &stop, &guard, &*answer));
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(TICK),
                Err(e) => {
                    tracing::warn!("control accept failed: {e}");
                    thread::sleep(TICK);
                }
            }
        }
    })
}

/// Serves one control connection until it closes, the node stops, or a message is refused:
/// that one is answered `error refused <reason>` (unsealed) and the connection closed.
fn control_connection(
    mut conn: TcpStream,
    peer: SocketAddr,
    stop: &AtomicBool,
    guard: &auth::Guard,
    answer: &Answer,
) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_nodelay(true);
    let _ = conn.set_read_timeout(Some(Duration::from_millis(100)));
    let Ok(local) = conn.local_addr() else {
        return;
    };
    let refuse = |conn: &mut TcpStream, why: auth::Refusal, detail: &str| {
        let text = format!("refused {}", why.name());
        let _ = conn.write_all(&reply(&Message::Error(text.as_bytes())));
        tracing::debug!(%peer, "control message refused ({}){detail}", why.name());
    };
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    while !stop.load(Ordering::Relaxed) {
        loop {
            let (seal, at, used) = match sealed(&buf) {
                Ok(Some(found)) => found,
                Ok(None) => break,
                Err(e) => {
                    guard.count(auth::Refusal::Malformed);
                    refuse(&mut conn, auth::Refusal::Malformed, &format!(": {e}"));
                    return;
                }
            };
            let body = &buf[at..at + used];
            let sender = match guard.check(peer, local, seal.as_ref(), body) {
                Ok(sender) => sender,
                Err(why) => {
                    refuse(&mut conn, why, "");
                    return;
                }
            };
            let Ok(Some((message, _))) = proto::parse(body) else {
                return;
            };
            let answered = answer(sender, &message);
            let Some(seal) = seal else {
                return;
            };
            let back = auth::Ends::new(local.ip(), peer.ip());
            let mut out = Vec::with_capacity(answered.len() + 128);
            proto::write_seal(&guard.own.seal_reply(&seal, back, &answered), &mut out);
            out.extend_from_slice(&answered);
            buf.drain(..at + used);
            if conn.write_all(&out).is_err() {
                return;
            }
        }
        match conn.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(_) => return,
        }
    }
}

fn reply(message: &Message<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    proto::write(message, &mut out);
    out
}

/// The keys a request names, as stored (meta base64 keys decoded).
fn keys_of(request: &Request<'_>) -> Vec<Vec<u8>> {
    let mut scratch = [0u8; wire::memcache::MAX_KEY_LEN];
    request
        .keys()
        .filter_map(|k| request.stored_key(k, &mut scratch).ok().map(<[u8]>::to_vec))
        .collect()
}

/// Counters of a role, for `stats`-like status and tests.
#[derive(Debug, Default)]
pub struct RoleCounters {
    pub reports: AtomicU64,
    pub instant_reports: AtomicU64,
    pub updates: AtomicU64,
    pub update_timeouts: AtomicU64,
    pub fetches: AtomicU64,
    /// Fetches answered with no value (the key is dropped).
    pub fetch_misses: AtomicU64,
    /// Leases a backend would not renew (the keys are dropped).
    pub renewals_refused: AtomicU64,
    pub served: AtomicU64,
    pub forwarded: AtomicU64,
    /// Gets a look-aside cache node answered as misses.
    pub misses: AtomicU64,
    pub rule_changes: AtomicU64,
    /// Control messages refused, by reason (`switchkv_refused_<reason>` in `stats`).
    pub refused: Arc<auth::Refusals>,
}

impl RoleCounters {
    /// Appends `stats`' reply with these counters after the node's own (`switchkv_*` lines),
    /// if `request` is a plain text `stats`; returns whether it did.
    fn answer_stats(
        &self,
        request: &Request<'_>,
        store: &Store,
        gauges: &[(&str, u64)],
        out: &mut Vec<u8>,
    ) -> bool {
        let plain = request.command == Command::Stats
            && request.protocol == wire::memcache::Protocol::Text
            && request
                .bytes()
                .split(|&b| b == b'\n')
                .next()
                .is_some_and(|l| l.trim_ascii() == b"stats");
        if !plain {
            return false;
        }
        store::text::stats(store, out);
        if out.ends_with(b"END\r\n") {
            out.truncate(out.len() - 5);
        }
        let rows = [
            ("reports", &self.reports),
            ("instant_reports", &self.instant_reports),
            ("updates", &self.updates),
            ("update_timeouts", &self.update_timeouts),
            ("fetches", &self.fetches),
            ("fetch_misses", &self.fetch_misses),
            ("renewals_refused", &self.renewals_refused),
            ("served", &self.served),
            ("forwarded", &self.forwarded),
            ("misses", &self.misses),
            ("rule_changes", &self.rule_changes),
        ];
        let counted = rows
            .iter()
            .map(|(name, c)| (name.to_string(), c.load(Ordering::Relaxed)));
        let refused = auth::Refusal::ALL
            .iter()
            .map(|&r| (format!("refused_{}", r.name()), self.refused.get(r)));
        let gauges = gauges.iter().map(|&(name, v)| (name.to_string(), v));
        for (name, v) in counted.chain(refused).chain(gauges) {
            out.extend_from_slice(format!("STAT switchkv_{name} {v}\r\n").as_bytes());
        }
        out.extend_from_slice(b"END\r\n");
        true
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

// ---- the backend ------------------------------------------------------------------------------

/// A SwitchKV backend: counts its reads, reports hot keys to its cache node, and tells it of
/// every write to a key it holds before the write is answered.
#[derive(Debug)]
pub struct BackendRole {
    clock: Clock,
    state: Mutex<Backend>,
    /// Calls made while serving a write (updates), one at a time.
    writes: Mutex<Link>,
    instant: Mutex<mpsc::SyncSender<Vec<u8>>>,
    /// Whether it sends the periodic reports (the instant ones are off when the config's log
    /// is).
    periodic: bool,
    /// Its control port, named in its reports.
    control_port: u16,
    pub counters: RoleCounters,
}

impl BackendRole {
    /// A backend reporting to the cache node whose control port is `cache` (periodically too
    /// if `periodic`), serving its own control port on `control` to that cache node alone,
    /// every message both ways sealed under `key`; `store` is the node's.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        cfg: BackendConfig,
        periodic: bool,
        cache: SocketAddr,
        key: auth::Key,
        control: TcpListener,
        store: Arc<Store>,
        stop: Arc<AtomicBool>,
    ) -> anyhow::Result<(Arc<BackendRole>, Vec<thread::JoinHandle<()>>)> {
        let control_port = control.local_addr()?.port();
        // A session of its own each start: what an earlier run sent is not taken for this one's.
        let sender = Arc::new(auth::Sender::new(key, control_port, rand::random()));
        let counters = RoleCounters::default();
        let guard = Arc::new(auth::Guard::new(
            sender.clone(),
            vec![cache],
            counters.refused.clone(),
        ));
        announce_start(cache, &sender, cfg.lease);
        let clock = Clock(Instant::now());
        let state = Backend::new(cfg, clock.now()).map_err(|e| anyhow::anyhow!("{e}"))?;
        // Bursts beyond what the reporter keeps up with are dropped: the periodic report
        // carries them too.
        let (tx, rx) = mpsc::sync_channel(INSTANT_QUEUE);
        let role = Arc::new(BackendRole {
            control_port,
            clock,
            state: Mutex::new(state),
            writes: Mutex::new(Link::new(cache, sender.clone(), auth::STREAM_WRITES)),
            instant: Mutex::new(tx),
            periodic,
            counters,
        });
        let reporter = {
            let (role, stop, store) = (role.clone(), stop.clone(), store.clone());
            let link = Link::new(cache, sender, auth::STREAM_REPORTS);
            thread::spawn(move || role.report_loop(link, &rx, &store, &stop))
        };
        let answer = {
            let (role, store) = (role.clone(), store.clone());
            Arc::new(move |_: SocketAddr, m: &Message<'_>| role.answer_control(m, &store))
        };
        let server = serve_control(control, stop, guard, answer);
        Ok((role, vec![reporter, server]))
    }

    /// Sends the periodic reports when due and the instant reports as they come.
    fn report_loop(
        &self,
        mut link: Link,
        instant: &Receiver<Vec<u8>>,
        store: &Store,
        stop: &AtomicBool,
    ) {
        while !stop.load(Ordering::Relaxed) {
            if let Ok(key) = instant.recv_timeout(TICK) {
                self.send_hot(&mut link, &key, store);
            }
            let report = lock(&self.state).report(self.clock.now());
            if let Some(report) = report.filter(|_| self.periodic) {
                let loads: Vec<(&[u8], f64)> = report.iter().map(|(k, l)| (&**k, *l)).collect();
                if link
                    .call(&Message::Report(self.control_port, loads), CALL_WAIT)
                    .is_ok()
                {
                    bump(&self.counters.reports);
                }
            }
        }
    }

    /// Sends an instant report of `key` with its value. Nothing is granted by it: the cache
    /// node that takes the key fetches it, and the fetch's grant is the lease.
    fn send_hot(&self, link: &mut Link, key: &[u8], store: &Store) {
        let Some(item) = store.get(key, None) else {
            return;
        };
        let load = lock(&self.state).burst_load();
        let message = Message::Hot(
            self.control_port,
            key,
            load,
            Item {
                flags: item.flags,
                data: &item.value,
            },
        );
        bump(&self.counters.instant_reports);
        let _ = link.call(&message, CALL_WAIT);
    }

    fn answer_control(&self, message: &Message<'_>, store: &Store) -> Vec<u8> {
        let now = self.clock.now();
        match message {
            Message::Fetch(key) => {
                // Granted before the value is read, under the updates' lock: a write the read
                // missed is told after this reply is sent (and the cache node's fill loses to
                // it).
                let mut updates = lock(&self.writes);
                let behind = updates.behind();
                {
                    let mut state = lock(&self.state);
                    if behind || !state.may_grant(key, now) {
                        return reply(&Message::Miss);
                    }
                    state.grant(key, now);
                }
                match store.get(key, None) {
                    Some(item) => {
                        bump(&self.counters.fetches);
                        reply(&Message::Value(Item {
                            flags: item.flags,
                            data: &item.value,
                        }))
                    }
                    None => {
                        lock(&self.state).evict(key);
                        reply(&Message::Miss)
                    }
                }
            }
            Message::Renew(keys) => {
                let renewed = lock(&self.state).renew(keys.iter().copied(), now);
                match renewed.len() == keys.len() {
                    true => reply(&Message::Ok),
                    false => reply(&Message::Renewed(renewed)),
                }
            }
            Message::Evict(key) => {
                lock(&self.state).evict(key);
                reply(&Message::Ok)
            }
            _ => reply(&Message::Error(b"a backend takes fetch, renew and evict")),
        }
    }

    /// Tells the cache node of a write to `key`, which now holds what `store` has, and waits
    /// for its acknowledgement or the end of the key's lease.
    fn tell(&self, key: &[u8], store: &Store) {
        // A key not cached is not told, and waits for no other write's update (the store
        // holds this write already: a grant after this check reads it).
        if lock(&self.state)
            .cached_until(key, self.clock.now())
            .is_none()
        {
            return;
        }
        // Under the updates' lock from the lease's check to the reply: updates of one key
        // reach the cache node in the order of the values they carry.
        let mut link = lock(&self.writes);
        let now = self.clock.now();
        let (until, revoked) = {
            let mut state = lock(&self.state);
            let Some(until) = state.cached_until(key, now) else {
                return;
            };
            (until, state.is_revoked(key))
        };
        bump(&self.counters.updates);
        if !revoked {
            let item = store.get(key, None);
            let message = match &item {
                Some(item) => Message::Update(
                    key,
                    Item {
                        flags: item.flags,
                        data: &item.value,
                    },
                ),
                None => Message::Delete(key),
            };
            let wait = until.saturating_duration_since(now);
            let acked = matches!(
                link.call(&message, wait).ok().as_deref().map(proto::parse),
                Some(Ok(Some((Message::Ok, _))))
            );
            if acked {
                return;
            }
            // The cache node may take the update late, or never: its lease on the key is
            // neither renewed nor granted again, and the write waits for it to end.
            lock(&self.state).revoke(key);
        }
        bump(&self.counters.update_timeouts);
        drop(link);
        let end = lock(&self.state).cached_until(key, self.clock.now());
        if let Some(end) = end {
            thread::sleep(end.saturating_duration_since(self.clock.now()));
        }
    }
}

impl Hooks for BackendRole {
    /// Reads are counted as they are asked for, served or dropped over capacity: the hot keys
    /// are those asked for most.
    fn received(&self, request: &Request<'_>) {
        if !request.command.is_retrieval() {
            return;
        }
        let now = self.clock.now();
        for key in keys_of(request) {
            let burst = lock(&self.state).see(&key, now);
            if burst {
                let _ = lock(&self.instant).send(key);
            }
        }
    }

    fn answer(&self, request: &Request<'_>, store: &Store, out: &mut Vec<u8>) -> bool {
        if request.command != Command::Stats {
            return false;
        }
        let cached = lock(&self.state).cached_keys(self.clock.now()) as u64;
        self.counters
            .answer_stats(request, store, &[("cached_keys", cached)], out)
    }

    fn executed(&self, request: &Request<'_>, store: &Store) {
        let command = request.command;
        if command.is_write() && !command.is_retrieval() {
            if command == Command::FlushAll {
                let all = lock(&self.state).all_cached(self.clock.now());
                for (key, _) in all {
                    self.tell(&key, store);
                }
                return;
            }
            for key in keys_of(request) {
                self.tell(&key, store);
            }
        }
    }
}

/// Tells the cache node at `cache` that the backend of `sender`'s control port starts
/// afresh (in the session `sender` begins), so that it drops every key it had from it (values a restart lost, leases nobody
/// keeps now). Returns once that is acknowledged, or once a whole lease has passed, when every
/// lease an earlier run of this backend granted has ended. The backend serves nothing before.
fn announce_start(cache: SocketAddr, sender: &Arc<auth::Sender>, lease: Duration) {
    let until = Instant::now() + lease;
    let port = sender.port();
    let mut link = Link::new(cache, sender.clone(), auth::STREAM_START);
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            tracing::info!(%cache, "cache node did not acknowledge the start; a lease has passed");
            return;
        }
        let acked = matches!(
            link.call(&Message::Reset(port), left.min(CALL_WAIT))
                .ok()
                .as_deref()
                .map(proto::parse),
            Some(Ok(Some((Message::Ok, _))))
        );
        if acked {
            return;
        }
        thread::sleep(TICK.min(until.saturating_duration_since(Instant::now())));
    }
}

// ---- the cache node --------------------------------------------------------------------------

/// A SwitchKV cache node: takes its backends' reports, fetches and serves the keys it admits
/// under their leases, hands rule changes to `rules`, and sends reads it cannot answer on to
/// `upstream` (the switch's VIP, reached so that they are not steered back here).
pub struct CacheRole {
    clock: Clock,
    state: Mutex<CacheNode>,
    /// Its backends by control address (their control connections), the configured ones in
    /// the pool's order (two servers on one control address are one backend). Its calls to
    /// each (fetches, renewals) take the backend's own link: a control request from the
    /// backend must not wait for a call to it.
    backends: Vec<(SocketAddr, Arc<Mutex<Link>>)>,
    /// Which backend holds a key: the pool's server, then its index in `backends`.
    place: Place,
    of_server: Vec<usize>,
    upstream: SocketAddr,
    forward: Mutex<Vec<Upstream>>,
    /// How clients reach it.
    path: CachePath,
    pub counters: RoleCounters,
}

impl std::fmt::Debug for CacheRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheRole")
            .field("upstream", &self.upstream)
            .finish_non_exhaustive()
    }
}

/// How clients reach a cache node: SwitchKV's architectures (its Table 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CachePath {
    /// The switch steers reads of its keys to it (SwitchKV).
    Steered,
    /// Clients send it every request (on-path look-through): writes go on to the upstream
    /// too, and over UDP what it does not answer goes on over UDP.
    LookThrough,
    /// Clients ask it first and the key's backend on a miss (look-aside): a text `get` of a
    /// key it does not serve is answered as a miss.
    LookAside,
}

/// A memcached text connection to where a cache node's misses go.
#[derive(Debug)]
struct Upstream {
    conn: Option<TcpStream>,
}

/// Which pool server (its index in [`Backends::control`]) holds a key, as the switch's pool
/// places it; `None` when no server does.
pub type Place = Box<dyn Fn(&[u8]) -> Option<usize> + Send + Sync>;

/// The backends a cache node takes reports from and fetches values from: the servers of the
/// pool the switch places keys with, each at its control address, and the placement itself.
/// A report is taken only from one of them, and only about keys the pool places on it; a
/// value is fetched only from the server that holds its key.
pub struct Backends {
    /// Each server's control address (its address, the backends' control port), in the
    /// pool's order.
    pub control: Vec<SocketAddr>,
    pub place: Place,
}

impl Backends {
    /// A single backend at `control`, holding every key.
    pub fn one(control: SocketAddr) -> Backends {
        Backends {
            control: vec![control],
            place: Box::new(|_: &[u8]| Some(0)),
        }
    }
}

impl std::fmt::Debug for Backends {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backends")
            .field("control", &self.control)
            .finish_non_exhaustive()
    }
}

/// Where a cache node's rule changes go: the switch that steers reads of its keys to it. An
/// empty batch, sent every second without changes, asks it to check that the switch still
/// holds what it was given.
pub type RuleSink = Box<dyn FnMut(Vec<Change<Box<[u8]>>>) -> anyhow::Result<()> + Send>;

impl CacheRole {
    /// A cache node serving its control port on `control` to `backends` alone, every message
    /// both ways sealed under `key`, sending misses to `upstream` and rule changes to `rules`.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        cfg: CacheNodeConfig,
        control: TcpListener,
        backends: Backends,
        key: auth::Key,
        upstream: SocketAddr,
        path: CachePath,
        mut rules: RuleSink,
        stop: Arc<AtomicBool>,
    ) -> anyhow::Result<(Arc<CacheRole>, Vec<thread::JoinHandle<()>>)> {
        if backends.control.is_empty() {
            anyhow::bail!("a cache node needs at least one backend");
        }
        let control_port = control.local_addr()?.port();
        let sender = Arc::new(auth::Sender::new(key, control_port, rand::random()));
        let counters = RoleCounters::default();
        let mut links: Vec<(SocketAddr, Arc<Mutex<Link>>)> = Vec::new();
        let mut of_server = Vec::with_capacity(backends.control.len());
        for &at in &backends.control {
            let at = SocketAddr::new(at.ip().to_canonical(), at.port());
            let i = match links.iter().position(|(a, _)| *a == at) {
                Some(i) => i,
                None => {
                    let link = Link::new(at, sender.clone(), auth::STREAM_CACHE);
                    links.push((at, Arc::new(Mutex::new(link))));
                    links.len() - 1
                }
            };
            of_server.push(i);
        }
        let guard = Arc::new(auth::Guard::new(
            sender,
            links.iter().map(|(a, _)| *a).collect(),
            counters.refused.clone(),
        ));
        let clock = Clock(Instant::now());
        let state = CacheNode::new(cfg, 1, clock.now()).map_err(|e| anyhow::anyhow!("{e}"))?;
        let role = Arc::new(CacheRole {
            clock,
            state: Mutex::new(state),
            backends: links,
            place: backends.place,
            of_server,
            upstream,
            forward: Mutex::new(Vec::new()),
            path,
            counters,
        });
        let (fetch_tx, fetch_rx) = mpsc::channel::<Fetch>();
        let answer = {
            let role = role.clone();
            let fetch_tx = Mutex::new(fetch_tx);
            Arc::new(move |sender: SocketAddr, m: &Message<'_>| {
                role.answer_control(sender, m, &fetch_tx)
            })
        };
        let server = serve_control(control, stop.clone(), guard, answer);
        // Rule changes go to the switch from a thread of their own, in order: a slow switch
        // API must not hold up fetches and renewals.
        let (rules_tx, rules_rx) = mpsc::channel::<Vec<Change<Box<[u8]>>>>();
        let installer = {
            let (role, stop) = (role.clone(), stop.clone());
            thread::spawn(move || {
                let mut synced = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    let mut changes = match rules_rx.recv_timeout(TICK) {
                        Ok(c) => c,
                        Err(mpsc::RecvTimeoutError::Timeout) => Vec::new(),
                        Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    };
                    // Whatever else is waiting goes in the same call.
                    while let Ok(more) = rules_rx.try_recv() {
                        changes.extend(more);
                    }
                    // No changes for a while: an empty batch asks the sink to check that the
                    // switch still holds the rules it was given.
                    if changes.is_empty() && synced.elapsed() < RULE_SYNC {
                        continue;
                    }
                    synced = Instant::now();
                    let n = changes.len() as u64;
                    match rules(changes) {
                        Ok(()) => {
                            role.counters.rule_changes.fetch_add(n, Ordering::Relaxed);
                        }
                        Err(e) => tracing::warn!("switch rules not changed: {e:#}"),
                    }
                }
            })
        };
        let ticker = {
            let (role, stop) = (role.clone(), stop.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    // The fetches waiting now (at most a tick's wait for the first), then the
                    // periodic work: a stream of fetches must not hold up renewals.
                    if let Ok(fetch) = fetch_rx.recv_timeout(TICK) {
                        role.fetch(fetch);
                        let mut more = 0;
                        while let Ok(fetch) = fetch_rx.try_recv() {
                            role.fetch(fetch);
                            more += 1;
                            if more >= MAX_FETCHES_A_TICK {
                                break;
                            }
                        }
                    }
                    let changes = lock(&role.state).poll(role.clock.now());
                    if !changes.is_empty() && rules_tx.send(changes).is_err() {
                        return;
                    }
                    role.renew();
                }
            })
        };
        Ok((role, vec![server, ticker, installer]))
    }

    /// The backend whose control address is `at`, if it is one.
    fn backend(&self, at: SocketAddr) -> Option<usize> {
        self.backends.iter().position(|(a, _)| *a == at)
    }

    /// The backend that holds `key`, as the pool places it.
    fn key_backend(&self, key: &[u8]) -> Option<usize> {
        (self.place)(key).and_then(|server| self.of_server.get(server).copied())
    }

    /// The link to backend `b`.
    fn link(&self, b: usize) -> Option<Arc<Mutex<Link>>> {
        self.backends.get(b).map(|(_, l)| l.clone())
    }

    /// Refuses what `sender` says about a key another backend holds (counted).
    fn refuse_key(&self, key: &[u8], b: usize) -> bool {
        if self.key_backend(key) == Some(b) {
            return false;
        }
        self.counters.refused.count(auth::Refusal::NotItsKey);
        tracing::debug!(
            backend = %self.backends[b].0,
            key = %String::from_utf8_lossy(key),
            "refused: a key the pool does not place on this backend"
        );
        true
    }

    /// Answers a control request from `sender` (a configured backend's control address, its
    /// seal checked).
    fn answer_control(
        &self,
        sender: SocketAddr,
        message: &Message<'_>,
        fetches: &Mutex<Sender<Fetch>>,
    ) -> Vec<u8> {
        let now = self.clock.now();
        let Some(b) = self.backend(sender) else {
            self.counters.refused.count(auth::Refusal::UnknownPeer);
            return reply(&Message::Error(b"refused unknown_peer"));
        };
        // A message naming a control port names its sender's.
        let named = match message {
            Message::Report(port, _) | Message::Hot(port, ..) | Message::Reset(port) => Some(*port),
            _ => None,
        };
        if named.is_some_and(|port| port != sender.port()) {
            self.counters.refused.count(auth::Refusal::UnknownPeer);
            return reply(&Message::Error(b"refused unknown_peer"));
        }
        match message {
            Message::Report(_, loads) => {
                bump(&self.counters.reports);
                let loads: Vec<(&[u8], f64)> = loads
                    .iter()
                    .filter(|(key, _)| !self.refuse_key(key, b))
                    .copied()
                    .collect();
                let wanted = lock(&self.state).report(b, &loads, now);
                let tx = lock(fetches);
                for f in wanted {
                    let _ = tx.send(f);
                }
                reply(&Message::Ok)
            }
            Message::Hot(_, key, load, _) => {
                // Taken: fetched like any admitted key, and served under that fetch's grant.
                bump(&self.counters.instant_reports);
                if self.refuse_key(key, b) {
                    return reply(&Message::No);
                }
                let fetch = lock(&self.state).hot(b, key, *load, now);
                match fetch {
                    Some(f) => {
                        let _ = lock(fetches).send(f);
                        reply(&Message::Ok)
                    }
                    None => reply(&Message::No),
                }
            }
            Message::Update(key, item) => {
                if self.refuse_key(key, b) {
                    return reply(&Message::Error(b"refused not_its_key"));
                }
                bump(&self.counters.updates);
                let value = kv::cache::Value {
                    flags: item.flags,
                    cas: None,
                    data: item.data.into(),
                    key_base64: None,
                };
                lock(&self.state).update(key, Some(value), now);
                reply(&Message::Ok)
            }
            Message::Delete(key) => {
                if self.refuse_key(key, b) {
                    return reply(&Message::Error(b"refused not_its_key"));
                }
                bump(&self.counters.updates);
                lock(&self.state).update(key, None, now);
                reply(&Message::Ok)
            }
            Message::Reset(_) => {
                lock(&self.state).reset(b, now);
                reply(&Message::Ok)
            }
            _ => reply(&Message::Error(
                b"a cache node takes report, hot, update, delete and reset",
            )),
        }
    }

    /// Fetches an admitted key's value from the backend the pool places it on, whoever
    /// reported it.
    fn fetch(&self, fetch: Fetch) {
        let asked = self.clock.now();
        let Some(link) = self.key_backend(&fetch.key).and_then(|b| self.link(b)) else {
            bump(&self.counters.fetch_misses);
            lock(&self.state).fetched(fetch, None, asked);
            return;
        };
        let answer = {
            let mut link = lock(&link);
            // A backend that has not answered an earlier call (hung): not asked again now,
            // so that it holds up no other backend's fetches and renewals.
            if link.behind() {
                Err(ErrorKind::TimedOut.into())
            } else {
                link.call(&Message::Fetch(&fetch.key), CALL_WAIT)
            }
        };
        bump(&self.counters.fetches);
        let value = match answer.as_deref().map(proto::parse) {
            Ok(Ok(Some((Message::Value(item), _)))) => Some(kv::cache::Value {
                flags: item.flags,
                cas: None,
                data: item.data.into(),
                key_base64: None,
            }),
            // No value, or no answer: the key goes, and a later report admits it again.
            _ => {
                bump(&self.counters.fetch_misses);
                None
            }
        };
        lock(&self.state).fetched(fetch, value, asked);
    }

    /// Renews the leases that end within half a lease.
    fn renew(&self) {
        let asked = self.clock.now();
        let due = lock(&self.state).renewals(asked);
        for (b, keys) in due {
            let Some(link) = self.link(b) else {
                continue;
            };
            let names: Vec<&[u8]> = keys.iter().map(|k| &**k).collect();
            let answer = {
                let mut link = lock(&link);
                if link.behind() {
                    continue;
                }
                link.call(&Message::Renew(names), CALL_WAIT)
            };
            // No answer: the leases run out unless a later try gets one.
            let Ok(answer) = answer else {
                continue;
            };
            type Keys = Vec<Box<[u8]>>;
            let (renewed, refused): (Keys, Keys) = match proto::parse(&answer) {
                Ok(Some((Message::Ok, _))) => (keys, Vec::new()),
                Ok(Some((Message::Renewed(some), _))) => {
                    let some: std::collections::HashSet<&[u8]> = some.into_iter().collect();
                    keys.into_iter().partition(|k| some.contains(&**k))
                }
                _ => (Vec::new(), keys),
            };
            self.counters
                .renewals_refused
                .fetch_add(refused.len() as u64, Ordering::Relaxed);
            let mut state = lock(&self.state);
            state.renewed(&renewed, asked);
            state.refused(&refused, asked);
        }
    }

    /// Answers a text `get` whose keys are all served under a lease; false (nothing appended)
    /// if any is not.
    fn answer_get(&self, request: &Request<'_>, out: &mut Vec<u8>) -> bool {
        let now = self.clock.now();
        let keys = keys_of(request);
        let mut items = Vec::with_capacity(keys.len());
        {
            let mut state = lock(&self.state);
            for key in &keys {
                match state.serve(0, key, now) {
                    Some(value) => items.push(value),
                    None => return false,
                }
            }
        }
        bump(&self.counters.served);
        for (key, value) in keys.iter().zip(&items) {
            out.extend_from_slice(b"VALUE ");
            out.extend_from_slice(key);
            out.extend_from_slice(format!(" {} {}\r\n", value.flags, value.data.len()).as_bytes());
            out.extend_from_slice(&value.data);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"END\r\n");
        true
    }

    /// Sends `request` to the upstream (the switch's VIP over TCP, whose proxy routes it to
    /// the key's backend) and appends its reply.
    fn forward(&self, request: &Request<'_>, out: &mut Vec<u8>) -> bool {
        let mut pool = lock(&self.forward);
        let mut link = pool.pop().unwrap_or(Upstream { conn: None });
        drop(pool);
        let ok = link.call(self.upstream, request, out);
        if ok {
            lock(&self.forward).push(link);
        }
        ok
    }
}

/// A binary no-op request: sent after a quiet binary request, whose success (or miss) has no
/// reply, so that its reply (or the no-op's alone) ends the exchange. `mn` does the same for
/// text `noreply` and meta `q`.
const BINARY_NOOP: [u8; wire::memcache::binary::HEADER_LEN] = {
    let mut h = [0u8; wire::memcache::binary::HEADER_LEN];
    h[0] = wire::memcache::binary::REQUEST_MAGIC;
    h[1] = wire::memcache::binary::opcode::NOOP;
    h
};
const META_NOOP: &[u8] = b"mn\r\n";

impl Upstream {
    /// Sends `request` to `to` and appends its whole reply, framed as memcached answers it.
    fn call(&mut self, to: SocketAddr, request: &Request<'_>, out: &mut Vec<u8>) -> bool {
        let binary = request.protocol == wire::memcache::Protocol::Binary;
        // A request that may have no reply is followed by a no-op, whose reply ends it.
        let sentinel: Option<&[u8]> = match (request.noreply(), binary) {
            (false, _) => None,
            (true, true) => Some(&BINARY_NOOP),
            (true, false) => Some(META_NOOP),
        };
        let is_sentinel = |reply: &[u8]| match binary {
            true => reply.get(1) == Some(&wire::memcache::binary::opcode::NOOP),
            false => reply == b"MN\r\n",
        };
        let kind = ReplyKind::of(request);
        let attempt = |conn: &mut Option<TcpStream>, out: &mut Vec<u8>| -> std::io::Result<()> {
            if conn.is_none() {
                let c = TcpStream::connect_timeout(&to, CALL_WAIT)?;
                c.set_nodelay(true)?;
                c.set_read_timeout(Some(CALL_WAIT))?;
                *conn = Some(c);
            }
            let Some(c) = conn.as_mut() else {
                return Err(ErrorKind::NotConnected.into());
            };
            c.set_write_timeout(Some(CALL_WAIT))?;
            let mut sent = request.bytes().to_vec();
            sent.extend_from_slice(sentinel.unwrap_or_default());
            c.write_all(&sent)?;
            let mut start = out.len();
            let mut framer = Framer::new(kind);
            let mut chunk = [0u8; 16 * 1024];
            loop {
                match framer.reply_len(&out[start..]) {
                    Ok(Some(len)) if sentinel.is_none() => {
                        // More than one reply: the connection is out of step.
                        if start + len != out.len() {
                            return Err(ErrorKind::InvalidData.into());
                        }
                        return Ok(());
                    }
                    Ok(Some(len)) => {
                        // The no-op's reply ends it, and is not the client's.
                        if is_sentinel(&out[start..start + len]) {
                            if start + len != out.len() {
                                return Err(ErrorKind::InvalidData.into());
                            }
                            out.truncate(start);
                            return Ok(());
                        }
                        start += len;
                        framer = Framer::new(if binary { kind } else { ReplyKind::Line });
                        continue;
                    }
                    Err(_) => return Err(ErrorKind::InvalidData.into()),
                    Ok(None) => {}
                }
                let n = match c.read(&mut chunk) {
                    Ok(n) => n,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                };
                if n == 0 {
                    return Err(ErrorKind::UnexpectedEof.into());
                }
                out.extend_from_slice(&chunk[..n]);
            }
        };
        let start = out.len();
        // A kept connection may have been closed by the other end meanwhile (a restarted
        // backend): a read is sent again once on a new one. A write is not: it may have been
        // applied.
        let tries = if self.conn.is_some() && !request.command.is_write() {
            2
        } else {
            1
        };
        for _ in 0..tries {
            match attempt(&mut self.conn, out) {
                Ok(()) => return true,
                Err(_) => {
                    self.conn = None;
                    out.truncate(start);
                }
            }
        }
        false
    }
}

impl Hooks for CacheRole {
    /// A text `get` whose keys are all served under a lease is answered here; any other read
    /// (a get of a key it does not hold, `gets`, `mg`, the binary gets) goes on to the
    /// upstream. Writes are refused (a cache node's values come from its backends), or, on
    /// the path of every request (look-through), sent on to the upstream as well. The rest
    /// (`version`, `mn`, `stats`, ...) the node answers as any node does.
    fn answer(&self, request: &Request<'_>, store: &Store, out: &mut Vec<u8>) -> bool {
        if request.command == Command::Stats {
            let (g, (leased, pending)) = {
                let state = lock(&self.state);
                (state.gauges(), state.leases(self.clock.now()))
            };
            let gauges = [
                ("cached_keys", g.entries as u64),
                ("filled_keys", g.filled as u64),
                ("leased_keys", leased as u64),
                ("pending_keys", pending as u64),
                ("rules_installed", g.rules_installed as u64),
                ("pending_installs", g.pending_installs as u64),
            ];
            if self.counters.answer_stats(request, store, &gauges, out) {
                return true;
            }
        }
        let command = request.command;
        if command.is_write() && !command.is_retrieval() && self.path != CachePath::LookThrough {
            out.extend_from_slice(
                b"SERVER_ERROR a cache node takes no writes; send them to the key's backend\r\n",
            );
            return true;
        }
        if !command.is_retrieval() && !command.is_write() {
            return false;
        }
        if command == Command::Get && self.answer_get(request, out) {
            return true;
        }
        if command == Command::Get && self.path == CachePath::LookAside {
            bump(&self.counters.misses);
            out.extend_from_slice(b"END\r\n");
            return true;
        }
        bump(&self.counters.forwarded);
        if !self.forward(request, out) {
            out.extend_from_slice(b"SERVER_ERROR the key's backend did not answer\r\n");
        }
        true
    }

    fn executed(&self, _: &Request<'_>, _: &Store) {}

    /// A UDP `get` of keys all served here is answered. On the path of every request, any
    /// other read or write goes on over UDP; steered to, any other read goes back through the
    /// switch to its backend.
    fn udp(&self, request: &Request<'_>, out: &mut Vec<u8>) -> UdpPath {
        let command = request.command;
        let onward = match self.path {
            CachePath::LookThrough => command.is_retrieval() || command.is_write(),
            CachePath::Steered => command.is_retrieval() && !command.is_write(),
            CachePath::LookAside => false,
        };
        if !onward {
            return UdpPath::Execute;
        }
        if command == Command::Get && self.answer_get(request, out) {
            return UdpPath::Answered;
        }
        bump(&self.counters.forwarded);
        UdpPath::SendOn
    }
}

/// Stops the roles' threads when dropped.
#[derive(Debug, Default)]
pub struct Roles {
    pub stop: Arc<AtomicBool>,
    pub threads: Vec<thread::JoinHandle<()>>,
}

impl Drop for Roles {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
