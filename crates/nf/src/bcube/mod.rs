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
use switch::control::{ActionDef, EntryDef, InterfaceDef, KeyField, Kind, TableDef, ACL};
use wire::ethernet::Mac;

use crate::{entry, number, text, IPV4};
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

/// Server `id`'s address.
pub fn address(first_ip: Ipv4Addr, id: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(first_ip).wrapping_add(id as u32))
}

/// The server whose address `ip` is, if it is one of the BCube's.
pub fn server(first_ip: Ipv4Addr, geometry: Geometry, ip: Ipv4Addr) -> Option<usize> {
    let id = u32::from(ip).wrapping_sub(u32::from(first_ip)) as usize;
    (id < geometry.servers()).then_some(id)
}

mod agent;
mod card;
mod header;
mod host;

pub use agent::*;
pub use card::*;
pub use header::*;
pub use host::*;

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
            assert_eq!(r.fields["ttl"], number(i as u64 + 2));
            assert_eq!(r.fields[&format!("nha{}", i + 1)], number(7u8));
            assert_eq!(r.fields.len(), 2);
            assert_eq!(r.actions[2], ActionDef::Interface(71));
        }
        let table = c.table();
        assert_eq!(table.key.len(), 12);
        assert_eq!(
            table.key[3],
            KeyField::Bytes {
                name: "nha1".into(),
                offset: 34,
                len: 1,
                padded: false
            }
        );
        let filters = c.filters();
        assert!(filters.iter().all(|f| f.priority > PRIO_ROUTE));
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
