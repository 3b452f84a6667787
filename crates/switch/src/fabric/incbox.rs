//! A fabric switch's cache as IncBricks' IncBox splits it (sections 3.2 and 4.5): a switch
//! stage in front of one or more cache processors.
//!
//! - **Processors.** The cache is cut into `processors` caches of their own (each an
//!   [`Lfu`] of its share of the items). A key's hash picks its processor ([`processor`]), so
//!   one key always meets one processor, and its reads and writes stay in order.
//! - **The hit check** (`hit_check`). The switch stage keeps a forwarding table on
//!   kvswitch's pipeline, matched exactly on a destination MAC. A processor that holds a key
//!   has an entry there under the key's *hash MAC* (a locally administered prefix and the
//!   32-bit key hash), whose action sends the read to that processor. A read whose hash MAC
//!   has no entry passes every processor by and goes on to the server, as a miss. An entry
//!   goes in once a fill has been taken by its processor, and comes out as the last item of
//!   its hash leaves it, in the same step, before anything else is looked up. Two keys of
//!   one hash share an entry, counted, so it stays until both are gone; a read of the other
//!   key is steered to the processor and misses there (`processor_misses`).
//! - **Without the hit check** every read goes to its processor, which answers or misses:
//!   one program per switch, as before, when there is one processor.
//!
//! A read the stage passes by is not counted by the processor's frequency sketch; its fill
//! is, when the reply reaches the processor (the processor sees the replies it may cache), so
//! a miss is counted once (a read that reached the processor and missed there, twice).
//! The table holds `fdb_entries` marks, at least the items the cache may hold (the switch
//! refuses less), and a mark stands for at least one item held: it never runs out.

use std::collections::HashMap;
use std::time::Duration;

use kv::fabric::{Lfu, LfuStats};
use kv::Instant;
use pipeline::{Action, Entry, EntryId, Field, MatchKind, Meta, Pipeline, TableId, TableSpec};

/// Most processors one switch may have.
pub const MAX_PROCESSORS: usize = 16;
/// The forwarding table's size by default: IncBricks' switch's FDB.
pub const FDB_ENTRIES: usize = 16_384;
/// Most marks a table may be given.
pub const MAX_FDB_ENTRIES: usize = 1 << 20;

/// The first two bytes of a hash MAC: locally administered, unicast, and a byte that no
/// kvswitch MAC uses.
const HASH_MAC_PREFIX: [u8; 2] = [0x06, 0x1c];

/// The MAC the switch stage looks a key up under.
pub fn hash_mac(key_hash: u32) -> [u8; 6] {
    let h = key_hash.to_be_bytes();
    [
        HASH_MAC_PREFIX[0],
        HASH_MAC_PREFIX[1],
        h[0],
        h[1],
        h[2],
        h[3],
    ]
}

/// How a switch's cache is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IncBoxSpec {
    /// Cache processors (1 to [`MAX_PROCESSORS`]).
    pub processors: usize,
    /// Whether the switch stage checks its table before a read reaches a processor.
    pub hit_check: bool,
    /// The table's size in marks (with the hit check).
    pub fdb_entries: usize,
}

impl Default for IncBoxSpec {
    fn default() -> Self {
        IncBoxSpec {
            processors: 1,
            hit_check: false,
            fdb_entries: FDB_ENTRIES,
        }
    }
}

impl IncBoxSpec {
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_PROCESSORS).contains(&self.processors) {
            return Err(format!(
                "{} processors: from 1 to {MAX_PROCESSORS}",
                self.processors
            ));
        }
        if !(1..=MAX_FDB_ENTRIES).contains(&self.fdb_entries) {
            return Err(format!(
                "{} forwarding table entries: from 1 to {MAX_FDB_ENTRIES}",
                self.fdb_entries
            ));
        }
        Ok(())
    }
}

