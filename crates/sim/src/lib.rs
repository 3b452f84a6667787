//! `kvswitch sim`: a discrete-event simulator that drives kvswitch's own code on a virtual
//! clock, to ask what happens at a scale no single machine holds.
//!
//! - [`core`]: the event queue (time, then schedule order) and one seeded generator per
//!   source of randomness.
//! - [`station`]: a server's queue and service.
//! - [`scenario`]: what to simulate, checked before anything runs; a file's variants and
//!   sweep expanded into runs (the TOML is read by `config::scenario`).
//! - [`request`]: the request level, SwitchKV's system through the `kv` crate's objects.
//! - [`frame`]: the frame level, IncBricks' fabric through the fabric's switches.
//! - [`output`]: the summary and time series, written the same way every time.
//!
//! Nothing here reads a clock, the operating system's randomness or a file, and no file format
//! is known here: with the `serde` feature the scenario derives Deserialize and the summary
//! Serialize, for `config::scenario` to read and write them. The same scenario and seed give
//! the same bytes.

pub mod core;
pub mod frame;
pub mod output;
pub mod request;
pub mod scenario;
pub mod station;

use std::time::Duration;

pub use output::{Bin, Summary};
pub use scenario::{File, Run, Scenario};

/// How far a run has got, for a progress line.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    pub events: u64,
    pub simulated: Duration,
    pub end: Duration,
}

/// One run's results.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub summary: Summary,
    pub series: Vec<Bin>,
    /// The time series as CSV.
    pub series_csv: String,
    /// Requests a second each backend served in the measured window, by backend.
    pub backend_loads: Vec<f64>,
}

/// Runs one scenario with `seed`.
pub fn run(run: &Run, seed: u64, progress: &mut dyn FnMut(Progress)) -> Result<Outcome, String> {
    let seeds = core::Seeds::new(seed);
    let (mut summary, series, backend_loads) = match run.scenario.level {
        scenario::Level::Request => request::RequestSim::new(&run.scenario, seeds)?.run(progress),
        scenario::Level::Frame => frame::FrameSim::new(&run.scenario, seeds)?.run(progress),
    };
    summary.variant = run.variant.clone();
    summary.x = run.x;
    let series_csv = output::series_csv(&series, run.scenario.bin_ms as f64 / 1000.0);
    Ok(Outcome {
        summary,
        series,
        series_csv,
        backend_loads,
    })
}

/// Per-backend loads as CSV: backend, requests a second.
pub fn backends_csv(loads: &[f64]) -> String {
    let mut out = String::from("backend,load_rps\n");
    for (i, l) in loads.iter().enumerate() {
        out.push_str(&format!("{i},{l:.1}\n"));
    }
    out
}
