//! One switch of a coherent caching fabric (IncBricks, sections 4.1 to 4.6): a ToR or a root
//! of a tree of kvswitches, each with a fixed-size LFU cache, the ToRs homes of their racks'
//! memcached servers with the directory that keeps every copy coherent.
//!
//! Ordinary traffic is routed by IPv4 destination: within a rack by learned MAC, between racks
//! up to a root chosen by a hash of the flow among the roots that are up (ECMP), and down to
//! the destination's ToR. Frames keep their Ethernet addresses (hosts know each other's MACs).
//!
//! A memcached UDP request from a host to a server of the fabric is taken in by the ToR next
//! to the client: a `get` of one key is answered from its cache when it can; otherwise the
//! request travels as a [`wire::inc`] message, expanded with the client's address, along the
//! key's designated path (the registration table's root for the key, then the server's ToR),
//! and every designated switch on the way may answer a `get` from its cache. The server's ToR
//! is the key's home: it sends reads on to the server as the client's own datagram, and wraps
//! the server's reply datagrams in messages back along the path; a reply the directory lets
//! fill is cached by the designated switches it passes. A write waits at the home until every
//! switch that may hold its key has acknowledged an invalidation, then goes to the server; the
//! client's ToR shrinks each reply back into the datagram the server sent.
//!
//! Neighbours greet each other every `hello_every`; a neighbour not heard from for
//! `dead_after` is down. A message whose designated root is down goes by another root,
//! flagged as a detour: nobody caches it on the way. A controller's new registration table
//! names failed switches: their copies are forgotten and the writes that waited for them go
//! on.
//!
//! Pure, like [`crate::Switch`]: frames, instants and the table come from the caller.
//!
//! This file holds the switch's state, its public API and the entry points (`process` for a
//! frame, `tick` for the time); each stage has a file of its own: `guard` (what may enter at a
//! ToR's host ports), `forward` (ordinary frames), `ingress` (a client's request at its ToR),
//! `answer` (what a switch answers a client itself), `message` (fabric messages to a switch,
//! requests on their path), `compute` (increments on a cached copy), `home` (a request at its
//! home), `write` (writes and their invalidations), `reply` (replies on their way back),
//! `update` (write-update's copies of a stored value), `node` (home nodes' messages), `relay` (invalidations received, a root's relays), `failed`
//! (switches a table names failed); beneath them `topology` (ports, neighbours, racks,
//! servers) and `send` (the frames a switch sends).

mod answer;
mod compute;
mod failed;
mod forward;
mod guard;
mod home;
pub mod incbox;
mod ingress;
mod message;
mod node;
mod relay;
mod reply;
mod send;
mod spec;
mod topology;
mod update;
mod write;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::Ipv4Addr;

use kv::fabric::{
    Directory, DirectoryStats, Due, LfuStats, ReadStamp, Registration, SwitchId, WriteStep,
};
use kv::Instant;
use wire::ethernet::{self, EtherType, Mac};
use wire::fnv::fnv1a_parts;
use wire::frame::{parse_udp, UdpEnds};
use wire::inc::classify::{
    after_delta, cached_number, classify, cond_operand, reply_key, text_delta, text_safe, Kind,
};
use wire::inc::{self, flags, Command, Header, Message};
use wire::{ipv4, mcudp};

pub use spec::{
    Coherence, FabricServer, FabricSpec, FabricSpecError, Member, PortRole, Rack, Role,
};

use crate::{Dest, Emit, Fate};
use guard::Refusal;
pub use incbox::{IncBox, IncBoxSpec, IncBoxStats};

/// Reads a home remembers while their server answers; past it, replies go back as ordinary
/// frames and fill nothing (writes are always remembered).
const MAX_PENDING: usize = 1 << 16;
/// How often home nodes are told again of the switches the table names failed.
const FAILED_NOTICE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
/// Hosts (addresses and MACs) a ToR learns on its host ports; past it, new ones are not
/// learned (their frames are still forwarded, flooded within the rack).
const MAX_HOSTS: usize = 4096;
/// Keys a root remembers having filled ToRs from its own copy; past it, its hits fill no ToR.
const MAX_FILLED: usize = 1 << 16;
/// How long past a lease a home waits before it takes a failed switch's copies as gone.
const FAILED_MARGIN: std::time::Duration = std::time::Duration::from_millis(100);

