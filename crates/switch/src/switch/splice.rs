//! The TCP splice: a connection to the VIP's memcached port routed by key in the switch, with no
//! trip through the host's stack while its requests stay on one server (docs/tcp.md).
//!
//! The switch answers the client's SYN itself with a SYN cookie (nothing is kept per SYN). The
//! cookie's ACK, or the first request that carries it, opens a flow. The first request's key
//! chooses the server, and the switch opens a connection to it in the client's name, with the
//! client's sequence numbers, the MSS the cookie granted and the client's window scale. From
//! then on every segment is rewritten in place: the server's sequence numbers moved into the
//! cookie's space, the client's acknowledgements moved back, windows rescaled when the two
//! ends' scales differ. The switch reads the client's byte stream request by request. When a
//! request belongs elsewhere (another server, several, none, a write the cache must see), the
//! flow is handed over at that request's first byte: once the server has acknowledged every
//! byte before it and the client every reply, the switch resets its connection to the server
//! and opens one in the client's name to the host's stack on the local port, where the proxy
//! serves the rest of the connection as it serves any other. The client stays the only sender
//! of its bytes: the switch acknowledges nothing in its name, so every loss is repaired by the
//! client's own retransmission.

use super::*;
use std::collections::VecDeque;

use wire::memcache::reply::ReplyKind;
use wire::tcp::{self, flag, Segment};

/// The window scale the switch announces to clients that offer one.
const OUR_WSCALE: u8 = 7;
/// The MSS the switch announces to clients: what the servers and the host take on a
/// 1500-byte network.
const OUR_MSS: u16 = 1460;
/// The MSS values a cookie can carry, smallest first (RFC 4987's idea, Linux's table).
const MSS_TABLE: [u16; 4] = [536, 1220, 1440, 1460];
/// A cookie's life: it carries the 64-second period it was made in, and the one before still
/// counts.
const COOKIE_PERIOD_NS: u64 = 64_000_000_000;
/// A flow that never carried a request is forgotten after this long without a segment.
const IDLE_OPEN: Duration = Duration::from_secs(120);
/// A flow is kept this long after both FINs (or a reset), for retransmissions.
const LINGER: Duration = Duration::from_secs(5);
/// Client bytes a flow holds while its next connection is opened; more are dropped (the client
/// sends them again).
const HELD_MAX: usize = 64 * 1024;
/// The longest a hand-over waits for the server's and the client's acknowledgements before it
/// gives up on order and resets the client.
const SWITCH_WAIT: Duration = Duration::from_secs(10);
/// How often a SYN to a target that has not answered is sent again while the client retransmits.
const SYN_RETRY: Duration = Duration::from_millis(200);

/// Where a flow's bytes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Target {
    Server(usize),
    /// The host's stack on the local port, where the proxy listens on the VIP's port.
    Host,
}

/// The switch's connection to a flow's target, made in the client's name.
#[derive(Debug)]
struct Leg {
    target: Target,
    mac: Mac,
    ip: Ipv4Addr,
    port: u16,
    /// The switch port the target is on.
    out: u16,
    /// The client's sequence number of the first byte this leg carries (its SYN has the one
    /// before).
    start: u32,
    /// The client-side sequence number of the target's first byte (the cookie's space).
    base: u32,
    /// `None` until the target's SYN-ACK: then its initial sequence number.
    isn: Option<u32>,
    syn_at: Instant,
    /// The shift of the target's windows as the client reads them moved to ours.
    target_shift: u8,
    /// The shift the target expects on the client's windows it does not get (0 when the target
    /// took the client's window scale).
    client_shift: u8,
    /// The highest acknowledgement the target sent (client sequence space).
    acked: u32,
    /// The end of the highest byte the target sent, in the client's view.
    sent: u32,
    /// The replies the target owes, read from its bytes in order up to `read` (client view).
    replies: Replies,
    read: u32,
}

/// Where a target's replies end: the kinds of the replies it owes, in order, and how far into
/// the current one its bytes have come. Only the kinds a spliced request gets are read: a
/// retrieval of one key, one line, a meta reply.
#[derive(Debug, Default)]
struct Replies {
    owed: VecDeque<ReplyKind>,
    /// The current reply line so far.
    line: Vec<u8>,
    /// Bytes of a data block (with its `\r\n`) still to come.
    data: usize,
    /// The current reply ends with its data block (a meta `VA`).
    ends_with_data: bool,
    /// The bytes did not read as the replies owed: no hand-over can be placed in them.
    lost: bool,
}

/// The longest reply line read (a `VALUE` line with a 250-byte key fits).
const REPLY_LINE_MAX: usize = 1024;

impl Replies {
    fn expect(&mut self, kind: ReplyKind) {
        self.owed.push_back(kind);
    }

