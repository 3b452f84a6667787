//! Switch rule updates under a rate limit, as SwitchKV schedules them (its rule buffer).
//!
//! A switch installs only so many forwarding rules per second. When a cache addition evicts
//! another key, installing the new rule first and deferring the old rule's deletion (up to a
//! maximum delay) lets new hot keys in at the full update rate during a burst; the deferred
//! deletions occupy a reserved "rule buffer" of about rate × max delay entries. This module
//! only orders and meters changes; applying them to a switch is the caller's job.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::Duration;

use crate::time::Instant;

/// Parameters of a [`RuleBudget`] and a [`RuleBuffer`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleConfig {
    /// Rule updates per second the switch accepts; `None` (the default) is unlimited.
    pub rate: Option<u32>,
    /// Updates that may go at once after a quiet period; `None` (the default) is one second's
    /// worth, `rate`. A caller that polls every P seconds needs at least rate × P.
    pub burst: Option<u32>,
    /// Longest a deletion waits behind additions before it goes first. Default 2 s, the
    /// setting of SwitchKV's evaluation. Zero sends every deletion ahead of any addition.
    pub max_delay: Duration,
    /// Most changes queued at once. Default 65 536.
    pub capacity: usize,
}

impl Default for RuleConfig {
    fn default() -> RuleConfig {
        RuleConfig {
            rate: None,
            burst: None,
            max_delay: Duration::from_secs(2),
            capacity: 65_536,
        }
    }
}

impl RuleConfig {
    /// Checks every field; see [`RuleConfigError`] for what is refused.
    pub fn validate(&self) -> Result<(), RuleConfigError> {
        if self.rate == Some(0) {
            return Err(RuleConfigError::ZeroRate);
        }
        if self.burst == Some(0) {
            return Err(RuleConfigError::ZeroBurst);
        }
        if self.capacity == 0 {
            return Err(RuleConfigError::ZeroCapacity);
        }
        Ok(())
    }

    /// Switch table entries to reserve for deferred deletions: rate × max delay, rounded up;
    /// `None` when the rate is unlimited (deletions then never wait for a budget).
    pub fn reserved_rules(&self) -> Option<u64> {
        let rate = u128::from(self.rate?);
        let nanos = rate * self.max_delay.as_nanos();
        Some(u64::try_from(nanos.div_ceil(NANOS_PER_SEC)).unwrap_or(u64::MAX))
    }
}

/// A [`RuleConfig`] that is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RuleConfigError {
    /// A rate of zero would never release anything; use `None` for unlimited.
    #[error("rule update rate must be at least 1 per second")]
    ZeroRate,
    /// A burst of zero would never release anything.
    #[error("rule update burst must be at least 1")]
    ZeroBurst,
    /// A buffer that can hold no change.
    #[error("rule buffer capacity must be at least 1")]
    ZeroCapacity,
}

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// A token bucket of rule updates: `rate` per second, at most `burst` saved up.
///
/// Credit is kept in integer units (one update = 10^9 units, `rate` units earned per
/// nanosecond), so the count of updates allowed over any interval is exact. The bucket
/// starts full. The default is unlimited.
#[derive(Clone, Debug, Default)]
pub struct RuleBudget {
    limit: Option<Bucket>,
}

#[derive(Clone, Debug)]
struct Bucket {
    rate: u32,
    /// Most credit held: burst × 10^9.
    cap: u128,
    credit: u128,
    /// When credit was last brought up to date.
    last: Instant,
}

impl RuleBudget {
    /// A budget that always allows an update.
    pub fn unlimited() -> RuleBudget {
        RuleBudget { limit: None }
    }

    /// `rate` updates per second with up to `burst` at once, full at `now`.
    pub fn limited(rate: u32, burst: u32, now: Instant) -> Result<RuleBudget, RuleConfigError> {
        if rate == 0 {
            return Err(RuleConfigError::ZeroRate);
        }
        if burst == 0 {
            return Err(RuleConfigError::ZeroBurst);
        }
        let cap = u128::from(burst) * NANOS_PER_SEC;
        Ok(RuleBudget {
            limit: Some(Bucket {
                rate,
                cap,
                credit: cap,
                last: now,
            }),
        })
    }

    /// The budget `cfg` describes (unlimited when `cfg.rate` is `None`), full at `now`.
    pub fn from_config(cfg: &RuleConfig, now: Instant) -> Result<RuleBudget, RuleConfigError> {
        cfg.validate()?;
        match cfg.rate {
            None => Ok(RuleBudget::unlimited()),
            Some(rate) => RuleBudget::limited(rate, cfg.burst.unwrap_or(rate), now),
        }
    }

