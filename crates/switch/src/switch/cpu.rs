//! The CPU path's answers: replies the switch builds itself, split gets sent and merged, and
//! server replies shown to the cache.

use super::*;

impl Switch {
    /// Sends the switch's own reply to a client, unless the client has used up its reply
    /// bytes (then every datagram of it is counted as dropped).
    pub(super) fn send_reply(
        &mut self,
        port: u16,
        ends: &UdpEnds,
        request_id: u16,
        reply: &[u8],
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        let Some(frames) = frame::memcached_reply(ends, request_id, reply) else {
            self.stats.count_drop(Drop::SplitBadReply);
            return;
        };
        let bytes = frames.iter().map(Vec::len).sum();
        if !self.reply_allowed(ends.dst_ip, bytes, now) {
            for _ in &frames {
                self.stats.count_drop(Drop::ReplyRateLimited);
            }
            return;
        }
        emit.extend(frames.into_iter().map(|frame| Emit {
            dest: Dest::Port(port),
            frame,
        }));
    }

    pub(super) fn start_split(
        &mut self,
        in_port: u16,
        client: UdpEnds,
        request_id: u16,
        body: &[u8],
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        let (agent_ip, req) = match self.agent_request(body) {
            Ok(x) => x,
            Err(reason) => return self.stats.count_drop(reason),
        };
        let client = split::Client {
            ends: client,
            request_id,
            port: in_port,
        };
        let started = if req.protocol == Protocol::Text {
            let keys: Option<Vec<(Vec<u8>, usize)>> = req
                .keys()
                .map(|k| Some((k.to_vec(), self.view.read_locate(k)?)))
                .collect();
            let Some(keys) = keys else {
                self.stats.count_drop(Drop::NoBackend);
                return;
            };
            // Every part needs a known MAC and port before anything is sent.
            if let Some(reason) = self.unreachable(keys.iter().map(|(_, s)| *s)) {
                self.stats.count_drop(reason);
                return;
            }
            if let Some(cache) = &self.cache {
                let view = &self.view;
                cache
                    .service()
                    .see(&req, &mut |key| view.locate(key).unwrap_or(0), now);
            }
            let service = self.cache.as_ref().map(|c| c.service().clone());
            let command = req.command;
            let mut cached = |key: &[u8]| {
                let service = service.as_ref()?;
                service.serve_text_key(command, key, now)
            };
            match self.splitter.start_cached(
                now,
                client.clone(),
                req.command,
                req.exptime_token(),
                keys,
                &self.sources,
                &mut cached,
            ) {
                Ok(split::Started::Answered(reply)) => {
                    self.stats.answer(Answer::Cache);
                    self.send_reply(
                        client.port,
                        &client.ends,
                        client.request_id,
                        &reply,
                        now,
                        emit,
                    );
                    return;
                }
                Ok(split::Started::Sent(subs)) => Ok(subs),
                Err(e) => Err(e),
            }
        } else {
            let Some(requests) = self.locate_pipeline(body) else {
                self.stats.count_drop(Drop::IncompleteRequest);
                return;
            };
            if let Some(reason) = self.unreachable(requests.iter().filter_map(|(_, s)| *s)) {
                self.stats.count_drop(reason);
                return;
            }
            self.splitter
                .start_pipeline(now, client, &requests, &self.sources)
        };
        let subs = match started {
            Ok(subs) => subs,
            Err(split::SplitError::TableFull) => {
                self.stats.count_drop(Drop::SplitTableFull);
                return;
            }
            Err(split::SplitError::NotRetrieval) => {
                self.stats.count_drop(Drop::PipelinedMultiServer);
                return;
            }
        };
        stats::inc(&self.stats.kv_split);
        self.count_splits();
        self.send_subs(agent_ip, subs, emit);
    }

