//! The switch is a function of its inputs and its seed. A seeded generator plays the clients,
//! the servers and the garbage of a small network against a switch with the cache on: ARP,
//! L2 traffic between stations, memcached requests to the VIP in text, meta and binary (gets
//! split across servers among them), the servers' answers to what the switch sent them (split
//! sub-requests included), lost and reordered replies, and frames that are dropped for a
//! score of reasons. Time is virtual and the switch is ticked as a driver would tick it.
//!
//! - Two fresh switches fed the same run emit the same bytes and fates, frame by frame, and
//!   end with the same counters, snapshot and cache; another seed changes the split
//!   sub-request ids.
//! - A driver that sleeps until `poll_at` sees exactly what a driver ticking every 10 ms
//!   sees, when every input arrives on the 10 ms grid.
//!
//! Every map in a process draws its own hash keys, so two switches iterate their maps in
//! different orders: anything that hangs on that order makes their outputs part.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

use kv::{Distribution, HashFn, Instant};
use switch::cache::{CacheService, CacheSettings};
use switch::frame::{self, UdpEnds};
use switch::pool::Pool;
use switch::spec::{self, ReplyLimit, SourceCheck};
use switch::stats::{self, Answer, Drop, Stats};
use switch::{Dest, Fate, Switch, SwitchSpec};
use wire::ethernet::{self, EtherType, Mac};
use wire::memcache::binary::opcode;
use wire::memcache::{self, cached, Command};
use wire::{arp, ipv4, mcudp, udp};

// ---------------------------------------------------------------------------------------------
// A seeded generator.

/// SplitMix64.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (the bias of the modulus is far below what matters here).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Uniform in `lo..=hi`.
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True `per_mille` times in a thousand.
    fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

// ---------------------------------------------------------------------------------------------
// The network: four ports; clients on ports 0 and 3, servers 0 and 1 on port 1, servers 2
// and 3 on port 2. Servers 0 and 1 have no configured MAC (the switch asks for it with ARP).

const PORTS: usize = 4;
const CLIENTS: usize = 8;
const SERVERS: usize = 4;
const VIP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 100);
const MC_PORT: u16 = 11211;
const AGENT_PORT: u16 = 11311;
const START: Instant = Instant::from_secs(1_000);
/// Keys `key:0` to `key:299`, the low ones read most.
const KEYS: u64 = 300;

#[derive(Clone, Copy)]
struct Host {
    ip: Ipv4Addr,
    mac: Mac,
    port: u16,
}

fn client(i: usize) -> Host {
    Host {
        ip: Ipv4Addr::new(10, 0, 0, 21 + i as u8),
        mac: Mac([2, 0, 0, 0, 2, 1 + i as u8]),
        port: [0, 3][i % 2],
    }
}

fn server(i: usize) -> Host {
    Host {
        ip: Ipv4Addr::new(10, 0, 0, 11 + i as u8),
        mac: Mac([2, 0, 0, 0, 1, 1 + i as u8]),
        port: 1 + (i / 2) as u16,
    }
}

fn server_at(ip: Ipv4Addr) -> Option<usize> {
    (0..SERVERS).find(|&i| server(i).ip == ip)
}

fn client_at(ip: Ipv4Addr) -> Option<usize> {
    (0..CLIENTS).find(|&i| client(i).ip == ip)
}

// ---------------------------------------------------------------------------------------------
// A switch and how it is ticked.

/// When a driver ticks its switch.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Cadence {
    /// At every instant `poll_at` names, and never otherwise.
    PollAt,
    /// At `poll_at`, and at random moments besides.
    PollAtAndRandom,
    /// At random moments 1 to 30 ms apart, whatever `poll_at` says.
    Random,
    /// Every period, from the start.
    Every(Duration),
}

struct Driver {
    cadence: Cadence,
    rng: Rng,
    /// The next random or periodic tick.
    next: Instant,
}

impl Driver {
    fn new(cadence: Cadence, seed: u64) -> Driver {
        Driver {
            cadence,
            rng: Rng(seed),
            next: START,
        }
    }

    /// The next instant this driver ticks at, `clock` being the last instant it acted at.
    fn next_tick(&self, sw: &Switch, clock: Instant) -> Option<Instant> {
        let poll = sw.poll_at().map(|t| t.max(clock));
        // A cadence taken up mid-run may find its next tick in the past: at once, then.
        let next = self.next.max(clock);
        match self.cadence {
            Cadence::PollAt => poll,
            Cadence::PollAtAndRandom => Some(poll.map_or(next, |t| t.min(next))),
            Cadence::Random | Cadence::Every(_) => Some(next),
        }
    }

    fn ticked(&mut self, at: Instant) {
        while self.next <= at {
            self.next = match self.cadence {
                Cadence::Every(period) => self.next + period,
                _ => at + Duration::from_millis(self.rng.between(1, 30)),
            };
        }
    }

    fn follows_poll_at(&self) -> bool {
        matches!(self.cadence, Cadence::PollAt | Cadence::PollAtAndRandom)
    }
}

/// What a switch did, in order: each received frame's fate and the frame as it leaves, and
/// each frame it originated.
#[derive(Debug, PartialEq)]
enum Out {
    Frame(Fate, Vec<u8>),
    Emit(Dest, Vec<u8>),
}

struct Rig {
    sw: Switch,
    stats: Arc<Stats>,
    cache: Arc<CacheService>,
    driver: Driver,
    /// The last instant the switch saw.
    clock: Instant,
    emit: Vec<switch::Emit>,
    log: Vec<Out>,
    ticks: u64,
}

