//! The pool both paths route by: its servers, how keys are placed on them, and their health,
//! as one versioned state. The switch's UDP path and the proxy read it; a failure the proxy
//! sees, or a change the control plane makes, goes through [`Pool`]'s few methods and reaches
//! both, so a key has one owner whichever transport asks. No clock is read: health changes
//! carry the caller's instant.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};
use std::time::Duration;

use kv::{Distribution, HashFn, Instant, Ring, RouteError, Server};

/// Default per-request timeout. nutcracker waits forever when a pool sets none (its default
/// `timeout` is infinite); kvswitch bounds every request, so a pool without a timeout gets
/// this one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(1000);
/// nutcracker's default `server_failure_limit`.
pub const DEFAULT_FAILURE_LIMIT: u32 = 2;
/// nutcracker's default `server_retry_timeout` (30 s).
pub const DEFAULT_RETRY_TIMEOUT: Duration = Duration::from_secs(30);
/// Default connections each proxy worker keeps to each server.
pub const DEFAULT_SERVER_CONNECTIONS: usize = 1;
/// Most servers a pool has had in all, removed ones included: counters and connection lists
/// are made for this many, so that a server added at run time has its own.
pub const MAX_SERVERS: usize = 1024;

/// One pool: a listening address and the servers its keys are spread over.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolSpec {
    /// The pool's name (the YAML key in a nutcracker file; "default" otherwise).
    pub name: String,
    /// Where clients connect.
    pub listen: SocketAddr,
    pub distribution: Distribution,
    pub hash: HashFn,
    /// nutcracker's `hash_tag`: two bytes, such as `{}`. When a key holds the first byte, then
    /// later the second with at least one byte between them, only the bytes between are hashed
    /// (see [`PoolSpec::hashed_key`]), so related keys can be kept on one server.
    pub hash_tag: Option<[u8; 2]>,
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
    /// Servers each key is kept on (1: no replication). A write goes to every replica of its
    /// key and is answered once all have answered; a read goes to the first live one.
    pub replicas: usize,
    /// A Redis pool (nutcracker's `redis: true`): its servers speak RESP. `None`: memcached.
    pub redis: Option<RedisSpec>,
}

/// What a Redis pool's proxy says to its servers before any client's command: nutcracker's
/// `redis_auth` and `redis_db`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisSpec {
    /// The password the servers want (`AUTH`), which the pool's clients must give too.
    pub auth: Option<String>,
    /// The database every command is run in (`SELECT`).
    pub db: u32,
    /// The servers are nodes of one Redis Cluster: keys are placed by the cluster's slots,
    /// learned from the nodes, not by the pool's hash; the servers listed are where the proxy
    /// first asks.
    pub cluster: bool,
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
            hash_tag: None,
            servers,
            timeout: DEFAULT_TIMEOUT,
            auto_eject_hosts: false,
            server_failure_limit: DEFAULT_FAILURE_LIMIT,
            server_retry_timeout: DEFAULT_RETRY_TIMEOUT,
            server_connections: DEFAULT_SERVER_CONNECTIONS,
            replicas: 1,
            redis: None,
        }
    }

    /// The part of `key` that is hashed to place it, exactly as nutcracker picks it: the whole
    /// key, unless the pool has a hash tag `[open, close]`, the key holds `open`, and after its
    /// first `open` the first `close` comes at least one byte later; then the bytes between
    /// those two. So with `{}`, `user{42}.name` is placed by `42`, while `a{}b`, `a{b` and
    /// `a}b{` are placed by the whole key.
    pub fn hashed_key<'k>(&self, key: &'k [u8]) -> &'k [u8] {
        hashed_key(self.hash_tag, key)
    }

    /// The pool's servers as the hash ring sees them: ring names and weights, in
    /// configuration order.
    pub fn ring_servers(&self) -> Vec<Server> {
        self.servers
            .iter()
            .map(|s| Server::new(s.ring_name(), s.weight))
            .collect()
    }

    /// Builds the pool's ring over all its servers; indexes it returns are positions in
    /// [`PoolSpec::servers`]. Place a key with `ring.locate(pool.hashed_key(key))`. The errors
    /// are [`Ring::new`]'s.
    pub fn ring(&self) -> Result<Ring, RouteError> {
        build_ring(self, &self.ring_servers())
    }
}

/// One server's health.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Health {
    /// Failures in a row (connects, lost connections, timeouts) since its last answer.
    pub failure_streak: u32,
    /// Until when it is out of the ring; `None` while it is in.
    pub down_until: Option<Instant>,
    /// Times it was taken out.
    pub ejections: u64,
    /// Failures in all.
    pub failures: u64,
    /// Taken out of the pool by the control plane; its position is never reused by another
    /// server, and adding the same server again brings it back there.
    pub removed: bool,
    /// Until when it warms up: a read the proxy sends it that misses is also asked of the
    /// key's previous owner (the owner on the ring without the servers warming up), whose
    /// item it is given.
    pub warm_until: Option<Instant>,
}

/// The pool as it stands at one version: the ring over the servers in it and where each of
/// its positions is in the pool's list.
#[derive(Debug)]
pub struct View {
    version: u64,
    ring: Option<Ring>,
    live: Vec<usize>,
    hash: HashFn,
    hash_tag: Option<[u8; 2]>,
    replicas: usize,
    /// The servers warming up, and the ring over the live servers without them: where their
    /// keys were before they came.
    warming: Vec<usize>,
    cold: Option<(Ring, Vec<usize>)>,
    /// The earliest instant at which a server that is out comes back, or one warming up is
    /// warm.
    next_return: Option<Instant>,
    /// Requests counted on each arc of the ring (a plain ketama pool's; `None` otherwise).
    arcs: Option<Arc<ArcLoads>>,
    /// Whether a placement of the ring's arcs is in force (see [`Placement`]).
    placed: bool,
}

/// Requests routed on each arc of a ketama ring (the hashes up to and including one point of
/// its continuum), in [`kv::route::Ring::points`] order: the load consistent hashing with
/// bounded loads places ([`kv::bounded`]). Kept while the ring's servers and points stay the
/// same, so a placement does not reset it; another ring starts again from 0. Nothing is
/// counted until the counts are first asked for ([`ArcLoads::start`]): a pool nobody balances
/// pays nothing for them.
#[derive(Debug)]
pub struct ArcLoads {
    /// The ring's servers (ring names, in the pool's order) the counts are of.
    servers: Vec<String>,
    /// Its points' values.
    values: Vec<u32>,
    counts: Box<[AtomicU64]>,
    on: std::sync::atomic::AtomicBool,
}

impl ArcLoads {
    fn new(servers: Vec<String>, values: Vec<u32>, on: bool) -> ArcLoads {
        ArcLoads {
            servers,
            counts: values.iter().map(|_| AtomicU64::new(0)).collect(),
            values,
            on: std::sync::atomic::AtomicBool::new(on),
        }
    }

    /// Counts from now on (for as long as the pool lives, rings after this one too).
    pub fn start(&self) {
        self.on.store(true, Ordering::Relaxed);
    }

    /// Whether requests are counted.
    pub fn counting(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// The points' values, in ring order.
    pub fn values(&self) -> &[u32] {
        &self.values
    }

    /// The ring's servers, by ring name, in ring order.
    pub fn servers(&self) -> &[String] {
        &self.servers
    }

    /// Points on the ring.
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    /// Whether the ring has no points.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Requests counted on each arc so far.
    pub fn counts(&self) -> Vec<u64> {
        self.counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }

    /// Counts the requests on the arcs of a router that routes by its own copy of the ring
    /// (the XDP fast path), arc by arc.
    pub fn add(&self, counts: &[u64]) {
        for (c, &n) in self.counts.iter().zip(counts) {
            if n > 0 {
                c.fetch_add(n, Ordering::Relaxed);
            }
        }
    }
}

/// A placement of a ketama ring's arcs: which server takes each arc that is not its ketama
/// owner's, by the value of the point that ends the arc. Set for the ring over `servers` (ring
/// names in the pool's order), and kept when the ring changes: on a ring of other servers a
/// move still applies where its point is still on the ring and its server in it, so that a
/// server added or taken out moves only the keys ketama moves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub servers: Vec<String>,
    /// Points on that ring.
    pub points: usize,
    /// (point value, ring name of the server that takes its arc).
    pub moves: Vec<(u32, String)>,
}

