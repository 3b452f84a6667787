//! The loop of the side-by-side scenarios: a testbed built for each group of systems and its
//! keys preloaded, every run measuring each point with the systems in that run's rotated
//! order, the medians over the runs, then the results folder. A scenario brings only what is
//! its own: its systems and testbeds, one measurement, its figures, plots and summary. The
//! runner never measures anything itself.

use serde::Serialize;

use super::bed::{Bed, BedSpec, CacheSetup, Servers, Setup, System};
use super::output::{Machine, Output};
use super::plot::Chart;
use super::Common;
use crate::measure::{median, median_of_some};

/// One scenario's run: the machine it ran on (described before anything started), its
/// results folder and how many times every measurement is made.
pub struct Runner {
    name: &'static str,
    runs: u32,
    machine: Machine,
    out: Output,
}

/// One testbed of a scenario and what every run measures on it.
pub struct Stage<A> {
    /// What the testbed holds, for the line that says it is being built.
    pub testbed: String,
    pub spec: BedSpec,
    /// Keys set before the first run.
    pub preload: Vec<Keys>,
    /// The systems measured, in table order; each run starts with another (see [`rotated`]).
    pub systems: Vec<System>,
    /// Where each run measures, in order; every system at every point.
    pub points: Vec<A>,
}

/// `count` keys `prefix<i>` of `value_size` bytes.
pub struct Keys {
    pub count: u64,
    pub prefix: String,
    pub value_size: usize,
}

impl Keys {
    pub fn new(count: u64, prefix: &str, value_size: usize) -> Keys {
        Keys {
            count,
            prefix: prefix.to_string(),
            value_size,
        }
    }
}

impl<A> Stage<A> {
    /// The peers' testbed for `systems`, which share `setup`: `servers` memcached in `l2` mode,
    /// kvswitch and nutcracker; with kvswitch's cache for [`Setup::Cache`], one that may hold
    /// every one of `cache_keys` keys once read. No keys preloaded and no points yet.
    pub fn peers(
        common: &Common,
        setup: Setup,
        systems: Vec<System>,
        cache_keys: u64,
        servers: usize,
    ) -> Self {
        let cached = setup == Setup::Cache;
        let with = match setup {
            Setup::Cache => " with its cache",
            Setup::TcpProxy => " with TCP on the proxy's path",
            _ => "",
        };
        Stage {
            testbed: format!("1 client, {servers} memcached, kvswitch{with}, nutcracker"),
            spec: BedSpec {
                prefix: common.prefix.clone(),
                servers: Servers::Memcached { n: servers },
                cache: cached.then(|| CacheSetup::whole_keyspace(cache_keys)),
                switchkv: None,
                nutcracker: true,
                datapath: None,
                tcp: (setup == Setup::TcpProxy).then_some("proxy"),
            },
            preload: Vec::new(),
            systems,
            points: Vec::new(),
        }
    }
}

/// One measurement's figures, as a scenario records them.
pub trait Figures: Sized {
    /// Where they were taken (the system and the point of the sweep): what the runs of one
    /// median share.
    type At: PartialEq;

    fn at(&self) -> Self::At;

    /// The figures of one place over its runs: the median of each.
    fn median(runs: &Runs<'_, Self>) -> Self;

    /// What the progress line of the measurement shows after its run.
    fn line(&self) -> String;
}

/// The runs of one place, at least one.
pub struct Runs<'a, P>(Vec<&'a P>);

impl<'a, P> Runs<'a, P> {
    /// The first run, for what every run of the place shares.
    pub fn first(&self) -> &'a P {
        self.0[0]
    }

    pub fn count(&self) -> u32 {
        self.0.len() as u32
    }

    pub fn iter(&self) -> impl Iterator<Item = &'a P> + '_ {
        self.0.iter().copied()
    }

    pub fn median(&self, figure: impl Fn(&P) -> f64) -> f64 {
        median(self.iter().map(figure).collect())
    }

    /// The median of the runs that have the figure.
    pub fn median_of_some(&self, figure: impl Fn(&P) -> Option<f64>) -> Option<f64> {
        median_of_some(self.iter().map(figure))
    }
}

/// The median figures of every place, in the order the places were first measured (the first
/// run keeps each stage's systems in table order).
pub fn medians<P: Figures>(runs: &[P]) -> Vec<P> {
    let mut places: Vec<P::At> = Vec::new();
    for p in runs {
        let at = p.at();
        if !places.contains(&at) {
            places.push(at);
        }
    }
    places
        .into_iter()
        .map(|at| P::median(&Runs(runs.iter().filter(|p| p.at() == at).collect())))
        .collect()
}

/// The systems of run `run`, each first in turn, so that drift over a scenario (a neighbour's
/// load, a server's growing memory) falls on all of them alike.
pub fn rotated<S: Clone>(systems: &[S], run: u32) -> Vec<S> {
    let mut v = systems.to_vec();
    if !v.is_empty() {
        let n = run as usize % v.len();
        v.rotate_left(n);
    }
    v
}

/// Says on stderr what run `run` of `runs` measured.
pub fn progress(run: u32, runs: u32, figures: &impl Figures) {
    eprintln!("  run {}/{runs}  {}", run + 1, figures.line());
}

