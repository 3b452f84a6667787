//! The switch application: a parser stage, the match-action pipeline that holds the switch's
//! behaviour as table entries, and the CPU path (ARP for the VIP, answers memcached would give,
//! split multi-key gets). TCP for the VIP leaves through the local port, into the host's own
//! stack where the proxy runs.
//!
//! Driven by the run loop (or a test): frames and the time come in, a fate for each frame and
//! a list of frames to emit go out. No I/O here.

use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use kv::Instant;

use pipeline::{
    Action, Choose, Entry, Field, MatchKind, Meta, Pipeline, SelectorId, TableId, TableSpec,
    Verdict,
};
use wire::ethernet::{self, EtherType, Mac};
use wire::memcache::{self, Command, Protocol};
use wire::{arp, ipv4, mcudp, udp};

use crate::cache::CacheService;
use crate::frame::{self, UdpEnds};
use crate::pool::{Pool, View};
use crate::ratelimit::ReplyLimiter;
use crate::source::{self, Check, SourceGuard};
use crate::spec::{splitmix64, Mode, SpecError, SwitchSpec};
use crate::split::{self, Arrival, Splitter};
use crate::stats::{self, Answer, Drop, Stats};
use crate::udp_cache::{UdpCache, CPU_CACHE, REG_CACHE};

/// What the run loop does with a received frame after processing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Send the (possibly rewritten) frame out of this port.
    Out(u16),
    /// Send it out of every port but the one it came from and the local port (the host's end
    /// needs only frames for the VIP's MAC, and ARP for its addresses is answered here).
    Flood,
    /// Nothing more to do: dropped (and counted) or handled by the CPU path.
    Consumed,
}

/// Where a frame the switch originates goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dest {
    Port(u16),
    /// Every port but the local port.
    Flood,
}

/// A routed request waiting for its server's port.
struct Held {
    dst: Mac,
    frame: Vec<u8>,
    since: Instant,
}

/// Routed requests held at most while servers' ports are being resolved (right after start).
const HOLD_MAX: usize = 256;
/// How long a routed request waits for its server's port before it is dropped.
const HOLD_FOR: std::time::Duration = std::time::Duration::from_secs(1);

/// A frame the switch originates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emit {
    pub dest: Dest,
    pub frame: Vec<u8>,
}

// Pipeline reason codes for the CPU path (below the switch's drop codes, above the pipeline's).
const CPU_ARP: u16 = 200;

// Metadata flags set by the parser stage.
/// The frame is IPv4 with a 20-byte header, not a fragment, carrying UDP: byte-range fields
/// at fixed offsets are valid.
const FLAG_PLAIN_UDP: u32 = 1;
/// The same for TCP: addresses and ports at the same offsets as for UDP.
const FLAG_PLAIN_TCP: u32 = 2;
/// Register 0 holds this when the parser stage routed the frame by key (a memcached request to
/// the VIP); no table matches on it.
const REG_ROUTED: usize = 0;

// Byte offsets of the fields the tables match, valid for untagged IPv4 with a 20-byte header.
const OFF_ETHERTYPE: u16 = 12;
const OFF_ARP_OP: u16 = 20;
const OFF_ARP_TARGET_IP: u16 = 38;
const OFF_IP_PROTO: u16 = 23;
const OFF_IP_SRC: u16 = 26;
const OFF_IP_DST: u16 = 30;
/// UDP and TCP ports: the same offsets for both.
const OFF_L4_SRC: u16 = 34;
const OFF_L4_DST: u16 = 36;
/// ARP operation codes as the `arp_vip` table matches them.
const ARP_REQUEST: u16 = 1;
const ARP_REPLY: u16 = 2;

/// How often servers whose MAC or port is unknown are asked for with ARP.
const ARP_RETRY: Duration = Duration::from_secs(1);
/// The period of ageing passes (stations, source addresses, reply buckets), on a grid from the
/// first tick.
const AGEING_EVERY: Duration = Duration::from_secs(1);

/// A view of the switch for the status API, refreshed by the run loop.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub backend_macs: Vec<Option<String>>,
    pub mac_table: usize,
    /// Source addresses bound to ports (with `switch.source_check`).
    pub source_table: usize,
    /// Clients with a bucket of reply bytes of their own.
    pub reply_buckets: usize,
    pub splits_in_flight: usize,
    pub tables: Vec<TableInfo>,
}

#[derive(Debug, Clone)]
pub struct TableInfo {
    pub name: String,
    pub kind: String,
    pub entries: usize,
    pub hits: u64,
    pub misses: u64,
}

/// Where a learned MAC lives and when it was last heard from.
struct Station {
    port: u16,
    seen: Instant,
}

/// The pool's ring, as the pipeline's hash selector sees it: a key hash to a server.
struct RingChooser(Arc<View>);

impl Choose for RingChooser {
    fn choose(&self, key_hash: u32) -> Option<usize> {
        self.0.locate_hash(key_hash)
    }
}

struct Tables {
    l2: TableId,
    ring: SelectorId,
    /// `kv_cache`, when the cache is on: exact on the key hash of reads it may answer.
    cache: Option<TableId>,
}

pub struct Switch {
    spec: SwitchSpec,
    ports: usize,
    /// The pool keys are routed by, shared with the proxy.
    pool: Arc<Pool>,
    /// The pool as the selector routes by it now.
    view: Arc<View>,
    pipeline: Pipeline,
    tables: Tables,
    /// Learned MAC → port; mirrors the pipeline's `l2` table. Looked up and counted; the
    /// ageing pass sorts what it removes.
    macs: HashMap<Mac, Station>,
    backend_macs: Vec<Option<Mac>>,
    backend_by_ip: HashMap<Ipv4Addr, usize>,
    splitter: Splitter,
    stats: Arc<Stats>,
    last_arp: Option<Instant>,
    /// Routed requests whose server's port is not known yet, oldest first: sent out of that
    /// port once the server is heard from, dropped after [`HOLD_FOR`].
    held: VecDeque<Held>,
    /// The time of the frame or tick being handled.
    now: Option<Instant>,
    /// When the next ageing pass is due: a point of the grid of [`AGEING_EVERY`] from the
    /// first tick, so that passes happen at the same instants however often the caller ticks.
    next_ageing: Option<Instant>,
    /// Each server's address and memcached port: where split parts must come from.
    sources: Vec<(Ipv4Addr, u16)>,
    /// The local port's index (after the configured ports), when there is one.
    local: Option<u16>,
    /// The addresses of the host's end of the local port (empty without one).
    local_ips: Vec<Ipv4Addr>,
    /// The cache's part of the UDP path, once [`Switch::set_cache`] attached one.
    cache: Option<UdpCache>,
    /// The source-address check, when `switch.source_check` is on.
    guard: Option<SourceGuard>,
    /// Reply bytes per client, unless `switch.udp_reply_bytes_per_sec` is 0.
    limiter: Option<ReplyLimiter>,
    /// The VIP network's broadcast address, when it has one (prefixes up to /30).
    vip_broadcast: Option<Ipv4Addr>,
}

impl Switch {
    /// Builds the switch `spec` describes, routing by `pool` (shared with the proxy, whose
    /// health changes it follows) and counting into `stats`.
    pub fn new(spec: SwitchSpec, pool: Arc<Pool>, stats: Arc<Stats>) -> Result<Switch, SpecError> {
        if let Some(local) = &spec.local {
            if usize::from(local.port) >= spec.ports {
                return Err(SpecError::LocalPort {
                    needed: local.port,
                    ports: spec.ports,
                });
            }
        }
        if pool.spec().servers.len() != spec.servers.len() {
            return Err(SpecError::PoolMismatch {
                servers: spec.servers.len(),
                pool: pool.spec().servers.len(),
            });
        }
        let local = spec.local.as_ref().map(|l| l.port);
        let local_ips: Vec<Ipv4Addr> = spec
            .local
            .as_ref()
            .map(|l| l.addrs.clone())
            .unwrap_or_default();
        let mut pipeline = Pipeline::new();
        let tables = build_tables(&mut pipeline, &spec)?;
        let backend_macs: Vec<Option<Mac>> = spec.servers.iter().map(|b| b.mac).collect();
        let backend_by_ip = spec
            .servers
            .iter()
            .enumerate()
            .map(|(i, b)| (*b.addr.ip(), i))
            .collect();
        let mut seed = spec.seed;
        let first_request_id = splitmix64(&mut seed) as u16;
        let view = pool.view(Instant::ZERO);
        let mut sw = Switch {
            ports: spec.ports,
            pool,
            view,
            pipeline,
            tables,
            macs: HashMap::new(),
            backend_macs,
            backend_by_ip,
            splitter: Splitter::new(spec.split_timeout, first_request_id),
            stats,
            last_arp: None,
            held: VecDeque::new(),
            now: None,
            next_ageing: None,
            sources: spec
                .servers
                .iter()
                .map(|b| (*b.addr.ip(), b.addr.port()))
                .collect(),
            local,
            local_ips,
            cache: None,
            guard: spec.source_check.as_ref().map(|c| {
                SourceGuard::new(
                    local.map_or(spec.ports, usize::from),
                    c.prefixes.clone(),
                    c.table_size,
                    c.age,
                )
            }),
            limiter: spec.reply_limit.map(|l| ReplyLimiter::new(l.rate, l.burst)),
            vip_broadcast: (spec.vip.prefix_len <= 30).then(|| {
                Ipv4Addr::from(u32::from(spec.vip.ip) | (u32::MAX >> spec.vip.prefix_len))
            }),
            spec,
        };
        sw.install_members()?;
        Ok(sw)
    }