    /// Whether every reply owed has come whole.
    fn settled(&self) -> bool {
        self.owed.is_empty() && self.line.is_empty() && self.data == 0 && !self.lost
    }

    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() && !self.lost {
            if self.data > 0 {
                let take = self.data.min(bytes.len());
                self.data -= take;
                bytes = &bytes[take..];
                if self.data == 0 && self.ends_with_data {
                    self.ends_with_data = false;
                    self.owed.pop_front();
                }
                continue;
            }
            let Some(&kind) = self.owed.front() else {
                self.lost = true;
                return;
            };
            let nl = bytes.iter().position(|&b| b == b'\n');
            let take = nl.map_or(bytes.len(), |i| i + 1);
            self.line.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.line.len() > REPLY_LINE_MAX {
                self.lost = true;
                return;
            }
            if nl.is_none() {
                return;
            }
            let line = std::mem::take(&mut self.line);
            let mut tokens = line
                .split(|&b| b == b' ' || b == b'\r' || b == b'\n')
                .filter(|t| !t.is_empty());
            let first = tokens.next().unwrap_or_default();
            match (kind, first) {
                (ReplyKind::Retrieval, b"VALUE") => match tokens.nth(2).and_then(number) {
                    Some(n) => self.data = n + 2,
                    None => self.lost = true,
                },
                (ReplyKind::Meta, b"VA") => match tokens.next().and_then(number) {
                    Some(n) => {
                        self.data = n + 2;
                        self.ends_with_data = true;
                    }
                    None => self.lost = true,
                },
                // `END`, an error line, or a reply of one line.
                _ => {
                    self.owed.pop_front();
                }
            }
        }
    }
}

fn number(token: &[u8]) -> Option<usize> {
    std::str::from_utf8(token).ok()?.parse().ok()
}

impl Leg {
    /// The offset that moves a target sequence number into the client's view.
    fn delta(&self) -> u32 {
        self.base
            .wrapping_sub(self.isn.unwrap_or(0).wrapping_add(1))
    }
}

#[derive(Debug)]
struct Flow {
    mac: Mac,
    /// The switch port the client is on.
    port: u16,
    /// Our cookie: the switch's initial sequence number towards the client.
    cookie: u32,
    mss: u16,
    /// The client's window scale, when it offered one (the switch then announced its own).
    wscale: Option<u8>,
    leg: Option<Leg>,
    /// The client's sequence number of the first byte not yet given to a leg.
    edge: u32,
    /// Bytes of a routed request's data block still to come at `edge`.
    data_left: usize,
    /// Where the bytes from `edge` on go, when not to the open leg: a leg still opening, or
    /// a hand-over waiting for acknowledgements.
    next: Option<Target>,
    /// Client bytes from `edge` on, held for the next leg; with a FIN after them.
    held: Vec<u8>,
    held_fin: bool,
    since: Instant,
    /// The client's highest acknowledgement (its view) and last window.
    client_acked: u32,
    client_window: u16,
    seen: Instant,
    closed: Option<Instant>,
    fins: u8,
}

/// The splice's flows and the key its cookies are made with.
pub(crate) struct Splice {
    key: (u64, u64),
    flows: HashMap<(Ipv4Addr, u16), Flow>,
    max_flows: usize,
}

impl Splice {
    pub(crate) fn new(seed: u64, max_flows: usize) -> Splice {
        let mut s = seed ^ 0x7463_705f_636f_6f6b;
        Splice {
            key: (splitmix64(&mut s), splitmix64(&mut s)),
            flows: HashMap::new(),
            max_flows,
        }
    }

    pub(crate) fn flows(&self) -> usize {
        self.flows.len()
    }

    fn cookie(&self, client: (Ipv4Addr, u16), isn: u32, period: u64, low: u8) -> u32 {
        let h = wire::siphash::siphash24(
            self.key.0,
            self.key.1,
            &[
                &client.0.octets(),
                &client.1.to_be_bytes(),
                &isn.to_be_bytes(),
                &period.to_be_bytes(),
                &[low],
            ],
        );
        ((h as u32) << 8) | u32::from(low)
    }

    /// A cookie for a SYN at `now`: its low byte holds the period's last two bits, the MSS's
    /// index and the client's window scale (15: none).
    fn make(
        &self,
        client: (Ipv4Addr, u16),
        isn: u32,
        mss: u16,
        ws: Option<u8>,
        now: Instant,
    ) -> u32 {
        let period = now.as_nanos() / COOKIE_PERIOD_NS;
        let mss_index = MSS_TABLE.iter().rposition(|&m| m <= mss).unwrap_or(0) as u8;
        let low = ((period & 3) as u8) << 6 | mss_index << 4 | ws.map_or(15, |w| w.min(14));
        self.cookie(client, isn, period, low)
    }

    /// The MSS and window scale a valid cookie carries.
    fn check(
        &self,
        client: (Ipv4Addr, u16),
        isn: u32,
        cookie: u32,
        now: Instant,
    ) -> Option<(u16, Option<u8>)> {
        let low = cookie as u8;
        let period = now.as_nanos() / COOKIE_PERIOD_NS;
        let valid = [period, period.wrapping_sub(1)]
            .into_iter()
            .filter(|p| (p & 3) as u8 == low >> 6)
            .any(|p| self.cookie(client, isn, p, low) == cookie);
        valid.then(|| {
            let mss = MSS_TABLE[usize::from((low >> 4) & 3)];
            let ws = match low & 15 {
                15 => None,
                w => Some(w),
            };
            (mss, ws)
        })
    }
}

