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
    /// How long a grant (a fetch, a renewal) lets the cache node
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

/// A key's fingerprint under one backend's detectors, from [`Backend::prepare`]; good for
/// that backend and that key only. A debug build checks it; a release build counts a
/// `Prepared` of another backend or key under the wrong name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prepared(u64);

/// A backend's hot keys and cached keys.
#[derive(Debug)]
pub struct Backend {
    cfg: BackendConfig,
    tracker: Tracker,
    log: Option<CircularLog>,
    /// Cached keys and the end of their lease.
    cached: HashMap<Box<[u8]>, Instant>,
    /// Cached keys whose update the cache node did not acknowledge in time: their lease is
    /// neither renewed nor granted again until it has ended, and writes to them wait it out.
    revoked: std::collections::HashSet<Box<[u8]>>,
    /// Reads in the current segment and the rate of the last one, for `load_floor`.
    reads: u64,
    rate: f64,
}

impl Backend {
    /// A backend whose first report segment starts at `now`.
    pub fn new(cfg: BackendConfig, now: Instant) -> Result<Backend, TrackerError> {
        let tracker = Tracker::new(cfg.tracker.clone(), 1, now)?;
        let log = tracker.log_beside(cfg.log_size, cfg.log_threshold);
        Ok(Backend {
            cfg,
            tracker,
            log,
            cached: HashMap::new(),
            revoked: std::collections::HashSet::new(),
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
        let fp = self.tracker.fingerprints().of(key);
        self.see_fingerprint(key, fp, now)
    }

    /// Reads what a visit begins with, ahead of the visit: the backend's own state and its
    /// detectors' headers, as plain loads the processor overlaps with the work after them
    /// (see `hot::touch`). Changes nothing; visits in between only make the reads less
    /// useful.
    ///
    /// A visit is bound by reads of memory, each waiting for the one before, once the
    /// detectors of all backends do not fit the processor's caches (a simulation of a
    /// thousand backends). A caller that knows its next few keys early makes their reads
    /// overlap: it touches each key's backend, then [prepares](Backend::prepare) each key,
    /// then [touches each key](Backend::touch_key), each step for all the keys before the
    /// next step, so that no read waits on another for the same key.
    pub fn touch(&self) {
        let mut v = self.reads ^ self.rate.to_bits() ^ self.tracker.touch_group(0);
        if let Some(log) = &self.log {
            v ^= log.touch_header();
        }
        crate::hot::touch(v);
    }

    /// The fingerprint [`Backend::see_prepared`] and [`Backend::touch_key`] take `key` by.
    pub fn prepare(&self, key: &[u8]) -> Prepared {
        Prepared(self.tracker.fingerprints().of(key))
    }

    /// Reads, ahead of the visit, what a visit of a [prepared](Backend::prepare) key reads
    /// after the backend's own state: where its detectors keep that key, or where it would
    /// go (see [`Backend::touch`]). Changes nothing.
    pub fn touch_key(&self, key: Prepared) {
        let mut v = self.tracker.touch(0, key.0);
        if let Some(log) = &self.log {
            v ^= log.touch(key.0);
        }
        crate::hot::touch(v);
    }

    /// [`Backend::see`] of a key this backend [prepared](Backend::prepare).
    pub fn see_prepared(&mut self, key: &[u8], prepared: Prepared, now: Instant) -> bool {
        debug_assert_eq!(prepared.0, self.tracker.fingerprints().of(key));
        self.see_fingerprint(key, prepared.0, now)
    }

    fn see_fingerprint(&mut self, key: &[u8], fp: u64, now: Instant) -> bool {
        self.roll(now);
        self.reads += 1;
        // One fingerprint for the log and the tracker, which share their fingerprints. The log
        // goes first: its few memory reads are then under way while the tracker's longer chain
        // of them runs.
        let burst = self.log.as_mut().is_some_and(|log| log.see_fingerprint(fp));
        self.tracker.see_fingerprint(0, key, fp, now);
        burst && self.rate >= self.cfg.load_floor && !self.is_cached(key, now)
    }

    /// The load of a key the circular log just found bursty, in requests a second: its share
    /// of the log at the threshold, times the backend's read rate.
    pub fn burst_load(&self) -> f64 {
        let share = f64::from(self.cfg.log_threshold + 1) / self.cfg.log_size.max(1) as f64;
        share * self.rate
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

    /// The cache node was given `key` (it fetched it) by a
    /// grant made at `granted`: it may serve it until `granted + lease`.
    pub fn grant(&mut self, key: &[u8], granted: Instant) {
        if !self.may_grant(key, granted) {
            return;
        }
        self.revoked.remove(key);
        let end = granted + self.cfg.lease;
        let at = self.cached.entry(key.into()).or_insert(end);
        *at = (*at).max(end);
    }

    /// The cache node renews its leases on `keys` (granted at `granted`); keys the backend
    /// does not count as cached are left alone (the cache node must drop them, and fetch them
    /// again to serve them). Returns the keys renewed.
    pub fn renew<'k>(
        &mut self,
        keys: impl IntoIterator<Item = &'k [u8]>,
        granted: Instant,
    ) -> Vec<&'k [u8]> {
        let end = granted + self.cfg.lease;
        let mut renewed = Vec::new();
        for key in keys {
            if self.revoked.contains(key) {
                continue;
            }
            if let Some(at) = self.cached.get_mut(key) {
                if *at > granted {
                    *at = (*at).max(end);
                    renewed.push(key);
                }
            }
        }
        renewed
    }

    /// `key` left the cache, or was not taken.
    pub fn evict(&mut self, key: &[u8]) {
        if !self.revoked.contains(key) {
            self.cached.remove(key);
        }
    }

    /// An update of `key` was not acknowledged: the cache node may still serve the value it
    /// had until the lease ends, and the update may yet reach it, late. The lease is no
    /// longer renewed nor granted again until it has ended (see [`Backend::may_grant`]).
    pub fn revoke(&mut self, key: &[u8]) {
        if self.cached.contains_key(key) {
            self.revoked.insert(key.into());
        }
    }

    /// Whether `key` may be granted at `now` (fetched, or reported with its value): not while
    /// a lease revoked by an unacknowledged update runs.
    pub fn may_grant(&mut self, key: &[u8], now: Instant) -> bool {
        !(self.is_cached(key, now) && self.revoked.contains(key))
    }

    /// Whether writes to `key` must wait out its lease without telling the cache node.
    pub fn is_revoked(&self, key: &[u8]) -> bool {
        self.revoked.contains(key)
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
            self.revoked.remove(key);
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

/// How long the cache under a cache node keeps a value: for good (a year).
const VALUE_KEPT: Duration = Duration::from_secs(365 * 24 * 3600);

/// A SwitchKV cache node's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheNodeConfig {
    /// Admission, eviction, loads, the rule budget and buffer (see [`crate::cache::Config`]);
    /// its tracker must count as the backends' do. Its `lease` is not used: the backends'
    /// grants bound serving.
    pub cache: crate::cache::Config,
    /// The backends' lease (their [`BackendConfig::lease`]).
    pub lease: Duration,
    /// Taken off every lease, for the time a grant takes to arrive: the cache node stops
    /// serving a key before its backend stops telling it of writes.
    pub guard: Duration,
}

impl Default for CacheNodeConfig {
    fn default() -> CacheNodeConfig {
        CacheNodeConfig {
            cache: crate::cache::Config::default(),
            lease: Duration::from_secs(2),
            guard: Duration::from_millis(200),
        }
    }
}

/// A SwitchKV cache node: which keys it holds (admitted from its backends' reports under the
/// admission threshold, evicted by load), their values, the lease under which each may be
/// served, and the switch rules that steer reads of them to it.
#[derive(Debug)]
pub struct CacheNode {
    cfg: CacheNodeConfig,
    cache: crate::cache::Cache,
    /// Per key, until when it may be served, as its backend granted.
    granted: HashMap<Box<[u8]>, Instant>,
    /// Keys whose value has been asked of their backend and not yet answered.
    fetching: std::collections::HashSet<Box<[u8]>>,
    /// Per admitted key, its backend.
    backend: HashMap<Box<[u8]>, usize>,
    /// The cache's evictions when the maps above were last trimmed to it: a key enters them
    /// only while cached, and leaves the cache only by an eviction.
    trimmed_at: u64,
}

/// A value fetch in flight: the key, its backend and the token its reply fills with.
#[derive(Debug, Clone)]
pub struct Fetch {
    pub key: Box<[u8]>,
    pub backend: usize,
    pub token: crate::cache::FillToken,
}

impl CacheNode {
    /// A cache node for `backends` backends.
    pub fn new(
        cfg: CacheNodeConfig,
        backends: usize,
        now: Instant,
    ) -> Result<CacheNode, crate::cache::ConfigError> {
        // A value is kept until it is evicted or replaced: what bounds serving it is its
        // backend's grant (`granted`), renewed as long as the key stays, not the time since
        // it was filled.
        let mut inner = cfg.cache.clone();
        inner.lease = VALUE_KEPT;
        // Keys come in from the backends' reports only, each with a fetch: the reads steered
        // here count for loads but admit nothing (an admission without a fetch would never
        // be served).
        inner.log_size = 0;
        let mut cache = crate::cache::Cache::new(inner, backends, now)?;
        cache.keep_rule_changes(true);
        Ok(CacheNode {
            cfg,
            cache,
            granted: HashMap::new(),
            fetching: std::collections::HashSet::new(),
            backend: HashMap::new(),
            trimmed_at: 0,
        })
    }

    /// The lease a grant made at `granted` gives the cache node.
    fn lease_end(&self, granted: Instant) -> Instant {
        granted + self.cfg.lease.saturating_sub(self.cfg.guard)
    }

    /// Takes a periodic report of `backend`: the keys it admits and must fetch now (also a
    /// cached key with neither a lease nor a fetch under way, which would otherwise never be
    /// served).
    pub fn report(&mut self, backend: usize, loads: &[(&[u8], f64)], now: Instant) -> Vec<Fetch> {
        self.cache.ensure_groups(backend + 1);
        let mut fetches = Vec::new();
        for &(key, load) in loads {
            // A cached key its backend still reads (its rule not installed yet, or its lease
            // ended): the backend's count of it counts too.
            self.cache.raise_load(key, load);
            if let Some(fetch) = self.admit(backend, key, load, now, false) {
                fetches.push(fetch);
            }
        }
        self.forget_evicted();
        fetches
    }

    /// Offers `key` to the cache; the fetch to make if it is cached now and neither leased
    /// nor being fetched.
    fn admit(
        &mut self,
        backend: usize,
        key: &[u8],
        load: f64,
        now: Instant,
        instant: bool,
    ) -> Option<Fetch> {
        let cached = if instant {
            self.cache.offer_instant(key, load, now)
        } else {
            self.cache.offer(key, load, now)
        };
        if !cached {
            return None;
        }
        let leased = self.granted.get(key).is_some_and(|&end| end > now);
        if leased || self.fetching.contains(key) {
            return None;
        }
        self.backend.insert(key.into(), backend);
        let token = self.cache.fill_token(key)?;
        self.fetching.insert(key.into());
        Some(Fetch {
            key: key.into(),
            backend,
            token,
        })
    }

    /// The answer to a fetch asked at `asked`: the value, or `None` if the backend has none
    /// or did not answer. The backend granted a lease when it answered, after `asked`. A
    /// value that does not fill (a write raced the fetch) leaves the key without a value
    /// known to be current: it is dropped, as it is without a value, and a later report
    /// admits it again.
    pub fn fetched(&mut self, fetch: Fetch, value: Option<crate::cache::Value>, asked: Instant) {
        self.fetching.remove(&fetch.key);
        let filled = match value {
            Some(value) => {
                self.cache.fill(&fetch.key, fetch.token, value, asked) == crate::cache::Fill::Filled
            }
            None => false,
        };
        if !filled {
            self.cache.evict(&fetch.key, asked);
            self.granted.remove(&fetch.key);
            self.forget_evicted();
            return;
        }
        let end = self.lease_end(asked);
        let at = self.granted.entry(fetch.key).or_insert(end);
        *at = (*at).max(end);
    }

    /// An instant report from `backend`: `key` is bursty, with `load` (requests a second).
    /// The fetch to make if the cache node takes it; its value comes with the fetch, whose
    /// grant starts when the backend answers it (a report's own value may have waited, in a
    /// hung cache node's queue, past anything its backend still promises).
    pub fn hot(&mut self, backend: usize, key: &[u8], load: f64, now: Instant) -> Option<Fetch> {
        self.cache.ensure_groups(backend + 1);
        let fetch = self.admit(backend, key, load, now, true);
        self.forget_evicted();
        fetch
    }

    /// A write at the backend: `key` now holds `value` (`None`: deleted). The lease stays as
    /// it was granted.
    pub fn update(&mut self, key: &[u8], value: Option<crate::cache::Value>, now: Instant) {
        let ticket = self.cache.begin_write(key);
        self.cache.end_write(ticket);
        let (Some(value), Some(token)) = (value, self.cache.fill_token(key)) else {
            return;
        };
        self.cache.fill(key, token, value, now);
    }

    /// A read of `key` (its backend `backend`, as the ring says) steered here: the value if it
    /// may be served now. Counted for the loads of cached keys.
    pub fn serve(
        &mut self,
        backend: usize,
        key: &[u8],
        now: Instant,
    ) -> Option<crate::cache::Value> {
        self.serve_with(backend, key, now, crate::cache::Value::clone)
    }

    /// As [`CacheNode::serve`], counted the same, giving what `answer` makes of the value
    /// rather than a copy of it (a reply written straight from it, or only whether there is
    /// one).
    pub fn serve_with<R>(
        &mut self,
        backend: usize,
        key: &[u8],
        now: Instant,
        answer: impl FnOnce(&crate::cache::Value) -> R,
    ) -> Option<R> {
        self.cache.ensure_groups(backend + 1);
        self.cache.see(backend, key, now);
        if self.granted.get(key).is_none_or(|&end| end <= now) {
            self.cache.count_misses(1);
            return None;
        }
        self.cache.lookup(key, false, now).ok().map(answer)
    }

    /// The leases to renew at `now` (those ending within half a lease), by backend: ask each
    /// backend, then give the answer to [`CacheNode::renewed`] with the time it was asked.
    pub fn renewals(&self, now: Instant) -> Vec<(usize, Vec<Box<[u8]>>)> {
        let soon = now + self.cfg.lease / 2;
        let mut by: HashMap<usize, Vec<Box<[u8]>>> = HashMap::new();
        let due = self
            .granted
            .iter()
            .filter(|(_, &end)| end > now && end <= soon)
            .map(|(k, _)| k);
        for key in due {
            if self.cache.contains(key) {
                if let Some(&b) = self.backend.get(key) {
                    by.entry(b).or_default().push(key.clone());
                }
            }
        }
        let mut all: Vec<(usize, Vec<Box<[u8]>>)> = by.into_iter().collect();
        all.sort();
        for (_, keys) in &mut all {
            keys.sort();
        }
        all
    }

    /// `keys` were renewed by a request made at `asked`.
    pub fn renewed(&mut self, keys: &[Box<[u8]>], asked: Instant) {
        let end = self.lease_end(asked);
        for key in keys {
            if let Some(at) = self.granted.get_mut(key) {
                *at = (*at).max(end);
            }
        }
    }

    /// `keys` were not renewed: their backend no longer counts them as cached (it restarted,
    /// or their lease had ended there). They are dropped; a later report may admit them again,
    /// and their fetch grants a new lease.
    pub fn refused(&mut self, keys: &[Box<[u8]>], now: Instant) {
        for key in keys {
            self.cache.evict(key, now);
        }
        self.forget_evicted();
    }

    /// `backend` started afresh: it holds no lease and perhaps none of its values. Every key
    /// of it is dropped.
    pub fn reset(&mut self, backend: usize, now: Instant) {
        let keys: Vec<Box<[u8]>> = self
            .backend
            .iter()
            .filter(|(_, &b)| b == backend)
            .map(|(k, _)| k.clone())
            .collect();
        self.refused(&keys, now);
    }

    /// The switch rule changes released at `now` (installs before removals, under the rule
    /// budget), in order; also ends the load segment when it is due, and drops the keys whose
    /// lease has ended (a key that cannot be served must not keep its rule, and its next
    /// admission fetches it again).
    pub fn poll(&mut self, now: Instant) -> Vec<crate::rules::Change<Box<[u8]>>> {
        let ended: Vec<Box<[u8]>> = self
            .granted
            .iter()
            .filter(|(_, &end)| end <= now)
            .map(|(k, _)| k.clone())
            .collect();
        if !ended.is_empty() {
            self.refused(&ended, now);
        }
        self.cache.roll(now);
        self.cache.poll_rules(now);
        self.forget_evicted();
        self.cache.take_rule_changes()
    }

    /// Drops the leases and backends of keys no longer cached.
    fn forget_evicted(&mut self) {
        let evictions = self.cache.counters().evictions;
        if evictions == self.trimmed_at {
            return;
        }
        self.trimmed_at = evictions;
        let cache = &self.cache;
        self.granted.retain(|k, _| cache.contains(k));
        self.fetching.retain(|k| cache.contains(k));
        self.backend.retain(|k, _| cache.contains(k));
    }

    /// The backend of every cached key, sorted: whom to tell when the cache node forgets.
    pub fn cached(&self) -> Vec<(Box<[u8]>, usize)> {
        let mut all: Vec<(Box<[u8]>, usize)> =
            self.backend.iter().map(|(k, &b)| (k.clone(), b)).collect();
        all.sort();
        all
    }

    pub fn counters(&self) -> crate::cache::Counters {
        self.cache.counters()
    }

    pub fn gauges(&self) -> crate::cache::Gauges {
        self.cache.gauges()
    }

    /// Keys that may be served at `now` (a lease that has not ended), and keys whose value
    /// is being fetched.
    pub fn leases(&self, now: Instant) -> (usize, usize) {
        let live = self.granted.values().filter(|&&end| end > now).count();
        (live, self.fetching.len())
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
    fn visits_prepared_and_touched_ahead_count_as_plain_ones() {
        let t0 = Instant::from_secs(10);
        let cfg = BackendConfig {
            tracker: TrackerConfig {
                capacity: 16,
                ..TrackerConfig::default()
            },
            log_size: 20,
            log_threshold: 3,
            ..BackendConfig::default()
        };
        let mut plain = Backend::new(cfg.clone(), t0).unwrap();
        let mut ahead = Backend::new(cfg, t0).unwrap();
        // Skewed keys, the lower the likelier: counter replacements and bursts both happen.
        let mut x = 7u64;
        let keys: Vec<Vec<u8>> = (0..4000)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let (a, b) = ((x >> 33) % 200, (x >> 13) % 200);
                format!("k{}", a.min(b)).into_bytes()
            })
            .collect();
        let (mut bursts, mut reports) = (0, 0);
        for (batch, chunk) in keys.chunks(8).enumerate() {
            let now = t0 + Duration::from_millis(batch as u64 * 50);
            // Every step for every key before the next, as a caller drawing ahead does.
            for _ in chunk {
                ahead.touch();
            }
            let prepared: Vec<Prepared> = chunk.iter().map(|k| ahead.prepare(k)).collect();
            for &p in &prepared {
                ahead.touch_key(p);
            }
            for (k, p) in chunk.iter().zip(prepared) {
                let burst = plain.see(k, now);
                assert_eq!(ahead.see_prepared(k, p, now), burst, "{k:?}");
                bursts += usize::from(burst);
            }
            let report = plain.report(now);
            assert_eq!(ahead.report(now), report);
            reports += usize::from(report.is_some());
        }
        assert!(
            bursts > 0 && reports > 10,
            "{bursts} bursts, {reports} reports"
        );
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
        assert_eq!(b.renew([&b"k"[..], b"unknown"], half), [&b"k"[..]]);
        assert_eq!(b.cached_until(b"k", half), Some(half + lease));
        // Past its lease the key is no longer cached, and a late renewal does not revive it.
        let late = half + lease;
        assert_eq!(b.cached_until(b"k", late), None);
        assert!(b.renew([&b"k"[..]], late).is_empty());
        assert!(!b.is_cached(b"k", late));
        b.grant(b"j", late);
        b.evict(b"j");
        assert!(!b.is_cached(b"j", late));
    }

    #[test]
    fn a_revoked_lease_is_neither_renewed_nor_granted_until_it_ends() {
        let t0 = Instant::from_secs(10);
        let mut b = backend(t0);
        let lease = b.config().lease;
        b.grant(b"k", t0);
        b.revoke(b"k");
        assert!(b.is_revoked(b"k"));
        let half = t0 + lease / 2;
        assert!(b.renew([&b"k"[..]], half).is_empty());
        assert!(!b.may_grant(b"k", half));
        b.grant(b"k", half);
        b.evict(b"k");
        assert_eq!(
            b.cached_until(b"k", half),
            Some(t0 + lease),
            "writes still wait it out"
        );
        // Once it has ended, the key may be granted afresh.
        let after = t0 + lease;
        assert_eq!(b.cached_until(b"k", after), None);
        assert!(b.may_grant(b"k", after) && !b.is_revoked(b"k"));
        b.grant(b"k", after);
        assert_eq!(b.renew([&b"k"[..]], after + lease / 2), [&b"k"[..]]);
    }

    fn value(data: &[u8]) -> crate::cache::Value {
        crate::cache::Value {
            flags: 3,
            cas: None,
            data: data.into(),
            key_base64: None,
        }
    }

    fn node(now: Instant) -> CacheNode {
        let mut cfg = CacheNodeConfig::default();
        cfg.cache.items = 2;
        CacheNode::new(cfg, 2, now).unwrap()
    }

    #[test]
    fn reported_keys_are_fetched_served_under_their_lease_and_updated() {
        let t0 = Instant::from_secs(10);
        let mut n = node(t0);
        let fetches = n.report(1, &[(&b"a"[..], 50.0), (&b"b"[..], 40.0)], t0);
        assert_eq!(fetches.len(), 2);
        // Not served before its value and its rule.
        assert_eq!(n.serve(1, b"a", t0), None);
        let changes = n.poll(t0);
        assert_eq!(changes.len(), 2, "both rules installed: {changes:?}");
        for f in fetches {
            n.fetched(f, Some(value(b"v1")), t0);
        }
        assert_eq!(n.serve(1, b"a", t0).unwrap().data.as_ref(), b"v1");
        // An update replaces the value and keeps the lease.
        n.update(b"a", Some(value(b"v2")), t0);
        assert_eq!(n.serve(1, b"a", t0).unwrap().data.as_ref(), b"v2");
        n.update(b"b", None, t0);
        assert_eq!(n.serve(1, b"b", t0), None, "deleted");
        // The lease less the guard: served until then, not after, unless renewed.
        let end = t0 + Duration::from_millis(1800);
        assert!(n.serve(1, b"a", end - Duration::from_millis(1)).is_some());
        // Renewed while cached, a value or not (a deleted key's next write fills it again).
        let both: Vec<Box<[u8]>> = vec![b"a".to_vec().into(), b"b".to_vec().into()];
        assert_eq!(n.renewals(t0 + Duration::from_millis(900)), vec![(1, both)]);
        n.renewed(&[b"a".to_vec().into()], t0 + Duration::from_millis(900));
        assert!(n.serve(1, b"a", end + Duration::from_millis(1)).is_some());
        assert!(n.serve(1, b"a", t0 + Duration::from_millis(2701)).is_none());
    }

    #[test]
    fn refused_renewals_resets_and_ended_leases_drop_keys_and_their_rules() {
        let t0 = Instant::from_secs(10);
        let mut n = node(t0);
        for f in n.report(1, &[(&b"a"[..], 50.0), (&b"b"[..], 40.0)], t0) {
            n.fetched(f, Some(value(b"v")), t0);
        }
        n.poll(t0);
        // A renewal the backend refused: the key goes, with its rule.
        n.refused(&[b"a".to_vec().into()], t0);
        assert_eq!(n.serve(1, b"a", t0), None);
        let changes = n.poll(t0 + Duration::from_millis(10));
        assert!(
            changes
                .iter()
                .any(|c| matches!(c, crate::rules::Change::Remove(k) if &**k == b"a")),
            "{changes:?}"
        );
        // A report admits it again and fetches it: a new lease.
        assert_eq!(n.report(1, &[(&b"a"[..], 60.0)], t0).len(), 1);
        // The backend restarted: all its keys go.
        n.reset(1, t0);
        assert!(n.cached().is_empty(), "{:?}", n.cached());
        // A lease that ends unrenewed drops its key at the next poll.
        let f = n.report(0, &[(&b"c"[..], 50.0)], t0).remove(0);
        n.fetched(f, Some(value(b"v")), t0);
        n.poll(t0);
        assert_eq!(n.cached().len(), 1);
        n.poll(t0 + Duration::from_millis(1801));
        assert!(n.cached().is_empty());
    }

    #[test]
    fn an_instant_report_is_fetched_and_served_under_the_fetch_grant() {
        let t0 = Instant::from_secs(10);
        let mut n = node(t0);
        let fetch = n.hot(0, b"h", 50.0, t0).expect("taken, to be fetched");
        n.poll(t0);
        assert_eq!(n.serve(0, b"h", t0), None, "no value nor lease yet");
        // Reported again while its fetch is under way: no second fetch.
        assert!(n.report(0, &[(&b"h"[..], 60.0)], t0).is_empty());
        let asked = t0 + Duration::from_secs(5);
        n.fetched(fetch, Some(value(b"v")), asked);
        assert!(n.serve(0, b"h", asked).is_some());
        assert!(n
            .serve(0, b"h", asked + Duration::from_millis(1800))
            .is_none());
        // A key cached but neither leased nor fetched (its lease ended) is fetched again at
        // its next report.
        let late = asked + Duration::from_millis(1801);
        assert_eq!(n.report(0, &[(&b"h"[..], 60.0)], late).len(), 1);
    }

    #[test]
    fn a_fetch_that_does_not_fill_drops_its_key() {
        let t0 = Instant::from_secs(10);
        let mut n = node(t0);
        let fetch = n.hot(0, b"k", 50.0, t0).unwrap();
        n.poll(t0);
        // A write raced it: the fetched value may be older than what was written.
        n.update(b"k", Some(value(b"new")), t0);
        n.fetched(fetch, Some(value(b"old")), t0);
        assert!(n.cached().is_empty(), "{:?}", n.cached());
        assert_eq!(n.serve(0, b"k", t0), None);
    }

    #[test]
    fn a_write_racing_a_fetch_wins() {
        let t0 = Instant::from_secs(10);
        let mut n = node(t0);
        let fetch = n.report(0, &[(&b"a"[..], 50.0)], t0).remove(0);
        n.poll(t0);
        n.update(b"a", Some(value(b"new")), t0);
        n.fetched(fetch, Some(value(b"old")), t0);
        assert_ne!(
            n.serve(0, b"a", t0).map(|v| v.data.to_vec()),
            Some(b"old".to_vec())
        );
    }

    #[test]
    fn a_full_cache_admits_only_above_the_threshold_and_evicts_the_least_loaded() {
        let t0 = Instant::from_secs(10);
        let mut n = node(t0);
        n.report(0, &[(&b"a"[..], 50.0), (&b"b"[..], 40.0)], t0);
        assert!(n.hot(0, b"c", 10.0, t0).is_none(), "full, and not hotter");
        assert!(
            n.hot(0, b"c", 45.0, t0).is_some(),
            "a burst beats the least loaded"
        );
        let keys: Vec<Box<[u8]>> = n.cached().into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys.len(), 2);
        assert!(keys.iter().any(|k| &**k == b"c"));
    }
}
