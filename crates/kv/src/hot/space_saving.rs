//! The space-saving frequency counter (Metwally et al.), in the bucket form SwitchKV's backends
//! use to find their hottest keys (its Algorithm 1).
//!
//! Keys with the same count share a bucket; buckets are kept in increasing count order and the
//! keys of a bucket from least to most recently visited. Both lists are doubly linked through
//! indices into vectors, so a visit touches a constant number of nodes and never scans. A
//! bucket's first key has no less recent neighbour and its `prev` is left stale: replacing
//! the least visited key, every request once the counter is full, then writes no other key's
//! slot to say so (one cache line fewer a request).

use super::{FingerprintMap, Fingerprints};

/// End of a list.
const NIL: u32 = u32::MAX;

/// Key bytes kept in the slot itself when short enough: a visit that replaces a key writes
/// the slot's own cache line rather than a separate allocation.
const INLINE: usize = 30;

/// A tracked key's bytes.
#[derive(Debug)]
enum KeyBytes {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<[u8]>),
}

impl KeyBytes {
    fn new(key: &[u8]) -> KeyBytes {
        if key.len() <= INLINE {
            let mut bytes = [0; INLINE];
            bytes[..key.len()].copy_from_slice(key);
            KeyBytes::Inline {
                len: key.len() as u8,
                bytes,
            }
        } else {
            KeyBytes::Heap(key.into())
        }
    }

    fn get(&self) -> &[u8] {
        match self {
            KeyBytes::Inline { len, bytes } => &bytes[..usize::from(*len)],
            KeyBytes::Heap(key) => key,
        }
    }

    fn set(&mut self, key: &[u8]) {
        match self {
            // The buffer is reused when the new key has the old one's length.
            KeyBytes::Heap(old) if old.len() == key.len() => old.copy_from_slice(key),
            _ => *self = KeyBytes::new(key),
        }
    }
}

/// One tracked key, in one cache line: a visit reads or writes a few slots, each once.
#[derive(Debug)]
#[repr(align(64))]
struct Slot {
    /// The key's fingerprint, its name in `index`.
    fp: u64,
    /// The bucket holding this key, which gives its count.
    bucket: u32,
    /// Less recently visited neighbour in the bucket; stale when this is the bucket's first
    /// key (the bucket's `first` says so).
    prev: u32,
    /// More recently visited neighbour in the bucket.
    next: u32,
    key: KeyBytes,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 64);

/// All keys visited `count` times, least recent first.
#[derive(Debug)]
struct Bucket {
    count: u64,
    first: u32,
    last: u32,
    /// Bucket with the next lower count.
    prev: u32,
    /// Bucket with the next higher count.
    next: u32,
}

/// Approximate counts of the most frequent keys of a stream, in memory for `capacity` keys.
///
/// Guarantees, for a stream of `n` visits since the last [`clear`](SpaceSaving::clear): a
/// tracked key's [`count`](SpaceSaving::count) is at least its true count and exceeds it by at
/// most [`min_count`](SpaceSaving::min_count) (itself at most `n / capacity`); an untracked
/// key was visited at most `min_count` times, so every key visited more than `n / capacity`
/// times is tracked. [`see`](SpaceSaving::see) is O(1); [`top`](SpaceSaving::top) is O(k).
#[derive(Debug)]
pub struct SpaceSaving {
    capacity: usize,
    /// Slots by their key's fingerprint (see [`Fingerprints`]).
    index: FingerprintMap,
    fingerprints: Fingerprints,
    slots: Vec<Slot>,
    buckets: Vec<Bucket>,
    /// Indices of unused entries in `buckets`.
    free: Vec<u32>,
    /// The bucket with the lowest count, or `NIL` when empty.
    lowest: u32,
    /// The bucket with the highest count, or `NIL` when empty.
    highest: u32,
    /// Once the counter is full, the key the next untracked key replaces (the lowest bucket's
    /// first), its fingerprint and its successor in the bucket, noted at the end of every
    /// visit: the next replacement then looks the old key up in `index` at once, alongside
    /// the new one, and moves the slot without waiting to read it, instead of after reading
    /// the bucket and then the slot, two memory reads in a row.
    victim: u32,
    victim_fp: u64,
    victim_next: u32,
}

