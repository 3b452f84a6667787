//! nutcracker's (twemproxy's) YAML configuration, read into [`PoolSpec`]s, so that a fleet
//! moves from nutcracker to kvswitch with the same file and every key stays where it was.
//!
//! ```yaml
//! alpha:
//!   listen: 127.0.0.1:22121
//!   hash: fnv1a_64
//!   hash_tag: "{}"
//!   distribution: ketama
//!   timeout: 400
//!   auto_eject_hosts: true
//!   server_retry_timeout: 2000
//!   server_failure_limit: 1
//!   servers:
//!    - 127.0.0.1:11211:1
//!    - cache2.example:11212:2 beta
//! ```
//!
//! Each pool key is read as nutcracker reads it, as text, and mapped so:
//!
//! - `listen`: `host:port`, the host a name or an address (split at the last `:`, as
//!   nutcracker does, so `::1:22121` is IPv6), resolved when the file is loaded. A unix socket
//!   path (`/path` or `/path perm`) is refused: the proxy listens on TCP only.
//! - `hash`, `distribution`, `hash_tag`: the same names and meaning; `random` is refused,
//!   since a cache needs a key to stay on one server.
//! - `timeout` (ms): absent, or 0, means no timeout in nutcracker; kvswitch bounds every
//!   request, so it takes [`DEFAULT_TIMEOUT`] (1 s) instead.
//! - `auto_eject_hosts`, `server_failure_limit`, `server_retry_timeout` (ms),
//!   `server_connections`: the same, with the proxy TOML's ranges; a failure limit of 0
//!   ejects on the first failure in nutcracker, so it is read as 1.
//! - `servers`: `host:port:weight [name]`, split from the right as nutcracker splits it. The
//!   host as written (not its address) is the server's ring identity, so `localhost:11212:1`
//!   and `127.0.0.1:11212:1` place keys differently, as in nutcracker. Hosts are resolved at
//!   load time (nutcracker resolves at each connect), so a name that does not resolve fails
//!   the load. Unix socket servers are refused.
//! - `redis`: `true` makes a Redis pool, whose servers speak RESP; `redis_auth` (the password
//!   the servers want, which clients must give the proxy too) and `redis_db` (the database
//!   selected on every server connection) are its own. In a memcached pool `redis_auth` is
//!   refused, as nutcracker refuses it, and `redis_db` is ignored, as nutcracker ignores it.
//! - `redis_cluster` (kvswitch's own; nutcracker has no such key): `true` makes a Redis pool's
//!   servers the nodes of one Redis Cluster, asked for its slots; keys go where the cluster
//!   keeps them, and `hash`, `distribution` and `hash_tag` do not place them. Only database 0
//!   exists in a cluster, so `redis_db` must be 0.
//! - `client_connections`: the most client connections the pool holds at once (0 or absent:
//!   no cap of the pool's own; the proxy's cap, from the descriptor limit, still holds). Read
//!   by [`client_connections`]; past it a connection is accepted and closed at once.
//! - `backlog`, `preconnect`, `tcpkeepalive`: checked for type and ignored. They tune
//!   nutcracker's own sockets (listen backlog; connecting at start; keepalive) and change
//!   neither where a key goes nor what a client sees.
//!
//! Any other key is refused, as nutcracker refuses it. Errors name the file, the pool and
//! key (`alpha.servers[1]`), and the problem.

use std::net::SocketAddr;
use std::path::Path;

use serde_norway::Value;

use super::pool_keys::{self, KeyError, PoolKeys, ResolveError, ServersError};
use super::ConfigError;
use switch::pool::{PoolSpec, RedisSpec, ServerSpec, DEFAULT_TIMEOUT};

/// Reads every pool of a nutcracker configuration file, in file order.
pub fn load_nutcracker(path: &Path) -> Result<Vec<PoolSpec>, ConfigError> {
    let text = crate::read_file(path)
        .map_err(|e| ConfigError::new(path, "", format!("cannot read: {e}")))?;
    parse_nutcracker(&text, path)
}

