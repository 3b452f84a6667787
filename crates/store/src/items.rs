//! The in-memory item store: memcached's item semantics (flags, expiry, CAS) over sharded hash
//! maps, shared by the text, meta and binary front ends.
//!
//! It never does I/O and never evicts: when a memory limit is set, a store that would exceed it
//! is refused (memcached's `-M` behaviour, `SERVER_ERROR out of memory storing object`). It
//! reads no clock either: the time comes from the [`Host`] it is given.

use std::collections::hash_map::{DefaultHasher, Entry};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Independent locks, so that worker threads rarely contend.
const SHARDS: usize = 32;

/// memcached's `REALTIME_MAXDELTA`: exptimes above 30 days are absolute unix times.
const REALTIME_MAXDELTA: i64 = 60 * 60 * 24 * 30;

/// Bytes charged per item on top of key and value, close to memcached's item header.
const ITEM_OVERHEAD: u64 = 50;

/// memcached's default `-I 1m`: the largest item, header and key included.
pub const ITEM_SIZE_MAX: usize = 1024 * 1024;

/// The clock value of a fresh start; `1` then always lies in the past, which is how an already
/// expired exptime is stored (memcached's `current_time` starts above 1 for the same reason).
const CLOCK_BASE: u64 = 2;

/// What a store learns from the world it runs in: how long it has run, the time, the process.
/// A server gives its own clock and process; a simulator or a test gives [`Frozen`].
pub trait Host: Send + Sync + std::fmt::Debug {
    /// Time since the store was created.
    fn elapsed(&self) -> Duration;
    /// Unix time, in seconds, when the store was created: the origin of absolute exptimes.
    fn started_unix(&self) -> i64;
    /// Unix time now, in seconds (`stats` `time`).
    fn unix_now(&self) -> u64;
    /// The process id `stats` reports.
    fn pid(&self) -> u32;
}

/// A host whose time stands still at unix time `unix`, in process 0: relative exptimes and
/// delays never come, and every run is the same.
#[derive(Clone, Copy, Debug, Default)]
pub struct Frozen {
    pub unix: i64,
}

impl Host for Frozen {
    fn elapsed(&self) -> Duration {
        Duration::ZERO
    }

    fn started_unix(&self) -> i64 {
        self.unix
    }

    fn unix_now(&self) -> u64 {
        self.unix.max(0) as u64
    }

    fn pid(&self) -> u32 {
        0
    }
}

/// One stored item.
#[derive(Debug, Clone)]
pub struct Item {
    pub value: Arc<[u8]>,
    pub flags: u32,
    /// Clock second at which the item expires; 0 for never.
    pub exptime: u64,
    pub cas: u64,
    /// Clock millisecond of the last store, for delayed `flush_all`.
    stored_ms: u64,
}

impl Item {
    fn size(&self, key: &[u8]) -> u64 {
        (key.len() + self.value.len()) as u64 + ITEM_OVERHEAD
    }
}

/// How a storage request treats an existing item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
}

/// The outcome of a storage request, as memcached names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOutcome {
    /// Stored, with the new CAS value.
    Stored(u64),
    NotStored,
    /// A CAS value was given and does not match.
    Exists,
    /// A CAS value was given and there is no item.
    NotFound,
    TooLarge,
    NoMemory,
}

/// The outcome of a delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteOutcome {
    Deleted,
    NotFound,
    Exists,
}

/// The outcome of an increment or decrement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delta {
    /// The new value and CAS.
    Value(u64, u64),
    NotFound,
    NonNumeric,
    Exists,
}

