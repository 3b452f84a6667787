//! What the proxy counts, and each server's health, shared by the workers and read by the
//! control API. Everything is an atomic: workers never wait for each other or for a reader.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use api::metrics::{Exposition, Kind};
use kv::Instant;

use switch::pool::{Pool, PoolSpec};

pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

pub(crate) fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

pub(crate) fn sub(counter: &AtomicU64, n: u64) {
    counter.fetch_sub(n, Ordering::Relaxed);
}

/// Counters and health of every pool, and what the proxy as a whole holds for its clients.
pub struct ProxyStats {
    pub pools: Vec<Arc<PoolStats>>,
    /// Client connections open, over every pool and worker (checked against
    /// [`Limits::client_connections`](crate::Limits::client_connections)).
    pub clients_open: AtomicU64,
    /// Outstanding reply bytes of every client (see [`crate::Limits`]), checked against
    /// [`Limits::reply_budget`](crate::Limits::reply_budget).
    pub reply_bytes: AtomicU64,
    /// The most `reply_bytes` ever held.
    pub reply_bytes_peak: AtomicU64,
    /// The limits in force, for the metrics.
    pub reply_budget: u64,
    pub client_cap: u64,
    started: std::time::Instant,
    /// TLS towards clients and servers, and SASL towards servers: counted in the metrics,
    /// their files read again by [`ProxyStats::reload_secrets`].
    secrets: Secrets,
}

/// The proxy's TLS configurations and SASL credentials in use.
#[derive(Clone, Default)]
pub struct Secrets {
    pub tls: Option<Arc<crate::tls::ClientTls>>,
    pub server_tls: Option<Arc<crate::tls::ServerTls>>,
    pub sasl: Option<Arc<crate::sasl::Sasl>>,
}

impl Secrets {
    /// Loads what a configuration names: the clients' TLS files, the servers' TLS files, the
    /// servers' SASL user and password (and whether clients must authenticate). An error
    /// names the file that does not load.
    pub fn load(
        tls: Option<&config::proxy::TlsFiles>,
        server_tls: Option<&config::proxy::ServerTlsFiles>,
        sasl: Option<&config::proxy::SaslFiles>,
    ) -> anyhow::Result<Secrets> {
        let tls = tls
            .map(|f| {
                crate::tls::ClientTls::load(f.cert.clone(), f.key.clone(), f.client_ca.clone())
            })
            .transpose()?
            .map(Arc::new);
        let server_tls = server_tls
            .map(|f| crate::tls::ServerTls::load(f.ca.clone(), f.own.clone()))
            .transpose()?
            .map(Arc::new);
        let sasl = match sasl {
            None => None,
            Some(f) => {
                let sasl = crate::sasl::Sasl::load(f.user.clone(), f.password_file.clone())?;
                Some(Arc::new(if f.clients {
                    sasl.requiring_clients()
                } else {
                    sasl
                }))
            }
        };
        Ok(Secrets {
            tls,
            server_tls,
            sasl,
        })
    }
}

impl ProxyStats {
    pub(crate) fn new(pools: &[Arc<Pool>], limits: &crate::Limits, secrets: Secrets) -> ProxyStats {
        ProxyStats {
            pools: pools
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let cap = limits.pool_client_connections.get(i).copied().flatten();
                    Arc::new(PoolStats::new(p, cap))
                })
                .collect(),
            clients_open: AtomicU64::new(0),
            reply_bytes: AtomicU64::new(0),
            reply_bytes_peak: AtomicU64::new(0),
            reply_budget: limits.reply_budget as u64,
            client_cap: limits.client_connections.unwrap_or(usize::MAX) as u64,
            started: std::time::Instant::now(),
            secrets,
        }
    }

    /// Reads the TLS files and the SASL password file in use again (SIGHUP): new connections
    /// use them, open ones keep theirs; a file that does not load leaves the old one in use.
    /// The log says what came of each.
    pub fn reload_secrets(&self) {
        let Secrets {
            tls,
            server_tls,
            sasl,
        } = &self.secrets;
        let outcomes = [
            ("clients' TLS files", tls.as_ref().map(|t| t.reload())),
            (
                "servers' TLS files",
                server_tls.as_ref().map(|t| t.reload()),
            ),
            ("servers' SASL password", sasl.as_ref().map(|s| s.reload())),
        ];
        for (what, outcome) in outcomes {
            match outcome {
                None => {}
                Some(Ok(())) => tracing::info!("the {what} read again"),
                Some(Err(e)) => tracing::error!("the {what} kept as they were: {e:#}"),
            }
        }
    }

    /// Counts `n` more outstanding reply bytes; returns the new total.
    pub(crate) fn hold(&self, n: usize) -> u64 {
        let total = self.reply_bytes.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
        self.reply_bytes_peak.fetch_max(total, Ordering::Relaxed);
        total
    }

    pub(crate) fn release(&self, n: usize) {
        self.reply_bytes.fetch_sub(n as u64, Ordering::Relaxed);
    }
}

