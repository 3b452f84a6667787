//! A client's request at its own ToR: read, refused or answered here, then sent into the fabric
//! along the key's designated path (or taken at once when this ToR is the key's home).

use super::*;

impl FabricSwitch {
    /// A client's memcached datagram to a server of the fabric, at the client's ToR. False
    /// when it is not the fabric's to carry (it is then routed as it is).
    pub(super) fn ingress(
        &mut self,
        client: (Ipv4Addr, u16),
        server: (Ipv4Addr, u16),
        datagram: &[u8],
        native: Option<(Command, u16)>,
        now: Instant,
        emit: &mut Vec<Emit>,
    ) -> bool {
        let Ok((mc, body)) = mcudp::Header::parse(datagram) else {
            return false;
        };
        if !mc.is_valid_request() {
            return false;
        }
        let Some(home) = self.home_of(server.0) else {
            return false;
        };
        let mut header = Header {
            request_id: match native {
                Some((_, id)) => id,
                None => self.new_request_id(),
            },
            command: Command::Get,
            key_hash: 0,
            flags: flags::EXPANDED | if native.is_some() { flags::NATIVE } else { 0 },
            origin: self.me.id,
            via: 0,
            epoch: 0,
            client,
            server,
            lease_ms: 0,
        };
        let (command, key, quiet) = match (classify(body), native) {
            (Kind::Plain, None) => return false,
            (Kind::Refused(why), _) => {
                self.stats.refused += 1;
                self.answer_error(&header, mc.request_id, "SERVER_ERROR", why, emit);
                return true;
            }
            (Kind::Get(key), None | Some((Command::Get, _))) => (Command::Get, key, false),
            (Kind::Write(command, key, quiet), None) => (command, key, quiet),
            (Kind::Write(Command::Set, key, quiet), Some((Command::CondPut, _)))
                if cond_operand(body).is_some() && body.starts_with(b"set ") && text_safe(&key) =>
            {
                (Command::CondPut, key, quiet)
            }
            (Kind::Write(command, key, quiet), Some((asked, _))) if command == asked => {
                (command, key, quiet)
            }
            (_, Some(_)) => {
                self.stats.malformed += 1;
                let why = "the message's command does not match its request";
                self.answer_error(&header, mc.request_id, "CLIENT_ERROR", why, emit);
                return true;
            }
        };
        header.command = command;
        header.key_hash = inc::key_hash(&key);
        self.stats.requests_in += 1;
        if let Some(reply) = self.answer_from_cache(server, command, &key, mc.request_id, body, now)
        {
            self.stats.hits += 1;
            self.answer(&header, &reply, emit);
            return true;
        }
        self.compute_increment(&mut header, &key, mc.request_id, body, now);
        if home == self.me.id {
            self.at_home(&header, &key, quiet, datagram, now, emit);
            return true;
        }
        let root = self.spec.registration.root(header.key_hash);
        if self.link_to(root, now).is_some() {
            self.send(root, &header, datagram, now, emit);
        } else {
            header.flags |= flags::DETOUR;
            self.send(home, &header, datagram, now, emit);
        }
        true
    }

    /// A request from a client that speaks the fabric's message itself (to a server's
    /// address, on [`inc::PORT`]).
    pub(super) fn ingress_native(
        &mut self,
        client: (Ipv4Addr, u16),
        server: (Ipv4Addr, u16),
        payload: &[u8],
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        let msg = match Message::parse(payload) {
            Ok(m)
                if matches!(
                    m.header.command,
                    Command::Get
                        | Command::Set
                        | Command::Del
                        | Command::Increment
                        | Command::CondPut
                ) =>
            {
                m
            }
            _ => {
                self.stats.malformed += 1;
                return;
            }
        };
        let native = Some((msg.header.command, msg.header.request_id));
        if !self.ingress(client, server, msg.payload, native, now, emit) {
            // A read the caches do not answer: straight to the server's home.
            self.stats.malformed += 1;
        }
    }
}
