//! A server's service: one FIFO queue in front of a worker that serves `capacity` requests a
//! second, each for a fixed time or for an exponential one of that mean, holding at most
//! `depth` requests (the one in service included); a request that finds it full is dropped.
//!
//! The time a request leaves is known when it arrives (Lindley's recursion), so a station
//! needs no events of its own: the caller asks at each arrival, in time order.

use std::collections::VecDeque;
use std::time::Duration;

use kv::rng::{Rng, Xoshiro256StarStar};

use kv::Instant;

/// How long each request takes to serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize, serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum Service {
    /// Every request takes 1 / capacity.
    Fixed,
    /// Exponentially distributed with mean 1 / capacity (an M/M/1 server under Poisson
    /// arrivals).
    Exponential,
}

#[derive(Debug)]
pub struct Station {
    mean: Duration,
    service: Service,
    depth: usize,
    rng: Xoshiro256StarStar,
    /// When each request in the station leaves, in order.
    leaving: VecDeque<Instant>,
    /// When the last request accepted leaves.
    free_at: Instant,
    pub accepted: u64,
    pub dropped: u64,
    /// Sum of the time accepted requests spend in the station, in nanoseconds.
    pub sojourn_ns: u128,
}

impl Station {
    /// A station serving `capacity` requests a second (> 0) with room for `depth` (≥ 1).
    pub fn new(capacity: f64, depth: usize, service: Service, rng: Xoshiro256StarStar) -> Station {
        assert!(capacity > 0.0 && depth >= 1);
        Station {
            mean: Duration::from_secs_f64(1.0 / capacity),
            service,
            depth,
            rng,
            leaving: VecDeque::new(),
            free_at: Instant::ZERO,
            accepted: 0,
            dropped: 0,
            sojourn_ns: 0,
        }
    }

    /// Reads what [`Station::arrive`] reads first, ahead of it (as
    /// `kv::switchkv::Backend::touch` does for a backend's detectors): when the last request
    /// leaves and the queue's head. Changes nothing.
    pub fn touch(&self) {
        std::hint::black_box((self.free_at, self.leaving.front().copied()));
    }

    /// A request arrives at `now` (never earlier than the last arrival): when it leaves, or
    /// `None` if the queue is full and it is dropped.
    pub fn arrive(&mut self, now: Instant) -> Option<Instant> {
        if self.free_at <= now {
            // The last request has left, so all have: the queue empties without reading it.
            self.leaving.clear();
        }
        while self.leaving.front().is_some_and(|&t| t <= now) {
            self.leaving.pop_front();
        }
        if self.leaving.len() >= self.depth {
            self.dropped += 1;
            return None;
        }
        let serve = match self.service {
            Service::Fixed => self.mean,
            Service::Exponential => crate::core::exponential(self.mean, 1.0 - self.rng.f64()),
        };
        let leaves = self.free_at.max(now) + serve;
        self.free_at = leaves;
        self.leaving.push_back(leaves);
        self.accepted += 1;
        self.sojourn_ns += u128::from(leaves.as_nanos() - now.as_nanos());
        Some(leaves)
    }

    /// Requests in the station at `now` (as of the last arrival's bookkeeping).
    pub fn queued(&self, now: Instant) -> usize {
        self.leaving.iter().filter(|&&t| t > now).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Seeds;

    #[test]
    fn a_fixed_station_serves_its_capacity_and_drops_past_its_depth() {
        let mut s = Station::new(1000.0, 3, Service::Fixed, Seeds::new(1).rng(1));
        let t = Instant::from_millis(10);
        assert_eq!(s.arrive(t), Some(t + Duration::from_millis(1)));
        assert_eq!(s.arrive(t), Some(t + Duration::from_millis(2)));
        assert_eq!(s.arrive(t), Some(t + Duration::from_millis(3)));
        assert_eq!(s.arrive(t), None);
        assert_eq!((s.accepted, s.dropped), (3, 1));
        // One has left a millisecond later: room for one more, behind the other two.
        let t1 = t + Duration::from_millis(1);
        assert_eq!(s.arrive(t1), Some(t + Duration::from_millis(4)));
        assert_eq!(s.queued(t1), 3);
        // Idle later: served at once.
        let t2 = Instant::from_secs(1);
        assert_eq!(s.arrive(t2), Some(t2 + Duration::from_millis(1)));
    }
}