/// Parses nutcracker YAML as [`load_nutcracker`] does; `path` is used in messages.
pub fn parse_nutcracker(text: &str, path: &Path) -> Result<Vec<PoolSpec>, ConfigError> {
    let doc: Value = serde_norway::from_str(text)
        .map_err(|e| ConfigError::new(path, "", format!("not valid YAML: {e}")))?;
    let pools = match doc {
        Value::Mapping(m) if !m.is_empty() => m,
        Value::Null => return Err(ConfigError::new(path, "", "no pools")),
        Value::Mapping(_) => return Err(ConfigError::new(path, "", "no pools")),
        _ => {
            return Err(ConfigError::new(
                path,
                "",
                "not a nutcracker configuration: expected a map of pool names to pools",
            ))
        }
    };
    let mut out: Vec<PoolSpec> = Vec::with_capacity(pools.len());
    for (name, body) in &pools {
        let name = scalar(name).ok_or_else(|| {
            ConfigError::new(path, "", "a pool name must be a plain name, such as alpha")
        })?;
        let err = |key: &str, message: String| {
            let key = if key.is_empty() {
                name.clone()
            } else {
                format!("{name}.{key}")
            };
            ConfigError::new(path, &key, message)
        };
        let pool = parse_pool(&name, body).map_err(|(key, p)| err(&key, p.to_string()))?;
        if let Some(other) = out.iter().find(|p| p.listen == pool.listen) {
            return Err(err(
                "listen",
                format!(
                    "{} is already where pool `{}` listens",
                    pool.listen, other.name
                ),
            ));
        }
        out.push(pool);
    }
    Ok(out)
}

/// Each pool's `client_connections`, in the order of [`parse_nutcracker`]'s pools: `None` where
/// it is absent or 0 (no cap of the pool's own, as in nutcracker). The text must be one that
/// [`parse_nutcracker`] accepts; a value it would refuse reads as `None`.
pub fn client_connections(text: &str) -> Vec<Option<usize>> {
    let Ok(Value::Mapping(pools)) = serde_norway::from_str::<Value>(text) else {
        return Vec::new();
    };
    pools
        .values()
        .map(|body| {
            let Value::Mapping(keys) = body else {
                return None;
            };
            let value = keys.get("client_connections").and_then(scalar)?;
            let n = number(&value).ok()?;
            (n > 0).then(|| usize::try_from(n).unwrap_or(usize::MAX))
        })
        .collect()
}

/// A failing key of a pool (`""` for the pool itself, `servers[1]` for a server) and why.
type PoolError = (String, Problem);

/// How a server line is written, for the messages of [`parse_server`].
const SERVER_USAGE: &str = "use \"host:port:weight\" or \"host:port:weight name\"";
/// How `listen` is written, for the messages of [`parse_listen`].
const LISTEN_USAGE: &str = "use host:port, such as 127.0.0.1:22121";