impl Switch {
    /// Handles a TCP segment the pipeline sends on, when it goes to the VIP's memcached port
    /// or comes from a flow's target to its client (the parser stage has checked the sources
    /// of frames to the VIP). `None`: not the splice's; the pipeline's verdict stands.
    pub(super) fn splice_segment(
        &mut self,
        in_port: u16,
        frame: &mut [u8],
        emit: &mut Vec<Emit>,
    ) -> Option<Fate> {
        self.splice.as_ref()?;
        let seg = Segment::parse(frame).ok()?;
        let now = self.now.unwrap_or(Instant::ZERO);
        let vip = (self.spec.vip.ip, self.spec.vip.port);
        if (seg.dst_ip(), seg.dst_port()) == vip && Some(in_port) != self.local {
            if !seg.verify_checksum() {
                self.stats.count_drop(Drop::BadTcpChecksum);
                return Some(Fate::Consumed);
            }
            return Some(self.on_client(in_port, frame, now, emit));
        }
        let client = (seg.dst_ip(), seg.dst_port());
        let flow = self.splice.as_ref()?.flows.get(&client)?;
        let leg = flow.leg.as_ref()?;
        let from_leg = (seg.src_ip(), seg.src_port()) == (leg.ip, leg.port)
            && (Some(in_port) == self.local) == (leg.target == Target::Host)
            && (leg.target == Target::Host || seg.src_mac() == leg.mac);
        if !from_leg {
            // An earlier leg's target (its answer to the reset), or a stranger: not the client's.
            let old = (seg.src_ip(), seg.src_port()) == vip
                || self.backend_by_ip.contains_key(&seg.src_ip());
            if old {
                self.stats.count_drop(Drop::TcpStale);
                return Some(Fate::Consumed);
            }
            return None;
        }
        if !seg.verify_checksum() {
            self.stats.count_drop(Drop::BadTcpChecksum);
            return Some(Fate::Consumed);
        }
        Some(self.on_target(client, frame, now, emit))
    }

    fn on_client(
        &mut self,
        in_port: u16,
        frame: &mut [u8],
        now: Instant,
        emit: &mut Vec<Emit>,
    ) -> Fate {
        let Ok(seg) = Segment::parse(frame) else {
            return Fate::Consumed;
        };
        let client = (seg.src_ip(), seg.src_port());
        let Some(splice) = self.splice.as_mut() else {
            return Fate::Consumed;
        };
        if seg.has(flag::SYN) {
            if seg.has(flag::ACK) || seg.has(flag::RST) {
                self.stats.count_drop(Drop::TcpUnexpected);
                return Fate::Consumed;
            }
            // Answered from the cookie alone, even for a flow the switch holds: a client that
            // lost our SYN-ACK, or one that reuses its port, starts again the same way.
            let o = seg.options();
            let mss = o.mss.unwrap_or(536);
            let cookie = splice.make(client, seg.seq(), mss, o.wscale, now);
            let syn_ack = tcp::Repr {
                src_port: self.spec.vip.port,
                dst_port: client.1,
                seq: cookie,
                ack: seg.seq().wrapping_add(1),
                flags: flag::SYN | flag::ACK,
                window: u16::MAX,
                mss: Some(OUR_MSS),
                wscale: o.wscale.map(|_| OUR_WSCALE),
            };
            let ends = tcp::Ends {
                src_mac: self.spec.vip.mac,
                dst_mac: seg.src_mac(),
                src_ip: self.spec.vip.ip,
                dst_ip: client.0,
            };
            stats::inc(&self.stats.tcp_syn_cookies);
            emit.push(Emit {
                dest: Dest::Port(in_port),
                frame: syn_ack.frame(&ends, &[]),
            });
            return Fate::Consumed;
        }
        let known = splice.flows.contains_key(&client);
        if !known {
            if seg.has(flag::RST) {
                return Fate::Consumed;
            }
            let isn = seg.seq().wrapping_sub(1);
            let cookie = seg.ack().wrapping_sub(1);
            let Some((mss, wscale)) = seg
                .has(flag::ACK)
                .then(|| splice.check(client, isn, cookie, now))
                .flatten()
            else {
                self.stats.count_drop(Drop::TcpBadCookie);
                self.reset_client(in_port, &seg, emit);
                return Fate::Consumed;
            };
            if splice.flows.len() >= splice.max_flows {
                self.stats.count_drop(Drop::TcpFlowsFull);
                self.reset_client(in_port, &seg, emit);
                return Fate::Consumed;
            }
            splice.flows.insert(
                client,
                Flow {
                    mac: seg.src_mac(),
                    port: in_port,
                    cookie,
                    mss,
                    wscale,
                    leg: None,
                    edge: isn.wrapping_add(1),
                    data_left: 0,
                    next: None,
                    held: Vec::new(),
                    held_fin: false,
                    since: now,
                    client_acked: cookie.wrapping_add(1),
                    client_window: seg.window(),
                    seen: now,
                    closed: None,
                    fins: 0,
                },
            );
            self.count_flows();
        }
        let Some(mut flow) = self.splice.as_mut().and_then(|s| s.flows.remove(&client)) else {
            return Fate::Consumed;
        };
        if flow.port != in_port || flow.mac != seg.src_mac() {
            // Another host in the client's name: the source check, when on, stopped it before.
            self.splice_put(client, flow);
            self.stats.count_drop(Drop::TcpStale);
            return Fate::Consumed;
        }
        flow.seen = now;
        let fate = self.client_segment(client, &mut flow, frame, now, emit);
        self.splice_put(client, flow);
        fate
    }

