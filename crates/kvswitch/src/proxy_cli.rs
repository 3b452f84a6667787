//! `kvswitch proxy`: the proxy alone on ordinary sockets, configured by a kvswitch TOML file or
//! by a nutcracker (twemproxy) YAML file.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use config::api::ApiServing;
use config::cache::{self as cache_file, CacheSettings};
use config::{nutcracker, proxy as proxy_file};
use daemon::api;
use daemon::cache::CacheService;
use proxy::pool::{Pool, PoolSpec};
use proxy::{default_client_connections, default_workers, Limits, Proxy, Settings};

/// Arguments of `kvswitch proxy`.
#[derive(Debug, Clone, clap::Args)]
#[command(
    about = "Run the memcached and Redis proxy alone (no root, no switch): a drop-in \
             replacement for twemproxy",
    long_about = "Run the memcached and Redis proxy alone (no root, no switch needed).\n\n\
                  Clients speak the text, meta or binary memcached protocol over TCP; every \
                  request is routed by key (ketama, placed as twemproxy places it) over a few \
                  persistent pipelined connections per server. Multi-key gets are split per \
                  server and merged in the client's key order; stats, flush_all and verbosity \
                  go to every server.\n\n\
                  A pool with `redis: true` in a twemproxy file serves Redis (RESP2 and RESP3, \
                  inline commands, pipelining) with the same placement: MGET, MSET, DEL, UNLINK, \
                  EXISTS and TOUCH are split per server; other commands with several keys are \
                  served when their keys share a server (a hash tag keeps them together); \
                  transactions, blocking, pub/sub and keyless commands are refused with an \
                  error. redis_auth is asked of clients and given to the servers, as is \
                  redis_db. With redis_cluster: true (kvswitch's own key) the servers are \
                  nodes of one Redis Cluster: keys go by its slots, and MOVED and ASK are \
                  followed for the client.\n\n\
                  Give a kvswitch TOML file (--config; see --example-config) or a twemproxy \
                  YAML file (--nutcracker-config), which then serves each of its pools on the \
                  pool's own listen address.\n\n\
                  Memory and descriptors are bounded: a client's reading stops while 4 MiB of \
                  its replies are unwritten, and a client holding 32 MiB is cut off; all \
                  clients together hold at most --reply-budget-mib (past it no requests are \
                  read, and clients holding over 4 MiB are cut off). Client connections past \
                  --client-connections (a pool's nutcracker client_connections, too), or \
                  arriving while the process is out of descriptors, are accepted and closed at \
                  once. Both are counted in /metrics."
)]
pub struct ProxyArgs {
    /// Address clients connect to (overrides `[proxy] listen`).
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<SocketAddr>,
    /// A kvswitch configuration file (TOML) with a `[pool]` section.
    #[arg(long, short, value_name = "FILE", conflicts_with = "nutcracker_config",
          required_unless_present_any = ["nutcracker_config", "example_config"])]
    pub config: Option<PathBuf>,
    /// A twemproxy (nutcracker) configuration file (YAML); every pool in it is served.
    #[arg(long, value_name = "FILE")]
    pub nutcracker_config: Option<PathBuf>,
    /// Worker threads (default: one per core, or `[proxy] workers`).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Serve /metrics and /api/v1/status on this address (overrides `[proxy] api`).
    #[arg(long, value_name = "ADDR:PORT")]
    pub api: Option<SocketAddr>,
    /// Check the configuration, print the pools and exit.
    #[arg(long)]
    pub check: bool,
    /// Print an example proxy configuration and exit.
    #[arg(long)]
    pub example_config: bool,
    /// Client connections held at once, over every pool; more are accepted and closed at
    /// once (overrides `[proxy] client_connections`; default: the descriptor limit, `ulimit
    /// -n`, less what server connections, listeners and the API need).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub client_connections: Option<u64>,
    /// Reply bytes held for all clients together (received, not yet written), in MiB;
    /// past it no client's requests are read (overrides `[proxy] reply_budget_mib`; default
    /// 256).
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub reply_budget_mib: Option<u64>,
    /// Answer hot keys from kvswitch's own coherent cache (settings: a `[cache]` table in the
    /// TOML file; defaults otherwise). Every pool gets its own cache.
    #[arg(long)]
    pub cache: bool,
    /// Clients speak TLS: the certificate chain (PEM) every pool's address shows them, read
    /// again on SIGHUP (overrides `[proxy] tls_cert`; with --tls-key).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Clients must show a certificate signed by one of these authorities (PEM; overrides
    /// `[proxy] tls_client_ca`).
    #[arg(long, value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,
    /// Speak TLS to the servers (`memcached -Z`), checking their certificates against these
    /// authorities (PEM) and the host each server line names (overrides `[proxy]
    /// server_tls_ca`).
    #[arg(long, value_name = "FILE")]
    pub server_tls_ca: Option<PathBuf>,
    /// The certificate chain (PEM) the proxy shows servers that ask for one.
    #[arg(long, value_name = "FILE", requires = "server_tls_key")]
    pub server_tls_cert: Option<PathBuf>,
    /// The private key of --server-tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "server_tls_cert")]
    pub server_tls_key: Option<PathBuf>,
    /// Authenticate every connection to the servers with SASL PLAIN as this user
    /// (`memcached -S`; binary clients only; overrides `[proxy] server_sasl_user`).
    #[arg(long, value_name = "USER")]
    pub server_sasl_user: Option<String>,
    /// The file whose first line is the SASL user's password, read again on SIGHUP
    /// (overrides `[proxy] server_sasl_password_file`).
    #[arg(long, value_name = "FILE")]
    pub server_sasl_password_file: Option<PathBuf>,
    /// Clients must authenticate with SASL (the same user and password) before any other
    /// request, as `memcached -S` wants (overrides `[proxy] client_sasl`).
    #[arg(long)]
    pub client_sasl: bool,
    /// Serve the API over HTTPS with this certificate chain (PEM; overrides `[proxy]
    /// api_tls_cert`; with --api-tls-key). The way to HTTPS for a nutcracker file's API.
    #[arg(long, value_name = "FILE", requires = "api_tls_key")]
    pub api_tls_cert: Option<PathBuf>,
    /// The private key of --api-tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "api_tls_cert")]
    pub api_tls_key: Option<PathBuf>,
    /// The API takes only clients showing a certificate these authorities signed (PEM;
    /// overrides `[proxy] api_tls_client_ca`).
    #[arg(long, value_name = "FILE")]
    pub api_tls_client_ca: Option<PathBuf>,
}

