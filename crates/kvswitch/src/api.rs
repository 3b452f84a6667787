//! The control API over HTTP: `GET /metrics` (Prometheus text format) and
//! `GET /api/v1/status` (JSON), for the switch (with its proxy, when one runs) or for a proxy
//! running alone. A small blocking server on its own thread; it only reads counters and the
//! snapshot the run loop publishes.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::cache::{self, CacheService};
use config::{Config, Mode};
use proxy::stats::escape;
use proxy::ProxyStats;
use switch::pool::Pool;
use switch::stats::{get, Answer, Drop, Stats};
use switch::Snapshot;
use wire::memcache::MAX_KEY_LEN;

/// What the API thread can see.
pub struct Shared {
    pub config: Config,
    pub port_names: Vec<String>,
    pub port_macs: Vec<String>,
    pub stats: Arc<Stats>,
    pub snapshot: Mutex<Snapshot>,
    pub started: Instant,
    /// The proxy serving TCP to the VIP, once it runs.
    pub proxy: OnceLock<Arc<ProxyStats>>,
    /// The cache of the UDP path and the proxy, when turned on.
    pub cache: Option<Arc<CacheService>>,
    /// The pool both paths route by, with its servers' health.
    pub pool: Arc<Pool>,
}

/// What an API server shows.
pub trait Exporter: Send + Sync + 'static {
    /// The Prometheus text exposition.
    fn metrics(&self) -> String;
    /// The status document.
    fn status(&self) -> serde_json::Value;
    /// The caches it runs, by pool name (none by default).
    fn caches(&self) -> Vec<(String, Arc<CacheService>)> {
        Vec::new()
    }
}

impl Exporter for Shared {
    fn metrics(&self) -> String {
        let mut out = metrics(self);
        if let Some(proxy) = self.proxy.get() {
            proxy.write_metrics(&mut out);
        }
        out
    }

    fn status(&self) -> serde_json::Value {
        let mut doc = status(self);
        if let (Some(proxy), Some(map)) = (self.proxy.get(), doc.as_object_mut()) {
            map.insert("proxy".into(), proxy.status());
        }
        doc
    }

    fn caches(&self) -> Vec<(String, Arc<CacheService>)> {
        self.cache
            .iter()
            .map(|c| ("default".to_string(), c.clone()))
            .collect()
    }
}

impl Exporter for ProxyStats {
    fn metrics(&self) -> String {
        let mut out = String::with_capacity(4096);
        self.write_metrics(&mut out);
        out
    }

    fn status(&self) -> serde_json::Value {
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "proxy": ProxyStats::status(self),
        })
    }
}

/// Binds the switch's API address and serves it on a background thread.
pub fn serve(shared: Arc<Shared>) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(shared.config.api).map_err(|e| {
        anyhow::anyhow!(
            "{}: `switch.api`: cannot listen on {}: {e}",
            shared.config.path.display(),
            shared.config.api
        )
    })?;
    serve_on(listener, shared)
}

/// Serves `exporter` on `listener` on a background thread; returns the address.
pub fn serve_on(listener: TcpListener, shared: Arc<dyn Exporter>) -> anyhow::Result<SocketAddr> {
    let addr = listener.local_addr()?;
    std::thread::Builder::new()
        .name("api".into())
        .spawn(move || {
            let open = Arc::new(AtomicUsize::new(0));
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                // One short-lived thread per connection keeps a slow client from blocking
                // others; past the limit a connection is closed at once.
                if open.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
                    continue;
                }
                open.fetch_add(1, Ordering::Relaxed);
                let (shared, open) = (shared.clone(), open.clone());
                let spawned =
                    std::thread::Builder::new()
                        .name("api-conn".into())
                        .spawn(move || {
                            let _ = handle(conn, shared.as_ref());
                            open.fetch_sub(1, Ordering::Relaxed);
                        });
                if spawned.is_err() {
                    // The closure never ran; give its slot back.
                    continue;
                }
            }
        })?;
    Ok(addr)
}

/// Cached keys listed in the status document.
const STATUS_ENTRIES: usize = 20;

/// The query of a cache request: `key` (percent-encoded bytes), `pool`, `limit`.
#[derive(Default)]
struct CacheQuery {
    key: Vec<u8>,
    pool: Option<String>,
    limit: Option<usize>,
}

