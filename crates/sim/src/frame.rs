//! The frame level: IncBricks' caching fabric as the daemon runs it. Every ToR and root is a
//! `switch::fabric::FabricSwitch` (its parser, LFU cache, registration table, directory and
//! coherence messages) fed whole Ethernet frames; links have a rate, a delay and a queue;
//! in a fat-tree, a ToR's link to a core is a path through an aggregation switch, which
//! forwards;
//! servers answer from `kvswitch node`'s store behind a [`Station`]; closed-loop clients send
//! memcached datagrams and record every operation for the coherence checker.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use history::{Kind, Op};
use kv::fabric::{Registration, SwitchId};
use kv::rng::{Rng, Xoshiro256StarStar};
use kv::zipf::KeyGen;
use kv::{Instant, Ring, Server};
use switch::cache::{CacheService, CacheSettings};
use switch::fabric::{FabricServer, FabricSpec, FabricSwitch, Member, PortRole, Rack, Role};
use switch::pool::Pool;
use switch::stats::Stats;
use switch::{Dest, Emit, Fate, Switch, SwitchSpec};
use wire::ethernet::{self, Mac};
use wire::frame::UdpEnds;
use wire::mcudp;

use crate::core::{source, Events, Seeds};
use crate::output::{Bin, Histogram, Summary};
use crate::scenario::{Fabric, Scenario, Topology};
use crate::station::Station;
use crate::Progress;

const MC_PORT: u16 = 11211;
/// Buckets of the registration table (each designates a root for the keys hashed to it).
const REGISTRATION_BUCKETS: usize = 64;
/// Bytes a frame occupies on the wire beyond its own: preamble, gap and check sequence.
const WIRE_OVERHEAD: u64 = 24;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum End {
    Switch(usize, u16),
    Host(usize),
}

enum Ev {
    /// A frame reaches an end of a link.
    Frame(End, Vec<u8>),
    /// A switch's processor takes the frame that reached its port.
    Process(usize, u16, Vec<u8>),
    /// A frame on the path from an end reaches the forwarder before the path's `n`th link.
    Relay(End, usize, Vec<u8>),
    /// A switch fails.
    Fail(usize),
    /// The controller installs a registration table naming the failed root.
    Controller,
    /// A switch's deadline.
    Tick(usize),
    /// A server's answer leaves it.
    Answer(usize, Vec<u8>),
    /// Client `c` sends its next request.
    Send(usize),
    /// Client `c` gives up on request `id`.
    Timeout(usize, u16),
    Bin,
}

/// One direction of a link: frames leave one after another at its rate.
struct Link {
    bits_per_ns: f64,
    delay: Duration,
    depth: usize,
    leaving: VecDeque<Instant>,
    free_at: Instant,
}

/// Where a frame sent from an end goes: over these links in turn (an aggregation switch
/// forwards between two), to `to`.
struct Path {
    links: Vec<usize>,
    to: End,
}

struct Host {
    ip: Ipv4Addr,
    mac: Mac,
    server: Option<(store::Store, Station)>,
}

struct Client {
    host: usize,
    port: u16,
    next_id: u16,
    waiting: Option<(u16, Op, u64)>,
    rng: Xoshiro256StarStar,
}

pub struct FrameSim<'a> {
    sc: &'a Scenario,
    f: &'a Fabric,
    ev: Events<Ev>,
    end: Instant,
    warmup: Instant,
    bin: Duration,
    switches: Vec<Node>,
    /// Each switch's processor, when `fabric.switch_capacity` limits it.
    processors: Vec<Option<Station>>,
    tick_at: Vec<Option<Instant>>,
    links: Vec<Link>,
    paths: HashMap<End, Path>,
    /// ToRs, then roots (a fat-tree's cores).
    tors: usize,
    /// Frames each switch took.
    frames: Vec<u64>,
    /// Ports each switch has.
    ports: Vec<u16>,
    /// A switch's time over each frame (`fabric.switch_us`).
    switch_time: Duration,
    /// A single switch's VIP MAC, where its clients send.
    vip_mac: Mac,
    /// Switches that have failed.
    down: Vec<bool>,
    hosts: Vec<Host>,
    servers: Vec<usize>,
    ring: Ring,
    clients: Vec<Client>,
    keys: KeyGen,
    key_rng: Xoshiro256StarStar,
    history: Vec<Op>,
    bins: Vec<Bin>,
    latency: Histogram,
    s: Summary,
    window_answered: u64,
    window_sent: u64,
    served: Vec<u64>,
    /// Requests each server took in the current bin, and the switches' hits counted so far.
    bin_served: Vec<u64>,
    hits_seen: u64,
    /// Keys every server holds from the start (the experiments' preload), stored when first
    /// asked for and recorded in the history as written before any client ran.
    preloaded: std::collections::HashSet<String>,
}

/// A switch of the simulated network.
enum Node {
    /// A ToR or root of the caching fabric.
    Fabric(Box<FabricSwitch>),
    /// `kvswitch run`'s switch application, and its cache if it has one.
    Single(Box<Switch>, Option<Arc<CacheService>>),
}

impl Node {
    fn process(&mut self, port: u16, frame: &mut [u8], now: Instant, emit: &mut Vec<Emit>) -> Fate {
        match self {
            Node::Fabric(sw) => sw.process(port, frame, true, now, emit),
            Node::Single(sw, _) => sw.process(port, frame, true, now, emit),
        }
    }

