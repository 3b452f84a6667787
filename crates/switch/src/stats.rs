//! Counters the run loop updates and the API thread reads: per port, per backend, per drop
//! reason. Plain relaxed atomics: a reader may see a counter a few packets behind, never torn.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Why a frame was dropped. Every reason has its own counter (`kvswitch_drops_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Drop {
    /// Shorter than an Ethernet header.
    BadEthernet,
    /// An IPv4 packet to the VIP whose header is malformed.
    BadIpv4,
    /// A UDP datagram to the VIP whose header is malformed.
    BadUdp,
    /// A UDP datagram to the VIP with a wrong checksum.
    BadUdpChecksum,
    /// An IPv4 packet to the VIP carrying IP options (not parsed by the key router).
    Ipv4Options,
    /// A fragment of an IP packet to the VIP (memcached requests fit one datagram).
    IpFragment,
    /// A datagram to the VIP's memcached port without a valid memcached UDP frame header.
    BadFrameHeader,
    /// A request spread over several datagrams (memcached does not accept those either).
    MultiDatagramRequest,
    /// A datagram that ends in the middle of a request.
    IncompleteRequest,
    /// A binary-protocol request memcached would not accept.
    BadBinaryRequest,
    /// A request memcached would close the connection for without a reply (line too long).
    BadRequest,
    /// An invalid request after a valid one in the same datagram.
    PipelinedError,
    /// Several requests in one datagram whose keys live on different servers.
    PipelinedMultiServer,
    /// A command without a key that kvswitch does not answer itself (stats, flush_all, ...).
    KeylessCommand,
    /// The ring chose no server.
    NoBackend,
    /// The chosen server's MAC address is not known yet.
    BackendUnresolved,
    /// Traffic to the VIP that is neither ARP nor memcached.
    VipUnhandled,
    /// A multi-key get could not be split: too many are in flight.
    SplitTableFull,
    /// A multi-key get could not be split: no source address for sub-requests (l2 mode).
    SplitUnavailable,
    /// A part of a split multi-key get did not come back in time.
    SplitTimeout,
    /// A part of a split multi-key get came back malformed.
    SplitBadReply,
    /// A reply to the split agent's port that belongs to no pending request.
    StaleReply,
    /// The pipeline reached no decision.
    NoAction,
    /// A frame whose only destination is the port it came from.
    SamePort,
    /// A port refused a frame on transmit.
    TxFailed,
    /// A datagram at the split agent's port that does not come from the server its request
    /// id was sent to.
    SplitForeignReply,
    /// A new station could not be learned: the MAC table is full.
    MacTableFull,
    /// A write to the VIP while the cache already waits for too many writes' replies: it
    /// cannot be tracked, so it is not forwarded.
    CacheWritesFull,
    /// A request routed by key whose server's port is not known yet (its MAC is not in the
    /// MAC table): never flooded, since it carries a client's data; the switch asks for the
    /// server with ARP.
    RoutePortUnknown,
    /// With `switch.source_check`: a source address seen on another port than the one it is
    /// bound to (learned or configured), or outside the prefixes configured for its port.
    SourceSpoofed,
    /// With `switch.source_check`: a new source address while the address table (or the
    /// port's share of it) is full; it is not accepted, so a flood of made-up addresses
    /// cannot crowd out the check.
    SourceTableFull,
    /// Traffic to the VIP from UDP or TCP source port 0 (nothing can answer it).
    SourcePortZero,
    /// Traffic to the VIP from 0.0.0.0.
    SourceUnspecified,
    /// Traffic to the VIP from a broadcast address (255.255.255.255, or the VIP network's).
    SourceBroadcast,
    /// Traffic to the VIP from a multicast address (224.0.0.0/4).
    SourceMulticast,
    /// Traffic to the VIP from a loopback address (127.0.0.0/8).
    SourceLoopback,
    /// A frame from the switch's own address (the VIP or the agent address) on a port other
    /// than the local port.
    SourceVip,
    /// A UDP reply from a server (or the switch's own answer) to a client that has used up its
    /// reply bytes (`switch.udp_reply_bytes_per_sec`, `switch.udp_reply_burst_bytes`).
    ReplyRateLimited,
    /// An operator's entry (in `acl` or a table of theirs) said drop.
    Operator,
    /// A frame for the control plane (`to_cpu`, `mirror`) while its queue is full.
    CpuQueueFull,
    /// A frame for a port whose egress queue (with a rate) was full.
    EgressQueueFull,
    /// In a replicated pool, a datagram holding a write with other requests: a write goes to
    /// every replica of its key alone.
    ReplicatedPipeline,
    /// In a replicated pool, a binary write that compares a cas unique: each replica has its
    /// own uniques (text and meta ones are answered with an error).
    ReplicatedCas,
    /// A frame to one of SwitchKV's query MACs that is no query: not IPv4 UDP to a server's
    /// address and memcached port (or with a source no host sends from).
    SwitchkvMisaddressed,
    /// A SwitchKV client's query while kvswitch's own cache is on: that cache stays coherent
    /// only by reading every write, and these are never read.
    SwitchkvCacheOn,
    /// An operator's label action found no MPLS label to pop or swap, or popped the bottom one
    /// off a payload that is neither IPv4 nor IPv6.
    Label,
    /// An operator's label push would have made the frame longer than the pipeline allows.
    FrameTooLong,
    /// With `switch.source_check`: a frame whose source MAC is a server's, on another port than
    /// the one the server is bound to (configured, or first resolved on). A server's MAC moves
    /// only when the operator removes the server from the pool and adds it again.
    SourceMacBound,
    /// With `switch.source_check`: a frame whose source MAC is a station's that was heard on
    /// another port within `switch.source_age_s`: a host's MAC does not move while in use.
    SourceMacMoved,
    /// Traffic to the VIP from an address outside the networks clients may use
    /// (`switch.client_networks`, by default the VIP's network): the server's answer would go
    /// nowhere (memcached stops answering UDP after a reply it cannot send).
    SourceOffNet,
    /// An operator's `impair` action dropped it (its `drop_ppm`), or held frames were already
    /// at the limit when it asked for a delay.
    Impaired,
    /// A TCP segment to the VIP's memcached port, or from a spliced connection's server, with a
    /// wrong checksum.
    BadTcpChecksum,
    /// A TCP segment the splice has no use for: a SYN with other flags, a SYN-ACK that answers
    /// no SYN of the switch's.
    TcpUnexpected,
    /// A TCP segment to the VIP's memcached port that belongs to no connection and carries no
    /// valid SYN cookie (the client is reset).
    TcpBadCookie,
    /// A connection the splice could not take: it holds `switch.tcp_max_flows` already, or a
    /// quarter of them for the client's address (the client is reset).
    TcpFlowsFull,
    /// A segment to the VIP's memcached port in a spliced connection's name from another port
    /// or MAC than its client's; or one from a leg's target after the switch let the leg go
    /// (or no longer knows it), which is answered with a reset.
    TcpStale,
    /// A spliced connection's segment past a gap in its sender's byte stream: the splice reads
    /// both streams in order, and the sender sends it again.
    TcpOutOfOrder,
    /// Client bytes waiting for their server's connection had no room (64 kB): the client sends
    /// them again.
    TcpHeldFull,
    /// A spliced connection's request that waited 10 s for its server's connection (the
    /// active one's replies, or its own handshake): the connection is reset.
    TcpHoldTimeout,
    /// A spliced connection's server refused it, did not answer, or closed or reset it with
    /// replies owed, or no connection to it could be made (no leg port left for the client's
    /// address). The client is reset when replies were owed or nothing could be made;
    /// otherwise the proxy serves that server's requests.
    TcpNoTarget,
    /// A spliced connection's server sent bytes that did not read as the replies it owed: the
    /// connection is reset.
    TcpRepliesLost,
    /// A datagram to a keyed port of the VIP (`vip.keyed_ports`) whose key-location header
    /// is missing or wrong: no preamble, offsets out of range, an empty key or one past 250
    /// bytes. It is never forwarded.
    BadKeyHeader,
    /// An operator's `strip_udp_payload` found no UDP payload that long.
    UdpStrip,
    /// A UDP datagram to the VIP's port of a Redis pool, which speaks TCP only.
    UdpToRedis,
}

