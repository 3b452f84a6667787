//! `kvswitch sim`: runs a scenario file in the simulator ([`sim`]) and writes each run's
//! summary and time series, a table of all runs, and plots.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use bench::plot::{self, Chart, LineChart, Series};
use clap::Args;

#[derive(Args, Debug)]
pub struct SimArgs {
    /// The scenario file (TOML; the repository's `scenarios/` holds the shipped ones, and
    /// docs/simulation.md describes every field).
    pub scenario: PathBuf,
    /// The seed every generator of the run is derived from: the same seed and scenario give
    /// the same files.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Where to write the results [default: sim-out/<scenario name>].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Leave out the plots (no font needed).
    #[arg(long)]
    pub no_plots: bool,
    /// Run the scenario's small version (its `[short]` table), as the test suite does: a first
    /// look in seconds, not figures.
    #[arg(long)]
    pub short: bool,
    /// Set a field of the scenario, a dotted key and a TOML value (`--set duration_s=15`,
    /// `--set 'cache.path="look-aside"'`); may be given more than once.
    #[arg(long, value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Print no progress line.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(args: &SimArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.scenario)
        .with_context(|| format!("reading {}", args.scenario.display()))?;
    let file = config::scenario::parse_set(&text, args.short, &args.set)
        .with_context(|| format!("{}", args.scenario.display()))?;
    check_plot(&file).with_context(|| format!("{}", args.scenario.display()))?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| Path::new("sim-out").join(&file.base.name));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let show = !args.quiet && std::io::stderr().is_terminal();
    let total = file.runs.len();
    let mut outcomes = Vec::new();
    let started = Instant::now();
    let mut events = 0u64;
    for (i, run) in file.runs.iter().enumerate() {
        let label = run_label(run, file.sweep.as_deref());
        let t0 = Instant::now();
        let mut progress = |p: sim::Progress| {
            if !show {
                return;
            }
            let wall = t0.elapsed().as_secs_f64();
            let done = p.simulated.as_secs_f64() / p.end.as_secs_f64().max(1e-9);
            let eta = if done > 0.0 {
                wall * (1.0 - done) / done
            } else {
                0.0
            };
            eprint!(
                "\r[{}/{total}] {label}: {:.2}/{:.2} s simulated, {:.2} M events/s, ETA {:.0} s   ",
                i + 1,
                p.simulated.as_secs_f64(),
                p.end.as_secs_f64(),
                p.events as f64 / wall.max(1e-9) / 1e6,
                eta
            );
        };
        let outcome =
            sim::run(run, args.seed, &mut progress).map_err(|e| anyhow::anyhow!("{label}: {e}"))?;
        if show {
            eprint!("\r{:100}\r", "");
        }
        let wall = t0.elapsed().as_secs_f64();
        events += outcome.summary.events;
        let dir = out.join(slug(&label));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        write(
            &dir.join("summary.json"),
            &config::scenario::summary_json(&outcome.summary),
        )?;
        write(&dir.join("series.csv"), &outcome.series_csv)?;
        write(
            &dir.join("backends.csv"),
            &sim::backends_csv(&outcome.backend_loads),
        )?;
        if !args.quiet {
            let s = &outcome.summary;
            eprintln!(
                "[{}/{total}] {label}: {:.0} req/s answered, loss {:.2}%, hit ratio {:.3}, imbalance {:.2}, {} events in {wall:.1} s",
                i + 1,
                s.throughput,
                s.loss * 100.0,
                s.hit_ratio,
                s.imbalance,
                s.events
            );
        }
        outcomes.push((run.clone(), outcome));
    }
    let table = table(&outcomes, file.sweep.as_deref());
    write(&out.join("runs.csv"), &table)?;
    if !args.no_plots {
        for (stem, chart) in charts(&file, &outcomes) {
            plot::write(&Chart::Line(chart), &out.join(stem))?;
        }
    }
    let wall = started.elapsed().as_secs_f64();
    println!(
        "{}: {} run(s), {events} events in {wall:.1} s ({:.2} M events/s); results in {}",
        file.base.name,
        total,
        events as f64 / wall.max(1e-9) / 1e6,
        out.display()
    );
    Ok(())
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

fn run_label(run: &sim::Run, sweep: Option<&str>) -> String {
    let mut label = run.variant.clone();
    if let (Some(key), Some(x)) = (sweep, run.x) {
        if !label.is_empty() {
            label.push(' ');
        }
        let _ = write!(label, "{}={x}", key.rsplit('.').next().unwrap_or(key));
    }
    if label.is_empty() {
        label.push_str("run");
    }
    label
}

