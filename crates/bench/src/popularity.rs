//! `kvswitch bench popularity-change`: throughput over time in front of capacity-limited
//! backends while the hot keys change, as SwitchKV's dynamic-workload figures draw it: hot-in
//! (cold keys become the hottest), hot-out (the hottest become cold) and random (hot keys swap
//! with cold ones), every few seconds, from the load generator's 100 ms time series. The
//! changes are what an in-network cache must follow under its rule-update limit; without the
//! cache they only move which backend is the hottest.
//!
//! For SwitchKV it also measures what its Figures 16 to 19 do: its backends sending periodic
//! reports only or instant reports only, its cache node without the rule buffer, and the
//! throughput of both caches against how often the hot keys change.

use std::fmt::Write as _;

use serde::Serialize;

use super::bed::{
    by_setup, Bed, BedSpec, CacheSetup, Reports, Servers, Setup, SwitchKvSetup, System,
};
use super::output::fmt;
use super::plot::{Chart, LineChart, Series};
use super::runner::{Figures, Keys, Record, Runner, Runs, Stage};
use super::Common;
use crate::measure::per_s;

pub const NAME: &str = "popularity-change";

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// Backends (kvswitch nodes).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub servers: u32,
    /// Requests per second each backend serves.
    #[arg(long, default_value_t = 500,
          value_parser = clap::value_parser!(u64).range(10..=10_000_000))]
    pub capacity: u64,
    /// Offered load as a multiple of the backends' total capacity: above 1, only a cache that
    /// holds the hot keys lets the load through.
    #[arg(long, default_value_t = 5.0)]
    pub load: f64,
    /// Keys preloaded and read.
    #[arg(long, default_value_t = 20_000,
          value_parser = clap::value_parser!(u64).range(100..=10_000_000))]
    pub keys: u64,
    /// Zipf exponent of the key popularity.
    #[arg(long, default_value_t = 0.99)]
    pub skew: f64,
    /// Keys each change moves.
    #[arg(long, default_value_t = 200)]
    pub change_keys: u64,
    /// Seconds between changes [default: 5; 0.5 with --short].
    #[arg(long, value_name = "SECS")]
    pub change_every: Option<f64>,
    /// Seconds measured per kind of change [default: 15; 1.5 with --short].
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Most cache insertions and evictions kvswitch may make a second (the rule-update limit);
    /// applies to the systems with the cache.
    #[arg(long, default_value_t = 400)]
    pub rule_updates: u64,
    /// Only these systems, by their short names (kvswitch_udp, kvswitch_cache_udp,
    /// switchkv_udp, look_through_udp, look_aside_udp), comma-separated [default: all].
    #[arg(long, value_delimiter = ',', value_name = "SYSTEM,...")]
    pub systems: Vec<String>,
    /// Seconds between changes of the change-rate sweep (hot-in and random, for kvswitch's
    /// cache and SwitchKV), comma-separated [default: 0.5,1,2,10; 1 with --short].
    #[arg(long, value_delimiter = ',', value_name = "SECS,...")]
    pub change_rates: Vec<f64>,
}

impl Args {
    pub fn with(common: Common) -> Args {
        Args {
            common,
            servers: 8,
            capacity: 500,
            load: 5.0,
            keys: 20_000,
            skew: 0.99,
            change_keys: 200,
            change_every: None,
            duration: None,
            rule_updates: 400,
            systems: Vec::new(),
            change_rates: Vec::new(),
        }
    }

    fn change_rates(&self) -> Vec<f64> {
        if !self.change_rates.is_empty() {
            self.change_rates.clone()
        } else if self.common.short {
            vec![1.0]
        } else {
            vec![0.5, 1.0, 2.0, 10.0]
        }
    }

    fn change_every(&self) -> f64 {
        self.change_every
            .unwrap_or(if self.common.short { 0.5 } else { 5.0 })
    }

    fn duration(&self) -> f64 {
        self.duration
            .unwrap_or(if self.common.short { 1.5 } else { 15.0 })
    }

    fn offered(&self) -> f64 {
        self.load * self.capacity as f64 * f64::from(self.servers)
    }