impl Drop {
    pub const ALL: [Drop; 64] = [
        Drop::BadEthernet,
        Drop::BadIpv4,
        Drop::BadUdp,
        Drop::BadUdpChecksum,
        Drop::Ipv4Options,
        Drop::IpFragment,
        Drop::BadFrameHeader,
        Drop::MultiDatagramRequest,
        Drop::IncompleteRequest,
        Drop::BadBinaryRequest,
        Drop::BadRequest,
        Drop::PipelinedError,
        Drop::PipelinedMultiServer,
        Drop::KeylessCommand,
        Drop::NoBackend,
        Drop::BackendUnresolved,
        Drop::VipUnhandled,
        Drop::SplitTableFull,
        Drop::SplitUnavailable,
        Drop::SplitTimeout,
        Drop::SplitBadReply,
        Drop::StaleReply,
        Drop::NoAction,
        Drop::SamePort,
        Drop::TxFailed,
        Drop::SplitForeignReply,
        Drop::MacTableFull,
        Drop::CacheWritesFull,
        Drop::RoutePortUnknown,
        Drop::SourceSpoofed,
        Drop::SourceTableFull,
        Drop::SourcePortZero,
        Drop::SourceUnspecified,
        Drop::SourceBroadcast,
        Drop::SourceMulticast,
        Drop::SourceLoopback,
        Drop::SourceVip,
        Drop::ReplyRateLimited,
        Drop::Operator,
        Drop::CpuQueueFull,
        Drop::EgressQueueFull,
        Drop::ReplicatedPipeline,
        Drop::ReplicatedCas,
        Drop::SwitchkvMisaddressed,
        Drop::SwitchkvCacheOn,
        Drop::Label,
        Drop::FrameTooLong,
        Drop::SourceMacBound,
        Drop::SourceMacMoved,
        Drop::SourceOffNet,
        Drop::Impaired,
        Drop::BadTcpChecksum,
        Drop::TcpUnexpected,
        Drop::TcpBadCookie,
        Drop::TcpFlowsFull,
        Drop::TcpStale,
        Drop::TcpOutOfOrder,
        Drop::TcpHeldFull,
        Drop::TcpHoldTimeout,
        Drop::TcpNoTarget,
        Drop::TcpRepliesLost,
        Drop::BadKeyHeader,
        Drop::UdpStrip,
        Drop::UdpToRedis,
    ];

