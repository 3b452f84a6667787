//! The cache at the edge: its `/metrics` families and status document, and the control
//! API's queries of it (pin, unpin and evict). The cache itself is [`switch::cache`].

use std::sync::Arc;

use api::metrics::{Exposition, Kind};
use serde_json::json;

use wire::memcache::MAX_KEY_LEN;

pub use switch::cache::*;

/// The cache families of `/metrics`, one series per pool.
pub fn write_metrics(m: &mut Exposition, caches: &[(String, Arc<CacheService>)]) {
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
        write_family(m, &name, Kind::Counter, help, samples);
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
        write_family(m, &name, Kind::Gauge, help, samples);
    }
}

/// One metric family: its help and type, then one sample per pool.
fn write_family<'p>(
    m: &mut Exposition,
    name: &str,
    kind: Kind,
    help: &str,
    samples: impl Iterator<Item = (&'p str, f64)>,
) {
    m.family(name, kind, help);
    for (pool, value) in samples {
        m.sample(name, &[("pool", pool)], value);
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

/// The query of a cache request: `key` (percent-encoded bytes), `pool`, `limit`.
#[derive(Default)]
pub(crate) struct CacheQuery {
    pub key: Vec<u8>,
    pub pool: Option<String>,
    pub limit: Option<usize>,
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

pub(crate) fn cache_query(query: &str) -> Result<CacheQuery, ApiError> {
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

/// Decodes `%XX` escapes (and `+` as a space). A `%` not followed by two hex digits is
/// refused: `percent_encoding` would pass it through as it is.
fn percent_decode(text: &str) -> Result<Vec<u8>, ApiError> {
    let bytes = text.as_bytes();
    let escapes_are_whole = bytes.iter().enumerate().all(|(i, &b)| {
        b != b'%'
            || bytes
                .get(i + 1..i + 3)
                .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
    });
    if !escapes_are_whole {
        return Err(ApiError::BadEscape(text.to_owned()));
    }
    Ok(percent_encoding::percent_decode_str(&text.replace('+', " ")).collect())
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