/// What varies between the runs.
#[derive(Clone)]
struct Scenario {
    /// Seeds the generator (not the switch).
    net_seed: u64,
    /// Every frame reaches the switch a multiple of this after [`START`].
    quantum: Duration,
    /// Between two generated frames: 0 to this many quanta, but for one time in fifty, a
    /// quiet spell of up to `quiet` quanta.
    max_gap: u64,
    quiet: u64,
    /// A server answers after this many quanta.
    delay: (u64, u64),
    mac_age: Duration,
}

impl Rig {
    fn new(switch_seed: u64, scenario: &Scenario, driver: Driver) -> Rig {
        let servers = (0..SERVERS)
            .map(|i| spec::Server {
                addr: SocketAddrV4::new(server(i).ip, MC_PORT),
                mac: (i >= 2).then_some(server(i).mac),
            })
            .collect();
        let mut spec = SwitchSpec::new(PORTS, VIP, servers);
        spec.seed = switch_seed;
        spec.cache = true;
        spec.agent_port = AGENT_PORT;
        spec.mac_table_size = 48;
        spec.mac_age = scenario.mac_age;
        spec.source_check = Some(SourceCheck {
            age: Duration::from_secs(5),
            table_size: 64,
            prefixes: Vec::new(),
        });
        spec.reply_limit = Some(ReplyLimit {
            rate: 60_000,
            burst: 16_000,
        });
        let pool = Pool::new(spec.pool_spec(Distribution::Ketama, HashFn::Md5)).unwrap();
        let stats = Arc::new(Stats::new(PORTS, SERVERS));
        let mut sw = Switch::new(spec, Arc::new(pool), stats.clone()).unwrap();
        let mut settings = CacheSettings {
            enabled: true,
            ..Default::default()
        };
        // Few items, so that keys are evicted as well as admitted.
        settings.cache.items = 12;
        let cache = CacheService::new(settings, SERVERS, START).unwrap();
        sw.set_cache(cache.clone()).unwrap();
        Rig {
            sw,
            stats,
            cache,
            driver,
            clock: START,
            emit: Vec::new(),
            log: Vec::new(),
            ticks: 0,
        }
    }

    fn process(&mut self, input: &Input, now: Instant) {
        let mut frame = input.frame.clone();
        let fate = self.sw.process(
            input.port,
            &mut frame,
            input.csum_ready,
            now,
            &mut self.emit,
        );
        self.log.push(Out::Frame(fate, frame));
        self.take_emits();
        self.clock = now;
    }

    fn tick(&mut self, at: Instant) {
        self.sw.tick(at, &mut self.emit);
        self.ticks += 1;
        self.take_emits();
        self.clock = at;
        self.driver.ticked(at);
        if self.driver.follows_poll_at() {
            let next = self.sw.poll_at();
            assert!(
                next.is_none_or(|t| t > at),
                "poll_at says {next:?} right after a tick at {at:?}"
            );
        }
    }

    fn take_emits(&mut self) {
        self.log
            .extend(self.emit.drain(..).map(|e| Out::Emit(e.dest, e.frame)));
    }

    fn next_tick(&self) -> Option<Instant> {
        self.driver.next_tick(&self.sw, self.clock)
    }

    /// Every counter, by name.
    fn counters(&self) -> Vec<(String, u64)> {
        let s = &self.stats;
        let mut out = Vec::new();
        for (i, p) in s.ports.iter().enumerate() {
            for (name, c) in [
                ("rx_packets", &p.rx_packets),
                ("rx_bytes", &p.rx_bytes),
                ("tx_packets", &p.tx_packets),
                ("tx_bytes", &p.tx_bytes),
            ] {
                out.push((format!("port{i}.{name}"), stats::get(c)));
            }
        }
        for (i, b) in s.backends.iter().enumerate() {
            out.push((format!("backend{i}.requests"), stats::get(&b.requests)));
            out.push((format!("backend{i}.replies"), stats::get(&b.replies)));
        }
        for d in Drop::ALL {
            out.push((format!("drop.{}", d.name()), self.drop(d)));
        }
        for a in Answer::ALL {
            out.push((format!("answer.{}", a.name()), self.answers(a)));
        }
        for (name, c) in [
            ("kv_requests", &s.kv_requests),
            ("kv_forwarded", &s.kv_forwarded),
            ("kv_split", &s.kv_split),
            ("kv_replicated", &s.kv_replicated),
            ("route_held", &s.route_held),
            ("arp_replies", &s.arp_replies),
            ("arp_requests_sent", &s.arp_requests_sent),
            ("flooded", &s.flooded),
            ("switched", &s.switched),
            ("mac_learned", &s.mac_learned),
            ("splits_in_flight", &s.splits_in_flight),
        ] {
            out.push((name.to_owned(), stats::get(c)));
        }
        out
    }

    fn drop(&self, reason: Drop) -> u64 {
        stats::get(&self.stats.drops[reason as usize])
    }

    fn answers(&self, kind: Answer) -> u64 {
        stats::get(&self.stats.answers[kind as usize])
    }

