//! `kvswitch node`: a memcached-protocol server with an in-memory store and an optional
//! capacity limit in requests per second, the emulated backend of kvswitch benchmarks (SwitchKV
//! emulated its 100 KQPS backends the same way).
//!
//! Requests are read with the `wire` parser, so the node reads a request exactly as the switch
//! does, and answered byte for byte as memcached 1.6 answers them. Over capacity, TCP requests
//! wait for a token and UDP requests are dropped; both are counted (`capacity_delays`,
//! `capacity_drops` in `stats`).
//!
//! Threads: one per TCP connection, `--threads` UDP workers sharing the UDP socket, one
//! acceptor. A UDP reply is one message (split into datagrams of at most 1400 bytes with
//! sequence numbers), a multi-key get included: its `VALUE` blocks and `END` travel together.
#![forbid(unsafe_code)]

pub mod auth;
mod bucket;
pub mod home;
mod host;
mod relay;
pub mod steer;
pub mod switchkv;
mod tcp;
mod udp;

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use anyhow::{bail, Context};

pub use bucket::Bucket;
pub use host::SystemHost;
/// One request at a time, from the pure `store` crate the simulator runs too.
pub use store::session;
/// The version the node reports to `version` and in `stats`.
pub use store::VERSION;
pub use store::{Counters, Hooks, Store};
pub use tcp::MAX_CONNECTIONS;

