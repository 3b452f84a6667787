//! SwitchKV's time-segmented top-k load tracker: per group (one per backend), a frequency
//! counter for the current segment and a key-load list of at most k keys, blended at each
//! segment end with equation (1) of the paper. Driven by the caller's clock; never reads one.

use std::collections::HashMap;
use std::time::Duration;

use crate::time::Instant;

use super::count_min::{mix64, CountMin, HeavyHitters};
use super::space_saving::SpaceSaving;
use super::{ewma, load_per_sec, Fingerprints};

/// Which frequency counter a [`Tracker`] keeps per group.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Counter {
    /// [`SpaceSaving`] with `capacity` keys: what SwitchKV used.
    SpaceSaving,
    /// A [`CountMin`] sketch of `depth` rows of `width` counters with a [`HeavyHitters`] set
    /// of `capacity` candidates: less memory per counted key when `capacity` is kept small.
    CountMin {
        width: usize,
        depth: usize,
        conservative: bool,
    },
}

impl Counter {
    /// A count-min counter of 4 rows of 2048 counters with conservative update: over-counts
    /// by at most ~0.13 % of a segment's requests with probability ≥ 98 %.
    pub const DEFAULT_COUNT_MIN: Counter = Counter::CountMin {
        width: 2048,
        depth: 4,
        conservative: true,
    };
}

/// Parameters of a [`Tracker`]. A cache that compares its own keys' loads with reported ones
/// must count them with the same `segment`, `alpha` and `sample`.
#[derive(Clone, Debug, PartialEq)]
pub struct TrackerConfig {
    /// Length of a segment; loads are refreshed at each segment end. Default 1 s, SwitchKV's
    /// report period.
    pub segment: Duration,
    /// Keys kept (and reported) per group. Default 5, as SwitchKV's backends reported.
    pub top_k: usize,
    /// Weight of the segment just ended in equation (1), in (0, 1]; 1 forgets the past at
    /// once. The paper gives no value; default 0.5.
    pub alpha: f64,
    /// Keys tracked per group by the frequency counter (space-saving slots or count-min
    /// candidates). Default 1024.
    pub capacity: usize,
    /// Count one request in `sample`; counts are scaled back up by `sample`. Default 1: every
    /// request.
    pub sample: u32,
    /// Seed of the sampling generator (and of the count-min hashes), so runs are repeatable.
    pub seed: u64,
    /// The frequency counter. Default [`Counter::SpaceSaving`].
    pub counter: Counter,
}

impl Default for TrackerConfig {
    fn default() -> TrackerConfig {
        TrackerConfig {
            segment: Duration::from_secs(1),
            top_k: 5,
            alpha: 0.5,
            capacity: 1024,
            sample: 1,
            seed: 0x5357_4b56, // "SWKV"
            counter: Counter::SpaceSaving,
        }
    }
}

impl TrackerConfig {
    /// Checks every field; see [`TrackerError`] for what is refused.
    pub fn validate(&self) -> Result<(), TrackerError> {
        if self.segment.is_zero() {
            return Err(TrackerError::ZeroSegment);
        }
        if !(self.alpha > 0.0 && self.alpha <= 1.0) {
            return Err(TrackerError::Alpha(self.alpha));
        }
        if self.capacity == 0 || self.capacity >= u32::MAX as usize {
            return Err(TrackerError::Capacity(self.capacity));
        }
        if self.top_k == 0 || self.top_k > self.capacity {
            return Err(TrackerError::TopK {
                top_k: self.top_k,
                capacity: self.capacity,
            });
        }
        if self.sample == 0 {
            return Err(TrackerError::ZeroSample);
        }
        if let Counter::CountMin { width, depth, .. } = self.counter {
            if width == 0 || depth == 0 || width.checked_mul(depth).is_none() {
                return Err(TrackerError::Sketch { width, depth });
            }
        }
        Ok(())
    }
}

