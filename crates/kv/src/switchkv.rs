//! A SwitchKV backend's share of the cache update protocol (SwitchKV sections 3.2 and 3.2.4),
//! as state the caller drives: which of its keys are hot (the time-segmented top-k tracker
//! for periodic reports, the circular log for instant reports), and which are cached at its
//! cache node, each under a lease, so that a write to one is told to the cache node before
//! the client is answered.
//!
//! Pure: time is an argument, nothing here does I/O; the node that serves the backend's
//! requests sends the reports and waits for the cache node.

use std::collections::HashMap;
use std::time::Duration;

use crate::hot::{CircularLog, Tracker, TrackerConfig, TrackerError};
use crate::time::Instant;

/// A backend's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendConfig {
    /// The periodic report: one segment of the tracker a report, its top k keys (SwitchKV:
    /// 1 s, k = 5). The cache node must count its own keys' loads the same way.
    pub tracker: TrackerConfig,
    /// The instant report: a key read more than `log_threshold` times in the last
    /// `log_size` reads (SwitchKV: 8 of 200); `log_size` 0 turns it off.
    pub log_size: usize,
    pub log_threshold: u32,
    /// Instant reports only while the backend serves at least this many reads a second
    /// (SwitchKV: "the node's overall load is also above a certain threshold").
    pub load_floor: f64,
    /// How long a grant (a fetch, an accepted instant report, a renewal) lets the cache node
    /// serve a key without hearing of writes.
    pub lease: Duration,
}

impl Default for BackendConfig {
    fn default() -> BackendConfig {
        BackendConfig {
            tracker: TrackerConfig::default(),
            log_size: crate::hot::DEFAULT_LOG_SIZE,
            log_threshold: crate::hot::DEFAULT_LOG_THRESHOLD,
            load_floor: 0.0,
            lease: Duration::from_secs(2),
        }
    }
}

/// A backend's hot keys and cached keys.
#[derive(Debug)]
pub struct Backend {
    cfg: BackendConfig,
    tracker: Tracker,
    log: Option<CircularLog>,
    /// Cached keys and the end of their lease.
    cached: HashMap<Box<[u8]>, Instant>,
    /// Reads in the current segment and the rate of the last one, for `load_floor`.
    reads: u64,
    rate: f64,
}

impl Backend {
    /// A backend whose first report segment starts at `now`.
    pub fn new(cfg: BackendConfig, now: Instant) -> Result<Backend, TrackerError> {
        let tracker = Tracker::new(cfg.tracker.clone(), 1, now)?;
        let log = (cfg.log_size > 0).then(|| CircularLog::new(cfg.log_size, cfg.log_threshold));
        Ok(Backend {
            cfg,
            tracker,
            log,
            cached: HashMap::new(),
            reads: 0,
            rate: 0.0,
        })
    }

    pub fn config(&self) -> &BackendConfig {
        &self.cfg
    }

    /// Counts a read of `key`. Returns true when the key has just become bursty and is not
    /// cached: its value is to be sent to the cache node at once (an instant report).
    pub fn see(&mut self, key: &[u8], now: Instant) -> bool {
        self.roll(now);
        self.reads += 1;
        self.tracker.see(0, key, now);
        let burst = self.log.as_mut().is_some_and(|log| log.see(key));
        burst && self.rate >= self.cfg.load_floor && !self.is_cached(key, now)
    }

    /// The periodic report due at `now`, if a segment has ended since the last: the top k
    /// keys and their loads (requests a second), hottest first.
    pub fn report(&mut self, now: Instant) -> Option<Vec<(Box<[u8]>, f64)>> {
        self.roll(now);
        let reports = self.tracker.take_reports();
        if reports.is_empty() {
            return None;
        }
        Some(reports.into_iter().map(|r| (r.key, r.load)).collect())
    }

    /// When the next report is due.
    pub fn next_report(&self) -> Instant {
        self.tracker.segment_end()
    }

    fn roll(&mut self, now: Instant) {
        let ended = self.tracker.segment_end();
        if self.tracker.roll_if_due(now) {
            let seconds = self.cfg.tracker.segment.as_secs_f64();
            // Segments that passed without a read count as empty.
            let span = seconds + (now - ended).as_secs_f64();
            self.rate = self.reads as f64 / span.max(seconds);
            self.reads = 0;
        }
    }

    /// The cache node was given `key` (it fetched it, or took an instant report of it) by a
    /// grant made at `granted`: it may serve it until `granted + lease`.
    pub fn grant(&mut self, key: &[u8], granted: Instant) {
        let end = granted + self.cfg.lease;
        let at = self.cached.entry(key.into()).or_insert(end);
        *at = (*at).max(end);
    }

