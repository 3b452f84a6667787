//! The fabric's switches joined in one process: frames cross links after a fixed delay on a
//! virtual clock, servers are `kvswitch node`'s memcached store, and clients record a history
//! the coherence checker reads. Deterministic: the same seed gives the same run.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::net::Ipv4Addr;

use history::{Kind, Op};
use kv::fabric::{Registration, SwitchId};
use kv::Instant;
use node::Store;
use switch::fabric::{
    Coherence, FabricServer, FabricSpec, FabricSwitch, IncBoxSpec, Member, PortRole, Rack, Role,
};
use switch::{Dest, Emit, Fate};
use wire::ethernet::{self, Mac};
use wire::frame::UdpEnds;
use wire::{ipv4, mcudp, udp};

/// One hop's delay.
const LINK_NS: u64 = 5_000;
/// A server's time to answer.
const SERVE_NS: u64 = 10_000;
/// A client's time before it gives up on a reply.
const TIMEOUT_NS: u64 = 30_000_000;
const MC_PORT: u16 = 11211;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum End {
    Switch(usize, u16),
    Host(usize),
}

struct Host {
    ip: Ipv4Addr,
    mac: Mac,
    /// The switch and port it hangs off.
    tor: (usize, u16),
    store: Option<Store>,
}

/// A closed-loop client on a host: one request at a time.
struct Client {
    host: usize,
    port: u16,
    next_id: u16,
    waiting: Option<Waiting>,
    rng: u64,
}

struct Waiting {
    request_id: u16,
    op: Op,
    /// The value a set writes, or the delta of an incr.
    arg: u64,
    deadline: u64,
}

/// A frame's arrival: when, in what order among equals, where.
type Arrival = (u64, u64, End, Vec<u8>);
/// An address and a port.
type Addr = (Ipv4Addr, u16);

struct Net {
    switches: Vec<FabricSwitch>,
    dead: BTreeSet<usize>,
    wires: HashMap<End, End>,
    hosts: Vec<Host>,
    clients: Vec<Client>,
    queue: BinaryHeap<Reverse<Arrival>>,
    now: u64,
    seq: u64,
    history: Vec<Op>,
    /// Every frame a switch sent out of each of its ports.
    sent: HashMap<End, u64>,
    /// The keys clients use, and the counters among them (only incremented).
    keys: Vec<String>,
    counters: usize,
    /// Acknowledged increments per counter, and increments of unknown outcome.
    increments: HashMap<String, (u64, u64)>,
    /// Up to this much more delay per frame, drawn from `jitter_rng`: frames may overtake
    /// each other.
    jitter_ns: u64,
    jitter_rng: u64,
    /// Whether clients send requests of their own (off while a test speaks for one).
    auto: bool,
    /// The reply to a test's own request.
    raw: Option<String>,
    /// The server a test's own request goes to, instead of the key's.
    to_server: Option<usize>,
}

fn switch_ip(id: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 255, 0, id as u8 + 1)
}

