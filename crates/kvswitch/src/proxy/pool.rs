//! What the proxy serves: pools of memcached servers, each behind one listening address, with
//! nutcracker's failure-handling options.
//!
//! The files a pool comes from are read in [`crate::config`]; their entry points are
//! re-exported here: [`load_toml`] (kvswitch's proxy TOML, or a switch configuration's pool)
//! and [`load_nutcracker`] (a nutcracker YAML file, every pool of it).

use std::net::SocketAddr;
use std::time::Duration;

use kv::{Distribution, HashFn, Ring, RouteError, Server};

pub use crate::config::nutcracker::{load_nutcracker, parse_nutcracker};
pub use crate::config::proxy::{load_toml, parse_toml, ProxyFile, PROXY_EXAMPLE, UNSET_LISTEN};

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
        let Some([open, close]) = self.hash_tag else {
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

    /// The pool's servers as the hash ring sees them: ring names and weights, in
    /// configuration order.
    pub fn ring_servers(&self) -> Vec<Server> {
        self.servers
            .iter()
            .map(|s| Server::new(s.ring_name(), s.weight))
            .collect()
    }

    /// Builds the pool's ring; indexes it returns are positions in [`PoolSpec::servers`].
    /// Place a key with `ring.locate(pool.hashed_key(key))`. A pool read by this crate's
    /// loaders always builds; the errors are [`Ring::new`]'s.
    pub fn ring(&self) -> Result<Ring, RouteError> {
        Ring::new(self.distribution, self.hash, &self.ring_servers())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tagged(tag: Option<&[u8; 2]>) -> PoolSpec {
        let mut pool = PoolSpec::new(
            "t",
            UNSET_LISTEN,
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
}