/// Command-line arguments of `kvswitch node`.
#[derive(Debug, Clone, clap::Args)]
pub struct NodeArgs {
    /// Address to serve on, TCP and UDP alike. With port 0 the UDP socket takes the port the
    /// TCP listener was given.
    #[arg(long, default_value = "127.0.0.1:11211")]
    pub listen: SocketAddr,
    /// Serve UDP, with memcached's 8-byte frame header (the default).
    #[arg(long, overrides_with = "no_udp")]
    pub udp: bool,
    /// Do not serve UDP.
    #[arg(long)]
    pub no_udp: bool,
    /// Do not serve TCP.
    #[arg(long)]
    pub no_tcp: bool,
    /// Requests per second served, 0 for unlimited. Beyond it TCP requests wait for their turn
    /// and UDP requests are dropped.
    #[arg(long, default_value_t = 0)]
    pub capacity: u64,
    /// Token bucket size in requests [default: capacity/100, at least 1].
    #[arg(long)]
    pub burst: Option<u64>,
    /// UDP worker threads (TCP connections get a thread each).
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Memory for items (keys, values and per-item overhead), in MiB. A store that would exceed
    /// it is refused with `SERVER_ERROR out of memory storing object`; nothing is evicted.
    #[arg(long)]
    pub memory_limit_mb: Option<u64>,
    /// SwitchKV's roles: `backend` reports its hot keys to its cache node (`--cache-node`)
    /// and tells it of writes to cached keys before answering them; `cache` admits reported
    /// keys and serves them under their backends' leases. The caching fabric's `home` keeps
    /// the fabric's directory for its own keys (a server marked `home = "node"` in the fabric
    /// file), on UDP port 11311 of its --listen address. `plain` (the default) does none.
    #[arg(long, value_enum, default_value = "plain")]
    pub role: Role,
    /// The port of this node's SwitchKV control connections (TCP), on its own address (a
    /// backend names it in its reports, and its cache node connects there).
    #[arg(long, default_value_t = 11311)]
    pub control_port: u16,
    /// The key SwitchKV's backends and cache nodes share (a file of at least 32 bytes, such as
    /// 32 random bytes as 64 hex digits; trailing white space is not part of it): every
    /// control message, request and reply, carries an HMAC-SHA256 under it and a sequence
    /// number, and one without a good MAC, or replayed, is refused. Needed by `--role backend`
    /// and `--role cache`; give every backend and cache node the same file.
    #[arg(long)]
    pub control_key_file: Option<std::path::PathBuf>,
    /// A backend's cache node: its address and control port. The backend's control port
    /// takes messages from that address and port alone.
    #[arg(long)]
    pub cache_node: Option<SocketAddr>,
    /// A cache node's backends: the kvswitch configuration file of the switch whose pool
    /// places the keys (as `kvswitch load --switchkv` reads it). Reports are taken only from
    /// the pool's servers, from their address and `--backend-control-port`, and only about
    /// keys the pool places on their sender; a value is fetched only from its key's server.
    /// Needed by `--role cache`.
    #[arg(long)]
    pub pool_config: Option<std::path::PathBuf>,
    /// The control port of a cache node's backends (their `--control-port`).
    #[arg(long, default_value_t = 11311)]
    pub backend_control_port: u16,
    /// A fabric home's ToR: its fabric address (the fabric file's `address`). The home takes
    /// messages from it alone.
    #[arg(long)]
    pub tor: Option<std::net::IpAddr>,
    /// How long a backend's grant lets its cache node serve a key without hearing of writes;
    /// for a fabric home, the caches' lease (the fabric file's `lease_ms`).
    #[arg(long, default_value_t = 2000)]
    pub lease_ms: u64,
    /// A fabric home's coherence protocol (the fabric file's `coherence`): `invalidate`, or
    /// `update`: once a `set`, `add`, `replace` or `cas` is stored, the switches the write
    /// invalidated get the value.
    #[arg(long, default_value = "invalidate", value_parser = ["invalidate", "update"])]
    pub coherence: String,
    /// A cache node's upstream: where a read it cannot answer goes (the switch's VIP and
    /// memcached port; its proxy, or with --look-through its key routing over UDP, takes it to
    /// the key's backend).
    #[arg(long)]
    pub upstream: Option<SocketAddr>,
    /// The switch pool's hash function, which the switch hashes keys with: the key hash of a
    /// cache node's steering entries and of the reads it sends back through the switch.
    #[arg(long, default_value = "md5")]
    pub hash: String,
    /// A cache node's capacity in keys (SwitchKV: 10,000).
    #[arg(long, default_value_t = 10_000)]
    pub cache_items: usize,
    /// Switch rule changes a second the cache node may ask for (SwitchKV: 400 in its
    /// evaluation); 0 for no limit.
    #[arg(long, default_value_t = 400)]
    pub rule_rate: u32,
    /// Longest a cache node's rule removal waits behind additions, in milliseconds (SwitchKV's
    /// rule buffer: 2000); 0 sends every removal first (no rule buffer).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub rule_buffer_ms: u64,
    /// A cache node that clients send every request to (SwitchKV's on-path look-through
    /// architecture): writes go on to the upstream instead of being refused, and what it does
    /// not answer over UDP goes on over UDP, as its client sent it (a backend over capacity
    /// drops it, as it would the client's).
    #[arg(long, conflicts_with = "look_aside")]
    pub look_through: bool,
    /// A cache node that clients ask first and then, on a miss, the key's backend (SwitchKV's
    /// look-aside architecture): a get of a key it does not serve is answered as a miss.
    #[arg(long)]
    pub look_aside: bool,
    /// Hot keys a backend reports each second, and a cache node counts per backend (SwitchKV:
    /// 5); give backends and their cache node the same.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub top_k: u32,
    /// Which hot-key reports a backend sends: both (SwitchKV's complete updates), periodic
    /// only, instant only, or every key read (the traditional update SwitchKV compares with).
    #[arg(long, value_enum, default_value_t = Reports::Both)]
    pub reports: Reports,
}

/// The hot-key reports a SwitchKV backend sends (SwitchKV's Figures 15 to 17 compare them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Reports {
    /// Periodic top-k reports and instant reports.
    #[default]
    Both,
    /// The periodic top-k reports only.
    Periodic,
    /// The instant reports only.
    Instant,
    /// An instant report of every key read that is not cached, and no periodic reports: the
    /// traditional cache update, which tries to add every key read (SwitchKV, Figure 15).
    Every,
}

/// What a node does besides serving memcached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    Plain,
    Backend,
    Cache,
    Home,
}

impl Default for NodeArgs {
    fn default() -> NodeArgs {
        NodeArgs {
            listen: SocketAddr::from(([127, 0, 0, 1], 11211)),
            udp: false,
            no_udp: false,
            no_tcp: false,
            capacity: 0,
            burst: None,
            threads: 4,
            memory_limit_mb: None,
            role: Role::Plain,
            control_port: 11311,
            control_key_file: None,
            cache_node: None,
            pool_config: None,
            backend_control_port: 11311,
            tor: None,
            lease_ms: 2000,
            coherence: "invalidate".into(),
            upstream: None,
            hash: "md5".into(),
            cache_items: 10_000,
            rule_rate: 400,
            rule_buffer_ms: 2000,
            top_k: 5,
            reports: Reports::Both,
            look_through: false,
            look_aside: false,
        }
    }
}

