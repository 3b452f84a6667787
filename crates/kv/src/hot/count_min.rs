//! The count-min sketch (Cormode and Muthukrishnan) and a bounded set of heavy hitters kept
//! beside it: an alternative to [`SpaceSaving`](super::SpaceSaving) whose memory per counted
//! key is a few integers shared with other keys, at the price of hashing `depth` times.

use std::collections::HashMap;

/// A count-min sketch: `depth` rows of `width` counters, one counter per row for each key.
///
/// An estimate is never below the key's true count. With `width = ⌈e/ε⌉` and
/// `depth = ⌈ln(1/δ)⌉`, it exceeds the true count by more than `ε·n` (n: visits since the
/// last clear) with probability at most `δ`. Row positions come from a seeded hash, so two
/// sketches built with the same seed agree. [`add`](CountMin::add) and
/// [`estimate`](CountMin::estimate) are O(depth).
#[derive(Clone, Debug)]
pub struct CountMin {
    width: usize,
    depth: usize,
    seed: u64,
    conservative: bool,
    /// Row-major: row `r` is `cells[r * width..(r + 1) * width]`.
    cells: Vec<u64>,
}

impl CountMin {
    /// A sketch of `depth` rows of `width` counters whose rows hash keys with `seed`; standard
    /// (not conservative) update.
    ///
    /// # Panics
    /// If `width` or `depth` is 0, or their product overflows `usize`.
    pub fn new(width: usize, depth: usize, seed: u64) -> CountMin {
        assert!(
            width > 0 && depth > 0,
            "count-min width and depth must be > 0"
        );
        let cells = width.checked_mul(depth).expect("count-min too large");
        CountMin {
            width,
            depth,
            seed,
            conservative: false,
            cells: vec![0; cells],
        }
    }

    /// Turns conservative update on or off. Conservative update raises a key's counters only
    /// as far as its new estimate, which keeps the same no-under-estimate guarantee with less
    /// over-estimate.
    pub fn conservative(mut self, on: bool) -> CountMin {
        self.conservative = on;
        self
    }

    /// Counts one visit of `key` and returns its new estimate (always the old estimate + 1).
    pub fn add(&mut self, key: &[u8]) -> u64 {
        let probe = self.probe(key);
        let new = self.estimate_probed(probe).saturating_add(1);
        for row in 0..self.depth {
            let i = self.cell(probe, row);
            let cell = &mut self.cells[i];
            *cell = if self.conservative {
                (*cell).max(new)
            } else {
                cell.saturating_add(1)
            };
        }
        new
    }

    /// The estimated count of `key`: at least its true count, 0 for a key never added.
    pub fn estimate(&self, key: &[u8]) -> u64 {
        self.estimate_probed(self.probe(key))
    }

    /// Sets every counter to zero.
    pub fn clear(&mut self) {
        self.cells.fill(0);
    }

    /// Halves every counter (rounding down): older visits weigh half as much as newer ones,
    /// the ageing of a sketch that counts a stream without end. An estimate stays at least
    /// half the key's true count, rounded down, for each halving since it was counted.
    pub fn halve(&mut self) {
        for cell in &mut self.cells {
            *cell /= 2;
        }
    }

    /// Counters per row.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Number of rows.
    pub fn depth(&self) -> usize {
        self.depth
    }

    fn estimate_probed(&self, probe: Probe) -> u64 {
        (0..self.depth)
            .map(|row| self.cells[self.cell(probe, row)])
            .min()
            .unwrap_or(0)
    }

    /// Hashes the key once for all rows.
    fn probe(&self, key: &[u8]) -> Probe {
        let hash = hash64(key, self.seed);
        Probe {
            hash,
            step: mix64(hash.rotate_left(32)) | 1,
        }
    }

    /// The index in `cells` of the key's counter in `row`, by double hashing: column
    /// `(hash + row·step) mod width`, with an odd step from a second mix of the hash.
    fn cell(&self, probe: Probe, row: usize) -> usize {
        let column = probe
            .hash
            .wrapping_add((row as u64).wrapping_mul(probe.step))
            % self.width as u64;
        row * self.width + column as usize
    }
}

/// A key's hash and its double-hashing step.
#[derive(Clone, Copy)]
struct Probe {
    hash: u64,
    step: u64,
}

