//! BCube on kvswitches (ServerSwitch 5.1): every server's kvswitch is its ServerSwitch card,
//! with a port per BCube level and one to its host; packets are source-routed by the card's
//! pipeline alone.
//!
//! - **Addresses.** A BCube of `n`-port switches and `levels` levels holds `n^levels` servers;
//!   server `id` has one digit per level (level 0 the least significant) and the IPv4 address
//!   `first_ip + id`. Its neighbour across level `l` whose digit there is `d` is next hop
//!   address (NHA) `l * n + d`.
//! - **The header.** A BCube packet is an IPv4 packet of protocol [`PROTO`] (reserved for
//!   experiments, RFC 3692) whose payload starts with a 12-byte header ([`HEADER_LEN`]): eight
//!   NHAs, the BCube kind (data, neighbour discovery, available-bandwidth query and reply),
//!   the number of hops, and the payload's own IP protocol. The NHAs are stored last hop
//!   first, and the IP TTL is the index: a packet of `h` hops leaves its host with TTL `h + 1`,
//!   and a card reading TTL `t` sends it to NHA `t - 1`, decrementing the TTL as it goes. So
//!   the index moves on by itself, as in ServerSwitch, where the chip decrements the TTL.
//! - **The card** (`kvswitch nf bcube-card`, [`run_card`]): a ternary table `bcube` keyed on
//!   the in-port, the IP destination, the TTL, the eight NHAs and the kind, filled as
//!   ServerSwitch's Figure 6 does: one entry per (index, NHA) that decrements the TTL and
//!   sends through the interface-table entry of that neighbour, and, above them, the
//!   filters: packets to this server go to the host port, discovery and queries to the CPU.
//!   An `acl` entry sends BCube packets to `bcube`; anything else the host sends is dropped.
//!   The agent on the CPU path announces itself on each level port, fills the interface
//!   table from its neighbours' announcements (installing a neighbour's route entries when it
//!   is first heard and removing them when it falls silent), reads the ports' byte counters
//!   each second, and answers available-bandwidth queries with the least bandwidth left on
//!   the path.
//! - **The host** (`kvswitch nf bcube-host`, [`run_host`]): a TUN device carries the host's
//!   packets to other servers; each gets the header of one of the parallel paths BCube gives
//!   (one per level where the two addresses differ), chosen packet by packet in proportion to
//!   the paths' available bandwidth, which the host queries every second. Packets that arrive
//!   lose the header and go up the host's stack.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use serde_json::{json, Value};
use wire::ethernet::Mac;

use api::Client;

/// The IP protocol of BCube packets: 253, reserved for experimentation (RFC 3692).
pub const PROTO: u8 = 253;
/// The BCube header that follows the IP header.
pub const HEADER_LEN: usize = 12;
/// Most hops a header holds (its NHA slots).
pub const MAX_HOPS: usize = 8;
/// Where the header starts in an Ethernet frame (an IPv4 header without options).
const AT: usize = 14 + 20;

/// The BCube kinds (the header's byte 8).
pub mod kind {
    pub const DATA: u8 = 0;
    /// Neighbour discovery: a card announces itself on a level port.
    pub const ND: u8 = 1;
    /// An available-bandwidth query on its way along a path.
    pub const ABQ: u8 = 2;
    /// The answer to a query, on its way back.
    pub const ABQ_REPLY: u8 = 3;
}

/// The shape of a BCube.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Ports of each BCube switch (servers per level-0 group).
    pub n: u8,
    /// Levels (BCube_k has k + 1).
    pub levels: u8,
}

impl Geometry {
    pub fn new(n: u8, levels: u8) -> anyhow::Result<Geometry> {
        anyhow::ensure!((2..=16).contains(&n), "n {n}: 2 to 16 ports per switch");
        anyhow::ensure!(
            (1..=4).contains(&levels),
            "levels {levels}: 1 to 4 (a header holds {MAX_HOPS} hops)"
        );
        let g = Geometry { n, levels };
        anyhow::ensure!(
            g.servers() <= 4096,
            "n {n} and {levels} levels make {} servers; at most 4,096",
            g.servers()
        );
        Ok(g)
    }

    pub fn servers(&self) -> usize {
        (self.n as usize).pow(self.levels as u32)
    }

    /// Server `id`'s digit at `level`.
    pub fn digit(&self, id: usize, level: u8) -> u8 {
        ((id / (self.n as usize).pow(level as u32)) % self.n as usize) as u8
    }

    /// The NHA of the neighbour across `level` whose digit there is `digit`.
    pub fn nha(&self, level: u8, digit: u8) -> u8 {
        level * self.n + digit
    }

    /// The level and digit an NHA names, if it names one.
    pub fn split(&self, nha: u8) -> Option<(u8, u8)> {
        (nha < self.levels * self.n).then(|| (nha / self.n, nha % self.n))
    }

    /// The server one hop from `from` through `nha` (`from` itself when the digit is its own).
    pub fn hop(&self, from: usize, nha: u8) -> Option<usize> {
        let (level, digit) = self.split(nha)?;
        let unit = (self.n as usize).pow(level as u32);
        let old = self.digit(from, level) as usize;
        Some(from - old * unit + digit as usize * unit)
    }

    /// The servers a route of NHAs visits after `from`, in order.
    pub fn walk(&self, from: usize, route: &[u8]) -> Option<Vec<usize>> {
        let mut at = from;
        route
            .iter()
            .map(|&nha| {
                at = self.hop(at, nha)?;
                Some(at)
            })
            .collect()
    }

    /// BCube's parallel paths from `src` to `dst` (its BuildPathSet for the levels where the
    /// two differ): path `i` corrects the differing digits starting at the `i`-th differing
    /// level, from high levels to low, wrapping around. The paths share no server but the
    /// ends. Each is a route of NHAs in the order travelled; none when `src == dst`.
    pub fn paths(&self, src: usize, dst: usize) -> Vec<Vec<u8>> {
        let differ: Vec<u8> = (0..self.levels)
            .rev()
            .filter(|&l| self.digit(src, l) != self.digit(dst, l))
            .collect();
        (0..differ.len())
            .map(|start| {
                (0..differ.len())
                    .map(|k| {
                        let level = differ[(start + k) % differ.len()];
                        self.nha(level, self.digit(dst, level))
                    })
                    .collect()
            })
            .collect()
    }

    /// The route back to `src` from where a route from `src` ends: the same levels in reverse,
    /// each restoring the digit the server before it had.
    pub fn reverse(&self, src: usize, route: &[u8]) -> Option<Vec<u8>> {
        let visited = self.walk(src, route)?;
        let mut before = vec![src];
        before.extend(&visited[..visited.len().saturating_sub(1)]);
        route
            .iter()
            .zip(&before)
            .rev()
            .map(|(&nha, &prev)| {
                let (level, _) = self.split(nha)?;
                Some(self.nha(level, self.digit(prev, level)))
            })
            .collect()
    }
}

/// A BCube header, read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: u8,
    /// The route in the order travelled.
    pub route: Vec<u8>,
    /// The payload's IP protocol.
    pub inner: u8,
}

