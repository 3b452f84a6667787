//! `kvswitch bench skew`: the aggregate throughput of capacity-limited backends behind
//! kvswitch as the key popularity grows more skewed, and the load each backend gets, as
//! SwitchKV's load-balance figures draw them. Each backend is a `kvswitch node` serving at
//! most `--capacity` requests a second (UDP beyond it is dropped), and the client offers a
//! multiple of their total capacity (`--load`, 6 by default). Without the cache at most that
//! capacity is answered, and skew piles the load onto the hottest backends; with kvswitch's
//! cache the hot keys are answered by kvswitch and the rest fits the backends. Further sweeps
//! vary the cache's size, the share of writes (SwitchKV's Figure 12) and the offered load, for
//! the latency of each architecture (its Figure 13).

use std::fmt::Write as _;

use serde::Serialize;

use super::bed::{
    by_setup, Bed, BedSpec, CachePath, CacheSetup, Servers, Setup, SwitchKvSetup, System,
};
use super::output::{fmt, ratio, times};
use super::plot::{BarChart, Chart, LineChart, Series};
use super::runner::{Figures, Keys, Record, Runner, Runs, Stage};
use super::Common;
use crate::measure::{loss, per_s};

pub const NAME: &str = "skew";

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// Zipf exponents, comma-separated, 0 (uniform) to 1.2 and beyond
    /// [default: 0,0.2,0.4,0.6,0.8,0.9,0.99,1.1,1.2; 0,0.99 with --short].
    #[arg(long, value_delimiter = ',', value_name = "THETA,...")]
    pub skews: Vec<f64>,
    /// Backends (kvswitch nodes), at least 8 for the figures.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub servers: u32,
    /// Requests per second each backend serves.
    #[arg(long, default_value_t = 500,
          value_parser = clap::value_parser!(u64).range(10..=10_000_000))]
    pub capacity: u64,
    /// Offered load as a multiple of the backends' total capacity: above 1, only what a cache
    /// answers gets through beyond the backends' capacity.
    #[arg(long, default_value_t = 6.0)]
    pub load: f64,
    /// Keys preloaded and read.
    #[arg(long, default_value_t = 20_000,
          value_parser = clap::value_parser!(u64).range(10..=10_000_000))]
    pub keys: u64,
    /// Seconds measured per point [default: 3; 0.5 with --short].
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Cache sizes (entries) of the cache-size sweep, comma-separated, for kvswitch's cache and
    /// SwitchKV's cache node (those of them measured) [default: 10,100,1000,10000].
    #[arg(long, value_delimiter = ',', value_name = "ENTRIES,...")]
    pub cache_sizes: Vec<u64>,
    /// Zipf exponent of the cache-size, write-ratio and latency sweeps.
    #[arg(long, default_value_t = 0.99)]
    pub cache_skew: f64,
    /// Shares of writes of the write-ratio sweep, comma-separated, 0 to 1
    /// [default: 0.01,0.05,0.1,0.2,0.3; 0.1 with --short].
    #[arg(long, value_delimiter = ',', value_name = "RATIO,...")]
    pub write_ratios: Vec<f64>,
    /// Offered loads of the latency sweep, as multiples of the backends' total capacity,
    /// comma-separated [default: 0.25,0.5,1,2,4; 0.5 with --short].
    #[arg(long, value_delimiter = ',', value_name = "LOAD,...")]
    pub latency_loads: Vec<f64>,
    /// Only these systems, by their short names (kvswitch_udp, kvswitch_cache_udp,
    /// switchkv_udp, switchkv_encoded_udp, look_through_udp, look_aside_udp), comma-separated
    /// [default: all].
    #[arg(long, value_delimiter = ',', value_name = "SYSTEM,...")]
    pub systems: Vec<String>,
}

impl Args {
    pub fn with(common: Common) -> Args {
        Args {
            common,
            skews: Vec::new(),
            servers: 8,
            capacity: 500,
            load: 6.0,
            keys: 20_000,
            duration: None,
            cache_sizes: Vec::new(),
            cache_skew: 0.99,
            write_ratios: Vec::new(),
            latency_loads: Vec::new(),
            systems: Vec::new(),
        }
    }