/// What is wrong with a pool, one of its keys or a server line. [`parse_nutcracker`] adds the
/// file, the pool and the key.
#[derive(Debug, thiserror::Error)]
enum Problem {
    #[error("must be a map of nutcracker pool keys (listen, hash, servers, ...)")]
    PoolNotMap,
    #[error("pool keys must be plain names")]
    KeyNotName,
    #[error("has no value")]
    NoValue,
    /// Unquoted, `{}` is an empty YAML map, not two characters.
    #[error("must be quoted, such as hash_tag: \"{{}}\"")]
    HashTagUnquoted,
    #[error("must be a single value")]
    NotScalar,
    #[error("only valid in a redis pool (redis: true)")]
    RedisAuth,
    #[error("must not be empty")]
    EmptyAuth,
    #[error("only valid in a redis pool (redis: true)")]
    ClusterNotRedis,
    #[error("a Redis Cluster has database 0 only")]
    ClusterDb,
    #[error(
        "unknown key (nutcracker refuses it too); a pool has listen, hash, hash_tag, \
         distribution, timeout, auto_eject_hosts, server_retry_timeout, \
         server_failure_limit, server_connections, servers and nutcracker's ignored tuning \
         keys"
    )]
    UnknownKey,
    #[error("missing: every pool needs one")]
    NoListen,
    #[error("missing: every pool needs servers")]
    NoServers,
    #[error("must be a list of \"host:port:weight [name]\"")]
    ServersNotList,
    #[error("must be \"host:port:weight [name]\"")]
    ServerNotScalar,
    /// A server line naming a unix socket.
    #[error("`{0}` is a unix socket; kvswitch reaches servers over TCP: {SERVER_USAGE}")]
    UnixServer(String),
    #[error("`{0}` has no weight; {SERVER_USAGE}")]
    ServerNoWeight(String),
    #[error("`{0}` has no port; {SERVER_USAGE}")]
    ServerNoPort(String),
    #[error("`{0}` has no host; {SERVER_USAGE}")]
    ServerNoHost(String),
    /// A `listen` naming a unix socket.
    #[error(
        "`{0}` is a unix socket; kvswitch listens on TCP only: use host:port, such as \
         127.0.0.1:22121"
    )]
    UnixListen(String),
    #[error("`{0}` has no port; {LISTEN_USAGE}")]
    ListenNoPort(String),
    #[error("`{0}` has no host; {LISTEN_USAGE}")]
    ListenNoHost(String),
    #[error("`{0}` is not a number (a whole number of 0 or more)")]
    NotNumber(String),
    #[error("`{0}` is too large")]
    TooLarge(String),
    #[error("`{0}` is not true or false")]
    NotBoolean(String),
    /// A part of the server line or `listen` address `text` is wrong.
    #[error("`{text}`: {problem}")]
    In { text: String, problem: Box<Problem> },
    /// The name of the server line `text` is wrong.
    #[error("`{text}`: name {problem}")]
    Name { text: String, problem: KeyError },
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    #[error(transparent)]
    Servers(#[from] ServersError),
}

impl Problem {
    /// This problem, found in the server line or `listen` address `text`.
    fn within(self, text: &str) -> Problem {
        Problem::In {
            text: text.to_owned(),
            problem: Box::new(self),
        }
    }
}

fn parse_pool(name: &str, body: &Value) -> Result<PoolSpec, PoolError> {
    let Value::Mapping(map) = body else {
        return Err((String::new(), Problem::PoolNotMap));
    };
    let mut keys = PoolKeys::default();
    let mut listen = None;
    let mut servers = None;
    let mut redis = RedisKeys::default();
    for (key, value) in map {
        let Some(key) = scalar(key) else {
            return Err((String::new(), Problem::KeyNotName));
        };
        if key == "servers" {
            servers = Some(parse_servers(value)?);
            continue;
        }
        pool_key(&mut keys, &mut redis, &mut listen, &key, value).map_err(|p| (key, p))?;
    }
    let Some(listen) = listen else {
        return Err(("listen".into(), Problem::NoListen));
    };
    let Some(servers) = servers else {
        return Err(("servers".into(), Problem::NoServers));
    };
    let mut pool = PoolSpec::new(name, listen, keys.distribution, keys.hash, servers);
    keys.apply(&mut pool);
    if redis.is_redis {
        if redis.cluster && redis.db != 0 {
            return Err(("redis_db".into(), Problem::ClusterDb));
        }
        pool.redis = Some(RedisSpec {
            auth: redis.auth,
            db: redis.db,
            cluster: redis.cluster,
        });
    } else if redis.auth.is_some() {
        return Err(("redis_auth".into(), Problem::RedisAuth));
    } else if redis.cluster {
        return Err(("redis_cluster".into(), Problem::ClusterNotRedis));
    }
    pool_keys::check_servers(&pool).map_err(|e| match e.server() {
        Some(i) => (format!("servers[{i}]"), e.into()),
        None => ("servers".into(), e.into()),
    })?;
    Ok(pool)
}

/// A pool's Redis keys, read before it is known whether the pool is one.
#[derive(Default)]
struct RedisKeys {
    is_redis: bool,
    auth: Option<String>,
    db: u32,
    cluster: bool,
}

