//! The cache on the switch's UDP path: what the switch does around a request to the VIP and
//! around a server's reply to a client, and the `kv_cache` table that mirrors the cache's rules.
//!
//! A request is matched against `kv_cache` (exact on the key hash) only when it is one read the
//! cache could answer; a hit hands it to [`UdpCache::serve`], and a miss there (a stale rule, no
//! value yet, an expired lease) sends it through the pipeline again to its server. Writes open
//! their keys' coherence writes before they are forwarded and close them when the server's
//! reply to the client passes, or after the write timeout. Reads of cached keys that are
//! forwarded are remembered by client and request id, and their replies, reassembled when they
//! take several datagrams, fill the cache.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use kv::Instant;

use pipeline::{Action, Entry, EntryId, Pipeline, TableId};
use wire::mcudp;
use wire::memcache::{self, Request};

use crate::cache::{CacheService, ReadFill, Writes};
use crate::stats::Drop;

/// Reads waiting for their reply to fill the cache, at most.
const MAX_READS: usize = 65_536;
/// Writes waiting for their reply, at most; a write past it is dropped (it could not be
/// tracked, and forwarding it untracked could let a stale read through).
const MAX_WRITES: usize = 262_144;
/// Most datagrams of one reply reassembled for a fill (memcached's 1 MiB items fit).
const MAX_REPLY_DATAGRAMS: u16 = 1024;
/// How long a forwarded read waits for its reply to fill.
const READ_TIMEOUT: Duration = Duration::from_secs(1);

/// Who a request came from and which one it was: the key of a reply that passes back.
type Ticket = (Ipv4Addr, u16, u16);

enum Pending {
    Read {
        fill: ReadFill,
        parts: Vec<Option<Vec<u8>>>,
        deadline: Instant,
    },
    Write {
        writes: Writes,
        deadline: Instant,
    },
}

pub struct UdpCache {
    service: Arc<CacheService>,
    /// What each forwarded request waits for, by ticket. Looked up, or scanned for the
    /// earliest deadline and for the expired (which are then sorted).
    pending: HashMap<Ticket, Pending>,
    reads: usize,
    writes: usize,
    /// Installed `kv_cache` entries by key hash, with how many cached keys share the hash.
    /// Only looked up: rule changes are applied in the order the cache released them.
    rules: HashMap<u32, (u32, EntryId)>,
    table: TableId,
    write_timeout: Duration,
}

impl UdpCache {
    pub fn new(service: Arc<CacheService>, table: TableId) -> UdpCache {
        service.lock().keep_rule_changes(true);
        let write_timeout = service.settings().write_timeout;
        UdpCache {
            service,
            pending: HashMap::new(),
            reads: 0,
            writes: 0,
            rules: HashMap::new(),
            table,
            write_timeout,
        }
    }

    pub fn service(&self) -> &Arc<CacheService> {
        &self.service
    }

    /// Before a datagram of requests to one server is forwarded: opens the writes it carries,
    /// and shows a read to hot-key detection. Returns whether it is one read the cache may
    /// answer (it is then matched against `kv_cache`), or the reason to drop it.
    pub fn on_request(
        &mut self,
        client: (Ipv4Addr, u16),
        request_id: u16,
        body: &[u8],
        locate: &mut dyn FnMut(&[u8]) -> usize,
        now: Instant,
    ) -> Result<bool, Drop> {
        let requests = parse_all(body);
        let ticket = (client.0, client.1, request_id);
        let mut opened: Option<Writes> = None;
        for request in &requests {
            if let Some(writes) = self.service.before_write(request, now) {
                match &mut opened {
                    Some(all) => all.extend(writes),
                    None => opened = Some(writes),
                }
            }
        }
        if let Some(writes) = opened {
            if self.writes >= MAX_WRITES {
                self.service.after_write(writes);
                return Err(Drop::CacheWritesFull);
            }
            self.settle(ticket);
            self.writes += 1;
            let deadline = now + self.write_timeout;
            self.pending
                .insert(ticket, Pending::Write { writes, deadline });
            return Ok(false);
        }
        let [request] = requests.as_slice() else {
            return Ok(false);
        };
        if !request.command.is_retrieval() {
            return Ok(false);
        }
        self.service.see(request, locate, now);
        Ok(memcache::cached::servable(request).is_some())
    }

    /// The reply to a read that `kv_cache` matched, if the cache can answer it now.
    pub fn serve(&self, body: &[u8], now: Instant) -> Option<Vec<u8>> {
        let request = single(body)?;
        self.service.serve(&request, now)
    }

    /// After a read was forwarded to its server: remembers it if its reply may fill.
    pub fn on_forwarded_read(
        &mut self,
        client: (Ipv4Addr, u16),
        request_id: u16,
        body: &[u8],
        now: Instant,
    ) {
        let Some(request) = single(body) else {
            return;
        };
        if !request.command.is_retrieval() || self.reads >= MAX_READS {
            return;
        }
        let Some(fill) = self.service.before_read(&request) else {
            return;
        };
        let ticket = (client.0, client.1, request_id);
        self.settle(ticket);
        self.reads += 1;
        self.pending.insert(
            ticket,
            Pending::Read {
                fill,
                parts: Vec::new(),
                deadline: now + READ_TIMEOUT,
            },
        );
    }

