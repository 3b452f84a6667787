//! What a switch is built from: a plain description of its ports, its VIP, its servers and its
//! limits. The daemon's configuration file becomes one of these; a test, a benchmark, a fuzz
//! target or a simulator writes one in a few lines.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use kv::{Distribution, HashFn};
use wire::ethernet::Mac;

use crate::pool::{PoolSpec, ServerSpec};
use crate::source::Prefix;

/// Whether servers see the client's request addressed to themselves (`L3`: the switch rewrites
/// the destination IP, and the source of their replies back to the VIP) or to the VIP, which
/// they own on loopback (`L2`: only MACs are rewritten).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    L2,
    L3,
}

/// The switch's memcached address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vip {
    pub ip: Ipv4Addr,
    /// Length of the VIP's network (where the clients and servers are).
    pub prefix_len: u8,
    pub mac: Mac,
    /// memcached's port on the VIP.
    pub port: u16,
}

/// One server of the pool, as the UDP path reaches it. Servers are numbered as the pool lists
/// them; the pool ([`crate::pool::Pool`]) places keys on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Server {
    pub addr: SocketAddrV4,
    /// Known MAC; `None`: the switch asks for it with ARP.
    pub mac: Option<Mac>,
}

/// The local port: the switch's way into the host's own network stack, where the proxy runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Local {
    /// Its port number (after the other ports).
    pub port: u16,
    /// The addresses of the host's end: the proxy's source address first, then the VIP if it
    /// differs.
    pub addrs: Vec<Ipv4Addr>,
    /// Where the proxy's connections to the servers come from.
    pub source: Ipv4Addr,
}

/// The source-address check of the ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceCheck {
    /// A learned address not seen for this long may appear on another port.
    pub age: Duration,
    /// Most addresses learned (each port gets an equal share).
    pub table_size: usize,
    /// Per port, the prefixes it alone may send from; a port with none learns its addresses.
    pub prefixes: Vec<Vec<Prefix>>,
}

/// The reply limit per client address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyLimit {
    /// Bytes a second.
    pub rate: u64,
    /// The most bytes at once.
    pub burst: u64,
}

/// Everything a switch is built from.
#[derive(Debug, Clone, PartialEq)]
pub struct SwitchSpec {
    /// Ports, numbered from 0, the local port included.
    pub ports: usize,
    pub local: Option<Local>,
    pub mode: Mode,
    pub vip: Vip,
    /// Source address of the sub-requests of split gets (and of the switch's ARP requests).
    pub agent_ip: Option<Ipv4Addr>,
    /// UDP port the sub-requests are sent from.
    pub agent_port: u16,
    /// In the pool's order.
    pub servers: Vec<Server>,
    /// How long a split get waits for all its parts.
    pub split_timeout: Duration,
    /// Most stations the MAC table holds.
    pub mac_table_size: usize,
    /// A station not heard from for this long is forgotten.
    pub mac_age: Duration,
    /// `None`: sources are not checked, and stations move to whichever port last sent from
    /// their MAC.
    pub source_check: Option<SourceCheck>,
    /// The networks requests to the VIP may come from; empty: the VIP's own network
    /// (`vip.prefix_len`). A request from elsewhere is dropped (`source_off_net`): its answer
    /// would leave the server by a route nobody chose, or by none.
    pub client_networks: Vec<Prefix>,
    /// `None`: replies are not limited.
    pub reply_limit: Option<ReplyLimit>,
    /// Whether the pipeline gets the cache's table (attach the cache with
    /// [`crate::Switch::set_cache`]).
    pub cache: bool,
    /// `Some`: TCP to the VIP's memcached port is spliced by the switch (it needs a local port,
    /// where the connections it hands over go); `None`: it all goes to the local port.
    pub tcp_splice: Option<TcpSplice>,
    /// UDP ports of the VIP whose datagrams carry the key-location header ([`wire::keyloc`]): each
    /// is routed by its key, with the pool's hash and ring, to its server at the same port,
    /// the header removed on the way; replies from those ports are the VIP's, as memcached's.
    pub keyed_ports: Vec<u16>,
    /// The pool is a Redis pool: the VIP's port speaks RESP over TCP, spliced command by
    /// command; UDP to it is dropped (`udp_to_redis`). Must match the pool's kind.
    pub redis: bool,
    /// Every choice the switch makes that must not be guessable (the first id of split
    /// sub-requests) comes from this. The same seed, frames and instants give the same run.
    pub seed: u64,
}