    fn tick(&mut self, now: Instant, emit: &mut Vec<Emit>) {
        match self {
            Node::Fabric(sw) => sw.tick(now, emit),
            Node::Single(sw, _) => sw.tick(now, emit),
        }
    }

    fn poll_at(&self) -> Option<Instant> {
        match self {
            Node::Fabric(sw) => sw.poll_at(),
            Node::Single(sw, _) => sw.poll_at(),
        }
    }

    /// Reads its cache answered, and messages it sent by another root than the designated.
    fn hits_and_detours(&self, now: Instant) -> (u64, u64) {
        match self {
            Node::Fabric(sw) => {
                let stats = sw.snapshot(now).stats;
                (stats.hits, stats.detours)
            }
            Node::Single(_, cache) => (cache.as_ref().map_or(0, |c| c.lock().counters().hits), 0),
        }
    }
}

/// The VIP of a single switch, on the hosts' subnet, past every host's address.
const VIP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 254);

fn switch_ip(id: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 255, (id >> 8) as u8, id as u8 + 1)
}

fn switch_mac(id: usize) -> Mac {
    Mac([0x02, 0xff, 0, 0, (id >> 8) as u8, id as u8])
}

impl<'a> FrameSim<'a> {
    pub fn new(sc: &'a Scenario, seeds: Seeds) -> Result<FrameSim<'a>, String> {
        let f = sc
            .fabric
            .as_ref()
            .ok_or("level = \"frame\" needs [fabric]")?;
        let (tors, roots, aggs) = f.shape();
        let per = f.hosts_per_rack;
        let n = tors + roots;
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                id: i as SwitchId,
                role: if i < tors { Role::Tor } else { Role::Root },
                ip: switch_ip(i),
                mac: switch_mac(i),
            })
            .collect();
        let racks: Vec<Rack> = (0..tors)
            .map(|t| Rack {
                tor: t as SwitchId,
                prefix: Ipv4Addr::new(10, (t / 250) as u8, (t % 250) as u8, 0),
                prefix_len: 24,
            })
            .collect();
        let mut hosts = Vec::new();
        let mut links = Vec::new();
        let mut paths = HashMap::new();
        let host_bits = f.host_gbps;
        let core_bits = f.core_gbps;
        let delay = Duration::from_secs_f64(sc.network.link_us / 1e6);
        let new_link = |links: &mut Vec<Link>, gbps: f64| {
            links.push(Link {
                bits_per_ns: gbps,
                delay,
                depth: f.link_queue,
                leaving: VecDeque::new(),
                free_at: Instant::ZERO,
            });
            links.len() - 1
        };
        let mut link = |from: End, to: End, gbps: f64| {
            let l = new_link(&mut links, gbps);
            paths.insert(from, Path { links: vec![l], to });
        };
        // Servers on host 0 of racks 0, 1, ... in turn, then host 1 of each, and so on; with
        // `cross_rack`, packed into the first racks, whose other hosts stay idle.
        let is_server = |t: usize, h: usize| {
            if f.cross_rack {
                t * per + h < f.servers
            } else {
                h * tors + t < f.servers
            }
        };
        let server_racks = if f.cross_rack {
            f.servers.div_ceil(per)
        } else {
            0
        };
        for t in 0..tors {
            for h in 0..per {
                let id = hosts.len();
                let server = is_server(t, h).then(|| {
                    let st = Station::new(
                        sc.backends.capacity,
                        sc.backends.queue,
                        sc.backends.service,
                        seeds.rng(source::SERVICE + id as u64),
                    );
                    (
                        store::Store::new(None, Box::new(store::Frozen::default())),
                        st,
                    )
                });
                hosts.push(Host {
                    ip: Ipv4Addr::new(10, (t / 250) as u8, (t % 250) as u8, h as u8 + 2),
                    mac: Mac([0x02, 0, (t >> 8) as u8, t as u8, h as u8, 1]),
                    server,
                });
                link(End::Switch(t, h as u16), End::Host(id), host_bits);
                link(End::Host(id), End::Switch(t, h as u16), host_bits);
            }
        }
        // Every ToR has a port for every root and every root one for every ToR; in a tree
        // that port is a link of its own, in a fat-tree a path over two links through the
        // aggregation switch of the ToR's pod that links to the root.
        let half = f.k / 2;
        let mut hops = HashMap::new();
        let mut agg_link = |links: &mut Vec<Link>, from: (usize, usize), to: (usize, usize)| {
            *hops
                .entry((from, to))
                .or_insert_with(|| new_link(links, core_bits))
        };
        let mut agg_link = |from, to| agg_link(&mut links, from, to);
        for t in 0..tors {
            for r in 0..roots {
                let (tor_port, root_port) = ((per + r) as u16, t as u16);
                let (up, down) = if aggs == 0 {
                    // Links of their own, never shared.
                    (
                        vec![agg_link((0, t), (2, r))],
                        vec![agg_link((2, r), (0, t))],
                    )
                } else {
                    // Switches named by (level, index): 0 ToRs, 1 aggregation, 2 cores.
                    let agg = (1, t / half * half + r / half);
                    let (tor, core) = ((0, t), (2, r));
                    (
                        vec![agg_link(tor, agg), agg_link(agg, core)],
                        vec![agg_link(core, agg), agg_link(agg, tor)],
                    )
                };
                paths.insert(
                    End::Switch(t, tor_port),
                    Path {
                        links: up,
                        to: End::Switch(tors + r, root_port),
                    },
                );
                paths.insert(
                    End::Switch(tors + r, root_port),
                    Path {
                        links: down,
                        to: End::Switch(t, tor_port),
                    },
                );
            }
        }
        let servers: Vec<usize> = (0..hosts.len())
            .filter(|&h| hosts[h].server.is_some())
            .collect();
        let fabric_servers: Vec<FabricServer> = servers
            .iter()
            .map(|&h| FabricServer {
                ip: hosts[h].ip,
                port: MC_PORT,
                mac: hosts[h].mac,
                home_node: false,
            })
            .collect();
        let mut switches = Vec::with_capacity(n);
        if f.topology == Topology::Switch {
            switches.push(single_switch(sc, &hosts, &servers, &seeds)?);
        } else {
            let root_ids: Vec<SwitchId> = (tors..n).map(|i| i as SwitchId).collect();
            let table = Registration::spread(1, &root_ids, &BTreeSet::new(), REGISTRATION_BUCKETS)
                .ok_or("no registration table")?;
            for i in 0..n {
                let mut spec = FabricSpec::new(
                    i as SwitchId,
                    members.clone(),
                    PortRole::two_level(i, tors, roots, per),
                    racks.clone(),
                    fabric_servers.clone(),
                    table.clone(),
                );
                spec.cache_items = if i >= tors {
                    f.root_items
                } else if i < server_racks {
                    f.server_tor_items.unwrap_or(f.tor_items)
                } else {
                    f.tor_items
                };
                spec.lease = Duration::from_secs_f64(f.lease_ms / 1000.0);
                switches.push(Node::Fabric(Box::new(
                    FabricSwitch::new(spec).map_err(|e| format!("switch {i}: {e}"))?,
                )));
            }
        }
        let processors = (0..n)
            .map(|i| {
                (f.switch_capacity > 0.0).then(|| {
                    Station::new(
                        f.switch_capacity,
                        f.switch_queue,
                        crate::station::Service::Fixed,
                        seeds.rng(source::SWITCH + i as u64),
                    )
                })
            })
            .collect();
        let ring_servers: Vec<Server> = servers
            .iter()
            .map(|&h| Server::new(format!("{}:{MC_PORT}", hosts[h].ip), 1))
            .collect();
        let ring = Ring::new(kv::Distribution::Ketama, kv::HashFn::Fnv1a64, &ring_servers)
            .map_err(|e| format!("the ring: {e}"))?;
        // Cross-rack: clients only in racks without a server.
        let client_hosts: Vec<usize> = (0..hosts.len())
            .filter(|&h| hosts[h].server.is_none() && h / per >= server_racks)
            .collect();
        if client_hosts.is_empty() {
            return Err("fabric: no rack is left for clients".into());
        }
        if sc.clients.count / client_hosts.len() > 40_000 {
            return Err("clients.count: more than 40,000 clients a host".into());
        }
        let clients = (0..sc.clients.count)
            .map(|c| Client {
                host: client_hosts[c % client_hosts.len()],
                port: 20_000 + (c / client_hosts.len()) as u16,
                next_id: 0,
                waiting: None,
                rng: seeds.rng(source::CLIENT + c as u64),
            })
            .collect::<Vec<_>>();
        let mut ports = vec![0u16; n];
        for end in paths.keys() {
            if let End::Switch(s, p) = *end {
                ports[s] = ports[s].max(p + 1);
            }
        }
        let mut sim = FrameSim {
            sc,
            f,
            ev: Events::new(),
            end: Instant::ZERO + sc.duration(),
            warmup: Instant::ZERO + Duration::from_secs_f64(sc.warmup_s),
            bin: Duration::from_millis(sc.bin_ms),
            tick_at: vec![None; switches.len()],
            switches,
            processors,
            links,
            paths,
            tors,
            frames: vec![0; n],
            ports,
            switch_time: Duration::from_secs_f64(f.switch_us / 1e6),
            vip_mac: SwitchSpec::new(0, VIP, Vec::new()).vip.mac,
            down: vec![false; n],
            served: vec![0; servers.len()],
            bin_served: vec![0; servers.len()],
            hits_seen: 0,
            hosts,
            servers,
            ring,
            clients,
            keys: KeyGen::new(sc.workload.keys, sc.workload.skew, true),
            key_rng: seeds.rng(source::KEYS),
            history: Vec::new(),
            bins: vec![Bin::default()],
            latency: Histogram::default(),
            s: Summary {
                scenario: sc.name.clone(),
                seed: seeds.seed(),
                level: "frame",
                simulated_s: sc.duration_s,
                ..Summary::default()
            },
            window_answered: 0,
            window_sent: 0,
            preloaded: std::collections::HashSet::new(),
        };
        for c in 0..sim.clients.len() {
            let start = Duration::from_nanos(sim.clients[c].rng.below(1_000_000));
            sim.ev.at(Instant::ZERO + start, Ev::Send(c));
        }
        for s in 0..sim.switches.len() {
            sim.schedule_tick(s);
        }
        if let Some(r) = f.fail_root {
            let at = Instant::ZERO + Duration::from_secs_f64(f.fail_at_s);
            sim.ev.at(at, Ev::Fail(tors + r));
            if let Some(ms) = f.controller_ms {
                sim.ev
                    .at(at + Duration::from_secs_f64(ms / 1000.0), Ev::Controller);
            }
        }
        sim.ev.at(Instant::ZERO + sim.bin, Ev::Bin);
        Ok(sim)
    }

    pub fn run(mut self, progress: &mut dyn FnMut(Progress)) -> (Summary, Vec<Bin>, Vec<f64>) {
        let mut reported = 0;
        while let Some(at) = self.ev.peek() {
            if at >= self.end {
                break;
            }
            let Some((now, e)) = self.ev.pop() else { break };
            match e {
                Ev::Frame(to, frame) => self.deliver(to, frame, now),
                Ev::Process(s, port, frame) => self.process(s, port, frame, now),
                Ev::Relay(from, n, frame) => self.forward(from, n, frame, now),
                Ev::Fail(s) => self.down[s] = true,
                Ev::Controller => self.controller(now),
                Ev::Tick(s) => {
                    if self.tick_at[s] == Some(now) && !self.down[s] {
                        self.tick_at[s] = None;
                        let mut emit = Vec::new();
                        self.switches[s].tick(now, &mut emit);
                        self.emitted(s, emit, now);
                        self.schedule_tick(s);
                    }
                }
                Ev::Answer(h, frame) => self.transmit(End::Host(h), frame, now),
                Ev::Send(c) => self.issue(c, now),
                Ev::Timeout(c, id) => {
                    if self.clients[c].waiting.as_ref().is_some_and(|w| w.0 == id) {
                        let (_, mut op, arg) =
                            self.clients[c]
                                .waiting
                                .take()
                                .unwrap_or((0, placeholder(), 0));
                        op.end = now.as_nanos();
                        op.kind = if op.cmd == "set" {
                            Kind::MaybeWrite(Some(arg))
                        } else {
                            Kind::Failed
                        };
                        self.history.push(op);
                        self.s.dropped += 1;
                        let b = self.bin_at(now);
                        self.bins[b].dropped += 1;
                        self.ev.at(now, Ev::Send(c));
                    }
                }
                Ev::Bin => {
                    self.close_bin(now);
                    self.ev.after(self.bin, Ev::Bin);
                }
            }
            if self.ev.handled() - reported >= 1 << 18 {
                reported = self.ev.handled();
                progress(Progress {
                    events: reported,
                    simulated: self.ev.now().since_origin(),
                    end: self.sc.duration(),
                });
            }
        }
        self.finish()
    }

    /// A bin ends at `now`: the reads the switches answered in it and the busiest server's
    /// requests.
    fn close_bin(&mut self, now: Instant) {
        let b = self.bin_at(now.checked_sub(Duration::from_nanos(1)).unwrap_or(now));
        let hits: u64 = self
            .switches
            .iter()
            .map(|sw| sw.hits_and_detours(now).0)
            .sum();
        self.bins[b].hits = hits - self.hits_seen;
        self.hits_seen = hits;
        self.bins[b].backend_max = self.bin_served.iter().copied().max().unwrap_or(0);
        self.bin_served.iter_mut().for_each(|n| *n = 0);
    }

    fn bin_at(&mut self, t: Instant) -> usize {
        let i = (t.as_nanos() / self.bin.as_nanos() as u64) as usize;
        while self.bins.len() <= i {
            self.bins.push(Bin::default());
        }
        self.bins[i].t = (i + 1) as f64 * self.bin.as_secs_f64();
        i
    }

    fn schedule_tick(&mut self, s: usize) {
        let Some(at) = self.switches[s].poll_at() else {
            return;
        };
        // A deadline already past runs now (the queue never goes back in time).
        let at = at.max(self.ev.now());
        if self.tick_at[s].is_none_or(|t| at < t) {
            self.tick_at[s] = Some(at);
            self.ev.at(at, Ev::Tick(s));
        }
    }

    /// A frame leaving `from` over its path.
    fn transmit(&mut self, from: End, frame: Vec<u8>, now: Instant) {
        self.forward(from, 0, frame, now);
    }

    /// A frame on the path from `from` leaving over the path's `n`th link: queued behind the
    /// frames before it, or dropped.
    fn forward(&mut self, from: End, n: usize, frame: Vec<u8>, now: Instant) {
        let Some(path) = self.paths.get(&from) else {
            return;
        };
        let (to, last) = (path.to, n + 1 == path.links.len());
        let Some(link) = path.links.get(n).and_then(|&l| self.links.get_mut(l)) else {
            return;
        };
        while link.leaving.front().is_some_and(|&t| t <= now) {
            link.leaving.pop_front();
        }
        if link.leaving.len() >= link.depth {
            self.s.dropped_link_queue += 1;
            return;
        }
        let bits = (frame.len() as u64 + WIRE_OVERHEAD) * 8;
        let leaves = link.free_at.max(now)
            + Duration::from_nanos((bits as f64 / link.bits_per_ns).ceil() as u64);
        link.free_at = leaves;
        link.leaving.push_back(leaves);
        let at = leaves + link.delay;
        if last {
            self.ev.at(at, Ev::Frame(to, frame));
        } else {
            // An aggregation switch forwards it, in a switch's time.
            let at = at + self.switch_time;
            self.ev.at(at, Ev::Relay(from, n + 1, frame));
        }
    }

    fn emitted(&mut self, s: usize, emit: Vec<Emit>, now: Instant) {
        for e in emit {
            match e.dest {
                Dest::Port(p) => self.transmit(End::Switch(s, p), e.frame, now),
                Dest::Flood => self.flood(s, None, e.frame, now),
            }
        }
    }

    /// Sends a frame out of every port of switch `s` but `except`.
    fn flood(&mut self, s: usize, except: Option<u16>, frame: Vec<u8>, now: Instant) {
        let ports = self.ports[s];
        for p in (0..ports).filter(|&p| Some(p) != except) {
            self.transmit(End::Switch(s, p), frame.clone(), now);
        }
    }

    fn deliver(&mut self, to: End, frame: Vec<u8>, now: Instant) {
        match to {
            End::Switch(s, _) if self.down[s] => self.s.dropped_switch_down += 1,
            End::Switch(s, port) => {
                // The switch's own time over the frame, after the frames ahead of it at a
                // limited processor.
                let handled = now + self.switch_time;
                match self.processors[s].as_mut().map(|p| p.arrive(handled)) {
                    None => self.process(s, port, frame, handled),
                    Some(Some(done)) => self.ev.at(done, Ev::Process(s, port, frame)),
                    Some(None) => self.s.dropped_switch_queue += 1,
                }
            }
            End::Host(h) => self.at_host(h, &frame, now),
        }
    }

    /// The controller's new registration table, naming the failed roots, installed on every
    /// switch that is up.
    fn controller(&mut self, now: Instant) {
        let roots: Vec<SwitchId> = (self.tors..self.switches.len())
            .map(|i| i as SwitchId)
            .collect();
        let failed: BTreeSet<SwitchId> = (self.tors..self.switches.len())
            .filter(|&i| self.down[i])
            .map(|i| i as SwitchId)
            .collect();
        let Some(table) = Registration::spread(2, &roots, &failed, REGISTRATION_BUCKETS) else {
            return;
        };
        for s in 0..self.switches.len() {
            if self.down[s] {
                continue;
            }
            let mut emit = Vec::new();
            if let Node::Fabric(sw) = &mut self.switches[s] {
                if sw.set_registration(table.clone(), now, &mut emit).is_ok() {
                    self.s.tables_installed += 1;
                }
            }
            self.emitted(s, emit, now);
            self.schedule_tick(s);
        }
    }

    /// The switch's verdict on a frame, and whatever it sends.
    fn process(&mut self, s: usize, port: u16, mut frame: Vec<u8>, now: Instant) {
        if self.down[s] {
            self.s.dropped_switch_down += 1;
            return;
        }
        self.frames[s] += 1;
        let mut emit = Vec::new();
        let fate = self.switches[s].process(port, &mut frame, now, &mut emit);
        self.emitted(s, emit, now);
        match fate {
            Fate::Out(p) => self.transmit(End::Switch(s, p), frame, now),
            Fate::Flood => self.flood(s, Some(port), frame, now),
            Fate::Consumed => {}
        }
        self.schedule_tick(s);
    }

    fn at_host(&mut self, h: usize, frame: &[u8], now: Instant) {
        if let Some(reply) = arp_reply(frame, self.hosts[h].ip, self.hosts[h].mac) {
            self.transmit(End::Host(h), reply, now);
            return;
        }
        let Some((ends, payload)) = wire::frame::parse_udp(frame) else {
            return;
        };
        let (src, dst) = ((ends.src_ip, ends.src_port), (ends.dst_ip, ends.dst_port));
        if dst.0 != self.hosts[h].ip {
            return;
        }
        if self.hosts[h].server.is_some() {
            self.serve(h, src, dst, payload, now);
            return;
        }
        let payload = match wire::inc::Message::parse(payload) {
            Ok(m) if m.header.command == wire::inc::Command::Reply => m.payload,
            _ => payload,
        };
        let Ok((mc, body)) = mcudp::Header::parse(payload) else {
            return;
        };
        let Some(c) = self
            .clients
            .iter()
            .position(|c| c.host == h && c.port == dst.1)
        else {
            return;
        };
        // Only the answer to the request the client waits for; a late one is not.
        if self.clients[c]
            .waiting
            .as_ref()
            .is_none_or(|w| w.0 != mc.request_id)
        {
            return;
        }
        let Some((_, mut op, arg)) = self.clients[c].waiting.take() else {
            return;
        };
        op.end = now.as_nanos();
        op.kind = outcome(&op, arg, body);
        if op.start >= self.warmup.as_nanos() {
            self.latency.record(op.end - op.start);
        }
        self.history.push(op);
        self.s.answered += 1;
        if now >= self.warmup {
            self.window_answered += 1;
        }
        let b = self.bin_at(now);
        self.bins[b].answered += 1;
        let think = Duration::from_secs_f64(self.sc.clients.think_us / 1e6);
        self.ev.at(now + think, Ev::Send(c));
    }

    fn serve(
        &mut self,
        h: usize,
        src: (Ipv4Addr, u16),
        dst: (Ipv4Addr, u16),
        payload: &[u8],
        now: Instant,
    ) {
        if dst.1 != MC_PORT {
            return;
        }
        let Ok((mc, body)) = mcudp::Header::parse(payload) else {
            return;
        };
        let Some((store, station)) = &mut self.hosts[h].server else {
            return;
        };
        let Some(leaves) = station.arrive(now) else {
            self.s.dropped_backend_queue += 1;
            return;
        };
        if let Some(i) = self.servers.iter().position(|&s| s == h) {
            self.bin_served[i] += 1;
            if now >= self.warmup {
                self.served[i] += 1;
            }
        }
        // A key written before anyone read it holds what was written, not the preload.
        if let Some(rest) = body.strip_prefix(b"set ") {
            if let Some(end) = rest.iter().position(|&b| b == b' ') {
                self.preloaded
                    .insert(String::from_utf8_lossy(&rest[..end]).into_owned());
            }
        }
        // A get of a key nobody has asked for yet: it was preloaded with 0.
        if let Some(key) = body
            .strip_prefix(b"get ")
            .and_then(|k| k.strip_suffix(b"\r\n"))
        {
            let key = String::from_utf8_lossy(key).into_owned();
            if !self.preloaded.contains(&key) {
                let v = padded(0, self.sc.workload.value_size);
                let set = format!("set {key} 0 0 {}\r\n{v}\r\n", v.len());
                let mut sink = Vec::new();
                store::session::step(
                    store,
                    set.as_bytes(),
                    &mut sink,
                    &mut |_| true,
                    &mut |_| true,
                    None,
                );
                self.history.push(Op {
                    client: u32::MAX,
                    cmd: "set",
                    key: key.clone(),
                    start: 0,
                    end: 0,
                    kind: Kind::Write(Some(0)),
                });
                self.preloaded.insert(key);
            }
        }
        let mut out = Vec::new();
        let mut at = 0;
        while at < body.len() {
            match store::session::step(
                store,
                &body[at..],
                &mut out,
                &mut |_| true,
                &mut |_| true,
                None,
            ) {
                Some(s) if s.consumed > 0 => at += s.consumed + s.skip,
                _ => break,
            }
        }
        // The fabric's switches know every host's MAC; the reply goes to the ToR, which
        // switches it by address.
        let client_mac = self
            .hosts
            .iter()
            .find(|o| o.ip == src.0)
            .map(|o| o.mac)
            .unwrap_or(Mac::BROADCAST);
        let ends = udp_ends(self.hosts[h].mac, client_mac, dst, src);
        let Some(frames) = switch::frame::memcached_reply(&ends, mc.request_id, &out) else {
            return;
        };
        for frame in frames {
            self.ev.at(leaves, Ev::Answer(h, frame));
        }
    }

    /// Client `c` sends its next request.
    fn issue(&mut self, c: usize, now: Instant) {
        let index = self.keys.next_index(&mut self.key_rng);
        let key = format!("key:{index}");
        // To the key's server through the fabric, or to a single switch's VIP, which picks it.
        let to = if self.f.topology == Topology::Switch {
            (VIP, self.vip_mac)
        } else {
            let server = self.servers[self.ring.locate(key.as_bytes())];
            (self.hosts[server].ip, self.hosts[server].mac)
        };
        let client = &mut self.clients[c];
        let write =
            self.sc.workload.write_ratio > 0.0 && client.rng.f64() < self.sc.workload.write_ratio;
        client.next_id = client.next_id.wrapping_add(1);
        let id = client.next_id;
        let value = ((c as u64 + 1) << 24) | u64::from(id) << 8 | client.rng.next_u64() & 0xff;
        let (cmd, text) = if write {
            let v = padded(value, self.sc.workload.value_size);
            ("set", format!("set {key} 0 0 {}\r\n{v}\r\n", v.len()))
        } else {
            ("get", format!("get {key}\r\n"))
        };
        let mut header = [0u8; mcudp::LEN];
        mcudp::Header::single(id).emit(&mut header);
        let host = &self.hosts[client.host];
        let ends = udp_ends(host.mac, to.1, (host.ip, client.port), (to.0, MC_PORT));
        let frame = switch::frame::udp_frame(&ends, &[&header, text.as_bytes()]);
        client.waiting = Some((
            id,
            Op {
                client: c as u32,
                cmd,
                key,
                start: now.as_nanos(),
                end: now.as_nanos(),
                kind: Kind::Failed,
            },
            value,
        ));
        let host = client.host;
        self.s.sent += 1;
        if now >= self.warmup {
            self.window_sent += 1;
        }
        let b = self.bin_at(now);
        self.bins[b].sent += 1;
        let timeout = Duration::from_secs_f64(self.sc.clients.timeout_ms / 1000.0);
        self.ev.at(now + timeout, Ev::Timeout(c, id));
        self.transmit(End::Host(host), frame, now);
    }

    fn finish(mut self) -> (Summary, Vec<Bin>, Vec<f64>) {
        let window = (self.end - self.warmup).as_secs_f64();
        self.close_bin(self.end);
        let bins = (self.sc.duration_s * 1000.0 / self.sc.bin_ms as f64).ceil() as usize;
        self.bins.truncate(bins);
        let s = &mut self.s;
        s.events = self.ev.handled();
        s.in_flight = self.clients.iter().filter(|c| c.waiting.is_some()).count() as u64;
        s.offered = self.window_sent as f64 / window;
        s.throughput = self.window_answered as f64 / window;
        s.loss = if self.window_sent == 0 {
            0.0
        } else {
            1.0 - (self.window_answered as f64 / self.window_sent as f64).min(1.0)
        };
        let tors = self.tors;
        for (i, sw) in self.switches.iter().enumerate() {
            let (hits, detours) = sw.hits_and_detours(self.end);
            s.detours += detours;
            if i < tors {
                s.tor_hits += hits;
            } else {
                s.root_hits += hits;
            }
        }
        s.cache_hits = s.tor_hits + s.root_hits;
        let sojourn = |range: std::ops::Range<usize>| {
            let (ns, n) = self.processors[range]
                .iter()
                .flatten()
                .fold((0u128, 0u64), |(t, n), p| {
                    (t + p.sojourn_ns, n + p.accepted)
                });
            if n == 0 {
                0.0
            } else {
                ns as f64 / n as f64 / 1000.0
            }
        };
        s.tor_sojourn_us = sojourn(0..tors);
        s.root_sojourn_us = sojourn(tors..self.processors.len());
        let roots = &self.frames[tors..];
        let mean = roots.iter().sum::<u64>() as f64 / roots.len().max(1) as f64;
        s.root_imbalance = if mean > 0.0 {
            roots.iter().copied().max().unwrap_or(0) as f64 / mean
        } else {
            0.0
        };
        s.hit_ratio = if s.answered == 0 {
            0.0
        } else {
            s.cache_hits as f64 / s.answered as f64
        };
        let loads: Vec<f64> = self.served.iter().map(|&n| n as f64 / window).collect();
        let (sojourn, accepted) = self
            .hosts
            .iter()
            .filter_map(|h| h.server.as_ref())
            .fold((0u128, 0u64), |(t, n), (_, st)| {
                (t + st.sojourn_ns, n + st.accepted)
            });
        s.set_loads(&loads, &self.latency, (sojourn, accepted));
        let report = history::check(&self.history);
        s.history_ops = self.history.len() as u64;
        s.violations = report.violations.len() as u64;
        (self.s, self.bins, loads)
    }
}