/// A [`CountMin`] plus the `k` keys with the highest estimates seen so far.
///
/// A key enters the set on an [`add`](HeavyHitters::add) whose estimate exceeds the lowest
/// estimate in a full set, replacing that key. Each member keeps the estimate of its latest
/// add, which is still an over-estimate of its true count (it has not been added since) and is
/// never above the sketch's current estimate. `add` is O(depth + log k).
#[derive(Clone, Debug)]
pub struct HeavyHitters {
    sketch: CountMin,
    k: usize,
    index: HashMap<Box<[u8]>, u32>,
    members: Vec<Member>,
    /// Binary min-heap of indices into `members`, ordered by estimate.
    heap: Vec<u32>,
}

#[derive(Clone, Debug)]
struct Member {
    key: Box<[u8]>,
    estimate: u64,
    /// Position in `heap`.
    pos: usize,
}

impl HeavyHitters {
    /// Keeps the `k` heaviest keys counted by `sketch`.
    ///
    /// # Panics
    /// If `k` is 0 or not below `u32::MAX`.
    pub fn new(sketch: CountMin, k: usize) -> HeavyHitters {
        assert!(
            k > 0 && k < u32::MAX as usize,
            "heavy hitters k must be in 1..u32::MAX, got {k}"
        );
        HeavyHitters {
            sketch,
            k,
            index: HashMap::with_capacity(k),
            members: Vec::with_capacity(k),
            heap: Vec::with_capacity(k),
        }
    }

    /// Counts one visit of `key` in the sketch, updates the set, and returns the estimate.
    pub fn add(&mut self, key: &[u8]) -> u64 {
        let estimate = self.sketch.add(key);
        if let Some(&m) = self.index.get(key) {
            // Estimates only grow, so the member can only move away from the heap's root.
            self.members[m as usize].estimate = estimate;
            self.sift_down(self.members[m as usize].pos);
        } else if self.members.len() < self.k {
            let m = self.members.len() as u32;
            self.members.push(Member {
                key: key.into(),
                estimate,
                pos: self.heap.len(),
            });
            self.heap.push(m);
            self.index.insert(key.into(), m);
            self.sift_up(self.heap.len() - 1);
        } else if estimate > self.members[self.heap[0] as usize].estimate {
            let m = self.heap[0];
            let member = &mut self.members[m as usize];
            let old = std::mem::replace(&mut member.key, key.into());
            member.estimate = estimate;
            self.index.remove(&old);
            self.index.insert(key.into(), m);
            self.sift_down(0);
        }
        estimate
    }

    /// The sketch's estimate for `key` (at least its true count).
    pub fn estimate(&self, key: &[u8]) -> u64 {
        self.sketch.estimate(key)
    }

    /// The estimate recorded for `key` if it is in the set.
    pub fn count(&self, key: &[u8]) -> Option<u64> {
        self.index
            .get(key)
            .map(|&m| self.members[m as usize].estimate)
    }

    /// Up to `n` members, highest estimate first, equal estimates in key byte order.
    /// O(k log k).
    pub fn top(&self, n: usize) -> Vec<(Box<[u8]>, u64)> {
        let mut all: Vec<&Member> = self.members.iter().collect();
        all.sort_unstable_by(|a, b| b.estimate.cmp(&a.estimate).then(a.key.cmp(&b.key)));
        all.into_iter()
            .take(n)
            .map(|m| (m.key.clone(), m.estimate))
            .collect()
    }

    /// Number of keys in the set.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The sketch underneath.
    pub fn sketch(&self) -> &CountMin {
        &self.sketch
    }

    /// Clears the sketch and the set.
    pub fn clear(&mut self) {
        self.sketch.clear();
        self.index.clear();
        self.members.clear();
        self.heap.clear();
    }

    fn less(&self, a: usize, b: usize) -> bool {
        self.members[self.heap[a] as usize].estimate < self.members[self.heap[b] as usize].estimate
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.members[self.heap[a] as usize].pos = a;
        self.members[self.heap[b] as usize].pos = b;
    }

    fn sift_up(&mut self, mut i: usize) {
        while i > 0 {
            let parent = (i - 1) / 2;
            if !self.less(i, parent) {
                break;
            }
            self.swap(i, parent);
            i = parent;
        }
    }

    fn sift_down(&mut self, mut i: usize) {
        loop {
            let (left, right) = (2 * i + 1, 2 * i + 2);
            let mut least = i;
            if left < self.heap.len() && self.less(left, least) {
                least = left;
            }
            if right < self.heap.len() && self.less(right, least) {
                least = right;
            }
            if least == i {
                break;
            }
            self.swap(i, least);
            i = least;
        }
    }
}