/// The IP packet `packet` (IPv4, no options) as a BCube packet along `route`: protocol
/// [`PROTO`], TTL `route.len() + 1`, the header in front of its payload. `None` for a packet
/// that is not plain IPv4, a route longer than [`MAX_HOPS`] or an empty one.
pub fn encapsulate(packet: &[u8], route: &[u8], kind: u8) -> Option<Vec<u8>> {
    if packet.len() < 20 || packet[0] != 0x45 || route.is_empty() || route.len() > MAX_HOPS {
        return None;
    }
    let total = u16::from_be_bytes([packet[2], packet[3]]) as usize;
    if total < 20 || total > packet.len() || total + HEADER_LEN > u16::MAX as usize {
        return None;
    }
    let mut out = Vec::with_capacity(total + HEADER_LEN);
    out.extend_from_slice(&packet[..20]);
    out.extend_from_slice(&header_bytes(route, kind, packet[9]));
    out.extend_from_slice(&packet[20..total]);
    out[2..4].copy_from_slice(&((total + HEADER_LEN) as u16).to_be_bytes());
    out[8] = route.len() as u8 + 1;
    out[9] = PROTO;
    fill_ip_checksum(&mut out);
    Some(out)
}

/// Reads the header of a BCube packet (IPv4, no options, protocol [`PROTO`]).
pub fn header(packet: &[u8]) -> Option<Header> {
    if packet.len() < 20 + HEADER_LEN || packet[0] != 0x45 || packet[9] != PROTO {
        return None;
    }
    let h = &packet[20..20 + HEADER_LEN];
    let hops = h[9] as usize;
    if hops > MAX_HOPS {
        return None;
    }
    Some(Header {
        kind: h[8],
        route: h[..hops].iter().rev().copied().collect(),
        inner: h[10],
    })
}

/// The IP packet a BCube data packet carries: the header removed, the payload's protocol
/// restored, the TTL set to 64 (the hops used it as an index).
pub fn decapsulate(packet: &[u8]) -> Option<Vec<u8>> {
    let h = header(packet)?;
    let total = u16::from_be_bytes([packet[2], packet[3]]) as usize;
    if h.kind != kind::DATA || total < 20 + HEADER_LEN || total > packet.len() {
        return None;
    }
    let mut out = Vec::with_capacity(total - HEADER_LEN);
    out.extend_from_slice(&packet[..20]);
    out.extend_from_slice(&packet[20 + HEADER_LEN..total]);
    out[2..4].copy_from_slice(&((total - HEADER_LEN) as u16).to_be_bytes());
    out[8] = 64;
    out[9] = h.inner;
    fill_ip_checksum(&mut out);
    Some(out)
}

/// The 12 header bytes for `route` (in the order travelled): its NHAs last hop first, the kind,
/// the hop count and the payload's protocol.
fn header_bytes(route: &[u8], kind: u8, inner: u8) -> [u8; HEADER_LEN] {
    let mut header = [0u8; HEADER_LEN];
    for (slot, &nha) in route.iter().rev().enumerate() {
        header[slot] = nha;
    }
    header[8] = kind;
    header[9] = route.len() as u8;
    header[10] = inner;
    header
}

fn fill_ip_checksum(packet: &mut [u8]) {
    wire::ipv4::Packet::new_unchecked(&mut packet[..]).fill_checksum();
}

/// A BCube control message: an IP packet from `src` to `dst` carrying `body` after the
/// header, in an Ethernet frame.
fn control_frame(
    eth: (Mac, Mac),
    src: Ipv4Addr,
    dst: Ipv4Addr,
    ttl: u8,
    h: &Header,
    body: &[u8],
) -> Vec<u8> {
    let total = 20 + HEADER_LEN + body.len();
    let mut f = Vec::with_capacity(14 + total);
    f.extend_from_slice(&eth.0 .0);
    f.extend_from_slice(&eth.1 .0);
    f.extend_from_slice(&[0x08, 0x00]);
    f.extend_from_slice(&[0x45, 0, 0, 0, 0, 0, 0x40, 0, ttl, PROTO, 0, 0]);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    f.extend_from_slice(&header_bytes(&h.route, h.kind, h.inner));
    f.extend_from_slice(body);
    f[16..18].copy_from_slice(&(total as u16).to_be_bytes());
    fill_ip_checksum(&mut f[14..34]);
    f
}

/// An available-bandwidth query's body: the asker's sequence number and path, and the least
/// bandwidth left on the hops so far, kilobits a second.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Query {
    pub seq: u32,
    pub path: u8,
    pub kbps: u32,
}

const QUERY_LEN: usize = 9;

impl Query {
    fn bytes(&self) -> [u8; QUERY_LEN] {
        let mut b = [0u8; QUERY_LEN];
        b[..4].copy_from_slice(&self.seq.to_be_bytes());
        b[4] = self.path;
        b[5..].copy_from_slice(&self.kbps.to_be_bytes());
        b
    }

    fn read(b: &[u8]) -> Option<Query> {
        let b = b.get(..QUERY_LEN)?;
        Some(Query {
            seq: u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            path: b[4],
            kbps: u32::from_be_bytes([b[5], b[6], b[7], b[8]]),
        })
    }
}

/// One server's card: where its ports lead and how its entries are written.
#[derive(Clone, Debug)]
pub struct Card {
    pub geometry: Geometry,
    pub id: usize,
    /// The address of server 0; server `id` has `first_ip + id`.
    pub first_ip: Ipv4Addr,
    /// The card's port of each level, level 0 first.
    pub level_ports: Vec<u16>,
    pub host_port: u16,
    /// The host's MAC, written on packets delivered to it.
    pub host_mac: Mac,
    /// The rate of a level link where the port has no egress rate of its own, Mb/s.
    pub link_mbps: f64,
    /// Interface-table entries `interface_base + NHA` are the card's.
    pub interface_base: u16,
    /// The priority of the card's `acl` entry.
    pub priority: u32,
}

/// The table the card's entries go in.
pub const TABLE: &str = "bcube";
const PRIO_ROUTE: u32 = 10;
const PRIO_LOCAL: u32 = 20;
const PRIO_CONTROL: u32 = 30;

/// A neighbour heard on a level port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Neighbour {
    pub nha: u8,
    pub mac: Mac,
    pub port: u16,
}

impl Card {
    pub fn check(&self) -> anyhow::Result<()> {
        let g = self.geometry;
        anyhow::ensure!(
            self.id < g.servers(),
            "server {} is not in a BCube of {} servers",
            self.id,
            g.servers()
        );
        anyhow::ensure!(
            self.level_ports.len() == g.levels as usize,
            "{} level ports for {} levels",
            self.level_ports.len(),
            g.levels
        );
        let mut ports = self.level_ports.clone();
        ports.push(self.host_port);
        ports.sort_unstable();
        ports.dedup();
        anyhow::ensure!(
            ports.len() == g.levels as usize + 1,
            "the host port and level ports must all differ"
        );
        anyhow::ensure!(
            self.interface_base as usize + (g.levels * g.n) as usize <= pipeline::MAX_INTERFACES,
            "interface base {}: the card's {} entries must fit below {}",
            self.interface_base,
            g.levels * g.n,
            pipeline::MAX_INTERFACES
        );
        anyhow::ensure!(
            u32::from(self.first_ip)
                .checked_add(g.servers() as u32 - 1)
                .is_some(),
            "{} plus {} servers runs past 255.255.255.255",
            self.first_ip,
            g.servers()
        );
        anyhow::ensure!(
            self.priority >= 1,
            "priority 0: the card's drop entry goes one below it"
        );
        anyhow::ensure!(
            self.link_mbps.is_finite() && self.link_mbps > 0.0,
            "link rate {}: more than 0 Mb/s",
            self.link_mbps
        );
        Ok(())
    }