impl SpaceSaving {
    /// A counter that tracks at most `capacity` keys. Allocates for all of them up front.
    ///
    /// # Panics
    /// If `capacity` is 0 or not below `u32::MAX`.
    pub fn new(capacity: usize) -> SpaceSaving {
        SpaceSaving::with_fingerprints(capacity, Fingerprints::default())
    }

    /// As [`SpaceSaving::new`], fingerprinting keys with `fingerprints`: a caller that holds
    /// the same [`Fingerprints`] can fingerprint a key once for this counter and others (see
    /// [`SpaceSaving::see_fingerprint`]).
    pub(crate) fn with_fingerprints(capacity: usize, fingerprints: Fingerprints) -> SpaceSaving {
        assert!(
            capacity > 0 && capacity < NIL as usize,
            "space-saving capacity must be in 1..u32::MAX, got {capacity}"
        );
        SpaceSaving {
            capacity,
            index: FingerprintMap::with_capacity(capacity),
            fingerprints,
            slots: Vec::with_capacity(capacity),
            buckets: Vec::with_capacity(capacity),
            free: Vec::new(),
            lowest: NIL,
            highest: NIL,
            victim: NIL,
            victim_fp: 0,
            victim_next: NIL,
        }
    }

    /// Counts one visit of `key`. An untracked key, when the counter is full, takes the place
    /// of the least recently visited of the least visited keys and inherits its count before
    /// the increment.
    pub fn see(&mut self, key: &[u8]) {
        self.see_fingerprint(key, self.fingerprints.of(key));
    }

    /// As [`SpaceSaving::see`], for a key whose fingerprint under this counter's
    /// [`Fingerprints`] (those it was made with) the caller has already taken. Another
    /// fingerprint would file the key under a wrong name.
    pub(crate) fn see_fingerprint(&mut self, key: &[u8], fp: u64) {
        debug_assert_eq!(fp, self.fingerprints.of(key));
        if let Some(slot) = self.index.get(fp) {
            self.bump(slot);
        } else if self.slots.len() < self.capacity {
            self.insert(key, fp);
        } else {
            self.replace(key, fp);
        }
        if self.slots.len() == self.capacity {
            let victim = self.buckets[self.lowest as usize].first;
            let v = &self.slots[victim as usize];
            (self.victim, self.victim_fp, self.victim_next) = (victim, v.fp, v.next);
        }
    }

    /// Tracks `key`, untracked, in a new slot (the counter is not full).
    fn insert(&mut self, key: &[u8], fp: u64) {
        let slot = self.slots.len() as u32;
        self.slots.push(Slot {
            key: KeyBytes::new(key),
            fp,
            bucket: NIL,
            prev: NIL,
            next: NIL,
        });
        self.index.insert(fp, slot);
        // Counts start at 1, so a bucket for 1 can only be the lowest one.
        let bucket = if self.lowest != NIL && self.buckets[self.lowest as usize].count == 1 {
            self.lowest
        } else {
            self.new_bucket(1, NIL, self.lowest)
        };
        self.append(bucket, slot);
    }

    /// Tracks `key`, untracked, in place of the victim (the counter is full).
    fn replace(&mut self, key: &[u8], fp: u64) {
        let slot = self.victim;
        debug_assert_eq!(slot, self.buckets[self.lowest as usize].first);
        debug_assert_eq!(self.victim_fp, self.slots[slot as usize].fp);
        debug_assert_eq!(self.victim_next, self.slots[slot as usize].next);
        self.index.remove(self.victim_fp);
        let s = &mut self.slots[slot as usize];
        s.key.set(key);
        s.fp = fp;
        self.index.insert(fp, slot);
        // The victim is its bucket's first: no `prev`.
        self.bump_linked(slot, self.lowest, NIL, self.victim_next);
    }