/// Why a request to the cache's part of the API was refused. The client gets the message,
/// with `400 Bad Request`.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A `%` not followed by two hex digits, in this query value.
    #[error("bad percent escape in `{0}`")]
    BadEscape(String),
    #[error("limit `{0}` is not a number")]
    BadLimit(String),
    #[error("unknown query parameter `{0}`")]
    UnknownParameter(String),
    #[error("the cache is off: start with --cache or a [cache] table")]
    CacheOff,
    /// A key that is empty or longer than memcached's longest; `len` is its length.
    #[error("give a key of 1 to {MAX_KEY_LEN} bytes: ?key=...")]
    KeyLength { len: usize },
    #[error("no pool `{0}`")]
    UnknownPool(String),
    #[error("several pools have a cache: give &pool=NAME")]
    PoolNeeded,
    #[error("unknown action `{0}`")]
    UnknownAction(String),
    /// The cache could not pin the key.
    #[error(transparent)]
    Pin(#[from] kv::cache::PinError),
}

fn cache_query(query: &str) -> Result<CacheQuery, ApiError> {
    let mut q = CacheQuery::default();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode(value)?;
        match name {
            "key" => q.key = value,
            "pool" => q.pool = Some(String::from_utf8_lossy(&value).into_owned()),
            "limit" => {
                let text = String::from_utf8_lossy(&value);
                q.limit = Some(
                    text.parse()
                        .map_err(|_| ApiError::BadLimit(text.into_owned()))?,
                );
            }
            other => return Err(ApiError::UnknownParameter(other.to_owned())),
        }
    }
    Ok(q)
}

/// Decodes `%XX` escapes (and `+` as a space).
fn percent_decode(text: &str) -> Result<Vec<u8>, ApiError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| ApiError::BadEscape(text.to_owned()))?;
                out.push(hex);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    Ok(out)
}

/// Most API connections served at once.
const MAX_CONNECTIONS: usize = 32;
/// Most bytes of a request (line and headers) read.
const MAX_REQUEST: u64 = 16 * 1024;