fn slug(label: &str) -> String {
    label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// Columns of `runs.csv`.
const FIGURES: &[&str] = &[
    "throughput",
    "offered",
    "loss",
    "hit_ratio",
    "imbalance",
    "backend_load_max",
    "backend_load_mean",
    "latency_mean_us",
    "latency_p99_us",
    "rule_changes",
    "rules_refused",
    "client_rate_end",
];

fn table(outcomes: &[(sim::Run, sim::Outcome)], sweep: Option<&str>) -> String {
    let mut out = format!("variant,{},{}\n", sweep.unwrap_or("x"), FIGURES.join(","));
    for (run, o) in outcomes {
        let _ = write!(
            out,
            "{},{}",
            run.variant,
            run.x.map(|x| x.to_string()).unwrap_or_default()
        );
        for f in FIGURES {
            let _ = write!(
                out,
                ",{}",
                config::scenario::figure(&o.summary, f).unwrap_or(f64::NAN)
            );
        }
        out.push('\n');
    }
    out
}

fn charts(file: &sim::File, outcomes: &[(sim::Run, sim::Outcome)]) -> Vec<(String, LineChart)> {
    let p = &file.base.plot;
    let title = if p.title.is_empty() {
        file.base.name.clone()
    } else {
        p.title.clone()
    };
    let mut charts = Vec::new();
    if p.backends {
        let series = outcomes
            .iter()
            .enumerate()
            .map(|(i, (r, o))| {
                let mut loads = o.backend_loads.clone();
                loads.sort_by(|a, b| b.total_cmp(a));
                Series {
                    name: run_label(r, file.sweep.as_deref()),
                    points: loads
                        .iter()
                        .enumerate()
                        .map(|(k, &l)| (k as f64, l))
                        .collect(),
                    color: i,
                    dashed: false,
                }
            })
            .collect();
        charts.push((
            "backends".to_string(),
            LineChart {
                title: format!("{title} (busiest first)"),
                x_label: "backend (by load)".into(),
                y_label: "requests/s".into(),
                x_log: false,
                y_log: false,
                y_from_zero: true,
                series,
            },
        ));
    }
    let mut variants: Vec<&str> = Vec::new();
    for (run, _) in outcomes {
        if !variants.contains(&run.variant.as_str()) {
            variants.push(&run.variant);
        }
    }
    let name = |v: &str| {
        if v.is_empty() {
            "simulated".to_string()
        } else {
            v.to_string()
        }
    };
    match &file.sweep {
        Some(key) => {
            let ys: Vec<String> = if p.y.is_empty() {
                vec!["throughput".into()]
            } else {
                p.y.clone()
            };
            for y in ys {
                let series = variants
                    .iter()
                    .enumerate()
                    .map(|(i, v)| Series {
                        name: name(v),
                        points: outcomes
                            .iter()
                            .filter(|(r, _)| r.variant == *v)
                            .filter_map(|(r, o)| {
                                Some((r.x?, config::scenario::figure(&o.summary, &y)?))
                            })
                            .collect(),
                        color: i,
                        dashed: false,
                    })
                    .collect();
                charts.push((
                    y.clone(),
                    LineChart {
                        title: format!("{title} ({y})"),
                        x_label: if p.x_label.is_empty() {
                            key.clone()
                        } else {
                            p.x_label.clone()
                        },
                        y_label: y.clone(),
                        x_log: p.x_log,
                        y_log: false,
                        y_from_zero: true,
                        series,
                    },
                ));
            }
        }
        None => {
            let ys: Vec<String> = if p.y.is_empty() {
                vec!["throughput_rps".into()]
            } else {
                p.y.clone()
            };
            for y in ys {
                let series = outcomes
                    .iter()
                    .enumerate()
                    .map(|(i, (r, o))| Series {
                        name: name(&r.variant),
                        points: sim::output::series_column(&o.series_csv, &y).unwrap_or_default(),
                        color: i,
                        dashed: false,
                    })
                    .collect();
                charts.push((
                    y.clone(),
                    LineChart {
                        title: format!("{title} ({y})"),
                        x_label: "time (s)".into(),
                        y_label: y.clone(),
                        x_log: false,
                        y_log: false,
                        y_from_zero: true,
                        series,
                    },
                ));
            }
        }
    }
    charts
}

/// Checks a scenario's plot figures name real columns, before a long run.
pub fn check_plot(file: &sim::File) -> anyhow::Result<()> {
    for y in &file.base.plot.y {
        let known = if file.sweep.is_some() {
            config::scenario::figure(&sim::Summary::default(), y).is_some()
        } else {
            sim::output::SERIES_COLUMNS.contains(&y.as_str())
        };
        if !known {
            bail!(
                "plot.y: \"{y}\" is not a figure of the {}",
                if file.sweep.is_some() {
                    "summary"
                } else {
                    "time series"
                }
            );
        }
    }
    Ok(())
}
