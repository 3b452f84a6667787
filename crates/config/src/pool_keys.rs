//! Pool settings shared by the three file formats: the switch's TOML, the proxy's TOML and
//! nutcracker's YAML. Each format names its keys its own way and calls these checks, so ranges
//! and messages are the same everywhere. An error ([`KeyError`], [`ResolveError`],
//! [`ServersError`]) says what is wrong with the value; the caller adds the file and the key.
//! Nothing here reads a file.

use std::net::{SocketAddr, ToSocketAddrs};
use std::ops::RangeInclusive;
use std::time::Duration;

use kv::{Distribution, HashFn, RouteError};
use serde::Deserialize;

use switch::pool::{
    PoolSpec, RedisSpec, DEFAULT_FAILURE_LIMIT, DEFAULT_RETRY_TIMEOUT, DEFAULT_SERVER_CONNECTIONS,
    DEFAULT_TIMEOUT, MAX_NAME_LEN,
};

/// Per-request timeout, in milliseconds: up to an hour.
pub(crate) const TIMEOUT_MS: RangeInclusive<u64> = 1..=3_600_000;
/// Consecutive failures before a server is ejected.
pub(crate) const FAILURE_LIMIT: RangeInclusive<u64> = 1..=1_000;
/// How long an ejected server stays out, in milliseconds: up to an hour.
pub(crate) const RETRY_TIMEOUT_MS: RangeInclusive<u64> = 1..=3_600_000;
/// Connections each worker keeps to each server.
pub(crate) const SERVER_CONNECTIONS: RangeInclusive<u64> = 1..=64;
/// Servers each key is kept on.
pub(crate) const REPLICAS: RangeInclusive<u64> = 1..=8;

/// The `[pool]` table of both TOML files, before validation. The switch refuses what only the
/// proxy can do (`hash_tag`); the proxy refuses what only the switch uses (a server's `mac`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPool {
    #[serde(default)]
    pub distribution: Option<String>,
    #[serde(default)]
    pub hash: Option<String>,
    #[serde(default)]
    pub hash_tag: Option<String>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    #[serde(default)]
    pub auto_eject_hosts: Option<bool>,
    #[serde(default)]
    pub server_failure_limit: Option<u64>,
    #[serde(default)]
    pub server_retry_timeout_ms: Option<u64>,
    #[serde(default)]
    pub server_connections: Option<u64>,
    #[serde(default)]
    pub replicas: Option<u64>,
    /// A Redis pool (nutcracker's `redis`, `redis_auth` and `redis_db`).
    #[serde(default)]
    pub redis: Option<bool>,
    #[serde(default)]
    pub redis_auth: Option<String>,
    #[serde(default)]
    pub redis_db: Option<u64>,
    pub servers: Vec<RawServer>,
}

/// One `[[pool.servers]]` entry of either TOML file, before validation.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawServer {
    pub addr: String,
    #[serde(default)]
    pub mac: Option<String>,
    #[serde(default)]
    pub weight: Option<u32>,
    #[serde(default)]
    pub name: Option<String>,
}

/// A pool's validated settings other than its name, address and servers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct PoolKeys {
    pub distribution: Distribution,
    pub hash: HashFn,
    pub hash_tag: Option<[u8; 2]>,
    pub timeout: Duration,
    pub auto_eject_hosts: bool,
    pub server_failure_limit: u32,
    pub server_retry_timeout: Duration,
    pub server_connections: usize,
    pub replicas: usize,
}

impl Default for PoolKeys {
    /// nutcracker's defaults, except the timeout (see [`DEFAULT_TIMEOUT`]).
    fn default() -> PoolKeys {
        PoolKeys {
            distribution: Distribution::Ketama,
            hash: HashFn::Md5,
            hash_tag: None,
            timeout: DEFAULT_TIMEOUT,
            auto_eject_hosts: false,
            server_failure_limit: DEFAULT_FAILURE_LIMIT,
            server_retry_timeout: DEFAULT_RETRY_TIMEOUT,
            server_connections: DEFAULT_SERVER_CONNECTIONS,
            replicas: 1,
        }
    }
}