fn handle(mut conn: TcpStream, shared: &dyn Exporter) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(conn.try_clone()?.take(MAX_REQUEST));
    let mut line = String::new();
    reader.read_line(&mut line)?;
    // Drain the headers (bounded by MAX_REQUEST).
    let mut header = String::new();
    while reader.read_line(&mut header)? > 2 {
        header.clear();
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("");
    let path = parts.next().unwrap_or("");
    let (route, query) = path.split_once('?').unwrap_or((path, ""));
    let json = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_default();
    let (status, ctype, body) = match (method, route) {
        ("GET", "/metrics") => {
            let mut out = shared.metrics();
            cache::write_metrics(&mut out, &shared.caches());
            ("200 OK", "text/plain; version=0.0.4", out)
        }
        ("GET", "/api/v1/status") => {
            let mut doc = shared.status();
            let caches = shared.caches();
            if let (false, Some(map)) = (caches.is_empty(), doc.as_object_mut()) {
                map.insert("cache".into(), cache::status(&caches, STATUS_ENTRIES));
            }
            ("200 OK", "application/json", json(&doc))
        }
        ("GET", "/api/v1/cache") => match cache_query(query) {
            Ok(q) => {
                let limit = q.limit.unwrap_or(STATUS_ENTRIES);
                let doc = cache::status(&shared.caches(), limit);
                ("200 OK", "application/json", json(&doc))
            }
            Err(e) => ("400 Bad Request", "text/plain", format!("{e}\n")),
        },
        ("POST", "/api/v1/cache/pin" | "/api/v1/cache/unpin" | "/api/v1/cache/evict") => {
            let action = route.rsplit('/').next().unwrap_or("");
            match cache_query(query)
                .and_then(|q| cache::control(&shared.caches(), action, &q.pool, &q.key))
            {
                Ok(doc) => ("200 OK", "application/json", json(&doc)),
                Err(e) => ("400 Bad Request", "text/plain", format!("{e}\n")),
            }
        }
        ("GET", "/") => (
            "200 OK",
            "text/plain",
            "kvswitch: GET /metrics (Prometheus), GET /api/v1/status (JSON), \
             GET /api/v1/cache[?limit=N], POST /api/v1/cache/{pin,unpin,evict}?key=K[&pool=P]\n"
                .to_string(),
        ),
        ("GET" | "POST", _) => ("404 Not Found", "text/plain", "not found\n".to_string()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET and POST are served\n".to_string(),
        ),
    };
    write!(
        conn,
        "HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    conn.flush()
}

/// The Prometheus text exposition.
pub fn metrics(shared: &Shared) -> String {
    let s = &shared.stats;
    let mut out = String::with_capacity(4096);
    let family = |out: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };
    family(
        &mut out,
        "kvswitch_port_packets_total",
        "counter",
        "Frames per port and direction.",
    );
    for (i, p) in s.ports.iter().enumerate() {
        let name = escape(&shared.port_names[i]);
        let _ = writeln!(
            out,
            "kvswitch_port_packets_total{{port=\"{name}\",dir=\"rx\"}} {}",
            get(&p.rx_packets)
        );
        let _ = writeln!(
            out,
            "kvswitch_port_packets_total{{port=\"{name}\",dir=\"tx\"}} {}",
            get(&p.tx_packets)
        );
    }
    family(
        &mut out,
        "kvswitch_port_bytes_total",
        "counter",
        "Bytes per port and direction.",
    );
    for (i, p) in s.ports.iter().enumerate() {
        let name = escape(&shared.port_names[i]);
        let _ = writeln!(
            out,
            "kvswitch_port_bytes_total{{port=\"{name}\",dir=\"rx\"}} {}",
            get(&p.rx_bytes)
        );
        let _ = writeln!(
            out,
            "kvswitch_port_bytes_total{{port=\"{name}\",dir=\"tx\"}} {}",
            get(&p.tx_bytes)
        );
    }
    family(
        &mut out,
        "kvswitch_backend_requests_total",
        "counter",
        "memcached requests routed to each server.",
    );
    for (i, b) in s.backends.iter().enumerate() {
        let label = escape(&shared.config.servers[i].label());
        let _ = writeln!(
            out,
            "kvswitch_backend_requests_total{{backend=\"{label}\"}} {}",
            get(&b.requests)
        );
    }
    let now = kvio::clock::now();
    family(
        &mut out,
        "kvswitch_backend_in_ring",
        "gauge",
        "1 while the server is in the pool's ring (both the UDP path and the proxy route to it), 0 while it is out.",
    );
    for i in 0..s.backends.len() {
        let label = escape(&shared.config.servers[i].label());
        let _ = writeln!(
            out,
            "kvswitch_backend_in_ring{{backend=\"{label}\"}} {}",
            u8::from(!shared.pool.is_down(i, now))
        );
    }
    family(
        &mut out,
        "kvswitch_pool_version",
        "gauge",
        "Changes of the pool's ring since start (a server taken out or put back).",
    );
    let _ = writeln!(out, "kvswitch_pool_version {}", shared.pool.version());
    family(
        &mut out,
        "kvswitch_backend_replies_total",
        "counter",
        "UDP replies from each server's memcached port that crossed the switch.",
    );
    for (i, b) in s.backends.iter().enumerate() {
        let label = escape(&shared.config.servers[i].label());
        let _ = writeln!(
            out,
            "kvswitch_backend_replies_total{{backend=\"{label}\"}} {}",
            get(&b.replies)
        );
    }
    family(
        &mut out,
        "kvswitch_drops_total",
        "counter",
        "Frames dropped, by reason.",
    );
    for d in Drop::ALL {
        let _ = writeln!(
            out,
            "kvswitch_drops_total{{reason=\"{}\"}} {}",
            d.name(),
            get(&s.drops[d as usize])
        );
    }
    family(
        &mut out,
        "kvswitch_answers_total",
        "counter",
        "Requests the switch answered itself, by kind.",
    );
    for a in Answer::ALL {
        let _ = writeln!(
            out,
            "kvswitch_answers_total{{kind=\"{}\"}} {}",
            a.name(),
            get(&s.answers[a as usize])
        );
    }
    let singles: [(&str, &str, u64); 10] = [
        (
            "kvswitch_kv_requests_total",
            "memcached datagrams to the VIP.",
            get(&s.kv_requests),
        ),
        (
            "kvswitch_kv_forwarded_total",
            "Datagrams forwarded whole to one server.",
            get(&s.kv_forwarded),
        ),
        (
            "kvswitch_kv_route_held_total",
            "Routed datagrams held until their server's port was known.",
            get(&s.route_held),
        ),
        (
            "kvswitch_kv_split_total",
            "Multi-key gets split across servers.",
            get(&s.kv_split),
        ),
        (
            "kvswitch_arp_replies_total",
            "ARP replies sent for the VIP.",
            get(&s.arp_replies),
        ),
        (
            "kvswitch_arp_requests_total",
            "ARP requests sent to resolve backends.",
            get(&s.arp_requests_sent),
        ),
        (
            "kvswitch_switched_total",
            "Frames sent out of one port.",
            get(&s.switched),
        ),
        ("kvswitch_flooded_total", "Frames flooded.", get(&s.flooded)),
        (
            "kvswitch_mac_learned_total",
            "MAC table updates.",
            get(&s.mac_learned),
        ),
        (
            "kvswitch_splits_in_flight",
            "Split multi-key gets awaiting parts.",
            get(&s.splits_in_flight),
        ),
    ];
    for (name, help, value) in singles {
        let kind = if name.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        family(&mut out, name, kind, help);
        let _ = writeln!(out, "{name} {value}");
    }
    out
}

