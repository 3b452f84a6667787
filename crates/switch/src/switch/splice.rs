//! The TCP splice: a connection to the VIP's memcached port routed by key in the switch, with no
//! trip through the host's stack (docs/tcp.md).
//!
//! The switch answers the client's SYN itself with a SYN cookie (nothing is kept per SYN). The
//! cookie's ACK, or the first request that carries it, opens a flow. The switch reads the
//! client's byte stream request by request and gives each request to a *leg*: a connection of
//! its own, opened in the client's name, to the request's server (or to the host's stack on
//! the local port, where the proxy answers what no one server can). One leg is *active* at a
//! time: a request for another leg waits until every reply the active one owes has come, so
//! the replies reach the client in request order, one leg's run after another's. The switch
//! keeps the runs it placed in both directions: which client bytes went to which leg at which
//! of its sequence numbers, and where each run of a leg's reply bytes lies in the client's
//! stream. With them it moves every sequence and acknowledgement number between the client's
//! space and each leg's, so the client sees one connection and each server a client of its
//! own. The switch acknowledges nothing that has not been acknowledged to it: the client's
//! bytes are acknowledged once their legs have them, a leg's replies once the client has them,
//! and every loss is repaired by the sender's own retransmission. A request whose reply has no
//! end the switch can find (a quiet or `noreply` one, binary, anything malformed) makes the
//! host's leg active for the rest of the connection.
//!
//! A Redis pool's VIP port is spliced the same way, command by command: a command whose keys
//! all lie on one server goes to that server, everything else to the proxy, and each reply is
//! one RESP value, framed as it streams by.

use std::collections::VecDeque;

use wire::memcache::reply::ReplyKind;
use wire::resp::commands::{self as redis, Class};
use wire::resp::{self, RequestParser, Step};
use wire::tcp::{self, flag, Segment};

use super::*;
use crate::fastpath::{ClientSide, LegHandOver, LegKey, LegOffload, LegSent};

/// The window scale the switch announces to clients that offer one.
const OUR_WSCALE: u8 = 7;
/// The MSS the switch announces to clients: what the servers and the host take on a
/// 1500-byte network.
const OUR_MSS: u16 = 1460;
/// The MSS values a cookie can carry, smallest first.
const MSS_TABLE: [u16; 4] = [536, 1220, 1440, 1460];
/// A cookie's life: it carries the 64-second period it was made in, and the one before still
/// counts.
const COOKIE_PERIOD_NS: u64 = 64_000_000_000;
/// A flow that never carried a request is forgotten after this long without a segment.
const IDLE_OPEN: Duration = Duration::from_secs(120);
/// A flow is kept this long after both FINs (or a reset), for retransmissions.
const LINGER: Duration = Duration::from_secs(5);
/// Client bytes a flow holds before they go to a leg (a request waiting for the active leg's
/// replies, or for its own leg to open); more are dropped, and the client sends them again.
const HELD_MAX: usize = 64 * 1024;
/// The longest a request waits for a leg: the active one's replies, or its own handshake.
const HOLD_WAIT: Duration = Duration::from_secs(10);
/// How often a SYN to a leg that has not answered is sent again (while the client retransmits
/// or the switch ticks).
const SYN_RETRY: Duration = Duration::from_millis(200);
/// One client address may hold at most this share of `switch.tcp_max_flows` (a quarter): a
/// host that opens connections without end keeps others out of only part of the table.
const PER_ADDRESS_SHARE: usize = 4;
/// How often flows are aged while there are any: a fraction of [`SYN_RETRY`].
const AGE_EVERY: Duration = Duration::from_millis(100);
/// Keepalive probes a silent client is sent before its connection is reset and forgotten.
const PROBES: u8 = 3;
/// The wait between two keepalive probes: a quarter of the idle time, within these bounds (a
/// Linux client answers a probe below its window at most every 500 ms).
const PROBE_EVERY_MIN: Duration = Duration::from_secs(1);
const PROBE_EVERY_MAX: Duration = Duration::from_secs(30);
/// The longest a leg the client left waits for the acknowledgement the switch holds back
/// (`Switch::ack_legs`): well within a server's first retransmission, even one whose
/// minimum timeout was lowered.
const ACK_HOLD: Duration = Duration::from_millis(5);
/// Legs one flow may have: one per server and the host's.
const MAX_LEGS: usize = 64;
/// The ports legs are opened from, with the client's address: outside Linux's ephemeral range,
/// so that a fast path can tell a leg's segments (to these ports) from a client's own
/// connections to a server, which it switches itself.
pub(crate) const FIRST_LEG_PORT: u16 = 61_000;
/// How long a leg's SYN may go unanswered before its server counts as failed for the flow,
/// whose requests for it then go to the proxy (which answers as the pool's failure settings
/// say, and ejects the server).
const LEG_OPEN_WAIT: Duration = Duration::from_secs(1);

/// The longest RESP reply line read (a simple string or an error: a script's error can be
/// long); past it the replies cannot be placed, and the flow is reset at its next leg change.
const RESP_LINE_MAX: usize = 1 << 20;
/// The deepest nesting of RESP arrays read (a script's reply may nest as deep as Lua lets it).
const RESP_DEPTH_MAX: usize = 1024;
/// A Redis command is routed once it is all held; one still incomplete past this many bytes
/// (a large value) makes the host's leg take the rest of the connection, since the switch
/// holds at most [`HELD_MAX`] bytes of a client's.
const RESP_WHOLE_MAX: usize = 16 * 1024;

/// What the VIP's TCP port speaks: the pool's protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Speaks {
    Memcached,
    /// `host_only`: the pool has a password or a database other than 0, which the proxy gives
    /// the servers and asks of clients: every connection is the proxy's.
    Redis {
        host_only: bool,
    },
}

/// What a pool's servers speak.
pub(super) fn speaks(pool: &Pool) -> Speaks {
    match &pool.spec().redis {
        None => Speaks::Memcached,
        Some(r) => Speaks::Redis {
            host_only: r.auth.is_some() || r.db != 0 || r.cluster,
        },
    }
}

/// The reply a request is owed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Owes {
    Memcache(ReplyKind),
    /// One RESP value.
    Resp,
    /// No reply at all (an empty Redis command).
    Nothing,
}

/// Where a request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Target {
    Server(usize),
    /// The host's stack on the local port, where the proxy listens on the VIP's port.
    Host,
}

/// The switch's connection to one target, made in the client's name.
#[derive(Debug)]
struct Leg {
    target: Target,
    /// The port the leg is opened from, with the client's address.
    sport: u16,
    mac: Mac,
    ip: Ipv4Addr,
    port: u16,
    /// The switch port the target is on.
    out: u16,
    /// The switch's initial sequence number on this leg (the client's side of it).
    isn: u32,
    /// The target's, once its SYN-ACK came.
    their_isn: Option<u32>,
    /// When the leg was opened, and its SYN last sent.
    born: Instant,
    syn_at: Instant,
    /// The MSS the target takes.
    mss: u16,
    /// The shift of the target's windows, and, when it did not take the client's window scale,
    /// the client's: its windows are shifted back by it before they go to the target, which
    /// reads them unscaled.
    target_shift: u8,
    client_shift: u8,
    /// The leg's sequence number for the next client byte it gets.
    next: u32,
    /// The highest acknowledgement the target sent (the leg's client-side space).
    acked: u32,
    /// The next target byte to read (the target's space): replies are read in order.
    read: u32,
    replies: Replies,
    /// The highest acknowledgement the switch sent the target.
    acked_to: u32,
    /// An acknowledgement the switch owes the target and holds back (`Switch::ack_legs`):
    /// sent with the leg's next segment, or [`ACK_HOLD`] after the first one held.
    ack_due: Option<u32>,
    /// The target closed its side.
    fin: bool,
    /// The switch reset the leg and let it go: whatever its target still sends is answered
    /// with a reset.
    gone: bool,
    /// A fast path holds the leg: it sends the target's replies on to the client itself
    /// until the switch takes the leg back ([`LegOffload`]).
    handed: bool,
}

impl Leg {
    /// Whether the leg was sent the client's FIN and has not acknowledged it yet; a leg its
    /// target closed or reset is not waited for.
    fn owes_fin(&self) -> bool {
        self.their_isn.is_some() && !self.gone && !self.fin && tcp::before(self.acked, self.next)
    }
}

/// A run of bytes one leg carried: `len` bytes from `client` in the client's stream, from `leg`
/// in the leg's. Requests: the client's bytes to a leg; replies: a leg's bytes to the client.
#[derive(Debug, Clone, Copy)]
struct Run {
    leg: usize,
    client: u32,
    leg_seq: u32,
    len: u32,
}

/// Where a target's replies end: the kinds of the replies it owes, in order, and how far into
/// the current one its bytes have come. Only the kinds a spliced request gets are read: a
/// retrieval of one key, one line, a meta reply; or, from a Redis server, RESP2 values.
#[derive(Debug, Default)]
struct Replies {
    owed: VecDeque<ReplyKind>,
    /// RESP values owed (a Redis pool's legs).
    owed_resp: usize,
    /// Elements still to come of each RESP array the current value is inside, outermost first.
    arrays: Vec<usize>,
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
    fn expect(&mut self, owes: Owes) {
        match owes {
            Owes::Memcache(kind) => self.owed.push_back(kind),
            Owes::Resp => self.owed_resp += 1,
            Owes::Nothing => {}
        }
    }

    /// Whether every reply owed has come whole.
    fn settled(&self) -> bool {
        self.owed.is_empty()
            && self.owed_resp == 0
            && self.line.is_empty()
            && self.data == 0
            && !self.lost
    }

    fn feed(&mut self, bytes: &[u8]) {
        if self.owed_resp > 0 || !self.arrays.is_empty() {
            self.feed_resp(bytes);
        } else {
            self.feed_memcache(bytes);
        }
    }

    /// Reads RESP2 values: simple strings, errors and integers are a line, a bulk string a
    /// line and its data, an array a line and its elements.
    fn feed_resp(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() && !self.lost {
            if self.data > 0 {
                let take = self.data.min(bytes.len());
                self.data -= take;
                bytes = &bytes[take..];
                if self.data == 0 {
                    self.resp_value_ends();
                }
                continue;
            }
            if self.owed_resp == 0 {
                self.lost = true;
                return;
            }
            let Some(line) = self.take_line(&mut bytes, RESP_LINE_MAX) else {
                return;
            };
            let Some(body) = line.strip_suffix(b"\r\n") else {
                self.lost = true;
                return;
            };
            let number = || resp::string2ll(&body[1..]);
            match body.first() {
                Some(b'+' | b'-' | b':') => self.resp_value_ends(),
                Some(b'$') => match number() {
                    Some(-1) => self.resp_value_ends(),
                    Some(n) if n >= 0 => self.data = n as usize + 2,
                    _ => self.lost = true,
                },
                Some(b'*') => match number() {
                    Some(-1 | 0) => self.resp_value_ends(),
                    Some(n) if n > 0 && self.arrays.len() < RESP_DEPTH_MAX => {
                        self.arrays.push(n as usize)
                    }
                    _ => self.lost = true,
                },
                // RESP3 types never come on a leg: `HELLO` makes the proxy's leg take the
                // connection.
                _ => self.lost = true,
            }
        }
    }

    /// The line under way, once its `\n` is in `bytes` (taken from them); `None` while it is
    /// not, or once it is longer than `max` (then the replies are lost).
    fn take_line(&mut self, bytes: &mut &[u8], max: usize) -> Option<Vec<u8>> {
        let nl = bytes.iter().position(|&b| b == b'\n');
        let take = nl.map_or(bytes.len(), |i| i + 1);
        self.line.extend_from_slice(&bytes[..take]);
        *bytes = &bytes[take..];
        if self.line.len() > max {
            self.lost = true;
            return None;
        }
        nl.map(|_| std::mem::take(&mut self.line))
    }

    /// A RESP value ended: an element of the array it is in, or a reply.
    fn resp_value_ends(&mut self) {
        while let Some(left) = self.arrays.last_mut() {
            *left -= 1;
            if *left > 0 {
                return;
            }
            self.arrays.pop();
        }
        self.owed_resp = self.owed_resp.saturating_sub(1);
    }