    fn splice_put(&mut self, client: (Ipv4Addr, u16), flow: Flow) {
        if let Some(s) = self.splice.as_mut() {
            s.flows.insert(client, flow);
        }
    }

    /// A segment from the client of a known flow.
    fn client_segment(
        &mut self,
        client: (Ipv4Addr, u16),
        flow: &mut Flow,
        frame: &mut [u8],
        now: Instant,
        emit: &mut Vec<Emit>,
    ) -> Fate {
        let Ok(seg) = Segment::parse(frame) else {
            return Fate::Consumed;
        };
        if seg.has(flag::ACK) && !tcp::before(seg.ack(), flow.client_acked) {
            flow.client_acked = seg.ack();
        }
        flow.client_window = seg.window();
        let open = flow.leg.as_ref().filter(|l| l.isn.is_some()).is_some();
        if seg.has(flag::RST) {
            flow.closed = Some(now);
            flow.next = None;
            return match (&flow.leg, open) {
                (Some(leg), true) => self.to_target(flow, leg, frame),
                _ => Fate::Consumed,
            };
        }
        let payload = seg.payload();
        let (seq, fin) = (seg.seq(), seg.has(flag::FIN));
        let holding = flow.next.is_some() || flow.leg.is_none();
        // The first byte the switch has not taken: past the edge, the bytes it holds.
        let expected = match holding {
            true => flow.edge.wrapping_add(flow.held.len() as u32),
            false => flow.edge,
        };
        if (!payload.is_empty() || fin) && tcp::before(expected, seq) {
            // Past a gap: the switch reads the stream in order, so the client sends it again.
            self.stats.count_drop(Drop::TcpOutOfOrder);
            return Fate::Consumed;
        }
        // Bytes before `new_at` were given to a leg already; the rest are new.
        let new_at = (flow.edge.wrapping_sub(seq) as usize).min(payload.len());
        let new = &payload[new_at..];
        let brings_fin = fin && !tcp::before(seq.wrapping_add(payload.len() as u32), flow.edge);
        if holding {
            // Everything from the edge on waits for the next leg.
            let at = flow.edge.wrapping_add(flow.held.len() as u32);
            let skip = at.wrapping_sub(seq) as usize;
            if !tcp::before(at, seq) && skip <= payload.len() {
                let more = &payload[skip..];
                if flow.held.len() + more.len() <= HELD_MAX {
                    flow.held.extend_from_slice(more);
                    flow.held_fin |= brings_fin;
                } else {
                    self.stats.count_drop(Drop::TcpHeldFull);
                }
            }
            if flow.leg.is_none() && flow.next.is_none() && !flow.held.is_empty() {
                flow.next = Some(self.route_first(&flow.held));
            }
            // What the open leg may still take: bytes it lacks, the client's acknowledgements.
            let out = match (&flow.leg, open) {
                (Some(leg), true) => self.cut_to_target(flow, leg, frame, new_at, emit),
                _ => Fate::Consumed,
            };
            self.advance(client, flow, now, emit);
            return out;
        }
        let Some(mut leg) = flow.leg.take() else {
            return Fate::Consumed;
        };
        let new = new.to_vec();
        let (end, switch) = self.scan(flow, &mut leg, &new);
        flow.leg = Some(leg);
        flow.edge = flow.edge.wrapping_add(end as u32);
        let keep = new_at + end;
        let whole = keep == payload.len();
        if let Some(to) = switch {
            flow.next = Some(to);
            flow.since = now;
            flow.held = new[end..].to_vec();
            flow.held_fin = brings_fin;
        } else if !whole {
            // A line cut by the segment's end: none of it leaves until all of it is here.
            self.stats.count_drop(Drop::TcpLineCut);
        }
        let out = match &flow.leg {
            Some(leg) => self.cut_to_target(flow, leg, frame, keep, emit),
            None => Fate::Consumed,
        };
        if whole && brings_fin && switch.is_none() {
            self.note_fin(flow, 1, now);
        }
        if switch.is_some() {
            self.advance(client, flow, now, emit);
        }
        out
    }

    /// Sends the first `keep` payload bytes of a client's segment to its leg: in place when
    /// that is all of them, else as a copy cut short, without its FIN.
    fn cut_to_target(
        &self,
        flow: &Flow,
        leg: &Leg,
        frame: &mut [u8],
        keep: usize,
        emit: &mut Vec<Emit>,
    ) -> Fate {
        let whole = Segment::parse(frame).is_ok_and(|s| s.payload().len() <= keep);
        if whole {
            return self.to_target(flow, leg, frame);
        }
        let mut cut = frame.to_vec();
        if let Some(mut r) = tcp::Rewrite::new(&mut cut) {
            let len = r.cut_payload(keep);
            r.clear_flags(flag::FIN);
            cut.truncate(len);
        }
        if let Fate::Out(p) = self.to_target(flow, leg, &mut cut) {
            emit.push(Emit {
                dest: Dest::Port(p),
                frame: cut,
            });
        }
        Fate::Consumed
    }