    fn write_ratios(&self) -> Vec<f64> {
        if !self.write_ratios.is_empty() {
            self.write_ratios.clone()
        } else if self.common.short {
            vec![0.1]
        } else {
            vec![0.01, 0.05, 0.1, 0.2, 0.3]
        }
    }

    fn latency_loads(&self) -> Vec<f64> {
        if !self.latency_loads.is_empty() {
            self.latency_loads.clone()
        } else if self.common.short {
            vec![0.5]
        } else {
            vec![0.25, 0.5, 1.0, 2.0, 4.0]
        }
    }

    fn skews(&self) -> Vec<f64> {
        if !self.skews.is_empty() {
            self.skews.clone()
        } else if self.common.short {
            vec![0.0, 0.99]
        } else {
            vec![0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 0.99, 1.1, 1.2]
        }
    }

    fn duration(&self) -> f64 {
        self.duration
            .unwrap_or(if self.common.short { 0.5 } else { 3.0 })
    }

    fn cache_sizes(&self) -> Vec<u64> {
        if !self.cache_sizes.is_empty() {
            self.cache_sizes.clone()
        } else if self.common.short {
            vec![100]
        } else {
            vec![10, 100, 1000, 10_000]
        }
    }

    fn offered(&self) -> f64 {
        self.offered_at(self.load)
    }

    /// The requests a second offered at `load` times the backends' total capacity.
    fn offered_at(&self, load: f64) -> f64 {
        load * self.capacity as f64 * f64::from(self.servers)
    }

    fn check(&self) -> anyhow::Result<()> {
        for &s in self.skews().iter().chain([self.cache_skew].iter()) {
            if !s.is_finite() || !(0.0..=5.0).contains(&s) {
                anyhow::bail!("a Zipf exponent must be between 0 and 5, got {s}");
            }
        }
        for &load in self.latency_loads().iter().chain([self.load].iter()) {
            if !load.is_finite() || load <= 0.0 || load > 100.0 {
                anyhow::bail!("a load must be above 0 and at most 100, got {load}");
            }
        }
        for &w in &self.write_ratios() {
            if !w.is_finite() || !(0.0..=1.0).contains(&w) {
                anyhow::bail!("--write-ratios: a share of writes is 0 to 1, got {w}");
            }
        }
        if self.cache_sizes().contains(&0) {
            anyhow::bail!("--cache-sizes: a cache holds at least one entry");
        }
        super::check_duration(self.duration())
    }
}

/// The sweeps of the scenario; a point belongs to one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Sweep {
    /// Gets only, against the Zipf exponent.
    Skew,
    /// Gets only, against the cache's size.
    CacheSize,
    /// Gets and sets, against the share of sets, the sets drawn by the same Zipf as the gets.
    WriteRatio,
    /// The same with the sets drawn uniformly over every key (SwitchKV's other write
    /// workload in Figure 12).
    UniformWrites,
    /// Gets only, against the offered load: latency.
    Load,
    /// The same, reading only keys every cache holds (SwitchKV's Figure 13a): the
    /// [`HIT_KEYS`] first keys, uniformly, which the caches take in during the warm-up.
    Hits,
    /// The same, reading keys the servers do not hold (prefix `miss:`, [`MISS_KEYS`] of them),
    /// uniformly: every read a cache miss, and a miss at the server too, which no cache
    /// takes in (SwitchKV's Figure 13b, whose cache was empty).
    Misses,
}

/// Keys the misses latency sweep reads, none of them stored.
pub const MISS_KEYS: u64 = 10_000_000;

/// Keys the hits-only latency sweep reads: few enough for every cache to hold.
pub const HIT_KEYS: u64 = 100;

/// Where a point is measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct At {
    pub sweep: Sweep,
    pub skew: f64,
    /// Entries of the testbed's cache (kvswitch's or SwitchKV's); none without one.
    pub cache_entries: Option<u64>,
    /// Share of the requests that are sets.
    pub write_ratio: f64,
    /// Offered load as a multiple of the backends' total capacity.
    pub load: f64,
}