/// Why a client was cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutOff {
    /// It held more than [`Limits::client_reply_max`](crate::Limits::client_reply_max).
    ReplyLimit,
    /// The proxy as a whole held more than its budget and this client more than its share.
    ReplyBudget,
}

impl CutOff {
    pub fn label(self) -> &'static str {
        match self {
            CutOff::ReplyLimit => "reply_limit",
            CutOff::ReplyBudget => "reply_budget",
        }
    }
}

/// Why a connection was accepted and closed at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The process's or the pool's client connection cap.
    Limit,
    /// Out of descriptors (`EMFILE`, `ENFILE`): accepted on the reserve descriptor.
    Descriptors,
}

impl Refused {
    pub fn label(self) -> &'static str {
        match self {
            Refused::Limit => "limit",
            Refused::Descriptors => "descriptors",
        }
    }
}

/// One pool's client-side counters and its servers.
pub struct PoolStats {
    /// The pool and its servers' health, shared with the switch's UDP path when the proxy
    /// runs inside the switch.
    pub pool: Arc<Pool>,
    pub spec: PoolSpec,
    pub client_connections: AtomicU64,
    pub client_connections_total: AtomicU64,
    /// Requests read from clients, each counted once however many servers it needed.
    pub requests: AtomicU64,
    /// Requests answered by the proxy itself (`mn`, NOOP, errors it detected).
    pub local_replies: AtomicU64,
    /// Reads answered from the cache.
    pub cache_replies: AtomicU64,
    /// Items a server warming up was given from where their keys were before.
    pub warm_fills: AtomicU64,
    /// Redis Cluster redirections followed: `MOVED` (a slot moved for good) and `ASK` (a
    /// slot moving).
    pub redis_moved: AtomicU64,
    pub redis_asks: AtomicU64,
    /// Malformed requests (answered as memcached answers them).
    pub client_errors: AtomicU64,
    /// Clients cut off for holding too many reply bytes, by [`CutOff`] reason.
    pub clients_cut_off: [AtomicU64; 2],
    /// Connections accepted and closed at once, by [`Refused`] reason.
    pub clients_refused: [AtomicU64; 2],
    /// The pool's own cap on client connections (nutcracker's `client_connections`).
    pub client_cap: Option<usize>,
    /// Outstanding reply bytes of the pool's clients.
    pub reply_bytes: AtomicU64,
    /// Reply bytes that arrived for clients already cut off or gone, thrown away unheld.
    pub reply_bytes_discarded: AtomicU64,
    pub bytes_from_clients: AtomicU64,
    pub bytes_to_clients: AtomicU64,
    pub servers: Vec<ServerStats>,
    /// Time from a forwarded request's parsing to its reply being ready, by command (the
    /// index into [`COMMANDS`]).
    pub commands: [RequestTime; COMMANDS.len()],
}

/// The commands the proxy times apart (memcached's, text and binary under one name, and
/// Redis's most used); any other is timed as `other`, so the label's values stay few.
pub const COMMANDS: [&str; 26] = [
    "get", "gets", "gat", "gats", "set", "add", "replace", "append", "prepend", "cas", "delete",
    "incr", "decr", "touch", "mg", "ms", "md", "ma", "del", "mget", "mset", "exists", "expire",
    "hget", "hset", "other",
];

/// The index in [`COMMANDS`] of a command's lowercase name; `other` when it is not listed.
pub fn command_index(name: &[u8]) -> usize {
    COMMANDS
        .iter()
        .position(|c| c.as_bytes() == name)
        .unwrap_or(COMMANDS.len() - 1)
}