/// What the standalone proxy's API shows: the proxy's counters and its pools' caches.
struct ProxyExporter {
    stats: Arc<proxy::ProxyStats>,
    caches: Vec<(String, Arc<CacheService>)>,
}

impl api::Exporter for ProxyExporter {
    fn metrics(&self, m: &mut ::api::metrics::Exposition) {
        self.stats.write_metrics(m);
    }

    fn status(&self) -> serde_json::Value {
        api::Exporter::status(self.stats.as_ref())
    }

    fn caches(&self) -> Vec<(String, Arc<CacheService>)> {
        self.caches.clone()
    }
}

/// Runs `kvswitch proxy` until SIGINT or SIGTERM.
pub fn run(args: ProxyArgs) -> anyhow::Result<()> {
    if args.example_config {
        print!(
            "{}\n{}",
            proxy_file::PROXY_EXAMPLE,
            cache_file::CACHE_EXAMPLE
        );
        return Ok(());
    }
    let Loaded {
        pools,
        workers,
        api: api_addr,
        serving,
        mut cache,
        limits,
        tls,
        server_tls,
        server_sasl,
    } = load(&args)?;
    let proxy::Secrets {
        tls: client_tls,
        server_tls: servers_tls,
        sasl,
    } = proxy::Secrets::load(tls.as_ref(), server_tls.as_ref(), server_sasl.as_ref())?;
    let tls_files = (tls, server_tls);
    let (tls, server_tls) = (client_tls, servers_tls);
    cache.enabled |= args.cache;
    if args.check {
        if cache.enabled {
            let c = &cache.cache;
            println!(
                "cache: {} items, {} bytes, lease {} ms, rule rate {}",
                c.items,
                c.bytes,
                c.lease.as_millis(),
                c.rules
                    .rate
                    .map_or("unlimited".to_string(), |r| format!("{r}/s"))
            );
        }
        for p in &pools {
            println!(
                "pool `{}`: {}, listen {}, {} servers, {} / {}, timeout {} ms, \
                 auto_eject_hosts {}",
                p.name,
                match &p.redis {
                    Some(r) if r.cluster => "redis cluster",
                    Some(_) => "redis",
                    None => "memcached",
                },
                p.listen,
                p.servers.len(),
                p.distribution,
                p.hash,
                p.timeout.as_millis(),
                p.auto_eject_hosts
            );
        }
        let cap = limits.client_connections.map_or_else(
            || {
                format!(
                    "{} (from the descriptor limit)",
                    default_client_connections(&pools, workers)
                )
            },
            |n| n.to_string(),
        );
        println!(
            "client connections: {cap}; reply budget: {} MiB",
            limits.reply_budget >> 20
        );
        if let Some(tls) = &tls {
            println!("clients: TLS ({tls:?})");
        }
        if server_tls.is_some() {
            println!("servers: TLS");
        }
        if let Some(sasl) = &sasl {
            println!(
                "servers: SASL PLAIN as {:?} (binary clients only)",
                sasl.user()
            );
        }
        return Ok(());
    }
    kvio::signal::install_stop_handlers();
    let api_listener = match api_addr {
        Some(addr) => {
            Some(TcpListener::bind(addr).with_context(|| format!("api: cannot listen on {addr}"))?)
        }
        None => None,
    };
    let mut caches = Vec::new();
    if cache.enabled {
        for p in &pools {
            let service = CacheService::new(cache.clone(), p.servers.len(), kvio::clock::now())?;
            caches.push((p.name.clone(), service));
        }
    }
    let ticker = caches.iter().map(|(_, c)| c.clone()).collect::<Vec<_>>();
    let pools = pools
        .into_iter()
        .map(|p| Pool::new(p).map(Arc::new))
        .collect::<Result<Vec<_>, _>>()?;
    let reload = reloader(&args, pools.clone(), caches.clone());
    kvio::signal::install_reload_handler();
    let proxy = Proxy::start(Settings {
        pools: pools.clone(),
        workers,
        source: None,
        limits,
        caches: caches.iter().map(|(_, c)| Some(c.clone())).collect(),
        tls: tls.clone(),
        server_tls: server_tls.clone(),
        server_sasl: sasl.clone(),
    })?;
    if let Some(listener) = api_listener {
        let stats: Arc<dyn api::Exporter> = Arc::new(ProxyExporter {
            stats: proxy.stats(),
            caches: caches.clone(),
        });
        let token = api::api_token(None, listener.local_addr()?)?;
        let addr = api::serve(
            listener,
            api::Api {
                exporter: stats,
                switch: None,
                token,
                pools: pools.clone(),
                reload: Some(reload.clone()),
                egress: None,
                serving,
            },
        )?;
        tracing::info!(api = %addr, "control API listening");
    }
    while !kvio::signal::stop_requested() {
        std::thread::sleep(Duration::from_millis(10));
        // Segments roll and held-back rule removals are released even when no read comes.
        let now = kvio::clock::now();
        for cache in &ticker {
            cache.tick(now);
        }
        if kvio::signal::reload_requested() {
            api::pools::reload_on_hangup(&reload);
            ::api::server::reload_tls();
            secrets_changed(&args, &tls_files, &server_sasl);
            proxy.stats().reload_secrets();
        }
    }
    tracing::info!("stopping");
    proxy.stop();
    Ok(())
}