    pub fn ip(&self) -> Ipv4Addr {
        address(self.first_ip, self.id)
    }

    /// `link_mbps` in kb/s.
    fn link_kbps(&self) -> u32 {
        (self.link_mbps * 1000.0) as u32
    }

    /// The `bcube` table: the in-port, IP destination, TTL (the index), the eight NHAs and the
    /// kind; a miss drops.
    pub fn table(&self) -> Value {
        let mut key = vec![json!("in_port"), json!("ip_dst")];
        key.push(json!({"name": "ttl", "offset": 22, "len": 1}));
        for slot in 0..MAX_HOPS {
            key.push(json!({"name": format!("nha{}", slot + 1), "offset": AT + slot, "len": 1}));
        }
        key.push(json!({"name": "bcube_kind", "offset": AT + 8, "len": 1}));
        json!({"name": TABLE, "kind": "ternary", "key": key, "miss": ["drop"]})
    }

    /// The filters: packets to this server from a level port go to the host; discovery from
    /// a level port and queries from any port go to the CPU.
    pub fn filters(&self) -> Vec<Value> {
        let mut out = Vec::new();
        for &p in &self.level_ports {
            out.push(
                json!({"match": {"in_port": p, "ip_dst": self.ip().to_string()},
                            "priority": PRIO_LOCAL,
                            "actions": [{"count": LOCAL_COUNTER},
                                        {"set_eth_dst": self.host_mac.to_string()},
                                        {"output": self.host_port}]}),
            );
            out.push(json!({"match": {"in_port": p, "bcube_kind": kind::ND},
                            "priority": PRIO_CONTROL, "actions": ["to_cpu"]}));
        }
        out.push(json!({"match": {"bcube_kind": kind::ABQ},
                        "priority": PRIO_CONTROL, "actions": ["to_cpu"]}));
        out
    }

    /// The `acl` entries: BCube packets to `bcube`, anything else from the host dropped.
    pub fn acl(&self) -> Vec<Value> {
        vec![
            json!({"match": {"ethertype": "0x0800", "ip_proto": PROTO},
                   "priority": self.priority, "actions": [{"goto": TABLE}]}),
            json!({"match": {"in_port": self.host_port},
                   "priority": self.priority.saturating_sub(1), "actions": ["drop"]}),
        ]
    }

    pub fn interface(&self, nha: u8) -> u16 {
        self.interface_base + nha as u16
    }

    /// A neighbour's route entries (ServerSwitch Figure 6, lines 9-17): at index `i` (TTL
    /// `i + 2`) with NHA slot `i + 1` holding its NHA, decrement the TTL and send through its
    /// interface entry.
    pub fn routes(&self, nha: u8) -> Vec<Value> {
        (0..MAX_HOPS)
            .map(|i| {
                json!({"match": {"ttl": i + 2, format!("nha{}", i + 1): nha},
                       "priority": PRIO_ROUTE,
                       "actions": [{"count": format!("{NHA_COUNTER}{nha}")}, "dec_ttl",
                                   {"interface": self.interface(nha)}]})
            })
            .collect()
    }

    /// The announcement sent on level port `level` from MAC `mac`.
    pub fn announcement(&self, level: u8, mac: Mac) -> Vec<u8> {
        let h = Header {
            kind: kind::ND,
            route: Vec::new(),
            inner: 0,
        };
        let mut body = (self.id as u16).to_be_bytes().to_vec();
        body.push(level);
        control_frame(
            (Mac([0xff; 6]), mac),
            self.ip(),
            Ipv4Addr::BROADCAST,
            1,
            &h,
            &body,
        )
    }

    /// The neighbour an announcement that came in on `port` names; `None` for anything but
    /// an announcement from a server one digit away at the port's own level.
    pub fn heard(&self, port: u16, frame: &[u8]) -> Option<Neighbour> {
        let level = self.level_ports.iter().position(|&p| p == port)? as u8;
        if frame.len() < 14 || frame[12..14] != [0x08, 0x00] {
            return None;
        }
        let h = header(&frame[14..])?;
        let body = frame.get(AT + HEADER_LEN..AT + HEADER_LEN + 3)?;
        let (id, said) = (u16::from_be_bytes([body[0], body[1]]) as usize, body[2]);
        let g = self.geometry;
        let one_digit_away = id < g.servers()
            && id != self.id
            && (0..g.levels).all(|l| l == level || g.digit(id, l) == g.digit(self.id, l));
        if h.kind != kind::ND || said != level || !one_digit_away {
            return None;
        }
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&frame[6..12]);
        Some(Neighbour {
            nha: g.nha(level, g.digit(id, level)),
            mac: Mac(mac),
            port,
        })
    }
}

/// Server `id`'s address.
pub fn address(first_ip: Ipv4Addr, id: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(first_ip).wrapping_add(id as u32))
}

/// The server whose address `ip` is, if it is one of the BCube's.
pub fn server(first_ip: Ipv4Addr, geometry: Geometry, ip: Ipv4Addr) -> Option<usize> {
    let id = u32::from(ip).wrapping_sub(u32::from(first_ip)) as usize;
    (id < geometry.servers()).then_some(id)
}

