//! The request level: SwitchKV's system (clients, one switch, cache nodes, backends) with
//! each request driven through the `kv` crate's own objects.
//!
//! - The switch routes by `kv::Ring` (the ring the daemon builds from the same servers) and by
//!   its exact-match rules, one per cached key's hash, as `kv_steer` holds them; rules change
//!   only as a cache node's `kv::switchkv::CacheNode::poll` releases them (the rule buffer and
//!   its budget), and a full table refuses an install.
//! - Each backend is a `kv::switchkv::Backend` (its top-k tracker, circular log and leases)
//!   behind a [`Station`](crate::station::Station): it counts the reads it serves, sends its
//!   periodic report each segment and an instant report when its log finds a burst.
//! - Each cache node is a `kv::switchkv::CacheNode` (admission, eviction, fetches, leases,
//!   renewals, rule changes), ticked as `kvswitch node --role cache` ticks it; a read it may
//!   not serve goes on to its backend.
//!
//! Network delays add to latency but do not reorder what the parts see: a request reaches
//! the switch, a cache node and a backend at the instant it is sent. Messages between a
//! backend and its cache node take effect at the node's next tick, as the node's threads
//! take them.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::time::Duration;

use kv::rate::LossControl;
use kv::rng::{Rng, Xoshiro256StarStar};
use kv::switchkv::{Backend, BackendConfig, CacheNode, CacheNodeConfig, Fetch, Prepared};
use kv::zipf::{KeyGen, Ranking};
use kv::{Instant, Ring, Server};

use crate::core::{exponential, source, Events, MixHasher, Seeds};
use crate::output::{Bin, Histogram, Summary};
use crate::scenario::{CacheNodes, CachePath, ClientModel, Scenario};
use crate::station::Station;
use crate::Progress;

/// Requests whose keys are drawn together, ahead of their sending (see
/// `RequestSim::draw_ahead`).
const AHEAD: usize = 16;

/// Cache-node stations draw their service times from these sources.
const NODE_SERVICE: u64 = 3 << 32;

#[derive(Debug, Clone, Copy)]
enum Ev {
    /// A backend's periodic report is due.
    Report(usize),
    /// A cache node's tick: fetches, rule changes, renewals.
    NodeTick(usize),
    /// Rate control looks at the loss.
    Adjust,
    /// A time-series bin ends.
    Bin,
    /// The popularity changes.
    Change,
    /// Closed-loop client `i` sends.
    Send(usize),
}

struct BackendState {
    station: Station,
    kv: Option<Backend>,
    bin: u64,
    window: u64,
}

struct NodeState {
    station: Option<Station>,
    kv: CacheNode,
    fetches: Vec<Fetch>,
}

/// A request's key, drawn ahead of its sending: the draw, and what the ranking in force
/// makes of it (the key, its hash on the ring, its backend and its fingerprint there).
#[derive(Default)]
struct Ahead {
    draw: u64,
    key: Vec<u8>,
    hash: u32,
    backend: usize,
    prepared: Option<Prepared>,
}

/// Where a request ended.
enum Fate {
    Answered { at: Instant, hit: bool },
    DroppedBackend,
    DroppedCache,
}

pub struct RequestSim<'a> {
    sc: &'a Scenario,
    ev: Events<Ev>,
    /// Requests start here, after the cache's lead-in; times in the results count from it.
    start: Instant,
    end: Instant,
    warmup: Instant,
    bin: Duration,
    /// One link's latency (`network.link_us`).
    link: Duration,
    ring: Ring,
    backends: Vec<BackendState>,
    nodes: Vec<NodeState>,
    /// Per backend, the loads of its keys among the prefilled ones, reported each segment of
    /// the lead-in.
    prefill: Vec<Vec<(Box<[u8]>, f64)>>,
    /// The switch's rules: key hash → cache node, with how many cached keys share it.
    rules: HashMap<u32, (usize, u32), BuildHasherDefault<MixHasher>>,
    keys: KeyGen,
    ranking: Option<Ranking>,
    key_rng: Xoshiro256StarStar,
    op_rng: Xoshiro256StarStar,
    arrival_rng: Xoshiro256StarStar,
    /// The next requests' keys, used from `ahead_next` on.
    ahead: Vec<Ahead>,
    ahead_next: usize,
    key: Vec<u8>,
    value: kv::cache::Value,
    rate: f64,
    /// Rate control's window: sent and dropped since the last adjustment.
    adjust_sent: u64,
    adjust_dropped: u64,
    bins: Vec<Bin>,
    latency: Histogram,
    s: Summary,
    window_sent: u64,
    window_answered: u64,
    window_dropped: u64,
}

