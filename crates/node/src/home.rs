//! `--role home`: the node keeps the caching fabric's directory for its own keys (IncBricks
//! 4.3), in place of its ToR, and stays memcached to everything else.
//!
//! It speaks only to its ToR (`--tor`; datagrams from anyone else are counted and dropped),
//! on UDP port [`inc::PORT`] of its own address. The ToR passes it
//! every fabric request for this server that reaches the home, unshrunk (the client's address,
//! the client's ToR as `origin`, and in `via` the designated root the reply will go by), and
//! every acknowledgement of its invalidations (`via`: the sharer that sent it). The node:
//!
//! - answers a GET from its store and, when the reply is one datagram holding the key and no
//!   write to it opened since, records the client's ToR and that root as sharers and marks
//!   the reply a fill at the key's epoch, so that they cache it on its way back;
//! - takes writes (SET, DEL, INCREMENT, COND_PUT) one at a time per key: it sends the ToR an
//!   invalidation for each sharer (`via`), again every retry interval until acknowledged,
//!   and applies the write to its store and answers the client only after every
//!   acknowledgement; a write not acknowledged within the give-up time fails unapplied;
//! - under write-update (`--coherence update`), once a `set`, `add`, `replace` or `cas` is
//!   stored and no other write to its key waits, sends the value as read from its store to
//!   every ToR the write invalidated, by fill-only replies (flag [`flags::FILL_ONLY`]) that
//!   fill the designated root on their way, each recorded as a sharer first;
//! - takes an acknowledgement flagged [`flags::FAILED`] as "switch `via` is counted out":
//!   the writes that waited for it go on.
//!
//! The ToR only relays and says which way replies go: the order of writes, the sharer lists
//! and the epochs are the node's. For a lease after it starts the node holds writes and lets
//! no read fill: copies made before a restart, which it no longer knows of, expire first.

use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use anyhow::Context;
use kv::fabric::{Directory, Due, SwitchId, WriteStep};
use wire::inc::classify::{cached_number, classify, cond_operand, reply_key, Kind};
use wire::inc::{self, flags, Command, Header, Message};
use wire::mcudp;

use crate::Shared;
use store::bump;

/// The home's settings (the defaults are a fabric file's).
#[derive(Debug, Clone, Copy)]
pub struct HomeConfig {
    /// The ToR's fabric address and port: the only source of messages the home takes, and
    /// where it sends its own.
    pub tor: SocketAddr,
    /// Unacknowledged invalidations are sent again this often.
    pub retry: Duration,
    /// A write whose invalidations are not all acknowledged by then fails, unapplied.
    pub give_up: Duration,
    /// The caches' lease: how long a copy may live without the home seeing it.
    pub lease: Duration,
    /// Most keys with sharers; past it, replies do not fill.
    pub keys: usize,
    /// Write-update: once a `set`, `add`, `replace` or `cas` is stored, the switches its
    /// invalidations went to are sent the value (each recorded as a sharer first).
    pub update: bool,
}

impl HomeConfig {
    /// The defaults, with ToR `tor`.
    pub fn new(tor: SocketAddr) -> HomeConfig {
        HomeConfig {
            tor,
            retry: Duration::from_millis(20),
            give_up: Duration::from_millis(1000),
            lease: Duration::from_secs(2),
            keys: 1 << 20,
            update: false,
        }
    }
}

/// A write waiting at the home: the request as the ToR passed it.
#[derive(Debug, Clone)]
struct Write {
    header: Header,
    key: Vec<u8>,
    /// The memcached datagram, frame header included.
    datagram: Vec<u8>,
    /// An increment a designated switch computed on a copy of a value nothing has changed
    /// since: its result may fill the sharers on the reply's way (the switch keeps it).
    fresh: bool,
}

/// Whether `body`, a write the server stored, leaves the value a `set` gives `key`: a text
/// `set`, `add`, `replace` or `cas` of it (what write-update sends on).
fn updates_value(body: &[u8], key: &[u8]) -> bool {
    use wire::memcache::Command as C;
    matches!(
        wire::memcache::parse(body),
        Ok(Some(r)) if matches!(r.command, C::Set | C::Add | C::Replace | C::Cas)
            && r.key() == Some(key)
    )
}

/// Writes held while the home starts, at most; more are refused.
const MAX_HELD: usize = 4096;

/// How often the home looks at its clock when nothing arrives.
const POLL: Duration = Duration::from_millis(5);