/// One system at one point of a sweep in one run.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    pub system: System,
    pub sweep: Sweep,
    pub skew: f64,
    /// Entries of kvswitch's cache; none without it.
    pub cache_entries: Option<u64>,
    pub write_ratio: f64,
    pub offered_rps: f64,
    /// Gets answered per second (hits and misses).
    pub get_rps: f64,
    /// Requests answered per second, gets and sets.
    pub rps: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub loss: f64,
    /// Requests per second each backend was sent, in server order.
    pub backend_rps: Vec<f64>,
    pub run: u32,
}

#[derive(Serialize)]
struct Settings {
    skews: Vec<f64>,
    servers: u32,
    capacity_rps: u64,
    burst: u64,
    offered_rps: f64,
    keys: u64,
    duration_s: f64,
    runs: u32,
    cache_sizes: Option<Vec<u64>>,
    cache_skew: f64,
    write_ratios: Vec<f64>,
    latency_loads: Vec<f64>,
    short: bool,
}

pub fn run(args: &Args) -> anyhow::Result<Vec<Point>> {
    args.check()?;
    let skews = args.skews();
    let duration = args.duration();
    let runner = Runner::start(NAME, &args.common)?;
    let runs = runner.runs();
    let systems = super::bed::pick(&System::switched(), &args.systems)?;
    let cache_sizes = (!sized(&systems).is_empty()).then(|| args.cache_sizes());

    // One testbed per kvswitch configuration for every sweep but the cache size's ...
    let entries = default_cache_entries(args);
    let mut stages: Vec<Stage<At>> = by_setup(&systems)
        .into_iter()
        .map(|(setup, group)| {
            stage(
                args,
                setup,
                group,
                entries,
                on_one_bed(args, &skews, entries),
            )
        })
        .collect();
    // ... then one per cache size of each system whose cache is sized.
    for &system in &sized(&systems) {
        for &entries in cache_sizes.iter().flatten() {
            let at = At {
                sweep: Sweep::CacheSize,
                skew: args.cache_skew,
                cache_entries: Some(entries),
                write_ratio: 0.0,
                load: args.load,
            };
            stages.push(stage(args, system.setup(), vec![system], entries, vec![at]));
        }
    }
    let points = runner.measure(stages, |bed, system, at, run| {
        measure(bed, args, system, at, run)
    })?;

    let medians = super::runner::medians(&points);
    let mut plots = vec![
        (
            "throughput-skew".to_string(),
            Chart::Line(skew_chart(args, &systems, &medians)),
        ),
        (
            "load-per-backend".to_string(),
            Chart::Bars(backend_chart(args, &skews, &medians)),
        ),
    ];
    if cache_sizes.is_some() {
        plots.push((
            "throughput-cache-size".to_string(),
            Chart::Line(cache_chart(args, &systems, &medians)),
        ));
    }
    plots.push((
        "throughput-write-ratio".to_string(),
        Chart::Line(write_chart(args, &systems, &medians)),
    ));
    for (name, which) in [
        ("latency-load", Sweep::Load),
        ("latency-load-hits", Sweep::Hits),
        ("latency-load-misses", Sweep::Misses),
    ] {
        plots.push((
            name.to_string(),
            Chart::Line(latency_chart(args, &systems, &medians, which)),
        ));
    }
    runner.finish(
        Record {
            settings: Settings {
                skews: skews.clone(),
                servers: args.servers,
                capacity_rps: args.capacity,
                burst: super::bed::node_burst(args.capacity),
                offered_rps: args.offered(),
                keys: args.keys,
                duration_s: duration,
                runs,
                cache_sizes: cache_sizes.clone(),
                cache_skew: args.cache_skew,
                write_ratios: args.write_ratios(),
                latency_loads: args.latency_loads(),
                short: args.common.short,
            },
            systems: Some(&systems),
            runs: &points,
            medians: &medians,
            more: (),
        },
        plots,
        &summary(args, &systems, &skews, &medians, runs, duration),
    )?;
    Ok(medians)
}

