//! Counters and latency histograms collected by the workers, and the report built from them.

use std::collections::BTreeMap;
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

/// Two significant digits for the per-interval histograms of the time series: one exists per
/// interval and worker, and 1% resolution is plenty for a plot.
const SERIES_SIGFIG: u8 = 2;

/// A fresh histogram for one interval of the time series.
pub fn new_series_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIST_MAX_US, SERIES_SIGFIG).expect("valid histogram bounds")
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
    /// Measured requests handed to the network (or failed while being sent).
    pub sent: u64,
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
            sent: 0,
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
        self.sent += other.sent;
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
    /// Absent from reports written before it was kept.
    #[serde(default)]
    pub p95: u64,
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
            p95: h.value_at_quantile(0.95),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
        }
    }
}

/// The result of one load run.
///
/// `requests = gets + sets + errors + timeouts`; `gets` and `sets` count successful replies
/// (`hits + misses` and `STORED`). Only requests issued (open loop: scheduled) after the warm-up
/// are counted, and the latency covers every request that got a reply (errors included,
/// timeouts not). `errors` also counts failed TCP reconnects and, in an open loop, scheduled
/// requests that could not be sent (connection down, or too many outstanding). Requests still
/// outstanding when the window closes are not counted.
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
    /// The open-loop rate asked for with `--rate`; absent for a closed loop.
    #[serde(default)]
    pub offered_rps: Option<f64>,
    /// Measured requests sent per second of the measured window.
    #[serde(default)]
    pub achieved_rps: f64,
    pub latency_us: Latency,
    /// Throughput and latency per `--interval-ms` of the measured window.
    #[serde(default)]
    pub series: Vec<Sample>,
    pub args: LoadArgs,
}

/// One interval of the time series. `t_s` is the interval's start in seconds since the measured
/// window began; requests are counted when they complete (reply, error or timeout) and the
/// percentiles cover the replies of the interval (0 when there were none).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub t_s: f64,
    pub requests: u64,
    pub throughput_rps: f64,
    /// Of the requests, those answered (a reply, error replies included; not timeouts), and
    /// their rate: what a server behind a loss gets done.
    #[serde(default)]
    pub replies: u64,
    #[serde(default)]
    pub replies_rps: f64,
    pub p50_us: u64,
    pub p99_us: u64,
}

/// What a worker reports for one interval of the time series.
#[derive(Debug)]
pub struct Slice {
    pub worker: usize,
    /// Interval number since the measured window began.
    pub interval: u64,
    pub requests: u64,
    pub latency: Histogram<u64>,
    /// The worker's final slice: it will report no later interval.
    pub last: bool,
}

/// Merges the workers' slices into the time series.
///
/// An interval is summarised and its histogram dropped as soon as every worker has reported a
/// later one, so memory stays bounded however long the run.
#[derive(Debug)]
pub struct SeriesBuilder {
    interval_s: f64,
    /// Per worker: every interval below this one has been reported.
    watermark: Vec<u64>,
    open: BTreeMap<u64, (u64, Histogram<u64>)>,
    /// The first interval not yet summarised.
    next: u64,
    samples: Vec<Sample>,
}

impl SeriesBuilder {
    pub fn new(interval_s: f64, workers: usize) -> SeriesBuilder {
        SeriesBuilder {
            interval_s,
            watermark: vec![0; workers],
            open: BTreeMap::new(),
            next: 0,
            samples: Vec::new(),
        }
    }

    pub fn add(&mut self, s: Slice) {
        if s.interval >= self.next {
            let (n, h) = self
                .open
                .entry(s.interval)
                .or_insert_with(|| (0, new_series_histogram()));
            *n += s.requests;
            let _ = h.add(&s.latency);
        }
        if let Some(w) = self.watermark.get_mut(s.worker) {
            *w = if s.last {
                u64::MAX
            } else {
                (*w).max(s.interval + 1)
            };
        }
        let done = self.watermark.iter().copied().min().unwrap_or(0);
        if done != u64::MAX {
            while self.next < done {
                self.close(self.interval_s);
            }
        }
    }

    /// The series of a measured window of `duration_s` seconds; the last interval may be short.
    pub fn finish(mut self, duration_s: f64) -> Vec<Sample> {
        let n = (duration_s / self.interval_s - 1e-9).ceil().max(0.0) as u64;
        let n = n.max(self.open.keys().next_back().map_or(0, |&k| k + 1));
        while self.next < n {
            let t = (self.next as f64 * self.interval_s * 1e6).round() / 1e6;
            let len = (duration_s - t).min(self.interval_s);
            self.close(if len > 0.0 { len } else { self.interval_s });
        }
        self.samples
    }

    fn close(&mut self, len_s: f64) {
        // Rounded to the microsecond so 19 × 0.1 prints as 1.9.
        let t_s = (self.next as f64 * self.interval_s * 1e6).round() / 1e6;
        let sample = match self.open.remove(&self.next) {
            Some((requests, h)) => Sample {
                t_s,
                requests,
                throughput_rps: requests as f64 / len_s,
                replies: h.len(),
                replies_rps: h.len() as f64 / len_s,
                p50_us: if h.is_empty() {
                    0
                } else {
                    h.value_at_quantile(0.5)
                },
                p99_us: if h.is_empty() {
                    0
                } else {
                    h.value_at_quantile(0.99)
                },
            },
            None => Sample {
                t_s,
                requests: 0,
                throughput_rps: 0.0,
                replies: 0,
                replies_rps: 0.0,
                p50_us: 0,
                p99_us: 0,
            },
        };
        self.samples.push(sample);
        self.next += 1;
    }
}