    /// The earliest instant at which one update is allowed: `None` for an unlimited budget,
    /// which always allows one.
    pub fn ready_at(&self) -> Option<Instant> {
        let b = self.limit.as_ref()?;
        let missing = NANOS_PER_SEC.saturating_sub(b.credit);
        // Credit grows by `rate` per nanosecond.
        let wait = missing.div_ceil(u128::from(b.rate.max(1)));
        Some(b.last + Duration::from_nanos(u64::try_from(wait).unwrap_or(u64::MAX)))
    }

    /// Spends one update if the budget allows it at `now`. A `now` earlier than a previous
    /// call earns nothing.
    pub fn try_take(&mut self, now: Instant) -> bool {
        let Some(b) = &mut self.limit else {
            return true;
        };
        if now > b.last {
            let earned = (now - b.last).as_nanos().saturating_mul(u128::from(b.rate));
            b.credit = b.credit.saturating_add(earned).min(b.cap);
            b.last = now;
        }
        if b.credit >= NANOS_PER_SEC {
            b.credit -= NANOS_PER_SEC;
            true
        } else {
            false
        }
    }

    /// Updates per second, `None` when unlimited.
    pub fn rate(&self) -> Option<u32> {
        self.limit.as_ref().map(|b| b.rate)
    }
}

/// A rule change released by [`RuleBuffer::poll`], to apply to the switch in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change<K> {
    /// Install the rule for the key.
    Add(K),
    /// Delete the rule for the key.
    Remove(K),
}

/// What [`RuleBuffer::add`] or [`RuleBuffer::remove`] did with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Queued.
    Queued,
    /// It undid the key's opposite queued change: neither goes to the switch.
    Cancelled,
    /// The same change was already queued for the key; it keeps its place.
    Duplicate,
}

/// [`RuleBuffer::add`] or [`RuleBuffer::remove`] found the buffer holding `capacity` changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("rule buffer full ({capacity} changes queued)")]
pub struct BufferFull {
    pub capacity: usize,
}

/// Requested rule changes, released to the switch under a [`RuleBudget`] with additions
/// first.
///
/// [`poll`](RuleBuffer::poll) releases, while the budget lasts: deletions that have waited
/// `max_delay` or more (oldest first), then additions (first in, first out), then the other
/// deletions (first in, first out). So a deletion waits at most `max_delay` whenever the
/// budget has room for it by then. At most one change per key is queued: a removal requested
/// while the key's addition is queued cancels both, and an addition requested while its
/// removal is queued cancels the removal (the installed rule stays). The buffer does not know
/// which rules are installed; it orders what it is asked. All operations are O(1) amortised.
#[derive(Clone, Debug)]
pub struct RuleBuffer<K> {
    max_delay: Duration,
    capacity: usize,
    /// The one queued change of each key.
    pending: HashMap<K, Pending>,
    /// Additions in request order. Entries whose change was cancelled stay until they reach
    /// the front or the queue is compacted; the front entry is always live.
    adds: VecDeque<Entry<K>>,
    /// Additions asked first ([`RuleBuffer::add_first`]), in request order, kept like `adds`
    /// and released before them.
    urgent: VecDeque<Entry<K>>,
    /// Removals in request order, kept like `adds`.
    removes: VecDeque<Entry<K>>,
    live_adds: usize,
    live_removes: usize,
    next_seq: u64,
}

#[derive(Clone, Copy, Debug)]
struct Pending {
    remove: bool,
    /// An addition in the `urgent` queue.
    urgent: bool,
    /// Identifies the queue entry, so that one left behind by a cancellation is recognised.
    seq: u64,
}

#[derive(Clone, Debug)]
struct Entry<K> {
    key: K,
    seq: u64,
    since: Instant,
}

/// Dead entries tolerated in a queue beyond its live ones before it is compacted.
const SLACK: usize = 32;

impl<K: Eq + Hash + Clone> RuleBuffer<K> {
    /// An empty buffer with `cfg.max_delay` and `cfg.capacity`.
    pub fn new(cfg: &RuleConfig) -> Result<RuleBuffer<K>, RuleConfigError> {
        cfg.validate()?;
        Ok(RuleBuffer {
            max_delay: cfg.max_delay,
            capacity: cfg.capacity,
            pending: HashMap::new(),
            adds: VecDeque::new(),
            urgent: VecDeque::new(),
            removes: VecDeque::new(),
            live_adds: 0,
            live_removes: 0,
            next_seq: 0,
        })
    }