impl NodeArgs {
    /// The token bucket size in effect.
    pub fn burst(&self) -> u64 {
        self.burst.unwrap_or(self.capacity / 100).max(1)
    }

    /// How a cache node's clients reach it (`--look-through`, `--look-aside`, or steered).
    pub fn cache_path(&self) -> switchkv::CachePath {
        match (self.look_through, self.look_aside) {
            (true, _) => switchkv::CachePath::LookThrough,
            (false, true) => switchkv::CachePath::LookAside,
            (false, false) => switchkv::CachePath::Steered,
        }
    }
}

/// What the serving threads share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub store: Arc<Store>,
    pub bucket: Option<Mutex<Bucket>>,
    pub stop: AtomicBool,
    /// What the node's role adds to serving (SwitchKV's backend or cache node).
    pub hooks: Option<Arc<dyn Hooks>>,
}

impl Shared {
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Takes a token for a UDP request, or counts it dropped over capacity (a UDP request is
    /// never queued); true without a capacity limit.
    pub(crate) fn udp_token(&self) -> bool {
        let Some(bucket) = &self.bucket else {
            return true;
        };
        let taken = bucket
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .try_take(Instant::now());
        if !taken {
            store::bump(&self.store.counters.capacity_drops);
        }
        taken
    }
}

/// A running node. Dropping it stops the serving threads and closes its sockets.
#[derive(Debug)]
pub struct Node {
    shared: Arc<Shared>,
    tcp: Option<SocketAddr>,
    udp: Option<SocketAddr>,
    threads: Vec<JoinHandle<()>>,
    /// The SwitchKV role's threads, stopped with the node.
    roles: switchkv::Roles,
    backend: Option<Arc<switchkv::BackendRole>>,
    cache: Option<Arc<switchkv::CacheRole>>,
}

impl Node {
    /// Binds the sockets and starts serving in background threads. A cache node (`--role
    /// cache`) needs [`Node::start_with`], which says where its rule changes go and which its
    /// backends are.
    pub fn start(args: &NodeArgs) -> anyhow::Result<Node> {
        Node::start_with(args, None, None)
    }

