//! Stations: MAC learning and ageing, ARP (answering for the VIP, resolving servers), and
//! requests held until their server's port is known.

use super::*;

impl Switch {
    /// Learns that `src` is behind `port`. With the source check on, a MAC is bound to its
    /// port: a server's (in the pool) to the port it is configured on (`source_prefixes`
    /// holding its address) or first resolved on, for as long as it is in the pool; any other
    /// station's while it is heard from (`source_age_s`). A frame from a bound MAC on another
    /// port is refused with the reason, and teaches the switch nothing. Without the check a
    /// station moves to whichever port last sent from it, as in a plain learning switch.
    pub(super) fn learn(&mut self, src: Mac, port: u16, now: Instant) -> Result<(), Drop> {
        if !src.is_unicast() || src == self.spec.vip.mac {
            return Ok(());
        }
        let checked = self.guard.is_some() && Some(port) != self.local;
        if checked {
            if let Some(bound) = self.server_mac_port(src) {
                if bound != port {
                    return Err(Drop::SourceMacBound);
                }
            }
        }
        if let Some(station) = self.macs.get_mut(&src) {
            if station.port == port {
                station.seen = now;
                return Ok(());
            }
            if checked {
                let age = self.guard.as_ref().map_or(Duration::ZERO, |g| g.age());
                if now.saturating_duration_since(station.seen) <= age {
                    return Err(Drop::SourceMacMoved);
                }
                tracing::info!(mac = %src, from = station.port, to = port, "station moved");
            }
            station.seen = now;
            station.port = port;
        } else {
            if self.macs.len() >= self.spec.mac_table_size {
                self.stats.count_drop(Drop::MacTableFull);
                return Ok(());
            }
            self.macs.insert(src, Station { port, seen: now });
        }
        stats::inc(&self.stats.mac_learned);
        let actions = vec![Action::Output(port)];
        let result = match self.pipeline.lookup_exact(self.tables.l2, &src.0) {
            // The station moved.
            Some(id) => self.pipeline.set_actions(self.tables.l2, id, actions),
            None => self
                .pipeline
                .insert(self.tables.l2, Entry::exact(src.0.to_vec(), actions))
                .map(|_| ()),
        };
        if let Err(e) = result {
            tracing::warn!(mac = %src, "learning failed: {e}");
        }
        Ok(())
    }

    /// The port a server's MAC is bound to, when `mac` is the MAC of a server in the pool and
    /// that port is known: the port whose `source_prefixes` hold the server's address, else
    /// the port its station was learned on.
    pub(super) fn server_mac_port(&self, mac: Mac) -> Option<u16> {
        let i = (0..self.backend_macs.len())
            .find(|&i| self.backend_macs[i] == Some(mac) && !self.is_removed(i))?;
        let configured = self
            .guard
            .as_ref()
            .and_then(|g| g.configured_port(*self.spec.servers[i].addr.ip()));
        configured.or_else(|| self.macs.get(&mac).map(|s| s.port))
    }

    /// The port the address of a server in the pool is bound to, if `ip` is one's and the
    /// port is known: the port its `source_prefixes` name, else its MAC's station's. A
    /// server's address never ages out of its port, however quiet the server.
    pub(super) fn server_ip_port(&self, ip: Ipv4Addr) -> Option<u16> {
        let i = *self.backend_by_ip.get(&ip)?;
        if self.is_removed(i) {
            return None;
        }
        if let Some(p) = self.guard.as_ref().and_then(|g| g.configured_port(ip)) {
            return Some(p);
        }
        self.server_port(i)
    }

    /// Whether server `i` was removed from the pool by the control plane.
    pub(super) fn is_removed(&self, i: usize) -> bool {
        self.removed.get(i).copied().unwrap_or(false)
    }

    /// Learns a backend's MAC from its ARP: every server at that address (the pool may hold
    /// the same address twice, a removed server and one added in its place).
    pub(super) fn note_backend(&mut self, ip: Ipv4Addr, mac: Mac) {
        if !mac.is_unicast() || !self.backend_by_ip.contains_key(&ip) {
            return;
        }
        let mut changed = false;
        for i in 0..self.spec.servers.len() {
            let server = &self.spec.servers[i];
            // A configured MAC is authoritative.
            if *server.addr.ip() != ip || server.mac.is_some() || self.backend_macs[i] == Some(mac)
            {
                continue;
            }
            tracing::info!(backend = %self.pool.spec().servers[i].label(), %mac, "backend MAC resolved");
            self.backend_macs[i] = Some(mac);
            changed = true;
        }
        if changed {
            if let Err(e) = self.install_members() {
                tracing::warn!("{e}");
            }
        }
    }

    /// ARP: learn backends; anything not for the switch goes on through the pipeline.
    pub(super) fn parse_arp(&mut self, frame: &[u8], dst: Mac) -> Option<Fate> {
        let Ok(packet) = arp::Packet::new_checked(&frame[ethernet::HEADER_LEN..]) else {
            return None;
        };
        let Ok(repr) = arp::Repr::parse(&packet) else {
            return None;
        };
        self.note_backend(repr.sender_ip, repr.sender_mac);
        if dst == self.spec.vip.mac
            && repr.operation == arp::Operation::Reply
            && !self.local_ips.contains(&repr.target_ip)
        {
            // An answer to the switch's own request. One to an address of the host's end of
            // the local port goes on: the `arp_vip` table sends it there (the switch has
            // learnt from it all the same).
            return Some(Fate::Consumed);
        }
        None
    }