/// What the switch stage and the processors counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IncBoxStats {
    pub processors: usize,
    pub hit_check: bool,
    /// Marks in the table now, and its size (in force with the hit check).
    pub marks: usize,
    pub fdb_entries: usize,
    /// Reads sent to a processor (every read, without the hit check).
    pub steered: u64,
    /// Reads the hit check sent past every processor.
    pub bypassed: u64,
    /// Steered reads the processor could not answer: every miss without the hit check; with
    /// it, a key sharing a hash with a held one, or a lease run out.
    pub processor_misses: u64,
    /// Fills not taken as the table had no room for their mark (none while the table holds
    /// at least the cache's items, as the switch sees to).
    pub fills_unmarked: u64,
    /// Per processor: reads it was given, and items it holds.
    pub reads: Vec<u64>,
    pub items: Vec<usize>,
}

/// A switch's cache: the switch stage and its processors.
#[derive(Debug)]
pub struct IncBox {
    spec: IncBoxSpec,
    processors: Vec<Lfu>,
    stage: Option<Stage>,
    tombstone_for: Duration,
    lease: Duration,
    capacity: usize,
    /// The processors' counters of the layouts before this one.
    earlier: LfuStats,
    stats: IncBoxStats,
}

/// The switch stage's forwarding table of hash MACs.
struct Stage {
    pipeline: Pipeline,
    table: TableId,
    /// Per key hash held: its entry and how many items hold it.
    marks: HashMap<u32, (EntryId, u32)>,
    /// The frame the stage looks a read up with: its destination, the hash MAC.
    probe: [u8; 14],
}

impl std::fmt::Debug for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stage")
            .field("marks", &self.marks.len())
            .finish_non_exhaustive()
    }
}

/// A miss's drop reason in the stage's table (no frame is dropped: a miss goes on).
const NOT_HELD: u16 = pipeline::reason::USER_BASE;

impl Stage {
    fn new(entries: usize) -> Stage {
        let mut pipeline = Pipeline::new();
        let table = pipeline
            .add_table(TableSpec {
                name: "incbox_fdb".into(),
                kind: MatchKind::Exact,
                key: vec![Field::Bytes { offset: 0, len: 6 }],
                miss: vec![Action::Drop(NOT_HELD)],
            })
            .expect("a valid table");
        pipeline
            .set_limit(table, Some(entries))
            .expect("the table exists");
        Stage {
            pipeline,
            table,
            marks: HashMap::new(),
            probe: [0; 14],
        }
    }

    /// The processor the table sends `key_hash`'s reads to, if any.
    fn lookup(&mut self, key_hash: u32) -> Option<usize> {
        self.probe[..6].copy_from_slice(&hash_mac(key_hash));
        match self.pipeline.process(&mut self.probe, &mut Meta::new(0)) {
            pipeline::Verdict::Output(p) => Some(usize::from(p)),
            _ => None,
        }
    }

    fn mark(&mut self, key_hash: u32, processor: usize) -> bool {
        if let Some((_, count)) = self.marks.get_mut(&key_hash) {
            *count += 1;
            return true;
        }
        let entry = Entry::exact(hash_mac(key_hash), vec![Action::Output(processor as u16)]);
        match self.pipeline.insert(self.table, entry) {
            Ok(id) => {
                self.marks.insert(key_hash, (id, 1));
                true
            }
            Err(_) => false,
        }
    }

    fn unmark(&mut self, key_hash: u32) {
        let Some((id, count)) = self.marks.get_mut(&key_hash) else {
            return;
        };
        *count -= 1;
        if *count == 0 {
            let id = *id;
            self.marks.remove(&key_hash);
            let _ = self.pipeline.remove(self.table, id);
        }
    }
}

/// The key hash of an item's name (the server's address and port, then the key).
fn name_hash(name: &[u8]) -> u32 {
    wire::inc::key_hash(name.get(6..).unwrap_or_default())
}