    fn check(&self) -> anyhow::Result<()> {
        if !self.skew.is_finite() || self.skew <= 0.0 || self.skew > 5.0 {
            anyhow::bail!("--skew must be above 0 and at most 5, got {}", self.skew);
        }
        if self.change_keys == 0 || self.change_keys.saturating_mul(2) > self.keys {
            anyhow::bail!("--change-keys must be between 1 and half of --keys");
        }
        for every in self.change_rates().into_iter().chain([self.change_every()]) {
            if !every.is_finite() || !(0.1..=3600.0).contains(&every) {
                anyhow::bail!("seconds between changes must be between 0.1 and 3600, got {every}");
            }
        }
        if !self.load.is_finite() || self.load <= 0.0 || self.load > 100.0 {
            anyhow::bail!("--load must be above 0 and at most 100, got {}", self.load);
        }
        if self.rule_updates == 0 {
            anyhow::bail!("--rule-updates must be at least 1");
        }
        super::check_duration(self.duration())
    }
}

/// The kinds of change measured; `None` is the steady workload they are compared with.
const KINDS: [Option<loadgen::ChangeKind>; 4] = [
    None,
    Some(loadgen::ChangeKind::HotIn),
    Some(loadgen::ChangeKind::HotOut),
    Some(loadgen::ChangeKind::Random),
];

fn kind_name(kind: Option<loadgen::ChangeKind>) -> &'static str {
    match kind {
        None => "no change",
        Some(loadgen::ChangeKind::HotIn) => "hot-in",
        Some(loadgen::ChangeKind::HotOut) => "hot-out",
        Some(loadgen::ChangeKind::Random) => "random",
    }
}

/// SwitchKV run otherwise than it is deployed, for its Figures 16 to 18.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Variant {
    /// Its backends send the periodic reports only.
    PeriodicOnly,
    /// Its backends send the instant reports only.
    InstantOnly,
    /// Its cache node sends rule removals first (no rule buffer).
    NoRuleBuffer,
    /// Its backends report every key read at once, and its cache node takes each: the
    /// traditional cache update of its Figure 15.
    Traditional,
}

impl Variant {
    const ALL: [Variant; 4] = [
        Variant::PeriodicOnly,
        Variant::InstantOnly,
        Variant::NoRuleBuffer,
        Variant::Traditional,
    ];

    fn name(self) -> &'static str {
        match self {
            Variant::PeriodicOnly => "periodic reports only",
            Variant::InstantOnly => "instant reports only",
            Variant::NoRuleBuffer => "no rule buffer",
            Variant::Traditional => "traditional update (every key read)",
        }
    }

    fn slug(self) -> &'static str {
        match self {
            Variant::PeriodicOnly => "periodic-only",
            Variant::InstantOnly => "instant-only",
            Variant::NoRuleBuffer => "no-rule-buffer",
            Variant::Traditional => "traditional",
        }
    }

    fn setup(self, complete: SwitchKvSetup) -> SwitchKvSetup {
        match self {
            Variant::PeriodicOnly => SwitchKvSetup {
                reports: Reports::PeriodicOnly,
                ..complete
            },
            Variant::InstantOnly => SwitchKvSetup {
                reports: Reports::InstantOnly,
                ..complete
            },
            Variant::NoRuleBuffer => SwitchKvSetup {
                rule_buffer: false,
                ..complete
            },
            Variant::Traditional => SwitchKvSetup {
                reports: Reports::EveryRead,
                ..complete
            },
        }
    }

    /// The changes it is measured under: the rule buffer matters to hot-in, and Figure 15
    /// shows the traditional update under hot-in.
    fn kinds(self) -> Vec<Option<loadgen::ChangeKind>> {
        match self {
            Variant::NoRuleBuffer | Variant::Traditional => {
                vec![None, Some(loadgen::ChangeKind::HotIn)]
            }
            _ => KINDS.to_vec(),
        }
    }
}

/// The kinds of change of the change-rate sweep.
const RATE_KINDS: [loadgen::ChangeKind; 2] =
    [loadgen::ChangeKind::HotIn, loadgen::ChangeKind::Random];

/// The caches of the change-rate sweep.
const RATED: [System; 2] = [System::KvswitchCacheUdp, System::SwitchKvUdp];

