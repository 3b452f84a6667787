//! The switch application: a parser stage, the match-action pipeline that holds the switch's
//! behaviour as table entries, and the CPU path (ARP for the VIP, answers memcached would give,
//! split multi-key gets). TCP for the VIP leaves through the local port, into the host's own
//! stack where the proxy runs.
//!
//! Driven by the run loop (or a test): frames and the time come in, a fate for each frame and
//! a list of frames to emit go out. No I/O here. This file holds the switch's state, its
//! construction and the walk of one frame through the stages; each stage has a file of its
//! own: `guard` (sources and the reply limit), `station` (learning, ARP, held requests),
//! `parse` (the parser stage), `tables` (the pipeline's tables), `cpu` (the switch's own
//! answers and split gets), `splice` (TCP to the VIP routed by key, when `tcp_splice` is on).

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

use kv::Instant;

use pipeline::{
    Action, Choose, Entry, Field, MatchKind, Meta, Pipeline, SelectorId, TableId, TableSpec,
    Verdict,
};
use wire::ethernet::{self, EtherType, Mac};
use wire::memcache::{self, Command, Protocol};
use wire::{arp, ipv4, keymac, mcudp, udp};

use crate::cache::CacheService;
use crate::frame::{self, UdpEnds};
use crate::pool::{Pool, View};
use crate::ratelimit::ReplyLimiter;
use crate::source::{self, Check, SourceGuard};
use crate::spec::{splitmix64, Mode, SpecError, SwitchSpec};
use crate::split::{self, Arrival, Splitter};
use crate::stats::{self, Answer, Drop, Stats};
use crate::udp_cache::{UdpCache, CPU_CACHE, REG_CACHE};

mod control;
mod cpu;
mod fast;
mod guard;
mod impair;
mod parse;
mod splice;
mod station;
mod tables;

pub(crate) use parse::complete_l4_checksum;
use parse::{Read, Stage};
use splice::speaks;
use tables::{build_tables, RingChooser};

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

