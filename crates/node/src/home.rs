//! `--role home`: the node keeps the caching fabric's directory for its own keys (IncBricks
//! 4.3), in place of its ToR, and stays memcached to everything else.
//!
//! It speaks only to its ToR, on UDP port [`inc::PORT`] of its own address. The ToR passes it
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
//! - takes an acknowledgement flagged [`flags::FAILED`] as "switch `via` is counted out":
//!   the writes that waited for it go on.
//!
//! The ToR only relays and says which way replies go: the order of writes, the sharer lists
//! and the epochs are the node's.

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

use crate::store::bump;
use crate::Shared;

/// The directory's settings (the same names and defaults as a fabric file's).
#[derive(Debug, Clone, Copy)]
pub struct HomeConfig {
    /// Unacknowledged invalidations are sent again this often.
    pub retry: Duration,
    /// A write whose invalidations are not all acknowledged by then fails, unapplied.
    pub give_up: Duration,
    /// The caches' lease: how long a copy may live without the home seeing it.
    pub lease: Duration,
    /// Most keys with sharers; past it, replies do not fill.
    pub keys: usize,
}

impl Default for HomeConfig {
    fn default() -> HomeConfig {
        HomeConfig {
            retry: Duration::from_millis(20),
            give_up: Duration::from_millis(1000),
            lease: Duration::from_secs(2),
            keys: 1 << 20,
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
}

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
    /// The ToR, as its messages come from it.
    tor: Option<SocketAddr>,
    /// This server as the fabric names it (address and memcached port), from the requests.
    server: Option<(std::net::Ipv4Addr, u16)>,
    started: std::time::Instant,
    next_id: u16,
}

impl<'a> Home<'a> {
    fn new(shared: &'a Shared, socket: &'a UdpSocket, cfg: HomeConfig) -> Home<'a> {
        Home {
            shared,
            socket,
            // Writes are applied here at once: the reply timeout never runs.
            directory: Directory::new(cfg.keys, cfg.retry, cfg.give_up, cfg.lease, cfg.lease),
            tor: None,
            server: None,
            started: std::time::Instant::now(),
            next_id: 0,
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
            for due in self.directory.tick(now) {
                match due {
                    Due::Retransmit { key, epoch, target } => self.invalidate(&key, epoch, target),
                    Due::Step { key, step } => self.step(&key, step),
                }
            }
        }
    }

    fn counters(&self) -> &crate::store::Counters {
        &self.shared.store.counters
    }

    /// One message from the ToR.
    fn message(&mut self, from: SocketAddr, bytes: &[u8]) {
        let Ok(msg) = Message::parse(bytes) else {
            bump(&self.counters().home_malformed);
            return;
        };
        self.tor = Some(from);
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
                let write = Write {
                    header: h,
                    key: key.clone(),
                    datagram: datagram.to_vec(),
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
        if out.len() <= mcudp::MAX_PAYLOAD && reply_key(&out) == Some(key) {
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
            let mut get = b"get ".to_vec();
            get.extend_from_slice(&write.key);
            get.extend_from_slice(b"\r\n");
            let mut current = Vec::new();
            crate::udp::execute(self.shared, &get, &mut current);
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
        // A quiet write answers nothing.
        if !out.is_empty() {
            self.reply(&write.header, mc.request_id, &out, None);
        }
        if let Some(step) = self.directory.done(&write.key, self.now()) {
            self.step(&write.key, step);
        }
    }

    /// Sends the ToR the invalidation of `key` at `epoch` for `target`.
    fn invalidate(&mut self, key: &[u8], epoch: u32, target: SwitchId) {
        let (Some(tor), Some(server)) = (self.tor, self.server) else {
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
        let Some(tor) = self.tor else {
            return;
        };
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
                    | (h.flags & (flags::DETOUR | flags::NATIVE | flags::VIA))
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