/// The status document.
pub fn status(shared: &Shared) -> serde_json::Value {
    let s = &shared.stats;
    let snap = shared
        .snapshot
        .lock()
        .map(|g| g.clone())
        .unwrap_or_default();
    let cfg = &shared.config;
    let ports: Vec<_> = s
        .ports
        .iter()
        .enumerate()
        .map(|(i, p)| {
            json!({
                "name": shared.port_names[i],
                "mac": shared.port_macs[i],
                "rx_packets": get(&p.rx_packets), "rx_bytes": get(&p.rx_bytes),
                "tx_packets": get(&p.tx_packets), "tx_bytes": get(&p.tx_bytes),
            })
        })
        .collect();
    let now = kvio::clock::now();
    let pool: Vec<_> = cfg
        .servers
        .iter()
        .enumerate()
        .map(|(i, b)| {
            json!({
                "addr": b.addr.to_string(),
                "name": b.name,
                "ring_name": b.ring_name(),
                "weight": b.weight,
                "mac": snap.backend_macs.get(i).cloned().flatten(),
                "in_ring": !shared.pool.is_down(i, now),
                "requests": get(&s.backends[i].requests),
                "replies": get(&s.backends[i].replies),
            })
        })
        .collect();
    let drops: serde_json::Map<String, serde_json::Value> = Drop::ALL
        .iter()
        .map(|d| (d.name().to_string(), json!(get(&s.drops[*d as usize]))))
        .collect();
    let answers: serde_json::Map<String, serde_json::Value> = Answer::ALL
        .iter()
        .map(|a| (a.name().to_string(), json!(get(&s.answers[*a as usize]))))
        .collect();
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_s": shared.started.elapsed().as_secs_f64(),
        "mode": match cfg.mode { Mode::L3 => "l3", Mode::L2 => "l2" },
        "vip": { "ip": cfg.vip.to_string(), "mac": cfg.vip_mac.to_string(), "port": cfg.vip_port },
        "pool": {
            "distribution": cfg.distribution.to_string(),
            "hash": cfg.hash.to_string(),
            "version": shared.pool.version(),
            "servers": pool,
        },
        "ports": ports,
        "counters": {
            "kv_requests": get(&s.kv_requests),
            "kv_forwarded": get(&s.kv_forwarded),
            "kv_split": get(&s.kv_split),
            "route_held": get(&s.route_held),
            "arp_replies": get(&s.arp_replies),
            "switched": get(&s.switched),
            "flooded": get(&s.flooded),
            "drops": drops,
            "answers": answers,
        },
        "mac_table": snap.mac_table,
        "splits_in_flight": snap.splits_in_flight,
        "tables": snap.tables.iter().map(|t| json!({
            "name": t.name, "kind": t.kind, "entries": t.entries, "hits": t.hits,
            "misses": t.misses,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cache_query_decodes_its_values() {
        let q = cache_query("key=a%20b+c&pool=p&limit=5").unwrap();
        assert_eq!(
            (q.key.as_slice(), q.pool.as_deref(), q.limit),
            (&b"a b c"[..], Some("p"), Some(5))
        );
        assert_eq!(cache_query("key=%ff").unwrap().key, [0xff]);
    }

    #[test]
    fn a_bad_cache_query_says_what_is_wrong() {
        let refused = |query: &str| cache_query(query).map(drop).unwrap_err();
        for bad in ["key=%2", "key=%zz", "key=%+1", "key=%-1"] {
            let e = refused(bad);
            assert!(matches!(e, ApiError::BadEscape(_)), "{bad}: {e:?}");
        }
        assert_eq!(
            refused("key=a%2").to_string(),
            "bad percent escape in `a%2`"
        );
        assert_eq!(refused("limit=x").to_string(), "limit `x` is not a number");
        assert_eq!(
            refused("colour=red").to_string(),
            "unknown query parameter `colour`"
        );
    }
}