    /// Attaches the cache that answers hot keys; the configuration must have turned it on
    /// (`cache.enabled`), which gives the pipeline its `kv_cache` table.
    pub fn set_cache(&mut self, service: Arc<CacheService>) -> Result<(), SpecError> {
        let Some(table) = self.tables.cache else {
            return Err(SpecError::CacheOff);
        };
        self.cache = Some(UdpCache::new(service, table));
        Ok(())
    }

    /// The local port's number, if there is one. Floods ([`Fate::Flood`], [`Dest::Flood`])
    /// never go out of it.
    pub fn local_port(&self) -> Option<u16> {
        self.local
    }

    /// Routes by the pool's current view if it changed (a server ejected or restored by the
    /// proxy or the control plane) or a server out of it is due back at `now`. One atomic
    /// read when nothing changed.
    fn refresh_pool(&mut self, now: Instant) {
        let due = self.view.next_return().is_some_and(|t| t <= now);
        if !due && self.pool.version() == self.view.version() {
            return;
        }
        self.view = self.pool.view(now);
        if let Err(e) = self.install_members() {
            tracing::warn!("routing by the pool's new view failed: {e}");
        }
    }

    /// When the switch next needs [`Switch::tick`] if no frame comes first: the earliest of a
    /// held request's deadline, the next ARP round for a server whose MAC or port is unknown
    /// or whose station is half-way to ageing, the next ageing pass (while there is anything
    /// to age), a split get's deadline, a server's return to the pool and the cache's next
    /// deadline. An instant not after the caller's now means at once (the first tick is due at
    /// once). `None`: nothing is waiting.
    ///
    /// Nothing a tick does falls due before this instant, so a caller that ticks at `poll_at`
    /// (and again after every frame that makes it earlier) meets every deadline that a caller
    /// ticking every few milliseconds meets, and no later.
    pub fn poll_at(&self) -> Option<Instant> {
        let Some(_) = self.now else {
            return Some(Instant::ZERO);
        };
        let held = self.held.iter().map(|h| h.since + HOLD_FOR).min();
        let arp_round = self.last_arp.map_or(Instant::ZERO, |t| t + ARP_RETRY);
        let arp = (0..self.spec.servers.len())
            .map(|i| {
                let half_age = self.spec.mac_age / 2;
                let wanted = match self.backend_macs[i].and_then(|mac| self.macs.get(&mac)) {
                    Some(station) => station.seen + half_age + Duration::from_nanos(1),
                    None => Instant::ZERO,
                };
                wanted.max(arp_round)
            })
            .min();
        let ageing_due = !self.macs.is_empty()
            || self.guard.as_ref().is_some_and(|g| !g.is_empty())
            || self.limiter.as_ref().is_some_and(|l| !l.is_empty());
        let ageing = ageing_due.then(|| self.next_ageing.unwrap_or(Instant::ZERO));
        let cache = self.cache.as_ref().and_then(UdpCache::poll_at);
        [
            held,
            arp,
            ageing,
            self.splitter.next_deadline(),
            self.view.next_return(),
            cache,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// (Re)installs the ring selector's members from what is known of each backend, and its
    /// chooser from the pool's view.
    fn install_members(&mut self) -> Result<(), SpecError> {
        let members = self
            .spec
            .servers
            .iter()
            .zip(&self.backend_macs)
            .map(|(b, mac)| match mac {
                Some(mac) => {
                    let mut acts = vec![Action::SetEthDst(mac.0)];
                    if self.spec.mode == Mode::L3 {
                        acts.push(Action::SetIpv4Dst(b.addr.ip().octets()));
                    }
                    acts.push(Action::Goto(self.tables.l2));
                    acts
                }
                None => vec![Action::Drop(Drop::BackendUnresolved.code())],
            })
            .collect();
        self.pipeline.set_selector(
            self.tables.ring,
            members,
            Box::new(RingChooser(self.view.clone())),
        )?;
        Ok(())
    }

    /// Processes one received frame. Rewrites happen in place in `frame`; frames the switch
    /// originates are appended to `emit`.
    pub fn process(
        &mut self,
        in_port: u16,
        frame: &mut [u8],
        csum_ready: bool,
        now: Instant,
        emit: &mut Vec<Emit>,
    ) -> Fate {
        let (src, dst, ethertype) = match ethernet::Frame::new_checked(&frame[..]) {
            Ok(eth) => (eth.src(), eth.dst(), eth.ethertype()),
            Err(_) => {
                self.stats.count_drop(Drop::BadEthernet);
                return Fate::Consumed;
            }
        };
        if let Some(reason) = self.check_source(in_port, frame, src, ethertype, now) {
            // Before learning: a forged frame teaches the switch nothing.
            self.stats.count_drop(reason);
            return Fate::Consumed;
        }
        self.now = Some(now);
        self.refresh_pool(now);
        self.learn(src, in_port, now);
        if !self.held.is_empty() {
            self.release_held(now, emit);
        }
        if !csum_ready && ethertype == EtherType::IPV4 {
            complete_l4_checksum(frame);
        }

        let mut meta = Meta {
            in_port,
            key_hash: 0,
            flags: 0,
            regs: [0; 4],
        };
        match ethertype {
            EtherType::ARP => {
                if let Some(fate) = self.parse_arp(frame, dst) {
                    return fate;
                }
            }
            EtherType::IPV4 => {
                match self.parse_ipv4(in_port, frame, src, dst, csum_ready, now, emit) {
                    Stage::Done(fate) => return fate,
                    Stage::Continue {
                        flags,
                        key_hash,
                        routed,
                        read,
                    } => {
                        meta.flags = flags;
                        meta.key_hash = key_hash;
                        meta.regs[REG_ROUTED] = u32::from(routed);
                        if let Some(read) = read {
                            return self.process_read(in_port, frame, meta, read, now, emit);
                        }
                    }
                }
            }
            _ => {}
        }

        let verdict = self.pipeline.process(frame, &mut meta);
        self.finish(verdict, in_port, frame, meta, emit)
    }

    /// One read the cache may answer: `kv_cache` decides whether the cache is asked; if it
    /// cannot answer, the read goes through the pipeline again to its server, and its reply
    /// may fill the cache.
    fn process_read(
        &mut self,
        in_port: u16,
        frame: &mut [u8],
        mut meta: Meta,
        read: Read,
        now: Instant,
        emit: &mut Vec<Emit>,
    ) -> Fate {
        meta.regs[REG_CACHE] = 1;
        let mut verdict = self.pipeline.process(frame, &mut meta);
        let body = frame.get(read.body..).unwrap_or_default();
        if verdict == Verdict::ToCpu(CPU_CACHE) {
            let reply = self.cache.as_ref().and_then(|c| c.serve(body, now));
            if let Some(reply) = reply {
                self.stats.answer(Answer::Cache);
                self.send_reply(in_port, &read.client, read.request_id, &reply, now, emit);
                return Fate::Consumed;
            }
            meta.regs[REG_CACHE] = 0;
            verdict = self.pipeline.process(frame, &mut meta);
        }
        // Remembered before it leaves, so its reply cannot pass first; a read the pipeline
        // then drops only waits out its timeout.
        if matches!(verdict, Verdict::Output(_)) {
            let client = (read.client.dst_ip, read.client.dst_port);
            if let (Some(cache), Some(body)) = (&mut self.cache, frame.get(read.body..)) {
                cache.on_forwarded_read(client, read.request_id, body, now);
            }
        }
        self.finish(verdict, in_port, frame, meta, emit)
    }

    fn finish(
        &mut self,
        verdict: Verdict,
        in_port: u16,
        frame: &mut [u8],
        meta: Meta,
        emit: &mut Vec<Emit>,
    ) -> Fate {
        let routed = meta.regs[REG_ROUTED] != 0;
        let fate = self.resolve(verdict, in_port, routed, frame, emit);
        if routed && fate != Fate::Consumed {
            // Counted once the pipeline has sent it on, not when it was parsed.
            if let Some(server) = self.view.locate_hash(meta.key_hash) {
                self.stats.backend_request(server);
            }
            stats::inc(&self.stats.kv_forwarded);
        }
        fate
    }

    /// Turns the pipeline's verdict into a fate.
    fn resolve(
        &mut self,
        verdict: Verdict,
        in_port: u16,
        routed: bool,
        frame: &[u8],
        emit: &mut Vec<Emit>,
    ) -> Fate {
        match verdict {
            Verdict::Output(p) if p == in_port => {
                // Only a key-routed request may go back where it came from (client and server
                // behind one port); plain switching never hairpins.
                if routed {
                    stats::inc(&self.stats.switched);
                    Fate::Out(p)
                } else {
                    self.stats.count_drop(Drop::SamePort);
                    Fate::Consumed
                }
            }
            Verdict::Output(p) if (p as usize) < self.ports => {
                stats::inc(&self.stats.switched);
                Fate::Out(p)
            }
            Verdict::Output(_) => {
                self.stats.count_drop(Drop::NoAction);
                Fate::Consumed
            }
            Verdict::Flood if routed => {
                // The server's MAC is not in the MAC table: a request carries a client's data
                // and goes to its server or nowhere. It waits a moment for the server's port
                // (asked for with ARP at the next tick); past the bound it is dropped.
                let dst = ethernet::Frame::new_checked(frame)
                    .ok()
                    .map(|eth| eth.dst());
                match (dst, self.now) {
                    (Some(dst), Some(since)) if self.held.len() < HOLD_MAX => {
                        if self.held.is_empty() {
                            // Ask at the next tick rather than at the next round; once per
                            // wait, not once per held frame.
                            self.last_arp = None;
                        }
                        self.held.push_back(Held {
                            dst,
                            frame: frame.to_vec(),
                            since,
                        });
                        stats::inc(&self.stats.route_held);
                    }
                    _ => self.stats.count_drop(Drop::RoutePortUnknown),
                }
                Fate::Consumed
            }
            Verdict::Flood => {
                stats::inc(&self.stats.flooded);
                Fate::Flood
            }
            Verdict::ToCpu(CPU_ARP) => {
                self.answer_arp(in_port, frame, emit);
                Fate::Consumed
            }
            Verdict::ToCpu(_) => {
                self.stats.count_drop(Drop::NoAction);
                Fate::Consumed
            }
            Verdict::Drop(code) => {
                let reason = match code {
                    pipeline::reason::NO_SELECTOR_MEMBER
                    | pipeline::reason::SELECTOR_OUT_OF_RANGE => Drop::NoBackend,
                    code => Drop::from_code(code).unwrap_or(Drop::NoAction),
                };
                self.stats.count_drop(reason);
                Fate::Consumed
            }
        }
    }

    /// With `switch.source_check`: whether the frame's IPv4 source (the IPv4 header's, or an
    /// ARP sender's) may come from `in_port`. The local port is the switch's own host and is
    /// not checked; the switch's own addresses come from nowhere else (but the VIP in l2 mode,
    /// which the servers own, from a server's MAC).
    fn check_source(
        &mut self,
        in_port: u16,
        frame: &[u8],
        src_mac: Mac,
        ethertype: EtherType,
        now: Instant,
    ) -> Option<Drop> {
        if self.guard.is_none() || Some(in_port) == self.local {
            return None;
        }
        let ip = match ethertype {
            EtherType::IPV4 => {
                let at = usize::from(OFF_IP_SRC);
                let bytes: [u8; 4] = frame.get(at..at + 4)?.try_into().ok()?;
                Ipv4Addr::from(bytes)
            }
            EtherType::ARP => {
                let packet = arp::Packet::new_checked(frame.get(ethernet::HEADER_LEN..)?).ok()?;
                arp::Repr::parse(&packet).ok()?.sender_ip
            }
            _ => return None,
        };
        if self.own_address(ip) {
            let server = self.backend_macs.contains(&Some(src_mac));
            if self.spec.mode == Mode::L2 && ip == self.spec.vip.ip && server {
                return None;
            }
            return Some(Drop::SourceVip);
        }
        if !source::is_host_address(ip) {
            return None;
        }
        match self.guard.as_mut()?.check(in_port, ip, now) {
            Check::Accept => None,
            Check::Spoofed => Some(Drop::SourceSpoofed),
            Check::TableFull => Some(Drop::SourceTableFull),
        }
    }

    /// The VIP, the agent address, or an address of the host's end of the local port.
    fn own_address(&self, ip: Ipv4Addr) -> bool {
        ip == self.spec.vip.ip || Some(ip) == self.spec.agent_ip || self.local_ips.contains(&ip)
    }

    /// Why traffic to the VIP (or the agent address) from `src_ip` cannot be genuine: no host
    /// sends from these addresses or from port 0, and an answer to one would go nowhere or
    /// everywhere (memcached stops answering UDP after a reply to port 0). `l4` is the IP
    /// payload; its first two bytes are the source port when `plain` says it is UDP or TCP.
    fn bad_source_to_vip(&self, src_ip: Ipv4Addr, l4: &[u8], plain: bool) -> Option<Drop> {
        if src_ip.is_unspecified() {
            return Some(Drop::SourceUnspecified);
        }
        if src_ip.is_broadcast() || Some(src_ip) == self.vip_broadcast {
            return Some(Drop::SourceBroadcast);
        }
        if src_ip.is_multicast() {
            return Some(Drop::SourceMulticast);
        }
        if src_ip.is_loopback() {
            return Some(Drop::SourceLoopback);
        }
        if self.own_address(src_ip) {
            return Some(Drop::SourceVip);
        }
        if plain && l4.get(0..2) == Some(&[0, 0]) {
            return Some(Drop::SourcePortZero);
        }
        None
    }

    /// Whether a UDP reply of `bytes` may go to `client` now. Replies to the switch's own
    /// addresses (parts of split gets) are not limited.
    fn reply_allowed(&mut self, client: Ipv4Addr, bytes: usize, now: Instant) -> bool {
        if self.own_address(client) {
            return true;
        }
        match &mut self.limiter {
            Some(limiter) => limiter.allow(client, bytes, now),
            None => true,
        }
    }

    fn learn(&mut self, src: Mac, port: u16, now: Instant) {
        if !src.is_unicast() || src == self.spec.vip.mac {
            return;
        }
        if let Some(station) = self.macs.get_mut(&src) {
            station.seen = now;
            if station.port == port {
                return;
            }
            station.port = port;
        } else {
            if self.macs.len() >= self.spec.mac_table_size {
                self.stats.count_drop(Drop::MacTableFull);
                return;
            }
            self.macs.insert(src, Station { port, seen: now });
        }
        stats::inc(&self.stats.mac_learned);
        let actions = vec![Action::Output(port)];
        let result = match self.pipeline.lookup_exact(self.tables.l2, &src.0) {
            // The station moved.
            Some(id) => self.pipeline.set_actions(self.tables.l2, id, actions),
            None => self
                .pipeline
                .insert(self.tables.l2, Entry::exact(src.0.to_vec(), actions))
                .map(|_| ()),
        };
        if let Err(e) = result {
            tracing::warn!(mac = %src, "learning failed: {e}");
        }
    }

    /// Learns a backend's MAC from traffic it sends.
    fn note_backend(&mut self, ip: Ipv4Addr, mac: Mac) {
        let Some(&i) = self.backend_by_ip.get(&ip) else {
            return;
        };
        if !mac.is_unicast() || self.backend_macs[i] == Some(mac) {
            return;
        }
        if self.spec.servers[i].mac.is_some() {
            // A configured MAC is authoritative.
            return;
        }
        tracing::info!(backend = %self.pool.spec().servers[i].label(), %mac, "backend MAC resolved");
        self.backend_macs[i] = Some(mac);
        if let Err(e) = self.install_members() {
            tracing::warn!("{e}");
        }
    }

    /// ARP: learn backends; anything not for the switch goes on through the pipeline.
    fn parse_arp(&mut self, frame: &[u8], dst: Mac) -> Option<Fate> {
        let Ok(packet) = arp::Packet::new_checked(&frame[ethernet::HEADER_LEN..]) else {
            return None;
        };
        let Ok(repr) = arp::Repr::parse(&packet) else {
            return None;
        };
        self.note_backend(repr.sender_ip, repr.sender_mac);
        if dst == self.spec.vip.mac
            && repr.operation == arp::Operation::Reply
            && !self.local_ips.contains(&repr.target_ip)
        {
            // An answer to the switch's own request. One to an address of the host's end of
            // the local port goes on: the `arp_vip` table sends it there (the switch has
            // learnt from it all the same).
            return Some(Fate::Consumed);
        }
        None
    }

    fn answer_arp(&mut self, in_port: u16, frame: &[u8], emit: &mut Vec<Emit>) {
        // The table matched the operation and target; an ARP that is not Ethernet/IPv4 is
        // nothing the switch can answer.
        let parsed = arp::Packet::new_checked(&frame[ethernet::HEADER_LEN..])
            .ok()
            .and_then(|p| arp::Repr::parse(&p).ok());
        let Some(req) = parsed else {
            self.stats.count_drop(Drop::VipUnhandled);
            return;
        };
        let reply = arp::Repr {
            operation: arp::Operation::Reply,
            sender_mac: self.spec.vip.mac,
            sender_ip: req.target_ip,
            target_mac: req.sender_mac,
            target_ip: req.sender_ip,
        };
        stats::inc(&self.stats.arp_replies);
        emit.push(Emit {
            dest: Dest::Port(in_port),
            frame: frame::arp_frame(req.sender_mac, &reply),
        });
    }

    #[allow(clippy::too_many_arguments)]
    fn parse_ipv4(
        &mut self,
        in_port: u16,
        frame: &[u8],
        src_mac: Mac,
        dst_mac: Mac,
        csum_ready: bool,
        now: Instant,
        emit: &mut Vec<Emit>,
    ) -> Stage {
        let ip = match ipv4::Packet::new_checked(&frame[ethernet::HEADER_LEN..]) {
            Ok(ip) => ip,
            Err(_) => {
                if dst_mac == self.spec.vip.mac {
                    self.stats.count_drop(Drop::BadIpv4);
                    return Stage::Done(Fate::Consumed);
                }
                return Stage::plain();
            }
        };
        let (src_ip, dst_ip) = (ip.src(), ip.dst());
        let plain = ip.header_len() == ipv4::HEADER_LEN && !ip.is_fragment();
        let plain_udp = plain && ip.protocol() == ipv4::Protocol::UDP;
        let plain_flags = match ip.protocol() {
            _ if !plain => 0,
            ipv4::Protocol::UDP => FLAG_PLAIN_UDP,
            ipv4::Protocol::TCP => FLAG_PLAIN_TCP,
            _ => 0,
        };
        let for_vip = dst_ip == self.spec.vip.ip;
        let for_agent = Some(dst_ip) == self.spec.agent_ip;
        if (for_vip || for_agent) && Some(in_port) != self.local {
            if let Some(reason) = self.bad_source_to_vip(src_ip, ip.payload(), plain_flags != 0) {
                self.stats.count_drop(reason);
                return Stage::Done(Fate::Consumed);
            }
        }
        if plain_udp {
            let mut reply = false;
            if let Some(&i) = self.backend_by_ip.get(&src_ip) {
                let from_memcached = udp::Packet::new_checked(ip.payload())
                    .is_ok_and(|u| u.src_port() == self.spec.servers[i].addr.port());
                if from_memcached {
                    stats::inc(&self.stats.backends[i].replies);
                    self.reply_passes(ip.payload(), dst_ip, now);
                    reply = true;
                }
            } else if src_ip == self.spec.vip.ip && self.spec.mode == Mode::L2 {
                // In l2 mode the servers answer from the VIP, which they own on loopback.
                let from_memcached = udp::Packet::new_checked(ip.payload())
                    .is_ok_and(|u| u.src_port() == self.spec.vip.port);
                if from_memcached {
                    self.reply_passes(ip.payload(), dst_ip, now);
                    reply = true;
                }
            }
            // The cache has heard of it either way: the server did what it answers.
            if reply && !self.reply_allowed(dst_ip, frame.len(), now) {
                self.stats.count_drop(Drop::ReplyRateLimited);
                return Stage::Done(Fate::Consumed);
            }
        }
        if !(for_vip || for_agent) || ip.protocol() != ipv4::Protocol::UDP {
            return Stage::Continue {
                flags: plain_flags,
                key_hash: 0,
                routed: false,
                read: None,
            };
        }
        // UDP to the VIP (or the agent address): the key router's business.
        if !ip.verify_checksum() {
            self.stats.count_drop(Drop::BadIpv4);
            return Stage::Done(Fate::Consumed);
        }
        if ip.is_fragment() {
            self.stats.count_drop(Drop::IpFragment);
            return Stage::Done(Fate::Consumed);
        }
        if ip.header_len() != ipv4::HEADER_LEN {
            self.stats.count_drop(Drop::Ipv4Options);
            return Stage::Done(Fate::Consumed);
        }
        let Ok(u) = udp::Packet::new_checked(ip.payload()) else {
            self.stats.count_drop(Drop::BadUdp);
            return Stage::Done(Fate::Consumed);
        };
        if csum_ready && !u.verify_checksum(src_ip, dst_ip) {
            self.stats.count_drop(Drop::BadUdpChecksum);
            return Stage::Done(Fate::Consumed);
        }
        let (src_port, dst_port) = (u.src_port(), u.dst_port());
        if for_agent && dst_port == self.spec.agent_port {
            self.split_reply((src_ip, src_port), u.payload(), now, emit);
            return Stage::Done(Fate::Consumed);
        }
        if !for_vip || dst_port != self.spec.vip.port {
            return Stage::Continue {
                flags: FLAG_PLAIN_UDP,
                key_hash: 0,
                routed: false,
                read: None,
            };
        }
        stats::inc(&self.stats.kv_requests);
        let client = UdpEnds {
            src_mac: self.spec.vip.mac,
            dst_mac: src_mac,
            src_ip: self.spec.vip.ip,
            dst_ip: src_ip,
            src_port: dst_port,
            dst_port: src_port,
        };
        let payload = u.payload();
        let (header, body) = match mcudp::Header::parse(payload) {
            Ok(x) => x,
            Err(_) => {
                self.stats.count_drop(Drop::BadFrameHeader);
                return Stage::Done(Fate::Consumed);
            }
        };
        if header.seq != 0 || header.total != 1 {
            self.stats.count_drop(Drop::MultiDatagramRequest);
            return Stage::Done(Fate::Consumed);
        }
        match self.route_datagram(body) {
            Route::One { key_hash } => {
                let mut read = None;
                if let Some(cache) = &mut self.cache {
                    let view = &self.view;
                    let mut locate = |key: &[u8]| view.locate(key).unwrap_or(0);
                    match cache.on_request(
                        (src_ip, src_port),
                        header.request_id,
                        body,
                        &mut locate,
                        now,
                    ) {
                        Ok(true) => {
                            read = Some(Read {
                                client,
                                request_id: header.request_id,
                                body: BODY_OFFSET,
                            })
                        }
                        Ok(false) => {}
                        Err(reason) => {
                            self.stats.count_drop(reason);
                            return Stage::Done(Fate::Consumed);
                        }
                    }
                }
                Stage::Continue {
                    flags: FLAG_PLAIN_UDP,
                    key_hash,
                    routed: true,
                    read,
                }
            }
            Route::Answer(kind, reply) => {
                self.stats.answer(kind);
                self.send_reply(in_port, &client, header.request_id, reply, now, emit);
                Stage::Done(Fate::Consumed)
            }
            Route::Split => {
                self.start_split(in_port, client, header.request_id, body, now, emit);
                Stage::Done(Fate::Consumed)
            }
            Route::Drop(reason) => {
                self.stats.count_drop(reason);
                Stage::Done(Fate::Consumed)
            }
        }
    }

    /// Decides where the requests of one datagram go: all to one server, answered here, split,
    /// or dropped. Never chooses a server that does not hold every key of the datagram.
    fn route_datagram(&mut self, body: &[u8]) -> Route {
        let mut offset = 0;
        let mut target: Option<(usize, u32)> = None;
        let mut multi = false;
        let mut requests = 0;
        let mut split_candidate = false;
        // Whether every request so far is a binary or meta get of one protocol, with at most
        // a trailing no-op: a pipeline the splitter can take apart.
        let mut pipelined_gets = true;
        let mut protocol: Option<Protocol> = None;
        let mut local: Option<&'static [u8]> = None;
        let mut noops = 0;
        while offset < body.len() {
            let req = match memcache::parse(&body[offset..]) {
                Ok(Some(req)) => req,
                Ok(None) => return Route::Drop(Drop::IncompleteRequest),
                Err(e) => {
                    if requests > 0 {
                        return Route::Drop(Drop::PipelinedError);
                    }
                    if body[offset] == 0x80 || body[offset] == 0x81 {
                        return Route::Drop(Drop::BadBinaryRequest);
                    }
                    if e.text_reply().is_empty() {
                        return Route::Drop(Drop::BadRequest);
                    }
                    let kind = if e.text_reply() == b"ERROR\r\n" {
                        Answer::UnknownCommand
                    } else {
                        Answer::ClientError
                    };
                    return Route::Answer(kind, e.text_reply());
                }
            };
            requests += 1;
            // Nothing may follow a no-op in a pipeline the splitter takes apart.
            let after_noop = noops > 0;
            if req.key_count() == 0 {
                match req.command {
                    // No-ops end a pipeline of quiet requests; they go wherever the keys go.
                    Command::MetaNoop | Command::Binary(memcache::binary::opcode::NOOP) => {
                        if req.command == Command::MetaNoop {
                            local = Some(b"MN\r\n");
                        }
                        noops += 1;
                    }
                    Command::Version => local = Some(VERSION_REPLY),
                    _ => return Route::Drop(Drop::KeylessCommand),
                }
            }
            split_candidate = req.protocol == Protocol::Text
                && matches!(
                    req.command,
                    Command::Get | Command::Gets | Command::Gat | Command::Gats
                );
            pipelined_gets &= !after_noop
                && req.protocol != Protocol::Text
                && protocol.is_none_or(|p| p == req.protocol)
                && is_pipelined_get_or_noop(req.command);
            protocol = Some(req.protocol);
            for token in req.keys() {
                let (hash, server) = match self.place(&req, token) {
                    Ok((hash, Some(server))) => (hash, server),
                    // Every server of the pool is out.
                    Ok((_, None)) => return Route::Drop(Drop::NoBackend),
                    Err(e) => return Route::Answer(Answer::ClientError, e.text_reply()),
                };
                match target {
                    None => target = Some((server, hash)),
                    Some((s, _)) if s != server => multi = true,
                    Some(_) => {}
                }
            }
            offset += req.len.max(1);
        }
        if target.is_some() && noops > 0 {
            // Keyed requests with their terminating no-op: one server answers them all.
            local = None;
        }
        if let Some(reply) = local {
            if requests == 1 {
                return Route::Answer(Answer::Local, reply);
            }
            return Route::Drop(Drop::KeylessCommand);
        }
        match target {
            None => Route::Drop(Drop::IncompleteRequest),
            Some((_, key_hash)) if !multi => Route::One { key_hash },
            Some(_) if requests == 1 && split_candidate => Route::Split,
            Some(_) if pipelined_gets => Route::Split,
            Some(_) => Route::Drop(Drop::PipelinedMultiServer),
        }
    }

    /// Sends the switch's own reply to a client, unless the client has used up its reply
    /// bytes (then every datagram of it is counted as dropped).
    fn send_reply(
        &mut self,
        port: u16,
        ends: &UdpEnds,
        request_id: u16,
        reply: &[u8],
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        let Some(frames) = frame::memcached_reply(ends, request_id, reply) else {
            self.stats.count_drop(Drop::SplitBadReply);
            return;
        };
        let bytes = frames.iter().map(Vec::len).sum();
        if !self.reply_allowed(ends.dst_ip, bytes, now) {
            for _ in &frames {
                self.stats.count_drop(Drop::ReplyRateLimited);
            }
            return;
        }
        emit.extend(frames.into_iter().map(|frame| Emit {
            dest: Dest::Port(port),
            frame,
        }));
    }

    fn start_split(
        &mut self,
        in_port: u16,
        client: UdpEnds,
        request_id: u16,
        body: &[u8],
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        let Some(agent_ip) = self.spec.agent_ip else {
            self.stats.count_drop(Drop::SplitUnavailable);
            return;
        };
        let Ok(Some(req)) = memcache::parse(body) else {
            self.stats.count_drop(Drop::IncompleteRequest);
            return;
        };
        let client = split::Client {
            ends: client,
            request_id,
            port: in_port,
        };
        let started = if req.protocol == Protocol::Text {
            let keys: Option<Vec<(Vec<u8>, usize)>> = req
                .keys()
                .map(|k| Some((k.to_vec(), self.view.locate(k)?)))
                .collect();
            let Some(keys) = keys else {
                self.stats.count_drop(Drop::NoBackend);
                return;
            };
            // Every part needs a known MAC and port before anything is sent.
            if keys.iter().any(|(_, s)| self.backend_macs[*s].is_none()) {
                self.stats.count_drop(Drop::BackendUnresolved);
                return;
            }
            if keys.iter().any(|(_, s)| self.server_port(*s).is_none()) {
                self.stats.count_drop(Drop::RoutePortUnknown);
                return;
            }
            if let Some(cache) = &self.cache {
                let view = &self.view;
                cache
                    .service()
                    .see(&req, &mut |key| view.locate(key).unwrap_or(0), now);
            }
            let service = self.cache.as_ref().map(|c| c.service().clone());
            let command = req.command;
            let mut cached = |key: &[u8]| {
                let service = service.as_ref()?;
                service.serve_text_key(command, key, now)
            };
            match self.splitter.start_cached(
                now,
                client.clone(),
                req.command,
                req.exptime_token(),
                keys,
                &self.sources,
                &mut cached,
            ) {
                Ok(split::Started::Answered(reply)) => {
                    self.stats.answer(Answer::Cache);
                    self.send_reply(
                        client.port,
                        &client.ends,
                        client.request_id,
                        &reply,
                        now,
                        emit,
                    );
                    return;
                }
                Ok(split::Started::Sent(subs)) => Ok(subs),
                Err(e) => Err(e),
            }
        } else {
            let Some(requests) = self.locate_pipeline(body) else {
                self.stats.count_drop(Drop::IncompleteRequest);
                return;
            };
            if requests
                .iter()
                .any(|(_, s)| s.is_some_and(|s| self.backend_macs[s].is_none()))
            {
                self.stats.count_drop(Drop::BackendUnresolved);
                return;
            }
            if requests
                .iter()
                .any(|(_, s)| s.is_some_and(|s| self.server_port(s).is_none()))
            {
                self.stats.count_drop(Drop::RoutePortUnknown);
                return;
            }
            self.splitter
                .start_pipeline(now, client, &requests, &self.sources)
        };
        let subs = match started {
            Ok(subs) => subs,
            Err(split::SplitError::TableFull) => {
                self.stats.count_drop(Drop::SplitTableFull);
                return;
            }
            Err(split::SplitError::NotRetrieval) => {
                self.stats.count_drop(Drop::PipelinedMultiServer);
                return;
            }
        };
        stats::inc(&self.stats.kv_split);
        self.count_splits();
        for sub in subs {
            let backend = &self.spec.servers[sub.server];
            // Both were checked before the split started.
            let (Some(mac), Some(port)) =
                (self.backend_macs[sub.server], self.server_port(sub.server))
            else {
                continue;
            };
            let ends = UdpEnds {
                src_mac: self.spec.vip.mac,
                dst_mac: mac,
                src_ip: agent_ip,
                dst_ip: *backend.addr.ip(),
                src_port: self.spec.agent_port,
                dst_port: backend.addr.port(),
            };
            let mut header = [0u8; mcudp::LEN];
            mcudp::Header {
                request_id: sub.request_id,
                seq: 0,
                total: 1,
                reserved: 0,
            }
            .emit(&mut header);
            self.stats.backend_request(sub.server);
            emit.push(Emit {
                dest: Dest::Port(port),
                frame: frame::udp_frame(&ends, &[&header, &sub.payload]),
            });
        }
    }

    /// The key hash and server of one key of `req`, placed as memcached stores it: a base64
    /// meta key by its decoded bytes.
    fn place(
        &self,
        req: &memcache::Request<'_>,
        token: &[u8],
    ) -> Result<(u32, Option<usize>), memcache::Error> {
        let mut decoded = [0u8; memcache::MAX_KEY_LEN];
        let key = req.stored_key(token, &mut decoded)?;
        let hash = self.view.key_hash(key);
        Ok((hash, self.view.locate_hash(hash)))
    }

    fn locate_pipeline<'a>(
        &self,
        body: &'a [u8],
    ) -> Option<Vec<(memcache::Request<'a>, Option<usize>)>> {
        let mut out = Vec::new();
        let mut offset = 0;
        while offset < body.len() {
            let req = memcache::parse(body.get(offset..)?).ok()??;
            let server = match req.key() {
                Some(token) => Some(self.place(&req, token).ok()?.1?),
                None => None,
            };
            offset += req.len.max(1);
            out.push((req, server));
        }
        Some(out)
    }

    fn split_reply(
        &mut self,
        source: (Ipv4Addr, u16),
        payload: &[u8],
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        let Ok((header, body)) = mcudp::Header::parse(payload) else {
            self.stats.count_drop(Drop::BadFrameHeader);
            return;
        };
        match self
            .splitter
            .arrive(source, header.request_id, header.seq, header.total, body)
        {
            Arrival::Stored => {}
            Arrival::Done {
                client_port,
                ends,
                request_id,
                reply,
            } => {
                self.stats.answer(Answer::MergedGet);
                // Quiet gets that all missed, with no no-op after them: memcached sends nothing.
                if !reply.is_empty() {
                    self.send_reply(client_port, &ends, request_id, &reply, now, emit);
                }
            }
            Arrival::BadReply => self.stats.count_drop(Drop::SplitBadReply),
            Arrival::Stale => self.stats.count_drop(Drop::StaleReply),
            Arrival::Foreign => self.stats.count_drop(Drop::SplitForeignReply),
        }
        self.count_splits();
    }

    /// A server's reply to a client passes: the cache hears of it first.
    fn reply_passes(&mut self, ip_payload: &[u8], client_ip: Ipv4Addr, now: Instant) {
        let Some(cache) = &mut self.cache else {
            return;
        };
        if let Ok(u) = udp::Packet::new_checked(ip_payload) {
            cache.on_reply((client_ip, u.dst_port()), u.payload(), now);
        }
    }

    /// Sends the held requests whose server's port is now known; drops those held too long.
    fn release_held(&mut self, now: Instant, emit: &mut Vec<Emit>) {
        let mut kept = VecDeque::with_capacity(self.held.len());
        while let Some(held) = self.held.pop_front() {
            if let Some(station) = self.macs.get(&held.dst) {
                stats::inc(&self.stats.switched);
                stats::inc(&self.stats.kv_forwarded);
                emit.push(Emit {
                    dest: Dest::Port(station.port),
                    frame: held.frame,
                });
            } else if now.duration_since(held.since) >= HOLD_FOR {
                self.stats.count_drop(Drop::RoutePortUnknown);
            } else {
                kept.push_back(held);
            }
        }
        self.held = kept;
    }

    /// Periodic work: expire split gets, ask servers whose MAC or port is unknown (out of
    /// every port, from the agent address), the cache's rules and timeouts, ageing. The first
    /// call asks at once, so the run loop's first tick resolves the servers at start-up.
    /// [`Switch::poll_at`] says when it next has work.
    pub fn tick(&mut self, now: Instant, emit: &mut Vec<Emit>) {
        self.now = Some(now);
        self.refresh_pool(now);
        if !self.held.is_empty() {
            self.release_held(now, emit);
        }
        if let Some(cache) = &mut self.cache {
            let view = &self.view;
            cache.tick(now, &mut self.pipeline, &|key| view.key_hash(key));
        }
        self.age_macs(now);
        for _ in 0..self.splitter.expire(now) {
            self.stats.count_drop(Drop::SplitTimeout);
        }
        self.count_splits();
        let due = self
            .last_arp
            .is_none_or(|t| now.duration_since(t) >= ARP_RETRY);
        let wanted: Vec<usize> = (0..self.spec.servers.len())
            .filter(|&i| self.needs_arp(i, now))
            .collect();
        if due && !wanted.is_empty() {
            self.last_arp = Some(now);
            let sender_ip = self.spec.agent_ip.unwrap_or(Ipv4Addr::UNSPECIFIED);
            for i in wanted {
                let b = &self.spec.servers[i];
                let req = arp::Repr {
                    operation: arp::Operation::Request,
                    sender_mac: self.spec.vip.mac,
                    sender_ip,
                    target_mac: Mac([0; 6]),
                    target_ip: *b.addr.ip(),
                };
                stats::inc(&self.stats.arp_requests_sent);
                emit.push(Emit {
                    dest: Dest::Flood,
                    frame: frame::arp_frame(Mac::BROADCAST, &req),
                });
            }
        }
    }

    /// The port server `i` is behind: its MAC's station in the MAC table, if both are known.
    fn server_port(&self, i: usize) -> Option<u16> {
        let mac = self.backend_macs.get(i).copied().flatten()?;
        self.macs.get(&mac).map(|station| station.port)
    }

    /// Whether server `i` is asked for with ARP at this tick: its MAC or its port is unknown,
    /// or its station is half-way to being aged out (so a quiet server's port is refreshed
    /// before its requests would have nowhere to go).
    fn needs_arp(&self, i: usize, now: Instant) -> bool {
        let Some(mac) = self.backend_macs.get(i).copied().flatten() else {
            return true;
        };
        match self.macs.get(&mac) {
            Some(station) => now.saturating_duration_since(station.seen) > self.spec.mac_age / 2,
            None => true,
        }
    }

    /// Publishes how many split gets are in flight; called wherever that changes, so that the
    /// gauge does not depend on how often the caller ticks.
    fn count_splits(&self) {
        self.stats.splits_in_flight.store(
            self.splitter.in_flight() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Forgets stations (and source addresses, and full reply buckets) not heard from for
    /// their ageing time, in passes on a grid of [`AGEING_EVERY`] from the first tick: a pass
    /// runs at the first tick at or after its grid point, and several points passed since the
    /// last tick make one pass.
    fn age_macs(&mut self, now: Instant) {
        if self.next_ageing.is_some_and(|due| now < due) {
            return;
        }
        let next = match self.next_ageing {
            // Whole periods since the point that fell due, and one more.
            Some(due) => {
                let periods = (now - due).as_nanos() / AGEING_EVERY.as_nanos() + 1;
                u32::try_from(periods)
                    .ok()
                    .and_then(|n| AGEING_EVERY.checked_mul(n))
                    .and_then(|d| due.checked_add(d))
            }
            None => now.checked_add(AGEING_EVERY),
        };
        self.next_ageing = Some(next.unwrap_or(now));
        if let Some(guard) = &mut self.guard {
            guard.expire(now);
        }
        if let Some(limiter) = &mut self.limiter {
            limiter.sweep(now);
        }
        let age = self.spec.mac_age;
        let mut stale: Vec<Mac> = self
            .macs
            .iter()
            .filter(|(_, s)| now.saturating_duration_since(s.seen) > age)
            .map(|(m, _)| *m)
            .collect();
        // Removed in MAC order, not the map's: the order frees the `l2` table's slots, which
        // later stations reuse (and the status API lists them by slot).
        stale.sort_unstable();
        for mac in stale {
            self.macs.remove(&mac);
            if let Some(id) = self.pipeline.lookup_exact(self.tables.l2, &mac.0) {
                let _ = self.pipeline.remove(self.tables.l2, id);
            }
        }
    }

    /// A view for the status API.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            backend_macs: self
                .backend_macs
                .iter()
                .map(|m| m.map(|m| m.to_string()))
                .collect(),
            mac_table: self.macs.len(),
            source_table: self.guard.as_ref().map_or(0, SourceGuard::len),
            reply_buckets: self.limiter.as_ref().map_or(0, ReplyLimiter::len),
            splits_in_flight: self.splitter.in_flight(),
            tables: self
                .pipeline
                .describe()
                .tables
                .into_iter()
                .map(|t| TableInfo {
                    name: t.name,
                    kind: format!("{:?}", t.kind).to_lowercase(),
                    entries: t.entries,
                    hits: t.hits,
                    misses: t.misses,
                })
                .collect(),
        }
    }
}

/// Whether a request may be part of a pipeline the splitter takes apart: a binary
/// `GET`/`GETQ`/`GETK`/`GETKQ` or `NOOP`, a meta `mg` or `mn`.
fn is_pipelined_get_or_noop(command: Command) -> bool {
    use memcache::binary::opcode;
    matches!(
        command,
        Command::MetaGet
            | Command::MetaNoop
            | Command::Binary(
                opcode::GET | opcode::GETQ | opcode::GETK | opcode::GETKQ | opcode::NOOP
            )
    )
}

/// The reply to `version` on the VIP: the switch answers for the pool.
const VERSION_REPLY: &[u8] =
    concat!("VERSION kvswitch-", env!("CARGO_PKG_VERSION"), "\r\n").as_bytes();

enum Stage {
    Done(Fate),
    Continue {
        flags: u32,
        key_hash: u32,
        routed: bool,
        /// One read the cache may answer.
        read: Option<Read>,
    },
}

/// A read the cache may answer, as the parser found it.
struct Read {
    /// The reply's addresses: from the VIP back to the client.
    client: UdpEnds,
    request_id: u16,
    /// Where the request starts in the frame.
    body: usize,
}

/// Where a UDP request to the VIP starts in its frame: Ethernet, IPv4 without options (others
/// are dropped before), UDP, and memcached's frame header.
const BODY_OFFSET: usize = ethernet::HEADER_LEN + ipv4::HEADER_LEN + udp::HEADER_LEN + mcudp::LEN;

impl Stage {
    fn plain() -> Stage {
        Stage::Continue {
            flags: 0,
            key_hash: 0,
            routed: false,
            read: None,
        }
    }
}

enum Route {
    One { key_hash: u32 },
    Answer(Answer, &'static [u8]),
    Split,
    Drop(Drop),
}

/// Completes the UDP or TCP checksum of an IPv4 frame whose sender left it to hardware (a
/// veth with transmit offload on hands such frames over with only the pseudo-header sum in
/// place). Fragments and malformed frames are left alone.
fn complete_l4_checksum(frame: &mut [u8]) {
    let Some(l3) = frame.get(ethernet::HEADER_LEN..) else {
        return;
    };
    let Ok(ip) = ipv4::Packet::new_checked(l3) else {
        return;
    };
    if ip.is_fragment() {
        return;
    }
    let (src, dst, proto) = (ip.src(), ip.dst(), ip.protocol());
    let start = ethernet::HEADER_LEN + ip.header_len();
    let end = ethernet::HEADER_LEN + usize::from(ip.total_len());
    let check_at = match proto {
        ipv4::Protocol::UDP => 6,
        ipv4::Protocol::TCP => 16,
        _ => return,
    };
    let Some(segment) = frame.get_mut(start..end) else {
        return;
    };
    if segment.len() < check_at + 2 {
        return;
    }
    segment[check_at..check_at + 2].copy_from_slice(&[0, 0]);
    let pseudo = wire::checksum::pseudo_header_v4(src, dst, proto.0, segment.len() as u16);
    let mut sum = wire::checksum::fold(pseudo + wire::checksum::sum(segment));
    if sum == 0 && proto == ipv4::Protocol::UDP {
        sum = 0xffff;
    }
    segment[check_at..check_at + 2].copy_from_slice(&sum.to_be_bytes());
}

fn bytes_field(offset: u16, len: u8) -> Field {
    Field::Bytes { offset, len }
}

/// The switch's behaviour as tables:
/// 0 `arp_vip`: ARP requests for the VIP (or agent address) go to the CPU; ARP replies to the
///   addresses of the host's end of the local port go out of the local port;
/// 1 `kv_route`: UDP to the VIP's memcached port is hashed by key onto the ring; TCP to it goes
///   out of the local port, to the proxy;
/// 2 `local_in`: TCP from a server's memcached port to the proxy's source address (the servers'
///   side of the proxy's connections) goes out of the local port;
/// 3 `vip_reply` (l3): replies from a backend's memcached port leave with the VIP as source;
/// 4 `l2`: learned destination MAC → port, otherwise flood.
fn build_tables(p: &mut Pipeline, spec: &SwitchSpec) -> Result<Tables, pipeline::Error> {
    let local = spec.local.as_ref().map(|l| l.port);
    let e = |e: pipeline::Error| e;
    // First, so that a read the cache may answer meets it before any other table.
    let cache_t = match spec.cache {
        true => Some(
            p.add_table(TableSpec {
                name: "kv_cache".into(),
                kind: MatchKind::Exact,
                key: vec![Field::Reg(REG_CACHE as u8), Field::KeyHash],
                miss: vec![],
            })
            .map_err(e)?,
        ),
        false => None,
    };
    let arp_t = p
        .add_table(TableSpec {
            name: "arp_vip".into(),
            kind: MatchKind::Exact,
            key: vec![
                bytes_field(OFF_ETHERTYPE, 2),
                bytes_field(OFF_ARP_OP, 2),
                bytes_field(OFF_ARP_TARGET_IP, 4),
            ],
            miss: vec![],
        })
        .map_err(e)?;
    let route_t = p
        .add_table(TableSpec {
            name: "kv_route".into(),
            kind: MatchKind::Exact,
            key: vec![
                Field::Flags,
                bytes_field(OFF_IP_PROTO, 1),
                bytes_field(OFF_IP_DST, 4),
                bytes_field(OFF_L4_DST, 2),
            ],
            miss: vec![],
        })
        .map_err(e)?;
    let local_t = p
        .add_table(TableSpec {
            name: "local_in".into(),
            kind: MatchKind::Exact,
            key: vec![
                Field::Flags,
                bytes_field(OFF_IP_PROTO, 1),
                bytes_field(OFF_IP_SRC, 4),
                bytes_field(OFF_L4_SRC, 2),
                bytes_field(OFF_IP_DST, 4),
            ],
            miss: vec![],
        })
        .map_err(e)?;
    let reply_t = p
        .add_table(TableSpec {
            name: "vip_reply".into(),
            kind: MatchKind::Exact,
            key: vec![
                Field::Flags,
                bytes_field(OFF_IP_PROTO, 1),
                bytes_field(OFF_IP_SRC, 4),
                bytes_field(OFF_L4_SRC, 2),
            ],
            miss: vec![],
        })
        .map_err(e)?;
    let l2 = p
        .add_table(TableSpec {
            name: "l2".into(),
            kind: MatchKind::Exact,
            key: vec![bytes_field(0, 6)],
            miss: vec![Action::Flood],
        })
        .map_err(e)?;
    // Misses fall through to the next table.
    if let Some(cache_t) = cache_t {
        p.set_miss(cache_t, vec![Action::Goto(arp_t)]).map_err(e)?;
    }
    p.set_miss(arp_t, vec![Action::Goto(route_t)]).map_err(e)?;
    p.set_miss(route_t, vec![Action::Goto(local_t)])
        .map_err(e)?;
    p.set_miss(local_t, vec![Action::Goto(reply_t)])
        .map_err(e)?;
    p.set_miss(reply_t, vec![Action::Goto(l2)]).map_err(e)?;

    let arp_key = |op: u16, ip: Ipv4Addr| {
        let mut key = Vec::with_capacity(8);
        key.extend_from_slice(&EtherType::ARP.0.to_be_bytes());
        key.extend_from_slice(&op.to_be_bytes());
        key.extend_from_slice(&ip.octets());
        key
    };
    let mut targets = vec![spec.vip.ip];
    if let Some(a) = spec.agent_ip {
        if a != spec.vip.ip {
            targets.push(a);
        }
    }
    for ip in targets {
        p.insert(
            arp_t,
            Entry::exact(arp_key(ARP_REQUEST, ip), vec![Action::ToCpu(CPU_ARP)]),
        )
        .map_err(e)?;
    }

    let ring = p.add_selector(vec![], Box::new(NoChoice)).map_err(e)?;
    // Flags, IP protocol, destination address and port, as `kv_route` matches them.
    let to_vip_port = |flags: u32, proto: ipv4::Protocol| {
        let mut key = Vec::with_capacity(11);
        key.extend_from_slice(&flags.to_be_bytes());
        key.push(proto.0);
        key.extend_from_slice(&spec.vip.ip.octets());
        key.extend_from_slice(&spec.vip.port.to_be_bytes());
        key
    };
    p.insert(
        route_t,
        Entry::exact(
            to_vip_port(FLAG_PLAIN_UDP, ipv4::Protocol::UDP),
            vec![Action::Select(ring)],
        ),
    )
    .map_err(e)?;

    if let Some(local) = local {
        // The host's end has the VIP's MAC: frames sent there need no rewrite. Its own ARP
        // requests are switched like anyone's; the answers are addressed to it.
        for &ip in spec.local.iter().flat_map(|l| &l.addrs) {
            p.insert(
                arp_t,
                Entry::exact(arp_key(ARP_REPLY, ip), vec![Action::Output(local)]),
            )
            .map_err(e)?;
        }
        p.insert(
            route_t,
            Entry::exact(
                to_vip_port(FLAG_PLAIN_TCP, ipv4::Protocol::TCP),
                vec![Action::Output(local)],
            ),
        )
        .map_err(e)?;
        // Only the servers' memcached ports, and only to the proxy's source address: nothing
        // else of the host's stack is reachable through the VIP.
        let source = spec.local.as_ref().map_or(spec.vip.ip, |l| l.source);
        for b in &spec.servers {
            let mut key = Vec::with_capacity(15);
            key.extend_from_slice(&FLAG_PLAIN_TCP.to_be_bytes());
            key.push(ipv4::Protocol::TCP.0);
            key.extend_from_slice(&b.addr.ip().octets());
            key.extend_from_slice(&b.addr.port().to_be_bytes());
            key.extend_from_slice(&source.octets());
            p.insert(local_t, Entry::exact(key, vec![Action::Output(local)]))
                .map_err(e)?;
        }
    }

    if spec.mode == Mode::L3 {
        for b in &spec.servers {
            let mut key = Vec::with_capacity(11);
            key.extend_from_slice(&FLAG_PLAIN_UDP.to_be_bytes());
            key.push(ipv4::Protocol::UDP.0);
            key.extend_from_slice(&b.addr.ip().octets());
            key.extend_from_slice(&b.addr.port().to_be_bytes());
            // Two servers may share an address on different ports; one entry each.
            let _ = p.insert(
                reply_t,
                Entry::exact(
                    key,
                    vec![Action::SetIpv4Src(spec.vip.ip.octets()), Action::Goto(l2)],
                ),
            );
        }
    }
    // Frames for the VIP's MAC that no table above claimed are not flooded.
    p.insert(
        l2,
        Entry::exact(
            spec.vip.mac.0.to_vec(),
            vec![Action::Drop(Drop::VipUnhandled.code())],
        ),
    )
    .map_err(e)?;
    Ok(Tables {
        l2,
        ring,
        cache: cache_t,
    })
}

/// Placeholder chooser until the ring is installed.
struct NoChoice;
impl Choose for NoChoice {
    fn choose(&self, _: u32) -> Option<usize> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{udp_frame, UdpEnds};
    use crate::pool::View;

