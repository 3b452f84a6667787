//! `kvswitch bench cost`: CPU time per request of every middle box on the path of each system,
//! read from /proc while a closed loop drives it as fast as it answers: kvswitch (which also
//! switches every other system's packets at layer 2 on the testbed) and nutcracker.

use std::fmt::Write as _;

use serde::Serialize;

use super::bed::{by_setup, Measured, System, PEERS};
use super::output::{fmt, ratio, times};
use super::plot::{BarChart, Chart};
use super::runner::{Figures, Keys, Record, Runner, Runs, Stage};
use super::Common;
use crate::measure::per_s;

pub const NAME: &str = "cost";

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// Closed-loop requesters (one request outstanding each).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub concurrency: u32,
    /// Seconds measured per system [default: 3; 0.5 with --short].
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Keys preloaded and read (uniformly).
    #[arg(long, default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub keys: u64,
    /// Value size in bytes.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub value_size: u32,
}

impl Args {
    pub fn with(common: Common) -> Args {
        Args {
            common,
            concurrency: 16,
            duration: None,
            keys: 10_000,
            value_size: 100,
        }
    }

    pub(crate) fn duration(&self) -> f64 {
        self.duration
            .unwrap_or(if self.common.short { 0.5 } else { 3.0 })
    }

    /// The closed loop at full speed: every requester reads the preloaded keys uniformly.
    pub(crate) fn load(&self, run: u32) -> loadgen::LoadArgs {
        let duration = self.duration();
        loadgen::LoadArgs {
            keys: self.keys,
            value_size: self.value_size as usize,
            get_ratio: 1.0,
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
    pub get_rps: f64,
    /// CPU µs per request of each process; none when it was not on the testbed.
    pub kvswitch_us: Option<f64>,
    pub nutcracker_us: Option<f64>,
    /// Both together: every middle box on the system's path.
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
            get_rps: runs.median(|p| p.get_rps),
            kvswitch_us: runs.median_of_some(|p| p.kvswitch_us),
            nutcracker_us: runs.median_of_some(|p| p.nutcracker_us),
            middle_us: runs.median_of_some(|p| p.middle_us),
            run: runs.count(),
        }
    }

    fn line(&self) -> String {
        format!(
            "{:<24} {:>8.0} GET/s  kvswitch {} µs/req  nutcracker {} µs/req",
            self.system,
            self.get_rps,
            fmt(self.kvswitch_us, 2),
            fmt(self.nutcracker_us, 2)
        )
    }
}

/// A closed-loop scenario's settings as its results record them (`cost`, `fastpath`).
#[derive(Serialize)]
pub(crate) struct Settings {
    concurrency: u32,
    duration_s: f64,
    runs: u32,
    keys: u64,
    value_size: u32,
    servers: usize,
    short: bool,
}

impl Settings {
    pub(crate) fn of(args: &Args, runs: u32) -> Settings {
        Settings {
            concurrency: args.concurrency,
            duration_s: args.duration(),
            runs,
            keys: args.keys,
            value_size: args.value_size,
            servers: PEERS,
            short: args.common.short,
        }
    }
}

pub fn run(args: &Args) -> anyhow::Result<Vec<Point>> {
    let duration = args.duration();
    super::check_duration(duration)?;
    let runner = Runner::start(NAME, &args.common)?;
    let runs = runner.runs();
    let systems = System::compared();
    // With the cache, it may hold every key read.
    let stages = by_setup(&systems).into_iter().map(|(setup, group)| Stage {
        preload: vec![Keys::new(args.keys, "key:", args.value_size as usize)],
        points: vec![()],
        ..Stage::peers(&args.common, setup, group, args.keys, PEERS)
    });
    let points = runner.measure(stages, |bed, system, (), run| {
        let load = args.load(run);
        let m = bed.load(system, &load)?;
        let cpu = Cpu::per_request(system, &m, load.warmup);
        Ok(Point {
            system,
            get_rps: per_s(m.report.gets, m.report.duration_s),
            kvswitch_us: cpu.kvswitch_us,
            nutcracker_us: cpu.nutcracker_us,
            middle_us: cpu.middle_us,
            run,
        })
    })?;
    let medians = super::runner::medians(&points);
    runner.finish(
        Record {
            settings: Settings::of(args, runs),
            systems: Some(&systems),
            runs: &points,
            medians: &medians,
            more: (),
        },
        vec![("cpu-per-request".into(), Chart::Bars(chart(&medians)))],
        &summary(args, &medians, runs, duration),
    )?;
    Ok(medians)
}