    /// The address sub-requests go from, and the request of `body` they carry.
    fn agent_request<'b>(&self, body: &'b [u8]) -> Result<(Ipv4Addr, memcache::Request<'b>), Drop> {
        let agent_ip = self.spec.agent_ip.ok_or(Drop::SplitUnavailable)?;
        match memcache::parse(body) {
            Ok(Some(req)) => Ok((agent_ip, req)),
            _ => Err(Drop::IncompleteRequest),
        }
    }

    /// Why sub-requests to `servers` cannot be sent yet: a server whose MAC is unknown, or
    /// whose port is; `None` when every one can be reached.
    pub(super) fn unreachable(&self, servers: impl Iterator<Item = usize> + Clone) -> Option<Drop> {
        if servers.clone().any(|s| self.backend_macs[s].is_none()) {
            return Some(Drop::BackendUnresolved);
        }
        if servers.into_iter().any(|s| self.server_port(s).is_none()) {
            return Some(Drop::RoutePortUnknown);
        }
        None
    }

    /// Sends sub-requests from the agent address, each to its server: the parts of a split
    /// get or the copies of a replicated write.
    pub(super) fn send_subs(
        &mut self,
        agent_ip: Ipv4Addr,
        subs: Vec<split::SubRequest>,
        emit: &mut Vec<Emit>,
    ) {
        for sub in subs {
            let backend = &self.spec.servers[sub.server];
            // Both were checked before the split started.
            let (Some(mac), Some(port)) =
                (self.backend_macs[sub.server], self.server_port(sub.server))
            else {
                continue;
            };
            let ends = UdpEnds {
                src_mac: self.spec.vip.mac,
                dst_mac: mac,
                src_ip: agent_ip,
                dst_ip: *backend.addr.ip(),
                src_port: self.spec.agent_port,
                dst_port: backend.addr.port(),
            };
            let mut header = [0u8; mcudp::LEN];
            mcudp::Header {
                request_id: sub.request_id,
                seq: 0,
                total: 1,
                reserved: 0,
            }
            .emit(&mut header);
            self.stats.backend_request(sub.server);
            emit.push(Emit {
                dest: Dest::Port(port),
                frame: frame::udp_frame(&ends, &[&header, &sub.payload]),
            });
        }
    }

    /// Sends a write to every replica of its key (`replicas`, owner first) from the agent
    /// address; the replies are merged into one for the client (see
    /// [`split::Splitter::start_write`]). Returns whether it went out; a write that did not is
    /// counted as a drop.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start_write(
        &mut self,
        in_port: u16,
        client: UdpEnds,
        request_id: u16,
        body: &[u8],
        replicas: &[usize],
        now: Instant,
        emit: &mut Vec<Emit>,
    ) -> bool {
        let (agent_ip, req) = match self.agent_request(body) {
            Ok(x) => x,
            Err(reason) => {
                self.stats.count_drop(reason);
                return false;
            }
        };
        if let Some(reason) = self.unreachable(replicas.iter().copied()) {
            self.stats.count_drop(reason);
            return false;
        }
        let client = split::Client {
            ends: client,
            request_id,
            port: in_port,
        };
        let quiet = req.noreply();
        match self
            .splitter
            .start_write(now, client, body, replicas, quiet, &self.sources)
        {
            Ok(subs) => {
                stats::inc(&self.stats.kv_replicated);
                self.count_splits();
                self.send_subs(agent_ip, subs, emit);
                true
            }
            Err(e) => {
                self.stats.count_drop(match e {
                    split::SplitError::TableFull => Drop::SplitTableFull,
                    split::SplitError::NotRetrieval => Drop::NoBackend,
                });
                false
            }
        }
    }

    pub(super) fn split_reply(
        &mut self,
        source: (Ipv4Addr, u16),
        payload: &[u8],
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        let Ok((header, body)) = mcudp::Header::parse(payload) else {
            self.stats.count_drop(Drop::BadFrameHeader);
            return;
        };
        match self
            .splitter
            .arrive(source, header.request_id, header.seq, header.total, body)
        {
            Arrival::Stored => {}
            Arrival::Done {
                client_port,
                ends,
                request_id,
                reply,
                write,
            } => {
                self.stats.answer(match write {
                    true => Answer::ReplicatedWrite,
                    false => Answer::MergedGet,
                });
                if let (true, Some(cache)) = (write, &mut self.cache) {
                    cache.write_answered((ends.dst_ip, ends.dst_port), request_id);
                }
                // Quiet gets that all missed, with no no-op after them: memcached sends nothing.
                if !reply.is_empty() {
                    self.send_reply(client_port, &ends, request_id, &reply, now, emit);
                }
            }
            Arrival::BadReply => self.stats.count_drop(Drop::SplitBadReply),
            Arrival::Stale => self.stats.count_drop(Drop::StaleReply),
            Arrival::Foreign => self.stats.count_drop(Drop::SplitForeignReply),
        }
        self.count_splits();
    }

    /// A server's reply to a client passes: the cache hears of it first.
    pub(super) fn reply_passes(&mut self, ip_payload: &[u8], client_ip: Ipv4Addr, now: Instant) {
        let Some(cache) = &mut self.cache else {
            return;
        };
        if let Ok(u) = udp::Packet::new_checked(ip_payload) {
            cache.on_reply((client_ip, u.dst_port()), u.payload(), now);
        }
    }
}