    /// Asks for `key`'s rule to be installed, at `now`.
    pub fn add(&mut self, key: K, now: Instant) -> Result<Outcome, BufferFull> {
        self.request(key, false, now)
    }

    /// Asks for `key`'s rule to be installed ahead of every addition queued by [`add`], after
    /// those asked first before it: a key found bursting must not wait behind a backlog of
    /// keys that only report load. An addition of the key already queued moves up.
    ///
    /// [`add`]: RuleBuffer::add
    pub fn add_first(&mut self, key: K, now: Instant) -> Result<Outcome, BufferFull> {
        match self.pending.get(&key) {
            Some(p) if p.remove => return self.request(key, false, now),
            Some(p) if p.urgent => return Ok(Outcome::Duplicate),
            // Queued among the others: a new entry in the urgent queue; the old one is left
            // behind, dead, and the count of additions stays.
            Some(_) => self.live_adds -= 1,
            None => self.room()?,
        }
        self.enqueue(key, false, true, now);
        self.tidy();
        Ok(Outcome::Queued)
    }

    /// Asks for `key`'s rule to be deleted, at `now`.
    pub fn remove(&mut self, key: K, now: Instant) -> Result<Outcome, BufferFull> {
        self.request(key, true, now)
    }

    /// Releases the changes `budget` allows at `now`, in the order they must be applied.
    pub fn poll(&mut self, now: Instant, budget: &mut RuleBudget) -> Vec<Change<K>> {
        let mut out = Vec::new();
        loop {
            let overdue = self
                .removes
                .front()
                .is_some_and(|e| now.saturating_duration_since(e.since) >= self.max_delay);
            let remove = overdue || (self.adds.is_empty() && self.urgent.is_empty());
            if remove && self.removes.is_empty() {
                break;
            }
            if !budget.try_take(now) {
                break;
            }
            let queue = if remove {
                &mut self.removes
            } else if !self.urgent.is_empty() {
                &mut self.urgent
            } else {
                &mut self.adds
            };
            let Some(entry) = queue.pop_front() else {
                break;
            };
            self.pending.remove(&entry.key);
            if remove {
                self.live_removes -= 1;
                out.push(Change::Remove(entry.key));
            } else {
                self.live_adds -= 1;
                out.push(Change::Add(entry.key));
            }
            self.tidy();
        }
        out
    }

    /// Queued additions.
    pub fn len_adds(&self) -> usize {
        self.live_adds
    }

    /// Queued deletions.
    pub fn len_removes(&self) -> usize {
        self.live_removes
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.live_adds + self.live_removes == 0
    }

    /// Rules kept in the switch only because their deletion is deferred: the part of the
    /// rule buffer in use. In steady state it stays within [`RuleConfig::reserved_rules`].
    pub fn occupancy(&self) -> usize {
        self.live_removes
    }

    /// How long the oldest queued deletion has waited at `now`.
    pub fn oldest_removal_age(&self, now: Instant) -> Option<Duration> {
        let e = self.removes.front()?;
        Some(now.saturating_duration_since(e.since))
    }

    /// Most changes queued at once.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Longest a deletion waits behind additions.
    pub fn max_delay(&self) -> Duration {
        self.max_delay
    }

    /// Drops every queued change.
    pub fn clear(&mut self) {
        self.pending.clear();
        self.adds.clear();
        self.urgent.clear();
        self.removes.clear();
        self.live_adds = 0;
        self.live_removes = 0;
    }

    fn request(&mut self, key: K, remove: bool, now: Instant) -> Result<Outcome, BufferFull> {
        if let Some(&p) = self.pending.get(&key) {
            if p.remove == remove {
                return Ok(Outcome::Duplicate);
            }
            self.pending.remove(&key);
            if p.remove {
                self.live_removes -= 1;
            } else {
                self.live_adds -= 1;
            }
            self.tidy();
            return Ok(Outcome::Cancelled);
        }
        self.room()?;
        self.enqueue(key, remove, false, now);
        Ok(Outcome::Queued)
    }

    /// Whether one more change fits.
    fn room(&self) -> Result<(), BufferFull> {
        if self.live_adds + self.live_removes >= self.capacity {
            return Err(BufferFull {
                capacity: self.capacity,
            });
        }
        Ok(())
    }

