//! What a fast path in front of the switch (kvswitch's XDP program) may do on the switch's
//! behalf, as plain data: the switch says what it knows ([`Tables`]), the fast path routes and
//! switches only what those tables decide exactly as the switch would, and hands back what it
//! saw ([`Seen`]) so learning, ageing and counters stay the switch's. Nothing here does I/O.

use std::net::Ipv4Addr;
use std::sync::Arc;

use kv::HashFn;
use wire::ethernet::Mac;

/// Everything a fast path needs to handle a frame as the switch would, or `disabled` with the
/// reason it must hand every frame to the switch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tables {
    /// Why the fast path must pass every frame up; `None` while it may act.
    pub disabled: Option<&'static str>,
    pub vip: Ipv4Addr,
    pub vip_mac: Mac,
    /// memcached's UDP port on the VIP; 0 for a Redis pool, whose port speaks TCP only.
    pub vip_port: u16,
    /// The VIP network's broadcast address, when it has one.
    pub vip_broadcast: Option<Ipv4Addr>,
    /// `l3` mode: requests get the server's address, replies the VIP's.
    pub l3: bool,
    /// The switch's own addresses (VIP, agent address, the local port's host end).
    pub own: Vec<Ipv4Addr>,
    /// The per-client reply limit (bytes a second, the most at once), when it is on.
    pub reply_limit: Option<(u64, u64)>,
    /// The cache is on: the fast path answers reads its copy of the cache holds
    /// ([`crate::cache::CacheMirror`]) and hands everything else to the switch.
    pub cache_only: bool,
    /// The switch splices TCP to the VIP: a TCP segment from a server's address (from the VIP
    /// in `l2` mode) to this port or above goes to it, to be rewritten for its client.
    pub tcp_splice: Option<u16>,
    /// The VIP's keyed ports: datagrams to them are routed by their key-location header.
    pub keyed_ports: Vec<u16>,
    /// The key hash and the ketama continuum: (point, server's position in the pool), the
    /// same allocation for as long as the pool's version stands.
    pub hash: HashFn,
    pub ring: Arc<[(u32, usize)]>,
    /// The pool's version the ring is of: a fast path rewrites its ring only when it moves.
    pub ring_version: u64,
    /// Per server (by position in the pool): where a routed request goes, `None` while the
    /// switch would not send it straight there (MAC or port unknown, or out of the ring).
    pub servers: Vec<FastServer>,
    /// Learned stations: unicast MAC and port (not the local port).
    pub stations: Vec<(Mac, u16)>,
    /// Senders whose frames the switch has sent on and would again: MAC, IPv4 source, port.
    pub hosts: Vec<Host>,
}

/// One server as the fast path sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FastServer {
    pub ip: Ipv4Addr,
    pub udp_port: u16,
    /// Its MAC and the port it is learned on, when a request to it may go straight there.
    pub to: Option<(Mac, u16)>,
    /// Whether it is in the pool: only then are its UDP replies sent on with the VIP as their
    /// source (a server the control plane removed speaks in its own name, as the switch's
    /// `vip_reply` table has it).
    pub in_pool: bool,
}

/// A sender: its MAC and IPv4 source on a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Host {
    pub mac: Mac,
    pub ip: Ipv4Addr,
    pub port: u16,
}

/// What a fast path did since it last reported: hosts it switched frames from (so their
/// stations and source bindings are refreshed as if the switch had seen the frames), and
/// counts to add into the switch's own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    pub hosts: Vec<Host>,
    /// Requests routed and replies switched, per server (by position in the pool).
    pub server_requests: Vec<u64>,
    pub server_replies: Vec<u64>,
    /// Replies dropped because their client's reply bytes ran out.
    pub reply_limited: u64,
    /// Reads answered from the fast path's copy of the cache.
    pub cache_hits: u64,
    /// Of the requests routed, those to a keyed port.
    pub keyed: u64,
}

/// Hosts the switch remembers at most for a fast path; past this, new senders stay on the
/// switch's own path (the XDP program's map holds as many).
pub const MAX_HOSTS: usize = 16_384;

/// The words by which a fast path's program decides whether it may route by its copy of the
/// ring: it routes a read only by a ring of the newest pool version any path may route by.
///
/// The pool's fence ([`crate::pool::VersionFence`]) raises `gate` before the pool publishes a
/// version, so from then on the program hands reads up to the switch, which routes them by the
/// pool's view; the fast path then changes over ([`changeover`]) and routes again. So a read
/// that reaches the program after a write routed by a new view (after the write's
/// acknowledgement, say) is never routed by an older ring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingWords {
    /// The newest pool version any path may route by; it never goes down.
    pub gate: u64,
    /// The copy of the ring in use (of two: one is written while the other is in use).
    pub copy: u8,
    /// The pool version whose ring the copy in use holds, as its stamp says.
    pub version: u64,
}