/// The index in [`COMMANDS`] of a memcached command: a binary opcode under its text name,
/// its quiet and key-returning forms included.
pub fn memcache_command_index(command: wire::memcache::Command) -> usize {
    use wire::memcache::binary::opcode as op;
    use wire::memcache::Command;
    let name = match command {
        Command::Binary(code) => match code {
            op::GET | op::GETQ | op::GETK | op::GETKQ => "get",
            op::SET | op::SETQ => "set",
            op::ADD | op::ADDQ => "add",
            op::REPLACE | op::REPLACEQ => "replace",
            op::DELETE | op::DELETEQ => "delete",
            op::INCREMENT | op::INCREMENTQ => "incr",
            op::DECREMENT | op::DECREMENTQ => "decr",
            op::APPEND | op::APPENDQ => "append",
            op::PREPEND | op::PREPENDQ => "prepend",
            op::TOUCH => "touch",
            op::GAT | op::GATQ | op::GATK | op::GATKQ => "gat",
            _ => "other",
        },
        other => other.name().unwrap_or("other"),
    };
    command_index(name.as_bytes())
}

impl PoolStats {
    fn new(pool: &Arc<Pool>, client_cap: Option<usize>) -> PoolStats {
        let spec = pool.spec();
        PoolStats {
            pool: pool.clone(),
            spec: (*spec).clone(),
            client_connections: AtomicU64::new(0),
            client_connections_total: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            local_replies: AtomicU64::new(0),
            cache_replies: AtomicU64::new(0),
            warm_fills: AtomicU64::new(0),
            redis_moved: AtomicU64::new(0),
            redis_asks: AtomicU64::new(0),
            client_errors: AtomicU64::new(0),
            clients_cut_off: Default::default(),
            clients_refused: Default::default(),
            client_cap,
            reply_bytes: AtomicU64::new(0),
            reply_bytes_discarded: AtomicU64::new(0),
            bytes_from_clients: AtomicU64::new(0),
            bytes_to_clients: AtomicU64::new(0),
            commands: Default::default(),
            // Room for servers added at run time.
            servers: (0..spec.servers.len().max(switch::pool::MAX_SERVERS))
                .map(|_| ServerStats::default())
                .collect(),
        }
    }

    /// Records a failed connection, connect or timeout on server `i`; the pool ejects it when
    /// it says so and it has failed `server_failure_limit` times in a row.
    pub(crate) fn server_failed(&self, i: usize, now: Instant) {
        add(&self.servers[i].failures, 1);
        if self.pool.failed(i, now) {
            add(&self.servers[i].ejections, 1);
            tracing::warn!(
                pool = %self.spec.name, server = %self.pool.spec().servers[i].label(),
                retry_in_ms = self.spec.server_retry_timeout.as_millis() as u64,
                "server ejected"
            );
        }
    }

    pub(crate) fn cut_off(&self, why: CutOff) {
        add(&self.clients_cut_off[why as usize], 1);
    }

    pub(crate) fn refused(&self, why: Refused) {
        add(&self.clients_refused[why as usize], 1);
    }

    /// Records a reply from server `i`: its failure streak ends.
    pub(crate) fn server_answered(&self, i: usize) {
        self.pool.answered(i);
    }
}

/// One server's counters and health.
#[derive(Default)]
pub struct ServerStats {
    /// Requests sent (a split multi-get counts once per server it reached).
    pub requests: AtomicU64,
    /// Requests that got the server's reply.
    pub replies: AtomicU64,
    /// Requests answered with a proxy `SERVER_ERROR` because of this server.
    pub errors: AtomicU64,
    pub timeouts: AtomicU64,
    /// Connections dropped because the server's replies no longer lined up with the requests
    /// sent (a batch's sentinel missing or out of place, or a reply that does not frame).
    pub out_of_step: AtomicU64,
    /// Batch sentinels on text connections that memcached answered as a hit or a miss: reads
    /// it counted that no client made, taken out of its `stats` again.
    pub sentinel_hits: AtomicU64,
    pub sentinel_misses: AtomicU64,
    /// Connect failures, lost connections and timeouts.
    pub failures: AtomicU64,
    /// Times the proxy's failures took the server out of the ring.
    pub ejections: AtomicU64,
    pub connections: AtomicU64,
    pub connects: AtomicU64,
    pub in_flight: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub bytes_received: AtomicU64,
    /// Time from queueing to reply of each request answered.
    pub request_time: RequestTime,
}

