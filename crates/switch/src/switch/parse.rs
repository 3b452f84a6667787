//! The parser stage: what a frame to the VIP is, and where each memcached request in it goes.

use super::*;

impl Switch {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn parse_ipv4(
        &mut self,
        in_port: u16,
        frame: &[u8],
        src_mac: Mac,
        dst_mac: Mac,
        csum_ready: bool,
        now: Instant,
        emit: &mut Vec<Emit>,
    ) -> Stage {
        let ip = match ipv4::Packet::new_checked(&frame[ethernet::HEADER_LEN..]) {
            Ok(ip) => ip,
            Err(_) => {
                if dst_mac == self.spec.vip.mac {
                    self.stats.count_drop(Drop::BadIpv4);
                    return Stage::Done(Fate::Consumed);
                }
                return Stage::plain();
            }
        };
        let (src_ip, dst_ip) = (ip.src(), ip.dst());
        let plain = ip.header_len() == ipv4::HEADER_LEN && !ip.is_fragment();
        let plain_udp = plain && ip.protocol() == ipv4::Protocol::UDP;
        let plain_flags = match ip.protocol() {
            _ if !plain => 0,
            ipv4::Protocol::UDP => FLAG_PLAIN_UDP,
            ipv4::Protocol::TCP => FLAG_PLAIN_TCP,
            _ => 0,
        };
        let for_vip = dst_ip == self.spec.vip.ip;
        let for_agent = Some(dst_ip) == self.spec.agent_ip;
        if (for_vip || for_agent) && Some(in_port) != self.local {
            if let Some(reason) = self.bad_source_to_vip(src_ip, ip.payload(), plain_flags != 0) {
                self.stats.count_drop(reason);
                return Stage::Done(Fate::Consumed);
            }
        }
        if plain_udp {
            let mut reply = false;
            if let Some(&i) = self.backend_by_ip.get(&src_ip) {
                let src_port = udp::Packet::new_checked(ip.payload()).map(|u| u.src_port());
                if src_port == Ok(self.spec.servers[i].addr.port()) && !self.spec.redis {
                    stats::inc(&self.stats.backends[i].replies);
                    self.reply_passes(ip.payload(), dst_ip, now);
                    reply = true;
                } else if src_port.is_ok_and(|p| self.spec.keyed_ports.contains(&p)) {
                    // A keyed service's answer: the VIP's too, and limited as memcached's.
                    stats::inc(&self.stats.backends[i].replies);
                    reply = true;
                }
            } else if src_ip == self.spec.vip.ip && self.spec.mode == Mode::L2 {
                // In l2 mode the servers answer from the VIP, which they own on loopback.
                let src_port = udp::Packet::new_checked(ip.payload()).map(|u| u.src_port());
                if src_port == Ok(self.spec.vip.port) && !self.spec.redis {
                    self.reply_passes(ip.payload(), dst_ip, now);
                    reply = true;
                } else if src_port.is_ok_and(|p| self.spec.keyed_ports.contains(&p)) {
                    reply = true;
                }
            }
            // The cache has heard of it either way: the server did what it answers.
            if reply && !self.reply_allowed(dst_ip, frame.len(), now) {
                self.stats.count_drop(Drop::ReplyRateLimited);
                return Stage::Done(Fate::Consumed);
            }
        }
        if !for_vip && !for_agent {
            if let Some(stage) =
                self.switchkv_query(dst_mac, src_ip, dst_ip, ip.payload(), plain_udp)
            {
                return stage;
            }
        }
        if !(for_vip || for_agent) || ip.protocol() != ipv4::Protocol::UDP {
            return Stage::Continue {
                flags: plain_flags,
                key_hash: 0,
                routed: false,
                read: None,
                one_read: false,
            };
        }
        // UDP to the VIP (or the agent address): the key router's business.
        if !ip.verify_checksum() {
            self.stats.count_drop(Drop::BadIpv4);
            return Stage::Done(Fate::Consumed);
        }
        if ip.is_fragment() {
            self.stats.count_drop(Drop::IpFragment);
            return Stage::Done(Fate::Consumed);
        }
        if ip.header_len() != ipv4::HEADER_LEN {
            self.stats.count_drop(Drop::Ipv4Options);
            return Stage::Done(Fate::Consumed);
        }
        let Ok(u) = udp::Packet::new_checked(ip.payload()) else {
            self.stats.count_drop(Drop::BadUdp);
            return Stage::Done(Fate::Consumed);
        };
        if csum_ready && !u.verify_checksum(src_ip, dst_ip) {
            self.stats.count_drop(Drop::BadUdpChecksum);
            return Stage::Done(Fate::Consumed);
        }
        let (src_port, dst_port) = (u.src_port(), u.dst_port());
        if for_agent && dst_port == self.spec.agent_port {
            self.split_reply((src_ip, src_port), u.payload(), now, emit);
            return Stage::Done(Fate::Consumed);
        }
        if for_vip && self.spec.keyed_ports.contains(&dst_port) {
            // The header is removed by the UDP length, which must be the IP payload's.
            if usize::from(u.len()) != ip.payload().len() {
                self.stats.count_drop(Drop::BadUdp);
                return Stage::Done(Fate::Consumed);
            }
            return self.route_keyed(u.payload());
        }
        if !for_vip || dst_port != self.spec.vip.port {
            return Stage::Continue {
                flags: FLAG_PLAIN_UDP,
                key_hash: 0,
                routed: false,
                read: None,
                one_read: false,
            };
        }
        if self.spec.redis {
            self.stats.count_drop(Drop::UdpToRedis);
            return Stage::Done(Fate::Consumed);
        }
        stats::inc(&self.stats.kv_requests);
        let client = UdpEnds {
            src_mac: self.spec.vip.mac,
            dst_mac: src_mac,
            src_ip: self.spec.vip.ip,
            dst_ip: src_ip,
            src_port: dst_port,
            dst_port: src_port,
        };
        let payload = u.payload();
        let (header, body) = match mcudp::Header::parse(payload) {
            Ok(x) => x,
            Err(_) => {
                self.stats.count_drop(Drop::BadFrameHeader);
                return Stage::Done(Fate::Consumed);
            }
        };
        if header.seq != 0 || header.total != 1 {
            self.stats.count_drop(Drop::MultiDatagramRequest);
            return Stage::Done(Fate::Consumed);
        }
        // A read a SwitchKV cache node sent back with the other prefix is never steered
        // again, nor asked of the cache (whose miss would steer it): it goes to its server.
        let sent_back = keymac::is_other(dst_mac);
        match self.route_datagram(body) {
            Route::One { key_hash, one_read } => {
                self.warm_deletes(body, &[], emit);
                let mut read = None;
                if let (Some(cache), false) = (&mut self.cache, sent_back) {
                    let view = &self.view;
                    let mut locate = |key: &[u8]| view.locate(key).unwrap_or(0);
                    match cache.on_request(
                        (src_ip, src_port),
                        header.request_id,
                        body,
                        &mut locate,
                        now,
                    ) {
                        Ok(true) => {
                            read = Some(Read {
                                client,
                                request_id: header.request_id,
                                body: BODY_OFFSET,
                            })
                        }
                        Ok(false) => {}
                        Err(reason) => {
                            self.stats.count_drop(reason);
                            return Stage::Done(Fate::Consumed);
                        }
                    }
                }
                // With the cache on, only the reads it may answer are marked, as before.
                let one_read = read.is_some() || (self.cache.is_none() && one_read && !sent_back);
                Stage::Continue {
                    flags: FLAG_PLAIN_UDP,
                    key_hash,
                    routed: true,
                    read,
                    one_read,
                }
            }
            Route::Answer(kind, reply) => {
                self.stats.answer(kind);
                self.send_reply(in_port, &client, header.request_id, reply, now, emit);
                Stage::Done(Fate::Consumed)
            }
            Route::Split => {
                self.start_split(in_port, client, header.request_id, body, now, emit);
                Stage::Done(Fate::Consumed)
            }
            Route::Replicate { servers } => {
                if let Some(cache) = &mut self.cache {
                    let view = &self.view;
                    let mut locate = |key: &[u8]| view.locate(key).unwrap_or(0);
                    let opened = cache.on_request(
                        (src_ip, src_port),
                        header.request_id,
                        body,
                        &mut locate,
                        now,
                    );
                    if let Err(reason) = opened {
                        self.stats.count_drop(reason);
                        return Stage::Done(Fate::Consumed);
                    }
                }
                self.warm_deletes(body, &servers, emit);
                let sent = self.start_write(
                    in_port,
                    client,
                    header.request_id,
                    body,
                    &servers,
                    now,
                    emit,
                );
                // Not sent: the write the cache opened for it is over at once, so the key is
                // not kept from filling until the write's time runs out.
                if let (false, Some(cache)) = (sent, &mut self.cache) {
                    cache.write_answered((src_ip, src_port), header.request_id);
                }
                Stage::Done(Fate::Consumed)
            }
            Route::Drop(reason) => {
                self.stats.count_drop(reason);
                Stage::Done(Fate::Consumed)
            }
        }
    }