    /// A server's reply datagram to a client passes: it closes a write, or fills once whole.
    /// Called before the datagram is forwarded, so the client sees it only after.
    pub fn on_reply(&mut self, client: (Ipv4Addr, u16), payload: &[u8], now: Instant) {
        if self.pending.is_empty() {
            return;
        }
        let Ok((header, body)) = mcudp::Header::parse(payload) else {
            return;
        };
        let ticket = (client.0, client.1, header.request_id);
        let Some(pending) = self.pending.get_mut(&ticket) else {
            return;
        };
        match pending {
            Pending::Write { .. } => self.settle(ticket),
            Pending::Read { parts, .. } => {
                let (seq, total) = (header.seq, header.total);
                if total == 0 || total > MAX_REPLY_DATAGRAMS || seq >= total {
                    self.settle(ticket);
                    return;
                }
                if parts.is_empty() {
                    parts.resize(usize::from(total), None);
                }
                if parts.len() != usize::from(total) {
                    self.settle(ticket);
                    return;
                }
                parts[usize::from(seq)] = Some(body.to_vec());
                if parts.iter().any(Option::is_none) {
                    return;
                }
                if let Some(Pending::Read { fill, parts, .. }) = self.pending.remove(&ticket) {
                    self.reads -= 1;
                    let reply: Vec<u8> = parts.into_iter().flatten().flatten().collect();
                    self.service.after_read(fill, &reply, now);
                }
            }
        }
    }

    /// Forgets what waits under `ticket`; an open write is closed.
    /// The switch answered the client's write itself (a replicated write, once every replica
    /// had): the write is over, as if its reply had passed.
    pub fn write_answered(&mut self, client: (Ipv4Addr, u16), request_id: u16) {
        if let Some(Pending::Write { .. }) = self.pending.get(&(client.0, client.1, request_id)) {
            self.settle((client.0, client.1, request_id));
        }
    }

    fn settle(&mut self, ticket: Ticket) {
        match self.pending.remove(&ticket) {
            Some(Pending::Write { writes, .. }) => {
                self.writes -= 1;
                self.service.after_write(writes);
            }
            Some(Pending::Read { .. }) => self.reads -= 1,
            None => {}
        }
    }

    /// The earliest instant at which [`UdpCache::tick`] has work: a reply given up on, or
    /// the cache's own next deadline.
    pub fn poll_at(&self) -> Option<Instant> {
        let replies = self
            .pending
            .values()
            .map(|p| match p {
                Pending::Read { deadline, .. } | Pending::Write { deadline, .. } => *deadline,
            })
            .min();
        [replies, self.service.poll_at()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Periodic work: gives up on replies that did not come, rolls the cache's segment,
    /// releases rule changes and mirrors them into `kv_cache`.
    pub fn tick(&mut self, now: Instant, pipeline: &mut Pipeline, key_hash: &dyn Fn(&[u8]) -> u32) {
        let mut expired: Vec<Ticket> = self
            .pending
            .iter()
            .filter(|(_, p)| match p {
                Pending::Read { deadline, .. } | Pending::Write { deadline, .. } => {
                    *deadline <= now
                }
            })
            .map(|(t, _)| *t)
            .collect();
        // Given up in ticket order (client address, port, request id), not the map's: closing
        // writes commutes today, and a stated order keeps it so if settling ever says more.
        expired.sort_unstable();
        for ticket in expired {
            self.settle(ticket);
        }
        self.service.tick(now);
        let changes = self.service.lock().take_rule_changes();
        for change in changes {
            match change {
                kv::rules::Change::Add(key) => {
                    let hash = key_hash(&key);
                    if let Some((refs, _)) = self.rules.get_mut(&hash) {
                        *refs += 1;
                        continue;
                    }
                    let entry = Entry::exact(rule_key(hash), vec![Action::ToCpu(CPU_CACHE)]);
                    if let Ok(id) = pipeline.insert(self.table, entry) {
                        self.rules.insert(hash, (1, id));
                    }
                }
                kv::rules::Change::Remove(key) => {
                    let hash = key_hash(&key);
                    let Some((refs, id)) = self.rules.get_mut(&hash) else {
                        continue;
                    };
                    *refs -= 1;
                    if *refs == 0 {
                        let id = *id;
                        self.rules.remove(&hash);
                        let _ = pipeline.remove(self.table, id);
                    }
                }
            }
        }
    }
}

/// The reason `kv_cache` hands a frame to the cache.
pub const CPU_CACHE: u16 = 201;
/// The register that says a frame is one read the cache may answer.
pub const REG_CACHE: usize = 1;

/// The `kv_cache` key of a rule: the register's value 1, then the key hash.
pub fn rule_key(hash: u32) -> Vec<u8> {
    let mut key = Vec::with_capacity(8);
    key.extend_from_slice(&1u32.to_be_bytes());
    key.extend_from_slice(&hash.to_be_bytes());
    key
}

/// The requests at the front of the datagram, up to the first that does not parse.
fn parse_all(body: &[u8]) -> Vec<Request<'_>> {
    let mut out = Vec::new();
    let mut offset = 0;
    while let Some(Ok(Some(request))) = body
        .get(offset..)
        .filter(|b| !b.is_empty())
        .map(memcache::parse)
    {
        offset += request.len.max(1);
        out.push(request);
    }
    out
}

/// The datagram's request if it holds exactly one.
fn single(body: &[u8]) -> Option<Request<'_>> {
    let request = memcache::parse(body).ok()??;
    (request.len == body.len()).then_some(request)
}