pub(crate) fn spawn(
    socket: UdpSocket,
    shared: Arc<Shared>,
    cfg: HomeConfig,
) -> anyhow::Result<JoinHandle<()>> {
    socket
        .set_read_timeout(Some(POLL))
        .context("failed to set the home socket's read timeout")?;
    thread::Builder::new()
        .name("node-home".into())
        .spawn(move || {
            let mut home = Home::new(&shared, &socket, cfg);
            home.serve();
        })
        .context("failed to start the home thread")
}

struct Home<'a> {
    shared: &'a Shared,
    socket: &'a UdpSocket,
    directory: Directory<Write>,
    /// The ToR.
    tor: SocketAddr,
    /// Until then (a lease after start), writes wait and reads fill nothing: copies made
    /// before a restart, which the directory no longer knows of, have expired by then.
    ready_at: kv::Instant,
    /// Writes that came before `ready_at`, in order.
    held: std::collections::VecDeque<(Header, Vec<u8>)>,
    /// This server as the fabric names it (address and memcached port), from the requests.
    server: Option<(std::net::Ipv4Addr, u16)>,
    started: std::time::Instant,
    next_id: u16,
    /// Write-update (see [`HomeConfig::update`]).
    update: bool,
    /// The ToR's own switch id, from a request of its rack (one that came by no root and
    /// not off its path): where write-update sends a copy with no root to fill on the way.
    own_tor: Option<SwitchId>,
}