/// The cache size of the skew sweep with the cache: the largest of the cache-size sweep.
fn default_cache_entries(args: &Args) -> u64 {
    args.cache_sizes().into_iter().max().unwrap_or(1000)
}

/// The testbed of `setup` for `systems`, with a cache (kvswitch's or SwitchKV's) of `entries`
/// where `setup` has one, measured at `points`.
fn stage(
    args: &Args,
    setup: Setup,
    systems: Vec<System>,
    entries: u64,
    points: Vec<At>,
) -> Stage<At> {
    let cache = (setup == Setup::Cache).then(|| CacheSetup::hot_keys(entries, None, args.servers));
    let switchkv = SwitchKvSetup::of(setup, entries, None, args.servers);
    let with = match (cache, switchkv) {
        (Some(c), _) => format!(" with a cache of {} entries", c.items),
        (_, Some(k)) if k.path == CachePath::LookThrough => {
            format!(" and a look-through cache node of {} entries", k.items)
        }
        (_, Some(k)) if k.path == CachePath::LookAside => {
            format!(" and a look-aside cache node of {} entries", k.items)
        }
        (_, Some(k)) => format!(" steering to a SwitchKV cache node of {} entries", k.items),
        _ => String::new(),
    };
    Stage {
        testbed: format!(
            "1 client, {} kvswitch nodes of {} requests/s, kvswitch{with}",
            args.servers, args.capacity
        ),
        spec: BedSpec {
            prefix: args.common.prefix.clone(),
            servers: Servers::Nodes {
                n: args.servers as usize,
                capacity: args.capacity,
            },
            cache,
            switchkv,
            nutcracker: false,
            datapath: None,
            tcp: None,
        },
        preload: vec![Keys::new(args.keys, "key:", 32)],
        systems,
        points,
    }
}

/// The points measured on each system's own testbed, with a cache of `entries` where it has
/// one, in order: the skews, then the write ratios and the Zipf loads at the cache-size sweep's
/// skew, then the loads of hits only and of misses (uniform).
fn on_one_bed(args: &Args, skews: &[f64], entries: u64) -> Vec<At> {
    let at = |sweep, skew, write_ratio, load| At {
        sweep,
        skew,
        cache_entries: Some(entries),
        write_ratio,
        load,
    };
    let skewed = skews.iter().map(|&s| at(Sweep::Skew, s, 0.0, args.load));
    let writes = [Sweep::WriteRatio, Sweep::UniformWrites]
        .into_iter()
        .flat_map(|sweep| {
            args.write_ratios()
                .into_iter()
                .map(move |w| at(sweep, args.cache_skew, w, args.load))
        });
    let loads = [Sweep::Load, Sweep::Hits, Sweep::Misses]
        .into_iter()
        .flat_map(|sweep| {
            args.latency_loads().into_iter().map(move |l| {
                let skew = if sweep == Sweep::Load {
                    args.cache_skew
                } else {
                    0.0
                };
                at(sweep, skew, 0.0, l)
            })
        });
    skewed.chain(writes).chain(loads).collect()
}