/// A time in whole microseconds, for the counters.
fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A lease left, in the whole milliseconds a fill's header carries.
fn whole_ms(left: std::time::Duration) -> u32 {
    u32::try_from(left.as_millis()).unwrap_or(u32::MAX)
}

/// Counters an operator reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FabricStats {
    /// Memcached requests taken into the fabric by this ToR.
    pub requests_in: u64,
    /// Of those, answered from this switch's cache (also counted by the cache).
    pub hits: u64,
    /// Requests refused as the fabric cannot keep them coherent.
    pub refused: u64,
    /// Requests a home sent on to its server.
    pub to_server: u64,
    /// Messages passed to a home node of this rack (requests, acknowledgements), and
    /// messages from it relayed on (replies, invalidations).
    pub to_home_node: u64,
    pub from_home_node: u64,
    /// Increments of a home node's key computed on this switch's copy, and of those, the new
    /// values kept (the home's result agreed and nothing had changed the key).
    pub computed: u64,
    pub computed_kept: u64,
    /// Replies shrunk back into the client's datagram.
    pub replies_out: u64,
    /// Fabric messages sent, and received for this switch.
    pub messages_sent: u64,
    pub messages_in: u64,
    pub invalidations_sent: u64,
    pub invalidations_in: u64,
    /// Invalidations dropped on an operator's order (`drop_invalidations`).
    pub invalidations_dropped: u64,
    pub acks_sent: u64,
    /// Replies that failed a write its invalidations could not complete.
    pub writes_failed: u64,
    /// Frames with no way on (no root up, a rack's ToR unreachable, a client unknown).
    pub no_route: u64,
    /// Frames and messages that could not be read.
    pub malformed: u64,
    /// Messages this switch cannot act on (a request for a server it is not the home of).
    pub unexpected: u64,
    /// Frames routed on unchanged.
    pub routed: u64,
    /// Messages that left by another root than the designated one.
    pub detours: u64,
    /// Frames from a host port with a source outside the rack or a switch's address, or
    /// to a switch's address, or a server's reply from another MAC, or from a MAC or address
    /// bound to another host (another port, another MAC): dropped.
    pub refused_sources: u64,
    /// Writes refused as their key had too many waiting already.
    pub writes_refused: u64,
    /// At a home, where its writes' time went (IncBricks' Figure 9): writes sent on to their
    /// server and their time held here first, for their invalidations' acknowledgements and
    /// behind earlier writes to their key, in µs; writes their server answered and the time
    /// from sending each to its reply, in µs. Writes that failed or were refused are in
    /// neither; a conditional put's read of the server's value is in neither, and one that
    /// stored nothing is forwarded but not answered.
    pub writes_forwarded: u64,
    pub writes_held_us: u64,
    pub writes_answered: u64,
    pub writes_server_us: u64,
    /// Under write-update, at a home: the copies of a stored write's value it sent to the
    /// switches the write invalidated (each also fills the designated root on its way).
    pub updates_sent: u64,
    /// IPv4 fragments from hosts to a server of the fabric: dropped.
    pub refused_fragments: u64,
    /// A root's hits that filled the client's ToR from the root's copy.
    pub root_fills: u64,
    /// Invalidations a root passed on to the ToRs it filled.
    pub invalidations_relayed: u64,
}

/// A view of the switch for the status API and the tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FabricSnapshot {
    pub id: SwitchId,
    pub role: Role,
    pub stats: FabricStats,
    pub cache: LfuStats,
    /// The switch stage's and the processors' counters.
    pub incbox: IncBoxStats,
    pub cached_items: usize,
    /// Items it may hold.
    pub cache_capacity: usize,
    pub directory: DirectoryStats,
    pub registration_version: u64,
    /// The coherence protocol this switch runs as a home.
    pub coherence: Coherence,
    /// Per port: whether the neighbour behind it is up (`None` for host ports).
    pub links_up: Vec<Option<bool>>,
}

