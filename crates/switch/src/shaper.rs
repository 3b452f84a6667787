//! An egress queue with a rate: frames wait in a queue of bounded depth and leave no faster
//! than the configured bits per second, so that congestion can be made, and measured, on a
//! testbed whose kernel has no traffic shaping. Pure: the caller gives the time.
//!
//! A token bucket fills at the rate; a frame leaves when the bucket holds its size. The bucket
//! holds at most [`Shaper::burst`] bytes (or the waiting frame's size, if larger), so an idle port does not save up a burst that would
//! break the rate. A frame that would take the queue past its depth is refused (tail drop).

use std::collections::VecDeque;
use std::time::Duration;

use kv::Instant;

/// Bytes the bucket may hold at least: two full-size frames, so that a frame always fits.
const MIN_BURST: u64 = 2 * 1514;

/// One port's egress queue and rate.
#[derive(Debug)]
pub struct Shaper {
    /// Bits per second.
    rate: u64,
    /// Most bytes waiting.
    depth: u64,
    queue: VecDeque<Vec<u8>>,
    queued_bytes: u64,
    /// Bytes the bucket holds, in millionths of a byte, so that slow rates lose nothing to
    /// rounding.
    tokens_micro: u128,
    /// When the bucket was last filled.
    filled: Option<Instant>,
}

impl Shaper {
    /// A queue of `depth` bytes drained at `rate` bits per second (both at least 1).
    pub fn new(rate: u64, depth: u64) -> Shaper {
        Shaper {
            rate: rate.max(1),
            depth: depth.max(1),
            queue: VecDeque::new(),
            queued_bytes: 0,
            tokens_micro: 0,
            filled: None,
        }
    }

    pub fn rate(&self) -> u64 {
        self.rate
    }

    pub fn depth(&self) -> u64 {
        self.depth
    }

    /// Changes the rate and depth; frames already queued stay, even past a smaller depth.
    pub fn set(&mut self, rate: u64, depth: u64) {
        self.rate = rate.max(1);
        self.depth = depth.max(1);
    }

    /// The most bytes the bucket saves up: a millisecond at the rate, or two full frames.
    pub fn burst(&self) -> u64 {
        (self.rate / 8 / 1000).max(MIN_BURST)
    }

    /// Queues `frame`, or gives it back when it would take the queue past its depth.
    pub fn push(&mut self, frame: Vec<u8>) -> Result<(), Vec<u8>> {
        let len = frame.len() as u64;
        if self.queued_bytes + len > self.depth {
            return Err(frame);
        }
        self.queued_bytes += len;
        self.queue.push_back(frame);
        Ok(())
    }

    fn fill(&mut self, now: Instant) {
        let last = *self.filled.get_or_insert(now);
        let elapsed = now.duration_since(last);
        self.filled = Some(now.max(last));
        // bytes = rate / 8 * seconds; in millionths of a byte: rate * nanos / 8000.
        let add = u128::from(self.rate) * elapsed.as_nanos() / 8_000;
        // A frame larger than the burst (a jumbo frame on a slow port) may still save up its
        // own size, or it would wait at the head for ever.
        let head = self.queue.front().map_or(0, |f| f.len() as u64);
        let cap = u128::from(self.burst().max(head)) * 1_000_000;
        self.tokens_micro = (self.tokens_micro + add).min(cap);
    }

    /// Moves the frames that may leave by `now` to `out`, oldest first.
    pub fn pop_ready(&mut self, now: Instant, out: &mut Vec<Vec<u8>>) {
        self.fill(now);
        while let Some(front) = self.queue.front() {
            let need = front.len() as u128 * 1_000_000;
            if self.tokens_micro < need {
                break;
            }
            self.tokens_micro -= need;
            self.queued_bytes -= front.len() as u64;
            if let Some(f) = self.queue.pop_front() {
                out.push(f);
            }
        }
    }