    /// Records a FIN from the client (bit 1) or the target (bit 2).
    fn note_fin(&self, flow: &mut Flow, side: u8, now: Instant) {
        flow.fins |= side;
        if flow.fins == 3 && flow.closed.is_none() {
            flow.closed = Some(now);
        }
    }

    /// Where a flow's first request goes (the host when its line is not all here yet: the
    /// proxy reads it as it comes).
    fn route_first(&self, bytes: &[u8]) -> Target {
        self.request_target(bytes)
            .map_or(Target::Host, |(_, t, _)| t)
    }

    /// The request at the front of `bytes`: its length, data block included, where it goes,
    /// and the kind of its reply. `None` while its line has not all arrived.
    fn request_target(&self, bytes: &[u8]) -> Option<(usize, Target, ReplyKind)> {
        let host = |len| Some((len, Target::Host, ReplyKind::Line));
        if bytes.first() == Some(&memcache::binary::REQUEST_MAGIC) {
            return host(bytes.len());
        }
        let request = match memcache::parse_text_head(bytes) {
            Ok(Some(r)) => r,
            Ok(None) => return None,
            // memcached's exact answer, and what follows it, are the proxy's.
            Err(_) => return host(bytes.len()),
        };
        let command = request.command;
        let kind = ReplyKind::of(&request);
        // One key, and a reply that always comes (quiet and noreply requests are answered only
        // when they fail, so where their replies end cannot be known).
        let spliceable = request.key_count() == 1
            && command.has_key()
            && !request.noreply()
            && matches!(
                kind,
                ReplyKind::Retrieval | ReplyKind::Line | ReplyKind::Meta
            );
        let to = match request.key() {
            Some(key) if spliceable => {
                let write = command.is_write();
                let hash = self.view.key_hash(key);
                let server = if write {
                    self.view.locate_hash(hash)
                } else {
                    self.view.read_locate_hash(hash)
                };
                // A replicated write goes to every replica, and the cache must see every
                // write before it leaves: both are the proxy's.
                let proxy_writes = self.view.replicas() > 1 || self.cache.is_some();
                match server {
                    Some(i) if !(write && proxy_writes) => Target::Server(i),
                    _ => Target::Host,
                }
            }
            _ => Target::Host,
        };
        Some((request.len, to, kind))
    }

    /// Reads client bytes that follow a flow's edge, for its leg to `target`: how many go
    /// there, and where the request after them goes when not there. Fewer than all and no
    /// other target: a line cut by the end of `bytes`.
    fn scan(&self, flow: &mut Flow, leg: &mut Leg, bytes: &[u8]) -> (usize, Option<Target>) {
        let target = leg.target;
        let mut at = 0;
        while at < bytes.len() {
            if flow.data_left > 0 {
                let take = flow.data_left.min(bytes.len() - at);
                flow.data_left -= take;
                at += take;
                continue;
            }
            if target == Target::Host {
                return (bytes.len(), None);
            }
            let rest = &bytes[at..];
            if rest.first() == Some(&b'q') {
                // `quit` goes to whoever holds the connection, which closes it unanswered.
                if let Ok(Some(r)) = memcache::parse_text_head(rest) {
                    if r.command == Command::Quit {
                        at += r.len.min(rest.len());
                        continue;
                    }
                }
            }
            match self.request_target(rest) {
                Some((len, to, kind)) if to == target => {
                    if let Target::Server(i) = target {
                        self.stats.backend_request(i);
                        stats::inc(&self.stats.tcp_requests);
                    }
                    leg.replies.expect(kind);
                    let take = len.min(rest.len());
                    flow.data_left = len - take;
                    at += take;
                }
                // Another server's, several, or none: the rest of the connection is the
                // proxy's (a connection that moved once is likely to move again).
                Some(_) => return (at, Some(Target::Host)),
                None => return (at, None),
            }
        }
        (at, None)
    }