    /// The label used in metrics.
    pub fn name(self) -> &'static str {
        match self {
            Drop::BadEthernet => "bad_ethernet",
            Drop::BadIpv4 => "bad_ipv4",
            Drop::BadUdp => "bad_udp",
            Drop::BadUdpChecksum => "bad_udp_checksum",
            Drop::Ipv4Options => "ipv4_options",
            Drop::IpFragment => "ip_fragment",
            Drop::BadFrameHeader => "bad_frame_header",
            Drop::MultiDatagramRequest => "multi_datagram_request",
            Drop::IncompleteRequest => "incomplete_request",
            Drop::BadBinaryRequest => "bad_binary_request",
            Drop::BadRequest => "bad_request",
            Drop::PipelinedError => "pipelined_error",
            Drop::PipelinedMultiServer => "pipelined_multi_server",
            Drop::KeylessCommand => "keyless_command",
            Drop::NoBackend => "no_backend",
            Drop::BackendUnresolved => "backend_unresolved",
            Drop::VipUnhandled => "vip_unhandled",
            Drop::SplitTableFull => "split_table_full",
            Drop::SplitUnavailable => "split_unavailable",
            Drop::SplitTimeout => "split_timeout",
            Drop::SplitBadReply => "split_bad_reply",
            Drop::StaleReply => "stale_reply",
            Drop::NoAction => "no_action",
            Drop::SamePort => "same_port",
            Drop::TxFailed => "tx_failed",
            Drop::SplitForeignReply => "split_foreign_reply",
            Drop::MacTableFull => "mac_table_full",
            Drop::CacheWritesFull => "cache_writes_full",
            Drop::RoutePortUnknown => "route_port_unknown",
            Drop::SourceSpoofed => "source_spoofed",
            Drop::SourceTableFull => "source_table_full",
            Drop::SourcePortZero => "source_port_zero",
            Drop::SourceUnspecified => "source_unspecified",
            Drop::SourceBroadcast => "source_broadcast",
            Drop::SourceMulticast => "source_multicast",
            Drop::SourceLoopback => "source_loopback",
            Drop::SourceVip => "source_vip",
            Drop::ReplyRateLimited => "reply_rate_limited",
            Drop::Operator => "operator",
            Drop::CpuQueueFull => "cpu_queue_full",
            Drop::EgressQueueFull => "egress_queue_full",
            Drop::ReplicatedPipeline => "replicated_pipeline",
            Drop::ReplicatedCas => "replicated_cas",
            Drop::SwitchkvMisaddressed => "switchkv_misaddressed",
            Drop::SwitchkvCacheOn => "switchkv_cache_on",
            Drop::Label => "label",
            Drop::FrameTooLong => "frame_too_long",
            Drop::SourceMacBound => "source_mac_bound",
            Drop::SourceMacMoved => "source_mac_moved",
            Drop::SourceOffNet => "source_off_net",
            Drop::Impaired => "impaired",
            Drop::BadTcpChecksum => "bad_tcp_checksum",
            Drop::TcpUnexpected => "tcp_unexpected",
            Drop::TcpBadCookie => "tcp_bad_cookie",
            Drop::TcpFlowsFull => "tcp_flows_full",
            Drop::TcpStale => "tcp_stale",
            Drop::TcpOutOfOrder => "tcp_out_of_order",
            Drop::TcpHeldFull => "tcp_held_full",
            Drop::TcpHoldTimeout => "tcp_hold_timeout",
            Drop::TcpNoTarget => "tcp_no_target",
            Drop::TcpRepliesLost => "tcp_replies_lost",
            Drop::BadKeyHeader => "bad_key_header",
            Drop::UdpStrip => "udp_strip",
            Drop::UdpToRedis => "udp_to_redis",
        }
    }

    /// Pipeline reason codes for the switch's own drops start here (below are the pipeline's).
    pub const CODE_BASE: u16 = 256;

    pub fn code(self) -> u16 {
        Self::CODE_BASE + self as u16
    }

    pub fn from_code(code: u16) -> Option<Drop> {
        let i = code.checked_sub(Self::CODE_BASE)? as usize;
        Self::ALL.get(i).copied()
    }
}