    #[test]
    fn unfinished_udp_checksum_is_completed() {
        let ends = UdpEnds {
            src_mac: "02:00:00:00:00:01".parse().unwrap(),
            dst_mac: "02:00:00:00:00:02".parse().unwrap(),
            src_ip: Ipv4Addr::new(10, 0, 0, 1),
            dst_ip: Ipv4Addr::new(10, 0, 0, 2),
            src_port: 4000,
            dst_port: 11211,
        };
        let good = udp_frame(&ends, &[b"\0\x01\0\0\0\x01\0\0get k\r\n"]);
        // What a sender with checksum offload leaves: the pseudo-header sum, not complemented.
        let mut partial = good.clone();
        let len = (good.len() - 34) as u16;
        let pseudo = wire::checksum::pseudo_header_v4(ends.src_ip, ends.dst_ip, 17, len);
        let folded = !wire::checksum::fold(pseudo);
        partial[40..42].copy_from_slice(&folded.to_be_bytes());
        assert_ne!(partial, good);
        complete_l4_checksum(&mut partial);
        assert_eq!(partial, good);
        // Garbage and truncated frames are left alone without panicking.
        for n in 0..good.len() {
            let mut cut = good[..n].to_vec();
            complete_l4_checksum(&mut cut);
        }
    }