/// A write waiting at its home.
#[derive(Debug, Clone)]
struct Write {
    key: Vec<u8>,
    command: Command,
    origin: SwitchId,
    detour: bool,
    native: bool,
    request_id: u16,
    client: (Ipv4Addr, u16),
    server: (Ipv4Addr, u16),
    /// The client's memcached datagram, frame header included.
    datagram: Vec<u8>,
    /// Its server will not answer it (`noreply`, meta `q`, quiet binary opcodes).
    quiet: bool,
    /// When the home took it.
    arrived: Instant,
}

/// A request a home sent on to its server, by (client address, client port, memcached
/// request id).
#[derive(Debug, Clone)]
struct Pending {
    key: Vec<u8>,
    /// A read's stamp; `None` for a write.
    stamp: Option<ReadStamp>,
    /// A conditional put whose home asked the server for the key's value first.
    cond: Option<Write>,
    origin: SwitchId,
    detour: bool,
    native: bool,
    request_id: u16,
    since: Instant,
    /// Under write-update, for a write: the reply a read of its key gives once the server
    /// has stored it (`VALUE ... END`), sent to the switches the write invalidated.
    update: Option<Vec<u8>>,
}

type Flow = (Ipv4Addr, u16, u16);

/// An increment this switch computed on its copy: the item, the new number, and the cached
/// reply that holds it, kept if the home's reply agrees.
#[derive(Debug, Clone)]
struct Computed {
    name: Vec<u8>,
    value: u64,
    reply: Vec<u8>,
    since: Instant,
}

/// An invalidation a root passed on to the ToRs it filled from its copy, acknowledged to the
/// key's home once every one of them has acknowledged it.
#[derive(Debug, Clone)]
struct Relay {
    /// The write's epoch: only acknowledgements of it count.
    epoch: u32,
    key: Vec<u8>,
    /// The ToRs still to acknowledge, and until when their copies may live.
    waiting: BTreeMap<SwitchId, Instant>,
    /// Whom the acknowledgement goes to, and the invalidation it answers.
    home: SwitchId,
    header: Header,
}

/// One switch of a fabric.
#[derive(Debug)]
pub struct FabricSwitch {
    spec: FabricSpec,
    me: Member,
    /// The cache: its switch stage and processors.
    cache: IncBox,
    /// At a home: what writes to its servers' keys said of their expiry (by item name), which
    /// the fills it grants keep to.
    expiries: kv::expiry::Expiries,
    directory: Directory<Write>,
    /// Hosts' MACs on this ToR's host ports.
    macs: HashMap<Mac, u16>,
    /// Hosts' addresses: their MAC and port, for replies shrunk back to them.
    hosts: HashMap<Ipv4Addr, (Mac, u16)>,
    /// Per port, when the neighbour behind it was last heard (links only).
    heard: Vec<Option<Instant>>,
    next_hello: Option<Instant>,
    /// When home nodes are next told again of the switches the table names failed.
    next_failed_notice: Option<Instant>,
    pending: HashMap<Flow, Pending>,
    pending_order: VecDeque<(Instant, Flow)>,
    /// Increments computed here, by their client's flow, until their reply passes.
    computed: HashMap<Flow, Computed>,
    computed_order: VecDeque<(Instant, Flow)>,
    next_request_id: u16,
    /// Invalidations still to drop on the operator's order.
    drop_invalidations: u64,
    /// Switches a table named failed, and when their copies are surely gone (a lease on).
    failing: Vec<(SwitchId, Instant)>,
    /// A root's: by item, the ToRs it filled from its own copy and until when their copies
    /// may live.
    filled: HashMap<Vec<u8>, Vec<(SwitchId, Instant)>>,
    /// A root's invalidations passed on to those ToRs, by item (a home writes one key at a
    /// time: a new epoch takes over the ToRs an earlier write left unacknowledged).
    relaying: HashMap<Vec<u8>, Relay>,
    stats: FabricStats,
}

