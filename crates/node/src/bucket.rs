//! A token bucket limiting the node to a fixed number of requests per second, as SwitchKV
//! emulated its capacity-limited backends.
//!
//! It is driven: callers pass the current time, so the arithmetic is tested without sleeping.

use std::time::{Duration, Instant};

/// Tokens refill continuously at `rate` per second up to `burst`.
///
/// [`Bucket::reserve`] may take a token that has not arrived yet and says how long to wait for
/// it; waiting callers are thereby served in arrival order at exactly `rate`, whatever the
/// sleep granularity. [`Bucket::try_take`] never goes into debt.
#[derive(Debug)]
pub struct Bucket {
    rate: f64,
    burst: f64,
    /// May be negative: tokens reserved ahead of their arrival.
    tokens: f64,
    last: Instant,
}

impl Bucket {
    /// A full bucket of `burst` tokens (at least one) refilled at `rate` per second (non-zero).
    pub fn new(rate: u64, burst: u64, now: Instant) -> Bucket {
        let burst = burst.max(1) as f64;
        Bucket {
            rate: rate.max(1) as f64,
            burst,
            tokens: burst,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.last = self.last.max(now);
    }

    /// Takes a token, possibly ahead of time; returns how long the caller must wait before
    /// acting on it (zero if one was available).
    pub fn reserve(&mut self, now: Instant) -> Duration {
        self.refill(now);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }

    /// Takes a token if one is available now.
    pub fn try_take(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_rate() {
        let t0 = Instant::now();
        let mut bucket = Bucket::new(1000, 10, t0);
        for _ in 0..10 {
            assert!(bucket.try_take(t0));
        }
        assert!(!bucket.try_take(t0));
        assert!(bucket.try_take(t0 + Duration::from_millis(1)));
        assert!(!bucket.try_take(t0 + Duration::from_millis(1)));
        // A long idle period refills only up to the burst.
        let later = t0 + Duration::from_secs(10);
        let taken = (0..100).filter(|_| bucket.try_take(later)).count();
        assert_eq!(taken, 10);
    }

    #[test]
    fn reservations_queue_at_the_rate() {
        let t0 = Instant::now();
        let mut bucket = Bucket::new(100, 1, t0);
        assert_eq!(bucket.reserve(t0), Duration::ZERO);
        let waits: Vec<u128> = (0..3).map(|_| bucket.reserve(t0).as_millis()).collect();
        assert_eq!(waits, [10, 20, 30]);
    }
}