/// What a run measures: a kind of change (none: the steady workload) every so many seconds,
/// on SwitchKV run as `variant` says.
#[derive(Clone, Copy, Debug)]
struct Change {
    variant: Option<Variant>,
    kind: Option<loadgen::ChangeKind>,
    every: f64,
}

/// One system under one kind of change in one run: the answered rate every interval.
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    pub system: System,
    /// SwitchKV run otherwise than deployed; none for every system as deployed.
    pub variant: Option<Variant>,
    pub change: &'static str,
    /// Seconds between changes.
    pub change_every_s: f64,
    pub run: u32,
    /// (interval start in s, GETs answered per second in it).
    pub series: Vec<(f64, f64)>,
    /// GETs answered per second over the whole window.
    pub get_rps: f64,
}

#[derive(Serialize)]
struct Settings {
    servers: u32,
    capacity_rps: u64,
    offered_rps: f64,
    load: f64,
    keys: u64,
    skew: f64,
    change_keys: u64,
    change_every_s: f64,
    change_rates_s: Vec<f64>,
    duration_s: f64,
    interval_ms: u64,
    runs: u32,
    /// The cache's rule-update limit; none when no system has the cache.
    rule_updates_per_s: Option<u64>,
    short: bool,
}

const INTERVAL_MS: u64 = 100;

pub fn run(args: &Args) -> anyhow::Result<Vec<Run>> {
    args.check()?;
    let runner = Runner::start(NAME, &args.common)?;
    let runs = runner.runs();
    let duration = args.duration();
    // SwitchKV's own clients reach the same cache node as the others: their keys' popularity
    // changes the same way, and the skew scenario compares the two encodings.
    let switched: Vec<System> = System::switched()
        .into_iter()
        .filter(|s| *s != System::SwitchKvEncodedUdp)
        .collect();
    let systems = super::bed::pick(&switched, &args.systems)?;
    let every = args.change_every();
    let change = |variant, kind, every| Change {
        variant,
        kind,
        every,
    };
    let mut stages: Vec<Stage<Change>> = by_setup(&systems)
        .into_iter()
        .map(|(setup, group)| {
            let mut points: Vec<Change> = KINDS.map(|kind| change(None, kind, every)).to_vec();
            // Both caches against how often the hot keys change: each is the only system of
            // its testbed.
            if group.iter().all(|s| RATED.contains(s)) {
                for every in args.change_rates() {
                    points.extend(RATE_KINDS.map(|kind| change(None, Some(kind), every)));
                }
            }
            stage(args, setup, None, group, points)
        })
        .collect();
    if systems.contains(&System::SwitchKvUdp) {
        for variant in Variant::ALL {
            let points = variant
                .kinds()
                .into_iter()
                .map(|kind| change(Some(variant), kind, every))
                .collect();
            let systems = vec![System::SwitchKvUdp];
            stages.push(stage(args, Setup::SwitchKv, Some(variant), systems, points));
        }
    }
    let all = runner.measure(stages, |bed, system, change, run| {
        measure(bed, args, system, change, run)
    })?;
    let medians = super::runner::medians(&all);
    let mut plots = Vec::new();
    for &s in &systems {
        let runs = as_deployed(args, &medians, s);
        plots.push((
            format!("throughput-over-time-{}", s.slug()),
            Chart::Line(chart(args, &s.to_string(), &runs)),
        ));
    }
    for variant in Variant::ALL {
        let runs: Vec<&Run> = medians
            .iter()
            .filter(|r| r.variant == Some(variant))
            .collect();
        if !runs.is_empty() {
            let name = format!("SwitchKV, {}", variant.name());
            plots.push((
                format!(
                    "throughput-over-time-{}-{}",
                    System::SwitchKvUdp.slug(),
                    variant.slug()
                ),
                Chart::Line(chart(args, &name, &runs)),
            ));
        }
    }
    if medians.iter().any(|r| rated(args, r)) {
        plots.push((
            "throughput-change-rate".to_string(),
            Chart::Line(rate_chart(args, &medians)),
        ));
    }
    runner.finish(
        Record {
            settings: Settings {
                servers: args.servers,
                capacity_rps: args.capacity,
                offered_rps: args.offered(),
                load: args.load,
                keys: args.keys,
                skew: args.skew,
                change_keys: args.change_keys,
                change_every_s: args.change_every(),
                change_rates_s: args.change_rates(),
                duration_s: duration,
                interval_ms: INTERVAL_MS,
                runs,
                rule_updates_per_s: systems
                    .iter()
                    .any(|s| s.caches())
                    .then_some(args.rule_updates),
                short: args.common.short,
            },
            systems: Some(&systems),
            runs: &all,
            medians: &medians,
            more: (),
        },
        plots,
        &summary(args, &systems, &medians, runs),
    )?;
    Ok(medians)
}