/// What `results.json` records besides the scenario's name and the machine.
pub struct Record<'a, S, P, X = ()> {
    pub settings: S,
    /// The systems compared, in table order; none where the figures name their own.
    pub systems: Option<&'a [System]>,
    /// Every measurement of every run, in the order made.
    pub runs: &'a [P],
    pub medians: &'a [P],
    /// Fields of the scenario's own, after the others.
    pub more: X,
}

#[derive(Serialize)]
struct Results<'a, S, P, X> {
    scenario: &'static str,
    settings: &'a S,
    machine: &'a Machine,
    #[serde(skip_serializing_if = "Option::is_none")]
    systems: Option<&'a [System]>,
    runs: &'a [P],
    medians: &'a [P],
    #[serde(flatten)]
    more: &'a X,
}

impl Runner {
    /// Describes the machine and creates the results folder (`--out`, else
    /// `results/<name>`).
    pub fn start(name: &'static str, common: &Common) -> anyhow::Result<Runner> {
        let machine = Machine::describe();
        let out = Output::create(&super::bed::out_dir(common.out.as_ref(), name))?;
        Ok(Runner {
            name,
            runs: common.runs(),
            machine,
            out,
        })
    }

    /// How many times every measurement is made.
    pub fn runs(&self) -> u32 {
        self.runs
    }

    /// Builds a testbed of `spec`, saying first on stderr what it holds (`testbed`).
    pub fn up(&self, testbed: &str, spec: &BedSpec) -> anyhow::Result<Bed> {
        eprintln!("{}: building the testbed ({testbed})...", self.name);
        Bed::up(spec)
    }

    /// Every stage in turn: its testbed built and preloaded, then in every run each point
    /// with each system in the run's rotated order, `measure(bed, system, point, run)` each,
    /// a progress line each; the testbed is taken down before the next. The figures of every
    /// measurement, in the order made.
    pub fn measure<A, P: Figures>(
        &self,
        stages: impl IntoIterator<Item = Stage<A>>,
        mut measure: impl FnMut(&Bed, System, &A, u32) -> anyhow::Result<P>,
    ) -> anyhow::Result<Vec<P>> {
        let mut figures = Vec::new();
        for stage in stages {
            let bed = self.up(&stage.testbed, &stage.spec)?;
            for keys in &stage.preload {
                bed.preload(keys.count, &keys.prefix, keys.value_size)?;
            }
            for run in 0..self.runs {
                for at in &stage.points {
                    for system in rotated(&stage.systems, run) {
                        let p = measure(&bed, system, at, run)?;
                        progress(run, self.runs, &p);
                        figures.push(p);
                    }
                }
            }
            bed.down()?;
        }
        Ok(figures)
    }

    /// Writes `results.json`, then each plot (`name`, chart) as PNG and SVG, then `summary.md`
    /// (`summary`, the plots and the machine), which is also printed.
    pub fn finish<S: Serialize, P: Serialize, X: Serialize>(
        mut self,
        record: Record<'_, S, P, X>,
        plots: Vec<(String, Chart)>,
        summary: &str,
    ) -> anyhow::Result<()> {
        self.out.json(&Results {
            scenario: self.name,
            settings: &record.settings,
            machine: &self.machine,
            systems: record.systems,
            runs: record.runs,
            medians: record.medians,
            more: &record.more,
        })?;
        for (name, chart) in &plots {
            self.out.plot(name, chart)?;
        }
        self.out.summary(summary, &self.machine)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Point {
        system: char,
        x: u32,
        y: f64,
        run: u32,
    }

    impl Figures for Point {
        type At = (char, u32);

        fn at(&self) -> (char, u32) {
            (self.system, self.x)
        }

        fn median(runs: &Runs<'_, Point>) -> Point {
            Point {
                y: runs.median(|p| p.y),
                run: runs.count(),
                ..*runs.first()
            }
        }

        fn line(&self) -> String {
            format!("{} at {}", self.system, self.x)
        }
    }

    #[test]
    fn every_system_goes_first_once_in_as_many_runs() {
        let systems = ['a', 'b', 'c'];
        let firsts: Vec<char> = (0..3).map(|r| rotated(&systems, r)[0]).collect();
        assert_eq!(firsts, systems);
        assert_eq!(rotated(&systems, 3), rotated(&systems, 0));
        assert_eq!(rotated(&systems, 1), ['b', 'c', 'a']);
        assert!(rotated::<char>(&[], 2).is_empty());
    }

    #[test]
    fn medians_per_place_in_the_order_first_measured() {
        let p = |system, x, y, run| Point { system, x, y, run };
        let runs = [
            p('a', 2, 1.0, 0),
            p('b', 2, 5.0, 0),
            p('a', 1, 7.0, 0),
            p('b', 2, 3.0, 1),
            p('a', 2, 3.0, 1),
            p('a', 2, 2.0, 2),
        ];
        assert_eq!(
            medians(&runs),
            [p('a', 2, 2.0, 3), p('b', 2, 4.0, 2), p('a', 1, 7.0, 1)]
        );
    }
}
