//! The one cache that the switch's UDP path and the proxy's TCP path share: what each path asks
//! of it around a request (answer it, take fill tokens, open and close writes) on top of the
//! pure [`kv::cache::Cache`], behind one lock. Replies are built byte for byte as memcached
//! builds them ([`wire::memcache::cached`]).

use kv::Instant;
use std::sync::{Arc, Mutex, MutexGuard};

use kv::cache::{Cache, FillToken, Value, WriteTicket};
use wire::memcache::cached::{self, CachedItem, KeyForm};
use wire::memcache::{binary, Command, Request, MAX_KEY_LEN};

use crate::config::cache::CacheSettings;

/// The shared cache.
pub struct CacheService {
    inner: Mutex<Cache>,
    settings: CacheSettings,
}

impl std::fmt::Debug for CacheService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheService")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// What the cache answers of a read.
#[derive(Debug)]
pub enum Served {
    /// The whole reply.
    All(Vec<u8>),
    /// A text multi-get's cached keys: `hits` marks them in key order, `cached` is their
    /// `VALUE` items in that order and `END`.
    Some {
        hits: Vec<bool>,
        cached: Vec<u8>,
    },
    None,
}

/// Fill tokens taken when a read of cached keys was forwarded; its reply fills with them.
#[derive(Debug)]
pub struct ReadFill {
    /// The request, kept to read its reply.
    request: Vec<u8>,
    tokens: Vec<(Box<[u8]>, FillToken)>,
}

/// The writes a forwarded request opened; close them once its reply has passed.
#[derive(Debug)]
pub struct Writes {
    tickets: Vec<WriteTicket>,
}

impl Writes {
    /// Joins the writes of another request of the same datagram.
    pub fn extend(&mut self, other: Writes) {
        self.tickets.extend(other.tickets);
    }
}

impl CacheService {
    /// A cache over `groups` backends.
    pub fn new(settings: CacheSettings, groups: usize, now: Instant) -> anyhow::Result<Arc<Self>> {
        let cache = Cache::new(settings.cache.clone(), groups, now)
            .map_err(|e| anyhow::anyhow!("cache: {e}"))?;
        Ok(Arc::new(CacheService {
            inner: Mutex::new(cache),
            settings,
        }))
    }

    pub fn settings(&self) -> &CacheSettings {
        &self.settings
    }

    /// The cache itself, for the status API, the switch's rule mirror and the subcommands.
    pub fn lock(&self) -> MutexGuard<'_, Cache> {
        // A panic while holding the lock leaves the cache consistent enough to serve: every
        // method finishes its bookkeeping before it can fail.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Shows the keys of a read to hot-key detection; `locate` names a key's backend.
    pub fn see(&self, request: &Request<'_>, locate: &mut dyn FnMut(&[u8]) -> usize, now: Instant) {
        if !request.command.is_retrieval() {
            return;
        }
        let mut cache = self.lock();
        let mut decoded = [0u8; MAX_KEY_LEN];
        for token in request.keys() {
            if let Ok(key) = request.stored_key(token, &mut decoded) {
                let group = locate(key);
                cache.see(group, key, now);
            }
        }
    }

    /// The reply to a read whose every key may be served from the cache now, built as
    /// memcached builds it; `None` if any key misses (the read is then forwarded whole).
    pub fn serve(&self, request: &Request<'_>, now: Instant) -> Option<Vec<u8>> {
        let serve = cached::servable(request)?;
        {
            // Every key must be servable, or none is answered (and none counted as a hit).
            let mut cache = self.lock();
            let mut decoded = [0u8; MAX_KEY_LEN];
            for token in request.keys() {
                let servable = request
                    .stored_key(token, &mut decoded)
                    .is_ok_and(|key| cache.can_serve(key, serve.want_cas, now));
                if !servable {
                    cache.count_misses(request.key_count() as u64);
                    return None;
                }
            }
        }
        match self.serve_parts(request, now) {
            Served::All(reply) => Some(reply),
            Served::Some { .. } | Served::None => None,
        }
    }