impl RingWords {
    /// The copy the program routes by, or `None` while it hands reads up.
    pub fn routes_by(&self) -> Option<u8> {
        (self.version == self.gate).then_some(self.copy)
    }

    /// The words after `write`.
    pub fn apply(&mut self, write: RingWrite) {
        match write {
            RingWrite::Gate(v) => self.gate = self.gate.max(v),
            RingWrite::Points(_) => {}
            RingWrite::Select(copy) => self.copy = copy,
            RingWrite::Stamp(v) => self.version = v,
        }
    }
}

/// One write of a change-over to a new ring. Each changes one word, so a frame that reads
/// the words while one is written sees them before it or after it (a torn stamp matches no
/// gate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingWrite {
    /// The gate raised to this version, if it is not there already (the fence raises it
    /// first; a fast path without a fence, as in tests, relies on this one).
    Gate(u64),
    /// The new ring's points written into this copy, the one not in use.
    Points(u8),
    /// The program switched to this copy, still under the old stamp, which the gate has
    /// left behind: reads go up while it changes.
    Select(u8),
    /// The copy in use stamped with its version: reads are routed by it again once it is
    /// the gate's.
    Stamp(u64),
}

/// The writes, in order, that take a fast path whose words are `now` to the ring of pool
/// version `version`: none for a version older than the one it holds (a newer ring is kept).
pub fn changeover(now: &RingWords, version: u64) -> Vec<RingWrite> {
    if version < now.version {
        return Vec::new();
    }
    let copy = 1 - (now.copy & 1);
    vec![
        RingWrite::Gate(version),
        RingWrite::Points(copy),
        RingWrite::Select(copy),
        RingWrite::Stamp(version),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two copies' contents (the pool version each holds a ring of) with the words.
    #[derive(Debug, Clone, Copy)]
    struct Kernel {
        words: RingWords,
        copies: [Option<u64>; 2],
    }

    impl Kernel {
        fn apply(&mut self, write: RingWrite, ring_of: u64) {
            if let RingWrite::Points(copy) = write {
                self.copies[usize::from(copy)] = Some(ring_of);
            }
            self.words.apply(write);
        }

        /// The version of the ring a read is routed by now, if it is routed.
        fn routes(&self) -> Option<u64> {
            let copy = self.words.routes_by()?;
            Some(self.copies[usize::from(copy)].expect("routes by a copy that was written"))
        }
    }

    /// A fast path in step with version 3: copy 0 holds its ring.
    fn settled() -> Kernel {
        Kernel {
            words: RingWords {
                gate: 3,
                copy: 0,
                version: 3,
            },
            copies: [Some(3), Some(2)],
        }
    }

    #[test]
    fn a_change_over_routes_only_by_the_gates_version_at_every_step() {
        // The pool publishes 4 (the fence raises the gate first); the fast path changes over
        // to 4 while, at any step or none, the pool publishes 5.
        for publish_at in 0..=5 {
            let mut k = settled();
            k.apply(RingWrite::Gate(4), 0);
            assert_eq!(k.routes(), None, "hands reads up once the fence is raised");
            let plan = changeover(&k.words, 4);
            assert_eq!(plan.len(), 4);
            for (step, &write) in plan.iter().enumerate() {
                if step == publish_at {
                    k.apply(RingWrite::Gate(5), 0);
                }
                k.apply(write, 4);
                if let Some(v) = k.routes() {
                    assert_eq!(v, k.words.gate, "step {step}: {k:?}");
                }
            }
            match publish_at {
                // 5 came during the change: still handing reads up, until a change to 5.
                0..=3 => {
                    assert_eq!(k.routes(), None, "{k:?}");
                    for write in changeover(&k.words, 5) {
                        k.apply(write, 5);
                        assert!(k.routes().is_none_or(|v| v == 5), "{k:?}");
                    }
                    assert_eq!(k.routes(), Some(5));
                }
                _ => assert_eq!(k.routes(), Some(4), "routes again once stamped"),
            }
        }
    }

    #[test]
    fn the_tables_of_a_switch_behind_the_pool_leave_reads_with_the_switch() {
        // The switch had not seen version 5 when it made the tables: the ring of 4 is written
        // and stamped, but the gate is 5, so nothing is routed by it.
        let mut k = settled();
        k.apply(RingWrite::Gate(5), 0);
        for write in changeover(&k.words, 4) {
            k.apply(write, 4);
            assert_eq!(k.routes(), None, "{k:?}");
        }
        // An older ring than the one held is never written.
        assert!(changeover(&settled().words, 2).is_empty());
    }

    #[test]
    fn a_first_change_over_without_a_fence_routes_by_the_ring_it_wrote() {
        // A fast path just loaded: nothing written, no fence (the gate at 0).
        let mut k = Kernel {
            words: RingWords::default(),
            copies: [None, None],
        };
        for write in changeover(&k.words, 7) {
            k.apply(write, 7);
            assert!(k.routes().is_none_or(|v| v == 7), "{k:?}");
        }
        assert_eq!(k.routes(), Some(7));
        assert_eq!(k.words.copy, 1);
    }
}

/// A spliced leg as its target's segments name it: the target's address and port, and the
/// leg's (the client's address and a leg port).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LegKey {
    pub target: (Ipv4Addr, u16),
    pub leg: (Ipv4Addr, u16),
}