/// The processor of `key_hash` among `processors`: the high bits of the hash times the
/// golden ratio (Fibonacci hashing), in which every bit of the hash counts. Not the hash
/// modulo their number: the registration table picks a key's root by its low bits (`hash %
/// 64` buckets, spread over the roots in turn), so a root's keys would meet only some of its
/// processors; and not the hash's own high bits, which FNV-1a leaves alike for keys that
/// differ in their last byte.
pub fn processor(key_hash: u32, processors: usize) -> usize {
    let mixed = key_hash.wrapping_mul(0x9e37_79b9);
    ((u64::from(mixed) * processors as u64) >> 32) as usize
}

/// `total` items shared out: the first processors take one more when it does not divide.
fn share(total: usize, processors: usize, p: usize) -> usize {
    total / processors + usize::from(p < total % processors)
}

impl IncBox {
    /// A cache of `capacity` items laid out as `spec` says (a spec that fails
    /// [`IncBoxSpec::validate`] is taken with its numbers brought within bounds; the switch
    /// checks them first).
    pub fn new(
        spec: IncBoxSpec,
        capacity: usize,
        tombstone_for: Duration,
        lease: Duration,
    ) -> IncBox {
        let spec = IncBoxSpec {
            processors: spec.processors.clamp(1, MAX_PROCESSORS),
            fdb_entries: spec.fdb_entries.clamp(1, MAX_FDB_ENTRIES),
            ..spec
        };
        let processors = (0..spec.processors)
            .map(|p| {
                let mut c = Lfu::new(share(capacity, spec.processors, p), tombstone_for, lease);
                if spec.hit_check {
                    c.track_gone();
                }
                c
            })
            .collect();
        IncBox {
            spec,
            processors,
            stage: spec.hit_check.then(|| Stage::new(spec.fdb_entries)),
            tombstone_for,
            lease,
            capacity,
            earlier: LfuStats::default(),
            stats: IncBoxStats {
                reads: vec![0; spec.processors],
                ..IncBoxStats::default()
            },
        }
    }

    pub fn spec(&self) -> IncBoxSpec {
        self.spec
    }

    /// Lays the cache out as `spec` says. Nothing changes when it is the layout in place; a
    /// new table size alone resizes the table. Otherwise the copies held are dropped (a
    /// switch may always forget a copy), while the invalidations' tombstones move to the new
    /// processors, so that no reply older than an invalidation taken fills after the change,
    /// and the counters carry on.
    pub fn reshape(&mut self, spec: IncBoxSpec) {
        if spec == self.spec {
            return;
        }
        let same_but_table = IncBoxSpec {
            fdb_entries: self.spec.fdb_entries,
            ..spec
        } == self.spec;
        if same_but_table {
            self.spec.fdb_entries = spec.fdb_entries;
            if let Some(stage) = &mut self.stage {
                let _ = stage
                    .pipeline
                    .set_limit(stage.table, Some(spec.fdb_entries));
            }
            return;
        }
        let mut next = IncBox::new(spec, self.capacity, self.tombstone_for, self.lease);
        next.earlier = self.cache_stats();
        // The totals carry on; the per-processor reads start again with the new processors.
        next.stats = IncBoxStats {
            reads: vec![0; next.processors.len()],
            ..std::mem::take(&mut self.stats)
        };
        let mut tombstones: Vec<(Vec<u8>, u32, Instant)> =
            self.processors.iter().flat_map(Lfu::tombstones).collect();
        tombstones.sort_by(|a, b| (a.2, &a.0).cmp(&(b.2, &b.0)));
        for (name, epoch, until) in tombstones {
            let p = next.processor_of(name_hash(&name));
            next.processors[p].keep_tombstone(&name, epoch, until);
        }
        *self = next;
    }

    fn processor_of(&self, key_hash: u32) -> usize {
        processor(key_hash, self.processors.len())
    }

