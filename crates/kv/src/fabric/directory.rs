//! The directory a key's home keeps (IncBricks 4.3): for each key, the switches that may hold
//! a copy, and the write in progress with the invalidations it still waits for. Writes to one
//! key are taken one at a time, in arrival order: a write is sent on to the server only when
//! every sharer has acknowledged its invalidation, and the next opens only once the server's
//! reply to it has passed. Unacknowledged invalidations are sent again every `retry`; a write
//! whose invalidations are not all acknowledged within `give_up` is failed, never applied.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use super::{epoch_before, SwitchId};
use crate::Instant;

/// The counter value a read was stamped with when the home sent it on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadStamp(pub u32);

/// What the home does next for a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteStep<W> {
    /// Another write to the key is in progress; this one waits its turn.
    Queued,
    /// Send an invalidation at `epoch` to each of `targets` and wait for their ACKs.
    Invalidate { epoch: u32, targets: Vec<SwitchId> },
    /// Nothing is cached elsewhere any more: send the write on to the server.
    Forward(W),
    /// Its invalidations were not all acknowledged in time: answer its client with an
    /// error; the write is not applied.
    Failed(W),
    /// Too many writes to the key wait already: answer its client with an error; the write
    /// is not applied.
    Refused(W),
}

/// Writes waiting behind a key's open write, at most; more are refused.
pub const MAX_QUEUED: usize = 64;

/// Work the home's clock brought.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Due<W> {
    /// Send the invalidation at `epoch` to `target` again.
    Retransmit {
        key: Vec<u8>,
        epoch: u32,
        target: SwitchId,
    },
    /// A write moved on (failed, or the next one opened).
    Step { key: Vec<u8>, step: WriteStep<W> },
}

/// Counters for the operator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirectoryStats {
    pub fills_allowed: u64,
    /// Replies that may not fill: a write to their key opened after their read.
    pub fills_refused_write: u64,
    /// Replies that may not fill: the directory was full.
    pub fills_refused_full: u64,
    pub writes: u64,
    pub writes_queued: u64,
    pub invalidations: u64,
    pub retransmits: u64,
    pub acks: u64,
    /// ACKs for no write in progress (late or repeated).
    pub acks_stale: u64,
    pub writes_failed: u64,
    /// Writes closed without the server's reply having passed.
    pub writes_timed_out: u64,
    /// Writes refused as [`MAX_QUEUED`] waited on their key already.
    pub writes_refused: u64,
}

#[derive(Debug)]
struct Open<W> {
    epoch: u32,
    /// Sharers yet to acknowledge, with when to ask again.
    waiting: BTreeMap<SwitchId, Instant>,
    /// Every sharer the write's invalidations went to.
    invalidated: Vec<SwitchId>,
    opened: Instant,
    /// The write, until it is sent on; then when it was.
    write: Option<W>,
    sent: Option<Instant>,
}

impl<W> Open<W> {
    /// When the write next has something due: an invalidation to send again, its give-up, or
    /// the end of its wait for the server's reply.
    fn next_due(&self, give_up: Duration, reply_timeout: Duration) -> Instant {
        match self.sent {
            None => {
                let fails = self.opened + give_up;
                self.waiting
                    .values()
                    .copied()
                    .min()
                    .map_or(fails, |r| r.min(fails))
            }
            Some(sent) => sent + reply_timeout,
        }
    }
}

#[derive(Debug)]
struct KeyState<W> {
    /// The epoch of the key's last change (a write opening or closing).
    changed: u32,
    sharers: BTreeSet<SwitchId>,
    open: Option<Open<W>>,
    queue: VecDeque<W>,
    /// A write closed without its server's reply may still be applied late: no reply
    /// fills until then.
    no_fill_until: Option<Instant>,
}

