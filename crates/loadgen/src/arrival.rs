//! Open-loop request schedules: Poisson arrivals, i.e. exponentially distributed gaps between
//! scheduled send times. Pure arithmetic on durations; the worker turns them into instants.

use std::time::Duration;

use kv::rng::{Rng, Xoshiro256StarStar};

/// Longest gap ever returned (about 136 years): far beyond any run, and small enough that adding
/// it to an instant cannot overflow.
pub const MAX_GAP: Duration = Duration::from_secs(1 << 32);

/// Exponential inter-arrival gaps for a Poisson process of a fixed rate.
#[derive(Clone, Debug)]
pub struct Arrivals {
    /// The mean gap at the rate it was made with, and the gap now (see [`Arrivals::set_scale`]).
    base_gap_s: f64,
    mean_gap_s: f64,
    rng: Xoshiro256StarStar,
}

impl Arrivals {
    /// A process of `rate` arrivals per second, drawing from `rng`.
    ///
    /// # Panics
    /// If `rate` is not a positive finite number; callers validate user input first.
    pub fn new(rate: f64, rng: Xoshiro256StarStar) -> Arrivals {
        assert!(rate.is_finite() && rate > 0.0, "arrival rate must be > 0");
        Arrivals {
            base_gap_s: 1.0 / rate,
            mean_gap_s: 1.0 / rate,
            rng,
        }
    }

    /// Runs at `factor` times the rate it was made with (a positive finite factor; others
    /// are ignored).
    pub fn set_scale(&mut self, factor: f64) {
        if factor.is_finite() && factor > 0.0 {
            self.mean_gap_s = self.base_gap_s / factor;
        }
    }

    /// The gap to the next arrival, by inversion: `-ln(U) / rate` with `U` in `(0, 1]`.
    pub fn next_gap(&mut self) -> Duration {
        let u: f64 = 1.0 - self.rng.f64();
        // Rates are validated, but a gap too long to represent must still not panic.
        Duration::try_from_secs_f64(-u.ln() * self.mean_gap_s)
            .map_or(MAX_GAP, |gap| gap.min(MAX_GAP))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_are_exponential() {
        const N: usize = 200_000;
        let rate = 2_000.0;
        let mut a = Arrivals::new(rate, Xoshiro256StarStar::seed_from_u64(3));
        let gaps: Vec<f64> = (0..N).map(|_| a.next_gap().as_secs_f64()).collect();
        let mean = gaps.iter().sum::<f64>() / N as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / (N - 1) as f64;
        let cv = var.sqrt() / mean;
        assert!((mean * rate - 1.0).abs() < 0.01, "mean gap {mean}");
        assert!((0.8..=1.2).contains(&cv), "coefficient of variation {cv}");
        // Memorylessness shows in the tail: P(gap > 2/rate) = e^-2.
        let tail = gaps.iter().filter(|&&g| g > 2.0 / rate).count() as f64 / N as f64;
        assert!((tail - (-2.0f64).exp()).abs() < 0.005, "tail {tail}");
    }

    #[test]
    fn tiny_rates_give_long_gaps_without_panicking() {
        for rate in [1e-300, f64::MIN_POSITIVE, 1e-12] {
            let mut a = Arrivals::new(rate, Xoshiro256StarStar::seed_from_u64(5));
            for _ in 0..1_000 {
                assert!(a.next_gap() <= MAX_GAP);
            }
        }
        let mut a = Arrivals::new(1e-300, Xoshiro256StarStar::seed_from_u64(5));
        assert_eq!(a.next_gap(), MAX_GAP);
    }

    #[test]
    fn split_over_requesters_keeps_the_aggregate_rate() {
        // Four independent processes at a quarter of the rate each: over 10 s of schedule the
        // total count is within a few standard deviations of rate × 10.
        let rate = 2_000.0;
        let horizon = 10.0;
        let mut total = 0u64;
        for i in 0..4 {
            let mut a = Arrivals::new(rate / 4.0, Xoshiro256StarStar::seed_from_u64(i));
            let mut t = 0.0;
            loop {
                t += a.next_gap().as_secs_f64();
                if t >= horizon {
                    break;
                }
                total += 1;
            }
        }
        let want = rate * horizon;
        assert!((total as f64 - want).abs() < 4.0 * want.sqrt(), "{total}");
    }
}
