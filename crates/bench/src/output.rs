//! The results folder of a testbed scenario: `results.json`, one PNG and one SVG per plot, and
//! `summary.md`, which is also printed. Also the description of the machine the figures came
//! from, which every summary carries.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;

use super::plot::{self, Chart};
use super::version_line;

/// The machine and the programs a run measured.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub kernel: String,
    /// Load averages (1, 5, 15 min) before the scenario started: other work on the cores
    /// skews every figure.
    pub loadavg_before: Option<[f64; 3]>,
    pub kvswitch: String,
    pub memcached: String,
    pub nutcracker: String,
}

impl Machine {
    pub fn describe() -> Machine {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("model name"))
                    .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
        let bin = |name: &str, arg: &str| {
            testbed::local::require(name)
                .map(|p| version_line(&p, arg))
                .unwrap_or_else(|_| "not installed".into())
        };
        Machine {
            cpu,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kernel,
            loadavg_before: loadavg(),
            kvswitch: format!("kvswitch {}", env!("CARGO_PKG_VERSION")),
            memcached: bin("memcached", "-V"),
            nutcracker: bin("nutcracker", "-V")
                .trim_start_matches("This is ")
                .to_string(),
        }
    }

    /// One markdown paragraph.
    pub fn markdown(&self) -> String {
        format!(
            "Machine: {} ({} cores), Linux {}, load average {} before the run; {}, {}, {}.",
            self.cpu,
            self.cores,
            self.kernel,
            self.loadavg_before
                .map_or_else(|| "unknown".into(), |l| format!("{:.2}", l[0])),
            self.kvswitch,
            self.memcached,
            self.nutcracker
        )
    }
}

/// The load averages of /proc/loadavg.
pub fn loadavg() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut it = text.split_whitespace().map(|w| w.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

/// The files of one scenario's results.
pub struct Output {
    dir: PathBuf,
    /// Markdown image links of the plots written so far.
    plots: Vec<String>,
}

impl Output {
    /// Creates the folder (and its parents); files of an earlier run in it are overwritten.
    pub fn create(dir: &Path) -> anyhow::Result<Output> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the results folder {}", dir.display()))?;
        Ok(Output {
            dir: dir.to_path_buf(),
            plots: Vec::new(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Draws `chart` as `<name>.png` and `<name>.svg`.
    pub fn plot(&mut self, name: &str, chart: &Chart) -> anyhow::Result<()> {
        plot::write(chart, &self.dir.join(name))?;
        let title = match chart {
            Chart::Line(c) => &c.title,
            Chart::Bars(c) => &c.title,
        };
        self.plots.push(format!("![{title}]({name}.png)"));
        Ok(())
    }

    /// Writes `results.json`.
    pub fn json(&self, value: &impl Serialize) -> anyhow::Result<()> {
        let path = self.dir.join("results.json");
        let text = serde_json::to_string_pretty(value)?;
        std::fs::write(&path, text + "\n").with_context(|| format!("writing {}", path.display()))
    }

    /// Writes `summary.md`: `body`, then the plots, then the machine; prints it too.
    pub fn summary(&self, body: &str, machine: &Machine) -> anyhow::Result<()> {
        let mut text = body.trim_end().to_string();
        text.push_str("\n\n");
        for p in &self.plots {
            let _ = writeln!(text, "{p}\n");
        }
        let _ = writeln!(text, "{}", machine.markdown());
        let path = self.dir.join("summary.md");
        std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
        println!("{text}");
        println!(
            "results written to {} (results.json, summary.md, plots as PNG and SVG)",
            self.dir.display()
        );
        Ok(())
    }
}

/// `x` with `decimals` decimals, or "-" for none or not finite.
pub fn fmt(x: Option<f64>, decimals: usize) -> String {
    match x {
        Some(v) if v.is_finite() => format!("{v:.decimals$}"),
        _ => "-".into(),
    }
}

/// `a / b` when both are present and positive.
pub fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if a > 0.0 && b > 0.0 && a.is_finite() && b.is_finite() => Some(a / b),
        _ => None,
    }
}

/// A ratio as "1.23x", or "-".
pub fn times(r: Option<f64>) -> String {
    r.map_or_else(|| "-".into(), |r| format!("{r:.2}x"))
}