/// `kvswitch run`'s switch with every host on a port of its own: the servers' addresses and
/// MACs configured, the ring the scenario's backends name, and the cache on the UDP path
/// when `fabric.tor_items` is above 0.
fn single_switch(
    sc: &Scenario,
    hosts: &[Host],
    servers: &[usize],
    seeds: &Seeds,
) -> Result<Node, String> {
    let backends = servers
        .iter()
        .map(|&h| switch::spec::Server {
            addr: std::net::SocketAddrV4::new(hosts[h].ip, MC_PORT),
            mac: Some(hosts[h].mac),
        })
        .collect();
    let mut spec = SwitchSpec::new(hosts.len(), VIP, backends);
    spec.seed = seeds.rng(source::SINGLE_SWITCH).next_u64();
    let items = sc.fabric.as_ref().map_or(0, |f| f.tor_items);
    spec.cache = items > 0;
    let dist: kv::Distribution = sc
        .backends
        .distribution
        .parse()
        .map_err(|e| format!("{e}"))?;
    let hash: kv::HashFn = sc.backends.hash.parse().map_err(|e| format!("{e}"))?;
    let pool = Pool::new(spec.pool_spec(dist, hash)).map_err(|e| format!("the pool: {e}"))?;
    let stats = Arc::new(Stats::new(hosts.len(), servers.len()));
    let mut sw =
        Switch::new(spec, Arc::new(pool), stats).map_err(|e| format!("the switch: {e}"))?;
    let cache = if items > 0 {
        let mut settings = CacheSettings {
            enabled: true,
            ..Default::default()
        };
        settings.cache.items = items;
        settings.cache.lease =
            Duration::from_secs_f64(sc.fabric.as_ref().map_or(2000.0, |f| f.lease_ms) / 1000.0);
        let cache = CacheService::new(settings, servers.len(), Instant::ZERO)
            .map_err(|e| format!("the switch's cache: {e}"))?;
        sw.set_cache(cache.clone())
            .map_err(|e| format!("the switch's cache: {e}"))?;
        Some(cache)
    } else {
        None
    };
    Ok(Node::Single(Box::new(sw), cache))
}

