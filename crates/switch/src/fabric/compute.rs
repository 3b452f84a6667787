//! Increments computed on a designated switch's copy: the new value is kept when the home's
//! reply agrees and nothing changed the key since the copy was filled.

use super::*;

impl FabricSwitch {
    /// An increment of a home node's key that this designated switch holds: computed on the
    /// copy as the home will compute it, remembered, and the request flagged so that the home
    /// lets this switch keep the new value if nothing changed the key since the copy's fill.
    pub(super) fn compute_increment(
        &mut self,
        h: &mut Header,
        key: &[u8],
        request_id: u16,
        body: &[u8],
        now: Instant,
    ) {
        if h.command != Command::Increment
            || h.has(flags::COMPUTED | flags::DETOUR)
            || !self
                .server(h.server.0, h.server.1)
                .is_some_and(|s| s.home_node)
            || self.computed.len() >= MAX_PENDING
        {
            return;
        }
        let Some((k, incr, delta)) = text_delta(body) else {
            return;
        };
        let name = item(h.server, key);
        if k != key {
            return;
        }
        let Some((value, reply, epoch)) = self.cache.get(&name, now).and_then(|(cached, epoch)| {
            after_delta(cached, incr, delta).map(|(v, r)| (v, r, epoch))
        }) else {
            return;
        };
        h.flags |= flags::COMPUTED;
        h.epoch = epoch;
        let flow = (h.client.0, h.client.1, request_id);
        self.stats.computed += 1;
        self.computed_order.push_back((now, flow));
        self.computed.insert(
            flow,
            Computed {
                name,
                value,
                reply,
                since: now,
            },
        );
    }

    /// A reply passing the switch that computed its increment: the new value is kept when the
    /// home marked the reply a fill and its number is the one computed here.
    pub(super) fn computed_reply(&mut self, h: &Header, datagram: &[u8], now: Instant) {
        let Ok((mc, body)) = mcudp::Header::parse(datagram) else {
            return;
        };
        let flow = (h.client.0, h.client.1, mc.request_id);
        let ours = self.computed.get(&flow).is_some_and(|c| {
            split_item(&c.name)
                .is_some_and(|(server, key)| server == h.server && inc::key_hash(key) == h.key_hash)
        });
        let Some(c) = self.computed.remove(&flow).filter(|_| ours) else {
            return;
        };
        if h.has(flags::FILL) && body == format!("{}\r\n", c.value).as_bytes() {
            self.cache.fill(&c.name, &c.reply, h.epoch, now);
            self.stats.computed_kept += 1;
        }
    }
}