    /// A client on port 0 and two servers with configured MACs, server `i` on port `1 + i`,
    /// whose ports the switch learns from their traffic; driven by a caller that sleeps until
    /// `poll_at`.
    struct Bed {
        sw: Switch,
        stats: Arc<Stats>,
        view: Arc<View>,
        vip: Ipv4Addr,
        vip_mac: Mac,
        now: Instant,
        emit: Vec<Emit>,
        /// Every instant the switch was ticked at.
        ticks: Vec<Instant>,
    }

    const CLIENT_MAC: Mac = Mac([2, 0, 0, 0, 0, 1]);
    const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

    /// Server `i`'s address, MAC and port.
    fn server(i: u8) -> (Ipv4Addr, Mac, u16) {
        (
            Ipv4Addr::new(10, 0, 0, 11 + i),
            Mac([2, 0, 0, 0, 0, 0x0b + i]),
            1 + u16::from(i),
        )
    }

    impl Bed {
        fn new(cache: Option<crate::cache::CacheSettings>) -> Bed {
            let servers = (0..2)
                .map(|i| {
                    let (ip, mac, _) = server(i);
                    crate::spec::Server {
                        addr: std::net::SocketAddrV4::new(ip, 11211),
                        mac: Some(mac),
                    }
                })
                .collect();
            let mut spec = SwitchSpec::new(3, Ipv4Addr::new(10, 0, 0, 100), servers);
            spec.cache = cache.is_some();
            let pool = spec.pool_spec(kv::Distribution::Ketama, kv::HashFn::Md5);
            let pool = Arc::new(Pool::new(pool).unwrap());
            let stats = Arc::new(Stats::new(3, 2));
            let now = Instant::from_secs(1_000);
            let mut sw = Switch::new(spec.clone(), pool.clone(), stats.clone()).unwrap();
            if let Some(settings) = cache {
                sw.set_cache(CacheService::new(settings, 2, now).unwrap())
                    .unwrap();
            }
            Bed {
                sw,
                stats,
                view: pool.view(now),
                vip: spec.vip.ip,
                vip_mac: spec.vip.mac,
                now,
                emit: Vec::new(),
                ticks: Vec::new(),
            }
        }