    /// A query a SwitchKV client encoded ([`keymac`]): a query prefix in the destination MAC,
    /// to a server's address and memcached port. Its key hash is the MAC's; a client's read is
    /// marked as one read, so that `kv_steer` may send it to a cache node, and `kv_backend`
    /// sends the rest to the server. Its payload is not read: the client chose the server.
    /// `None` for a frame to any other MAC; a query MAC on anything else is dropped, as is
    /// every query while kvswitch's own cache is on (it would miss their writes).
    fn switchkv_query(
        &self,
        dst_mac: Mac,
        src_ip: Ipv4Addr,
        dst_ip: Ipv4Addr,
        l4: &[u8],
        plain_udp: bool,
    ) -> Option<Stage> {
        let (kind, key_hash) = keymac::decode(dst_mac)?;
        let server = self
            .backend_by_ip
            .get(&dst_ip)
            .and_then(|&i| self.spec.servers.get(i));
        let to_server = plain_udp
            && server.is_some_and(|s| {
                udp::Packet::new_checked(l4).is_ok_and(|u| u.dst_port() == s.addr.port())
            });
        if !to_server || self.bad_source_to_vip(src_ip, l4, plain_udp).is_some() {
            self.stats.count_drop(Drop::SwitchkvMisaddressed);
            return Some(Stage::Done(Fate::Consumed));
        }
        if self.cache.is_some() {
            self.stats.count_drop(Drop::SwitchkvCacheOn);
            return Some(Stage::Done(Fate::Consumed));
        }
        let get = kind == keymac::Kind::Get;
        stats::inc(match get {
            true => &self.stats.switchkv_gets,
            false => &self.stats.switchkv_others,
        });
        Some(Stage::Continue {
            flags: FLAG_PLAIN_UDP | FLAG_SWITCHKV,
            key_hash,
            routed: true,
            read: None,
            one_read: get,
        })
    }