/// A [`TrackerConfig`] (or group count) that [`Tracker::new`] refuses.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum TrackerError {
    /// `segment` is zero.
    #[error("tracker segment must be longer than zero")]
    ZeroSegment,
    /// `alpha` is not in (0, 1] (or is NaN).
    #[error("tracker alpha must be in (0, 1], got {0}")]
    Alpha(f64),
    /// `capacity` is 0 or not below 2^32 − 1.
    #[error("tracker capacity must be in 1..4294967295, got {0}")]
    Capacity(usize),
    /// `top_k` is 0 or above `capacity`: the counter could not supply that many keys.
    #[error("tracker top_k must be in 1..=capacity ({capacity}), got {top_k}")]
    TopK { top_k: usize, capacity: usize },
    /// `sample` is 0.
    #[error("tracker sample must be at least 1")]
    ZeroSample,
    /// A count-min counter with no counters (or too many to address).
    #[error("count-min width and depth must be > 0 and addressable, got {width} x {depth}")]
    Sketch { width: usize, depth: usize },
    /// No groups to track.
    #[error("tracker needs at least one group")]
    ZeroGroups,
}

/// One entry of a group's key-load list as it stood after a segment roll: what a SwitchKV
/// backend sends to the cache every period.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub key: Box<[u8]>,
    /// Requests per second, by equation (1).
    pub load: f64,
    /// The group (backend) whose list holds the key.
    pub group: usize,
    /// The key was not in the group's list before this roll.
    pub fresh: bool,
}

/// Recent hot keys and their loads, per group, over time segments.
///
/// Requests are counted in the current segment's frequency counter. When a segment ends,
/// each group's new key-load list is its counter's top `k` keys, each with load
/// `L = α·f + (1 − α)·L'`, where `f` is its count × `sample` / segment seconds and `L'` its
/// load in the previous list (0 if absent); the counter then starts afresh. If the segment saw
/// fewer than `k` keys, the list is filled up with the previous list's highest-load keys not
/// seen, at frequency 0 (so an idle group's loads decay by `1 − α` per segment instead of
/// vanishing); a key whose load reaches 0 (only when `α = 1`) is dropped. Lists are kept in
/// decreasing load order.
///
/// [`see`](Tracker::see) costs one counter update (O(1) for space-saving, O(depth + log
/// capacity) for count-min) plus the roll when a segment has ended; a roll is O(groups · k)
/// for space-saving, O(groups · capacity · log capacity) for count-min.
#[derive(Debug)]
pub struct Tracker {
    cfg: TrackerConfig,
    groups: Vec<Group>,
    /// Every group's space-saving counter fingerprints keys with these, so that a caller
    /// fingerprints a key once for the tracker and its own structures.
    fingerprints: Fingerprints,
    /// End of the current segment.
    segment_end: Instant,
    /// SplitMix64 state for sampling.
    rng: u64,
    ignored: u64,
    reports: Vec<Report>,
}

#[derive(Debug)]
struct Group {
    counter: Freq,
    /// The key-load list, decreasing load.
    loads: Vec<Entry>,
}

impl Group {
    fn new(cfg: &TrackerConfig, fingerprints: &Fingerprints) -> Group {
        Group {
            counter: match cfg.counter {
                Counter::SpaceSaving => Freq::SpaceSaving(SpaceSaving::with_fingerprints(
                    cfg.capacity,
                    fingerprints.clone(),
                )),
                Counter::CountMin {
                    width,
                    depth,
                    conservative,
                } => Freq::CountMin(HeavyHitters::new(
                    CountMin::new(width, depth, cfg.seed).conservative(conservative),
                    cfg.capacity,
                )),
            },
            loads: Vec::with_capacity(cfg.top_k),
        }
    }
}

#[derive(Debug)]
struct Entry {
    key: Box<[u8]>,
    load: f64,
    /// Not in the list before the last roll.
    fresh: bool,
}

#[derive(Debug)]
enum Freq {
    SpaceSaving(SpaceSaving),
    CountMin(HeavyHitters),
}

