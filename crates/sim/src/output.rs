//! What a run gives back: a summary of the measured window and a time series, both written
//! the same way every time (fixed column order, fixed number formats), so the same seed and
//! scenario give the same bytes.

/// A run's figures over its measured window (after the warm-up), and its totals.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Summary {
    pub scenario: String,
    pub variant: String,
    pub x: Option<f64>,
    pub seed: u64,
    pub level: &'static str,
    pub simulated_s: f64,
    /// Events handled: arrivals and the scheduled ones.
    pub events: u64,
    /// Every request sent, and where each ended up; `sent = answered + dropped + in_flight`.
    pub sent: u64,
    pub answered: u64,
    pub dropped: u64,
    pub in_flight: u64,
    /// Drops by reason.
    pub dropped_backend_queue: u64,
    pub dropped_cache_queue: u64,
    /// In the measured window: requests sent, answers received, a second.
    pub offered: f64,
    pub throughput: f64,
    /// Dropped over sent, in the measured window.
    pub loss: f64,
    /// Reads answered by a cache node, and their share of the answers.
    pub cache_hits: u64,
    pub hit_ratio: f64,
    /// Requests a second each backend served in the measured window.
    pub backend_load_max: f64,
    pub backend_load_mean: f64,
    pub backend_load_min: f64,
    /// The busiest backend's load over the mean.
    pub imbalance: f64,
    pub latency_mean_us: f64,
    pub latency_p99_us: f64,
    /// Mean time a request spent queued and served at a backend.
    pub backend_sojourn_us: f64,
    /// Rule changes the switch applied; installs it refused for a full table; rules at the end.
    pub rule_changes: u64,
    pub rules_refused: u64,
    pub rules_end: u64,
    /// Keys the cache nodes may serve at the end.
    pub cached_end: u64,
    /// Instant and periodic reports the cache nodes took.
    pub instant_reports: u64,
    pub periodic_reports: u64,
    /// Rate-control clients: their rate at the end, requests a second.
    pub client_rate_end: f64,
    /// Frame level: reads answered by a ToR's cache and by a root's, frames dropped by a
    /// full link queue or a full switch processor's queue, the mean time a frame spent at a
    /// ToR's and at a root's processor (queued and handled), and what the coherence checker
    /// found in the clients' history.
    pub tor_hits: u64,
    pub root_hits: u64,
    pub dropped_link_queue: u64,
    pub dropped_switch_queue: u64,
    /// Frames that reached a failed switch, and messages the switches sent by another root
    /// than the key's designated one (as it was down).
    pub dropped_switch_down: u64,
    pub detours: u64,
    /// Registration tables the controller installed on the switches.
    pub tables_installed: u64,
    pub tor_sojourn_us: f64,
    pub root_sojourn_us: f64,
    /// Frames the busiest root took over the mean root's: how evenly the keys' designated
    /// roots (a fat-tree's paths) share the load.
    pub root_imbalance: f64,
    pub history_ops: u64,
    pub violations: u64,
}

impl Summary {
    /// The figures of the backends' loads (requests a second each served) and of the clients'
    /// latencies and the servers' time in queue and service (total nanoseconds, requests).
    pub fn set_loads(&mut self, loads: &[f64], latency: &Histogram, sojourn: (u128, u64)) {
        self.backend_load_max = loads.iter().cloned().fold(0.0, f64::max);
        self.backend_load_min = loads.iter().cloned().fold(f64::INFINITY, f64::min);
        self.backend_load_mean = loads.iter().sum::<f64>() / loads.len().max(1) as f64;
        self.imbalance = if self.backend_load_mean > 0.0 {
            self.backend_load_max / self.backend_load_mean
        } else {
            0.0
        };
        self.latency_mean_us = latency.mean_ns() / 1000.0;
        self.latency_p99_us = latency.quantile_ns(0.99) / 1000.0;
        let (ns, accepted) = sojourn;
        self.backend_sojourn_us = if accepted == 0 {
            0.0
        } else {
            ns as f64 / accepted as f64 / 1000.0
        };
    }
}

