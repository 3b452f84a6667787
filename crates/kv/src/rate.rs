//! SwitchKV's clients' rate control (section 4.1): the sending rate is adjusted at a fixed
//! period to keep the share of requests lost between two bounds, so that a client offers what
//! the system answers, with a little loss, and a run measures the system's highest effective
//! throughput. The simulator's clients and `kvswitch load --rate-control` both run it.

/// A rate kept where the loss is between `low` and `high`.
#[derive(Debug, Clone, PartialEq)]
pub struct LossControl {
    rate: f64,
    /// Below it the rate grows by `step`; above `high` it shrinks by `step`.
    pub low: f64,
    pub high: f64,
    pub step: f64,
    min: f64,
    max: f64,
}

impl LossControl {
    /// Starts at `rate`, never leaving `min..=max`.
    pub fn new(rate: f64, low: f64, high: f64, step: f64, min: f64, max: f64) -> LossControl {
        LossControl {
            rate: rate.clamp(min, max),
            low,
            high,
            step,
            min,
            max,
        }
    }

    /// SwitchKV's bounds: 0.5% to 1% lost, a step of 2% a period.
    pub fn switchkv(rate: f64, min: f64, max: f64) -> LossControl {
        LossControl::new(rate, 0.005, 0.01, 0.02, min, max)
    }

    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// One period's adjustment, from the requests that ended in it and those of them lost;
    /// none when no request ended. Returns the new rate.
    pub fn adjust(&mut self, ended: u64, lost: u64) -> f64 {
        if ended > 0 {
            let loss = lost as f64 / ended as f64;
            if loss > self.high {
                self.rate *= 1.0 - self.step;
            } else if loss < self.low {
                self.rate *= 1.0 + self.step;
            }
            self.rate = self.rate.clamp(self.min, self.max);
        }
        self.rate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_follows_the_loss_within_its_bounds() {
        let mut c = LossControl::switchkv(1000.0, 1.0, 1500.0);
        assert_eq!(c.adjust(0, 0), 1000.0, "nothing ended: no change");
        assert!((c.adjust(1000, 0) - 1020.0).abs() < 1e-9, "no loss: up");
        assert!((c.adjust(1000, 7) - 1020.0).abs() < 1e-9, "0.7% lost: kept");
        assert!((c.adjust(1000, 50) - 999.6).abs() < 1e-9, "5% lost: down");
        for _ in 0..100 {
            c.adjust(10, 0);
        }
        assert_eq!(c.rate(), 1500.0, "held at its top");
        for _ in 0..1000 {
            c.adjust(10, 10);
        }
        assert_eq!(c.rate(), 1.0, "held at its bottom");
    }

    #[test]
    fn against_a_capacity_it_settles_near_it() {
        // A server that answers `capacity` a period and loses the rest.
        let capacity = 500.0;
        let mut c = LossControl::switchkv(50.0, 1.0, 1e6);
        let mut rates = Vec::new();
        for _ in 0..2000 {
            let sent = c.rate();
            let lost = (sent - capacity).max(0.0);
            c.adjust(sent.round() as u64, lost.round() as u64);
            rates.push(c.rate());
        }
        let tail = &rates[1000..];
        assert!(
            tail.iter()
                .all(|&r| (capacity * 0.97..=capacity * 1.03).contains(&r)),
            "{:?}",
            &tail[..10]
        );
    }
}