/// With the hit check, the switch stage's table must have a mark for every item the cache
/// may hold, so that a fill never finds it full.
fn check_table(incbox: IncBoxSpec, items: usize) -> Result<(), String> {
    if incbox.hit_check && incbox.fdb_entries < items {
        return Err(format!(
            "the switch stage's table of {} entries cannot mark {items} cached items: give \
             `fdb_entries` at least the items",
            incbox.fdb_entries
        ));
    }
    Ok(())
}

/// The cache's and the directory's name for `key` of `server`: the server's address and port,
/// then the key (two servers' items of one name are two items).
fn item(server: (Ipv4Addr, u16), key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(6 + key.len());
    out.extend_from_slice(&server.0.octets());
    out.extend_from_slice(&server.1.to_be_bytes());
    out.extend_from_slice(key);
    out
}

/// The server and the key of an [`item`] name.
fn split_item(name: &[u8]) -> Option<((Ipv4Addr, u16), &[u8])> {
    let ip = Ipv4Addr::new(*name.first()?, *name.get(1)?, *name.get(2)?, *name.get(3)?);
    let port = u16::from_be_bytes([*name.get(4)?, *name.get(5)?]);
    Some(((ip, port), name.get(6..)?))
}

impl FabricSwitch {
    pub fn new(spec: FabricSpec) -> Result<FabricSwitch, FabricSpecError> {
        spec.validate()?;
        let me = *spec.member(spec.id).expect("validated");
        let cache = IncBox::new(
            spec.incbox,
            spec.cache_items,
            spec.tombstone_for,
            spec.lease,
        );
        let directory = Directory::new(
            spec.directory_keys,
            spec.invalidate_retry,
            spec.invalidate_give_up,
            spec.reply_timeout,
            spec.lease,
        );
        let heard = vec![None; spec.ports.len()];
        Ok(FabricSwitch {
            spec,
            me,
            cache,
            directory,
            expiries: kv::expiry::Expiries::default(),
            macs: HashMap::new(),
            hosts: HashMap::new(),
            heard,
            next_hello: None,
            next_failed_notice: None,
            pending: HashMap::new(),
            computed: HashMap::new(),
            computed_order: VecDeque::new(),
            pending_order: VecDeque::new(),
            next_request_id: 0,
            drop_invalidations: 0,
            failing: Vec::new(),
            filled: HashMap::new(),
            relaying: HashMap::new(),
            stats: FabricStats::default(),
        })
    }

    /// Whether this switch caches `key` (of any server) now.
    pub fn holds(&self, key: &[u8]) -> bool {
        self.spec
            .servers
            .iter()
            .any(|s| self.cache.contains(&item((s.ip, s.port), key)))
    }

    pub fn snapshot(&self, now: Instant) -> FabricSnapshot {
        FabricSnapshot {
            id: self.me.id,
            role: self.me.role,
            stats: self.stats,
            cache: self.cache.cache_stats(),
            incbox: self.cache.stats(),
            cached_items: self.cache.len(),
            cache_capacity: self.cache.capacity(),
            directory: self.directory.stats(),
            registration_version: self.spec.registration.version(),
            coherence: self.spec.coherence,
            links_up: (0..self.spec.ports.len())
                .map(|p| match self.spec.ports[p] {
                    PortRole::Host => None,
                    PortRole::Link(_) => Some(self.up(p as u16, now)),
                })
                .collect(),
        }
    }

    /// Changes how many items this switch caches (0: none), evicting the least frequently
    /// used past it. Refused when the switch stage's table (with the hit check) would hold
    /// fewer marks than the items.
    pub fn set_cache_items(&mut self, items: usize) -> Result<(), String> {
        self.set_cache(items, self.spec.incbox)
    }

