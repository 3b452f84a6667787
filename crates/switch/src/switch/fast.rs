//! The switch's side of a fast path ([`crate::fastpath`]): the tables it publishes, the senders
//! it remembers, and what it takes back.

use std::collections::BTreeSet;

use super::*;
use crate::fastpath::{FastServer, Host, Seen, Tables, MAX_HOSTS};

/// The hash and ketama points a fast path routes by; `None` when keys are not placed by the
/// ring alone.
pub(super) type FastRing = Option<(kv::HashFn, Arc<[(u32, usize)]>)>;

impl Switch {
    /// Turns the fast path's bookkeeping on or off: while it is on, each IPv4 sender whose
    /// frame the switch sends on to one port is remembered (at most [`MAX_HOSTS`]).
    pub fn set_fast_path(&mut self, on: bool) {
        self.fast_hosts = on.then(BTreeSet::new);
    }

    /// The sender of `frame` as a fast path would key it, when the switch remembers senders.
    pub(super) fn fast_sender(&self, in_port: u16, frame: &[u8]) -> Option<Host> {
        let hosts = self.fast_hosts.as_ref()?;
        if Some(in_port) == self.local || frame.get(12..14) != Some(&[0x08, 0x00][..]) {
            return None;
        }
        let mac = Mac(frame.get(6..12)?.try_into().ok()?);
        let at = usize::from(OFF_IP_SRC);
        let ip = Ipv4Addr::from(<[u8; 4]>::try_from(frame.get(at..at + 4)?).ok()?);
        let host = Host {
            mac,
            ip,
            port: in_port,
        };
        (!hosts.contains(&host) && hosts.len() < MAX_HOSTS).then_some(host)
    }

    /// Remembers a sender whose frame the switch just sent on.
    pub(super) fn fast_note(&mut self, host: Host) {
        if let Some(hosts) = &mut self.fast_hosts {
            hosts.insert(host);
        }
    }