/// A home's directory.
#[derive(Debug)]
pub struct Directory<W> {
    counter: u32,
    /// The latest change among keys no longer held: a key not held changed no later.
    floor: u32,
    keys: HashMap<Vec<u8>, KeyState<W>>,
    /// When keys with a write open have something due, earliest first: what `tick` and
    /// `poll_at` look at, so their cost follows the writes due, not the writes open or the
    /// keys held. An entry may be early (an ACK or a close since made it so), never late:
    /// every open write has one at or before its next due time.
    due: BTreeSet<(Instant, Vec<u8>)>,
    /// Most keys with sharers; past it, replies do not fill.
    capacity: usize,
    retry: Duration,
    give_up: Duration,
    /// How long a write sent on waits for the server's reply before its key moves on.
    reply_timeout: Duration,
    /// How long after such a write no reply fills (the caches' lease).
    quarantine: Duration,
    stats: DirectoryStats,
}

impl<W> Directory<W> {
    /// A directory of at most `capacity` keys with sharers. Invalidations are sent again every
    /// `retry` and a write fails `give_up` after it opened; a write sent on whose reply does
    /// not come within `reply_timeout` lets the key's next write go, and no reply fills the
    /// key for `quarantine` after (the write may still be applied late).
    pub fn new(
        capacity: usize,
        retry: Duration,
        give_up: Duration,
        reply_timeout: Duration,
        quarantine: Duration,
    ) -> Directory<W> {
        Directory {
            counter: 0,
            floor: 0,
            keys: HashMap::new(),
            due: BTreeSet::new(),
            capacity,
            retry,
            give_up,
            reply_timeout,
            quarantine,
            stats: DirectoryStats::default(),
        }
    }

    pub fn stats(&self) -> DirectoryStats {
        self.stats
    }

    /// Keys held (with sharers or writes).
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The switches that may hold `key`.
    pub fn sharers(&self, key: &[u8]) -> Vec<SwitchId> {
        self.keys
            .get(key)
            .map(|k| k.sharers.iter().copied().collect())
            .unwrap_or_default()
    }

    /// The switches the open write on `key` invalidated (none when no write is open): under
    /// write-update, once the write is done, its home sends them the new value.
    pub fn invalidated(&self, key: &[u8]) -> Vec<SwitchId> {
        self.keys
            .get(key)
            .and_then(|k| k.open.as_ref())
            .map(|o| o.invalidated.clone())
            .unwrap_or_default()
    }

    /// Whether a write to `key` is in progress.
    pub fn write_open(&self, key: &[u8]) -> bool {
        self.keys.get(key).is_some_and(|k| k.open.is_some())
    }

    /// Whether `key` has not changed since `epoch` (a copy filled then still holds its value)
    /// and no write to it is open or waiting.
    pub fn unchanged_since(&self, key: &[u8], epoch: u32) -> bool {
        match self.keys.get(key) {
            Some(k) => k.open.is_none() && k.queue.is_empty() && !epoch_before(epoch, k.changed),
            None => !epoch_before(epoch, self.floor),
        }
    }

    /// Stamps a read the home sends on to the server.
    pub fn read(&self) -> ReadStamp {
        ReadStamp(self.counter)
    }

    /// Whether the reply to a read stamped `stamp` may fill the caches of `sharers`: yes when
    /// no write to `key` is in progress or opened after the stamp, and the directory has room
    /// to remember them. Then they are recorded, and the epoch the fill is valid for returned.
    pub fn fill(
        &mut self,
        key: &[u8],
        stamp: ReadStamp,
        sharers: impl IntoIterator<Item = SwitchId>,
        now: Instant,
    ) -> Option<u32> {
        let state = self.keys.get(key);
        let changed = state.map_or(self.floor, |k| k.changed);
        let open = state.is_some_and(|k| k.open.is_some());
        let quarantined = state
            .and_then(|k| k.no_fill_until)
            .is_some_and(|until| now < until);
        if open || quarantined || epoch_before(stamp.0, changed) {
            self.stats.fills_refused_write += 1;
            return None;
        }
        let sharers: Vec<SwitchId> = sharers.into_iter().collect();
        if sharers.is_empty() {
            // Only the home's own copy: nothing to remember.
            self.stats.fills_allowed += 1;
            return Some(stamp.0);
        }
        if !self.keys.contains_key(key) && self.keys.len() >= self.capacity {
            self.stats.fills_refused_full += 1;
            return None;
        }
        self.entry(key).sharers.extend(sharers);
        self.stats.fills_allowed += 1;
        Some(stamp.0)
    }

