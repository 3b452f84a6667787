//! The `[cache]` table, shared by the switch's and the proxy's TOML files: every setting of the
//! in-network cache, with the papers' values as defaults. The table turns the cache on unless it
//! says `enabled = false`; `--cache` on the command line turns it on with the defaults.

use std::path::Path;
use std::time::Duration;

use kv::cache::{Admission, Config as CacheConfig};
use kv::hot::Counter;
use serde::Deserialize;

use super::ConfigError;

pub use switch::cache::{CacheSettings, DEFAULT_WRITE_TIMEOUT};

/// The `[cache]` table before validation.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCache {
    #[serde(default)]
    enabled: Option<bool>,
    #[serde(default)]
    items: Option<usize>,
    #[serde(default)]
    bytes: Option<u64>,
    #[serde(default)]
    max_value: Option<usize>,
    #[serde(default)]
    lease_ms: Option<u64>,
    #[serde(default)]
    admit_percentile: Option<f64>,
    #[serde(default)]
    segment_ms: Option<u64>,
    #[serde(default)]
    top_k: Option<usize>,
    #[serde(default)]
    alpha: Option<f64>,
    #[serde(default)]
    tracked_keys: Option<usize>,
    #[serde(default)]
    sample: Option<u32>,
    #[serde(default)]
    counter: Option<String>,
    #[serde(default)]
    log_size: Option<usize>,
    #[serde(default)]
    log_threshold: Option<u32>,
    #[serde(default)]
    rule_rate: Option<u32>,
    #[serde(default)]
    rule_delay_ms: Option<u64>,
    #[serde(default)]
    write_timeout_ms: Option<u64>,
    #[serde(default)]
    admit: Option<String>,
}

/// Most keys a cache may hold.
const MAX_ITEMS: usize = 10_000_000;
/// Longest lease, segment or delay, in milliseconds: an hour.
const MAX_MS: u64 = 3_600_000;

impl RawCache {
    /// Validates the table; `present` says whether the file had one (it then turns the cache
    /// on unless `enabled = false`).
    pub(crate) fn settings(self, present: bool, path: &Path) -> Result<CacheSettings, ConfigError> {
        let err =
            |key: &str, message: String| ConfigError::new(path, &format!("cache.{key}"), message);
        let ms = |key: &str, v: Option<u64>, default: Duration| -> Result<Duration, ConfigError> {
            match v {
                None => Ok(default),
                Some(v) if (1..=MAX_MS).contains(&v) => Ok(Duration::from_millis(v)),
                Some(v) => Err(err(key, format!("{v} is outside 1..={MAX_MS}"))),
            }
        };
        let mut c = CacheConfig::default();
        if let Some(items) = self.items {
            if !(1..=MAX_ITEMS).contains(&items) {
                return Err(err("items", format!("{items} is outside 1..={MAX_ITEMS}")));
            }
            c.items = items;
        }
        if let Some(bytes) = self.bytes {
            if bytes == 0 {
                return Err(err("bytes", "must be at least 1".into()));
            }
            c.bytes = bytes;
        }
        if let Some(max_value) = self.max_value {
            c.max_value = max_value;
        }
        c.lease = ms("lease_ms", self.lease_ms, c.lease)?;
        if let Some(p) = self.admit_percentile {
            if !(0.0..=100.0).contains(&p) {
                return Err(err("admit_percentile", format!("{p} is outside 0..=100")));
            }
            c.admit_percentile = p;
        }
        c.tracker.segment = ms("segment_ms", self.segment_ms, c.tracker.segment)?;
        if let Some(k) = self.top_k {
            c.tracker.top_k = k;
        }
        if let Some(alpha) = self.alpha {
            if !(alpha > 0.0 && alpha <= 1.0) {
                return Err(err("alpha", format!("{alpha} is outside (0, 1]")));
            }
            c.tracker.alpha = alpha;
        }
        if let Some(n) = self.tracked_keys {
            c.tracker.capacity = n;
        }
        if let Some(n) = self.sample {
            c.tracker.sample = n;
        }
        if let Some(counter) = &self.counter {
            c.tracker.counter = match counter.as_str() {
                "space-saving" => Counter::SpaceSaving,
                "count-min" => Counter::DEFAULT_COUNT_MIN,
                other => {
                    return Err(err(
                        "counter",
                        format!("`{other}` is not one of space-saving, count-min"),
                    ))
                }
            };
        }
        if let Some(n) = self.log_size {
            c.log_size = n;
        }
        if let Some(n) = self.log_threshold {
            c.log_threshold = n;
        }
        if let Some(rate) = self.rule_rate {
            c.rules.rate = (rate > 0).then_some(rate);
        }
        c.rules.max_delay = ms("rule_delay_ms", self.rule_delay_ms, c.rules.max_delay)?;
        if let Some(admit) = &self.admit {
            c.admission = match admit.as_str() {
                "hot" => Admission::Hot,
                "every" => Admission::EveryRead,
                "lfu" => Admission::Lfu,
                other => {
                    return Err(err(
                        "admit",
                        format!("`{other}` is not one of hot, every, lfu"),
                    ))
                }
            };
        }
        let write_timeout = ms(
            "write_timeout_ms",
            self.write_timeout_ms,
            DEFAULT_WRITE_TIMEOUT,
        )?;
        c.validate().map_err(|e| err("", e.to_string()))?;
        Ok(CacheSettings {
            enabled: self.enabled.unwrap_or(present),
            cache: c,
            write_timeout,
        })
    }
}