/// Server-wide counters, reported by `stats`.
#[derive(Debug, Default)]
pub struct Counters {
    pub cmd_get: AtomicU64,
    pub get_hits: AtomicU64,
    pub get_misses: AtomicU64,
    pub cmd_set: AtomicU64,
    pub cmd_touch: AtomicU64,
    pub touch_hits: AtomicU64,
    pub touch_misses: AtomicU64,
    pub delete_hits: AtomicU64,
    pub delete_misses: AtomicU64,
    pub incr_hits: AtomicU64,
    pub incr_misses: AtomicU64,
    pub decr_hits: AtomicU64,
    pub decr_misses: AtomicU64,
    pub cas_hits: AtomicU64,
    pub cas_misses: AtomicU64,
    pub cas_badval: AtomicU64,
    pub cmd_flush: AtomicU64,
    pub total_items: AtomicU64,
    pub curr_connections: AtomicU64,
    pub total_connections: AtomicU64,
    /// UDP requests dropped because the token bucket was empty.
    pub capacity_drops: AtomicU64,
    /// TCP requests held back until the token bucket refilled.
    pub capacity_delays: AtomicU64,
    /// Requests of any kind served.
    pub requests: AtomicU64,
    /// UDP requests a look-through cache node sent on to its upstream.
    pub relayed: AtomicU64,
    /// Relayed requests whose reply did not come back in time (the upstream dropped them).
    pub relay_lost: AtomicU64,
    /// Datagrams at the relay that answer no open request (late, or not a reply).
    pub relay_stray: AtomicU64,
    /// UDP reads a steered cache node could not answer and sent back through the switch to
    /// their backend.
    pub bounced: AtomicU64,
    /// Reads it could not send back that way, taken to the backend over TCP instead.
    pub bounce_failed: AtomicU64,
    /// A fabric home's requests from its ToR.
    pub home_requests: AtomicU64,
    /// Read replies it let fill the caches on their way.
    pub home_fills: AtomicU64,
    /// Invalidations it sent (retransmissions included), and acknowledgements received.
    pub home_invalidations: AtomicU64,
    pub home_acks: AtomicU64,
    /// Writes failed unapplied (invalidations not acknowledged in time, or too many waiting).
    pub home_writes_failed: AtomicU64,
    /// Messages it could not read or that did not match their request.
    pub home_malformed: AtomicU64,
    /// Datagrams to its fabric port from anyone but its ToR: dropped.
    pub home_refused: AtomicU64,
    /// Under write-update, copies of stored values it sent to the switches a write
    /// invalidated.
    pub home_updates: AtomicU64,
}