/// Reads the pool key `key` (any but `servers`) into `keys` or `redis`, or `listen` into
/// `listen`.
fn pool_key(
    keys: &mut PoolKeys,
    redis: &mut RedisKeys,
    listen: &mut Option<SocketAddr>,
    key: &str,
    value: &Value,
) -> Result<(), Problem> {
    let text = match value {
        Value::Null => return Err(Problem::NoValue),
        Value::Mapping(_) if key == "hash_tag" => return Err(Problem::HashTagUnquoted),
        v => scalar(v).ok_or(Problem::NotScalar)?,
    };
    match key {
        "listen" => *listen = Some(parse_listen(&text)?),
        "hash" => keys.hash = pool_keys::hash(&text)?,
        "distribution" => keys.distribution = pool_keys::distribution(&text)?,
        "hash_tag" => keys.hash_tag = Some(pool_keys::hash_tag(&text)?),
        "timeout" => {
            keys.timeout = match number(&text)? {
                // nutcracker's "wait forever"; kvswitch always bounds a request.
                0 => DEFAULT_TIMEOUT,
                ms => pool_keys::timeout_ms(ms)?,
            }
        }
        "auto_eject_hosts" => keys.auto_eject_hosts = boolean(&text)?,
        "server_failure_limit" => {
            // nutcracker compares the failure count after counting the failure, so 0 and
            // 1 both eject on the first.
            let n = number(&text)?.max(1);
            keys.server_failure_limit = pool_keys::failure_limit(n)?;
        }
        "server_retry_timeout" => {
            keys.server_retry_timeout = pool_keys::retry_timeout_ms(number(&text)?)?
        }
        "server_connections" => {
            keys.server_connections = pool_keys::server_connections(number(&text)?)?
        }
        "redis" => redis.is_redis = boolean(&text)?,
        "redis_cluster" => redis.cluster = boolean(&text)?,
        "redis_auth" if text.is_empty() => return Err(Problem::EmptyAuth),
        "redis_auth" => redis.auth = Some(text),
        "redis_db" => {
            redis.db = u32::try_from(number(&text)?).map_err(|_| Problem::TooLarge(text))?
        }
        // nutcracker's own socket tuning, and a cap read by `client_connections`.
        "backlog" | "client_connections" => drop(number(&text)?),
        "preconnect" | "tcpkeepalive" => drop(boolean(&text)?),
        _ => return Err(Problem::UnknownKey),
    }
    Ok(())
}

fn parse_servers(value: &Value) -> Result<Vec<ServerSpec>, PoolError> {
    let Value::Sequence(items) = value else {
        return Err(("servers".into(), Problem::ServersNotList));
    };
    let mut servers = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let server = scalar(item)
            .ok_or(Problem::ServerNotScalar)
            .and_then(|text| parse_server(&text))
            .map_err(|p| (format!("servers[{i}]"), p))?;
        servers.push(server);
    }
    Ok(servers)
}

/// `host:port:weight [name]`, split from the right as nutcracker splits it: the name after
/// the last space, the weight after the last `:` before it, then the port; the rest is the
/// host, which may itself hold colons (an IPv6 address).
fn parse_server(text: &str) -> Result<ServerSpec, Problem> {
    if text.starts_with('/') {
        return Err(Problem::UnixServer(text.to_owned()));
    }
    let (spec, name) = match text.rsplit_once(' ') {
        Some((spec, name)) => (spec, Some(name)),
        None => (text, None),
    };
    let Some((rest, weight)) = spec.rsplit_once(':') else {
        return Err(Problem::ServerNoWeight(text.to_owned()));
    };
    let Some((host, port)) = rest.rsplit_once(':') else {
        return Err(Problem::ServerNoPort(text.to_owned()));
    };
    if host.is_empty() {
        return Err(Problem::ServerNoHost(text.to_owned()));
    }
    let port = pool_keys::port_number(port).map_err(|e| Problem::from(e).within(text))?;
    let weight = number(weight)
        .and_then(|w| Ok(pool_keys::weight(w)?))
        .map_err(|p| p.within(text))?;
    if let Some(name) = name {
        pool_keys::server_name(name).map_err(|problem| Problem::Name {
            text: text.to_owned(),
            problem,
        })?;
    }
    let addr = pool_keys::resolve(host, port)?;
    Ok(ServerSpec {
        host: host.to_owned(),
        addr,
        weight,
        name: name.map(str::to_owned),
    })
}

