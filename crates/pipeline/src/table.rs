//! One match table: its key, its entries and the index that finds them.
//!
//! Exact tables hash the key bytes; LPM tables keep one hash map per prefix length in use,
//! longest first; ternary tables keep entries sorted by priority and test each mask in turn.
//! Nothing here looks at frames or runs actions.

use crate::action::{Action, EntryId, TableId};
use crate::error::Error;
use crate::field::Field;
use crate::MAX_KEY_LEN;
use std::collections::HashMap;

/// How a table compares its lookup key with entry keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatchKind {
    /// All key bytes equal.
    Exact,
    /// The first `prefix_len` bits equal; the longest matching prefix wins.
    Lpm,
    /// `lookup & mask == key & mask`; the highest priority wins, then the earliest inserted.
    Ternary,
}

/// Everything needed to create a table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableSpec {
    /// Unique name, for status output and [`Pipeline::table_id`](crate::Pipeline::table_id).
    pub name: String,
    pub kind: MatchKind,
    /// Fields concatenated into the lookup key; 1 to [`MAX_KEY_LEN`] bytes in total.
    pub key: Vec<Field>,
    /// Actions run when no entry matches or when the key is absent (bytes past the frame end).
    pub miss: Vec<Action>,
}

/// A table entry as the control plane writes it.
///
/// `key` (and `mask`) must be exactly as long as the table's key. Exact entries take neither
/// `mask` nor `prefix_len`; LPM entries need `prefix_len` (in bits, at most the key length) and
/// ternary entries need `mask`. Key bits outside the prefix or the mask are ignored and stored
/// as zero. `priority` only matters for ternary tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub key: Vec<u8>,
    pub mask: Option<Vec<u8>>,
    pub prefix_len: Option<u16>,
    pub priority: u32,
    pub actions: Vec<Action>,
}

impl Entry {
    /// An entry for an exact table.
    pub fn exact(key: impl Into<Vec<u8>>, actions: Vec<Action>) -> Self {
        Entry {
            key: key.into(),
            mask: None,
            prefix_len: None,
            priority: 0,
            actions,
        }
    }

    /// An entry for an LPM table matching the first `prefix_len` bits of `key`.
    pub fn lpm(key: impl Into<Vec<u8>>, prefix_len: u16, actions: Vec<Action>) -> Self {
        Entry {
            prefix_len: Some(prefix_len),
            ..Entry::exact(key, actions)
        }
    }

    /// An entry for a ternary table; higher `priority` wins.
    pub fn ternary(
        key: impl Into<Vec<u8>>,
        mask: impl Into<Vec<u8>>,
        priority: u32,
        actions: Vec<Action>,
    ) -> Self {
        Entry {
            mask: Some(mask.into()),
            priority,
            ..Entry::exact(key, actions)
        }
    }
}

/// An entry with its hit counter.
pub(crate) struct Stored {
    pub entry: Entry,
    pub hits: u64,
    /// When it was first inserted, in the table's order: ternary ties go to the earliest.
    pub seq: u64,
}

/// A place in the entry slab; `generation` changes whenever the entry in it is removed.
struct Slot {
    generation: u32,
    stored: Option<Stored>,
}

/// LPM entries of one prefix length, keyed by the masked key.
struct Level {
    prefix_len: u16,
    map: HashMap<Box<[u8]>, u32>,
}

/// A ternary entry's place in priority order.
struct Row {
    priority: u32,
    seq: u64,
    slot: u32,
}

enum Index {
    /// Key bytes → slot.
    Exact(HashMap<Box<[u8]>, u32>),
    /// Prefix lengths in use, longest first.
    Lpm(Vec<Level>),
    /// Rows by descending priority; rows of equal priority in insertion order.
    Ternary(Vec<Row>),
}

pub(crate) struct Table {
    pub name: String,
    pub kind: MatchKind,
    pub fields: Vec<Field>,
    pub key_len: usize,
    pub miss: Vec<Action>,
    /// Most entries it may hold; `None` for no limit but memory.
    pub limit: Option<usize>,
    /// Removed from its pipeline: its id is never valid again.
    pub removed: bool,
    pub hits: u64,
    pub misses: u64,
    /// Misses because the key reached past the end of the frame (included in `misses`).
    pub absent: u64,
    slots: Vec<Slot>,
    /// Empty slots, reused before the slab grows.
    free: Vec<u32>,
    live: usize,
    /// The `seq` of the next entry inserted.
    next_seq: u64,
    index: Index,
}