        /// Ticks at every instant `poll_at` names up to `until` (at once: now), as a caller
        /// sleeping until then would; after each tick nothing may be due at its instant.
        fn sleep_until(&mut self, until: Instant) {
            while let Some(due) = self.sw.poll_at().filter(|t| *t <= until) {
                let at = due.max(self.now);
                self.sw.tick(at, &mut self.emit);
                self.ticks.push(at);
                self.now = at;
                let next = self.sw.poll_at();
                assert!(
                    next.is_none_or(|t| t > at),
                    "due at {next:?} after a tick at {at:?}"
                );
            }
            self.now = until;
        }

        fn process(&mut self, port: u16, mut frame: Vec<u8>) -> Fate {
            self.sw
                .process(port, &mut frame, true, self.now, &mut self.emit)
        }

        /// A frame from server `i`: its port is known from then on.
        fn hello(&mut self, i: u8) {
            let (ip, mac, port) = server(i);
            let ends = UdpEnds {
                src_mac: mac,
                dst_mac: Mac::BROADCAST,
                src_ip: ip,
                dst_ip: Ipv4Addr::BROADCAST,
                src_port: 9,
                dst_port: 9,
            };
            self.process(port, udp_frame(&ends, &[b"hello"]));
        }

        /// A text request from the client to the VIP.
        fn request(&mut self, text: &str) -> Fate {
            let ends = UdpEnds {
                src_mac: CLIENT_MAC,
                dst_mac: self.vip_mac,
                src_ip: CLIENT_IP,
                dst_ip: self.vip,
                src_port: 40_000,
                dst_port: 11211,
            };
            let header = [0, 7, 0, 0, 0, 1, 0, 0];
            self.process(0, udp_frame(&ends, &[&header, text.as_bytes()]))
        }