/// The upper bounds of [`RequestTime`]'s buckets, in microseconds.
pub const REQUEST_TIME_BOUNDS_US: [u64; 15] = [
    25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000,
];

/// A histogram of request times, written to by every worker at once.
#[derive(Default)]
pub struct RequestTime {
    /// Observations per bucket (not cumulative); the last holds those above every bound.
    buckets: [AtomicU64; REQUEST_TIME_BOUNDS_US.len() + 1],
    sum_ns: AtomicU64,
}

impl RequestTime {
    pub fn observe(&self, took: std::time::Duration) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let i = REQUEST_TIME_BOUNDS_US.partition_point(|&bound| bound < us);
        add(&self.buckets[i], 1);
        add(
            &self.sum_ns,
            u64::try_from(took.as_nanos()).unwrap_or(u64::MAX),
        );
    }

    /// The cumulative buckets (bound in seconds, observations at most that), the sum in
    /// seconds and the count. The count is the buckets' own total, so that a scrape taken
    /// while workers observe never shows a bucket above it.
    pub fn snapshot(&self) -> (Vec<(f64, u64)>, f64, u64) {
        let mut total = 0;
        let buckets = REQUEST_TIME_BOUNDS_US
            .iter()
            .zip(&self.buckets)
            .map(|(&bound, n)| {
                total += get(n);
                (bound as f64 / 1e6, total)
            })
            .collect();
        let count = total + get(&self.buckets[REQUEST_TIME_BOUNDS_US.len()]);
        (buckets, get(&self.sum_ns) as f64 / 1e9, count)
    }
}