    /// The text reply to `get KEY` (or `gets KEY`) if the cache may answer it now: one
    /// `VALUE` item and `END`, as the key's server would send it.
    pub fn serve_text_key(&self, command: Command, key: &[u8], now: Instant) -> Option<Vec<u8>> {
        let name: &[u8] = match command {
            Command::Get => b"get ",
            Command::Gets => b"gets ",
            _ => return None,
        };
        let bytes = [name, key, b"\r\n"].concat();
        let request = wire::memcache::parse_text(&bytes).ok()??;
        self.serve(&request, now)
    }

    /// What the cache can answer of a read now: all of it, the cached keys of a text
    /// multi-get (the rest goes to the servers), or nothing.
    pub fn serve_parts(&self, request: &Request<'_>, now: Instant) -> Served {
        let Some(serve) = cached::servable(request) else {
            return Served::None;
        };
        let mut cache = self.lock();
        let mut decoded = [0u8; MAX_KEY_LEN];
        let mut out = Vec::new();
        let mut hits = Vec::with_capacity(request.key_count());
        for token in request.keys() {
            let Ok(key) = request.stored_key(token, &mut decoded) else {
                return Served::None;
            };
            let hit = match cache.lookup(key, serve.want_cas, now) {
                Ok(value) => {
                    let item = CachedItem {
                        flags: value.flags,
                        cas: value.cas,
                        data: &value.data,
                        key_form: key_form(value.key_base64),
                    };
                    // A value that cannot answer this form (no CAS, a key echo in an unknown
                    // form) is a miss: its key goes to its server.
                    cached::write_hit(request, token, &item, &mut out)
                }
                Err(_) => false,
            };
            hits.push(hit);
        }
        let text = request.protocol == wire::memcache::Protocol::Text;
        if text {
            cached::write_text_end(&mut out);
        }
        if hits.iter().all(|&h| h) {
            return Served::All(out);
        }
        if text && serve.multi && hits.iter().any(|&h| h) {
            return Served::Some { hits, cached: out };
        }
        Served::None
    }

    /// Fill tokens for the cached keys of a read being forwarded now; `None` when it names none
    /// (or cannot fill at all).
    pub fn before_read(&self, request: &Request<'_>) -> Option<ReadFill> {
        self.before_read_except(request, &[])
    }

    /// As [`CacheService::before_read`], leaving out the keys `answered` marks (in key order):
    /// the cache answered them, and a value must never refill itself.
    pub fn before_read_except(&self, request: &Request<'_>, answered: &[bool]) -> Option<ReadFill> {
        cached::servable(request)?;
        let cache = self.lock();
        let mut decoded = [0u8; MAX_KEY_LEN];
        let mut tokens = Vec::new();
        for (i, token) in request.keys().enumerate() {
            if answered.get(i).copied().unwrap_or(false) {
                continue;
            }
            let Ok(key) = request.stored_key(token, &mut decoded) else {
                continue;
            };
            if let Some(fill) = cache.fill_token(key) {
                tokens.push((Box::<[u8]>::from(key), fill));
            }
        }
        if tokens.is_empty() {
            return None;
        }
        Some(ReadFill {
            request: request.bytes().to_vec(),
            tokens,
        })
    }

    /// Fills from the server's complete reply to a read forwarded with `fill`.
    pub fn after_read(&self, fill: ReadFill, reply: &[u8], now: Instant) {
        let Ok(Some(request)) = wire::memcache::parse(&fill.request) else {
            return;
        };
        let mut items = Vec::new();
        let mut decoded = [0u8; MAX_KEY_LEN];
        cached::read_fills(&request, reply, |token, item| {
            if let Ok(key) = request.stored_key(token, &mut decoded) {
                let form = key_base64(item.key_form);
                items.push((
                    Box::<[u8]>::from(key),
                    item.flags,
                    item.cas,
                    item.data,
                    form,
                ));
            }
        });
        if items.is_empty() {
            return;
        }
        let mut cache = self.lock();
        for (key, flags, cas, data, key_base64) in items {
            let Some((_, token)) = fill.tokens.iter().find(|(k, _)| *k == key) else {
                continue;
            };
            let value = Value {
                flags,
                cas,
                data: data.into(),
                key_base64,
            };
            cache.fill(&key, *token, value, now);
        }
    }

