//! What this switch answers a client itself: hits of its cache, a conditional put that would
//! change nothing, and errors, in the client's own format.

use super::*;

impl FabricSwitch {
    /// What a designated switch answers from its cache: a `get`'s hit, or a conditional put
    /// whose operand is not above the cached number (nothing to write).
    pub(super) fn answer_from_cache(
        &mut self,
        server: (Ipv4Addr, u16),
        command: Command,
        key: &[u8],
        request_id: u16,
        body: &[u8],
        now: Instant,
    ) -> Option<Vec<u8>> {
        match command {
            Command::Get => self.cached_reply(server, key, request_id, now),
            Command::CondPut => {
                let operand = cond_operand(body)?;
                let cached = self
                    .cache
                    .get(&item(server, key), now)
                    .and_then(|(reply, _)| cached_number(reply))?;
                (cached >= operand).then(|| {
                    let mut reply = vec![0u8; mcudp::LEN];
                    mcudp::Header::single(request_id).emit(&mut reply);
                    reply.extend_from_slice(b"NOT_STORED\r\n");
                    reply
                })
            }
            _ => None,
        }
    }

    /// Answers the client of `h` with `datagram`: as a message for a client that speaks the
    /// fabric's format, else as the server's own datagram.
    pub(super) fn answer(&mut self, h: &Header, datagram: &[u8], emit: &mut Vec<Emit>) {
        if !h.has(flags::NATIVE) {
            self.send_to_client(h.client, h.server, datagram, emit);
            return;
        }
        let mut payload = Vec::with_capacity(inc::HEADER_LEN + datagram.len());
        Header {
            command: Command::Reply,
            flags: flags::NATIVE,
            epoch: 0,
            lease_ms: 0,
            ..*h
        }
        .emit(&mut payload);
        payload.extend_from_slice(datagram);
        self.send_to_client(h.client, (h.server.0, inc::PORT), &payload, emit);
    }

    /// Answers the client of `h` with `KIND reason`.
    pub(super) fn answer_error(
        &mut self,
        h: &Header,
        request_id: u16,
        kind: &str,
        why: &str,
        emit: &mut Vec<Emit>,
    ) {
        let mut reply = vec![0u8; mcudp::LEN];
        mcudp::Header::single(request_id).emit(&mut reply);
        reply.extend_from_slice(format!("{kind} {why}\r\n").as_bytes());
        self.answer(h, &reply, emit);
    }

    /// The datagram answering `get KEY` from this switch's cache.
    pub(super) fn cached_reply(
        &mut self,
        server: (Ipv4Addr, u16),
        key: &[u8],
        request_id: u16,
        now: Instant,
    ) -> Option<Vec<u8>> {
        let (body, _) = self.cache.get(&item(server, key), now)?;
        let mut reply = vec![0u8; mcudp::LEN];
        mcudp::Header::single(request_id).emit(&mut reply);
        reply.extend_from_slice(body);
        Some(reply)
    }
}