        /// A key that server `i` holds.
        fn key_on(&self, i: usize) -> String {
            (0..)
                .map(|n| format!("key{n}"))
                .find(|k| self.view.locate(k.as_bytes()) == Some(i))
                .unwrap()
        }

        fn drops(&self, reason: Drop) -> u64 {
            stats::get(&self.stats.drops[reason as usize])
        }
    }

    #[test]
    fn poll_at_is_due_at_once_before_the_first_tick_and_then_only_for_the_next_arp_round() {
        let mut bed = Bed::new(None);
        assert_eq!(bed.sw.poll_at(), Some(Instant::ZERO));
        let t0 = bed.now;
        bed.sleep_until(t0);
        assert_eq!(bed.ticks, [t0]);
        // No station yet: both servers are asked for, and nothing is due before the next round.
        assert_eq!(bed.emit.len(), 2);
        assert_eq!(bed.sw.poll_at(), Some(t0 + ARP_RETRY));
        bed.sleep_until(t0 + 3 * ARP_RETRY - Duration::from_nanos(1));
        assert_eq!(bed.ticks, [t0, t0 + ARP_RETRY, t0 + 2 * ARP_RETRY]);
        assert_eq!(stats::get(&bed.stats.arp_requests_sent), 6);
    }

    #[test]
    fn an_idle_switch_that_knows_every_station_is_due_only_for_its_ageing_passes() {
        let mut bed = Bed::new(None);
        let t0 = bed.now;
        bed.sleep_until(t0);
        bed.hello(0);
        bed.hello(1);
        // Once a second on the grid of the first tick; the servers' stations are fresh for
        // another half of their ageing time, so no ARP round comes before.
        assert_eq!(bed.sw.poll_at(), Some(t0 + AGEING_EVERY));
        bed.emit.clear();
        bed.sleep_until(t0 + 10 * AGEING_EVERY);
        let grid: Vec<Instant> = (0..=10).map(|n| t0 + n * AGEING_EVERY).collect();
        assert_eq!(bed.ticks, grid);
        assert!(bed.emit.is_empty());
    }