fn switch_mac(id: usize) -> Mac {
    Mac([0x02, 0xff, 0, 0, 0, id as u8])
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

impl Net {
    /// `tors` ToRs (switches 0..tors) and `roots` roots after them, each ToR linked to every
    /// root; `hosts` hosts per rack, the first of each a memcached server.
    fn tree(tors: usize, roots: usize, hosts: usize, cache_items: usize) -> Net {
        Net::tree_with(tors, roots, hosts, cache_items, |_| {})
    }

    /// [`Net::tree`] with every switch's spec changed by `edit`.
    fn tree_with(
        tors: usize,
        roots: usize,
        hosts: usize,
        cache_items: usize,
        edit: impl Fn(&mut FabricSpec),
    ) -> Net {
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
                prefix: Ipv4Addr::new(10, t as u8 + 1, 0, 0),
                prefix_len: 16,
            })
            .collect();
        let mut all_hosts = Vec::new();
        let mut wires = HashMap::new();
        for t in 0..tors {
            for h in 0..hosts {
                let id = all_hosts.len();
                all_hosts.push(Host {
                    ip: Ipv4Addr::new(10, t as u8 + 1, 0, h as u8 + 2),
                    mac: Mac([0x02, 0, 0, t as u8, h as u8, 1]),
                    tor: (t, h as u16),
                    store: (h == 0).then(|| Store::new(None, Box::new(node::SystemHost::start()))),
                });
                wires.insert(End::Switch(t, h as u16), End::Host(id));
                wires.insert(End::Host(id), End::Switch(t, h as u16));
            }
            for r in 0..roots {
                let tor_port = (hosts + r) as u16;
                let root_port = t as u16;
                wires.insert(End::Switch(t, tor_port), End::Switch(tors + r, root_port));
                wires.insert(End::Switch(tors + r, root_port), End::Switch(t, tor_port));
            }
        }
        let servers: Vec<FabricServer> = all_hosts
            .iter()
            .filter(|h| h.store.is_some())
            .map(|h| FabricServer {
                ip: h.ip,
                port: MC_PORT,
                mac: h.mac,
                home_node: false,
            })
            .collect();
        let root_ids: Vec<SwitchId> = (tors..n).map(|i| i as SwitchId).collect();
        let table = Registration::spread(1, &root_ids, &BTreeSet::new(), 64).unwrap();
        let switches = (0..n)
            .map(|i| {
                let mut spec = FabricSpec::new(
                    i as SwitchId,
                    members.clone(),
                    PortRole::two_level(i, tors, roots, hosts),
                    racks.clone(),
                    servers.clone(),
                    table.clone(),
                );
                spec.cache_items = cache_items;
                edit(&mut spec);
                FabricSwitch::new(spec).unwrap()
            })
            .collect();
        Net {
            switches,
            dead: BTreeSet::new(),
            wires,
            hosts: all_hosts,
            clients: Vec::new(),
            queue: BinaryHeap::new(),
            now: 0,
            seq: 0,
            history: Vec::new(),
            sent: HashMap::new(),
            keys: Vec::new(),
            counters: 0,
            increments: HashMap::new(),
            jitter_ns: 0,
            jitter_rng: 0x2545_f491_4f6c_dd1d,
            auto: true,
            raw: None,
            to_server: None,
        }
    }

    fn at(&self) -> Instant {
        Instant::from_nanos(self.now)
    }

    fn push(&mut self, at: u64, to: End, frame: Vec<u8>) {
        self.seq += 1;
        self.queue.push(Reverse((at, self.seq, to, frame)));
    }

    /// A frame leaving `from` over its wire.
    fn transmit(&mut self, from: End, frame: Vec<u8>) {
        *self.sent.entry(from).or_default() += 1;
        if let Some(&to) = self.wires.get(&from) {
            let jitter = match self.jitter_ns {
                0 => 0,
                j => xorshift(&mut self.jitter_rng) % j,
            };
            self.push(self.now + LINK_NS + jitter, to, frame);
        }
    }

    fn emitted(&mut self, s: usize, emit: Vec<Emit>) {
        for e in emit {
            match e.dest {
                Dest::Port(p) => self.transmit(End::Switch(s, p), e.frame),
                Dest::Flood => panic!("the fabric never floods blindly"),
            }
        }
    }

    fn deliver(&mut self, to: End, mut frame: Vec<u8>) {
        match to {
            End::Switch(s, port) => {
                if self.dead.contains(&s) {
                    return;
                }
                let mut emit = Vec::new();
                let now = self.at();
                let fate = self.switches[s].process(port, &mut frame, true, now, &mut emit);
                self.emitted(s, emit);
                match fate {
                    Fate::Out(p) => self.transmit(End::Switch(s, p), frame),
                    Fate::Consumed => {}
                    Fate::Flood => panic!("the fabric never floods blindly"),
                }
            }
            End::Host(h) => self.at_host(h, &frame),
        }
    }

    fn at_host(&mut self, h: usize, frame: &[u8]) {
        let Some((src, dst, payload)) = udp_of(frame) else {
            return;
        };
        if dst.0 != self.hosts[h].ip {
            return;
        }
        if let Some(store) = &self.hosts[h].store {
            if dst.1 != MC_PORT {
                return;
            }
            let Ok((mc, body)) = mcudp::Header::parse(payload) else {
                return;
            };
            let mut out = Vec::new();
            let mut at = 0;
            while at < body.len() {
                let step = node::session::step(
                    store,
                    &body[at..],
                    &mut out,
                    &mut |_| true,
                    &mut |_| true,
                    None,
                );
                match step {
                    Some(s) if s.consumed > 0 => at += s.consumed + s.skip,
                    _ => break,
                }
            }
            let client_mac = self
                .hosts
                .iter()
                .find(|o| o.ip == src.0)
                .map(|o| o.mac)
                .unwrap_or(Mac::BROADCAST);
            let pieces: Vec<Vec<u8>> = mcudp::pieces(mc.request_id, &out)
                .unwrap()
                .map(|(hdr, bytes)| {
                    let mut d = vec![0u8; mcudp::LEN];
                    hdr.emit(&mut d);
                    d.extend_from_slice(bytes);
                    d
                })
                .collect();
            for d in pieces {
                let frame = udp_frame(self.hosts[h].mac, client_mac, dst, src, &d);
                self.seq += 1;
                let at = self.now + SERVE_NS;
                let to = self.wires[&End::Host(h)];
                self.queue.push(Reverse((at, self.seq, to, frame)));
            }
            return;
        }
        // A client: the reply it waits for (inside a message for a client that speaks the
        // fabric's format).
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
        let waiting = match &self.clients[c].waiting {
            Some(w) if w.request_id == mc.request_id => self.clients[c].waiting.take().unwrap(),
            _ => return,
        };
        assert_eq!(mc.total, 1, "small values fit one datagram");
        if waiting.op.cmd == "raw" {
            self.raw = Some(String::from_utf8_lossy(body).into_owned());
            return;
        }
        let kind = outcome(&waiting, body);
        self.finish(c, waiting, kind);
    }

    fn finish(&mut self, c: usize, w: Waiting, kind: Kind) {
        let mut op = w.op;
        op.end = self.now;
        op.kind = kind;
        if op.cmd == "incr" {
            let e = self.increments.entry(op.key.clone()).or_default();
            match kind {
                Kind::Write(_) => e.0 += w.arg,
                _ => e.1 += w.arg,
            }
        }
        self.history.push(op);
        let _ = c;
    }

    /// Sends client `c`'s next request.
    fn issue(&mut self, c: usize) {
        let client = &mut self.clients[c];
        let r = xorshift(&mut client.rng);
        client.next_id = client.next_id.wrapping_add(1);
        let request_id = client.next_id;
        let counter = r.is_multiple_of(10);
        let key = if counter {
            self.keys[(r >> 8) as usize % self.counters].clone()
        } else {
            self.keys[self.counters + (r >> 8) as usize % (self.keys.len() - self.counters)].clone()
        };
        let dice = (r >> 32) % 100;
        let value = ((c as u64 + 1) << 32) | u64::from(request_id) << 8 | (r & 0xff);
        let (cmd, text, arg): (&'static str, String, u64) = if counter {
            if dice < 50 {
                ("get", format!("get {key}\r\n"), 0)
            } else {
                let d = 1 + (r >> 40) % 5;
                ("incr", format!("incr {key} {d}\r\n"), d)
            }
        } else if dice < 80 {
            ("get", format!("get {key}\r\n"), 0)
        } else if dice < 95 {
            let v = value.to_string();
            (
                "set",
                format!("set {key} 0 0 {}\r\n{v}\r\n", v.len()),
                value,
            )
        } else {
            ("delete", format!("delete {key}\r\n"), 0)
        };
        let mut datagram = vec![0u8; mcudp::LEN];
        mcudp::Header::single(request_id).emit(&mut datagram);
        datagram.extend_from_slice(text.as_bytes());
        let server = self.server_of(&key);
        let client = &mut self.clients[c];
        let host = &self.hosts[client.host];
        let src = (host.ip, client.port);
        let dst = (self.hosts[server].ip, MC_PORT);
        let frame = udp_frame(host.mac, self.hosts[server].mac, src, dst, &datagram);
        let to = self.wires[&End::Host(client.host)];
        client.waiting = Some(Waiting {
            request_id,
            op: Op {
                client: c as u32,
                cmd,
                key,
                start: self.now,
                end: self.now,
                kind: Kind::Failed,
            },
            arg,
            deadline: self.now + TIMEOUT_NS,
        });
        self.push(self.now + LINK_NS, to, frame);
    }

    fn server_of(&self, key: &str) -> usize {
        let servers: Vec<usize> = (0..self.hosts.len())
            .filter(|&h| self.hosts[h].store.is_some())
            .collect();
        let h = key
            .bytes()
            .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
        servers[h as usize % servers.len()]
    }

    /// Runs until `until` (ns) or until `ops` operations are recorded.
    fn run(&mut self, until: u64, ops: usize) {
        loop {
            if self.history.len() >= ops || self.raw.is_some() {
                return;
            }
            // Clients with nothing outstanding ask again; those past their deadline give up.
            for c in 0..self.clients.len() {
                match &self.clients[c].waiting {
                    None if self.auto => self.issue(c),
                    None => {}
                    Some(w) if self.now >= w.deadline => {
                        let w = self.clients[c].waiting.take().unwrap();
                        let kind = match w.op.cmd {
                            "set" => Kind::MaybeWrite(Some(w.arg)),
                            "delete" => Kind::MaybeWrite(None),
                            "incr" => Kind::MaybeIncr(w.arg),
                            _ => Kind::Failed,
                        };
                        self.finish(c, w, kind);
                    }
                    Some(_) => {}
                }
            }
            let next_frame = self.queue.peek().map(|Reverse((t, ..))| *t);
            let next_tick = self
                .switches
                .iter()
                .enumerate()
                .filter(|(i, _)| !self.dead.contains(i))
                .filter_map(|(_, s)| s.poll_at())
                .map(|i| i.as_nanos())
                .min();
            let next_deadline = self
                .clients
                .iter()
                .filter_map(|c| c.waiting.as_ref().map(|w| w.deadline))
                .min();
            let Some(next) = [next_frame, next_tick, next_deadline]
                .into_iter()
                .flatten()
                .min()
            else {
                return;
            };
            if next > until {
                self.now = until;
                return;
            }
            self.now = self.now.max(next);
            for s in 0..self.switches.len() {
                if self.dead.contains(&s) {
                    continue;
                }
                if self.switches[s]
                    .poll_at()
                    .is_some_and(|at| at.as_nanos() <= self.now)
                {
                    let mut emit = Vec::new();
                    let now = self.at();
                    self.switches[s].tick(now, &mut emit);
                    self.emitted(s, emit);
                }
            }
            while let Some(Reverse((t, ..))) = self.queue.peek() {
                if *t > self.now {
                    break;
                }
                let Reverse((_, _, to, frame)) = self.queue.pop().unwrap();
                self.deliver(to, frame);
            }
        }
    }

    /// Adds `per_rack` clients on every non-server host.
    fn add_clients(&mut self, seed: u64) {
        for h in 0..self.hosts.len() {
            if self.hosts[h].store.is_none() {
                let n = self.clients.len() as u64;
                self.clients.push(Client {
                    host: h,
                    port: 40_000 + n as u16,
                    next_id: 0,
                    waiting: None,
                    rng: (seed ^ (n + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1,
                });
            }
        }
    }

    /// Frames switch `s` has sent, out of all its ports.
    fn sent_by(&self, s: usize) -> u64 {
        self.sent
            .iter()
            .filter(|(end, _)| matches!(end, End::Switch(i, _) if *i == s))
            .map(|(_, n)| n)
            .sum()
    }
}

fn udp_frame(
    src_mac: Mac,
    dst_mac: Mac,
    src: (Ipv4Addr, u16),
    dst: (Ipv4Addr, u16),
    payload: &[u8],
) -> Vec<u8> {
    switch::frame::udp_frame(
        &UdpEnds::between((src_mac, src.0, src.1), (dst_mac, dst.0, dst.1)),
        &[payload],
    )
}

fn udp_of(frame: &[u8]) -> Option<(Addr, Addr, &[u8])> {
    let ip = ipv4::Packet::new_checked(frame.get(ethernet::HEADER_LEN..)?).ok()?;
    let (s, d) = (ip.src(), ip.dst());
    let start = ethernet::HEADER_LEN + ip.header_len();
    let u = udp::Packet::new_checked(frame.get(start..)?).ok()?;
    let len = usize::from(u.len());
    let payload = frame.get(start + udp::HEADER_LEN..start + len)?;
    Some(((s, u.src_port()), (d, u.dst_port()), payload))
}

/// What a reply says about the operation it answers.
fn outcome(w: &Waiting, body: &[u8]) -> Kind {
    let text = String::from_utf8_lossy(body);
    if text.starts_with("SERVER_ERROR") {
        return match w.op.cmd {
            "set" => Kind::MaybeWrite(Some(w.arg)),
            "delete" => Kind::MaybeWrite(None),
            "incr" => Kind::MaybeIncr(w.arg),
            _ => Kind::Failed,
        };
    }
    match w.op.cmd {
        "get" => {
            if text == "END\r\n" {
                return Kind::Read(None);
            }
            let mut lines = text.split("\r\n");
            let head = lines.next().unwrap_or_default();
            assert!(
                head.starts_with(&format!("VALUE {} 0 ", w.op.key)),
                "{text:?}"
            );
            let v: u64 = lines.next().unwrap().parse().unwrap();
            assert_eq!(lines.next(), Some("END"), "{text:?}");
            Kind::Read(Some(v))
        }
        "set" => {
            assert_eq!(text, "STORED\r\n");
            Kind::Write(Some(w.arg))
        }
        "delete" => match &*text {
            "DELETED\r\n" => Kind::Write(None),
            "NOT_FOUND\r\n" => Kind::Failed,
            other => panic!("{other:?}"),
        },
        "incr" => match text.trim_end().parse::<u64>() {
            Ok(n) => Kind::Write(Some(n)),
            Err(_) => {
                assert_eq!(text, "NOT_FOUND\r\n");
                Kind::Failed
            }
        },
        other => panic!("{other}"),
    }
}

/// Stores every counter as 0 first, through the fabric, so increments find it.
fn seed_counters(net: &mut Net) {
    for i in 0..net.counters {
        let key = net.keys[i].clone();
        let server = net.server_of(&key);
        let store = net.hosts[server].store.as_ref().unwrap();
        let mut out = Vec::new();
        let req = format!("set {key} 0 0 1\r\n0\r\n");
        node::session::step(
            store,
            req.as_bytes(),
            &mut out,
            &mut |_| true,
            &mut |_| true,
            None,
        );
        assert_eq!(out, b"STORED\r\n");
        net.history.push(Op {
            client: u32::MAX,
            cmd: "set",
            key,
            start: 0,
            end: 0,
            kind: Kind::Write(Some(0)),
        });
    }
}

fn with_keys(net: &mut Net, counters: usize, keys: usize) {
    net.keys = (0..counters)
        .map(|i| format!("counter:{i}"))
        .chain((0..keys).map(|i| format!("key:{i}")))
        .collect();
    net.counters = counters;
    seed_counters(net);
}

/// No stale read, and every counter holds exactly its acknowledged increments (plus some of
/// those whose outcome is unknown).
fn check(net: &Net) {
    let report = history::check(&net.history);
    assert!(
        report.violations.is_empty(),
        "{} stale reads, the first: {:?}",
        report.violations.len(),
        report.violations.first()
    );
    for i in 0..net.counters {
        let key = &net.keys[i];
        let store = net.hosts[net.server_of(key)].store.as_ref().unwrap();
        let mut out = Vec::new();
        let req = format!("get {key}\r\n");
        node::session::step(
            store,
            req.as_bytes(),
            &mut out,
            &mut |_| true,
            &mut |_| true,
            None,
        );
        let text = String::from_utf8(out).unwrap();
        let value: u64 = text.split("\r\n").nth(1).unwrap().parse().unwrap();
        let (acked, mut unknown) = net.increments.get(key).copied().unwrap_or_default();
        // Increments still on their way may have been applied.
        unknown += net
            .clients
            .iter()
            .filter_map(|c| c.waiting.as_ref())
            .filter(|w| w.op.cmd == "incr" && &w.op.key == key)
            .map(|w| w.arg)
            .sum::<u64>();
        assert!(
            value >= acked && value <= acked + unknown,
            "{key}: {value}, acknowledged {acked}, unknown {unknown}"
        );
    }
}

fn hits(net: &Net) -> u64 {
    net.switches
        .iter()
        .map(|s| s.snapshot(Instant::ZERO).cache.hits)
        .sum()
}

#[test]
fn a_two_level_tree_answers_from_its_caches_and_stays_coherent() {
    let mut net = Net::tree(2, 1, 3, 4096);
    with_keys(&mut net, 2, 16);
    net.add_clients(1);
    net.run(20_000_000_000, 20_000);
    check(&net);
    assert!(net.history.len() >= 20_000);
    let h = hits(&net);
    assert!(h > 2_000, "hits {h}");
    let root = net.switches[2].snapshot(Instant::ZERO);
    assert!(root.cache.hits > 0, "{root:?}");
}

#[test]
fn a_multi_rooted_tree_of_four_racks_stays_coherent_over_a_hundred_thousand_operations() {
    let mut net = Net::tree(4, 2, 3, 4096);
    // Frames overtake each other: fills may arrive after the invalidations that follow them.
    net.jitter_ns = 40_000;
    with_keys(&mut net, 4, 24);
    net.add_clients(7);
    net.run(200_000_000_000, 100_000);
    check(&net);
    assert!(net.history.len() >= 100_000);
    let reads = net.history.iter().filter(|o| o.cmd == "get").count();
    assert!(
        hits(&net) as usize > reads / 10,
        "hits {} of {reads} reads",
        hits(&net)
    );
    // Every root took part in caching, and filled ToRs from its own copies, whose
    // invalidations it passed on (the history above is coherent with them).
    for r in 4..6 {
        let root = net.switches[r].snapshot(Instant::ZERO);
        assert!(root.cache.fills > 0);
        assert!(root.stats.root_fills > 0, "{:?}", root.stats);
        assert!(root.stats.invalidations_relayed > 0, "{:?}", root.stats);
    }
    let dirs: u64 = (0..4)
        .map(|t| {
            net.switches[t]
                .snapshot(Instant::ZERO)
                .directory
                .invalidations
        })
        .sum();
    assert!(dirs > 100, "invalidations {dirs}");
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let run = |seed| {
        let mut net = Net::tree(2, 2, 2, 64);
        with_keys(&mut net, 1, 8);
        net.add_clients(seed);
        net.run(10_000_000_000, 2_000);
        net.history
            .iter()
            .map(|o| format!("{o}"))
            .collect::<Vec<_>>()
    };
    assert_eq!(run(3), run(3));
    assert_ne!(run(3), run(4));
}

/// The first key from `k{from}` on whose server is in rack `rack`.
fn key_in_rack(net: &Net, rack: usize, from: usize) -> String {
    (from..from + 100)
        .map(|i| format!("k{i}"))
        .find(|k| net.hosts[net.server_of(k)].tor.0 == rack)
        .expect("a key of every rack within 100")
}

/// Three racks of two hosts and one root (switch 3), every switch caching 64 items with its
/// spec changed by `edit`; a client in each rack, and a key of rack 1's server that rack 0's
/// client has set to `hi`.
fn three_racks(edit: impl Fn(&mut FabricSpec)) -> (Net, String) {
    let mut net = Net::tree_with(3, 1, 2, 64, edit);
    net.add_clients(1);
    let key = key_in_rack(&net, 1, 0);
    one(&mut net, 0, &format!("set {key} 0 0 2\r\nhi\r\n"), &key);
    (net, key)
}

/// A client's own request-reply on `key`, with nothing else running.
fn one(net: &mut Net, client: usize, text: &str, key: &str) -> String {
    exchange(net, client, text, key, None)
}

/// The same, as a message of the fabric's own format with `command` (what the `kvswitch
/// inc` library sends).
fn native(
    net: &mut Net,
    client: usize,
    command: wire::inc::Command,
    text: &str,
    key: &str,
) -> String {
    exchange(net, client, text, key, Some(command))
}

fn exchange(
    net: &mut Net,
    client: usize,
    text: &str,
    key: &str,
    native: Option<wire::inc::Command>,
) -> String {
    let request_id = 7000 + net.history.len() as u16;
    push_request(net, client, request_id, text, key, native);
    await_reply(net, client, request_id, key)
}

/// Sends `text` from `client` to `key`'s server (as a fabric message with `native`) under
/// memcached request id `request_id`, without waiting for its reply.
fn push_request(
    net: &mut Net,
    client: usize,
    request_id: u16,
    text: &str,
    key: &str,
    native: Option<wire::inc::Command>,
) {
    let mut datagram = vec![0u8; mcudp::LEN];
    mcudp::Header::single(request_id).emit(&mut datagram);
    datagram.extend_from_slice(text.as_bytes());
    let server = net.to_server.unwrap_or_else(|| net.server_of(key));
    let port = match native {
        Some(command) => {
            let mut message = Vec::new();
            wire::inc::Message {
                header: wire::inc::Header {
                    request_id: 99,
                    command,
                    key_hash: wire::inc::key_hash(key.as_bytes()),
                    flags: 0,
                    origin: 0,
                    via: 0,
                    epoch: 0,
                    client: (Ipv4Addr::UNSPECIFIED, 0),
                    server: (Ipv4Addr::UNSPECIFIED, 0),
                    lease_ms: 0,
                },
                payload: &datagram,
            }
            .emit(&mut message);
            datagram = message;
            wire::inc::PORT
        }
        None => MC_PORT,
    };
    let c = &net.clients[client];
    let host = &net.hosts[c.host];
    let frame = udp_frame(
        host.mac,
        net.hosts[server].mac,
        (host.ip, c.port),
        (net.hosts[server].ip, port),
        &datagram,
    );
    let to = net.wires[&End::Host(c.host)];
    let now = net.now;
    net.push(now + LINK_NS, to, frame);
}

/// Runs the network for a second with `client` waiting for the reply to `request_id`.
fn await_reply(net: &mut Net, client: usize, request_id: u16, key: &str) -> String {
    net.clients[client].waiting = Some(Waiting {
        request_id,
        op: Op {
            client: client as u32,
            cmd: "raw",
            key: key.to_string(),
            start: net.now,
            end: net.now,
            kind: Kind::Failed,
        },
        arg: 0,
        deadline: u64::MAX,
    });
    net.auto = false;
    let until = net.now + 1_000_000_000;
    net.run(until, usize::MAX);
    net.clients[client].waiting = None;
    net.raw.take().expect("a reply within a second")
}

#[test]
fn a_hit_in_a_tor_never_crosses_a_root() {
    let mut net = Net::tree(2, 1, 2, 64);
    net.add_clients(1);
    // Client 0 is in rack 0; pick a key whose server is in rack 1.
    let key = key_in_rack(&net, 1, 0);
    assert_eq!(
        one(&mut net, 0, &format!("set {key} 0 0 2\r\nhi\r\n"), &key),
        "STORED\r\n"
    );
    let miss = one(&mut net, 0, &format!("get {key}\r\n"), &key);
    assert_eq!(miss, format!("VALUE {key} 0 2\r\nhi\r\nEND\r\n"));
    assert!(
        net.switches[0].holds(key.as_bytes()),
        "filled at the client's ToR"
    );
    assert!(
        net.switches[2].holds(key.as_bytes()),
        "and at the designated root"
    );
    let root_frames: u64 = net.sent_by(2);
    for _ in 0..10 {
        let hit = one(&mut net, 0, &format!("get {key}\r\n"), &key);
        assert_eq!(hit, miss, "byte for byte what the server said");
    }
    let after: u64 = net.sent_by(2);
    assert_eq!(root_frames, after, "the root sent nothing for ten hits");
    // A write invalidates both copies before it is acknowledged.
    assert_eq!(
        one(&mut net, 0, &format!("set {key} 0 0 3\r\nbye\r\n"), &key),
        "STORED\r\n"
    );
    assert!(!net.switches[0].holds(key.as_bytes()));
    assert!(!net.switches[2].holds(key.as_bytes()));
    assert_eq!(
        one(&mut net, 0, &format!("get {key}\r\n"), &key),
        format!("VALUE {key} 0 3\r\nbye\r\nEND\r\n")
    );
}

#[test]
fn a_roots_hit_fills_the_clients_tor_and_the_root_passes_invalidations_on() {
    // Three racks, one root (switch 3): clients 0, 1 and 2 in racks 0, 1 and 2.
    let (mut net, key) = three_racks(|_| {});
    let get = format!("get {key}\r\n");
    let value = one(&mut net, 0, &get, &key);
    assert!(net.switches[3].holds(key.as_bytes()), "filled at the root");
    assert!(!net.switches[2].holds(key.as_bytes()));
    // Rack 2's first read is the root's hit, and fills rack 2's ToR on its way (inclusive).
    assert_eq!(one(&mut net, 2, &get, &key), value);
    assert!(
        net.switches[2].holds(key.as_bytes()),
        "filled by the root's hit"
    );
    assert_eq!(net.switches[3].snapshot(Instant::ZERO).stats.root_fills, 1);
    let root_frames: u64 = net.sent_by(3);
    assert_eq!(one(&mut net, 2, &get, &key), value);
    let after: u64 = net.sent_by(3);
    assert_eq!(
        root_frames, after,
        "the next read is rack 2's ToR's own hit"
    );
    // The home never heard of rack 2's copy: the root passes the invalidation on and
    // acknowledges only once rack 2's ToR has, so the write waits for its retries.
    net.switches[2].drop_invalidations(2);
    let start = net.now;
    assert_eq!(
        one(&mut net, 0, &format!("set {key} 0 0 3\r\nbye\r\n"), &key),
        "STORED\r\n"
    );
    let took = net.now - start;
    assert!(took >= 40_000_000, "acknowledged after {took} ns");
    for s in [0, 2, 3] {
        assert!(!net.switches[s].holds(key.as_bytes()), "switch {s} kept it");
    }
    let root = net.switches[3].snapshot(Instant::ZERO).stats;
    assert!(root.invalidations_relayed >= 3, "{root:?}");
    assert_eq!(
        net.switches[2]
            .snapshot(Instant::ZERO)
            .stats
            .invalidations_dropped,
        2
    );
    assert_eq!(
        one(&mut net, 2, &get, &key),
        format!("VALUE {key} 0 3\r\nbye\r\nEND\r\n")
    );
}

#[test]
fn a_hit_of_the_homes_copy_fills_the_caches_on_its_way_back() {
    // Three racks, one root (switch 3); the key's server in rack 1, whose ToR is its home.
    let (mut net, key) = three_racks(|_| {});
    let get = format!("get {key}\r\n");
    // A read from the home's own rack fills the home's copy alone.
    let value = one(&mut net, 1, &get, &key);
    assert!(net.switches[1].holds(key.as_bytes()), "the home's copy");
    assert!(!net.switches[0].holds(key.as_bytes()) && !net.switches[3].holds(key.as_bytes()));
    // Rack 0's read misses its ToR and the root, is the home's hit, and fills both on the
    // way back: the next is rack 0's ToR's own hit.
    assert_eq!(one(&mut net, 0, &get, &key), value);
    assert!(
        net.switches[0].holds(key.as_bytes()),
        "filled at the client's ToR"
    );
    assert!(net.switches[3].holds(key.as_bytes()), "filled at the root");
    let home_frames: u64 = net.sent_by(1);
    assert_eq!(one(&mut net, 0, &get, &key), value);
    let after: u64 = net.sent_by(1);
    assert_eq!(home_frames, after, "the home heard nothing of rack 0's hit");
    // The home counts both copies: a write from rack 2 takes them before it is acknowledged.
    assert_eq!(
        one(&mut net, 2, &format!("set {key} 0 0 3\r\nbye\r\n"), &key),
        "STORED\r\n"
    );
    for s in 0..4 {
        assert!(!net.switches[s].holds(key.as_bytes()), "switch {s} kept it");
    }
    assert_eq!(
        one(&mut net, 0, &get, &key),
        format!("VALUE {key} 0 3\r\nbye\r\nEND\r\n")
    );
}

#[test]
fn a_copy_made_from_the_homes_lives_no_longer_than_the_homes() {
    let (mut net, key) = three_racks(|spec| {
        spec.lease = std::time::Duration::from_secs(1);
    });
    let get = format!("get {key}\r\n");
    let wait = |net: &mut Net, ns: u64| {
        let until = net.now + ns;
        net.run(until, usize::MAX);
    };
    let tor_hits = |net: &Net| net.switches[0].snapshot(Instant::ZERO).stats.hits;
    let value = one(&mut net, 1, &get, &key);
    // 600 ms into the home copy's lease, rack 0's read fills its ToR from it.
    wait(&mut net, 600_000_000);
    assert_eq!(one(&mut net, 0, &get, &key), value);
    assert!(net.switches[0].holds(key.as_bytes()));
    let before = tor_hits(&net);
    assert_eq!(one(&mut net, 0, &get, &key), value);
    assert_eq!(tor_hits(&net), before + 1, "rack 0's ToR answers");
    // Past the home copy's lease, rack 0's copy has run out too: its ToR answers no more.
    wait(&mut net, 500_000_000);
    assert_eq!(one(&mut net, 0, &get, &key), value);
    assert_eq!(
        tor_hits(&net),
        before + 1,
        "rack 0's copy outlived the home's"
    );
}

#[test]
fn a_tor_a_failed_write_left_holding_its_copy_is_asked_again_by_the_next() {
    // Leases longer than the home waits for acknowledgements: a copy outlives a write that
    // gave up on it.
    let (mut net, key) = three_racks(|spec| {
        spec.lease = std::time::Duration::from_secs(10);
        spec.invalidate_give_up = std::time::Duration::from_millis(200);
    });
    let get = format!("get {key}\r\n");
    one(&mut net, 0, &get, &key);
    let old = one(&mut net, 2, &get, &key);
    assert!(
        net.switches[2].holds(key.as_bytes()),
        "filled by the root's hit"
    );
    // Rack 2's ToR hears no invalidation: the write is not applied, and its copy stays
    // (still the key's value).
    net.switches[2].drop_invalidations(u64::MAX);
    let failed = one(&mut net, 0, &format!("set {key} 0 0 1\r\nx\r\n"), &key);
    assert!(failed.starts_with("SERVER_ERROR"), "{failed}");
    assert!(net.switches[2].holds(key.as_bytes()));
    assert_eq!(one(&mut net, 2, &get, &key), old);
    // The next write reaches that copy through the root all the same.
    net.switches[2].drop_invalidations(0);
    assert_eq!(
        one(&mut net, 0, &format!("set {key} 0 0 3\r\nnew\r\n"), &key),
        "STORED\r\n"
    );
    assert!(
        !net.switches[2].holds(key.as_bytes()),
        "a stale copy survived the write"
    );
    assert_eq!(
        one(&mut net, 2, &get, &key),
        format!("VALUE {key} 0 3\r\nnew\r\nEND\r\n")
    );
}

#[test]
fn dropped_invalidations_are_sent_again_and_hold_the_write_back() {
    let mut net = Net::tree(2, 1, 2, 64);
    net.add_clients(1);
    let key = key_in_rack(&net, 1, 0);
    one(&mut net, 0, &format!("set {key} 0 0 1\r\na\r\n"), &key);
    one(&mut net, 0, &format!("get {key}\r\n"), &key);
    assert!(net.switches[0].holds(key.as_bytes()));
    // The client's ToR drops the next three invalidations it gets.
    net.switches[0].drop_invalidations(3);
    let start = net.now;
    assert_eq!(
        one(&mut net, 0, &format!("set {key} 0 0 1\r\nb\r\n"), &key),
        "STORED\r\n"
    );
    let took = net.now - start;
    let tor = net.switches[0].snapshot(Instant::ZERO);
    assert_eq!(tor.stats.invalidations_dropped, 3);
    let home = net.switches[1].snapshot(Instant::ZERO);
    assert!(home.directory.retransmits >= 3, "{:?}", home.directory);
    // Not acknowledged before the fourth invalidation (three retries of 20 ms) got through.
    assert!(took >= 60_000_000, "acknowledged after {took} ns");
    assert!(!net.switches[0].holds(key.as_bytes()));
}

#[test]
fn a_killed_root_leaves_traffic_on_the_other_and_caching_resumes_with_a_new_table() {
    let mut net = Net::tree(4, 2, 3, 4096);
    with_keys(&mut net, 2, 24);
    net.add_clients(11);
    net.run(u64::MAX, 10_000);
    // Root 4 dies mid-run.
    net.dead.insert(4);
    let killed_at = net.now;
    net.run(u64::MAX, 30_000);
    let fills_before: u64 = net.switches[5].snapshot(Instant::ZERO).cache.fills;
    // The controller's new table names it failed.
    let table = Registration::spread(2, &[4, 5], &BTreeSet::from([4]), 64).unwrap();
    for s in [0, 1, 2, 3, 5] {
        let mut emit = Vec::new();
        let now = net.at();
        net.switches[s]
            .set_registration(table.clone(), now, &mut emit)
            .unwrap();
        net.emitted(s, emit);
    }
    net.run(u64::MAX, 50_000);
    check(&net);
    // Traffic went on: operations after the kill were answered.
    let answered = net
        .history
        .iter()
        .filter(|o| o.start > killed_at && matches!(o.kind, Kind::Read(_) | Kind::Write(_)))
        .count();
    assert!(answered > 30_000, "{answered}");
    let fills_after = net.switches[5].snapshot(Instant::ZERO).cache.fills;
    assert!(
        fills_after > fills_before,
        "the other root caches the dead one's keys"
    );
    for t in 0..4 {
        assert_eq!(
            net.switches[t].neighbours_up(net.at()),
            BTreeSet::from([5]),
            "ToR {t} sees the dead root down"
        );
    }
}

#[test]
fn conditional_puts_that_write_nothing_are_answered_in_the_network() {
    use wire::inc::Command;
    let mut net = Net::tree(2, 1, 2, 64);
    net.add_clients(1);
    let key = key_in_rack(&net, 1, 0);
    let put = |n: u64| format!("set {key} 0 0 {}\r\n{n}\r\n", n.to_string().len());
    // Unset: stored (the home reads the server's value first).
    assert_eq!(
        native(&mut net, 0, Command::CondPut, &put(10), &key),
        "STORED\r\n"
    );
    assert_eq!(
        native(&mut net, 0, Command::CondPut, &put(7), &key),
        "NOT_STORED\r\n"
    );
    // Once the client's ToR holds the key, a put that would write nothing stays there.
    assert_eq!(
        native(&mut net, 0, Command::Get, &format!("get {key}\r\n"), &key),
        format!("VALUE {key} 0 2\r\n10\r\nEND\r\n")
    );
    let home_before = net.switches[1].snapshot(Instant::ZERO).stats.messages_in;
    for n in [3, 9, 10] {
        assert_eq!(
            native(&mut net, 0, Command::CondPut, &put(n), &key),
            "NOT_STORED\r\n"
        );
    }
    assert_eq!(
        net.switches[1].snapshot(Instant::ZERO).stats.messages_in,
        home_before
    );
    // A bigger one is a write, through the home, and invalidates the copies.
    assert_eq!(
        native(&mut net, 0, Command::CondPut, &put(25), &key),
        "STORED\r\n"
    );
    assert!(!net.switches[0].holds(key.as_bytes()));
    assert_eq!(
        one(&mut net, 0, &format!("get {key}\r\n"), &key),
        format!("VALUE {key} 0 2\r\n25\r\nEND\r\n")
    );
    // Increments are ordered by the home and executed by the server, as memcached's incr.
    assert_eq!(
        native(
            &mut net,
            0,
            Command::Increment,
            &format!("incr {key} 5\r\n"),
            &key
        ),
        "30\r\n"
    );
    // A put the home refused leaves the value it read cached on the way back, so the next
    // one that would change nothing stays at the client's ToR.
    let other = key_in_rack(&net, 1, 100);
    let put_other = |n: u64| format!("set {other} 0 0 {}\r\n{n}\r\n", n.to_string().len());
    assert_eq!(
        native(&mut net, 0, Command::CondPut, &put_other(50), &other),
        "STORED\r\n"
    );
    assert!(!net.switches[0].holds(other.as_bytes()));
    assert_eq!(
        native(&mut net, 0, Command::CondPut, &put_other(40), &other),
        "NOT_STORED\r\n"
    );
    assert!(
        net.switches[0].holds(other.as_bytes()),
        "filled by the refusal"
    );
    let home_before = net.switches[1].snapshot(Instant::ZERO).stats.messages_in;
    assert_eq!(
        native(&mut net, 0, Command::CondPut, &put_other(45), &other),
        "NOT_STORED\r\n"
    );
    assert_eq!(
        net.switches[1].snapshot(Instant::ZERO).stats.messages_in,
        home_before
    );
    // A message whose command does not match its request is refused.
    assert!(
        native(&mut net, 0, Command::Del, &format!("get {key}\r\n"), &key)
            .starts_with("CLIENT_ERROR")
    );
}

#[test]
fn garbage_from_hosts_and_links_is_counted_never_a_panic() {
    let mut net = Net::tree(2, 1, 2, 64);
    net.add_clients(1);
    let key = "k1";
    assert_eq!(
        one(&mut net, 0, &format!("set {key} 0 0 1\r\nx\r\n"), key),
        "STORED\r\n"
    );
    // A valid message, then every byte of it changed in turn, and random bytes, from a host
    // and from a link, to a switch's own address and to a server's fabric port.
    let mut message = Vec::new();
    let datagram = b"\x00\x01\x00\x00\x00\x01\x00\x00get k1\r\n";
    wire::inc::Message {
        header: wire::inc::Header {
            request_id: 1,
            command: wire::inc::Command::Get,
            key_hash: wire::inc::key_hash(b"k1"),
            flags: wire::inc::flags::EXPANDED,
            origin: 0,
            via: 0,
            epoch: 0,
            client: (net.hosts[0].ip, 40000),
            server: (net.hosts[2].ip, MC_PORT),
            lease_ms: 0,
        },
        payload: datagram,
    }
    .emit(&mut message);
    let mut rng = 0x1234_5678_9abc_def1_u64;
    let mut payloads = vec![message.clone()];
    for i in 0..message.len() {
        let mut m = message.clone();
        m[i] ^= (xorshift(&mut rng) as u8) | 1;
        payloads.push(m);
    }
    for len in 0..120 {
        payloads.push((0..len).map(|_| xorshift(&mut rng) as u8).collect());
    }
    let before: u64 = net
        .switches
        .iter()
        .map(|s| s.snapshot(Instant::ZERO).stats.malformed)
        .sum();
    let client = (net.hosts[1].ip, net.hosts[1].mac);
    for p in &payloads {
        for (to_port, dst) in [
            (wire::inc::PORT, switch_ip(2)),
            (wire::inc::PORT, net.hosts[2].ip),
            (MC_PORT, net.hosts[2].ip),
        ] {
            // From a host of rack 0 into ToR 0, and from the root into ToR 1.
            let f = udp_frame(
                client.1,
                switch_mac(0),
                (client.0, 40000),
                (dst, to_port),
                p,
            );
            net.push(net.now + LINK_NS, End::Switch(0, 1), f.clone());
            net.push(net.now + LINK_NS, End::Switch(1, 2), f);
        }
    }
    net.auto = false;
    let until = net.now + 100_000_000;
    net.run(until, usize::MAX);
    let after: u64 = net
        .switches
        .iter()
        .map(|s| s.snapshot(Instant::ZERO).stats.malformed)
        .sum();
    assert!(after > before + 50, "malformed {before} then {after}");
    // The fabric still answers, and the value is what was stored.
    assert_eq!(
        one(&mut net, 0, &format!("get {key}\r\n"), key),
        "VALUE k1 0 1\r\nx\r\nEND\r\n"
    );
}

#[test]
fn two_servers_items_of_one_name_are_two_items() {
    let mut net = Net::tree(2, 1, 2, 64);
    net.add_clients(1);
    // Host 0 is rack 0's server, host 2 rack 1's; client 0 is in rack 0.
    net.to_server = Some(2);
    assert_eq!(
        one(&mut net, 0, "set same 0 0 3\r\none\r\n", "same"),
        "STORED\r\n"
    );
    assert_eq!(
        one(&mut net, 0, "get same\r\n", "same"),
        "VALUE same 0 3\r\none\r\nEND\r\n"
    );
    assert!(net.switches[0].holds(b"same"));
    net.to_server = Some(0);
    assert_eq!(one(&mut net, 0, "get same\r\n", "same"), "END\r\n");
    assert_eq!(
        one(&mut net, 0, "set same 0 0 3\r\ntwo\r\n", "same"),
        "STORED\r\n"
    );
    assert_eq!(
        one(&mut net, 0, "get same\r\n", "same"),
        "VALUE same 0 3\r\ntwo\r\nEND\r\n"
    );
    net.to_server = Some(2);
    assert_eq!(
        one(&mut net, 0, "get same\r\n", "same"),
        "VALUE same 0 3\r\none\r\nEND\r\n"
    );
}

#[test]
fn hosts_cannot_speak_for_switches_or_servers() {
    use wire::inc::{flags, Command, Header, Message};
    let mut net = Net::tree(2, 1, 2, 64);
    net.add_clients(1);
    let key = key_in_rack(&net, 1, 0);
    one(&mut net, 0, &format!("set {key} 0 0 4\r\ngood\r\n"), &key);
    one(&mut net, 0, &format!("get {key}\r\n"), &key);
    assert!(net.switches[0].holds(key.as_bytes()));
    let server = net.server_of(&key);
    let server_ip = net.hosts[server].ip;
    let (client_ip, client_mac) = (net.hosts[1].ip, net.hosts[1].mac);
    let evil = format!("VALUE {key} 0 4\r\nevil\r\nEND\r\n");
    let mut datagram = vec![0u8; mcudp::LEN];
    mcudp::Header::single(1).emit(&mut datagram);
    datagram.extend_from_slice(evil.as_bytes());
    let mut forged = Vec::new();
    Message {
        header: Header {
            request_id: 1,
            command: Command::Reply,
            key_hash: wire::inc::key_hash(key.as_bytes()),
            flags: flags::EXPANDED | flags::FILL,
            origin: 0,
            via: 0,
            epoch: u32::MAX / 2,
            client: (client_ip, 40000),
            server: (server_ip, MC_PORT),
            lease_ms: 0,
        },
        payload: &datagram,
    }
    .emit(&mut forged);
    let before = net.switches[0]
        .snapshot(Instant::ZERO)
        .stats
        .refused_sources;
    // A fill addressed to the ToR, from a host of its rack; and a server's reply from a host
    // that is not the server (rack 1's client, with the server's address).
    let to_tor = udp_frame(
        client_mac,
        switch_mac(0),
        (client_ip, 40000),
        (switch_ip(0), wire::inc::PORT),
        &forged,
    );
    net.push(net.now + LINK_NS, End::Switch(0, 1), to_tor);
    let fake_reply = udp_frame(
        net.hosts[3].mac,
        client_mac,
        (server_ip, MC_PORT),
        (client_ip, 40000),
        &datagram,
    );
    net.push(net.now + LINK_NS, End::Switch(1, 1), fake_reply);
    net.auto = false;
    let until = net.now + 10_000_000;
    net.run(until, usize::MAX);
    assert!(
        net.switches[0]
            .snapshot(Instant::ZERO)
            .stats
            .refused_sources
            > before
    );
    assert_eq!(
        one(&mut net, 0, &format!("get {key}\r\n"), &key),
        format!("VALUE {key} 0 4\r\ngood\r\nEND\r\n"),
        "the forged fill was refused"
    );
    // A write, then a read: the value is the real one, never the forged one.
    one(&mut net, 0, &format!("set {key} 0 0 4\r\nnext\r\n"), &key);
    for _ in 0..3 {
        assert_eq!(
            one(&mut net, 0, &format!("get {key}\r\n"), &key),
            format!("VALUE {key} 0 4\r\nnext\r\nEND\r\n")
        );
    }
}

#[test]
fn fragments_from_hosts_to_servers_are_refused() {
    let mut net = Net::tree(2, 1, 2, 64);
    net.add_clients(1);
    let key = key_in_rack(&net, 1, 0);
    let server = net.server_of(&key);
    let (client_ip, client_mac) = (net.hosts[1].ip, net.hosts[1].mac);
    // The first piece of a write cut in two: a ToR that let it by would let the write reach
    // its server without the home seeing it.
    let mut datagram = vec![0u8; mcudp::LEN];
    mcudp::Header::single(1).emit(&mut datagram);
    datagram.extend_from_slice(format!("set {key} 0 0 4\r\nevil\r\n").as_bytes());
    let mut frame = udp_frame(
        client_mac,
        net.hosts[server].mac,
        (client_ip, 40000),
        (net.hosts[server].ip, MC_PORT),
        &datagram,
    );
    // More fragments follow.
    frame[ethernet::HEADER_LEN + 6] |= 0x20;
    let mut ip = wire::ipv4::Packet::new_unchecked(&mut frame[ethernet::HEADER_LEN..]);
    ip.fill_checksum();
    net.push(net.now + LINK_NS, End::Switch(0, 1), frame);
    net.auto = false;
    let until = net.now + 10_000_000;
    net.run(until, usize::MAX);
    assert_eq!(
        net.switches[0]
            .snapshot(Instant::ZERO)
            .stats
            .refused_fragments,
        1
    );
    assert_eq!(
        one(&mut net, 0, &format!("get {key}\r\n"), &key),
        "END\r\n",
        "the write never reached the server"
    );
}

/// A client in a server's rack asks the server for a key and, before the server answers, sends
/// a reply of its own with the server's MAC and address. The server's MAC is bound to the
/// server's port, so the ToR (the key's home) neither caches the forged value nor moves the
/// server's MAC to the client's port: every rack still reads the real value, and requests and
/// writes to the server still reach the server.
#[test]
fn a_client_with_a_servers_mac_and_address_is_refused_and_moves_nothing() {
    let (mut net, key) = three_racks(|_| {});
    let server = net.server_of(&key);
    let (server_ip, server_mac) = (net.hosts[server].ip, net.hosts[server].mac);
    assert_eq!(net.hosts[server].tor.0, 1);
    // Client 1 is the second host of rack 1, the server's rack.
    let attacker = net.clients[1].host;
    assert_eq!(net.hosts[attacker].tor.0, 1);
    let (attacker_ip, attacker_mac) = (net.hosts[attacker].ip, net.hosts[attacker].mac);
    let to_tor = net.wires[&End::Host(attacker)];
    let refused = |net: &Net| {
        net.switches[1]
            .snapshot(Instant::ZERO)
            .stats
            .refused_sources
    };
    let before = refused(&net);
    for round in 0..3u16 {
        let request_id = 900 + round;
        let mut get = vec![0u8; mcudp::LEN];
        mcudp::Header::single(request_id).emit(&mut get);
        get.extend_from_slice(format!("get {key}\r\n").as_bytes());
        let mut evil = vec![0u8; mcudp::LEN];
        mcudp::Header::single(request_id).emit(&mut evil);
        evil.extend_from_slice(format!("VALUE {key} 0 4\r\nEVIL\r\nEND\r\n").as_bytes());
        let ask = udp_frame(
            attacker_mac,
            server_mac,
            (attacker_ip, 40_001),
            (server_ip, MC_PORT),
            &get,
        );
        let forged = udp_frame(
            server_mac,
            attacker_mac,
            (server_ip, MC_PORT),
            (attacker_ip, 40_001),
            &evil,
        );
        // And one frame of another kind with the server's MAC alone.
        let mut other = forged.clone();
        other[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
        let now = net.now;
        net.push(now + LINK_NS, to_tor, ask);
        net.push(now + LINK_NS + 1, to_tor, forged);
        net.push(now + LINK_NS + 2, to_tor, other);
        net.auto = false;
        let until = net.now + 10_000_000;
        net.run(until, usize::MAX);
        assert_eq!(refused(&net), before + 2 * u64::from(round + 1));
        for client in [0, 2] {
            assert_eq!(
                one(&mut net, client, &format!("get {key}\r\n"), &key),
                format!("VALUE {key} 0 2\r\nhi\r\nEND\r\n"),
                "round {round}, client {client}"
            );
        }
    }
    // The server's MAC stayed on its port: another rack's write reaches the server, not the
    // attacker.
    one(&mut net, 0, &format!("set {key} 0 0 2\r\nok\r\n"), &key);
    net.to_server = Some(server);
    assert_eq!(
        one(&mut net, 2, &format!("get {key}\r\n"), &key),
        format!("VALUE {key} 0 2\r\nok\r\nEND\r\n")
    );
}

/// A host's address is bound to the MAC and port it was first seen with: another host of the
/// rack sending from it is refused, and the replies to it still reach their owner.
#[test]
fn a_hosts_address_stays_with_its_mac_and_port() {
    let (mut net, key) = three_racks(|_| {});
    let victim = net.clients[0].host;
    let victim_ip = net.hosts[victim].ip;
    // The other host of rack 0 (its server) sends from the client's address.
    let intruder = 0;
    assert_eq!(net.hosts[intruder].tor.0, 0);
    let to_tor = net.wires[&End::Host(intruder)];
    let refused = |net: &Net| {
        net.switches[0]
            .snapshot(Instant::ZERO)
            .stats
            .refused_sources
    };
    let before = refused(&net);
    let mut get = vec![0u8; mcudp::LEN];
    mcudp::Header::single(5).emit(&mut get);
    get.extend_from_slice(format!("get {key}\r\n").as_bytes());
    let server = net.server_of(&key);
    let forged = udp_frame(
        net.hosts[intruder].mac,
        net.hosts[server].mac,
        (victim_ip, 40_000),
        (net.hosts[server].ip, MC_PORT),
        &get,
    );
    let now = net.now;
    net.push(now + LINK_NS, to_tor, forged);
    net.auto = false;
    let until = net.now + 10_000_000;
    net.run(until, usize::MAX);
    assert_eq!(refused(&net), before + 1);
    assert_eq!(
        one(&mut net, 0, &format!("get {key}\r\n"), &key),
        format!("VALUE {key} 0 2\r\nhi\r\nEND\r\n")
    );
}

/// An item written with an expiry is cached no longer than memcached keeps it: the home caps
/// its own copy's lease and the lease of the copies it fills on the way (a second early, as
/// memcached's clock moves in seconds), and an item about to expire fills nothing.
#[test]
fn cached_copies_live_no_longer_than_their_items_expiry() {
    let (mut net, key) = three_racks(|spec| spec.lease = std::time::Duration::from_secs(30));
    let hit = |net: &mut Net, key: &str| {
        let before = hits(net);
        let reply = one(net, 0, &format!("get {key}\r\n"), key);
        (reply, hits(net) > before)
    };
    one(&mut net, 0, &format!("set {key} 0 3 2\r\nhi\r\n"), &key);
    let set_at = net.now;
    let value = format!("VALUE {key} 0 2\r\nhi\r\nEND\r\n");
    // Filled by the first read; the next are hits, in rack 0's ToR.
    assert_eq!(hit(&mut net, &key), (value.clone(), false));
    assert_eq!(hit(&mut net, &key), (value.clone(), true));
    // 2.1 s after the set (3 s less memcached's second): no cache has it any more.
    net.auto = false;
    let until = set_at + 2_100_000_000;
    net.run(until, usize::MAX);
    assert!(
        !hit(&mut net, &key).1,
        "served from a cache past the item's expiry"
    );
    // An exptime of one second: never cached.
    one(&mut net, 0, &format!("set {key} 0 1 2\r\nho\r\n"), &key);
    for _ in 0..3 {
        assert!(!hit(&mut net, &key).1, "an item about to expire was cached");
    }
    // Set again without an expiry, it is cached for the lease as before.
    one(&mut net, 0, &format!("set {key} 0 0 2\r\nhi\r\n"), &key);
    hit(&mut net, &key);
    assert_eq!(hit(&mut net, &key), (value, true));
}

/// Every switch's cache split as an IncBox: `processors` processors behind a switch stage
/// that checks its table for a hit.
fn incbox(processors: usize) -> impl Fn(&mut FabricSpec) {
    move |spec| {
        spec.incbox = IncBoxSpec {
            processors,
            hit_check: true,
            ..IncBoxSpec::default()
        }
    }
}

#[test]
fn an_incbox_split_steers_by_hash_passes_misses_by_and_stays_coherent() {
    let mut net = Net::tree_with(4, 2, 3, 4096, incbox(4));
    net.jitter_ns = 40_000;
    with_keys(&mut net, 4, 24);
    net.add_clients(11);
    net.run(100_000_000_000, 40_000);
    check(&net);
    assert!(net.history.len() >= 40_000);
    let reads = net.history.iter().filter(|o| o.cmd == "get").count();
    assert!(
        hits(&net) as usize > reads / 10,
        "hits {} of {reads} reads",
        hits(&net)
    );
    for t in 0..4 {
        let s = net.switches[t].snapshot(Instant::ZERO);
        let b = &s.incbox;
        assert!(
            b.bypassed > 0,
            "ToR {t}: no miss passed the processors by: {b:?}"
        );
        assert!(
            b.reads.iter().all(|&n| n > 0),
            "ToR {t}: a processor took no read: {b:?}"
        );
        // Every read that reached a processor was for a key the table marked, so the
        // processors' own misses are only copies whose lease ended or shared hashes.
        assert!(b.processor_misses * 10 <= b.steered, "ToR {t}: {b:?}");
        assert_eq!(
            b.marks, s.cached_items,
            "ToR {t}: one mark per item (no shared hash)"
        );
    }
}

#[test]
fn a_key_held_in_an_incbox_is_read_without_the_server_and_evicted_is_passed_by() {
    let mut net = Net::tree_with(2, 1, 2, 64, incbox(2));
    net.add_clients(1);
    let key = key_in_rack(&net, 1, 0);
    assert_eq!(
        one(&mut net, 0, &format!("set {key} 0 0 2\r\nhi\r\n"), &key),
        "STORED\r\n"
    );
    let miss = one(&mut net, 0, &format!("get {key}\r\n"), &key);
    assert_eq!(miss, format!("VALUE {key} 0 2\r\nhi\r\nEND\r\n"));
    let hash = wire::inc::key_hash(key.as_bytes());
    let mac = switch::fabric::incbox::hash_mac(hash);
    let processor = switch::fabric::incbox::processor;
    assert!(
        net.switches[0].holds(key.as_bytes()),
        "filled at the client's ToR"
    );
    let tor = net.switches[0].snapshot(Instant::ZERO).incbox;
    assert_eq!(tor.marks, 1, "{tor:?} marked under {mac:02x?}");
    let to_server = net.switches[1].snapshot(Instant::ZERO).stats.to_server;
    for _ in 0..10 {
        assert_eq!(one(&mut net, 0, &format!("get {key}\r\n"), &key), miss);
    }
    let after = net.switches[0].snapshot(Instant::ZERO).incbox;
    assert_eq!(
        after.steered - tor.steered,
        10,
        "ten hits steered to the processor"
    );
    assert_eq!(
        after.reads[processor(hash, 2)] - tor.reads[processor(hash, 2)],
        10,
        "all at the key's processor"
    );
    assert_eq!(
        net.switches[1].snapshot(Instant::ZERO).stats.to_server,
        to_server,
        "no read reached the server"
    );
    // Evicted at the processor: the mark goes with the copy, and the next read passes every
    // processor by on its way to the server.
    net.switches[0].set_cache_items(0).unwrap();
    let evicted = net.switches[0].snapshot(Instant::ZERO).incbox;
    let root = net.switches[2].snapshot(Instant::ZERO).cache.hits;
    assert_eq!(evicted.marks, 0);
    assert_eq!(one(&mut net, 0, &format!("get {key}\r\n"), &key), miss);
    let last = net.switches[0].snapshot(Instant::ZERO).incbox;
    assert_eq!(
        last.steered, evicted.steered,
        "the evicted key was not steered"
    );
    assert_eq!(last.bypassed, evicted.bypassed + 1);
    assert_eq!(last.processor_misses, 0);
    assert_eq!(
        net.switches[2].snapshot(Instant::ZERO).cache.hits,
        root + 1,
        "the read went on to the designated root, which answered it"
    );
    // A write takes the root's copy and its mark away before it is acknowledged.
    assert!(net.switches[2].snapshot(Instant::ZERO).incbox.marks > 0);
    assert_eq!(
        one(&mut net, 0, &format!("set {key} 0 0 3\r\nbye\r\n"), &key),
        "STORED\r\n"
    );
    assert_eq!(net.switches[2].snapshot(Instant::ZERO).incbox.marks, 0);
    assert!(!net.switches[2].holds(key.as_bytes()));
}

#[test]
fn write_update_gives_a_stored_value_to_the_switches_a_write_invalidated() {
    for protocol in [Coherence::Invalidate, Coherence::Update] {
        // Three racks under one root (switch 3); the key's home is rack 1's ToR.
        let (mut net, key) = three_racks(|s| s.coherence = protocol);
        let get = format!("get {key}\r\n");
        one(&mut net, 0, &get, &key);
        assert!(net.switches[0].holds(key.as_bytes()));
        assert!(net.switches[3].holds(key.as_bytes()));
        // Rack 2's client writes (flags as memcached reads them: `005` is 5): both copies
        // go before the write is acknowledged.
        let stored = one(&mut net, 2, &format!("set {key} 005 0 3\r\nbye\r\n"), &key);
        assert_eq!(stored, "STORED\r\n");
        let update = protocol == Coherence::Update;
        for s in [0, 1, 3] {
            assert_eq!(
                net.switches[s].holds(key.as_bytes()),
                update,
                "{protocol:?}: switch {s}"
            );
        }
        assert!(
            !net.switches[2].holds(key.as_bytes()),
            "the writer's ToR held none"
        );
        let home = |net: &Net| net.switches[1].snapshot(Instant::ZERO).stats;
        assert_eq!(home(&net).updates_sent, u64::from(update));
        // Rack 0 reads the new value: from its own ToR under write-update, from the server
        // otherwise.
        let asked = home(&net).to_server;
        let new = format!("VALUE {key} 5 3\r\nbye\r\nEND\r\n");
        assert_eq!(one(&mut net, 0, &get, &key), new);
        assert_eq!(
            home(&net).to_server - asked,
            u64::from(!update),
            "{protocol:?}"
        );
        // The updated copies are sharers: the next write takes them away again.
        one(&mut net, 2, &format!("set {key} 0 0 2\r\nok\r\n"), &key);
        let newer = format!("VALUE {key} 0 2\r\nok\r\nEND\r\n");
        for client in [0, 1, 2] {
            assert_eq!(one(&mut net, client, &get, &key), newer, "{protocol:?}");
        }
        // Writes that store nothing, or are not a value, update nothing.
        let sent = home(&net).updates_sent;
        assert_eq!(
            one(&mut net, 2, &format!("add {key} 0 0 1\r\nx\r\n"), &key),
            "NOT_STORED\r\n"
        );
        assert_eq!(
            one(&mut net, 2, &format!("append {key} 0 0 1\r\nx\r\n"), &key),
            "STORED\r\n"
        );
        assert_eq!(home(&net).updates_sent, sent);
        assert_eq!(
            one(&mut net, 0, &get, &key),
            format!("VALUE {key} 0 3\r\nokx\r\nEND\r\n")
        );
    }
}

#[test]
fn a_multi_rooted_tree_under_write_update_stays_coherent() {
    let mut net = Net::tree_with(4, 2, 3, 4096, |s| s.coherence = Coherence::Update);
    net.jitter_ns = 40_000;
    with_keys(&mut net, 4, 24);
    net.add_clients(11);
    net.run(100_000_000_000, 50_000);
    check(&net);
    assert!(net.history.len() >= 50_000);
    let updates: u64 = (0..4)
        .map(|t| net.switches[t].snapshot(Instant::ZERO).stats.updates_sent)
        .sum();
    assert!(updates > 100, "updates {updates}");
}

#[test]
fn writes_under_one_request_id_update_no_copy() {
    // Two keys of one server in rack 1, both cached at rack 0's ToR and the root.
    let (mut net, key) = three_racks(|s| s.coherence = Coherence::Update);
    let other = (1..200)
        .map(|i| key_in_rack(&net, 1, i))
        .find(|k| *k != key && net.server_of(k) == net.server_of(&key))
        .expect("another key of the same server");
    one(
        &mut net,
        0,
        &format!("set {other} 0 0 3\r\nold\r\n"),
        &other,
    );
    let old = one(&mut net, 0, &format!("get {other}\r\n"), &other);
    assert_eq!(old, format!("VALUE {other} 0 3\r\nold\r\nEND\r\n"));
    one(&mut net, 0, &format!("get {key}\r\n"), &key);
    assert!(net.switches[0].holds(other.as_bytes()));
    // One client, one request id: a set that is stored and an add that is not. A reply is
    // matched by the client and the id alone, so the set's STORED could pass for the add's.
    let id = 4242;
    push_request(
        &mut net,
        0,
        id,
        &format!("set {key} 0 0 1\r\nx\r\n"),
        &key,
        None,
    );
    push_request(
        &mut net,
        0,
        id,
        &format!("add {other} 0 0 4\r\nevil\r\n"),
        &other,
        None,
    );
    await_reply(&mut net, 0, id, &key);
    let until = net.now + 1_000_000_000;
    net.run(until, usize::MAX);
    // Nothing updated a copy with the value the server refused.
    for client in [0, 2] {
        assert_eq!(
            one(&mut net, client, &format!("get {other}\r\n"), &other),
            old,
            "client {client}"
        );
    }
}
