//! The cache at the edge: its `/metrics` families and status document, the control API's
//! pin, unpin and evict, and `kvswitch cache`. The cache itself is [`switch::cache`].

use std::sync::Arc;

use serde_json::json;

use wire::memcache::MAX_KEY_LEN;

use crate::api::ApiError;
pub use switch::cache::*;

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
    let counters: [(&str, &str, Counter); 14] = [
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
        (
            "rule_backlog",
            "Admissions refused because a second's worth of rule installs was already waiting.",
            |c| c.rule_backlog,
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
) -> Result<serde_json::Value, ApiError> {
    if caches.is_empty() {
        return Err(ApiError::CacheOff);
    }
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(ApiError::KeyLength { len: key.len() });
    }
    let cache = match pool {
        Some(name) => caches
            .iter()
            .find(|(p, _)| p == name)
            .ok_or_else(|| ApiError::UnknownPool(name.clone()))?,
        None if caches.len() == 1 => &caches[0],
        None => return Err(ApiError::PoolNeeded),
    };
    let now = kvio::clock::now();
    let mut c = cache.1.lock();
    let done = match action {
        "pin" => c.pin(key, now).map(|()| true)?,
        "unpin" => c.unpin(key),
        "evict" => c.evict(key, now),
        other => return Err(ApiError::UnknownAction(other.to_owned())),
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
    /// The control API of the switch or proxy.
    #[arg(long, global = true, default_value = config::DEFAULT_API, value_name = "ADDR:PORT")]
    pub api: std::net::SocketAddr,
    #[command(flatten)]
    pub cmd: CacheCmd,
}

/// What to do with the cache, for `kvswitch cache` and `kvswitch ctl cache`.
#[derive(Debug, clap::Args)]
pub struct CacheCmd {
    #[command(subcommand)]
    pub action: CacheAction,
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
    let client = crate::ctl::Client {
        api: args.api,
        token: crate::ctl::token(None)?,
    };
    let doc = call(&client, &args.cmd)?;
    println!("{}", serde_json::to_string_pretty(&doc)?);
    Ok(())
}

/// The API call `cmd` stands for, made with `client`.
pub fn call(client: &crate::ctl::Client, cmd: &CacheCmd) -> anyhow::Result<serde_json::Value> {
    let pool = cmd
        .pool
        .as_ref()
        .map(|p| format!("&pool={}", percent_encode(p.as_bytes())))
        .unwrap_or_default();
    match &cmd.action {
        CacheAction::Show { limit } => {
            client.call("GET", &format!("/api/v1/cache?limit={limit}"), None)
        }
        CacheAction::Pin { key } | CacheAction::Unpin { key } | CacheAction::Evict { key } => {
            let action = match &cmd.action {
                CacheAction::Pin { .. } => "pin",
                CacheAction::Unpin { .. } => "unpin",
                _ => "evict",
            };
            let key = percent_encode(key.as_bytes());
            client.call(
                "POST",
                &format!("/api/v1/cache/{action}?key={key}{pool}"),
                None,
            )
        }
    }
}

/// `bytes` with everything but unreserved characters as `%XX`.
pub fn percent_encode(bytes: &[u8]) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_refuses_with_a_reason() {
        let key = b"k".as_slice();
        let e = control(&[], "pin", &None, key).unwrap_err();
        assert!(matches!(e, ApiError::CacheOff), "{e:?}");
        let service = CacheService::new(CacheSettings::default(), 1, kv::Instant::ZERO).unwrap();
        let one = [("default".to_string(), service.clone())];
        let long = vec![b'k'; MAX_KEY_LEN + 1];
        let e = control(&one, "pin", &None, &long).unwrap_err();
        assert!(matches!(e, ApiError::KeyLength { len } if len == MAX_KEY_LEN + 1));
        assert_eq!(
            e.to_string(),
            format!("give a key of 1 to {MAX_KEY_LEN} bytes: ?key=...")
        );
        let e = control(&one, "pin", &Some("other".into()), key).unwrap_err();
        assert_eq!(e.to_string(), "no pool `other`");
        let e = control(&one, "freeze", &None, key).unwrap_err();
        assert_eq!(e.to_string(), "unknown action `freeze`");
        let two = [one[0].clone(), ("second".to_string(), service)];
        let e = control(&two, "pin", &None, key).unwrap_err();
        assert!(matches!(e, ApiError::PoolNeeded), "{e:?}");
        let done = control(&one, "pin", &None, key).unwrap();
        assert_eq!(done["changed"], true);
    }
}
