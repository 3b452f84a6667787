//! Counters and latency histograms collected by the workers, and the report built from them.

use std::io::Write;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::text::Outcome;
use crate::{LoadArgs, Proto};

/// Histogram range: 1 µs to one hour, values above are clamped to the top.
const HIST_MAX_US: u64 = 3_600_000_000;
/// Three significant digits: every recorded value is kept within 0.1%.
const HIST_SIGFIG: u8 = 3;

/// A fresh latency histogram in microseconds.
pub fn new_histogram() -> Histogram<u64> {
    // The bounds are constants that hdrhistogram accepts, so this cannot fail.
    Histogram::new_with_bounds(1, HIST_MAX_US, HIST_SIGFIG).expect("valid histogram bounds")
}

/// What one worker thread counted during the measured window.
#[derive(Debug)]
pub struct Stats {
    pub gets: u64,
    pub sets: u64,
    pub hits: u64,
    pub misses: u64,
    pub errors: u64,
    pub timeouts: u64,
    pub stale_datagrams: u64,
    pub bad_datagrams: u64,
    pub latency: Histogram<u64>,
}

impl Default for Stats {
    fn default() -> Stats {
        Stats {
            gets: 0,
            sets: 0,
            hits: 0,
            misses: 0,
            errors: 0,
            timeouts: 0,
            stale_datagrams: 0,
            bad_datagrams: 0,
            latency: new_histogram(),
        }
    }
}

impl Stats {
    /// Counts a reply and its latency in microseconds.
    pub fn record(&mut self, outcome: Outcome, latency_us: u64) {
        match outcome {
            Outcome::Hit => {
                self.gets += 1;
                self.hits += 1;
            }
            Outcome::Miss => {
                self.gets += 1;
                self.misses += 1;
            }
            Outcome::Stored => self.sets += 1,
            Outcome::ErrorReply | Outcome::Malformed => self.errors += 1,
        }
        self.latency.saturating_record(latency_us.max(1));
    }

    pub fn merge(&mut self, other: &Stats) {
        self.gets += other.gets;
        self.sets += other.sets;
        self.hits += other.hits;
        self.misses += other.misses;
        self.errors += other.errors;
        self.timeouts += other.timeouts;
        self.stale_datagrams += other.stale_datagrams;
        self.bad_datagrams += other.bad_datagrams;
        // Same bounds on both sides, so adding cannot fail; saturate if it ever did.
        let _ = self.latency.add(&other.latency);
    }

    pub fn requests(&self) -> u64 {
        self.gets + self.sets + self.errors + self.timeouts
    }
}

/// Latency summary in microseconds, from an HDR histogram with 3 significant digits.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub min: u64,
    pub mean: f64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
}

impl Latency {
    pub fn from_histogram(h: &Histogram<u64>) -> Latency {
        if h.is_empty() {
            return Latency::default();
        }
        Latency {
            min: h.min(),
            mean: h.mean(),
            p50: h.value_at_quantile(0.50),
            p90: h.value_at_quantile(0.90),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
        }
    }
}

/// The result of one load run.
///
/// `requests = gets + sets + errors + timeouts`; `gets` and `sets` count successful replies
/// (`hits + misses` and `STORED`). Only requests issued after the warm-up are counted, and the
/// latency covers every request that got a reply (errors included, timeouts not).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub target: String,
    pub proto: Proto,
    /// Length of the measured window in seconds.
    pub duration_s: f64,
    pub requests: u64,
    pub gets: u64,
    pub sets: u64,
    pub hits: u64,
    pub misses: u64,
    pub errors: u64,
    pub timeouts: u64,
    /// UDP reply datagrams for a request that had already timed out.
    pub stale_datagrams: u64,
    /// UDP reply datagrams with a broken frame header.
    pub bad_datagrams: u64,
    pub throughput_rps: f64,
    pub latency_us: Latency,
    pub args: LoadArgs,
}