fn measure(bed: &Bed, args: &Args, system: System, at: &At, run: u32) -> anyhow::Result<Point> {
    let skew = at.skew;
    let cache_entries = at.cache_entries.filter(|_| system.caches());
    let duration = args.duration();
    let (keys, key_prefix, dist) = match at.sweep {
        Sweep::Hits => (HIT_KEYS.min(args.keys), "key:", loadgen::Dist::Uniform),
        Sweep::Misses => (MISS_KEYS, "miss:", loadgen::Dist::Uniform),
        _ => (args.keys, "key:", loadgen::Dist::Zipf(skew)),
    };
    let load = loadgen::LoadArgs {
        keys,
        key_prefix: key_prefix.into(),
        value_size: 32,
        dist,
        write_dist: (at.sweep == Sweep::UniformWrites).then_some(loadgen::Dist::Uniform),
        get_ratio: 1.0 - at.write_ratio,
        concurrency: 16,
        rate: Some(args.offered_at(at.load)),
        duration,
        // The cache learns the hot keys while the load runs: give it the paper's few segments.
        warmup: if system.caches() && !args.common.short {
            3.0
        } else {
            (duration / 4.0).min(0.5)
        },
        // Lost requests are expected: a short timeout keeps requesters from waiting on them.
        timeout_ms: 100,
        seed: u64::from(run) + 1,
        ..loadgen::LoadArgs::new("")
    };
    let before = bed.backend_requests()?;
    let m = bed.load(system, &load)?;
    let after = bed.backend_requests()?;
    let r = &m.report;
    // The backend counters also cover the warm-up: divide by the whole run.
    let window = load.warmup + r.duration_s.max(1e-9);
    let backend_rps = before
        .iter()
        .zip(&after)
        .map(|(b, a)| a.saturating_sub(*b) as f64 / window)
        .collect();
    Ok(Point {
        system,
        sweep: at.sweep,
        skew,
        cache_entries,
        write_ratio: at.write_ratio,
        offered_rps: args.offered_at(at.load),
        get_rps: per_s(r.gets, r.duration_s),
        rps: per_s(r.gets + r.sets, r.duration_s),
        p50_us: r.latency_us.p50 as f64,
        p99_us: r.latency_us.p99 as f64,
        loss: loss(r),
        backend_rps,
        run,
    })
}

impl Figures for Point {
    type At = (System, Sweep, f64, Option<u64>, f64, f64);

    fn at(&self) -> Self::At {
        (
            self.system,
            self.sweep,
            self.skew,
            self.cache_entries,
            self.write_ratio,
            self.offered_rps,
        )
    }

    /// Medians per system and point of a sweep, backend loads per backend.
    fn median(runs: &Runs<'_, Point>) -> Point {
        let first = runs.first();
        Point {
            get_rps: runs.median(|p| p.get_rps),
            rps: runs.median(|p| p.rps),
            p50_us: runs.median(|p| p.p50_us),
            p99_us: runs.median(|p| p.p99_us),
            loss: runs.median(|p| p.loss),
            backend_rps: (0..first.backend_rps.len())
                .map(|i| runs.median(|p| p.backend_rps.get(i).copied().unwrap_or(0.0)))
                .collect(),
            run: runs.count(),
            ..first.clone()
        }
    }

    fn line(&self) -> String {
        let keys = match self.sweep {
            Sweep::Hits => "hits    ".to_string(),
            Sweep::Misses => "misses  ".to_string(),
            _ => format!("zipf {:<4}", self.skew),
        };
        format!(
            "{keys}  {:<24}{}{} {:>8.0} requests/s of {:.0} offered, p50 {:.0} us",
            self.system,
            self.cache_entries
                .map_or_else(String::new, |e| format!(" cache {e:>6}")),
            match self.write_ratio {
                0.0 => String::new(),
                w => format!(" writes {w}"),
            },
            self.rps,
            self.offered_rps,
            self.p50_us
        )
    }
}

/// The points of `system` in `kind`'s sweep.
fn sweep(medians: &[Point], system: System, kind: Sweep) -> Vec<&Point> {
    medians
        .iter()
        .filter(|p| p.system == system && p.sweep == kind)
        .collect()
}

fn skew_chart(args: &Args, systems: &[System], medians: &[Point]) -> LineChart {
    let mut series: Vec<Series> = systems
        .iter()
        .map(|&s| Series {
            name: s.to_string(),
            points: sweep(medians, s, Sweep::Skew)
                .iter()
                .map(|p| (p.skew, p.get_rps))
                .collect(),
            color: s.color(),
            dashed: false,
        })
        .collect();
    let skews: Vec<f64> = medians.iter().map(|p| p.skew).collect();
    let (lo, hi) = skews
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &s| {
            (a.min(s), b.max(s))
        });
    let total = args.capacity as f64 * f64::from(args.servers);
    series.push(Series {
        name: format!(
            "backends' total capacity ({} x {})",
            args.servers, args.capacity
        ),
        points: vec![(lo, total), (hi, total)],
        color: 6,
        dashed: true,
    });
    LineChart {
        title: format!(
            "Throughput of {} capacity-limited backends against key skew",
            args.servers
        ),
        x_label: "Zipf exponent (0 = uniform)".into(),
        y_label: "GETs answered per second".into(),
        x_log: false,
        y_log: false,
        y_from_zero: true,
        series,
    }
}