/// Zeroes every bit of `key` from bit `bits` on.
fn mask_prefix(key: &mut [u8], bits: usize) {
    for (i, b) in key.iter_mut().enumerate() {
        let start = i * 8;
        if start >= bits {
            *b = 0;
        } else if bits - start < 8 {
            *b &= 0xffu8 << (8 - (bits - start));
        }
    }
}

impl Table {
    /// Checks the spec's key (not its miss actions) and creates an empty table.
    pub fn new(spec: TableSpec) -> Result<Table, Error> {
        if spec.key.is_empty() {
            return Err(Error::EmptyKey);
        }
        for f in &spec.key {
            f.validate().map_err(Error::BadField)?;
        }
        let key_len = spec.key.iter().map(Field::width).sum();
        if key_len > MAX_KEY_LEN {
            return Err(Error::KeyTooLong(key_len));
        }
        let index = match spec.kind {
            MatchKind::Exact => Index::Exact(HashMap::new()),
            MatchKind::Lpm => Index::Lpm(Vec::new()),
            MatchKind::Ternary => Index::Ternary(Vec::new()),
        };
        Ok(Table {
            name: spec.name,
            kind: spec.kind,
            fields: spec.key,
            key_len,
            miss: spec.miss,
            limit: None,
            removed: false,
            hits: 0,
            misses: 0,
            absent: 0,
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            next_seq: 0,
            index,
        })
    }

    pub fn len(&self) -> usize {
        self.live
    }

    fn id_of(&self, slot: u32) -> EntryId {
        EntryId {
            index: slot,
            generation: self.slots[slot as usize].generation,
        }
    }

    /// Checks the entry's shape against the table and normalises its key (bits outside the
    /// prefix or mask cleared). Actions are checked by the caller.
    pub fn normalise(&self, mut e: Entry) -> Result<Entry, Error> {
        let expected = self.key_len;
        if e.key.len() != expected {
            return Err(Error::KeyLength {
                expected,
                got: e.key.len(),
            });
        }
        let ternary = self.kind == MatchKind::Ternary;
        let lpm = self.kind == MatchKind::Lpm;
        if e.mask.is_some() != ternary {
            return Err(Error::Mask { required: ternary });
        }
        if e.prefix_len.is_some() != lpm {
            return Err(Error::Prefix { required: lpm });
        }
        if let Some(mask) = &e.mask {
            if mask.len() != expected {
                return Err(Error::KeyLength {
                    expected,
                    got: mask.len(),
                });
            }
            for (k, m) in e.key.iter_mut().zip(mask) {
                *k &= m;
            }
        }
        if let Some(p) = e.prefix_len {
            let max = (expected * 8) as u16; // at most 512: MAX_KEY_LEN bytes
            if p > max {
                return Err(Error::PrefixTooLong { prefix_len: p, max });
            }
            mask_prefix(&mut e.key, usize::from(p));
        }
        Ok(e)
    }

    /// Inserts an entry already passed through [`Table::normalise`].
    pub fn insert(&mut self, e: Entry) -> Result<EntryId, Error> {
        // Refuse duplicates before touching the slab.
        if let Some(id) = self.duplicate_of(&e) {
            return Err(Error::DuplicateKey(id));
        }
        self.insert_new(e)
    }

    /// The live exact or LPM entry with `e`'s (normalised) key and prefix, if any.
    pub fn duplicate_of(&self, e: &Entry) -> Option<EntryId> {
        let existing = match &self.index {
            Index::Exact(map) => map.get(e.key.as_slice()).copied(),
            Index::Lpm(levels) => levels
                .iter()
                .find(|l| Some(l.prefix_len) == e.prefix_len)
                .and_then(|l| l.map.get(e.key.as_slice()).copied()),
            Index::Ternary(_) => None,
        };
        existing.map(|slot| self.id_of(slot))
    }

