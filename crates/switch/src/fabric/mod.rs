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

mod answer;
mod compute;
mod forward;
mod guard;
mod ingress;
mod message;
mod send;
mod spec;
mod topology;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::Ipv4Addr;

use kv::fabric::{
    Directory, DirectoryStats, Due, Lfu, LfuStats, ReadStamp, Registration, SwitchId, WriteStep,
};
use kv::hash::fnv1a_parts;
use kv::Instant;
use wire::ethernet::{self, EtherType, Mac};
use wire::frame::{parse_udp, UdpEnds};
use wire::inc::classify::{
    after_delta, cached_number, classify, cond_operand, reply_key, text_delta, text_safe, Kind,
};
use wire::inc::{self, flags, Command, Header, Message};
use wire::{ipv4, mcudp};

pub use spec::{FabricServer, FabricSpec, FabricSpecError, Member, PortRole, Rack, Role};

use crate::{Dest, Emit, Fate};
use guard::Refusal;

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
    pub cached_items: usize,
    /// Items it may hold.
    pub cache_capacity: usize,
    pub directory: DirectoryStats,
    pub registration_version: u64,
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
    cache: Lfu,
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
        let cache = Lfu::new(spec.cache_items, spec.tombstone_for, spec.lease);
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
            cache: self.cache.stats(),
            cached_items: self.cache.len(),
            cache_capacity: self.cache.capacity(),
            directory: self.directory.stats(),
            registration_version: self.spec.registration.version(),
            links_up: (0..self.spec.ports.len())
                .map(|p| match self.spec.ports[p] {
                    PortRole::Host => None,
                    PortRole::Link(_) => Some(self.up(p as u16, now)),
                })
                .collect(),
        }
    }

    /// Changes how many items this switch caches (0: none), evicting the least frequently
    /// used past it.
    pub fn set_cache_items(&mut self, items: usize) {
        self.spec.cache_items = items;
        self.cache.set_capacity(items);
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

    /// Writes that waited only for switches whose failure is a lease old go on.
    fn release_failed(&mut self, now: Instant, emit: &mut Vec<Emit>) {
        let due: Vec<SwitchId> = self
            .failing
            .iter()
            .filter(|&&(_, at)| now >= at)
            .map(|&(id, _)| id)
            .collect();
        self.failing.retain(|&(_, at)| now < at);
        for id in due {
            if !self.spec.registration.is_failed(id) {
                continue;
            }
            for (_, write) in self.directory.switch_failed(id, now) {
                self.forward_write(write, now, emit);
            }
            self.relay_failed(id, now, emit);
            self.tell_nodes_failed(id, emit);
        }
        // Told again every second while the table names them failed: a notice may be lost.
        if self.next_failed_notice.is_none_or(|at| now >= at) {
            self.next_failed_notice = Some(now + FAILED_NOTICE_EVERY);
            let released: Vec<SwitchId> = self
                .spec
                .members
                .iter()
                .map(|m| m.id)
                .filter(|&id| {
                    self.spec.registration.is_failed(id)
                        && !self.failing.iter().any(|&(f, _)| f == id)
                })
                .collect();
            for id in released {
                self.tell_nodes_failed(id, emit);
            }
        }
    }

    /// Tells every home node of this rack that switch `id` is counted out.
    fn tell_nodes_failed(&mut self, id: SwitchId, emit: &mut Vec<Emit>) {
        let nodes: Vec<FabricServer> = self
            .spec
            .servers
            .iter()
            .filter(|s| self.home_node(s.ip).is_some())
            .copied()
            .collect();
        for node in nodes {
            let failed = Header {
                request_id: 0,
                command: Command::InvalidateAck,
                key_hash: 0,
                flags: flags::VIA | flags::FAILED,
                origin: self.me.id,
                via: id,
                epoch: 0,
                client: (Ipv4Addr::UNSPECIFIED, 0),
                server: (node.ip, node.port),
                lease_ms: 0,
            };
            self.send_to_node(&node, &failed, &[], emit);
        }
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

    /// A request at its home, from a client of this rack or through the fabric; `quiet` when
    /// it is a write its server will not answer.
    fn at_home(
        &mut self,
        h: &Header,
        key: &[u8],
        quiet: bool,
        datagram: &[u8],
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        let Ok((mc, body)) = mcudp::Header::parse(datagram) else {
            self.stats.malformed += 1;
            return;
        };
        let detour = h.has(flags::DETOUR);
        if h.origin != self.me.id {
            // The client's ToR looked already when the client is in this rack.
            if let Some(reply) =
                self.answer_from_cache(h.server, h.command, key, mc.request_id, body, now)
            {
                self.stats.hits += 1;
                let mut h = *h;
                let fill = match h.command {
                    Command::Get => self.fill_from_home_copy(&mut h, key, now),
                    _ => None,
                };
                self.reply_to(&h, inc::key_hash(key), &reply, fill, now, emit);
                return;
            }
        }
        if let Some(node) = self.home_node(h.server.0) {
            // The server keeps its own directory: it hears the request as it came, with the
            // root its reply will go by (a sharer of what it fills).
            let via = self.via_root(h, now);
            let header = Header {
                flags: (h.flags & !(flags::VIA | flags::FAILED))
                    | if via.is_some() { flags::VIA } else { 0 },
                via: via.unwrap_or(0),
                ..*h
            };
            self.send_to_node(&node, &header, datagram, emit);
            return;
        }
        if h.command == Command::Get {
            let stamp = self.directory.read();
            self.remember(
                (h.client.0, h.client.1, mc.request_id),
                Pending {
                    key: key.to_vec(),
                    stamp: Some(stamp),
                    cond: None,
                    origin: h.origin,
                    detour,
                    native: h.has(flags::NATIVE),
                    request_id: h.request_id,
                    since: now,
                },
            );
            self.send_to_server(h.client, h.server, datagram, emit);
            return;
        }
        // A write: this switch's own copy goes at once; the others are invalidated first.
        let name = item(h.server, key);
        self.cache.remove(&name);
        if let Ok(Some(request)) = wire::memcache::parse(body) {
            let expiry = crate::cache::write_expiry(&request);
            self.expiries.note(&name, expiry, now);
        }
        let write = Write {
            key: key.to_vec(),
            command: h.command,
            origin: h.origin,
            detour,
            native: h.has(flags::NATIVE),
            request_id: h.request_id,
            client: h.client,
            server: h.server,
            datagram: datagram.to_vec(),
            quiet,
        };
        let step = self.directory.write(&name, write, now);
        self.write_step(&name, step, now, emit);
    }

    /// The fill a hit of the home's own copy grants the caches on the reply's way, as a
    /// server's reply would (the caches are inclusive), and the epoch it is at: the home
    /// records them as sharers, and their copies live no longer than its own (`h`'s lease is
    /// set to what is left of it). `None` when the directory refuses, or when a home node
    /// keeps the key's directory.
    fn fill_from_home_copy(&mut self, h: &mut Header, key: &[u8], now: Instant) -> Option<u32> {
        if self.home_node(h.server.0).is_some() {
            return None;
        }
        let name = item(h.server, key);
        let (_, left) = self.copy_to_fill_from(&name, now)?;
        let stamp = self.directory.read();
        let sharers = self.sharers_on_way(h, now);
        let epoch = self.directory.fill(&name, stamp, sharers, now)?;
        h.lease_ms = whole_ms(left);
        Some(epoch)
    }

    /// This switch's copy of `name`, for a fill made from it: its epoch and what is left of
    /// its lease, which the fill may live no longer than; `None` when none is held or under a
    /// millisecond is left (the fill's header counts whole milliseconds, see [`whole_ms`]).
    fn copy_to_fill_from(&self, name: &[u8], now: Instant) -> Option<(u32, std::time::Duration)> {
        let (epoch, left) = self.cache.held(name, now)?;
        (whole_ms(left) > 0).then_some((epoch, left))
    }

    /// Carries out a step of the directory for the write on `name` (an [`item`] name).
    fn write_step(
        &mut self,
        name: &[u8],
        step: WriteStep<Write>,
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        let (write, why) = match step {
            WriteStep::Queued => return,
            WriteStep::Invalidate { epoch, targets } => {
                for target in targets {
                    self.send_invalidation(name, epoch, target, now, emit);
                }
                return;
            }
            WriteStep::Forward(write) => return self.forward_write(write, now, emit),
            WriteStep::Failed(write) => {
                self.stats.writes_failed += 1;
                (write, "fabric invalidation not acknowledged")
            }
            WriteStep::Refused(write) => {
                self.stats.writes_refused += 1;
                (write, "too many writes to this key wait in the fabric")
            }
        };
        let Ok((mc, _)) = mcudp::Header::parse(&write.datagram) else {
            return;
        };
        let mut reply = vec![0u8; mcudp::LEN];
        mcudp::Header::single(mc.request_id).emit(&mut reply);
        reply.extend_from_slice(format!("SERVER_ERROR {why}\r\n").as_bytes());
        let h = self.write_header(&write);
        self.reply_to(&h, inc::key_hash(&write.key), &reply, None, now, emit);
    }

    fn write_header(&self, w: &Write) -> Header {
        Header {
            request_id: w.request_id,
            command: w.command,
            key_hash: inc::key_hash(&w.key),
            flags: flags::EXPANDED
                | if w.detour { flags::DETOUR } else { 0 }
                | if w.native { flags::NATIVE } else { 0 },
            origin: w.origin,
            via: 0,
            epoch: 0,
            client: w.client,
            server: w.server,
            lease_ms: 0,
        }
    }

    /// Sends the invalidation of `name` (an [`item`] name) at `epoch` to `target`.
    fn send_invalidation(
        &mut self,
        name: &[u8],
        epoch: u32,
        target: SwitchId,
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        let Some((server, key)) = split_item(name) else {
            return;
        };
        if target == self.me.id {
            return;
        }
        let header = Header {
            request_id: self.new_request_id(),
            command: Command::Invalidate,
            key_hash: inc::key_hash(key),
            flags: 0,
            origin: self.me.id,
            via: 0,
            epoch,
            client: (Ipv4Addr::UNSPECIFIED, 0),
            server,
            lease_ms: 0,
        };
        self.stats.invalidations_sent += 1;
        self.send(target, &header, key, now, emit);
    }

    /// A write whose invalidations are all acknowledged goes to its server.
    fn forward_write(&mut self, write: Write, now: Instant, emit: &mut Vec<Emit>) {
        let Ok((mc, _)) = mcudp::Header::parse(&write.datagram) else {
            self.stats.malformed += 1;
            return;
        };
        if write.command == Command::CondPut {
            // Executed here on the server's value: read it first, under the key's write.
            // An id this client has no request waiting under.
            let mut id = self.new_request_id();
            for _ in 0..16 {
                if !self
                    .pending
                    .contains_key(&(write.client.0, write.client.1, id))
                {
                    break;
                }
                id = self.new_request_id();
            }
            let mut get = vec![0u8; mcudp::LEN];
            mcudp::Header::single(id).emit(&mut get);
            get.extend_from_slice(b"get ");
            get.extend_from_slice(&write.key);
            get.extend_from_slice(b"\r\n");
            let (client, server) = (write.client, write.server);
            self.remember(
                (client.0, client.1, id),
                Pending {
                    key: write.key.clone(),
                    stamp: None,
                    origin: write.origin,
                    detour: write.detour,
                    native: write.native,
                    request_id: write.request_id,
                    since: now,
                    cond: Some(write),
                },
            );
            self.send_to_server(client, server, &get, emit);
            return;
        }
        self.send_write(write, mc.request_id, now, emit);
    }

    /// Sends a write to its server and waits for the reply (none for a quiet one).
    fn send_write(&mut self, write: Write, request_id: u16, now: Instant, emit: &mut Vec<Emit>) {
        self.remember(
            (write.client.0, write.client.1, request_id),
            Pending {
                key: write.key.clone(),
                stamp: None,
                cond: None,
                origin: write.origin,
                detour: write.detour,
                native: write.native,
                request_id: write.request_id,
                since: now,
            },
        );
        self.send_to_server(write.client, write.server, &write.datagram, emit);
        if write.quiet {
            // No reply will come: the write is done once it left (the server takes the
            // key's requests in the order this home sends them).
            self.pending
                .remove(&(write.client.0, write.client.1, request_id));
            let name = item(write.server, &write.key);
            if let Some(step) = self.directory.done(&name, now) {
                self.write_step(&name, step, now, emit);
            }
        }
    }

    /// The server's value for a conditional put waiting at its home: the put goes on to
    /// the server when the value is smaller or unset, else the client hears `NOT_STORED`.
    fn cond_put_read(&mut self, write: Write, body: &[u8], now: Instant, emit: &mut Vec<Emit>) {
        let Ok((mc, put)) = mcudp::Header::parse(&write.datagram) else {
            return;
        };
        let current = if body == b"END\r\n" {
            None
        } else {
            Some(cached_number(body))
        };
        let operand = cond_operand(put);
        let store = match (current, operand) {
            (None, Some(_)) => true,
            (Some(Some(v)), Some(o)) => v < o,
            _ => false,
        };
        if store {
            self.send_write(write, mc.request_id, now, emit);
            return;
        }
        let mut reply = vec![0u8; mcudp::LEN];
        mcudp::Header::single(mc.request_id).emit(&mut reply);
        reply.extend_from_slice(b"NOT_STORED\r\n");
        let h = self.write_header(&write);
        self.reply_to(&h, inc::key_hash(&write.key), &reply, None, now, emit);
        let name = item(write.server, &write.key);
        if let Some(step) = self.directory.done(&name, now) {
            self.write_step(&name, step, now, emit);
            return;
        }
        // Nothing changed and no write waits: the value read is the key's value now, and
        // the designated switches on the way may cache it, so that the next conditional
        // put that would change nothing is answered there.
        if matches!(current, Some(Some(_))) && reply_key(body) == Some(&write.key[..]) {
            let stamp = self.directory.read();
            let sharers = self.sharers_on_way(&h, now);
            if let Some(epoch) = self.directory.fill(&name, stamp, sharers, now) {
                self.cache.fill(&name, body, epoch, now);
                let mut datagram = vec![0u8; mcudp::LEN];
                mcudp::Header::single(0).emit(&mut datagram);
                datagram.extend_from_slice(body);
                let h = Header {
                    flags: h.flags | flags::FILL_ONLY,
                    ..h
                };
                self.reply_to(
                    &h,
                    inc::key_hash(&write.key),
                    &datagram,
                    Some(epoch),
                    now,
                    emit,
                );
            }
        }
    }

    fn remember(&mut self, flow: Flow, pending: Pending) {
        let read = pending.stamp.is_some();
        if read && self.pending.len() >= MAX_PENDING && !self.pending.contains_key(&flow) {
            return;
        }
        self.pending_order.push_back((pending.since, flow));
        self.pending.insert(flow, pending);
    }

    /// A server's reply datagram, at its home. False when no request of the fabric's waits
    /// for it (it is then routed as it is).
    fn server_reply(
        &mut self,
        client: (Ipv4Addr, u16),
        server: (Ipv4Addr, u16),
        datagram: &[u8],
        now: Instant,
        emit: &mut Vec<Emit>,
    ) -> bool {
        let Ok((mc, body)) = mcudp::Header::parse(datagram) else {
            return false;
        };
        let flow = (client.0, client.1, mc.request_id);
        let Some(pending) = self.pending.get(&flow).cloned() else {
            return false;
        };
        // A read's reply may come in several datagrams; anything else is done at its first.
        if mc.seq.saturating_add(1) >= mc.total || pending.stamp.is_none() {
            self.pending.remove(&flow);
        }
        if let Some(write) = pending.cond {
            self.cond_put_read(write, body, now, emit);
            return true;
        }
        let name = item(server, &pending.key);
        let mut h = Header {
            request_id: pending.request_id,
            command: Command::Reply,
            key_hash: inc::key_hash(&pending.key),
            flags: flags::EXPANDED
                | if pending.detour { flags::DETOUR } else { 0 }
                | if pending.native { flags::NATIVE } else { 0 },
            origin: pending.origin,
            via: 0,
            epoch: 0,
            client,
            server,
            lease_ms: 0,
        };
        let mut fill = None;
        match pending.stamp {
            None => {
                if let Some(step) = self.directory.done(&name, now) {
                    self.write_step(&name, step, now, emit);
                }
            }
            Some(stamp) => {
                // A value whose item expires sooner than a lease lives no longer, here or in the
                // caches it fills (the reply's lease says so); one that may have expired fills
                // nothing.
                let lease = match self.expiries.cap(&name, now) {
                    Ok(Some(cap)) => Some(cap.saturating_duration_since(now).min(self.spec.lease)),
                    Ok(None) => Some(self.spec.lease),
                    Err(_) => None,
                }
                .filter(|l| whole_ms(*l) > 0);
                if let (true, Some(lease)) = (
                    mc.total == 1 && reply_key(body) == Some(&pending.key[..]),
                    lease,
                ) {
                    let sharers = self.sharers_on_way(&h, now);
                    if let Some(epoch) = self.directory.fill(&name, stamp, sharers, now) {
                        self.cache.fill_for(&name, body, epoch, lease, now);
                        if lease < self.spec.lease {
                            h.lease_ms = whole_ms(lease);
                        }
                        fill = Some(epoch);
                    }
                }
            }
        }
        self.reply_to(&h, inc::key_hash(&pending.key), datagram, fill, now, emit);
        true
    }

    /// The switches a reply from this home to `h.origin` would leave cached copies at: the
    /// client's ToR, and the key's designated root when the reply goes by it.
    fn sharers_on_way(&self, h: &Header, now: Instant) -> Vec<SwitchId> {
        if h.origin == self.me.id {
            return Vec::new();
        }
        let mut sharers = vec![h.origin];
        if let Some(root) = self.via_root(h, now) {
            sharers.push(root);
        }
        sharers
    }

    /// The designated root a reply to `h.origin` goes by, if it is up and the request came by
    /// it.
    fn via_root(&self, h: &Header, now: Instant) -> Option<SwitchId> {
        if h.has(flags::DETOUR) || h.origin == self.me.id {
            return None;
        }
        let root = self.spec.registration.root(h.key_hash);
        self.link_to(root, now).map(|_| root)
    }

    /// Sends a reply datagram back to the client: by its ToR, through the designated root
    /// when it is up (a fill then at `epoch`), or straight to a client of this rack.
    fn reply_to(
        &mut self,
        h: &Header,
        key_hash: u32,
        datagram: &[u8],
        fill: Option<u32>,
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        if h.origin == self.me.id {
            if !h.has(flags::FILL_ONLY) {
                self.answer(h, datagram, emit);
            }
            return;
        }
        let root = self.via_root(h, now);
        let mut header = Header {
            command: Command::Reply,
            key_hash,
            flags: flags::EXPANDED | (h.flags & (flags::NATIVE | flags::FILL_ONLY)),
            via: 0,
            epoch: fill.unwrap_or(0),
            ..*h
        };
        if fill.is_some() {
            header.flags |= flags::FILL;
        }
        match root {
            Some(root) => {
                self.send(root, &header, datagram, now, emit);
            }
            None => {
                header.flags |= flags::DETOUR;
                self.send(h.origin, &header, datagram, now, emit);
            }
        }
    }

    /// A reply on its way back: filled here if this is a designated switch it may fill, then
    /// on to the client's ToR, or shrunk to the client.
    fn reply_message(&mut self, h: &Header, datagram: &[u8], now: Instant, emit: &mut Vec<Emit>) {
        if !self.computed.is_empty() {
            self.computed_reply(h, datagram, now);
        }
        if h.has(flags::FILL) && (h.origin == self.me.id || !h.has(flags::DETOUR)) {
            self.fill_from_reply(h, datagram, h.epoch, now);
        }
        if h.origin != self.me.id {
            self.send(h.origin, h, datagram, now, emit);
        } else if !h.has(flags::FILL_ONLY) {
            self.answer(h, datagram, emit);
        }
    }

    /// Caches the value a reply datagram for `h` carries, at `epoch`, when it is one datagram
    /// and a hit of `h`'s key.
    fn fill_from_reply(&mut self, h: &Header, datagram: &[u8], epoch: u32, now: Instant) {
        let Ok((mc, body)) = mcudp::Header::parse(datagram) else {
            return;
        };
        if let Some(key) = reply_key(body) {
            if mc.total == 1 && inc::key_hash(key) == h.key_hash {
                let name = item(h.server, key);
                match h.lease_ms {
                    0 => self.cache.fill(&name, body, epoch, now),
                    ms => self.cache.fill_for(
                        &name,
                        body,
                        epoch,
                        std::time::Duration::from_millis(u64::from(ms)),
                        now,
                    ),
                };
            }
        }
    }

    /// Counts an invalidation received; false when an operator's fault drops it.
    fn take_invalidation(&mut self) -> bool {
        self.stats.invalidations_in += 1;
        if self.drop_invalidations > 0 {
            self.drop_invalidations -= 1;
            self.stats.invalidations_dropped += 1;
            return false;
        }
        true
    }

    /// A message from a home node of this rack: a reply to send on its way (filling this
    /// switch's copy when its client is in this rack), or an invalidation to pass to a sharer
    /// (or to carry out here, acknowledged straight back).
    fn home_node_message(
        &mut self,
        node: &FabricServer,
        payload: &[u8],
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        let Ok(msg) = Message::parse(payload) else {
            self.stats.malformed += 1;
            return;
        };
        let h = msg.header;
        if h.server.0 != node.ip {
            // A home node speaks for its own keys only.
            self.stats.unexpected += 1;
            return;
        }
        self.stats.from_home_node += 1;
        match h.command {
            Command::Reply => {
                if mcudp::Header::parse(msg.payload).is_err()
                    || self.spec.member(h.origin).is_none()
                {
                    self.stats.malformed += 1;
                    return;
                }
                // The node recorded the root named in `via` as a sharer: a fill goes only by it.
                let recorded = h.has(flags::VIA).then_some(h.via);
                let fill =
                    (h.has(flags::FILL) && self.via_root(&h, now) == recorded).then_some(h.epoch);
                let header = Header {
                    flags: h.flags & !(flags::VIA | flags::FAILED | flags::FILL)
                        | if fill.is_some() { flags::FILL } else { 0 },
                    via: 0,
                    ..h
                };
                if h.origin == self.me.id {
                    if !self.computed.is_empty() {
                        self.computed_reply(&header, msg.payload, now);
                    }
                    if let Some(epoch) = fill {
                        self.fill_from_reply(&header, msg.payload, epoch, now);
                    }
                }
                self.reply_to(&header, h.key_hash, msg.payload, fill, now, emit);
            }
            Command::Invalidate if h.has(flags::VIA) => {
                let key = msg.payload;
                if h.via != self.me.id {
                    let header = Header {
                        origin: self.me.id,
                        flags: 0,
                        via: 0,
                        ..h
                    };
                    self.stats.invalidations_sent += 1;
                    self.send(h.via, &header, key, now, emit);
                    return;
                }
                if !self.take_invalidation() {
                    return;
                }
                self.cache.invalidate(&item(h.server, key), h.epoch, now);
                let ack = Header {
                    command: Command::InvalidateAck,
                    origin: self.me.id,
                    flags: flags::VIA,
                    via: self.me.id,
                    ..h
                };
                self.stats.acks_sent += 1;
                self.send_to_node(node, &ack, key, emit);
            }
            _ => self.stats.unexpected += 1,
        }
    }

    /// An invalidation from a key's home: the copy goes, and the home hears so.
    fn invalidated(
        &mut self,
        src_ip: Ipv4Addr,
        h: &Header,
        key: &[u8],
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        if !self.take_invalidation() {
            return;
        }
        let Some(home) = self.member_by_ip(src_ip) else {
            self.stats.unexpected += 1;
            return;
        };
        let name = item(h.server, key);
        self.cache.invalidate(&name, h.epoch, now);
        // The ToRs this root filled from its copy drop theirs first (the home sends again
        // until it hears, and each time they are asked again). Those an earlier write left
        // unacknowledged (its home gave up) are asked too: their copies may still live.
        let mut waiting: BTreeMap<SwitchId, Instant> = BTreeMap::new();
        let earlier = self.relaying.remove(&name).map(|r| r.waiting);
        let filled = self.filled.remove(&name).unwrap_or_default();
        for (tor, until) in filled.into_iter().chain(earlier.into_iter().flatten()) {
            let at = waiting.entry(tor).or_insert(until);
            *at = (*at).max(until);
        }
        waiting.retain(|_, until| now < *until);
        if waiting.is_empty() {
            let ack = Header {
                command: Command::InvalidateAck,
                origin: self.me.id,
                ..*h
            };
            self.stats.acks_sent += 1;
            self.send(home.id, &ack, key, now, emit);
            return;
        }
        for &tor in waiting.keys() {
            let on = Header {
                origin: self.me.id,
                ..*h
            };
            self.stats.invalidations_relayed += 1;
            self.send(tor, &on, key, now, emit);
        }
        if self.relaying.len() >= MAX_FILLED {
            // Relays whose ToRs' copies have all run out are done with.
            self.relaying
                .retain(|_, r| r.waiting.values().any(|&until| now < until));
        }
        self.relaying.insert(
            name,
            Relay {
                epoch: h.epoch,
                key: key.to_vec(),
                waiting,
                home: home.id,
                header: *h,
            },
        );
    }

    /// A root's hit for the client's ToR `tor`: remembered, so that an invalidation of the
    /// item reaches the ToR through this root, and the epoch and lease left of the copy the
    /// ToR may fill from. `None` (no fill) for anything but a ToR, or past [`MAX_FILLED`].
    fn fill_tor(&mut self, name: Vec<u8>, tor: SwitchId, now: Instant) -> Option<(u32, u32)> {
        if self.me.role != Role::Root
            || tor == self.me.id
            || self.spec.member(tor).map(|m| m.role) != Some(Role::Tor)
        {
            return None;
        }
        let (epoch, left) = self.copy_to_fill_from(&name, now)?;
        if !self.filled.contains_key(&name) && self.filled.len() >= MAX_FILLED {
            self.filled.retain(|_, tors| {
                tors.retain(|&(_, until)| now < until);
                !tors.is_empty()
            });
            if self.filled.len() >= MAX_FILLED {
                return None;
            }
        }
        // The ToR's copy may outlive the record by the time the reply takes to get there.
        let until = now + left + FAILED_MARGIN;
        let tors = self.filled.entry(name).or_default();
        match tors.iter_mut().find(|(t, _)| *t == tor) {
            Some(known) => known.1 = known.1.max(until),
            None => tors.push((tor, until)),
        }
        self.stats.root_fills += 1;
        Some((epoch, whole_ms(left)))
    }

    /// An acknowledgement from a ToR of an invalidation this root passed on: when it is the
    /// last one waited for, the home hears from this root. False when no relay waits for it.
    fn relay_ack(
        &mut self,
        from: SwitchId,
        h: &Header,
        key: &[u8],
        now: Instant,
        emit: &mut Vec<Emit>,
    ) -> bool {
        let name = item(h.server, key);
        let Some(relay) = self.relaying.get_mut(&name) else {
            return false;
        };
        // An acknowledgement of an earlier write says nothing of a copy filled since.
        if relay.epoch != h.epoch {
            return true;
        }
        relay.waiting.remove(&from);
        if relay.waiting.is_empty() {
            if let Some(done) = self.relaying.remove(&name) {
                self.ack_relay(done, now, emit);
            }
        }
        true
    }

    fn ack_relay(&mut self, relay: Relay, now: Instant, emit: &mut Vec<Emit>) {
        let ack = Header {
            command: Command::InvalidateAck,
            origin: self.me.id,
            ..relay.header
        };
        self.stats.acks_sent += 1;
        self.send(relay.home, &ack, &relay.key, now, emit);
    }

    /// A ToR the table named failed a lease ago holds nothing this root filled: relays stop
    /// waiting for it.
    fn relay_failed(&mut self, id: SwitchId, now: Instant, emit: &mut Vec<Emit>) {
        for tors in self.filled.values_mut() {
            tors.retain(|&(t, _)| t != id);
        }
        self.filled.retain(|_, tors| !tors.is_empty());
        let mut done: Vec<Vec<u8>> = self
            .relaying
            .iter_mut()
            .filter_map(|(name, r)| {
                (r.waiting.remove(&id).is_some() && r.waiting.is_empty()).then(|| name.clone())
            })
            .collect();
        // Acknowledged in key order, the same every run.
        done.sort();
        for at in done {
            if let Some(relay) = self.relaying.remove(&at) {
                self.ack_relay(relay, now, emit);
            }
        }
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
