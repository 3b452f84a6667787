//! A switch's cache in the fabric (IncBricks 4.2.1): a fixed number of items, the least
//! frequently used evicted first (the older of equals first), tombstones that keep a reply
//! older than an invalidation from filling after it, and a lease on every item that bounds
//! how long a write the fabric never saw can leave it stale.
//!
//! Frequencies are those of the keys' lookups at the switch, hits and misses alike, counted
//! in a count-min sketch that is halved every ten lookups per item the cache holds, so that
//! they follow the keys' recent popularity. When the cache is full, a fill takes the place of
//! the least frequently used item only if its key was looked up more often (TinyLFU's
//! admission): a key seen once cannot push out a hot one, and a key keeps its frequency
//! through a write's invalidation or its lease's end. IncBricks leaves its replacement policy
//! open and names biasing the cache toward heavy hitters as the way to cut its miss rate.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use super::epoch_before;
use crate::hot::CountMin;
use crate::Instant;

#[derive(Debug)]
struct Item {
    value: Vec<u8>,
    epoch: u32,
    uses: u64,
    /// When it was last used, in the cache's own count of operations.
    seq: u64,
    /// When its lease ends.
    until: Instant,
}

/// Counters for the operator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LfuStats {
    pub hits: u64,
    pub misses: u64,
    pub fills: u64,
    /// Fills older than an invalidation of their key.
    pub fills_stale: u64,
    pub evictions: u64,
    /// Fills refused as their key was looked up no more often than the item they would
    /// replace.
    pub fills_refused: u64,
    pub invalidations: u64,
    /// Items dropped as their lease ended.
    pub expired: u64,
}

impl std::ops::AddAssign for LfuStats {
    /// Several caches' counters summed (an IncBox's processors).
    fn add_assign(&mut self, o: LfuStats) {
        self.hits += o.hits;
        self.misses += o.misses;
        self.fills += o.fills;
        self.fills_stale += o.fills_stale;
        self.evictions += o.evictions;
        self.fills_refused += o.fills_refused;
        self.invalidations += o.invalidations;
        self.expired += o.expired;
    }
}

/// A fixed-size cache of values by key, least frequently used out first.
#[derive(Debug)]
pub struct Lfu {
    capacity: usize,
    items: HashMap<Vec<u8>, Item>,
    /// (uses, seq, key) of every item: the first is the next to go.
    order: BTreeSet<(u64, u64, Vec<u8>)>,
    seq: u64,
    /// The latest invalidation epoch of keys dropped recently, and until when it is kept.
    tombstones: HashMap<Vec<u8>, (u32, Instant)>,
    /// Tombstones in the order they expire.
    tomb_order: VecDeque<(Instant, Vec<u8>)>,
    tombstone_for: Duration,
    lease: Duration,
    /// How often each key was looked up lately.
    frequency: CountMin,
    /// Lookups counted since the sketch was last halved.
    counted: u64,
    /// With [`Lfu::track_gone`]: the keys of items that left the cache since the last
    /// [`Lfu::take_gone`], in the order they left.
    gone: Option<Vec<Vec<u8>>>,
    stats: LfuStats,
}

/// Most tombstones kept; past it the oldest go first.
const MAX_TOMBSTONES: usize = 1 << 16;

/// Lookups per item held between two halvings of the frequencies (TinyLFU's sample of ten
/// times the cache's size).
const AGE_EVERY: u64 = 10;

/// The frequency sketch of a cache of `capacity` items: four rows of four counters per item
/// (at least 64 a row, at most 2^20: 32 MiB in all), with conservative update.
fn sketch(capacity: usize) -> CountMin {
    let width = capacity.saturating_mul(4).clamp(64, 1 << 20);
    CountMin::new(width, 4, 0x1f_c0de).conservative(true)
}

impl Lfu {
    /// A cache of `capacity` items, each held at most `lease` after its fill.
    pub fn new(capacity: usize, tombstone_for: Duration, lease: Duration) -> Lfu {
        Lfu {
            capacity,
            items: HashMap::new(),
            order: BTreeSet::new(),
            seq: 0,
            tombstones: HashMap::new(),
            tomb_order: VecDeque::new(),
            tombstone_for,
            lease,
            frequency: sketch(capacity),
            counted: 0,
            gone: None,
            stats: LfuStats::default(),
        }
    }

