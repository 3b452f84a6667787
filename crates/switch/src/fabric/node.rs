//! Home nodes: servers that keep the directory of their own keys and speak to their ToR in
//! fabric messages; the ToR sends their replies on, and their invalidations to the sharer (or
//! carries one out itself and acknowledges it).

use super::*;

impl FabricSwitch {
    /// A message from a home node of this rack: a reply to send on its way (filling this
    /// switch's copy when its client is in this rack), or an invalidation to pass to a sharer
    /// (or to carry out here, acknowledged straight back).
    pub(super) fn home_node_message(
        &mut self,
        node: &FabricServer,
        payload: &[u8],
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        let Ok(msg) = Message::parse(payload) else {
            self.stats.malformed += 1;
            return;
        };
        let h = msg.header;
        if h.server.0 != node.ip {
            // A home node speaks for its own keys only.
            self.stats.unexpected += 1;
            return;
        }
        self.stats.from_home_node += 1;
        match h.command {
            Command::Reply => {
                if mcudp::Header::parse(msg.payload).is_err()
                    || self.spec.member(h.origin).is_none()
                {
                    self.stats.malformed += 1;
                    return;
                }
                // The node recorded the root named in `via` as a sharer: a fill goes only by it.
                let recorded = h.has(flags::VIA).then_some(h.via);
                let fill =
                    (h.has(flags::FILL) && self.via_root(&h, now) == recorded).then_some(h.epoch);
                let header = Header {
                    flags: h.flags & !(flags::VIA | flags::FAILED | flags::FILL)
                        | if fill.is_some() { flags::FILL } else { 0 },
                    via: 0,
                    ..h
                };
                if h.origin == self.me.id {
                    if !self.computed.is_empty() {
                        self.computed_reply(&header, msg.payload, now);
                    }
                    if let Some(epoch) = fill {
                        self.fill_from_reply(&header, msg.payload, epoch, now);
                    }
                }
                self.reply_to(&header, h.key_hash, msg.payload, fill, now, emit);
            }
            Command::Invalidate if h.has(flags::VIA) => {
                let key = msg.payload;
                if h.via != self.me.id {
                    let header = Header {
                        origin: self.me.id,
                        flags: 0,
                        via: 0,
                        ..h
                    };
                    self.stats.invalidations_sent += 1;
                    self.send(h.via, &header, key, now, emit);
                    return;
                }
                if !self.take_invalidation() {
                    return;
                }
                self.cache.invalidate(&item(h.server, key), h.epoch, now);
                let ack = Header {
                    command: Command::InvalidateAck,
                    origin: self.me.id,
                    flags: flags::VIA,
                    via: self.me.id,
                    ..h
                };
                self.stats.acks_sent += 1;
                self.send_to_node(node, &ack, key, emit);
            }
            _ => self.stats.unexpected += 1,
        }
    }
}