impl PoolKeys {
    /// Validates the settings of a TOML `[pool]`; the error is the failing key (without the
    /// `pool.` prefix) and what is wrong with its value.
    pub fn from_toml(raw: &RawPool) -> Result<PoolKeys, (&'static str, KeyError)> {
        let mut keys = PoolKeys::default();
        if let Some(d) = &raw.distribution {
            keys.distribution = distribution(d).map_err(|e| ("distribution", e))?;
        }
        if let Some(h) = &raw.hash {
            keys.hash = hash(h).map_err(|e| ("hash", e))?;
        }
        if let Some(t) = &raw.hash_tag {
            keys.hash_tag = Some(hash_tag(t).map_err(|e| ("hash_tag", e))?);
        }
        if let Some(ms) = raw.timeout_ms {
            keys.timeout = timeout_ms(ms).map_err(|e| ("timeout_ms", e))?;
        }
        if let Some(on) = raw.auto_eject_hosts {
            keys.auto_eject_hosts = on;
        }
        if let Some(n) = raw.server_failure_limit {
            keys.server_failure_limit =
                failure_limit(n).map_err(|e| ("server_failure_limit", e))?;
        }
        if let Some(ms) = raw.server_retry_timeout_ms {
            keys.server_retry_timeout =
                retry_timeout_ms(ms).map_err(|e| ("server_retry_timeout_ms", e))?;
        }
        if let Some(n) = raw.server_connections {
            keys.server_connections =
                server_connections(n).map_err(|e| ("server_connections", e))?;
        }
        if let Some(n) = raw.replicas {
            keys.replicas = in_range(n, &REPLICAS, "").map_err(|e| ("replicas", e))? as usize;
            if n > 1 && keys.distribution != Distribution::Ketama {
                return Err((
                    "replicas",
                    KeyError::ReplicasNeedKetama(n, keys.distribution),
                ));
            }
        }
        Ok(keys)
    }

    /// Copies these settings into `pool`.
    pub fn apply(&self, pool: &mut PoolSpec) {
        pool.distribution = self.distribution;
        pool.hash = self.hash;
        pool.hash_tag = self.hash_tag;
        pool.timeout = self.timeout;
        pool.auto_eject_hosts = self.auto_eject_hosts;
        pool.server_failure_limit = self.server_failure_limit;
        pool.server_retry_timeout = self.server_retry_timeout;
        pool.server_connections = self.server_connections;
        pool.replicas = self.replicas;
    }
}

/// How kvswitch's `host:port` is written, for the messages of [`host_port`].
const HOST_PORT_USAGE: &str =
    "use host:port, such as 10.0.0.1:11211, cache1.example:11211 or [::1]:11211";

/// Why the value of a pool key was refused. The message says what is wrong with the value; the
/// caller adds the file and the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum KeyError {
    /// A number outside its key's range; `unit` follows the range in the message.
    #[error("{value} is out of range; use {min} to {max}{unit}")]
    OutOfRange {
        value: u64,
        min: u64,
        max: u64,
        unit: &'static str,
    },
    #[error(transparent)]
    Distribution(RouteError),
    #[error(transparent)]
    Hash(kv::UnknownHash),
    /// A hash tag that is not two characters.
    #[error("`{0}` is not a hash tag: it must be exactly two characters, such as \"{{}}\"")]
    HashTag(String),
    #[error("weight must be at least 1")]
    ZeroWeight,
    /// A Redis pool's key in a memcached pool.
    #[error("only valid in a Redis pool (redis = true)")]
    RedisOnly,
    #[error("an empty password; remove the key for none")]
    EmptyAuth,
    /// Replication asked of a Redis pool, whose proxy sends each key to one server.
    #[error("a Redis pool keeps each key on one server; use replicas = 1")]
    RedisReplicas,
    /// Replication over a distribution that moves every key when a server leaves.
    #[error(
        "{0} replicas over distribution {1}: a replicated pool needs distribution = \"ketama\", \
         where a server's keys go to their next replica when it leaves"
    )]
    ReplicasNeedKetama(u64, Distribution),
    #[error("weight {0} is too large; use 1 to {max}", max = u32::MAX)]
    WeightTooLarge(u64),
    /// A server name that is empty, too long or holds a space.
    #[error("`{0}` must be 1 to {MAX_NAME_LEN} characters without spaces")]
    ServerName(String),
    /// A `host:port` without a `:`.
    #[error("`{0}` has no port; {HOST_PORT_USAGE}")]
    NoPort(String),
    /// A `host:port` whose host is an IPv6 address without brackets, or badly bracketed.
    #[error("`{0}`: an IPv6 address is written in brackets; {HOST_PORT_USAGE}")]
    Brackets(String),
    /// A `host:port` with an empty host, or one with a space.
    #[error("`{0}` has no host; {HOST_PORT_USAGE}")]
    NoHost(String),
    /// Text that is not a port from 1 to 65535.
    #[error("`{0}` is not a port from 1 to 65535")]
    Port(String),
    /// A `host:port` (`text`) whose port is not one.
    #[error("`{text}`: `{port}` is not a port from 1 to 65535")]
    HostPort { text: String, port: String },
}