impl Fate {
    /// Calls `out` with every port a frame received on `in_port` leaves by with this fate, in
    /// port order: `Out(p)` by `p` (the in-port included; a port past `ports` gets nothing), a
    /// flood by every port but the in-port and the `local` port. The one rule the switch and
    /// every driver follow.
    pub fn each_port(
        self,
        in_port: usize,
        ports: usize,
        local: Option<usize>,
        mut out: impl FnMut(usize),
    ) {
        match self {
            Fate::Out(p) if usize::from(p) < ports => out(usize::from(p)),
            Fate::Out(_) | Fate::Consumed => {}
            Fate::Flood => (0..ports)
                .filter(|&p| p != in_port && Some(p) != local)
                .for_each(out),
        }
    }
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
/// A plain UDP query a SwitchKV client encoded ([`wire::keymac`]) for the backend in its
/// destination IP: `kv_backend` sends it there.
const FLAG_SWITCHKV: u32 = 4;
/// Register 0 holds this when the parser stage routed the frame by key (a memcached request to
/// the VIP); no table matches on it.
const REG_ROUTED: usize = 0;
/// Set by an operator's `mirror`: a copy of the frame goes to the CPU queue.
const REG_MIRROR: usize = 2;
/// The verdict of an operator's `to_cpu`.
const CPU_OPERATOR: u16 = 202;

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

struct Tables {
    l2: TableId,
    ring: SelectorId,
    /// `kv_cache`, when the cache is on: exact on the key hash of reads it may answer.
    cache: Option<TableId>,
    /// `kv_steer`: the operator's entries that send reads of one key elsewhere.
    steer: TableId,
    /// `kv_backend`: a SwitchKV client's query to the backend in its destination IP.
    backend: TableId,
    /// The operator's table in front of the program.
    acl: TableId,
    /// The program's first table, where `acl` goes on to.
    program: TableId,
    local_in: TableId,
    vip_reply: TableId,
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
    /// Per server, whether the control plane removed it from the pool: a removed server's
    /// MAC and address are bound to no port, and its entries are gone.
    removed: Vec<bool>,
    /// The networks requests to the VIP may come from (`SwitchSpec::client_networks`, or the
    /// VIP's network).
    client_networks: Vec<source::Prefix>,
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
    /// What the control plane added: its tables, counters and the CPU queue.
    operator: control::Operator,
    /// The `impair` actions' profiles, their generator and the frames they hold back.
    impair: impair::Impairments,
    /// The interface-table entries `kv_steer` entries send reads through (the SwitchKV cache
    /// nodes' next hops), kept as `kv_steer` changes: only these may send a read back in its
    /// client's name past the source check.
    steer_hops: Vec<u16>,
    /// With a fast path in front of the switch: the senders whose frames the switch sent on,
    /// which the fast path may then switch itself ([`Switch::set_fast_path`]).
    fast_hosts: Option<std::collections::BTreeSet<crate::fastpath::Host>>,
    /// Whether the frame being processed left changed in length, as a frame of the switch's
    /// own (one of its senders is then the fast path's as much as one sent on unchanged).
    sent_resized: bool,
    /// The frame was a spliced connection's segment taken as its client's, or a leg's from its
    /// server: its sender is one a fast path may send the connection's segments on from.
    spliced_sender: bool,
    /// The pool version and ring last worked out for the fast path ([`Switch::fast_tables`]).
    fast_ring: Option<(u64, Arc<fast::FastRing>)>,
    /// TCP to the VIP's memcached port, routed by key (`SwitchSpec::tcp_splice`).
    splice: Option<splice::Splice>,
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
        let kind = |redis: bool| if redis { "Redis" } else { "memcached" };
        if spec.redis != pool.spec().redis.is_some() {
            return Err(SpecError::PoolKind {
                switch: kind(spec.redis),
                pool: kind(pool.spec().redis.is_some()),
            });
        }
        let speaks = speaks(&pool);
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
            removed: vec![false; backend_macs.len()],
            client_networks: if spec.client_networks.is_empty() {
                vec![source::Prefix {
                    addr: spec.vip.ip,
                    len: spec.vip.prefix_len,
                }]
            } else {
                spec.client_networks.clone()
            },
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
            operator: control::Operator::default(),
            impair: impair::Impairments::new(spec.seed),
            steer_hops: Vec::new(),
            fast_hosts: None,
            sent_resized: false,
            spliced_sender: false,
            fast_ring: None,
            splice: spec
                .tcp_splice
                .filter(|_| local.is_some())
                .map(|t| splice::Splice::new(spec.seed, t, speaks)),
            spec,
        };
        sw.operator.tables.insert(sw.tables.acl);
        sw.operator.tables.insert(sw.tables.steer);
        sw.operator.keys.insert(
            sw.tables.steer,
            vec![
                crate::control::KeyField::Meta {
                    name: "one_read".into(),
                    meta: crate::control::MetaField::Reg1,
                },
                crate::control::KeyField::Named("key_hash".into()),
            ],
        );
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

    /// How many ports the switch has.
    pub fn port_count(&self) -> usize {
        self.ports
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
        self.add_new_servers();
        self.note_removed();
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
            self.impair.next_due(),
            self.splice.as_ref().and_then(splice::Splice::poll_at),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// (Re)installs the ring selector's members from what is known of each backend, and its
    /// chooser from the pool's view.
    /// Takes in the servers the control plane added to the pool since the switch last looked:
    /// their addresses, their entries, and an ARP round to find their ports.
    fn add_new_servers(&mut self) {
        let pool = self.pool.spec();
        for s in pool.servers.iter().skip(self.spec.servers.len()) {
            let addr = match s.addr {
                std::net::SocketAddr::V4(a) => a,
                std::net::SocketAddr::V6(a) => {
                    // The UDP path is IPv4; the proxy still reaches the server.
                    tracing::warn!(server = %a, "an IPv6 server is not reachable over UDP");
                    SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, a.port())
                }
            };
            let i = self.spec.servers.len();
            self.spec
                .servers
                .push(crate::spec::Server { addr, mac: None });
            self.backend_macs.push(None);
            // The newest server at an address is the one its replies are counted for (it may
            // take the place of a removed one).
            self.backend_by_ip.insert(*addr.ip(), i);
            self.sources.push((*addr.ip(), addr.port()));
            tables::server_entries(&mut self.pipeline, &self.spec, &self.tables, addr);
            self.last_arp = None;
        }
    }