    /// Decides where the requests of one datagram go: all to one server, answered here, split,
    /// or dropped. Never chooses a server that does not hold every key of the datagram.
    pub(super) fn route_datagram(&mut self, body: &[u8]) -> Route {
        let mut offset = 0;
        let mut target: Option<(usize, u32)> = None;
        let mut multi = false;
        let mut requests = 0;
        let mut split_candidate = false;
        // Whether every request so far is a binary or meta get of one protocol, with at most
        // a trailing no-op: a pipeline the splitter can take apart.
        let mut pipelined_gets = true;
        let mut protocol: Option<Protocol> = None;
        let mut local: Option<&'static [u8]> = None;
        let mut noops = 0;
        let mut writes = false;
        let mut cas = false;
        // Whether the last request is one the cache could answer: with `requests == 1`, a
        // datagram holding one read of its keys.
        let mut servable = false;
        while offset < body.len() {
            let req = match memcache::parse(&body[offset..]) {
                Ok(Some(req)) => req,
                Ok(None) => return Route::Drop(Drop::IncompleteRequest),
                Err(e) => {
                    if requests > 0 {
                        return Route::Drop(Drop::PipelinedError);
                    }
                    if body[offset] == 0x80 || body[offset] == 0x81 {
                        return Route::Drop(Drop::BadBinaryRequest);
                    }
                    if e.text_reply().is_empty() {
                        return Route::Drop(Drop::BadRequest);
                    }
                    let kind = if e.text_reply() == b"ERROR\r\n" {
                        Answer::UnknownCommand
                    } else {
                        Answer::ClientError
                    };
                    return Route::Answer(kind, e.text_reply());
                }
            };
            requests += 1;
            writes |= req.command.is_write() && !req.command.is_retrieval();
            cas |= req.compares_cas();
            // Nothing may follow a no-op in a pipeline the splitter takes apart.
            let after_noop = noops > 0;
            if req.key_count() == 0 {
                match req.command {
                    // No-ops end a pipeline of quiet requests; they go wherever the keys go.
                    Command::MetaNoop | Command::Binary(memcache::binary::opcode::NOOP) => {
                        if req.command == Command::MetaNoop {
                            local = Some(b"MN\r\n");
                        }
                        noops += 1;
                    }
                    Command::Version => local = Some(VERSION_REPLY),
                    _ => return Route::Drop(Drop::KeylessCommand),
                }
            }
            split_candidate = req.protocol == Protocol::Text
                && matches!(
                    req.command,
                    Command::Get | Command::Gets | Command::Gat | Command::Gats
                );
            pipelined_gets &= !after_noop
                && req.protocol != Protocol::Text
                && protocol.is_none_or(|p| p == req.protocol)
                && is_pipelined_get_or_noop(req.command);
            protocol = Some(req.protocol);
            servable = memcache::cached::servable(&req).is_some();
            for token in req.keys() {
                let (hash, server) = match self.place(&req, token) {
                    Ok((hash, Some(server))) => (hash, server),
                    // Every server of the pool is out.
                    Ok((_, None)) => return Route::Drop(Drop::NoBackend),
                    Err(e) => return Route::Answer(Answer::ClientError, e.text_reply()),
                };
                match target {
                    None => target = Some((server, hash)),
                    Some((s, _)) if s != server => multi = true,
                    Some(_) => {}
                }
            }
            offset += req.len.max(1);
        }
        if target.is_some() && noops > 0 {
            // Keyed requests with their terminating no-op: one server answers them all.
            local = None;
        }
        if let Some(reply) = local {
            if requests == 1 {
                return Route::Answer(Answer::Local, reply);
            }
            return Route::Drop(Drop::KeylessCommand);
        }
        if writes && self.view.replicas() > 1 {
            let Some((_, key_hash)) = target else {
                return Route::Drop(Drop::IncompleteRequest);
            };
            if requests > 1 {
                return Route::Drop(Drop::ReplicatedPipeline);
            }
            if cas {
                return match protocol {
                    Some(Protocol::Binary) => Route::Drop(Drop::ReplicatedCas),
                    _ => Route::Answer(Answer::ClientError, REPLICATED_CAS_REPLY),
                };
            }
            let mut servers = Vec::with_capacity(self.view.replicas());
            self.view.replicas_hash(key_hash, &mut servers);
            if servers.len() > 1 {
                return Route::Replicate { servers };
            }
        }
        match target {
            None => Route::Drop(Drop::IncompleteRequest),
            Some((_, key_hash)) if !multi => Route::One {
                key_hash,
                one_read: requests == 1 && servable,
            },
            Some(_) if requests == 1 && split_candidate => Route::Split,
            Some(_) if pipelined_gets => Route::Split,
            Some(_) => Route::Drop(Drop::PipelinedMultiServer),
        }
    }