    /// Items this switch may cache.
    pub fn cache_items(&self) -> usize {
        self.spec.cache_items
    }

    /// Chooses the coherence protocol this switch runs as a home, from its next write's
    /// reply on (a write under way when it changes updates, or not, as it began).
    pub fn set_coherence(&mut self, coherence: Coherence) {
        self.spec.coherence = coherence;
    }

    /// How the cache is laid out.
    pub fn incbox(&self) -> IncBoxSpec {
        self.spec.incbox
    }

    /// Lays the cache out anew: its processors and whether the switch stage checks for hits.
    /// Unless only the table's size changed, the copies held are dropped (the homes'
    /// invalidations of them are still acknowledged, and the tombstones kept).
    pub fn set_incbox(&mut self, incbox: IncBoxSpec) -> Result<(), String> {
        self.set_cache(self.spec.cache_items, incbox)
    }

    /// The cache's size and layout together, checked as a pair (with the hit check, a table
    /// with a mark for every item), so that no order of changes can leave a table smaller
    /// than the cache. Nothing changes when refused.
    pub fn set_cache(&mut self, items: usize, incbox: IncBoxSpec) -> Result<(), String> {
        incbox.validate()?;
        check_table(incbox, items)?;
        self.spec.cache_items = items;
        self.spec.incbox = incbox;
        self.cache.reshape(incbox);
        self.cache.set_capacity(items);
        Ok(())
    }

    /// The operator's fault: drop the next `n` invalidations this switch receives (unacknowledged,
    /// so their home sends them again).
    pub fn drop_invalidations(&mut self, n: u64) {
        self.drop_invalidations = n;
    }

    /// Installs a controller's registration table. Refused unless newer than the one held.
    /// Switches it names failed leave every sharer list (their writes go on), and a switch
    /// named failed itself forgets its copies.
    pub fn set_registration(
        &mut self,
        table: Registration,
        now: Instant,
        emit: &mut Vec<Emit>,
    ) -> Result<(), String> {
        if table.version() <= self.spec.registration.version() {
            return Err(format!(
                "registration table version {} is not newer than {}",
                table.version(),
                self.spec.registration.version()
            ));
        }
        if let Some(&bad) = table
            .buckets()
            .iter()
            .find(|&&r| self.spec.member(r).map(|m| m.role) != Some(Role::Root))
        {
            return Err(format!(
                "the table designates switch {bad}, which is not a root"
            ));
        }
        let newly_failed: Vec<SwitchId> = table
            .failed()
            .iter()
            .copied()
            .filter(|id| !self.spec.registration.is_failed(*id))
            .collect();
        // Named failed, or a table missed (one may have named it failed): its copies are
        // no longer counted by the homes.
        if table.is_failed(self.me.id) || table.version() > self.spec.registration.version() + 1 {
            self.cache.clear();
        }
        self.spec.registration = table;
        // A switch declared failed may only be slow: its copies are taken as gone once a
        // lease has passed, and the writes that wait for it go on then.
        for id in newly_failed {
            self.failing
                .push((id, now + self.spec.lease + FAILED_MARGIN));
        }
        self.release_failed(now, emit);
        Ok(())
    }