/// Adds one to a counter.
pub fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Reads a counter.
pub fn read(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

type Shard = HashMap<Vec<u8>, Item>;

/// The item store. All methods take `&self` and are safe to call from many threads.
#[derive(Debug)]
pub struct Store {
    shards: Vec<Mutex<Shard>>,
    /// The last CAS value handed out; memcached's global `cas_id`.
    cas: AtomicU64,
    host: Box<dyn Host>,
    started_unix: i64,
    used: AtomicU64,
    limit: Option<u64>,
    /// Clock millisecond of a pending delayed `flush_all`, 0 if none.
    flush_ms: AtomicU64,
    pub counters: Counters,
}

impl Store {
    /// A store holding at most `limit` bytes of items (keys, values and overhead), or unbounded,
    /// on `host`'s clock.
    pub fn new(limit: Option<u64>, host: Box<dyn Host>) -> Store {
        let started_unix = host.started_unix();
        Store {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            cas: AtomicU64::new(0),
            host,
            started_unix,
            used: AtomicU64::new(0),
            limit,
            flush_ms: AtomicU64::new(0),
            counters: Counters::default(),
        }
    }

    /// The server clock in seconds, memcached's `current_time`.
    pub fn now(&self) -> u64 {
        self.host.elapsed().as_secs() + CLOCK_BASE
    }

    fn now_ms(&self) -> u64 {
        self.host.elapsed().as_millis() as u64 + CLOCK_BASE * 1000
    }

    /// Seconds since the store was created.
    pub fn uptime(&self) -> u64 {
        self.host.elapsed().as_secs()
    }

    /// The host the store runs on.
    pub fn host(&self) -> &dyn Host {
        &*self.host
    }

    /// Converts a protocol exptime to a clock second as memcached's `realtime()` does: 0 is
    /// never, negative is already expired, up to 30 days is relative, above is a unix time.
    pub fn expiry(&self, exptime: i64) -> u64 {
        if exptime == 0 {
            0
        } else if exptime < 0 {
            1
        } else if exptime > REALTIME_MAXDELTA {
            let relative = exptime - self.started_unix;
            if relative <= 0 {
                1
            } else {
                relative as u64 + CLOCK_BASE
            }
        } else {
            exptime as u64 + self.now()
        }
    }

    /// Seconds an item has left, or -1 if it never expires (meta `t`).
    pub fn ttl(&self, item: &Item) -> i64 {
        if item.exptime == 0 {
            -1
        } else {
            item.exptime as i64 - self.now() as i64
        }
    }

    /// Number of live and not yet reaped items.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes charged for stored items.
    pub fn bytes(&self) -> u64 {
        read(&self.used)
    }

    pub fn limit(&self) -> Option<u64> {
        self.limit
    }

    fn shard(&self, key: &[u8]) -> MutexGuard<'_, Shard> {
        let mut hasher = DefaultHasher::new();
        key.hash(&mut hasher);
        let index = hasher.finish() as usize % SHARDS;
        lock(&self.shards[index])
    }

    fn next_cas(&self) -> u64 {
        self.cas.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn is_live(&self, item: &Item) -> bool {
        if item.exptime != 0 && item.exptime <= self.now() {
            return false;
        }
        let flush = read(&self.flush_ms);
        !(flush != 0 && flush <= self.now_ms() && item.stored_ms <= flush)
    }

    /// Removes `key` from `shard` if its item is dead; returns whether a live item remains.
    fn reap(&self, shard: &mut Shard, key: &[u8]) -> bool {
        let live = match shard.get(key) {
            None => return false,
            Some(item) => self.is_live(item),
        };
        if !live {
            if let Some(item) = shard.remove(key) {
                self.used.fetch_sub(item.size(key), Ordering::Relaxed);
            }
        }
        live
    }

    /// The item under `key`; with `touch`, its expiry is first reset to that exptime.
    pub fn get(&self, key: &[u8], touch: Option<i64>) -> Option<Item> {
        let mut shard = self.shard(key);
        if !self.reap(&mut shard, key) {
            return None;
        }
        let expiry = touch.map(|t| self.expiry(t));
        let item = shard.get_mut(key)?;
        if let Some(expiry) = expiry {
            item.exptime = expiry;
        }
        Some(item.clone())
    }

    /// Stores `value` under `key`. A non-zero `cas` makes the store conditional on the item's
    /// current CAS value, as the text `cas` command, binary CAS and meta `C` do.
    pub fn store(
        &self,
        mode: Mode,
        key: &[u8],
        value: &[u8],
        flags: u32,
        exptime: i64,
        cas: u64,
    ) -> StoreOutcome {
        if key.len() + value.len() + ITEM_OVERHEAD as usize > ITEM_SIZE_MAX {
            return StoreOutcome::TooLarge;
        }
        let expiry = self.expiry(exptime);
        let mut shard = self.shard(key);
        let live = self.reap(&mut shard, key);
        let old = if live { shard.get(key) } else { None };
        match (old, mode, cas) {
            (None, _, c) if c != 0 => return StoreOutcome::NotFound,
            (Some(old), _, c) if c != 0 && old.cas != c => return StoreOutcome::Exists,
            (None, Mode::Replace | Mode::Append | Mode::Prepend, _) => {
                return StoreOutcome::NotStored
            }
            (Some(_), Mode::Add, _) => return StoreOutcome::NotStored,
            _ => {}
        }
        if let (Some(old), Mode::Append | Mode::Prepend) = (old, mode) {
            // memcached cannot allocate the joined item and answers as for a missing one.
            let joined = key.len() + old.value.len() + value.len() + ITEM_OVERHEAD as usize;
            if joined > ITEM_SIZE_MAX {
                return StoreOutcome::NotStored;
            }
        }
        let (value, flags, exptime): (Arc<[u8]>, u32, u64) = match (old, mode) {
            (Some(old), Mode::Append) => (
                [&old.value[..], value].concat().into(),
                old.flags,
                old.exptime,
            ),
            (Some(old), Mode::Prepend) => (
                [value, &old.value[..]].concat().into(),
                old.flags,
                old.exptime,
            ),
            _ => (value.into(), flags, expiry),
        };
        let item = Item {
            value,
            flags,
            exptime,
            cas: self.next_cas(),
            stored_ms: self.now_ms(),
        };
        if !self.charge(&shard, key, &item) {
            return StoreOutcome::NoMemory;
        }
        let cas = item.cas;
        shard.insert(key.to_vec(), item);
        bump(&self.counters.total_items);
        StoreOutcome::Stored(cas)
    }

    /// Accounts for replacing the item under `key` with `item`; false if over the limit.
    fn charge(&self, shard: &Shard, key: &[u8], item: &Item) -> bool {
        let old = shard.get(key).map_or(0, |old| old.size(key));
        let new = item.size(key);
        let used = read(&self.used);
        if let Some(limit) = self.limit {
            if new > old && used + new - old > limit {
                return false;
            }
        }
        self.used.fetch_add(new, Ordering::Relaxed);
        self.used.fetch_sub(old, Ordering::Relaxed);
        true
    }

    /// Deletes `key`, only if its CAS value is `cas` when that is non-zero.
    pub fn delete(&self, key: &[u8], cas: u64) -> DeleteOutcome {
        let mut shard = self.shard(key);
        if !self.reap(&mut shard, key) {
            return DeleteOutcome::NotFound;
        }
        if let Entry::Occupied(entry) = shard.entry(key.to_vec()) {
            if cas != 0 && entry.get().cas != cas {
                return DeleteOutcome::Exists;
            }
            let item = entry.remove();
            self.used.fetch_sub(item.size(key), Ordering::Relaxed);
        }
        DeleteOutcome::Deleted
    }

    /// Adds `delta` to (or subtracts it from) a decimal value as memcached's `do_add_delta`:
    /// increments wrap at 2^64, decrements stop at 0, and a result no longer than the old value
    /// is written in place, padded with spaces.
    pub fn delta(&self, key: &[u8], incr: bool, delta: u64, cas: u64) -> Delta {
        let mut shard = self.shard(key);
        if !self.reap(&mut shard, key) {
            return Delta::NotFound;
        }
        let Some(item) = shard.get(key) else {
            return Delta::NotFound;
        };
        if cas != 0 && item.cas != cas {
            return Delta::Exists;
        }
        let Some(current) = parse_counter(&item.value) else {
            return Delta::NonNumeric;
        };
        let value = if incr {
            current.wrapping_add(delta)
        } else {
            current.saturating_sub(delta)
        };
        let mut text = value.to_string().into_bytes();
        if text.len() <= item.value.len() {
            text.resize(item.value.len(), b' ');
        }
        let new = Item {
            value: text.into(),
            flags: item.flags,
            exptime: item.exptime,
            cas: self.next_cas(),
            stored_ms: item.stored_ms,
        };
        if !self.charge(&shard, key, &new) {
            return Delta::NonNumeric;
        }
        let cas = new.cas;
        shard.insert(key.to_vec(), new);
        Delta::Value(value, cas)
    }

    /// Resets the expiry of `key`; false if there is no such item.
    pub fn touch(&self, key: &[u8], exptime: i64) -> bool {
        self.get(key, Some(exptime)).is_some()
    }

    /// Invalidates every item now (`delay` 0 or less) or every item stored before `delay`
    /// seconds from now, once that time comes. As for exptimes, a `delay` above 30 days is a
    /// unix time, and one already past flushes now.
    pub fn flush(&self, delay: i64) {
        let at = if delay <= 0 {
            None
        } else if delay > REALTIME_MAXDELTA {
            let relative = delay.saturating_sub(self.started_unix);
            (relative > 0).then(|| (relative as u64 + CLOCK_BASE).saturating_mul(1000))
        } else {
            Some(self.now_ms().saturating_add(delay as u64 * 1000))
        };
        if let Some(at) = at {
            if at > self.now_ms() {
                self.flush_ms.store(at, Ordering::Relaxed);
                return;
            }
        }
        self.flush_ms.store(0, Ordering::Relaxed);
        for shard in &self.shards {
            let mut shard = lock(shard);
            for (key, item) in shard.drain() {
                self.used.fetch_sub(item.size(&key), Ordering::Relaxed);
            }
        }
    }
}

/// Locks a shard; a poisoned lock still holds consistent data, as no method panics midway.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(|e| e.into_inner())
}