    /// Takes the marks off for the items `p` let go, in the step that let them go.
    fn settle(&mut self, p: usize) {
        let Some(stage) = &mut self.stage else {
            return;
        };
        for name in self.processors[p].take_gone() {
            stage.unmark(name_hash(&name));
        }
    }

    /// A read of `name`: its value and fill epoch when its processor holds it.
    pub fn get(&mut self, name: &[u8], now: Instant) -> Option<(&[u8], u32)> {
        let hash = name_hash(name);
        let p = match &mut self.stage {
            Some(stage) => match stage.lookup(hash) {
                Some(p) => p,
                None => {
                    self.stats.bypassed += 1;
                    return None;
                }
            },
            None => self.processor_of(hash),
        };
        self.stats.steered += 1;
        self.stats.reads[p] += 1;
        let found = self.processors[p].get(name, now).is_some();
        self.settle(p);
        if !found {
            self.stats.processor_misses += 1;
            return None;
        }
        self.processors[p].peek(name)
    }

    /// The epoch and lease left of `name`'s copy, without counting a use.
    pub fn held(&self, name: &[u8], now: Instant) -> Option<(u32, Duration)> {
        self.processors[self.processor_of(name_hash(name))].held(name, now)
    }

    pub fn contains(&self, name: &[u8]) -> bool {
        self.processors[self.processor_of(name_hash(name))].contains(name)
    }

    pub fn fill(&mut self, name: &[u8], value: &[u8], epoch: u32, now: Instant) -> bool {
        self.fill_for(name, value, epoch, self.lease, now)
    }

    /// Caches a reply's value at its key's processor, then marks the key in the switch
    /// stage's table.
    pub fn fill_for(
        &mut self,
        name: &[u8],
        value: &[u8],
        epoch: u32,
        lease: Duration,
        now: Instant,
    ) -> bool {
        let hash = name_hash(name);
        let p = self.processor_of(hash);
        let new = !self.processors[p].contains(name);
        if self.stage.is_some() && new {
            // The read that missed passed the processor by; its reply counts it.
            self.processors[p].note(name);
        }
        let taken = self.processors[p].fill_for(name, value, epoch, lease, now);
        self.settle(p);
        if taken && new {
            if let Some(stage) = &mut self.stage {
                if !stage.mark(hash, p) {
                    // Only a table smaller than the cache runs out, which the switch refuses;
                    // a copy no read could be sent to is not kept.
                    self.processors[p].remove(name);
                    let _ = self.processors[p].take_gone();
                    self.stats.fills_unmarked += 1;
                    return false;
                }
            }
        }
        taken
    }

    /// Drops `name` for the write at `epoch`, and its mark with it (in this step: no read is
    /// looked up between the two).
    pub fn invalidate(&mut self, name: &[u8], epoch: u32, now: Instant) -> bool {
        let p = self.processor_of(name_hash(name));
        let held = self.processors[p].invalidate(name, epoch, now);
        self.settle(p);
        held
    }

    pub fn remove(&mut self, name: &[u8]) -> bool {
        let p = self.processor_of(name_hash(name));
        let held = self.processors[p].remove(name);
        self.settle(p);
        held
    }

    pub fn clear(&mut self) {
        for p in 0..self.processors.len() {
            self.processors[p].clear();
            self.settle(p);
        }
    }

    pub fn set_capacity(&mut self, items: usize) {
        self.capacity = items;
        let n = self.processors.len();
        for p in 0..n {
            self.processors[p].set_capacity(share(items, n, p));
            self.settle(p);
        }
    }

