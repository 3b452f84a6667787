//! Fabric messages addressed to this switch, by command: greetings from neighbours,
//! invalidations and their acknowledgements, replies, and requests on their designated path
//! (answered from a designated switch's cache on the way, or sent on toward the key's home).

use super::*;

impl FabricSwitch {
    /// A fabric message addressed to this switch.
    pub(super) fn message(
        &mut self,
        in_port: u16,
        src_ip: Ipv4Addr,
        payload: &[u8],
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        let Ok(msg) = Message::parse(payload) else {
            self.stats.malformed += 1;
            return;
        };
        let h = msg.header;
        if h.command == Command::Hello {
            if let Some(PortRole::Link(from)) = self.port_role(in_port) {
                if self.member_by_ip(src_ip).map(|m| m.id) == Some(from) {
                    self.heard[usize::from(in_port)] = Some(now);
                    return;
                }
            }
            self.stats.unexpected += 1;
            return;
        }
        self.stats.messages_in += 1;
        match h.command {
            Command::Invalidate => self.invalidated(src_ip, &h, msg.payload, now, emit),
            Command::InvalidateAck => {
                let Some(from) = self.member_by_ip(src_ip) else {
                    self.stats.unexpected += 1;
                    return;
                };
                if self.me.role == Role::Root {
                    if !self.relay_ack(from.id, &h, msg.payload, now, emit) {
                        self.stats.unexpected += 1;
                    }
                    return;
                }
                if let Some(node) = self.home_node(h.server.0) {
                    // For the home node, which sent the invalidation by this switch.
                    let header = Header {
                        flags: flags::VIA,
                        via: from.id,
                        ..h
                    };
                    self.send_to_node(&node, &header, msg.payload, emit);
                    return;
                }
                let name = item(h.server, msg.payload);
                if let Some(write) = self.directory.ack(&name, h.epoch, from.id, now) {
                    self.forward_write(write, now, emit);
                }
            }
            Command::Reply => self.reply_message(&h, msg.payload, now, emit),
            _ => self.request_message(&h, msg.payload, now, emit),
        }
    }

    /// A request travelling its designated path: answered here from the cache (a get at a
    /// designated switch), taken by its home, or sent on toward the home.
    pub(super) fn request_message(
        &mut self,
        h: &Header,
        datagram: &[u8],
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        let Some(home) = self.home_of(h.server.0) else {
            self.stats.unexpected += 1;
            return;
        };
        if self.server(h.server.0, h.server.1).is_none() {
            self.stats.unexpected += 1;
            return;
        }
        let Ok((mc, body)) = mcudp::Header::parse(datagram) else {
            self.stats.malformed += 1;
            return;
        };
        if !mc.is_valid_request() {
            self.stats.malformed += 1;
            return;
        }
        let (key, quiet) = match (h.command, classify(body)) {
            (Command::Get, Kind::Get(key)) => (key, false),
            (Command::CondPut, Kind::Write(Command::Set, key, quiet))
                if body.starts_with(b"set ") && text_safe(&key) =>
            {
                (key, quiet)
            }
            (c, Kind::Write(w, key, quiet)) if c == w => (key, quiet),
            _ => {
                self.stats.malformed += 1;
                return;
            }
        };
        if inc::key_hash(&key) != h.key_hash {
            self.stats.malformed += 1;
            return;
        }
        if home == self.me.id {
            self.at_home(h, &key, quiet, datagram, now, emit);
            return;
        }
        if !h.has(flags::DETOUR) {
            if let Some(reply) =
                self.answer_from_cache(h.server, h.command, &key, mc.request_id, body, now)
            {
                self.stats.hits += 1;
                let mut header = Header {
                    command: Command::Reply,
                    flags: h.flags & (flags::EXPANDED | flags::NATIVE),
                    epoch: 0,
                    lease_ms: 0,
                    ..*h
                };
                // A root's hit fills the client's ToR (the cache is inclusive, as in
                // IncBricks): the root now answers for that copy to the home.
                if h.command == Command::Get {
                    if let Some((epoch, lease_ms)) =
                        self.fill_tor(item(h.server, &key), h.origin, now)
                    {
                        header.flags |= flags::FILL;
                        header.epoch = epoch;
                        header.lease_ms = lease_ms;
                    }
                }
                self.send(h.origin, &header, &reply, now, emit);
                return;
            }
        }
        let mut h = *h;
        if !h.has(flags::DETOUR) {
            self.compute_increment(&mut h, &key, mc.request_id, body, now);
        }
        self.send(home, &h, datagram, now, emit);
    }
}
