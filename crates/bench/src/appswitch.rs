//! `kvswitch bench appswitch`: AppSwitch's Table 1 (shared seed 001, section 4). One memcached
//! server, a client sending half SETs and half GETs in closed loops, and the requests routed
//! either through a proxy (the paper's McRouter; here nutcracker, the proxy fleets run) or by
//! the switch itself (the paper's AppSwitch; here kvswitch's VIP over UDP and over TCP), with
//! memcached direct as the floor: requests per second and the mean, p95 and p99 latency.

use std::fmt::Write as _;

use serde::Serialize;

use super::bed::{BedSpec, Servers, System};
use super::cost::Cpu;
use super::output::{fmt, ratio, times};
use super::plot::{BarChart, Chart};
use super::runner::{Figures, Keys, Record, Runner, Runs, Stage};
use super::Common;
use crate::measure::per_s;

pub const NAME: &str = "appswitch";

/// AppSwitch's Table 1, as the paper prints it: the proxy (McRouter) baseline and AppSwitch.
/// The paper labels the latencies ms; at the rates it gives they can only be µs.
pub const PAPER: [PaperRow; 2] = [
    PaperRow {
        system: "McRouter (baseline)",
        qps: 631.0,
        mean: 1696.7,
        p95: 2025.4,
        p99: 4122.5,
    },
    PaperRow {
        system: "AppSwitch",
        qps: 1156.8,
        mean: 967.8,
        p95: 1368.2,
        p99: 1547.7,
    },
];

/// One row of the paper's table.
pub struct PaperRow {
    pub system: &'static str,
    pub qps: f64,
    pub mean: f64,
    pub p95: f64,
    pub p99: f64,
}

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// Closed-loop requesters (one request outstanding each).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub concurrency: u32,
    /// Seconds measured per system [default: 5; 0.5 with --short].
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Keys preloaded, read and written (uniformly).
    #[arg(long, default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub keys: u64,
    /// Value size in bytes (mutilate's default, which the paper ran).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub value_size: u32,
    /// The share of requests that are GETs, 0 to 1; the rest are SETs.
    #[arg(long, default_value_t = 0.5, value_parser = share)]
    pub get_ratio: f64,
}

fn share(s: &str) -> anyhow::Result<f64> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => anyhow::bail!("{s:?}: a share from 0 to 1 (0.5: half GETs, half SETs)"),
    }
}

impl Args {
    pub fn with(common: Common) -> Args {
        Args {
            common,
            concurrency: 8,
            duration: None,
            keys: 10_000,
            value_size: 200,
            get_ratio: 0.5,
        }
    }

    fn duration(&self) -> f64 {
        self.duration
            .unwrap_or(if self.common.short { 0.5 } else { 5.0 })
    }