    pub fn len(&self) -> usize {
        self.processors.iter().map(Lfu::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The processors' counters, summed, with those of the layouts before.
    pub fn cache_stats(&self) -> LfuStats {
        let mut sum = self.earlier;
        for s in self.processors.iter().map(Lfu::stats) {
            sum += s;
        }
        sum
    }

    pub fn stats(&self) -> IncBoxStats {
        IncBoxStats {
            processors: self.spec.processors,
            hit_check: self.spec.hit_check,
            marks: self.stage.as_ref().map_or(0, |s| s.marks.len()),
            fdb_entries: self.spec.fdb_entries,
            items: self.processors.iter().map(Lfu::len).collect(),
            ..self.stats.clone()
        }
    }

    /// Whether the switch stage would send a read of `key_hash` to a processor now.
    pub fn marked(&mut self, key_hash: u32) -> bool {
        self.stage
            .as_mut()
            .is_none_or(|s| s.lookup(key_hash).is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(2);

    fn name(server: u8, key: &str) -> Vec<u8> {
        let mut n = vec![10, 0, 0, server, 0x2b, 0xcb];
        n.extend_from_slice(key.as_bytes());
        n
    }

    fn split(processors: usize, items: usize) -> IncBox {
        let spec = IncBoxSpec {
            processors,
            hit_check: true,
            fdb_entries: FDB_ENTRIES,
        };
        IncBox::new(spec, items, LEASE, LEASE)
    }

    fn hash(key: &str) -> u32 {
        wire::inc::key_hash(key.as_bytes())
    }

    #[test]
    fn a_hit_is_steered_to_its_keys_processor_and_a_miss_reaches_none() {
        let mut b = split(4, 64);
        let t = Instant::ZERO;
        let keys: Vec<String> = (0..16).map(|i| format!("k{i}")).collect();
        for k in &keys {
            assert!(b.fill(&name(1, k), k.as_bytes(), 1, t));
        }
        let mut expected = [0u64; 4];
        for k in &keys {
            assert_eq!(
                b.get(&name(1, k), t).map(|(v, _)| v.to_vec()),
                Some(k.as_bytes().to_vec())
            );
            expected[processor(hash(k), 4)] += 1;
        }
        for i in 0..100 {
            assert!(b.get(&name(1, &format!("cold{i}")), t).is_none());
        }
        let s = b.stats();
        assert_eq!(
            s.reads,
            expected.to_vec(),
            "each read at its key's processor"
        );
        assert_eq!((s.steered, s.bypassed, s.processor_misses), (16, 100, 0));
        assert_eq!(s.marks, 16);
        assert_eq!(b.cache_stats().misses, 0, "no processor saw a miss");
        assert!(s.items.iter().all(|&n| n > 0), "{:?}", s.items);
    }

    #[test]
    fn a_keys_mark_goes_with_its_last_copy() {
        let mut b = split(2, 8);
        let t = Instant::ZERO;
        // One key of two servers: one hash, one mark counted twice.
        assert!(b.fill(&name(1, "k"), b"one", 1, t));
        assert!(b.fill(&name(2, "k"), b"two", 1, t));
        assert_eq!(b.stats().marks, 1);
        assert!(b.invalidate(&name(1, "k"), 2, t));
        assert!(
            b.marked(hash("k")),
            "the other server's copy still holds it"
        );
        assert!(b.get(&name(1, "k"), t).is_none());
        assert_eq!(b.stats().processor_misses, 1);
        assert_eq!(
            b.get(&name(2, "k"), t).map(|(v, _)| v.to_vec()),
            Some(b"two".to_vec())
        );
        assert!(b.remove(&name(2, "k")));
        assert!(!b.marked(hash("k")));
        assert!(b.get(&name(2, "k"), t).is_none());
        assert_eq!(b.stats().bypassed, 1);
        assert_eq!(b.stats().marks, 0);
    }

    #[test]
    fn an_evicted_key_is_no_longer_steered() {
        // One processor of two items: a third key that its replies show hotter takes the
        // place of the least used, and that key's mark goes in the same step.
        let mut b = split(1, 2);
        let t = Instant::ZERO;
        assert!(b.fill(&name(1, "a"), b"a", 1, t));
        assert!(b.fill(&name(1, "b"), b"b", 1, t));
        for _ in 0..3 {
            b.get(&name(1, "b"), t);
        }
        let mut taken = false;
        for _ in 0..4 {
            taken |= b.fill(&name(1, "c"), b"c", 1, t);
        }
        assert!(taken, "{:?}", b.cache_stats());
        assert!(!b.marked(hash("a")), "the evicted key's mark is gone");
        assert!(b.marked(hash("b")) && b.marked(hash("c")));
        let before = b.stats().steered;
        assert!(b.get(&name(1, "a"), t).is_none());
        assert_eq!(
            b.stats().steered,
            before,
            "a read of it reached no processor"
        );
        // A smaller cache evicts too, and its marks go with it.
        b.set_capacity(0);
        assert_eq!(b.stats().marks, 0);
        assert!(!b.marked(hash("b")) && !b.marked(hash("c")));
    }

    #[test]
    fn a_copy_past_its_lease_loses_its_mark_at_the_next_read() {
        let mut b = split(1, 4);
        let t = Instant::ZERO;
        assert!(b.fill(&name(1, "k"), b"v", 1, t));
        assert!(b.get(&name(1, "k"), t + LEASE).is_none());
        assert_eq!(b.stats().processor_misses, 1);
        assert!(!b.marked(hash("k")));
        assert!(b.get(&name(1, "k"), t + LEASE).is_none());
        assert_eq!(b.stats().bypassed, 1);
    }

    #[test]
    fn a_full_table_takes_no_fill_it_could_not_mark() {
        let spec = IncBoxSpec {
            processors: 2,
            hit_check: true,
            fdb_entries: 2,
        };
        let mut b = IncBox::new(spec, 16, LEASE, LEASE);
        let t = Instant::ZERO;
        assert!(b.fill(&name(1, "a"), b"a", 1, t));
        assert!(b.fill(&name(1, "b"), b"b", 1, t));
        assert!(!b.fill(&name(1, "c"), b"c", 1, t));
        assert!(
            b.fill(&name(2, "a"), b"a", 1, t),
            "a held hash needs no new mark"
        );
        let s = b.stats();
        assert_eq!((s.marks, s.fills_unmarked), (2, 1));
        assert_eq!(b.len(), 3);
        b.clear();
        assert_eq!((b.len(), b.stats().marks), (0, 0));
        assert!(b.fill(&name(1, "c"), b"c", 1, t));
    }

    #[test]
    fn without_the_hit_check_every_read_reaches_its_processor() {
        let spec = IncBoxSpec {
            processors: 3,
            ..IncBoxSpec::default()
        };
        let mut b = IncBox::new(spec, 30, LEASE, LEASE);
        let t = Instant::ZERO;
        assert!(b.fill(&name(1, "a"), b"a", 1, t));
        assert!(b.get(&name(1, "a"), t).is_some());
        assert!(b.get(&name(1, "b"), t).is_none());
        let s = b.stats();
        assert_eq!((s.steered, s.bypassed, s.marks), (2, 0, 0));
        assert_eq!(
            s.processor_misses, 1,
            "the miss cost its processor a lookup"
        );
        assert_eq!(b.cache_stats().misses, 1);
        assert_eq!(b.capacity(), 30);
        assert_eq!(s.items.len(), 3);
    }

    /// Every mark stands for the items of its hash held at its processor, counted, after
    /// any mix of fills, reads, invalidations, evictions, lease ends and resizes.
    #[test]
    fn marks_follow_the_items_held_through_any_mix_of_operations() {
        let mut b = split(3, 24);
        // Keys of two servers: each key's hash is held by up to two items.
        let names: Vec<Vec<u8>> = (0..40)
            .flat_map(|k| [name(1, &format!("k{k}")), name(2, &format!("k{k}"))])
            .collect();
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut t = Instant::ZERO;
        for step in 0..20_000u32 {
            let n = &names[next(names.len() as u64) as usize];
            match next(10) {
                0..=3 => {
                    b.get(n, t);
                }
                4..=6 => {
                    b.fill(n, b"v", step, t);
                }
                7 => {
                    b.invalidate(n, step, t);
                }
                8 => t += Duration::from_millis(next(400)),
                _ => b.set_capacity([6, 24, 12][next(3) as usize]),
            }
            let stage = b.stage.as_ref().unwrap();
            let mut held: HashMap<u32, u32> = HashMap::new();
            for n in names.iter().filter(|n| b.contains(n)) {
                *held.entry(name_hash(n)).or_default() += 1;
            }
            let marks: HashMap<u32, u32> = stage.marks.iter().map(|(&h, &(_, c))| (h, c)).collect();
            assert_eq!(marks, held, "step {step}");
            for (&h, &(id, _)) in &stage.marks {
                let entry = stage.pipeline.entry(stage.table, id).expect("its entry");
                assert_eq!(
                    entry.entry.actions,
                    vec![Action::Output(processor(h, 3) as u16)]
                );
            }
        }
        assert!(b.stats().steered > 0 && b.stats().bypassed > 0);
    }

    #[test]
    fn a_new_layout_keeps_the_tombstones_and_the_counters() {
        let mut b = split(2, 16);
        let t = Instant::ZERO;
        assert!(b.fill(&name(1, "k"), b"old", 1, t));
        assert!(b.get(&name(1, "k"), t).is_some());
        assert!(b.invalidate(&name(1, "k"), 5, t));
        b.reshape(IncBoxSpec {
            processors: 3,
            ..b.spec()
        });
        assert!(
            !b.fill(&name(1, "k"), b"old", 4, t),
            "a reply older than the invalidation fills nothing after the change"
        );
        assert!(b.fill(&name(1, "k"), b"new", 6, t));
        let s = b.stats();
        assert_eq!((s.processors, s.steered, s.reads.len()), (3, 1, 3));
        assert_eq!(
            b.cache_stats().hits,
            1,
            "the earlier layout's hit still counted"
        );
        // The same layout changes nothing; a new table size alone keeps the copies.
        b.reshape(b.spec());
        b.reshape(IncBoxSpec {
            fdb_entries: 64,
            ..b.spec()
        });
        assert_eq!((b.len(), b.stats().fdb_entries), (1, 64));
        assert!(b.get(&name(1, "k"), t).is_some());
    }

    #[test]
    fn keys_spread_over_every_processor_whatever_their_root() {
        // The keys one root of two holds (even buckets of the registration table), and keys
        // that differ in their last byte alone, spread over every processor.
        for (keys, what) in [
            (
                (0..4000)
                    .map(|i| format!("key:{i}"))
                    .filter(|k| (hash(k) % 64).is_multiple_of(2))
                    .collect::<Vec<_>>(),
                "one root's keys",
            ),
            (
                (0..16).map(|i| format!("k{i:x}")).collect(),
                "keys one byte apart",
            ),
        ] {
            let mut seen = [0usize; 4];
            for k in &keys {
                seen[processor(hash(k), 4)] += 1;
            }
            let least = keys.len() / 4 / 3;
            assert!(seen.iter().all(|&n| n >= least.max(1)), "{what}: {seen:?}");
        }
        assert!((0..=u32::MAX)
            .step_by(65_537)
            .all(|h| processor(h, 16) < 16));
    }

    #[test]
    fn bad_layouts_are_refused() {
        for (processors, fdb_entries) in [(0, 10), (17, 10), (2, 0), (2, MAX_FDB_ENTRIES + 1)] {
            let spec = IncBoxSpec {
                processors,
                hit_check: true,
                fdb_entries,
            };
            assert!(spec.validate().is_err(), "{spec:?}");
        }
        assert!(IncBoxSpec::default().validate().is_ok());
        assert_eq!(hash_mac(0x0102_0304), [0x06, 0x1c, 1, 2, 3, 4]);
    }
}