fn placeholder() -> Op {
    Op {
        client: 0,
        cmd: "get",
        key: String::new(),
        start: 0,
        end: 0,
        kind: Kind::Failed,
    }
}

fn udp_ends(src_mac: Mac, dst_mac: Mac, src: Addr, dst: Addr) -> UdpEnds {
    UdpEnds {
        src_mac,
        dst_mac,
        src_ip: src.0,
        dst_ip: dst.0,
        src_port: src.1,
        dst_port: dst.1,
    }
}

type Addr = (Ipv4Addr, u16);

/// A host's answer to an ARP request for its address.
fn arp_reply(frame: &[u8], ip: Ipv4Addr, mac: Mac) -> Option<Vec<u8>> {
    let eth = ethernet::Frame::new_checked(frame).ok()?;
    if eth.ethertype() != ethernet::EtherType::ARP {
        return None;
    }
    let asked =
        wire::arp::Repr::parse(&wire::arp::Packet::new_checked(eth.payload()).ok()?).ok()?;
    if asked.operation != wire::arp::Operation::Request || asked.target_ip != ip {
        return None;
    }
    let reply = wire::arp::Repr {
        operation: wire::arp::Operation::Reply,
        sender_mac: mac,
        sender_ip: ip,
        target_mac: asked.sender_mac,
        target_ip: asked.sender_ip,
    };
    Some(switch::frame::arp_frame(asked.sender_mac, &reply))
}