    fn feed_memcache(&mut self, mut bytes: &[u8]) {
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
            let Some(line) = self.take_line(&mut bytes, REPLY_LINE_MAX) else {
                return;
            };
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
                // Lines up to `END`.
                (ReplyKind::Stats, b"STAT" | b"ITEM" | b"PREFIX") => {}
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

#[derive(Debug)]
struct Flow {
    mac: Mac,
    /// The switch port the client is on.
    port: u16,
    mss: u16,
    /// The client's window scale, when it offered one (the switch then announced its own).
    wscale: Option<u8>,
    legs: Vec<Leg>,
    /// The leg requests go to now; every leg but it owes no reply.
    active: Option<usize>,
    /// The host's leg takes every request from now on.
    sticky: bool,
    /// Servers whose leg failed to open: their requests go to the host's leg.
    avoid: Vec<usize>,
    /// The client's sequence number of the first byte not yet given to a leg.
    edge: u32,
    /// Bytes of a request's data block still to come, for the active leg.
    data_left: usize,
    /// Bulk arguments of a Redis command still to come, for the active leg (streamed as
    /// they arrive, as a data block is).
    resp_left: usize,
    /// Client bytes from `edge` on, not yet given to a leg; a FIN after them.
    held: Vec<u8>,
    held_fin: bool,
    /// When the bytes at the front of `held` started to wait.
    since: Instant,
    /// Requests and replies placed, oldest first, kept until acknowledged.
    requests: VecDeque<Run>,
    replies: VecDeque<Run>,
    /// The client-side sequence number of the next reply byte: where the active leg's run
    /// goes on.
    out: u32,
    /// The highest byte (and FIN) sent to the client, plus one.
    sent: u32,
    /// The client's highest acknowledgement and last window.
    client_acked: u32,
    client_window: u16,
    /// The window the client was last told, and the acknowledgement.
    window: u16,
    last_ack: u32,
    /// The last segment from the client, or the last time the fast path had carried some
    /// of its connection when the flow was taken back.
    seen: Instant,
    /// Keepalive probes sent since `seen`, and when the last went.
    probes: u8,
    probed: Instant,
    closed: Option<Instant>,
    /// Bit 1: the client's FIN went to the legs; bit 2: a FIN went to the client.
    fins: u8,
}

impl Flow {
    /// Records that the client's next `len` bytes (from the edge) go to leg `i` at its next
    /// sequence number: the last request run grows when it is that leg's and both ends meet.
    fn place_request(&mut self, i: usize, len: u32) {
        let leg_seq = self.legs[i].next;
        match self.requests.back_mut() {
            Some(run)
                if run.leg == i
                    && run.client.wrapping_add(run.len) == self.edge
                    && run.leg_seq.wrapping_add(run.len) == leg_seq =>
            {
                run.len = run.len.wrapping_add(len);
            }
            _ => self.requests.push_back(Run {
                leg: i,
                client: self.edge,
                leg_seq,
                len,
            }),
        }
        self.edge = self.edge.wrapping_add(len);
    }

    /// The client's bytes every leg has acknowledged: where the oldest request run not yet
    /// acknowledged whole stops being so, or the edge.
    fn acked_for_client(&mut self) -> u32 {
        while let Some(run) = self.requests.front() {
            let leg = &self.legs[run.leg];
            let end = run.leg_seq.wrapping_add(run.len);
            if tcp::before(leg.acked, end) {
                let done = leg.acked.wrapping_sub(run.leg_seq);
                let done = if tcp::before(leg.acked, run.leg_seq) {
                    0
                } else {
                    done
                };
                return run.client.wrapping_add(done);
            }
            self.requests.pop_front();
        }
        if self.fins & 1 != 0 && self.legs.iter().any(Leg::owes_fin) {
            // The client's FIN went to the legs: it is acknowledged once each has it.
            return self.edge.wrapping_sub(1);
        }
        self.edge
    }

    /// What the client's acknowledgement `ack` acknowledges of leg `i`'s bytes.
    fn ack_for_leg(&self, i: usize, ack: u32) -> Option<u32> {
        let mut best = None;
        for run in self.replies.iter().filter(|r| r.leg == i) {
            if tcp::before(ack, run.client) {
                break;
            }
            let got = ack.wrapping_sub(run.client).min(run.len);
            best = Some(run.leg_seq.wrapping_add(got));
        }
        best
    }
}

/// The splice's flows and the key its cookies are made with.
pub(crate) struct Splice {
    key: (u64, u64),
    flows: HashMap<(Ipv4Addr, u16), Flow>,
    /// Each leg's client address and port: its flow's client and its place among the legs.
    legs: HashMap<(Ipv4Addr, u16), ((Ipv4Addr, u16), usize)>,
    /// Where the search for a free leg port starts.
    next_port: u16,
    max_flows: usize,
    /// A client silent this long is probed (`TcpSplice::idle`).
    idle: Duration,
    /// The flows of each client address: one address may hold a share of them only.
    per_address: HashMap<Ipv4Addr, usize>,
    /// When the flows were last aged (and their waits moved on).
    aged: Option<Instant>,
    /// Flows with an acknowledgement held back for a leg, and when the first of them is due.
    acks_held: std::collections::HashSet<(Ipv4Addr, u16)>,
    acks_at: Option<Instant>,
    speaks: Speaks,
    /// A fast path that sends legs' replies on in the switch's place.
    offload: Option<Box<dyn LegOffload>>,
}

impl Splice {
    pub(crate) fn new(seed: u64, settings: crate::spec::TcpSplice, speaks: Speaks) -> Splice {
        let mut s = seed ^ 0x7463_705f_636f_6f6b;
        let key = (splitmix64(&mut s), splitmix64(&mut s));
        // Where the first leg port lies depends on the seed: a switch started again does not
        // open its legs on the ports its last run used first.
        let span = u64::from(u16::MAX - FIRST_LEG_PORT) + 1;
        Splice {
            key,
            flows: HashMap::new(),
            legs: HashMap::new(),
            next_port: FIRST_LEG_PORT + (splitmix64(&mut s) % span) as u16,
            max_flows: settings.max_flows,
            idle: settings.idle,
            per_address: HashMap::new(),
            aged: None,
            acks_held: std::collections::HashSet::new(),
            acks_at: None,
            speaks,
            offload: None,
        }
    }

    pub(crate) fn flows(&self) -> usize {
        self.flows.len()
    }

    /// When the flows want ageing next: every [`AGE_EVERY`] while there are any (a SYN to a
    /// leg sent again, a wait given up, a flow forgotten after its linger).
    pub(crate) fn poll_at(&self) -> Option<Instant> {
        if self.flows.is_empty() {
            return None;
        }
        let aged = self.aged.map_or(Instant::ZERO, |t| t + AGE_EVERY);
        Some(self.acks_at.map_or(aged, |t| t.min(aged)))
    }

    /// A port no leg of `ip` uses, recorded for leg `i` of `client`'s flow.
    fn leg_port(&mut self, ip: Ipv4Addr, client: (Ipv4Addr, u16), i: usize) -> Option<u16> {
        let span = u32::from(u16::MAX - FIRST_LEG_PORT) + 1;
        for _ in 0..span {
            let port = self.next_port;
            self.next_port = if port == u16::MAX {
                FIRST_LEG_PORT
            } else {
                port + 1
            };
            if let std::collections::hash_map::Entry::Vacant(e) = self.legs.entry((ip, port)) {
                e.insert((client, i));
                return Some(port);
            }
        }
        None
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
    /// or comes from a flow's leg to its client (the parser stage has checked the sources of
    /// frames to the VIP). `None`: not the splice's; the pipeline's verdict stands.
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
            self.on_client(in_port, &seg, now, emit);
            return Some(Fate::Consumed);
        }
        let splice = self.splice.as_ref()?;
        let from_local = Some(in_port) == self.local;
        let found = splice
            .legs
            .get(&(seg.dst_ip(), seg.dst_port()))
            .and_then(|&(client, leg)| Some((client, leg, splice.flows.get(&client)?)));
        let Some((client, leg, flow)) = found else {
            // The host's end of a leg the switch no longer holds (a flow forgotten, a switch
            // started again): the host's stack answers only legs, from the VIP's port to the
            // leg ports, and hears a reset so that the port can open a leg again.
            if from_local && (seg.src_ip(), seg.src_port()) == vip && is_leg_port(seg.dst_port()) {
                self.stale_leg_segment(in_port, &seg, emit);
                return Some(Fate::Consumed);
            }
            return None;
        };
        let l = flow.legs.get(leg)?;
        let from_leg = (seg.src_ip(), seg.src_port()) == (l.ip, l.port)
            && from_local == (l.target == Target::Host)
            && (l.target == Target::Host || seg.src_mac() == l.mac);
        if !from_leg {
            return None;
        }
        if flow.closed.is_some() || l.gone {
            self.stale_leg_segment(in_port, &seg, emit);
            return Some(Fate::Consumed);
        }
        if !seg.verify_checksum() {
            self.stats.count_drop(Drop::BadTcpChecksum);
            return Some(Fate::Consumed);
        }
        self.spliced_sender = !from_local;
        if let Some(mut flow) = self.flow_take(client) {
            self.leg_segment(client, &mut flow, leg, &seg, now, emit);
            self.splice_put(client, flow);
        }
        Some(Fate::Consumed)
    }

    fn on_client(&mut self, in_port: u16, seg: &Segment<'_>, now: Instant, emit: &mut Vec<Emit>) {
        let client = (seg.src_ip(), seg.src_port());
        let Some(splice) = self.splice.as_mut() else {
            return;
        };
        if seg.has(flag::SYN) {
            if seg.has(flag::ACK) || seg.has(flag::RST) {
                self.stats.count_drop(Drop::TcpUnexpected);
                return;
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
            return;
        }
        if !splice.flows.contains_key(&client) {
            if seg.has(flag::RST) {
                return;
            }
            let isn = seg.seq().wrapping_sub(1);
            let cookie = seg.ack().wrapping_sub(1);
            let Some((mss, wscale)) = seg
                .has(flag::ACK)
                .then(|| splice.check(client, isn, cookie, now))
                .flatten()
            else {
                self.stats.count_drop(Drop::TcpBadCookie);
                self.reset_client(in_port, seg, emit);
                return;
            };
            let of_address = splice.per_address.get(&client.0).copied().unwrap_or(0);
            if splice.flows.len() >= splice.max_flows
                || of_address >= splice.max_flows.div_ceil(PER_ADDRESS_SHARE)
            {
                self.stats.count_drop(Drop::TcpFlowsFull);
                self.reset_client(in_port, seg, emit);
                return;
            }
            *splice.per_address.entry(client.0).or_default() += 1;
            splice.flows.insert(
                client,
                Flow {
                    mac: seg.src_mac(),
                    port: in_port,
                    mss,
                    wscale,
                    legs: Vec::new(),
                    active: None,
                    sticky: false,
                    avoid: Vec::new(),
                    edge: isn.wrapping_add(1),
                    data_left: 0,
                    resp_left: 0,
                    held: Vec::new(),
                    held_fin: false,
                    since: now,
                    requests: VecDeque::new(),
                    replies: VecDeque::new(),
                    out: cookie.wrapping_add(1),
                    sent: cookie.wrapping_add(1),
                    client_acked: cookie.wrapping_add(1),
                    client_window: seg.window(),
                    window: u16::MAX,
                    last_ack: isn.wrapping_add(1),
                    seen: now,
                    probes: 0,
                    probed: now,
                    closed: None,
                    fins: 0,
                },
            );
            self.count_flows();
        }
        let Some(mut flow) = self.flow_take(client) else {
            return;
        };
        if flow.port != in_port || flow.mac != seg.src_mac() {
            // Another host in the client's name: the source check, when on, stopped it before.
            self.splice_put(client, flow);
            self.stats.count_drop(Drop::TcpStale);
            return;
        }
        flow.seen = now;
        flow.probes = 0;
        self.spliced_sender = true;
        self.client_segment(client, &mut flow, seg, now, emit);
        self.splice_put(client, flow);
    }

    /// Hands the splice a fast path that sends legs' replies on in its place (the XDP
    /// program's); false when it has one already, or does not splice.
    pub fn set_leg_offload(&mut self, offload: Box<dyn LegOffload>) -> bool {
        match self.splice.as_mut() {
            Some(s) if s.offload.is_none() => {
                s.offload = Some(offload);
                true
            }
            _ => false,
        }
    }

    /// Takes `client`'s flow out of the table to work on it, its legs taken back from the
    /// fast path and what it sent on them booked.
    fn flow_take(&mut self, client: (Ipv4Addr, u16)) -> Option<Flow> {
        let now = self.now.unwrap_or(Instant::ZERO);
        let splice = self.splice.as_mut()?;
        let mut flow = splice.flows.remove(&client)?;
        if let Some(offload) = splice.offload.as_mut() {
            for i in 0..flow.legs.len() {
                if !flow.legs[i].handed {
                    continue;
                }
                flow.legs[i].handed = false;
                if let Some(sent) = offload.take_back(leg_key(client, &flow.legs[i])) {
                    let before = (flow.edge, flow.client_acked);
                    book_sent(&mut flow, i, &sent);
                    if (flow.edge, flow.client_acked) != before {
                        // The client's requests or acknowledgements went by the fast path.
                        flow.seen = now;
                        flow.probes = 0;
                    }
                    stats::add(&self.stats.tcp_requests, u64::from(sent.requests));
                }
            }
        }
        Some(flow)
    }

    /// Puts `client`'s flow back, handing its active leg to the fast path when what that leg
    /// sends next needs no decision of the switch's; legs let go are forgotten there.
    fn splice_put(&mut self, client: (Ipv4Addr, u16), mut flow: Flow) {
        let vip = (self.spec.vip.ip, self.spec.vip.port);
        let Some(s) = self.splice.as_mut() else {
            return;
        };
        if let Some(offload) = s.offload.as_mut() {
            for leg in flow.legs.iter().filter(|l| l.gone || flow.closed.is_some()) {
                offload.forget(leg_key(client, leg));
            }
            if let (Speaks::Memcached, Some((i, h))) = (s.speaks, hand_over(client, &mut flow, vip))
            {
                flow.legs[i].handed = offload.hand_over(leg_key(client, &flow.legs[i]), &h);
            }
        }
        s.flows.insert(client, flow);
    }

    /// A segment from the client of a known flow.
    fn client_segment(
        &mut self,
        client: (Ipv4Addr, u16),
        flow: &mut Flow,
        seg: &Segment<'_>,
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        if seg.has(flag::RST) {
            self.end_flow(client, flow, now, emit, false);
            return;
        }
        if seg.has(flag::ACK)
            && tcp::before(flow.client_acked, seg.ack())
            && !tcp::before(flow.sent, seg.ack())
        {
            flow.client_acked = seg.ack();
            // Runs the client has whole are forgotten; the last one may still grow.
            while flow.replies.len() > 1
                && flow
                    .replies
                    .front()
                    .is_some_and(|r| !tcp::before(seg.ack(), r.client.wrapping_add(r.len)))
            {
                flow.replies.pop_front();
            }
        }
        flow.client_window = seg.window();
        let payload = seg.payload();
        let (seq, fin) = (seg.seq(), seg.has(flag::FIN));
        // The client's bytes the switch has: given to legs up to the edge, then held.
        let have = flow.edge.wrapping_add(flow.held.len() as u32);
        if !payload.is_empty() && tcp::before(seq, flow.edge) {
            // Bytes given to legs already: one of them may not have them.
            let old = (flow.edge.wrapping_sub(seq) as usize).min(payload.len());
            self.give_again(client, flow, seq, &payload[..old], emit);
        }
        if (!payload.is_empty() || fin) && tcp::before(have, seq) {
            // Past a gap: the switch reads the stream in order, so the client sends it again.
            self.stats.count_drop(Drop::TcpOutOfOrder);
        } else if !payload.is_empty() || fin {
            let skip = have.wrapping_sub(seq) as usize;
            if let Some(more) = payload.get(skip..) {
                if flow.held.is_empty() {
                    flow.since = now;
                }
                if flow.held.len() + more.len() <= HELD_MAX {
                    flow.held.extend_from_slice(more);
                    flow.held_fin |= fin && flow.fins & 1 == 0;
                } else {
                    self.stats.count_drop(Drop::TcpHeldFull);
                }
            } else if flow.fins & 1 == 0 || !fin {
                // Bytes the legs had already: the client did not hear our acknowledgement.
                self.ack_client(client, flow, emit);
            } else {
                // The client's FIN again: a leg that has not acknowledged it lost it.
                self.fin_again(client, flow, emit);
            }
        }
        self.pump(client, flow, now, emit);
        if flow.fins == 3 && flow.closed.is_none() {
            // The client's FIN after the end a leg gave it (the proxy closed first): it is
            // acknowledged, and the flow is done.
            let (sent, edge) = (flow.sent, flow.edge);
            self.client_send(client, flow, sent, edge, &[], flag::ACK, emit);
            self.end_flow(client, flow, now, emit, false);
            return;
        }
        self.ack_legs(client, flow, emit);
    }

    /// Gives held client bytes to legs, request by request, as far as order allows.
    fn pump(
        &mut self,
        client: (Ipv4Addr, u16),
        flow: &mut Flow,
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        if flow.closed.is_some() {
            return;
        }
        let mut given = 0;
        loop {
            let remaining = flow.held.len() - given;
            if remaining == 0 {
                break;
            }
            if flow.data_left > 0 {
                // The rest of a data block goes where its command went.
                let Some(active) = flow.active else { break };
                if flow.legs[active].their_isn.is_none() {
                    break;
                }
                let n = flow.data_left.min(remaining);
                let bytes = flow.held[given..given + n].to_vec();
                self.give(client, flow, active, &bytes, emit);
                flow.data_left -= n;
                given += n;
                continue;
            }
            if flow.resp_left > 0 {
                // The next bulk argument of a command already routed: its header, then its
                // bytes as a data block.
                let Some(active) = flow.active else { break };
                if flow.legs[active].their_isn.is_none() {
                    break;
                }
                let rest = &flow.held[given..];
                let take = match bulk_header(rest) {
                    Some(Ok((len, data))) => {
                        flow.resp_left -= 1;
                        flow.data_left = data;
                        len
                    }
                    // The rest of the line comes later.
                    None => break,
                    // What the server refuses and closes on: it gets the rest of the stream.
                    Some(Err(())) => {
                        flow.resp_left = 0;
                        flow.data_left = usize::MAX;
                        0
                    }
                };
                let bytes = flow.held[given..given + take].to_vec();
                self.give(client, flow, active, &bytes, emit);
                given += take;
                continue;
            }
            let rest = &flow.held[given..];
            let speaks = self.splice.as_ref().map_or(Speaks::Memcached, |s| s.speaks);
            let active = flow.active.map(|a| flow.legs[a].target);
            let (len, target, kind, left, hash) = if flow.sticky {
                (rest.len(), Target::Host, None, 0, None)
            } else if let Speaks::Redis { host_only } = speaks {
                match self.resp_target(rest, host_only, active) {
                    Some((len, target, kind, left)) => (len, target, kind, left, None),
                    // A command cut short: the rest of it comes later.
                    None => break,
                }
            } else if rest.first() == Some(&b'q') && is_quit(rest) {
                // `quit` goes to the active leg, which closes; the host's when there is none.
                let len = rest
                    .iter()
                    .position(|&b| b == b'\n')
                    .map_or(rest.len(), |i| i + 1);
                (len, active.unwrap_or(Target::Host), None, 0, None)
            } else {
                match self.request_target(rest) {
                    Some((len, target, kind, hash)) => (len, target, kind, 0, hash),
                    None => {
                        // A line cut short: the rest of it comes later.
                        break;
                    }
                }
            };
            let target = match target {
                Target::Server(i) if flow.avoid.contains(&i) => Target::Host,
                t => t,
            };
            let Some(leg) = self.leg_for(client, flow, target, now, emit) else {
                self.stats.count_drop(Drop::TcpNoTarget);
                self.end_flow(client, flow, now, emit, true);
                return;
            };
            if flow.active != Some(leg) {
                let settled = flow.active.is_none_or(|a| flow.legs[a].replies.settled());
                if !settled {
                    if flow.active.is_some_and(|a| flow.legs[a].replies.lost) {
                        self.stats.count_drop(Drop::TcpRepliesLost);
                        self.end_flow(client, flow, now, emit, true);
                        return;
                    }
                    break;
                }
                if flow.legs[leg].their_isn.is_none() {
                    break;
                }
                flow.active = Some(leg);
                let read = flow.legs[leg].read;
                flow.replies.push_back(Run {
                    leg,
                    client: flow.out,
                    leg_seq: read,
                    len: 0,
                });
            } else if flow.legs[leg].their_isn.is_none() {
                break;
            }
            match kind {
                Some(owes) => flow.legs[leg].replies.expect(owes),
                None if target == Target::Host => flow.sticky = true,
                None => {}
            }
            if let Target::Server(i) = target {
                self.stats.backend_request(i);
                stats::inc(&self.stats.tcp_requests);
                // Counted on its arc once it is sent, not when it was parsed (it may wait).
                if let Some(hash) = hash {
                    self.view.count(hash);
                }
            }
            let n = len.min(remaining);
            flow.data_left = len - n;
            flow.resp_left = left;
            let bytes = flow.held[given..given + n].to_vec();
            self.give(client, flow, leg, &bytes, emit);
            given += n;
        }
        flow.held.drain(..given);
        if given > 0 {
            flow.since = now;
        }
        if flow.held.is_empty() && flow.held_fin && flow.fins & 1 == 0 {
            // The client is done sending: every leg hears so after its last request.
            flow.held_fin = false;
            flow.fins |= 1;
            flow.edge = flow.edge.wrapping_add(1);
            for i in 0..flow.legs.len() {
                if flow.legs[i].their_isn.is_some() {
                    self.leg_send(client, flow, i, &[], flag::FIN, emit);
                }
            }
        }
        if !flow.held.is_empty() && now.saturating_duration_since(flow.since) > HOLD_WAIT {
            self.stats.count_drop(Drop::TcpHoldTimeout);
            self.end_flow(client, flow, now, emit, true);
        }
    }

    /// The leg for `target`, opened (its SYN sent) when the flow has none yet.
    fn leg_for(
        &mut self,
        client: (Ipv4Addr, u16),
        flow: &mut Flow,
        target: Target,
        now: Instant,
        emit: &mut Vec<Emit>,
    ) -> Option<usize> {
        if let Some(i) = flow.legs.iter().position(|l| l.target == target && !l.fin) {
            let leg = &mut flow.legs[i];
            let waited = now.saturating_duration_since(leg.born);
            match (leg.their_isn, target) {
                (None, Target::Server(s)) if waited >= LEG_OPEN_WAIT => {
                    // Its server does not answer: the proxy serves its requests.
                    self.fail_leg(client, flow, i, s, emit);
                    return self.leg_for(client, flow, Target::Host, now, emit);
                }
                (None, _) if now.saturating_duration_since(leg.syn_at) >= SYN_RETRY => {
                    leg.syn_at = now;
                    emit.push(self.leg_syn(client, flow, i));
                }
                _ => {}
            }
            return Some(i);
        }
        if flow.legs.len() >= MAX_LEGS {
            return None;
        }
        let target = match self.target_address(target) {
            Some(_) => target,
            // Its server's port is not known yet: the proxy serves this request.
            None => Target::Host,
        };
        if target == Target::Host {
            if let Some(i) = flow.legs.iter().position(|l| l.target == target && !l.fin) {
                return Some(i);
            }
        }
        let (mac, ip, port, out) = self.target_address(target)?;
        let isn = flow.edge.wrapping_sub(1);
        let sport = self
            .splice
            .as_mut()?
            .leg_port(client.0, client, flow.legs.len())?;
        flow.legs.push(Leg {
            target,
            sport,
            mac,
            ip,
            port,
            out,
            isn,
            their_isn: None,
            born: now,
            syn_at: now,
            mss: flow.mss,
            target_shift: 0,
            client_shift: 0,
            next: isn.wrapping_add(1),
            acked: isn.wrapping_add(1),
            read: 0,
            replies: Replies::default(),
            acked_to: 0,
            ack_due: None,
            fin: false,
            gone: false,
            handed: false,
        });
        let i = flow.legs.len() - 1;
        match (target, flow.legs.len()) {
            (Target::Server(_), 1) => stats::inc(&self.stats.tcp_spliced),
            (Target::Host, 1) => stats::inc(&self.stats.tcp_proxied),
            (Target::Host, _) => stats::inc(&self.stats.tcp_handed_over),
            (Target::Server(_), _) => stats::inc(&self.stats.tcp_legs),
        }
        emit.push(self.leg_syn(client, flow, i));
        Some(i)
    }

    /// Leg `i` to server `server` did not open: it is let go, and the flow's requests for that
    /// server go to the host's leg.
    fn fail_leg(
        &mut self,
        client: (Ipv4Addr, u16),
        flow: &mut Flow,
        i: usize,
        server: usize,
        emit: &mut Vec<Emit>,
    ) {
        self.stats.count_drop(Drop::TcpNoTarget);
        self.reset_leg(client, flow, i, emit);
        if !flow.avoid.contains(&server) {
            flow.avoid.push(server);
        }
    }

    /// The SYN of leg `i`, in the client's name, with the client's MSS and window scale.
    fn leg_syn(&self, client: (Ipv4Addr, u16), flow: &Flow, i: usize) -> Emit {
        let leg = &flow.legs[i];
        let syn = tcp::Repr {
            src_port: leg.sport,
            dst_port: leg.port,
            seq: leg.isn,
            ack: 0,
            flags: flag::SYN,
            window: flow.client_window,
            mss: Some(flow.mss),
            wscale: flow.wscale,
        };
        Emit {
            dest: Dest::Port(leg.out),
            frame: syn.frame(&leg_ends(client, flow, leg), &[]),
        }
    }

    /// Sends client bytes to leg `i`, in segments of its MSS, as a request run.
    fn give(
        &mut self,
        client: (Ipv4Addr, u16),
        flow: &mut Flow,
        i: usize,
        bytes: &[u8],
        emit: &mut Vec<Emit>,
    ) {
        if bytes.is_empty() {
            return;
        }
        flow.place_request(i, bytes.len() as u32);
        let mss = usize::from(flow.legs[i].mss.max(1));
        let chunks: Vec<&[u8]> = bytes.chunks(mss).collect();
        let last = chunks.len().saturating_sub(1);
        for (n, chunk) in chunks.into_iter().enumerate() {
            let psh = if n == last { flag::PSH } else { 0 };
            self.leg_send(client, flow, i, chunk, psh, emit);
        }
    }

    /// Client bytes from `seq` that were given to legs before, given again where their runs
    /// put them (the legs drop what they have).
    fn give_again(
        &mut self,
        client: (Ipv4Addr, u16),
        flow: &mut Flow,
        seq: u32,
        bytes: &[u8],
        emit: &mut Vec<Emit>,
    ) {
        let mut at = 0;
        while at < bytes.len() {
            let s = seq.wrapping_add(at as u32);
            let Some(run) = flow.requests.iter().copied().find(|r| {
                !tcp::before(s, r.client) && tcp::before(s, r.client.wrapping_add(r.len))
            }) else {
                // Acknowledged by its leg already, or before the oldest run kept.
                at += 1;
                continue;
            };
            let n =
                (run.client.wrapping_add(run.len).wrapping_sub(s) as usize).min(bytes.len() - at);
            let leg_seq = run.leg_seq.wrapping_add(s.wrapping_sub(run.client));
            let next = flow.legs[run.leg].next;
            flow.legs[run.leg].next = leg_seq;
            self.leg_send(client, flow, run.leg, &bytes[at..at + n], flag::PSH, emit);
            flow.legs[run.leg].next = next;
            at += n;
        }
    }

    /// The client's FIN, sent again to each leg that has not acknowledged it (at the sequence
    /// number it had); a leg that has it gets the acknowledgement it may have lost.
    fn fin_again(&mut self, client: (Ipv4Addr, u16), flow: &mut Flow, emit: &mut Vec<Emit>) {
        for i in 0..flow.legs.len() {
            if !flow.legs[i].owes_fin() {
                continue;
            }
            let next = flow.legs[i].next;
            flow.legs[i].next = next.wrapping_sub(1);
            self.leg_send(client, flow, i, &[], flag::FIN, emit);
            flow.legs[i].next = next;
        }
        if !flow.legs.iter().any(Leg::owes_fin) {
            self.ack_client(client, flow, emit);
        }
    }

    /// One segment to leg `i` in the client's name: `payload` at the leg's next sequence
    /// number, the client's acknowledgement of the leg's bytes, the client's window.
    fn leg_send(
        &mut self,
        client: (Ipv4Addr, u16),
        flow: &mut Flow,
        i: usize,
        payload: &[u8],
        flags: u8,
        emit: &mut Vec<Emit>,
    ) {
        let ack = flow.ack_for_leg(i, flow.client_acked);
        let leg = &mut flow.legs[i];
        let Some(their) = leg.their_isn else {
            return;
        };
        let mut ack = ack.unwrap_or(their.wrapping_add(1));
        for held in [Some(leg.acked_to), leg.ack_due.take()]
            .into_iter()
            .flatten()
        {
            if tcp::before(ack, held) {
                ack = held;
            }
        }
        leg.acked_to = ack;
        let window = rescale(flow.client_window, leg.client_shift, 0);
        let seg = tcp::Repr::plain(
            leg.sport,
            leg.port,
            leg.next,
            ack,
            flag::ACK | flags,
            window,
        );
        leg.next = leg
            .next
            .wrapping_add(payload.len() as u32 + u32::from(flags & flag::FIN != 0));
        emit.push(leg_emit(client, flow, i, &seg, payload));
    }

    /// Tells every open leg what the client has acknowledged of its bytes, when that moved.
    /// A leg the client left for another, that owes it nothing more and whose replies the
    /// client has whole, hears it a little later ([`may_wait`]): from its next request, which
    /// carries it, or at the tick [`ACK_HOLD`] after the first acknowledgement held. Under
    /// load the client is back at that leg's server first, and a change of server sends one
    /// segment, the request, where it sent two.
    fn ack_legs(&mut self, client: (Ipv4Addr, u16), flow: &mut Flow, emit: &mut Vec<Emit>) {
        for i in 0..flow.legs.len() {
            let leg = &flow.legs[i];
            if leg.their_isn.is_none() {
                continue;
            }
            let Some(ack) = flow.ack_for_leg(i, flow.client_acked) else {
                continue;
            };
            if !tcp::before(leg.acked_to, ack) {
                continue;
            }
            if may_wait(flow, i, ack) {
                flow.legs[i].ack_due = Some(ack);
                let now = self.now.unwrap_or(Instant::ZERO);
                if let Some(s) = self.splice.as_mut() {
                    s.acks_held.insert(client);
                    s.acks_at.get_or_insert(now + ACK_HOLD);
                }
            } else {
                self.leg_send(client, flow, i, &[], 0, emit);
            }
        }
    }

    /// Sends the acknowledgements [`ack_legs`] held back, once they are due.
    fn send_deferred_acks(&mut self, now: Instant, emit: &mut Vec<Emit>) {
        let Some(splice) = self.splice.as_mut() else {
            return;
        };
        if splice.acks_at.is_none_or(|t| now < t) {
            return;
        }
        splice.acks_at = None;
        let held: Vec<(Ipv4Addr, u16)> = splice.acks_held.drain().collect();
        for client in held {
            let owed = self
                .splice
                .as_ref()
                .and_then(|s| s.flows.get(&client))
                .is_some_and(|f| (0..f.legs.len()).any(|i| ack_owed(f, i)));
            if !owed {
                // Carried by a request since, or the flow is gone.
                continue;
            }
            let Some(mut flow) = self.flow_take(client) else {
                continue;
            };
            for i in 0..flow.legs.len() {
                if ack_owed(&flow, i) {
                    self.leg_send(client, &mut flow, i, &[], 0, emit);
                }
            }
            self.splice_put(client, flow);
        }
    }

    /// A pure acknowledgement to the client of what the legs have of its bytes.
    fn ack_client(&mut self, client: (Ipv4Addr, u16), flow: &mut Flow, emit: &mut Vec<Emit>) {
        let ack = flow.acked_for_client();
        flow.last_ack = ack;
        let port = self.spec.vip.port;
        let seg = tcp::Repr::plain(port, client.1, flow.sent, ack, flag::ACK, flow.window);
        emit.push(self.client_emit(client, flow, &seg, &[]));
    }

    /// Segment `seg` to the client, from the VIP.
    fn client_emit(
        &self,
        client: (Ipv4Addr, u16),
        flow: &Flow,
        seg: &tcp::Repr,
        payload: &[u8],
    ) -> Emit {
        Emit {
            dest: Dest::Port(flow.port),
            frame: seg.frame(&self.client_ends(client, flow), payload),
        }
    }

    fn client_ends(&self, client: (Ipv4Addr, u16), flow: &Flow) -> tcp::Ends {
        tcp::Ends {
            src_mac: self.spec.vip.mac,
            dst_mac: flow.mac,
            src_ip: self.spec.vip.ip,
            dst_ip: client.0,
        }
    }

    /// A segment from leg `i`'s target.
    fn leg_segment(
        &mut self,
        client: (Ipv4Addr, u16),
        flow: &mut Flow,
        i: usize,
        seg: &Segment<'_>,
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        if seg.has(flag::RST) {
            match (flow.legs[i].their_isn, flow.legs[i].target) {
                // Refused: the proxy serves this server's requests for the flow.
                (None, Target::Server(s)) => {
                    flow.legs[i].fin = true;
                    self.fail_leg(client, flow, i, s, emit);
                    self.pump(client, flow, now, emit);
                }
                _ if self.owes(flow, i) => {
                    // Gone mid-request: what the client was promised cannot come.
                    self.stats.count_drop(Drop::TcpNoTarget);
                    self.end_flow(client, flow, now, emit, true);
                }
                _ => flow.legs[i].fin = true,
            }
            return;
        }
        if seg.has(flag::SYN) {
            let leg = &mut flow.legs[i];
            let answers = seg.has(flag::ACK) && seg.ack() == leg.isn.wrapping_add(1);
            if !answers || leg.their_isn.is_some_and(|t| t != seg.seq()) {
                self.stats.count_drop(Drop::TcpUnexpected);
                return;
            }
            let first = leg.their_isn.is_none();
            leg.their_isn = Some(seg.seq());
            let o = seg.options();
            leg.mss = o.mss.unwrap_or(536).min(flow.mss).max(64);
            (leg.target_shift, leg.client_shift) = match (flow.wscale, o.wscale) {
                (Some(_), Some(t)) => (t, 0),
                (Some(c), None) => (0, c),
                (None, _) => (0, 0),
            };
            if first {
                leg.read = seg.seq().wrapping_add(1);
                leg.acked_to = leg.read;
                leg.acked = leg.isn.wrapping_add(1);
            }
            // The handshake's last ACK, in the client's name.
            let ack = tcp::Repr::plain(
                leg.sport,
                leg.port,
                leg.isn.wrapping_add(1),
                seg.seq().wrapping_add(1),
                flag::ACK,
                rescale(flow.client_window, leg.client_shift, 0),
            );
            emit.push(leg_emit(client, flow, i, &ack, &[]));
            if first {
                self.pump(client, flow, now, emit);
            }
            return;
        }
        if flow.legs[i].their_isn.is_none() {
            if seg.has(flag::ACK) {
                // The target holds an older connection on this leg's ports (one it still
                // closes, or in TIME-WAIT) and acknowledged that one: a reset at its
                // acknowledgement ends it, and the next SYN opens the leg.
                self.stats.count_drop(Drop::TcpStale);
                emit.push(reset_reply(flow.legs[i].out, seg, seg.dst_mac()));
                flow.legs[i].syn_at = now;
                emit.push(self.leg_syn(client, flow, i));
            }
            return;
        }
        if seg.has(flag::ACK)
            && tcp::before(flow.legs[i].acked, seg.ack())
            && !tcp::before(flow.legs[i].next, seg.ack())
        {
            flow.legs[i].acked = seg.ack();
        }
        let our_shift = flow.wscale.map_or(0, |_| OUR_WSCALE);
        flow.window = rescale(seg.window(), flow.legs[i].target_shift, our_shift);
        let payload = seg.payload();
        let seq = seg.seq();
        let mut pieces: Vec<(u32, &[u8])> = Vec::new();
        if !payload.is_empty() {
            let leg = &mut flow.legs[i];
            if tcp::before(leg.read, seq) {
                // Past a gap in the replies: they are read in order, and the target sends these
                // again.
                self.stats.count_drop(Drop::TcpOutOfOrder);
                return;
            }
            let end = seq.wrapping_add(payload.len() as u32);
            let fresh = if tcp::before(leg.read, end) {
                let skip = leg.read.wrapping_sub(seq) as usize;
                let new = &payload[skip..];
                if flow.active != Some(i) {
                    // Bytes nobody asked for: this leg owes no reply.
                    leg.replies.lost = true;
                    self.stats.count_drop(Drop::TcpRepliesLost);
                    self.end_flow(client, flow, now, emit, true);
                    return;
                }
                if !flow.sticky {
                    leg.replies.feed(new);
                }
                leg.read = end;
                if let Some(run) = flow.replies.back_mut() {
                    run.len = run.len.wrapping_add(new.len() as u32);
                }
                flow.out = flow.out.wrapping_add(new.len() as u32);
                skip
            } else {
                payload.len()
            };
            // Bytes sent before (retransmitted): where each run put them.
            let mut at = 0;
            while at < fresh {
                let s = seq.wrapping_add(at as u32);
                let Some(run) = flow.replies.iter().find(|r| {
                    r.leg == i
                        && !tcp::before(s, r.leg_seq)
                        && tcp::before(s, r.leg_seq.wrapping_add(r.len))
                }) else {
                    break;
                };
                let n =
                    (run.leg_seq.wrapping_add(run.len).wrapping_sub(s) as usize).min(fresh - at);
                pieces.push((
                    run.client.wrapping_add(s.wrapping_sub(run.leg_seq)),
                    &payload[at..at + n],
                ));
                at += n;
            }
            if fresh < payload.len() {
                let run = flow.replies.back().copied();
                if let Some(run) = run {
                    let s = seq.wrapping_add(fresh as u32);
                    pieces.push((
                        run.client.wrapping_add(s.wrapping_sub(run.leg_seq)),
                        &payload[fresh..],
                    ));
                }
            }
        }
        let fin = seg.has(flag::FIN);
        let leg_fin = fin && !flow.legs[i].fin;
        if leg_fin {
            flow.legs[i].fin = true;
            if self.owes(flow, i) {
                // The server closed with replies owed: the client cannot get them.
                self.stats.count_drop(Drop::TcpNoTarget);
                let ack = flow.acked_for_client();
                for (at, bytes) in &pieces {
                    self.client_send(client, flow, *at, ack, bytes, flag::ACK, emit);
                }
                self.end_flow(client, flow, now, emit, true);
                return;
            }
        }
        // The leg's end is the client's only when it is the active leg (which owes nothing,
        // or it was reset above) and nothing waits: a `quit`, the server closing on the
        // client's FIN, or the proxy, which holds the rest of the connection, closing it.
        let to_client_fin = leg_fin && flow.active == Some(i) && flow.held.is_empty();
        let ack = flow.acked_for_client();
        let push = seg.has(flag::PSH);
        for (k, (at, bytes)) in pieces.iter().enumerate() {
            let last = k + 1 == pieces.len();
            let mut flags = flag::ACK;
            if last && push {
                flags |= flag::PSH;
            }
            self.client_send(client, flow, *at, ack, bytes, flags, emit);
        }
        if to_client_fin {
            let at = flow.out;
            self.client_send(client, flow, at, ack, &[], flag::ACK | flag::FIN, emit);
            flow.fins |= 2;
            if flow.fins & 1 == 0 {
                // A server that closed by itself (`quit`): the client's own FIN is still to
                // come, the other legs are done with.
                self.reset_legs(client, flow, Some(i), emit);
            }
        } else if pieces.is_empty() && tcp::before(flow.last_ack, ack) {
            // The client's bytes moved on at the legs: tell it.
            self.ack_client(client, flow, emit);
        }
        if !payload.is_empty() && pieces.is_empty() {
            // All of it had reached the client: the leg did not hear our acknowledgement,
            // which goes again now. Its reply runs may be forgotten already (the client had
            // them whole): it is then owed all it sent.
            if flow.ack_for_leg(i, flow.client_acked).is_none() && flow.legs[i].replies.settled() {
                flow.legs[i].ack_due = Some(flow.legs[i].read);
            }
            self.leg_send(client, flow, i, &[], 0, emit);
        }
        if leg_fin && flow.active != Some(i) {
            // An idle leg whose server closed: it is let go, and opened again when needed.
            self.reset_leg(client, flow, i, emit);
        }
        if flow.fins == 3 && flow.closed.is_none() {
            // Both ends are done: the legs are let go.
            self.end_flow(client, flow, now, emit, false);
            return;
        }
        if flow.legs[i].replies.settled() && !flow.held.is_empty() {
            self.pump(client, flow, now, emit);
        }
        self.ack_legs(client, flow, emit);
    }

    /// Whether leg `i` owes the client something: replies, or requests not yet acknowledged.
    fn owes(&self, flow: &Flow, i: usize) -> bool {
        let leg = &flow.legs[i];
        if flow.sticky && flow.active == Some(i) {
            // The proxy holds the rest of the connection: its end is the client's.
            return false;
        }
        !leg.replies.owed.is_empty() || !leg.replies.settled() || tcp::before(leg.acked, leg.next)
    }

    /// One segment to the client: `payload` at client sequence number `seq`.
    #[allow(clippy::too_many_arguments)]
    fn client_send(
        &mut self,
        client: (Ipv4Addr, u16),
        flow: &mut Flow,
        seq: u32,
        ack: u32,
        payload: &[u8],
        flags: u8,
        emit: &mut Vec<Emit>,
    ) {
        let seg = tcp::Repr::plain(self.spec.vip.port, client.1, seq, ack, flags, flow.window);
        let end = seq.wrapping_add(payload.len() as u32 + u32::from(flags & flag::FIN != 0));
        if tcp::before(flow.sent, end) {
            flow.sent = end;
        }
        flow.last_ack = ack;
        emit.push(self.client_emit(client, flow, &seg, payload));
    }

    /// Resets every open leg but `keep`.
    fn reset_legs(
        &mut self,
        client: (Ipv4Addr, u16),
        flow: &mut Flow,
        keep: Option<usize>,
        emit: &mut Vec<Emit>,
    ) {
        for i in 0..flow.legs.len() {
            if Some(i) != keep && !flow.legs[i].fin {
                self.reset_leg(client, flow, i, emit);
            }
        }
    }

    /// Resets leg `i` and lets it go.
    fn reset_leg(
        &mut self,
        client: (Ipv4Addr, u16),
        flow: &mut Flow,
        i: usize,
        emit: &mut Vec<Emit>,
    ) {
        let leg = &mut flow.legs[i];
        leg.fin = true;
        leg.gone = true;
        if leg.their_isn.is_none() {
            return;
        }
        emit.push(leg_reset(client, flow, i));
    }

    /// Ends a flow: resets to every leg, and to the client when `reset_client`; the flow is
    /// forgotten after its linger.
    fn end_flow(
        &mut self,
        client: (Ipv4Addr, u16),
        flow: &mut Flow,
        now: Instant,
        emit: &mut Vec<Emit>,
        reset_client: bool,
    ) {
        for i in 0..flow.legs.len() {
            flow.legs[i].gone = true;
            if flow.legs[i].their_isn.is_none() && !reset_client {
                continue;
            }
            emit.push(leg_reset(client, flow, i));
        }
        if reset_client {
            let rst = tcp::Repr::plain(self.spec.vip.port, client.1, flow.sent, 0, flag::RST, 0);
            emit.push(self.client_emit(client, flow, &rst, &[]));
        }
        flow.held.clear();
        flow.closed = Some(now);
    }

    /// The request at the front of `bytes`: its length, data block included, where it goes,
    /// and the kind of its reply (`None`: a reply whose end cannot be found, or none). `None`
    /// while its line has not all arrived.
    fn request_target(&self, bytes: &[u8]) -> Option<(usize, Target, Option<Owes>, Option<u32>)> {
        let sticky = |len| Some((len, Target::Host, None, None));
        if bytes.first() == Some(&memcache::binary::REQUEST_MAGIC) {
            return sticky(bytes.len());
        }
        let request = match memcache::parse_text_head(bytes) {
            Ok(Some(r)) => r,
            Ok(None) => return None,
            // memcached's exact answer, and what follows it, are the proxy's.
            Err(_) => return sticky(bytes.len()),
        };
        let command = request.command;
        // Quiet and noreply requests are answered only when they fail: where their replies end
        // cannot be known.
        let kind = Some(ReplyKind::of(&request)).filter(|_| !request.noreply());
        let framed = matches!(
            kind,
            Some(ReplyKind::Retrieval | ReplyKind::Line | ReplyKind::Meta)
        );
        let (to, hash) = match request.key() {
            Some(key) if request.key_count() == 1 && command.has_key() && framed => {
                let write = command.is_write();
                let server = self.key_server(key, write);
                // A replicated write goes to every replica, and the cache must see every
                // write before it leaves: both are the proxy's.
                let proxy_writes = self.view.replicas() > 1 || self.cache.is_some();
                match server {
                    Some(i) if !(write && proxy_writes) => {
                        (Target::Server(i), Some(self.view.key_hash(key)))
                    }
                    _ => (Target::Host, None),
                }
            }
            _ => (Target::Host, None),
        };
        // What the proxy answers itself or merges, with replies whose end is known: several
        // keys, keyless commands with a reply of lines.
        let known_end = match command {
            Command::Version | Command::Stats | Command::FlushAll | Command::Verbosity => true,
            Command::MetaNoop => true,
            c => c.has_key() && !matches!(c, Command::Binary(_)),
        };
        let kind =
            kind.filter(|k| *k != ReplyKind::Binary && *k != ReplyKind::BinaryStats && known_end);
        Some((request.len, to, kind.map(Owes::Memcache), hash))
    }

    /// The Redis command at the front of `bytes`: its length, where it goes and what it is
    /// owed (`None`: the host's leg takes the rest of the connection). `None` while it has not
    /// all arrived. `active`: the target of the active leg, which a command any server answers
    /// alike (`PING`, `ECHO`, `QUIT`, an empty one) goes to.
    fn resp_target(
        &self,
        bytes: &[u8],
        host_only: bool,
        active: Option<Target>,
    ) -> Option<(usize, Target, Option<Owes>, usize)> {
        let sticky = Some((bytes.len(), Target::Host, None, 0));
        if host_only {
            return sticky;
        }
        let (len, command) = match RequestParser::default().step(bytes, false) {
            Ok((len, Step::Command(command))) => (len, command),
            Ok((_, Step::More)) => {
                // A command of one key goes once its name and key are in; its other
                // arguments follow it as they come.
                if let Some(head) = self.resp_head(bytes) {
                    return Some(head);
                }
                return match bytes.len() <= RESP_WHOLE_MAX {
                    true => None,
                    false => sticky,
                };
            }
            // A stream the server would refuse and close: the proxy reads it as the server
            // does.
            Err(_) => return sticky,
        };
        self.resp_command(len, &command, active)
            .map(|(len, to, owes)| (len, to, owes, 0))
    }

    /// The start of a multibulk command of one key whose name and key have arrived (and
    /// not the rest): its length so far, its server, and the arguments still to come. `None`
    /// for anything else, which is routed whole.
    fn resp_head(&self, bytes: &[u8]) -> Option<(usize, Target, Option<Owes>, usize)> {
        let (count, mut at) = resp_line(bytes, b'*')?;
        let count = usize::try_from(count).ok().filter(|&n| n > 2)?;
        let mut words: [&[u8]; 2] = [&[], &[]];
        for word in &mut words {
            let (len, header) = resp_line(&bytes[at..], b'$')?;
            let len = usize::try_from(len).ok()?;
            let start = at + header;
            *word = bytes.get(start..start + len)?;
            if bytes.get(start + len..start + len + 2)? != b"\r\n" {
                return None;
            }
            at = start + len + 2;
        }
        let (buf, n) = redis::lower(words[0])?;
        let name = &buf[..n];
        let (arity, class) = redis::lookup(name)?;
        let one_key = Class::Keys {
            first: 1,
            last: 1,
            step: 1,
        };
        if class != one_key || !redis::arity_fits(arity, count) {
            return None;
        }
        if redis::options_may_name_keys(name) {
            return None;
        }
        let write = !redis::is_read(name);
        if write && (self.view.replicas() > 1 || self.cache.is_some()) {
            return None;
        }
        let server = self.key_server(words[1], write)?;
        Some((at, Target::Server(server), Some(Owes::Resp), count - 2))
    }

    /// Where a whole Redis command goes, and what it is owed.
    fn resp_command(
        &self,
        len: usize,
        command: &resp::Command,
        active: Option<Target>,
    ) -> Option<(usize, Target, Option<Owes>)> {
        let sticky = Some((len, Target::Host, None));
        let here = active.unwrap_or(Target::Host);
        if command.is_empty() {
            return Some((len, here, Some(Owes::Nothing)));
        }
        // What the proxy answers: an unknown command or a wrong arity (the server's words),
        // a refusal, several servers' keys.
        let host = Some((len, Target::Host, Some(Owes::Resp)));
        let Some((buf, n)) = redis::lower(command.word(0)) else {
            return host;
        };
        let name = &buf[..n];
        let Some((arity, class)) = redis::lookup(name) else {
            return host;
        };
        if !redis::arity_fits(arity, command.len()) {
            return host;
        }
        match class {
            Class::Local => {
                return match name {
                    b"ping" | b"echo" => Some((len, here, Some(Owes::Resp))),
                    // The server closes after its `+OK`: whatever the client sent after it
                    // goes to the same leg, unanswered, as it would on one connection.
                    b"quit" => Some((usize::MAX, here, Some(Owes::Resp))),
                    // AUTH, SELECT, HELLO: the connection's state is the proxy's from now on.
                    _ => sticky,
                };
            }
            Class::Refused(_) => return host,
            _ => {}
        }
        if redis::names_other_keys(name, command) {
            return host;
        }
        let write = !redis::is_read(name);
        // A replicated write goes to every replica, and the cache must see every write
        // before it leaves: both are the proxy's.
        if write && (self.view.replicas() > 1 || self.cache.is_some()) {
            return host;
        }
        let mut server = None;
        for i in redis::key_positions(class, command) {
            let at = self.key_server(command.word(i), write);
            match (server, at) {
                (_, None) => return host,
                (Some(a), Some(b)) if a != b => return host,
                _ => server = at,
            }
        }
        match server {
            Some(i) => Some((len, Target::Server(i), Some(Owes::Resp))),
            None => host,
        }
    }

    /// The server a request for `key` goes to on a leg of its own, `None` when the proxy must
    /// take it: no server, or a key whose owner warms up (the memcached proxy reads it where it
    /// was and gives the owner what it finds; the Redis proxy sends it to its owner).
    fn key_server(&self, key: &[u8], write: bool) -> Option<usize> {
        let hash = self.view.key_hash(key);
        let owner = self.view.locate_hash(hash);
        let warming = self.view.is_warming()
            && (self.view.read_locate_hash(hash) != owner || self.view.warm_source(hash).is_some());
        match (write, warming) {
            (_, true) => None,
            (true, false) => owner,
            (false, false) => self.view.read_locate_hash(hash),
        }
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

    /// A reset for a segment to the VIP's port that belongs to no connection (RFC 9293: its
    /// sequence number is the segment's acknowledgement).
    fn reset_client(&self, in_port: u16, seg: &Segment<'_>, emit: &mut Vec<Emit>) {
        emit.push(reset_reply(in_port, seg, self.spec.vip.mac));
    }

    /// A segment from the target of a leg the switch has let go, or no longer holds: counted,
    /// and answered with a reset it takes (at its acknowledgement) unless it is one.
    fn stale_leg_segment(&self, in_port: u16, seg: &Segment<'_>, emit: &mut Vec<Emit>) {
        if !seg.verify_checksum() {
            // Not a segment the target sent: nothing to answer.
            self.stats.count_drop(Drop::BadTcpChecksum);
            return;
        }
        self.stats.count_drop(Drop::TcpStale);
        if !seg.has(flag::RST) {
            emit.push(reset_reply(in_port, seg, seg.dst_mac()));
        }
    }

    /// Forgets closed flows after their linger and flows that never carried a request after
    /// [`IDLE_OPEN`]; moves on flows whose requests wait (a SYN sent again, a wait given up).
    pub(super) fn age_splice(&mut self, now: Instant, emit: &mut Vec<Emit>) {
        self.send_deferred_acks(now, emit);
        let Some(splice) = self.splice.as_mut() else {
            return;
        };
        if splice.aged.is_some_and(|t| now < t + AGE_EVERY) {
            // Ticked for something else (a held acknowledgement, another stage's deadline).
            return;
        }
        let legs = &mut splice.legs;
        let per_address = &mut splice.per_address;
        let offload = &mut splice.offload;
        splice.aged = Some(now);
        splice.flows.retain(|client, f| {
            let keep = match f.closed {
                Some(at) => now.saturating_duration_since(at) < LINGER,
                None => !f.legs.is_empty() || now.saturating_duration_since(f.seen) < IDLE_OPEN,
            };
            if !keep {
                for leg in &f.legs {
                    legs.remove(&(client.0, leg.sport));
                    if let Some(o) = offload.as_mut() {
                        o.forget(leg_key(*client, leg));
                    }
                }
                if let Some(n) = per_address.get_mut(&client.0) {
                    *n -= 1;
                    if *n == 0 {
                        per_address.remove(&client.0);
                    }
                }
            }
            keep
        });
        let waiting: Vec<(Ipv4Addr, u16)> = splice
            .flows
            .iter()
            .filter(|(_, f)| {
                f.closed.is_none()
                    && (!f.held.is_empty()
                        || f.legs.iter().any(|l| l.their_isn.is_none() && !l.fin))
            })
            .map(|(c, _)| *c)
            .collect();
        for client in waiting {
            if let Some(mut flow) = self.flow_take(client) {
                self.pump(client, &mut flow, now, emit);
                self.splice_put(client, flow);
            }
        }
        self.probe_silent(now, emit);
        self.count_flows();
    }

    /// Asks clients silent for the idle time whether they are still there: a keepalive probe
    /// (an acknowledgement of a byte they had already, which their stack answers), again
    /// every quarter of the idle time (at least [`PROBE_EVERY_MIN`], at most
    /// [`PROBE_EVERY_MAX`]); after [`PROBES`] unanswered, the connection is reset towards
    /// the client and every leg, and forgotten after its linger. A client that went without a
    /// word (its host gone, or one that holds connections open to fill the table) so gives
    /// its flow back.
    fn probe_silent(&mut self, now: Instant, emit: &mut Vec<Emit>) {
        let Some(splice) = self.splice.as_ref() else {
            return;
        };
        let idle = splice.idle;
        let every = (idle / 4).clamp(PROBE_EVERY_MIN, PROBE_EVERY_MAX);
        let due = |f: &Flow| {
            f.closed.is_none()
                && !f.legs.is_empty()
                && now.saturating_duration_since(f.seen) >= idle
                && (f.probes == 0 || now.saturating_duration_since(f.probed) >= every)
        };
        let silent: Vec<(Ipv4Addr, u16)> = splice
            .flows
            .iter()
            .filter(|(_, f)| due(f))
            .map(|(c, _)| *c)
            .collect();
        for client in silent {
            // Taking it back books what the fast path carried, which may show the client.
            let Some(mut flow) = self.flow_take(client) else {
                continue;
            };
            if due(&flow) {
                if flow.probes >= PROBES {
                    stats::inc(&self.stats.tcp_idle_resets);
                    self.end_flow(client, &mut flow, now, emit, true);
                } else {
                    // Below what the client has acknowledged: never in its window, always
                    // answered.
                    let (seq, ack) = (flow.client_acked.wrapping_sub(1), flow.last_ack);
                    self.client_send(client, &mut flow, seq, ack, &[], flag::ACK, emit);
                    stats::inc(&self.stats.tcp_keepalive_probes);
                    flow.probes += 1;
                    flow.probed = now;
                }
            }
            self.splice_put(client, flow);
        }
    }

    fn count_flows(&self) {
        if let Some(s) = &self.splice {
            self.stats
                .tcp_flows
                .store(s.flows() as u64, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Whether leg `i`'s acknowledgement `ack` may wait (see `Switch::ack_legs`): not the active
/// leg, open, owing the client nothing, on a flow that is not closing, and `ack` says the
/// client has all its replies.
fn may_wait(flow: &Flow, i: usize, ack: u32) -> bool {
    let leg = &flow.legs[i];
    flow.active != Some(i)
        && flow.fins == 0
        && still_open(flow, i)
        && leg.replies.settled()
        && ack == leg.read
}

/// Whether leg `i` waits for an acknowledgement [`may_wait`] let the switch hold back.
fn ack_owed(flow: &Flow, i: usize) -> bool {
    let leg = &flow.legs[i];
    leg.their_isn.is_some()
        && still_open(flow, i)
        && leg
            .ack_due
            .is_some_and(|due| tcp::before(leg.acked_to, due))
}

/// Whether leg `i` and its flow are open on every side: an acknowledgement held for it is
/// still worth sending.
fn still_open(flow: &Flow, i: usize) -> bool {
    let leg = &flow.legs[i];
    flow.closed.is_none() && !leg.fin && !leg.gone
}

/// Leg `leg` of `client`'s flow as its target's segments name it.
fn leg_key(client: (Ipv4Addr, u16), leg: &Leg) -> LegKey {
    LegKey {
        target: (leg.ip, leg.port),
        leg: (client.0, leg.sport),
    }
}

/// What the fast path sent on leg `i` while it held it, booked as if the switch had: the
/// reply run grows, the replies framed whole are no longer owed.
fn book_sent(flow: &mut Flow, i: usize, sent: &LegSent) {
    if let Some(c) = sent.client {
        // The client's bytes it gave the leg: one run at the leg's offset.
        if tcp::before(flow.edge, c.next_in) {
            let grown = c.next_in.wrapping_sub(flow.edge);
            flow.place_request(i, grown);
            flow.legs[i].next = flow.legs[i].next.wrapping_add(grown);
        }
        for _ in 0..sent.requests {
            flow.legs[i]
                .replies
                .expect(Owes::Memcache(ReplyKind::Retrieval));
        }
        if tcp::before(flow.client_acked, c.acked) {
            flow.client_acked = c.acked;
        }
        flow.client_window = c.window;
        if tcp::before(flow.legs[i].acked_to, c.acked_to) {
            flow.legs[i].acked_to = c.acked_to;
        }
    }
    let leg = &mut flow.legs[i];
    if tcp::before(leg.read, sent.read) {
        let new = sent.read.wrapping_sub(leg.read);
        leg.read = sent.read;
        if let Some(run) = flow.replies.back_mut() {
            run.len = run.len.wrapping_add(new);
        }
        flow.out = flow.out.wrapping_add(new);
        if tcp::before(flow.sent, flow.out) {
            flow.sent = flow.out;
        }
    }
    let answered = (sent.answered as usize).min(leg.replies.owed.len());
    leg.replies.owed.drain(..answered);
    leg.replies.data = sent.data as usize;
    if tcp::before(leg.acked, sent.acked) && !tcp::before(leg.next, sent.acked) {
        leg.acked = sent.acked;
    }
    if let Some((ack, window)) = sent.last {
        flow.last_ack = ack;
        flow.window = window;
    }
}

/// The active leg of `flow` and how a fast path may send its replies on, when what it sends
/// next needs no decision of the switch's: a server's leg owing replies to single-key
/// retrievals only, their framing at a line's start, nothing waiting for another leg, no
/// other leg owing anything, and the client's bytes it has not acknowledged all at one offset
/// from its own (so that its acknowledgements are the client's by one addition). The client's
/// segments may go on too (`get`s of this server's keys, acknowledgements) when no request's
/// data block streams and every other leg has been told the client has all its replies.
fn hand_over(
    client: (Ipv4Addr, u16),
    flow: &mut Flow,
    vip: (Ipv4Addr, u16),
) -> Option<(usize, LegHandOver)> {
    if flow.closed.is_some()
        || flow.sticky
        || !flow.held.is_empty()
        || flow.held_fin
        || flow.fins != 0
        || flow.probes != 0
    {
        // (A probed client's answer must reach the switch, not the fast path.)
        return None;
    }
    let i = flow.active?;
    let idle = |l: &Leg| l.replies.settled() && !tcp::before(l.acked, l.next);
    if flow
        .legs
        .iter()
        .enumerate()
        .any(|(j, l)| j != i && !l.fin && !idle(l))
    {
        return None;
    }
    let leg = &flow.legs[i];
    let r = &leg.replies;
    if !matches!(leg.target, Target::Server(_))
        || leg.their_isn.is_none()
        || leg.fin
        || leg.gone
        || r.owed.iter().any(|k| *k != ReplyKind::Retrieval)
        || !r.line.is_empty()
        || r.lost
        || r.ends_with_data
        || r.owed_resp != 0
        || !r.arrays.is_empty()
    {
        return None;
    }
    let run = flow.replies.back()?;
    if run.leg != i
        || run.client.wrapping_add(run.len) != flow.out
        || run.leg_seq.wrapping_add(run.len) != leg.read
    {
        return None;
    }
    let ack_off = flow.edge.wrapping_sub(leg.next);
    let (next, acked) = (leg.next, leg.acked);
    flow.acked_for_client();
    if flow
        .requests
        .iter()
        .any(|r| r.leg != i || r.client.wrapping_sub(r.leg_seq) != ack_off)
    {
        return None;
    }
    let leg = &flow.legs[i];
    let Target::Server(server) = leg.target else {
        return None;
    };
    // The client's segments too, when nothing but this leg has to hear of its bytes: no
    // request streams, and every other leg has been told of all its replies' receipt.
    // (A leg whose acknowledgement the switch holds back is told from what the switch knows
    // already: the client had all its replies.)
    let others_told = flow.legs.iter().enumerate().all(|(j, l)| {
        j == i
            || l.fin
            || l.their_isn.is_none()
            || !tcp::before(l.acked_to, l.read)
            || l.ack_due == Some(l.read)
    });
    let requests =
        (flow.data_left == 0 && flow.resp_left == 0 && others_told).then_some(ClientSide {
            next_in: flow.edge,
            acked: flow.client_acked,
            window: flow.client_window,
            acked_to: leg.acked_to,
            leg_shift: leg.client_shift,
        });
    if leg.replies.owed.is_empty() && requests.is_none() {
        // Nothing the program could send on.
        return None;
    }
    Some((
        i,
        LegHandOver {
            target_mac: leg.mac,
            target_port: leg.out,
            client_mac: flow.mac,
            client_port: client.1,
            client_at: flow.port,
            vip,
            target_shift: leg.target_shift,
            client_shift: flow.wscale.map_or(0, |_| OUR_WSCALE),
            seq_from: leg.read,
            seq_off: flow.out.wrapping_sub(leg.read),
            ack_from: acked,
            ack_to: next,
            ack_off,
            owed: u32::try_from(leg.replies.owed.len()).ok()?,
            data: u32::try_from(leg.replies.data).ok()?,
            server,
            requests,
        },
    ))
}

/// The ends of a segment to a leg, in the client's name.
fn leg_ends(client: (Ipv4Addr, u16), flow: &Flow, leg: &Leg) -> tcp::Ends {
    tcp::Ends {
        src_mac: flow.mac,
        dst_mac: leg.mac,
        src_ip: client.0,
        dst_ip: leg.ip,
    }
}

/// Segment `seg` to leg `i`, in the client's name.
fn leg_emit(
    client: (Ipv4Addr, u16),
    flow: &Flow,
    i: usize,
    seg: &tcp::Repr,
    payload: &[u8],
) -> Emit {
    let leg = &flow.legs[i];
    Emit {
        dest: Dest::Port(leg.out),
        frame: seg.frame(&leg_ends(client, flow, leg), payload),
    }
}

/// A reset to leg `i`, at the next sequence number it expects.
fn leg_reset(client: (Ipv4Addr, u16), flow: &Flow, i: usize) -> Emit {
    let leg = &flow.legs[i];
    let rst = tcp::Repr::plain(leg.sport, leg.port, leg.next, 0, flag::RST, 0);
    leg_emit(client, flow, i, &rst, &[])
}

/// The reset that answers `seg` on the port it came in on, from the address it was sent to
/// (with `src_mac` as the frame's source): at its acknowledgement when it carries one (the
/// sequence number its sender expects next), else acknowledging it.
fn reset_reply(in_port: u16, seg: &Segment<'_>, src_mac: Mac) -> Emit {
    let (seq, ack, flags) = if seg.has(flag::ACK) {
        (seg.ack(), 0, flag::RST)
    } else {
        (
            0,
            seg.seq().wrapping_add(seg.seq_len()),
            flag::RST | flag::ACK,
        )
    };
    let rst = tcp::Repr::plain(seg.dst_port(), seg.src_port(), seq, ack, flags, 0);
    let ends = tcp::Ends {
        src_mac,
        dst_mac: seg.src_mac(),
        src_ip: seg.dst_ip(),
        dst_ip: seg.src_ip(),
    };
    Emit {
        dest: Dest::Port(in_port),
        frame: rst.frame(&ends, &[]),
    }
}

/// Whether `port` is one legs are opened from.
fn is_leg_port(port: u16) -> bool {
    port >= FIRST_LEG_PORT
}

/// A window advertised with shift `from`, advertised again with shift `to`.
/// A RESP line `<kind><number>\r\n` at the front of `bytes`: the number and the line's length.
/// `None` while incomplete, or if it is not one.
fn resp_line(bytes: &[u8], kind: u8) -> Option<(i64, usize)> {
    if bytes.first() != Some(&kind) {
        return None;
    }
    let cr = bytes.iter().take(24).position(|&b| b == b'\r')?;
    if bytes.get(cr + 1) != Some(&b'\n') {
        return None;
    }
    Some((resp::string2ll(&bytes[1..cr])?, cr + 2))
}

/// A bulk argument's header at the front of `bytes`: its length and the bytes of data (with
/// the two that end them) that follow. `None` while incomplete; an error for what a server
/// refuses.
fn bulk_header(bytes: &[u8]) -> Option<Result<(usize, usize), ()>> {
    if bytes.first().is_some_and(|&b| b != b'$') {
        return Some(Err(()));
    }
    let Some(cr) = bytes.iter().position(|&b| b == b'\r') else {
        return (bytes.len() > 24).then_some(Err(()));
    };
    if cr + 1 >= bytes.len() {
        return None;
    }
    let len = resp::string2ll(&bytes[1..cr])
        .filter(|&n| n >= 0 && n as u64 <= resp::MAX_BULK && bytes[cr + 1] == b'\n');
    Some(len.map(|n| (cr + 2, n as usize + 2)).ok_or(()))
}

fn rescale(window: u16, from: u8, to: u8) -> u16 {
    ((u32::from(window) << from) >> to).min(u32::from(u16::MAX)) as u16
}

/// Whether `bytes` starts with a `quit` line.
fn is_quit(bytes: &[u8]) -> bool {
    matches!(
        memcache::parse_text_head(bytes),
        Ok(Some(r)) if r.command == Command::Quit
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::udp_frame;
    use crate::spec::{Local, Server, TcpSplice};

    const CLIENT_MAC: Mac = Mac([2, 0, 0, 0, 0, 1]);
    const CLIENT: (Ipv4Addr, u16) = (Ipv4Addr::new(10, 0, 0, 1), 40_000);
    const VIP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 100);

    fn server(i: u8) -> (Ipv4Addr, Mac) {
        (
            Ipv4Addr::new(10, 0, 0, 11 + i),
            Mac([2, 0, 0, 0, 0, 0x0b + i]),
        )
    }

    struct Bed {
        sw: Switch,
        stats: Arc<Stats>,
        view: Arc<View>,
        now: Instant,
        emit: Vec<Emit>,
    }

    impl Bed {
        /// Two servers on ports 1 and 2, the client on port 0, the local port 3.
        fn new() -> Bed {
            Bed::speaking(false)
        }

        /// A bed whose pool is a Redis pool.
        fn redis() -> Bed {
            Bed::speaking(true)
        }

        fn speaking(redis: bool) -> Bed {
            let servers = (0..2)
                .map(|i| Server {
                    addr: SocketAddrV4::new(server(i).0, 11211),
                    mac: Some(server(i).1),
                })
                .collect();
            let mut spec = SwitchSpec::new(4, VIP, servers);
            spec.local = Some(Local {
                port: 3,
                addrs: vec![VIP],
                source: VIP,
            });
            spec.tcp_splice = Some(TcpSplice::new(4));
            spec.seed = 7;
            spec.redis = redis;
            let pool = spec.pool_spec(kv::Distribution::Ketama, kv::HashFn::Md5);
            let pool = Arc::new(Pool::new(pool).unwrap());
            let stats = Arc::new(Stats::new(4, 2));
            let now = Instant::from_secs(1_000);
            let sw = Switch::new(spec, pool.clone(), stats.clone()).unwrap();
            let mut bed = Bed {
                sw,
                stats,
                view: pool.view(now),
                now,
                emit: Vec::new(),
            };
            for i in 0..2 {
                let (ip, mac) = server(i);
                let ends = UdpEnds::between((mac, ip, 9), (Mac::BROADCAST, Ipv4Addr::BROADCAST, 9));
                bed.process(u16::from(i) + 1, udp_frame(&ends, &[b"hello"]));
            }
            bed.emit.clear();
            bed
        }

        fn process(&mut self, port: u16, mut frame: Vec<u8>) -> Fate {
            self.sw
                .process(port, &mut frame, true, self.now, &mut self.emit)
        }

        fn key_on(&self, i: usize) -> String {
            (0..)
                .map(|n| format!("key{n}"))
                .find(|k| self.view.locate(k.as_bytes()) == Some(i))
                .unwrap()
        }

        /// A segment from the client to the VIP's memcached port.
        fn client_sends(&mut self, seq: u32, ack: u32, flags: u8, payload: &[u8]) {
            self.sends_from(CLIENT, seq, ack, flags, payload);
        }

        /// A segment from `from` (on the client's port and MAC) to the VIP's memcached port.
        fn sends_from(
            &mut self,
            from: (Ipv4Addr, u16),
            seq: u32,
            ack: u32,
            flags: u8,
            payload: &[u8],
        ) {
            let ends = tcp::Ends {
                src_mac: CLIENT_MAC,
                dst_mac: Mac([2, 0, 0, 0, 0, 0x64]),
                src_ip: from.0,
                dst_ip: VIP,
            };
            let frame = segment((from.1, 11211), (seq, ack, flags, 1000), &ends, payload);
            assert_eq!(self.process(0, frame), Fate::Consumed);
        }

        /// A segment from server `i` to the client.
        fn server_sends(
            &mut self,
            i: u8,
            to_port: u16,
            seq: u32,
            ack: u32,
            flags: u8,
            payload: &[u8],
        ) {
            let (ip, mac) = server(i);
            let ends = tcp::Ends {
                src_mac: mac,
                dst_mac: CLIENT_MAC,
                src_ip: ip,
                dst_ip: CLIENT.0,
            };
            let frame = segment((11211, to_port), (seq, ack, flags, 500), &ends, payload);
            assert_eq!(self.process(u16::from(i) + 1, frame), Fate::Consumed);
        }

        /// A segment from the host's stack (the proxy) on the local port, to a leg port.
        fn host_sends(&mut self, to_port: u16, seq: u32, ack: u32, flags: u8, payload: &[u8]) {
            let ends = tcp::Ends {
                src_mac: Mac([2, 0, 0, 0, 0, 0x64]),
                dst_mac: CLIENT_MAC,
                src_ip: VIP,
                dst_ip: CLIENT.0,
            };
            let frame = segment((11211, to_port), (seq, ack, flags, 500), &ends, payload);
            assert_eq!(self.process(3, frame), Fate::Consumed);
        }

        /// Answers the SYN among `sent` to server `i`'s port with the server's SYN-ACK, its
        /// initial sequence number `isn`: the leg's port and the switch's initial sequence
        /// number on it.
        fn accept_leg(&mut self, sent: &[(u16, Vec<u8>)], i: u8, isn: u32) -> (u16, u32) {
            let syn = sent
                .iter()
                .map(|(p, f)| (*p, seg(f)))
                .find(|(p, f)| *p == u16::from(i) + 1 && f.has(flag::SYN))
                .unwrap_or_else(|| panic!("a SYN to server {i}: {sent:?}"))
                .1;
            let (port, leg_isn) = (syn.src_port(), syn.seq());
            let ack = leg_isn.wrapping_add(1);
            self.server_sends(i, port, isn, ack, flag::SYN | flag::ACK, b"");
            (port, leg_isn)
        }

        /// The frames emitted since the last call, as (port, segment's copy).
        fn sent(&mut self) -> Vec<(u16, Vec<u8>)> {
            self.emit
                .drain(..)
                .map(|e| match e.dest {
                    Dest::Port(p) => (p, e.frame),
                    Dest::Flood => (u16::MAX, e.frame),
                })
                .collect()
        }

        fn flows(&self) -> usize {
            self.sw.splice.as_ref().map_or(0, Splice::flows)
        }
    }

    /// A segment's frame: `ports` (source, destination), `(seq, ack, flags, window)`, and a
    /// SYN's MSS and window scale.
    fn segment(
        ports: (u16, u16),
        (seq, ack, flags, window): (u32, u32, u8, u16),
        ends: &tcp::Ends,
        payload: &[u8],
    ) -> Vec<u8> {
        let syn = flags & flag::SYN != 0;
        tcp::Repr {
            src_port: ports.0,
            dst_port: ports.1,
            seq,
            ack,
            flags,
            window,
            mss: syn.then_some(1460),
            wscale: syn.then_some(7),
        }
        .frame(ends, payload)
    }

    fn seg(frame: &[u8]) -> Segment<'_> {
        Segment::parse(frame).unwrap()
    }

    /// A flow whose first request, a `get` of a key on server 0, is answered `END` on a new
    /// leg: the client's cookie, the leg's port, the leg's next sequence number and the
    /// client's.
    fn one_get_answered(bed: &mut Bed) -> (u32, u16, u32, u32) {
        let cookie = handshake(bed);
        let k0 = bed.key_on(0);
        let get = format!("get {k0}\r\n");
        bed.client_sends(1001, cookie.wrapping_add(1), flag::ACK, get.as_bytes());
        let sent = bed.sent();
        let (p0, syn) = bed.accept_leg(&sent, 0, 50_000);
        let got = syn.wrapping_add(1 + get.len() as u32);
        bed.server_sends(0, p0, 50_001, got, flag::ACK, b"END\r\n");
        bed.sent();
        (cookie, p0, got, 1001 + get.len() as u32)
    }

    /// The handshake with the client: its cookie.
    fn handshake(bed: &mut Bed) -> u32 {
        bed.client_sends(1000, 0, flag::SYN, b"");
        let sent = bed.sent();
        assert_eq!(sent.len(), 1);
        let syn_ack = seg(&sent[0].1);
        assert_eq!(sent[0].0, 0);
        assert!(syn_ack.has(flag::SYN) && syn_ack.has(flag::ACK));
        assert_eq!(syn_ack.ack(), 1001);
        assert_eq!(syn_ack.options().mss, Some(OUR_MSS));
        assert_eq!(syn_ack.options().wscale, Some(OUR_WSCALE));
        assert!(syn_ack.verify_checksum());
        let cookie = syn_ack.seq();
        bed.client_sends(1001, cookie.wrapping_add(1), flag::ACK, b"");
        cookie
    }

    #[test]
    fn syns_are_answered_from_the_cookie_alone() {
        let mut bed = Bed::new();
        for port in 0..200u16 {
            let seg = tcp::Repr {
                src_port: 20_000 + port,
                dst_port: 11211,
                seq: u32::from(port) * 7919,
                ack: 0,
                flags: flag::SYN,
                window: 1000,
                mss: Some(1400),
                wscale: None,
            };
            let ends = tcp::Ends {
                src_mac: CLIENT_MAC,
                dst_mac: Mac([2, 0, 0, 0, 0, 0x64]),
                src_ip: CLIENT.0,
                dst_ip: VIP,
            };
            bed.process(0, seg.frame(&ends, b""));
        }
        assert_eq!(bed.sent().len(), 200);
        assert_eq!(bed.flows(), 0, "nothing is kept for a SYN");
        assert_eq!(stats::get(&bed.stats.tcp_syn_cookies), 200);
        // An ACK whose cookie is wrong opens nothing and is answered with a reset.
        bed.client_sends(1001, 12345, flag::ACK, b"get a\r\n");
        let sent = bed.sent();
        assert_eq!(sent.len(), 1);
        assert!(seg(&sent[0].1).has(flag::RST));
        assert_eq!(bed.flows(), 0);
        assert_eq!(stats::get(&bed.stats.drops[Drop::TcpBadCookie as usize]), 1);
        // The right one opens a flow.
        handshake(&mut bed);
        assert_eq!(bed.flows(), 1);
    }

    #[test]
    fn requests_go_to_their_servers_on_legs_and_replies_come_back_in_the_clients_space() {
        let mut bed = Bed::new();
        let cookie = handshake(&mut bed);
        let (k0, k1) = (bed.key_on(0), bed.key_on(1));
        let first = format!("get {k0}\r\n");
        bed.client_sends(
            1001,
            cookie.wrapping_add(1),
            flag::ACK | flag::PSH,
            first.as_bytes(),
        );
        // The switch opens a connection to k0's server in the client's name.
        let sent = bed.sent();
        assert_eq!(sent.len(), 1, "{sent:?}");
        let syn = seg(&sent[0].1);
        assert_eq!(sent[0].0, 1);
        assert!(syn.has(flag::SYN) && !syn.has(flag::ACK));
        // From the client's address and a leg port of the switch's.
        assert_eq!(syn.src_ip(), CLIENT.0);
        assert!(syn.src_port() >= FIRST_LEG_PORT);
        assert_eq!((syn.dst_ip(), syn.dst_port()), (server(0).0, 11211));
        assert_eq!(syn.options().wscale, Some(7));
        let leg_isn = syn.seq();
        let p0 = syn.src_port();
        // Its SYN-ACK: the handshake ends and the request goes on.
        bed.server_sends(
            0,
            p0,
            50_000,
            leg_isn.wrapping_add(1),
            flag::SYN | flag::ACK,
            b"",
        );
        let sent = bed.sent();
        assert_eq!(sent.len(), 2, "{sent:?}");
        assert_eq!(seg(&sent[0].1).payload(), b"");
        let data = seg(&sent[1].1);
        assert_eq!(data.payload(), first.as_bytes());
        assert_eq!(data.seq(), leg_isn.wrapping_add(1));
        assert_eq!(data.ack(), 50_001);
        assert!(data.verify_checksum());
        // The reply reaches the client at the cookie's next sequence number, from the VIP.
        let ack = leg_isn.wrapping_add(1 + first.len() as u32);
        bed.server_sends(0, p0, 50_001, ack, flag::ACK | flag::PSH, b"END\r\n");
        let sent = bed.sent();
        let reply = sent
            .iter()
            .find(|(p, _)| *p == 0)
            .expect("a reply to the client");
        let reply = seg(&reply.1);
        assert_eq!((reply.src_ip(), reply.src_port()), (VIP, 11211));
        assert_eq!(reply.seq(), cookie.wrapping_add(1));
        assert_eq!(reply.ack(), 1001 + first.len() as u32);
        assert_eq!(reply.payload(), b"END\r\n");
        assert!(reply.verify_checksum());

        // A request for the other server: a second leg, and its reply after the first's.
        let second = format!("get {k1}\r\n");
        let at = 1001 + first.len() as u32;
        bed.client_sends(
            at,
            cookie.wrapping_add(6),
            flag::ACK | flag::PSH,
            second.as_bytes(),
        );
        let sent = bed.sent();
        let (p1, leg1) = bed.accept_leg(&sent, 1, 90_000);
        let sent = bed.sent();
        let data = sent
            .iter()
            .find(|(p, f)| *p == 2 && !seg(f).payload().is_empty())
            .expect("the request");
        assert_eq!(seg(&data.1).payload(), second.as_bytes());
        bed.server_sends(
            1,
            p1,
            90_001,
            leg1.wrapping_add(1 + second.len() as u32),
            flag::ACK,
            b"END\r\n",
        );
        let sent = bed.sent();
        let reply = sent
            .iter()
            .find(|(p, _)| *p == 0)
            .expect("the second reply");
        let reply = seg(&reply.1);
        assert_eq!(reply.seq(), cookie.wrapping_add(6));
        assert_eq!(reply.ack(), at + second.len() as u32);
        assert_eq!(stats::get(&bed.stats.tcp_spliced), 1);
        assert_eq!(stats::get(&bed.stats.tcp_legs), 1);
        assert_eq!(stats::get(&bed.stats.tcp_requests), 2);

        // Bytes the first server sends unasked: the flow cannot be trusted and is reset.
        bed.server_sends(0, p0, 50_006, ack, flag::ACK, b"EXTRA\r\n");
        let sent = bed.sent();
        assert!(
            sent.iter().any(|(p, f)| *p == 0 && seg(f).has(flag::RST)),
            "{sent:?}"
        );
        assert_eq!(
            stats::get(&bed.stats.drops[Drop::TcpRepliesLost as usize]),
            1
        );
    }

    #[test]
    fn a_request_waits_for_the_other_legs_replies() {
        let mut bed = Bed::new();
        let cookie = handshake(&mut bed);
        let (k0, k1) = (bed.key_on(0), bed.key_on(1));
        // Two requests in one segment, for two servers.
        let both = format!("get {k0}\r\nget {k1}\r\n");
        bed.client_sends(1001, cookie.wrapping_add(1), flag::ACK, both.as_bytes());
        let syn = bed.sent().remove(0);
        let leg0 = seg(&syn.1).seq();
        let p0 = seg(&syn.1).src_port();
        bed.server_sends(0, p0, 7, leg0.wrapping_add(1), flag::SYN | flag::ACK, b"");
        let sent = bed.sent();
        // Only the first request went; the second waits for its reply (its leg may open).
        let to0: Vec<_> = sent
            .iter()
            .filter(|(p, f)| *p == 1 && !seg(f).payload().is_empty())
            .collect();
        assert_eq!(to0.len(), 1);
        assert_eq!(seg(&to0[0].1).payload(), format!("get {k0}\r\n").as_bytes());
        assert!(sent
            .iter()
            .all(|(p, f)| *p != 2 || seg(f).payload().is_empty()));
        // Leg 1 opens early.
        bed.accept_leg(&sent, 1, 70);
        assert!(bed.sent().iter().all(|(_, f)| seg(f).payload().is_empty()));
        // Half of the first reply: still waiting.
        bed.server_sends(0, p0, 8, leg0.wrapping_add(1), flag::ACK, b"VALUE ");
        assert!(bed.sent().iter().all(|(p, _)| *p != 2));
        bed.server_sends(
            0,
            p0,
            14,
            leg0.wrapping_add(1),
            flag::ACK,
            format!("{k0} 0 1\r\nx\r\nEND\r\n").as_bytes(),
        );
        let sent = bed.sent();
        let to1 = sent
            .iter()
            .find(|(p, f)| *p == 2 && !seg(f).payload().is_empty())
            .expect("the second request");
        assert_eq!(seg(&to1.1).payload(), format!("get {k1}\r\n").as_bytes());
    }

    /// The host's end of a leg is closed whichever side closes first, and never left waiting:
    /// an old connection the host still holds on the leg's ports is reset when it answers the
    /// SYN; the proxy closing before the client ends the flow on the client's FIN, which is
    /// acknowledged; what the host sends after the flow is forgotten is reset at its
    /// acknowledgement (the sequence number it expects).
    #[test]
    fn the_hosts_end_of_a_leg_is_closed_whichever_side_closes_first() {
        let mut bed = Bed::new();
        let cookie = handshake(&mut bed);
        let request = b"version\r\n";
        bed.client_sends(1001, cookie.wrapping_add(1), flag::ACK, request);
        let sent = bed.sent();
        assert_eq!(sent.len(), 1, "{sent:?}");
        assert_eq!(sent[0].0, 3, "a keyless request goes to the host's leg");
        let leg_isn = seg(&sent[0].1).seq();
        let port = seg(&sent[0].1).src_port();

        // The host answers the SYN for a connection it still holds on these ports.
        bed.host_sends(port, 777, 12_345, flag::ACK, b"");
        let sent = bed.sent();
        assert_eq!(sent.len(), 2, "{sent:?}");
        let rst = seg(&sent[0].1);
        assert_eq!(sent[0].0, 3);
        assert!(rst.has(flag::RST));
        assert_eq!(
            rst.seq(),
            12_345,
            "a reset the host takes: at its acknowledgement"
        );
        assert_eq!((rst.src_ip(), rst.src_port()), (CLIENT.0, port));
        assert!(rst.verify_checksum());
        let syn = seg(&sent[1].1);
        assert!(
            syn.has(flag::SYN) && syn.seq() == leg_isn,
            "and the SYN goes again"
        );
        assert_eq!(stats::get(&bed.stats.drops[Drop::TcpStale as usize]), 1);

        bed.host_sends(
            port,
            5000,
            leg_isn.wrapping_add(1),
            flag::SYN | flag::ACK,
            b"",
        );
        let sent = bed.sent();
        assert_eq!(seg(&sent[1].1).payload(), request);
        // The proxy answers and closes at once.
        let reply = b"VERSION 1\r\n";
        let acked = leg_isn.wrapping_add(1 + request.len() as u32);
        bed.host_sends(port, 5001, acked, flag::ACK | flag::FIN, reply);
        let sent = bed.sent();
        let to_client: Vec<_> = sent.iter().filter(|(p, _)| *p == 0).collect();
        assert!(to_client.iter().any(|(_, f)| seg(f).payload() == reply));
        let fin = to_client
            .iter()
            .map(|(_, f)| seg(f))
            .find(|s| s.has(flag::FIN))
            .expect("the proxy's end reaches the client");
        assert_eq!(fin.seq(), cookie.wrapping_add(1 + reply.len() as u32));

        // The client's own FIN then ends the flow, and is acknowledged.
        let at = 1001 + request.len() as u32;
        let their_end = fin.seq().wrapping_add(1);
        bed.client_sends(at, their_end, flag::ACK | flag::FIN, b"");
        let sent = bed.sent();
        assert!(
            sent.iter()
                .any(|(p, f)| *p == 0 && seg(f).has(flag::ACK) && seg(f).ack() == at + 1),
            "{sent:?}"
        );
        assert!(sent.iter().any(|(p, f)| *p == 3 && seg(f).has(flag::RST)));
        bed.now += LINGER + Duration::from_secs(1);
        let now = bed.now;
        bed.sw.tick(now, &mut bed.emit);
        assert_eq!(
            bed.flows(),
            0,
            "a closed flow is forgotten after its linger"
        );
        assert_eq!(bed.sw.poll_at().map(|t| t > now), Some(true));

        // The host sends its FIN again: the flow is gone, and the reset ends its side.
        bed.sent();
        bed.host_sends(
            port,
            5001 + reply.len() as u32,
            acked + 1,
            flag::ACK | flag::FIN,
            b"",
        );
        let sent = bed.sent();
        assert_eq!(sent.len(), 1, "{sent:?}");
        let rst = seg(&sent[0].1);
        assert!(rst.has(flag::RST));
        assert_eq!((sent[0].0, rst.seq()), (3, acked + 1));
        assert_eq!(stats::get(&bed.stats.drops[Drop::TcpStale as usize]), 2);
    }

    /// The client's FIN is acknowledged once the leg has acknowledged it, not before; sent
    /// again by the client, it goes again to the leg.
    #[test]
    fn the_clients_fin_is_acknowledged_once_its_leg_has_it_and_sent_again_if_lost() {
        let mut bed = Bed::new();
        let (cookie, p0, got, fin_at) = one_get_answered(&mut bed);
        // The client has its reply and closes.
        let their = cookie.wrapping_add(1 + 5);
        bed.client_sends(fin_at, their, flag::ACK | flag::FIN, b"");
        let sent = bed.sent();
        let to_leg: Vec<_> = sent.iter().filter(|(p, _)| *p == 1).collect();
        assert!(
            to_leg
                .iter()
                .any(|(_, f)| seg(f).has(flag::FIN) && seg(f).seq() == got),
            "{sent:?}"
        );
        // The server's segment that does not acknowledge the FIN (a window update): the
        // client hears nothing of its FIN yet.
        bed.server_sends(0, p0, 50_006, got, flag::ACK, b"");
        let sent = [sent, bed.sent()].concat();
        assert!(
            !sent
                .iter()
                .any(|(p, f)| *p == 0 && tcp::before(fin_at, seg(f).ack())),
            "the FIN is not acknowledged before its leg has it: {sent:?}"
        );
        // The leg's copy was lost: the client sends its FIN again, and so does the switch.
        bed.client_sends(fin_at, their, flag::ACK | flag::FIN, b"");
        let sent = bed.sent();
        assert!(
            sent.iter()
                .any(|(p, f)| *p == 1 && seg(f).has(flag::FIN) && seg(f).seq() == got),
            "the FIN goes again to the leg: {sent:?}"
        );
        // The server takes it: the client's FIN is acknowledged.
        bed.server_sends(0, p0, 50_006, got.wrapping_add(1), flag::ACK, b"");
        let sent = bed.sent();
        assert!(
            sent.iter()
                .any(|(p, f)| *p == 0 && seg(f).ack() == fin_at.wrapping_add(1)),
            "{sent:?}"
        );
    }

    /// A leg the client left for another hears that the client has its replies from its next
    /// request, or at a tick shortly after: not in a segment of its own at the change of
    /// server.
    #[test]
    fn a_leg_left_for_another_hears_its_acknowledgement_later() {
        let mut bed = Bed::new();
        let (cookie, p0, got0, mut at) = one_get_answered(&mut bed);
        // The pure acknowledgements each server (server 0 on port 1, server 1 on 2) hears.
        let acks_to = |sent: &[(u16, Vec<u8>)], port: u16| -> Vec<u32> {
            sent.iter()
                .filter(|(p, f)| *p == port && seg(f).payload().is_empty())
                .map(|(_, f)| seg(f).ack())
                .collect()
        };
        let (k0, k1) = (bed.key_on(0), bed.key_on(1));
        let (get0, get1) = (format!("get {k0}\r\n"), format!("get {k1}\r\n"));
        let step = get0.len() as u32;
        assert_eq!(step, get1.len() as u32);
        // Server 1's leg opens at the first request for it, and answers.
        bed.client_sends(at, cookie.wrapping_add(6), flag::ACK, get1.as_bytes());
        let opened = bed.sent();
        let (p1, syn1) = bed.accept_leg(&opened, 1, 70_000);
        let mut next1 = syn1.wrapping_add(1 + step);
        bed.server_sends(1, p1, 70_001, next1, flag::ACK, b"END\r\n");
        bed.sent();
        at += step;
        let mut next0 = got0;

        // Back to server 0: its request goes; server 1, left, hears nothing yet...
        bed.client_sends(at, cookie.wrapping_add(11), flag::ACK, get0.as_bytes());
        let sent = bed.sent();
        assert!(
            sent.iter()
                .any(|(p, f)| *p == 1 && seg(f).payload() == get0.as_bytes()),
            "{sent:?}"
        );
        assert_eq!(acks_to(&sent, 2), Vec::<u32>::new(), "{sent:?}");
        next0 = next0.wrapping_add(step);
        bed.server_sends(0, p0, 50_006, next0, flag::ACK, b"END\r\n");
        bed.sent();
        at += step;
        // (The client's acknowledgement of that reply: the switch forgets the reply runs the
        // client has whole, server 1's among them, and still knows what server 1 is owed.)
        bed.client_sends(at, cookie.wrapping_add(16), flag::ACK, b"");
        assert_eq!(acks_to(&bed.sent(), 2), Vec::<u32>::new());
        // ... until a tick, once.
        bed.now += AGE_EVERY;
        let now = bed.now;
        bed.sw.tick(now, &mut bed.emit);
        let sent = bed.sent();
        assert_eq!(acks_to(&sent, 2), vec![70_006], "{sent:?}");
        assert_eq!(acks_to(&sent, 1), Vec::<u32>::new(), "{sent:?}");
        bed.now += AGE_EVERY;
        let now = bed.now;
        bed.sw.tick(now, &mut bed.emit);
        assert_eq!(acks_to(&bed.sent(), 2), Vec::<u32>::new(), "told once");
        // Server 1 did not hear it and sends its reply again: it is acknowledged again at
        // once, though the switch has forgotten where that reply lay in the client's stream.
        bed.server_sends(1, p1, 70_001, next1, flag::ACK, b"END\r\n");
        let sent = bed.sent();
        assert_eq!(acks_to(&sent, 2), vec![70_006], "{sent:?}");
        assert!(
            sent.iter().all(|(p, _)| *p != 0),
            "nothing again to the client"
        );

        // To server 1 and straight back to server 0: server 0's next request carries what it
        // was owed, and the ageing tells server 1 alone.
        bed.client_sends(at, cookie.wrapping_add(16), flag::ACK, get1.as_bytes());
        assert_eq!(acks_to(&bed.sent(), 1), Vec::<u32>::new());
        next1 = next1.wrapping_add(step);
        bed.server_sends(1, p1, 70_006, next1, flag::ACK, b"END\r\n");
        bed.sent();
        at += step;
        bed.client_sends(at, cookie.wrapping_add(21), flag::ACK, get0.as_bytes());
        let sent = bed.sent();
        let request = sent
            .iter()
            .map(|(p, f)| (*p, seg(f)))
            .find(|(p, f)| *p == 1 && f.payload() == get0.as_bytes())
            .expect("the request to server 0");
        assert_eq!(request.1.ack(), 50_011);
        bed.now += AGE_EVERY;
        let now = bed.now;
        bed.sw.tick(now, &mut bed.emit);
        let sent = bed.sent();
        assert_eq!(acks_to(&sent, 1), Vec::<u32>::new(), "{sent:?}");
        assert_eq!(acks_to(&sent, 2), vec![70_011], "{sent:?}");
    }

    /// A client silent for the idle time is sent keepalive probes; one that answers keeps its
    /// connection, one that answers none of them has it reset on both sides and forgotten,
    /// and a server's segments meanwhile do not count as the client's.
    #[test]
    fn a_silent_client_is_probed_and_its_connection_forgotten_when_it_never_answers() {
        let mut bed = Bed::new();
        let idle = TcpSplice::DEFAULT_IDLE;
        let every = idle / 4;
        let (cookie, p0, got, at) = one_get_answered(&mut bed);
        bed.client_sends(at, cookie.wrapping_add(6), flag::ACK, b"");
        bed.sent();
        let tick = |bed: &mut Bed, by: Duration| {
            bed.now += by;
            let now = bed.now;
            bed.sw.tick(now, &mut bed.emit);
            bed.sent()
        };
        let probe_of = |sent: &[(u16, Vec<u8>)]| {
            sent.iter()
                .filter(|(p, _)| *p == 0)
                .map(|(_, f)| seg(f))
                .find(|s| s.flags() == flag::ACK && s.payload().is_empty())
                .map(|s| (s.seq(), s.ack()))
        };

        // Not yet silent for long enough: nothing.
        assert_eq!(
            probe_of(&tick(&mut bed, idle - Duration::from_secs(1))),
            None
        );
        // A probe: an acknowledgement of the last byte the client has.
        let sent = tick(&mut bed, Duration::from_secs(1));
        assert_eq!(
            probe_of(&sent),
            Some((cookie.wrapping_add(5), at)),
            "{sent:?}"
        );
        assert_eq!(stats::get(&bed.stats.tcp_keepalive_probes), 1);
        // The client's stack answers: no more probes until it is silent again.
        bed.client_sends(at, cookie.wrapping_add(6), flag::ACK, b"");
        bed.sent();
        assert_eq!(probe_of(&tick(&mut bed, every)), None);

        // Now it never answers. A server's retransmission is not the client's word.
        let sent = tick(&mut bed, idle - every);
        assert!(probe_of(&sent).is_some(), "{sent:?}");
        bed.server_sends(0, p0, 50_001, got, flag::ACK, b"END\r\n");
        bed.sent();
        for n in 2..=PROBES {
            let sent = tick(&mut bed, every);
            assert!(probe_of(&sent).is_some(), "probe {n}: {sent:?}");
        }
        assert_eq!(
            stats::get(&bed.stats.tcp_keepalive_probes),
            1 + u64::from(PROBES)
        );
        // After the last probe's wait the connection is reset towards the client and the leg.
        let sent = tick(&mut bed, every);
        assert!(
            sent.iter().any(|(p, f)| *p == 0 && seg(f).has(flag::RST)),
            "{sent:?}"
        );
        assert!(
            sent.iter()
                .any(|(p, f)| *p == 1 && seg(f).has(flag::RST) && seg(f).src_port() == p0),
            "{sent:?}"
        );
        assert_eq!(stats::get(&bed.stats.tcp_idle_resets), 1);
        tick(&mut bed, LINGER + Duration::from_secs(1));
        assert_eq!(bed.flows(), 0, "the flow is forgotten after its linger");
    }

    /// A server that does not take the client's window scale reads the client's windows
    /// unscaled: they reach it shifted up by the client's scale (at most 65,535).
    #[test]
    fn a_server_without_window_scaling_gets_the_clients_window_unscaled() {
        let mut bed = Bed::new();
        let cookie = handshake(&mut bed);
        let k0 = bed.key_on(0);
        let get = format!("get {k0}\r\n");
        // The client's window is 1,000 in units of 2^7.
        bed.client_sends(1001, cookie.wrapping_add(1), flag::ACK, get.as_bytes());
        let sent = bed.sent();
        let syn = seg(&sent[0].1);
        let (ip, mac) = server(0);
        let ends = tcp::Ends {
            src_mac: mac,
            dst_mac: CLIENT_MAC,
            src_ip: ip,
            dst_ip: CLIENT.0,
        };
        let syn_ack = tcp::Repr {
            mss: Some(1460),
            wscale: None,
            ..tcp::Repr::plain(
                11211,
                syn.src_port(),
                50_000,
                syn.seq().wrapping_add(1),
                flag::SYN | flag::ACK,
                500,
            )
        }
        .frame(&ends, &[]);
        assert_eq!(bed.process(1, syn_ack), Fate::Consumed);
        let sent = bed.sent();
        assert!(!sent.is_empty());
        for (port, frame) in &sent {
            assert_eq!(*port, 1);
            assert_eq!(seg(frame).window(), u16::MAX, "1,000 << 7, at most 65,535");
        }
    }

    /// One client address holds at most a quarter of `tcp_max_flows`: past it, its new
    /// connections are reset while another address's are still taken.
    #[test]
    fn one_address_holds_a_share_of_the_flows_only() {
        // The bed's table holds 4 flows: one per address.
        let mut bed = Bed::new();
        handshake(&mut bed);
        let open = |bed: &mut Bed, from: (Ipv4Addr, u16)| {
            bed.sends_from(from, 5000, 0, flag::SYN, b"");
            let cookie = seg(&bed.sent()[0].1).seq();
            bed.sends_from(from, 5001, cookie.wrapping_add(1), flag::ACK, b"");
            bed.sent()
        };
        let sent = open(&mut bed, (CLIENT.0, CLIENT.1 + 1));
        assert!(
            sent.len() == 1 && seg(&sent[0].1).has(flag::RST),
            "{sent:?}"
        );
        assert_eq!(bed.flows(), 1);
        assert_eq!(stats::get(&bed.stats.drops[Drop::TcpFlowsFull as usize]), 1);
        let sent = open(&mut bed, (Ipv4Addr::new(10, 0, 0, 2), CLIENT.1));
        assert!(sent.is_empty(), "{sent:?}");
        assert_eq!(bed.flows(), 2);
    }

    #[test]
    fn resp_replies_are_framed_as_they_stream_in() {
        let mut r = Replies::default();
        for _ in 0..4 {
            r.expect(Owes::Resp);
        }
        let replies: &[u8] =
            b"+OK\r\n$5\r\nhello\r\n*3\r\n:1\r\n*2\r\n$-1\r\n+a\r\n$0\r\n\r\n-ERR x\r\n";
        // One byte at a time: every split of a line, a length and a value.
        for b in replies.chunks(1) {
            assert!(!r.settled());
            r.feed(b);
        }
        assert!(r.settled(), "{r:?}");
        // A reply nobody asked for, or a RESP3 type, cannot be placed.
        r.feed(b"+late\r\n");
        assert!(r.lost);
        let mut r = Replies::default();
        r.expect(Owes::Resp);
        r.feed(b"%1\r\n");
        assert!(r.lost);
    }

    #[test]
    fn a_bulk_header_is_read_whole_or_refused() {
        assert_eq!(bulk_header(b"$3\r\nabc\r\n"), Some(Ok((4, 5))));
        assert_eq!(bulk_header(b"$12"), None);
        assert_eq!(bulk_header(b"$12\r"), None);
        assert_eq!(bulk_header(b"*1\r\n"), Some(Err(())));
        assert_eq!(bulk_header(b"$-1\r\n"), Some(Err(())));
        assert_eq!(bulk_header(b"$1x\r\n"), Some(Err(())));
        assert_eq!(bulk_header(&[b'$'; 30]), Some(Err(())));
        assert_eq!(resp_line(b"*3\r\n$3", b'*'), Some((3, 4)));
        assert_eq!(resp_line(b"*3\r", b'*'), None);
    }

    /// The payloads sent out of `port`, joined.
    fn payload_to(sent: &[(u16, Vec<u8>)], port: u16) -> Vec<u8> {
        sent.iter()
            .filter(|(p, _)| *p == port)
            .flat_map(|(_, f)| seg(f).payload().to_vec())
            .collect()
    }

    #[test]
    fn a_redis_command_of_one_key_goes_before_its_value_is_in_and_the_next_waits_for_its_reply() {
        let mut bed = Bed::redis();
        let cookie = handshake(&mut bed);
        let (k0, k1) = (bed.key_on(0), bed.key_on(1));
        // A SET whose value is still coming: its name and key are enough to pick the server.
        let head = format!("*3\r\n$3\r\nSET\r\n${}\r\n{k0}\r\n$10\r\n0123", k0.len());
        bed.client_sends(
            1001,
            cookie.wrapping_add(1),
            flag::ACK | flag::PSH,
            head.as_bytes(),
        );
        let sent = bed.sent();
        let (port, leg) = bed.accept_leg(&sent, 0, 70_000);
        assert_eq!(payload_to(&bed.sent(), 1), head.as_bytes());
        // The rest of the value, its header split from it, then a GET of the other server's key
        // in the same segment: the value goes on to server 0, the GET waits for its reply.
        let mut rest = b"456789\r\n".to_vec();
        let get = format!("*2\r\n$3\r\nGET\r\n${}\r\n{k1}\r\n", k1.len());
        rest.extend_from_slice(get.as_bytes());
        let at = 1001 + head.len() as u32;
        bed.client_sends(at, cookie.wrapping_add(1), flag::ACK | flag::PSH, &rest);
        let sent = bed.sent();
        assert_eq!(payload_to(&sent, 1), b"456789\r\n");
        // Server 1's leg opens, but the GET waits for server 0's reply.
        bed.accept_leg(&sent, 1, 90_000);
        assert_eq!(payload_to(&bed.sent(), 2), b"");
        // Server 0's `+OK`, in two pieces: the GET goes once it is whole.
        let acked = leg.wrapping_add(1 + head.len() as u32 + 8);
        bed.server_sends(0, port, 70_001, acked, flag::ACK | flag::PSH, b"+O");
        let sent = bed.sent();
        assert_eq!(payload_to(&sent, 0), b"+O");
        assert_eq!(payload_to(&sent, 2), b"");
        bed.server_sends(0, port, 70_003, acked, flag::ACK | flag::PSH, b"K\r\n");
        let sent = bed.sent();
        assert_eq!(payload_to(&sent, 0), b"K\r\n");
        assert_eq!(payload_to(&sent, 2), get.as_bytes());
        assert_eq!(stats::get(&bed.stats.tcp_requests), 2);
        assert_eq!(
            stats::get(&bed.stats.drops[Drop::TcpRepliesLost as usize]),
            0
        );
    }

    #[test]
    fn a_redis_command_no_one_server_answers_goes_to_the_host_and_hello_keeps_it_there() {
        let mut bed = Bed::redis();
        let cookie = handshake(&mut bed);
        let (k0, k1) = (bed.key_on(0), bed.key_on(1));
        // Keys on both servers: the proxy's (port 3, the local port).
        let mget = format!("MGET {k0} {k1}\r\nHELLO 3\r\nGET {k0}\r\n");
        bed.client_sends(
            1001,
            cookie.wrapping_add(1),
            flag::ACK | flag::PSH,
            mget.as_bytes(),
        );
        let sent = bed.sent();
        assert!(sent.iter().any(|(p, f)| *p == 3 && seg(f).has(flag::SYN)));
        assert!(sent.iter().all(|(p, _)| *p != 1 && *p != 2), "{sent:?}");
        // UDP to the port is nobody's.
        let ends = UdpEnds::between(
            (CLIENT_MAC, CLIENT.0, 5000),
            (bed.sw.spec.vip.mac, VIP, bed.sw.spec.vip.port),
        );
        bed.process(0, udp_frame(&ends, &[b"\0\0\0\0\0\x01\0\0get a\r\n"]));
        assert_eq!(stats::get(&bed.stats.drops[Drop::UdpToRedis as usize]), 1);
    }
}