impl ProxyStats {
    /// Appends the proxy's families to a Prometheus text exposition.
    pub fn write_metrics(&self, m: &mut Exposition) {
        type PoolField = fn(&PoolStats) -> u64;
        let pool_families: [(&str, Kind, &str, PoolField); 13] = [
            (
                "kvswitch_proxy_client_connections",
                Kind::Gauge,
                "Client connections open.",
                |p| get(&p.client_connections),
            ),
            (
                "kvswitch_proxy_client_connections_total",
                Kind::Counter,
                "Client connections accepted.",
                |p| get(&p.client_connections_total),
            ),
            (
                "kvswitch_proxy_requests_total",
                Kind::Counter,
                "Requests read from clients.",
                |p| get(&p.requests),
            ),
            (
                "kvswitch_proxy_local_replies_total",
                Kind::Counter,
                "Requests the proxy answered itself (no-ops, errors).",
                |p| get(&p.local_replies),
            ),
            (
                "kvswitch_proxy_cache_replies_total",
                Kind::Counter,
                "Reads answered from the cache.",
                |p| get(&p.cache_replies),
            ),
            (
                "kvswitch_proxy_warm_fills_total",
                Kind::Counter,
                "Items a server warming up was given from the server that held their keys before.",
                |p| get(&p.warm_fills),
            ),
            (
                "kvswitch_proxy_redis_moved_total",
                Kind::Counter,
                "Redis Cluster MOVED redirections followed (a slot found on another node).",
                |p| get(&p.redis_moved),
            ),
            (
                "kvswitch_proxy_redis_asks_total",
                Kind::Counter,
                "Redis Cluster ASK redirections followed (a request to a slot being migrated).",
                |p| get(&p.redis_asks),
            ),
            (
                "kvswitch_proxy_client_errors_total",
                Kind::Counter,
                "Malformed or refused client requests.",
                |p| get(&p.client_errors),
            ),
            (
                "kvswitch_proxy_client_reply_bytes",
                Kind::Gauge,
                "Reply bytes received from the servers and not yet written to the pool's clients.",
                |p| get(&p.reply_bytes),
            ),
            (
                "kvswitch_proxy_reply_bytes_discarded_total",
                Kind::Counter,
                "Reply bytes thrown away as they arrived, for clients cut off or gone.",
                |p| get(&p.reply_bytes_discarded),
            ),
            (
                "kvswitch_proxy_client_bytes_received_total",
                Kind::Counter,
                "Bytes read from clients.",
                |p| get(&p.bytes_from_clients),
            ),
            (
                "kvswitch_proxy_client_bytes_sent_total",
                Kind::Counter,
                "Bytes written to clients.",
                |p| get(&p.bytes_to_clients),
            ),
        ];
        for (name, kind, help, field) in pool_families {
            m.family(name, kind, help);
            for p in &self.pools {
                m.sample(name, &[("pool", &p.spec.name)], field(p));
            }
        }
        type ReasonField = fn(&PoolStats, usize) -> u64;
        let reasons: [(&str, &str, &[&str], ReasonField); 2] = [
            (
                "kvswitch_proxy_clients_overflowed_total",
                "Clients cut off for holding too many unwritten reply bytes (reply_limit: their \
                 own limit; reply_budget: the proxy's budget was spent).",
                &[CutOff::ReplyLimit.label(), CutOff::ReplyBudget.label()],
                |p, i| get(&p.clients_cut_off[i]),
            ),
            (
                "kvswitch_proxy_clients_refused_total",
                "Client connections accepted and closed at once (limit: the connection cap; \
                 descriptors: out of file descriptors).",
                &[Refused::Limit.label(), Refused::Descriptors.label()],
                |p, i| get(&p.clients_refused[i]),
            ),
        ];
        for (name, help, labels, field) in reasons {
            m.family(name, Kind::Counter, help);
            for p in &self.pools {
                for (i, reason) in labels.iter().enumerate() {
                    m.sample(
                        name,
                        &[("pool", &p.spec.name), ("reason", reason)],
                        field(p, i),
                    );
                }
            }
        }
        let process: [(&str, &str, u64); 4] = [
            (
                "kvswitch_proxy_reply_bytes",
                "Reply bytes held for all clients: received from the servers, not yet written.",
                get(&self.reply_bytes),
            ),
            (
                "kvswitch_proxy_reply_bytes_peak",
                "The most reply bytes ever held for all clients at once.",
                get(&self.reply_bytes_peak),
            ),
            (
                "kvswitch_proxy_reply_budget_bytes",
                "Reply bytes the proxy holds for all clients before it stops reading requests.",
                self.reply_budget,
            ),
            (
                "kvswitch_proxy_client_connections_limit",
                "Client connections the proxy holds at once; more are accepted and closed.",
                self.client_cap,
            ),
        ];
        for (name, help, value) in process {
            m.single(name, Kind::Gauge, help, value);
        }
        type ServerField = fn(&ServerStats) -> u64;
        let server_families: [(&str, Kind, &str, ServerField); 12] = [
            (
                "kvswitch_proxy_server_requests_total",
                Kind::Counter,
                "Requests sent to the server.",
                |s| get(&s.requests),
            ),
            (
                "kvswitch_proxy_server_replies_total",
                Kind::Counter,
                "Replies read from the server.",
                |s| get(&s.replies),
            ),
            (
                "kvswitch_proxy_server_errors_total",
                Kind::Counter,
                "Requests failed with a proxy error because of the server.",
                |s| get(&s.errors),
            ),
            (
                "kvswitch_proxy_server_timeouts_total",
                Kind::Counter,
                "Requests that timed out.",
                |s| get(&s.timeouts),
            ),
            (
                "kvswitch_proxy_server_out_of_step_total",
                Kind::Counter,
                "Connections dropped because the replies no longer lined up with the requests.",
                |s| get(&s.out_of_step),
            ),
            (
                "kvswitch_proxy_server_failures_total",
                Kind::Counter,
                "Failed connects, lost connections and timeouts.",
                |s| get(&s.failures),
            ),
            (
                "kvswitch_proxy_server_ejections_total",
                Kind::Counter,
                "Times the server was taken out of the ring.",
                |s| get(&s.ejections),
            ),
            (
                "kvswitch_proxy_server_connections",
                Kind::Gauge,
                "Connections open to the server.",
                |s| get(&s.connections),
            ),
            (
                "kvswitch_proxy_server_connects_total",
                Kind::Counter,
                "Connections made to the server.",
                |s| get(&s.connects),
            ),
            (
                "kvswitch_proxy_server_in_flight",
                Kind::Gauge,
                "Requests sent and not yet answered.",
                |s| get(&s.in_flight),
            ),
            (
                "kvswitch_proxy_server_bytes_sent_total",
                Kind::Counter,
                "Bytes written to the server.",
                |s| get(&s.bytes_sent),
            ),
            (
                "kvswitch_proxy_server_bytes_received_total",
                Kind::Counter,
                "Bytes read from the server.",
                |s| get(&s.bytes_received),
            ),
        ];
        // The pools' servers, those removed left out.
        let servers: Vec<(&PoolStats, usize, String, &ServerStats)> = self
            .pools
            .iter()
            .flat_map(|p| {
                let spec = p.pool.spec();
                spec.servers
                    .iter()
                    .zip(&p.servers)
                    .enumerate()
                    .filter(|(i, _)| !p.pool.health(*i).removed)
                    .map(|(i, (server, s))| (p.as_ref(), i, server.label(), s))
                    .collect::<Vec<_>>()
            })
            .collect();
        for (name, kind, help, field) in server_families {
            m.family(name, kind, help);
            for (p, _, label, s) in &servers {
                m.sample(name, &[("pool", &p.spec.name), ("server", label)], field(s));
            }
        }
        let now = kvio::clock::now();
        m.family(
            "kvswitch_proxy_server_up",
            Kind::Gauge,
            "1 while the server is in the ring, 0 while ejected.",
        );
        for (p, i, label, _) in &servers {
            m.sample(
                "kvswitch_proxy_server_up",
                &[("pool", &p.spec.name), ("server", label)],
                u8::from(!p.pool.is_down(*i, now)),
            );
        }
        m.family(
            "kvswitch_proxy_server_request_seconds",
            Kind::Histogram,
            "Time from a request's queueing for the server to its reply, in seconds (requests \
             that failed or timed out are not counted).",
        );
        for (p, _, label, s) in &servers {
            let (buckets, sum, count) = s.request_time.snapshot();
            m.histogram(
                "kvswitch_proxy_server_request_seconds",
                &[("pool", &p.spec.name), ("server", label)],
                &buckets,
                sum,
                count,
            );
        }
        m.family(
            "kvswitch_proxy_command_request_seconds",
            Kind::Histogram,
            "Time from a forwarded request's parsing to its reply being ready for the client, \
             by command (requests answered by the proxy or its cache are not \
             counted; commands not listed apart are `other`).",
        );
        for p in &self.pools {
            for (command, time) in COMMANDS.iter().zip(&p.commands) {
                let (buckets, sum, count) = time.snapshot();
                if count > 0 {
                    m.histogram(
                        "kvswitch_proxy_command_request_seconds",
                        &[("pool", &p.spec.name), ("command", command)],
                        &buckets,
                        sum,
                        count,
                    );
                }
            }
        }
        write_tls_metrics(
            m,
            self.secrets.tls.as_deref(),
            self.secrets.server_tls.as_deref(),
        );
        if let Some(sasl) = &self.secrets.sasl {
            sasl.write_metrics(m);
        }
    }

