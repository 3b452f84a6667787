//! The memcached proxy: terminates client TCP connections, routes every request by key over a
//! few persistent, pipelined connections per server, and answers as one memcached would.
//!
//! It runs alone on an ordinary socket (`kvswitch proxy`) or as the switch's CPU path, where
//! TCP to the VIP reaches it through the switch's local port.

mod backend;
mod client;
mod combine;
mod memory;
pub mod plan;
pub mod pool;
mod redis;
pub mod sasl;
pub mod stats;
pub use ::tls;
mod worker;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::Context;

use switch::cache::CacheService;
use tokio::sync::watch;

pub use pool::{Pool, PoolSpec, ServerSpec};
pub use stats::{ProxyStats, Secrets};

/// How the proxy runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The pools and their servers' health; the switch shares its pool with its proxy, so
    /// that a server ejected here is left out of the UDP path too.
    pub pools: Vec<Arc<Pool>>,
    /// Worker threads; each accepts clients and keeps its own server connections.
    pub workers: usize,
    /// Source address of the connections to the servers (`None`: the kernel chooses).
    pub source: Option<IpAddr>,
    pub limits: Limits,
    /// Per pool, in order, the cache that answers its hot keys (`None`: no cache). Missing
    /// entries mean no cache.
    pub caches: Vec<Option<Arc<CacheService>>>,
    /// Clients speak TLS on every pool's address (`None`: plain TCP).
    pub tls: Option<Arc<tls::ClientTls>>,
    /// Connections to the servers are made over TLS (`None`: plain TCP).
    pub server_tls: Option<Arc<tls::ServerTls>>,
    /// Connections to the servers authenticate with SASL first (`None`: they do not).
    pub server_sasl: Option<Arc<sasl::Sasl>>,
}

/// Bounds on what clients may hold in the proxy: replies and descriptors.
///
/// A client's *outstanding* reply bytes are the bytes of its replies that arrived from the
/// servers and are not yet written to it: parts held until their batch is confirmed, replies
/// complete and queued. What its forwarded requests will still bring is unknown, so the
/// proxy stops forwarding a client's requests once it holds its budget, and cuts off a client
/// that holds far more than that (its replies' later bytes are then thrown away as they
/// arrive, never held).
#[derive(Debug, Clone)]
pub struct Limits {
    /// Requests read from one client and not yet answered; reading stops past it. This bounds
    /// both the replies one client can have in flight and how long another client's request
    /// can wait behind them on a shared server connection.
    pub client_pending: usize,
    /// Outstanding reply bytes of one client past which its reading stops.
    pub client_reply_bytes: usize,
    /// Outstanding reply bytes one client may hold at most (replies to requests forwarded
    /// before reading stopped keep coming); a client past it is cut off.
    pub client_reply_max: usize,
    /// Outstanding reply bytes of every client of the process together. Past it no client's
    /// requests are read (backpressure), and a client holding more than `client_reply_bytes`
    /// whose replies keep arriving is cut off.
    pub reply_budget: usize,
    /// Client connections open at once, over every pool and worker; a connection past it is
    /// accepted and closed at once. `None`: [`default_client_connections`], from the
    /// descriptor limit.
    pub client_connections: Option<usize>,
    /// Per pool, in order, the client connections it may hold at once (nutcracker's
    /// `client_connections`); missing or `None`: only the process-wide cap.
    pub pool_client_connections: Vec<Option<usize>>,
}

/// The default of [`Limits::reply_budget`].
pub const DEFAULT_REPLY_BUDGET: usize = 256 << 20;

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            client_pending: 128,
            client_reply_bytes: 4 << 20,
            client_reply_max: 32 << 20,
            reply_budget: DEFAULT_REPLY_BUDGET,
            client_connections: None,
            pool_client_connections: Vec::new(),
        }
    }
}

/// Descriptors kept back from clients besides the server connections: listeners, the API
/// and its connections, the runtime's own (epoll, eventfds), logs and configuration reads.
const RESERVED_DESCRIPTORS: u64 = 64;