/// Why kvswitch answered a request itself, with memcached's own reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// `ERROR`: memcached does not know the command.
    UnknownCommand,
    /// `CLIENT_ERROR ...`: the request is malformed (bad format, key too long, bad key).
    ClientError,
    /// `mn` / `version`, answered without a server.
    Local,
    /// A multi-key get split across servers, merged and answered.
    MergedGet,
    /// A read answered from the cache.
    Cache,
    /// A write sent to every replica of its key, answered once all had.
    ReplicatedWrite,
}

impl Answer {
    pub const ALL: [Answer; 6] = [
        Answer::UnknownCommand,
        Answer::ClientError,
        Answer::Local,
        Answer::MergedGet,
        Answer::Cache,
        Answer::ReplicatedWrite,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Answer::UnknownCommand => "unknown_command",
            Answer::ClientError => "client_error",
            Answer::Local => "local",
            Answer::MergedGet => "merged_get",
            Answer::Cache => "cache",
            Answer::ReplicatedWrite => "replicated_write",
        }
    }
}

#[derive(Default)]
pub struct PortCounters {
    pub rx_packets: AtomicU64,
    pub rx_bytes: AtomicU64,
    pub tx_packets: AtomicU64,
    pub tx_bytes: AtomicU64,
    /// Frames the port refused on transmit, or its egress queue had no room for.
    pub tx_dropped: AtomicU64,
    /// Bytes and frames waiting in the port's egress queue (when it has a rate).
    pub queue_bytes: AtomicU64,
    pub queue_packets: AtomicU64,
}

impl PortCounters {
    /// A figure the port shows as a read-only register `port<N>.<figure>`, by name.
    pub fn figure(&self, name: &str) -> Option<u64> {
        let c = match name {
            "rx_packets" => &self.rx_packets,
            "rx_bytes" => &self.rx_bytes,
            "tx_packets" => &self.tx_packets,
            "tx_bytes" => &self.tx_bytes,
            "tx_dropped" => &self.tx_dropped,
            "queue_bytes" => &self.queue_bytes,
            "queue_packets" => &self.queue_packets,
            _ => return None,
        };
        Some(get(c))
    }
}

#[derive(Default)]
pub struct BackendCounters {
    /// Requests routed to this server (a split multi-key get counts once per part).
    pub requests: AtomicU64,
    /// Replies from this server that crossed the switch.
    pub replies: AtomicU64,
}