    /// Reads the counter's own fields, which [`SpaceSaving::touch`] starts from.
    pub(crate) fn touch_header(&self) -> u64 {
        self.victim_fp ^ u64::from(self.victim) ^ u64::from(self.lowest)
    }

    /// Reads what a visit of the key with fingerprint `fp` will read first: its entry in the
    /// index and, once the counter is full, the next replacement's slot, its successor's, its
    /// index entry and the lowest bucket (see [`super::touch`]). Changes nothing.
    pub(crate) fn touch(&self, fp: u64) -> u64 {
        let mut v = self.index.touch(fp);
        if self.victim != NIL && self.slots.len() == self.capacity {
            v ^= self.index.touch(self.victim_fp);
            v ^= self.slots[self.victim as usize].fp;
            v ^= self.buckets[self.lowest as usize].count;
            if self.victim_next != NIL {
                v ^= self.slots[self.victim_next as usize].fp;
            }
        }
        v
    }

    /// The estimated count of `key`, or `None` if it is not tracked.
    pub fn count(&self, key: &[u8]) -> Option<u64> {
        let slot = self.index.get(self.fingerprints.of(key))?;
        Some(self.buckets[self.slots[slot as usize].bucket as usize].count)
    }

    /// Up to `k` tracked keys with their counts, highest count first; among equal counts the
    /// most recently visited first.
    pub fn top(&self, k: usize) -> Vec<(Box<[u8]>, u64)> {
        let mut out = Vec::with_capacity(k.min(self.slots.len()));
        let mut bucket = self.highest;
        while bucket != NIL && out.len() < k {
            let b = &self.buckets[bucket as usize];
            let mut slot = b.last;
            while slot != NIL && out.len() < k {
                let s = &self.slots[slot as usize];
                out.push((s.key.get().into(), b.count));
                slot = if slot == b.first { NIL } else { s.prev };
            }
            bucket = b.prev;
        }
        out
    }

    /// The most an estimate can exceed the true count: the lowest tracked count once the
    /// counter is full (keys have been replaced), 0 before (every count is exact).
    pub fn min_count(&self) -> u64 {
        if self.slots.len() < self.capacity {
            0
        } else {
            self.buckets[self.lowest as usize].count
        }
    }

    /// Number of tracked keys.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The most keys tracked at once.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Forgets every key, keeping the allocations.
    pub fn clear(&mut self) {
        self.index.clear();
        self.slots.clear();
        self.buckets.clear();
        self.free.clear();
        self.lowest = NIL;
        self.highest = NIL;
    }

    /// Lines 10-16 of Algorithm 1: moves a tracked key from its bucket (count f) to the
    /// bucket for f + 1, as that bucket's most recent key.
    fn bump(&mut self, slot: u32) {
        let s = &self.slots[slot as usize];
        self.bump_linked(slot, s.bucket, s.prev, s.next);
    }

    /// [`SpaceSaving::bump`] for a slot whose bucket and neighbours there (`prev`, `after`)
    /// the caller knows; `prev` is not read when `slot` is the bucket's first.
    fn bump_linked(&mut self, slot: u32, bucket: u32, prev: u32, after: u32) {
        let b = &self.buckets[bucket as usize];
        let (count, next) = (b.count, b.next);
        if next != NIL && self.buckets[next as usize].count == count + 1 {
            self.unlink(slot, bucket, prev, after);
            self.append(next, slot);
            if self.buckets[bucket as usize].first == NIL {
                self.drop_bucket(bucket);
            }
        } else if b.first == slot && b.last == slot {
            // Alone in its bucket, and the next bucket (if any) counts more than f + 1.
            self.buckets[bucket as usize].count = count + 1;
        } else {
            let new = self.new_bucket(count + 1, bucket, next);
            self.unlink(slot, bucket, prev, after);
            self.append(new, slot);
        }
    }