    /// A write to `key` arrived at the home.
    pub fn write(&mut self, key: &[u8], write: W, now: Instant) -> WriteStep<W> {
        self.stats.writes += 1;
        let state = self.entry(key);
        if state.open.is_some() {
            if state.queue.len() >= MAX_QUEUED {
                self.stats.writes_refused += 1;
                return WriteStep::Refused(write);
            }
            state.queue.push_back(write);
            self.stats.writes_queued += 1;
            return WriteStep::Queued;
        }
        self.open(key, write, now)
    }

    /// The key's state, made (changed no later than any key forgotten) if it has none.
    fn entry(&mut self, key: &[u8]) -> &mut KeyState<W> {
        let floor = self.floor;
        self.keys.entry(key.to_vec()).or_insert_with(|| KeyState {
            changed: floor,
            sharers: BTreeSet::new(),
            open: None,
            queue: VecDeque::new(),
            no_fill_until: None,
        })
    }

    /// Opens `write` on `key`, which has none open.
    fn open(&mut self, key: &[u8], write: W, now: Instant) -> WriteStep<W> {
        self.counter = self.counter.wrapping_add(1);
        let epoch = self.counter;
        let retry_at = now + self.retry;
        let state = self.keys.get_mut(key).expect("the key's state exists");
        state.changed = epoch;
        let targets: Vec<SwitchId> = std::mem::take(&mut state.sharers).into_iter().collect();
        if targets.is_empty() {
            state.open = Some(Open {
                epoch,
                waiting: BTreeMap::new(),
                invalidated: Vec::new(),
                opened: now,
                write: None,
                sent: Some(now),
            });
            self.due.insert((now + self.reply_timeout, key.to_vec()));
            return WriteStep::Forward(write);
        }
        self.stats.invalidations += targets.len() as u64;
        state.open = Some(Open {
            epoch,
            waiting: targets.iter().map(|&t| (t, retry_at)).collect(),
            invalidated: targets.clone(),
            opened: now,
            write: Some(write),
            sent: None,
        });
        let due = retry_at.min(now + self.give_up);
        self.due.insert((due, key.to_vec()));
        WriteStep::Invalidate { epoch, targets }
    }

    /// `from` acknowledged the invalidation of `key` at `epoch`. The write, when that was
    /// the last ACK it waited for.
    pub fn ack(&mut self, key: &[u8], epoch: u32, from: SwitchId, now: Instant) -> Option<W> {
        let open = self
            .keys
            .get_mut(key)
            .and_then(|k| k.open.as_mut())
            .filter(|o| o.epoch == epoch && o.waiting.contains_key(&from));
        let Some(open) = open else {
            self.stats.acks_stale += 1;
            return None;
        };
        self.stats.acks += 1;
        open.waiting.remove(&from);
        if open.waiting.is_empty() && open.sent.is_none() {
            open.sent = Some(now);
            let write = open.write.take();
            // Sent on: due when its reply is late, which may be before the retry it was due at.
            self.due.insert((now + self.reply_timeout, key.to_vec()));
            return write;
        }
        None
    }

    /// The server's reply to the write in progress on `key` passed: the key's next write, if
    /// one waits, opens.
    pub fn done(&mut self, key: &[u8], now: Instant) -> Option<WriteStep<W>> {
        let sent = self
            .keys
            .get(key)
            .and_then(|k| k.open.as_ref())
            .is_some_and(|o| o.sent.is_some());
        if !sent {
            return None;
        }
        self.close(key, now)
    }

    /// Closes the key's write and opens the next.
    fn close(&mut self, key: &[u8], now: Instant) -> Option<WriteStep<W>> {
        self.counter = self.counter.wrapping_add(1);
        let epoch = self.counter;
        let state = self.keys.get_mut(key)?;
        state.open = None;
        state.changed = epoch;
        if let Some(next) = state.queue.pop_front() {
            return Some(self.open(key, next, now));
        }
        let quarantined = state.no_fill_until.is_some_and(|until| now < until);
        if state.sharers.is_empty() && !quarantined {
            self.keys.remove(key);
            if epoch_before(self.floor, epoch) {
                self.floor = epoch;
            }
        }
        None
    }