    /// Moves a flow on: opens its next leg once the last one is done with, sends the held bytes
    /// once the new leg is open.
    fn advance(
        &mut self,
        client: (Ipv4Addr, u16),
        flow: &mut Flow,
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        let Some(to) = flow.next else {
            return;
        };
        if let Some(leg) = flow
            .leg
            .as_mut()
            .filter(|l| l.target == to && l.isn.is_none())
        {
            if now.saturating_duration_since(leg.syn_at) >= SYN_RETRY {
                leg.syn_at = now;
                if let Some(syn) = self.leg_syn(client, flow) {
                    emit.push(syn);
                }
            }
            return;
        }
        if let Some(leg) = &flow.leg {
            // Handing over: the old target must have every byte before the edge, and the client
            // every reply.
            let done = leg.replies.settled()
                && !tcp::before(leg.acked, flow.edge)
                && !tcp::before(flow.client_acked, leg.sent);
            if leg.replies.lost {
                self.stats.count_drop(Drop::TcpRepliesLost);
                self.abort_flow(client, flow, now, emit);
                return;
            }
            if !done {
                if now.saturating_duration_since(flow.since) > SWITCH_WAIT {
                    self.stats.count_drop(Drop::TcpHandOverTimeout);
                    self.abort_flow(client, flow, now, emit);
                }
                return;
            }
            // The old connection ends with a reset in the client's name.
            let rst = tcp::Repr {
                src_port: client.1,
                dst_port: leg.port,
                seq: flow.edge,
                ack: 0,
                flags: flag::RST,
                window: 0,
                mss: None,
                wscale: None,
            };
            let ends = tcp::Ends {
                src_mac: flow.mac,
                dst_mac: leg.mac,
                src_ip: client.0,
                dst_ip: leg.ip,
            };
            emit.push(Emit {
                dest: Dest::Port(leg.out),
                frame: rst.frame(&ends, &[]),
            });
            stats::inc(&self.stats.tcp_handed_over);
        } else {
            match to {
                Target::Server(_) => stats::inc(&self.stats.tcp_spliced),
                Target::Host => stats::inc(&self.stats.tcp_proxied),
            }
        }
        let base = match &flow.leg {
            Some(leg) => leg.sent,
            None => flow.cookie.wrapping_add(1),
        };
        let Some((mac, ip, port, out)) = self.target_address(to) else {
            if to != Target::Host {
                // Its server's port is not known yet: the proxy serves this one.
                flow.next = Some(Target::Host);
                return self.advance(client, flow, now, emit);
            }
            self.stats.count_drop(Drop::TcpNoTarget);
            self.abort_flow(client, flow, now, emit);
            return;
        };
        flow.leg = Some(Leg {
            target: to,
            mac,
            ip,
            port,
            out,
            start: flow.edge,
            base,
            isn: None,
            syn_at: now,
            target_shift: 0,
            client_shift: 0,
            acked: flow.edge,
            sent: base,
            replies: Replies::default(),
            read: base,
        });
        if let Some(syn) = self.leg_syn(client, flow) {
            emit.push(syn);
        }
    }

    /// The SYN of a flow's leg, in the client's name.
    fn leg_syn(&self, client: (Ipv4Addr, u16), flow: &Flow) -> Option<Emit> {
        let leg = flow.leg.as_ref()?;
        let syn = tcp::Repr {
            src_port: client.1,
            dst_port: leg.port,
            seq: leg.start.wrapping_sub(1),
            ack: 0,
            flags: flag::SYN,
            window: flow.client_window,
            mss: Some(flow.mss),
            wscale: flow.wscale,
        };
        let ends = tcp::Ends {
            src_mac: flow.mac,
            dst_mac: leg.mac,
            src_ip: client.0,
            dst_ip: leg.ip,
        };
        Some(Emit {
            dest: Dest::Port(leg.out),
            frame: syn.frame(&ends, &[]),
        })
    }

    /// The MAC, address, port and switch port a target is reached at.
    fn target_address(&self, to: Target) -> Option<(Mac, Ipv4Addr, u16, u16)> {
        let vip = (self.spec.vip.ip, self.spec.vip.port);
        match to {
            Target::Host => Some((self.spec.vip.mac, vip.0, vip.1, self.local?)),
            Target::Server(i) => {
                let mac = self.backend_macs.get(i).copied().flatten()?;
                let port = self.macs.get(&mac)?.port;
                let (ip, tcp_port) = match self.spec.mode {
                    Mode::L3 => (
                        *self.spec.servers.get(i)?.addr.ip(),
                        self.spec.servers.get(i)?.addr.port(),
                    ),
                    Mode::L2 => vip,
                };
                Some((mac, ip, tcp_port, port))
            }
        }
    }

    /// Rewrites a client's segment for its leg; the frame leaves from the returned port.
    fn to_target(&self, flow: &Flow, leg: &Leg, frame: &mut [u8]) -> Fate {
        let Ok(seg) = Segment::parse(frame) else {
            return Fate::Consumed;
        };
        let window = if leg.client_shift > 0 {
            (u32::from(seg.window()) << leg.client_shift).min(u32::from(u16::MAX)) as u16
        } else {
            seg.window()
        };
        let ack = seg.ack().wrapping_sub(leg.delta());
        let has_ack = seg.has(flag::ACK);
        let Some(mut r) = tcp::Rewrite::new(frame) else {
            return Fate::Consumed;
        };
        r.macs(flow.mac, leg.mac)
            .dst(leg.ip, leg.port)
            .window(window);
        if has_ack {
            r.ack(ack);
        }
        r.finish();
        Fate::Out(leg.out)
    }

    /// A segment from a flow's target to its client.
    fn on_target(
        &mut self,
        client: (Ipv4Addr, u16),
        frame: &mut [u8],
        now: Instant,
        emit: &mut Vec<Emit>,
    ) -> Fate {
        let Some(mut flow) = self.splice.as_mut().and_then(|s| s.flows.remove(&client)) else {
            return Fate::Consumed;
        };
        let fate = self.target_segment(client, &mut flow, frame, now, emit);
        self.splice_put(client, flow);
        fate
    }