/// What a fast path needs to send a spliced leg's replies on to its client as the switch
/// would: where they come from and go, and how each number maps into the client's
/// connection. It may forward only segments that carry the ACK flag (and PSH) and nothing
/// else, whose acknowledgement lies in `ack_from..=ack_to` and whose bytes are either the
/// next ones (`seq_from` on) and frame whole as replies to single-key retrievals, at most
/// `owed` of them, or bytes it sent before; every other segment goes to the switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LegHandOver {
    pub target_mac: Mac,
    /// The switch port the target is on.
    pub target_port: u16,
    pub client_mac: Mac,
    pub client_port: u16,
    /// The switch port the client is on.
    pub client_at: u16,
    /// The source the client sees: the VIP and its port.
    pub vip: (Ipv4Addr, u16),
    /// The window shift of the target's segments, and the one the client was told.
    pub target_shift: u8,
    pub client_shift: u8,
    /// The target's byte `s` (from `seq_from` on) is the client's `s + seq_off`.
    pub seq_from: u32,
    pub seq_off: u32,
    /// The target's acknowledgement `a` is the client's `a + ack_off`.
    pub ack_from: u32,
    pub ack_to: u32,
    pub ack_off: u32,
    /// Retrieval replies owed, and bytes of the current one's data block still to come.
    pub owed: u32,
    pub data: u32,
    /// The leg's server, by position in the pool.
    pub server: usize,
    /// When the client's segments may go on too: a `get` of one key of this server, whole in
    /// the segment and next in the client's stream, or an acknowledgement that moves the leg
    /// on (within the leg's run of replies).
    pub requests: Option<ClientSide>,
}

/// Where the client's side of a handed-over leg stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientSide {
    /// The client's next byte, its highest acknowledgement and last window.
    pub next_in: u32,
    pub acked: u32,
    pub window: u16,
    /// The highest acknowledgement the target was sent, and the shift it expects on windows.
    pub acked_to: u32,
    pub leg_shift: u8,
}

/// What a fast path did with a leg while it held it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LegSent {
    /// The target's next byte to frame, and the replies framed whole since the hand-over
    /// (with the data block bytes still to come of the current one).
    pub read: u32,
    pub answered: u32,
    pub data: u32,
    /// The highest acknowledgement of the target's it carried.
    pub acked: u32,
    /// The client's acknowledgement and window it last sent, when it sent anything.
    pub last: Option<(u32, u16)>,
    /// The client's side after what it sent on to the target: `gets` sent (each owes a
    /// retrieval reply), and where the client's stream stands.
    pub requests: u32,
    pub client: Option<ClientSide>,
}

/// A fast path that rewrites spliced legs' replies in the switch's place (the XDP program's
/// `fp_legs`). The splice hands it a leg when the leg's replies need no decision of the
/// switch's, and takes it back before it looks at the leg or its flow again.
pub trait LegOffload: Send {
    /// Hands leg `key` over; false when it cannot take it (full), and the switch keeps it.
    fn hand_over(&mut self, key: LegKey, leg: &LegHandOver) -> bool;
    /// Takes leg `key` back: once this returns, the fast path sends none of its segments on.
    /// `None` when it did not hold the leg.
    fn take_back(&mut self, key: LegKey) -> Option<LegSent>;
    /// Forgets leg `key` for good (taking it back first, if needed).
    fn forget(&mut self, key: LegKey);
}