/// FNV-1a over the key from a seeded basis, then a finaliser so that every output bit depends
/// on every input bit (FNV alone leaves the low bits weak for a modulus).
fn hash64(key: &[u8], seed: u64) -> u64 {
    const FNV_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = FNV_BASIS ^ mix64(seed);
    for &b in key {
        h = (h ^ u64::from(b)).wrapping_mul(FNV_PRIME);
    }
    mix64(h)
}

/// The SplitMix64 / MurmurHash3 64-bit finaliser.
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::hot::test_zipf::{key, zipf_stream};

    #[test]
    fn exact_without_collisions() {
        let mut cm = CountMin::new(1 << 16, 4, 1);
        assert_eq!(cm.add(b"a"), 1);
        assert_eq!(cm.add(b"a"), 2);
        assert_eq!(cm.add(b"b"), 1);
        assert_eq!(cm.estimate(b"a"), 2);
        assert_eq!(cm.estimate(b"c"), 0);
        cm.clear();
        assert_eq!(cm.estimate(b"a"), 0);
    }

    #[test]
    fn halving_ages_every_count() {
        let mut cm = CountMin::new(1 << 16, 4, 1);
        for _ in 0..7 {
            cm.add(b"a");
        }
        cm.add(b"b");
        cm.halve();
        assert_eq!((cm.estimate(b"a"), cm.estimate(b"b")), (3, 0));
        cm.add(b"b");
        cm.halve();
        assert_eq!((cm.estimate(b"a"), cm.estimate(b"b")), (1, 0));
    }

    #[test]
    fn never_under_estimates() {
        let stream = zipf_stream(50_000, 0.99, 300_000, 3);
        let mut exact: HashMap<u32, u64> = HashMap::new();
        let mut plain = CountMin::new(512, 4, 9);
        let mut conservative = CountMin::new(512, 4, 9).conservative(true);
        for &k in &stream {
            let c = exact.entry(k).or_default();
            *c += 1;
            assert!(plain.add(&key(k)) >= *c);
            assert!(conservative.add(&key(k)) >= *c);
        }
        let mut plain_excess = 0;
        let mut conservative_excess = 0;
        for (&k, &c) in &exact {
            let (p, q) = (plain.estimate(&key(k)), conservative.estimate(&key(k)));
            assert!(p >= c && q >= c, "key {k}: true {c}, estimates {p} {q}");
            assert!(q <= p);
            plain_excess += p - c;
            conservative_excess += q - c;
        }
        // A sketch this narrow collides a lot; conservative update must help.
        assert!(plain_excess > 0);
        assert!(conservative_excess < plain_excess);
    }

    #[test]
    fn heavy_hitters_of_a_zipf_stream() {
        for (i, skew) in [0.99, 1.2].into_iter().enumerate() {
            let stream = zipf_stream(100_000, skew, 500_000, 10 + i as u64);
            let mut exact: HashMap<u32, u64> = HashMap::new();
            let mut hh = HeavyHitters::new(CountMin::new(2048, 4, 5).conservative(true), 40);
            for &k in &stream {
                *exact.entry(k).or_default() += 1;
                hh.add(&key(k));
            }
            let mut truth: Vec<(u32, u64)> = exact.into_iter().collect();
            truth.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            let top = hh.top(20);
            assert_eq!(top.len(), 20);
            assert!(top.windows(2).all(|w| w[0].1 >= w[1].1));
            for &(k, c) in &truth[..10] {
                let found = top.iter().find(|(r, _)| **r == key(k));
                let (_, est) = found.unwrap_or_else(|| panic!("skew {skew}: key {k} missing"));
                assert!(*est >= c);
            }
        }
    }

    #[test]
    fn heavy_hitters_replace_the_lightest_member() {
        let mut hh = HeavyHitters::new(CountMin::new(1 << 12, 4, 0), 2);
        for k in [&b"a"[..], b"a", b"a", b"b", b"c"] {
            hh.add(k);
        }
        // c's estimate (1) does not exceed b's (1): the set is unchanged.
        assert_eq!(hh.count(b"c"), None);
        hh.add(b"c");
        assert_eq!(hh.count(b"b"), None);
        assert_eq!(hh.count(b"c"), Some(2));
        assert_eq!(hh.top(5), [(b"a"[..].into(), 3), (b"c"[..].into(), 2)]);
        hh.clear();
        assert!(hh.is_empty());
        assert_eq!(hh.estimate(b"a"), 0);
    }
}