/// On SIGHUP: whether the TLS or SASL settings name other files, or add or remove TLS or
/// SASL, which takes a restart; said in the log (the files in use are read again anyway).
fn secrets_changed(
    args: &ProxyArgs,
    running: &(
        Option<proxy_file::TlsFiles>,
        Option<proxy_file::ServerTlsFiles>,
    ),
    sasl: &Option<proxy_file::SaslFiles>,
) {
    if let Ok(now) = load(args) {
        if (&now.tls, &now.server_tls, &now.server_sasl) != (&running.0, &running.1, sasl) {
            tracing::error!(
                "the TLS or SASL settings changed: restart the proxy to use them; the running \
                 ones are kept, their files read again"
            );
        }
    }
}

/// Reads the proxy's configuration file (TOML or nutcracker YAML) again and changes the
/// pools' servers and weights to its.
fn reloader(
    args: &ProxyArgs,
    pools: Vec<Arc<Pool>>,
    caches: Vec<(String, Arc<CacheService>)>,
) -> api::pools::Reloader {
    let args = ProxyArgs {
        check: false,
        example_config: false,
        ..args.clone()
    };
    Arc::new(move || {
        let specs = load(&args)?.pools;
        api::pools::apply(&pools, &specs, &caches)
    })
}

/// What `kvswitch proxy` runs, from its files and arguments.
struct Loaded {
    pools: Vec<PoolSpec>,
    workers: usize,
    /// Where its API listens, if it has one.
    api: Option<SocketAddr>,
    serving: ApiServing,
    cache: CacheSettings,
    limits: Limits,
    /// Clients speak TLS.
    tls: Option<proxy_file::TlsFiles>,
    /// The servers are spoken to over TLS.
    server_tls: Option<proxy_file::ServerTlsFiles>,
    /// Connections to the servers authenticate with SASL.
    server_sasl: Option<proxy_file::SaslFiles>,
}