    /// Creates a bucket for `count` between buckets `prev` and `next` (either may be `NIL`).
    fn new_bucket(&mut self, count: u64, prev: u32, next: u32) -> u32 {
        let bucket = Bucket {
            count,
            first: NIL,
            last: NIL,
            prev,
            next,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.buckets[id as usize] = bucket;
                id
            }
            None => {
                self.buckets.push(bucket);
                (self.buckets.len() - 1) as u32
            }
        };
        match prev {
            NIL => self.lowest = id,
            p => self.buckets[p as usize].next = id,
        }
        match next {
            NIL => self.highest = id,
            n => self.buckets[n as usize].prev = id,
        }
        id
    }

    /// Unlinks an empty bucket and keeps its entry for reuse.
    fn drop_bucket(&mut self, id: u32) {
        let Bucket { prev, next, .. } = self.buckets[id as usize];
        match prev {
            NIL => self.lowest = next,
            p => self.buckets[p as usize].next = next,
        }
        match next {
            NIL => self.highest = prev,
            n => self.buckets[n as usize].prev = prev,
        }
        self.free.push(id);
    }

    /// Makes `slot` the most recent key of `bucket`.
    fn append(&mut self, bucket: u32, slot: u32) {
        let last = self.buckets[bucket as usize].last;
        let s = &mut self.slots[slot as usize];
        s.bucket = bucket;
        s.prev = last;
        s.next = NIL;
        match last {
            NIL => self.buckets[bucket as usize].first = slot,
            l => self.slots[l as usize].next = slot,
        }
        self.buckets[bucket as usize].last = slot;
    }

    /// Takes `slot`, whose bucket and neighbours there are `bucket`, `prev` and `next`, out
    /// of that bucket's list (the bucket may be left empty). A first key's successor becomes
    /// first with its `prev` left stale, unwritten.
    fn unlink(&mut self, slot: u32, bucket: u32, prev: u32, next: u32) {
        let b = &mut self.buckets[bucket as usize];
        if b.first == slot {
            b.first = next;
            if next == NIL {
                b.last = NIL;
            }
            return;
        }
        // Not first: `prev` is a key of the bucket.
        self.slots[prev as usize].next = next;
        match next {
            NIL => b.last = prev,
            n => self.slots[n as usize].prev = prev,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::hot::test_zipf::{key, zipf_stream};

    fn keys(top: &[(Box<[u8]>, u64)]) -> Vec<(&[u8], u64)> {
        top.iter().map(|(k, c)| (&**k, *c)).collect()
    }

    #[test]
    fn counts_exactly_until_full() {
        let mut ss = SpaceSaving::new(4);
        for k in [&b"a"[..], b"b", b"a", b"c", b"a", b"b"] {
            ss.see(k);
        }
        assert_eq!(ss.count(b"a"), Some(3));
        assert_eq!(ss.count(b"b"), Some(2));
        assert_eq!(ss.count(b"c"), Some(1));
        assert_eq!(ss.count(b"d"), None);
        assert_eq!(ss.len(), 3);
        assert_eq!(ss.min_count(), 0);
        assert_eq!(
            keys(&ss.top(10)),
            [(&b"a"[..], 3), (&b"b"[..], 2), (&b"c"[..], 1)]
        );
    }

    #[test]
    fn eviction_takes_least_visited_least_recent() {
        let mut ss = SpaceSaving::new(3);
        for k in [&b"a"[..], b"b", b"b", b"c"] {
            ss.see(k);
        }
        // a and c were seen once, a longer ago: d replaces a and counts 1 + 1.
        ss.see(b"d");
        assert_eq!(ss.count(b"a"), None);
        assert_eq!(ss.count(b"d"), Some(2));
        assert_eq!(ss.min_count(), 1);
        // Equal counts: most recent first.
        assert_eq!(
            keys(&ss.top(3)),
            [(&b"d"[..], 2), (&b"b"[..], 2), (&b"c"[..], 1)]
        );
        // c is now the only key seen once.
        ss.see(b"e");
        assert_eq!(ss.count(b"c"), None);
        assert_eq!(ss.count(b"e"), Some(2));
        // All at 2: b was visited least recently.
        ss.see(b"f");
        assert_eq!(ss.count(b"b"), None);
        assert_eq!(ss.count(b"f"), Some(3));
        assert_eq!(
            keys(&ss.top(3)),
            [(&b"f"[..], 3), (&b"e"[..], 2), (&b"d"[..], 2)]
        );
        assert_eq!(keys(&ss.top(1)), [(&b"f"[..], 3)]);
    }

    #[test]
    fn keys_of_every_length_survive_eviction_inline_or_not() {
        // 30 bytes fit in a slot, 31 do not; each replaces a key of the other kind.
        let key = |n: usize, c: u8| vec![c; n];
        let mut ss = SpaceSaving::new(2);
        for (n, c) in [
            (30, b'a'),
            (31, b'b'),
            (31, b'c'),
            (30, b'd'),
            (64, b'e'),
            (1, b'f'),
        ] {
            ss.see(&key(n, c));
            ss.see(&key(n, c));
        }
        // The last two seen are held, with the counts they took over (2 + 2 each time).
        let top = ss.top(2);
        assert_eq!(top.len(), 2);
        assert_eq!(top[0].0.as_ref(), &key(1, b'f')[..]);
        assert_eq!(top[1].0.as_ref(), &key(64, b'e')[..]);
        assert_eq!(ss.count(&key(1, b'f')), Some(top[0].1));
        assert_eq!(ss.count(&key(30, b'a')), None);
        assert_eq!(ss.count(&key(31, b'c')), None);
        // A long key and a short one sharing a prefix are apart.
        ss.see(&key(30, b'e'));
        assert_eq!(ss.count(&key(64, b'e')), None);
        assert!(ss.count(&key(30, b'e')).is_some());
    }

    #[test]
    fn recency_orders_a_bucket() {
        let mut ss = SpaceSaving::new(8);
        for k in [&b"a"[..], b"b", b"c", b"c", b"a", b"b"] {
            ss.see(k);
        }
        assert_eq!(
            keys(&ss.top(3)),
            [(&b"b"[..], 2), (&b"a"[..], 2), (&b"c"[..], 2)]
        );
    }

    #[test]
    fn clear_forgets_everything() {
        let mut ss = SpaceSaving::new(2);
        for k in [&b"a"[..], b"b", b"c", b"c"] {
            ss.see(k);
        }
        ss.clear();
        assert!(ss.is_empty());
        assert_eq!(ss.top(5), []);
        assert_eq!(ss.count(b"c"), None);
        ss.see(b"x");
        assert_eq!(keys(&ss.top(5)), [(&b"x"[..], 1)]);
    }

    #[test]
    fn agrees_with_a_model_of_counts_and_last_visits() {
        use rand::rngs::SmallRng;
        use rand::{Rng, SeedableRng};
        // The model: per tracked key its count and the step of its last visit. A full counter
        // replaces the key with the lowest (count, last visit); `top` orders by the highest.
        let mut rng = SmallRng::seed_from_u64(11);
        for capacity in [1, 2, 3, 8, 33] {
            let mut ss = SpaceSaving::new(capacity);
            let mut model: HashMap<u32, (u64, u32)> = HashMap::new();
            for step in 0..20_000u32 {
                // Skewed: a few keys come back often, so hits, ties and replacements mix.
                let spread = rng.gen_range(1..4 * capacity as u32 + 2);
                let k = rng.gen_range(0..spread);
                // Touching ahead reads, changes nothing, and must not fail at any state
                // (empty, filling, full, capacity 1, after a clear).
                ss.touch_header();
                ss.touch(ss.fingerprints.of(&key(k)));
                ss.see(&key(k));
                if let Some(entry) = model.get_mut(&k) {
                    *entry = (entry.0 + 1, step);
                } else if model.len() < capacity {
                    model.insert(k, (1, step));
                } else {
                    let (&victim, &(count, _)) =
                        model.iter().min_by_key(|(_, &(c, at))| (c, at)).unwrap();
                    model.remove(&victim);
                    model.insert(k, (count + 1, step));
                }
                if step % 97 == 0 || capacity <= 3 {
                    let mut want: Vec<(u32, u64, u32)> =
                        model.iter().map(|(&k, &(c, at))| (k, c, at)).collect();
                    want.sort_by_key(|&(_, c, at)| std::cmp::Reverse((c, at)));
                    let want: Vec<(Box<[u8]>, u64)> = want
                        .iter()
                        .map(|&(k, c, _)| (key(k).to_vec().into_boxed_slice(), c))
                        .collect();
                    for n in [1, capacity / 2, capacity, capacity + 1] {
                        assert_eq!(ss.top(n), want[..n.min(want.len())], "step {step}");
                    }
                    let low = model.values().map(|&(c, _)| c).min().unwrap_or(0);
                    let full = model.len() == capacity;
                    assert_eq!(ss.min_count(), if full { low } else { 0 });
                }
                assert_eq!(ss.count(&key(k)), model.get(&k).map(|&(c, _)| c));
                if step == 10_000 {
                    ss.clear();
                    model.clear();
                }
            }
        }
    }

    #[test]
    fn a_million_visits_on_a_thousand_slots() {
        use rand::rngs::SmallRng;
        use rand::{Rng, SeedableRng};
        let mut rng = SmallRng::seed_from_u64(7);
        let mut ss = SpaceSaving::new(1000);
        for _ in 0..1_000_000 {
            ss.see(&key(rng.gen_range(0..1_000_000)));
        }
        assert_eq!(ss.len(), 1000);
        let total: u64 = ss.top(1000).iter().map(|(_, c)| c).sum();
        // Every visit adds exactly one to the sum of counts.
        assert_eq!(total, 1_000_000);
    }

    #[test]
    fn finds_the_heaviest_keys_of_zipf_streams() {
        const KEYS: u32 = 100_000;
        const VISITS: usize = 1_000_000;
        const CAPACITY: usize = 2_000;
        for (i, skew) in [0.9, 0.99, 1.2].into_iter().enumerate() {
            let stream = zipf_stream(KEYS, skew, VISITS, i as u64);
            let mut exact: HashMap<u32, u64> = HashMap::new();
            let mut ss = SpaceSaving::new(CAPACITY);
            for &k in &stream {
                *exact.entry(k).or_default() += 1;
                ss.see(&key(k));
            }
            let mut truth: Vec<(u32, u64)> = exact.iter().map(|(&k, &c)| (k, c)).collect();
            truth.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));

            for k in [20, 100] {
                let reported = ss.top(k);
                assert_eq!(reported.len(), k);
                for &(true_key, _) in &truth[..k / 2] {
                    assert!(
                        reported.iter().any(|(r, _)| **r == key(true_key)),
                        "skew {skew}: top {k} misses true top-{} key {true_key}",
                        k / 2
                    );
                }
            }

            let slack = ss.min_count();
            assert!(slack > 0 && slack <= (VISITS / CAPACITY) as u64);
            for (&k, &c) in &exact {
                match ss.count(&key(k)) {
                    Some(est) => assert!(
                        c <= est && est <= c + slack,
                        "skew {skew}: key {k} true {c} estimate {est} slack {slack}"
                    ),
                    None => assert!(c <= slack, "skew {skew}: untracked key {k} seen {c}"),
                }
            }
        }
    }
}