    /// Handles one received frame.
    pub fn process(
        &mut self,
        in_port: u16,
        frame: &mut [u8],
        csum_ready: bool,
        now: Instant,
        emit: &mut Vec<Emit>,
    ) -> Fate {
        self.start(now);
        let Ok(eth) = ethernet::Frame::new_checked(&frame[..]) else {
            self.stats.malformed += 1;
            return Fate::Consumed;
        };
        let (src, dst, ethertype) = (eth.src(), eth.dst(), eth.ethertype());
        let Some(role) = self.port_role(in_port) else {
            self.stats.malformed += 1;
            return Fate::Consumed;
        };
        if role == PortRole::Host && !self.bind_mac(src, in_port) {
            self.stats.refused_sources += 1;
            return Fate::Consumed;
        }
        if ethertype == EtherType::ARP && role == PortRole::Host {
            if let Some(reply) = self.arp_for_me(frame) {
                emit.push(Emit {
                    dest: Dest::Port(in_port),
                    frame: reply,
                });
                return Fate::Consumed;
            }
        }
        if ethertype != EtherType::IPV4 {
            // Hosts' ARP and other traffic stay within their rack.
            return match role {
                PortRole::Host => self.switch_l2(in_port, dst, frame, emit),
                PortRole::Link(_) => {
                    self.stats.no_route += 1;
                    Fate::Consumed
                }
            };
        }
        if !csum_ready {
            crate::switch::complete_l4_checksum(frame);
        }
        if role == PortRole::Host {
            match self.host_refusal(frame) {
                Some(Refusal::Source) => {
                    self.stats.refused_sources += 1;
                    return Fate::Consumed;
                }
                Some(Refusal::Fragment) => {
                    self.stats.refused_fragments += 1;
                    return Fate::Consumed;
                }
                None => {}
            }
        }
        if role == PortRole::Host && !self.bind_ip(frame, src, in_port) {
            self.stats.refused_sources += 1;
            return Fate::Consumed;
        }
        let Some((udp, udp_payload)) = parse_udp(frame) else {
            return self.route(in_port, frame, None, now, emit);
        };
        if udp.dst_port == inc::PORT && udp.dst_ip == self.me.ip {
            // Only another switch speaks to a switch, and a home node to its ToR.
            if role == PortRole::Host {
                match self.home_node(udp.src_ip).filter(|n| n.mac == src) {
                    Some(node) if udp.src_port == inc::PORT => {
                        let payload = udp_payload.to_vec();
                        self.home_node_message(&node, &payload, now, emit);
                    }
                    _ => self.stats.refused_sources += 1,
                }
                return Fate::Consumed;
            }
            let (src_ip, payload) = (udp.src_ip, udp_payload.to_vec());
            self.message(in_port, src_ip, &payload, now, emit);
            return Fate::Consumed;
        }
        if role == PortRole::Host && self.me.role == Role::Tor {
            let native_server = (udp.dst_port == inc::PORT)
                .then(|| {
                    self.spec
                        .servers
                        .iter()
                        .find(|s| s.ip == udp.dst_ip)
                        .copied()
                })
                .flatten();
            if let Some(server) = native_server {
                let client = (udp.src_ip, udp.src_port);
                let payload = udp_payload.to_vec();
                self.ingress_native(client, (server.ip, server.port), &payload, now, emit);
                return Fate::Consumed;
            }
            if self.server(udp.dst_ip, udp.dst_port).is_some() {
                let client = (udp.src_ip, udp.src_port);
                let server = (udp.dst_ip, udp.dst_port);
                let datagram = udp_payload.to_vec();
                if self.ingress(client, server, &datagram, None, now, emit) {
                    return Fate::Consumed;
                }
            } else if self
                .server(udp.src_ip, udp.src_port)
                .is_some_and(|s| s.mac == src)
                && self.home_of(udp.src_ip) == Some(self.me.id)
            {
                let client = (udp.dst_ip, udp.dst_port);
                let server = (udp.src_ip, udp.src_port);
                let datagram = udp_payload.to_vec();
                if self.server_reply(client, server, &datagram, now, emit) {
                    return Fate::Consumed;
                }
            }
        }
        let flow = fnv1a_parts(&[
            &udp.src_ip.octets(),
            &udp.dst_ip.octets(),
            &udp.src_port.to_be_bytes(),
            &udp.dst_port.to_be_bytes(),
        ]);
        self.route(in_port, frame, Some(flow), now, emit)
    }

    fn new_request_id(&mut self) -> u16 {
        self.next_request_id = self.next_request_id.wrapping_add(1);
        self.next_request_id
    }

    fn start(&mut self, now: Instant) {
        if self.next_hello.is_none() {
            // Every neighbour counts as up until it has had time to greet.
            for (p, role) in self.spec.ports.iter().enumerate() {
                if matches!(role, PortRole::Link(_)) {
                    self.heard[p] = Some(now);
                }
            }
            self.next_hello = Some(now);
        }
    }