impl<'a> RequestSim<'a> {
    pub fn new(sc: &'a Scenario, seeds: Seeds) -> Result<RequestSim<'a>, String> {
        let b = &sc.backends;
        let dist: kv::Distribution = b.distribution.parse().map_err(|e| format!("{e}"))?;
        let hash: kv::HashFn = b.hash.parse().map_err(|e| format!("{e}"))?;
        // Named as the testbed names its servers, so a key has the same backend here and there.
        let servers: Vec<Server> = (0..b.count)
            .map(|i| Server::new(server_name(i), 1))
            .collect();
        let ring = Ring::new(dist, hash, &servers).map_err(|e| format!("the ring: {e}"))?;
        let now = Instant::ZERO;
        let backend_cfg = sc.cache.as_ref().map(backend_config);
        let mut backends = Vec::with_capacity(b.count);
        for i in 0..b.count {
            let kv = match &backend_cfg {
                Some(cfg) => {
                    let mut cfg = cfg.clone();
                    cfg.tracker.seed = seeds.seed() ^ (i as u64).wrapping_mul(0x9e37_79b9);
                    Some(Backend::new(cfg, now).map_err(|e| format!("backend {i}: {e}"))?)
                }
                None => None,
            };
            backends.push(BackendState {
                station: Station::new(
                    b.capacity,
                    b.queue,
                    b.service,
                    seeds.rng(source::SERVICE + i as u64),
                ),
                kv,
                bin: 0,
                window: 0,
            });
        }
        let mut nodes = Vec::new();
        if let Some(c) = &sc.cache {
            for n in 0..c.nodes {
                let served = (0..b.count).filter(|i| i % c.nodes == n).count();
                let mut cfg = node_config(c, seeds.seed());
                cfg.cache.items = c.items;
                let kv =
                    CacheNode::new(cfg, served, now).map_err(|e| format!("cache node {n}: {e}"))?;
                let station = (c.capacity > 0.0).then(|| {
                    Station::new(
                        c.capacity,
                        c.queue,
                        b.service,
                        seeds.rng(NODE_SERVICE + n as u64),
                    )
                });
                nodes.push(NodeState {
                    station,
                    kv,
                    fetches: Vec::new(),
                });
            }
        }
        let w = &sc.workload;
        let ranking = w.change.as_ref().map(|c| {
            Ranking::new(
                w.keys,
                c.kind,
                c.keys,
                seeds.rng(source::CHANGES).next_u64(),
            )
        });
        let keys = KeyGen::new(w.keys, w.skew, true);
        let (start, prefill) = match &sc.cache {
            Some(c) if c.prefill > 0 => {
                let mut per: Vec<Vec<(Box<[u8]>, f64)>> = vec![Vec::new(); b.count];
                let mut key = Vec::new();
                for rank0 in 0..c.prefill {
                    key.clear();
                    key.extend_from_slice(b"key:");
                    push_decimal(&mut key, keys.index_of_rank(rank0, ranking.as_ref()));
                    let load = sc.clients.rate * keys.share(rank0);
                    per[ring.locate(&key)].push((key.as_slice().into(), load));
                }
                // Long enough for every rule at the rule rate, and a segment more.
                let rate = if c.rule_rate > 0 {
                    f64::from(c.rule_rate)
                } else {
                    f64::INFINITY
                };
                let lead = (c.prefill as f64 / rate).ceil() + (c.report_ms as f64 / 1000.0).ceil();
                (Instant::ZERO + Duration::from_secs_f64(lead), per)
            }
            _ => (Instant::ZERO, Vec::new()),
        };
        let mut sim = RequestSim {
            sc,
            ev: Events::new(),
            start,
            end: start + sc.duration(),
            warmup: start + Duration::from_secs_f64(sc.warmup_s),
            bin: Duration::from_millis(sc.bin_ms),
            link: Duration::from_secs_f64(sc.network.link_us / 1e6),
            ring,
            backends,
            nodes,
            prefill,
            rules: HashMap::default(),
            keys,
            ranking,
            key_rng: seeds.rng(source::KEYS),
            ahead: Vec::new(),
            ahead_next: 0,
            op_rng: seeds.rng(source::OPERATIONS),
            arrival_rng: seeds.rng(source::ARRIVALS),
            key: Vec::with_capacity(32),
            value: kv::cache::Value {
                flags: 0,
                cas: None,
                data: vec![b'v'; w.value_size].into(),
                key_base64: None,
            },
            rate: sc.clients.rate,
            adjust_sent: 0,
            adjust_dropped: 0,
            bins: Vec::new(),
            latency: Histogram::default(),
            s: Summary {
                scenario: sc.name.clone(),
                seed: seeds.seed(),
                level: "request",
                simulated_s: sc.duration_s,
                ..Summary::default()
            },
            window_sent: 0,
            window_answered: 0,
            window_dropped: 0,
        };
        sim.schedule_start(seeds);
        Ok(sim)
    }

    fn schedule_start(&mut self, seeds: Seeds) {
        if !self.prefill.is_empty() {
            for i in 0..self.backends.len() {
                self.report_prefill(i, Instant::ZERO);
            }
        }
        let now = self.start;
        for (i, b) in self.backends.iter().enumerate() {
            if let Some(kv) = &b.kv {
                self.ev.at(kv.next_report(), Ev::Report(i));
            }
        }
        if let Some(c) = &self.sc.cache {
            for n in 0..self.nodes.len() {
                self.ev.at(
                    Instant::ZERO + Duration::from_millis(c.tick_ms),
                    Ev::NodeTick(n),
                );
            }
        }
        self.ev.at(now + self.bin, Ev::Bin);
        self.bins.push(Bin::default());
        let cl = &self.sc.clients;
        if cl.model == ClientModel::RateControl {
            self.ev.at(
                now + Duration::from_secs_f64(cl.adjust_ms / 1000.0),
                Ev::Adjust,
            );
        }
        if cl.model == ClientModel::Closed {
            for i in 0..cl.count {
                // Clients start spread over a millisecond, each from its own generator.
                let mut rng = seeds.rng(source::CLIENT + i as u64);
                let start = Duration::from_nanos(rng.below(1_000_000));
                self.ev.at(now + start, Ev::Send(i));
            }
        }
        if let Some(c) = &self.sc.workload.change {
            let first = c.start_s.unwrap_or(c.every_s);
            self.ev.at(now + Duration::from_secs_f64(first), Ev::Change);
        }
    }

    /// Runs to the end; `progress` is called about every million events.
    pub fn run(mut self, progress: &mut dyn FnMut(Progress)) -> (Summary, Vec<Bin>, Vec<f64>) {
        let open = self.sc.clients.model != ClientModel::Closed;
        let mut next_arrival = if open {
            Some(self.next_arrival(self.start))
        } else {
            None
        };
        let mut reported = 0u64;
        loop {
            let due = self.ev.peek();
            let take_arrival = match (next_arrival, due) {
                (Some(a), Some(d)) => a < d,
                (Some(_), None) => true,
                (None, _) => false,
            };
            let at = if take_arrival {
                next_arrival.unwrap_or(self.end)
            } else {
                due.unwrap_or(self.end)
            };
            if at >= self.end {
                break;
            }
            if take_arrival {
                self.ev.advance(at);
                self.request(at);
                next_arrival = Some(self.next_arrival(at));
            } else if let Some((now, e)) = self.ev.pop() {
                self.handle(now, e);
            }
            if self.ev.handled() - reported >= 1 << 20 {
                reported = self.ev.handled();
                progress(Progress {
                    events: reported,
                    simulated: self.ev.now().duration_since(self.start),
                    end: self.sc.duration(),
                });
            }
        }
        self.finish()
    }

    fn next_arrival(&mut self, now: Instant) -> Instant {
        now + exponential(
            Duration::from_secs_f64(1.0 / self.rate),
            1.0 - self.arrival_rng.f64(),
        )
    }

    fn handle(&mut self, now: Instant, e: Ev) {
        match e {
            Ev::Report(i) => self.report(i, now),
            Ev::NodeTick(n) => self.node_tick(n, now),
            Ev::Adjust => {
                let c = &self.sc.clients;
                if self.adjust_sent > 0 {
                    // Never past a hundred times where it started: a system that drops
                    // nothing (a very deep queue) would have it grow without end.
                    let cap = (c.rate * 100.0).min(crate::scenario::MAX_RATE);
                    let mut control =
                        LossControl::new(self.rate, c.loss_low, c.loss_high, c.step, 1.0, cap);
                    self.rate = control.adjust(self.adjust_sent, self.adjust_dropped);
                }
                self.adjust_sent = 0;
                self.adjust_dropped = 0;
                self.ev
                    .after(Duration::from_secs_f64(c.adjust_ms / 1000.0), Ev::Adjust);
            }
            Ev::Bin => {
                self.close_bin(now);
                self.ev.after(self.bin, Ev::Bin);
            }
            Ev::Change => {
                if let (Some(r), Some(c)) = (&mut self.ranking, &self.sc.workload.change) {
                    r.advance_to(r.epoch() + 1);
                    // Keys drawn ahead take the new ranking.
                    self.resolve_ahead(self.ahead_next);
                    self.ev
                        .after(Duration::from_secs_f64(c.every_s), Ev::Change);
                }
            }
            Ev::Send(i) => {
                let fate = self.request(now);
                let cl = &self.sc.clients;
                let next = match fate {
                    Some(at) => at + Duration::from_secs_f64(cl.think_us / 1e6),
                    None => now + Duration::from_secs_f64(cl.timeout_ms / 1000.0),
                };
                self.ev.at(next, Ev::Send(i));
            }
        }
    }

    /// Records the figures taken at a bin's end (`now`), and starts the next bin's counts.
    fn close_bin(&mut self, now: Instant) {
        let max = self.backends.iter().map(|b| b.bin).max().unwrap_or(0);
        for b in &mut self.backends {
            b.bin = 0;
        }
        let rules = self.rules.len() as u64;
        let rate = match self.sc.clients.model {
            ClientModel::Closed => 0.0,
            _ => self.rate,
        };
        let bin = self.current_bin(now.checked_sub(Duration::from_nanos(1)).unwrap_or(now));
        let b = &mut self.bins[bin];
        b.backend_max = max;
        b.rules = rules;
        b.rate = rate;
    }

    /// The bin holding `t`, growing the series to it.
    fn current_bin(&mut self, t: Instant) -> usize {
        let i = (t.duration_since(self.start).as_nanos() / self.bin.as_nanos()) as usize;
        while self.bins.len() <= i {
            let n = self.bins.len() + 1;
            self.bins.push(Bin {
                t: (n as f64) * self.bin.as_secs_f64(),
                ..Bin::default()
            });
        }
        if self.bins[i].t == 0.0 {
            self.bins[i].t = (i + 1) as f64 * self.bin.as_secs_f64();
        }
        i
    }

    /// One request sent at `now`: its answer's time, or `None` if it was dropped.
    fn request(&mut self, now: Instant) -> Option<Instant> {
        if self.ahead_next == self.ahead.len() {
            self.draw_ahead();
        }
        let a = &self.ahead[self.ahead_next];
        self.ahead_next += 1;
        let (hash, backend, prepared) = (a.hash, a.backend, a.prepared);
        self.key.clear();
        self.key.extend_from_slice(&a.key);
        let write =
            self.sc.workload.write_ratio > 0.0 && self.op_rng.f64() < self.sc.workload.write_ratio;
        let fate = self.route(now, write, hash, backend, prepared);
        self.s.sent += 1;
        self.adjust_sent += 1;
        let measured = now >= self.warmup;
        if measured {
            self.window_sent += 1;
        }
        let bin = self.current_bin(now);
        self.bins[bin].sent += 1;
        match fate {
            Fate::Answered { at, hit } => {
                self.latency_record(now, at, measured);
                if at >= self.end {
                    self.s.in_flight += 1;
                    return Some(at);
                }
                self.s.answered += 1;
                if hit {
                    self.s.cache_hits += 1;
                }
                if at >= self.warmup {
                    self.window_answered += 1;
                }
                let b = self.current_bin(at);
                self.bins[b].answered += 1;
                if hit {
                    self.bins[b].hits += 1;
                }
                Some(at)
            }
            Fate::DroppedBackend | Fate::DroppedCache => {
                if matches!(fate, Fate::DroppedBackend) {
                    self.s.dropped_backend_queue += 1;
                } else {
                    self.s.dropped_cache_queue += 1;
                }
                self.s.dropped += 1;
                self.adjust_dropped += 1;
                if measured {
                    self.window_dropped += 1;
                }
                self.bins[bin].dropped += 1;
                None
            }
        }
    }

    /// Draws the next `AHEAD` requests' keys, in the order requests are sent, so that their
    /// backends' detectors (which for a thousand backends are far larger than the
    /// processor's caches) are read for all of them together: see `Backend::touch_key`.
    /// What each request does is unchanged; the same keys come in the same order.
    fn draw_ahead(&mut self) {
        self.ahead.resize_with(AHEAD, Ahead::default);
        for a in &mut self.ahead {
            a.draw = self.keys.draw(&mut self.key_rng);
        }
        self.ahead_next = 0;
        self.resolve_ahead(0);
    }

    /// Works out the keys drawn ahead from `from` on under the ranking in force, and starts
    /// their backends' reads. Each step is taken for every key before the next step, so
    /// that the keys' reads of memory overlap (see `Backend::touch`).
    fn resolve_ahead(&mut self, from: usize) {
        let ahead = &mut self.ahead[from..];
        for a in ahead.iter_mut() {
            let index = self.keys.index_of_draw(a.draw, self.ranking.as_ref());
            a.key.clear();
            a.key.extend_from_slice(b"key:");
            push_decimal(&mut a.key, index);
            a.hash = self.ring.key_hash(&a.key);
        }
        for a in ahead.iter_mut() {
            a.backend = self.ring.locate_hash(a.hash);
        }
        for a in ahead.iter() {
            let b = &self.backends[a.backend];
            b.station.touch();
            if let Some(kv) = &b.kv {
                kv.touch();
            }
        }
        for a in ahead.iter_mut() {
            a.prepared = self.backends[a.backend]
                .kv
                .as_ref()
                .map(|kv| kv.prepare(&a.key));
        }
        for a in ahead.iter() {
            if let (Some(kv), Some(key)) = (&self.backends[a.backend].kv, a.prepared) {
                kv.touch_key(key);
            }
        }
    }

    fn latency_record(&mut self, sent: Instant, at: Instant, measured: bool) {
        if measured {
            self.latency.record(at.as_nanos() - sent.as_nanos());
        }
    }

    /// The switch, a cache node and a backend, for the key in `self.key`: `hash` is its hash
    /// on the ring, `backend` the backend that holds it, and `prepared` its fingerprint
    /// there.
    fn route(
        &mut self,
        now: Instant,
        write: bool,
        hash: u32,
        backend: usize,
        prepared: Option<Prepared>,
    ) -> Fate {
        let link = self.link;
        let steered = match self.sc.cache.as_ref().map(|c| c.path) {
            _ if write => None,
            Some(CachePath::LookAside) => Some(backend % self.nodes.len()),
            _ => self.rules.get(&hash).map(|&(n, _)| n),
        };
        let mut links = 4;
        if let Some(n) = steered {
            let local = backend / self.nodes.len();
            let node = &mut self.nodes[n];
            let leaves = match &mut node.station {
                Some(st) => match st.arrive(now) {
                    Some(t) => t,
                    None => return Fate::DroppedCache,
                },
                None => now,
            };
            // Only whether it is answered matters here: no copy of the value.
            if node.kv.serve_with(local, &self.key, now, |_| ()).is_some() {
                return Fate::Answered {
                    at: leaves + link * 4,
                    hit: true,
                };
            }
            // Not servable here: sent back through the switch to the backend.
            links = 6;
        }
        let b = &mut self.backends[backend];
        let Some(leaves) = b.station.arrive(now) else {
            return Fate::DroppedBackend;
        };
        b.bin += 1;
        if now >= self.warmup {
            b.window += 1;
        }
        if let Some(kv) = &mut b.kv {
            let nodes = self.nodes.len();
            let (n, local) = (backend % nodes, backend / nodes);
            if write {
                if kv.cached_until(&self.key, now).is_some() {
                    self.nodes[n]
                        .kv
                        .update(&self.key, Some(self.value.clone()), now);
                }
            } else if match prepared {
                Some(p) => kv.see_prepared(&self.key, p, now),
                None => kv.see(&self.key, now),
            } {
                let load = kv.burst_load();
                self.s.instant_reports += 1;
                if let Some(f) = self.nodes[n].kv.hot(local, &self.key, load, now) {
                    self.nodes[n].fetches.push(f);
                }
            }
        }
        Fate::Answered {
            at: leaves + link * links,
            hit: false,
        }
    }

    fn report(&mut self, i: usize, now: Instant) {
        let nodes = self.nodes.len();
        let Some(kv) = self.backends[i].kv.as_mut() else {
            return;
        };
        let report = kv.report(now);
        let next = kv.next_report().max(now + Duration::from_nanos(1));
        self.ev.at(next, Ev::Report(i));
        if now < self.start && !self.prefill.is_empty() {
            self.report_prefill(i, now);
            return;
        }
        let periodic = self.sc.cache.as_ref().is_some_and(|c| c.periodic);
        if let (Some(loads), true) = (report, periodic) {
            self.s.periodic_reports += 1;
            let loads: Vec<(&[u8], f64)> = loads.iter().map(|(k, l)| (&k[..], *l)).collect();
            let fetches = self.nodes[i % nodes].kv.report(i / nodes, &loads, now);
            self.nodes[i % nodes].fetches.extend(fetches);
        }
    }

    /// During the lead-in: backend `i` reports its prefilled keys with their loads.
    fn report_prefill(&mut self, i: usize, now: Instant) {
        let nodes = self.nodes.len();
        let loads: Vec<(&[u8], f64)> = self.prefill[i].iter().map(|(k, l)| (&k[..], *l)).collect();
        if loads.is_empty() {
            return;
        }
        let fetches = self.nodes[i % nodes].kv.report(i / nodes, &loads, now);
        self.nodes[i % nodes].fetches.extend(fetches);
    }

    fn node_tick(&mut self, n: usize, now: Instant) {
        let nodes = self.nodes.len();
        let backend_of = |local: usize| local * nodes + n;
        for f in std::mem::take(&mut self.nodes[n].fetches) {
            let b = backend_of(f.backend);
            if let Some(kv) = self.backends[b].kv.as_mut() {
                kv.grant(&f.key, now);
            }
            self.nodes[n].kv.fetched(f, Some(self.value.clone()), now);
        }
        for change in self.nodes[n].kv.poll(now) {
            self.s.rule_changes += 1;
            match change {
                kv::rules::Change::Add(key) => {
                    let h = self.ring.key_hash(&key);
                    let table = self.sc.cache.as_ref().map_or(usize::MAX, |c| c.rule_table);
                    let full = self.rules.len() >= table;
                    match self.rules.get_mut(&h) {
                        Some((_, users)) => *users += 1,
                        None if full => self.s.rules_refused += 1,
                        None => {
                            self.rules.insert(h, (n, 1));
                        }
                    }
                }
                kv::rules::Change::Remove(key) => {
                    let h = self.ring.key_hash(&key);
                    if let Some((_, users)) = self.rules.get_mut(&h) {
                        *users -= 1;
                        if *users == 0 {
                            self.rules.remove(&h);
                        }
                    }
                }
            }
        }
        for (local, keys) in self.nodes[n].kv.renewals(now) {
            let b = backend_of(local);
            let Some(kv) = self.backends[b].kv.as_mut() else {
                continue;
            };
            let renewed: Vec<Box<[u8]>> = kv
                .renew(keys.iter().map(|k| &k[..]), now)
                .into_iter()
                .map(Box::from)
                .collect();
            let refused: Vec<Box<[u8]>> = keys
                .iter()
                .filter(|k| !renewed.contains(k))
                .cloned()
                .collect();
            self.nodes[n].kv.renewed(&renewed, now);
            if !refused.is_empty() {
                self.nodes[n].kv.refused(&refused, now);
            }
        }
        let tick = Duration::from_millis(self.sc.cache.as_ref().map_or(10, |c| c.tick_ms));
        self.ev.after(tick, Ev::NodeTick(n));
    }

    fn finish(mut self) -> (Summary, Vec<Bin>, Vec<f64>) {
        let end = self.end;
        let window = (end - self.warmup).as_secs_f64();
        let s = &mut self.s;
        s.events = self.ev.handled();
        s.offered = self.window_sent as f64 / window;
        s.throughput = self.window_answered as f64 / window;
        s.loss = if self.window_sent == 0 {
            0.0
        } else {
            self.window_dropped as f64 / self.window_sent as f64
        };
        s.hit_ratio = if s.answered == 0 {
            0.0
        } else {
            s.cache_hits as f64 / s.answered as f64
        };
        let loads: Vec<f64> = self
            .backends
            .iter()
            .map(|b| b.window as f64 / window)
            .collect();
        let (sojourn, accepted) = self.backends.iter().fold((0u128, 0u64), |(t, n), b| {
            (t + b.station.sojourn_ns, n + b.station.accepted)
        });
        s.set_loads(&loads, &self.latency, (sojourn, accepted));
        s.rules_end = self.rules.len() as u64;
        s.cached_end = self.nodes.iter().map(|n| n.kv.leases(end).0 as u64).sum();
        s.client_rate_end = match self.sc.clients.model {
            ClientModel::Closed => 0.0,
            _ => self.rate,
        };
        // The last bin ends with the run; bins past it would hold answers counted in flight.
        let bins = (self.sc.duration_s * 1000.0 / self.sc.bin_ms as f64).ceil() as usize;
        self.close_bin(end);
        self.bins.truncate(bins);
        (self.s, self.bins, loads)
    }
}

/// A backend's name on the ring: the testbed's address for server `i`, so a key lands on the
/// same backend in the simulator and on a testbed of as many servers.
pub fn server_name(i: usize) -> String {
    format!(
        "10.{}.{}.{}:11211",
        64 + i / 62_000,
        (i / 250) % 250,
        10 + i % 250
    )
}

fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

fn backend_config(c: &CacheNodes) -> BackendConfig {
    BackendConfig {
        tracker: tracker(c, 0),
        log_size: c.log_size,
        log_threshold: c.log_threshold,
        load_floor: c.load_floor,
        lease: Duration::from_millis(c.lease_ms),
    }
}

fn tracker(c: &CacheNodes, seed: u64) -> kv::hot::TrackerConfig {
    kv::hot::TrackerConfig {
        segment: Duration::from_millis(c.report_ms),
        top_k: c.top_k,
        alpha: c.alpha,
        capacity: c.counter_capacity,
        sample: c.sample,
        seed,
        ..kv::hot::TrackerConfig::default()
    }
}

fn node_config(c: &CacheNodes, seed: u64) -> CacheNodeConfig {
    let lease = Duration::from_millis(c.lease_ms);
    CacheNodeConfig {
        cache: kv::cache::Config {
            items: c.items,
            admit_percentile: c.admit_percentile,
            tracker: tracker(c, seed),
            rules: kv::rules::RuleConfig {
                rate: (c.rule_rate > 0).then_some(c.rule_rate),
                ..kv::rules::RuleConfig::default()
            },
            ..kv::cache::Config::default()
        },
        lease,
        guard: lease / 10,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_drawn_ahead_are_the_keys_drawn_in_turn_under_the_ranking_when_sent() {
        use crate::scenario::{Backends, Change, ChangeKind, Clients, Workload};
        let sc = Scenario {
            name: "ahead".into(),
            duration_s: 1.0,
            workload: Workload {
                keys: 100_000,
                skew: 0.99,
                change: Some(Change {
                    kind: ChangeKind::HotIn,
                    keys: 1000,
                    every_s: 1.0,
                    start_s: None,
                }),
                ..Workload::default()
            },
            clients: Clients {
                model: ClientModel::Open,
                rate: 10_000.0,
                ..Clients::default()
            },
            backends: Backends {
                count: 8,
                capacity: 10_000.0,
                ..Backends::default()
            },
            cache: Some(CacheNodes {
                items: 100,
                ..CacheNodes::default()
            }),
            ..Scenario::default()
        };
        sc.validate().unwrap();
        let mut sim = RequestSim::new(&sc, Seeds::new(3)).unwrap();
        let mut in_turn = Seeds::new(3).rng(source::KEYS);
        let mut ranking = sim.ranking.clone().unwrap();
        let mut changed = 0;
        // Changes before the first request, in the middle of a batch, and when a batch is
        // used up (nothing drawn is left to work out again).
        let change_at = [0, 5, AHEAD, 2 * AHEAD + 9];
        for i in 0..3 * AHEAD {
            if change_at.contains(&i) {
                sim.handle(sim.start, Ev::Change);
                ranking.advance_to(ranking.epoch() + 1);
                changed += 1;
            }
            sim.request(sim.start);
            let index = sim.keys.next_index_ranked(&mut in_turn, Some(&ranking));
            assert_eq!(sim.key, format!("key:{index}").into_bytes(), "request {i}");
            let a = &sim.ahead[sim.ahead_next - 1];
            assert_eq!(a.key, sim.key);
            assert_eq!(a.hash, sim.ring.key_hash(&a.key));
            assert_eq!(a.backend, sim.ring.locate(&a.key));
            let kv = sim.backends[a.backend].kv.as_ref().unwrap();
            assert_eq!(a.prepared, Some(kv.prepare(&a.key)));
        }
        assert_eq!(sim.s.sent, 3 * AHEAD as u64);
        assert_eq!(changed, change_at.len());
        assert_eq!(sim.ranking.as_ref().unwrap().epoch(), ranking.epoch());
    }

    #[test]
    fn decimals_are_written_as_text() {
        let mut v = Vec::new();
        push_decimal(&mut v, 0);
        v.push(b' ');
        push_decimal(&mut v, 9_999_999_999);
        assert_eq!(v, b"0 9999999999");
    }
}