    /// From now on, notes the key of every item that leaves the cache (evicted, expired,
    /// invalidated, removed, cleared) for [`Lfu::take_gone`]: for whoever marks what the
    /// cache holds elsewhere (an IncBox's switch stage).
    pub fn track_gone(&mut self) {
        self.gone.get_or_insert_with(Vec::new);
    }

    /// The keys of the items that left since the last call, oldest first.
    pub fn take_gone(&mut self) -> Vec<Vec<u8>> {
        self.gone.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn left(&mut self, key: Vec<u8>) {
        if let Some(gone) = &mut self.gone {
            gone.push(key);
        }
    }

    /// Every tombstone held, as (key, the invalidation's epoch, until when), soonest to end
    /// first: for a cache that takes this one's place (see [`Lfu::keep_tombstone`]).
    pub fn tombstones(&self) -> Vec<(Vec<u8>, u32, Instant)> {
        let mut all: Vec<(Vec<u8>, u32, Instant)> = self
            .tombstones
            .iter()
            .map(|(k, &(epoch, until))| (k.clone(), epoch, until))
            .collect();
        all.sort_by(|a, b| (a.2, &a.0).cmp(&(b.2, &b.0)));
        all
    }

    /// Takes over another cache's tombstone of `key`: fills from before `epoch` are refused
    /// until `until`. Given in the order [`Lfu::tombstones`] lists them. (All are kept, even
    /// past the bound on tombstones: dropping one could let a stale fill in; they end within
    /// the tombstone time.)
    pub fn keep_tombstone(&mut self, key: &[u8], epoch: u32, until: Instant) {
        self.tombstones.insert(key.to_vec(), (epoch, until));
        self.tomb_order.push_back((until, key.to_vec()));
    }

    /// Counts a lookup of `key` that did not reach the cache (a read the switch stage sent
    /// past it), so that its frequency still counts when its reply comes to fill it.
    pub fn note(&mut self, key: &[u8]) {
        self.count(key);
    }

    pub fn stats(&self) -> LfuStats {
        self.stats
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Changes the number of items held, evicting the least frequently used past it. The
    /// frequencies counted so far are forgotten.
    pub fn set_capacity(&mut self, capacity: usize) {
        if capacity != self.capacity {
            self.frequency = sketch(capacity);
            self.counted = 0;
        }
        self.capacity = capacity;
        while self.items.len() > capacity {
            let Some(first) = self.order.pop_first() else {
                break;
            };
            self.items.remove(&first.2);
            self.stats.evictions += 1;
            self.left(first.2);
        }
    }

    pub fn contains(&self, key: &[u8]) -> bool {
        self.items.contains_key(key)
    }

    /// The value of `key` and the epoch it was filled at, counted as one use; `None` past its
    /// lease.
    pub fn get(&mut self, key: &[u8], now: Instant) -> Option<(&[u8], u32)> {
        self.seq += 1;
        self.count(key);
        if self.items.get(key).is_some_and(|i| now >= i.until) {
            self.remove(key);
            self.stats.expired += 1;
        }
        let Some(item) = self.items.get_mut(key) else {
            self.stats.misses += 1;
            return None;
        };
        self.stats.hits += 1;
        self.order.remove(&(item.uses, item.seq, key.to_vec()));
        item.uses += 1;
        item.seq = self.seq;
        self.order.insert((item.uses, item.seq, key.to_vec()));
        Some((&item.value, item.epoch))
    }

    /// The value of `key` and its fill epoch, without counting a use or minding its lease
    /// (for a caller that has just had it from [`Lfu::get`]).
    pub fn peek(&self, key: &[u8]) -> Option<(&[u8], u32)> {
        self.items.get(key).map(|i| (i.value.as_slice(), i.epoch))
    }

    /// The epoch `key`'s copy was filled at and how long it has left of its lease, without
    /// counting a use; `None` when none is held (or its lease ran out).
    pub fn held(&self, key: &[u8], now: Instant) -> Option<(u32, Duration)> {
        let item = self.items.get(key)?;
        (now < item.until).then(|| (item.epoch, item.until - now))
    }

    /// Caches `value` for `key`, valid at `epoch`. Refused (false) when an invalidation of the
    /// key at a later epoch was seen, or a copy from a later epoch is held, or the cache is
    /// full and the key was looked up no more often than its least frequently used item.
    pub fn fill(&mut self, key: &[u8], value: &[u8], epoch: u32, now: Instant) -> bool {
        self.fill_for(key, value, epoch, self.lease, now)
    }

    /// [`Lfu::fill`] with a lease no longer than `lease`: a copy made from another cache's
    /// copy ends when that one would.
    pub fn fill_for(
        &mut self,
        key: &[u8],
        value: &[u8],
        epoch: u32,
        lease: Duration,
        now: Instant,
    ) -> bool {
        self.expire(now);
        if self
            .tombstones
            .get(key)
            .is_some_and(|&(dead, _)| epoch_before(epoch, dead))
            || self
                .items
                .get(key)
                .is_some_and(|i| epoch_before(epoch, i.epoch))
        {
            self.stats.fills_stale += 1;
            return false;
        }
        if self.capacity == 0 {
            return false;
        }
        self.seq += 1;
        let uses = match self.items.remove(key) {
            Some(old) => {
                self.order.remove(&(old.uses, old.seq, key.to_vec()));
                old.uses
            }
            None => {
                let wanted = self.frequency.estimate(key);
                if self.items.len() >= self.capacity {
                    let Some(first) = self.order.first() else {
                        return false;
                    };
                    if wanted <= self.frequency.estimate(&first.2) {
                        self.stats.fills_refused += 1;
                        return false;
                    }
                    let first = self.order.pop_first().expect("first exists");
                    self.items.remove(&first.2);
                    self.stats.evictions += 1;
                    self.left(first.2);
                }
                wanted.max(1)
            }
        };
        self.items.insert(
            key.to_vec(),
            Item {
                value: value.to_vec(),
                epoch,
                uses,
                seq: self.seq,
                until: now + lease.min(self.lease),
            },
        );
        self.order.insert((uses, self.seq, key.to_vec()));
        self.stats.fills += 1;
        true
    }

    /// Drops `key` for the write at `epoch`; fills from before it are refused for
    /// `tombstone_for`. True when a copy was held.
    pub fn invalidate(&mut self, key: &[u8], epoch: u32, now: Instant) -> bool {
        self.expire(now);
        self.stats.invalidations += 1;
        let held = self.remove(key);
        let until = now + self.tombstone_for;
        let dead = match self.tombstones.get(key) {
            Some(&(e, _)) if epoch_before(epoch, e) => e,
            _ => epoch,
        };
        while self.tombstones.len() >= MAX_TOMBSTONES && !self.tombstones.contains_key(key) {
            let Some((until, oldest)) = self.tomb_order.pop_front() else {
                break;
            };
            // Only the entry that is the tombstone's latest; older ones of a key invalidated
            // again since are stale.
            if self
                .tombstones
                .get(&oldest)
                .is_some_and(|&(_, u)| u == until)
            {
                self.tombstones.remove(&oldest);
            }
        }
        self.tombstones.insert(key.to_vec(), (dead, until));
        self.tomb_order.push_back((until, key.to_vec()));
        held
    }

    /// Drops `key` with no tombstone (for a home, whose directory refuses stale fills
    /// itself). True when a copy was held.
    pub fn remove(&mut self, key: &[u8]) -> bool {
        match self.items.remove(key) {
            Some(item) => {
                self.order.remove(&(item.uses, item.seq, key.to_vec()));
                self.left(key.to_vec());
                true
            }
            None => false,
        }
    }

    /// Drops every item (the switch's copies are no longer trusted).
    pub fn clear(&mut self) {
        if self.gone.is_some() {
            let keys: Vec<Vec<u8>> = self.items.keys().cloned().collect();
            for key in keys {
                self.left(key);
            }
        }
        self.items.clear();
        self.order.clear();
    }

    /// Counts a lookup of `key`, halving every frequency (and every item's count of uses, so
    /// that old favourites age too) once enough lookups have been counted.
    fn count(&mut self, key: &[u8]) {
        if self.capacity == 0 {
            return;
        }
        self.frequency.add(key);
        self.counted += 1;
        if self.counted < AGE_EVERY.saturating_mul(self.capacity as u64) {
            return;
        }
        self.counted = 0;
        self.frequency.halve();
        let order = std::mem::take(&mut self.order);
        self.order = order
            .into_iter()
            .map(|(uses, seq, key)| {
                let uses = uses / 2;
                if let Some(item) = self.items.get_mut(&key) {
                    item.uses = uses;
                }
                (uses, seq, key)
            })
            .collect();
    }

    fn expire(&mut self, now: Instant) {
        while let Some((until, _)) = self.tomb_order.front() {
            if *until > now {
                break;
            }
            let (_, key) = self.tomb_order.pop_front().expect("front exists");
            if self.tombstones.get(&key).is_some_and(|&(_, u)| u <= now) {
                self.tombstones.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_of_a_copy_ends_when_the_first_would() {
        let lease = Duration::from_secs(2);
        let mut c = Lfu::new(4, Duration::from_secs(2), lease);
        let t0 = Instant::ZERO;
        assert!(c.fill(b"k", b"v", 3, t0));
        assert_eq!(c.held(b"k", t0), Some((3, lease)));
        let t1 = t0 + Duration::from_millis(500);
        let (epoch, left) = c.held(b"k", t1).unwrap();
        assert_eq!((epoch, left), (3, Duration::from_millis(1500)));
        let mut other = Lfu::new(4, Duration::from_secs(2), lease);
        assert!(other.fill_for(b"k", b"v", epoch, left, t1));
        assert!(other.get(b"k", t0 + Duration::from_millis(1999)).is_some());
        assert!(
            other.get(b"k", t0 + lease).is_none(),
            "outlived the first copy"
        );
        // A longer lease than the cache's own is cut to it.
        assert!(other.fill_for(b"j", b"v", 1, Duration::from_secs(60), t1));
        assert_eq!(other.held(b"j", t1), Some((1, lease)));
        assert_eq!(c.held(b"k", t0 + lease), None);
    }

    const SEC: Duration = Duration::from_secs(1);

    /// Looks `key` up `times` times, as the switch does for every read it sees.
    fn look_up(c: &mut Lfu, key: &[u8], times: usize) {
        for _ in 0..times {
            c.get(key, Instant::ZERO);
        }
    }

    #[test]
    fn the_least_frequently_used_goes_first_and_only_for_a_key_looked_up_more_often() {
        let mut c = Lfu::new(2, SEC, 60 * SEC);
        let now = Instant::ZERO;
        for key in [b"a", b"b"] {
            assert!(c.get(key, now).is_none());
            assert!(c.fill(key, b"1", 1, now));
        }
        look_up(&mut c, b"a", 2);
        look_up(&mut c, b"b", 1);
        // c was looked up once, b twice: c stays out.
        look_up(&mut c, b"c", 1);
        assert!(!c.fill(b"c", b"3", 1, now));
        assert_eq!(c.stats().fills_refused, 1);
        assert!(c.contains(b"a") && c.contains(b"b") && !c.contains(b"c"));
        // Three lookups against b's two: c takes the place of the least used.
        look_up(&mut c, b"c", 2);
        assert!(c.fill(b"c", b"3", 1, now));
        assert!(c.contains(b"a") && c.contains(b"c") && !c.contains(b"b"));
        assert_eq!(c.stats().evictions, 1);
        // a and c were both looked up three times: of equals, the one used longer ago goes.
        look_up(&mut c, b"d", 4);
        assert!(c.fill(b"d", b"4", 1, now));
        assert!(c.contains(b"c") && c.contains(b"d") && !c.contains(b"a"));
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn a_key_keeps_its_frequency_through_an_invalidation() {
        let mut c = Lfu::new(2, SEC, 60 * SEC);
        let now = Instant::ZERO;
        look_up(&mut c, b"hot", 5);
        assert!(c.fill(b"hot", b"1", 1, now));
        look_up(&mut c, b"warm", 4);
        assert!(c.fill(b"warm", b"1", 1, now));
        assert!(c.invalidate(b"hot", 2, now));
        look_up(&mut c, b"new", 4);
        assert!(c.fill(b"new", b"1", 1, now));
        // A key looked up as often as the least used item stays out...
        look_up(&mut c, b"tepid", 4);
        assert!(!c.fill(b"tepid", b"1", 1, now));
        // ...but hot's copy was dropped and its lookups were not: it takes warm's place.
        assert!(c.fill(b"hot", b"2", 2, now));
        assert!(c.contains(b"hot") && c.contains(b"new") && !c.contains(b"warm"));
    }

    #[test]
    fn frequencies_age_so_that_a_new_favourite_gets_in() {
        let mut c = Lfu::new(1, SEC, 60 * SEC);
        let now = Instant::ZERO;
        look_up(&mut c, b"old", 100);
        assert!(c.fill(b"old", b"1", 1, now));
        look_up(&mut c, b"new", 1);
        assert!(!c.fill(b"new", b"2", 1, now));
        // 20 lookups of new against 100 of old, but old's are older: halved every ten
        // lookups, they count for less than new's.
        look_up(&mut c, b"new", 19);
        assert!(c.fill(b"new", b"2", 1, now));
        assert!(c.contains(b"new") && !c.contains(b"old"));
    }

    #[test]
    fn a_fill_older_than_an_invalidation_is_refused() {
        let mut c = Lfu::new(4, SEC, 60 * SEC);
        let now = Instant::ZERO;
        assert!(c.fill(b"k", b"old", 3, now));
        assert!(c.invalidate(b"k", 5, now));
        assert!(!c.fill(b"k", b"old", 4, now));
        assert_eq!(c.get(b"k", Instant::ZERO), None);
        assert!(c.fill(b"k", b"new", 6, now));
        assert_eq!(c.get(b"k", Instant::ZERO), Some((&b"new"[..], 6)));
        // Nor does an older copy replace a newer one.
        assert!(!c.fill(b"k", b"old", 4, now));
        assert_eq!(c.stats().fills_stale, 2);
    }

    #[test]
    fn an_item_past_its_lease_is_gone() {
        let mut c = Lfu::new(4, SEC, SEC);
        c.fill(b"k", b"v", 1, Instant::ZERO);
        assert!(c.get(b"k", Instant::from_millis(999)).is_some());
        assert!(c.get(b"k", Instant::from_millis(1000)).is_none());
        assert_eq!(c.stats().expired, 1);
        assert!(c.is_empty());
    }

    #[test]
    fn tombstones_expire() {
        let mut c = Lfu::new(4, SEC, 60 * SEC);
        c.invalidate(b"k", 5, Instant::ZERO);
        assert!(!c.fill(b"k", b"v", 4, Instant::from_millis(999)));
        assert!(c.fill(b"k", b"v", 4, Instant::from_millis(1000)));
    }

    #[test]
    fn shrinking_evicts_the_least_used() {
        let mut c = Lfu::new(3, SEC, 60 * SEC);
        for k in [b"a", b"b", b"c"] {
            c.fill(k, b"v", 1, Instant::ZERO);
        }
        c.get(b"b", Instant::ZERO);
        c.get(b"c", Instant::ZERO);
        c.get(b"c", Instant::ZERO);
        c.set_capacity(1);
        assert_eq!(c.len(), 1);
        assert!(c.contains(b"c"));
        c.set_capacity(0);
        assert!(c.is_empty());
        assert!(!c.fill(b"a", b"v", 1, Instant::ZERO));
    }

    #[test]
    fn a_zero_size_cache_holds_nothing() {
        let mut c = Lfu::new(0, SEC, 60 * SEC);
        assert!(!c.fill(b"k", b"v", 1, Instant::ZERO));
        assert!(c.is_empty());
    }
}
