//! The proxy's configuration file (TOML): `[proxy]` (where to listen, workers, API) and one
//! `[pool]`, with the same pool keys as the switch's file. A switch configuration is accepted
//! too, for its pool. Hostnames are resolved once, when the file is loaded.
//!
//! ```toml
//! [proxy]
//! listen = "127.0.0.1:22121"   # optional; `--listen` on the command line wins
//! workers = 2                  # optional
//! api = "127.0.0.1:9111"       # optional
//! client_connections = 10000   # optional; default from the descriptor limit
//! reply_budget_mib = 256       # optional
//!
//! [pool]
//! distribution = "ketama"
//! hash = "md5"
//! hash_tag = "{}"              # optional, as nutcracker's
//! timeout_ms = 1000            # and auto_eject_hosts, server_failure_limit,
//!                              # server_retry_timeout_ms, server_connections,
//!                              # replicas (servers each key is kept on)
//! [[pool.servers]]
//! addr = "cache1.example:11211"
//! weight = 1
//! name = "s1"
//! ```
//!
//! Which kind a file is: one with a `[switch]` or `[vip]` table is a switch configuration and
//! is validated whole, exactly as `kvswitch run` would; the proxy then takes only its pool
//! (servers, distribution, hash, failure keys), and nothing else from it: not `[switch].api`,
//! which is the switch's own API address. Anything else is a proxy configuration. A file with
//! both `[proxy]` and `[switch]`/`[vip]` is refused rather than half read.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::api::{ApiServing, RawApiServing};
use super::cache::CacheSettings;
use super::pool_keys::{self, PoolKeys, RawPool};
use super::{Config, ConfigError};
use switch::pool::{PoolSpec, ServerSpec};

/// The listening address a [`ProxyFile`]'s pool holds while neither the file nor the command
/// line has given one: `0.0.0.0:0`, never served (see [`ProxyFile::pool_with_listen`]).
pub const UNSET_LISTEN: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::UNSPECIFIED,
    0,
));

/// Most worker threads a proxy file may ask for.
const MAX_WORKERS: usize = 256;

/// Largest `[proxy].reply_budget_mib`: 1 TiB.
const MAX_REPLY_BUDGET_MIB: u64 = 1 << 20;

/// A loaded proxy configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ProxyFile {
    /// The file it came from, for messages.
    pub path: PathBuf,
    /// `[proxy].listen`, resolved; `None` when the file has none (always, for a switch file).
    pub listen: Option<SocketAddr>,
    /// `[proxy].workers`; `None` leaves the choice to the caller.
    pub workers: Option<usize>,
    /// `[proxy].api`: the proxy's HTTP API; `None` when the file has none.
    pub api: Option<SocketAddr>,
    /// How the API bounds its clients (`[proxy]`'s `api_max_connections`,
    /// `api_header_timeout_ms`, `api_hosts`).
    pub api_serving: ApiServing,
    /// `[proxy].client_connections`: client connections held at once; `None` leaves it to
    /// the descriptor limit.
    pub client_connections: Option<usize>,
    /// `[proxy].reply_budget_mib`, in bytes: unwritten reply bytes held for all clients
    /// before the proxy stops reading requests; `None`: the proxy's default.
    pub reply_budget: Option<usize>,
    /// The pool. Its `listen` is [`ProxyFile::listen`], or [`UNSET_LISTEN`] when the file has
    /// none: take the pool through [`ProxyFile::pool_with_listen`], which settles it.
    pub pool: PoolSpec,
    /// True when the file was a switch configuration, of which only the pool and the cache
    /// were taken.
    pub from_switch: bool,
    /// The `[cache]` table (off when there is none; `--cache` turns it on).
    pub cache: CacheSettings,
    /// `[proxy]`'s `tls_cert`, `tls_key` and `tls_client_ca`: clients speak TLS.
    pub tls: Option<TlsFiles>,
    /// `[proxy]`'s `server_tls_ca`, `server_tls_cert` and `server_tls_key`: the proxy speaks
    /// TLS to the servers.
    pub server_tls: Option<ServerTlsFiles>,
    /// `[proxy]`'s `server_sasl_user` and `server_sasl_password_file`: the proxy
    /// authenticates its connections to the servers with SASL.
    pub server_sasl: Option<SaslFiles>,
}

/// The user the proxy authenticates to the servers as, and the file whose first line is its
/// password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaslFiles {
    pub user: String,
    pub password_file: PathBuf,
    /// Clients must authenticate (with the same user and password) before any other request
    /// (`client_sasl`).
    pub clients: bool,
}

