//! What the proxy counts, and each server's health, shared by the workers and read by the
//! control API. Everything is an atomic: workers never wait for each other or for a reader.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use kv::Instant;

use super::pool::{Pool, PoolSpec};

/// A Prometheus label value: backslash, double quote and newline escaped.
pub fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

pub(crate) fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

pub(crate) fn sub(counter: &AtomicU64, n: u64) {
    counter.fetch_sub(n, Ordering::Relaxed);
}

/// Counters and health of every pool.
pub struct ProxyStats {
    pub pools: Vec<Arc<PoolStats>>,
    started: std::time::Instant,
}

impl ProxyStats {
    pub(crate) fn new(pools: &[Arc<Pool>]) -> ProxyStats {
        ProxyStats {
            pools: pools.iter().map(|p| Arc::new(PoolStats::new(p))).collect(),
            started: std::time::Instant::now(),
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
    /// Malformed requests (answered as memcached answers them).
    pub client_errors: AtomicU64,
    /// Clients disconnected for leaving more replies unread than `client_reply_max`.
    pub clients_overflowed: AtomicU64,
    pub bytes_from_clients: AtomicU64,
    pub bytes_to_clients: AtomicU64,
    pub servers: Vec<ServerStats>,
}

impl PoolStats {
    fn new(pool: &Arc<Pool>) -> PoolStats {
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
            client_errors: AtomicU64::new(0),
            clients_overflowed: AtomicU64::new(0),
            bytes_from_clients: AtomicU64::new(0),
            bytes_to_clients: AtomicU64::new(0),
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
}

impl ProxyStats {
    /// Appends the proxy's families to a Prometheus text exposition.
    pub fn write_metrics(&self, out: &mut String) {
        use std::fmt::Write as _;
        let family = |out: &mut String, name: &str, kind: &str, help: &str| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        type PoolField = fn(&PoolStats) -> u64;
        let pool_families: [(&str, &str, &str, PoolField); 10] = [
            (
                "kvswitch_proxy_client_connections",
                "gauge",
                "Client connections open.",
                |p| get(&p.client_connections),
            ),
            (
                "kvswitch_proxy_client_connections_total",
                "counter",
                "Client connections accepted.",
                |p| get(&p.client_connections_total),
            ),
            (
                "kvswitch_proxy_requests_total",
                "counter",
                "Requests read from clients.",
                |p| get(&p.requests),
            ),
            (
                "kvswitch_proxy_local_replies_total",
                "counter",
                "Requests the proxy answered itself (no-ops, errors).",
                |p| get(&p.local_replies),
            ),
            (
                "kvswitch_proxy_cache_replies_total",
                "counter",
                "Reads answered from the cache.",
                |p| get(&p.cache_replies),
            ),
            (
                "kvswitch_proxy_warm_fills_total",
                "counter",
                "Items a server warming up was given from the server that held their keys before.",
                |p| get(&p.warm_fills),
            ),
            (
                "kvswitch_proxy_client_errors_total",
                "counter",
                "Malformed or refused client requests.",
                |p| get(&p.client_errors),
            ),
            (
                "kvswitch_proxy_clients_overflowed_total",
                "counter",
                "Clients disconnected for leaving more replies unread than the proxy holds for one.",
                |p| get(&p.clients_overflowed),
            ),
            (
                "kvswitch_proxy_client_bytes_received_total",
                "counter",
                "Bytes read from clients.",
                |p| get(&p.bytes_from_clients),
            ),
            (
                "kvswitch_proxy_client_bytes_sent_total",
                "counter",
                "Bytes written to clients.",
                |p| get(&p.bytes_to_clients),
            ),
        ];
        for (name, kind, help, field) in pool_families {
            family(out, name, kind, help);
            for p in &self.pools {
                let _ = writeln!(
                    out,
                    "{name}{{pool=\"{}\"}} {}",
                    crate::stats::escape(&p.spec.name),
                    field(p)
                );
            }
        }
        type ServerField = fn(&ServerStats) -> u64;
        let server_families: [(&str, &str, &str, ServerField); 12] = [
            (
                "kvswitch_proxy_server_requests_total",
                "counter",
                "Requests sent to the server.",
                |s| get(&s.requests),
            ),
            (
                "kvswitch_proxy_server_replies_total",
                "counter",
                "Replies read from the server.",
                |s| get(&s.replies),
            ),
            (
                "kvswitch_proxy_server_errors_total",
                "counter",
                "Requests failed with a proxy error because of the server.",
                |s| get(&s.errors),
            ),
            (
                "kvswitch_proxy_server_timeouts_total",
                "counter",
                "Requests that timed out.",
                |s| get(&s.timeouts),
            ),
            (
                "kvswitch_proxy_server_out_of_step_total",
                "counter",
                "Connections dropped because the replies no longer lined up with the requests.",
                |s| get(&s.out_of_step),
            ),
            (
                "kvswitch_proxy_server_failures_total",
                "counter",
                "Failed connects, lost connections and timeouts.",
                |s| get(&s.failures),
            ),
            (
                "kvswitch_proxy_server_ejections_total",
                "counter",
                "Times the server was taken out of the ring.",
                |s| get(&s.ejections),
            ),
            (
                "kvswitch_proxy_server_connections",
                "gauge",
                "Connections open to the server.",
                |s| get(&s.connections),
            ),
            (
                "kvswitch_proxy_server_connects_total",
                "counter",
                "Connections made to the server.",
                |s| get(&s.connects),
            ),
            (
                "kvswitch_proxy_server_in_flight",
                "gauge",
                "Requests sent and not yet answered.",
                |s| get(&s.in_flight),
            ),
            (
                "kvswitch_proxy_server_bytes_sent_total",
                "counter",
                "Bytes written to the server.",
                |s| get(&s.bytes_sent),
            ),
            (
                "kvswitch_proxy_server_bytes_received_total",
                "counter",
                "Bytes read from the server.",
                |s| get(&s.bytes_received),
            ),
        ];
        for (name, kind, help, field) in server_families {
            family(out, name, kind, help);
            for p in &self.pools {
                let servers = p.pool.spec();
                for (i, (spec, s)) in servers.servers.iter().zip(&p.servers).enumerate() {
                    if p.pool.health(i).removed {
                        continue;
                    }
                    let _ = writeln!(
                        out,
                        "{name}{{pool=\"{}\",server=\"{}\"}} {}",
                        crate::stats::escape(&p.spec.name),
                        crate::stats::escape(&spec.label()),
                        field(s)
                    );
                }
            }
        }
        let now = kvio::clock::now();
        family(
            out,
            "kvswitch_proxy_server_up",
            "gauge",
            "1 while the server is in the ring, 0 while ejected.",
        );
        for p in &self.pools {
            for (i, spec) in p.pool.spec().servers.iter().enumerate() {
                if p.pool.health(i).removed {
                    continue;
                }
                let _ = writeln!(
                    out,
                    "kvswitch_proxy_server_up{{pool=\"{}\",server=\"{}\"}} {}",
                    crate::stats::escape(&p.spec.name),
                    crate::stats::escape(&spec.label()),
                    u8::from(!p.pool.is_down(i, now))
                );
            }
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
                    "client_errors": get(&p.client_errors),
                    "servers": servers,
                })
            })
            .collect();
        json!({ "uptime_s": self.started.elapsed().as_secs_f64(), "pools": pools })
    }
}