/// Why [`resolve`] found no address for a host.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ResolveError {
    #[error("`{0}` resolves to no address")]
    NoAddress(String),
    /// The system resolver failed; `error` is its answer.
    #[error("cannot resolve `{host}`: {error}")]
    Failed { host: String, error: std::io::Error },
}

/// Why a pool's list of servers was refused as a whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ServersError {
    #[error("at least one server is needed")]
    Empty,
    /// Server `server` has the ring name `name` of server `first`.
    #[error("ring name `{name}` is already used by server {first}; give one of them a name")]
    NameTwice {
        server: usize,
        first: usize,
        name: String,
    },
    /// The ring does not build.
    #[error(transparent)]
    Ring(RouteError),
}

impl ServersError {
    /// The index of the server at fault, when one is.
    pub fn server(&self) -> Option<usize> {
        match *self {
            ServersError::Empty => None,
            ServersError::NameTwice { server, .. } => Some(server),
            ServersError::Ring(
                RouteError::ZeroWeight { server } | RouteError::NameTooLong { server, .. },
            ) => Some(server),
            ServersError::Ring(RouteError::DuplicateName { second, .. }) => Some(second),
            ServersError::Ring(_) => None,
        }
    }
}

fn in_range(value: u64, range: &RangeInclusive<u64>, unit: &'static str) -> Result<u64, KeyError> {
    if range.contains(&value) {
        Ok(value)
    } else {
        Err(KeyError::OutOfRange {
            value,
            min: *range.start(),
            max: *range.end(),
            unit,
        })
    }
}

pub(crate) fn distribution(name: &str) -> Result<Distribution, KeyError> {
    name.parse().map_err(KeyError::Distribution)
}

pub(crate) fn hash(name: &str) -> Result<HashFn, KeyError> {
    name.parse().map_err(KeyError::Hash)
}

/// nutcracker's rule: exactly two bytes, the opening and the closing one.
pub(crate) fn hash_tag(text: &str) -> Result<[u8; 2], KeyError> {
    match text.as_bytes() {
        &[open, close] => Ok([open, close]),
        _ => Err(KeyError::HashTag(text.to_owned())),
    }
}

pub(crate) fn timeout_ms(ms: u64) -> Result<Duration, KeyError> {
    in_range(ms, &TIMEOUT_MS, " ms").map(Duration::from_millis)
}

pub(crate) fn failure_limit(n: u64) -> Result<u32, KeyError> {
    // The range keeps it far below u32::MAX.
    in_range(n, &FAILURE_LIMIT, "").map(|n| n as u32)
}

pub(crate) fn retry_timeout_ms(ms: u64) -> Result<Duration, KeyError> {
    in_range(ms, &RETRY_TIMEOUT_MS, " ms").map(Duration::from_millis)
}

pub(crate) fn server_connections(n: u64) -> Result<usize, KeyError> {
    in_range(n, &SERVER_CONNECTIONS, " per worker").map(|n| n as usize)
}

pub(crate) fn weight(w: u64) -> Result<u32, KeyError> {
    match u32::try_from(w) {
        Ok(0) => Err(KeyError::ZeroWeight),
        Ok(w) => Ok(w),
        Err(_) => Err(KeyError::WeightTooLarge(w)),
    }
}