    /// Retransmissions due, writes given up and writes whose reply never came.
    pub fn tick(&mut self, now: Instant) -> Vec<Due<W>> {
        let mut due = Vec::new();
        let mut failed = Vec::new();
        let mut timed_out = Vec::new();
        // The keys due by now, in key order.
        let mut keys = BTreeSet::new();
        while let Some(first) = self.due.first() {
            if first.0 > now {
                break;
            }
            if let Some((_, key)) = self.due.pop_first() {
                keys.insert(key);
            }
        }
        for key in &keys {
            let Some(open) = self.keys.get_mut(key).and_then(|s| s.open.as_mut()) else {
                continue;
            };
            match open.sent {
                None if now >= open.opened + self.give_up => failed.push(key.clone()),
                None => {
                    for (&target, at) in &mut open.waiting {
                        if now >= *at {
                            *at = now + self.retry;
                            self.stats.retransmits += 1;
                            due.push(Due::Retransmit {
                                key: key.clone(),
                                epoch: open.epoch,
                                target,
                            });
                        }
                    }
                }
                Some(sent) if now >= sent + self.reply_timeout => timed_out.push(key.clone()),
                Some(_) => {}
            }
        }
        for key in failed {
            let state = self.keys.get_mut(&key).expect("listed above");
            let open = state.open.as_mut().expect("listed above");
            // Sharers that did not answer may still hold the key.
            let missing: Vec<SwitchId> = open.waiting.keys().copied().collect();
            state.sharers.extend(missing);
            let write = open.write.take().expect("not sent");
            open.sent = Some(now);
            self.stats.writes_failed += 1;
            due.push(Due::Step {
                key: key.clone(),
                step: WriteStep::Failed(write),
            });
            if let Some(step) = self.close(&key, now) {
                due.push(Due::Step { key, step });
            }
        }
        for key in timed_out {
            self.stats.writes_timed_out += 1;
            if let Some(state) = self.keys.get_mut(&key) {
                state.no_fill_until = Some(now + self.quarantine);
            }
            if let Some(step) = self.close(&key, now) {
                due.push(Due::Step { key, step });
            }
        }
        // Each key looked at is due again when its write (the same, or the next opened)
        // next has something due.
        for key in keys {
            if let Some(open) = self.keys.get(&key).and_then(|s| s.open.as_ref()) {
                let at = open.next_due(self.give_up, self.reply_timeout);
                self.due.insert((at, key));
            }
        }
        due
    }

    /// When [`Directory::tick`] next has work.
    ///
    /// It may be early (a write that was due then has since moved on): a tick then finds
    /// nothing to do but to look again later.
    pub fn poll_at(&self) -> Option<Instant> {
        self.due.first().map(|&(at, _)| at)
    }

    /// A controller declared `id` failed: its copies are gone. It leaves every sharer list,
    /// and writes that waited only for it go on, returned in key order.
    pub fn switch_failed(&mut self, id: SwitchId, now: Instant) -> Vec<(Vec<u8>, W)> {
        let mut ready = Vec::new();
        for (key, state) in &mut self.keys {
            state.sharers.remove(&id);
            if let Some(open) = &mut state.open {
                // Counted out: no longer one of the write's to update either.
                open.invalidated.retain(|&s| s != id);
                if open.waiting.remove(&id).is_some() && open.waiting.is_empty() {
                    if let Some(w) = open.write.take() {
                        open.sent = Some(now);
                        ready.push((key.clone(), w));
                    }
                }
            }
        }
        // The same order every run, whatever the map's.
        ready.sort_by(|a, b| a.0.cmp(&b.0));
        for (key, _) in &ready {
            self.due.insert((now + self.reply_timeout, key.clone()));
        }
        ready
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn dir() -> Directory<&'static str> {
        Directory::new(4, 10 * MS, 100 * MS, 50 * MS, 30 * MS)
    }

    fn at(ms: u64) -> Instant {
        Instant::from_millis(ms)
    }

