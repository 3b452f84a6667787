//! The card's agent on the CPU path (`kvswitch nf bcube-card`): neighbour discovery, the
//! ports' load, and the answers to available-bandwidth queries.

use super::*;
use crate::cpu::{Cpu, CpuMode};

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

pub(super) struct Agent<'a> {
    client: &'a Client,
    /// Frames in and out: the switch's CPU path.
    cpu: Cpu,
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
pub(super) const LOCAL_COUNTER: &str = "bcube_local";
pub(super) const NHA_COUNTER: &str = "bcube_nha";

/// Deletes the counters the card's entries fed, once the entries are gone.
pub(super) fn delete_counters(client: &Client) -> anyhow::Result<()> {
    let ours = client.counters()?.into_iter().filter(|c| {
        c.name == LOCAL_COUNTER
            || c.name
                .strip_prefix(NHA_COUNTER)
                .is_some_and(|nha| nha.parse::<u8>().is_ok())
    });
    for counter in ours {
        client.remove_counter(&counter.name)?;
    }
    Ok(())
}

/// Runs a card's agent until `stop`: sets the card's tables up, discovers neighbours,
/// answers queries; then removes everything it made (also after an error).
pub fn run_card(
    client: &Client,
    card: &Card,
    cpu: CpuMode,
    stop: &dyn Fn() -> bool,
) -> anyhow::Result<CardStats> {
    card.check()?;
    let cpu = Cpu::open(client, cpu, true)?;
    let macs: Vec<Mac> = client
        .ports()
        .context("listing the switch's ports")?
        .iter()
        .map(|p| {
            p.mac
                .as_deref()
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
        cpu,
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
        cleanup = cleanup.and(client.remove_entry(ACL, id).map(drop));
    }
    if made_table {
        cleanup = cleanup.and(client.remove_table(TABLE));
    }
    for nha in agent.neighbours.keys() {
        cleanup = cleanup.and(client.remove_interface(card.interface(*nha)));
    }
    if made_table {
        cleanup = cleanup.and(delete_counters(client));
    }
    served?;
    cleanup.context("removing the BCube card's entries")?;
    Ok(agent.stats)
}

impl Agent<'_> {
    pub(super) fn setup(
        &mut self,
        acl_ids: &mut Vec<u64>,
        made_table: &mut bool,
    ) -> anyhow::Result<()> {
        let c = self.client;
        c.add_table(&self.card.table())
            .context("creating the bcube table (is another BCube agent running here?)")?;
        *made_table = true;
        for f in self.card.filters() {
            c.add_entry(TABLE, &f)?;
        }
        for a in self.card.acl() {
            acl_ids.push(c.add_entry(ACL, &a)?);
        }
        Ok(())
    }

    pub(super) fn serve(&mut self, stop: &dyn Fn() -> bool) -> anyhow::Result<()> {
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
            for f in self.cpu.frames(64, Duration::from_millis(100))? {
                self.take(f.in_port, &f.frame)?;
            }
        }
        Ok(())
    }

    pub(super) fn announce(&mut self) -> anyhow::Result<()> {
        for (level, &port) in self.card.level_ports.iter().enumerate() {
            let frame = self
                .card
                .announcement(level as u8, self.macs[port as usize]);
            self.cpu.send(port, &frame)?;
            self.stats.announcements_sent += 1;
        }
        Ok(())
    }

    pub(super) fn take(&mut self, port: u16, frame: &[u8]) -> anyhow::Result<()> {
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
                self.cpu.send(port, &frame)?;
                self.stats.queries_forwarded += 1;
            }
            QueryStep::Answer { port, frame } => {
                self.cpu.send(port, &frame)?;
                self.stats.queries_answered += 1;
            }
            QueryStep::Drop(_) => self.stats.queries_dropped += 1,
        }
        Ok(())
    }

    pub(super) fn learn(&mut self, n: Neighbour) -> anyhow::Result<()> {
        let now = Instant::now();
        if let Some((known, seen, _)) = self.neighbours.get_mut(&n.nha) {
            *seen = now;
            if *known == n {
                return Ok(());
            }
        }
        let iface = InterfaceDef {
            eth_dst: n.mac.to_string(),
            eth_src: self.macs[n.port as usize].to_string(),
            port: n.port,
        };
        self.client
            .set_interface(self.card.interface(n.nha), &iface)?;
        match self.neighbours.get_mut(&n.nha) {
            // Moved to another MAC or port: the interface entry now says so.
            Some(known) => known.0 = n,
            None => {
                self.neighbours.insert(n.nha, (n, now, Vec::new()));
                self.stats.neighbours += 1;
                for r in self.card.routes(n.nha) {
                    let id = self.client.add_entry(TABLE, &r)?;
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
    pub(super) fn expire(&mut self, now: Instant) -> anyhow::Result<()> {
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
                self.client.remove_entry(TABLE, id)?;
                if let Some(n) = self.neighbours.get_mut(&nha) {
                    n.2.pop();
                }
            }
            self.client.remove_interface(self.card.interface(nha))?;
            self.neighbours.remove(&nha);
            self.stats.neighbours = self.stats.neighbours.saturating_sub(1);
            self.stats.neighbours_lost += 1;
        }
        Ok(())
    }

    /// Reads every port's bytes sent and its capacity (its egress rate, or the link's).
    pub(super) fn read_rates(&mut self, now: Instant) -> anyhow::Result<()> {
        let ports = self.client.ports()?;
        let link = self.card.link_kbps();
        let mut next = Vec::with_capacity(ports.len());
        for (i, p) in ports.iter().enumerate() {
            let bytes = p.tx_bytes;
            let cap = match p.egress_rate_bps {
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