    /// Why a fast path may not act for the switch now, if it may not: something reads or
    /// changes frames that it does not know of.
    fn fast_blocker(&self) -> Option<&'static str> {
        if self.fast_hosts.is_none() {
            return Some("off");
        }
        if self.pipeline.len(self.tables.acl).unwrap_or(1) > 0 {
            return Some("acl has entries");
        }
        if self.pipeline.len(self.tables.steer).unwrap_or(1) > 0 {
            return Some("kv_steer has entries");
        }
        if self.spec.servers.len() > crate::pool::MAX_SERVERS {
            return Some("too many servers");
        }
        None
    }

    /// What a fast path needs to act for the switch as it stands: see [`Tables`]. Senders that
    /// the switch would no longer accept where they were (a station moved or aged out, a
    /// source binding went) are forgotten.
    pub fn fast_tables(&mut self) -> Tables {
        let ring = self.fast_ring();
        let mut disabled = self.fast_blocker();
        if disabled.is_none() && ring.is_none() {
            disabled = Some("keys are not placed by a ketama ring alone");
        }
        let (hash, ring) = match &*ring {
            Some((hash, points)) => (*hash, points.clone()),
            None => (kv::HashFn::Md5, Arc::default()),
        };
        let live = self.view.live();
        let servers = self
            .spec
            .servers
            .iter()
            .enumerate()
            .map(|(i, s)| FastServer {
                ip: *s.addr.ip(),
                // A Redis server has no UDP port of the VIP's: 0 matches none.
                udp_port: if self.spec.redis { 0 } else { s.addr.port() },
                to: match (live.contains(&i), self.backend_macs[i], self.server_port(i)) {
                    (true, Some(mac), Some(port)) => Some((mac, port)),
                    _ => None,
                },
                in_pool: !self.is_removed(i),
            })
            .collect();
        let mut stations: Vec<(Mac, u16)> = self
            .macs
            .iter()
            .filter(|(_, s)| Some(s.port) != self.local)
            .map(|(m, s)| (*m, s.port))
            .collect();
        stations.sort();
        // Taken out while they are judged, as judging reads the rest of the switch.
        let list = match self.fast_hosts.take() {
            Some(mut hosts) => {
                hosts.retain(|h| self.fast_accepts(h));
                let list = hosts.iter().copied().collect();
                self.fast_hosts = Some(hosts);
                list
            }
            None => Vec::new(),
        };
        let mut own = vec![self.spec.vip.ip];
        own.extend(self.spec.agent_ip);
        own.extend(self.local_ips.iter().copied());
        own.sort();
        own.dedup();
        Tables {
            disabled,
            vip: self.spec.vip.ip,
            vip_mac: self.spec.vip.mac,
            // UDP to a Redis pool's port is the switch's to drop: 0 routes none.
            vip_port: if self.spec.redis {
                0
            } else {
                self.spec.vip.port
            },
            vip_broadcast: self.vip_broadcast,
            l3: self.spec.mode == Mode::L3,
            own,
            cache_only: self.cache.is_some(),
            tcp_splice: self.splice.as_ref().map(|_| splice::FIRST_LEG_PORT),
            keyed_ports: self.spec.keyed_ports.clone(),
            reply_limit: self
                .spec
                .reply_limit
                .as_ref()
                .filter(|_| self.limiter.is_some())
                .map(|l| (l.rate, l.burst)),
            hash,
            ring,
            ring_version: self.view.version(),
            servers,
            stations,
            hosts: list,
        }
    }

    /// The view's ketama points for the fast path, worked out once per pool version (at a
    /// thousand servers they are 160,000).
    fn fast_ring(&mut self) -> Arc<FastRing> {
        let version = self.view.version();
        if let Some((v, ring)) = &self.fast_ring {
            if *v == version {
                return ring.clone();
            }
        }
        let ring = Arc::new(
            self.view
                .ketama_points()
                .map(|(hash, points)| (hash, Arc::from(points))),
        );
        self.fast_ring = Some((version, ring.clone()));
        ring
    }

    /// Whether the switch would send on a frame from `h` without learning anything new: its
    /// station is on its port, and its source passes the source check there.
    fn fast_accepts(&self, h: &Host) -> bool {
        if self.macs.get(&h.mac).map(|s| s.port) != Some(h.port) {
            return false;
        }
        if self.own_address(h.ip) {
            // Only the servers' answers from the VIP in l2 mode come from an address of the
            // switch's own.
            return self.spec.mode == Mode::L2
                && h.ip == self.spec.vip.ip
                && self.backend_macs.contains(&Some(h.mac));
        }
        if let Some(port) = self.server_ip_port(h.ip) {
            return port == h.port;
        }
        match &self.guard {
            Some(guard) if source::is_host_address(h.ip) => guard.accepts(h.port, h.ip),
            _ => true,
        }
    }

    /// Takes in what a fast path did: its senders' stations and source bindings are refreshed
    /// at `now` as if the switch had seen their frames, and its counts are added to the
    /// switch's own. The switch also takes the pool's current view, as at a frame, so that
    /// [`Switch::fast_tables`] after it are of the pool's newest version: a fast path routes
    /// by no other (see [`crate::fastpath::RingWords`]).
    pub fn fast_seen(&mut self, seen: &Seen, now: Instant) {
        self.refresh_pool(now);
        for h in &seen.hosts {
            if !self.fast_accepts(h) {
                continue;
            }
            if let (Some(guard), true) = (&mut self.guard, source::is_host_address(h.ip)) {
                guard.check(h.port, h.ip, now);
            }
            // Accepted above: its station is on its port already.
            let _ = self.learn(h.mac, h.port, now);
        }
        let mut routed = 0;
        for (i, &n) in seen.server_requests.iter().enumerate() {
            if let (Some(b), true) = (self.stats.backends.get(i), n > 0) {
                stats::add(&b.requests, n);
                routed += n;
            }
        }
        for (i, &n) in seen.server_replies.iter().enumerate() {
            if let (Some(b), true) = (self.stats.backends.get(i), n > 0) {
                stats::add(&b.replies, n);
            }
        }
        if seen.cache_hits > 0 {
            stats::add(&self.stats.answers[Answer::Cache as usize], seen.cache_hits);
            stats::add(&self.stats.kv_requests, seen.cache_hits);
            if let Some(cache) = &self.cache {
                cache.service().count_mirror_hits(seen.cache_hits);
            }
        }
        stats::add(
            &self.stats.drops[Drop::ReplyRateLimited as usize],
            seen.reply_limited,
        );
        let keyed = seen.keyed.min(routed);
        stats::add(&self.stats.kv_requests, routed - keyed);
        stats::add(&self.stats.keyed_requests, keyed);
        stats::add(&self.stats.kv_forwarded, routed);
    }
}
