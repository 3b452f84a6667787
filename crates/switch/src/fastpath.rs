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
}

/// Hosts the switch remembers at most for a fast path; past this, new senders stay on the
/// switch's own path (the XDP program's map holds as many).
pub const MAX_HOSTS: usize = 16_384;
