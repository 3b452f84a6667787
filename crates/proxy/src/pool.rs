//! The pools the proxy serves: each a listening address and its servers, with nutcracker's
//! failure-handling options, and the servers' health. The pool itself, shared with the
//! switch's UDP path when the proxy runs inside the switch, is [`switch::pool`]; the files it
//! is read from are the `config` crate's. [`PoolRt`] is a pool as one worker sees it: its
//! connections to the servers and the view it routes by.

use std::cell::{Cell, RefCell};
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::Arc;

use switch::cache::CacheService;

use super::backend::Conn;
use super::plan::{Router, Wire};
use super::sasl::Sasl;
use super::stats::{PoolStats, ProxyStats};
use super::tls::ServerTls;

pub use switch::pool::{
    Pool, PoolSpec, ServerSpec, View, DEFAULT_FAILURE_LIMIT, DEFAULT_RETRY_TIMEOUT,
    DEFAULT_SERVER_CONNECTIONS, DEFAULT_TIMEOUT,
};

/// One pool as one worker sees it.
pub(crate) struct PoolRt {
    pub stats: Arc<PoolStats>,
    /// The whole proxy's counters: client connections and reply bytes over every pool.
    pub proxy: Arc<ProxyStats>,
    /// Per server, its connections by [`Wire`] (text, binary, RESP2, RESP3), made when first
    /// needed.
    conns: Vec<RefCell<[Vec<Rc<Conn>>; 4]>>,
    source: Option<IpAddr>,
    /// TLS towards the servers.
    server_tls: Option<Arc<ServerTls>>,
    /// SASL towards the servers.
    sasl: Option<Arc<Sasl>>,
    /// The pool as this worker routes by it now.
    view: RefCell<Arc<View>>,
    /// The cache that answers this pool's hot keys.
    pub cache: Option<Arc<CacheService>>,
    /// A Redis Cluster pool's slots, as this worker knows them.
    cluster: Option<Cluster>,
    /// Clients served so far, for their connection affinity.
    clients: Cell<usize>,
}

/// A Redis Cluster's slots as one worker knows them: learned from the cluster (`CLUSTER
/// SLOTS`, asked by `redis::cluster`) and from its redirections. A slot not known yet goes to
/// the first live server, whose `MOVED` then says where it lives.
pub(crate) struct Cluster {
    /// Per slot, the pool's server that holds it, or [`UNKNOWN`].
    owner: RefCell<Vec<u16>>,
    /// Wakes the task that asks the cluster for its slots.
    pub wanted: tokio::sync::Notify,
}

const UNKNOWN: u16 = u16::MAX;

impl PoolRt {
    pub fn new(
        proxy: Arc<ProxyStats>,
        index: usize,
        source: Option<IpAddr>,
        (server_tls, sasl): (Option<Arc<ServerTls>>, Option<Arc<Sasl>>),
        cache: Option<Arc<CacheService>>,
    ) -> Rc<PoolRt> {
        let stats = proxy.pools[index].clone();
        let view = stats.pool.view(kvio::clock::now());
        // Room for servers added at run time.
        let conns = (0..stats.spec.servers.len().max(switch::pool::MAX_SERVERS))
            .map(|_| RefCell::new(Default::default()))
            .collect();
        let cluster = stats
            .spec
            .redis
            .as_ref()
            .filter(|r| r.cluster)
            .map(|_| Cluster {
                owner: RefCell::new(vec![UNKNOWN; wire::resp::SLOTS]),
                wanted: tokio::sync::Notify::new(),
            });
        Rc::new(PoolRt {
            stats,
            proxy,
            conns,
            source,
            server_tls,
            sasl,
            view: RefCell::new(view),
            cache,
            cluster,
            clients: Cell::new(0),
        })
    }

    pub fn cluster(&self) -> Option<&Cluster> {
        self.cluster.as_ref()
    }

    pub fn source(&self) -> Option<IpAddr> {
        self.source
    }

    pub fn server_tls(&self) -> Option<&Arc<ServerTls>> {
        self.server_tls.as_ref()
    }

    /// SASL towards the servers, which also answers the clients' SASL requests.
    pub fn sasl(&self) -> Option<&Arc<Sasl>> {
        self.sasl.as_ref()
    }