/// What a card does with a query that reached its CPU.
#[derive(Debug, PartialEq, Eq)]
pub enum QueryStep {
    /// Send the query on, this frame out of this port.
    Forward { port: u16, frame: Vec<u8> },
    /// Send the answer back, this frame out of this port (the query was for this server).
    Answer { port: u16, frame: Vec<u8> },
    /// Not a query this card can move on (counted).
    Drop(&'static str),
}

impl Card {
    /// Moves a query on: at its destination it turns into a reply along the reverse path
    /// (carrying the least bandwidth left on the hops there); on the way, the bandwidth left
    /// on the port it leaves by is folded in and it goes to the next hop as the pipeline would
    /// send it (TTL decremented, the neighbour's MACs).
    pub fn query(
        &self,
        frame: &[u8],
        neighbour: &dyn Fn(u8) -> Option<Neighbour>,
        port_macs: &[Mac],
        available_kbps: &dyn Fn(u16) -> u32,
    ) -> QueryStep {
        if frame.len() < AT + HEADER_LEN || frame[12..14] != [0x08, 0x00] {
            return QueryStep::Drop("not IPv4");
        }
        let Some(h) = header(&frame[14..]) else {
            return QueryStep::Drop("no BCube header");
        };
        let Some(mut q) = Query::read(&frame[AT + HEADER_LEN..]) else {
            return QueryStep::Drop("short query");
        };
        let src = Ipv4Addr::new(frame[26], frame[27], frame[28], frame[29]);
        let dst = Ipv4Addr::new(frame[30], frame[31], frame[32], frame[33]);
        let answering = dst == self.ip();
        let (route, ttl, to) = if answering {
            let Some(from) = server(self.first_ip, self.geometry, src) else {
                return QueryStep::Drop("query from outside the BCube");
            };
            let Some(back) = self.geometry.reverse(from, &h.route) else {
                return QueryStep::Drop("bad route");
            };
            if self
                .geometry
                .walk(from, &h.route)
                .and_then(|w| w.last().copied())
                != Some(self.id)
            {
                return QueryStep::Drop("route does not lead here");
            }
            let ttl = back.len() as u8 + 1;
            (back, ttl, src)
        } else {
            (h.route.clone(), frame[22], dst)
        };
        let hops = route.len();
        // The slot the TTL points at: TTL t reads NHA t - 1, stored last hop first.
        let Some(slot) = (ttl as usize).checked_sub(2).filter(|&s| s < hops) else {
            return QueryStep::Drop("index out of the route");
        };
        let nha = route[hops - 1 - slot];
        let Some(next) = neighbour(nha) else {
            return QueryStep::Drop("next hop not discovered");
        };
        // The way back from the destination is not the path's: only the hops on the way
        // there count.
        if !answering {
            q.kbps = q.kbps.min(available_kbps(next.port));
        }
        let h = Header {
            kind: if answering {
                kind::ABQ_REPLY
            } else {
                kind::ABQ
            },
            route,
            inner: 0,
        };
        let src_mac = port_macs
            .get(next.port as usize)
            .copied()
            .unwrap_or(Mac([0; 6]));
        // An answer comes from this server, a query goes on from its asker.
        let from = if answering { self.ip() } else { src };
        let frame = control_frame((next.mac, src_mac), from, to, ttl - 1, &h, &q.bytes());
        let port = next.port;
        match answering {
            true => QueryStep::Answer { port, frame },
            false => QueryStep::Forward { port, frame },
        }
    }
}

/// What a card's agent counted.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct CardStats {
    pub announcements_sent: u64,
    pub announcements_heard: u64,
    pub neighbours: u64,
    pub neighbours_lost: u64,
    pub queries_forwarded: u64,
    pub queries_answered: u64,
    pub queries_dropped: u64,
    pub ignored: u64,
}

/// How often a card announces itself; a neighbour unheard for three of these is gone.
pub const ANNOUNCE_EVERY: Duration = Duration::from_millis(500);

struct Agent<'a> {
    client: &'a Client,
    card: &'a Card,
    macs: Vec<Mac>,
    /// By NHA: the neighbour, when it was last heard, its route entries' ids.
    neighbours: HashMap<u8, (Neighbour, Instant, Vec<u64>)>,
    /// Per port: when its bytes sent were read, how many, and the bandwidth it had left
    /// (kb/s: its capacity less what it sent since the read before).
    rates: Vec<(Instant, u64, u32)>,
    stats: CardStats,
}

/// The counter of what reached the host, and the prefix of each neighbour's (its NHA after
/// it): what the card's entries count.
const LOCAL_COUNTER: &str = "bcube_local";
const NHA_COUNTER: &str = "bcube_nha";