    /// When the frame at the head may leave, if one waits.
    pub fn next_ready(&self, now: Instant) -> Option<Instant> {
        let front = self.queue.front()?;
        let need = (front.len() as u128 * 1_000_000).saturating_sub(self.tokens_micro);
        // nanos = need (millionths of a byte) * 8000 / rate, rounded up.
        let nanos = (need * 8_000).div_ceil(u128::from(self.rate));
        let base = self.filled.unwrap_or(now).max(now);
        Some(base + Duration::from_nanos(nanos.min(u128::from(u64::MAX)) as u64))
    }

    /// Bytes waiting.
    pub fn queued_bytes(&self) -> u64 {
        self.queued_bytes
    }

    /// Frames waiting.
    pub fn queued_packets(&self) -> usize {
        self.queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Offers `size`-byte frames twice as fast as the rate for one virtual second, draining
    /// every 100 µs, and returns the bytes that left.
    fn run(rate: u64, size: usize) -> u64 {
        let mut s = Shaper::new(rate, 1 << 20);
        let mut out = Vec::new();
        let offered_per_step = (rate / 8 * 2 / 10_000) as usize / size + 1;
        let mut sent = 0u64;
        for step in 0..10_000u64 {
            let now = Instant::from_micros(step * 100);
            for _ in 0..offered_per_step {
                let _ = s.push(vec![0; size]);
            }
            s.pop_ready(now, &mut out);
            sent += out.drain(..).map(|f| f.len() as u64).sum::<u64>();
        }
        sent
    }

    #[test]
    fn a_frame_larger_than_the_burst_still_leaves_at_the_rate() {
        // 10 Mbit/s: a burst of 3,028 bytes; a 9,000-byte frame needs 7.2 ms of tokens.
        let mut s = Shaper::new(10_000_000, 100_000);
        let start = Instant::from_secs(1);
        s.push(vec![0; 9000]).unwrap();
        s.push(vec![0; 9000]).unwrap();
        let mut out = Vec::new();
        let mut now = start;
        s.pop_ready(now, &mut out);
        while out.len() < 2 && now < start + Duration::from_secs(1) {
            now = s.next_ready(now).expect("frames wait").max(now);
            s.pop_ready(now, &mut out);
        }
        assert_eq!(out.len(), 2, "the jumbo frames never left");
        // Two frames of 72,000 bits at 10 Mbit/s: 14.4 ms from an empty bucket.
        let took = now.duration_since(start);
        assert!(
            took >= Duration::from_micros(14_300) && took <= Duration::from_micros(14_500),
            "{took:?}"
        );
    }

    #[test]
    fn the_rate_holds_within_five_percent_for_small_and_full_frames() {
        for rate in [10_000_000u64, 100_000_000, 1_000_000_000] {
            for size in [64usize, 1500] {
                let sent = run(rate, size) as f64 * 8.0;
                let err = (sent / rate as f64 - 1.0).abs();
                assert!(
                    err <= 0.05,
                    "{rate} b/s, {size}-byte frames: {sent} bits in 1 s"
                );
            }
        }
    }

    #[test]
    fn a_full_queue_refuses_and_counts_what_waits() {
        let mut s = Shaper::new(8_000, 3000);
        assert!(s.push(vec![0; 1500]).is_ok());
        assert!(s.push(vec![0; 1500]).is_ok());
        assert_eq!(s.push(vec![0; 1]).unwrap_err().len(), 1);
        assert_eq!((s.queued_bytes(), s.queued_packets()), (3000, 2));
        // 8000 b/s is 1000 bytes a second: the first frame leaves after 1.5 s.
        let mut out = Vec::new();
        s.pop_ready(Instant::ZERO, &mut out);
        assert!(out.is_empty());
        let at = s.next_ready(Instant::ZERO).unwrap();
        assert_eq!(at, Instant::from_millis(1500));
        s.pop_ready(at, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(s.queued_bytes(), 1500);
    }
}