/// The client connections a proxy may hold when none is configured: the soft descriptor limit
/// (`RLIMIT_NOFILE`) less what the server connections (`server_connections` per server, text
/// and binary, in every worker) and [`RESERVED_DESCRIPTORS`] need, and at least 1.
pub fn default_client_connections(pools: &[PoolSpec], workers: usize) -> usize {
    let servers: u64 = pools
        .iter()
        .map(|spec| (spec.servers.len() * spec.server_connections * 2) as u64)
        .sum();
    let needed = servers * workers as u64 + RESERVED_DESCRIPTORS + 2 * workers as u64;
    descriptor_limit().saturating_sub(needed).max(1) as usize
}

/// The soft `RLIMIT_NOFILE` (a large number where it cannot be read or is unlimited).
pub fn descriptor_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given and nothing else.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
    if !ok || limit.rlim_cur == libc::RLIM_INFINITY {
        return 1 << 20;
    }
    limit.rlim_cur
}

/// The number of workers used when none is configured: one per core.
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A running proxy. Dropping it stops the workers.
pub struct Proxy {
    stats: Arc<ProxyStats>,
    local_addrs: Vec<SocketAddr>,
    stop: watch::Sender<bool>,
    workers: Vec<JoinHandle<()>>,
}

impl Proxy {
    /// Binds every pool's listening address and starts the workers.
    pub fn start(settings: Settings) -> anyhow::Result<Proxy> {
        anyhow::ensure!(!settings.pools.is_empty(), "no pool to serve");
        let workers = settings.workers.max(1);
        // Listeners are made on a throwaway runtime, then handed to the workers as plain
        // sockets: port 0 is resolved by the first bind and the others bind the same port.
        let binder = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()?;
        let mut per_worker: Vec<Vec<std::net::TcpListener>> =
            (0..workers).map(|_| Vec::new()).collect();
        let mut local_addrs = Vec::with_capacity(settings.pools.len());
        for pool in &settings.pools {
            let pool = pool.spec();
            let mut addr = pool.listen;
            for listeners in per_worker.iter_mut() {
                let listener = binder
                    .block_on(async { worker::bind(addr)?.into_std() })
                    .with_context(|| {
                        format!("pool `{}`: cannot listen on {}", pool.name, pool.listen)
                    })?;
                addr = listener.local_addr()?;
                listeners.push(listener);
            }
            local_addrs.push(addr);
        }
        drop(binder);
        memory::large_allocations_own_pages();
        let mut limits = settings.limits.clone();
        let cap = limits.client_connections.unwrap_or_else(|| {
            let specs: Vec<PoolSpec> = settings.pools.iter().map(|p| (*p.spec()).clone()).collect();
            default_client_connections(&specs, workers)
        });
        limits.client_connections = Some(cap);
        let secrets = stats::Secrets {
            tls: settings.tls.clone(),
            server_tls: settings.server_tls.clone(),
            sasl: settings.server_sasl.clone(),
        };
        let stats = Arc::new(ProxyStats::new(&settings.pools, &limits, secrets));
        let (stop, watch) = watch::channel(false);
        let mut handles = Vec::with_capacity(workers);
        for (i, listeners) in per_worker.into_iter().enumerate() {
            let (stats, watch) = (stats.clone(), watch.clone());
            let settings = Settings {
                limits: limits.clone(),
                ..settings.clone()
            };
            let handle = std::thread::Builder::new()
                .name(format!("proxy-{i}"))
                .spawn(move || {
                    if let Err(e) = worker::run(stats, listeners, settings, watch) {
                        tracing::error!("proxy worker {i} failed: {e}");
                    }
                })?;
            handles.push(handle);
        }
        for (pool, addr) in settings.pools.iter().zip(&local_addrs) {
            let pool = pool.spec();
            tracing::info!(
                pool = %pool.name, listen = %addr, servers = pool.servers.len(), workers,
                client_connections = cap, reply_budget = limits.reply_budget, "proxy listening"
            );
        }
        Ok(Proxy {
            stats,
            local_addrs,
            stop,
            workers: handles,
        })
    }

    /// The addresses bound, one per pool (port 0 in a pool's address is resolved here).
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.local_addrs
    }

    pub fn stats(&self) -> Arc<ProxyStats> {
        self.stats.clone()
    }

    /// Stops the workers and waits for them; open connections are closed.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        let _ = self.stop.send(true);
        for handle in self.workers.drain(..) {
            let _ = handle.join();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shutdown();
    }
}