/// Deletes the counters the card's entries fed, once the entries are gone.
fn delete_counters(client: &Client) -> anyhow::Result<()> {
    let listed = client.call("GET", "/api/v1/counters", None)?;
    let ours = listed["counters"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .filter(|name| {
            *name == LOCAL_COUNTER
                || name
                    .strip_prefix(NHA_COUNTER)
                    .is_some_and(|nha| nha.parse::<u8>().is_ok())
        });
    for name in ours {
        client.call("DELETE", &format!("/api/v1/counters/{name}"), None)?;
    }
    Ok(())
}

/// Runs a card's agent until `stop`: sets the card's tables up, discovers neighbours,
/// answers queries; then removes everything it made (also after an error).
pub fn run_card(
    client: &Client,
    card: &Card,
    stop: &dyn Fn() -> bool,
) -> anyhow::Result<CardStats> {
    card.check()?;
    let ports = client.call("GET", "/api/v1/ports", None)?;
    let macs: Vec<Mac> = ports["ports"]
        .as_array()
        .context("the switch listed no ports")?
        .iter()
        .map(|p| {
            p["mac"]
                .as_str()
                .and_then(|m| m.parse().ok())
                .unwrap_or(Mac([0; 6]))
        })
        .collect();
    let highest = card.level_ports.iter().chain([&card.host_port]).max();
    anyhow::ensure!(
        highest.is_some_and(|&p| (p as usize) < macs.len()),
        "the switch has {} ports; the card names port {}",
        macs.len(),
        highest.copied().unwrap_or(0)
    );
    let mut agent = Agent {
        client,
        card,
        macs,
        neighbours: HashMap::new(),
        rates: Vec::new(),
        stats: CardStats::default(),
    };
    let mut acl_ids = Vec::new();
    let mut made_table = false;
    let made = agent.setup(&mut acl_ids, &mut made_table);
    let served = made.and_then(|()| agent.serve(stop));
    let mut cleanup: anyhow::Result<()> = Ok(());
    for id in acl_ids {
        cleanup = cleanup.and(super::delete_acl(client, id));
    }
    if made_table {
        cleanup = cleanup.and(
            client
                .call("DELETE", &format!("/api/v1/tables/{TABLE}"), None)
                .map(drop),
        );
    }
    for nha in agent.neighbours.keys() {
        cleanup = cleanup.and(
            client
                .call(
                    "DELETE",
                    &format!("/api/v1/interfaces/{}", card.interface(*nha)),
                    None,
                )
                .map(drop),
        );
    }
    if made_table {
        cleanup = cleanup.and(delete_counters(client));
    }
    served?;
    cleanup.context("removing the BCube card's entries")?;
    Ok(agent.stats)
}

impl Agent<'_> {
    fn setup(&mut self, acl_ids: &mut Vec<u64>, made_table: &mut bool) -> anyhow::Result<()> {
        let c = self.client;
        c.call("POST", "/api/v1/tables", Some(&self.card.table()))
            .context("creating the bcube table (is another BCube agent running here?)")?;
        *made_table = true;
        for f in self.card.filters() {
            super::add_entry(c, TABLE, &f)?;
        }
        for a in self.card.acl() {
            acl_ids.push(super::add_acl(c, &a)?);
        }
        Ok(())
    }

    fn serve(&mut self, stop: &dyn Fn() -> bool) -> anyhow::Result<()> {
        let mut next_announce = Instant::now();
        let mut next_read = Instant::now();
        while !stop() {
            let now = Instant::now();
            if now >= next_announce {
                self.announce()?;
                self.expire(now)?;
                next_announce = now + ANNOUNCE_EVERY;
            }
            if now >= next_read {
                self.read_rates(now)?;
                next_read = now + Duration::from_secs(1);
            }
            let got = self
                .client
                .call("GET", "/api/v1/packets?max=64&wait_ms=100", None)?;
            for f in got["frames"].as_array().into_iter().flatten() {
                let (Some(port), Some(hex)) = (f["in_port"].as_u64(), f["frame"].as_str()) else {
                    continue;
                };
                let Ok(frame) = ::switch::control::unhex(hex) else {
                    continue;
                };
                self.take(port as u16, &frame)?;
            }
        }
        Ok(())
    }

    fn announce(&mut self) -> anyhow::Result<()> {
        for (level, &port) in self.card.level_ports.iter().enumerate() {
            let frame = self
                .card
                .announcement(level as u8, self.macs[port as usize]);
            super::send_frame(self.client, port, &frame)?;
            self.stats.announcements_sent += 1;
        }
        Ok(())
    }

    fn take(&mut self, port: u16, frame: &[u8]) -> anyhow::Result<()> {
        let kind = frame.get(AT + 8).copied();
        if kind == Some(kind::ND) {
            match self.card.heard(port, frame) {
                Some(n) => {
                    self.stats.announcements_heard += 1;
                    self.learn(n)?;
                }
                None => self.stats.ignored += 1,
            }
            return Ok(());
        }
        if kind != Some(kind::ABQ) {
            self.stats.ignored += 1;
            return Ok(());
        }
        let (neighbours, rates) = (&self.neighbours, &self.rates);
        let link = self.card.link_kbps();
        let step = self.card.query(
            frame,
            &|nha| neighbours.get(&nha).map(|n| n.0),
            &self.macs,
            &|p| rates.get(p as usize).map_or(link, |r| r.2),
        );
        match step {
            QueryStep::Forward { port, frame } => {
                super::send_frame(self.client, port, &frame)?;
                self.stats.queries_forwarded += 1;
            }
            QueryStep::Answer { port, frame } => {
                super::send_frame(self.client, port, &frame)?;
                self.stats.queries_answered += 1;
            }
            QueryStep::Drop(_) => self.stats.queries_dropped += 1,
        }
        Ok(())
    }

    fn learn(&mut self, n: Neighbour) -> anyhow::Result<()> {
        let now = Instant::now();
        if let Some((known, seen, _)) = self.neighbours.get_mut(&n.nha) {
            *seen = now;
            if *known == n {
                return Ok(());
            }
        }
        let iface = json!({"eth_dst": n.mac.to_string(),
                           "eth_src": self.macs[n.port as usize].to_string(), "port": n.port});
        self.client.call(
            "PUT",
            &format!("/api/v1/interfaces/{}", self.card.interface(n.nha)),
            Some(&iface),
        )?;
        match self.neighbours.get_mut(&n.nha) {
            // Moved to another MAC or port: the interface entry now says so.
            Some(known) => known.0 = n,
            None => {
                self.neighbours.insert(n.nha, (n, now, Vec::new()));
                self.stats.neighbours += 1;
                for r in self.card.routes(n.nha) {
                    let id = super::add_entry(self.client, TABLE, &r)?;
                    if let Some(known) = self.neighbours.get_mut(&n.nha) {
                        known.2.push(id);
                    }
                }
            }
        }
        Ok(())
    }

    /// Removes neighbours unheard for three announcement periods: their route entries, then
    /// their interface entries.
    fn expire(&mut self, now: Instant) -> anyhow::Result<()> {
        let gone: Vec<u8> = self
            .neighbours
            .iter()
            .filter(|(_, (_, seen, _))| now.duration_since(*seen) > 3 * ANNOUNCE_EVERY)
            .map(|(nha, _)| *nha)
            .collect();
        for nha in gone {
            // Forgotten only once its entries are gone: a failed call leaves it for the next
            // round (or the cleanup at the end).
            while let Some(&id) = self.neighbours.get(&nha).and_then(|n| n.2.last()) {
                self.client.call(
                    "DELETE",
                    &format!("/api/v1/tables/{TABLE}/entries/{id}"),
                    None,
                )?;
                if let Some(n) = self.neighbours.get_mut(&nha) {
                    n.2.pop();
                }
            }
            let iface = self.card.interface(nha);
            self.client
                .call("DELETE", &format!("/api/v1/interfaces/{iface}"), None)?;
            self.neighbours.remove(&nha);
            self.stats.neighbours = self.stats.neighbours.saturating_sub(1);
            self.stats.neighbours_lost += 1;
        }
        Ok(())
    }

    /// Reads every port's bytes sent and its capacity (its egress rate, or the link's).
    fn read_rates(&mut self, now: Instant) -> anyhow::Result<()> {
        let ports = self.client.call("GET", "/api/v1/ports", None)?;
        let link = self.card.link_kbps();
        let list = ports["ports"].as_array().cloned().unwrap_or_default();
        let mut next = Vec::with_capacity(list.len());
        for (i, p) in list.iter().enumerate() {
            let bytes = p["tx_bytes"].as_u64().unwrap_or(0);
            let cap = match p["egress_rate_bps"].as_u64() {
                Some(bps) if bps > 0 => (bps / 1000) as u32,
                _ => link,
            };
            let used = match self.rates.get(i) {
                Some(&(at, before, _)) => {
                    let secs = now.duration_since(at).as_secs_f64().max(1e-3);
                    (bytes.saturating_sub(before) as f64 * 8.0 / 1000.0 / secs) as u32
                }
                None => 0,
            };
            next.push((now, bytes, cap.saturating_sub(used)));
        }
        self.rates = next;
        Ok(())
    }
}

/// A server's host side.
#[derive(Clone, Debug)]
pub struct HostConfig {
    pub geometry: Geometry,
    pub id: usize,
    pub first_ip: Ipv4Addr,
    /// The TUN device to create.
    pub tun: String,
    /// The interface to the card.
    pub dev: String,
    /// Use at most this many of the parallel paths to a server (0: all).
    pub max_paths: usize,
    /// How often each path in use is asked its available bandwidth (zero: never; the paths
    /// then share packets evenly).
    pub query_every: Duration,
}

/// What a host side counted.
#[derive(Clone, Debug, Default, Serialize)]
pub struct HostStats {
    /// Packets sent, by destination server and path number.
    pub sent: std::collections::BTreeMap<String, Vec<u64>>,
    pub received: u64,
    pub queries_sent: u64,
    pub replies: u64,
    /// Packets from the TUN device that were not IPv4 to another server of the BCube.
    pub not_bcube: u64,
    /// Packets from the card that did not read as BCube data or replies.
    pub malformed: u64,
    /// Data packets the kernel would not take from the TUN device.
    pub undelivered: u64,
    /// Each destination's paths' last answered bandwidth, kb/s.
    pub available_kbps: std::collections::BTreeMap<String, Vec<u32>>,
}

/// The paths to one server and how packets are spread over them.
struct Spread {
    paths: Vec<Vec<u8>>,
    /// Each path's weight (its last answered bandwidth; all equal until answered).
    weight: Vec<u64>,
    /// Smooth weighted round robin: each path's credit.
    credit: Vec<i64>,
    sent: Vec<u64>,
    /// When each path last answered a query.
    answered_at: Vec<Option<Instant>>,
    /// When the spread was made (a path that never answered is silent since then).
    since: Instant,
    last_used: Instant,
}

impl Spread {
    fn new(paths: Vec<Vec<u8>>) -> Spread {
        let k = paths.len();
        Spread {
            paths,
            weight: vec![1; k],
            credit: vec![0; k],
            sent: vec![0; k],
            answered_at: vec![None; k],
            since: Instant::now(),
            last_used: Instant::now(),
        }
    }

