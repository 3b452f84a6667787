//! The pool both paths route by: its servers, how keys are placed on them, and their health,
//! as one versioned state. The switch's UDP path and the proxy read it; a failure the proxy
//! sees, or a change the control plane makes, goes through [`Pool`]'s few methods and reaches
//! both, so a key has one owner whichever transport asks. No clock is read: health changes
//! carry the caller's instant.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
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
        Ring::new(self.distribution, self.hash, &self.ring_servers())
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
    /// The earliest instant at which a server that is out comes back.
    next_return: Option<Instant>,
}

impl View {
    /// The version this view shows; it grows with every change of the pool.
    pub fn version(&self) -> u64 {
        self.version
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

    /// The server that owns `key`.
    pub fn locate(&self, key: &[u8]) -> Option<usize> {
        self.locate_hash(self.key_hash(key))
    }

    /// When this view stops being true without any other change: a server that is out is
    /// due back then.
    pub fn next_return(&self) -> Option<Instant> {
        self.next_return
    }
}

/// A pool and its servers' health, shared by every path that routes by it.
#[derive(Debug)]
pub struct Pool {
    spec: PoolSpec,
    /// The current view's version, readable without a lock.
    version: AtomicU64,
    health: Mutex<Vec<Health>>,
    view: RwLock<Arc<View>>,
}

impl Pool {
    /// A pool with every server in the ring.
    pub fn new(spec: PoolSpec) -> Result<Pool, RouteError> {
        let health = vec![Health::default(); spec.servers.len()];
        let view = build_view(&spec, &health, 0)?;
        Ok(Pool {
            spec,
            version: AtomicU64::new(0),
            health: Mutex::new(health),
            view: RwLock::new(Arc::new(view)),
        })
    }

    pub fn spec(&self) -> &PoolSpec {
        &self.spec
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
        self.lock_health().get(i).copied().unwrap_or_default()
    }

    /// Whether server `i` is out of the ring at `now`.
    pub fn is_down(&self, i: usize, now: Instant) -> bool {
        self.health(i).down_until.is_some_and(|t| t > now)
    }

    /// Records a failure of server `i` (a refused connect, a lost connection, a timeout); with
    /// `auto_eject_hosts`, the `server_failure_limit`-th in a row takes it out of the ring for
    /// `server_retry_timeout`. Returns whether this failure took it out.
    pub fn failed(&self, i: usize, now: Instant) -> bool {
        let (limit, retry, eject) = (
            self.spec.server_failure_limit.max(1),
            self.spec.server_retry_timeout,
            self.spec.auto_eject_hosts,
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
            let out = h.down_until.is_some_and(|t| t > now);
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
        let mut health = self.lock_health();
        if let Some(h) = health.get_mut(i) {
            h.failure_streak = 0;
        }
    }

    /// Takes server `i` out of the ring until `until`, or puts it back (`None`): the one door
    /// through which an operator or a controller changes the pool's health. Returns the new
    /// version (the same if nothing changed).
    pub fn set_down(&self, i: usize, until: Option<Instant>) -> u64 {
        self.change(|health| match health.get_mut(i) {
            Some(h) if h.down_until != until => {
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

    fn lock_health(&self) -> MutexGuard<'_, Vec<Health>> {
        match self.health.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Applies `f` to the health of every server; if it says the ring changed, publishes a
    /// new view under the next version. The health lock is held throughout, so versions are
    /// published in order.
    fn change(&self, f: impl FnOnce(&mut Vec<Health>) -> bool) {
        let mut health = self.lock_health();
        if !f(&mut health) {
            return;
        }
        let version = self.version.load(Ordering::Acquire) + 1;
        // The servers are those the pool was built with; a ring over a subset always builds
        // (an empty one is `None`).
        let view = build_view(&self.spec, &health, version).unwrap_or_else(|_| View {
            version,
            ring: None,
            live: Vec::new(),
            hash: self.spec.hash,
            hash_tag: self.spec.hash_tag,
            next_return: None,
        });
        match self.view.write() {
            Ok(mut v) => *v = Arc::new(view),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(view),
        }
        self.version.store(version, Ordering::Release);
    }
}

/// The view of `spec` with the servers `health` has in the ring.
fn build_view(spec: &PoolSpec, health: &[Health], version: u64) -> Result<View, RouteError> {
    let live: Vec<usize> = (0..spec.servers.len())
        .filter(|&i| health[i].down_until.is_none())
        .collect();
    let servers: Vec<Server> = live
        .iter()
        .map(|&i| Server::new(spec.servers[i].ring_name(), spec.servers[i].weight))
        .collect();
    let ring = match servers.is_empty() {
        true => None,
        false => Some(Ring::new(spec.distribution, spec.hash, &servers)?),
    };
    Ok(View {
        version,
        ring,
        live,
        hash: spec.hash,
        hash_tag: spec.hash_tag,
        next_return: health.iter().filter_map(|h| h.down_until).min(),
    })
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
}
