//! `kvswitch bench latency-throughput`: GET latency (median and p99) against offered rate, as
//! MemSwitch's throughput curve draws it, for memcached direct, nutcracker, kvswitch switch
//! mode and kvswitch's proxy on one testbed, side by side in one run. The load is an open
//! loop with Poisson arrivals, so latency counts queueing from each request's scheduled time
//! and a system past its limit shows as a knee rather than as a slower client.

use std::fmt::Write as _;

use serde::Serialize;

use super::bed::{by_setup, System, PEERS};
use super::output::{fmt, ratio, times};
use super::plot::{Chart, LineChart, Series};
use super::runner::{Figures, Keys, Record, Runner, Runs, Stage};
use super::Common;
use crate::measure::{loss, per_s};

pub const NAME: &str = "latency-throughput";
/// A point is sustained when at least this share of the offered rate was answered ...
const SUSTAINED: f64 = 0.95;
/// ... at most this share of requests failed or timed out ...
const MAX_LOSS: f64 = 0.01;
/// ... and the median stayed below this many µs: above it, queues are building up.
const MAX_P50_US: f64 = 5000.0;

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// Offered GET rates in requests per second, comma-separated
    /// [default: 5000,10000,20000,30000,40000; 2000,8000 with --short].
    #[arg(long, value_delimiter = ',', value_name = "RPS,...")]
    pub rates: Vec<f64>,
    /// Seconds measured at each rate [default: 1.5; 0.5 with --short].
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Open-loop requesters (UDP sockets or TCP connections) sharing the arrivals.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub concurrency: u32,
    /// Keys preloaded and read (uniformly).
    #[arg(long, default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub keys: u64,
    /// Value size of the keys, in bytes.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub value_size: u32,
    /// memcached servers behind nutcracker and kvswitch (MemSwitch's Figure 3 runs one and
    /// two); memcached direct talks to the first, which holds every key.
    #[arg(long, default_value_t = PEERS as u32, value_parser = clap::value_parser!(u32).range(1..=8))]
    pub servers: u32,
}

impl Args {
    /// The defaults, with `common`.
    pub fn with(common: Common) -> Args {
        Args {
            common,
            rates: Vec::new(),
            duration: None,
            concurrency: 16,
            keys: 10_000,
            value_size: 100,
            servers: PEERS as u32,
        }
    }

    fn rates(&self) -> Vec<f64> {
        if !self.rates.is_empty() {
            self.rates.clone()
        } else if self.common.short {
            vec![2000.0, 8000.0]
        } else {
            vec![5000.0, 10_000.0, 20_000.0, 30_000.0, 40_000.0]
        }
    }

    fn duration(&self) -> f64 {
        self.duration
            .unwrap_or(if self.common.short { 0.5 } else { 1.5 })
    }

    fn warmup(&self) -> f64 {
        (self.duration() / 4.0).min(0.5)
    }
}

/// One system at one rate in one run.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    pub system: System,
    pub offered_rps: f64,
    /// Gets answered per second.
    pub get_rps: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Requests that failed or timed out, as a share of all requests.
    pub loss: f64,
    pub run: u32,
}

impl Figures for Point {
    type At = (System, f64);

    fn at(&self) -> (System, f64) {
        (self.system, self.offered_rps)
    }

    fn median(runs: &Runs<'_, Point>) -> Point {
        Point {
            system: runs.first().system,
            offered_rps: runs.first().offered_rps,
            get_rps: runs.median(|p| p.get_rps),
            p50_us: runs.median(|p| p.p50_us),
            p99_us: runs.median(|p| p.p99_us),
            loss: runs.median(|p| p.loss),
            run: runs.count(),
        }
    }

