//! Hot-key detection as SwitchKV does it: frequency counters that find a stream's heaviest
//! keys at constant cost per request, a time-segmented top-k load tracker with an
//! exponentially weighted average, a circular-log burst detector, and the cache's admission
//! threshold.
//!
//! Everything here is driven by its caller: time arrives as `Instant` arguments and no clock
//! is read, no I/O is done, and randomness comes from seeds in the configuration.

mod circular_log;
mod count_min;
mod space_saving;
mod tracker;

use std::time::Duration;

pub use circular_log::{CircularLog, DEFAULT_LOG_SIZE, DEFAULT_LOG_THRESHOLD};

use std::hash::BuildHasher;

/// 64-bit fingerprints of keys under a random key of each structure that holds them, so that
/// the per-request paths of the detectors compare and hash eight bytes rather than whole
/// keys. Two keys share a fingerprint with probability 2^-64 a pair, and then count as one:
/// a detector may nominate a key a little early, nothing worse. The random key keeps that
/// out of a client's reach.
#[derive(Clone, Debug, Default)]
pub(crate) struct Fingerprints(std::collections::hash_map::RandomState);

impl Fingerprints {
    pub(crate) fn of(&self, key: &[u8]) -> u64 {
        self.0.hash_one(key)
    }
}

/// Keeps the reads that `values` came from: the per-request paths here are bound by reads of
/// memory that is not in the processor's caches, one after another, and a caller that knows
/// its next keys early can have their first reads made together, ahead of time
/// ([`crate::switchkv::Backend::touch`]). They are plain loads, not prefetches (this crate has
/// no unsafe code): the processor overlaps them with each other and with the work after
/// them, as far as its out-of-order window reaches. The values are of no use; `black_box`
/// only keeps the reads from being left out.
pub(crate) fn touch(values: u64) {
    std::hint::black_box(values);
}

/// A map from fingerprints to `u32` values, for the per-request paths of the detectors: open
/// addressing with linear probing in one flat table, so that a lookup usually reads a single
/// cache line (a general hash map keeps its control bytes and its entries apart, two lines a
/// lookup). Fingerprints are uniform already and index the table as they are. The table
/// holds at most half as many keys as it has entries, growing when needed; removal shifts the
/// entries after it back, so there are no tombstones and lookups never slow down.
#[derive(Clone, Debug)]
pub(crate) struct FingerprintMap {
    /// `(fingerprint, value)`; [`FingerprintMap::VACANT`] as the value marks an empty entry.
    entries: Box<[(u64, u32)]>,
    mask: usize,
    len: usize,
}

impl FingerprintMap {
    /// The value that marks an empty entry; it cannot be stored.
    pub(crate) const VACANT: u32 = u32::MAX;

    /// A map with room for `keys` keys before it grows.
    pub(crate) fn with_capacity(keys: usize) -> FingerprintMap {
        let size = keys.max(4).saturating_mul(2).next_power_of_two();
        FingerprintMap {
            entries: vec![(0, Self::VACANT); size].into_boxed_slice(),
            mask: size - 1,
            len: 0,
        }
    }

    fn home(&self, fp: u64) -> usize {
        (fp as usize) & self.mask
    }

