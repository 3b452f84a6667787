//! Invalidations received: the copy goes and the home hears so; a root first passes each on to
//! the ToRs it filled from its own copy, and acknowledges once they all have.

use super::*;

impl FabricSwitch {
    /// Counts an invalidation received; false when an operator's fault drops it.
    pub(super) fn take_invalidation(&mut self) -> bool {
        self.stats.invalidations_in += 1;
        if self.drop_invalidations > 0 {
            self.drop_invalidations -= 1;
            self.stats.invalidations_dropped += 1;
            return false;
        }
        true
    }

    /// An invalidation from a key's home: the copy goes, and the home hears so.
    pub(super) fn invalidated(
        &mut self,
        src_ip: Ipv4Addr,
        h: &Header,
        key: &[u8],
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        if !self.take_invalidation() {
            return;
        }
        let Some(home) = self.member_by_ip(src_ip) else {
            self.stats.unexpected += 1;
            return;
        };
        let name = item(h.server, key);
        self.cache.invalidate(&name, h.epoch, now);
        // The ToRs this root filled from its copy drop theirs first (the home sends again
        // until it hears, and each time they are asked again). Those an earlier write left
        // unacknowledged (its home gave up) are asked too: their copies may still live.
        let mut waiting: BTreeMap<SwitchId, Instant> = BTreeMap::new();
        let earlier = self.relaying.remove(&name).map(|r| r.waiting);
        let filled = self.filled.remove(&name).unwrap_or_default();
        for (tor, until) in filled.into_iter().chain(earlier.into_iter().flatten()) {
            let at = waiting.entry(tor).or_insert(until);
            *at = (*at).max(until);
        }
        waiting.retain(|_, until| now < *until);
        if waiting.is_empty() {
            let ack = Header {
                command: Command::InvalidateAck,
                origin: self.me.id,
                ..*h
            };
            self.stats.acks_sent += 1;
            self.send(home.id, &ack, key, now, emit);
            return;
        }
        for &tor in waiting.keys() {
            let on = Header {
                origin: self.me.id,
                ..*h
            };
            self.stats.invalidations_relayed += 1;
            self.send(tor, &on, key, now, emit);
        }
        if self.relaying.len() >= MAX_FILLED {
            // Relays whose ToRs' copies have all run out are done with.
            self.relaying
                .retain(|_, r| r.waiting.values().any(|&until| now < until));
        }
        self.relaying.insert(
            name,
            Relay {
                epoch: h.epoch,
                key: key.to_vec(),
                waiting,
                home: home.id,
                header: *h,
            },
        );
    }

    /// A root's hit for the client's ToR `tor`: remembered, so that an invalidation of the
    /// item reaches the ToR through this root, and the epoch and lease left of the copy the
    /// ToR may fill from. `None` (no fill) for anything but a ToR, or past [`MAX_FILLED`].
    pub(super) fn fill_tor(
        &mut self,
        name: Vec<u8>,
        tor: SwitchId,
        now: Instant,
    ) -> Option<(u32, u32)> {
        if self.me.role != Role::Root
            || tor == self.me.id
            || self.spec.member(tor).map(|m| m.role) != Some(Role::Tor)
        {
            return None;
        }
        let (epoch, left) = self.copy_to_fill_from(&name, now)?;
        if !self.filled.contains_key(&name) && self.filled.len() >= MAX_FILLED {
            self.filled.retain(|_, tors| {
                tors.retain(|&(_, until)| now < until);
                !tors.is_empty()
            });
            if self.filled.len() >= MAX_FILLED {
                return None;
            }
        }
        // The ToR's copy may outlive the record by the time the reply takes to get there.
        let until = now + left + FAILED_MARGIN;
        let tors = self.filled.entry(name).or_default();
        match tors.iter_mut().find(|(t, _)| *t == tor) {
            Some(known) => known.1 = known.1.max(until),
            None => tors.push((tor, until)),
        }
        self.stats.root_fills += 1;
        Some((epoch, whole_ms(left)))
    }

    /// An acknowledgement from a ToR of an invalidation this root passed on: when it is the
    /// last one waited for, the home hears from this root. False when no relay waits for it.
    pub(super) fn relay_ack(
        &mut self,
        from: SwitchId,
        h: &Header,
        key: &[u8],
        now: Instant,
        emit: &mut Vec<Emit>,
    ) -> bool {
        let name = item(h.server, key);
        let Some(relay) = self.relaying.get_mut(&name) else {
            return false;
        };
        // An acknowledgement of an earlier write says nothing of a copy filled since.
        if relay.epoch != h.epoch {
            return true;
        }
        relay.waiting.remove(&from);
        if relay.waiting.is_empty() {
            if let Some(done) = self.relaying.remove(&name) {
                self.ack_relay(done, now, emit);
            }
        }
        true
    }

    pub(super) fn ack_relay(&mut self, relay: Relay, now: Instant, emit: &mut Vec<Emit>) {
        let ack = Header {
            command: Command::InvalidateAck,
            origin: self.me.id,
            ..relay.header
        };
        self.stats.acks_sent += 1;
        self.send(relay.home, &ack, &relay.key, now, emit);
    }

    /// A ToR the table named failed a lease ago holds nothing this root filled: relays stop
    /// waiting for it.
    pub(super) fn relay_failed(&mut self, id: SwitchId, now: Instant, emit: &mut Vec<Emit>) {
        for tors in self.filled.values_mut() {
            tors.retain(|&(t, _)| t != id);
        }
        self.filled.retain(|_, tors| !tors.is_empty());
        let mut done: Vec<Vec<u8>> = self
            .relaying
            .iter_mut()
            .filter_map(|(name, r)| {
                (r.waiting.remove(&id).is_some() && r.waiting.is_empty()).then(|| name.clone())
            })
            .collect();
        // Acknowledged in key order, the same every run.
        done.sort();
        for at in done {
            if let Some(relay) = self.relaying.remove(&at) {
                self.ack_relay(relay, now, emit);
            }
        }
    }
}