    fn target_segment(
        &mut self,
        client: (Ipv4Addr, u16),
        flow: &mut Flow,
        frame: &mut [u8],
        now: Instant,
        emit: &mut Vec<Emit>,
    ) -> Fate {
        let Ok(seg) = Segment::parse(frame) else {
            return Fate::Consumed;
        };
        let Some(mut leg) = flow.leg.take() else {
            return Fate::Consumed;
        };
        flow.seen = now;
        if seg.has(flag::SYN) {
            let answers = seg.has(flag::ACK) && seg.ack() == leg.start && !seg.has(flag::RST);
            if !answers || leg.isn.is_some_and(|i| i != seg.seq()) {
                flow.leg = Some(leg);
                self.stats.count_drop(Drop::TcpUnexpected);
                return Fate::Consumed;
            }
            let first = leg.isn.is_none();
            leg.isn = Some(seg.seq());
            let o = seg.options();
            match (flow.wscale, o.wscale) {
                (Some(_), Some(t)) => {
                    leg.target_shift = t;
                    leg.client_shift = 0;
                }
                (Some(c), None) => {
                    leg.target_shift = 0;
                    leg.client_shift = c;
                }
                (None, _) => {
                    leg.target_shift = 0;
                    leg.client_shift = 0;
                }
            }
            leg.acked = leg.start;
            // The handshake's last ACK, in the client's name.
            let ack = tcp::Repr {
                src_port: client.1,
                dst_port: leg.port,
                seq: leg.start,
                ack: seg.seq().wrapping_add(1),
                flags: flag::ACK,
                window: flow.client_window,
                mss: None,
                wscale: None,
            };
            let ends = tcp::Ends {
                src_mac: flow.mac,
                dst_mac: leg.mac,
                src_ip: client.0,
                dst_ip: leg.ip,
            };
            emit.push(Emit {
                dest: Dest::Port(leg.out),
                frame: ack.frame(&ends, &[]),
            });
            if first {
                flow.leg = Some(leg);
                flow.next = None;
                self.send_held(client, flow, now, emit);
            } else {
                flow.leg = Some(leg);
            }
            return Fate::Consumed;
        }
        if leg.isn.is_none() {
            flow.leg = Some(leg);
            if seg.has(flag::RST) {
                // The target refused: the client learns it as the proxy would tell it.
                self.stats.count_drop(Drop::TcpNoTarget);
                self.abort_flow(client, flow, now, emit);
            }
            return Fate::Consumed;
        }
        let delta = leg.delta();
        let seq = seg.seq().wrapping_add(delta);
        let end = seq.wrapping_add(seg.seq_len());
        let payload = seg.payload();
        if !payload.is_empty() {
            if tcp::before(leg.read, seq) {
                // Past a gap in the replies: they are read in order, and the target sends
                // these again.
                flow.leg = Some(leg);
                self.stats.count_drop(Drop::TcpOutOfOrder);
                return Fate::Consumed;
            }
            let skip = leg.read.wrapping_sub(seq) as usize;
            if let Some(new) = payload.get(skip..).filter(|n| !n.is_empty()) {
                leg.replies.feed(new);
                leg.read = leg.read.wrapping_add(new.len() as u32);
            }
        }
        if tcp::before(leg.sent, end) {
            leg.sent = end;
        }
        if seg.has(flag::ACK) && tcp::before(leg.acked, seg.ack()) {
            leg.acked = seg.ack();
        }
        let our_shift = flow.wscale.map_or(0, |_| OUR_WSCALE);
        let real = u32::from(seg.window()) << leg.target_shift;
        let window = (real >> our_shift).min(u32::from(u16::MAX)) as u16;
        let (rst, fin) = (seg.has(flag::RST), seg.has(flag::FIN));
        let Some(mut r) = tcp::Rewrite::new(frame) else {
            flow.leg = Some(leg);
            return Fate::Consumed;
        };
        r.macs(self.spec.vip.mac, flow.mac)
            .src(self.spec.vip.ip, self.spec.vip.port)
            .seq(seq)
            .window(window);
        r.finish();
        flow.leg = Some(leg);
        if rst {
            flow.closed = Some(now);
        } else if fin && flow.fins & 2 == 0 {
            flow.fins |= 2;
            if flow.fins == 3 {
                flow.closed = Some(now);
            }
        }
        if flow.next.is_some() {
            // A hand-over may be waiting for this acknowledgement; the reply goes first.
            let out = Emit {
                dest: Dest::Port(flow.port),
                frame: frame.to_vec(),
            };
            emit.push(out);
            self.advance(client, flow, now, emit);
            return Fate::Consumed;
        }
        Fate::Out(flow.port)
    }