/// The testbed of `setup` for `systems`, SwitchKV's run as `variant` says, measured at `points`.
fn stage(
    args: &Args,
    setup: Setup,
    variant: Option<Variant>,
    systems: Vec<System>,
    points: Vec<Change>,
) -> Stage<Change> {
    let entries = args.keys / 10;
    let rules = Some(args.rule_updates);
    let switchkv = SwitchKvSetup::of(setup, entries, rules, args.servers);
    Stage {
        testbed: format!(
            "1 client, {} kvswitch nodes of {} requests/s, kvswitch{}{}",
            args.servers,
            args.capacity,
            match setup {
                Setup::Plain => "",
                Setup::TcpProxy => " with TCP on the proxy's path",
                Setup::Cache => " with its cache",
                Setup::SwitchKv => " steering to a SwitchKV cache node",
                Setup::LookThrough => " and a look-through cache node",
                Setup::LookAside => " and a look-aside cache node",
            },
            variant.map_or_else(String::new, |v| format!(", {}", v.name())),
        ),
        spec: BedSpec {
            prefix: args.common.prefix.clone(),
            servers: Servers::Nodes {
                n: args.servers as usize,
                capacity: args.capacity,
            },
            cache: (setup == Setup::Cache)
                .then(|| CacheSetup::hot_keys(entries, rules, args.servers)),
            switchkv: match variant {
                Some(v) => switchkv.map(|k| v.setup(k)),
                None => switchkv,
            },
            nutcracker: false,
            datapath: None,
            tcp: None,
        },
        preload: vec![Keys::new(args.keys, "key:", 32)],
        systems,
        points,
    }
}

fn measure(
    bed: &Bed,
    args: &Args,
    system: System,
    change: &Change,
    run: u32,
) -> anyhow::Result<Run> {
    let load = loadgen::LoadArgs {
        keys: args.keys,
        value_size: 32,
        dist: loadgen::Dist::Zipf(args.skew),
        get_ratio: 1.0,
        concurrency: 16,
        rate: Some(args.offered()),
        duration: args.duration(),
        // The cache learns the hot keys while the load runs: give it a few segments first.
        warmup: if system.caches() && !args.common.short {
            3.0
        } else {
            0.5_f64.min(args.duration() / 4.0)
        },
        timeout_ms: 100,
        change: change.kind,
        change_keys: args.change_keys,
        change_every: change.every,
        interval_ms: INTERVAL_MS,
        seed: u64::from(run) + 1,
        ..loadgen::LoadArgs::new("")
    };
    let m = bed.load(system, &load)?;
    let r = &m.report;
    Ok(Run {
        system,
        variant: change.variant,
        change: kind_name(change.kind),
        change_every_s: change.every,
        run,
        series: r.series.iter().map(|s| (s.t_s, s.replies_rps)).collect(),
        get_rps: per_s(r.gets, r.duration_s),
    })
}

impl Figures for Run {
    type At = (System, Option<Variant>, &'static str, f64);

    fn at(&self) -> Self::At {
        (self.system, self.variant, self.change, self.change_every_s)
    }

    /// The median of each interval over the runs.
    fn median(runs: &Runs<'_, Run>) -> Run {
        let first = runs.first();
        let n = runs.iter().map(|r| r.series.len()).min().unwrap_or(0);
        let series = (0..n)
            .map(|i| (first.series[i].0, runs.median(|r| r.series[i].1)))
            .collect();
        Run {
            system: first.system,
            variant: first.variant,
            change: first.change,
            change_every_s: first.change_every_s,
            run: runs.count(),
            series,
            get_rps: runs.median(|r| r.get_rps),
        }
    }

    fn line(&self) -> String {
        format!(
            "{:<9} every {} s  {:<24}{} {:>8.0} GET/s",
            self.change,
            self.change_every_s,
            self.system,
            self.variant
                .map_or_else(String::new, |v| format!(" ({})", v.name())),
            self.get_rps
        )
    }
}

/// The runs of `system` as deployed, at the scenario's own change rate.
fn as_deployed<'a>(args: &Args, medians: &'a [Run], system: System) -> Vec<&'a Run> {
    medians
        .iter()
        .filter(|r| {
            r.system == system && r.variant.is_none() && r.change_every_s == args.change_every()
        })
        .collect()
}

