//! The limit on UDP reply bytes per client address (`switch.udp_reply_bytes_per_sec`): a
//! token bucket per destination of replies, so that a forged source address cannot turn the
//! pool into an amplifier aimed at one host at more than the configured rate. Pure: the time
//! comes from the caller, and the number of buckets is bounded.

use kv::Instant;
use std::collections::hash_map::{Entry, HashMap};
use std::net::Ipv4Addr;

/// Most destinations with a bucket of their own; beyond them, new destinations share one
/// bucket until idle buckets are swept at a tick.
pub const MAX_BUCKETS: usize = 65_536;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: u64,
    last: Instant,
}

impl Bucket {
    fn full(burst: u64, now: Instant) -> Bucket {
        Bucket {
            tokens: burst,
            last: now,
        }
    }

    fn refill(&mut self, rate: u64, burst: u64, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_nanos();
        let add = elapsed.saturating_mul(u128::from(rate)) / 1_000_000_000;
        // Left as it is while less than a byte has accrued, so frequent calls lose nothing.
        if add > 0 {
            let add = u64::try_from(add).unwrap_or(u64::MAX);
            self.tokens = self.tokens.saturating_add(add).min(burst);
            self.last = now;
        }
    }
}

/// Token buckets of reply bytes, one per client address.
pub struct ReplyLimiter {
    rate: u64,
    burst: u64,
    buckets: HashMap<Ipv4Addr, Bucket>,
    /// Shared by destinations that found the table full.
    overflow: Option<Bucket>,
    max: usize,
}

impl ReplyLimiter {
    /// `rate` bytes a second per client, up to `burst` bytes at once (a client not heard from
    /// starts with a full bucket).
    pub fn new(rate: u64, burst: u64) -> ReplyLimiter {
        ReplyLimiter::with_capacity(rate, burst, MAX_BUCKETS)
    }

    /// The same with at most `max` buckets of their own.
    pub fn with_capacity(rate: u64, burst: u64, max: usize) -> ReplyLimiter {
        ReplyLimiter {
            rate,
            burst,
            buckets: HashMap::new(),
            overflow: None,
            max,
        }
    }

    /// Whether `bytes` more may go to `client` at `now`; if so they are taken from its bucket.
    pub fn allow(&mut self, client: Ipv4Addr, bytes: usize, now: Instant) -> bool {
        let (rate, burst) = (self.rate, self.burst);
        let room = self.buckets.len() < self.max;
        let bucket = match self.buckets.entry(client) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) if room => e.insert(Bucket::full(burst, now)),
            Entry::Vacant(_) => self
                .overflow
                .get_or_insert_with(|| Bucket::full(burst, now)),
        };
        bucket.refill(rate, burst, now);
        let bytes = bytes as u64;
        if bucket.tokens >= bytes {
            bucket.tokens -= bytes;
            true
        } else {
            false
        }
    }

    /// Drops the buckets that have filled up again: a new bucket would be the same. Each
    /// bucket is refilled and judged on its own, so the map's order changes nothing.
    pub fn sweep(&mut self, now: Instant) {
        let (rate, burst) = (self.rate, self.burst);
        self.buckets.retain(|_, b| {
            b.refill(rate, burst, now);
            b.tokens < burst
        });
        if let Some(b) = &mut self.overflow {
            b.refill(rate, burst, now);
            if b.tokens >= burst {
                self.overflow = None;
            }
        }
    }

    /// Clients with a bucket of their own.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const C1: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const C2: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    #[test]
    fn burst_then_rate() {
        let now = Instant::from_secs(1_000);
        let mut l = ReplyLimiter::new(1000, 3000);
        assert!(l.allow(C1, 2000, now));
        assert!(l.allow(C1, 1000, now));
        assert!(!l.allow(C1, 1, now));
        // Another client has its own bucket.
        assert!(l.allow(C2, 3000, now));
        // Half a second refills 500 bytes, in small steps as well as at once.
        for ms in 1..=500 {
            let _ = l.allow(C1, 0, now + Duration::from_millis(ms));
        }
        let t = now + Duration::from_millis(500);
        assert!(l.allow(C1, 500, t));
        assert!(!l.allow(C1, 1, t));
        // Never more than the burst.
        let t = t + Duration::from_secs(3600);
        assert!(!l.allow(C1, 3001, t));
        assert!(l.allow(C1, 3000, t));
    }

    #[test]
    fn buckets_are_bounded_and_swept() {
        let now = Instant::from_secs(1_000);
        let mut l = ReplyLimiter::with_capacity(1000, 2000, 2);
        assert!(l.allow(C1, 2000, now));
        assert!(l.allow(C2, 2000, now));
        // The table is full: the rest share one bucket.
        let c3 = Ipv4Addr::new(10, 0, 0, 3);
        let c4 = Ipv4Addr::new(10, 0, 0, 4);
        assert!(l.allow(c3, 1500, now));
        assert!(!l.allow(c4, 1000, now));
        assert_eq!(l.len(), 2);
        // Two seconds on every bucket is full again, and swept.
        l.sweep(now + Duration::from_secs(2));
        assert!(l.is_empty());
        assert!(l.allow(c4, 2000, now + Duration::from_secs(2)));
    }
}