/// The TCP splice's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpSplice {
    /// Most connections spliced at once; a client past them is reset.
    pub max_flows: usize,
    /// How long a connection may go without a segment from its client before the switch asks
    /// whether the client is still there (keepalive probes); one that does not answer them
    /// is reset on both sides and forgotten.
    pub idle: std::time::Duration,
}

impl TcpSplice {
    /// `max_flows` connections, probed after `DEFAULT_IDLE` without a client segment.
    pub fn new(max_flows: usize) -> TcpSplice {
        TcpSplice {
            max_flows,
            idle: TcpSplice::DEFAULT_IDLE,
        }
    }

    /// The default of `idle` (`switch.tcp_idle_s`): five minutes.
    pub const DEFAULT_IDLE: std::time::Duration = std::time::Duration::from_secs(300);
}

impl SwitchSpec {
    /// A switch of `ports` ports in front of `servers`, with the VIP `vip` (MAC
    /// 02:00:00:00:00:64, memcached's port, a /24), `l3` mode, the VIP as agent address, no
    /// local port and the defaults of the daemon's configuration for the rest (split timeout
    /// 1 s, 8192 stations aged after 300 s, no source check, 125 MB/s of replies per client
    /// with bursts of 16 MiB, no cache, seed 0).
    pub fn new(ports: usize, vip: Ipv4Addr, servers: Vec<Server>) -> SwitchSpec {
        SwitchSpec {
            ports,
            local: None,
            mode: Mode::L3,
            vip: Vip {
                ip: vip,
                prefix_len: 24,
                mac: Mac([2, 0, 0, 0, 0, 0x64]),
                port: 11211,
            },
            agent_ip: Some(vip),
            agent_port: 11311,
            servers,
            split_timeout: Duration::from_secs(1),
            mac_table_size: 8192,
            mac_age: Duration::from_secs(300),
            source_check: None,
            client_networks: Vec::new(),
            reply_limit: Some(ReplyLimit {
                rate: 125_000_000,
                burst: 16 << 20,
            }),
            cache: false,
            tcp_splice: None,
            keyed_ports: Vec::new(),
            redis: false,
            seed: 0,
        }
    }

    /// The pool of this switch's servers, in its order, as the proxy serves it on the VIP (a
    /// Redis pool when the switch speaks Redis): each server's ring name is its address (name them in the result to place keys as a
    /// nutcracker pool with names does).
    pub fn pool_spec(&self, distribution: Distribution, hash: HashFn) -> PoolSpec {
        let servers = self
            .servers
            .iter()
            .map(|s| ServerSpec {
                host: s.addr.ip().to_string(),
                addr: s.addr.into(),
                weight: 1,
                name: None,
            })
            .collect();
        let listen = std::net::SocketAddr::from((self.vip.ip, self.vip.port));
        let mut pool = PoolSpec::new("default", listen, distribution, hash, servers);
        if self.redis {
            pool.redis = Some(crate::pool::RedisSpec::default());
        }
        pool
    }

    /// The VIP, the agent address, or an address of the host's end of the local port.
    pub fn own_address(&self, ip: Ipv4Addr) -> bool {
        ip == self.vip.ip
            || Some(ip) == self.agent_ip
            || self.local.as_ref().is_some_and(|l| l.addrs.contains(&ip))
    }
}

/// What makes a spec unusable. A wrapped error is part of the message, not a `source()`, so
/// a chain printed with `{:#}` names it once.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("the local port needs port number {needed}, but the switch has {ports} ports")]
    LocalPort { needed: u16, ports: usize },
    #[error("the switch has {servers} servers but its pool {pool}")]
    PoolMismatch { servers: usize, pool: usize },
    #[error("the switch speaks {switch} on the VIP's port but its pool is a {pool} pool")]
    PoolKind {
        switch: &'static str,
        pool: &'static str,
    },
    #[error("the pipeline refused the switch's tables: {0}")]
    Pipeline(pipeline::Error),
    #[error("the cache is off in the spec; turn it on to attach one")]
    CacheOff,
    #[error("the pool's ring: {0}")]
    Ring(kv::RouteError),
}

impl From<pipeline::Error> for SpecError {
    fn from(e: pipeline::Error) -> SpecError {
        SpecError::Pipeline(e)
    }
}

impl From<kv::RouteError> for SpecError {
    fn from(e: kv::RouteError) -> SpecError {
        SpecError::Ring(e)
    }
}

/// SplitMix64: the switch's generator for the few values it draws from its seed.
pub(crate) fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