    #[test]
    fn a_write_waits_for_every_sharer_then_goes_on() {
        let mut d = dir();
        let stamp = d.read();
        assert_eq!(d.fill(b"k", stamp, [1, 5], at(0)), Some(stamp.0));
        let step = d.write(b"k", "w1", at(0));
        let WriteStep::Invalidate { epoch, targets } = step else {
            panic!("{step:?}")
        };
        assert_eq!(targets, vec![1, 5]);
        assert_eq!(d.ack(b"k", epoch, 1, at(1)), None);
        // A repeated ACK changes nothing.
        assert_eq!(d.ack(b"k", epoch, 1, at(1)), None);
        assert_eq!(d.ack(b"k", epoch, 5, at(2)), Some("w1"));
        assert!(d.write_open(b"k"));
        assert_eq!(d.done(b"k", at(3)), None);
        assert!(d.is_empty(), "nothing left to remember");
    }

    #[test]
    fn the_switches_a_write_invalidated_may_take_its_value_once_it_is_done_and_not_before() {
        let mut d = dir();
        let stamp = d.read();
        assert_eq!(d.fill(b"k", stamp, [1, 5], at(0)), Some(stamp.0));
        let WriteStep::Invalidate { epoch, .. } = d.write(b"k", "w1", at(0)) else {
            panic!("sharers to invalidate")
        };
        assert_eq!(d.invalidated(b"k"), vec![1, 5]);
        // While the write is open, nothing fills, whatever it is stamped.
        assert_eq!(d.fill(b"k", d.read(), [1], at(1)), None);
        d.ack(b"k", epoch, 1, at(1));
        assert_eq!(d.ack(b"k", epoch, 5, at(1)), Some("w1"));
        assert_eq!(
            d.invalidated(b"k"),
            vec![1, 5],
            "kept until the write is done"
        );
        assert_eq!(d.done(b"k", at(2)), None);
        assert!(d.invalidated(b"k").is_empty());
        // Done: a fill stamped after the close is allowed, and the sharers are back, so the
        // next write invalidates them again; a fill stamped before the write is refused.
        assert_eq!(d.fill(b"k", stamp, [1], at(3)), None);
        let after = d.read();
        assert_eq!(d.fill(b"k", after, [1, 5], at(3)), Some(after.0));
        assert_eq!(d.sharers(b"k"), vec![1, 5]);
        let WriteStep::Invalidate { epoch, targets } = d.write(b"k", "w2", at(4)) else {
            panic!("the refilled sharers to invalidate")
        };
        assert_eq!(targets, vec![1, 5]);
        // A switch counted out while the write waits for it is no longer one to update.
        d.ack(b"k", epoch, 1, at(5));
        assert_eq!(d.switch_failed(5, at(6)), vec![(b"k".to_vec(), "w2")]);
        assert_eq!(d.invalidated(b"k"), vec![1]);
    }

    #[test]
    fn a_tick_looks_only_at_the_writes_due_and_an_early_wake_finds_nothing() {
        let mut d = Directory::new(4096, 10 * MS, 100 * MS, 50 * MS, 30 * MS);
        // A thousand writes waiting for a sharer that never answers, and one that is sent on.
        for i in 0..1000u32 {
            let key = i.to_be_bytes();
            let stamp = d.read();
            d.fill(&key, stamp, [7], at(0));
            assert!(matches!(
                d.write(&key, "w", at(0)),
                WriteStep::Invalidate { .. }
            ));
        }
        let stamp = d.read();
        d.fill(b"acked", stamp, [1], at(0));
        let WriteStep::Invalidate { epoch, .. } = d.write(b"acked", "w", at(5)) else {
            panic!("a sharer to invalidate")
        };
        assert_eq!(d.ack(b"acked", epoch, 1, at(6)), Some("w"));
        // Every waiting write is due again at 10 ms, each once.
        assert_eq!(d.poll_at(), Some(at(10)));
        assert_eq!(d.tick(at(10)).len(), 1000);
        // The acknowledged write was due to be asked again at 15 ms; nothing is due then but
        // the wait for its server's reply, which ends at 56 ms.
        assert_eq!(d.poll_at(), Some(at(15)));
        assert!(d.tick(at(15)).is_empty());
        assert_eq!(d.poll_at(), Some(at(20)));
        assert_eq!(d.tick(at(20)).len(), 1000);
        // Answered in time: the write closes, and its key is not due at 56 ms.
        assert_eq!(d.done(b"acked", at(21)), None);
        let due = d.tick(at(56));
        assert_eq!(due.len(), 1000);
        assert!(due.iter().all(|d| matches!(d, Due::Retransmit { .. })));
        assert_eq!(d.stats().writes_timed_out, 0);
    }