    /// The cache as an operator sees it: counters, gauges, every entry, the hot keys.
    fn cache_state(&self) -> String {
        let c = self.cache.lock();
        format!(
            "{:?} {:?} {:?} {:?}",
            c.counters(),
            c.gauges(),
            c.top_entries(usize::MAX),
            c.hot_keys()
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Frames.

/// One frame into the switch.
#[derive(Clone)]
struct Input {
    port: u16,
    frame: Vec<u8>,
    csum_ready: bool,
}

impl Input {
    fn new(port: u16, frame: Vec<u8>) -> Input {
        Input {
            port,
            frame,
            csum_ready: true,
        }
    }
}

fn udp_frame(src: (Mac, Ipv4Addr, u16), dst: (Mac, Ipv4Addr, u16), payload: &[&[u8]]) -> Vec<u8> {
    let ends = UdpEnds {
        src_mac: src.0,
        dst_mac: dst.0,
        src_ip: src.1,
        dst_ip: dst.1,
        src_port: src.2,
        dst_port: dst.2,
    };
    frame::udp_frame(&ends, payload)
}

fn mc_header(request_id: u16, seq: u16, total: u16) -> [u8; mcudp::LEN] {
    let mut h = [0u8; mcudp::LEN];
    mcudp::Header {
        request_id,
        seq,
        total,
        reserved: 0,
    }
    .emit(&mut h);
    h
}

/// A UDP datagram read back from a frame.
struct Datagram {
    src_mac: Mac,
    src: (Ipv4Addr, u16),
    dst: (Ipv4Addr, u16),
    payload: Vec<u8>,
}

fn datagram(frame: &[u8]) -> Option<Datagram> {
    let eth = ethernet::Frame::new_checked(frame).ok()?;
    if eth.ethertype() != EtherType::IPV4 {
        return None;
    }
    let ip = ipv4::Packet::new_checked(eth.payload()).ok()?;
    if ip.protocol() != ipv4::Protocol::UDP || ip.is_fragment() {
        return None;
    }
    let u = udp::Packet::new_checked(ip.payload()).ok()?;
    Some(Datagram {
        src_mac: eth.src(),
        src: (ip.src(), u.src_port()),
        dst: (ip.dst(), u.dst_port()),
        payload: u.payload().to_vec(),
    })
}

fn arp_of(frame: &[u8]) -> Option<arp::Repr> {
    let eth = ethernet::Frame::new_checked(frame).ok()?;
    if eth.ethertype() != EtherType::ARP {
        return None;
    }
    arp::Repr::parse(&arp::Packet::new_checked(eth.payload()).ok()?).ok()
}

fn arp_frame(op: arp::Operation, from: Host, to_mac: Mac, target: (Mac, Ipv4Addr)) -> Vec<u8> {
    let repr = arp::Repr {
        operation: op,
        sender_mac: from.mac,
        sender_ip: from.ip,
        target_mac: target.0,
        target_ip: target.1,
    };
    frame::arp_frame(to_mac, &repr)
}

fn binary_request(op: u8, key: &[u8], opaque: u32) -> Vec<u8> {
    let mut out = vec![0u8; 24];
    out[0] = 0x80;
    out[1] = op;
    out[2..4].copy_from_slice(&(key.len() as u16).to_be_bytes());
    out[8..12].copy_from_slice(&(key.len() as u32).to_be_bytes());
    out[12..16].copy_from_slice(&opaque.to_be_bytes());
    out.extend_from_slice(key);
    out
}

fn binary_response(op: u8, status: u16, opaque: u32, body: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; 24];
    out[0] = 0x81;
    out[1] = op;
    out[6..8].copy_from_slice(&status.to_be_bytes());
    out[8..12].copy_from_slice(&(body.len() as u32).to_be_bytes());
    out[12..16].copy_from_slice(&opaque.to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// Makes an IPv4 frame's header checksum right again after an edit.
fn refill_ip_checksum(frame: &mut [u8]) {
    if let Ok(mut ip) = ipv4::Packet::new_checked(&mut frame[ethernet::HEADER_LEN..]) {
        ip.fill_checksum();
    }
}

// ---------------------------------------------------------------------------------------------
// The servers.

#[derive(Clone)]
struct Item {
    flags: u32,
    data: Vec<u8>,
    cas: u64,
}

/// One memcached, as far as the switch can tell: items, and its replies to what it is sent.
struct Server {
    items: BTreeMap<Vec<u8>, Item>,
}

impl Server {
    /// Every key, with a value whose size depends on the key; a few take several datagrams.
    fn new() -> Server {
        let items = (0..KEYS)
            .map(|n| {
                let len = if n % 37 == 5 {
                    3000
                } else {
                    1 + (n * 7 % 90) as usize
                };
                let item = Item {
                    flags: n as u32,
                    data: vec![b'a' + (n % 26) as u8; len],
                    cas: n + 1,
                };
                (key(n).into_bytes(), item)
            })
            .collect();
        Server { items }
    }

    /// The reply to the requests of one datagram.
    fn answer(&mut self, body: &[u8], cas: &mut u64) -> Vec<u8> {
        let mut out = Vec::new();
        let mut offset = 0;
        while offset < body.len() {
            let Ok(Some(req)) = memcache::parse(&body[offset..]) else {
                out.extend_from_slice(b"ERROR\r\n");
                break;
            };
            offset += req.len.max(1);
            match req.command {
                Command::Get
                | Command::Gets
                | Command::MetaGet
                | Command::Binary(opcode::GET | opcode::GETQ | opcode::GETK | opcode::GETKQ) => {
                    for token in req.keys() {
                        let hit = self.items.get(token).is_some_and(|item| {
                            let item = cached::CachedItem {
                                flags: item.flags,
                                cas: Some(item.cas),
                                data: &item.data,
                                key_form: cached::KeyForm::Raw,
                            };
                            cached::write_hit(&req, token, &item, &mut out)
                        });
                        if !hit {
                            miss(&req, &mut out);
                        }
                    }
                    if req.protocol == memcache::Protocol::Text {
                        cached::write_text_end(&mut out);
                    }
                }
                Command::Set => {
                    // set <key> <flags> <exptime> <bytes>
                    let flags = req
                        .bytes()
                        .split(|&b| b == b' ')
                        .nth(2)
                        .and_then(|f| std::str::from_utf8(f).ok()?.parse().ok())
                        .unwrap_or(0);
                    *cas += 1;
                    let item = Item {
                        flags,
                        data: req.data().unwrap_or_default().to_vec(),
                        cas: *cas,
                    };
                    if let Some(key) = req.key() {
                        self.items.insert(key.to_vec(), item);
                    }
                    if !req.noreply() {
                        out.extend_from_slice(b"STORED\r\n");
                    }
                }
                Command::Delete => {
                    let gone = req.key().and_then(|k| self.items.remove(k)).is_some();
                    if !req.noreply() {
                        out.extend_from_slice(if gone {
                            b"DELETED\r\n"
                        } else {
                            b"NOT_FOUND\r\n"
                        });
                    }
                }
                Command::MetaNoop => out.extend_from_slice(b"MN\r\n"),
                Command::Binary(opcode::NOOP) => {
                    let opaque = req.opaque().unwrap_or(0);
                    out.extend(binary_response(opcode::NOOP, 0, opaque, b""));
                }
                _ => out.extend_from_slice(b"ERROR\r\n"),
            }
        }
        out
    }
}

/// memcached's answer to a get of a key it does not hold (a quiet get's is nothing).
fn miss(req: &memcache::Request<'_>, out: &mut Vec<u8>) {
    match req.command {
        Command::MetaGet if !req.noreply() => out.extend_from_slice(b"EN\r\n"),
        Command::Binary(op @ (opcode::GET | opcode::GETK)) => {
            let opaque = req.opaque().unwrap_or(0);
            out.extend(binary_response(op, 1, opaque, b"Not found"));
        }
        _ => {}
    }
}

fn key(n: u64) -> String {
    format!("key:{n}")
}

// ---------------------------------------------------------------------------------------------
// The generator: clients, servers, garbage.

struct Net {
    rng: Rng,
    scenario: Scenario,
    /// When the next frame is generated.
    next_gen: Instant,
    /// Frames on their way to the switch, by arrival and then order of sending.
    wire: BTreeMap<(Instant, u64), Input>,
    sent: u64,
    /// Each client's next request id.
    request_ids: [u16; CLIENTS],
    servers: Vec<Server>,
    cas: u64,
    /// Recent sub-requests (server, request id), for foreign and stale replies.
    recent_subs: Vec<(usize, u16)>,
    /// Every sub-request id the switch sent, in order.
    sub_ids: Vec<u16>,
    /// Frames generated so far (the first ones introduce every client).
    generated: u64,
}

impl Net {
    fn new(scenario: &Scenario) -> Net {
        Net {
            rng: Rng(scenario.net_seed),
            scenario: scenario.clone(),
            next_gen: START + scenario.quantum,
            wire: BTreeMap::new(),
            sent: 0,
            request_ids: [0; CLIENTS],
            servers: (0..SERVERS).map(|_| Server::new()).collect(),
            cas: 1_000,
            recent_subs: Vec::new(),
            sub_ids: Vec::new(),
            generated: 0,
        }
    }

    fn steps(&self, n: u64) -> Duration {
        self.scenario.quantum * n as u32
    }

    /// Whether server `s` is silent at `now`: every server while it boots (the switch's first
    /// ARP goes unanswered), and server 1 for three seconds later on.
    fn silent(&self, s: usize, now: Instant) -> bool {
        let boot = START + Duration::from_millis(200);
        let outage = START + Duration::from_secs(5)..START + Duration::from_secs(8);
        now < boot || (s == 1 && outage.contains(&now))
    }

    /// When the next frame reaches the switch.
    fn next_input_at(&self) -> Instant {
        match self.wire.keys().next() {
            Some(&(t, _)) => t.min(self.next_gen),
            None => self.next_gen,
        }
    }

    /// The frames that reach the switch at `now`: those on the wire first, then a new one if
    /// one is generated now.
    fn inputs(&mut self, now: Instant) -> Vec<Input> {
        let mut out = Vec::new();
        while let Some(entry) = self.wire.first_entry() {
            if entry.key().0 > now {
                break;
            }
            out.push(entry.remove());
        }
        if self.next_gen <= now {
            out.push(self.generate());
            let gap = match self.rng.chance(20) {
                true => self.rng.below(self.scenario.quiet + 1),
                false => self.rng.below(self.scenario.max_gap + 1),
            };
            self.next_gen = now + self.steps(gap);
        }
        out
    }

    /// Sends `input` to arrive after a server's delay.
    fn send(&mut self, now: Instant, input: Input) {
        let (lo, hi) = self.scenario.delay;
        let delay = self.rng.between(lo, hi);
        let at = now + self.steps(delay);
        self.sent += 1;
        self.wire.insert((at, self.sent), input);
    }

    fn zipf_key(&mut self) -> String {
        // u³ puts most of the weight on the low keys: key:0 takes about 15 % of reads.
        let u = (self.rng.next() >> 11) as f64 / (1u64 << 53) as f64;
        key(((u * u * u) * KEYS as f64) as u64)
    }

    fn request_id(&mut self, c: usize) -> u16 {
        self.request_ids[c] = self.request_ids[c].wrapping_add(1);
        self.request_ids[c]
    }

    /// A request from client `c` to the VIP.
    fn request(&mut self, c: usize, body: &[u8]) -> Input {
        let h = client(c);
        let id = self.request_id(c);
        let frame = udp_frame(
            (h.mac, h.ip, 40_000 + c as u16),
            (Mac([2, 0, 0, 0, 0, 0x64]), VIP, MC_PORT),
            &[&mc_header(id, 0, 1), body],
        );
        Input::new(h.port, frame)
    }

    fn generate(&mut self) -> Input {
        self.generated += 1;
        let n = self.generated - 1;
        // First, every client says hello, so that the switch learns where they are; servers
        // are found by the switch's ARP (or their first answer).
        if (n as usize) < CLIENTS {
            let h = client(n as usize);
            let frame = udp_frame(
                (h.mac, h.ip, 9),
                (Mac::BROADCAST, Ipv4Addr::BROADCAST, 9),
                &[b"hello"],
            );
            return Input::new(h.port, frame);
        }
        let c = self.rng.below(CLIENTS as u64) as usize;
        let roll = self.rng.below(1000);
        match roll {
            0..360 => {
                let k = self.zipf_key();
                self.request(c, format!("get {k}\r\n").as_bytes())
            }
            360..440 => {
                let keys: Vec<String> = (0..self.rng.between(2, 5))
                    .map(|_| self.zipf_key())
                    .collect();
                self.request(c, format!("get {}\r\n", keys.join(" ")).as_bytes())
            }
            440..460 => {
                let keys = [self.zipf_key(), self.zipf_key()];
                self.request(c, format!("gets {}\r\n", keys.join(" ")).as_bytes())
            }
            460..490 => {
                let k = self.zipf_key();
                self.request(c, format!("gets {k}\r\n").as_bytes())
            }
            490..560 => {
                let k = self.zipf_key();
                let len = self.rng.between(1, 60) as usize;
                let data = vec![b'0' + (self.rng.below(10) as u8); len];
                let noreply = if self.rng.chance(150) { " noreply" } else { "" };
                let line = format!("set {k} {} 0 {len}{noreply}\r\n", self.rng.below(100));
                let body = [line.as_bytes(), &data, b"\r\n"].concat();
                self.request(c, &body)
            }
            560..585 => {
                let k = self.zipf_key();
                self.request(c, format!("delete {k}\r\n").as_bytes())
            }
            585..625 => {
                let k = self.zipf_key();
                let op = [opcode::GET, opcode::GETK][self.rng.below(2) as usize];
                let opaque = self.rng.next() as u32;
                self.request(c, &binary_request(op, k.as_bytes(), opaque))
            }
            625..650 => {
                // A pipeline of binary gets and a NOOP: split when the keys span servers.
                let mut body = Vec::new();
                for _ in 0..self.rng.between(2, 4) {
                    let k = self.zipf_key();
                    let ops = [opcode::GET, opcode::GETQ, opcode::GETK, opcode::GETKQ];
                    let op = ops[self.rng.below(4) as usize];
                    body.extend(binary_request(op, k.as_bytes(), self.rng.next() as u32));
                }
                body.extend(binary_request(opcode::NOOP, b"", 7));
                self.request(c, &body)
            }
            650..690 => {
                let k = self.zipf_key();
                let flags = ["v", "v f", "v k c", "s v", "v f O123", "v q"];
                let f = flags[self.rng.below(flags.len() as u64) as usize];
                self.request(c, format!("mg {k} {f}\r\n").as_bytes())
            }
            690..715 => {
                let mut body = String::new();
                for _ in 0..self.rng.between(2, 4) {
                    let k = self.zipf_key();
                    let f = ["v", "v f", "v q", "k v"][self.rng.below(4) as usize];
                    body.push_str(&format!("mg {k} {f}\r\n"));
                }
                body.push_str("mn\r\n");
                self.request(c, body.as_bytes())
            }
            715..725 => {
                let body = ["mn\r\n", "version\r\n"][self.rng.below(2) as usize];
                self.request(c, body.as_bytes())
            }
            725..740 => {
                let long = "x".repeat(251);
                let (a, b) = (self.zipf_key(), self.zipf_key());
                let bodies = [
                    "bogus\r\n".to_owned(),
                    format!("get {long}\r\n"),
                    "stats\r\n".to_owned(),
                    format!("get {a}\r\nget {b}\r\n"),
                    format!("get {a}"),
                    format!("set {a} 0 0 5\r\nab\r\n"),
                ];
                let body = bodies[self.rng.below(bodies.len() as u64) as usize].clone();
                self.request(c, body.as_bytes())
            }
            740..760 => {
                // ARP for the VIP: the switch answers.
                let h = client(c);
                let frame = arp_frame(
                    arp::Operation::Request,
                    h,
                    Mac::BROADCAST,
                    (Mac([0; 6]), VIP),
                );
                Input::new(h.port, frame)
            }
            760..780 => {
                // ARP for another client: flooded, and answered by it.
                let h = client(c);
                let other = client((c + 1 + self.rng.below(CLIENTS as u64 - 1) as usize) % CLIENTS);
                let frame = arp_frame(
                    arp::Operation::Request,
                    h,
                    Mac::BROADCAST,
                    (Mac([0; 6]), other.ip),
                );
                Input::new(h.port, frame)
            }
            780..865 => {
                // Traffic between stations; now and then to a MAC nobody has.
                let h = client(c);
                let other = client(self.rng.below(CLIENTS as u64) as usize);
                let dst_mac = if self.rng.chance(60) {
                    Mac([2, 0, 0, 0, 9, 9])
                } else {
                    other.mac
                };
                let len = self.rng.between(1, 200) as usize;
                let frame = udp_frame(
                    (h.mac, h.ip, 5000),
                    (dst_mac, other.ip, 5001),
                    &[&vec![7u8; len]],
                );
                Input::new(h.port, frame)
            }
            865..880 => self.reply_to_agent(),
            _ => self.garbage(c),
        }
    }

    /// A datagram to the agent port that is no part's answer: from another server than the one
    /// a recent sub-request went to, or with an id no split has.
    fn reply_to_agent(&mut self) -> Input {
        let (s, id) = match self.recent_subs.len() {
            0 => (0, self.rng.next() as u16),
            n => {
                let (s, id) = self.recent_subs[self.rng.below(n as u64) as usize];
                if self.rng.chance(500) {
                    ((s + 1) % SERVERS, id)
                } else {
                    (s, self.rng.next() as u16)
                }
            }
        };
        let h = server(s);
        let frame = udp_frame(
            (h.mac, h.ip, MC_PORT),
            (Mac([2, 0, 0, 0, 0, 0x64]), VIP, AGENT_PORT),
            &[&mc_header(id, 0, 1), b"END\r\n"],
        );
        Input::new(h.port, frame)
    }

    /// A frame the switch must drop, each for its own reason.
    fn garbage(&mut self, c: usize) -> Input {
        let h = client(c);
        let k = self.zipf_key();
        let get = format!("get {k}\r\n");
        let mut input = self.request(c, get.as_bytes());
        let f = &mut input.frame;
        match self.rng.below(16) {
            0 => {
                // Random bytes: too short, or of an unknown EtherType from one of forty
                // stations, which are learned until the MAC table is full.
                let len = self.rng.below(60) as usize;
                let mut bytes: Vec<u8> = (0..len).map(|_| self.rng.next() as u8).collect();
                if len >= 14 {
                    bytes[0] &= 0xfe;
                    bytes[6..12].copy_from_slice(&[2, 0, 0, 0, 8, self.rng.below(40) as u8]);
                    bytes[12..14].copy_from_slice(&[0x88, 0xb5]);
                }
                *f = bytes;
            }
            1 => f[41] ^= 0x5a, // UDP checksum
            2 => f[24] ^= 0x5a, // IPv4 header checksum
            3 => {
                f[20] |= 0x20; // more fragments
                refill_ip_checksum(f);
            }
            4 => {
                // Four bytes of IP options (no-ops and the end of the list).
                f.splice(34..34, [1, 1, 1, 0]);
                f[14] = 0x46;
                let total = u16::from_be_bytes([f[16], f[17]]) + 4;
                f[16..18].copy_from_slice(&total.to_be_bytes());
                refill_ip_checksum(f);
            }
            5 => {
                let id = self.request_id(c);
                *f = udp_frame(
                    (h.mac, h.ip, 40_000 + c as u16),
                    (Mac([2, 0, 0, 0, 0, 0x64]), VIP, MC_PORT),
                    &[&mc_header(id, 0, 2), get.as_bytes()],
                );
            }
            6 => {
                *f = udp_frame(
                    (h.mac, h.ip, 40_000 + c as u16),
                    (Mac([2, 0, 0, 0, 0, 0x64]), VIP, MC_PORT),
                    &[b"\x00\x01"],
                );
            }
            7 => {
                *f = udp_frame(
                    (h.mac, h.ip, 0),
                    (Mac([2, 0, 0, 0, 0, 0x64]), VIP, MC_PORT),
                    &[&mc_header(1, 0, 1), get.as_bytes()],
                );
            }
            8..=10 => {
                let src = match self.rng.below(3) {
                    0 => Ipv4Addr::new(224, 0, 0, 9),
                    1 => Ipv4Addr::LOCALHOST,
                    _ => VIP,
                };
                *f = udp_frame(
                    (h.mac, src, 40_000),
                    (Mac([2, 0, 0, 0, 0, 0x64]), VIP, MC_PORT),
                    &[&mc_header(1, 0, 1), get.as_bytes()],
                );
            }
            11 => {
                // Another client's address from this one's port.
                let other = client((c + 1) % CLIENTS);
                *f = udp_frame(
                    (h.mac, other.ip, 40_000),
                    (Mac([2, 0, 0, 0, 0, 0x64]), VIP, MC_PORT),
                    &[&mc_header(1, 0, 1), get.as_bytes()],
                );
            }
            12..=13 => {
                // A made-up address: learned until the port's share of the table is full.
                let src = Ipv4Addr::new(10, 0, 200, self.rng.below(250) as u8 + 1);
                *f = udp_frame(
                    (h.mac, src, 40_000),
                    (Mac([2, 0, 0, 0, 0, 0x64]), VIP, MC_PORT),
                    &[&mc_header(1, 0, 1), get.as_bytes()],
                );
            }
            14 => {
                // An IPv4 header that claims more than the frame holds.
                f[16..18].copy_from_slice(&1400u16.to_be_bytes());
                refill_ip_checksum(f);
            }
            _ => {
                // A good request whose UDP checksum the sender left to the hardware.
                input.csum_ready = false;
            }
        }
        input
    }

    /// Reacts to what the switch did at `now`: servers answer what reached them and ARP for
    /// them, clients answer ARP for them.
    fn observe(&mut self, now: Instant, log: &[Out]) {
        for out in log {
            match out {
                Out::Frame(Fate::Out(p), frame) | Out::Emit(Dest::Port(p), frame) => {
                    self.reached_port(now, *p, frame)
                }
                Out::Frame(Fate::Flood, frame) | Out::Emit(Dest::Flood, frame) => {
                    self.flooded(now, frame)
                }
                Out::Frame(Fate::Consumed, _) => {}
            }
        }
    }

    fn reached_port(&mut self, now: Instant, port: u16, frame: &[u8]) {
        let Some(d) = datagram(frame) else {
            return;
        };
        let Some(s) = server_at(d.dst.0).filter(|&s| server(s).port == port) else {
            return;
        };
        if d.dst.1 != MC_PORT {
            return;
        }
        let Ok((header, body)) = mcudp::Header::parse(&d.payload) else {
            return;
        };
        if d.src.1 == AGENT_PORT {
            self.sub_ids.push(header.request_id);
            if self.recent_subs.len() == 32 {
                self.recent_subs.remove(0);
            }
            self.recent_subs.push((s, header.request_id));
        }
        // Lost now and then: splits time out, writes and fills wait out their timeouts.
        if self.rng.chance(20) || self.silent(s, now) {
            return;
        }
        let reply = self.servers[s].answer(body, &mut self.cas);
        if reply.is_empty() {
            return;
        }
        let h = server(s);
        let ends = UdpEnds {
            src_mac: h.mac,
            dst_mac: d.src_mac,
            src_ip: h.ip,
            dst_ip: d.src.0,
            src_port: MC_PORT,
            dst_port: d.src.1,
        };
        let Some(mut frames) = frame::memcached_reply(&ends, header.request_id, &reply) else {
            return;
        };
        if frames.len() > 1 && self.rng.chance(200) {
            frames.reverse();
        }
        let (lo, hi) = self.scenario.delay;
        let delay = self.rng.between(lo, hi);
        let at = now + self.steps(delay);
        for frame in frames {
            self.sent += 1;
            self.wire.insert((at, self.sent), Input::new(h.port, frame));
        }
    }

    fn flooded(&mut self, now: Instant, frame: &[u8]) {
        let Some(asked) = arp_of(frame) else {
            return;
        };
        if asked.operation != arp::Operation::Request {
            return;
        }
        let target = match (server_at(asked.target_ip), client_at(asked.target_ip)) {
            (Some(s), _) if self.silent(s, now) => return,
            (Some(s), _) => server(s),
            (None, Some(c)) if asked.sender_ip != asked.target_ip => client(c),
            _ => return,
        };
        if self.rng.chance(30) {
            return;
        }
        let reply = arp_frame(
            arp::Operation::Reply,
            target,
            asked.sender_mac,
            (asked.sender_mac, asked.sender_ip),
        );
        self.send(now, Input::new(target.port, reply));
    }
}

// ---------------------------------------------------------------------------------------------
// Running.

/// Runs `rigs` (one, or two to be compared) on the scenario until `inputs` frames have gone
/// in; with `phases` = (n, cadences), every rig takes up the next cadence every n inputs. The
/// generator reacts to the first rig; with two, their outputs must match at every step.
fn run(
    scenario: &Scenario,
    rigs: &mut [Rig],
    inputs: usize,
    phases: Option<(usize, &[Cadence])>,
) -> Net {
    let mut net = Net::new(scenario);
    let mut done = 0;
    let mut step = 0u64;
    while done < inputs {
        step += 1;
        let t_in = net.next_input_at();
        let t_tick = rigs.iter().filter_map(Rig::next_tick).min();
        let now = match t_tick {
            Some(t) if t < t_in => {
                for rig in rigs.iter_mut() {
                    if rig.next_tick() == Some(t) {
                        rig.tick(t);
                    }
                }
                t
            }
            _ => {
                for input in net.inputs(t_in) {
                    for rig in rigs.iter_mut() {
                        rig.process(&input, t_in);
                    }
                    done += 1;
                    if let Some((every, cadences)) = phases {
                        if done % every == 0 {
                            let cadence = cadences[(done / every) % cadences.len()];
                            for rig in rigs.iter_mut() {
                                rig.driver.cadence = cadence;
                            }
                        }
                    }
                }
                for rig in rigs.iter_mut() {
                    if rig.next_tick().is_some_and(|t| t <= t_in) {
                        rig.tick(t_in);
                    }
                }
                t_in
            }
        };
        let log = std::mem::take(&mut rigs[0].log);
        for other in &mut rigs[1..] {
            let theirs = std::mem::take(&mut other.log);
            if theirs != log {
                let at = log.iter().zip(&theirs).position(|(a, b)| a != b);
                let at = at.unwrap_or(log.len().min(theirs.len()));
                panic!(
                    "step {step} at {now:?}: the runs part at output {at} of {} and {}: \
                     {:?} against {:?}",
                    log.len(),
                    theirs.len(),
                    log.get(at),
                    theirs.get(at)
                );
            }
        }
        net.observe(now, &log);
    }
    net
}

/// Microseconds apart, on the scale of a loaded switch.
fn busy(net_seed: u64) -> Scenario {
    Scenario {
        net_seed,
        quantum: Duration::from_micros(1),
        max_gap: 300,
        quiet: 300,
        delay: (40, 3_000),
        mac_age: Duration::from_secs(4),
    }
}

#[test]
fn the_same_seed_gives_the_same_run_frame_for_frame() {
    let scenario = busy(0x6b76_7377);
    let cadences = [Cadence::PollAt, Cadence::PollAtAndRandom, Cadence::Random];
    let mut rigs: Vec<Rig> = (0..2)
        .map(|_| Rig::new(42, &scenario, Driver::new(cadences[0], 7)))
        .collect();
    let inputs = 100_000;
    let net = run(&scenario, &mut rigs, inputs, Some((20_000, &cadences)));

    let (a, b) = (&rigs[0], &rigs[1]);
    assert_eq!(a.counters(), b.counters());
    assert_eq!(
        format!("{:?}", a.sw.snapshot()),
        format!("{:?}", b.sw.snapshot())
    );
    assert_eq!(a.cache_state(), b.cache_state());
    assert_eq!(a.sw.poll_at(), b.sw.poll_at());

    // The run did what it claims to.
    let count = |name: &str| {
        a.counters()
            .into_iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, v)| v)
    };
    for name in [
        "kv_split",
        "kv_forwarded",
        "route_held",
        "arp_replies",
        "arp_requests_sent",
        "flooded",
        "switched",
        "mac_learned",
    ] {
        assert!(count(name) > 0, "{name} never moved");
    }
    // The seeded network's pool keeps each key once: no write is replicated.
    for kind in Answer::ALL
        .into_iter()
        .filter(|k| *k != Answer::ReplicatedWrite)
    {
        assert!(a.answers(kind) > 0, "no {} answer", kind.name());
    }
    for reason in [
        Drop::BadEthernet,
        Drop::BadIpv4,
        Drop::BadUdpChecksum,
        Drop::Ipv4Options,
        Drop::IpFragment,
        Drop::BadFrameHeader,
        Drop::MultiDatagramRequest,
        Drop::IncompleteRequest,
        Drop::PipelinedMultiServer,
        Drop::KeylessCommand,
        Drop::BackendUnresolved,
        Drop::RoutePortUnknown,
        Drop::SplitTimeout,
        Drop::StaleReply,
        Drop::SplitForeignReply,
        Drop::MacTableFull,
        Drop::SourceSpoofed,
        Drop::SourceTableFull,
        Drop::SourcePortZero,
        Drop::SourceMulticast,
        Drop::SourceLoopback,
        Drop::SourceVip,
        Drop::ReplyRateLimited,
    ] {
        assert!(a.drop(reason) > 0, "nothing dropped as {}", reason.name());
    }
    let cache = a.cache.lock().counters();
    assert!(cache.hits > 0 && cache.fills > 0, "{cache:?}");
    assert!(cache.admissions > 0 && cache.evictions > 0, "{cache:?}");
    assert!(
        cache.invalidations > 0 && cache.rule_removals > 0,
        "{cache:?}"
    );
    assert!(!net.sub_ids.is_empty());
}

#[test]
fn another_seed_draws_other_split_ids() {
    let scenario = busy(0x5eed);
    let ids = |switch_seed: u64| {
        let mut rigs = [Rig::new(
            switch_seed,
            &scenario,
            Driver::new(Cadence::PollAt, 1),
        )];
        run(&scenario, &mut rigs, 15_000, None).sub_ids
    };
    let (a, b) = (ids(1), ids(2));
    assert!(a.len() > 10, "only {} sub-requests", a.len());
    assert_eq!(a, ids(1));
    assert_ne!(a[0], b[0]);
    assert_ne!(a, b);
}

#[test]
fn a_driver_sleeping_until_poll_at_sees_what_one_ticking_every_10_ms_sees() {
    // Every input on the 10 ms grid, and quiet spells of up to three seconds between them.
    let tick = Duration::from_millis(10);
    let scenario = Scenario {
        net_seed: 0x7469_636b,
        quantum: tick,
        max_gap: 8,
        quiet: 300,
        delay: (1, 3),
        // Stations refreshed at a grid instant are due for ARP half an ageing time and a
        // nanosecond later, off the grid; keep them fresh for the whole run.
        mac_age: Duration::from_secs(3_600),
    };
    let mut rigs = [
        Rig::new(9, &scenario, Driver::new(Cadence::Every(tick), 0)),
        Rig::new(9, &scenario, Driver::new(Cadence::PollAt, 0)),
    ];
    run(&scenario, &mut rigs, 20_000, None);
    let (every, sleeper) = (&rigs[0], &rigs[1]);
    assert_eq!(every.counters(), sleeper.counters());
    assert_eq!(every.cache_state(), sleeper.cache_state());
    assert_eq!(
        format!("{:?}", every.sw.snapshot()),
        format!("{:?}", sleeper.sw.snapshot())
    );
    // The sleeper slept, and deadlines fell while it did.
    assert!(sleeper.ticks * 20 < every.ticks, "{} ticks", sleeper.ticks);
    assert!(every.answers(Answer::MergedGet) > 0 && every.answers(Answer::Cache) > 0);
    assert!(every.drop(Drop::SplitTimeout) > 0);
    let cache = every.cache.lock().counters();
    assert!(cache.evictions > 0 && cache.lease_expiries > 0, "{cache:?}");
}