    /// While a server warms up, a write to one of its keys also deletes the key where it
    /// was before (a quiet binary delete from the agent address, unless that server keeps
    /// the key as a replica), so that a later miss on the warming server, read there by the
    /// proxy, does not find the value the write replaced.
    fn warm_deletes(&mut self, body: &[u8], replicas: &[usize], emit: &mut Vec<Emit>) {
        if !self.view.is_warming() {
            return;
        }
        let Some(agent_ip) = self.spec.agent_ip else {
            return;
        };
        let mut subs = Vec::new();
        let mut offset = 0;
        while let Some(Ok(Some(req))) = body.get(offset..).map(memcache::parse) {
            offset += req.len.max(1);
            if !req.command.is_write() || req.command.is_retrieval() {
                continue;
            }
            for token in req.keys() {
                let mut decoded = [0u8; memcache::MAX_KEY_LEN];
                let Ok(key) = req.stored_key(token, &mut decoded) else {
                    continue;
                };
                let Some((_, before)) = self.view.warm_source(self.view.key_hash(key)) else {
                    continue;
                };
                if replicas.contains(&before) || self.unreachable(std::iter::once(before)).is_some()
                {
                    continue;
                }
                let mut payload = Vec::with_capacity(memcache::binary::HEADER_LEN + key.len());
                memcache::binary::write_request(
                    memcache::binary::opcode::DELETEQ,
                    key,
                    b"",
                    b"",
                    0,
                    0,
                    &mut payload,
                );
                subs.push(split::SubRequest {
                    server: before,
                    request_id: 0,
                    payload,
                });
            }
        }
        self.send_subs(agent_ip, subs, emit);
    }