    #[test]
    fn a_held_request_is_dropped_at_its_deadline_when_ticked_at_poll_at() {
        let mut bed = Bed::new(None);
        let t0 = bed.now;
        bed.sleep_until(t0 + Duration::from_millis(250));
        // Server 0's MAC is configured but its port unknown: held, and asked for at once.
        let key = bed.key_on(0);
        assert_eq!(bed.request(&format!("get {key}\r\n")), Fate::Consumed);
        assert_eq!(stats::get(&bed.stats.route_held), 1);
        let since = bed.now;
        assert!(bed.sw.poll_at().is_some_and(|t| t <= since));
        bed.sleep_until(since + HOLD_FOR - Duration::from_nanos(1));
        assert_eq!(bed.drops(Drop::RoutePortUnknown), 0);
        bed.sleep_until(since + HOLD_FOR);
        assert_eq!(bed.drops(Drop::RoutePortUnknown), 1);
        assert_eq!(bed.ticks.last(), Some(&(since + HOLD_FOR)));
    }

    #[test]
    fn an_unanswered_split_expires_at_its_deadline_when_ticked_at_poll_at() {
        let mut bed = Bed::new(None);
        let t0 = bed.now;
        bed.sleep_until(t0);
        bed.hello(0);
        bed.hello(1);
        bed.sleep_until(t0 + Duration::from_millis(250));
        let (a, b) = (bed.key_on(0), bed.key_on(1));
        bed.emit.clear();
        assert_eq!(bed.request(&format!("get {a} {b}\r\n")), Fate::Consumed);
        assert_eq!(bed.emit.len(), 2, "one sub-request per server");
        assert_eq!(stats::get(&bed.stats.splits_in_flight), 1);
        let deadline = bed.now + Duration::from_secs(1);
        bed.sleep_until(deadline - Duration::from_nanos(1));
        assert_eq!(bed.drops(Drop::SplitTimeout), 0);
        bed.sleep_until(deadline);
        assert_eq!(bed.drops(Drop::SplitTimeout), 1);
        assert_eq!(bed.ticks.last(), Some(&deadline));
        assert_eq!(stats::get(&bed.stats.splits_in_flight), 0);
    }