    pub(super) fn answer_arp(&mut self, in_port: u16, frame: &[u8], emit: &mut Vec<Emit>) {
        // The table matched the operation and target; an ARP that is not Ethernet/IPv4 is
        // nothing the switch can answer.
        let parsed = arp::Packet::new_checked(&frame[ethernet::HEADER_LEN..])
            .ok()
            .and_then(|p| arp::Repr::parse(&p).ok());
        let Some(req) = parsed else {
            self.stats.count_drop(Drop::VipUnhandled);
            return;
        };
        let reply = arp::Repr {
            operation: arp::Operation::Reply,
            sender_mac: self.spec.vip.mac,
            sender_ip: req.target_ip,
            target_mac: req.sender_mac,
            target_ip: req.sender_ip,
        };
        stats::inc(&self.stats.arp_replies);
        emit.push(Emit {
            dest: Dest::Port(in_port),
            frame: frame::arp_frame(req.sender_mac, &reply),
        });
    }

    /// Sends the held requests whose server's port is now known; drops those held too long.
    pub(super) fn release_held(&mut self, now: Instant, emit: &mut Vec<Emit>) {
        let mut kept = VecDeque::with_capacity(self.held.len());
        while let Some(held) = self.held.pop_front() {
            if let Some(station) = self.macs.get(&held.dst) {
                stats::inc(&self.stats.switched);
                stats::inc(&self.stats.kv_forwarded);
                emit.push(Emit {
                    dest: Dest::Port(station.port),
                    frame: held.frame,
                });
            } else if now.duration_since(held.since) >= HOLD_FOR {
                self.stats.count_drop(Drop::RoutePortUnknown);
            } else {
                kept.push_back(held);
            }
        }
        self.held = kept;
    }

    /// The port server `i` is behind: its MAC's station in the MAC table, if both are known.
    pub(super) fn server_port(&self, i: usize) -> Option<u16> {
        let mac = self.backend_macs.get(i).copied().flatten()?;
        self.macs.get(&mac).map(|station| station.port)
    }

    /// Whether server `i` is asked for with ARP at this tick: its MAC or its port is unknown,
    /// or its station is half-way to being aged out (so a quiet server's port is refreshed
    /// before its requests would have nowhere to go).
    pub(super) fn needs_arp(&self, i: usize, now: Instant) -> bool {
        let Some(mac) = self.backend_macs.get(i).copied().flatten() else {
            return true;
        };
        match self.macs.get(&mac) {
            Some(station) => now.saturating_duration_since(station.seen) > self.spec.mac_age / 2,
            None => true,
        }
    }

    /// Forgets stations (and source addresses, and full reply buckets) not heard from for
    /// their ageing time, in passes on a grid of [`AGEING_EVERY`] from the first tick: a pass
    /// runs at the first tick at or after its grid point, and several points passed since the
    /// last tick make one pass.
    pub(super) fn age_macs(&mut self, now: Instant) {
        if self.next_ageing.is_some_and(|due| now < due) {
            return;
        }
        let next = match self.next_ageing {
            // Whole periods since the point that fell due, and one more.
            Some(due) => {
                let periods = (now - due).as_nanos() / AGEING_EVERY.as_nanos() + 1;
                u32::try_from(periods)
                    .ok()
                    .and_then(|n| AGEING_EVERY.checked_mul(n))
                    .and_then(|d| due.checked_add(d))
            }
            None => now.checked_add(AGEING_EVERY),
        };
        self.next_ageing = Some(next.unwrap_or(now));
        if let Some(guard) = &mut self.guard {
            guard.expire(now);
        }
        if let Some(limiter) = &mut self.limiter {
            limiter.sweep(now);
        }
        let age = self.spec.mac_age;
        // With the source check on, a server's station stays while the server is in the pool:
        // a quiet server's MAC must not become free for another port to take.
        let pinned: Vec<Mac> = match self.guard {
            Some(_) => (0..self.backend_macs.len())
                .filter(|&i| !self.is_removed(i))
                .filter_map(|i| self.backend_macs[i])
                .collect(),
            None => Vec::new(),
        };
        let mut stale: Vec<Mac> = self
            .macs
            .iter()
            .filter(|(m, s)| now.saturating_duration_since(s.seen) > age && !pinned.contains(m))
            .map(|(m, _)| *m)
            .collect();
        // Removed in MAC order, not the map's: the order frees the `l2` table's slots, which
        // later stations reuse (and the status API lists them by slot).
        stale.sort_unstable();
        for mac in stale {
            self.macs.remove(&mac);
            if let Some(id) = self.pipeline.lookup_exact(self.tables.l2, &mac.0) {
                let _ = self.pipeline.remove(self.tables.l2, id);
            }
        }
    }
}