/// The limits from the command line, over the file's (`client_connections`, the reply budget
/// in bytes).
fn limits(args: &ProxyArgs, file_cap: Option<usize>, file_budget: Option<usize>) -> Limits {
    let defaults = Limits::default();
    Limits {
        client_connections: args
            .client_connections
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
            .or(file_cap),
        reply_budget: args
            .reply_budget_mib
            .map(|mib| (mib << 20) as usize)
            .or(file_budget)
            .unwrap_or(defaults.reply_budget),
        ..defaults
    }
}

fn load(args: &ProxyArgs) -> anyhow::Result<Loaded> {
    if let Some(workers) = args.workers {
        anyhow::ensure!(
            (1..=256).contains(&workers),
            "--workers {workers}: use 1 to 256"
        );
    }
    if let Some(path) = &args.nutcracker_config {
        let mut pools = nutcracker::load_nutcracker(path)?;
        let mut limits = limits(args, None, None);
        // Read again for the caps alone: the load above has checked the file.
        let text =
            config::read_file(path).with_context(|| format!("cannot read {}", path.display()))?;
        limits.pool_client_connections = nutcracker::client_connections(&text);
        if let Some(listen) = args.listen {
            anyhow::ensure!(
                pools.len() == 1,
                "--listen can only replace the address of a file with one pool; {} has {}",
                path.display(),
                pools.len()
            );
            pools[0].listen = listen;
        }
        let workers = args.workers.unwrap_or_else(default_workers);
        return Ok(Loaded {
            pools,
            workers,
            api: args.api,
            serving: api_serving_of(args, ApiServing::default())?,
            cache: CacheSettings::default(),
            limits,
            tls: tls_of(args, None)?,
            server_tls: server_tls_of(args, None)?,
            server_sasl: sasl_of(args, None)?,
        });
    }
    let path = args
        .config
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("give --config or --nutcracker-config"))?;
    let file = proxy_file::load_toml(path)?;
    let pool = file.pool_with_listen(args.listen)?;
    let workers = args
        .workers
        .or(file.workers)
        .unwrap_or_else(default_workers);
    Ok(Loaded {
        pools: vec![pool],
        workers,
        api: args.api.or(file.api),
        serving: api_serving_of(args, file.api_serving)?,
        cache: file.cache,
        limits: limits(args, file.client_connections, file.reply_budget),
        tls: tls_of(args, file.tls)?,
        server_tls: server_tls_of(args, file.server_tls)?,
        server_sasl: sasl_of(args, file.server_sasl)?,
    })
}