/// `host:port` (split at the last `:`, as nutcracker does), resolved.
fn parse_listen(text: &str) -> Result<SocketAddr, Problem> {
    if text.starts_with('/') {
        return Err(Problem::UnixListen(text.to_owned()));
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(Problem::ListenNoPort(text.to_owned()));
    };
    if host.is_empty() {
        return Err(Problem::ListenNoHost(text.to_owned()));
    }
    let port = pool_keys::port_number(port).map_err(|e| Problem::from(e).within(text))?;
    Ok(pool_keys::resolve(host, port)?)
}

/// A scalar as nutcracker sees it: its text. `None` for maps, lists, null and tagged values.
fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A number as nutcracker reads one: decimal digits only.
fn number(text: &str) -> Result<u64, Problem> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Problem::NotNumber(text.to_owned()));
    }
    text.parse().map_err(|_| Problem::TooLarge(text.to_owned()))
}

/// A boolean as nutcracker reads one: `true` or `false`, nothing else.
fn boolean(text: &str) -> Result<bool, Problem> {
    match text {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(Problem::NotBoolean(text.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use kv::{Distribution, HashFn};

    fn parse(text: &str) -> Result<Vec<PoolSpec>, ConfigError> {
        parse_nutcracker(text, Path::new("nutcracker.yml"))
    }

    fn error(text: &str) -> String {
        parse(text).expect_err("must be refused").to_string()
    }

    /// Two pools in the style of nutcracker's own example configuration.
    const TWO_POOLS: &str = "\
alpha:
  listen: 127.0.0.1:22121
  hash: fnv1a_64
  distribution: ketama
  auto_eject_hosts: true
  redis: false
  timeout: 400
  server_retry_timeout: 2000
  server_failure_limit: 1
  servers:
   - 127.0.0.1:11211:1
   - 127.0.0.1:11212:2 beta

gamma:
  listen: localhost:22123
  hash: md5
  hash_tag: \"{}\"
  distribution: modula
  backlog: 1024
  preconnect: true
  client_connections: 10
  tcpkeepalive: true
  server_connections: 2
  servers:
   - localhost:11214:1
   - ::1:11215:1
";

    #[test]
    fn client_connections_are_read_per_pool() {
        assert_eq!(client_connections(TWO_POOLS), vec![None, Some(10)]);
        let zero = TWO_POOLS.replace("client_connections: 10", "client_connections: 0");
        assert_eq!(client_connections(&zero), vec![None, None]);
    }

    #[test]
    fn two_pools() {
        let pools = parse(TWO_POOLS).unwrap();
        assert_eq!(pools.len(), 2);
        let a = &pools[0];
        assert_eq!(a.name, "alpha");
        assert_eq!(a.listen, "127.0.0.1:22121".parse().unwrap());
        assert_eq!(a.hash, HashFn::Fnv1a64);
        assert_eq!(a.distribution, Distribution::Ketama);
        assert_eq!(a.hash_tag, None);
        assert!(a.auto_eject_hosts);
        assert_eq!(a.timeout, Duration::from_millis(400));
        assert_eq!(a.server_retry_timeout, Duration::from_millis(2000));
        assert_eq!(a.server_failure_limit, 1);
        assert_eq!(a.server_connections, 1);
        assert_eq!(a.servers.len(), 2);
        assert_eq!(a.servers[0].host, "127.0.0.1");
        assert_eq!(a.servers[0].ring_name(), "127.0.0.1");
        assert_eq!(a.servers[1].weight, 2);
        assert_eq!(a.servers[1].ring_name(), "beta");
        assert_eq!(a.servers[1].addr, "127.0.0.1:11212".parse().unwrap());

        let g = &pools[1];
        assert_eq!(g.name, "gamma");
        assert!(g.listen.ip().is_loopback());
        assert_eq!(g.listen.port(), 22123);
        assert_eq!(g.distribution, Distribution::Modula);
        assert_eq!(g.hash_tag, Some(*b"{}"));
        // No timeout in nutcracker's terms is kvswitch's default.
        assert_eq!(g.timeout, DEFAULT_TIMEOUT);
        assert!(!g.auto_eject_hosts);
        assert_eq!(g.server_failure_limit, 2);
        assert_eq!(g.server_retry_timeout, Duration::from_secs(30));
        assert_eq!(g.server_connections, 2);
        assert_eq!(g.servers[0].ring_name(), "localhost:11214");
        assert!(g.servers[0].addr.ip().is_loopback());
        assert_eq!(g.servers[1].host, "::1");
        assert_eq!(g.servers[1].addr, "[::1]:11215".parse().unwrap());
        assert_eq!(g.servers[1].ring_name(), "::1:11215");
        for p in &pools {
            p.ring().unwrap();
        }
    }

    #[test]
    fn zero_means_what_it_means_in_nutcracker() {
        let text = TWO_POOLS
            .replace("timeout: 400", "timeout: 0")
            .replace("server_failure_limit: 1", "server_failure_limit: 0");
        let a = &parse(&text).unwrap()[0];
        assert_eq!(a.timeout, DEFAULT_TIMEOUT);
        assert_eq!(a.server_failure_limit, 1);
    }

    #[test]
    fn quoted_numbers_and_numeric_names_are_text() {
        let text = TWO_POOLS
            .replace("timeout: 400", "timeout: \"400\"")
            .replace("alpha:", "1:");
        let pools = parse(&text).unwrap();
        assert_eq!(pools[0].name, "1");
        assert_eq!(pools[0].timeout, Duration::from_millis(400));
    }

    #[test]
    fn server_lines() {
        let s = parse_server("cache.example-1:7000:3 c1").map(|s| (s.host, s.weight, s.name));
        // The name does not resolve here; what matters is how far parsing got.
        assert!(s.is_err_and(|e| matches!(
            e,
            Problem::Resolve(ResolveError::Failed { ref host, .. }) if host == "cache.example-1"
        )));
        let s = parse_server("127.0.0.1:7000:3 c1").unwrap();
        assert_eq!(
            (s.host.as_str(), s.addr.port(), s.weight, s.name.as_deref()),
            ("127.0.0.1", 7000, 3, Some("c1"))
        );
        for (bad, want) in [
            ("127.0.0.1:11211", "no port"),
            ("127.0.0.1", "no weight"),
            (":11211:1", "no host"),
            ("127.0.0.1:0:1", "port"),
            ("127.0.0.1:11211:0", "at least 1"),
            ("127.0.0.1:11211:-1", "not a number"),
            ("127.0.0.1:11211:1 a b", "not a number"),
            ("/tmp/memcached.sock:1", "unix socket"),
        ] {
            let e = parse_server(bad).unwrap_err().to_string();
            assert!(e.contains(want), "{bad}: {e}");
        }
        let e = parse_server("127.0.0.1:0:1").unwrap_err();
        assert_eq!(
            e.to_string(),
            "`127.0.0.1:0:1`: `0` is not a port from 1 to 65535"
        );
        assert!(
            matches!(&e, Problem::In { problem, .. } if matches!(**problem, Problem::Key(KeyError::Port(_)))),
            "{e:?}"
        );
    }

    #[test]
    fn a_redis_pool_keeps_its_password_and_database() {
        let pools = parse(TWO_POOLS).unwrap();
        assert_eq!(pools[0].redis, None);
        let redis = TWO_POOLS.replace(
            "redis: false",
            "redis: true\n  redis_auth: s3cret\n  redis_db: 2",
        );
        let pools = parse(&redis).unwrap();
        let want = RedisSpec {
            auth: Some("s3cret".into()),
            db: 2,
            cluster: false,
        };
        assert_eq!(pools[0].redis, Some(want));
        assert_eq!(pools[1].redis, None);
        let plain = TWO_POOLS.replace("redis: false", "redis: true");
        assert_eq!(parse(&plain).unwrap()[0].redis, Some(RedisSpec::default()));
        let cluster = TWO_POOLS.replace("redis: false", "redis: true\n  redis_cluster: true");
        assert!(parse(&cluster).unwrap()[0].redis.as_ref().unwrap().cluster);
        for (bad, key) in [
            ("redis: false\n  redis_cluster: true", "alpha.redis_cluster"),
            (
                "redis: true\n  redis_cluster: true\n  redis_db: 1",
                "alpha.redis_db",
            ),
        ] {
            let e = error(&TWO_POOLS.replace("redis: false", bad));
            assert!(e.contains(key), "{e}");
        }
        let empty = TWO_POOLS.replace("redis: false", "redis: true\n  redis_auth: \"\"");
        assert!(
            error(&empty).contains("alpha.redis_auth"),
            "{}",
            error(&empty)
        );
    }

    #[test]
    fn errors_name_file_pool_and_key() {
        let cases: &[(&str, &str, &str)] = &[
            ("redis: false", "redis: 1", "alpha.redis"),
            ("redis: false", "redis_db: -1", "alpha.redis_db"),
            ("redis: false", "redis_auth: secret", "alpha.redis_auth"),
            ("redis: false", "redis: yes", "not true or false"),
            ("redis: false", "bogus: 1", "alpha.bogus"),
            (
                "distribution: modula",
                "distribution: random",
                "gamma.distribution",
            ),
            ("hash: md5", "hash: sha1", "gamma.hash"),
            ("hash_tag: \"{}\"", "hash_tag: \"{\"", "gamma.hash_tag"),
            ("hash_tag: \"{}\"", "hash_tag: {}", "must be quoted"),
            ("hash: md5", "hash: [md5]", "single value"),
            ("timeout: 400", "timeout: -1", "alpha.timeout"),
            ("timeout: 400", "timeout: 1.5", "not a number"),
            ("timeout: 400", "timeout: 3600001", "3600000"),
            ("timeout: 400", "timeout:", "alpha.timeout`: has no value"),
            (
                "server_connections: 2",
                "server_connections: 0",
                "gamma.server_connections",
            ),
            (
                "server_retry_timeout: 2000",
                "server_retry_timeout: 0",
                "alpha.server_retry_timeout",
            ),
            (
                "auto_eject_hosts: true",
                "auto_eject_hosts: 1",
                "alpha.auto_eject_hosts",
            ),
            (
                "listen: 127.0.0.1:22121",
                "listen: /tmp/nc.sock 0755",
                "unix socket",
            ),
            (
                "listen: 127.0.0.1:22121",
                "listen: 127.0.0.1",
                "alpha.listen",
            ),
            (
                "listen: 127.0.0.1:22121",
                "listen: no-such-host.invalid:22121",
                "cannot resolve",
            ),
            (
                "listen: 127.0.0.1:22121",
                "listen: localhost:22123",
                "already where pool `alpha`",
            ),
            ("  listen: 127.0.0.1:22121\n", "", "alpha.listen"),
            (
                "   - 127.0.0.1:11212:2 beta",
                "   - 127.0.0.1:11212:2 beta\n   - x:1",
                "alpha.servers[2]",
            ),
            (
                "   - 127.0.0.1:11212:2 beta",
                "   - 127.0.0.1:11211:2",
                "alpha.servers[1]",
            ),
            (
                "   - ::1:11215:1",
                "   - no-such-host.invalid:11215:1",
                "gamma.servers[1]",
            ),
            ("   - ::1:11215:1", "   - [a, b]", "gamma.servers[1]"),
            (
                "  servers:\n   - 127.0.0.1:11211:1\n   - 127.0.0.1:11212:2 beta\n",
                "",
                "alpha.servers",
            ),
            (
                "  hash: fnv1a_64\n",
                "  hash: fnv1a_64\n  hash: md5\n",
                "duplicate",
            ),
            ("gamma:\n", "gamma: 1\ndelta:\n", "gamma"),
        ];
        for (from, to, want) in cases {
            assert!(TWO_POOLS.contains(from), "{from} not in the file");
            let text = TWO_POOLS.replacen(from, to, 1);
            let e = error(&text);
            assert!(
                e.contains("nutcracker.yml") && e.contains(want),
                "{to}: {e}"
            );
        }
    }

    #[test]
    fn not_a_pool_file() {
        assert!(error("").contains("no pools"));
        assert!(error("{}").contains("no pools"));
        assert!(error("- a\n- b\n").contains("map of pool names"));
        let e = error("alpha:\n  listen: [\n");
        assert!(e.contains("not valid YAML") && e.contains("line"), "{e}");
    }
}