impl SaslFiles {
    /// `user` and `password_file` given together, or neither (no SASL). `key_of` names a
    /// setting in a refusal.
    pub fn from_parts(
        user: Option<String>,
        password_file: Option<PathBuf>,
        key_of: impl Fn(&str) -> String,
    ) -> Result<Option<SaslFiles>, (String, String)> {
        match (user, password_file) {
            (Some(user), _) if user.is_empty() => Err((
                key_of("server_sasl_user"),
                "empty: give the user the servers know".into(),
            )),
            (Some(user), Some(password_file)) => Ok(Some(SaslFiles {
                user,
                password_file,
                clients: false,
            })),
            (None, None) => Ok(None),
            (Some(_), None) => Err((
                key_of("server_sasl_password_file"),
                "missing: server_sasl_user needs the file holding its password".into(),
            )),
            (None, Some(_)) => Err((
                key_of("server_sasl_user"),
                "missing: server_sasl_password_file needs the user it is the password of".into(),
            )),
        }
    }
}

/// What the proxy trusts in the servers' certificates, and the certificate and key it shows
/// servers that ask for one (PEM files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTlsFiles {
    pub ca: PathBuf,
    pub own: Option<(PathBuf, PathBuf)>,
}

impl ServerTlsFiles {
    /// `ca`, `cert` and `key` given as they must be: the authority alone, or with both of the
    /// others; none at all is no TLS. `key_of` names a setting in a refusal.
    pub fn from_parts(
        ca: Option<PathBuf>,
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        key_of: impl Fn(&str) -> String,
    ) -> Result<Option<ServerTlsFiles>, (String, String)> {
        let own = match (cert, key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            (Some(_), None) => {
                return Err((
                    key_of("server_tls_key"),
                    "missing: server_tls_cert needs its key".into(),
                ))
            }
            (None, Some(_)) => {
                return Err((
                    key_of("server_tls_cert"),
                    "missing: server_tls_key needs its certificate".into(),
                ))
            }
        };
        match (ca, own) {
            (Some(ca), own) => Ok(Some(ServerTlsFiles { ca, own })),
            (None, None) => Ok(None),
            (None, Some(_)) => Err((
                key_of("server_tls_ca"),
                "missing: a certificate for the servers needs the authority their certificates are checked against".into(),
            )),
        }
    }
}

/// The TLS and SASL keys a `[proxy]` or a `[switch]` table takes, as written.
pub(crate) struct RawSecrets {
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_client_ca: Option<PathBuf>,
    pub server_tls_ca: Option<PathBuf>,
    pub server_tls_cert: Option<PathBuf>,
    pub server_tls_key: Option<PathBuf>,
    pub server_sasl_user: Option<String>,
    pub server_sasl_password_file: Option<PathBuf>,
    pub client_sasl: Option<bool>,
}

/// What [`RawSecrets::check`] gives: the clients' TLS, the servers' TLS, the servers' SASL.
pub(crate) type SecretFiles = (Option<TlsFiles>, Option<ServerTlsFiles>, Option<SaslFiles>);

impl RawSecrets {
    /// Checks the keys of `[section]` in the file `path`, their files relative to its
    /// directory; an error names `section.key`.
    pub(crate) fn check(self, path: &Path, section: &str) -> Result<SecretFiles, ConfigError> {
        let beside = |f: Option<PathBuf>| f.map(|f| path.parent().unwrap_or(Path::new("")).join(f));
        let key_of = |k: &str| format!("{section}.{k}");
        let fail = |(k, e): (String, String)| ConfigError::new(path, &k, e);
        let tls = TlsFiles::from_parts(
            beside(self.tls_cert),
            beside(self.tls_key),
            beside(self.tls_client_ca),
            key_of,
        )
        .map_err(fail)?;
        let server_tls = ServerTlsFiles::from_parts(
            beside(self.server_tls_ca),
            beside(self.server_tls_cert),
            beside(self.server_tls_key),
            key_of,
        )
        .map_err(fail)?;
        let sasl = SaslFiles::from_parts(
            self.server_sasl_user,
            beside(self.server_sasl_password_file),
            key_of,
        )
        .map_err(fail)?;
        let sasl = match (sasl, self.client_sasl) {
            (Some(s), Some(clients)) => Some(SaslFiles { clients, ..s }),
            (None, Some(true)) => {
                return Err(ConfigError::new(
                    path,
                    &key_of("client_sasl"),
                    "clients authenticate with the servers' user and password: give \
                     server_sasl_user and server_sasl_password_file too",
                ))
            }
            (s, _) => s,
        };
        Ok((tls, server_tls, sasl))
    }
}

/// Where a TLS listener finds its certificate chain, its key and, to ask clients for
/// certificates, the authorities it takes them from (PEM files, read again on SIGHUP).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