    /// As [`Node::start`]; a cache node hands its switch rule changes to `rules` and takes
    /// reports from `backends` alone (needed: `--pool-config` read, as `kvswitch node` does).
    pub fn start_with(
        args: &NodeArgs,
        rules: Option<switchkv::RuleSink>,
        backends: Option<switchkv::Backends>,
    ) -> anyhow::Result<Node> {
        if args.no_tcp && args.no_udp {
            bail!("--no-tcp and --no-udp leave nothing to serve");
        }
        let hash: kv::HashFn = args
            .hash
            .parse()
            .map_err(|e| anyhow::anyhow!("--hash {}: {e}", args.hash))?;
        // A cache node whose rule changes go to a switch is steered to by it.
        let steered = rules.is_some();
        let bucket = (args.capacity > 0)
            .then(|| Mutex::new(Bucket::new(args.capacity, args.burst(), Instant::now())));
        let limit = args
            .memory_limit_mb
            .map(|mb| mb.saturating_mul(1024 * 1024));
        let store = Arc::new(Store::new(limit, Box::new(SystemHost::start())));
        let roles = switchkv::Roles::default();
        let control = || {
            let addr = SocketAddr::new(args.listen.ip(), args.control_port);
            TcpListener::bind(addr).with_context(|| format!("failed to listen on control {addr}"))
        };
        let lease = std::time::Duration::from_millis(args.lease_ms.max(1));
        let control_key = |role: &str| -> anyhow::Result<auth::Key> {
            let Some(path) = &args.control_key_file else {
                bail!(
                    "--role {role} needs --control-key-file PATH (the key its backends and cache \
                     nodes share)"
                );
            };
            Ok(auth::Key::read(path)?)
        };
        let (mut backend, mut cache, mut role_threads) = (None, None, Vec::new());
        let hooks: Option<Arc<dyn Hooks>> = match args.role {
            Role::Plain | Role::Home => None,
            Role::Backend => {
                let Some(to) = args.cache_node else {
                    bail!("--role backend needs --cache-node ADDRESS:PORT");
                };
                let mut cfg = kv::switchkv::BackendConfig {
                    lease,
                    ..Default::default()
                };
                cfg.tracker.top_k = args.top_k as usize;
                // The tracker must count at least as many keys as it reports.
                cfg.tracker.capacity = cfg.tracker.capacity.max(4 * cfg.tracker.top_k);
                match args.reports {
                    Reports::Periodic => cfg.log_size = 0,
                    // A log of one read and no threshold: every key read (not the one read
                    // just before) is bursty.
                    Reports::Every => {
                        cfg.log_size = 1;
                        cfg.log_threshold = 0;
                    }
                    Reports::Both | Reports::Instant => {}
                }
                let (role, threads) = switchkv::BackendRole::start(
                    cfg,
                    matches!(args.reports, Reports::Both | Reports::Periodic),
                    to,
                    control_key("backend")?,
                    control()?,
                    store.clone(),
                    roles.stop.clone(),
                )?;
                role_threads = threads;
                backend = Some(role.clone());
                Some(role)
            }
            Role::Cache => {
                let Some(upstream) = args.upstream else {
                    bail!("--role cache needs --upstream ADDRESS:PORT (the switch's VIP)");
                };
                let key = control_key("cache")?;
                let Some(backends) = backends else {
                    bail!(
                        "--role cache needs its backends: --pool-config FILE (the kvswitch \
                         configuration whose pool places the keys)"
                    );
                };
                let rules = rules.unwrap_or_else(|| Box::new(|_| Ok(())));
                let mut cfg = kv::switchkv::CacheNodeConfig {
                    lease,
                    ..Default::default()
                };
                cfg.cache.items = args.cache_items.max(1);
                cfg.cache.tracker.top_k = args.top_k as usize;
                cfg.cache.tracker.capacity =
                    cfg.cache.tracker.capacity.max(4 * cfg.cache.tracker.top_k);
                cfg.cache.rules.rate = (args.rule_rate > 0).then_some(args.rule_rate);
                cfg.cache.rules.max_delay = std::time::Duration::from_millis(args.rule_buffer_ms);
                let (role, threads) = switchkv::CacheRole::start(
                    cfg,
                    control()?,
                    backends,
                    key,
                    upstream,
                    args.cache_path(),
                    rules,
                    roles.stop.clone(),
                )?;
                role_threads = threads;
                cache = Some(role.clone());
                Some(role)
            }
        };
        let shared = Arc::new(Shared {
            store,
            bucket,
            stop: AtomicBool::new(false),
            hooks,
        });
        let mut roles = roles;
        roles.threads = role_threads;
        let mut node = Node {
            shared,
            tcp: None,
            udp: None,
            threads: Vec::new(),
            roles,
            backend,
            cache,
        };
        let mut listen = args.listen;
        if args.role == Role::Home {
            let addr = SocketAddr::new(args.listen.ip(), wire::inc::PORT);
            let socket = UdpSocket::bind(addr)
                .with_context(|| format!("--role home: failed to bind udp {addr}"))?;
            let Some(tor) = args.tor else {
                bail!("--role home needs --tor ADDRESS (its ToR's fabric address)");
            };
            let cfg = home::HomeConfig {
                lease: std::time::Duration::from_millis(args.lease_ms.max(1)),
                update: args.coherence == "update",
                ..home::HomeConfig::new(SocketAddr::new(tor, wire::inc::PORT))
            };
            node.threads
                .push(home::spawn(socket, node.shared.clone(), cfg)?);
        }
        if !args.no_tcp {
            let listener = TcpListener::bind(listen)
                .with_context(|| format!("failed to listen on tcp {listen}"))?;
            let addr = listener
                .local_addr()
                .context("failed to read the tcp address")?;
            listen.set_port(addr.port());
            node.tcp = Some(addr);
            node.threads
                .push(tcp::spawn(listener, node.shared.clone())?);
        }
        if !args.no_udp {
            let socket =
                UdpSocket::bind(listen).with_context(|| format!("failed to bind udp {listen}"))?;
            let serving = socket
                .local_addr()
                .context("failed to read the udp address")?;
            node.udp = Some(serving);
            // A look-through cache node sends what it does not answer on over UDP; one a
            // switch steers reads to sends those back through the switch.
            let onward = match (args.upstream, args.role, args.cache_path()) {
                (Some(upstream), Role::Cache, switchkv::CachePath::LookThrough) => {
                    let relay = Arc::new(relay::Relay::new(&socket, upstream)?);
                    node.threads
                        .push(relay::Relay::spawn(relay.clone(), node.shared.clone())?);
                    Some(relay::Onward::Relay(relay))
                }
                (Some(upstream), Role::Cache, switchkv::CachePath::Steered) if steered => {
                    match relay::Bounce::new(serving, upstream, hash) {
                        Ok(bounce) => Some(relay::Onward::Bounce(Arc::new(bounce))),
                        Err(e) => {
                            tracing::warn!(
                                "reads this cache node cannot answer go to their backend over \
                                 TCP: {e:#}"
                            );
                            None
                        }
                    }
                }
                _ => None,
            };
            for _ in 0..args.threads.max(1) {
                let socket = socket
                    .try_clone()
                    .context("failed to share the udp socket")?;
                node.threads
                    .push(udp::spawn(socket, node.shared.clone(), onward.clone())?);
            }
        }
        Ok(node)
    }

