//! The registration table's keeper (IncBricks, section 4.4): it probes every fabric switch's
//! API and, when the set of dead switches changes, installs a new table that names them
//! failed. `kvswitch fabric watch` runs one alone; `kvswitch controller` with `fabric` set runs
//! one as the leader.

use kv::health::{Detector, Thresholds};
use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Context;
use api::Client;
use config::fabric::FabricConfig;
use serde_json::{json, Value};

/// How long a probe or an install waits for a switch's answer: a switch slower than this is
/// as good as dead to the fabric.
const PROBE_WITHIN: Duration = Duration::from_secs(1);

/// The fabric's token as a controller sends it: from the fabric file's `api_token_file`
/// alone, never from the environment, where a controller's own token lives.
pub fn fabric_token(cfg: &FabricConfig) -> anyhow::Result<Option<String>> {
    cfg.api_token_file
        .as_deref()
        .map(api::client::file_token)
        .transpose()
}

/// `PUT /api/v1/fabric/registration` of `table` to one switch.
fn install(api: &Client, table: &Value) -> anyhow::Result<Value> {
    api.call_within(
        "PUT",
        "/api/v1/fabric/registration",
        Some(table),
        PROBE_WITHIN,
    )
}

/// A registration table: its version and the switches it counts out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub version: u64,
    pub failed: BTreeSet<String>,
}

impl Table {
    /// The body of `PUT /api/v1/fabric/registration`, and how a controller stores it.
    pub fn to_json(&self) -> Value {
        json!({"version": self.version, "failed": self.failed})
    }

    /// A table as [`Table::to_json`] writes it.
    pub fn from_json(v: &Value) -> anyhow::Result<Table> {
        let version = v["version"].as_u64().context("a table without a version")?;
        let failed = v["failed"]
            .as_array()
            .context("a table without a failed list")?
            .iter()
            .map(|n| {
                n.as_str()
                    .map(String::from)
                    .context("a failed switch not named")
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Table { version, failed })
    }
}

/// The registration table's keeper: probes every switch's API, and makes a new table (with
/// the switches found dead failed) when the set of dead ones changes. `kvswitch fabric watch`
/// and `kvswitch controller` (with `fabric` set) both run one.
pub struct Keeper {
    /// Every switch with an API: its name and a client of its API (with the fabric's token).
    switches: Vec<(String, Client)>,
    /// Whether each switch is taken for alive (the one failure detector: dead after
    /// `failures` probes failed in a row, alive again at its first answer).
    alive: Vec<Detector>,
    thresholds: Thresholds,
    /// Per switch: whether it answered the last probe holding an older table than `table`.
    behind: Vec<bool>,
    /// The table installed last (version 0: none yet).
    table: Table,
}

impl Keeper {
    /// A keeper of the switches of `cfg`, speaking to their APIs with `token` (the fabric's:
    /// see [`fabric_token`]).
    pub fn new(cfg: &FabricConfig, failures: u32, token: Option<String>) -> anyhow::Result<Keeper> {
        let switches: Vec<(String, Client)> = cfg
            .switches
            .iter()
            .filter_map(|s| {
                let api = Client::new(s.api?, token.clone());
                Some((s.name.clone(), api))
            })
            .collect();
        anyhow::ensure!(
            !switches.is_empty(),
            "{}: no switch has an `api` to watch",
            cfg.path.display()
        );
        Ok(Keeper {
            alive: vec![Detector::up(); switches.len()],
            behind: vec![false; switches.len()],
            switches,
            thresholds: Thresholds {
                down_after: failures.max(1),
                up_after: 1,
            },
            table: Table {
                version: 0,
                failed: BTreeSet::new(),
            },
        })
    }

    /// Carries on from a table installed before (a controller taking over from another): its
    /// failed switches stay failed until they answer a probe.
    pub fn resume(&mut self, table: Table) {
        for ((name, _), alive) in self.switches.iter().zip(&mut self.alive) {
            if table.failed.contains(name) {
                *alive = Detector::down();
            }
        }
        if table.version > self.table.version {
            self.table = table;
        }
    }

    /// The table installed last.
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// Each switch's name, whether it is taken for alive, and its probes failed in a row.
    pub fn switches(&self) -> impl Iterator<Item = (&str, bool, u32)> {
        self.switches
            .iter()
            .zip(&self.alive)
            .map(|((name, _), d)| (name.as_str(), d.is_up(), d.failed_in_row()))
    }

    /// Probes every switch once; the new table to install when the set of dead switches
    /// changed. Its version is above every version a switch reported holding.
    pub fn probe(&mut self) -> Option<Table> {
        let mut version = self.table.version;
        let probed = self
            .switches
            .iter()
            .zip(&mut self.alive)
            .zip(&mut self.behind);
        let t = self.thresholds;
        for (((_, api), alive), behind) in probed {
            *behind = false;
            match api.call_within("GET", "/api/v1/fabric", None, PROBE_WITHIN) {
                Ok(doc) => {
                    alive.record(true, t);
                    let held = doc["registration_version"].as_u64().unwrap_or(0);
                    version = version.max(held);
                    *behind = held < self.table.version;
                }
                _ => {
                    alive.record(false, t);
                }
            }
        }
        let dead: BTreeSet<String> = self
            .switches()
            .filter(|(_, alive, _)| !alive)
            .map(|(name, _, _)| name.to_string())
            .collect();
        (dead != self.table.failed).then(|| Table {
            version: version + 1,
            failed: dead,
        })
    }

    /// Sends `table` to every switch, the ones taken for dead too (a switch that is only slow
    /// learns that it was named failed, and forgets its copies), and keeps it as the table
    /// installed. Returns the switches that did not take it.
    pub fn install(&mut self, table: Table) -> Vec<String> {
        let body = table.to_json();
        tracing::info!(version = table.version, failed = ?table.failed, "installing a registration table");
        let mut refused = Vec::new();
        for (name, api) in &self.switches {
            if let Err(e) = install(api, &body) {
                tracing::warn!(switch = %name, "registration table not installed: {e:#}");
                refused.push(name.clone());
            }
        }
        self.table = table;
        refused
    }

    /// Sends the table installed last again to the switches the last probe found holding an
    /// older one (it did not reach them, or a controller stored it and lost the lead before
    /// installing it). Returns the switches that did not take it.
    pub fn catch_up(&mut self) -> Vec<String> {
        let body = self.table.to_json();
        let mut refused = Vec::new();
        for ((name, api), behind) in self.switches.iter().zip(&mut self.behind) {
            if !*behind {
                continue;
            }
            tracing::info!(switch = %name, version = self.table.version, "installing the registration table again");
            match install(api, &body) {
                Ok(_) => *behind = false,
                Err(e) => {
                    tracing::warn!(switch = %name, "registration table not installed: {e:#}");
                    refused.push(name.clone());
                }
            }
        }
        refused
    }
}

/// `kvswitch fabric watch`: a [`Keeper`] probing every `every` until `stop`.
pub fn watch(
    cfg: &FabricConfig,
    every: std::time::Duration,
    failures: u32,
    stop: &dyn Fn() -> bool,
) -> anyhow::Result<()> {
    let token = api::client::token(cfg.api_token_file.as_deref())?;
    let mut keeper = Keeper::new(cfg, failures, token)?;
    while !stop() {
        match keeper.probe() {
            Some(table) => {
                keeper.install(table);
            }
            None => {
                keeper.catch_up();
            }
        }
        std::thread::sleep(every);
    }
    Ok(())
}