/// The skews the bar chart shows: uniform and the most skewed measured.
fn bar_skews(skews: &[f64]) -> Vec<f64> {
    let lo = skews.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = skews.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if lo == hi {
        vec![lo]
    } else {
        vec![lo, hi]
    }
}

fn backend_chart(args: &Args, skews: &[f64], medians: &[Point]) -> BarChart {
    let mut groups = Vec::new();
    for skew in bar_skews(skews) {
        for p in medians
            .iter()
            .filter(|p| p.sweep == Sweep::Skew && p.skew == skew)
        {
            groups.push((format!("zipf {skew}, {}", p.system), p.backend_rps.clone()));
        }
    }
    BarChart {
        title: "Requests each backend is sent".into(),
        x_label: "backend".into(),
        y_label: "requests per second".into(),
        categories: (1..=args.servers).map(|i| format!("s{i}")).collect(),
        groups,
        line: Some((
            format!("capacity ({}/s)", args.capacity),
            args.capacity as f64,
        )),
        stacked: false,
    }
}

/// The systems of the cache-size sweep: those whose cache is sized (kvswitch's, SwitchKV's
/// steered cache node).
fn sized(systems: &[System]) -> Vec<System> {
    systems
        .iter()
        .copied()
        .filter(|s| matches!(s, System::KvswitchCacheUdp | System::SwitchKvUdp))
        .collect()
}

fn cache_chart(args: &Args, systems: &[System], medians: &[Point]) -> LineChart {
    let series = sized(systems)
        .into_iter()
        .map(|system| Series {
            name: system.to_string(),
            points: medians
                .iter()
                .filter(|p| p.system == system && p.sweep == Sweep::CacheSize)
                .filter_map(|p| Some((p.cache_entries? as f64, p.get_rps)))
                .collect(),
            color: system.color(),
            dashed: false,
        })
        .collect();
    LineChart {
        title: format!("Throughput against cache size (zipf {})", args.cache_skew),
        x_label: "cache size (entries, log scale)".into(),
        y_label: "GETs answered per second".into(),
        x_log: true,
        y_log: false,
        y_from_zero: true,
        series,
    }
}

/// Zipf writes solid, uniform writes dashed.
fn write_chart(args: &Args, systems: &[System], medians: &[Point]) -> LineChart {
    let series = systems
        .iter()
        .flat_map(|&system| {
            [
                (Sweep::WriteRatio, ""),
                (Sweep::UniformWrites, ", uniform writes"),
            ]
            .map(|(which, label)| Series {
                name: format!("{system}{label}"),
                points: sweep(medians, system, which)
                    .iter()
                    .map(|p| (p.write_ratio, p.rps))
                    .collect(),
                color: system.color(),
                dashed: which == Sweep::UniformWrites,
            })
        })
        .collect();
    LineChart {
        title: format!(
            "Throughput against the share of writes (zipf {} reads; writes zipf or uniform)",
            args.cache_skew
        ),
        x_label: "share of requests that are sets".into(),
        y_label: "requests answered per second".into(),
        x_log: false,
        y_log: false,
        y_from_zero: true,
        series,
    }
}