/// All counters of one running switch.
pub struct Stats {
    pub ports: Vec<PortCounters>,
    pub backends: Vec<BackendCounters>,
    pub drops: [AtomicU64; Drop::ALL.len()],
    pub answers: [AtomicU64; Answer::ALL.len()],
    /// memcached requests to the VIP seen (valid or not).
    pub kv_requests: AtomicU64,
    /// Datagrams to the VIP's keyed ports seen (valid header or not).
    pub keyed_requests: AtomicU64,
    /// Queries a SwitchKV client encoded (key hash in the destination MAC, backend in the
    /// destination IP): reads, and everything else.
    pub switchkv_gets: AtomicU64,
    pub switchkv_others: AtomicU64,
    /// Requests forwarded to exactly one server unchanged.
    pub kv_forwarded: AtomicU64,
    /// Multi-key gets split across servers.
    pub kv_split: AtomicU64,
    /// Writes sent to every replica of their key (a replicated pool).
    pub kv_replicated: AtomicU64,
    /// Routed requests held until their server's port was known (right after start).
    pub route_held: AtomicU64,
    pub arp_replies: AtomicU64,
    pub arp_requests_sent: AtomicU64,
    pub flooded: AtomicU64,
    /// Frames a `multicast` action copied to a group's members ...
    pub multicast: AtomicU64,
    /// ... and the copies sent.
    pub multicast_copies: AtomicU64,
    pub switched: AtomicU64,
    pub mac_learned: AtomicU64,
    pub splits_in_flight: AtomicU64,
    /// Frames an `impair` action holds back now.
    pub impaired_held: AtomicU64,
    /// Frames an `impair` action sent twice.
    pub impaired_duplicated: AtomicU64,
    /// The TCP splice: SYNs answered with a cookie; connections whose first request went to a
    /// server (spliced), or to the host's stack (proxied); spliced connections later handed
    /// over to the host's stack; requests it sent to a server; connections it holds now.
    pub tcp_syn_cookies: AtomicU64,
    pub tcp_spliced: AtomicU64,
    pub tcp_proxied: AtomicU64,
    pub tcp_handed_over: AtomicU64,
    /// Spliced connections' legs to a server opened after their first.
    pub tcp_legs: AtomicU64,
    pub tcp_requests: AtomicU64,
    pub tcp_flows: AtomicU64,
    /// Keepalive probes sent to clients silent for `switch.tcp_idle_s`, and their connections
    /// reset because they answered none.
    pub tcp_keepalive_probes: AtomicU64,
    pub tcp_idle_resets: AtomicU64,
}

impl Stats {
    pub fn new(ports: usize, backends: usize) -> Stats {
        Stats {
            ports: (0..ports).map(|_| PortCounters::default()).collect(),
            // Room for servers added at run time.
            backends: (0..backends.max(crate::pool::MAX_SERVERS))
                .map(|_| BackendCounters::default())
                .collect(),
            drops: std::array::from_fn(|_| AtomicU64::new(0)),
            answers: std::array::from_fn(|_| AtomicU64::new(0)),
            kv_requests: AtomicU64::new(0),
            keyed_requests: AtomicU64::new(0),
            switchkv_gets: AtomicU64::new(0),
            switchkv_others: AtomicU64::new(0),
            kv_forwarded: AtomicU64::new(0),
            kv_split: AtomicU64::new(0),
            kv_replicated: AtomicU64::new(0),
            route_held: AtomicU64::new(0),
            arp_replies: AtomicU64::new(0),
            arp_requests_sent: AtomicU64::new(0),
            flooded: AtomicU64::new(0),
            multicast: AtomicU64::new(0),
            multicast_copies: AtomicU64::new(0),
            switched: AtomicU64::new(0),
            mac_learned: AtomicU64::new(0),
            splits_in_flight: AtomicU64::new(0),
            impaired_held: AtomicU64::new(0),
            impaired_duplicated: AtomicU64::new(0),
            tcp_syn_cookies: AtomicU64::new(0),
            tcp_spliced: AtomicU64::new(0),
            tcp_proxied: AtomicU64::new(0),
            tcp_handed_over: AtomicU64::new(0),
            tcp_legs: AtomicU64::new(0),
            tcp_requests: AtomicU64::new(0),
            tcp_flows: AtomicU64::new(0),
            tcp_keepalive_probes: AtomicU64::new(0),
            tcp_idle_resets: AtomicU64::new(0),
        }
    }

    pub fn count_drop(&self, reason: Drop) {
        self.drops[reason as usize].fetch_add(1, Relaxed);
    }

    pub fn answer(&self, kind: Answer) {
        self.answers[kind as usize].fetch_add(1, Relaxed);
    }

    pub fn backend_request(&self, i: usize) {
        if let Some(b) = self.backends.get(i) {
            b.requests.fetch_add(1, Relaxed);
        }
    }
}

pub fn get(c: &AtomicU64) -> u64 {
    c.load(Relaxed)
}

pub fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Relaxed);
}

pub fn inc(c: &AtomicU64) {
    c.fetch_add(1, Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_codes_round_trip_and_names_are_unique() {
        let mut names = std::collections::HashSet::new();
        for (i, d) in Drop::ALL.iter().enumerate() {
            assert_eq!(*d as usize, i, "ALL must be in declaration order");
            assert_eq!(Drop::from_code(d.code()), Some(*d));
            assert!(names.insert(d.name()));
        }
        assert_eq!(Drop::from_code(3), None);
        assert_eq!(Drop::from_code(Drop::CODE_BASE + 500), None);
    }
}
