//! Writes at their home: every copy invalidated first, then the write sent to its server; a
//! conditional put reads the server's value first; a write the directory fails or refuses is
//! answered with an error.

use super::*;

impl FabricSwitch {
    /// Carries out a step of the directory for the write on `name` (an [`item`] name).
    pub(super) fn write_step(
        &mut self,
        name: &[u8],
        step: WriteStep<Write>,
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        let (write, why) = match step {
            WriteStep::Queued => return,
            WriteStep::Invalidate { epoch, targets } => {
                for target in targets {
                    self.send_invalidation(name, epoch, target, now, emit);
                }
                return;
            }
            WriteStep::Forward(write) => return self.forward_write(write, now, emit),
            WriteStep::Failed(write) => {
                self.stats.writes_failed += 1;
                (write, "fabric invalidation not acknowledged")
            }
            WriteStep::Refused(write) => {
                self.stats.writes_refused += 1;
                (write, "too many writes to this key wait in the fabric")
            }
        };
        let Ok((mc, _)) = mcudp::Header::parse(&write.datagram) else {
            return;
        };
        let mut reply = vec![0u8; mcudp::LEN];
        mcudp::Header::single(mc.request_id).emit(&mut reply);
        reply.extend_from_slice(format!("SERVER_ERROR {why}\r\n").as_bytes());
        let h = self.write_header(&write);
        self.reply_to(&h, inc::key_hash(&write.key), &reply, None, now, emit);
    }

    pub(super) fn write_header(&self, w: &Write) -> Header {
        Header {
            request_id: w.request_id,
            command: w.command,
            key_hash: inc::key_hash(&w.key),
            flags: flags::EXPANDED
                | if w.detour { flags::DETOUR } else { 0 }
                | if w.native { flags::NATIVE } else { 0 },
            origin: w.origin,
            via: 0,
            epoch: 0,
            client: w.client,
            server: w.server,
            lease_ms: 0,
        }
    }

    /// Sends the invalidation of `name` (an [`item`] name) at `epoch` to `target`.
    pub(super) fn send_invalidation(
        &mut self,
        name: &[u8],
        epoch: u32,
        target: SwitchId,
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        let Some((server, key)) = split_item(name) else {
            return;
        };
        if target == self.me.id {
            return;
        }
        let header = Header {
            request_id: self.new_request_id(),
            command: Command::Invalidate,
            key_hash: inc::key_hash(key),
            flags: 0,
            origin: self.me.id,
            via: 0,
            epoch,
            client: (Ipv4Addr::UNSPECIFIED, 0),
            server,
            lease_ms: 0,
        };
        self.stats.invalidations_sent += 1;
        self.send(target, &header, key, now, emit);
    }

    /// A write whose invalidations are all acknowledged goes to its server.
    pub(super) fn forward_write(&mut self, write: Write, now: Instant, emit: &mut Vec<Emit>) {
        let Ok((mc, _)) = mcudp::Header::parse(&write.datagram) else {
            self.stats.malformed += 1;
            return;
        };
        self.stats.writes_forwarded += 1;
        self.stats.writes_held_us += micros(now.saturating_duration_since(write.arrived));
        if write.command == Command::CondPut {
            // Executed here on the server's value: read it first, under the key's write.
            // An id this client has no request waiting under.
            let mut id = self.new_request_id();
            for _ in 0..16 {
                if !self
                    .pending
                    .contains_key(&(write.client.0, write.client.1, id))
                {
                    break;
                }
                id = self.new_request_id();
            }
            let mut get = vec![0u8; mcudp::LEN];
            mcudp::Header::single(id).emit(&mut get);
            get.extend_from_slice(b"get ");
            get.extend_from_slice(&write.key);
            get.extend_from_slice(b"\r\n");
            let (client, server) = (write.client, write.server);
            self.remember(
                (client.0, client.1, id),
                Pending {
                    key: write.key.clone(),
                    stamp: None,
                    origin: write.origin,
                    detour: write.detour,
                    native: write.native,
                    request_id: write.request_id,
                    since: now,
                    cond: Some(write),
                    update: None,
                },
            );
            self.send_to_server(client, server, &get, emit);
            return;
        }
        self.send_write(write, mc.request_id, now, emit);
    }

