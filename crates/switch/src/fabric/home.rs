//! A request at its home: reads sent on to the server (or answered from the home's own copy,
//! granting fills on the way back), writes handed to the directory, and a home node's requests
//! passed to it.

use super::*;

impl FabricSwitch {
    /// A request at its home, from a client of this rack or through the fabric; `quiet` when
    /// it is a write its server will not answer.
    pub(super) fn at_home(
        &mut self,
        h: &Header,
        key: &[u8],
        quiet: bool,
        datagram: &[u8],
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        let Ok((mc, body)) = mcudp::Header::parse(datagram) else {
            self.stats.malformed += 1;
            return;
        };
        let detour = h.has(flags::DETOUR);
        if h.origin != self.me.id {
            // The client's ToR looked already when the client is in this rack.
            if let Some(reply) =
                self.answer_from_cache(h.server, h.command, key, mc.request_id, body, now)
            {
                self.stats.hits += 1;
                let mut h = *h;
                let fill = match h.command {
                    Command::Get => self.fill_from_home_copy(&mut h, key, now),
                    _ => None,
                };
                self.reply_to(&h, inc::key_hash(key), &reply, fill, now, emit);
                return;
            }
        }
        if let Some(node) = self.home_node(h.server.0) {
            // The server keeps its own directory: it hears the request as it came, with the
            // root its reply will go by (a sharer of what it fills).
            let via = self.via_root(h, now);
            let header = Header {
                flags: (h.flags & !(flags::VIA | flags::FAILED))
                    | if via.is_some() { flags::VIA } else { 0 },
                via: via.unwrap_or(0),
                ..*h
            };
            self.send_to_node(&node, &header, datagram, emit);
            return;
        }
        if h.command == Command::Get {
            let stamp = self.directory.read();
            self.remember(
                (h.client.0, h.client.1, mc.request_id),
                Pending {
                    key: key.to_vec(),
                    stamp: Some(stamp),
                    cond: None,
                    origin: h.origin,
                    detour,
                    native: h.has(flags::NATIVE),
                    request_id: h.request_id,
                    since: now,
                    update: None,
                },
            );
            self.send_to_server(h.client, h.server, datagram, emit);
            return;
        }
        // A write: this switch's own copy goes at once; the others are invalidated first.
        let name = item(h.server, key);
        self.cache.remove(&name);
        if let Ok(Some(request)) = wire::memcache::parse(body) {
            let expiry = crate::cache::write_expiry(&request);
            self.expiries.note(&name, expiry, now);
        }
        let write = Write {
            key: key.to_vec(),
            command: h.command,
            origin: h.origin,
            detour,
            native: h.has(flags::NATIVE),
            request_id: h.request_id,
            client: h.client,
            server: h.server,
            datagram: datagram.to_vec(),
            quiet,
            arrived: now,
        };
        let step = self.directory.write(&name, write, now);
        self.write_step(&name, step, now, emit);
    }

    /// The fill a hit of the home's own copy grants the caches on the reply's way, as a
    /// server's reply would (the caches are inclusive), and the epoch it is at: the home
    /// records them as sharers, and their copies live no longer than its own (`h`'s lease is
    /// set to what is left of it). `None` when the directory refuses, or when a home node
    /// keeps the key's directory.
    pub(super) fn fill_from_home_copy(
        &mut self,
        h: &mut Header,
        key: &[u8],
        now: Instant,
    ) -> Option<u32> {
        if self.home_node(h.server.0).is_some() {
            return None;
        }
        let name = item(h.server, key);
        let (_, left) = self.copy_to_fill_from(&name, now)?;
        let stamp = self.directory.read();
        let sharers = self.sharers_on_way(h, now);
        let epoch = self.directory.fill(&name, stamp, sharers, now)?;
        h.lease_ms = whole_ms(left);
        Some(epoch)
    }

    /// This switch's copy of `name`, for a fill made from it: its epoch and what is left of
    /// its lease, which the fill may live no longer than; `None` when none is held or under a
    /// millisecond is left (the fill's header counts whole milliseconds, see [`whole_ms`]).
    pub(super) fn copy_to_fill_from(
        &self,
        name: &[u8],
        now: Instant,
    ) -> Option<(u32, std::time::Duration)> {
        let (epoch, left) = self.cache.held(name, now)?;
        (whole_ms(left) > 0).then_some((epoch, left))
    }

    pub(super) fn remember(&mut self, flow: Flow, pending: Pending) {
        let read = pending.stamp.is_some();
        if read && self.pending.len() >= MAX_PENDING && !self.pending.contains_key(&flow) {
            return;
        }
        self.pending_order.push_back((pending.since, flow));
        self.pending.insert(flow, pending);
    }
}