/// An explicit server name: the server's identity on the ring.
pub(crate) fn server_name(name: &str) -> Result<(), KeyError> {
    if switch::pool::valid_server_name(name) {
        Ok(())
    } else {
        Err(KeyError::ServerName(name.to_owned()))
    }
}

/// Splits kvswitch's `host:port`: a hostname, an IPv4 address or a bracketed IPv6 address,
/// then a port from 1 to 65535. Returns the host without brackets, which is the text the ring
/// hashes (nutcracker writes the same IPv6 server as `::1:11211:1`, without brackets).
pub(crate) fn host_port(text: &str) -> Result<(&str, u16), KeyError> {
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(KeyError::NoPort(text.to_owned()));
    };
    let host = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(inner) if !inner.is_empty() => inner,
        _ if host.contains(['[', ']', ':']) => return Err(KeyError::Brackets(text.to_owned())),
        _ => host,
    };
    if host.is_empty() || host.contains(char::is_whitespace) {
        return Err(KeyError::NoHost(text.to_owned()));
    }
    let port = port_number(port).map_err(|_| KeyError::HostPort {
        text: text.to_owned(),
        port: port.to_owned(),
    })?;
    Ok((host, port))
}

/// A port number as nutcracker accepts it: decimal digits, 1 to 65535.
pub(crate) fn port_number(text: &str) -> Result<u16, KeyError> {
    match text.parse::<u16>() {
        Ok(p) if p != 0 && text.bytes().all(|b| b.is_ascii_digit()) => Ok(p),
        _ => Err(KeyError::Port(text.to_owned())),
    }
}

/// Resolves `host` (a name or an address literal) with the system resolver and takes the
/// first address, as nutcracker does.
pub(crate) fn resolve(host: &str, port: u16) -> Result<SocketAddr, ResolveError> {
    match (host, port).to_socket_addrs() {
        Ok(mut addrs) => addrs
            .next()
            .ok_or_else(|| ResolveError::NoAddress(host.to_owned())),
        Err(error) => Err(ResolveError::Failed {
            host: host.to_owned(),
            error,
        }),
    }
}

/// Checks a pool's servers as a whole: at least one, no ring name twice (nutcracker refuses
/// both), and a ring that builds. [`ServersError::server`] names the server at fault.
pub(crate) fn check_servers(pool: &PoolSpec) -> Result<(), ServersError> {
    if pool.servers.is_empty() {
        return Err(ServersError::Empty);
    }
    for (i, s) in pool.servers.iter().enumerate() {
        let name = s.ring_name();
        if let Some(first) = pool.servers[..i].iter().position(|t| t.ring_name() == name) {
            return Err(ServersError::NameTwice {
                server: i,
                first,
                name,
            });
        }
    }
    pool.ring().map(drop).map_err(ServersError::Ring)
}