    /// The next path: each gets packets in proportion to its weight, interleaved.
    fn pick(&mut self) -> usize {
        let total: i64 = self.weight.iter().map(|&w| w as i64).sum();
        for (c, &w) in self.credit.iter_mut().zip(&self.weight) {
            *c += w as i64;
        }
        let best = (0..self.credit.len())
            .max_by_key(|&i| (self.credit[i], std::cmp::Reverse(i)))
            .unwrap_or(0);
        self.credit[best] -= total;
        self.sent[best] += 1;
        best
    }

    fn answered(&mut self, path: usize, kbps: u32, now: Instant) {
        if path < self.weight.len() {
            // A path with nothing left still gets a trickle, so its next answer is heard.
            self.weight[path] = u64::from(kbps.max(1));
            self.answered_at[path] = Some(now);
        }
    }

    /// Paths that have not answered for `silent` (their queries lost, as on a path through a
    /// server that is gone) keep a trickle only; while none has ever answered, all share
    /// evenly.
    fn age(&mut self, now: Instant, silent: Duration) {
        if self.answered_at.iter().all(Option::is_none) {
            return;
        }
        for (w, at) in self.weight.iter_mut().zip(&self.answered_at) {
            if now.duration_since(at.unwrap_or(self.since)) > silent {
                *w = 1;
            }
        }
    }
}