/// Why a placement was refused; the pool is as it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("the pool's ring is not plain ketama (another distribution, replicas or a server warming up): its arcs cannot be placed")]
    NotKetama,
    #[error("the placement is for a ring over {given:?}; the pool's ring is over {current:?}")]
    OtherRing {
        given: Vec<String>,
        current: Vec<String>,
    },
    #[error("the placement is for a ring of {given} points; the pool's has {current}")]
    Points { given: usize, current: usize },
    #[error("no point of the ring has the value {0}")]
    NoSuchPoint(u32),
    #[error("{moves} moves for a ring of {points} points")]
    TooMany { moves: usize, points: usize },
    #[error("server {0:?} is not on the ring")]
    UnknownServer(String),
}

impl View {
    /// The version this view shows; it grows with every change of the pool.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Counts one request routed by `hash` on its arc (a plain ketama pool only; nothing
    /// otherwise). Call once for each request sent to the key's owner.
    pub fn count(&self, hash: u32) {
        if let (Some(arcs), Some(ring)) = (&self.arcs, &self.ring) {
            if !arcs.counting() {
                return;
            }
            if let Some(c) = arcs.counts.get(ring.point_index(hash)) {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The requests counted on the ring's arcs (a plain ketama pool only).
    pub fn arcs(&self) -> Option<&Arc<ArcLoads>> {
        self.arcs.as_ref()
    }

    /// Whether the ring's arcs are placed by a [`Placement`] rather than by ketama alone.
    pub fn placed(&self) -> bool {
        self.placed
    }

    /// The ring's servers' ring names and weights, in ring order.
    pub fn ring_servers(&self, spec: &PoolSpec) -> Vec<(String, u32)> {
        self.live
            .iter()
            .filter_map(|&i| spec.servers.get(i))
            .map(|s| (s.ring_name(), s.weight))
            .collect()
    }

    /// The owner of each of the ring's points, by its place in the ring's server list (see
    /// [`View::ring_servers`]): the owners a placement gives where one is in force. Empty but
    /// for ketama.
    pub fn ring_owners(&self) -> Vec<u32> {
        self.ring
            .as_ref()
            .map_or_else(Vec::new, |r| r.points().map(|(_, s)| s).collect())
    }

    /// The servers in the ring, in the pool's order.
    pub fn live(&self) -> &[usize] {
        &self.live
    }

    /// The hash that places `key` (its hash-tagged part, as nutcracker hashes it).
    pub fn key_hash(&self, key: &[u8]) -> u32 {
        let key = hashed_key(self.hash_tag, key);
        if key.is_empty() {
            0
        } else {
            self.hash.hash(key)
        }
    }

    /// The server (its position in the pool's list) that owns `hash`; `None` when every
    /// server is out.
    pub fn locate_hash(&self, hash: u32) -> Option<usize> {
        let ring = self.ring.as_ref()?;
        self.live.get(ring.locate_hash(hash)).copied()
    }

    /// The ring as a table of points for a router that searches it itself (the XDP fast
    /// path): the key hash function and each ketama point with the pool position of its
    /// server. `None` when keys are not placed by the ring alone: another distribution, a
    /// hash tag, replicas, a server warming up, or every server out.
    pub fn ketama_points(&self) -> Option<(HashFn, Vec<(u32, usize)>)> {
        let ring = self.ring.as_ref()?;
        if ring.distribution() != kv::Distribution::Ketama
            || self.hash_tag.is_some()
            || self.replicas > 1
            || !self.warming.is_empty()
        {
            return None;
        }
        let points = ring
            .points()
            .map(|(value, server)| self.live.get(server as usize).map(|&s| (value, s)))
            .collect::<Option<Vec<_>>>()?;
        Some((self.hash, points))
    }

    /// The server that owns `key`.
    pub fn locate(&self, key: &[u8]) -> Option<usize> {
        self.locate_hash(self.key_hash(key))
    }

    /// The server a read of `hash` goes to: its owner, except in a replicated pool whose owner
    /// warms up (back from being down, it lacks what was written meanwhile), where it is the
    /// first of the key's replicas that does not, which has every write.
    pub fn read_locate_hash(&self, hash: u32) -> Option<usize> {
        let owner = self.locate_hash(hash)?;
        if self.replicas < 2 || !self.warming.contains(&owner) {
            return Some(owner);
        }
        let mut replicas = Vec::with_capacity(self.replicas);
        self.replicas_hash(hash, &mut replicas);
        Some(
            replicas
                .into_iter()
                .find(|r| !self.warming.contains(r))
                .unwrap_or(owner),
        )
    }

    /// The server a read of `key` goes to (see [`View::read_locate_hash`]).
    pub fn read_locate(&self, key: &[u8]) -> Option<usize> {
        self.read_locate_hash(self.key_hash(key))
    }

    /// Whether a server warms up.
    pub fn is_warming(&self) -> bool {
        !self.warming.is_empty()
    }

    /// For a key (by its hash) whose owner is warming up: the owner, and the server that owned
    /// the key before the servers warming up came (`None` when no other server holds it).
    pub fn warm_source(&self, hash: u32) -> Option<(usize, usize)> {
        if self.warming.is_empty() {
            return None;
        }
        let owner = self.locate_hash(hash)?;
        if !self.warming.contains(&owner) {
            return None;
        }
        let (ring, live) = self.cold.as_ref()?;
        let before = *live.get(ring.locate_hash(hash))?;
        (before != owner).then_some((owner, before))
    }

    /// Servers each key is kept on (the pool's `replicas`; 1 when it is not replicated).
    pub fn replicas(&self) -> usize {
        self.replicas
    }

    /// The live servers that hold `hash`, owner first, into `out` (cleared first): the
    /// pool's `replicas` of them, or every live server when fewer are in (see
    /// [`Ring::replicas_hash`]). Empty when every server is out.
    pub fn replicas_hash(&self, hash: u32, out: &mut Vec<usize>) {
        out.clear();
        let Some(ring) = self.ring.as_ref() else {
            return;
        };
        ring.replicas_hash(hash, self.replicas, out);
        for i in out.iter_mut() {
            *i = self.live[*i];
        }
    }

    /// When this view stops being true without any other change: a server that is out is
    /// due back then.
    pub fn next_return(&self) -> Option<Instant> {
        self.next_return
    }
}

/// Told of each new version of a pool before any path can route by it: a router that keeps
/// its own copy of the ring (the XDP fast path) stops routing by its copy here, so that no
/// request it routes by an older ring can follow a request routed by the new one.
pub trait VersionFence: Send + Sync {
    /// `version` is about to be published. Called under the pool's lock, before the view and
    /// the version are visible to any reader, once per version and in order; it must not call
    /// back into the pool's changing methods, and should return quickly (one map write).
    fn before_publish(&self, version: u64);
}

/// The pool's fence, if one is set (see [`Pool::set_fence`]).
#[derive(Default)]
struct Fence(OnceLock<Arc<dyn VersionFence>>);

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "Fence(set)"
        } else {
            "Fence(none)"
        })
    }
}