    #[test]
    fn a_key_admitted_by_a_read_reaches_kv_cache_at_the_tick_poll_at_asks_for_at_once() {
        let mut settings = crate::cache::CacheSettings {
            enabled: true,
            ..Default::default()
        };
        settings.cache.admit_every_read = true;
        let mut bed = Bed::new(Some(settings));
        let t0 = bed.now;
        bed.sleep_until(t0);
        bed.hello(0);
        bed.hello(1);
        bed.sleep_until(t0 + Duration::from_millis(250));
        let key = bed.key_on(0);
        assert_eq!(bed.request(&format!("get {key}\r\n")), Fate::Out(1));
        let kv_cache = |bed: &Bed| {
            let snapshot = bed.sw.snapshot();
            let table = snapshot.tables.iter().find(|t| t.name == "kv_cache");
            table.map(|t| t.entries)
        };
        assert_eq!(kv_cache(&bed), Some(0));
        // Admitted as it was read: its rule is released, and the table follows at once.
        assert!(bed.sw.poll_at().is_some_and(|t| t <= bed.now));
        bed.sleep_until(bed.now);
        assert_eq!(kv_cache(&bed), Some(1));
    }

    /// A pool whose servers' MACs are not configured: the switch asks for them with ARP,
    /// drops requests for a server it cannot reach yet (counted), and routes once it knows.
    #[test]
    fn backend_macs_are_resolved_with_arp() {
        let server = std::net::SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 11), 11211);
        let cfg = SwitchSpec::new(
            2,
            Ipv4Addr::new(10, 0, 0, 100),
            vec![crate::spec::Server {
                addr: server,
                mac: None,
            }],
        );
        let pool = crate::pool::PoolSpec::new(
            "default",
            std::net::SocketAddr::from((cfg.vip.ip, 11211)),
            kv::Distribution::Ketama,
            kv::HashFn::Md5,
            vec![crate::pool::ServerSpec {
                host: server.ip().to_string(),
                addr: server.into(),
                weight: 1,
                name: Some("s1".into()),
            }],
        );
        let pool = Arc::new(Pool::new(pool).unwrap());
        let stats = Arc::new(Stats::new(2, 1));
        let mut sw = Switch::new(cfg.clone(), pool, stats.clone()).unwrap();
        let now = Instant::from_secs(1_000);
        let client_mac: Mac = "02:00:00:00:00:01".parse().unwrap();
        let server_mac: Mac = "02:00:00:00:00:0b".parse().unwrap();
        let get = || {
            udp_frame(
                &UdpEnds {
                    src_mac: client_mac,
                    dst_mac: cfg.vip.mac,
                    src_ip: Ipv4Addr::new(10, 0, 0, 1),
                    dst_ip: cfg.vip.ip,
                    src_port: 4000,
                    dst_port: 11211,
                },
                &[b"\0\x01\0\0\0\x01\0\0get k\r\n"],
            )
        };
        let mut emit = Vec::new();

        // Unknown: the request is dropped and counted, and the tick asks for the MAC.
        assert_eq!(
            sw.process(0, &mut get(), true, now, &mut emit),
            Fate::Consumed
        );
        assert_eq!(
            stats::get(&stats.drops[Drop::BackendUnresolved as usize]),
            1
        );
        sw.tick(now, &mut emit);
        assert_eq!(emit.len(), 1);
        assert_eq!(emit[0].dest, Dest::Flood);
        let frame = &emit[0].frame;
        let asked = arp::Repr::parse(&arp::Packet::new_checked(&frame[14..]).unwrap()).unwrap();
        assert_eq!(asked.operation, arp::Operation::Request);
        assert_eq!(asked.target_ip, Ipv4Addr::new(10, 0, 0, 11));
        assert_eq!(asked.sender_mac, cfg.vip.mac);
        // Asked again only after the retry interval.
        emit.clear();
        sw.tick(now + Duration::from_millis(10), &mut emit);
        assert!(emit.is_empty());

        // The server answers on port 1; from then on its requests leave by that port.
        let reply = arp::Repr {
            operation: arp::Operation::Reply,
            sender_mac: server_mac,
            sender_ip: Ipv4Addr::new(10, 0, 0, 11),
            target_mac: cfg.vip.mac,
            target_ip: asked.sender_ip,
        };
        let mut answer = crate::frame::arp_frame(cfg.vip.mac, &reply);
        assert_eq!(
            sw.process(1, &mut answer, true, now, &mut emit),
            Fate::Consumed
        );
        let mut frame = get();
        assert_eq!(
            sw.process(0, &mut frame, true, now, &mut emit),
            Fate::Out(1)
        );
        assert_eq!(&frame[0..6], &server_mac.0);
        assert_eq!(&frame[30..34], &[10, 0, 0, 11]);
        assert_eq!(stats::get(&stats.backends[0].requests), 1);
        assert_eq!(
            sw.snapshot().backend_macs,
            vec![Some(server_mac.to_string())]
        );
        emit.clear();
        sw.tick(now + Duration::from_secs(5), &mut emit);
        assert!(emit.is_empty(), "a resolved server is not asked again");
    }
}