impl Freq {
    /// Counts `key`, whose fingerprint under the tracker's [`Fingerprints`] is `fp` if the
    /// caller has taken it.
    fn see(&mut self, key: &[u8], fp: Option<u64>) {
        match self {
            Freq::SpaceSaving(c) => match fp {
                Some(fp) => c.see_fingerprint(key, fp),
                None => c.see(key),
            },
            Freq::CountMin(c) => {
                c.add(key);
            }
        }
    }

    fn top(&self, k: usize) -> Vec<(Box<[u8]>, u64)> {
        match self {
            Freq::SpaceSaving(c) => c.top(k),
            Freq::CountMin(c) => c.top(k),
        }
    }

    fn clear(&mut self) {
        match self {
            Freq::SpaceSaving(c) => c.clear(),
            Freq::CountMin(c) => c.clear(),
        }
    }
}

impl Tracker {
    /// A tracker for `groups` groups whose first segment starts at `now`.
    pub fn new(cfg: TrackerConfig, groups: usize, now: Instant) -> Result<Tracker, TrackerError> {
        cfg.validate()?;
        if groups == 0 {
            return Err(TrackerError::ZeroGroups);
        }
        let fingerprints = Fingerprints::default();
        let groups = (0..groups)
            .map(|_| Group::new(&cfg, &fingerprints))
            .collect();
        Ok(Tracker {
            segment_end: now + cfg.segment,
            rng: cfg.seed,
            groups,
            fingerprints,
            ignored: 0,
            reports: Vec::new(),
            cfg,
        })
    }

    /// Makes room for `groups` groups (a backend added at run time); never removes any.
    pub fn ensure_groups(&mut self, groups: usize) {
        while self.groups.len() < groups {
            self.groups.push(Group::new(&self.cfg, &self.fingerprints));
        }
    }

    /// Counts a request for `key` to `group` at `now` (subject to sampling), after rolling
    /// the segment if `now` has reached its end. A `group` out of range is counted in
    /// [`ignored`](Tracker::ignored) and otherwise ignored. `now` should not go backwards; a
    /// `now` before the current segment's end simply counts in the current segment.
    pub fn see(&mut self, group: usize, key: &[u8], now: Instant) {
        self.count(group, key, None, now);
    }

    /// The fingerprints the tracker's counters take keys by (see
    /// [`Tracker::see_fingerprint`]).
    pub(crate) fn fingerprints(&self) -> &Fingerprints {
        &self.fingerprints
    }

    /// A circular log of `size` entries and `threshold` (see [`super::CircularLog::new`]) that
    /// fingerprints keys as the tracker's counters do, so that a key is fingerprinted once for
    /// both; `None` when `size` is 0 (no log).
    pub(crate) fn log_beside(&self, size: usize, threshold: u32) -> Option<super::CircularLog> {
        (size > 0).then(|| {
            super::CircularLog::with_fingerprints(size, threshold, self.fingerprints.clone())
        })
    }

    /// As [`Tracker::see`], for a key whose fingerprint under [`Tracker::fingerprints`] the
    /// caller has already taken (to share it with a [`super::CircularLog`] made with the same
    /// fingerprints).
    pub(crate) fn see_fingerprint(&mut self, group: usize, key: &[u8], fp: u64, now: Instant) {
        self.count(group, key, Some(fp), now);
    }

    /// Reads what counting the key with fingerprint `fp` (under [`Tracker::fingerprints`])
    /// in `group` will read first (see [`super::touch`]); 0 for a count-min counter or a
    /// group out of range. Changes nothing.
    pub(crate) fn touch(&self, group: usize, fp: u64) -> u64 {
        match self.groups.get(group).map(|g| &g.counter) {
            Some(Freq::SpaceSaving(c)) => c.touch(fp),
            _ => 0,
        }
    }

