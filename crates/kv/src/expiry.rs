//! What writes said of their items' expiry, so that a cache never serves an item past the time
//! memcached drops it. Pure: the time comes from the caller, and the record is bounded.

use std::collections::HashMap;
use std::time::Duration;

use crate::Instant;

/// What a write says of its item's expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteExpiry {
    /// It leaves the expiry as it was.
    Unchanged,
    /// The item expires `after` from now (`None`: never; [`UNKNOWN_EXPIRY`] or more: at a time
    /// a cache cannot place). `definite`: the write sets the expiry whenever it stores;
    /// otherwise it may store nothing and leave the old one.
    Sets {
        after: Option<Duration>,
        definite: bool,
    },
}

/// An expiry a cache cannot place in time (an absolute Unix time): the item is served from no
/// cache until a write gives it one it can.
pub const UNKNOWN_EXPIRY: Duration = Duration::from_secs(60 * 60 * 24 * 30);

/// Most keys whose expiry is remembered at once.
pub const MAX_EXPIRIES: usize = 65_536;

/// memcached's clock moves in whole seconds, so an item may expire up to a second before the
/// exptime it was given: it is served no later than this before.
const CLOCK_STEP: Duration = Duration::from_secs(1);

/// Per key written with an expiry, until when a value may be served and until when the key
/// is remembered.
#[derive(Debug, Default)]
pub struct Expiries {
    /// Until when a filled value may be served, and until when the record is kept (past the
    /// first and until the second the key fills nothing: a write that may or may not have
    /// stored left its expiry uncertain).
    records: HashMap<Box<[u8]>, (Instant, Instant)>,
    /// While `records` was full: until then a key without a record fills nothing.
    overflow: Option<Instant>,
}

/// A value that may not be filled: its item has expired in memcached by now, or may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expired;

impl Expiries {
    /// Takes in what a write to `key` forwarded at `now` says of its item's expiry. A write
    /// whose expiry is uncertain (an `add` that may not store) keeps the earlier of the two
    /// times for serving and the later for refusing fills. Bounded by [`MAX_EXPIRIES`]: when
    /// full, every key without a record fills nothing until the latest expiry not noted.
    pub fn note(&mut self, key: &[u8], expiry: WriteExpiry, now: Instant) {
        let WriteExpiry::Sets { after, definite } = expiry else {
            return;
        };
        let Some(after) = after else {
            if definite {
                self.records.remove(key);
            } else if let Some((_, keep)) = self.records.get_mut(key) {
                *keep = (*keep).max(now + UNKNOWN_EXPIRY);
            }
            return;
        };
        let (cap, keep) = if after >= UNKNOWN_EXPIRY {
            (now, now + UNKNOWN_EXPIRY)
        } else {
            let at = now + after.saturating_sub(CLOCK_STEP);
            (at, at)
        };
        if let Some(record) = self.records.get_mut(key) {
            *record = match definite {
                true => (cap, keep),
                false => (record.0.min(cap), record.1.max(keep)),
            };
            return;
        }
        if self.records.len() >= MAX_EXPIRIES {
            self.records.retain(|_, (_, keep)| *keep > now);
        }
        if self.records.len() >= MAX_EXPIRIES {
            self.overflow = Some(self.overflow.map_or(keep, |t| t.max(keep)));
            return;
        }
        self.records.insert(key.into(), (cap, keep));
    }

    /// Until when a value of `key` filled at `now` may be served (`None`: no expiry known);
    /// [`Expired`] when it may not be filled at all.
    pub fn cap(&self, key: &[u8], now: Instant) -> Result<Option<Instant>, Expired> {
        match self.records.get(key) {
            Some(&(cap, _)) if cap <= now => Err(Expired),
            Some(&(cap, _)) => Ok(Some(cap)),
            None if self.overflow.is_some_and(|t| t > now) => Err(Expired),
            None => Ok(None),
        }
    }

    /// Keys remembered.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sets(secs: u64, definite: bool) -> WriteExpiry {
        WriteExpiry::Sets {
            after: Some(Duration::from_secs(secs)),
            definite,
        }
    }

    #[test]
    fn a_full_record_refuses_fills_of_unrecorded_keys_until_their_expiry() {
        let now = Instant::from_secs(100);
        let mut e = Expiries::default();
        for i in 0..MAX_EXPIRIES {
            e.note(format!("k{i}").as_bytes(), sets(10, true), now);
        }
        assert_eq!(e.cap(b"other", now), Ok(None));
        e.note(b"late", sets(20, true), now);
        assert_eq!(e.cap(b"late", now), Err(Expired));
        assert_eq!(e.cap(b"other", now), Err(Expired));
        // Once the late key's expiry passed, the overflow is over; the full record is pruned
        // at the next note.
        let after = now + Duration::from_secs(20);
        assert_eq!(e.cap(b"other", after), Ok(None));
        e.note(b"new", sets(5, true), after);
        assert_eq!(e.len(), 1);
        assert_eq!(
            e.cap(b"new", after),
            Ok(Some(after + Duration::from_secs(4)))
        );
    }
}