impl Report {
    pub fn new(
        args: &LoadArgs,
        target: String,
        duration_s: f64,
        stats: &Stats,
        series: Vec<Sample>,
    ) -> Report {
        let requests = stats.requests();
        let per_s = |n: u64| {
            if duration_s > 0.0 {
                n as f64 / duration_s
            } else {
                0.0
            }
        };
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
            throughput_rps: per_s(requests),
            offered_rps: args.rate,
            achieved_rps: per_s(stats.sent),
            latency_us: Latency::from_histogram(&stats.latency),
            series,
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
        if let Some(rate) = self.offered_rps {
            if self.args.rate_control {
                writeln!(
                    w,
                    "open loop   rate control from {:.0} req/s: {:.0} req/s sent on average",
                    rate, self.achieved_rps
                )?;
            } else {
                writeln!(
                    w,
                    "open loop   {:.0} req/s offered, {:.0} req/s sent",
                    rate, self.achieved_rps
                )?;
            }
        }
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
            "latency µs  min {}  mean {:.1}  p50 {}  p90 {}  p95 {}  p99 {}  p99.9 {}  max {}",
            l.min, l.mean, l.p50, l.p90, l.p95, l.p99, l.p999, l.max
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kv::rng::{Rng, Xoshiro256StarStar};

    /// Nearest-rank percentile of sorted data.
    fn exact(sorted: &[u64], q: f64) -> u64 {
        let rank = ((q * sorted.len() as f64).ceil() as usize).max(1);
        sorted[rank - 1]
    }

    #[test]
    fn hdr_percentiles_match_exact_ones() {
        // A long-tailed latency-like sample: mostly tens of µs, some ms.
        let mut rng = Xoshiro256StarStar::seed_from_u64(5);
        let mut sample: Vec<u64> = (0..200_000)
            .map(|_| {
                let u = rng.f64();
                (20.0 * (-(1.0 - u).ln() * 1.5).exp()) as u64 + 1
            })
            .collect();
        let mut stats = Stats::default();
        for &v in &sample {
            stats.record(Outcome::Hit, v);
        }
        sample.sort_unstable();
        let l = Latency::from_histogram(&stats.latency);
        for (q, got) in [
            (0.5, l.p50),
            (0.9, l.p90),
            (0.95, l.p95),
            (0.99, l.p99),
            (0.999, l.p999),
        ] {
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

    fn slice(worker: usize, interval: u64, latencies: &[u64], last: bool) -> Slice {
        let mut h = new_series_histogram();
        for &l in latencies {
            h.record(l).expect("in range");
        }
        Slice {
            worker,
            interval,
            requests: latencies.len() as u64,
            latency: h,
            last,
        }
    }

    #[test]
    fn series_merges_workers_per_interval() {
        let mut b = SeriesBuilder::new(0.1, 2);
        b.add(slice(0, 0, &[10, 20, 30], false));
        // Worker 1 has not reported interval 0 yet: nothing is summarised.
        assert!(b.samples.is_empty());
        b.add(slice(1, 0, &[40], false));
        assert_eq!(b.samples.len(), 1);
        assert_eq!(b.samples[0].requests, 4);
        assert!((b.samples[0].throughput_rps - 40.0).abs() < 1e-9);
        assert_eq!(b.samples[0].p50_us, 20);
        assert_eq!(b.samples[0].p99_us, 40);
        // Worker 0 skips interval 1 (an idle worker reports it empty or not at all).
        b.add(slice(0, 2, &[1_000; 10], true));
        b.add(slice(1, 1, &[], false));
        b.add(slice(1, 2, &[2_000; 10], true));
        let s = b.finish(0.25);
        assert_eq!(s.len(), 3);
        assert_eq!((s[1].requests, s[1].p50_us, s[1].p99_us), (0, 0, 0));
        assert!((s[2].t_s - 0.2).abs() < 1e-9);
        assert_eq!(s[2].requests, 20);
        assert_eq!(s[2].replies, 20);
        assert!((s[2].replies_rps - 400.0).abs() < 1e-6, "{s:?}");
        // The last interval is half as long, so 20 requests make 400 per second.
        assert!((s[2].throughput_rps - 400.0).abs() < 1e-6, "{s:?}");
        // Two significant digits: within 1%.
        assert!(s[2].p50_us.abs_diff(1_000) <= 10, "{s:?}");
        assert!(s[2].p99_us.abs_diff(2_000) <= 20, "{s:?}");
    }

    #[test]
    fn series_covers_quiet_intervals() {
        let mut b = SeriesBuilder::new(0.1, 1);
        b.add(slice(0, 3, &[5], true));
        let s = b.finish(0.5);
        assert_eq!(s.len(), 5);
        assert_eq!(
            s.iter().map(|x| x.requests).collect::<Vec<_>>(),
            [0, 0, 0, 1, 0]
        );
        assert!(s.windows(2).all(|w| w[1].t_s > w[0].t_s));
    }
}