    /// Follows the servers the control plane removed from the pool or brought back: a removed
    /// server's UDP is no longer re-sourced as the VIP (`vip_reply`), queries to it are no
    /// longer taken (`kv_backend`), and its MAC and address are no longer bound to its port;
    /// one brought back gets them again.
    fn note_removed(&mut self) {
        let n = self.spec.servers.len();
        self.removed.resize(n, false);
        let mut changed = false;
        for i in 0..n {
            let removed = self.pool.health(i).removed;
            if self.removed[i] != removed {
                self.removed[i] = removed;
                changed = true;
                let label = self.pool.spec().servers[i].label();
                if removed {
                    tracing::info!(backend = %label, "server removed: its bindings and entries go");
                } else {
                    tracing::info!(backend = %label, "server back in the pool");
                }
            }
        }
        if !changed {
            return;
        }
        // By address: two servers may share one, and an address keeps its entries while any
        // server at it is in the pool.
        let mut addrs: Vec<(SocketAddrV4, bool)> = Vec::with_capacity(n);
        for (i, server) in self.spec.servers.iter().enumerate() {
            match addrs.iter_mut().find(|(a, _)| *a == server.addr) {
                Some((_, live)) => *live |= !self.removed[i],
                None => addrs.push((server.addr, !self.removed[i])),
            }
        }
        // A keyed port's reply entry is by address alone: it stays while any server at the
        // address is in the pool.
        let live_ips: Vec<Ipv4Addr> = addrs
            .iter()
            .filter(|(_, live)| *live)
            .map(|(a, _)| *a.ip())
            .collect();
        for (addr, live) in addrs {
            if live {
                tables::server_entries(&mut self.pipeline, &self.spec, &self.tables, addr);
            } else {
                let keep_keyed = live_ips.contains(addr.ip());
                tables::remove_server_entries(
                    &mut self.pipeline,
                    &self.spec,
                    &self.tables,
                    addr,
                    keep_keyed,
                );
            }
        }
    }

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
        // A SwitchKV client's queries go to the server at their destination IP (the newest
        // at an address, as its replies are counted).
        for (&ip, &i) in &self.backend_by_ip {
            let mut key = Vec::with_capacity(8);
            key.extend_from_slice(&(FLAG_PLAIN_UDP | FLAG_SWITCHKV).to_be_bytes());
            key.extend_from_slice(&ip.octets());
            if self.removed.get(i).copied().unwrap_or(false) {
                // Queries to a removed server's address are misaddressed now.
                if let Some(id) = self.pipeline.lookup_exact(self.tables.backend, &key) {
                    self.pipeline.remove(self.tables.backend, id)?;
                }
                continue;
            }
            let actions = match self.backend_macs.get(i).copied().flatten() {
                Some(mac) => vec![Action::SetEthDst(mac.0), Action::Goto(self.tables.l2)],
                None => vec![Action::Drop(Drop::BackendUnresolved.code())],
            };
            match self.pipeline.lookup_exact(self.tables.backend, &key) {
                Some(id) => self
                    .pipeline
                    .set_actions(self.tables.backend, id, actions)?,
                None => {
                    self.pipeline
                        .insert(self.tables.backend, Entry::exact(key, actions))?;
                }
            }
        }
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
        let sender = self.fast_sender(in_port, frame);
        self.sent_resized = false;
        self.spliced_sender = false;
        let fate = self.process_frame(in_port, frame, csum_ready, now, emit);
        if let Some(host) = sender {
            // Sent on as it came, or changed in length (a keyed request without its header),
            // or a spliced connection's segment from its client or a leg's server.
            if matches!(fate, Fate::Out(_)) || self.sent_resized || self.spliced_sender {
                self.fast_note(host);
            }
        }
        fate
    }

    fn process_frame(
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
        if let Err(reason) = self.learn(src, in_port, now) {
            // A MAC bound to another port: the frame speaks for another host.
            self.stats.count_drop(reason);
            return Fate::Consumed;
        }
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
            regs: [0; pipeline::NUM_REGS],
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
                        one_read,
                    } => {
                        meta.flags = flags;
                        meta.key_hash = key_hash;
                        meta.regs[REG_ROUTED] = u32::from(routed);
                        meta.regs[REG_CACHE] = u32::from(one_read);
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

    /// Sends a frame an `impair` action matched as its profile `n` draws: dropped, sent
    /// once or twice, now or held back, out of each port `fate` names.
    fn impaired(&mut self, n: u32, fate: Fate, in_port: u16, bytes: Vec<u8>, emit: &mut Vec<Emit>) {
        let mut ports = Vec::new();
        fate.each_port(
            in_port.into(),
            self.ports,
            self.local.map(usize::from),
            |p| ports.push(p as u16),
        );
        let now = self.now.unwrap_or(Instant::ZERO);
        for p in ports {
            match self.impair.decide(n) {
                impair::Effect::Drop => self.stats.count_drop(Drop::Impaired),
                impair::Effect::Send { copies, wait } => {
                    if copies > 1 {
                        stats::inc(&self.stats.impaired_duplicated);
                    }
                    for _ in 0..copies {
                        let out = Emit {
                            dest: Dest::Port(p),
                            frame: bytes.clone(),
                        };
                        if wait.is_zero() {
                            emit.push(out);
                        } else if !self.impair.hold(now + wait, out) {
                            self.stats.count_drop(Drop::Impaired);
                        }
                    }
                }
            }
        }
        self.count_impaired();
    }

    fn finish(
        &mut self,
        verdict: Verdict,
        in_port: u16,
        frame: &mut [u8],
        meta: Meta,
        emit: &mut Vec<Emit>,
    ) -> Fate {
        // A label pushed or popped changed the frame's length: it leaves as a frame of the
        // switch's own, from the pipeline's buffer.
        let moved = self.pipeline.resized().map(<[u8]>::to_vec);
        // A TCP segment the pipeline sends on, to the VIP's memcached port or from a spliced
        // connection's target: the splice rewrites it and says where it goes (the operator's
        // `acl` entries, drops and impairments included, apply to it as to any frame).
        let spliced = match (&self.splice, &moved, verdict) {
            (Some(_), None, Verdict::Output(_)) if meta.flags & FLAG_PLAIN_TCP != 0 => {
                self.splice_segment(in_port, frame, emit)
            }
            _ => None,
        };
        let frame: &[u8] = moved.as_deref().unwrap_or(frame);
        let routed = meta.regs[REG_ROUTED] != 0;
        if meta.regs[REG_MIRROR] != 0 {
            self.queue_for_cpu(in_port, "mirror", frame);
        }
        let impair = meta.regs[impair::REG_IMPAIR];
        let fate = match spliced {
            Some(fate) => fate,
            None => self.resolve(verdict, in_port, routed, frame, impair, emit),
        };
        if routed && fate != Fate::Consumed {
            // Counted once the pipeline has sent it on, not when it was parsed, for the server
            // it leaves for (with that server's MAC): the key's owner on the ring, or the
            // server a SwitchKV client's query names. A read steered to a cache node, or sent
            // elsewhere by an operator, leaves with another MAC and counts for none.
            let server = match meta.flags & FLAG_SWITCHKV {
                0 => self.view.read_locate_hash(meta.key_hash),
                _ => frame
                    .get(usize::from(OFF_IP_DST)..usize::from(OFF_IP_DST) + 4)
                    .and_then(|b| <[u8; 4]>::try_from(b).ok())
                    .and_then(|ip| self.backend_by_ip.get(&Ipv4Addr::from(ip)).copied()),
            }
            .filter(|&i| {
                let mac = self.backend_macs.get(i).copied().flatten();
                mac.is_some_and(|m| frame.get(0..6) == Some(&m.0[..]))
            });
            if let Some(server) = server {
                self.stats.backend_request(server);
                if meta.flags & FLAG_SWITCHKV == 0 {
                    self.view.count(meta.key_hash);
                }
            }
            stats::inc(&self.stats.kv_forwarded);
        }
        if impair != 0 && matches!(fate, Fate::Out(_) | Fate::Flood) {
            let bytes = frame.to_vec();
            self.impaired(impair, fate, in_port, bytes, emit);
            return Fate::Consumed;
        }
        match (moved, fate) {
            (Some(bytes), Fate::Out(p)) => {
                self.sent_resized = true;
                emit.push(Emit {
                    dest: Dest::Port(p),
                    frame: bytes,
                });
                Fate::Consumed
            }
            (Some(bytes), Fate::Flood) => {
                let local = self.local.map(usize::from);
                Fate::Flood.each_port(in_port.into(), self.ports, local, |p| {
                    emit.push(Emit {
                        dest: Dest::Port(p as u16),
                        frame: bytes.clone(),
                    })
                });
                Fate::Consumed
            }
            (_, fate) => fate,
        }
    }

    /// Turns the pipeline's verdict into a fate (a multicast's copies, impaired as `impair`
    /// says, sent at once).
    fn resolve(
        &mut self,
        verdict: Verdict,
        in_port: u16,
        routed: bool,
        frame: &[u8],
        impair: u32,
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
            Verdict::Multicast(g) => {
                self.multicast(g, in_port, frame, impair, emit);
                Fate::Consumed
            }
            Verdict::ToCpu(CPU_ARP) => {
                self.answer_arp(in_port, frame, emit);
                Fate::Consumed
            }
            Verdict::ToCpu(CPU_OPERATOR) => {
                self.queue_for_cpu(in_port, "to_cpu", frame);
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
                    pipeline::reason::NO_LABEL | pipeline::reason::LABEL_PAYLOAD_UNKNOWN => {
                        Drop::Label
                    }
                    pipeline::reason::FRAME_TOO_LONG => Drop::FrameTooLong,
                    pipeline::reason::NO_UDP_PAYLOAD => Drop::UdpStrip,
                    code => Drop::from_code(code).unwrap_or(Drop::NoAction),
                };
                self.stats.count_drop(reason);
                Fate::Consumed
            }
        }
    }

    /// Sends a copy of `frame` to each member of multicast group `g`, in the group's order:
    /// out of a port as it is, through an interface entry with its addresses; each copy
    /// impaired as profile `impair` says (0: none). A member on the port the frame came in by
    /// gets no copy (as flooding sends none back), nor does one on a port past the switch's; a
    /// frame left with no copy at all is dropped as `same_port`.
    fn multicast(&mut self, g: u16, in_port: u16, frame: &[u8], impair: u32, emit: &mut Vec<Emit>) {
        let ports = self.ports;
        let to = |port: u16| port != in_port && usize::from(port) < ports;
        let Some(copies) = self.pipeline.copies(g, frame, to) else {
            // Removal is refused while an action names the group.
            self.stats.count_drop(Drop::NoAction);
            return;
        };
        if copies.is_empty() {
            self.stats.count_drop(Drop::SamePort);
            return;
        }
        stats::inc(&self.stats.multicast);
        self.stats
            .multicast_copies
            .fetch_add(copies.len() as u64, std::sync::atomic::Ordering::Relaxed);
        for (port, copy) in copies {
            match impair {
                0 => emit.push(Emit {
                    dest: Dest::Port(port),
                    frame: copy,
                }),
                n => self.impaired(n, Fate::Out(port), in_port, copy, emit),
            }
        }
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
        self.impair.release(now, emit);
        self.count_impaired();
        if let Some(cache) = &mut self.cache {
            let view = &self.view;
            cache.tick(now, &mut self.pipeline, &|key| view.key_hash(key));
        }
        self.age_macs(now);
        self.age_splice(now, emit);
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

    /// Publishes how many frames the `impair` actions hold.
    fn count_impaired(&self) {
        self.stats.impaired_held.store(
            self.impair.held() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Publishes how many split gets are in flight; called wherever that changes, so that the
    /// gauge does not depend on how often the caller ticks.
    fn count_splits(&self) {
        self.stats.splits_in_flight.store(
            self.splitter.in_flight() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
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
        settings.cache.admission = kv::cache::Admission::EveryRead;
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