    /// The proxy's part of the status document: pools, their settings and each server's
    /// health and counters.
    pub fn status(&self) -> serde_json::Value {
        use serde_json::json;
        let now = kvio::clock::now();
        let pools: Vec<_> = self
            .pools
            .iter()
            .map(|p| {
                let spec = &p.spec;
                let current = p.pool.spec();
                let servers: Vec<_> = current
                    .servers
                    .iter()
                    .zip(&p.servers)
                    .enumerate()
                    .filter(|(i, _)| !p.pool.health(*i).removed)
                    .map(|(i, (server, s))| {
                        let until = p.pool.health(i).down_until.unwrap_or(now);
                        let health = if until > now {
                            "ejected"
                        } else if get(&s.connections) > 0 {
                            "up"
                        } else if get(&s.failures) > 0 && get(&s.replies) == 0 {
                            "unreachable"
                        } else {
                            "idle"
                        };
                        json!({
                            "name": server.label(),
                            "addr": server.addr.to_string(),
                            "ring_name": server.ring_name(),
                            "weight": server.weight,
                            "health": health,
                            "ejected_for_ms": until.duration_since(now).as_millis() as u64,
                            "requests": get(&s.requests),
                            "replies": get(&s.replies),
                            "errors": get(&s.errors),
                            "timeouts": get(&s.timeouts),
                            "out_of_step": get(&s.out_of_step),
                            "failures": get(&s.failures),
                            "ejections": get(&s.ejections),
                            "connections": get(&s.connections),
                            "in_flight": get(&s.in_flight),
                            "bytes_sent": get(&s.bytes_sent),
                            "bytes_received": get(&s.bytes_received),
                        })
                    })
                    .collect();
                json!({
                    "name": spec.name,
                    "listen": spec.listen.to_string(),
                    "distribution": spec.distribution.to_string(),
                    "hash": spec.hash.to_string(),
                    "timeout_ms": spec.timeout.as_millis() as u64,
                    "auto_eject_hosts": spec.auto_eject_hosts,
                    "server_failure_limit": spec.server_failure_limit,
                    "server_retry_timeout_ms": spec.server_retry_timeout.as_millis() as u64,
                    "client_connections": get(&p.client_connections),
                    "requests": get(&p.requests),
                    "local_replies": get(&p.local_replies),
                    "cache_replies": get(&p.cache_replies),
                    "warm_fills": get(&p.warm_fills),
                    "redis_moved": get(&p.redis_moved),
                    "redis_asks": get(&p.redis_asks),
                    "client_errors": get(&p.client_errors),
                    "client_connections_limit": p.client_cap,
                    "reply_bytes": get(&p.reply_bytes),
                    "clients_cut_off": {
                        "reply_limit": get(&p.clients_cut_off[CutOff::ReplyLimit as usize]),
                        "reply_budget": get(&p.clients_cut_off[CutOff::ReplyBudget as usize]),
                    },
                    "clients_refused": {
                        "limit": get(&p.clients_refused[Refused::Limit as usize]),
                        "descriptors": get(&p.clients_refused[Refused::Descriptors as usize]),
                    },
                    "servers": servers,
                })
            })
            .collect();
        json!({
            "uptime_s": self.started.elapsed().as_secs_f64(),
            "client_connections": get(&self.clients_open),
            "client_connections_limit": self.client_cap,
            "reply_bytes": get(&self.reply_bytes),
            "reply_bytes_peak": get(&self.reply_bytes_peak),
            "reply_budget_bytes": self.reply_budget,
            "pools": pools,
        })
    }
}