    /// The TCP address served, if TCP is on.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp
    }

    /// The UDP address served, if UDP is on.
    pub fn udp_addr(&self) -> Option<SocketAddr> {
        self.udp
    }

    /// The item store and its counters.
    pub fn store(&self) -> &Store {
        &self.shared.store
    }

    /// The SwitchKV backend role's counters, if the node is one.
    pub fn backend_counters(&self) -> Option<&switchkv::RoleCounters> {
        self.backend.as_ref().map(|b| &b.counters)
    }

    /// The SwitchKV cache node role's counters, if the node is one.
    pub fn cache_counters(&self) -> Option<&switchkv::RoleCounters> {
        self.cache.as_ref().map(|c| &c.counters)
    }

    /// Serves until a serving thread exits (which happens only on a fatal socket error).
    pub fn wait(mut self) {
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.roles.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Runs `kvswitch node` in the foreground.
pub fn run(args: &NodeArgs) -> anyhow::Result<()> {
    run_with(args, None, None)
}

/// As [`run`]; a cache node hands its switch rule changes to `rules` and takes reports from
/// `backends`.
pub fn run_with(
    args: &NodeArgs,
    rules: Option<switchkv::RuleSink>,
    backends: Option<switchkv::Backends>,
) -> anyhow::Result<()> {
    let node = Node::start_with(args, rules, backends)?;
    tracing::info!(
        tcp = ?node.tcp_addr(),
        udp = ?node.udp_addr(),
        capacity = args.capacity,
        burst = args.burst(),
        "node serving"
    );
    node.wait();
    bail!("node stopped serving")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        node: NodeArgs,
    }

    #[test]
    fn flags() {
        let cli = Cli::try_parse_from(["node"]).unwrap().node;
        assert_eq!(cli.listen, NodeArgs::default().listen);
        assert_eq!(
            (cli.no_tcp, cli.no_udp, cli.capacity, cli.burst()),
            (false, false, 0, 1)
        );
        let cli = Cli::try_parse_from([
            "node",
            "--listen",
            "0.0.0.0:11311",
            "--no-tcp",
            "--udp",
            "--capacity",
            "100000",
            "--threads",
            "8",
            "--memory-limit-mb",
            "64",
        ])
        .unwrap()
        .node;
        assert_eq!(cli.listen.port(), 11311);
        assert!(cli.no_tcp && cli.udp && !cli.no_udp);
        assert_eq!((cli.capacity, cli.burst(), cli.threads), (100_000, 1000, 8));
        assert_eq!(cli.memory_limit_mb, Some(64));
        let cli = Cli::try_parse_from(["node", "--capacity", "5000", "--burst", "7"]).unwrap();
        assert_eq!(cli.node.burst(), 7);
        let args = NodeArgs {
            no_tcp: true,
            no_udp: true,
            ..NodeArgs::default()
        };
        assert!(Node::start(&args).is_err());
    }
}