    /// Sends the bytes a flow held to its new leg, in segments of the client's MSS, read as
    /// they would have been had they come now.
    fn send_held(
        &mut self,
        client: (Ipv4Addr, u16),
        flow: &mut Flow,
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        let held = std::mem::take(&mut flow.held);
        let fin = std::mem::replace(&mut flow.held_fin, false);
        let Some(mut leg) = flow.leg.take() else {
            return;
        };
        let (fits, switch) = self.scan(flow, &mut leg, &held);
        let mss = usize::from(flow.mss).max(1);
        let ends = tcp::Ends {
            src_mac: flow.mac,
            dst_mac: leg.mac,
            src_ip: client.0,
            dst_ip: leg.ip,
        };
        let ack = flow.client_acked.wrapping_sub(leg.delta());
        let mut at = 0;
        loop {
            let end = (at + mss).min(fits);
            let last = end == fits;
            let with_fin = last && fin && switch.is_none() && fits == held.len();
            if end == at && !with_fin {
                break;
            }
            let flags =
                flag::ACK | if last { flag::PSH } else { 0 } | if with_fin { flag::FIN } else { 0 };
            let seg = tcp::Repr {
                src_port: client.1,
                dst_port: leg.port,
                seq: flow.edge.wrapping_add(at as u32),
                ack,
                flags,
                window: flow.client_window,
                mss: None,
                wscale: None,
            };
            emit.push(Emit {
                dest: Dest::Port(leg.out),
                frame: seg.frame(&ends, &held[at..end]),
            });
            if with_fin {
                self.note_fin(flow, 1, now);
            }
            at = end;
            if last {
                break;
            }
        }
        flow.edge = flow.edge.wrapping_add(fits as u32);
        flow.leg = Some(leg);
        match switch {
            Some(to) => {
                flow.next = Some(to);
                flow.since = now;
                flow.held = held[fits..].to_vec();
                flow.held_fin = fin;
                self.advance(client, flow, now, emit);
            }
            None if fits < held.len() => {
                // A line the client has not finished: it sends it again, whole.
                self.stats.count_drop(Drop::TcpLineCut);
            }
            None => {}
        }
    }

    /// Ends a flow the switch cannot carry on: the client gets a reset (it reconnects), the
    /// target one too.
    fn abort_flow(
        &mut self,
        client: (Ipv4Addr, u16),
        flow: &mut Flow,
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        let seq = flow
            .leg
            .as_ref()
            .map_or(flow.cookie.wrapping_add(1), |l| l.sent);
        let rst = tcp::Repr {
            src_port: self.spec.vip.port,
            dst_port: client.1,
            seq,
            ack: 0,
            flags: flag::RST,
            window: 0,
            mss: None,
            wscale: None,
        };
        let ends = tcp::Ends {
            src_mac: self.spec.vip.mac,
            dst_mac: flow.mac,
            src_ip: self.spec.vip.ip,
            dst_ip: client.0,
        };
        emit.push(Emit {
            dest: Dest::Port(flow.port),
            frame: rst.frame(&ends, &[]),
        });
        if let Some(leg) = &flow.leg {
            let rst = tcp::Repr {
                src_port: client.1,
                dst_port: leg.port,
                seq: flow.edge,
                ..rst
            };
            let ends = tcp::Ends {
                src_mac: flow.mac,
                dst_mac: leg.mac,
                src_ip: client.0,
                dst_ip: leg.ip,
            };
            emit.push(Emit {
                dest: Dest::Port(leg.out),
                frame: rst.frame(&ends, &[]),
            });
        }
        flow.next = None;
        flow.closed = Some(now);
    }

    /// A reset for a segment to the VIP's port that belongs to no connection (RFC 9293: its
    /// sequence number is the segment's acknowledgement).
    fn reset_client(&self, in_port: u16, seg: &Segment<'_>, emit: &mut Vec<Emit>) {
        let (seq, ack, flags) = if seg.has(flag::ACK) {
            (seg.ack(), 0, flag::RST)
        } else {
            (
                0,
                seg.seq().wrapping_add(seg.seq_len()),
                flag::RST | flag::ACK,
            )
        };
        let rst = tcp::Repr {
            src_port: self.spec.vip.port,
            dst_port: seg.src_port(),
            seq,
            ack,
            flags,
            window: 0,
            mss: None,
            wscale: None,
        };
        let ends = tcp::Ends {
            src_mac: self.spec.vip.mac,
            dst_mac: seg.src_mac(),
            src_ip: self.spec.vip.ip,
            dst_ip: seg.src_ip(),
        };
        emit.push(Emit {
            dest: Dest::Port(in_port),
            frame: rst.frame(&ends, &[]),
        });
    }

    /// Forgets closed flows after their linger, flows that never carried a request after
    /// [`IDLE_OPEN`], and moves waiting hand-overs on.
    pub(super) fn age_splice(&mut self, now: Instant, emit: &mut Vec<Emit>) {
        let Some(splice) = self.splice.as_mut() else {
            return;
        };
        let waiting: Vec<(Ipv4Addr, u16)> = splice
            .flows
            .iter()
            .filter(|(_, f)| f.next.is_some() && f.closed.is_none())
            .map(|(c, _)| *c)
            .collect();
        splice.flows.retain(|_, f| match f.closed {
            Some(at) => now.saturating_duration_since(at) < LINGER,
            None => {
                f.leg.is_some()
                    || f.next.is_some()
                    || now.saturating_duration_since(f.seen) < IDLE_OPEN
            }
        });
        for client in waiting {
            if let Some(mut flow) = self.splice.as_mut().and_then(|s| s.flows.remove(&client)) {
                self.advance(client, &mut flow, now, emit);
                self.splice_put(client, flow);
            }
        }
        self.count_flows();
    }

    fn count_flows(&self) {
        if let Some(s) = &self.splice {
            self.stats
                .tcp_flows
                .store(s.flows() as u64, std::sync::atomic::Ordering::Relaxed);
        }
    }
}