    fn line(&self) -> String {
        let at = if self.offered_rps == LIGHT {
            "light     ".to_string()
        } else {
            format!("{:>8.0}/s", self.offered_rps)
        };
        format!(
            "{at}  {:<24} {:>8.0} GET/s  p50 {:>6.0} µs  p99 {:>7.0} µs{}",
            self.system,
            self.get_rps,
            self.p50_us,
            self.p99_us,
            if self.loss > 0.0 && self.offered_rps != LIGHT {
                format!("  lost {:.1}%", self.loss * 100.0)
            } else {
                String::new()
            }
        )
    }
}

#[derive(Serialize)]
struct Settings {
    rates: Vec<f64>,
    duration_s: f64,
    warmup_s: f64,
    runs: u32,
    concurrency: u32,
    keys: u64,
    value_size: u32,
    servers: usize,
    short: bool,
}

/// The light-load figures, recorded beside the others.
#[derive(Serialize)]
struct Light<'a> {
    /// One closed-loop requester (light load): each run, and the medians.
    light_runs: &'a [Point],
    light_medians: &'a [Point],
}

pub fn run(args: &Args) -> anyhow::Result<Vec<Point>> {
    let rates = args.rates();
    let duration = args.duration();
    check_rates(&rates)?;
    super::check_duration(duration)?;
    let runner = Runner::start(NAME, &args.common)?;
    let runs = runner.runs();
    let systems = System::compared();
    // Light load first: one request at a time, what a lone client waits.
    let at: Vec<f64> = [LIGHT].into_iter().chain(rates.iter().copied()).collect();
    // With the cache, it may hold every key read.
    let stages = by_setup(&systems).into_iter().map(|(setup, group)| Stage {
        preload: vec![Keys::new(args.keys, "key:", args.value_size as usize)],
        points: at.clone(),
        ..Stage::peers(&args.common, setup, group, args.keys, args.servers as usize)
    });
    let all = runner.measure(stages, |bed, system, &rate, run| {
        let load = loadgen::LoadArgs {
            keys: args.keys,
            value_size: args.value_size as usize,
            get_ratio: 1.0,
            concurrency: if rate == LIGHT {
                1
            } else {
                args.concurrency as usize
            },
            rate: (rate != LIGHT).then_some(rate),
            duration,
            warmup: args.warmup(),
            seed: u64::from(run) + 1,
            ..loadgen::LoadArgs::new("")
        };
        let r = bed.load(system, &load)?.report;
        Ok(Point {
            system,
            offered_rps: rate,
            get_rps: per_s(r.gets, r.duration_s),
            p50_us: r.latency_us.p50 as f64,
            p99_us: r.latency_us.p99 as f64,
            loss: loss(&r),
            run,
        })
    })?;
    let (light, points): (Vec<Point>, Vec<Point>) =
        all.into_iter().partition(|p| p.offered_rps == LIGHT);
    let medians = medians(&systems, &points);
    let light_medians = self::medians(&systems, &light);
    runner.finish(
        Record {
            settings: Settings {
                rates: rates.clone(),
                duration_s: duration,
                warmup_s: args.warmup(),
                runs,
                concurrency: args.concurrency,
                keys: args.keys,
                value_size: args.value_size,
                servers: args.servers as usize,
                short: args.common.short,
            },
            systems: Some(&systems),
            runs: &points,
            medians: &medians,
            more: Light {
                light_runs: &light,
                light_medians: &light_medians,
            },
        },
        vec![("latency".into(), Chart::Line(chart(&systems, &medians)))],
        &summary(
            args,
            &systems,
            &rates,
            &medians,
            &light_medians,
            runs,
            duration,
        ),
    )?;
    Ok(medians)
}

fn check_rates(rates: &[f64]) -> anyhow::Result<()> {
    for &r in rates {
        if !r.is_finite() || !(loadgen::MIN_RATE..=1e8).contains(&r) {
            anyhow::bail!("--rates: {r} is not a rate between 0.001 and 100,000,000 per second");
        }
    }
    Ok(())
}

/// The median of each figure per system and rate, in the order of `systems`.
fn medians(systems: &[System], points: &[Point]) -> Vec<Point> {
    let mut medians = super::runner::medians(points);
    medians.sort_by_key(|p| systems.iter().position(|&s| s == p.system));
    medians
}