    fn insert_new(&mut self, e: Entry) -> Result<EntryId, Error> {
        let stored = Stored {
            entry: e,
            hits: 0,
            seq: self.next_seq,
        };
        self.next_seq += 1;
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(Slot {
                    generation: 0,
                    stored: None,
                });
                // Slab size is bounded by memory long before u32::MAX entries.
                (self.slots.len() - 1) as u32
            }
        };
        self.place(slot, stored);
        Ok(self.id_of(slot))
    }

    /// Puts back an entry [`Table::remove`] took, under its old id and with its hits, as if it
    /// had never gone: for undoing a change. Returns `false` (and does nothing) if its slot
    /// has been taken since, or it clashes with a live entry.
    pub fn restore(&mut self, id: EntryId, stored: Stored) -> bool {
        let entry = &stored.entry;
        let Some(pos) = self.free.iter().position(|&s| s == id.index) else {
            return false;
        };
        let clash = match &self.index {
            Index::Exact(map) => map.contains_key(entry.key.as_slice()),
            Index::Lpm(levels) => levels.iter().any(|l| {
                Some(l.prefix_len) == entry.prefix_len && l.map.contains_key(entry.key.as_slice())
            }),
            Index::Ternary(_) => false,
        };
        if clash {
            return false;
        }
        self.free.swap_remove(pos);
        self.slots[id.index as usize].generation = id.generation;
        self.place(id.index, stored);
        true
    }

    /// Stores `stored` in the empty `slot` and indexes it.
    fn place(&mut self, slot: u32, stored: Stored) {
        let key: Box<[u8]> = stored.entry.key.clone().into_boxed_slice();
        let (priority, prefix_len, seq) = (
            stored.entry.priority,
            stored.entry.prefix_len.unwrap_or(0),
            stored.seq,
        );
        self.slots[slot as usize].stored = Some(stored);
        match &mut self.index {
            Index::Exact(map) => {
                map.insert(key, slot);
            }
            Index::Lpm(levels) => {
                let pos = levels.partition_point(|l| l.prefix_len > prefix_len);
                if levels.get(pos).map(|l| l.prefix_len) != Some(prefix_len) {
                    levels.insert(
                        pos,
                        Level {
                            prefix_len,
                            map: HashMap::new(),
                        },
                    );
                }
                levels[pos].map.insert(key, slot);
            }
            Index::Ternary(rows) => {
                // Among rows of equal priority, earlier insertions win ties.
                let pos = rows.partition_point(|r| {
                    r.priority > priority || (r.priority == priority && r.seq < seq)
                });
                rows.insert(
                    pos,
                    Row {
                        priority,
                        seq,
                        slot,
                    },
                );
            }
        }
        self.live += 1;
    }

    fn slot_of(&self, id: EntryId) -> Option<u32> {
        let s = self.slots.get(id.index as usize)?;
        (s.generation == id.generation && s.stored.is_some()).then_some(id.index)
    }

    pub fn get(&self, id: EntryId) -> Option<&Stored> {
        let slot = self.slot_of(id)?;
        self.slots[slot as usize].stored.as_ref()
    }

    pub fn get_mut(&mut self, id: EntryId) -> Option<&mut Stored> {
        let slot = self.slot_of(id)?;
        self.slots[slot as usize].stored.as_mut()
    }

    /// Removes an entry, returning it; `None` if the id is not live.
    pub fn remove(&mut self, id: EntryId) -> Option<Entry> {
        self.take(id).map(|s| s.entry)
    }

    /// Removes an entry, returning it with its hits.
    pub fn take(&mut self, id: EntryId) -> Option<Stored> {
        let slot = self.slot_of(id)?;
        let stored = self.slots[slot as usize].stored.take()?;
        let key = stored.entry.key.as_slice();
        match &mut self.index {
            Index::Exact(map) => {
                map.remove(key);
            }
            Index::Lpm(levels) => {
                let p = stored.entry.prefix_len.unwrap_or(0);
                if let Some(pos) = levels.iter().position(|l| l.prefix_len == p) {
                    levels[pos].map.remove(key);
                    if levels[pos].map.is_empty() {
                        levels.remove(pos);
                    }
                }
            }
            Index::Ternary(rows) => rows.retain(|r| r.slot != slot),
        }
        let s = &mut self.slots[slot as usize];
        s.generation = s.generation.wrapping_add(1);
        self.free.push(slot);
        self.live -= 1;
        Some(stored)
    }

    /// Finds the slot matching `key` (of the table's key length). `scratch` is reused for
    /// masking and must have [`MAX_KEY_LEN`] capacity to stay allocation-free.
    pub fn find(&self, key: &[u8], scratch: &mut Vec<u8>) -> Option<u32> {
        match &self.index {
            Index::Exact(map) => map.get(key).copied(),
            Index::Lpm(levels) => levels.iter().find_map(|l| {
                scratch.clear();
                scratch.extend_from_slice(key);
                mask_prefix(scratch, usize::from(l.prefix_len));
                l.map.get(scratch.as_slice()).copied()
            }),
            Index::Ternary(rows) => rows
                .iter()
                .find(|r| {
                    let Some(stored) = &self.slots[r.slot as usize].stored else {
                        return false;
                    };
                    let e = &stored.entry;
                    let mask = e.mask.as_deref().unwrap_or(&[]);
                    key.len() == e.key.len()
                        && key
                            .iter()
                            .zip(mask)
                            .zip(&e.key)
                            .all(|((k, m), v)| k & m == *v)
                })
                .map(|r| r.slot),
        }
    }

    /// Records a hit on `slot` and returns its actions.
    pub fn hit(&mut self, slot: u32) -> &[Action] {
        self.hits += 1;
        match self
            .slots
            .get_mut(slot as usize)
            .and_then(|s| s.stored.as_mut())
        {
            Some(stored) => {
                stored.hits += 1;
                &stored.entry.actions
            }
            None => &[],
        }
    }

    pub fn id(&self, slot: u32) -> EntryId {
        self.id_of(slot)
    }

    /// Live entries in slab order.
    pub fn iter(&self) -> impl Iterator<Item = (EntryId, &Stored)> {
        self.slots.iter().enumerate().filter_map(|(i, s)| {
            let stored = s.stored.as_ref()?;
            let id = EntryId {
                index: i as u32,
                generation: s.generation,
            };
            Some((id, stored))
        })
    }
}