    /// After every step of a random run, `poll_at` is at or before the earliest time any open
    /// write has something due (an early wake is allowed, a late one never).
    #[test]
    fn poll_at_is_never_later_than_the_first_write_due() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        // A retry longer than the reply timeout, so that an ACK makes a write due sooner.
        for (retry, reply) in [(100 * MS, 10 * MS), (10 * MS, 50 * MS)] {
            let mut d: Directory<u32> = Directory::new(64, retry, 300 * MS, reply, 30 * MS);
            let mut epochs: HashMap<Vec<u8>, u32> = HashMap::new();
            let mut now = at(0);
            for step in 0..20_000u32 {
                now += Duration::from_micros(next(3_000));
                let key = vec![b'k', next(8) as u8];
                match next(7) {
                    0 | 1 => {
                        let stamp = d.read();
                        d.fill(&key, stamp, [next(4) as SwitchId + 1], now);
                    }
                    2 => {
                        if let WriteStep::Invalidate { epoch, .. } = d.write(&key, step, now) {
                            epochs.insert(key, epoch);
                        }
                    }
                    3 => {
                        if let Some(&epoch) = epochs.get(&key) {
                            d.ack(&key, epoch, next(4) as SwitchId + 1, now);
                        }
                    }
                    4 => {
                        d.done(&key, now);
                    }
                    5 => {
                        d.switch_failed(next(4) as SwitchId + 1, now);
                    }
                    _ => {
                        d.tick(now);
                    }
                }
                let first_due = d
                    .keys
                    .values()
                    .filter_map(|k| k.open.as_ref())
                    .map(|o| o.next_due(d.give_up, d.reply_timeout))
                    .min();
                if let Some(due) = first_due {
                    let poll = d.poll_at().expect("a write is open");
                    assert!(poll <= due, "step {step}: poll_at {poll:?} after {due:?}");
                }
            }
        }
    }

    #[test]
    fn writes_to_one_key_go_one_at_a_time() {
        let mut d = dir();
        assert_eq!(d.write(b"k", "w1", at(0)), WriteStep::Forward("w1"));
        assert_eq!(d.write(b"k", "w2", at(0)), WriteStep::Queued);
        assert_eq!(d.write(b"other", "w3", at(0)), WriteStep::Forward("w3"));
        assert_eq!(d.done(b"k", at(1)), Some(WriteStep::Forward("w2")));
        assert_eq!(d.done(b"k", at(2)), None);
    }

    #[test]
    fn a_reply_read_before_a_write_opened_does_not_fill() {
        let mut d = dir();
        let before = d.read();
        assert!(matches!(d.write(b"k", "w", at(0)), WriteStep::Forward(_)));
        // While the write is open, and after it closed, the older read may not fill.
        assert_eq!(d.fill(b"k", before, [1], at(0)), None);
        d.done(b"k", at(1));
        assert_eq!(d.fill(b"k", before, [1], at(0)), None);
        // A read after the write may.
        let after = d.read();
        assert_eq!(d.fill(b"k", after, [1], at(0)), Some(after.0));
        assert_eq!(d.stats().fills_refused_write, 2);
    }

    #[test]
    fn a_forgotten_key_still_refuses_old_reads() {
        let mut d = dir();
        let old = d.read();
        d.write(b"k", "w", at(0));
        d.done(b"k", at(1));
        assert!(d.is_empty());
        assert_eq!(d.fill(b"k", old, [1], at(0)), None);
    }

    #[test]
    fn unacknowledged_invalidations_are_sent_again_then_the_write_fails() {
        let mut d = dir();
        let s = d.read();
        d.fill(b"k", s, [3], at(0));
        let WriteStep::Invalidate { epoch, .. } = d.write(b"k", "w", at(0)) else {
            panic!()
        };
        assert_eq!(d.poll_at(), Some(at(10)));
        assert!(d.tick(at(5)).is_empty());
        assert_eq!(
            d.tick(at(10)),
            vec![Due::Retransmit {
                key: b"k".to_vec(),
                epoch,
                target: 3
            }]
        );
        assert!(d.tick(at(15)).is_empty());
        assert_eq!(d.tick(at(20)).len(), 1);
        let due = d.tick(at(100));
        assert_eq!(
            due,
            vec![Due::Step {
                key: b"k".to_vec(),
                step: WriteStep::Failed("w")
            }]
        );
        // The silent sharer is still counted as holding the key.
        assert_eq!(d.sharers(b"k"), vec![3]);
        assert_eq!(d.stats().writes_failed, 1);
    }

    #[test]
    fn a_failed_switch_leaves_the_lists_and_releases_writes() {
        let mut d = dir();
        let s = d.read();
        d.fill(b"k", s, [3, 4], at(0));
        let WriteStep::Invalidate { epoch, .. } = d.write(b"k", "w", at(0)) else {
            panic!()
        };
        assert_eq!(d.ack(b"k", epoch, 3, at(1)), None);
        assert_eq!(d.switch_failed(4, at(2)), vec![(b"k".to_vec(), "w")]);
        assert_eq!(d.done(b"k", at(3)), None);
        assert!(d.sharers(b"k").is_empty());
    }

    #[test]
    fn writes_a_failed_switch_held_go_on_in_key_order() {
        let mut d = Directory::new(128, 10 * MS, 100 * MS, 50 * MS, 30 * MS);
        let keys: Vec<Vec<u8>> = (0..64u32)
            .rev()
            .map(|i| format!("k{i:02}").into_bytes())
            .collect();
        for key in &keys {
            let s = d.read();
            d.fill(key, s, [4], at(0));
            assert!(matches!(
                d.write(key, "w", at(0)),
                WriteStep::Invalidate { .. }
            ));
        }
        let released: Vec<Vec<u8>> = d
            .switch_failed(4, at(1))
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(released, sorted);
    }

    #[test]
    fn a_write_whose_reply_never_comes_lets_the_next_go() {
        let mut d = dir();
        d.write(b"k", "w1", at(0));
        d.write(b"k", "w2", at(0));
        assert_eq!(d.poll_at(), Some(at(50)));
        let due = d.tick(at(50));
        assert_eq!(
            due,
            vec![Due::Step {
                key: b"k".to_vec(),
                step: WriteStep::Forward("w2")
            }]
        );
        assert_eq!(d.stats().writes_timed_out, 1);
    }

    #[test]
    fn after_a_write_whose_reply_never_came_nothing_fills_for_a_while() {
        let mut d = dir();
        d.write(b"k", "w", at(0));
        d.tick(at(50));
        let s = d.read();
        assert_eq!(
            d.fill(b"k", s, [1], at(60)),
            None,
            "the write may land late"
        );
        assert_eq!(d.fill(b"k", s, [1], at(80)), Some(s.0));
    }

    #[test]
    fn writes_past_the_queue_bound_are_refused_and_fills_of_the_home_alone_leave_nothing() {
        let mut d = dir();
        assert!(matches!(
            d.write(b"k", "first", at(0)),
            WriteStep::Forward(_)
        ));
        for _ in 0..MAX_QUEUED {
            assert_eq!(d.write(b"k", "w", at(0)), WriteStep::Queued);
        }
        assert_eq!(d.write(b"k", "more", at(0)), WriteStep::Refused("more"));
        assert_eq!(d.stats().writes_refused, 1);
        let mut e = dir();
        let s = e.read();
        assert_eq!(e.fill(b"x", s, [], at(0)), Some(s.0));
        assert!(e.is_empty());
    }

    #[test]
    fn a_full_directory_refuses_fills_but_never_writes() {
        let mut d = dir();
        for k in 0..4u8 {
            let s = d.read();
            assert!(d.fill(&[k], s, [1], at(0)).is_some());
        }
        let s = d.read();
        assert_eq!(d.fill(b"x", s, [1], at(0)), None);
        assert_eq!(d.stats().fills_refused_full, 1);
        assert!(matches!(d.write(b"x", "w", at(0)), WriteStep::Forward(_)));
    }
}