/// Runs a server's host side until `stop`: creates the TUN device, routes every other
/// server's address through it, and carries packets between it and the card.
pub fn run_host(cfg: &HostConfig, stop: &(dyn Fn() -> bool + Sync)) -> anyhow::Result<HostStats> {
    let g = cfg.geometry;
    anyhow::ensure!(
        cfg.id < g.servers(),
        "server {} is not in the BCube",
        cfg.id
    );
    let me = address(cfg.first_ip, cfg.id);
    let tun = kvio::Tun::open(&cfg.tun)?;
    // Room for the BCube header inside the card link's MTU.
    let mtu = std::fs::read_to_string(format!("/sys/class/net/{}/mtu", cfg.dev))
        .with_context(|| format!("reading the MTU of {}", cfg.dev))?
        .trim()
        .parse::<usize>()
        .context("the interface's MTU")?;
    anyhow::ensure!(
        mtu >= 576 + HEADER_LEN,
        "{}'s MTU of {mtu} leaves no room for the BCube header",
        cfg.dev
    );
    kvio::link::set_mtu(&cfg.tun, mtu - HEADER_LEN)?;
    kvio::link::set_up(&cfg.tun)?;
    for id in (0..g.servers()).filter(|&id| id != cfg.id) {
        kvio::link::replace_host_route(&cfg.tun, address(cfg.first_ip, id), me)?;
    }
    // Packets from other servers come in on the card's link but are routed back through
    // the TUN device: reverse-path filtering would drop them.
    for conf in ["all", "default", cfg.dev.as_str(), cfg.tun.as_str()] {
        kvio::link::set_ipv4_conf(conf, "rp_filter", "0")?;
    }
    let opts = kvio::AfPacketOptions {
        promiscuous: false,
        ignore_outgoing: true,
        rcvbuf: 1 << 16,
        sndbuf: 4 << 20,
        qdisc_bypass: false,
        rx_ring: false,
    };
    let mut port = kvio::AfPacket::open(&cfg.dev, &opts)?;
    let host_mac = Mac(kvio::Port::mac(&port));
    // Receives BCube packets for this host; holding it also keeps the kernel from answering
    // them with ICMP "protocol unreachable".
    let raw = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::RAW,
        Some(socket2::Protocol::from(PROTO as i32)),
    )
    .context("a raw IP socket for BCube packets (needs CAP_NET_RAW)")?;
    raw.set_read_timeout(Some(Duration::from_millis(100)))?;
    let spreads: std::sync::Mutex<HashMap<usize, Spread>> = std::sync::Mutex::new(HashMap::new());
    let stats = std::sync::Mutex::new(HostStats::default());
    let lock = |m: &'static str| anyhow::anyhow!("{m} poisoned");
    let frame_for = |packet: &[u8], host_mac: Mac| {
        let mut f = Vec::with_capacity(14 + packet.len());
        f.extend_from_slice(&[0xff; 6]);
        f.extend_from_slice(&host_mac.0);
        f.extend_from_slice(&[0x08, 0x00]);
        f.extend_from_slice(packet);
        f
    };
    let server_of = |ip: Ipv4Addr| server(cfg.first_ip, g, ip);
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let receiver = scope.spawn(|| -> anyhow::Result<()> {
            let mut buf = vec![0u8; 65536];
            while !stop() && !done.load(std::sync::atomic::Ordering::Relaxed) {
                let n = match std::io::Read::read(&mut &raw, &mut buf) {
                    Ok(n) => n,
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock
                                | std::io::ErrorKind::TimedOut
                                | std::io::ErrorKind::Interrupted
                        ) =>
                    {
                        continue
                    }
                    Err(e) => return Err(e).context("receiving BCube packets"),
                };
                let packet = &buf[..n];
                let Some(h) = header(packet) else {
                    stats.lock().map_err(|_| lock("stats"))?.malformed += 1;
                    continue;
                };
                match h.kind {
                    kind::DATA => {
                        // A packet the kernel will not take (a bad inner header) is counted,
                        // not fatal.
                        let inner = decapsulate(packet);
                        let taken = inner.as_ref().map(|p| tun.write(p).is_ok());
                        let mut st = stats.lock().map_err(|_| lock("stats"))?;
                        match taken {
                            Some(true) => st.received += 1,
                            Some(false) => st.undelivered += 1,
                            None => st.malformed += 1,
                        }
                    }
                    kind::ABQ_REPLY => {
                        let src = Ipv4Addr::new(packet[12], packet[13], packet[14], packet[15]);
                        let q = Query::read(&packet[20 + HEADER_LEN..]);
                        if let (Some(q), Some(from)) = (q, server_of(src)) {
                            let mut s = spreads.lock().map_err(|_| lock("paths"))?;
                            if let Some(spread) = s.get_mut(&from) {
                                spread.answered(q.path as usize, q.kbps, Instant::now());
                            }
                            stats.lock().map_err(|_| lock("stats"))?.replies += 1;
                        }
                    }
                    _ => stats.lock().map_err(|_| lock("stats"))?.malformed += 1,
                }
            }
            Ok(())
        });
        // The sending side: any error ends it, and the receiver with it.
        let sending = (|| -> anyhow::Result<()> {
            let mut buf = vec![0u8; 65536];
            let mut next_query = Instant::now() + cfg.query_every;
            let mut seq = 0u32;
            while !stop() && !receiver.is_finished() {
                let n = tun.read(&mut buf, Duration::from_millis(50))?;
                if n > 0 {
                    let packet = &buf[..n];
                    let dst = (n >= 20 && packet[0] == 0x45)
                        .then(|| Ipv4Addr::new(packet[16], packet[17], packet[18], packet[19]))
                        .and_then(server_of)
                        .filter(|&id| id != cfg.id);
                    let Some(dst) = dst else {
                        stats.lock().map_err(|_| lock("stats"))?.not_bcube += 1;
                        continue;
                    };
                    let route = {
                        let mut s = spreads.lock().map_err(|_| lock("paths"))?;
                        let spread = s.entry(dst).or_insert_with(|| {
                            let mut paths = g.paths(cfg.id, dst);
                            if cfg.max_paths > 0 {
                                paths.truncate(cfg.max_paths);
                            }
                            Spread::new(paths)
                        });
                        spread.last_used = Instant::now();
                        let i = spread.pick();
                        spread.paths[i].clone()
                    };
                    match encapsulate(packet, &route, kind::DATA) {
                        Some(out) => {
                            kvio::Port::send(&mut port, &[&frame_for(&out, host_mac)])
                                .context("sending to the card")?;
                        }
                        None => stats.lock().map_err(|_| lock("stats"))?.not_bcube += 1,
                    }
                }
                if !cfg.query_every.is_zero() && Instant::now() >= next_query {
                    let now = Instant::now();
                    next_query = now + cfg.query_every;
                    let mut s = spreads.lock().map_err(|_| lock("paths"))?;
                    for (&dst, spread) in s.iter_mut() {
                        if spread.last_used.elapsed() > 10 * cfg.query_every {
                            continue;
                        }
                        // A path silent for three rounds (a relay gone) gets a trickle only.
                        spread.age(now, 3 * cfg.query_every);
                        for (i, route) in spread.paths.iter().enumerate() {
                            seq = seq.wrapping_add(1);
                            let q = Query {
                                seq,
                                path: i as u8,
                                kbps: u32::MAX,
                            };
                            let h = Header {
                                kind: kind::ABQ,
                                route: route.clone(),
                                inner: 0,
                            };
                            let f = control_frame(
                                (Mac([0xff; 6]), host_mac),
                                me,
                                address(cfg.first_ip, dst),
                                route.len() as u8 + 1,
                                &h,
                                &q.bytes(),
                            );
                            kvio::Port::send(&mut port, &[&f]).context("sending a query")?;
                            stats.lock().map_err(|_| lock("stats"))?.queries_sent += 1;
                        }
                    }
                }
            }
            Ok(())
        })();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let result = sending;
        let received = receiver
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the receiver panicked")));
        result.and(received)
    })?;
    let mut out = stats.into_inner().map_err(|_| lock("stats"))?;
    for (dst, s) in spreads.into_inner().map_err(|_| lock("paths"))? {
        let name = address(cfg.first_ip, dst).to_string();
        out.sent.insert(name.clone(), s.sent);
        out.available_kbps.insert(
            name,
            s.weight
                .iter()
                .map(|&w| w.min(u32::MAX as u64) as u32)
                .collect(),
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bcube1() -> Geometry {
        Geometry::new(4, 2).unwrap()
    }

    fn card(id: usize) -> Card {
        Card {
            geometry: bcube1(),
            id,
            first_ip: Ipv4Addr::new(10, 9, 0, 1),
            level_ports: vec![1, 2],
            host_port: 0,
            host_mac: Mac([2, 0, 0, 0, 0, id as u8]),
            link_mbps: 1000.0,
            interface_base: 64,
            priority: 100,
        }
    }

    /// A UDP packet from server `from` to server `to` with `payload`.
    fn udp(from: usize, to: usize, payload: &[u8]) -> Vec<u8> {
        let total = 28 + payload.len();
        let mut p = vec![0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, 17, 0, 0];
        p.extend_from_slice(&address(Ipv4Addr::new(10, 9, 0, 1), from).octets());
        p.extend_from_slice(&address(Ipv4Addr::new(10, 9, 0, 1), to).octets());
        p.extend_from_slice(&[0x30, 0x39, 0x24, 0x54]);
        p.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        p.extend_from_slice(&[0, 0]);
        p.extend_from_slice(payload);
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        fill_ip_checksum(&mut p);
        p
    }

    #[test]
    fn geometry_names_servers_by_digits_and_neighbours_by_nha() {
        let g = bcube1();
        assert_eq!(g.servers(), 16);
        // Server 13 is digits (3, 1): level 1 digit 3, level 0 digit 1.
        assert_eq!((g.digit(13, 1), g.digit(13, 0)), (3, 1));
        assert_eq!(g.nha(1, 2), 6);
        assert_eq!(g.split(6), Some((1, 2)));
        assert_eq!(g.split(8), None);
        assert_eq!(g.hop(13, g.nha(0, 0)), Some(12));
        assert_eq!(g.hop(13, g.nha(1, 0)), Some(1));
        assert_eq!(g.hop(13, 99), None);
        assert!(Geometry::new(1, 2).is_err());
        assert!(Geometry::new(4, 5).is_err());
        assert!(Geometry::new(16, 4).is_err(), "65,536 servers");
    }

    #[test]
    fn parallel_paths_are_disjoint_and_lead_to_the_destination() {
        for g in [bcube1(), Geometry::new(3, 3).unwrap()] {
            for src in 0..g.servers() {
                for dst in 0..g.servers() {
                    let paths = g.paths(src, dst);
                    let differ = (0..g.levels)
                        .filter(|&l| g.digit(src, l) != g.digit(dst, l))
                        .count();
                    assert_eq!(paths.len(), differ, "{src} -> {dst}");
                    let mut middles = std::collections::HashSet::new();
                    for p in &paths {
                        let walked = g.walk(src, p).unwrap();
                        assert_eq!(walked.last(), Some(&dst), "{src} -> {dst}: {p:?}");
                        for &m in &walked[..walked.len() - 1] {
                            assert!(middles.insert(m), "{src} -> {dst}: {m} on two paths");
                        }
                        // The way back visits the same servers in reverse.
                        let back = g.reverse(src, p).unwrap();
                        let mut again = g.walk(dst, &back).unwrap();
                        again.pop();
                        let mut forward = walked.clone();
                        forward.pop();
                        forward.reverse();
                        assert_eq!(again, forward, "{src} -> {dst}: {p:?} back {back:?}");
                        assert_eq!(g.walk(dst, &back).unwrap().last(), Some(&src));
                    }
                }
            }
        }
    }

    #[test]
    fn the_header_holds_next_hops_last_first_and_the_ttl_is_the_index() {
        let g = bcube1();
        let route = g.paths(0, 15)[0].clone();
        let packet = udp(0, 15, b"payload");
        let b = encapsulate(&packet, &route, kind::DATA).unwrap();
        assert_eq!(b.len(), packet.len() + HEADER_LEN);
        assert_eq!(b[8], 3, "two hops: TTL 3");
        assert_eq!(b[9], PROTO);
        // NHA1 is the last hop; the TTL t reads NHA t - 1.
        assert_eq!(&b[20..22], &[route[1], route[0]]);
        assert_eq!((b[28], b[29], b[30]), (kind::DATA, 2, 17));
        assert!(wire::ipv4::Packet::new_checked(&b[..])
            .unwrap()
            .verify_checksum());
        let h = header(&b).unwrap();
        assert_eq!((h.kind, &h.route, h.inner), (kind::DATA, &route, 17));
        // The packet comes back as it was sent (its TTL was 64 already).
        assert_eq!(decapsulate(&b).unwrap(), packet);
        // Anything else is refused, never a panic.
        assert_eq!(encapsulate(&packet, &[], kind::DATA), None);
        assert_eq!(encapsulate(&packet, &[0; 9], kind::DATA), None);
        assert_eq!(encapsulate(&packet[..10], &route, kind::DATA), None);
        let mut options = packet.clone();
        options[0] = 0x46;
        assert_eq!(encapsulate(&options, &route, kind::DATA), None);
        assert_eq!(decapsulate(&packet), None, "not a BCube packet");
        for cut in 0..b.len() {
            let _ = header(&b[..cut]);
            let _ = decapsulate(&b[..cut]);
        }
        let mut lying = b.clone();
        lying[29] = 9;
        assert_eq!(header(&lying), None, "nine hops");
    }

    #[test]
    fn the_card_writes_figure_6_one_entry_per_index_and_next_hop() {
        let c = card(0);
        c.check().unwrap();
        let routes = c.routes(7);
        assert_eq!(routes.len(), MAX_HOPS);
        for (i, r) in routes.iter().enumerate() {
            assert_eq!(r["match"]["ttl"], json!(i + 2));
            assert_eq!(r["match"][format!("nha{}", i + 1)], json!(7));
            assert_eq!(r["match"].as_object().unwrap().len(), 2);
            assert_eq!(r["actions"][2], json!({"interface": 71}));
        }
        let table = c.table();
        assert_eq!(table["key"].as_array().unwrap().len(), 12);
        assert_eq!(
            table["key"][3],
            json!({"name": "nha1", "offset": 34, "len": 1})
        );
        let filters = c.filters();
        assert!(filters
            .iter()
            .all(|f| f["priority"].as_u64() > Some(u64::from(PRIO_ROUTE))));
        let mut bad = card(0);
        bad.level_ports = vec![1, 0];
        assert!(bad.check().is_err(), "host port reused");
        bad = card(16);
        assert!(bad.check().is_err());
        bad = card(0);
        bad.interface_base = 250;
        assert!(bad.check().is_err());
    }

    #[test]
    fn announcements_are_heard_only_from_neighbours_at_the_ports_level() {
        let (a, b) = (card(0), card(3));
        let mac = Mac([2, 0, 0, 0, 3, 1]);
        let said = b.announcement(0, mac);
        assert_eq!(
            a.heard(1, &said),
            Some(Neighbour {
                nha: 3,
                mac,
                port: 1
            })
        );
        assert_eq!(
            a.heard(2, &said),
            None,
            "level 0's announcement on level 1's port"
        );
        assert_eq!(a.heard(0, &said), None, "from the host port");
        // Server 5 is two digits away from 0: not a neighbour on any level.
        assert_eq!(a.heard(1, &card(5).announcement(0, mac)), None);
        assert_eq!(a.heard(1, &a.announcement(0, mac)), None, "itself");
        for cut in 0..said.len() {
            let _ = a.heard(1, &said[..cut]);
        }
    }

    #[test]
    fn a_query_takes_the_least_bandwidth_on_its_way_and_returns_by_the_reverse_path() {
        let g = bcube1();
        let route = g.paths(0, 15)[1].clone(); // through 3
        let q = Query {
            seq: 7,
            path: 1,
            kbps: u32::MAX,
        };
        let h = Header {
            kind: kind::ABQ,
            route: route.clone(),
            inner: 0,
        };
        let first = Ipv4Addr::new(10, 9, 0, 1);
        let frame = control_frame(
            (Mac([0xff; 6]), Mac([2; 6])),
            address(first, 0),
            address(first, 15),
            3,
            &h,
            &q.bytes(),
        );
        let macs = vec![Mac([0xa0; 6]), Mac([0xa1; 6]), Mac([0xa2; 6])];
        let neighbour = |nha: u8, port: u16| Neighbour {
            nha,
            mac: Mac([0xb0, 0, 0, 0, 0, nha]),
            port,
        };
        // At the source's card: out of its level-0 port to 3, with 600 Mb/s left there.
        let at0: HashMap<u8, Neighbour> = [(3, neighbour(3, 1))].into();
        let QueryStep::Forward { port, frame } =
            card(0).query(&frame, &|n| at0.get(&n).copied(), &macs, &|p| {
                if p == 1 {
                    600_000
                } else {
                    0
                }
            })
        else {
            panic!("not sent");
        };
        assert_eq!(port, 1);
        assert_eq!(frame[22], 2, "TTL decremented");
        assert_eq!(&frame[..6], &[0xb0, 0, 0, 0, 0, 3]);
        // At 3: on through level 1 to 15, where less is left.
        let at3: HashMap<u8, Neighbour> = [(7, neighbour(7, 2))].into();
        let QueryStep::Forward { port, frame } =
            card(3).query(&frame, &|n| at3.get(&n).copied(), &macs, &|_| 250_000)
        else {
            panic!("not sent");
        };
        assert_eq!((port, frame[22]), (2, 1));
        // At 15: answered along the reverse path (back through 3), the least kept; the way
        // back (however loaded) is not the path's.
        let at15: HashMap<u8, Neighbour> = [(4, neighbour(4, 2))].into();
        let QueryStep::Answer { port, frame } =
            card(15).query(&frame, &|n| at15.get(&n).copied(), &macs, &|_| 100)
        else {
            panic!("not answered");
        };
        assert_eq!(port, 2);
        let h = header(&frame[14..]).unwrap();
        assert_eq!(h.kind, kind::ABQ_REPLY);
        assert_eq!(h.route, g.reverse(0, &route).unwrap());
        assert_eq!(g.walk(15, &h.route).unwrap(), vec![3, 0]);
        assert_eq!(&frame[30..34], &address(first, 0).octets());
        let answer = Query::read(&frame[AT + HEADER_LEN..]).unwrap();
        assert_eq!(
            answer,
            Query {
                seq: 7,
                path: 1,
                kbps: 250_000
            }
        );
        assert!(wire::ipv4::Packet::new_checked(&frame[14..])
            .unwrap()
            .verify_checksum());
        // A next hop not yet discovered, or a cut frame: dropped, counted by the caller.
        assert!(matches!(
            card(3).query(&frame, &|_| None, &macs, &|_| 0),
            QueryStep::Drop(_)
        ));
        for cut in 0..frame.len() {
            let _ = card(0).query(&frame[..cut], &|n| at0.get(&n).copied(), &macs, &|_| 0);
        }
    }

    #[test]
    fn packets_are_spread_over_paths_by_their_bandwidth() {
        let mut s = Spread::new(vec![vec![1], vec![2]]);
        let picks: Vec<usize> = (0..4).map(|_| s.pick()).collect();
        assert_eq!(picks, [0, 1, 0, 1], "even until answered");
        let now = Instant::now();
        s.age(now + Duration::from_secs(60), Duration::from_secs(3));
        assert_eq!(s.weight, [1, 1], "no answer yet: nothing to age");
        s.answered(0, 300, now);
        s.answered(1, 100, now);
        s.answered(5, 100, now);
        let mut n = [0; 2];
        for _ in 0..400 {
            n[s.pick()] += 1;
        }
        assert_eq!(n, [300, 100]);
        s.answered(1, 0, now);
        assert!(
            (0..1000).any(|_| s.pick() == 1),
            "a full path still gets a trickle"
        );
        // A path that stops answering (its relay gone) keeps a trickle only.
        s.answered(1, 100, now);
        let later = now + Duration::from_secs(4);
        s.answered(0, 300, later);
        s.age(later, Duration::from_secs(3));
        assert_eq!(s.weight, [300, 1]);
    }
}
