//! What the proxy serves: pools of memcached servers, each behind one listening address, with
//! nutcracker's failure-handling options.

use std::net::SocketAddr;
use std::time::Duration;

use kv::{Distribution, HashFn};

/// Default per-request timeout. nutcracker waits forever when a pool sets none; kvswitch
/// bounds every request.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(1000);
/// nutcracker's default `server_failure_limit`.
pub const DEFAULT_FAILURE_LIMIT: u32 = 2;
/// nutcracker's default `server_retry_timeout` (30 s).
pub const DEFAULT_RETRY_TIMEOUT: Duration = Duration::from_secs(30);
/// Default connections each proxy worker keeps to each server.
pub const DEFAULT_SERVER_CONNECTIONS: usize = 1;

/// One pool: a listening address and the servers its keys are spread over.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolSpec {
    /// The pool's name (the YAML key in a nutcracker file; "default" otherwise).
    pub name: String,
    /// Where clients connect.
    pub listen: SocketAddr,
    pub distribution: Distribution,
    pub hash: HashFn,
    /// In configuration order.
    pub servers: Vec<ServerSpec>,
    /// How long a request may wait for its reply before it fails.
    pub timeout: Duration,
    /// Take a failing server out of the ring (nutcracker's `auto_eject_hosts`).
    pub auto_eject_hosts: bool,
    /// Consecutive failures after which a server is ejected.
    pub server_failure_limit: u32,
    /// How long an ejected server stays out before it is tried again.
    pub server_retry_timeout: Duration,
    /// Connections each worker keeps to each server.
    pub server_connections: usize,
}

/// One memcached server of a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSpec {
    /// The host as spelled in the configuration: ketama hashes this text.
    pub host: String,
    /// The address connected to.
    pub addr: SocketAddr,
    pub weight: u32,
    pub name: Option<String>,
}

impl ServerSpec {
    /// The server's identity on the hash ring, as nutcracker derives it.
    pub fn ring_name(&self) -> String {
        kv::ketama_name(&self.host, self.addr.port(), self.name.as_deref())
    }

    /// A short label for metrics and logs.
    pub fn label(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| format!("{}:{}", self.host, self.addr.port()))
    }
}

impl PoolSpec {
    /// A pool with nutcracker's defaults for everything but the servers.
    pub fn new(
        name: &str,
        listen: SocketAddr,
        distribution: Distribution,
        hash: HashFn,
        servers: Vec<ServerSpec>,
    ) -> PoolSpec {
        PoolSpec {
            name: name.to_owned(),
            listen,
            distribution,
            hash,
            servers,
            timeout: DEFAULT_TIMEOUT,
            auto_eject_hosts: false,
            server_failure_limit: DEFAULT_FAILURE_LIMIT,
            server_retry_timeout: DEFAULT_RETRY_TIMEOUT,
            server_connections: DEFAULT_SERVER_CONNECTIONS,
        }
    }
}