/// One time-series bin.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Bin {
    /// The bin's end, seconds.
    pub t: f64,
    pub sent: u64,
    pub answered: u64,
    pub dropped: u64,
    pub hits: u64,
    /// Requests the busiest backend served in the bin.
    pub backend_max: u64,
    /// Rules in the switch at the bin's end.
    pub rules: u64,
    /// Rate-control clients' rate at the bin's end (open loop: the set rate; closed: 0).
    pub rate: f64,
}

/// The columns of [`series_csv`].
pub const SERIES_COLUMNS: &[&str] = &[
    "t_s",
    "offered_rps",
    "throughput_rps",
    "loss",
    "hit_ratio",
    "backend_max_rps",
    "rules",
    "client_rate_rps",
];

/// The time series as CSV, figures a second.
pub fn series_csv(bins: &[Bin], bin_s: f64) -> String {
    let mut out = SERIES_COLUMNS.join(",");
    out.push('\n');
    for b in bins {
        let loss = if b.sent == 0 {
            0.0
        } else {
            b.dropped as f64 / b.sent as f64
        };
        let hits = if b.answered == 0 {
            0.0
        } else {
            b.hits as f64 / b.answered as f64
        };
        out.push_str(&format!(
            "{:.3},{:.1},{:.1},{:.5},{:.4},{:.1},{},{:.1}\n",
            b.t,
            b.sent as f64 / bin_s,
            b.answered as f64 / bin_s,
            loss,
            hits.min(1.0),
            b.backend_max as f64 / bin_s,
            b.rules,
            b.rate
        ));
    }
    out
}

/// The series' value of a column at each bin, for plots: (t, value).
pub fn series_column(csv: &str, column: &str) -> Option<Vec<(f64, f64)>> {
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next()?.split(',').collect();
    let i = header.iter().position(|h| *h == column)?;
    Some(
        lines
            .filter_map(|l| {
                let cells: Vec<&str> = l.split(',').collect();
                Some((cells.first()?.parse().ok()?, cells.get(i)?.parse().ok()?))
            })
            .collect(),
    )
}

/// The mean of a time-series column over the bins that end in `(from, to]` seconds; `None`
/// when the column is missing or no bin ends there.
pub fn series_mean(csv: &str, column: &str, from: f64, to: f64) -> Option<f64> {
    let v: Vec<f64> = series_column(csv, column)?
        .into_iter()
        .filter(|&(t, _)| t > from && t <= to)
        .map(|(_, y)| y)
        .collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Latencies in buckets of a sixteenth of an octave: percentiles within 4.4%.
#[derive(Clone, Debug)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    sum_ns: u128,
}

const SUB: u32 = 16;

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; 64 * SUB as usize],
            total: 0,
            sum_ns: 0,
        }
    }
}

impl Histogram {
    pub fn record(&mut self, ns: u64) {
        let ns = ns.max(1);
        let octave = 63 - ns.leading_zeros();
        let frac = if octave >= 4 {
            (ns >> (octave - 4)) & 15
        } else {
            (ns << (4 - octave)) & 15
        };
        self.counts[(octave * SUB + frac as u32) as usize] += 1;
        self.total += 1;
        self.sum_ns += u128::from(ns);
    }

    pub fn mean_ns(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.sum_ns as f64 / self.total as f64
        }
    }

    /// The `q` quantile (0 to 1): the bucket's upper bound.
    pub fn quantile_ns(&self, q: f64) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        let want = ((self.total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                let octave = i as u32 / SUB;
                let frac = u64::from(i as u32 % SUB);
                return 2f64.powi(octave as i32) * (1.0 + (frac + 1) as f64 / 16.0);
            }
        }
        f64::INFINITY
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_are_within_a_bucket() {
        let mut h = Histogram::default();
        for ns in 1..=100_000u64 {
            h.record(ns);
        }
        let p50 = h.quantile_ns(0.5);
        let p99 = h.quantile_ns(0.99);
        assert!((p50 / 50_000.0 - 1.0).abs() < 0.07, "{p50}");
        assert!((p99 / 99_000.0 - 1.0).abs() < 0.07, "{p99}");
        assert!((h.mean_ns() - 50_000.5).abs() < 1.0);
    }
}