    /// Sends a write to its server and waits for the reply (none for a quiet one).
    pub(super) fn send_write(
        &mut self,
        write: Write,
        request_id: u16,
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        // A reply is matched to its request by the client's address, port and request id
        // alone: when another request of the client's under the same id is in flight, either
        // reply may be taken for either, so neither may update copies.
        let flow = (write.client.0, write.client.1, request_id);
        let shared_id = match self.pending.get_mut(&flow) {
            Some(other) => {
                other.update = None;
                true
            }
            None => false,
        };
        let update = match mcudp::Header::parse(&write.datagram) {
            Ok((_, body)) if !write.quiet && !shared_id => self.value_after_write(&write.key, body),
            _ => None,
        };
        self.remember(
            (write.client.0, write.client.1, request_id),
            Pending {
                key: write.key.clone(),
                stamp: None,
                cond: None,
                origin: write.origin,
                detour: write.detour,
                native: write.native,
                request_id: write.request_id,
                since: now,
                update,
            },
        );
        self.send_to_server(write.client, write.server, &write.datagram, emit);
        if write.quiet {
            // No reply will come: the write is done once it left (the server takes the
            // key's requests in the order this home sends them).
            self.pending
                .remove(&(write.client.0, write.client.1, request_id));
            let name = item(write.server, &write.key);
            if let Some(step) = self.directory.done(&name, now) {
                self.write_step(&name, step, now, emit);
            }
        }
    }

    /// The server's value for a conditional put waiting at its home: the put goes on to
    /// the server when the value is smaller or unset, else the client hears `NOT_STORED`.
    pub(super) fn cond_put_read(
        &mut self,
        write: Write,
        body: &[u8],
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        let Ok((mc, put)) = mcudp::Header::parse(&write.datagram) else {
            return;
        };
        let current = if body == b"END\r\n" {
            None
        } else {
            Some(cached_number(body))
        };
        let operand = cond_operand(put);
        let store = match (current, operand) {
            (None, Some(_)) => true,
            (Some(Some(v)), Some(o)) => v < o,
            _ => false,
        };
        if store {
            self.send_write(write, mc.request_id, now, emit);
            return;
        }
        let mut reply = vec![0u8; mcudp::LEN];
        mcudp::Header::single(mc.request_id).emit(&mut reply);
        reply.extend_from_slice(b"NOT_STORED\r\n");
        let h = self.write_header(&write);
        self.reply_to(&h, inc::key_hash(&write.key), &reply, None, now, emit);
        let name = item(write.server, &write.key);
        if let Some(step) = self.directory.done(&name, now) {
            self.write_step(&name, step, now, emit);
            return;
        }
        // Nothing changed and no write waits: the value read is the key's value now, and
        // the designated switches on the way may cache it, so that the next conditional
        // put that would change nothing is answered there.
        if matches!(current, Some(Some(_))) && reply_key(body) == Some(&write.key[..]) {
            let stamp = self.directory.read();
            let sharers = self.sharers_on_way(&h, now);
            if let Some(epoch) = self.directory.fill(&name, stamp, sharers, now) {
                self.cache.fill(&name, body, epoch, now);
                let mut datagram = vec![0u8; mcudp::LEN];
                mcudp::Header::single(0).emit(&mut datagram);
                datagram.extend_from_slice(body);
                let h = Header {
                    flags: h.flags | flags::FILL_ONLY,
                    ..h
                };
                self.reply_to(
                    &h,
                    inc::key_hash(&write.key),
                    &datagram,
                    Some(epoch),
                    now,
                    emit,
                );
            }
        }
    }
}
