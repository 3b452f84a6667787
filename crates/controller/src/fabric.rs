//! A caching fabric's registration table (`fabric` in the controller's file): the fabric's
//! switches are probed every probe interval, and a switch whose API fails `down_after` probes
//! in a row is counted out in a new table installed on every switch (IncBricks 4.4: traffic
//! then takes non-designated paths uncached until the table names new designated switches);
//! one that answers again is taken back the same way. With a store, each table is written to
//! etcd before it is installed (else to the state file, when there is one), and a controller
//! that takes the lead or starts again carries on from the stored one: its failed switches
//! stay failed until they answer, and versions only grow.

use api::metrics::{Exposition, Kind};
use std::sync::atomic::Ordering;
use std::time::Instant;

use serde_json::{json, Value};

use super::{Shared, CAMPAIGN_INTERVAL};
use crate::keeper::{Keeper, Table};

/// What the controller shows of the fabric.
#[derive(Debug, Clone, Default)]
pub(super) struct FabricStatus {
    /// The fabric file.
    pub file: String,
    /// The table installed last: version and failed switches.
    pub version: u64,
    pub failed: Vec<String>,
    /// Each switch: name, alive, probes failed in a row.
    pub switches: Vec<(String, bool, u32)>,
    /// Tables installed, and switches that refused one.
    pub tables: u64,
    pub refusals: u64,
    pub last_error: Option<String>,
}

/// Keeps the table while this controller acts; runs until the controller stops.
pub(super) fn keep(shared: &Shared, mut keeper: Keeper) {
    // Whether the stored table has been read since this controller last took the lead.
    let mut resumed = false;
    while !shared.stop.load(Ordering::Relaxed) {
        let began = Instant::now();
        let (acting, interval) = {
            let f = shared.fleet();
            (f.acting(), f.file.probe_interval)
        };
        if !acting {
            resumed = false;
            std::thread::sleep(CAMPAIGN_INTERVAL);
            continue;
        }
        if !resumed {
            match stored_table(shared) {
                Ok(Some(table)) => keeper.resume(table),
                Ok(None) => {}
                Err(e) => {
                    set_error(shared, format!("reading the stored table: {e:#}"));
                    std::thread::sleep(CAMPAIGN_INTERVAL);
                    continue;
                }
            }
            resumed = true;
        }
        if let Some(table) = keeper.probe() {
            // Stored first: a controller that takes over never installs an older version.
            let stored = shared.save(FABRIC_KEY, &table.stored());
            match stored {
                Ok(()) if shared.fleet().acting() => {
                    let refused = keeper.install(table);
                    let mut f = shared.fleet();
                    if let Some(s) = &mut f.fabric {
                        s.tables += 1;
                        s.refusals += refused.len() as u64;
                        s.last_error = (!refused.is_empty())
                            .then(|| format!("not installed on {}", refused.join(", ")));
                    }
                }
                Ok(()) => {}
                Err(e) => set_error(shared, format!("storing the table: {e:#}")),
            }
        } else if shared.fleet().acting() {
            let refused = keeper.catch_up();
            if !refused.is_empty() {
                set_error(shared, format!("not installed on {}", refused.join(", ")));
            }
        }
        {
            let mut f = shared.fleet();
            if let Some(s) = &mut f.fabric {
                s.version = keeper.table().version;
                s.failed = keeper.table().failed.iter().cloned().collect();
                s.switches = keeper
                    .switches()
                    .map(|(n, alive, missed)| (n.to_string(), alive, missed))
                    .collect();
            }
        }
        std::thread::sleep(interval.saturating_sub(began.elapsed()));
    }
}

fn set_error(shared: &Shared, error: String) {
    tracing::warn!("fabric: {error}");
    if let Some(s) = &mut shared.fleet().fabric {
        s.last_error = Some(error);
    }
}

/// The fabric's part of `/api/v1/fleet`.
pub(super) fn status(s: &Option<FabricStatus>) -> Value {
    let Some(s) = s else {
        return Value::Null;
    };
    let switches: Vec<Value> = s
        .switches
        .iter()
        .map(|(name, alive, missed)| json!({"name": name, "up": alive, "missed": missed}))
        .collect();
    json!({
        "file": s.file, "registration_version": s.version, "failed": s.failed,
        "switches": switches, "tables_installed": s.tables, "refusals": s.refusals,
        "last_error": s.last_error,
    })
}

/// The fabric's metrics.
pub(super) fn metrics(s: &Option<FabricStatus>, m: &mut Exposition) {
    let Some(s) = s else {
        return;
    };
    m.single(
        "kvswitch_controller_fabric_registration_version",
        Kind::Gauge,
        "The registration table's version installed last.",
        s.version,
    );
    m.single(
        "kvswitch_controller_fabric_tables_total",
        Kind::Counter,
        "Registration tables installed.",
        s.tables,
    );
    m.family(
        "kvswitch_controller_fabric_switch_up",
        Kind::Gauge,
        "1 while the fabric switch answers its probes.",
    );
    for (name, alive, _) in &s.switches {
        m.sample(
            "kvswitch_controller_fabric_switch_up",
            &[("switch", name)],
            u8::from(*alive),
        );
    }
}

/// The state store's key of the registration table.
const FABRIC_KEY: &str = "fabric";

/// The registration table as stored (in etcd with a store, else in the state file), if it is.
fn stored_table(shared: &Shared) -> anyhow::Result<Option<Table>> {
    let Some(bytes) = shared.load(FABRIC_KEY)? else {
        return Ok(None);
    };
    let doc: Value = serde_json::from_slice(&bytes)
        .map_err(|e| anyhow::anyhow!("the stored fabric table is not JSON: {e}"))?;
    Table::from_json(&doc).map(Some)
}

impl Table {
    /// The table as etcd holds it.
    fn stored(&self) -> Vec<u8> {
        self.to_json().to_string().into_bytes()
    }
}
