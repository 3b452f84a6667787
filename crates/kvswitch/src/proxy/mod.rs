//! The memcached proxy: terminates client TCP connections, routes every request by key over a
//! few persistent, pipelined connections per server, and answers as one memcached would.
//!
//! It runs alone on an ordinary socket (`kvswitch proxy`) or as the switch's CPU path, where
//! TCP to the VIP reaches it through the switch's local port.

pub mod pool;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

pub use pool::{PoolSpec, ServerSpec};

/// How the proxy runs.
#[derive(Debug, Clone)]
pub struct Settings {
    pub pools: Vec<PoolSpec>,
    /// Worker threads; each accepts clients and keeps its own server connections.
    pub workers: usize,
    /// Source address of the connections to the servers (`None`: the kernel chooses).
    pub source: Option<IpAddr>,
    pub limits: Limits,
}

/// Bounds on what one client connection may hold in the proxy.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Requests read from one client and not yet answered; reading stops past it.
    pub client_pending: usize,
    /// Reply bytes waiting to be written to one client; reading stops past it.
    pub client_reply_bytes: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            client_pending: 1024,
            client_reply_bytes: 4 << 20,
        }
    }
}

/// A running proxy.
pub struct Proxy {
    stats: Arc<ProxyStats>,
    local_addrs: Vec<SocketAddr>,
}

/// Counters and health of every pool and server, shared with the control API.
pub struct ProxyStats {}

impl Proxy {
    /// Binds every pool's listening address and starts the workers.
    pub fn start(settings: Settings) -> anyhow::Result<Proxy> {
        let _ = settings;
        anyhow::bail!("not yet")
    }

    /// The addresses bound, one per pool (port 0 in a pool's address is resolved here).
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.local_addrs
    }

    pub fn stats(&self) -> Arc<ProxyStats> {
        self.stats.clone()
    }
}