    /// Reads the header of `group`'s counter, where a [`Tracker::touch`] of a key in it
    /// starts (see [`super::touch`]). Changes nothing.
    pub(crate) fn touch_group(&self, group: usize) -> u64 {
        let v = self.segment_end.as_nanos() ^ u64::from(self.cfg.sample);
        match self.groups.get(group).map(|g| &g.counter) {
            Some(Freq::SpaceSaving(c)) => v ^ c.touch_header(),
            _ => v,
        }
    }

    fn count(&mut self, group: usize, key: &[u8], fp: Option<u64>, now: Instant) {
        self.roll_if_due(now);
        if group >= self.groups.len() {
            self.ignored += 1;
            return;
        }
        if self.cfg.sample > 1 {
            self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
            // Keep the request when the draw's top 32 bits, scaled to 0..sample, give 0.
            if ((mix64(self.rng) >> 32) * u64::from(self.cfg.sample)) >> 32 != 0 {
                return;
            }
        }
        self.groups[group].counter.see(key, fp);
    }

    /// Ends the current segment if `now` has reached its end, updating every group's list,
    /// and returns whether it did. Segments that ended with no call in between are taken as
    /// empty: each multiplies the loads by `1 − α`. The next segment end stays on the grid
    /// `start + n·segment`. The new lists become the pending [`take_reports`] answer.
    ///
    /// [`take_reports`]: Tracker::take_reports
    pub fn roll_if_due(&mut self, now: Instant) -> bool {
        if now < self.segment_end {
            return false;
        }
        let seg = self.cfg.segment;
        // Whole segments that ended after the one holding the counts: all empty.
        let empty = (now - self.segment_end).as_nanos() / seg.as_nanos();
        let decay = (1.0 - self.cfg.alpha).powf(empty as f64);
        self.reports.clear();
        for (g, group) in self.groups.iter_mut().enumerate() {
            group.roll(&self.cfg, decay);
            self.reports.extend(group.loads.iter().map(|e| Report {
                key: e.key.clone(),
                load: e.load,
                group: g,
                fresh: e.fresh,
            }));
        }
        self.segment_end = u32::try_from(empty + 1)
            .ok()
            .and_then(|n| seg.checked_mul(n))
            .and_then(|d| self.segment_end.checked_add(d))
            .or_else(|| now.checked_add(seg))
            .unwrap_or(now);
        true
    }

    /// Every group's key-load list: `(key, load in requests/s, group)`, group by group, each
    /// in decreasing load.
    pub fn hot(&self) -> impl Iterator<Item = (&[u8], f64, usize)> + '_ {
        self.groups
            .iter()
            .enumerate()
            .flat_map(|(g, group)| group.loads.iter().map(move |e| (&e.key[..], e.load, g)))
    }

    /// The load of `key` in `group`'s list, if it is there.
    pub fn load(&self, group: usize, key: &[u8]) -> Option<f64> {
        let group = self.groups.get(group)?;
        group.loads.iter().find(|e| *e.key == *key).map(|e| e.load)
    }

    /// The lists produced by the most recent roll, if not taken yet: every entry of every
    /// group, with `fresh` set for keys new to their group's list. A roll replaces reports
    /// not taken since the previous one (they are stale by then).
    pub fn take_reports(&mut self) -> Vec<Report> {
        std::mem::take(&mut self.reports)
    }

    /// Requests ignored because their group was out of range.
    pub fn ignored(&self) -> u64 {
        self.ignored
    }

    /// When the current segment ends.
    pub fn segment_end(&self) -> Instant {
        self.segment_end
    }

    /// Number of groups.
    pub fn groups(&self) -> usize {
        self.groups.len()
    }

    /// The configuration.
    pub fn config(&self) -> &TrackerConfig {
        &self.cfg
    }
}