/// Whether `r` belongs to the change-rate sweep.
fn rated(args: &Args, r: &Run) -> bool {
    r.variant.is_none()
        && args.change_rates().contains(&r.change_every_s)
        && RATE_KINDS.iter().any(|&k| kind_name(Some(k)) == r.change)
        && RATED.contains(&r.system)
}

/// GETs answered against keys changed a second, a series per cache and kind of change.
fn rate_chart(args: &Args, medians: &[Run]) -> LineChart {
    let mut series = Vec::new();
    for system in RATED {
        for (i, kind) in RATE_KINDS.into_iter().enumerate() {
            let mut points: Vec<(f64, f64)> = medians
                .iter()
                .filter(|r| {
                    rated(args, r) && r.system == system && r.change == kind_name(Some(kind))
                })
                .map(|r| (args.change_keys as f64 / r.change_every_s, r.get_rps))
                .collect();
            if points.is_empty() {
                continue;
            }
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            series.push(Series {
                name: format!("{system}, {}", kind_name(Some(kind))),
                points,
                color: system.color(),
                dashed: i == 1,
            });
        }
    }
    LineChart {
        title: format!(
            "Throughput against how fast the hot keys change (zipf {})",
            args.skew
        ),
        x_label: "keys changed per second (log scale)".into(),
        y_label: "GETs answered per second".into(),
        x_log: true,
        y_log: false,
        y_from_zero: true,
        series,
    }
}

fn chart(args: &Args, name: &str, runs: &[&Run]) -> LineChart {
    let series = runs
        .iter()
        .enumerate()
        .map(|(i, r)| Series {
            name: r.change.to_string(),
            points: r.series.clone(),
            color: [6, 0, 1, 2][i % 4],
            dashed: r.change == "no change",
        })
        .collect();
    LineChart {
        title: format!(
            "{name}: throughput while {} keys change every {} s",
            args.change_keys,
            args.change_every()
        ),
        x_label: "time (s)".into(),
        y_label: format!("GETs answered per second (per {INTERVAL_MS} ms)"),
        x_log: false,
        y_log: false,
        y_from_zero: true,
        series,
    }
}

