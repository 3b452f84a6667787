//! Replies: a server's reply taken at its home and sent back along the key's path, filling the
//! caches the directory allows on the way, and shrunk back into the server's datagram at the
//! client's ToR.

use super::*;

impl FabricSwitch {
    /// A server's reply datagram, at its home. False when no request of the fabric's waits
    /// for it (it is then routed as it is).
    pub(super) fn server_reply(
        &mut self,
        client: (Ipv4Addr, u16),
        server: (Ipv4Addr, u16),
        datagram: &[u8],
        now: Instant,
        emit: &mut Vec<Emit>,
    ) -> bool {
        let Ok((mc, body)) = mcudp::Header::parse(datagram) else {
            return false;
        };
        let flow = (client.0, client.1, mc.request_id);
        let Some(pending) = self.pending.get(&flow).cloned() else {
            return false;
        };
        // A read's reply may come in several datagrams; anything else is done at its first.
        if mc.seq.saturating_add(1) >= mc.total || pending.stamp.is_none() {
            self.pending.remove(&flow);
        }
        if let Some(write) = pending.cond {
            self.cond_put_read(write, body, now, emit);
            return true;
        }
        let name = item(server, &pending.key);
        let mut h = Header {
            request_id: pending.request_id,
            command: Command::Reply,
            key_hash: inc::key_hash(&pending.key),
            flags: flags::EXPANDED
                | if pending.detour { flags::DETOUR } else { 0 }
                | if pending.native { flags::NATIVE } else { 0 },
            origin: pending.origin,
            via: 0,
            epoch: 0,
            client,
            server,
            lease_ms: 0,
        };
        let mut fill = None;
        match pending.stamp {
            None => {
                self.stats.writes_answered += 1;
                self.stats.writes_server_us += micros(now.saturating_duration_since(pending.since));
                let update = pending.update.as_ref().filter(|_| body == b"STORED\r\n");
                let invalidated = match update {
                    Some(_) => self.directory.invalidated(&name),
                    None => Vec::new(),
                };
                match (self.directory.done(&name, now), update) {
                    (Some(step), _) => self.write_step(&name, step, now, emit),
                    (None, Some(value)) => {
                        self.update_copies(&h, &name, value, &invalidated, now, emit)
                    }
                    (None, None) => {}
                }
            }
            Some(stamp) => {
                let lease = self.fill_lease(&name, now);
                if let (true, Some(lease)) = (
                    mc.total == 1 && reply_key(body) == Some(&pending.key[..]),
                    lease,
                ) {
                    let sharers = self.sharers_on_way(&h, now);
                    if let Some(epoch) = self.directory.fill(&name, stamp, sharers, now) {
                        self.cache.fill_for(&name, body, epoch, lease, now);
                        if lease < self.spec.lease {
                            h.lease_ms = whole_ms(lease);
                        }
                        fill = Some(epoch);
                    }
                }
            }
        }
        self.reply_to(&h, inc::key_hash(&pending.key), datagram, fill, now, emit);
        true
    }

    /// How long a copy of `name`'s value filled now may live: a value whose item expires
    /// sooner than a lease lives no longer, here or in the caches it fills (the reply's lease
    /// says so); one that may have expired, or has under a millisecond left, fills nothing.
    pub(super) fn fill_lease(&self, name: &[u8], now: Instant) -> Option<std::time::Duration> {
        match self.expiries.cap(name, now) {
            Ok(Some(cap)) => Some(cap.saturating_duration_since(now).min(self.spec.lease)),
            Ok(None) => Some(self.spec.lease),
            Err(_) => None,
        }
        .filter(|l| whole_ms(*l) > 0)
    }

    /// The switches a reply from this home to `h.origin` would leave cached copies at: the
    /// client's ToR, and the key's designated root when the reply goes by it.
    pub(super) fn sharers_on_way(&self, h: &Header, now: Instant) -> Vec<SwitchId> {
        if h.origin == self.me.id {
            return Vec::new();
        }
        let mut sharers = vec![h.origin];
        if let Some(root) = self.via_root(h, now) {
            sharers.push(root);
        }
        sharers
    }

    /// The designated root a reply to `h.origin` goes by, if it is up and the request came by
    /// it.
    pub(super) fn via_root(&self, h: &Header, now: Instant) -> Option<SwitchId> {
        if h.has(flags::DETOUR) || h.origin == self.me.id {
            return None;
        }
        let root = self.spec.registration.root(h.key_hash);
        self.link_to(root, now).map(|_| root)
    }

    /// Sends a reply datagram back to the client: by its ToR, through the designated root
    /// when it is up (a fill then at `epoch`), or straight to a client of this rack.
    pub(super) fn reply_to(
        &mut self,
        h: &Header,
        key_hash: u32,
        datagram: &[u8],
        fill: Option<u32>,
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        if h.origin == self.me.id {
            if !h.has(flags::FILL_ONLY) {
                self.answer(h, datagram, emit);
            }
            return;
        }
        let root = self.via_root(h, now);
        let mut header = Header {
            command: Command::Reply,
            key_hash,
            flags: flags::EXPANDED | (h.flags & (flags::NATIVE | flags::FILL_ONLY)),
            via: 0,
            epoch: fill.unwrap_or(0),
            ..*h
        };
        if fill.is_some() {
            header.flags |= flags::FILL;
        }
        match root {
            Some(root) => {
                self.send(root, &header, datagram, now, emit);
            }
            None => {
                header.flags |= flags::DETOUR;
                self.send(h.origin, &header, datagram, now, emit);
            }
        }
    }

    /// A reply on its way back: filled here if this is a designated switch it may fill, then
    /// on to the client's ToR, or shrunk to the client.
    pub(super) fn reply_message(
        &mut self,
        h: &Header,
        datagram: &[u8],
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        if !self.computed.is_empty() {
            self.computed_reply(h, datagram, now);
        }
        if h.has(flags::FILL) && (h.origin == self.me.id || !h.has(flags::DETOUR)) {
            self.fill_from_reply(h, datagram, h.epoch, now);
        }
        if h.origin != self.me.id {
            self.send(h.origin, h, datagram, now, emit);
        } else if !h.has(flags::FILL_ONLY) {
            self.answer(h, datagram, emit);
        }
    }

    /// Caches the value a reply datagram for `h` carries, at `epoch`, when it is one datagram
    /// and a hit of `h`'s key.
    pub(super) fn fill_from_reply(
        &mut self,
        h: &Header,
        datagram: &[u8],
        epoch: u32,
        now: Instant,
    ) {
        let Ok((mc, body)) = mcudp::Header::parse(datagram) else {
            return;
        };
        if let Some(key) = reply_key(body) {
            if mc.total == 1 && inc::key_hash(key) == h.key_hash {
                let name = item(h.server, key);
                match h.lease_ms {
                    0 => self.cache.fill(&name, body, epoch, now),
                    ms => self.cache.fill_for(
                        &name,
                        body,
                        epoch,
                        std::time::Duration::from_millis(u64::from(ms)),
                        now,
                    ),
                };
            }
        }
    }
}