/// Table ids as they are handed out: the position in the pipeline.
pub(crate) fn table_id(index: usize) -> TableId {
    // The pipeline hands out fewer than MAX_TABLE_IDS (u16::MAX) ids.
    TableId(index as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(kind: MatchKind, len: u8) -> Table {
        Table::new(TableSpec {
            name: "t".into(),
            kind,
            key: vec![Field::Bytes { offset: 0, len }],
            miss: vec![],
        })
        .unwrap()
    }

    #[test]
    fn prefix_masking() {
        let mut k = [0xff; 3];
        mask_prefix(&mut k, 12);
        assert_eq!(k, [0xff, 0xf0, 0]);
        let mut k = [0xff; 2];
        mask_prefix(&mut k, 0);
        assert_eq!(k, [0, 0]);
        let mut k = [0xab; 2];
        mask_prefix(&mut k, 16);
        assert_eq!(k, [0xab, 0xab]);
    }

    #[test]
    fn slot_reuse_invalidates_old_ids() {
        let mut t = table(MatchKind::Exact, 1);
        let a = t
            .insert(t.normalise(Entry::exact([1], vec![])).unwrap())
            .unwrap();
        assert!(t.remove(a).is_some());
        let b = t
            .insert(t.normalise(Entry::exact([2], vec![])).unwrap())
            .unwrap();
        assert_ne!(a, b);
        assert!(t.get(a).is_none());
        assert!(t.remove(a).is_none());
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn shape_errors() {
        let t = table(MatchKind::Lpm, 2);
        assert_eq!(
            t.normalise(Entry::exact([1, 2], vec![])),
            Err(Error::Prefix { required: true })
        );
        assert_eq!(
            t.normalise(Entry::lpm([1, 2], 17, vec![])),
            Err(Error::PrefixTooLong {
                prefix_len: 17,
                max: 16
            })
        );
        assert_eq!(
            t.normalise(Entry::lpm([1], 8, vec![])),
            Err(Error::KeyLength {
                expected: 2,
                got: 1
            })
        );
        let t = table(MatchKind::Ternary, 2);
        assert_eq!(
            t.normalise(Entry::ternary([1, 2], [1], 0, vec![])),
            Err(Error::KeyLength {
                expected: 2,
                got: 1
            })
        );
        assert_eq!(
            t.normalise(Entry::exact([1, 2], vec![])),
            Err(Error::Mask { required: true })
        );
    }

    #[test]
    fn ternary_ties_go_to_the_earliest() {
        let mut t = table(MatchKind::Ternary, 1);
        let a = t
            .insert(t.normalise(Entry::ternary([0], [0], 5, vec![])).unwrap())
            .unwrap();
        let _b = t
            .insert(t.normalise(Entry::ternary([0], [0], 5, vec![])).unwrap())
            .unwrap();
        let mut s = Vec::new();
        assert_eq!(t.find(&[9], &mut s).map(|x| t.id(x)), Some(a));
    }
}
