//! `kvswitch bench value-size`: the round-trip time of one GET at a time for values from 32
//! bytes to 11 KB, as MemSwitch's value-size curve draws it, for the systems of the latency
//! comparison on one testbed, side by side in one run.

use std::fmt::Write as _;

use serde::Serialize;

use super::bed::{by_setup, System, PEERS};
use super::output::{fmt, ratio, times};
use super::plot::{Chart, LineChart, Series};
use super::runner::{Figures, Keys, Record, Runner, Runs, Stage};
use super::Common;
use crate::measure::{loss, per_s};

pub const NAME: &str = "value-size";
/// Largest value: a GET reply then spans 8 UDP datagrams.
const MAX_SIZE: u32 = 11_000;

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// Value sizes in bytes, comma-separated, 1 to 11000
    /// [default: 32,128,512,1024,2048,4096,8192,11000; 32,11000 with --short].
    #[arg(long, value_delimiter = ',', value_name = "BYTES,...")]
    pub sizes: Vec<u32>,
    /// Seconds measured per size and system [default: 1; 0.3 with --short].
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Keys preloaded per size.
    #[arg(long, default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub keys: u64,
}

impl Args {
    pub fn with(common: Common) -> Args {
        Args {
            common,
            sizes: Vec::new(),
            duration: None,
            keys: 1000,
        }
    }

    fn sizes(&self) -> Vec<u32> {
        if !self.sizes.is_empty() {
            self.sizes.clone()
        } else if self.common.short {
            vec![32, MAX_SIZE]
        } else {
            vec![32, 128, 512, 1024, 2048, 4096, 8192, MAX_SIZE]
        }
    }