impl Group {
    /// Replaces the key-load list by the one for the segment just ended, followed by
    /// `decay` for the empty segments after it, and clears the counter.
    fn roll(&mut self, cfg: &TrackerConfig, decay: f64) {
        let old = std::mem::take(&mut self.loads);
        let mut previous: HashMap<&[u8], f64> = old.iter().map(|e| (&e.key[..], e.load)).collect();
        let mut new = Vec::with_capacity(cfg.top_k);
        for (key, count) in self.counter.top(cfg.top_k) {
            let f = load_per_sec(count, cfg.sample, cfg.segment);
            let before = previous.remove(&key[..]);
            new.push(Entry {
                load: ewma(cfg.alpha, f, before.unwrap_or(0.0)),
                fresh: before.is_none(),
                key,
            });
        }
        // Fill up with unseen keys of the old list (already in decreasing load).
        for e in &old {
            if new.len() == cfg.top_k {
                break;
            }
            if previous.contains_key(&e.key[..]) {
                new.push(Entry {
                    key: e.key.clone(),
                    load: ewma(cfg.alpha, 0.0, e.load),
                    fresh: false,
                });
            }
        }
        for e in &mut new {
            e.load *= decay;
        }
        new.retain(|e| e.load > 0.0);
        // Stable: equal loads keep the counter's order (space-saving: the most recently seen
        // first; count-min: key order), then the old list's.
        new.sort_by(|a, b| b.load.total_cmp(&a.load));
        self.loads = new;
        self.counter.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(top_k: usize) -> TrackerConfig {
        TrackerConfig {
            top_k,
            capacity: 16,
            ..TrackerConfig::default()
        }
    }

    fn see_n(t: &mut Tracker, group: usize, key: &[u8], n: usize, now: Instant) {
        for _ in 0..n {
            t.see(group, key, now);
        }
    }

    fn list(t: &Tracker) -> Vec<(&[u8], f64, usize)> {
        t.hot().collect()
    }

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn equation_one_over_several_segments() {
        let t0 = Instant::ZERO;
        let mut t = Tracker::new(cfg(2), 1, t0).unwrap();
        see_n(&mut t, 0, b"a", 10, t0);
        see_n(&mut t, 0, b"b", 4, t0 + SEC / 2);
        assert!(!t.roll_if_due(t0 + SEC - Duration::from_nanos(1)));
        assert!(list(&t).is_empty());
        assert!(t.roll_if_due(t0 + SEC));
        assert!(!t.roll_if_due(t0 + SEC));
        assert_eq!(list(&t), [(&b"a"[..], 5.0, 0), (&b"b"[..], 2.0, 0)]);
        let reports = t.take_reports();
        assert_eq!(reports.len(), 2);
        assert!(reports.iter().all(|r| r.fresh && r.group == 0));
        assert!(t.take_reports().is_empty());

        // Segment 2: top-2 is c (6) and a (2); b falls out of the list.
        see_n(&mut t, 0, b"a", 2, t0 + SEC);
        see_n(&mut t, 0, b"c", 6, t0 + SEC);
        see_n(&mut t, 0, b"b", 1, t0 + SEC);
        // The first request of segment 3 rolls segment 2.
        t.see(0, b"a", t0 + 2 * SEC);
        assert_eq!(list(&t), [(&b"a"[..], 3.5, 0), (&b"c"[..], 3.0, 0)]);
        let reports = t.take_reports();
        let fresh: Vec<(&[u8], bool)> = reports.iter().map(|r| (&r.key[..], r.fresh)).collect();
        assert_eq!(fresh, [(&b"a"[..], false), (&b"c"[..], true)]);
        assert_eq!(t.load(0, b"b"), None);

        // Segment 3: a 4 times, c not at all: c keeps a slot at frequency 0.
        see_n(&mut t, 0, b"a", 3, t0 + 2 * SEC);
        assert!(t.roll_if_due(t0 + 3 * SEC));
        assert_eq!(list(&t), [(&b"a"[..], 3.75, 0), (&b"c"[..], 1.5, 0)]);
        assert_eq!(t.segment_end(), t0 + 4 * SEC);
    }

    #[test]
    fn load_is_per_second_of_segment() {
        let t0 = Instant::ZERO;
        let config = TrackerConfig {
            segment: Duration::from_millis(500),
            alpha: 0.25,
            ..cfg(5)
        };
        let mut t = Tracker::new(config, 1, t0).unwrap();
        see_n(&mut t, 0, b"a", 3, t0);
        t.roll_if_due(t0 + SEC / 2);
        // 3 requests in half a second: 6/s, weighted by 0.25.
        assert_eq!(t.load(0, b"a"), Some(1.5));
    }

    #[test]
    fn empty_segments_decay_loads() {
        let t0 = Instant::ZERO;
        let mut t = Tracker::new(cfg(5), 1, t0).unwrap();
        see_n(&mut t, 0, b"a", 8, t0);
        see_n(&mut t, 0, b"b", 16, t0);
        assert!(t.roll_if_due(t0 + SEC));
        assert_eq!(list(&t), [(&b"b"[..], 8.0, 0), (&b"a"[..], 4.0, 0)]);
        // [1 s, 2 s) and [2 s, 3 s) ended empty.
        assert!(t.roll_if_due(t0 + 3 * SEC + SEC / 2));
        assert_eq!(list(&t), [(&b"b"[..], 2.0, 0), (&b"a"[..], 1.0, 0)]);
        assert_eq!(t.segment_end(), t0 + 4 * SEC);
        assert!(t.take_reports().iter().all(|r| !r.fresh));

        // A request long after: [3 s, 4 s) and the 3 segments after it ended empty before it.
        see_n(&mut t, 0, b"c", 1, t0 + 7 * SEC);
        assert_eq!(list(&t), [(&b"b"[..], 0.125, 0), (&b"a"[..], 0.0625, 0)]);
        assert!(t.roll_if_due(t0 + 8 * SEC));
        assert_eq!(
            list(&t),
            [
                (&b"c"[..], 0.5, 0),
                (&b"b"[..], 0.0625, 0),
                (&b"a"[..], 0.03125, 0)
            ]
        );

        // With alpha 1, nothing survives an empty segment.
        let config = TrackerConfig {
            alpha: 1.0,
            ..cfg(5)
        };
        let mut t = Tracker::new(config, 1, t0).unwrap();
        see_n(&mut t, 0, b"a", 8, t0);
        t.roll_if_due(t0 + SEC);
        assert_eq!(list(&t), [(&b"a"[..], 8.0, 0)]);
        t.roll_if_due(t0 + 2 * SEC);
        assert!(list(&t).is_empty());
    }

    #[test]
    fn only_top_k_per_group() {
        let t0 = Instant::ZERO;
        let mut t = Tracker::new(cfg(3), 2, t0).unwrap();
        for (i, key) in [b"k1", b"k2", b"k3", b"k4", b"k5", b"k6"]
            .iter()
            .enumerate()
        {
            see_n(&mut t, 0, &key[..], 10 * (i + 1), t0);
            see_n(&mut t, 1, &key[..], 60 - 10 * i, t0);
        }
        t.see(2, b"k9", t0);
        t.see(usize::MAX, b"k9", t0);
        assert_eq!(t.ignored(), 2);
        t.roll_if_due(t0 + SEC);
        assert_eq!(
            list(&t),
            [
                (&b"k6"[..], 30.0, 0),
                (&b"k5"[..], 25.0, 0),
                (&b"k4"[..], 20.0, 0),
                (&b"k1"[..], 30.0, 1),
                (&b"k2"[..], 25.0, 1),
                (&b"k3"[..], 20.0, 1),
            ]
        );
        assert_eq!(t.take_reports().len(), 6);
    }

    #[test]
    fn sampling_scales_loads() {
        let t0 = Instant::ZERO;
        let run = |sample: u32, seed: u64| {
            let config = TrackerConfig {
                sample,
                seed,
                ..cfg(5)
            };
            let mut t = Tracker::new(config, 1, t0).unwrap();
            see_n(&mut t, 0, b"hot", 40_000, t0);
            see_n(&mut t, 0, b"warm", 4_000, t0);
            t.roll_if_due(t0 + SEC);
            (t.load(0, b"hot").unwrap(), t.load(0, b"warm").unwrap())
        };
        assert_eq!(run(1, 0), (20_000.0, 2_000.0));
        let (hot, warm) = run(16, 1);
        assert!((hot - 20_000.0).abs() < 1_000.0, "hot {hot}");
        assert!((warm - 2_000.0).abs() < 400.0, "warm {warm}");
        // Loads are whole multiples of what one sampled request weighs: 16 × α.
        assert_eq!(hot % 8.0, 0.0);
        // Repeatable from the seed.
        assert_eq!(run(16, 1), (hot, warm));
        assert_ne!(run(16, 2), (hot, warm));
    }

    #[test]
    fn count_min_counter_gives_the_same_loads() {
        let t0 = Instant::ZERO;
        let config = TrackerConfig {
            counter: Counter::DEFAULT_COUNT_MIN,
            ..cfg(2)
        };
        let mut t = Tracker::new(config, 1, t0).unwrap();
        see_n(&mut t, 0, b"a", 10, t0);
        see_n(&mut t, 0, b"b", 4, t0);
        see_n(&mut t, 0, b"c", 2, t0);
        t.roll_if_due(t0 + SEC);
        assert_eq!(list(&t), [(&b"a"[..], 5.0, 0), (&b"b"[..], 2.0, 0)]);
        see_n(&mut t, 0, b"a", 2, t0 + SEC);
        see_n(&mut t, 0, b"c", 6, t0 + SEC);
        t.roll_if_due(t0 + 2 * SEC);
        assert_eq!(list(&t), [(&b"a"[..], 3.5, 0), (&b"c"[..], 3.0, 0)]);
    }

    #[test]
    fn refuses_bad_configs() {
        let t0 = Instant::ZERO;
        let bad = [
            (
                TrackerConfig {
                    segment: Duration::ZERO,
                    ..TrackerConfig::default()
                },
                TrackerError::ZeroSegment,
            ),
            (
                TrackerConfig {
                    alpha: 0.0,
                    ..TrackerConfig::default()
                },
                TrackerError::Alpha(0.0),
            ),
            (
                TrackerConfig {
                    alpha: 1.5,
                    ..TrackerConfig::default()
                },
                TrackerError::Alpha(1.5),
            ),
            (
                TrackerConfig {
                    top_k: 0,
                    ..TrackerConfig::default()
                },
                TrackerError::TopK {
                    top_k: 0,
                    capacity: 1024,
                },
            ),
            (
                TrackerConfig {
                    top_k: 2000,
                    ..TrackerConfig::default()
                },
                TrackerError::TopK {
                    top_k: 2000,
                    capacity: 1024,
                },
            ),
            (
                TrackerConfig {
                    capacity: 0,
                    ..TrackerConfig::default()
                },
                TrackerError::Capacity(0),
            ),
            (
                TrackerConfig {
                    sample: 0,
                    ..TrackerConfig::default()
                },
                TrackerError::ZeroSample,
            ),
            (
                TrackerConfig {
                    counter: Counter::CountMin {
                        width: 0,
                        depth: 4,
                        conservative: false,
                    },
                    ..TrackerConfig::default()
                },
                TrackerError::Sketch { width: 0, depth: 4 },
            ),
        ];
        for (config, want) in bad {
            assert_eq!(Tracker::new(config, 1, t0).unwrap_err(), want);
        }
        let nan = TrackerConfig {
            alpha: f64::NAN,
            ..TrackerConfig::default()
        };
        assert!(matches!(nan.validate(), Err(TrackerError::Alpha(a)) if a.is_nan()));
        assert_eq!(
            Tracker::new(TrackerConfig::default(), 0, t0).unwrap_err(),
            TrackerError::ZeroGroups
        );
        let t = Tracker::new(TrackerConfig::default(), 3, t0).unwrap();
        assert_eq!(t.groups(), 3);
        assert_eq!(t.segment_end(), t0 + SEC);
    }
}