/// A pool and its servers' health, shared by every path that routes by it.
#[derive(Debug)]
pub struct Pool {
    /// The current view's version, readable without a lock.
    version: AtomicU64,
    /// What servers added or set at run time must be.
    rules: RwLock<ServerRules>,
    state: Mutex<State>,
    view: RwLock<Arc<View>>,
    fence: Fence,
}

/// What the pool's lock guards: its servers, their order and their health, changed together.
#[derive(Debug)]
struct State {
    /// Servers by position; positions stay what they are for the pool's life.
    spec: Arc<PoolSpec>,
    /// The positions in configuration order: the ring is built over the live ones in this
    /// order, as nutcracker builds it over its list (it matters to `modula`).
    order: Vec<usize>,
    health: Vec<Health>,
    /// Where the arcs of the ring go, when not by ketama alone.
    placement: Option<Placement>,
    /// The arcs' request counts, of the ring last built.
    arcs: Option<Arc<ArcLoads>>,
}

/// Why a change of the pool's servers was refused; the pool is as it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolChangeError {
    #[error("no server {0:?} in the pool")]
    UnknownServer(String),
    #[error("server {0:?} is in the pool already")]
    Duplicate(String),
    #[error("weight {0}: give 1 or more")]
    BadWeight(u32),
    #[error("the pool has had {MAX_SERVERS} servers; restart to add more")]
    Full,
    #[error("the ring cannot be built: {0}")]
    Ring(String),
    /// A server the pool cannot have: the message says what is wrong with it.
    #[error("server {0:?}: {1}")]
    BadServer(String, String),
}

/// What a pool's servers must be beyond what every pool asks (a port other than 0, an address
/// that can be connected to, a name of 1 to 80 characters without spaces): set by the switch,
/// whose UDP path rewrites a request's addresses but not its ports, so that a server added at
/// run time is one its configuration would take.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerRules {
    /// Every server listens on this port (the VIP's).
    pub port: Option<u16>,
    /// Addresses no server may have (the VIP, the agent address).
    pub refused: Vec<std::net::IpAddr>,
    /// Only IPv4 host addresses (not loopback, broadcast, multicast or 240.0.0.0/4), one
    /// server in the pool per address.
    pub host_addresses: bool,
}

/// Longest explicit server name (a server's identity on the ring).
pub const MAX_NAME_LEN: usize = 80;

/// Whether `name` may be a server's explicit name: 1 to [`MAX_NAME_LEN`] characters without
/// spaces. The configuration files and the pool's changes at run time hold names to this.
pub fn valid_server_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME_LEN && !name.contains(char::is_whitespace)
}

impl ServerRules {
    /// Why `server` cannot join a pool whose live servers are `live`, if it cannot.
    fn refuse(&self, server: &ServerSpec, live: &[&ServerSpec]) -> Option<String> {
        let ip = server.addr.ip();
        if server.addr.port() == 0 {
            return Some("port 0 cannot be connected to".into());
        }
        if ip.is_unspecified() {
            return Some(format!("{ip} cannot be connected to"));
        }
        if let Some(name) = &server.name {
            if !valid_server_name(name) {
                return Some(format!(
                    "a name must be 1 to {MAX_NAME_LEN} characters without spaces"
                ));
            }
        }
        if let Some(port) = self.port.filter(|p| *p != server.addr.port()) {
            return Some(format!(
                "port {} differs from the VIP's port {port}; in switch mode every server \
                 listens on the VIP's port",
                server.addr.port()
            ));
        }
        if self.refused.contains(&ip) {
            return Some(format!("{ip} is the switch's own address"));
        }
        if self.host_addresses {
            let std::net::IpAddr::V4(v4) = ip else {
                return Some("the switch reaches servers over IPv4 only".into());
            };
            if !crate::source::is_host_address(v4) {
                return Some(format!("{ip} is not a host's address"));
            }
            if live.iter().any(|s| {
                s.addr.ip() == ip && s.addr != server.addr
                    || s.addr == server.addr && s.ring_name() != server.ring_name()
            }) {
                return Some(format!("{ip} is in the pool already"));
            }
        }
        None
    }
}

/// What one change did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    /// The server's position.
    pub server: usize,
    /// The pool's version after the change.
    pub version: u64,
}

impl Pool {
    /// A pool with every server in the ring.
    pub fn new(spec: PoolSpec) -> Result<Pool, RouteError> {
        let mut state = State {
            order: (0..spec.servers.len()).collect(),
            health: vec![Health::default(); spec.servers.len()],
            spec: Arc::new(spec),
            placement: None,
            arcs: None,
        };
        let view = build_view(&state, 0)?;
        state.arcs = view.arcs.clone();
        Ok(Pool {
            version: AtomicU64::new(0),
            rules: RwLock::new(ServerRules::default()),
            state: Mutex::new(state),
            view: RwLock::new(Arc::new(view)),
            fence: Fence::default(),
        })
    }

    /// Tells `fence` of every version from now on before it is published; it is first told
    /// of the version in force, so that it starts from there. A pool has one fence: false,
    /// and nothing changes, when it has one already.
    pub fn set_fence(&self, fence: Arc<dyn VersionFence>) -> bool {
        // Under the lock, so that no version is published between the two.
        let _state = self.lock_state();
        if self.fence.0.set(fence.clone()).is_err() {
            return false;
        }
        fence.before_publish(self.version());
        true
    }

    /// The pool's settings and every server it has had, by position (removed ones too: see
    /// [`Health::removed`]).
    pub fn spec(&self) -> Arc<PoolSpec> {
        self.lock_state().spec.clone()
    }

    /// The position of the live (not removed) server `label` names: its label, its ring
    /// name, or its position as a number.
    pub fn find(&self, label: &str) -> Option<usize> {
        let state = self.lock_state();
        let live = |i: &usize| !state.health[*i].removed;
        if let Ok(i) = label.parse::<usize>() {
            return (i < state.spec.servers.len()).then_some(i).filter(live);
        }
        state
            .spec
            .servers
            .iter()
            .enumerate()
            .find(|(i, s)| live(i) && (s.label() == label || s.ring_name() == label))
            .map(|(i, _)| i)
    }

    /// Adds `server` at the end of the pool's order, or brings back a removed server with the
    /// same ring name and address at its old position. Only the keys ketama gives the new
    /// server move.
    pub fn add_server(&self, server: ServerSpec) -> Result<Changed, PoolChangeError> {
        self.add_warming(server, None)
    }

    /// Sets what servers added or set from now on must be (see [`ServerRules`]); the servers
    /// the pool has are not judged again.
    pub fn set_rules(&self, rules: ServerRules) {
        match self.rules.write() {
            Ok(mut r) => *r = rules,
            Err(poisoned) => *poisoned.into_inner() = rules,
        }
    }