    fn duration(&self) -> f64 {
        self.duration
            .unwrap_or(if self.common.short { 0.3 } else { 1.0 })
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Point {
    pub system: System,
    pub value_size: u32,
    pub p50_us: f64,
    pub p99_us: f64,
    pub get_rps: f64,
    pub loss: f64,
    pub run: u32,
}

impl Figures for Point {
    type At = (System, u32);

    fn at(&self) -> (System, u32) {
        (self.system, self.value_size)
    }

    fn median(runs: &Runs<'_, Point>) -> Point {
        Point {
            system: runs.first().system,
            value_size: runs.first().value_size,
            p50_us: runs.median(|p| p.p50_us),
            p99_us: runs.median(|p| p.p99_us),
            get_rps: runs.median(|p| p.get_rps),
            loss: runs.median(|p| p.loss),
            run: runs.count(),
        }
    }

    fn line(&self) -> String {
        format!(
            "{:>6} B  {:<24} p50 {:>6.0} µs  p99 {:>6.0} µs",
            self.value_size, self.system, self.p50_us, self.p99_us
        )
    }
}

#[derive(Serialize)]
struct Settings {
    sizes: Vec<u32>,
    duration_s: f64,
    runs: u32,
    keys_per_size: u64,
    servers: usize,
    short: bool,
}

pub fn run(args: &Args) -> anyhow::Result<Vec<Point>> {
    let sizes = args.sizes();
    if let Some(bad) = sizes.iter().find(|&&s| s == 0 || s > MAX_SIZE) {
        anyhow::bail!("--sizes: {bad} is outside 1..={MAX_SIZE} bytes");
    }
    let duration = args.duration();
    super::check_duration(duration)?;
    let runner = Runner::start(NAME, &args.common)?;
    let runs = runner.runs();
    let systems = System::compared();
    // With the cache, it may hold every key read.
    let cache_keys = args.keys * sizes.len() as u64;
    let stages = by_setup(&systems).into_iter().map(|(setup, group)| Stage {
        preload: sizes
            .iter()
            .map(|&size| Keys::new(args.keys, &key_prefix(size), size as usize))
            .collect(),
        points: sizes.clone(),
        ..Stage::peers(&args.common, setup, group, cache_keys, PEERS)
    });
    let points = runner.measure(stages, |bed, system, &size, run| {
        let load = loadgen::LoadArgs {
            keys: args.keys,
            key_prefix: key_prefix(size),
            value_size: size as usize,
            get_ratio: 1.0,
            concurrency: 1,
            duration,
            warmup: 0.1,
            seed: u64::from(run) + 1,
            ..loadgen::LoadArgs::new("")
        };
        let m = bed.load(system, &load)?;
        let r = &m.report;
        if r.gets > 0 && r.hits < r.gets {
            anyhow::bail!(
                "{system}: {} of {} gets of {size}-byte values missed a preloaded key",
                r.gets - r.hits,
                r.gets
            );
        }
        Ok(Point {
            system,
            value_size: size,
            p50_us: r.latency_us.p50 as f64,
            p99_us: r.latency_us.p99 as f64,
            get_rps: per_s(r.gets, r.duration_s),
            loss: loss(r),
            run,
        })
    })?;
    let mut medians = super::runner::medians(&points);
    medians.sort_by_key(|p| systems.iter().position(|&s| s == p.system));
    runner.finish(
        Record {
            settings: Settings {
                sizes: sizes.clone(),
                duration_s: duration,
                runs,
                keys_per_size: args.keys,
                servers: PEERS,
                short: args.common.short,
            },
            systems: Some(&systems),
            runs: &points,
            medians: &medians,
            more: (),
        },
        vec![("value-size".into(), Chart::Line(chart(&systems, &medians)))],
        &summary(&systems, &sizes, &medians, runs, duration),
    )?;
    Ok(medians)
}

/// Each size has its own keys, so one preload serves every run.
fn key_prefix(size: u32) -> String {
    format!("v{size}:")
}

fn chart(systems: &[System], medians: &[Point]) -> LineChart {
    let series = systems
        .iter()
        .map(|&s| Series {
            name: s.to_string(),
            points: medians
                .iter()
                .filter(|p| p.system == s)
                .map(|p| (f64::from(p.value_size), p.p50_us))
                .collect(),
            color: s.color(),
            dashed: false,
        })
        .collect();
    LineChart {
        title: "GET round-trip time against value size (median)".into(),
        x_label: "value size (bytes, log scale)".into(),
        y_label: "round-trip time (µs)".into(),
        x_log: true,
        y_log: false,
        y_from_zero: true,
        series,
    }
}

fn summary(
    systems: &[System],
    sizes: &[u32],
    medians: &[Point],
    runs: u32,
    duration: f64,
) -> String {
    let mut t = String::new();
    let _ = writeln!(t, "# GET round-trip time against value size\n");
    let _ = writeln!(
        t,
        "One GET at a time (a closed loop of one requester), {duration} s per size and system, \
         medians of {runs} run(s) with the systems in rotating order; the testbed of the \
         latency comparison ({PEERS} memcached in `l2` mode behind kvswitch). Over UDP a \
         reply of more than about 1,400 bytes travels as several datagrams. Median (p99) in \
         µs:\n"
    );
    let _ = write!(t, "| value size (B) |");
    for s in systems {
        let _ = write!(t, " {s} |");
    }
    let _ = writeln!(t);
    let _ = writeln!(t, "|--:|{}", "--:|".repeat(systems.len()));
    let find = |s: System, size: u32| {
        medians
            .iter()
            .find(|p| p.system == s && p.value_size == size)
    };
    for &size in sizes {
        let _ = write!(t, "| {size} |");
        for &s in systems {
            let p = find(s, size);
            let _ = write!(
                t,
                " {} ({}) |",
                fmt(p.map(|p| p.p50_us), 0),
                fmt(p.map(|p| p.p99_us), 0)
            );
        }
        let _ = writeln!(t);
    }
    let pairs = [
        (System::KvswitchUdp, System::DirectUdp),
        (System::KvswitchTcp, System::DirectTcp),
        (System::KvswitchTcp, System::Nutcracker),
    ];
    let _ = write!(t, "\n| median ratio |");
    for size in sizes {
        let _ = write!(t, " {size} B |");
    }
    let _ = writeln!(t);
    let _ = writeln!(t, "|---|{}", "--:|".repeat(sizes.len()));
    for (a, b) in pairs {
        let _ = write!(t, "| {a} / {b} |");
        for &size in sizes {
            let _ = write!(
                t,
                " {} |",
                times(ratio(
                    find(a, size).map(|p| p.p50_us),
                    find(b, size).map(|p| p.p50_us)
                ))
            );
        }
        let _ = writeln!(t);
    }
    let _ = writeln!(
        t,
        "\nkvswitch + cache runs with a cache that admits every key read and holds the whole \
         keyspace (`admit = \"every\"`): after its first read, every GET is answered by \
         kvswitch itself, on the UDP path and in the proxy."
    );
    t
}
