//! Write-update (the `update` coherence protocol): a write still takes every copy of its key
//! away before it is applied, and once its server has stored it, the home sends the value to
//! the switches it invalidated, stamped after the write. The copies come back without a read
//! of the server, and no reader can see the old value after the new one: every copy of the
//! new value is made after the write is applied, and a later write's invalidation refuses a
//! copy stamped before it, whichever arrives first.

use super::*;

impl FabricSwitch {
    /// Under write-update, the reply a read of the key gives once `body` (a client's write
    /// datagram's memcached bytes) is stored: for a text `set`, `add`, `replace` or `cas`
    /// whose value fits one reply datagram. `None` for anything else, which updates nothing.
    pub(super) fn value_after_write(&self, key: &[u8], body: &[u8]) -> Option<Vec<u8>> {
        if self.spec.coherence != Coherence::Update {
            return None;
        }
        let request = wire::memcache::parse(body).ok()??;
        use wire::memcache::Command as C;
        if !matches!(request.command, C::Set | C::Add | C::Replace | C::Cas)
            || request.key() != Some(key)
            || request.noreply()
        {
            return None;
        }
        let data = request.data()?;
        // `<command> <key> <flags> ...`: the flags are the third word of the line, a 32-bit
        // number memcached gives back in its own form (`007` is read back as `7`).
        let line = body.split(|&b| b == b'\n').next()?;
        let flags = line.split(|&b| b == b' ').nth(2)?;
        let flags = flags.strip_suffix(b"\r").unwrap_or(flags);
        if flags.is_empty() || !flags.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let flags: u32 = std::str::from_utf8(flags).ok()?.parse().ok()?;
        let mut value = Vec::with_capacity(key.len() + data.len() + 32);
        value.extend_from_slice(b"VALUE ");
        value.extend_from_slice(key);
        value.extend_from_slice(format!(" {flags} {}\r\n", data.len()).as_bytes());
        value.extend_from_slice(data);
        value.extend_from_slice(b"\r\nEND\r\n");
        (value.len() <= mcudp::MAX_PAYLOAD).then_some(value)
    }

    /// The write on `name` is done and stored `value` (a reply body): the home's own copy and
    /// the switches in `invalidated` take it, each ToR by a fill-only reply that fills the
    /// key's designated root on its way, as a read's reply would. Each is recorded as a
    /// sharer first, so the key's next write invalidates it again.
    pub(super) fn update_copies(
        &mut self,
        h: &Header,
        name: &[u8],
        value: &[u8],
        invalidated: &[SwitchId],
        now: Instant,
        emit: &mut Vec<Emit>,
    ) {
        // As for a read's reply: a value whose item expires sooner lives no longer.
        let Some(lease) = self.fill_lease(name, now) else {
            return;
        };
        let stamp = self.directory.read();
        let Some(epoch) = self.directory.fill(name, stamp, [], now) else {
            // Another write opened, or the key is quarantined: nothing is updated.
            return;
        };
        self.cache.fill_for(name, value, epoch, lease, now);
        let mut datagram = vec![0u8; mcudp::LEN];
        mcudp::Header::single(0).emit(&mut datagram);
        datagram.extend_from_slice(value);
        for &tor in invalidated {
            let is_tor = self.spec.member(tor).is_some_and(|m| m.role == Role::Tor);
            if tor == self.me.id || !is_tor || self.spec.registration.is_failed(tor) {
                // A root takes its copy on the way to a ToR it serves; a switch the table
                // names failed holds nothing and takes nothing.
                continue;
            }
            let to = Header {
                request_id: 0,
                command: Command::Reply,
                flags: flags::EXPANDED | flags::FILL_ONLY,
                origin: tor,
                via: 0,
                epoch: 0,
                lease_ms: if lease < self.spec.lease {
                    whole_ms(lease)
                } else {
                    0
                },
                ..*h
            };
            let sharers = self.sharers_on_way(&to, now);
            let Some(epoch) = self.directory.fill(name, stamp, sharers, now) else {
                continue;
            };
            self.stats.updates_sent += 1;
            self.reply_to(&to, h.key_hash, &datagram, Some(epoch), now, emit);
        }
    }
}