/// A TOML `[pool]`'s Redis settings: `None` for a memcached pool. The error is the failing key
/// (without the `pool.` prefix) and what is wrong with its value.
pub(crate) fn redis_toml(raw: &RawPool) -> Result<Option<RedisSpec>, (&'static str, KeyError)> {
    if raw.redis != Some(true) {
        return match (&raw.redis_auth, raw.redis_db) {
            (Some(_), _) => Err(("redis_auth", KeyError::RedisOnly)),
            (_, Some(_)) => Err(("redis_db", KeyError::RedisOnly)),
            _ => Ok(None),
        };
    }
    if raw.replicas.is_some_and(|n| n > 1) {
        return Err(("replicas", KeyError::RedisReplicas));
    }
    if raw.redis_auth.as_deref() == Some("") {
        return Err(("redis_auth", KeyError::EmptyAuth));
    }
    let db = match raw.redis_db {
        Some(n) => in_range(n, &(0..=u64::from(u32::MAX)), "").map_err(|e| ("redis_db", e))? as u32,
        None => 0,
    };
    Ok(Some(RedisSpec {
        auth: raw.redis_auth.clone(),
        db,
        cluster: false,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_forms() {
        assert_eq!(host_port("10.0.0.1:11211"), Ok(("10.0.0.1", 11211)));
        assert_eq!(
            host_port("cache-1.example:7000"),
            Ok(("cache-1.example", 7000))
        );
        assert_eq!(host_port("[::1]:11211"), Ok(("::1", 11211)));
        for bad in [
            "10.0.0.1",
            ":11211",
            "::1:11211",
            "[]:11211",
            "[::1:11211",
            "host:0",
            "host:65536",
            "host:+80",
            "host:",
            "a b:80",
        ] {
            assert!(host_port(bad).is_err(), "{bad} accepted");
        }
        assert_eq!(
            host_port("::1:11211"),
            Err(KeyError::Brackets("::1:11211".into()))
        );
        assert_eq!(
            host_port("host:+80").unwrap_err().to_string(),
            "`host:+80`: `+80` is not a port from 1 to 65535"
        );
    }

    #[test]
    fn ranges() {
        assert_eq!(timeout_ms(1), Ok(Duration::from_millis(1)));
        assert_eq!(
            timeout_ms(0).unwrap_err().to_string(),
            "0 is out of range; use 1 to 3600000 ms"
        );
        assert!(timeout_ms(3_600_001).is_err());
        assert_eq!(failure_limit(2), Ok(2));
        assert!(failure_limit(0).is_err());
        assert!(retry_timeout_ms(0).is_err());
        assert_eq!(server_connections(64), Ok(64));
        assert!(server_connections(0).is_err());
        assert!(server_connections(65).is_err());
        assert!(weight(0).is_err());
        assert!(weight(1 << 32).is_err());
        assert_eq!(hash_tag("{}"), Ok(*b"{}"));
        assert!(hash_tag("{").is_err());
        assert!(hash_tag("{{}").is_err());
        assert_eq!(
            distribution("random"),
            Err(KeyError::Distribution(RouteError::RandomDistribution))
        );
        assert_eq!(
            hash("sha1"),
            Err(KeyError::Hash(kv::UnknownHash("sha1".into())))
        );
    }

    fn pool(names: &[&str]) -> PoolSpec {
        let servers = names
            .iter()
            .enumerate()
            .map(|(i, n)| switch::pool::ServerSpec {
                host: format!("10.0.0.{i}"),
                addr: SocketAddr::from(([10, 0, 0, i as u8], 11211)),
                weight: 1,
                name: Some(n.to_string()),
            })
            .collect();
        PoolSpec::new(
            "t",
            crate::proxy::UNSET_LISTEN,
            Distribution::Jump,
            HashFn::Md5,
            servers,
        )
    }

    #[test]
    fn server_list_checks() {
        assert_eq!(check_servers(&pool(&["a", "b"])), Ok(()));
        let e = check_servers(&pool(&[])).unwrap_err();
        assert_eq!((e.server(), &e), (None, &ServersError::Empty));
        // Duplicate names are refused for every distribution, jump included.
        let e = check_servers(&pool(&["a", "b", "a"])).unwrap_err();
        assert_eq!(e.server(), Some(2));
        assert_eq!(
            e.to_string(),
            "ring name `a` is already used by server 0; give one of them a name"
        );
        // Too long for nutcracker's ketama point buffer.
        let long = "x".repeat(84);
        let mut p = pool(&["a", &long]);
        p.distribution = Distribution::Ketama;
        let e = check_servers(&p).unwrap_err();
        assert_eq!(e.server(), Some(1));
        assert!(
            matches!(e, ServersError::Ring(RouteError::NameTooLong { .. })),
            "{e}"
        );
    }

    #[test]
    fn resolves_names_and_literals() {
        assert_eq!(
            resolve("127.0.0.1", 80).ok(),
            Some(SocketAddr::from(([127, 0, 0, 1], 80)))
        );
        assert!(resolve("::1", 80).is_ok_and(|a| a.is_ipv6()));
        assert!(resolve("localhost", 80).is_ok_and(|a| a.ip().is_loopback()));
        let e = resolve("no-such-host.invalid", 80).unwrap_err().to_string();
        assert!(
            e.starts_with("cannot resolve `no-such-host.invalid`: "),
            "{e}"
        );
    }
}