/// The proxy's TLS families of `/metrics`: the clients' side and the servers'.
fn write_tls_metrics(
    m: &mut Exposition,
    clients: Option<&crate::tls::ClientTls>,
    servers: Option<&crate::tls::ServerTls>,
) {
    if let Some(tls) = clients {
        m.tls(
            "kvswitch_proxy_tls",
            [
                "Clients' TLS handshakes, by how they ended (failed: refused by either side, \
                 such as a client that does not trust the certificate; timed_out: not done in \
                 10 s).",
                "Times the certificate files were read again (SIGHUP), by outcome (refused: the \
                 files in use were kept).",
            ],
            &tls.counts(),
        );
    }
    if let Some(tls) = servers {
        m.tls(
            "kvswitch_proxy_server_tls",
            [
                "TLS handshakes with the servers, by how they ended (failed: such as a server \
                 whose certificate is not trusted or names another host; timed_out: not done \
                 within the pool's timeout, on a connection that carries requests).",
                "Times the servers' TLS files were read again (SIGHUP), by outcome (refused: \
                 the files in use were kept).",
            ],
            &tls.counts(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::memcache::binary::opcode;
    use wire::memcache::Command;

    #[test]
    fn a_command_is_timed_under_one_name_whatever_its_protocol() {
        let name = |c| COMMANDS[memcache_command_index(c)];
        assert_eq!(name(Command::Get), "get");
        assert_eq!(name(Command::Binary(opcode::GETKQ)), "get");
        assert_eq!(name(Command::Binary(opcode::SETQ)), "set");
        assert_eq!(name(Command::MetaGet), "mg");
        assert_eq!(name(Command::Binary(opcode::NOOP)), "other");
        assert_eq!(name(Command::Misc), "other");
        assert_eq!(COMMANDS[command_index(b"hset")], "hset");
        assert_eq!(COMMANDS[command_index(b"zadd")], "other");
        // Every name is listed once.
        let mut names = COMMANDS.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), COMMANDS.len());
    }
}