    /// The cache node renews its leases on `keys` (granted at `granted`); keys the backend
    /// does not count as cached are left alone (the cache node must fetch them again).
    /// Returns how many were renewed.
    pub fn renew<'k>(
        &mut self,
        keys: impl IntoIterator<Item = &'k [u8]>,
        granted: Instant,
    ) -> usize {
        let end = granted + self.cfg.lease;
        let mut renewed = 0;
        for key in keys {
            if let Some(at) = self.cached.get_mut(key) {
                if *at > granted {
                    *at = (*at).max(end);
                    renewed += 1;
                }
            }
        }
        renewed
    }

    /// `key` left the cache, or was not taken.
    pub fn evict(&mut self, key: &[u8]) {
        self.cached.remove(key);
    }

    /// Whether the cache node may serve `key` at `now`; a lease that has ended is forgotten.
    pub fn is_cached(&mut self, key: &[u8], now: Instant) -> bool {
        self.cached_until(key, now).is_some()
    }

    /// For a write to `key` at `now`: until when the cache node may still serve it, if it
    /// may. The backend tells the cache node of the write and answers its client once the
    /// cache node has acknowledged, or at that instant at the latest.
    pub fn cached_until(&mut self, key: &[u8], now: Instant) -> Option<Instant> {
        let end = *self.cached.get(key)?;
        if end <= now {
            self.cached.remove(key);
            return None;
        }
        Some(end)
    }

    /// Keys counted as cached now (leases not yet ended).
    pub fn cached_keys(&self, now: Instant) -> usize {
        self.cached.values().filter(|&&end| end > now).count()
    }

    /// Every key cached (a `flush_all`): all of them are written.
    pub fn all_cached(&self, now: Instant) -> Vec<(Box<[u8]>, Instant)> {
        let mut all: Vec<(Box<[u8]>, Instant)> = self
            .cached
            .iter()
            .filter(|(_, &end)| end > now)
            .map(|(k, &end)| (k.clone(), end))
            .collect();
        all.sort();
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend(now: Instant) -> Backend {
        let cfg = BackendConfig {
            log_size: 20,
            log_threshold: 3,
            ..BackendConfig::default()
        };
        Backend::new(cfg, now).unwrap()
    }

    #[test]
    fn a_segment_ends_with_the_top_keys_hottest_first() {
        let t0 = Instant::from_secs(10);
        let mut b = backend(t0);
        for i in 0..100u32 {
            b.see(format!("k{}", i % 10).as_bytes(), t0);
            b.see(b"hot", t0);
        }
        assert_eq!(b.report(t0), None, "not before the segment ends");
        let report = b.report(t0 + Duration::from_secs(1)).unwrap();
        assert_eq!(report.len(), 5);
        assert_eq!(&*report[0].0, b"hot");
        // Equation (1) with alpha 0.5 on a first segment: half the rate.
        assert!((report[0].1 - 50.0).abs() < 1e-9, "{report:?}");
        assert_eq!(b.report(t0 + Duration::from_secs(1)), None, "taken once");
    }

    #[test]
    fn a_burst_is_reported_once_and_not_while_cached() {
        let t0 = Instant::from_secs(10);
        let mut b = backend(t0);
        let bursts: Vec<bool> = (0..6).map(|_| b.see(b"x", t0)).collect();
        assert_eq!(bursts, [false, false, false, true, false, false]);
        b.grant(b"x", t0);
        for i in 0..40 {
            b.see(format!("other{i}").as_bytes(), t0);
        }
        assert!(
            !(0..6).any(|_| b.see(b"x", t0)),
            "cached: no instant report"
        );
    }

    #[test]
    fn leases_run_from_their_grant_and_renewals_extend_only_live_ones() {
        let t0 = Instant::from_secs(10);
        let mut b = backend(t0);
        b.grant(b"k", t0);
        let lease = b.config().lease;
        assert_eq!(b.cached_until(b"k", t0), Some(t0 + lease));
        let half = t0 + lease / 2;
        assert_eq!(b.renew([&b"k"[..], b"unknown"], half), 1);
        assert_eq!(b.cached_until(b"k", half), Some(half + lease));
        // Past its lease the key is no longer cached, and a late renewal does not revive it.
        let late = half + lease;
        assert_eq!(b.cached_until(b"k", late), None);
        assert_eq!(b.renew([&b"k"[..]], late), 0);
        assert!(!b.is_cached(b"k", late));
        b.grant(b"j", late);
        b.evict(b"j");
        assert!(!b.is_cached(b"j", late));
    }
}