    /// Greetings, retransmitted invalidations, failed writes, forgotten requests.
    pub fn tick(&mut self, now: Instant, emit: &mut Vec<Emit>) {
        self.start(now);
        if self.next_hello.is_some_and(|at| now >= at) {
            self.next_hello = Some(now + self.spec.hello_every);
            for p in 0..self.spec.ports.len() as u16 {
                if let Some(PortRole::Link(to)) = self.port_role(p) {
                    let Some(member) = self.spec.member(to).copied() else {
                        continue;
                    };
                    let hello = Header {
                        request_id: 0,
                        command: Command::Hello,
                        key_hash: 0,
                        flags: 0,
                        origin: self.me.id,
                        via: 0,
                        epoch: 0,
                        client: (Ipv4Addr::UNSPECIFIED, 0),
                        server: (Ipv4Addr::UNSPECIFIED, 0),
                        lease_ms: 0,
                    };
                    if let Some(frame) = self.message_frame((member.mac, member.ip), &hello, &[]) {
                        emit.push(Emit {
                            dest: Dest::Port(p),
                            frame,
                        });
                    }
                }
            }
        }
        self.release_failed(now, emit);
        for due in self.directory.tick(now) {
            match due {
                Due::Retransmit { key, epoch, target } => {
                    self.send_invalidation(&key, epoch, target, now, emit)
                }
                Due::Step { key, step } => self.write_step(&key, step, now, emit),
            }
        }
        while let Some(&(since, flow)) = self.computed_order.front() {
            if now < since + self.spec.reply_timeout {
                break;
            }
            self.computed_order.pop_front();
            if self.computed.get(&flow).is_some_and(|c| c.since == since) {
                self.computed.remove(&flow);
            }
        }
        while let Some(&(since, flow)) = self.pending_order.front() {
            if now < since + self.spec.reply_timeout {
                break;
            }
            self.pending_order.pop_front();
            if self.pending.get(&flow).is_some_and(|p| p.since == since) {
                self.pending.remove(&flow);
            }
        }
    }

    /// When [`FabricSwitch::tick`] next has work.
    pub fn poll_at(&self) -> Option<Instant> {
        let pending = self
            .pending_order
            .front()
            .into_iter()
            .chain(self.computed_order.front())
            .map(|&(since, _)| since + self.spec.reply_timeout)
            .min();
        let failing = self.failing.iter().map(|&(_, at)| at).min();
        [self.next_hello, self.directory.poll_at(), pending, failing]
            .into_iter()
            .flatten()
            .min()
    }

    /// The links up now, by neighbour: for tests and the status API.
    pub fn neighbours_up(&self, now: Instant) -> BTreeSet<SwitchId> {
        (0..self.spec.ports.len() as u16)
            .filter_map(|p| match self.port_role(p) {
                Some(PortRole::Link(to)) if self.up(p, now) => Some(to),
                _ => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flow hash picks among the roots that are up (ECMP), so the tests' topologies depend
    /// on its values: pinned here, on bytes above 0x7f too, which it takes as unsigned.
    #[test]
    fn the_flow_hash_is_fnv1a_32_over_its_parts_in_turn() {
        let flow = fnv1a_parts(&[
            &[10, 1, 0, 2],
            &[10, 2, 0, 9],
            &40000u16.to_be_bytes(),
            &11211u16.to_be_bytes(),
        ]);
        assert_eq!(flow, 0x9cd7_9ac3);
        assert_eq!(
            fnv1a_parts(&[&[192, 168, 200, 250], &[10, 0, 0, 255]]),
            0x8550_c3b0
        );
        assert_eq!(fnv1a_parts(&[b"foo", b"bar"]), 0xbf9c_f968);
        assert_eq!(fnv1a_parts(&[b"foobar"]), 0xbf9c_f968);
        assert_eq!(fnv1a_parts(&[]), 0x811c_9dc5);
    }
}
