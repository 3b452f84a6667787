//! One server's card: the entries that source-route BCube packets through its pipeline,
//! and what it does with a query that reaches its CPU.

use super::*;

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
pub(super) const PRIO_ROUTE: u32 = 10;
pub(super) const PRIO_LOCAL: u32 = 20;
pub(super) const PRIO_CONTROL: u32 = 30;

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
    pub(super) fn link_kbps(&self) -> u32 {
        (self.link_mbps * 1000.0) as u32
    }

    /// The `bcube` table: the in-port, IP destination, TTL (the index), the eight NHAs and the
    /// kind; a miss drops.
    pub fn table(&self) -> TableDef {
        let byte = |name: String, offset: usize| KeyField::Bytes {
            name,
            offset: offset as u16,
            len: 1,
            padded: false,
        };
        let mut key = vec![
            KeyField::Named("in_port".into()),
            KeyField::Named("ip_dst".into()),
            byte("ttl".into(), 22),
        ];
        for slot in 0..MAX_HOPS {
            key.push(byte(format!("nha{}", slot + 1), AT + slot));
        }
        key.push(byte("bcube_kind".into(), AT + 8));
        TableDef {
            name: TABLE.into(),
            kind: Kind::Ternary,
            key,
            miss: vec![ActionDef::Drop],
            size: None,
        }
    }

    /// The filters: packets to this server from a level port go to the host; discovery from
    /// a level port and queries from any port go to the CPU.
    pub fn filters(&self) -> Vec<EntryDef> {
        let mut out = Vec::new();
        for &p in &self.level_ports {
            out.push(entry(
                [("in_port", number(p)), ("ip_dst", text(self.ip()))],
                PRIO_LOCAL,
                vec![
                    ActionDef::Count(LOCAL_COUNTER.into()),
                    ActionDef::SetEthDst(self.host_mac.to_string()),
                    ActionDef::Output(self.host_port),
                ],
            ));
            out.push(entry(
                [("in_port", number(p)), ("bcube_kind", number(kind::ND))],
                PRIO_CONTROL,
                vec![ActionDef::ToCpu],
            ));
        }
        out.push(entry(
            [("bcube_kind", number(kind::ABQ))],
            PRIO_CONTROL,
            vec![ActionDef::ToCpu],
        ));
        out
    }

    /// The `acl` entries: BCube packets to `bcube`, anything else from the host dropped.
    pub fn acl(&self) -> Vec<EntryDef> {
        vec![
            entry(
                [("ethertype", text(IPV4)), ("ip_proto", number(PROTO))],
                self.priority,
                vec![ActionDef::Goto(TABLE.into())],
            ),
            entry(
                [("in_port", number(self.host_port))],
                self.priority.saturating_sub(1),
                vec![ActionDef::Drop],
            ),
        ]
    }

    pub fn interface(&self, nha: u8) -> u16 {
        self.interface_base + nha as u16
    }

    /// A neighbour's route entries (ServerSwitch Figure 6, lines 9-17): at index `i` (TTL
    /// `i + 2`) with NHA slot `i + 1` holding its NHA, decrement the TTL and send through its
    /// interface entry.
    pub fn routes(&self, nha: u8) -> Vec<EntryDef> {
        (0..MAX_HOPS)
            .map(|i| {
                let slot = format!("nha{}", i + 1);
                entry(
                    [("ttl", number(i as u64 + 2)), (slot.as_str(), number(nha))],
                    PRIO_ROUTE,
                    vec![
                        ActionDef::Count(format!("{NHA_COUNTER}{nha}")),
                        ActionDef::DecTtl,
                        ActionDef::Interface(self.interface(nha)),
                    ],
                )
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