    /// Queues `key`'s change at the back of its queue (`urgent`: the additions asked first)
    /// and counts it live.
    fn enqueue(&mut self, key: K, remove: bool, urgent: bool, now: Instant) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.pending.insert(
            key.clone(),
            Pending {
                remove,
                urgent,
                seq,
            },
        );
        let entry = Entry {
            key,
            seq,
            since: now,
        };
        if remove {
            self.removes.push_back(entry);
            self.live_removes += 1;
        } else if urgent {
            self.urgent.push_back(entry);
            self.live_adds += 1;
        } else {
            self.adds.push_back(entry);
            self.live_adds += 1;
        }
    }

    /// Restores the queues' invariants after a change left the queue: live fronts, and no
    /// more than `SLACK` dead entries beyond the live ones.
    fn tidy(&mut self) {
        let pending = &self.pending;
        let live = |e: &Entry<K>| pending.get(&e.key).is_some_and(|p| p.seq == e.seq);
        for (queue, n) in [
            (&mut self.adds, self.live_adds),
            (&mut self.urgent, self.live_adds),
            (&mut self.removes, self.live_removes),
        ] {
            if queue.len() > 2 * n + SLACK {
                queue.retain(|e| live(e));
            }
            while queue.front().is_some_and(|e| !live(e)) {
                queue.pop_front();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn an_addition_asked_first_goes_ahead_of_the_queue() {
        let (cfg, mut b) = limited(1000, 2000 * MS);
        let now = Instant::ZERO;
        let mut budget = RuleBudget::from_config(&cfg, now).unwrap();
        for k in 1..=3 {
            assert_eq!(b.add(k, now), Ok(Outcome::Queued));
        }
        assert_eq!(b.add_first(9, now), Ok(Outcome::Queued));
        // Already queued: moved up behind 9, still one change.
        assert_eq!(b.add_first(3, now), Ok(Outcome::Queued));
        assert_eq!(b.len_adds(), 4);
        // A queued removal is cancelled as by `add`.
        assert_eq!(b.remove(7, now), Ok(Outcome::Queued));
        assert_eq!(b.add_first(7, now), Ok(Outcome::Cancelled));
        let mut out = Vec::new();
        let mut t = now;
        while out.len() < 4 {
            t += MS;
            out.extend(b.poll(t, &mut budget));
        }
        assert_eq!(
            out,
            [
                Change::Add(9),
                Change::Add(3),
                Change::Add(1),
                Change::Add(2)
            ]
        );
        assert!(b.is_empty());
    }

    fn limited(rate: u32, max_delay: Duration) -> (RuleConfig, RuleBuffer<u32>) {
        let cfg = RuleConfig {
            rate: Some(rate),
            burst: Some(1),
            max_delay,
            ..RuleConfig::default()
        };
        let buffer = RuleBuffer::new(&cfg).unwrap();
        (cfg, buffer)
    }

    #[test]
    fn token_bucket_counts_exactly() {
        let t0 = Instant::ZERO;
        let mut budget = RuleBudget::limited(400, 400, t0).unwrap();
        assert_eq!((0..1000).filter(|_| budget.try_take(t0)).count(), 400);
        assert_eq!((0..10).filter(|_| budget.try_take(t0 + 10 * MS)).count(), 4);
        assert_eq!((0..10).filter(|_| budget.try_take(t0 + 12 * MS)).count(), 0);
        assert_eq!((0..10).filter(|_| budget.try_take(t0 + 15 * MS)).count(), 2);
        // Going back in time earns nothing.
        assert!(!budget.try_take(t0));
        assert_eq!(
            (0..1000)
                .filter(|_| budget.try_take(t0 + Duration::from_secs(100)))
                .count(),
            400
        );
        let mut unlimited = RuleBudget::default();
        assert!((0..10_000).all(|_| unlimited.try_take(t0)));
        assert_eq!(unlimited.rate(), None);
    }

    #[test]
    fn unlimited_budget_releases_everything_at_once() {
        let t0 = Instant::ZERO;
        let mut buffer = RuleBuffer::new(&RuleConfig::default()).unwrap();
        let mut budget = RuleBudget::from_config(&RuleConfig::default(), t0).unwrap();
        buffer.remove(10, t0).unwrap();
        buffer.add(1, t0).unwrap();
        buffer.remove(11, t0).unwrap();
        buffer.add(2, t0).unwrap();
        assert_eq!(buffer.occupancy(), 2);
        assert_eq!(
            buffer.poll(t0, &mut budget),
            [
                Change::Add(1),
                Change::Add(2),
                Change::Remove(10),
                Change::Remove(11)
            ]
        );
        assert!(buffer.is_empty());
        assert_eq!(buffer.poll(t0, &mut budget), []);
    }

    #[test]
    fn additions_go_before_deletions() {
        let t0 = Instant::ZERO;
        let (cfg, mut buffer) = limited(10, Duration::from_secs(2));
        let mut budget = RuleBudget::from_config(&cfg, t0).unwrap();
        buffer.remove(100, t0).unwrap();
        for k in 1..=3 {
            buffer.add(k, t0).unwrap();
        }
        assert_eq!(buffer.poll(t0, &mut budget), [Change::Add(1)]);
        assert_eq!(buffer.poll(t0 + 50 * MS, &mut budget), []);
        assert_eq!(buffer.poll(t0 + 100 * MS, &mut budget), [Change::Add(2)]);
        assert_eq!(buffer.poll(t0 + 200 * MS, &mut budget), [Change::Add(3)]);
        assert_eq!(buffer.len_removes(), 1);
        assert_eq!(buffer.oldest_removal_age(t0 + 250 * MS), Some(250 * MS));
        assert_eq!(
            buffer.poll(t0 + 300 * MS, &mut budget),
            [Change::Remove(100)]
        );
        assert_eq!(buffer.oldest_removal_age(t0 + 300 * MS), None);
    }

    #[test]
    fn a_deletion_waits_at_most_max_delay() {
        let t0 = Instant::ZERO;
        let (cfg, mut buffer) = limited(10, Duration::from_secs(2));
        let mut budget = RuleBudget::from_config(&cfg, t0).unwrap();
        buffer.remove(1000, t0).unwrap();
        let mut released_at = None;
        // One addition per 100 ms takes the whole budget; the deletion only goes once it has
        // waited 2 s, ahead of the addition waiting then.
        for tick in 0..30u32 {
            let now = t0 + 100 * MS * tick;
            buffer.add(tick, now).unwrap();
            let out = buffer.poll(now, &mut budget);
            assert_eq!(out.len(), 1, "tick {tick}");
            if out[0] == Change::Remove(1000) {
                assert_eq!(released_at, None);
                released_at = Some(tick);
            }
        }
        assert_eq!(released_at, Some(20));
        assert_eq!(buffer.len_adds(), 1);
    }

    #[test]
    fn opposite_requests_cancel() {
        let t0 = Instant::ZERO;
        let mut buffer = RuleBuffer::new(&RuleConfig::default()).unwrap();
        let mut budget = RuleBudget::unlimited();
        // Add then remove: neither rule is touched.
        assert_eq!(buffer.add(1, t0), Ok(Outcome::Queued));
        assert_eq!(buffer.add(1, t0), Ok(Outcome::Duplicate));
        assert_eq!(buffer.remove(1, t0), Ok(Outcome::Cancelled));
        assert!(buffer.is_empty());
        // Remove then add: the rule stays.
        assert_eq!(buffer.remove(2, t0), Ok(Outcome::Queued));
        assert_eq!(buffer.remove(2, t0), Ok(Outcome::Duplicate));
        assert_eq!(buffer.add(2, t0), Ok(Outcome::Cancelled));
        assert!(buffer.is_empty());
        assert_eq!(buffer.poll(t0, &mut budget), []);

        // Cancellations in the middle of the queues.
        for k in [3, 4, 5] {
            buffer.add(k, t0).unwrap();
            buffer.remove(k + 10, t0).unwrap();
        }
        buffer.remove(4, t0).unwrap();
        buffer.add(13, t0).unwrap();
        assert_eq!((buffer.len_adds(), buffer.len_removes()), (2, 2));
        assert_eq!(
            buffer.poll(t0, &mut budget),
            [
                Change::Add(3),
                Change::Add(5),
                Change::Remove(14),
                Change::Remove(15)
            ]
        );
        // Once released, a key can be queued again.
        assert_eq!(buffer.remove(3, t0), Ok(Outcome::Queued));
    }

    #[test]
    fn repeated_cancellations_stay_bounded() {
        let t0 = Instant::ZERO;
        let mut buffer = RuleBuffer::new(&RuleConfig::default()).unwrap();
        buffer.add(0, t0).unwrap();
        for _ in 0..10_000 {
            buffer.add(1, t0).unwrap();
            buffer.remove(1, t0).unwrap();
        }
        assert!(buffer.adds.len() <= 2 + SLACK + 1);
        assert_eq!(
            buffer.poll(t0, &mut RuleBudget::unlimited()),
            [Change::Add(0)]
        );
        assert!(buffer.adds.is_empty());
    }

    #[test]
    fn a_full_buffer_refuses_new_changes() {
        let t0 = Instant::ZERO;
        let cfg = RuleConfig {
            capacity: 3,
            ..RuleConfig::default()
        };
        let mut buffer = RuleBuffer::new(&cfg).unwrap();
        buffer.add(1, t0).unwrap();
        buffer.add(2, t0).unwrap();
        buffer.remove(3, t0).unwrap();
        assert_eq!(buffer.add(4, t0), Err(BufferFull { capacity: 3 }));
        assert_eq!(buffer.remove(5, t0), Err(BufferFull { capacity: 3 }));
        // Cancelling and repeating need no room.
        assert_eq!(buffer.add(1, t0), Ok(Outcome::Duplicate));
        assert_eq!(buffer.add(3, t0), Ok(Outcome::Cancelled));
        assert_eq!(buffer.add(4, t0), Ok(Outcome::Queued));
    }

    #[test]
    fn deferred_deletions_fit_the_reserved_buffer() {
        let t0 = Instant::ZERO;
        let (cfg, mut buffer) = limited(100, Duration::from_secs(2));
        let reserved = cfg.reserved_rules().unwrap();
        assert_eq!(reserved, 200);
        let mut budget = RuleBudget::from_config(&cfg, t0).unwrap();
        let mut next = 0u32;
        let mut queued_at = HashMap::new();
        let (mut peak, mut add_wait, mut remove_wait) = (0, Duration::ZERO, Duration::ZERO);
        // 20 s in 10 ms steps: a burst of 150 cache replacements (an addition and a deletion
        // each) every 5 s over a background of 10 replacements per second, 80 updates per
        // second on average against a rate of 100.
        for tick in 0..2000u32 {
            let now = t0 + 10 * MS * tick;
            let replacements = match tick {
                t if t % 500 == 0 => 150,
                t if t % 10 == 0 => 1,
                _ => 0,
            };
            for _ in 0..replacements {
                buffer.add(next, now).unwrap();
                buffer.remove(u32::MAX - next, now).unwrap();
                queued_at.insert(next, now);
                queued_at.insert(u32::MAX - next, now);
                next += 1;
            }
            for change in buffer.poll(now, &mut budget) {
                let (key, wait) = match change {
                    Change::Add(k) => (k, &mut add_wait),
                    Change::Remove(k) => (k, &mut remove_wait),
                };
                *wait = (*wait).max(now - queued_at[&key]);
            }
            peak = peak.max(buffer.occupancy());
        }
        assert!(buffer.is_empty());
        assert!(peak as u64 <= reserved, "peak {peak} above {reserved}");
        // A burst's additions go at the full rate: 150 in 1.5 s, not the 3 s that
        // interleaving their deletions would take.
        assert_eq!(add_wait, 1490 * MS);
        // Deletions then wait for the budget: the burst's additions, then their own turn.
        assert!(remove_wait > Duration::from_secs(2), "{remove_wait:?}");
        assert!(remove_wait < Duration::from_secs(4), "{remove_wait:?}");
    }

    #[test]
    fn config_validation_and_reserve() {
        assert_eq!(RuleConfig::default().validate(), Ok(()));
        assert_eq!(RuleConfig::default().reserved_rules(), None);
        let paper = RuleConfig {
            rate: Some(2000),
            max_delay: Duration::from_secs(1),
            ..RuleConfig::default()
        };
        assert_eq!(paper.reserved_rules(), Some(2000));
        for (cfg, err) in [
            (
                RuleConfig {
                    rate: Some(0),
                    ..RuleConfig::default()
                },
                RuleConfigError::ZeroRate,
            ),
            (
                RuleConfig {
                    burst: Some(0),
                    ..RuleConfig::default()
                },
                RuleConfigError::ZeroBurst,
            ),
            (
                RuleConfig {
                    capacity: 0,
                    ..RuleConfig::default()
                },
                RuleConfigError::ZeroCapacity,
            ),
        ] {
            assert_eq!(cfg.validate(), Err(err));
            assert_eq!(RuleBuffer::<u32>::new(&cfg).unwrap_err(), err);
            assert_eq!(
                RuleBudget::from_config(&cfg, Instant::ZERO).unwrap_err(),
                err
            );
        }
        assert_eq!(
            RuleBudget::limited(0, 1, Instant::ZERO).unwrap_err(),
            RuleConfigError::ZeroRate
        );
    }
}