    /// Where `fp` is, or the empty entry where it would go.
    fn find(&self, fp: u64) -> (usize, bool) {
        let mut i = self.home(fp);
        loop {
            let (f, v) = self.entries[i];
            if v == Self::VACANT {
                return (i, false);
            }
            if f == fp {
                return (i, true);
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Reads the entry where a lookup of `fp` starts and returns a value made from it, for
    /// the caller to pass to [`std::hint::black_box`]: the entry's cache line is then on its
    /// way to the processor before the lookup needs it (see [`touch`]).
    pub(crate) fn touch(&self, fp: u64) -> u64 {
        let (f, v) = self.entries[self.home(fp)];
        f ^ u64::from(v)
    }

    pub(crate) fn get(&self, fp: u64) -> Option<u32> {
        match self.find(fp) {
            (i, true) => Some(self.entries[i].1),
            _ => None,
        }
    }

    pub(crate) fn get_mut(&mut self, fp: u64) -> Option<&mut u32> {
        match self.find(fp) {
            (i, true) => Some(&mut self.entries[i].1),
            _ => None,
        }
    }

    /// The value of `fp`, inserted as `value` first if absent.
    pub(crate) fn get_or_insert(&mut self, fp: u64, value: u32) -> &mut u32 {
        debug_assert_ne!(value, Self::VACANT);
        let (mut i, found) = self.find(fp);
        if !found {
            if (self.len + 1) * 2 > self.entries.len() {
                self.grow();
                i = self.find(fp).0;
            }
            self.entries[i] = (fp, value);
            self.len += 1;
        }
        &mut self.entries[i].1
    }

    /// Sets the value of `fp`.
    pub(crate) fn insert(&mut self, fp: u64, value: u32) {
        *self.get_or_insert(fp, value) = value;
    }

    /// Removes `fp`, returning its value if it was there.
    pub(crate) fn remove(&mut self, fp: u64) -> Option<u32> {
        let (mut hole, true) = self.find(fp) else {
            return None;
        };
        let value = self.entries[hole].1;
        // Backward shift: an entry after the hole moves into it unless its home lies in
        // (hole, j] (cyclically), where it must stay to be found.
        let mut j = hole;
        loop {
            j = (j + 1) & self.mask;
            let (f, v) = self.entries[j];
            if v == Self::VACANT {
                break;
            }
            let home = self.home(f);
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.entries[hole] = self.entries[j];
                hole = j;
            }
        }
        self.entries[hole] = (0, Self::VACANT);
        self.len -= 1;
        Some(value)
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Removes every key, keeping the table.
    pub(crate) fn clear(&mut self) {
        if self.len > 0 {
            self.entries.fill((0, Self::VACANT));
            self.len = 0;
        }
    }

    fn grow(&mut self) {
        let old = std::mem::replace(self, FingerprintMap::with_capacity(self.entries.len()));
        for &(f, v) in old.entries.iter() {
            if v != Self::VACANT {
                self.insert(f, v);
            }
        }
    }
}

pub use count_min::{CountMin, HeavyHitters};
pub use space_saving::SpaceSaving;
pub use tracker::{Counter, Report, Tracker, TrackerConfig, TrackerError};

/// Equation (1) of SwitchKV: the new load `α·freq_per_sec + (1 − α)·previous`.
///
/// `freq_per_sec` is the key's rate over the segment just ended (see [`load_per_sec`]) and
/// `previous` its load before, 0 for a key that had none. The cache applies this to its own
/// keys with the tracker's `alpha` so that both sides' loads compare.
pub fn ewma(alpha: f64, freq_per_sec: f64, previous: f64) -> f64 {
    alpha * freq_per_sec + (1.0 - alpha) * previous
}

/// A segment's count as requests per second: `count × sample / segment seconds`, where one
/// request in `sample` was counted. A zero `segment` gives an infinite or NaN rate (a
/// [`TrackerConfig`] with one is refused).
pub fn load_per_sec(count: u64, sample: u32, segment: Duration) -> f64 {
    count as f64 * f64::from(sample) / segment.as_secs_f64()
}

/// The cache's admission threshold: the load at the given percentile of `loads` counted from
/// the lowest, by the nearest-rank rule. SwitchKV uses the 10th percentile of its cached keys'
/// loads and admits reported keys whose load is above it.
///
/// With `n` loads and `percentile` p (in percent, clamped to [0, 100]; NaN counts as 0) the
/// answer is the r-th lowest load, r = ⌈p·n / 100⌉ kept within 1..=n. So for the loads 1..=100
/// the 10th percentile is 10, the 10.5th is 11, the 0th is 1 and the 100th is 100. Loads are
/// ranked by [`f64::total_cmp`]. Returns `None` when `loads` is empty. Reorders `loads` (a
/// selection, O(n), not a full sort).
pub fn admission_threshold(loads: &mut [f64], percentile: f64) -> Option<f64> {
    if loads.is_empty() {
        return None;
    }
    let n = loads.len();
    let p = if percentile.is_nan() {
        0.0
    } else {
        percentile.clamp(0.0, 100.0)
    };
    // p·n before the division, so that 10 % of 100 is exactly rank 10.
    let rank = ((p * n as f64) / 100.0).ceil() as usize;
    let index = rank.clamp(1, n) - 1;
    let (_, load, _) = loads.select_nth_unstable_by(index, |a, b| a.total_cmp(b));
    Some(*load)
}

/// A deterministic Zipf stream for tests.
#[cfg(test)]
pub(crate) mod test_zipf {
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    /// `len` key indices in `0..keys`, index i drawn with probability ∝ 1 / (i + 1)^skew.
    pub fn zipf_stream(keys: u32, skew: f64, len: usize, seed: u64) -> Vec<u32> {
        let mut cdf = Vec::with_capacity(keys as usize);
        let mut total = 0.0;
        for i in 0..keys {
            total += 1.0 / f64::from(i + 1).powf(skew);
            cdf.push(total);
        }
        let mut rng = SmallRng::seed_from_u64(seed);
        (0..len)
            .map(|_| {
                let u = rng.gen::<f64>() * total;
                cdf.partition_point(|&c| c <= u).min(keys as usize - 1) as u32
            })
            .collect()
    }

    /// Key bytes for index `i`.
    pub fn key(i: u32) -> [u8; 4] {
        i.to_le_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_map_agrees_with_a_hash_map() {
        use rand::rngs::SmallRng;
        use rand::{Rng, SeedableRng};
        let mut rng = SmallRng::seed_from_u64(5);
        let mut map = FingerprintMap::with_capacity(8);
        let mut want = std::collections::HashMap::new();
        for step in 0..200_000u32 {
            // Few distinct fingerprints, many sharing low bits and all at the top of the table
            // at every size: long probe runs that wrap past its end.
            let fp = u64::from(rng.gen_range(0..64u32)) << 40
                | (0xff_ffff - u64::from(rng.gen_range(0..24u32)));
            match rng.gen_range(0..4) {
                0 => {
                    map.insert(fp, step);
                    want.insert(fp, step);
                }
                1 => assert_eq!(map.remove(fp), want.remove(&fp)),
                2 => {
                    *map.get_or_insert(fp, 7) += 1;
                    *want.entry(fp).or_insert(7) += 1;
                }
                _ => assert_eq!(map.get(fp), want.get(&fp).copied()),
            }
            assert_eq!(map.len(), want.len());
            if step % 50_000 == 0 {
                map.clear();
                assert_eq!(map.get(fp), None);
                map = FingerprintMap::with_capacity(8);
                want.clear();
            }
        }
        for (&fp, &v) in &want {
            assert_eq!(map.get(fp), Some(v));
        }
    }

    #[test]
    fn structures_sharing_fingerprints_take_keys_fingerprinted_once() {
        use rand::rngs::SmallRng;
        use rand::{Rng, SeedableRng};
        // A counter and a log fed fingerprints taken once under shared `Fingerprints` answer
        // as ones that fingerprint each key themselves.
        let shared = Fingerprints::default();
        let mut counter = SpaceSaving::with_fingerprints(16, shared.clone());
        let mut log = CircularLog::with_fingerprints(20, 3, shared.clone());
        let (mut counter_alone, mut log_alone) = (SpaceSaving::new(16), CircularLog::new(20, 3));
        let mut rng = SmallRng::seed_from_u64(3);
        for _ in 0..20_000 {
            let spread = rng.gen_range(1..64);
            let key = test_zipf::key(rng.gen_range(0..spread));
            let fp = shared.of(&key);
            counter.see_fingerprint(&key, fp);
            counter_alone.see(&key);
            assert_eq!(log.see_fingerprint(fp), log_alone.see(&key));
            assert_eq!(counter.count(&key), counter_alone.count(&key));
            assert_eq!(log.count(&key), log_alone.count(&key));
        }
        assert_eq!(counter.top(16), counter_alone.top(16));
    }

    #[test]
    fn ewma_weights_the_new_frequency_by_alpha() {
        assert_eq!(ewma(0.5, 10.0, 0.0), 5.0);
        assert_eq!(ewma(0.5, 2.0, 5.0), 3.5);
        assert_eq!(ewma(0.25, 8.0, 4.0), 5.0);
        assert_eq!(ewma(1.0, 7.0, 100.0), 7.0);
    }

    #[test]
    fn load_is_scaled_to_requests_per_second() {
        assert_eq!(load_per_sec(10, 1, Duration::from_secs(1)), 10.0);
        assert_eq!(load_per_sec(10, 1, Duration::from_millis(500)), 20.0);
        assert_eq!(load_per_sec(10, 8, Duration::from_secs(2)), 40.0);
    }

    #[test]
    fn admission_threshold_picks_the_nearest_rank() {
        // 1..=100, shuffled deterministically.
        let mut loads: Vec<f64> = (1..=100).map(|i| ((i * 37) % 100 + 1) as f64).collect();
        for (p, want) in [
            (10.0, 10.0),
            (10.5, 11.0),
            (0.0, 1.0),
            (1.0, 1.0),
            (50.0, 50.0),
            (99.5, 100.0),
            (100.0, 100.0),
            (250.0, 100.0),
            (-3.0, 1.0),
            (f64::NAN, 1.0),
        ] {
            assert_eq!(admission_threshold(&mut loads, p), Some(want), "p = {p}");
        }

        // Ten loads: the 10th percentile is the lowest, anything above it the second.
        let mut ten = [9.0, 3.5, 7.0, 1.25, 8.0, 2.0, 6.0, 4.0, 5.0, 10.0];
        assert_eq!(admission_threshold(&mut ten, 10.0), Some(1.25));
        assert_eq!(admission_threshold(&mut ten, 10.1), Some(2.0));
        assert_eq!(admission_threshold(&mut [4.0], 10.0), Some(4.0));
        assert_eq!(admission_threshold(&mut [], 10.0), None);
        let mut with_nan = [f64::NAN, 2.0, 1.0];
        assert_eq!(admission_threshold(&mut with_nan, 60.0), Some(2.0));
        assert!(admission_threshold(&mut with_nan, 100.0).is_some_and(f64::is_nan));
    }
}