    /// Opens the writes of a request that changes items, before it is forwarded: its keys'
    /// values are dropped at once. `None` for a request that writes nothing.
    pub fn before_write(&self, request: &Request<'_>) -> Option<Writes> {
        if !writes(request) {
            return None;
        }
        let mut cache = self.lock();
        let tickets = if flushes(request) {
            vec![cache.begin_flush()]
        } else {
            let mut decoded = [0u8; MAX_KEY_LEN];
            let mut tickets = Vec::with_capacity(1);
            for token in request.keys() {
                if let Ok(key) = request.stored_key(token, &mut decoded) {
                    tickets.push(cache.begin_write(key));
                }
            }
            tickets
        };
        Some(Writes { tickets })
    }

    /// Closes the writes of a request whose reply has passed, or that was given up.
    pub fn after_write(&self, writes: Writes) {
        let mut cache = self.lock();
        for ticket in writes.tickets {
            cache.end_write(ticket);
        }
    }

    /// Periodic work: the tracker's segment and the rule buffer's delayed removals.
    pub fn tick(&self, now: Instant) {
        let mut cache = self.lock();
        cache.roll(now);
        cache.poll_rules(now);
    }
}

/// Whether a request may change stored items. A meta get that the cache cannot answer may carry
/// flags that change the item (`T`, `N`, `E`), so it counts as one: the cost is a dropped value.
fn writes(request: &Request<'_>) -> bool {
    match request.command {
        Command::MetaGet => cached::servable(request).is_none(),
        command => command.is_write(),
    }
}

/// Whether a request empties every server (`flush_all`, binary FLUSH).
fn flushes(request: &Request<'_>) -> bool {
    matches!(
        request.command,
        Command::FlushAll
            | Command::Binary(binary::opcode::FLUSH)
            | Command::Binary(binary::opcode::FLUSHQ)
    )
}

/// The cache families of `/metrics`, one series per pool.
pub fn write_metrics(out: &mut String, caches: &[(String, Arc<CacheService>)]) {
    if caches.is_empty() {
        return;
    }
    let snapshots: Vec<_> = caches
        .iter()
        .map(|(pool, c)| {
            let cache = c.lock();
            (pool.as_str(), cache.counters(), cache.gauges())
        })
        .collect();
    type Counter = fn(&kv::cache::Counters) -> u64;
    let counters: [(&str, &str, Counter); 13] = [
        ("hits", "Reads answered from the cache.", |c| c.hits),
        ("misses", "Reads of keys the cache could not answer.", |c| {
            c.misses
        }),
        ("fills", "Values stored from servers' replies.", |c| c.fills),
        (
            "fills_refused",
            "Replies not stored: a write raced the read, the key left, or too large.",
            |c| c.fills_refused,
        ),
        ("admissions", "Keys that entered the cache.", |c| {
            c.admissions
        }),
        ("evictions", "Keys that left the cache.", |c| c.evictions),
        ("invalidations", "Values dropped by writes.", |c| {
            c.invalidations
        }),
        (
            "lease_expiries",
            "Values dropped when their lease ran out.",
            |c| c.lease_expiries,
        ),
        ("rule_installs", "Cache rules installed.", |c| {
            c.rule_installs
        }),
        ("rule_removals", "Cache rules removed.", |c| c.rule_removals),
        (
            "instant_reports",
            "Keys nominated by the circular log.",
            |c| c.instant_reports,
        ),
        (
            "periodic_reports",
            "Keys nominated by the top-k tracker.",
            |c| c.periodic_reports,
        ),
        (
            "rule_buffer_full",
            "Rule changes refused because the rule buffer was full.",
            |c| c.rule_buffer_full,
        ),
    ];
    for (name, help, read) in counters {
        let name = format!("kvswitch_cache_{name}_total");
        let samples = snapshots.iter().map(|(pool, c, _)| (*pool, read(c) as f64));
        write_family(out, &name, "counter", help, samples);
    }
    type Gauge = fn(&kv::cache::Gauges) -> f64;
    let gauges: [(&str, &str, Gauge); 7] = [
        ("entries", "Keys cached (filled or not).", |g| {
            g.entries as f64
        }),
        ("filled", "Keys cached with a value.", |g| g.filled as f64),
        ("bytes", "Value bytes held.", |g| g.bytes as f64),
        ("rules_installed", "Cache rules installed now.", |g| {
            g.rules_installed as f64
        }),
        (
            "rule_buffer_occupancy",
            "Rule removals held back in the rule buffer.",
            |g| g.buffered_removals as f64,
        ),
        (
            "rules_pending",
            "Rule installs waiting for the budget.",
            |g| g.pending_installs as f64,
        ),
        (
            "admission_threshold",
            "Load (requests/s) a key needs to enter a full cache.",
            |g| g.threshold,
        ),
    ];
    for (name, help, read) in gauges {
        let name = format!("kvswitch_cache_{name}");
        let samples = snapshots.iter().map(|(pool, _, g)| (*pool, read(g)));
        write_family(out, &name, "gauge", help, samples);
    }
}