    /// A datagram to a keyed port of the VIP: placed by the key its key-location header
    /// points at, with the pool's hash and ring; `kv_route` removes the header and sends it to
    /// the key's server. A bad header, or no server in the ring, drops it.
    fn route_keyed(&mut self, datagram: &[u8]) -> Stage {
        stats::inc(&self.stats.keyed_requests);
        let located = match wire::keyloc::parse(datagram) {
            Ok(located) => located,
            Err(_) => {
                self.stats.count_drop(Drop::BadKeyHeader);
                return Stage::Done(Fate::Consumed);
            }
        };
        let key_hash = self.view.key_hash(located.key_bytes());
        if self.view.read_locate_hash(key_hash).is_none() {
            self.stats.count_drop(Drop::NoBackend);
            return Stage::Done(Fate::Consumed);
        }
        Stage::Continue {
            flags: FLAG_PLAIN_UDP,
            key_hash,
            routed: true,
            read: None,
            one_read: false,
        }
    }

    /// The key hash and server of one key of `req`, placed as memcached stores it: a base64
    /// meta key by its decoded bytes.
    pub(super) fn place(
        &self,
        req: &memcache::Request<'_>,
        token: &[u8],
    ) -> Result<(u32, Option<usize>), memcache::Error> {
        let mut decoded = [0u8; memcache::MAX_KEY_LEN];
        let key = req.stored_key(token, &mut decoded)?;
        let hash = self.view.key_hash(key);
        Ok((hash, self.view.locate_hash(hash)))
    }

    pub(super) fn locate_pipeline<'a>(
        &self,
        body: &'a [u8],
    ) -> Option<Vec<(memcache::Request<'a>, Option<usize>)>> {
        let mut out = Vec::new();
        let mut offset = 0;
        while offset < body.len() {
            let req = memcache::parse(body.get(offset..)?).ok()??;
            let server = match req.key() {
                Some(token) => Some(self.place(&req, token).ok()?.1?),
                None => None,
            };
            offset += req.len.max(1);
            out.push((req, server));
        }
        Some(out)
    }
}