fn sustained(p: &Point) -> bool {
    p.get_rps >= SUSTAINED * p.offered_rps && p.loss <= MAX_LOSS && p.p50_us <= MAX_P50_US
}

fn chart(systems: &[System], medians: &[Point]) -> LineChart {
    let mut series = Vec::new();
    for &s in systems {
        let of: Vec<&Point> = medians.iter().filter(|p| p.system == s).collect();
        series.push(Series {
            name: format!("{s} median"),
            points: of.iter().map(|p| (p.offered_rps, p.p50_us)).collect(),
            color: s.color(),
            dashed: false,
        });
        series.push(Series {
            name: format!("{s} p99"),
            points: of.iter().map(|p| (p.offered_rps, p.p99_us)).collect(),
            color: s.color(),
            dashed: true,
        });
    }
    LineChart {
        title: "GET latency against offered load (open loop, Poisson)".into(),
        x_label: "offered load (GET/s)".into(),
        y_label: "latency (µs, log scale)".into(),
        x_log: false,
        y_log: true,
        y_from_zero: false,
        series,
    }
}

/// The offered rate a light-load point is filed under: one closed-loop requester.
pub const LIGHT: f64 = 0.0;

fn summary(
    args: &Args,
    systems: &[System],
    rates: &[f64],
    medians: &[Point],
    light: &[Point],
    runs: u32,
    duration: f64,
) -> String {
    let mut t = String::new();
    let _ = writeln!(t, "# GET latency against offered load\n");
    let _ = writeln!(
        t,
        "## Light load\n\nOne closed-loop requester (one request at a time), {duration} s, \
         medians of {runs} run(s):\n"
    );
    let _ = writeln!(t, "| system | p50 (µs) | p99 (µs) | GET/s |");
    let _ = writeln!(t, "|---|--:|--:|--:|");
    for p in light {
        let _ = writeln!(
            t,
            "| {} | {:.0} | {:.0} | {:.0} |",
            p.system, p.p50_us, p.p99_us, p.get_rps
        );
    }
    let of = |s: System| light.iter().find(|p| p.system == s);
    let pairs = [
        (System::KvswitchTcp, System::DirectTcp),
        (System::KvswitchTcp, System::KvswitchTcpProxy),
        (System::KvswitchTcpProxy, System::DirectTcp),
        (System::KvswitchCacheUdp, System::DirectUdp),
        (System::KvswitchCacheUdp, System::KvswitchUdp),
        (System::KvswitchCacheTcp, System::DirectTcp),
        (System::KvswitchCacheTcp, System::KvswitchTcp),
    ];
    let _ = writeln!(t, "\n| ratio at light load | p50 | p99 |\n|---|--:|--:|");
    for (a, b) in pairs {
        if let (Some(x), Some(y)) = (of(a), of(b)) {
            let _ = writeln!(
                t,
                "| {a} / {b} | {:.2}x | {:.2}x |",
                x.p50_us / y.p50_us.max(1e-9),
                x.p99_us / y.p99_us.max(1e-9)
            );
        }
    }
    let _ = writeln!(t, "\n## Against offered load\n");
    let _ = writeln!(
        t,
        "Open-loop GETs with Poisson arrivals from {} requesters in one client namespace, {} \
         keys of {} bytes read uniformly, {} s per point after a short warm-up, medians of {} \
         run(s) with the systems in rotating order. One testbed: {} memcached servers \
         and the client joined by kvswitch in `l2` mode, so that every system's packets cross \
         the same switch: memcached direct talks to the first server (which holds every key) \
         at its own address, nutcracker runs in the client's namespace, kvswitch switch mode \
         is UDP to the VIP, kvswitch splice is TCP to the VIP routed by the switch, and \
         kvswitch proxy path is TCP to the VIP on a testbed of its own whose kvswitch sends it \
         to its proxy (`switch.tcp = \"proxy\"`). A point is *sustained* when \
         at least {:.0}% of the offered rate was answered, at most {:.0}% of requests were \
         lost and the median stayed below {:.0} ms.\n",
        args.concurrency,
        args.keys,
        args.value_size,
        duration,
        runs,
        args.servers,
        SUSTAINED * 100.0,
        MAX_LOSS * 100.0,
        MAX_P50_US / 1000.0
    );
    let _ = write!(t, "| offered GET/s |");
    for s in systems {
        let _ = write!(t, " {s} p50 / p99 (µs) |");
    }
    let _ = writeln!(t);
    let _ = writeln!(t, "|--:|{}", "--:|".repeat(systems.len()));
    for &rate in rates {
        let _ = write!(t, "| {rate:.0} |");
        for &s in systems {
            match medians
                .iter()
                .find(|p| p.system == s && p.offered_rps == rate)
            {
                Some(p) => {
                    let _ = write!(
                        t,
                        " {:.0} / {:.0}{} |",
                        p.p50_us,
                        p.p99_us,
                        if sustained(p) { "" } else { " (not sustained)" }
                    );
                }
                None => {
                    let _ = write!(t, " - |");
                }
            }
        }
        let _ = writeln!(t);
    }
    // Headline: light-load latency and the highest sustained rate, with ratios.
    let light = |s: System| {
        medians
            .iter()
            .find(|p| p.system == s && Some(p.offered_rps) == rates.first().copied())
    };
    let best = |s: System| {
        medians
            .iter()
            .filter(|p| p.system == s && sustained(p))
            .map(|p| p.offered_rps)
            .fold(None, |a: Option<f64>, r| Some(a.map_or(r, |a| a.max(r))))
    };
    let _ = writeln!(
        t,
        "\n| system | p50 at {:.0}/s (µs) | p99 at {:.0}/s (µs) | highest sustained rate (GET/s) |",
        rates[0], rates[0]
    );
    let _ = writeln!(t, "|---|--:|--:|--:|");
    for &s in systems {
        let l = light(s);
        let _ = writeln!(
            t,
            "| {s} | {} | {} | {} |",
            fmt(l.map(|p| p.p50_us), 0),
            fmt(l.map(|p| p.p99_us), 0),
            best(s).map_or_else(|| format!("below {:.0}", rates[0]), |r| format!("{r:.0}"))
        );
    }
    let pairs = [
        (System::KvswitchUdp, System::DirectUdp),
        (System::KvswitchTcp, System::DirectTcp),
        (System::KvswitchTcp, System::Nutcracker),
        (System::KvswitchTcp, System::KvswitchTcpProxy),
        (System::KvswitchTcpProxy, System::Nutcracker),
        (System::KvswitchUdp, System::Nutcracker),
    ];
    let _ = writeln!(
        t,
        "\n| ratio | p50 at {:.0}/s | p99 at {:.0}/s | highest sustained rate |",
        rates[0], rates[0]
    );
    let _ = writeln!(t, "|---|--:|--:|--:|");
    for (a, b) in pairs {
        if !systems.contains(&a) || !systems.contains(&b) {
            continue;
        }
        let _ = writeln!(
            t,
            "| {a} / {b} | {} | {} | {} |",
            times(ratio(
                light(a).map(|p| p.p50_us),
                light(b).map(|p| p.p50_us)
            )),
            times(ratio(
                light(a).map(|p| p.p99_us),
                light(b).map(|p| p.p99_us)
            )),
            times(ratio(best(a), best(b)))
        );
    }
    let _ = writeln!(
        t,
        "\nA highest sustained rate equal to the largest rate offered means the system was not \
         driven to its limit; the ratio is then a lower bound."
    );
    let _ = writeln!(
        t,
        "\nkvswitch + cache runs with a cache that admits every key read and holds the whole \
         keyspace (`admit = \"every\"`): after its first read, every GET is answered by \
         kvswitch itself, on the UDP path and in the proxy."
    );
    t
}