/// One metric family: its help and type, then one sample per pool.
fn write_family<'p>(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    samples: impl Iterator<Item = (&'p str, f64)>,
) {
    use std::fmt::Write as _;
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (pool, value) in samples {
        let _ = writeln!(out, "{name}{{pool=\"{pool}\"}} {value}");
    }
}

/// How a cached value's key was stored, as the reply builder needs it.
fn key_form(key_base64: Option<bool>) -> KeyForm {
    match key_base64 {
        None => KeyForm::Unknown,
        Some(false) => KeyForm::Raw,
        Some(true) => KeyForm::Base64,
    }
}

/// The other way: what a reply showed of the key's form, as the cache keeps it.
fn key_base64(form: KeyForm) -> Option<bool> {
    match form {
        KeyForm::Unknown => None,
        KeyForm::Raw => Some(false),
        KeyForm::Base64 => Some(true),
    }
}

/// A key as the status shows it: text when printable, else hex with a `0x` prefix.
fn show_key(key: &[u8]) -> String {
    if key.iter().all(|b| b.is_ascii_graphic()) {
        return String::from_utf8_lossy(key).into_owned();
    }
    let mut s = String::from("0x");
    for b in key {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// The cache part of the status document: per pool, sizes, counters, the `limit` most loaded
/// cached keys and the tracker's hot keys.
pub fn status(caches: &[(String, Arc<CacheService>)], limit: usize) -> serde_json::Value {
    use serde_json::json;
    let pools: Vec<serde_json::Value> = caches
        .iter()
        .map(|(pool, c)| {
            let settings = c.settings();
            let cache = c.lock();
            let (n, g) = (cache.counters(), cache.gauges());
            let cfg = cache.config();
            let lookups = n.hits + n.misses;
            json!({
                "pool": pool,
                "settings": {
                    "items": cfg.items,
                    "bytes": cfg.bytes,
                    "lease_ms": cfg.lease.as_millis() as u64,
                    "rule_rate": cfg.rules.rate,
                    "rule_delay_ms": cfg.rules.max_delay.as_millis() as u64,
                    "write_timeout_ms": settings.write_timeout.as_millis() as u64,
                },
                "entries": g.entries,
                "filled": g.filled,
                "bytes": g.bytes,
                "rules_installed": g.rules_installed,
                "rule_buffer_occupancy": g.buffered_removals,
                "rules_pending": g.pending_installs,
                "admission_threshold": g.threshold,
                "hits": n.hits,
                "misses": n.misses,
                "hit_ratio": if lookups == 0 { 0.0 } else { n.hits as f64 / lookups as f64 },
                "fills": n.fills,
                "fills_refused": n.fills_refused,
                "admissions": n.admissions,
                "evictions": n.evictions,
                "invalidations": n.invalidations,
                "top": cache.top_entries(limit).iter().map(|e| json!({
                    "key": show_key(&e.key),
                    "load": e.load,
                    "bytes": e.bytes,
                    "filled": e.filled,
                    "rule": e.rule,
                    "pinned": e.pinned,
                })).collect::<Vec<_>>(),
                "hot": cache.hot_keys().iter().take(limit).map(|(k, load, backend)| json!({
                    "key": show_key(k),
                    "load": load,
                    "backend": backend,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({ "enabled": !caches.is_empty(), "pools": pools })
}

/// `pin`, `unpin` or `evict` one key of a pool's cache (the only pool when `pool` is `None`).
pub fn control(
    caches: &[(String, Arc<CacheService>)],
    action: &str,
    pool: &Option<String>,
    key: &[u8],
) -> Result<serde_json::Value, String> {
    if caches.is_empty() {
        return Err("the cache is off: start with --cache or a [cache] table".into());
    }
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(format!("give a key of 1 to {MAX_KEY_LEN} bytes: ?key=..."));
    }
    let cache = match pool {
        Some(name) => caches
            .iter()
            .find(|(p, _)| p == name)
            .ok_or_else(|| format!("no pool `{name}`"))?,
        None if caches.len() == 1 => &caches[0],
        None => return Err("several pools have a cache: give &pool=NAME".into()),
    };
    let now = kvio::clock::now();
    let mut c = cache.1.lock();
    let done = match action {
        "pin" => c.pin(key, now).map(|()| true)?,
        "unpin" => c.unpin(key),
        "evict" => c.evict(key, now),
        other => return Err(format!("unknown action `{other}`")),
    };
    Ok(serde_json::json!({
        "pool": cache.0,
        "key": show_key(key),
        "action": action,
        "cached": c.contains(key),
        "changed": done,
    }))
}

/// Arguments of `kvswitch cache`.
#[derive(Debug, clap::Args)]
#[command(
    long_about = "Show the cache of a running switch or proxy (sizes, hit ratio, the most \
                        loaded cached keys, the hot keys detected), or pin, unpin or evict a \
                        key. Talks to the control API (`switch.api`, or the proxy's --api)."
)]
pub struct CacheArgs {
    #[command(subcommand)]
    pub action: CacheAction,
    /// The control API of the switch or proxy.
    #[arg(long, global = true, default_value = crate::config::DEFAULT_API, value_name = "ADDR:PORT")]
    pub api: std::net::SocketAddr,
    /// The pool whose cache is meant, when a proxy serves several.
    #[arg(long, global = true)]
    pub pool: Option<String>,
}

#[derive(Debug, clap::Subcommand)]
pub enum CacheAction {
    /// Print the cache's state as JSON.
    Show {
        /// How many of the most loaded cached keys and hot keys to list.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Put a key in the cache and keep it there (its rule is installed within the budget).
    Pin { key: String },
    /// Let a pinned key be evicted again like any other.
    Unpin { key: String },
    /// Remove a key from the cache now.
    Evict { key: String },
}

/// Runs `kvswitch cache`.
pub fn run_cli(args: &CacheArgs) -> anyhow::Result<()> {
    let pool = args
        .pool
        .as_ref()
        .map(|p| format!("&pool={}", percent_encode(p.as_bytes())))
        .unwrap_or_default();
    let (method, path) = match &args.action {
        CacheAction::Show { limit } => ("GET", format!("/api/v1/cache?limit={limit}")),
        CacheAction::Pin { key } | CacheAction::Unpin { key } | CacheAction::Evict { key } => {
            let action = match &args.action {
                CacheAction::Pin { .. } => "pin",
                CacheAction::Unpin { .. } => "unpin",
                _ => "evict",
            };
            let key = percent_encode(key.as_bytes());
            ("POST", format!("/api/v1/cache/{action}?key={key}{pool}"))
        }
    };
    let body = http(args.api, method, &path)?;
    print!("{body}");
    Ok(())
}

fn percent_encode(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len());
    for &b in bytes {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s
}

/// One HTTP/1.0 request to the control API; the body, or an error with the API's message.
fn http(api: std::net::SocketAddr, method: &str, path: &str) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let timeout = std::time::Duration::from_secs(5);
    let mut conn = std::net::TcpStream::connect_timeout(&api, timeout).map_err(|e| {
        anyhow::anyhow!("cannot reach the control API at {api} ({e}); is kvswitch running there?")
    })?;
    conn.set_read_timeout(Some(timeout))?;
    write!(conn, "{method} {path} HTTP/1.0\r\nHost: {api}\r\n\r\n")?;
    let mut reply = String::new();
    conn.read_to_string(&mut reply)?;
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    let status = head.lines().next().unwrap_or("");
    if !status.contains(" 200 ") {
        anyhow::bail!("{}: {}", status.trim(), body.trim());
    }
    Ok(body.to_string())
}