    fn load(&self, run: u32) -> loadgen::LoadArgs {
        let duration = self.duration();
        loadgen::LoadArgs {
            keys: self.keys,
            value_size: self.value_size as usize,
            get_ratio: self.get_ratio,
            concurrency: self.concurrency as usize,
            duration,
            warmup: (duration / 4.0).min(0.5),
            seed: u64::from(run) + 1,
            ..loadgen::LoadArgs::new("")
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Point {
    pub system: System,
    /// Requests (GETs and SETs) answered per second.
    pub qps: f64,
    pub mean_us: f64,
    pub p95_us: f64,
    pub p99_us: f64,
    /// Requests that failed or timed out, of all sent.
    pub failed: u64,
    /// CPU µs per request of the middle boxes on the path: kvswitch always (it is the
    /// network), nutcracker for nutcracker.
    pub middle_us: Option<f64>,
    pub run: u32,
}

impl Figures for Point {
    type At = System;

    fn at(&self) -> System {
        self.system
    }

    fn median(runs: &Runs<'_, Point>) -> Point {
        Point {
            system: runs.first().system,
            qps: runs.median(|p| p.qps),
            mean_us: runs.median(|p| p.mean_us),
            p95_us: runs.median(|p| p.p95_us),
            p99_us: runs.median(|p| p.p99_us),
            failed: runs.iter().map(|p| p.failed).sum(),
            middle_us: runs.median_of_some(|p| p.middle_us),
            run: runs.count(),
        }
    }

    fn line(&self) -> String {
        format!(
            "{:<24} {:>8.0} req/s  mean {:>6.0} µs  p95 {:>6.0} µs  p99 {:>6.0} µs  middle boxes \
             {} µs/req",
            self.system,
            self.qps,
            self.mean_us,
            self.p95_us,
            self.p99_us,
            fmt(self.middle_us, 2)
        )
    }
}

#[derive(Serialize)]
struct Settings {
    concurrency: u32,
    duration_s: f64,
    runs: u32,
    keys: u64,
    value_size: u32,
    get_ratio: f64,
    servers: usize,
    short: bool,
}

/// The systems of the table: the proxy and the switch's routes, then memcached direct.
const SYSTEMS: [System; 5] = [
    System::Nutcracker,
    System::KvswitchUdp,
    System::KvswitchTcp,
    System::DirectUdp,
    System::DirectTcp,
];

pub fn run(args: &Args) -> anyhow::Result<Vec<Point>> {
    let duration = args.duration();
    super::check_duration(duration)?;
    let runner = Runner::start(NAME, &args.common)?;
    let runs = runner.runs();
    let stage = Stage {
        testbed: "1 client, 1 memcached, kvswitch, nutcracker".into(),
        spec: BedSpec {
            prefix: args.common.prefix.clone(),
            servers: Servers::Memcached { n: 1 },
            cache: None,
            switchkv: None,
            nutcracker: true,
            datapath: None,
            tcp: None,
        },
        preload: vec![Keys::new(args.keys, "key:", args.value_size as usize)],
        systems: SYSTEMS.to_vec(),
        points: vec![()],
    };
    let points = runner.measure([stage], |bed, system, (), run| {
        let load = args.load(run);
        let m = bed.load(system, &load)?;
        let middle_us = Cpu::per_request(system, &m, load.warmup).middle_us;
        let r = &m.report;
        Ok(Point {
            system,
            qps: per_s(r.gets + r.sets, r.duration_s),
            mean_us: r.latency_us.mean,
            p95_us: r.latency_us.p95 as f64,
            p99_us: r.latency_us.p99 as f64,
            failed: r.errors + r.timeouts,
            middle_us,
            run,
        })
    })?;
    let medians = super::runner::medians(&points);
    let systems = SYSTEMS.to_vec();
    runner.finish(
        Record {
            settings: Settings {
                concurrency: args.concurrency,
                duration_s: duration,
                runs,
                keys: args.keys,
                value_size: args.value_size,
                get_ratio: args.get_ratio,
                servers: 1,
                short: args.common.short,
            },
            systems: Some(&systems),
            runs: &points,
            medians: &medians,
            more: (),
        },
        vec![("latency".into(), Chart::Bars(chart(&medians)))],
        &summary(args, &medians, runs, duration),
    )?;
    Ok(medians)
}

fn chart(medians: &[Point]) -> BarChart {
    let series =
        |name: &str, f: fn(&Point) -> f64| (name.to_string(), medians.iter().map(f).collect());
    BarChart {
        title: "AppSwitch's Table 1: 50% SET, 50% GET to one memcached".into(),
        x_label: "system".into(),
        y_label: "latency (µs)".into(),
        categories: medians
            .iter()
            .map(|p| {
                p.system
                    .to_string()
                    .replace("memcached direct", "direct")
                    .replace("kvswitch ", "kvs ")
            })
            .collect(),
        groups: vec![
            series("mean", |p| p.mean_us),
            series("p95", |p| p.p95_us),
            series("p99", |p| p.p99_us),
        ],
        line: None,
        stacked: false,
    }
}

/// The ratio of the switch's route to the proxy's, as the paper gives AppSwitch's to
/// McRouter's.
fn paper_ratio(f: fn(&PaperRow) -> f64) -> f64 {
    f(&PAPER[1]) / f(&PAPER[0])
}

fn summary(args: &Args, medians: &[Point], runs: u32, duration: f64) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "# AppSwitch's Table 1: requests through a proxy or routed by the switch\n"
    );
    let _ = writeln!(
        t,
        "{} closed-loop requesters send {:.0}% GETs and {:.0}% SETs of {} keys of {} bytes to one \
         memcached, {} s per system, medians of {runs} run(s) with the systems in rotating \
         order. nutcracker stands for the paper's McRouter (a proxy on the path), kvswitch's VIP \
         for AppSwitch (the switch routes by the request's key). Middle boxes' CPU: the process \
         time (user + system, from /proc) of kvswitch (the network for every system here) \
         and, for nutcracker, of nutcracker; the XDP program's and the kernel's softirq time \
         count for whichever task they ran in.\n",
        args.concurrency,
        args.get_ratio * 100.0,
        (1.0 - args.get_ratio) * 100.0,
        args.keys,
        args.value_size,
        duration
    );
    let _ = writeln!(
        t,
        "| system | requests/s | mean (µs) | p95 (µs) | p99 (µs) | middle boxes µs/req | failed |"
    );
    let _ = writeln!(t, "|---|--:|--:|--:|--:|--:|--:|");
    for p in medians {
        let _ = writeln!(
            t,
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {} |",
            p.system,
            p.qps,
            p.mean_us,
            p.p95_us,
            p.p99_us,
            fmt(p.middle_us, 2),
            p.failed
        );
    }
    let _ = writeln!(t, "\nThe paper's Table 1 (latencies as printed, in µs):\n");
    let _ = writeln!(t, "| system | requests/s | mean | p95 | p99 |");
    let _ = writeln!(t, "|---|--:|--:|--:|--:|");
    for r in &PAPER {
        let _ = writeln!(
            t,
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} |",
            r.system, r.qps, r.mean, r.p95, r.p99
        );
    }
    let find = |s: System| medians.iter().find(|p| p.system == s);
    let nc = find(System::Nutcracker);
    let _ = writeln!(
        t,
        "\n| switch / proxy | requests/s | mean | p95 | p99 |\n|---|--:|--:|--:|--:|"
    );
    let _ = writeln!(
        t,
        "| AppSwitch / McRouter (paper) | {:.2}x | {:.2}x | {:.2}x | {:.2}x |",
        paper_ratio(|r| r.qps),
        paper_ratio(|r| r.mean),
        paper_ratio(|r| r.p95),
        paper_ratio(|r| r.p99)
    );
    for s in [System::KvswitchUdp, System::KvswitchTcp] {
        let Some(p) = find(s) else { continue };
        let of = |f: fn(&Point) -> f64| times(ratio(Some(f(p)), nc.map(f)));
        let _ = writeln!(
            t,
            "| {s} / nutcracker (TCP) | {} | {} | {} | {} |",
            of(|p| p.qps),
            of(|p| p.mean_us),
            of(|p| p.p95_us),
            of(|p| p.p99_us)
        );
    }
    t
}