fn summary(args: &Args, systems: &[System], medians: &[Run], runs: u32) -> String {
    let mut t = String::new();
    let _ = writeln!(t, "# Throughput while the hot keys change\n");
    let _ = writeln!(
        t,
        "{} `kvswitch node` backends of {} requests/s behind kvswitch in switch mode; one \
         client offers {:.0} GETs/s ({}x their total capacity) over UDP, open loop, Zipf {} over {} \
         keys. Every {} s the load generator moves {} keys: *hot-in* makes the coldest the \
         hottest, *hot-out* sends the hottest to the bottom, *random* swaps hot keys with cold \
         ones. {} s per kind, throughput per {INTERVAL_MS} ms, medians of {runs} run(s).\n",
        args.servers,
        args.capacity,
        args.offered(),
        args.load,
        args.skew,
        args.keys,
        args.change_every(),
        args.change_keys,
        args.duration()
    );
    let _ = writeln!(
        t,
        "| system | change | GET/s over the run | lowest {INTERVAL_MS} ms (GET/s) | vs no change \
         | back to 90% after a change (median, worst) |"
    );
    let _ = writeln!(t, "|---|---|--:|--:|--:|--:|");
    let rows = systems
        .iter()
        .map(|&s| (s.to_string(), as_deployed(args, medians, s)))
        .chain(Variant::ALL.into_iter().map(|v| {
            let runs = medians.iter().filter(|r| r.variant == Some(v)).collect();
            (format!("{}, {}", System::SwitchKvUdp, v.name()), runs)
        }));
    for (s, runs) in rows {
        let steady = runs
            .iter()
            .find(|r| r.change == "no change")
            .map(|r| r.get_rps);
        for r in runs {
            // The last interval may be cut short; leave it out of the minimum.
            let body = &r.series[..r.series.len().saturating_sub(1)];
            let lowest = body
                .iter()
                .map(|p| p.1)
                .fold(None, |a: Option<f64>, v| Some(a.map_or(v, |a| a.min(v))));
            let recovery = match (r.change, steady) {
                ("no change", _) | (_, None) => "-".to_string(),
                (_, Some(steady)) => show_recovery(&recoveries(r, steady, r.change_every_s)),
            };
            let _ = writeln!(
                t,
                "| {s} | {} | {:.0} | {} | {} | {recovery} |",
                r.change,
                r.get_rps,
                fmt(lowest, 0),
                super::output::times(super::output::ratio(Some(r.get_rps), steady))
            );
        }
    }
    let _ = writeln!(
        t,
        "\nThe cache may make at most {} insertions and evictions a second (its rule-update \
         limit). *Back to 90%*: after each change, the time until a {INTERVAL_MS} ms interval \
         answers at least 90% of the system's rate without changes (\"never\": not before the \
         next change). SwitchKV's variants: its backends sending *periodic reports only* (top \
         k a second) or *instant reports only* (a key read more than 8 times in the last 200), \
         its cache node with *no rule buffer* (a removal goes before the additions it \
         waits behind, instead of up to 2 s after), and the *traditional update* (Figure 15: \
         its backends report every key read that is not cached, at once, and no top k; the \
         cache node takes each, the least loaded out).",
        args.rule_updates
    );
    let rated: Vec<&Run> = medians.iter().filter(|r| rated(args, r)).collect();
    if !rated.is_empty() {
        let _ = writeln!(
            t,
            "\nThroughput against how fast the hot keys change ({} keys a change):\n",
            args.change_keys
        );
        let _ = writeln!(
            t,
            "| system | change | every (s) | keys changed a second | GET/s |"
        );
        let _ = writeln!(t, "|---|---|--:|--:|--:|");
        for r in rated {
            let _ = writeln!(
                t,
                "| {} | {} | {} | {:.0} | {:.0} |",
                r.system,
                r.change,
                r.change_every_s,
                args.change_keys as f64 / r.change_every_s,
                r.get_rps
            );
        }
    }
    t
}

/// For each change in `run`, how long until an interval answers at least 90% of `steady`
/// GETs a second, in seconds; `None` when none does before the next change. Changes come every
/// `every` seconds of the measured window, the first at `every`.
pub fn recoveries(run: &Run, steady: f64, every: f64) -> Vec<Option<f64>> {
    let interval = INTERVAL_MS as f64 / 1000.0;
    let end = run.series.last().map_or(0.0, |p| p.0);
    let mut out = Vec::new();
    let mut change = every;
    // A change needs a full period after it to be judged.
    while change + every <= end + interval + 1e-9 {
        let back = run
            .series
            .iter()
            .filter(|p| p.0 + 1e-9 >= change && p.0 < change + every - 1e-9)
            .find(|p| p.1 >= 0.9 * steady)
            .map(|p| p.0 + interval - change);
        out.push(back);
        change += every;
    }
    out
}

fn show_recovery(times: &[Option<f64>]) -> String {
    if times.is_empty() {
        return "-".into();
    }
    // A change never recovered from counts as the longest.
    let mut all: Vec<f64> = times.iter().map(|t| t.unwrap_or(f64::INFINITY)).collect();
    all.sort_by(f64::total_cmp);
    let never = all.iter().filter(|t| t.is_infinite()).count();
    let done = &all[..all.len() - never];
    let middle = all[(all.len() - 1) / 2];
    let median = if middle.is_infinite() {
        "never".to_string()
    } else {
        format!("{middle:.1} s")
    };
    let worst = if never > 0 {
        "never".to_string()
    } else {
        format!("{:.1} s", done.last().copied().unwrap_or(0.0))
    };
    format!("{median}, {worst}")
}