    /// Why `server` may not join the pool beside `others` under its rules, if it may not.
    fn refuse(&self, server: &ServerSpec, others: &[&ServerSpec]) -> Result<(), PoolChangeError> {
        let rules = match self.rules.read() {
            Ok(r) => r.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        match rules.refuse(server, others) {
            Some(why) => Err(PoolChangeError::BadServer(server.label(), why)),
            None => Ok(()),
        }
    }

    /// As [`Pool::add_server`]; with `warm_until`, the server warms up until then (see
    /// [`Health::warm_until`]).
    pub fn add_warming(
        &self,
        server: ServerSpec,
        warm_until: Option<Instant>,
    ) -> Result<Changed, PoolChangeError> {
        if server.weight == 0 {
            return Err(PoolChangeError::BadWeight(0));
        }
        self.edit(|state| {
            let live: Vec<&ServerSpec> = (0..state.spec.servers.len())
                .filter(|&i| !state.health[i].removed)
                .map(|i| &state.spec.servers[i])
                .collect();
            self.refuse(&server, &live)?;
            let i = match place(&state.spec, &state.health, &server) {
                Place::Live(_) => return Err(PoolChangeError::Duplicate(server.label())),
                Place::Removed(i) => {
                    state.health[i].removed = false;
                    state.health[i].down_until = None;
                    state.health[i].failure_streak = 0;
                    Arc::make_mut(&mut state.spec).servers[i].weight = server.weight;
                    i
                }
                Place::New if state.spec.servers.len() >= MAX_SERVERS => {
                    return Err(PoolChangeError::Full)
                }
                Place::New => {
                    Arc::make_mut(&mut state.spec).servers.push(server.clone());
                    state.health.push(Health::default());
                    state.spec.servers.len() - 1
                }
            };
            state.order.retain(|&o| o != i);
            state.order.push(i);
            state.health[i].warm_until = warm_until;
            Ok(i)
        })
    }

    /// Takes server `i` out of the pool for good: its keys go to the servers ketama gives
    /// them next; requests already sent to it are answered.
    pub fn remove_server(&self, i: usize) -> Result<Changed, PoolChangeError> {
        self.edit(|state| {
            match state.health.get_mut(i) {
                Some(h) if !h.removed => h.removed = true,
                _ => return Err(PoolChangeError::UnknownServer(i.to_string())),
            }
            state.order.retain(|&o| o != i);
            Ok(i)
        })
    }

    /// Gives server `i` a new weight.
    pub fn set_weight(&self, i: usize, weight: u32) -> Result<Changed, PoolChangeError> {
        if weight == 0 {
            return Err(PoolChangeError::BadWeight(0));
        }
        self.edit(|state| {
            if state.health.get(i).is_none_or(|h| h.removed) {
                return Err(PoolChangeError::UnknownServer(i.to_string()));
            }
            Arc::make_mut(&mut state.spec).servers[i].weight = weight;
            Ok(i)
        })
    }

    /// Makes the pool's servers `servers`, in that order: servers it lacks are added (or
    /// brought back), servers not listed are removed, weights follow. All or nothing; returns
    /// the new version.
    pub fn set_servers(&self, servers: &[ServerSpec]) -> Result<u64, PoolChangeError> {
        self.refuse_all(servers)?;
        self.edit(|state| servers_into(state, servers))
            .map(|c| c.version)
    }

    /// As [`Pool::set_servers`], and a server that was not in the pool before and has a
    /// `warm_until` (by its position in `servers`) warms up until then, all in one version:
    /// a staged change taken at once.
    pub fn set_servers_warming(
        &self,
        servers: &[ServerSpec],
        warm_until: &[Option<Instant>],
    ) -> Result<u64, PoolChangeError> {
        self.refuse_all(servers)?;
        self.edit(|state| {
            let before = state.order.clone();
            servers_into(state, servers)?;
            for (k, &i) in state.order.clone().iter().enumerate() {
                if let Some(&Some(until)) = warm_until.get(k) {
                    if !before.contains(&i) {
                        state.health[i].warm_until = Some(until);
                    }
                }
            }
            Ok(0)
        })
        .map(|c| c.version)
    }

    /// Places the ring's arcs as `placement` says (`None`: by ketama alone again), under a new
    /// version. Refused, changing nothing, when the pool's ring is not plain ketama or is not
    /// over the servers the placement was made for.
    pub fn set_placement(&self, placement: Option<Placement>) -> Result<u64, PlacementError> {
        let mut state = self.lock_state();
        if let Some(p) = &placement {
            let view = self.current();
            let Some(arcs) = view.arcs.as_ref() else {
                return Err(PlacementError::NotKetama);
            };
            if p.servers != arcs.servers {
                return Err(PlacementError::OtherRing {
                    given: p.servers.clone(),
                    current: arcs.servers.clone(),
                });
            }
            if p.points != arcs.counts.len() {
                return Err(PlacementError::Points {
                    given: p.points,
                    current: arcs.counts.len(),
                });
            }
            if p.moves.len() > p.points {
                return Err(PlacementError::TooMany {
                    moves: p.moves.len(),
                    points: p.points,
                });
            }
            for (point, name) in &p.moves {
                if arcs.values.binary_search(point).is_err() {
                    return Err(PlacementError::NoSuchPoint(*point));
                }
                if !p.servers.contains(name) {
                    return Err(PlacementError::UnknownServer(name.clone()));
                }
            }
        }
        // One move a point (the last given), in the ring's order.
        let placement = placement.map(|mut p| {
            let moves: std::collections::BTreeMap<u32, String> = p.moves.drain(..).collect();
            p.moves = moves.into_iter().collect();
            p
        });
        if state.placement == placement {
            return Ok(self.version());
        }
        let version = self.version.load(Ordering::Acquire) + 1;
        let before = std::mem::replace(&mut state.placement, placement);
        match build_view(&state, version) {
            Ok(view) => {
                state.arcs = view.arcs.clone();
                self.publish(view);
                Ok(version)
            }
            Err(_) => {
                // Checked above against the ring in force, whose points take any owner.
                state.placement = before;
                Err(PlacementError::NotKetama)
            }
        }
    }

    /// The placement set, whether or not it is in force (see [`View::placed`]).
    pub fn placement(&self) -> Option<Placement> {
        self.lock_state().placement.clone()
    }

    /// Whether [`Pool::set_servers`] would take `servers` as the pool stands now, changing
    /// nothing: for checking every pool of a file before changing any.
    pub fn check_servers(&self, servers: &[ServerSpec]) -> Result<(), PoolChangeError> {
        self.refuse_all(servers)?;
        let state = self.lock_state();
        let mut next = State {
            spec: state.spec.clone(),
            order: state.order.clone(),
            health: state.health.clone(),
            placement: state.placement.clone(),
            arcs: state.arcs.clone(),
        };
        drop(state);
        servers_into(&mut next, servers)?;
        build_view(&next, 0).map_err(|e| PoolChangeError::Ring(e.to_string()))?;
        Ok(())
    }

    /// Judges each of `servers` beside the others.
    fn refuse_all(&self, servers: &[ServerSpec]) -> Result<(), PoolChangeError> {
        for (i, server) in servers.iter().enumerate() {
            let others: Vec<&ServerSpec> = servers
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, s)| s)
                .collect();
            self.refuse(server, &others)?;
        }
        Ok(())
    }

    /// Applies `f` to a copy of the state; publishes it with a new view under the next
    /// version if `f` succeeds and the ring builds, and leaves the pool as it was otherwise.
    fn edit(
        &self,
        f: impl FnOnce(&mut State) -> Result<usize, PoolChangeError>,
    ) -> Result<Changed, PoolChangeError> {
        let mut state = self.lock_state();
        let mut next = State {
            spec: state.spec.clone(),
            order: state.order.clone(),
            health: state.health.clone(),
            placement: state.placement.clone(),
            arcs: state.arcs.clone(),
        };
        let server = f(&mut next)?;
        let version = self.version.load(Ordering::Acquire) + 1;
        let view = build_view(&next, version).map_err(|e| PoolChangeError::Ring(e.to_string()))?;
        next.arcs = view.arcs.clone();
        *state = next;
        self.publish(view);
        Ok(Changed { server, version })
    }

    /// Makes `view` the pool's, under the state's lock: the fence first, then the view, then
    /// its version (which readers compare with their view's before they take the new one).
    fn publish(&self, view: View) {
        let version = view.version;
        if let Some(fence) = self.fence.0.get() {
            fence.before_publish(version);
        }
        match self.view.write() {
            Ok(mut v) => *v = Arc::new(view),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(view),
        }
        self.version.store(version, Ordering::Release);
    }

    /// The current version: compare it with a view's to know whether the view is stale.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// The pool as it stands at `now`: a server whose time out has ended is back in it.
    pub fn view(&self, now: Instant) -> Arc<View> {
        let view = self.current();
        if view.next_return.is_some_and(|t| t <= now) {
            self.change(|health| {
                let mut changed = false;
                for h in health.iter_mut() {
                    if h.down_until.is_some_and(|t| t <= now) {
                        h.down_until = None;
                        changed = true;
                    }
                    if h.warm_until.is_some_and(|t| t <= now) {
                        h.warm_until = None;
                        changed = true;
                    }
                }
                changed
            });
            return self.current();
        }
        view
    }

    fn current(&self) -> Arc<View> {
        match self.view.read() {
            Ok(v) => v.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Server `i`'s health.
    pub fn health(&self, i: usize) -> Health {
        self.lock_state().health.get(i).copied().unwrap_or_default()
    }

    /// Whether server `i` is out of the ring at `now`.
    pub fn is_down(&self, i: usize, now: Instant) -> bool {
        self.health(i).down_until.is_some_and(|t| t > now)
    }

    /// Records a failure of server `i` (a refused connect, a lost connection, a timeout); with
    /// `auto_eject_hosts`, the `server_failure_limit`-th in a row takes it out of the ring for
    /// `server_retry_timeout`. Returns whether this failure took it out.
    pub fn failed(&self, i: usize, now: Instant) -> bool {
        let spec = self.spec();
        let (limit, retry, eject) = (
            spec.server_failure_limit.max(1),
            spec.server_retry_timeout,
            spec.auto_eject_hosts,
        );
        let mut ejected = false;
        self.change(|health| {
            let Some(h) = health.get_mut(i) else {
                return false;
            };
            h.failures += 1;
            // Failures of requests sent before it went out (or while an operator holds it
            // out) do not count towards the next ejection: back in the ring, it starts afresh,
            // as nutcracker's server does.
            let out = h.removed || h.down_until.is_some_and(|t| t > now);
            if out {
                return false;
            }
            h.failure_streak += 1;
            if eject && h.failure_streak >= limit {
                h.down_until = Some(now + retry);
                h.failure_streak = 0;
                h.ejections += 1;
                ejected = true;
            }
            ejected
        });
        ejected
    }

    /// Records an answer from server `i`: its failure streak ends.
    pub fn answered(&self, i: usize) {
        let mut state = self.lock_state();
        if let Some(h) = state.health.get_mut(i) {
            h.failure_streak = 0;
        }
    }

    /// Takes server `i` out of the ring until `until`, or puts it back (`None`): the one door
    /// through which an operator or a controller changes the pool's health. Returns the new
    /// version (the same if nothing changed).
    pub fn set_down(&self, i: usize, until: Option<Instant>) -> u64 {
        self.change(|health| match health.get_mut(i) {
            Some(h) if !h.removed && h.down_until != until => {
                if until.is_some() && h.down_until.is_none() {
                    h.ejections += 1;
                }
                h.down_until = until;
                true
            }
            _ => false,
        });
        self.version()
    }

    fn lock_state(&self) -> MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Applies `f` to the health of every server; if it says the ring changed, publishes a
    /// new view under the next version. The health lock is held throughout, so versions are
    /// published in order.
    fn change(&self, f: impl FnOnce(&mut Vec<Health>) -> bool) {
        let mut state = self.lock_state();
        if !f(&mut state.health) {
            return;
        }
        let version = self.version.load(Ordering::Acquire) + 1;
        // The servers are those of the last change, whose ring built; a ring over a subset
        // always builds (an empty one is `None`).
        let view = build_view(&state, version).unwrap_or_else(|_| View {
            version,
            ring: None,
            live: Vec::new(),
            hash: state.spec.hash,
            hash_tag: state.spec.hash_tag,
            replicas: state.spec.replicas.max(1),
            warming: Vec::new(),
            cold: None,
            next_return: None,
            arcs: None,
            placed: false,
        });
        state.arcs = view.arcs.clone();
        self.publish(view);
    }
}

/// The view of the state's servers that are neither removed nor out, in its order.
fn build_view(state: &State, version: u64) -> Result<View, RouteError> {
    let (spec, health) = (&state.spec, &state.health);
    let live: Vec<usize> = state
        .order
        .iter()
        .copied()
        .filter(|&i| !health[i].removed && health[i].down_until.is_none())
        .collect();
    let servers: Vec<Server> = live
        .iter()
        .map(|&i| Server::new(spec.servers[i].ring_name(), spec.servers[i].weight))
        .collect();
    let ring = match servers.is_empty() {
        true => None,
        false => Some(build_ring(spec, &servers)?),
    };
    let warming: Vec<usize> = live
        .iter()
        .copied()
        .filter(|&i| health[i].warm_until.is_some())
        .collect();
    // A ketama ring without replicas is placed by the placement's moves, and, but while a
    // server warms up (the fast path does not route then, and the loads are not the pool's
    // own), its arcs are counted.
    let names: Vec<String> = servers.iter().map(|s| s.name.clone()).collect();
    let plain = |ring: &Ring| ring.distribution() == Distribution::Ketama && spec.replicas < 2;
    let arcs = match &ring {
        Some(r) if plain(r) && warming.is_empty() => {
            let values: Vec<u32> = r.points().map(|(v, _)| v).collect();
            Some(match &state.arcs {
                Some(a) if a.servers == names && a.values == values => a.clone(),
                before => Arc::new(ArcLoads::new(
                    names.clone(),
                    values,
                    before.as_ref().is_some_and(|a| a.counting()),
                )),
            })
        }
        _ => None,
    };
    let placed_ring = |r: Ring, names: &[String]| -> Result<(Ring, bool), RouteError> {
        match &state.placement {
            Some(p) if plain(&r) && !p.moves.is_empty() => {
                let owners = kv::bounded::owners_with_moves(&r, names, &p.moves);
                Ok((r.with_owners(&owners)?, true))
            }
            _ => Ok((r, false)),
        }
    };
    let (ring, placed) = match ring {
        Some(r) => {
            let (r, placed) = placed_ring(r, &names)?;
            (Some(r), placed)
        }
        None => (None, false),
    };
    let cold_live: Vec<usize> = live
        .iter()
        .copied()
        .filter(|i| !warming.contains(i))
        .collect();
    let cold = match (warming.is_empty(), cold_live.is_empty()) {
        (false, false) => {
            let servers: Vec<Server> = cold_live
                .iter()
                .map(|&i| Server::new(spec.servers[i].ring_name(), spec.servers[i].weight))
                .collect();
            let cold_names: Vec<String> = servers.iter().map(|s| s.name.clone()).collect();
            let (cold, _) = placed_ring(build_ring(spec, &servers)?, &cold_names)?;
            Some((cold, cold_live))
        }
        _ => None,
    };
    Ok(View {
        version,
        ring,
        live,
        hash: spec.hash,
        hash_tag: spec.hash_tag,
        replicas: spec.replicas.max(1),
        warming,
        cold,
        next_return: health
            .iter()
            .filter(|h| !h.removed)
            .flat_map(|h| [h.down_until, h.warm_until])
            .flatten()
            .min(),
        arcs,
        placed,
    })
}

/// The ring of `servers` in `spec`'s pool: twemproxy's, or for a replicated pool the stable
/// ring ([`Ring::new_stable`]), on which taking a server out hands each of its keys to the
/// key's next replica, which holds it.
fn build_ring(spec: &PoolSpec, servers: &[Server]) -> Result<Ring, RouteError> {
    match spec.replicas > 1 && spec.distribution == Distribution::Ketama {
        true => Ring::new_stable(spec.hash, servers),
        false => Ring::new(spec.distribution, spec.hash, servers),
    }
}

/// The part of `key` nutcracker hashes under the hash tag `tag` (see [`PoolSpec::hashed_key`]).
fn hashed_key(tag: Option<[u8; 2]>, key: &[u8]) -> &[u8] {
    let Some([open, close]) = tag else {
        return key;
    };
    let Some(start) = key.iter().position(|&b| b == open) else {
        return key;
    };
    let rest = &key[start + 1..];
    match rest.iter().position(|&b| b == close) {
        Some(end) if end > 0 => &rest[..end],
        _ => key,
    }
}

/// Makes `state`'s servers `servers`, in that order (see [`Pool::set_servers`]).
fn servers_into(state: &mut State, servers: &[ServerSpec]) -> Result<usize, PoolChangeError> {
    if servers.iter().any(|s| s.weight == 0) {
        return Err(PoolChangeError::BadWeight(0));
    }
    let mut order = Vec::with_capacity(servers.len());
    let mut spec = (*state.spec).clone();
    let mut health = state.health.clone();
    for s in servers {
        let i = match place(&spec, &health, s) {
            Place::Live(i) | Place::Removed(i) if order.contains(&i) => {
                return Err(PoolChangeError::Duplicate(s.label()))
            }
            Place::Live(i) if spec.servers[i].addr == s.addr => i,
            Place::Removed(i) => i,
            Place::Live(i) => {
                // Same ring name, new address: a new server in the old one's place on
                // the ring.
                health[i].removed = true;
                spec.servers.push(s.clone());
                health.push(Health::default());
                spec.servers.len() - 1
            }
            Place::New => {
                spec.servers.push(s.clone());
                health.push(Health::default());
                spec.servers.len() - 1
            }
        };
        if spec.servers.len() > MAX_SERVERS {
            return Err(PoolChangeError::Full);
        }
        spec.servers[i].weight = s.weight;
        spec.servers[i].name = s.name.clone();
        if health[i].removed {
            health[i] = Health {
                ejections: health[i].ejections,
                failures: health[i].failures,
                ..Health::default()
            };
        }
        order.push(i);
    }
    for (i, h) in health.iter_mut().enumerate() {
        if !order.contains(&i) {
            h.removed = true;
        }
    }
    state.spec = Arc::new(spec);
    state.health = health;
    state.order = order;
    Ok(0)
}

/// Where a server goes in a pool's positions.
enum Place {
    /// A server in the pool with the same ring name.
    Live(usize),
    /// A removed server with the same ring name and address, to bring back.
    Removed(usize),
    /// A position of its own.
    New,
}

/// Where `server` goes: the live server of its ring name if there is one (positions of
/// removed servers with that name do not hide it), else a removed one of that name and
/// address, else a new position.
fn place(spec: &PoolSpec, health: &[Health], server: &ServerSpec) -> Place {
    let name = server.ring_name();
    let mut removed = None;
    for (i, s) in spec.servers.iter().enumerate() {
        if s.ring_name() != name {
            continue;
        }
        match health.get(i) {
            Some(h) if !h.removed => return Place::Live(i),
            _ if s.addr == server.addr && removed.is_none() => removed = Some(i),
            _ => {}
        }
    }
    removed.map_or(Place::New, Place::Removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tagged(tag: Option<&[u8; 2]>) -> PoolSpec {
        let mut pool = PoolSpec::new(
            "t",
            SocketAddr::from(([0, 0, 0, 0], 0)),
            Distribution::Ketama,
            HashFn::Md5,
            Vec::new(),
        );
        pool.hash_tag = tag.copied();
        pool
    }

    #[test]
    fn hashed_key_follows_nutcracker() {
        let pool = tagged(Some(b"{}"));
        let cases: &[(&[u8], &[u8])] = &[
            (b"user{42}.name", b"42"),
            (b"{42}", b"42"),
            (b"{a}{b}", b"a"),
            (b"a{b{c}d", b"b{c"),
            (b"a{}b", b"a{}b"),
            (b"a{b", b"a{b"),
            (b"a}b{", b"a}b{"),
            (b"a}b{c}", b"c"),
            (b"plain", b"plain"),
            (b"", b""),
            (b"{", b"{"),
            (b"{}}", b"{}}"),
        ];
        for (key, want) in cases {
            assert_eq!(
                pool.hashed_key(key),
                *want,
                "key {:?}",
                String::from_utf8_lossy(key)
            );
        }
    }

    #[test]
    fn same_open_and_close_byte() {
        let pool = tagged(Some(b"::"));
        assert_eq!(pool.hashed_key(b"a:b:c"), b"b");
        assert_eq!(pool.hashed_key(b"a::c"), b"a::c");
        assert_eq!(pool.hashed_key(b"a:b"), b"a:b");
    }

    #[test]
    fn no_tag_hashes_whole_key() {
        let pool = tagged(None);
        assert_eq!(pool.hashed_key(b"user{42}"), b"user{42}");
    }

    fn three(eject: bool) -> Pool {
        let servers = (1..=3u8)
            .map(|i| ServerSpec {
                host: format!("10.0.0.{i}"),
                addr: SocketAddr::from(([10, 0, 0, i], 11211)),
                weight: 1,
                name: None,
            })
            .collect();
        let mut spec = PoolSpec::new(
            "p",
            SocketAddr::from(([0, 0, 0, 0], 0)),
            Distribution::Ketama,
            HashFn::Md5,
            servers,
        );
        spec.auto_eject_hosts = eject;
        spec.server_failure_limit = 2;
        spec.server_retry_timeout = Duration::from_secs(30);
        Pool::new(spec).unwrap()
    }

    /// Keys of server `i` under the full ring.
    fn keys_of(view: &View, i: usize) -> Vec<Vec<u8>> {
        (0..1000)
            .map(|n| format!("key:{n}").into_bytes())
            .filter(|k| view.locate(k) == Some(i))
            .collect()
    }

    #[test]
    fn failures_eject_and_the_server_returns_after_its_timeout() {
        let pool = three(true);
        let t0 = Instant::from_secs(100);
        let full = pool.view(t0);
        assert_eq!(full.version(), 0);
        assert_eq!(full.live(), &[0, 1, 2]);
        let moved = keys_of(&full, 1);
        assert!(!moved.is_empty());

        assert!(!pool.failed(1, t0), "one failure is below the limit");
        assert_eq!(pool.version(), 0);
        pool.answered(1);
        assert!(!pool.failed(1, t0), "an answer ended the streak");
        assert!(pool.failed(1, t0), "the second failure in a row ejects");
        assert_eq!(pool.version(), 1);
        assert!(pool.is_down(1, t0));
        let out = pool.view(t0);
        assert_eq!(out.version(), 1);
        assert_eq!(out.live(), &[0, 2]);
        assert_eq!(out.next_return(), Some(t0 + Duration::from_secs(30)));
        // Its keys go to the survivors; nobody else's keys move (ketama).
        for k in &moved {
            assert_ne!(out.locate(k), Some(1));
        }
        for i in [0, 2] {
            for k in keys_of(&full, i) {
                assert_eq!(out.locate(&k), Some(i));
            }
        }
        // Late failures of requests sent before it went out do not count towards the next.
        assert!(!pool.failed(1, t0 + Duration::from_secs(1)));
        assert_eq!(pool.health(1).failure_streak, 0);
        assert_eq!(pool.health(1).failures, 4);
        assert_eq!(pool.health(1).ejections, 1);

        // Back once its time out ends: a new version, the first ring again.
        let back = pool.view(t0 + Duration::from_secs(30));
        assert_eq!(back.version(), 2);
        assert_eq!(back.live(), &[0, 1, 2]);
        for k in &moved {
            assert_eq!(back.locate(k), Some(1));
        }
        assert!(
            !pool.failed(1, t0 + Duration::from_secs(31)),
            "it starts afresh"
        );
    }

    #[test]
    fn without_auto_eject_failures_are_only_counted() {
        let pool = three(false);
        let t0 = Instant::from_secs(1);
        for _ in 0..10 {
            assert!(!pool.failed(0, t0));
        }
        assert_eq!(pool.version(), 0);
        assert_eq!(pool.health(0).failures, 10);
    }

    #[test]
    fn set_down_is_the_operators_door() {
        let pool = three(false);
        let t0 = Instant::from_secs(1);
        assert_eq!(pool.set_down(2, Some(Instant::from_secs(10))), 1);
        assert_eq!(
            pool.set_down(2, Some(Instant::from_secs(10))),
            1,
            "no change, no version"
        );
        assert_eq!(pool.view(t0).live(), &[0, 1]);
        for i in 0..3 {
            pool.set_down(i, Some(Instant::from_secs(10)));
        }
        let none = pool.view(t0);
        assert!(none.live().is_empty());
        assert_eq!(none.locate(b"k"), None, "no server: no owner");
        assert_eq!(pool.set_down(0, None), 4);
        assert_eq!(pool.view(t0).locate(b"k"), Some(0));
        assert_eq!(pool.view(t0).live(), &[0]);
        // Out of range: nothing changes.
        assert_eq!(pool.set_down(7, None), 4);
    }

    #[test]
    fn servers_the_configuration_refuses_are_refused_at_run_time_too() {
        let pool = three(false);
        let at = |text: &str, name: Option<&str>| ServerSpec {
            host: text.rsplit_once(':').unwrap().0.to_string(),
            addr: text.parse().unwrap(),
            weight: 1,
            name: name.map(str::to_string),
        };
        // Every pool: no port 0, no 0.0.0.0, no name with spaces.
        for bad in [
            at("10.0.0.9:0", None),
            at("0.0.0.0:11211", None),
            at("10.0.0.9:11211", Some("a b")),
            at("10.0.0.9:11211", Some("")),
        ] {
            let err = pool.add_server(bad.clone()).unwrap_err();
            assert!(
                matches!(err, PoolChangeError::BadServer(..)),
                "{bad:?}: {err}"
            );
        }
        // A proxy's pool may have a server on loopback or another port.
        pool.add_server(at("127.0.0.1:11300", None)).unwrap();
        // A switch's may not.
        let pool = three(false);
        pool.set_rules(ServerRules {
            port: Some(11211),
            refused: vec!["10.0.0.100".parse().unwrap()],
            host_addresses: true,
        });
        let version = pool.version();
        for bad in [
            at("10.0.0.9:11212", None),
            at("10.0.0.100:11211", None),
            at("127.0.0.1:11211", None),
            at("255.255.255.255:11211", None),
            at("224.0.0.1:11211", None),
            at("10.0.0.1:11211", Some("again")),
        ] {
            let err = pool.add_server(bad.clone()).unwrap_err();
            assert!(
                matches!(err, PoolChangeError::BadServer(..)),
                "{bad:?}: {err}"
            );
            // As a whole new set, the second name at 10.0.0.1 is the only server there.
            if bad.name.is_none() {
                let err = pool.check_servers(std::slice::from_ref(&bad)).unwrap_err();
                assert!(
                    matches!(err, PoolChangeError::BadServer(..)),
                    "{bad:?}: {err}"
                );
            }
        }
        assert_eq!(pool.version(), version, "nothing changed");
        // The same address twice in one set.
        let twice = [at("10.0.0.1:11211", None), at("10.0.0.1:11211", Some("b"))];
        assert!(pool.set_servers(&twice).is_err());
        pool.add_server(at("10.0.0.9:11211", None)).unwrap();
        assert_eq!(
            pool.add_server(at("10.0.0.9:11211", Some("x")))
                .unwrap_err()
                .to_string(),
            "server \"x\": 10.0.0.9 is in the pool already"
        );
    }

    fn server(i: u8, weight: u32) -> ServerSpec {
        ServerSpec {
            host: format!("10.0.0.{i}"),
            addr: SocketAddr::from(([10, 0, 0, i], 11211)),
            weight,
            name: None,
        }
    }

    #[test]
    fn a_staged_list_taken_at_once_warms_only_the_servers_new_to_the_pool() {
        let spec = PoolSpec::new(
            "p",
            SocketAddr::from(([0, 0, 0, 0], 0)),
            Distribution::Ketama,
            HashFn::Md5,
            vec![server(1, 1), server(2, 1)],
        );
        let pool = Pool::new(spec).unwrap();
        let before = pool.version();
        let until = Instant::ZERO + Duration::from_secs(60);
        // Server 2 stays (its warm-up is ignored), 1 goes, 3 comes and warms up.
        let version = pool
            .set_servers_warming(&[server(2, 1), server(3, 2)], &[Some(until), Some(until)])
            .unwrap();
        assert_eq!(version, before + 1, "one version for the whole list");
        let view = pool.view(Instant::ZERO);
        assert_eq!(view.live(), &[1, 2]);
        assert_eq!(pool.health(1).warm_until, None);
        assert_eq!(pool.health(2).warm_until, Some(until));
        assert_eq!(pool.spec().servers[2].weight, 2);
        // A list the pool refuses changes nothing.
        assert!(pool
            .set_servers_warming(&[server(2, 1), server(2, 1)], &[])
            .is_err());
        assert_eq!(pool.version(), version);
    }

    /// Where each of 2000 keys lives, as server addresses.
    fn placement(view: &View, pool: &Pool) -> Vec<Option<SocketAddr>> {
        let spec = pool.spec();
        (0..2000)
            .map(|k| {
                view.locate(format!("key:{k}").as_bytes())
                    .map(|i| spec.servers[i].addr)
            })
            .collect()
    }

    /// Where each key lives on a fresh pool of `servers`: what nutcracker would do with that
    /// list.
    fn fresh(servers: Vec<ServerSpec>, distribution: Distribution) -> Vec<Option<SocketAddr>> {
        let spec = PoolSpec::new(
            "f",
            SocketAddr::from(([0, 0, 0, 0], 0)),
            distribution,
            HashFn::Md5,
            servers,
        );
        let pool = Pool::new(spec).unwrap();
        placement(&pool.view(Instant::ZERO), &pool)
    }

    #[test]
    fn servers_added_removed_and_reweighted_place_keys_as_a_fresh_pool_would() {
        for dist in [Distribution::Ketama, Distribution::Modula] {
            let spec = PoolSpec::new(
                "p",
                SocketAddr::from(([0, 0, 0, 0], 0)),
                dist,
                HashFn::Md5,
                vec![server(1, 1), server(2, 1), server(3, 1)],
            );
            let pool = Pool::new(spec).unwrap();
            let before = placement(&pool.view(Instant::ZERO), &pool);
            let added = pool.add_server(server(4, 1)).unwrap();
            assert_eq!((added.server, added.version), (3, 1));
            let after = placement(&pool.view(Instant::ZERO), &pool);
            let four = vec![server(1, 1), server(2, 1), server(3, 1), server(4, 1)];
            assert_eq!(after, fresh(four, dist), "{dist:?}");
            if dist == Distribution::Ketama {
                // Only keys the new server takes move.
                for (b, a) in before.iter().zip(&after) {
                    assert!(b == a || *a == Some(server(4, 1).addr));
                }
            }
            pool.remove_server(1).unwrap();
            let spec = pool.spec();
            assert_eq!(spec.servers.len(), 4, "positions stay");
            assert_eq!(
                placement(&pool.view(Instant::ZERO), &pool),
                fresh(vec![server(1, 1), server(3, 1), server(4, 1)], dist)
            );
            pool.set_weight(0, 3).unwrap();
            assert_eq!(
                placement(&pool.view(Instant::ZERO), &pool),
                fresh(vec![server(1, 3), server(3, 1), server(4, 1)], dist)
            );
            // Back at its old position, last in the order.
            assert_eq!(pool.add_server(server(2, 1)).unwrap().server, 1);
            assert_eq!(
                placement(&pool.view(Instant::ZERO), &pool),
                fresh(
                    vec![server(1, 3), server(3, 1), server(4, 1), server(2, 1)],
                    dist
                )
            );
            // A whole new list, in its order.
            let list = vec![server(4, 1), server(5, 2), server(1, 1)];
            pool.set_servers(&list).unwrap();
            assert_eq!(
                placement(&pool.view(Instant::ZERO), &pool),
                fresh(list, dist)
            );
            assert!(pool.health(1).removed && pool.health(2).removed);
        }
    }

    #[test]
    fn the_same_list_twice_keeps_every_position() {
        // A named server moved to a new address: a new position the first time, the same
        // one after.
        let named = |i: u8| ServerSpec {
            name: Some("a".into()),
            ..server(i, 1)
        };
        let spec = PoolSpec::new(
            "p",
            SocketAddr::from(([0, 0, 0, 0], 0)),
            Distribution::Ketama,
            HashFn::Md5,
            vec![named(1), server(2, 1)],
        );
        let pool = Pool::new(spec).unwrap();
        let list = [named(9), server(2, 1)];
        pool.set_servers(&list).unwrap();
        let first = pool.spec().servers.len();
        assert_eq!(first, 3);
        for _ in 0..3 {
            pool.set_servers(&list).unwrap();
            assert_eq!(
                pool.spec().servers.len(),
                first,
                "a reload took a new position"
            );
        }
        assert_eq!(pool.find("a"), Some(2));
        // The live one is a duplicate, whatever removed servers share its name.
        assert_eq!(
            pool.add_server(named(7)),
            Err(PoolChangeError::Duplicate("a".into()))
        );
    }

    #[test]
    fn a_refused_change_leaves_the_pool_as_it_was() {
        let pool = three(false);
        let version = pool.version();
        assert_eq!(
            pool.add_server(server(2, 1)),
            Err(PoolChangeError::Duplicate("10.0.0.2:11211".into()))
        );
        assert_eq!(pool.set_weight(1, 0), Err(PoolChangeError::BadWeight(0)));
        pool.remove_server(2).unwrap();
        assert_eq!(
            pool.remove_server(2),
            Err(PoolChangeError::UnknownServer("2".into()))
        );
        assert_eq!(
            pool.set_servers(&[server(1, 1), server(1, 1)]),
            Err(PoolChangeError::Duplicate("10.0.0.1:11211".into()))
        );
        assert_eq!(pool.version(), version + 1);
        assert_eq!(pool.find("10.0.0.3:11211"), None);
        assert_eq!(pool.find("10.0.0.2:11211"), Some(1));
        assert_eq!(pool.find("0"), Some(0));
        // A removed server's failures change nothing.
        assert!(!pool.failed(2, Instant::ZERO));
        assert_eq!(pool.version(), version + 1);
    }

    #[test]
    fn a_server_warming_up_names_where_its_keys_were_until_it_is_warm() {
        let pool = three(false);
        let t0 = Instant::from_secs(100);
        let before = pool.view(t0);
        let fourth = ServerSpec {
            host: "10.0.0.4".into(),
            addr: SocketAddr::from(([10, 0, 0, 4], 11211)),
            weight: 1,
            name: None,
        };
        let until = t0 + Duration::from_secs(5);
        let added = pool.add_warming(fourth, Some(until)).unwrap();
        let view = pool.view(t0);
        assert_eq!(view.next_return(), Some(until));
        let mut moved = 0;
        for k in 0..2000u32 {
            let hash = view.key_hash(format!("key:{k}").as_bytes());
            let owner = view.locate_hash(hash).unwrap();
            match view.warm_source(hash) {
                Some((o, was)) => {
                    moved += 1;
                    assert_eq!(o, added.server);
                    assert_eq!(Some(was), before.locate_hash(hash), "the owner before");
                }
                None => assert_ne!(owner, added.server),
            }
        }
        assert!(moved > 200, "{moved} keys moved to the new server");
        // Warm: its keys are its own.
        let later = pool.view(until);
        assert!(later.version() > view.version());
        assert!((0..2000u32).all(|k| later
            .warm_source(later.key_hash(format!("key:{k}").as_bytes()))
            .is_none()));
        assert_eq!(pool.health(added.server).warm_until, None);
    }

    #[test]
    fn a_replicated_pool_reads_a_warming_owners_keys_from_another_replica() {
        let mut spec = three(false).spec().as_ref().clone();
        spec.replicas = 2;
        let pool = Pool::new(spec).unwrap();
        let t0 = Instant::from_secs(100);
        let s1 = pool.spec().servers[0].clone();
        pool.remove_server(0).unwrap();
        pool.add_warming(s1, Some(t0 + Duration::from_secs(5)))
            .unwrap();
        let view = pool.view(t0);
        let mut replicas = Vec::new();
        let mut moved = 0;
        for k in 0..500u32 {
            let hash = view.key_hash(format!("key:{k}").as_bytes());
            view.replicas_hash(hash, &mut replicas);
            let read = view.read_locate_hash(hash).unwrap();
            if replicas[0] == 0 {
                moved += 1;
                assert_eq!(
                    read, replicas[1],
                    "read from the replica that is not warming"
                );
            } else {
                assert_eq!(read, replicas[0]);
            }
        }
        assert!(moved > 50);
        // Warm: every read goes to its owner again.
        let view = pool.view(t0 + Duration::from_secs(5));
        for k in 0..500u32 {
            let hash = view.key_hash(format!("key:{k}").as_bytes());
            assert_eq!(view.read_locate_hash(hash), view.locate_hash(hash));
        }
    }

    /// A fence that notes each version it is told of with the version readers saw then.
    #[derive(Default)]
    struct Noting {
        pool: OnceLock<std::sync::Weak<Pool>>,
        seen: Mutex<Vec<(u64, u64, u64)>>,
    }

    impl VersionFence for Noting {
        fn before_publish(&self, version: u64) {
            let pool = self.pool.get().and_then(|p| p.upgrade()).unwrap();
            // What a router reads at this moment: the version word and the view.
            let visible = (pool.version(), pool.current().version());
            self.seen
                .lock()
                .unwrap()
                .push((version, visible.0, visible.1));
        }
    }

    #[test]
    fn the_fence_hears_of_every_version_before_any_reader_sees_it() {
        let pool = Arc::new(three(true));
        let t0 = Instant::ZERO;
        pool.set_down(0, Some(t0 + Duration::from_secs(1)));
        let fence = Arc::new(Noting::default());
        fence.pool.set(Arc::downgrade(&pool)).unwrap();
        assert!(pool.set_fence(fence.clone()));
        assert!(!pool.set_fence(Arc::new(Noting::default())), "one fence");
        // Every kind of change: the control plane's, the proxy's failures, time.
        let s2 = pool.spec().servers[1].clone();
        pool.remove_server(1).unwrap();
        pool.add_server(s2).unwrap();
        pool.set_weight(2, 3).unwrap();
        assert!(!pool.failed(2, t0));
        assert!(pool.failed(2, t0), "the second failure ejects");
        let _ = pool.view(t0 + Duration::from_secs(1)); // server 0 is due back
        pool.set_servers(&pool.spec().servers[1..]).unwrap();
        let seen = fence.seen.lock().unwrap().clone();
        // First the version in force (told on setting), then each new one, in order, each
        // while readers still saw the one before.
        assert_eq!(seen[0], (1, 1, 1));
        for (n, &(told, word, view)) in seen.iter().enumerate().skip(1) {
            assert_eq!(told, 1 + n as u64, "in order, none left out: {seen:?}");
            assert_eq!(
                (word, view),
                (told - 1, told - 1),
                "told before readers saw it"
            );
        }
        assert_eq!(seen.len(), 7, "{seen:?}");
        assert_eq!(seen.last().unwrap().0, pool.version());
    }
}