/// Whether a request may be part of a pipeline the splitter takes apart: a binary
/// `GET`/`GETQ`/`GETK`/`GETKQ` or `NOOP`, a meta `mg` or `mn`.
pub(super) fn is_pipelined_get_or_noop(command: Command) -> bool {
    use memcache::binary::opcode;
    matches!(
        command,
        Command::MetaGet
            | Command::MetaNoop
            | Command::Binary(
                opcode::GET | opcode::GETQ | opcode::GETK | opcode::GETKQ | opcode::NOOP
            )
    )
}

/// The answer to a text or meta write that compares a cas unique, in a replicated pool: each
/// replica has its own uniques, so the comparison could succeed on some and fail on others.
pub(super) const REPLICATED_CAS_REPLY: &[u8] =
    b"SERVER_ERROR cas is not supported by a replicated pool\r\n";

/// The reply to `version` on the VIP: the switch answers for the pool.
pub(super) const VERSION_REPLY: &[u8] =
    concat!("VERSION kvswitch-", env!("CARGO_PKG_VERSION"), "\r\n").as_bytes();

pub(super) enum Stage {
    Done(Fate),
    Continue {
        flags: u32,
        key_hash: u32,
        routed: bool,
        /// One read the cache may answer.
        read: Option<Read>,
        /// One read of one key: what `kv_steer` may send elsewhere.
        one_read: bool,
    },
}

/// A read the cache may answer, as the parser found it.
pub(super) struct Read {
    /// The reply's addresses: from the VIP back to the client.
    pub(super) client: UdpEnds,
    pub(super) request_id: u16,
    /// Where the request starts in the frame.
    pub(super) body: usize,
}

/// Where a UDP request to the VIP starts in its frame: Ethernet, IPv4 without options (others
/// are dropped before), UDP, and memcached's frame header.
pub(super) const BODY_OFFSET: usize =
    ethernet::HEADER_LEN + ipv4::HEADER_LEN + udp::HEADER_LEN + mcudp::LEN;

impl Stage {
    fn plain() -> Stage {
        Stage::Continue {
            flags: 0,
            key_hash: 0,
            routed: false,
            read: None,
            one_read: false,
        }
    }
}

pub(super) enum Route {
    One {
        key_hash: u32,
        /// One read of one key the cache could answer (what `kv_steer` steers).
        one_read: bool,
    },
    /// A lone write in a replicated pool: to each of these servers, owner first.
    Replicate {
        servers: Vec<usize>,
    },
    Answer(Answer, &'static [u8]),
    Split,
    Drop(Drop),
}

/// Completes the UDP or TCP checksum of an IPv4 frame whose sender left it to hardware (a
/// veth with transmit offload on hands such frames over with only the pseudo-header sum in
/// place). Fragments and malformed frames are left alone.
pub(crate) fn complete_l4_checksum(frame: &mut [u8]) {
    let Some(l3) = frame.get(ethernet::HEADER_LEN..) else {
        return;
    };
    let Ok(ip) = ipv4::Packet::new_checked(l3) else {
        return;
    };
    if ip.is_fragment() {
        return;
    }
    let (src, dst, proto) = (ip.src(), ip.dst(), ip.protocol());
    let start = ethernet::HEADER_LEN + ip.header_len();
    let end = ethernet::HEADER_LEN + usize::from(ip.total_len());
    let check_at = match proto {
        ipv4::Protocol::UDP => 6,
        ipv4::Protocol::TCP => 16,
        _ => return,
    };
    let Some(segment) = frame.get_mut(start..end) else {
        return;
    };
    if segment.len() < check_at + 2 {
        return;
    }
    segment[check_at..check_at + 2].copy_from_slice(&[0, 0]);
    let pseudo = wire::checksum::pseudo_header_v4(src, dst, proto.0, segment.len() as u16);
    let mut sum = wire::checksum::fold(pseudo + wire::checksum::sum(segment));
    if sum == 0 && proto == ipv4::Protocol::UDP {
        sum = 0xffff;
    }
    segment[check_at..check_at + 2].copy_from_slice(&sum.to_be_bytes());
}