impl TlsFiles {
    /// The files of `cert`, `key` and `client_ca` given together: both of the first two, or
    /// none of the three. `key_of` names a setting in a refusal.
    pub fn from_parts(
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        client_ca: Option<PathBuf>,
        key_of: impl Fn(&str) -> String,
    ) -> Result<Option<TlsFiles>, (String, String)> {
        match (cert, key) {
            (Some(cert), Some(key)) => Ok(Some(TlsFiles {
                cert,
                key,
                client_ca,
            })),
            (None, None) if client_ca.is_none() => Ok(None),
            (None, None) => Err((
                key_of("tls_client_ca"),
                "asks clients for certificates, which needs TLS: give tls_cert and tls_key too"
                    .into(),
            )),
            (Some(_), None) => Err((
                key_of("tls_key"),
                "missing: tls_cert needs the key of its certificate".into(),
            )),
            (None, Some(_)) => Err((
                key_of("tls_cert"),
                "missing: tls_key needs its certificate chain".into(),
            )),
        }
    }
}

impl ProxyFile {
    /// The pool to serve, listening on `listen` (the command line's `--listen`), which wins
    /// over the file's `[proxy].listen`. Fails, naming the file, when neither gives one.
    pub fn pool_with_listen(&self, listen: Option<SocketAddr>) -> Result<PoolSpec, ConfigError> {
        let Some(listen) = listen.or(self.listen) else {
            return Err(ConfigError::new(
                &self.path,
                "proxy.listen",
                "no listening address: give --listen, or set listen in [proxy]",
            ));
        };
        let mut pool = self.pool.clone();
        pool.listen = listen;
        Ok(pool)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProxyFile {
    #[serde(default)]
    proxy: Option<RawProxy>,
    pool: RawPool,
    #[serde(default)]
    cache: Option<super::cache::RawCache>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProxy {
    #[serde(default)]
    listen: Option<String>,
    #[serde(default)]
    workers: Option<usize>,
    #[serde(default)]
    api: Option<String>,
    #[serde(default)]
    api_max_connections: Option<usize>,
    #[serde(default)]
    api_header_timeout_ms: Option<u64>,
    #[serde(default)]
    api_hosts: Option<Vec<String>>,
    #[serde(default)]
    api_tls_cert: Option<PathBuf>,
    #[serde(default)]
    api_tls_key: Option<PathBuf>,
    #[serde(default)]
    api_tls_client_ca: Option<PathBuf>,
    client_connections: Option<usize>,
    #[serde(default)]
    reply_budget_mib: Option<u64>,
    #[serde(default)]
    tls_cert: Option<PathBuf>,
    #[serde(default)]
    tls_key: Option<PathBuf>,
    #[serde(default)]
    tls_client_ca: Option<PathBuf>,
    #[serde(default)]
    server_tls_ca: Option<PathBuf>,
    #[serde(default)]
    server_tls_cert: Option<PathBuf>,
    #[serde(default)]
    server_tls_key: Option<PathBuf>,
    #[serde(default)]
    server_sasl_user: Option<String>,
    #[serde(default)]
    server_sasl_password_file: Option<PathBuf>,
    #[serde(default)]
    client_sasl: Option<bool>,
}

/// Reads a proxy configuration, or a switch configuration for its pool (see the module
/// documentation), resolving every hostname in it.
pub fn load_toml(path: &Path) -> Result<ProxyFile, ConfigError> {
    let text = crate::read_file(path)
        .map_err(|e| ConfigError::new(path, "", format!("cannot read: {e}")))?;
    parse_toml(&text, path)
}

/// Parses configuration text as [`load_toml`] does; `path` is used in messages.
pub fn parse_toml(text: &str, path: &Path) -> Result<ProxyFile, ConfigError> {
    let table: toml::Table = toml::from_str(text).map_err(|e| ConfigError::toml(path, text, &e))?;
    let switch_file = table.contains_key("switch") || table.contains_key("vip");
    if switch_file {
        if table.contains_key("proxy") {
            return Err(ConfigError::new(
                path,
                "proxy",
                "a file is either a switch configuration ([switch], [vip], [pool]) or a proxy \
                 configuration ([proxy], [pool]), not both",
            ));
        }
        let config = Config::parse(text, path)?;
        return Ok(ProxyFile {
            path: path.to_owned(),
            listen: None,
            workers: None,
            api: None,
            api_serving: config.api_serving.clone(),
            client_connections: None,
            reply_budget: None,
            pool: config.pool_spec(UNSET_LISTEN),
            from_switch: true,
            tls: config.tls.clone(),
            server_tls: config.server_tls.clone(),
            server_sasl: config.server_sasl.clone(),
            cache: config.cache,
        });
    }
    let raw: RawProxyFile = toml::from_str(text).map_err(|e| ConfigError::toml(path, text, &e))?;
    let err = |key: &str, message: String| ConfigError::new(path, key, message);

    let proxy = raw.proxy.unwrap_or(RawProxy {
        listen: None,
        workers: None,
        api: None,
        api_max_connections: None,
        api_header_timeout_ms: None,
        api_hosts: None,
        api_tls_cert: None,
        api_tls_key: None,
        api_tls_client_ca: None,
        client_connections: None,
        reply_budget_mib: None,
        tls_cert: None,
        tls_key: None,
        tls_client_ca: None,
        server_tls_ca: None,
        server_tls_cert: None,
        server_tls_key: None,
        server_sasl_user: None,
        server_sasl_password_file: None,
        client_sasl: None,
    });
    // Their files relative to the file's directory, as every other file a configuration
    // names.
    let (tls, server_tls, server_sasl) = RawSecrets {
        tls_cert: proxy.tls_cert.clone(),
        tls_key: proxy.tls_key.clone(),
        tls_client_ca: proxy.tls_client_ca.clone(),
        server_tls_ca: proxy.server_tls_ca.clone(),
        server_tls_cert: proxy.server_tls_cert.clone(),
        server_tls_key: proxy.server_tls_key.clone(),
        server_sasl_user: proxy.server_sasl_user.clone(),
        server_sasl_password_file: proxy.server_sasl_password_file.clone(),
        client_sasl: proxy.client_sasl,
    }
    .check(path, "proxy")?;
    let api_serving = RawApiServing {
        max_connections: proxy.api_max_connections,
        header_timeout_ms: proxy.api_header_timeout_ms,
        hosts: proxy.api_hosts.clone(),
        tls_cert: proxy.api_tls_cert.clone(),
        tls_key: proxy.api_tls_key.clone(),
        tls_client_ca: proxy.api_tls_client_ca.clone(),
    }
    .check(path, "proxy")?;
    if proxy.client_connections == Some(0) {
        return Err(err(
            "proxy.client_connections",
            "0 would refuse every client; leave it out for the default".into(),
        ));
    }
    if let Some(mib) = proxy.reply_budget_mib {
        if !(1..=MAX_REPLY_BUDGET_MIB).contains(&mib) {
            return Err(err(
                "proxy.reply_budget_mib",
                format!("{mib} is out of range; use 1 to {MAX_REPLY_BUDGET_MIB}"),
            ));
        }
    }
    let listen = match proxy.listen.as_deref() {
        Some(text) => {
            let (host, port) =
                pool_keys::host_port(text).map_err(|e| err("proxy.listen", e.to_string()))?;
            Some(pool_keys::resolve(host, port).map_err(|e| err("proxy.listen", e.to_string()))?)
        }
        None => None,
    };
    if let Some(w) = proxy.workers {
        if !(1..=MAX_WORKERS).contains(&w) {
            return Err(err(
                "proxy.workers",
                format!("{w} is out of range; use 1 to {MAX_WORKERS}"),
            ));
        }
    }
    let api = match proxy.api.as_deref() {
        Some(text) => Some(text.parse::<SocketAddr>().map_err(|_| {
            err(
                "proxy.api",
                format!("`{text}` is not an address such as 127.0.0.1:9111"),
            )
        })?),
        None => None,
    };

    let keys = PoolKeys::from_toml(&raw.pool)
        .map_err(|(k, e)| err(&format!("pool.{k}"), e.to_string()))?;
    let mut servers = Vec::with_capacity(raw.pool.servers.len());
    for (i, s) in raw.pool.servers.iter().enumerate() {
        let key = |field: &str| format!("pool.servers[{i}].{field}");
        if s.mac.is_some() {
            return Err(err(
                &key("mac"),
                "a server's MAC belongs in a switch configuration; the proxy connects by \
                 address: remove it"
                    .into(),
            ));
        }
        let (host, port) =
            pool_keys::host_port(&s.addr).map_err(|e| err(&key("addr"), e.to_string()))?;
        let addr = pool_keys::resolve(host, port).map_err(|e| err(&key("addr"), e.to_string()))?;
        let weight = pool_keys::weight(s.weight.unwrap_or(1).into())
            .map_err(|e| err(&key("weight"), e.to_string()))?;
        if let Some(name) = &s.name {
            pool_keys::server_name(name).map_err(|e| err(&key("name"), e.to_string()))?;
        }
        servers.push(ServerSpec {
            host: host.to_owned(),
            addr,
            weight,
            name: s.name.clone(),
        });
    }
    let mut pool = PoolSpec::new(
        "default",
        listen.unwrap_or(UNSET_LISTEN),
        keys.distribution,
        keys.hash,
        servers,
    );
    keys.apply(&mut pool);
    pool.redis = pool_keys::redis_toml(&raw.pool)
        .map_err(|(k, e)| err(&format!("pool.{k}"), e.to_string()))?;
    pool_keys::check_servers(&pool).map_err(|e| match e.server() {
        Some(i) => err(&format!("pool.servers[{i}]"), e.to_string()),
        None => err("pool.servers", e.to_string()),
    })?;
    Ok(ProxyFile {
        path: path.to_owned(),
        listen,
        workers: proxy.workers,
        api,
        api_serving,
        client_connections: proxy.client_connections,
        reply_budget: proxy.reply_budget_mib.map(|mib| (mib << 20) as usize),
        pool,
        from_switch: false,
        tls,
        server_tls,
        server_sasl,
        cache: {
            let present = raw.cache.is_some();
            raw.cache.unwrap_or_default().settings(present, path)?
        },
    })
}

/// An example proxy configuration, every key shown.
pub const PROXY_EXAMPLE: &str = r#"# kvswitch-proxy.toml: the memcached proxy's configuration.
[proxy]
# Where clients connect (host:port; a hostname is resolved at start).
# `kvswitch proxy --listen ADDR` overrides it; one of the two must be given.
listen = "127.0.0.1:22121"
# Worker threads; each accepts clients and keeps its own connections to the servers.
# workers = 2
# HTTP: /metrics (Prometheus text) and /api/v1/status (JSON).
# api = "127.0.0.1:9111"
# It answers only requests whose Host names it (its address, localhost, or api_hosts), and
# takes changes only as JSON from no other web origin; past api_max_connections (256) a
# connection is closed at once, and headers must arrive within api_header_timeout_ms (10000).
# api_hosts = ["proxy1.example"]
# HTTPS for the API (api_tls_cert, api_tls_key; api_tls_client_ca to ask for client
# certificates), read again on SIGHUP.
# api_tls_cert = "api.crt"
# api_tls_key = "api.key"
# Client connections held at once; more are accepted and closed at once (counted in
# kvswitch_proxy_clients_refused_total). Default: the descriptor limit (ulimit -n) less what
# the server connections, listeners and API need.
# client_connections = 10000
# Reply bytes (MiB) held for all clients together, received from the servers and not yet
# written. Past it no client's requests are read, and clients holding more than 4 MiB are
# cut off as more of their replies arrive; a client holding 32 MiB is cut off anyway.
# reply_budget_mib = 256
# TLS for clients (memcached's own, as `memcached -Z` serves it): the certificate chain and
# its key (PEM; paths relative to this file), read again on SIGHUP without dropping a
# connection. With tls_client_ca, a client must show a certificate that authority signed.
# tls_cert = "proxy.crt"
# tls_key = "proxy.key"
# tls_client_ca = "clients-ca.crt"
# TLS to the servers (`memcached -Z`): their certificates are checked against this authority
# and the host each server line names; the proxy shows its own certificate to servers that
# ask for one (server_tls_cert and server_tls_key).
# server_tls_ca = "servers-ca.crt"
# server_tls_cert = "proxy-client.crt"
# server_tls_key = "proxy-client.key"
# SASL to the servers (`memcached -S`): every connection to a server authenticates with
# PLAIN as this user, the password being the first line of the file (read again on SIGHUP).
# memcached takes SASL over its binary protocol only, so such a pool serves binary clients;
# their own SASL requests are answered by the proxy against the same user and password.
# server_sasl_user = "proxy"
# server_sasl_password_file = "servers.password"
# true: a client must authenticate (SASL PLAIN, the same user and password) before any other
# request, as memcached -S wants; one that has not is refused and disconnected.
# client_sasl = false

[pool]
distribution = "ketama"   # ketama | modula | jump
hash = "md5"              # nutcracker's hash names: md5, fnv1a_64, crc32, ...
# Hash only the part of a key between the two characters, as nutcracker's hash_tag:
# with "{}", user{42}.name and user{42}.mail live on one server.
# hash_tag = "{}"
# Failure handling, as nutcracker's keys of the same names (times in milliseconds).
# nutcracker waits forever for a reply unless told otherwise; kvswitch always bounds a
# request, by timeout_ms.
# timeout_ms = 1000                # a request without a reply by then fails
# auto_eject_hosts = false         # take a failing server out of the ring ...
# server_failure_limit = 2         # ... after this many failures in a row ...
# server_retry_timeout_ms = 30000  # ... for this long
# server_connections = 1           # connections to each server, per worker
# replicas = 1                     # servers each key is kept on (writes to all, reads to one)

[[pool.servers]]
# host:port, where host is an IPv4 address, [an IPv6 address] or a hostname (resolved at
# start). The ring hashes the host as written here, as nutcracker does, so keep the spelling
# of the nutcracker configuration you migrate from.
addr = "127.0.0.1:11211"
weight = 1                 # optional, default 1
name = "s1"                # optional: the server's identity on the ring, instead of its address

[[pool.servers]]
addr = "localhost:11212"
weight = 2
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use kv::{Distribution, HashFn};

    fn parse(text: &str) -> Result<ProxyFile, ConfigError> {
        parse_toml(text, Path::new("proxy.toml"))
    }

    fn error(text: &str) -> String {
        parse(text).expect_err("must be refused").to_string()
    }

    const MINIMAL: &str = "[pool]\n[[pool.servers]]\naddr = \"127.0.0.1:11211\"\n";

    #[test]
    fn tls_files_come_together_and_beside_the_file() {
        let with = |lines: &str| format!("[proxy]\n{lines}\n{MINIMAL}");
        let f = parse_toml(
            &with("tls_cert = \"a.crt\"\ntls_key = \"/etc/k.key\""),
            Path::new("/srv/kv/proxy.toml"),
        )
        .unwrap();
        let tls = f.tls.expect("tls");
        assert_eq!(tls.cert, Path::new("/srv/kv/a.crt"));
        assert_eq!(tls.key, Path::new("/etc/k.key"));
        assert_eq!(tls.client_ca, None);
        assert_eq!(parse(MINIMAL).unwrap().tls, None);
        let e = error(&with("tls_cert = \"a.crt\""));
        assert!(e.contains("proxy.tls_key") && e.contains("missing"), "{e}");
        let e = error(&with("tls_key = \"a.key\""));
        assert!(e.contains("proxy.tls_cert"), "{e}");
        let e = error(&with("tls_client_ca = \"ca.crt\""));
        assert!(e.contains("proxy.tls_client_ca"), "{e}");
        // Towards the servers: the authority alone, or with a certificate and its key.
        let f = parse_toml(
            &with("server_tls_ca = \"ca.crt\""),
            Path::new("/srv/kv/proxy.toml"),
        )
        .unwrap();
        let servers = f.server_tls.expect("server tls");
        assert_eq!(servers.ca, Path::new("/srv/kv/ca.crt"));
        assert_eq!(servers.own, None);
        let e = error(&with(
            "server_tls_cert = \"c.crt\"\nserver_tls_key = \"c.key\"",
        ));
        assert!(e.contains("proxy.server_tls_ca"), "{e}");
        let e = error(&with(
            "server_tls_ca = \"ca.crt\"\nserver_tls_cert = \"c.crt\"",
        ));
        assert!(e.contains("proxy.server_tls_key"), "{e}");
    }

    #[test]
    fn sasl_user_and_password_file_come_together() {
        let with = |lines: &str| format!("[proxy]\n{lines}\n{MINIMAL}");
        let f = parse_toml(
            &with("server_sasl_user = \"proxy\"\nserver_sasl_password_file = \"pw\""),
            Path::new("/srv/kv/proxy.toml"),
        )
        .unwrap();
        let sasl = f.server_sasl.expect("sasl");
        assert_eq!(sasl.user, "proxy");
        assert_eq!(sasl.password_file, Path::new("/srv/kv/pw"));
        assert_eq!(parse(MINIMAL).unwrap().server_sasl, None);
        let e = error(&with("server_sasl_user = \"proxy\""));
        assert!(e.contains("proxy.server_sasl_password_file"), "{e}");
        let e = error(&with("server_sasl_password_file = \"pw\""));
        assert!(e.contains("proxy.server_sasl_user"), "{e}");
        let e = error(&with(
            "server_sasl_user = \"\"\nserver_sasl_password_file = \"pw\"",
        ));
        assert!(e.contains("empty"), "{e}");
        let e = error(&with("client_sasl = true"));
        assert!(e.contains("proxy.client_sasl"), "{e}");
        let f = parse(&with(
            "server_sasl_user = \"p\"\nserver_sasl_password_file = \"pw\"\nclient_sasl = true",
        ))
        .unwrap();
        assert!(f.server_sasl.expect("sasl").clients);
    }

    #[test]
    fn example_parses() {
        let f = parse(PROXY_EXAMPLE).expect("example must parse");
        assert!(!f.from_switch);
        assert_eq!(f.listen, Some("127.0.0.1:22121".parse().unwrap()));
        assert_eq!(f.workers, None);
        assert_eq!(f.api, None);
        assert_eq!((f.client_connections, f.reply_budget), (None, None));
        let p = &f.pool;
        assert_eq!(p.name, "default");
        assert_eq!(p.listen, "127.0.0.1:22121".parse().unwrap());
        assert_eq!(p.distribution, Distribution::Ketama);
        assert_eq!(p.hash, HashFn::Md5);
        assert_eq!(p.hash_tag, None);
        assert_eq!(p.timeout, Duration::from_millis(1000));
        assert_eq!(p.servers.len(), 2);
        assert_eq!(p.servers[0].ring_name(), "s1");
        assert_eq!(p.servers[1].host, "localhost");
        assert!(p.servers[1].addr.ip().is_loopback());
        assert_eq!(p.servers[1].addr.port(), 11212);
        assert_eq!(p.servers[1].weight, 2);
        assert_eq!(p.servers[1].ring_name(), "localhost:11212");
        p.ring().expect("ring builds");
    }

    #[test]
    fn example_with_every_key_uncommented() {
        let text = PROXY_EXAMPLE
            .replace("# workers", "workers")
            .replace("# api", "api")
            .replace("# client_connections", "client_connections")
            .replace("# reply_budget_mib = 256", "reply_budget_mib = 64")
            .replace("# hash_tag", "hash_tag")
            .replace("# timeout_ms = 1000", "timeout_ms = 250")
            .replace("# auto_eject_hosts = false", "auto_eject_hosts = true")
            .replace("# server_failure_limit = 2", "server_failure_limit = 3")
            .replace("# server_retry_timeout_ms", "server_retry_timeout_ms")
            .replace("# server_connections = 1", "server_connections = 4");
        let f = parse(&text).unwrap();
        assert_eq!(f.workers, Some(2));
        assert_eq!(f.api, Some("127.0.0.1:9111".parse().unwrap()));
        assert_eq!(f.client_connections, Some(10_000));
        assert_eq!(f.reply_budget, Some(64 << 20));
        let p = &f.pool;
        assert_eq!(p.hash_tag, Some(*b"{}"));
        assert_eq!(p.timeout, Duration::from_millis(250));
        assert!(p.auto_eject_hosts);
        assert_eq!(p.server_failure_limit, 3);
        assert_eq!(p.server_retry_timeout, Duration::from_secs(30));
        assert_eq!(p.server_connections, 4);
    }

    #[test]
    fn defaults_are_nutcrackers_but_the_timeout() {
        let f = parse(MINIMAL).unwrap();
        assert_eq!(f.listen, None);
        assert_eq!(f.pool.listen, UNSET_LISTEN);
        let p = &f.pool;
        assert_eq!(p.timeout, Duration::from_millis(1000));
        assert!(!p.auto_eject_hosts);
        assert_eq!(p.server_failure_limit, 2);
        assert_eq!(p.server_retry_timeout, Duration::from_millis(30_000));
        assert_eq!(p.server_connections, 1);
        // Port 11211 is left out of the ring name, as nutcracker does.
        assert_eq!(p.servers[0].ring_name(), "127.0.0.1");
    }

    #[test]
    fn command_line_listen_wins() {
        let f = parse(PROXY_EXAMPLE).unwrap();
        let cli: SocketAddr = "0.0.0.0:5000".parse().unwrap();
        assert_eq!(f.pool_with_listen(Some(cli)).unwrap().listen, cli);
        assert_eq!(
            f.pool_with_listen(None).unwrap().listen,
            "127.0.0.1:22121".parse().unwrap()
        );
        let f = parse(MINIMAL).unwrap();
        assert_eq!(f.pool_with_listen(Some(cli)).unwrap().listen, cli);
        let e = f.pool_with_listen(None).unwrap_err().to_string();
        assert!(
            e.contains("proxy.toml") && e.contains("proxy.listen") && e.contains("--listen"),
            "{e}"
        );
    }

    #[test]
    fn ipv6_servers_hash_without_brackets() {
        let f = parse("[pool]\n[[pool.servers]]\naddr = \"[::1]:11212\"\n").unwrap();
        let s = &f.pool.servers[0];
        assert_eq!(s.addr, "[::1]:11212".parse().unwrap());
        assert_eq!(s.host, "::1");
        assert_eq!(s.ring_name(), "::1:11212");
    }

    #[test]
    fn switch_file_gives_its_pool() {
        let text = crate::EXAMPLE.replace(
            "# timeout_ms = 1000",
            "timeout_ms = 500\nauto_eject_hosts = true",
        );
        let f = parse(&text).unwrap();
        assert!(f.from_switch);
        assert_eq!((f.listen, f.workers, f.api), (None, None, None));
        let p = &f.pool;
        assert_eq!(p.servers.len(), 3);
        assert_eq!(p.servers[0].host, "10.0.0.11");
        assert_eq!(p.servers[0].addr, "10.0.0.11:11211".parse().unwrap());
        assert_eq!(p.servers[0].ring_name(), "s1");
        assert_eq!(p.timeout, Duration::from_millis(500));
        assert!(p.auto_eject_hosts);
        let cli: SocketAddr = "10.0.0.100:11211".parse().unwrap();
        assert_eq!(f.pool_with_listen(Some(cli)).unwrap().listen, cli);
        assert!(f.pool_with_listen(None).is_err());

        // Validated as the switch validates it.
        let e = error(&crate::EXAMPLE.replace("mode = \"l3\"", "mode = \"l4\""));
        assert!(e.contains("switch.mode"), "{e}");
        let e = error(&format!("{}\n[proxy]\nworkers = 2\n", crate::EXAMPLE));
        assert!(e.contains("`proxy`") && e.contains("not both"), "{e}");
    }

    #[test]
    fn errors_name_file_and_key() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "listen = \"127.0.0.1:22121\"",
                "listen = \"127.0.0.1\"",
                "proxy.listen",
            ),
            (
                "listen = \"127.0.0.1:22121\"",
                "listen = \"no-such-host.invalid:22121\"",
                "cannot resolve",
            ),
            ("# workers = 2", "workers = 0", "proxy.workers"),
            (
                "# client_connections = 10000",
                "client_connections = 0",
                "proxy.client_connections",
            ),
            (
                "# reply_budget_mib = 256",
                "reply_budget_mib = 0",
                "proxy.reply_budget_mib",
            ),
            (
                "# api = \"127.0.0.1:9111\"",
                "api = \"localhost\"",
                "proxy.api",
            ),
            ("hash = \"md5\"", "hash = \"sha1\"", "pool.hash"),
            (
                "distribution = \"ketama\"",
                "distribution = \"random\"",
                "pool.distribution",
            ),
            ("# hash_tag = \"{}\"", "hash_tag = \"{\"", "pool.hash_tag"),
            ("# timeout_ms = 1000", "timeout_ms = 0", "pool.timeout_ms"),
            ("# timeout_ms = 1000", "timeout_ms = 3600001", "3600000"),
            (
                "# server_failure_limit = 2",
                "server_failure_limit = 0",
                "pool.server_failure_limit",
            ),
            (
                "# server_retry_timeout_ms = 30000",
                "server_retry_timeout_ms = 0",
                "pool.server_retry_timeout_ms",
            ),
            (
                "# server_connections = 1",
                "server_connections = 0",
                "pool.server_connections",
            ),
            (
                "# server_connections = 1",
                "server_connections = 65",
                "1 to 64",
            ),
            ("# replicas = 1", "replicas = 9", "pool.replicas"),
            (
                "distribution = \"ketama\"",
                "distribution = \"modula\"\nreplicas = 2",
                "needs distribution = \"ketama\"",
            ),
            (
                "addr = \"localhost:11212\"",
                "addr = \"localhost\"",
                "pool.servers[1].addr",
            ),
            (
                "addr = \"localhost:11212\"",
                "addr = \"::1:11212\"",
                "brackets",
            ),
            (
                "addr = \"localhost:11212\"",
                "addr = \"no-such-host.invalid:11212\"",
                "pool.servers[1].addr",
            ),
            ("weight = 2", "weight = 0", "pool.servers[1].weight"),
            ("name = \"s1\"", "name = \"s 1\"", "pool.servers[0].name"),
            (
                "weight = 2",
                "weight = 2\nmac = \"02:00:00:00:00:0b\"",
                "pool.servers[1].mac",
            ),
            ("[proxy]", "[proxy]\nbogus = 1", "bogus"),
            ("[pool]", "[pool]\nbogus = 1", "bogus"),
            ("[proxy]", "[prxy]", "prxy"),
            ("# workers = 2", "workers = -2", "line "),
        ];
        for (from, to, want) in cases {
            let text = PROXY_EXAMPLE.replace(from, to);
            assert_ne!(text, PROXY_EXAMPLE, "{from} not in the example");
            let e = error(&text);
            assert!(e.contains("proxy.toml") && e.contains(want), "{to}: {e}");
        }
    }

    #[test]
    fn duplicate_ring_names_are_refused() {
        let text = "[pool]\n[[pool.servers]]\naddr = \"127.0.0.1:11211\"\n\
                    [[pool.servers]]\naddr = \"127.0.0.2:11211\"\nname = \"127.0.0.1\"\n";
        let e = error(text);
        assert!(
            e.contains("pool.servers[1]") && e.contains("already used"),
            "{e}"
        );
        let e = error("[pool]\nservers = []\n");
        assert!(
            e.contains("pool.servers") && e.contains("at least one"),
            "{e}"
        );
    }
}