impl<'a> Home<'a> {
    fn new(shared: &'a Shared, socket: &'a UdpSocket, cfg: HomeConfig) -> Home<'a> {
        Home {
            shared,
            socket,
            // Writes are applied here at once: the reply timeout never runs.
            directory: Directory::new(cfg.keys, cfg.retry, cfg.give_up, cfg.lease, cfg.lease),
            tor: cfg.tor,
            ready_at: kv::Instant::ZERO + cfg.lease,
            held: std::collections::VecDeque::new(),
            server: None,
            started: std::time::Instant::now(),
            next_id: 0,
            update: cfg.update,
            own_tor: None,
        }
    }

    fn now(&self) -> kv::Instant {
        kv::Instant::from_nanos(self.started.elapsed().as_nanos() as u64)
    }

    fn serve(&mut self) {
        let mut buf = vec![0u8; 64 * 1024];
        while !self.shared.stopping() {
            match self.socket.recv_from(&mut buf) {
                Ok((n, from)) => {
                    let message = buf[..n].to_vec();
                    self.message(from, &message);
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => tracing::debug!("home receive failed: {e}"),
            }
            let now = self.now();
            if now >= self.ready_at && !self.held.is_empty() {
                for (h, datagram) in std::mem::take(&mut self.held) {
                    self.request(h, &datagram);
                }
            }
            if self.directory.poll_at().is_some_and(|at| now >= at) {
                for due in self.directory.tick(now) {
                    match due {
                        Due::Retransmit { key, epoch, target } => {
                            self.invalidate(&key, epoch, target)
                        }
                        Due::Step { key, step } => self.step(&key, step),
                    }
                }
            }
        }
    }

    /// Whether the home has been up a lease (see `ready_at`).
    fn ready(&self) -> bool {
        self.now() >= self.ready_at
    }

    fn counters(&self) -> &store::Counters {
        &self.shared.store.counters
    }

    /// One message from the ToR.
    fn message(&mut self, from: SocketAddr, bytes: &[u8]) {
        if from != self.tor {
            bump(&self.counters().home_refused);
            return;
        }
        let Ok(msg) = Message::parse(bytes) else {
            bump(&self.counters().home_malformed);
            return;
        };
        let h = msg.header;
        match h.command {
            Command::InvalidateAck if h.has(flags::VIA) => {
                let now = self.now();
                if h.has(flags::FAILED) {
                    for (_, write) in self.directory.switch_failed(h.via, now) {
                        self.apply(write);
                    }
                    return;
                }
                bump(&self.counters().home_acks);
                if let Some(write) = self.directory.ack(msg.payload, h.epoch, h.via, now) {
                    self.apply(write);
                }
            }
            Command::Set | Command::Del | Command::Increment | Command::CondPut
                if !self.ready() =>
            {
                if self.held.len() < MAX_HELD {
                    self.held.push_back((h, msg.payload.to_vec()));
                } else if let Ok((mc, _)) = mcudp::Header::parse(msg.payload) {
                    let why = b"SERVER_ERROR the fabric's home is starting\r\n";
                    self.reply(&h, mc.request_id, why, None);
                }
            }
            Command::Get | Command::Set | Command::Del | Command::Increment | Command::CondPut => {
                self.request(h, msg.payload)
            }
            _ => bump(&self.counters().home_malformed),
        }
    }

    /// A request for this server that reached its home.
    fn request(&mut self, h: Header, datagram: &[u8]) {
        let Ok((mc, body)) = mcudp::Header::parse(datagram) else {
            bump(&self.counters().home_malformed);
            return;
        };
        bump(&self.counters().home_requests);
        self.server = Some(h.server);
        if !h.has(flags::VIA) && !h.has(flags::DETOUR) {
            self.own_tor = Some(h.origin);
        }
        let key = match (h.command, classify(body)) {
            (Command::Get, Kind::Get(key)) if inc::key_hash(&key) == h.key_hash => {
                return self.read(h, mc.request_id, &key, body);
            }
            (Command::CondPut, Kind::Write(Command::Set, key, _)) => Some(key),
            (asked, Kind::Write(write, key, _)) if asked == write => Some(key),
            _ => None,
        };
        match key {
            Some(key) if inc::key_hash(&key) == h.key_hash => {
                let fresh = h.command == Command::Increment
                    && h.has(flags::COMPUTED)
                    && self.directory.unchanged_since(&key, h.epoch);
                let write = Write {
                    header: h,
                    key: key.clone(),
                    datagram: datagram.to_vec(),
                    fresh,
                };
                let step = self.directory.write(&key, write, self.now());
                self.step(&key, step);
            }
            _ => {
                bump(&self.counters().home_malformed);
                let why = "CLIENT_ERROR the message's command does not match its request\r\n";
                self.reply(&h, mc.request_id, why.as_bytes(), None);
            }
        }
    }

    /// A read: answered from the store, a fill for the sharers on its way when it may be.
    fn read(&mut self, h: Header, request_id: u16, key: &[u8], body: &[u8]) {
        let stamp = self.directory.read();
        let mut out = Vec::new();
        crate::udp::execute(self.shared, body, &mut out);
        let mut fill = None;
        if self.ready() && out.len() <= mcudp::MAX_PAYLOAD && reply_key(&out) == Some(key) {
            let mut sharers: Vec<SwitchId> = vec![h.origin];
            if h.has(flags::VIA) && !h.has(flags::DETOUR) && h.via != h.origin {
                sharers.push(h.via);
            }
            fill = self.directory.fill(key, stamp, sharers, self.now());
            if fill.is_some() {
                bump(&self.counters().home_fills);
            }
        }
        self.reply(&h, request_id, &out, fill);
    }

    /// Carries out a step of the directory for the write on `key`.
    fn step(&mut self, key: &[u8], step: WriteStep<Write>) {
        let (write, why) = match step {
            WriteStep::Queued => return,
            WriteStep::Invalidate { epoch, targets } => {
                for target in targets {
                    self.invalidate(key, epoch, target);
                }
                return;
            }
            WriteStep::Forward(write) => return self.apply(write),
            WriteStep::Failed(write) => {
                bump(&self.counters().home_writes_failed);
                (write, "fabric invalidation not acknowledged")
            }
            WriteStep::Refused(write) => {
                bump(&self.counters().home_writes_failed);
                (write, "too many writes to this key wait in the fabric")
            }
        };
        if let Ok((mc, _)) = mcudp::Header::parse(&write.datagram) {
            let text = format!("SERVER_ERROR {why}\r\n");
            self.reply(&write.header, mc.request_id, text.as_bytes(), None);
        }
    }

    /// Every sharer has dropped its copy: the write is applied to the store and answered,
    /// and the key's next write opens.
    fn apply(&mut self, write: Write) {
        let Ok((mc, body)) = mcudp::Header::parse(&write.datagram) else {
            return;
        };
        let mut out = Vec::new();
        if write.header.command == Command::CondPut {
            // Stored only when the value held is smaller or unset.
            let current = self.held_value(&write.key);
            let store = match (current.as_slice(), cond_operand(body)) {
                (b"END\r\n", Some(_)) => true,
                (held, Some(operand)) => cached_number(held).is_some_and(|v| v < operand),
                _ => false,
            };
            if store {
                crate::udp::execute(self.shared, body, &mut out);
            } else {
                out.extend_from_slice(b"NOT_STORED\r\n");
            }
        } else {
            crate::udp::execute(self.shared, body, &mut out);
        }
        let now = self.now();
        let stored = out == b"STORED\r\n" && self.update && updates_value(body, &write.key);
        let invalidated = match stored {
            true => self.directory.invalidated(&write.key),
            false => Vec::new(),
        };
        let next = self.directory.done(&write.key, now);
        // A computed increment's result fills the switches on the reply's way: the one that
        // computed it keeps its new value if the number agrees.
        let number = out.len() > 2
            && out.ends_with(b"\r\n")
            && out[..out.len() - 2].iter().all(u8::is_ascii_digit);
        let mut fill = None;
        if write.fresh && number && next.is_none() {
            let h = write.header;
            let mut sharers: Vec<SwitchId> = vec![h.origin];
            if h.has(flags::VIA) && !h.has(flags::DETOUR) && h.via != h.origin {
                sharers.push(h.via);
            }
            let stamp = self.directory.read();
            fill = self.directory.fill(&write.key, stamp, sharers, now);
            if fill.is_some() {
                bump(&self.counters().home_fills);
            }
        }
        // A quiet write answers nothing.
        if !out.is_empty() {
            self.reply(&write.header, mc.request_id, &out, fill);
        }
        match next {
            Some(step) => self.step(&write.key, step),
            None if stored => self.update_copies(&write, &invalidated),
            None => {}
        }
    }

    /// What a `get` of `key` answers from the store now (`END` alone when it holds none).
    fn held_value(&self, key: &[u8]) -> Vec<u8> {
        let mut get = b"get ".to_vec();
        get.extend_from_slice(key);
        get.extend_from_slice(b"\r\n");
        let mut out = Vec::new();
        crate::udp::execute(self.shared, &get, &mut out);
        out
    }

    /// Write-update: the value `write` stored, as a read gives it, goes to every ToR in
    /// `invalidated` by a fill-only reply: the ToR's own with no root, the others by the
    /// root the write came by (the key's designated root), which fills on the way. A write
    /// from this rack names no root: then only the ToR's own copy is made. The relaying ToR
    /// fills only by the root the reply names, so every copy made is one recorded here.
    fn update_copies(&mut self, write: &Write, invalidated: &[SwitchId]) {
        let value = self.held_value(&write.key);
        if value.len() > mcudp::MAX_PAYLOAD || reply_key(&value) != Some(&write.key[..]) {
            return;
        }
        let h = write.header;
        let root = (h.has(flags::VIA) && !h.has(flags::DETOUR)).then_some(h.via);
        let now = self.now();
        let stamp = self.directory.read();
        for &tor in invalidated {
            let by = match (Some(tor) == self.own_tor, root) {
                (true, _) => None,
                (false, Some(root)) if root != tor => Some(root),
                _ => continue,
            };
            let sharers: Vec<SwitchId> = std::iter::once(tor).chain(by).collect();
            let Some(fill) = self.directory.fill(&write.key, stamp, sharers, now) else {
                continue;
            };
            let to = Header {
                origin: tor,
                flags: flags::EXPANDED
                    | flags::FILL_ONLY
                    | if by.is_some() { flags::VIA } else { 0 },
                via: by.unwrap_or(0),
                ..h
            };
            bump(&self.counters().home_updates);
            self.send_reply(&to, 0, &value, Some(fill));
        }
    }

    /// Sends the ToR the invalidation of `key` at `epoch` for `target`.
    fn invalidate(&mut self, key: &[u8], epoch: u32, target: SwitchId) {
        let (tor, Some(server)) = (self.tor, self.server) else {
            return;
        };
        self.next_id = self.next_id.wrapping_add(1);
        let header = Header {
            request_id: self.next_id,
            command: Command::Invalidate,
            key_hash: inc::key_hash(key),
            flags: flags::VIA,
            origin: 0,
            via: target,
            epoch,
            client: (std::net::Ipv4Addr::UNSPECIFIED, 0),
            server,
            lease_ms: 0,
        };
        let mut out = Vec::with_capacity(inc::HEADER_LEN + key.len());
        header.emit(&mut out);
        out.extend_from_slice(key);
        bump(&self.counters().home_invalidations);
        let _ = self.socket.send_to(&out, tor);
    }

    /// Sends the client of `h` the reply `message` (one memcached message, split into
    /// datagrams), by the ToR; the first datagram is a fill at `fill` when it is the only one.
    fn reply(&mut self, h: &Header, request_id: u16, message: &[u8], fill: Option<u32>) {
        let h = Header {
            flags: h.flags & !flags::FILL_ONLY,
            ..*h
        };
        self.send_reply(&h, request_id, message, fill);
    }

    /// As [`Home::reply`], keeping `h`'s [`flags::FILL_ONLY`]: a reply that only fills.
    fn send_reply(&mut self, h: &Header, request_id: u16, message: &[u8], fill: Option<u32>) {
        let tor = self.tor;
        let Some(pieces) = mcudp::pieces(request_id, message) else {
            return;
        };
        let pieces: Vec<_> = pieces.collect();
        let single = pieces.len() == 1;
        let mut out = Vec::new();
        for (mc, piece) in pieces {
            let header = Header {
                command: Command::Reply,
                flags: flags::EXPANDED
                    | (h.flags & (flags::DETOUR | flags::NATIVE | flags::VIA | flags::FILL_ONLY))
                    | if single && fill.is_some() {
                        flags::FILL
                    } else {
                        0
                    },
                epoch: if single { fill.unwrap_or(0) } else { 0 },
                ..*h
            };
            out.clear();
            header.emit(&mut out);
            let at = out.len();
            out.resize(at + mcudp::LEN, 0);
            mc.emit(&mut out[at..]);
            out.extend_from_slice(piece);
            let _ = self.socket.send_to(&out, tor);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::sync::atomic::AtomicBool;

    use super::*;
    use store::{read, Store};

    /// A home on loopback, and the socket that plays its ToR.
    struct Bed {
        shared: Arc<Shared>,
        tor: UdpSocket,
        home: SocketAddr,
        thread: Option<JoinHandle<()>>,
    }

    impl Drop for Bed {
        fn drop(&mut self) {
            self.shared
                .stop
                .store(true, std::sync::atomic::Ordering::Relaxed);
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }

    const SERVER: (Ipv4Addr, u16) = (Ipv4Addr::LOCALHOST, 11211);

    /// A home whose ToR is the bed's socket, with a lease of 100 ms (`change` may set more).
    fn bed(change: impl FnOnce(&mut HomeConfig)) -> Bed {
        let shared = Arc::new(Shared {
            store: Arc::new(Store::new(None, Box::new(crate::SystemHost::start()))),
            bucket: None,
            stop: AtomicBool::new(false),
            hooks: None,
        });
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let home = socket.local_addr().unwrap();
        let tor = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut cfg = HomeConfig::new(tor.local_addr().unwrap());
        cfg.lease = Duration::from_millis(100);
        change(&mut cfg);
        let thread = spawn(socket, shared.clone(), cfg).unwrap();
        tor.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        Bed {
            shared,
            tor,
            home,
            thread: Some(thread),
        }
    }

    fn header(command: Command, key: &[u8], origin: SwitchId, via: Option<SwitchId>) -> Header {
        Header {
            request_id: 9,
            command,
            key_hash: inc::key_hash(key),
            flags: flags::EXPANDED | if via.is_some() { flags::VIA } else { 0 },
            origin,
            via: via.unwrap_or(0),
            epoch: 0,
            client: (Ipv4Addr::new(10, 0, 0, 2), 40000),
            server: SERVER,
            lease_ms: 0,
        }
    }

    impl Bed {
        fn send(&self, h: Header, payload: &[u8]) {
            let mut out = Vec::new();
            h.emit(&mut out);
            out.extend_from_slice(payload);
            self.tor.send_to(&out, self.home).unwrap();
        }

        /// A client's request datagram in a message.
        fn request(&self, h: Header, body: &[u8]) {
            let mut d = vec![0u8; mcudp::LEN];
            mcudp::Header::single(7).emit(&mut d);
            d.extend_from_slice(body);
            self.send(h, &d);
        }

        /// The next message from the home: its header and payload.
        fn next(&self) -> (Header, Vec<u8>) {
            let mut buf = [0u8; 2048];
            let (n, _) = self.tor.recv_from(&mut buf).expect("the home answers");
            let m = Message::parse(&buf[..n]).unwrap();
            (m.header, m.payload.to_vec())
        }

        fn reply_body(&self) -> (Header, Vec<u8>) {
            let (h, p) = self.next();
            assert_eq!(h.command, Command::Reply);
            let (mc, body) = mcudp::Header::parse(&p).unwrap();
            assert_eq!(mc.request_id, 7, "the client's own request id");
            (h, body.to_vec())
        }
    }

    #[test]
    fn reads_fill_their_sharers_and_writes_wait_for_every_acknowledgement() {
        let b = bed(|_| {});
        b.request(
            header(Command::Set, b"k", 1, None),
            b"set k 0 0 2\r\nv1\r\n",
        );
        let (_, body) = b.reply_body();
        assert_eq!(body, b"STORED\r\n");

        // A read from ToR 1 by root 3: a fill, the two of them sharers.
        b.request(header(Command::Get, b"k", 1, Some(3)), b"get k\r\n");
        let (h, body) = b.reply_body();
        assert_eq!(body, b"VALUE k 0 2\r\nv1\r\nEND\r\n");
        assert!(
            h.has(flags::FILL) && h.has(flags::VIA) && h.via == 3,
            "{h:?}"
        );
        assert_eq!(
            (h.origin, h.client),
            (1, (Ipv4Addr::new(10, 0, 0, 2), 40000))
        );
        let fill_epoch = h.epoch;

        // A write: invalidations for both, and nothing applied until both acknowledged.
        b.request(
            header(Command::Set, b"k", 2, None),
            b"set k 0 0 2\r\nv2\r\n",
        );
        let mut targets = Vec::new();
        for _ in 0..2 {
            let (h, key) = b.next();
            assert_eq!(
                (h.command, key.as_slice()),
                (Command::Invalidate, &b"k"[..])
            );
            assert!(h.has(flags::VIA) && h.server == SERVER);
            assert!(
                epoch_after(h.epoch, fill_epoch),
                "{} after {fill_epoch}",
                h.epoch
            );
            targets.push((h.via, h.epoch));
        }
        targets.sort();
        assert_eq!(targets.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3]);
        let ack = |via: SwitchId, epoch: u32| Header {
            command: Command::InvalidateAck,
            flags: flags::VIA,
            via,
            epoch,
            ..header(Command::InvalidateAck, b"k", 1, None)
        };
        b.send(ack(1, targets[0].1), b"k");
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(read(&b.shared.store.counters.cmd_set), 1, "not applied yet");
        b.send(ack(3, targets[1].1), b"k");
        // Invalidations sent again while waiting may come first.
        let body = loop {
            let (h, p) = b.next();
            if h.command == Command::Reply {
                break mcudp::Header::parse(&p).unwrap().1.to_vec();
            }
        };
        assert_eq!(body, b"STORED\r\n");
        assert_eq!(read(&b.shared.store.counters.cmd_set), 2);
        assert!(read(&b.shared.store.counters.home_acks) >= 2);
    }

    #[test]
    fn under_write_update_a_stored_value_goes_to_every_tor_the_write_invalidated() {
        let b = bed(|c| c.update = true);
        b.request(
            header(Command::Set, b"k", 2, Some(3)),
            b"set k 3 0 2\r\nv1\r\n",
        );
        assert_eq!(b.reply_body().1, b"STORED\r\n");
        b.request(header(Command::Get, b"k", 1, Some(3)), b"get k\r\n");
        let fill = b.reply_body().0;
        assert!(fill.has(flags::FILL));
        // Acknowledges the invalidations of the write after `epoch` (those of an earlier
        // one, sent again, are skipped) until both sharers have; their names and the epoch.
        let acks_after = |epoch: u32, sharers: usize| {
            let (mut seen, mut at) = (Vec::new(), epoch);
            while seen.len() < sharers {
                let (h, _) = b.next();
                if h.command != Command::Invalidate || !epoch_after(h.epoch, epoch) {
                    continue;
                }
                at = h.epoch;
                let ack = Header {
                    command: Command::InvalidateAck,
                    flags: flags::VIA,
                    via: h.via,
                    epoch: h.epoch,
                    ..header(Command::InvalidateAck, b"k", 1, None)
                };
                b.send(ack, b"k");
                if !seen.contains(&h.via) {
                    seen.push(h.via);
                }
            }
            seen.sort();
            (seen, at)
        };
        // The writer's reply and, under write-update, ToR 1's fill-only copy by root 3.
        let replies = |update: bool| {
            let (mut stored, mut copy) = (None, None);
            while stored.is_none() || (update && copy.is_none()) {
                let (h, p) = b.next();
                if h.command != Command::Reply {
                    continue;
                }
                let body = mcudp::Header::parse(&p).unwrap().1.to_vec();
                match h.origin {
                    2 => stored = Some((h, body)),
                    _ => copy = Some((h, body)),
                }
            }
            (stored.unwrap(), copy)
        };
        // ToR 2's write by root 3: ToR 1 and root 3 are invalidated and acknowledge; the
        // writer hears STORED and ToR 1 gets the new value.
        b.request(
            header(Command::Set, b"k", 2, Some(3)),
            b"set k 3 0 2\r\nv2\r\n",
        );
        let (sharers, epoch) = acks_after(fill.epoch, 2);
        assert_eq!(sharers, vec![1, 3]);
        let (stored, copy) = replies(true);
        assert_eq!(stored.1, b"STORED\r\n");
        assert!(!stored.0.has(flags::FILL_ONLY), "{:?}", stored.0);
        let (h, body) = copy.unwrap();
        assert_eq!(body, b"VALUE k 3 2\r\nv2\r\nEND\r\n");
        assert_eq!(h.origin, 1);
        assert!(h.has(flags::FILL) && h.has(flags::FILL_ONLY), "{h:?}");
        assert!(h.has(flags::VIA) && h.via == 3, "{h:?}");
        assert!(epoch_after(h.epoch, epoch), "stamped after the write");
        assert_eq!(read(&b.shared.store.counters.home_updates), 1);
        // Both are sharers again: the next write invalidates them before it is applied.
        b.request(
            header(Command::Set, b"k", 2, Some(3)),
            b"set k 0 0 2\r\nv3\r\n",
        );
        let (sharers, epoch) = acks_after(h.epoch, 2);
        assert_eq!(sharers, vec![1, 3]);
        let (_, copy) = replies(true);
        let (h, body) = copy.unwrap();
        assert_eq!(body, b"VALUE k 0 2\r\nv3\r\nEND\r\n");
        assert_eq!(read(&b.shared.store.counters.home_updates), 2);
        // A delete updates nothing.
        b.request(header(Command::Del, b"k", 2, Some(3)), b"delete k\r\n");
        let (sharers, _) = acks_after(epoch.max(h.epoch), 2);
        assert_eq!(sharers, vec![1, 3]);
        let (deleted, _) = replies(false);
        assert_eq!(deleted.1, b"DELETED\r\n");
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(read(&b.shared.store.counters.home_updates), 2);
        // A read of this rack (by no root) makes ToR 4 a sharer and names the ToR's own id:
        // its copy after a write comes with no root to fill on the way.
        b.request(
            header(Command::Set, b"k", 2, Some(3)),
            b"set k 0 0 1\r\nx\r\n",
        );
        let (stored, _) = replies(false);
        assert_eq!(stored.1, b"STORED\r\n");
        b.request(header(Command::Get, b"k", 4, None), b"get k\r\n");
        let fill = b.reply_body().0;
        assert!(fill.has(flags::FILL) && !fill.has(flags::VIA), "{fill:?}");
        b.request(
            header(Command::Set, b"k", 2, Some(3)),
            b"set k 0 0 1\r\ny\r\n",
        );
        let (sharers, _) = acks_after(fill.epoch, 1);
        assert_eq!(sharers, vec![4]);
        let (_, copy) = replies(true);
        let (h, body) = copy.unwrap();
        assert_eq!(body, b"VALUE k 0 1\r\ny\r\nEND\r\n");
        assert_eq!(h.origin, 4);
        assert!(h.has(flags::FILL_ONLY) && !h.has(flags::VIA), "{h:?}");
    }

    fn epoch_after(a: u32, b: u32) -> bool {
        kv::fabric::epoch_before(b, a)
    }

    #[test]
    fn a_computed_increment_fills_only_when_nothing_changed_the_key_since_the_copy() {
        let b = bed(|_| {});
        b.request(header(Command::Set, b"c", 1, None), b"set c 0 0 1\r\n5\r\n");
        assert_eq!(b.reply_body().1, b"STORED\r\n");
        b.request(header(Command::Get, b"c", 2, None), b"get c\r\n");
        let (h, _) = b.reply_body();
        assert!(h.has(flags::FILL));
        let copy = h.epoch;
        let computed = |epoch: u32| Header {
            flags: flags::EXPANDED | flags::COMPUTED,
            epoch,
            ..header(Command::Increment, b"c", 2, None)
        };
        // Switch 2 computed 6 on its copy: the write invalidates it, then fills it again.
        b.request(computed(copy), b"incr c 1\r\n");
        let (inv, _) = b.next();
        assert_eq!((inv.command, inv.via), (Command::Invalidate, 2));
        b.send(
            Header {
                command: Command::InvalidateAck,
                flags: flags::VIA,
                via: 2,
                epoch: inv.epoch,
                ..header(Command::InvalidateAck, b"c", 1, None)
            },
            b"c",
        );
        let (h, body) = b.reply_body();
        assert_eq!(body, b"6\r\n");
        assert!(h.has(flags::FILL), "{h:?}");
        let filled = h.epoch;

        // A copy older than a change since: its increment is executed, and fills nothing.
        b.request(computed(copy), b"incr c 1\r\n");
        let reply = loop {
            let (h, p) = b.next();
            match h.command {
                Command::Invalidate => b.send(
                    Header {
                        command: Command::InvalidateAck,
                        flags: flags::VIA,
                        via: h.via,
                        epoch: h.epoch,
                        ..header(Command::InvalidateAck, b"c", 1, None)
                    },
                    b"c",
                ),
                _ => break (h, p),
            }
        };
        assert_eq!(mcudp::Header::parse(&reply.1).unwrap().1, b"7\r\n");
        assert!(
            !reply.0.has(flags::FILL),
            "a stale copy's computation keeps nothing"
        );
        assert!(filled != copy);
    }

    #[test]
    fn unanswered_invalidations_are_sent_again_and_fail_the_write_or_end_with_a_failed_switch() {
        let b = bed(|c| {
            c.retry = Duration::from_millis(20);
            c.give_up = Duration::from_millis(300);
        });
        b.request(header(Command::Get, b"x", 4, None), b"get x\r\n");
        assert_eq!(b.reply_body().1, b"END\r\n", "a miss fills nothing");
        b.request(header(Command::Set, b"x", 1, None), b"set x 0 0 1\r\na\r\n");
        assert_eq!(b.reply_body().1, b"STORED\r\n");
        b.request(header(Command::Get, b"x", 4, None), b"get x\r\n");
        assert!(b.reply_body().0.has(flags::FILL));

        // Switch 4 never answers: its invalidation is sent again, and the write fails.
        b.request(header(Command::Del, b"x", 1, None), b"delete x\r\n");
        let mut sent = 0;
        let body = loop {
            let (h, p) = b.next();
            match h.command {
                Command::Invalidate => sent += 1,
                Command::Reply => break mcudp::Header::parse(&p).unwrap().1.to_vec(),
                other => panic!("{other:?}"),
            }
        };
        assert!(
            sent >= 3,
            "{sent} invalidations: sent again until the give-up"
        );
        assert!(
            body.starts_with(b"SERVER_ERROR"),
            "{:?}",
            String::from_utf8_lossy(&body)
        );
        assert_eq!(read(&b.shared.store.counters.home_writes_failed), 1);

        // Read again (a fill for 4), then 4 is declared failed while a write waits for it:
        // the write goes on.
        b.request(header(Command::Get, b"x", 4, None), b"get x\r\n");
        assert!(b.reply_body().0.has(flags::FILL));
        b.request(header(Command::Del, b"x", 1, None), b"delete x\r\n");
        assert_eq!(b.next().0.command, Command::Invalidate);
        b.send(
            Header {
                command: Command::InvalidateAck,
                flags: flags::VIA | flags::FAILED,
                via: 4,
                ..header(Command::InvalidateAck, b"", 1, None)
            },
            &[],
        );
        let body = loop {
            let (h, p) = b.next();
            if h.command == Command::Reply {
                break mcudp::Header::parse(&p).unwrap().1.to_vec();
            }
        };
        assert_eq!(body, b"DELETED\r\n");
    }

    #[test]
    fn a_starting_home_holds_writes_and_fills_nothing_for_a_lease_and_hears_only_its_tor() {
        let started = std::time::Instant::now();
        let b = bed(|c| c.lease = Duration::from_millis(400));
        b.request(header(Command::Set, b"s", 1, None), b"set s 0 0 1\r\nx\r\n");
        b.request(header(Command::Get, b"s", 1, None), b"get s\r\n");
        // The read is answered at once, before the held write, and fills nothing.
        let (h, body) = b.reply_body();
        assert_eq!(body, b"END\r\n");
        assert!(!h.has(flags::FILL));
        let (_, body) = b.reply_body();
        assert_eq!(body, b"STORED\r\n");
        assert!(
            started.elapsed() >= Duration::from_millis(400),
            "{:?}",
            started.elapsed()
        );
        b.request(header(Command::Get, b"s", 1, None), b"get s\r\n");
        assert!(b.reply_body().0.has(flags::FILL), "ready: reads fill");

        // Anyone but the ToR is not heard, however well formed.
        let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut out = Vec::new();
        header(Command::Get, b"s", 1, None).emit(&mut out);
        stranger.send_to(&out, b.home).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(read(&b.shared.store.counters.home_refused), 1);
    }

    #[test]
    fn conditional_puts_store_only_a_larger_number_and_bad_messages_are_counted() {
        let b = bed(|_| {});
        b.request(
            header(Command::CondPut, b"n", 1, None),
            b"set n 0 0 2\r\n10\r\n",
        );
        assert_eq!(b.reply_body().1, b"STORED\r\n", "unset: stored");
        b.request(
            header(Command::CondPut, b"n", 1, None),
            b"set n 0 0 1\r\n9\r\n",
        );
        assert_eq!(b.reply_body().1, b"NOT_STORED\r\n");
        b.request(
            header(Command::CondPut, b"n", 1, None),
            b"set n 0 0 2\r\n11\r\n",
        );
        assert_eq!(b.reply_body().1, b"STORED\r\n");
        b.request(header(Command::Increment, b"n", 1, None), b"incr n 4\r\n");
        assert_eq!(b.reply_body().1, b"15\r\n");
        // A command that does not match its request, and a key hash that does not.
        b.request(header(Command::Del, b"n", 1, None), b"incr n 4\r\n");
        assert!(b.reply_body().1.starts_with(b"CLIENT_ERROR"));
        b.request(header(Command::Get, b"m", 1, None), b"get n\r\n");
        assert!(b.reply_body().1.starts_with(b"CLIENT_ERROR"));
        b.tor.send_to(b"not a message at all", b.home).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(read(&b.shared.store.counters.home_malformed), 3);
    }
}