/// Median (solid) and 99th-percentile (dashed) latency against the offered load.
fn latency_chart(args: &Args, systems: &[System], medians: &[Point], which: Sweep) -> LineChart {
    let mut series = Vec::new();
    for &system in systems {
        let pts = sweep(medians, system, which);
        for (what, dashed) in [("p50", false), ("p99", true)] {
            series.push(Series {
                name: format!("{system} {what}"),
                points: pts
                    .iter()
                    .map(|p| (p.offered_rps, if dashed { p.p99_us } else { p.p50_us }))
                    .collect(),
                color: system.color(),
                dashed,
            });
        }
    }
    LineChart {
        title: match which {
            Sweep::Hits => format!(
                "Latency against offered load, hits only ({} keys)",
                HIT_KEYS.min(args.keys)
            ),
            Sweep::Misses => "Latency against offered load, misses (keys no server holds)".into(),
            _ => format!("Latency against offered load (zipf {})", args.cache_skew),
        },
        x_label: "GETs offered per second (log scale)".into(),
        y_label: "latency of answered GETs (µs, log scale)".into(),
        x_log: true,
        y_log: true,
        y_from_zero: false,
        series,
    }
}

fn summary(
    args: &Args,
    systems: &[System],
    skews: &[f64],
    medians: &[Point],
    runs: u32,
    duration: f64,
) -> String {
    let mut t = String::new();
    let total = args.capacity as f64 * f64::from(args.servers);
    let _ = writeln!(t, "# Throughput against key skew\n");
    let _ = writeln!(
        t,
        "{} backends, each a `kvswitch node` serving at most {} requests/s (token bucket of {}; \
         UDP requests beyond it are dropped), behind kvswitch in switch mode (`l3`). One client \
         namespace offers {:.0} GETs/s ({}x the backends' total capacity) over UDP to the VIP, \
         open loop with Poisson arrivals, keys drawn from {} preloaded keys with the given Zipf \
         exponent (ranks scattered over the keyspace). {duration} s per point, medians of {runs} \
         run(s). Throughput is GETs answered per second. With the cache, kvswitch finds hot keys \
         itself (periodic top-k reports, {} per backend per second so that the {} backends \
         report as many as SwitchKV's 128 did, and the circular log); it learns them during a \
         3 s warm-up before each point and keeps them from one point to the next. With \
         SwitchKV, the backends report the same way to a cache node (`kvswitch node --role \
         cache`, as many entries) on a host of its own, which installs a `kv_steer` entry per \
         key it holds in kvswitch; kvswitch has no cache of its own then. SwitchKV's own \
         clients (client-encoded) send each request as a frame with its key's hash in the \
         destination MAC to its backend's address (`kvswitch load --switchkv`), which kvswitch \
         steers by that hash without reading the request. Look-through sends \
         every request to that cache node instead, which answers what it holds and relays the \
         rest to the VIP over UDP (a backend over capacity drops it as it would a client's). \
         Look-aside clients ask the cache node first and the VIP on a miss.\n",
        args.servers,
        args.capacity,
        super::bed::node_burst(args.capacity),
        args.offered(),
        args.load,
        args.keys,
        super::bed::PAPER_REPORTS_PER_SEGMENT.div_ceil(u64::from(args.servers.max(1))),
        args.servers
    );
    let _ = write!(t, "| Zipf exponent |");
    for s in systems {
        let _ = write!(t, " {s} GET/s | busiest backend (req/s) |");
    }
    let _ = writeln!(t);
    let _ = writeln!(t, "|--:|{}", "--:|--:|".repeat(systems.len()));
    for &skew in skews {
        let _ = write!(t, "| {skew} |");
        for &s in systems {
            let p = sweep(medians, s, Sweep::Skew)
                .into_iter()
                .find(|p| p.skew == skew);
            let busiest = p.map(|p| p.backend_rps.iter().copied().fold(0.0, f64::max));
            let _ = write!(
                t,
                " {} | {} |",
                fmt(p.map(|p| p.get_rps), 0),
                fmt(busiest, 0)
            );
        }
        let _ = writeln!(t);
    }
    let _ = writeln!(t);
    for &s in systems {
        let pts = sweep(medians, s, Sweep::Skew);
        let uniform = pts.iter().find(|p| p.skew == 0.0).map(|p| p.get_rps);
        for p in pts.iter().filter(|p| p.skew > 0.0) {
            let _ = writeln!(
                t,
                "- {s}, zipf {}: {:.0} GET/s, {} of uniform's, {:.0}% of the total capacity.",
                p.skew,
                p.get_rps,
                times(ratio(Some(p.get_rps), uniform)),
                p.get_rps / total * 100.0
            );
        }
    }
    let _ = writeln!(t);
    let base = sweep(medians, System::KvswitchUdp, Sweep::Skew);
    for &s in systems.iter().filter(|s| s.caches()) {
        for p in sweep(medians, s, Sweep::Skew) {
            let without = base.iter().find(|b| b.skew == p.skew).map(|b| b.get_rps);
            let _ = writeln!(
                t,
                "- {s} against no cache, zipf {}: {} ({:.0} against {} GET/s).",
                p.skew,
                times(ratio(Some(p.get_rps), without)),
                p.get_rps,
                fmt(without, 0)
            );
        }
    }
    let _ = writeln!(
        t,
        "\n| cache entries | system | GET/s at zipf {} |",
        args.cache_skew
    );
    let _ = writeln!(t, "|--:|---|--:|");
    for &system in &sized(systems) {
        for p in sweep(medians, system, Sweep::CacheSize) {
            let _ = writeln!(
                t,
                "| {} | {system} | {:.0} |",
                p.cache_entries.unwrap_or(0),
                p.get_rps
            );
        }
    }
    let _ = writeln!(
        t,
        "\nWith writes (sets of 32 bytes to the keys the same Zipf {} draws / to keys drawn \
         uniformly, sent to the VIP, or to the cache node on the path of every request), \
         requests answered per second:\n",
        args.cache_skew
    );
    let _ = write!(t, "| share of sets |");
    for s in systems {
        let _ = write!(t, " {s} |");
    }
    let _ = writeln!(t, "\n|--:|{}", "--:|".repeat(systems.len()));
    for w in args.write_ratios() {
        let _ = write!(t, "| {w} |");
        for &s in systems {
            let rps = |which| {
                sweep(medians, s, which)
                    .into_iter()
                    .find(|p| p.write_ratio == w)
                    .map(|p| p.rps)
            };
            let _ = write!(
                t,
                " {} / {} |",
                fmt(rps(Sweep::WriteRatio), 0),
                fmt(rps(Sweep::UniformWrites), 0)
            );
        }
        let _ = writeln!(t);
    }
    for (which, what) in [
        (
            Sweep::Load,
            format!("zipf {} (Figure 13c)", args.cache_skew),
        ),
        (
            Sweep::Hits,
            format!(
                "only the {} first keys, uniformly, which the caches take in during the warm-up \
                 (Figure 13a)",
                HIT_KEYS.min(args.keys)
            ),
        ),
        (
            Sweep::Misses,
            format!(
                "keys no server holds ({MISS_KEYS} under `miss:`), uniformly: every read a miss \
                 of the caches and of the servers (Figure 13b)"
            ),
        ),
    ] {
        let _ = writeln!(
            t,
            "\nLatency of answered GETs (median / 99th percentile, µs) and GETs answered per \
             second, at loads offered as a multiple of the backends' total capacity ({:.0}/s), \
             {what}:\n",
            total
        );
        let _ = write!(t, "| offered |");
        for s in systems {
            let _ = write!(t, " {s} |");
        }
        let _ = writeln!(t, "\n|--:|{}", "--:|".repeat(systems.len()));
        for load in args.latency_loads() {
            let offered = args.offered_at(load);
            let _ = write!(t, "| {offered:.0} ({load}x) |");
            for &s in systems {
                let p = sweep(medians, s, which)
                    .into_iter()
                    .find(|p| p.offered_rps == offered);
                let cell = p.map_or_else(
                    || "-".to_string(),
                    |p| format!("{:.0} / {:.0} µs, {:.0}/s", p.p50_us, p.p99_us, p.get_rps),
                );
                let _ = write!(t, " {cell} |");
            }
            let _ = writeln!(t);
        }
    }
    t
}