/// How the API serves: the file's settings, its TLS files each replaced by the command
/// line's where it gives one.
fn api_serving_of(args: &ProxyArgs, file: ApiServing) -> anyhow::Result<ApiServing> {
    let (cert, key) = match (&args.api_tls_cert, &args.api_tls_key, &file.tls) {
        (Some(cert), Some(key), _) => (Some(cert.clone()), Some(key.clone())),
        (_, _, Some(f)) => (Some(f.cert.clone()), Some(f.key.clone())),
        _ => (None, None),
    };
    let client_ca =
        (args.api_tls_client_ca.clone()).or(file.tls.as_ref().and_then(|f| f.client_ca.clone()));
    let tls =
        proxy_file::TlsFiles::from_parts(cert, key, client_ca, |k| setting(&format!("api_{k}")))
            .map_err(|(k, e)| anyhow::anyhow!("{k}: {e}"))?;
    Ok(ApiServing { tls, ..file })
}

/// The servers' SASL user and password file, and whether clients must authenticate: the
/// file's, each replaced by the command line's where it gives one.
fn sasl_of(
    args: &ProxyArgs,
    file: Option<proxy_file::SaslFiles>,
) -> anyhow::Result<Option<proxy_file::SaslFiles>> {
    let (user, password_file, clients) = file.map_or((None, None, false), |f| {
        (Some(f.user), Some(f.password_file), f.clients)
    });
    let sasl = proxy_file::SaslFiles::from_parts(
        args.server_sasl_user.clone().or(user),
        args.server_sasl_password_file.clone().or(password_file),
        setting,
    )
    .map_err(|(k, e)| anyhow::anyhow!("{k}: {e}"))?;
    let clients = clients || args.client_sasl;
    match sasl {
        Some(s) => Ok(Some(proxy_file::SaslFiles { clients, ..s })),
        None if clients => anyhow::bail!(
            "--client-sasl ([proxy] client_sasl): clients authenticate with the servers' user \
             and password; give --server-sasl-user and --server-sasl-password-file too"
        ),
        None => Ok(None),
    }
}

/// The clients' TLS files: the file's, each of them replaced by the command line's where it
/// gives one (a certificate and its key go together).
fn tls_of(
    args: &ProxyArgs,
    file: Option<proxy_file::TlsFiles>,
) -> anyhow::Result<Option<proxy_file::TlsFiles>> {
    let (cert, key) = match (&args.tls_cert, &args.tls_key, &file) {
        (Some(cert), Some(key), _) => (Some(cert.clone()), Some(key.clone())),
        (_, _, Some(f)) => (Some(f.cert.clone()), Some(f.key.clone())),
        _ => (None, None),
    };
    let client_ca = (args.tls_client_ca.clone()).or(file.and_then(|f| f.client_ca));
    proxy_file::TlsFiles::from_parts(cert, key, client_ca, setting)
        .map_err(|(k, e)| anyhow::anyhow!("{k}: {e}"))
}

/// The servers' TLS files: the file's, each replaced by the command line's where it gives one.
fn server_tls_of(
    args: &ProxyArgs,
    file: Option<proxy_file::ServerTlsFiles>,
) -> anyhow::Result<Option<proxy_file::ServerTlsFiles>> {
    let (file_ca, file_own) = file.map_or((None, None), |f| (Some(f.ca), f.own));
    let (cert, key) = match (&args.server_tls_cert, &args.server_tls_key, file_own) {
        (Some(cert), Some(key), _) => (Some(cert.clone()), Some(key.clone())),
        (_, _, Some((cert, key))) => (Some(cert), Some(key)),
        _ => (None, None),
    };
    let ca = args.server_tls_ca.clone().or(file_ca);
    proxy_file::ServerTlsFiles::from_parts(ca, cert, key, setting)
        .map_err(|(k, e)| anyhow::anyhow!("{k}: {e}"))
}

/// A TLS setting's names, on the command line and in the file.
fn setting(key: &str) -> String {
    format!("--{} ([proxy] {key})", key.replace('_', "-"))
}