/// CPU µs per request of the processes on the testbed over one load.
pub(crate) struct Cpu {
    pub kvswitch_us: Option<f64>,
    pub nutcracker_us: Option<f64>,
    /// The middle boxes on the system's path: kvswitch always (it is the network here),
    /// nutcracker only for nutcracker.
    pub middle_us: Option<f64>,
}

impl Cpu {
    /// From `m`, whose CPU was read over its `warmup` seconds and its window alike: per
    /// request of both.
    pub(crate) fn per_request(system: System, m: &Measured, warmup: f64) -> Cpu {
        let r = &m.report;
        let requests = per_s(r.requests, r.duration_s) * (r.duration_s + warmup);
        let per = |cpu: Option<f64>| cpu.filter(|_| requests > 0.0).map(|s| s * 1e6 / requests);
        let (kvswitch_us, nutcracker_us) = (per(m.kvswitch_cpu_s), per(m.nutcracker_cpu_s));
        let middle_us = match system {
            System::Nutcracker => kvswitch_us.zip(nutcracker_us).map(|(k, n)| k + n),
            _ => kvswitch_us,
        };
        Cpu {
            kvswitch_us,
            nutcracker_us,
            middle_us,
        }
    }
}

fn chart(medians: &[Point]) -> BarChart {
    BarChart {
        title: "CPU time per request of the middle boxes (closed loop at full speed)".into(),
        x_label: "system".into(),
        y_label: "CPU µs per request".into(),
        categories: medians
            .iter()
            .map(|p| {
                // Two lines do not fit under a bar; the short form does.
                p.system
                    .to_string()
                    .replace("memcached direct", "direct")
                    .replace("kvswitch ", "kvs ")
            })
            .collect(),
        groups: vec![
            (
                "kvswitch process".into(),
                medians
                    .iter()
                    .map(|p| p.kvswitch_us.unwrap_or(0.0))
                    .collect(),
            ),
            (
                "nutcracker process".into(),
                medians
                    .iter()
                    .map(|p| {
                        if p.system == System::Nutcracker {
                            p.nutcracker_us.unwrap_or(0.0)
                        } else {
                            0.0
                        }
                    })
                    .collect(),
            ),
        ],
        line: None,
        stacked: true,
    }
}

fn summary(args: &Args, medians: &[Point], runs: u32, duration: f64) -> String {
    let mut t = String::new();
    let _ = writeln!(t, "# CPU time per request of the middle boxes\n");
    let _ = writeln!(
        t,
        "{} closed-loop requesters read {} keys of {} bytes as fast as each system answers, {} \
         s per system, medians of {runs} run(s) with the systems in rotating order. CPU is user \
         + system time from /proc/PID/stat of the kvswitch process (its switch loop and, for \
         TCP to the VIP, its proxy) and of nutcracker, over the run, per request. On this \
         testbed ({PEERS} memcached in `l2` mode) kvswitch is also the network: every \
         system's packets cross it, so its CPU under memcached direct is the cost of switching \
         alone. kvswitch busy-polls (200 µs after each frame by default), which it pays for in \
         CPU whatever the load.\n",
        args.concurrency, args.keys, args.value_size, duration
    );
    let _ = writeln!(
        t,
        "| system | GET/s | kvswitch µs/req | nutcracker µs/req | middle boxes µs/req |"
    );
    let _ = writeln!(t, "|---|--:|--:|--:|--:|");
    for p in medians {
        let _ = writeln!(
            t,
            "| {} | {:.0} | {} | {} | {} |",
            p.system,
            p.get_rps,
            fmt(p.kvswitch_us, 2),
            if p.system == System::Nutcracker {
                fmt(p.nutcracker_us, 2)
            } else {
                "-".into()
            },
            fmt(p.middle_us, 2)
        );
    }
    let find = |s: System| medians.iter().find(|p| p.system == s);
    let nc = find(System::Nutcracker);
    let _ = writeln!(t);
    for s in [
        System::KvswitchUdp,
        System::KvswitchTcp,
        System::KvswitchTcpProxy,
    ] {
        let Some(p) = find(s) else { continue };
        let _ = writeln!(
            t,
            "- {s} / nutcracker (TCP), middle boxes' CPU per request: {}; GET/s: {}.",
            times(ratio(p.middle_us, nc.and_then(|n| n.middle_us))),
            times(ratio(Some(p.get_rps), nc.map(|n| n.get_rps)))
        );
    }
    t
}