/// What a reply says about the operation it answers; an answer that is not what memcached
/// gives counts as a failed read (the checker then holds it to nothing).
fn outcome(op: &Op, arg: u64, body: &[u8]) -> Kind {
    match op.cmd {
        "set" if body == b"STORED\r\n" => Kind::Write(Some(arg)),
        "set" => Kind::MaybeWrite(Some(arg)),
        _ if body == b"END\r\n" => Kind::Read(None),
        _ => read_value(&op.key, body).map_or(Kind::Failed, |v| Kind::Read(Some(v))),
    }
}

/// The number in the answer to a `get` of `key`: `VALUE <key> 0 <bytes>`, the number in
/// `<bytes>` digits (zero-padded), then `END`. Every answer of a run passes here, and the
/// value runs to a kilobyte: it is taken by its length, not searched.
fn read_value(key: &str, body: &[u8]) -> Option<u64> {
    let (head, rest) = body.split_at(body.windows(2).position(|w| w == b"\r\n")?);
    let bytes = head
        .strip_prefix(b"VALUE ")?
        .strip_prefix(key.as_bytes())?
        .strip_prefix(b" 0 ")?;
    if !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: usize = std::str::from_utf8(bytes).ok()?.parse().ok()?;
    let rest = rest.get(2..)?;
    let data = rest.get(..n)?;
    if !matches!(&rest[n..], b"\r\nEND\r\n" | b"\r\nEND") {
        return None;
    }
    // The padding eight bytes at a time, then the digits that are left.
    let zeros = data
        .chunks_exact(8)
        .take_while(|c| c == b"00000000")
        .count()
        * 8;
    let digits = match data[zeros..].iter().position(|&b| b != b'0') {
        Some(first) => &data[zeros + first..],
        None if data.is_empty() => return None,
        None => b"0",
    };
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// `value` in decimal, zero-padded to `width` digits, as `format!("{value:0width$}")` gives it
/// (which pads a character at a time).
fn padded(value: u64, width: usize) -> String {
    let digits = value.to_string();
    let mut text = "0".repeat(width.saturating_sub(digits.len()));
    text.push_str(&digits);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(cmd: &'static str) -> Op {
        Op {
            cmd,
            key: "key:7".into(),
            ..placeholder()
        }
    }

    #[test]
    fn a_reply_gives_the_operation_memcached_performed_and_anything_else_fails() {
        let read = |body: &str| outcome(&op("get"), 0, body.as_bytes());
        let value = format!("VALUE key:7 0 1000\r\n{:01000}\r\nEND\r\n", 42);
        assert_eq!(read(&value), Kind::Read(Some(42)));
        assert_eq!(read("VALUE key:7 0 2\r\n42\r\nEND"), Kind::Read(Some(42)));
        assert_eq!(
            read("VALUE key:7 0 3\r\n000\r\nEND\r\n"),
            Kind::Read(Some(0))
        );
        assert_eq!(read("END\r\n"), Kind::Read(None));
        for bad in [
            "",
            "END",
            "VALUE key:7 0 2\r\n42",
            "VALUE key:7 0 2\r\n42\r\n",
            "VALUE key:7 0 2\r\n42\r\nEN\r\n",
            "VALUE key:70 0 2\r\n42\r\nEND\r\n",
            "VALUE key:8 0 2\r\n42\r\nEND\r\n",
            "VALUE key:7 1 2\r\n42\r\nEND\r\n",
            "VALUE key:7 0 2\r\n4x\r\nEND\r\n",
            "VALUE key:7 0 20\r\n99999999999999999999\r\nEND\r\n",
            "VALUE key:7 0 18446744073709551615\r\n42\r\nEND\r\n",
            "VALUE key:7 0 3\r\n42\r\nEND\r\n",
            "VALUE key:7 0 1\r\n42\r\nEND\r\n",
            "VALUE key:7 0 0\r\n\r\nEND\r\n",
            "VALUE key:7 0 \r\n42\r\nEND\r\n",
            "VALUE key:7 0 +2\r\n42\r\nEND\r\n",
            "VALUE key:7 0 2\r\n+4\r\nEND\r\n",
            "VALUE key:7 0 2\r\n42\r\nEND\r\nEND\r\n",
            "SERVER_ERROR out of memory\r\n",
        ] {
            assert_eq!(read(bad), Kind::Failed, "{bad:?}");
        }
        assert_eq!(
            outcome(&op("get"), 0, b"VALUE key:7 0 2\r\n\xff2\r\nEND\r\n"),
            Kind::Failed
        );
        for (value, width) in [(0, 1), (0, 1000), (42, 1), (42, 2), (42, 5), (u64::MAX, 3)] {
            assert_eq!(padded(value, width), format!("{value:0width$}"));
        }
        let set = |body: &str| outcome(&op("set"), 9, body.as_bytes());
        assert_eq!(set("STORED\r\n"), Kind::Write(Some(9)));
        assert_eq!(
            set("SERVER_ERROR fabric invalidation not acknowledged\r\n"),
            Kind::MaybeWrite(Some(9))
        );
    }
}