/// Reads a stored counter value as memcached's `safe_strtoull` does: decimal digits, then
/// only trailing spaces (which an in-place decrement leaves).
pub fn parse_counter(value: &[u8]) -> Option<u64> {
    let digits = value.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || value[digits..].iter().any(|&b| b != b' ') {
        return None;
    }
    std::str::from_utf8(&value[..digits]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store whose clock stands at a recent unix time, so that an absolute exptime can lie
    /// in the past.
    fn test_store(limit: Option<u64>) -> Store {
        Store::new(
            limit,
            Box::new(Frozen {
                unix: 1_700_000_000,
            }),
        )
    }

    #[test]
    fn cas_is_global_and_increasing() {
        let store = test_store(None);
        assert_eq!(
            store.store(Mode::Set, b"a", b"1", 0, 0, 0),
            StoreOutcome::Stored(1)
        );
        assert_eq!(
            store.store(Mode::Set, b"b", b"1", 0, 0, 0),
            StoreOutcome::Stored(2)
        );
        assert_eq!(
            store.store(Mode::Set, b"a", b"2", 0, 0, 7),
            StoreOutcome::Exists
        );
        assert_eq!(
            store.store(Mode::Set, b"a", b"2", 0, 0, 1),
            StoreOutcome::Stored(3)
        );
        assert_eq!(
            store.store(Mode::Set, b"c", b"2", 0, 0, 1),
            StoreOutcome::NotFound
        );
    }

    #[test]
    fn decrement_pads_in_place() {
        let store = test_store(None);
        store.store(Mode::Set, b"n", b"100", 0, 0, 0);
        assert!(matches!(
            store.delta(b"n", false, 95, 0),
            Delta::Value(5, _)
        ));
        assert_eq!(&*store.get(b"n", None).unwrap().value, b"5  ");
        assert!(matches!(
            store.delta(b"n", true, 1000, 0),
            Delta::Value(1005, _)
        ));
        assert_eq!(&*store.get(b"n", None).unwrap().value, b"1005");
        store.store(Mode::Set, b"x", b"1a", 0, 0, 0);
        assert_eq!(store.delta(b"x", true, 1, 0), Delta::NonNumeric);
    }

    #[test]
    fn expired_items_are_gone() {
        let store = test_store(None);
        store.store(Mode::Set, b"a", b"1", 0, -1, 0);
        assert!(store.get(b"a", None).is_none());
        assert_eq!(store.bytes(), 0);
    }

    #[test]
    fn memory_limit_refuses() {
        let store = test_store(Some(200));
        assert!(matches!(
            store.store(Mode::Set, b"a", &[b'x'; 100], 0, 0, 0),
            StoreOutcome::Stored(_)
        ));
        assert_eq!(
            store.store(Mode::Set, b"b", &[b'x'; 100], 0, 0, 0),
            StoreOutcome::NoMemory
        );
        // Replacing an item with one of the same size still fits.
        assert!(matches!(
            store.store(Mode::Set, b"a", &[b'y'; 100], 0, 0, 0),
            StoreOutcome::Stored(_)
        ));
        store.flush(0);
        assert_eq!(store.bytes(), 0);
    }

    #[test]
    fn append_checks_the_joined_size() {
        let store = test_store(None);
        let half = vec![b'x'; ITEM_SIZE_MAX / 2];
        assert!(matches!(
            store.store(Mode::Set, b"k", &half, 0, 0, 0),
            StoreOutcome::Stored(_)
        ));
        assert_eq!(
            store.store(Mode::Append, b"k", &half, 0, 0, 0),
            StoreOutcome::NotStored
        );
        assert_eq!(
            store.store(Mode::Prepend, b"k", &half, 0, 0, 0),
            StoreOutcome::NotStored
        );
        assert_eq!(store.get(b"k", None).unwrap().value.len(), half.len());
        assert!(matches!(
            store.store(Mode::Append, b"k", b"y", 0, 0, 0),
            StoreOutcome::Stored(_)
        ));
    }

    #[test]
    fn flush_delays_do_not_overflow() {
        let store = test_store(None);
        store.store(Mode::Set, b"a", b"1", 0, 0, 0);
        // A unix time far in the future: nothing is flushed yet.
        store.flush(i64::MAX);
        assert!(store.get(b"a", None).is_some());
        // The longest relative delay.
        store.flush(REALTIME_MAXDELTA);
        assert!(store.get(b"a", None).is_some());
        // A unix time already past flushes now.
        store.flush(REALTIME_MAXDELTA + 1);
        assert!(store.get(b"a", None).is_none());
        assert_eq!(store.bytes(), 0);
    }
}