/// The `[cache]` table of the example files, commented.
pub const CACHE_EXAMPLE: &str = r#"# The in-network cache (also turned on by --cache). Hot keys are detected on every read,
# admitted under a rule-update budget, and answered by kvswitch; writes invalidate first.
[cache]
enabled = false
items = 10000            # keys cached at most
bytes = 67108864         # value bytes held at most
max_value = 1048576      # larger values are never cached
lease_ms = 2000          # a value is refetched after this long (bounds writes that bypass kvswitch)
admit = "hot"            # "hot": keys hot-key detection finds; "every": every key read, the
                         # least loaded out first; "lfu": every key read, the least used out first
admit_percentile = 10    # a key enters a full cache above this percentile of cached keys' loads
segment_ms = 1000        # the top-k tracker's segment
top_k = 5                # hot keys reported per backend per segment
alpha = 0.5              # EWMA weight of the newest segment
tracked_keys = 1024      # keys counted per backend per segment
sample = 1               # count one read in this many
counter = "space-saving" # or "count-min"
log_size = 200           # the circular log of recent reads (0: no instant admission)
log_threshold = 8        # admitted at once when seen more often than this in the log
rule_rate = 0            # rule installs and removals per second (0: unlimited)
rule_delay_ms = 2000     # longest a rule removal waits behind installs
write_timeout_ms = 1000  # how long an unanswered UDP write keeps its key from filling
"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<CacheSettings, ConfigError> {
        #[derive(Deserialize)]
        struct File {
            cache: RawCache,
        }
        let file: File =
            toml::from_str(text).map_err(|e| ConfigError::toml(Path::new("t"), text, &e))?;
        file.cache.settings(true, Path::new("t"))
    }

    #[test]
    fn the_example_parses_and_defaults_match() {
        let s = parse(CACHE_EXAMPLE).unwrap();
        assert!(!s.enabled);
        let d = CacheConfig::default();
        assert_eq!(s.cache.items, d.items);
        assert_eq!(s.cache.lease, d.lease);
        assert_eq!(s.cache.rules.rate, None);
        assert_eq!(s.cache.tracker.top_k, 5);
        assert_eq!(s.cache.log_threshold, 8);
        assert_eq!(s.cache.log_size, 200);
    }

    #[test]
    fn a_present_table_turns_the_cache_on_and_errors_name_the_key() {
        let s = parse("[cache]\nrule_rate = 400\nitems = 100\n").unwrap();
        assert!(s.enabled);
        assert_eq!(s.cache.rules.rate, Some(400));
        assert_eq!(s.cache.items, 100);
        let e = parse("[cache]\nalpha = 1.5\n").unwrap_err().to_string();
        assert!(e.contains("cache.alpha"), "{e}");
        let e = parse("[cache]\ncounter = \"lfu\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("cache.counter") && e.contains("lfu"), "{e}");
        let e = parse("[cache]\nitems = 0\n").unwrap_err().to_string();
        assert!(e.contains("cache.items"), "{e}");
        for (name, admission) in [
            ("hot", Admission::Hot),
            ("every", Admission::EveryRead),
            ("lfu", Admission::Lfu),
        ] {
            let s = parse(&format!("[cache]\nadmit = \"{name}\"\n")).unwrap();
            assert_eq!(s.cache.admission, admission);
        }
        let e = parse("[cache]\nadmit = \"lru\"\n").unwrap_err().to_string();
        assert!(e.contains("cache.admit") && e.contains("lru"), "{e}");
        let e = parse("[cache]\nlease = 3\n").unwrap_err().to_string();
        assert!(e.contains("lease"), "{e}");
    }
}
