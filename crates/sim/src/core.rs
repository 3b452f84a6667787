//! The discrete-event core: a queue of events ordered by time, then by the order they were
//! scheduled in, and one seeded generator per source of randomness.
//!
//! Nothing here reads a clock or the operating system's randomness: the same seed and the
//! same schedule give the same run.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::time::Duration;

use kv::rng::Xoshiro256StarStar;
use kv::Instant;

/// Events waiting for their time. Two events at the same instant come out in the order they
/// were scheduled.
#[derive(Debug)]
pub struct Events<E> {
    heap: BinaryHeap<Reverse<Entry<E>>>,
    seq: u64,
    now: Instant,
    handled: u64,
}

#[derive(Debug)]
struct Entry<E> {
    at: Instant,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl<E> Eq for Entry<E> {}
impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Entry<E> {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

impl<E> Default for Events<E> {
    fn default() -> Self {
        Events::new()
    }
}

impl<E> Events<E> {
    pub fn new() -> Events<E> {
        Events {
            heap: BinaryHeap::new(),
            seq: 0,
            now: Instant::ZERO,
            handled: 0,
        }
    }

    /// The time of the event taken last.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Schedules `event` at `at`; a time before now is taken as now (nothing runs backwards).
    pub fn at(&mut self, at: Instant, event: E) {
        let at = at.max(self.now);
        self.seq += 1;
        self.heap.push(Reverse(Entry {
            at,
            seq: self.seq,
            event,
        }));
    }

    /// Schedules `event` `after` from now.
    pub fn after(&mut self, after: Duration, event: E) {
        self.at(self.now + after, event);
    }

    /// When the next event is due.
    pub fn peek(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse(e)| e.at)
    }

    /// Takes the next event and moves the clock to it.
    pub fn pop(&mut self) -> Option<(Instant, E)> {
        let Reverse(e) = self.heap.pop()?;
        self.now = e.at;
        self.handled += 1;
        Some((e.at, e.event))
    }

    /// Moves the clock to `at` for work done outside the queue (a stream of arrivals the
    /// caller draws itself), which must not be earlier than now.
    pub fn advance(&mut self, at: Instant) {
        debug_assert!(at >= self.now, "time ran backwards");
        self.now = self.now.max(at);
        self.handled += 1;
    }

    /// Events taken so far, those counted by [`Events::advance`] included.
    pub fn handled(&self) -> u64 {
        self.handled
    }

    /// Events still waiting.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

/// The generators of one run: every source (a client, a server's service times, the
/// workload's changes) draws from its own, derived from the run's seed and the source's
/// number, so adding a source or drawing more in one leaves the others' draws as they were.
#[derive(Clone, Copy, Debug)]
pub struct Seeds {
    seed: u64,
}

/// Sources of randomness, by number; a model's own sources count up from
/// [`Seeds::MODEL_BASE`].
pub mod source {
    pub const ARRIVALS: u64 = 1;
    pub const KEYS: u64 = 2;
    pub const OPERATIONS: u64 = 3;
    pub const CHANGES: u64 = 4;
    /// Server `i`'s service times: `SERVICE + i`.
    pub const SERVICE: u64 = 1 << 32;
    /// Closed-loop client `i`: `CLIENT + i`.
    pub const CLIENT: u64 = 2 << 32;
    /// Switch `i`'s processor: `SWITCH + i`.
    pub const SWITCH: u64 = 3 << 32;
    /// A single switch's own seed.
    pub const SINGLE_SWITCH: u64 = 4 << 32;
}

impl Seeds {
    pub fn new(seed: u64) -> Seeds {
        Seeds { seed }
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The generator of `source`.
    pub fn rng(&self, source: u64) -> Xoshiro256StarStar {
        Xoshiro256StarStar::seed_from_u64(mix(self.seed ^ mix(source.wrapping_add(0x5157_4b56))))
    }
}

/// SplitMix64's finaliser: a bijection that spreads nearby inputs apart.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The hasher of the simulator's maps keyed by numbers (a switch's table keyed by key
/// hashes, looked up at every request): [`mix`] of the number rather than SipHash, as no
/// client chooses these keys and their order is never read.
#[derive(Clone, Copy, Debug, Default)]
pub struct MixHasher(u64);

impl std::hash::Hasher for MixHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = mix(self.0 ^ u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = mix(self.0 ^ u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = mix(self.0 ^ n);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// An exponential draw with mean `mean`, from a uniform in (0, 1].
pub fn exponential(mean: Duration, u: f64) -> Duration {
    let u = if u <= 0.0 {
        f64::MIN_POSITIVE
    } else {
        u.min(1.0)
    };
    Duration::from_secs_f64(-u.ln() * mean.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kv::rng::Rng;

    fn words(mut r: Xoshiro256StarStar) -> Vec<u64> {
        (0..4).map(|_| r.next_u64()).collect()
    }

    #[test]
    fn events_come_out_by_time_then_by_schedule_order() {
        let mut q = Events::new();
        q.at(Instant::from_micros(5), "b");
        q.at(Instant::from_micros(1), "a");
        q.at(Instant::from_micros(5), "c");
        q.at(Instant::from_micros(3), "x");
        let order: Vec<&str> = std::iter::from_fn(|| q.pop().map(|(_, e)| e)).collect();
        assert_eq!(order, ["a", "x", "b", "c"]);
        assert_eq!(q.now(), Instant::from_micros(5));
        assert_eq!(q.handled(), 4);
        // Scheduling in the past runs at once, never before now.
        q.at(Instant::from_micros(1), "late");
        assert_eq!(q.pop(), Some((Instant::from_micros(5), "late")));
    }

    #[test]
    fn sources_draw_apart_and_repeat_with_the_seed() {
        let a = words(Seeds::new(7).rng(source::KEYS));
        let b = words(Seeds::new(7).rng(source::KEYS));
        let c = words(Seeds::new(7).rng(source::ARRIVALS));
        let d = words(Seeds::new(8).rng(source::KEYS));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
    }

    #[test]
    fn exponential_draws_have_the_mean() {
        let mut rng = Seeds::new(1).rng(9);
        let n = 200_000;
        let mean = Duration::from_micros(10);
        let total: f64 = (0..n)
            .map(|_| exponential(mean, 1.0 - rng.f64()).as_secs_f64())
            .sum();
        let got = total / n as f64;
        assert!((got / mean.as_secs_f64() - 1.0).abs() < 0.01, "mean {got}");
    }
}