impl Report {
    pub fn new(args: &LoadArgs, target: String, duration_s: f64, stats: &Stats) -> Report {
        let requests = stats.requests();
        Report {
            target,
            proto: args.proto,
            duration_s,
            requests,
            gets: stats.gets,
            sets: stats.sets,
            hits: stats.hits,
            misses: stats.misses,
            errors: stats.errors,
            timeouts: stats.timeouts,
            stale_datagrams: stats.stale_datagrams,
            bad_datagrams: stats.bad_datagrams,
            throughput_rps: if duration_s > 0.0 {
                requests as f64 / duration_s
            } else {
                0.0
            },
            latency_us: Latency::from_histogram(&stats.latency),
            args: args.clone(),
        }
    }

    /// A few aligned lines for a terminal. Write errors are ignored (stdout went away).
    pub fn print_human(&self, w: &mut impl Write) {
        let _ = self.write_human(w);
    }

    fn write_human(&self, w: &mut impl Write) -> std::io::Result<()> {
        let pct = |n: u64, d: u64| {
            if d == 0 {
                0.0
            } else {
                100.0 * n as f64 / d as f64
            }
        };
        writeln!(
            w,
            "target      {} ({}), {} requesters, {:.2} s",
            self.target, self.proto, self.args.concurrency, self.duration_s
        )?;
        writeln!(
            w,
            "requests    {} ({:.0} req/s)",
            self.requests, self.throughput_rps
        )?;
        writeln!(
            w,
            "gets        {} (hits {}, misses {}, hit ratio {:.1}%)",
            self.gets,
            self.hits,
            self.misses,
            pct(self.hits, self.gets)
        )?;
        writeln!(w, "sets        {}", self.sets)?;
        writeln!(
            w,
            "errors      {}   timeouts {} ({:.2}%)   stale datagrams {}   bad datagrams {}",
            self.errors,
            self.timeouts,
            pct(self.timeouts, self.requests),
            self.stale_datagrams,
            self.bad_datagrams
        )?;
        let l = &self.latency_us;
        writeln!(
            w,
            "latency µs  min {}  mean {:.1}  p50 {}  p90 {}  p99 {}  p99.9 {}  max {}",
            l.min, l.mean, l.p50, l.p90, l.p99, l.p999, l.max
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    /// Nearest-rank percentile of sorted data.
    fn exact(sorted: &[u64], q: f64) -> u64 {
        let rank = ((q * sorted.len() as f64).ceil() as usize).max(1);
        sorted[rank - 1]
    }

    #[test]
    fn hdr_percentiles_match_exact_ones() {
        // A long-tailed latency-like sample: mostly tens of µs, some ms.
        let mut rng = SmallRng::seed_from_u64(5);
        let mut sample: Vec<u64> = (0..200_000)
            .map(|_| {
                let u: f64 = rng.gen_range(0.0..1.0);
                (20.0 * (-(1.0 - u).ln() * 1.5).exp()) as u64 + 1
            })
            .collect();
        let mut stats = Stats::default();
        for &v in &sample {
            stats.record(Outcome::Hit, v);
        }
        sample.sort_unstable();
        let l = Latency::from_histogram(&stats.latency);
        for (q, got) in [(0.5, l.p50), (0.9, l.p90), (0.99, l.p99), (0.999, l.p999)] {
            let want = exact(&sample, q);
            let err = (got as f64 - want as f64).abs() / want as f64;
            assert!(err <= 0.001, "q={q}: hdr {got}, exact {want}");
        }
        assert_eq!(l.min, sample[0]);
        let max_err = (l.max as f64 - sample[sample.len() - 1] as f64).abs() / l.max as f64;
        assert!(max_err <= 0.001);
        let mean = sample.iter().sum::<u64>() as f64 / sample.len() as f64;
        assert!((l.mean - mean).abs() / mean <= 0.001);
    }

    #[test]
    fn merge_adds_counts_and_histograms() {
        let mut a = Stats::default();
        a.record(Outcome::Hit, 10);
        a.timeouts = 2;
        let mut b = Stats::default();
        b.record(Outcome::Stored, 30);
        b.record(Outcome::ErrorReply, 20);
        a.merge(&b);
        assert_eq!(
            (a.gets, a.sets, a.errors, a.timeouts, a.requests()),
            (1, 1, 1, 2, 5)
        );
        assert_eq!(a.latency.len(), 3);
        assert_eq!(a.latency.max(), 30);
    }
}