    /// The server that holds cluster slot `slot`, if known.
    pub fn slot_owner(&self, slot: u16) -> Option<usize> {
        let owner = *self.cluster.as_ref()?.owner.borrow().get(slot as usize)?;
        (owner != UNKNOWN).then_some(owner as usize)
    }

    /// Slots `slots` live on `server` now.
    pub fn learn_slots(&self, slots: std::ops::RangeInclusive<u16>, server: usize) {
        if let Some(cluster) = &self.cluster {
            let mut owner = cluster.owner.borrow_mut();
            for slot in slots {
                if let Some(o) = owner.get_mut(slot as usize) {
                    *o = server as u16;
                }
            }
        }
    }

    /// The pool's server at `addr`: a cluster node the pool has not seen is added to it (as a
    /// server of its own, for its connections and counters). `None` when the pool is full.
    pub fn server_at(&self, addr: std::net::SocketAddr) -> Option<usize> {
        let pool = &self.stats.pool;
        let find = || pool.spec().servers.iter().position(|s| s.addr == addr);
        if let Some(i) = find() {
            return Some(i);
        }
        let node = switch::pool::ServerSpec {
            host: addr.ip().to_string(),
            addr,
            weight: 1,
            name: None,
        };
        if let Err(e) = pool.add_server(node) {
            tracing::warn!(pool = %self.stats.spec.name, node = %addr, "cluster node not added: {e}");
        }
        find()
    }

    /// The connection to `server` for `wire` that a client of `affinity` uses: one of the
    /// pool's `server_connections`, by the client, made when first needed. A client's
    /// requests to one server all take one connection, so they reach the server in the
    /// order the client sent them (a set, then a get of the same key, must not be
    /// overtaken); the clients are spread over the connections.
    pub fn conn(&self, server: usize, wire: Wire, affinity: usize) -> Rc<Conn> {
        let mut conns = self.conns[server].borrow_mut();
        let list = &mut conns[wire as usize];
        let index = affinity % self.stats.spec.server_connections.max(1);
        while list.len() <= index {
            list.push(Conn::new(
                self.stats.clone(),
                server,
                wire,
                self.source,
                self.server_tls.clone(),
                self.sasl.clone(),
            ));
        }
        list[index].clone()
    }

    /// A number for a new client: its connection affinity.
    pub fn next_affinity(&self) -> usize {
        let n = self.clients.get();
        self.clients.set(n.wrapping_add(1));
        n
    }

    pub fn router(self: &Rc<Self>) -> PoolRouter {
        self.refresh();
        PoolRouter { pool: self.clone() }
    }

    /// Takes the pool's view again when it changed (a server ejected here, in another
    /// worker or by the control plane) or a server is due back.
    fn refresh(&self) {
        let now = kvio::clock::now();
        let mut view = self.view.borrow_mut();
        let due = view.next_return().is_some_and(|t| t <= now);
        if view.version() != self.stats.pool.version() || due {
            *view = self.stats.pool.view(now);
        }
    }
}

/// Places keys for one batch of requests.
pub(crate) struct PoolRouter {
    pool: Rc<PoolRt>,
}

impl PoolRouter {
    /// Where a read of `key` goes, without counting it as routed (for the cache's hot-key
    /// detection, which sees reads it may answer itself).
    pub(crate) fn peek(&self, key: &[u8]) -> Option<usize> {
        self.pool.view.borrow().read_locate(key)
    }
}

impl Router for PoolRouter {
    fn locate(&mut self, key: &[u8]) -> Option<usize> {
        // Used for reads (writes go to `replicas`): a replicated pool reads a warming owner's
        // keys from another replica, except the one-key gets that warm it.
        let view = self.pool.view.borrow();
        let hash = view.key_hash(key);
        view.count(hash);
        view.read_locate_hash(hash)
    }

    fn live(&self) -> Vec<usize> {
        self.pool.view.borrow().live().to_vec()
    }

    fn replicas(&mut self, key: &[u8], out: &mut Vec<usize>) {
        let view = self.pool.view.borrow();
        let hash = view.key_hash(key);
        view.count(hash);
        view.replicas_hash(hash, out);
    }

    fn warm_source(&mut self, key: &[u8]) -> Option<(usize, usize)> {
        let view = self.pool.view.borrow();
        view.warm_source(view.key_hash(key))
    }
}
