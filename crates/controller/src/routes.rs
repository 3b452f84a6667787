//! Routes the controller keeps on its switches, changed consistently: every frame is handled
//! by one version of them from its first switch to its last, never by a mix (AppSwitch §5.2,
//! after the two-phase update of Reitblatt et al.). It changes the switches only through
//! their control APIs, and holds nothing on the data path.
//!
//! On each switch the controller makes two tables of its own, reached from `acl` by one entry
//! matching `[routes] match` (the frames it routes):
//!
//! - [`STAMP`] (ternary on `in_port`): on an edge port, `set_dscp` the version in force and go
//!   on to [`ROUTES`]; from any other port the frame goes on as its first switch stamped it;
//! - [`ROUTES`] (ternary on `acl`'s fields and `dscp`, the ToS byte's top 6 bits): the entries
//!   of each installed version, each under `dscp = version`.
//!
//! An update to version `v` (1 to 63; 0 is "unstamped", and a version still installed is
//! never taken) runs in phases, each on every switch at once: *ready* (read a switch the
//! controller does not know yet, making its tables), *prepare* (add `v`'s entries, one batch a
//! switch, and wait for every switch to acknowledge), *flip* (every edge port stamps `v`),
//! *drain* (wait `drain_ms`, so that frames stamped with the old version leave the fabric)
//! and *cleanup* (delete every other version). A switch that refuses or cannot be reached
//! before the flip stops the update: what was added is taken out again, and the old version
//! stays in force everywhere.

use api::metrics::{self, Exposition};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use config::controller::RoutesSpec;
use serde::Deserialize;
use serde_json::{json, Value as JsonValue};
use switch::control::{
    ActionDef, Change, EntryDef, EntryView, KeyField, Kind, TableDef, Value, ACL, ACL_KEY,
};

use super::{authorised, leading, refuse, Reply, Shared, SWITCH_WAIT};
use api::{Client, Refused};

/// The controller's stamp table on each switch.
pub const STAMP: &str = "ctl_stamp";
/// The controller's routes table on each switch.
pub const ROUTES: &str = "ctl_routes";
/// The key field of [`ROUTES`] that holds the version: the ToS byte of an Ethernet II / IPv4
/// frame, matched under [`DSCP_MASK`].
pub const DSCP_FIELD: &str = "dscp";
const DSCP_MASK: &str = "0xfc";
/// Versions are DSCP values; 0 means a frame no switch has stamped.
pub const MAX_VERSION: u8 = switch::control::MAX_DSCP;
/// Most entries of one switch in one version: they are added as one batch, and a ternary
/// table costs every frame that reaches it about 50 ns an entry.
pub const MAX_ENTRIES: usize = 2000;

/// The version after `current` in the cycle 1..=63 that is not `taken` (installed or stamped
/// on some switch), or `None` if every one is.
pub fn next_version(current: Option<u8>, taken: &BTreeSet<u8>) -> Option<u8> {
    let start = current.map_or(1, |c| c % MAX_VERSION + 1);
    (0..MAX_VERSION)
        .map(|k| (start - 1 + k) % MAX_VERSION + 1)
        .find(|v| !taken.contains(v))
}

/// The match value that selects version `v` in [`ROUTES`].
pub fn dscp_match(v: u8) -> Value {
    Value::Masked {
        value: Box::new(Value::Number(u64::from(v) << 2)),
        mask: Box::new(Value::Text(DSCP_MASK.into())),
    }
}

/// The version an entry of [`ROUTES`] belongs to, from its match as the switch lists it.
pub fn version_of(listed_match: &BTreeMap<String, Value>) -> Option<u8> {
    let Some(Value::Masked { value, .. }) = listed_match.get(DSCP_FIELD) else {
        return None;
    };
    let &Value::Number(v) = value.as_ref() else {
        return None;
    };
    u8::try_from(v >> 2)
        .ok()
        .filter(|v| (1..=MAX_VERSION).contains(v))
}

/// `entries` as additions to [`ROUTES`] under version `v`.
pub fn versioned(entries: &[EntryDef], v: u8) -> Vec<Change> {
    entries
        .iter()
        .map(|e| {
            let mut entry = e.clone();
            entry.fields.insert(DSCP_FIELD.into(), dscp_match(v));
            Change::Add {
                table: ROUTES.into(),
                entry,
            }
        })
        .collect()
}

/// What the controller knows it has put on one switch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OnSwitch {
    /// Whether the switch was read (false at first and after any failure there: it is read
    /// again before the next update).
    pub known: bool,
    /// Entry ids in [`ROUTES`], by version.
    pub installed: BTreeMap<u8, Vec<u64>>,
    /// The stamp entries: port → (entry id, version it stamps).
    pub stamps: BTreeMap<u16, (u64, u8)>,
}

/// One change of the stamp table and what it makes of the port's stamp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StampEffect {
    /// The port stamps this version (its entry's id comes from the batch's reply).
    Stamps(u16, u8),
    /// The port's entry is gone.
    Gone(u16),
}

fn stamp_actions(v: u8) -> Vec<ActionDef> {
    vec![ActionDef::SetDscp(v), ActionDef::Goto(ROUTES.into())]
}

/// The changes that bring the stamp table from `on.stamps` to `want` (port → version).
pub fn stamp_changes(on: &OnSwitch, want: &BTreeMap<u16, u8>) -> Vec<(Change, StampEffect)> {
    let mut out = Vec::new();
    for (&port, &v) in want {
        let effect = StampEffect::Stamps(port, v);
        match on.stamps.get(&port) {
            Some(&(_, now)) if now == v => {}
            Some(&(id, _)) => out.push((
                Change::Modify {
                    table: STAMP.into(),
                    id,
                    actions: stamp_actions(v),
                },
                effect,
            )),
            None => out.push((
                Change::Add {
                    table: STAMP.into(),
                    entry: EntryDef {
                        fields: BTreeMap::from([("in_port".into(), Value::Number(port.into()))]),
                        priority: 1,
                        prefix_len: None,
                        actions: stamp_actions(v),
                    },
                },
                effect,
            )),
        }
    }
    for (&port, &(id, _)) in &on.stamps {
        if !want.contains_key(&port) {
            let change = Change::Delete {
                table: STAMP.into(),
                id,
            };
            out.push((change, StampEffect::Gone(port)));
        }
    }
    out
}

/// `on` after `changes` were applied and answered with `ids` (one per change, in order).
fn after_stamps(on: &mut OnSwitch, changes: &[(Change, StampEffect)], ids: &[u64]) {
    for ((_, effect), &id) in changes.iter().zip(ids) {
        match *effect {
            StampEffect::Stamps(port, v) => {
                on.stamps.insert(port, (id, v));
            }
            StampEffect::Gone(port) => {
                on.stamps.remove(&port);
            }
        }
    }
}

/// Why a step on a switch failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The switch answered and refused (4xx): nothing of that call was applied.
    Refused(String),
    /// No answer, or not a clear one (5xx, a timeout): the call may or may not have applied.
    OutOfReach(String),
    /// This controller no longer leads.
    NotLeading,
}

impl Failure {
    fn status(&self) -> StatusCode {
        match self {
            Failure::Refused(_) => StatusCode::CONFLICT,
            Failure::OutOfReach(_) => StatusCode::BAD_GATEWAY,
            Failure::NotLeading => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Refused(m) => write!(f, "refused: {m}"),
            Failure::OutOfReach(m) => write!(f, "out of reach: {m}"),
            Failure::NotLeading => write!(f, "this controller no longer leads"),
        }
    }
}

/// Calls to one switch, each given [`SWITCH_WAIT`], each only while this controller leads.
struct Calls<'a> {
    /// The switch's client, its calls limited to [`SWITCH_WAIT`].
    client: Client,
    leads: &'a (dyn Fn() -> bool + Sync),
}

impl Calls<'_> {
    /// `call` on the switch's client, if this controller still leads; its error as a
    /// [`Failure`].
    fn call<T>(&self, call: impl FnOnce(&Client) -> anyhow::Result<T>) -> Result<T, Failure> {
        if !(self.leads)() {
            return Err(Failure::NotLeading);
        }
        call(&self.client).map_err(|e| match e.downcast_ref::<Refused>() {
            Some(r) if (400..500).contains(&r.status) => Failure::Refused(r.to_string()),
            _ => Failure::OutOfReach(format!("{e:#}")),
        })
    }

    /// Applies `changes` as batches of at most [`switch::control::MAX_BATCH`]; the ids, one
    /// per change. No changes make no call, so they need no leader either.
    fn batch(&self, changes: &[Change]) -> Result<Vec<u64>, Failure> {
        // Leadership is checked again before each chunk: a controller that loses the lead in
        // the middle of a long update stops there.
        let mut ids = Vec::with_capacity(changes.len());
        for chunk in changes.chunks(switch::control::MAX_BATCH) {
            ids.extend(self.call(|c| c.batch(chunk))?);
        }
        Ok(ids)
    }

    /// Every entry of `table`, a page at a time.
    fn entries(&self, table: &str) -> Result<Vec<EntryView>, Failure> {
        self.call(|c| c.table_entries(table))
    }
}

/// A controller that has just taken the lead waits until a call the last leader made to a
/// switch can no longer land ([`SWITCH_WAIT`] after the lead was taken).
fn after_last_leader(shared: &Shared) {
    let led_since = shared.fleet().led_since;
    if let Some(wait) = led_since.map(|t| SWITCH_WAIT.saturating_sub(t.elapsed())) {
        std::thread::sleep(wait);
    }
}

/// Calls to each of `switches`, each given [`SWITCH_WAIT`] and made only while `leads`.
fn calls_to<'a>(
    shared: &Shared,
    switches: &[config::controller::SwitchRef],
    leads: &'a (dyn Fn() -> bool + Sync),
) -> Vec<Calls<'a>> {
    switches
        .iter()
        .map(|s| Calls {
            client: shared.switch_client(s.api).with_limit(SWITCH_WAIT),
            leads,
        })
        .collect()
}

/// The tables' definitions.
fn stamp_table() -> TableDef {
    TableDef {
        name: STAMP.into(),
        kind: Kind::Ternary,
        key: vec![KeyField::Named("in_port".into())],
        miss: Vec::new(),
        size: None,
    }
}

fn routes_table() -> TableDef {
    let mut key: Vec<KeyField> = ACL_KEY
        .iter()
        .map(|n| KeyField::Named(n.to_string()))
        .collect();
    key.push(KeyField::Bytes {
        name: DSCP_FIELD.into(),
        offset: 15,
        len: 1,
        padded: false,
    });
    TableDef {
        name: ROUTES.into(),
        kind: Kind::Ternary,
        key,
        miss: Vec::new(),
        // The version in force, one a failed update left behind, and the next.
        size: Some(3 * MAX_ENTRIES + 64),
    }
}

/// Reads a switch the controller does not know yet, making what is missing: its two tables
/// ([`STAMP`] before [`ROUTES`], since a goto only goes forward), the entry of `acl` that sends
/// the routed frames to [`STAMP`], and [`STAMP`]'s catch-all that sends the rest on to
/// [`ROUTES`]. Versions installed before (by this controller before a restart, or another
/// that led) are found by their `dscp`.
fn ready(c: &Calls, spec: &RoutesSpec) -> Result<OnSwitch, Failure> {
    let tables = c.call(Client::tables)?;
    let has = |name: &str| tables.iter().any(|t| t.name == name);
    let (has_stamp, has_routes) = (has(STAMP), has(ROUTES));
    if has_routes && !has_stamp {
        // Left alone by hand: made again in order.
        c.call(|c| c.remove_table(ROUTES))?;
    }
    if !has_stamp {
        c.call(|c| c.add_table(&stamp_table()))?;
    }
    if !(has_stamp && has_routes) {
        c.call(|c| c.add_table(&routes_table()))?;
    }
    let mut adds = Vec::new();
    let to_stamp = [ActionDef::Goto(STAMP.into())];
    if !c.entries(ACL)?.iter().any(|e| e.actions == to_stamp) {
        adds.push(Change::Add {
            table: ACL.into(),
            entry: EntryDef {
                fields: spec.traffic.clone(),
                priority: spec.priority,
                prefix_len: None,
                actions: vec![ActionDef::Goto(STAMP.into())],
            },
        });
    }
    let mut on = OnSwitch {
        known: true,
        ..OnSwitch::default()
    };
    let mut catch_all = false;
    for e in c.entries(STAMP)? {
        let port = match e.fields.get("in_port") {
            Some(&Value::Number(p)) => u16::try_from(p).ok(),
            _ => None,
        };
        let stamp = match e.actions.first() {
            Some(&ActionDef::SetDscp(v)) => Some(v),
            _ => None,
        };
        match (port, stamp) {
            (Some(p), Some(v)) => {
                on.stamps.insert(p, (e.id, v));
            }
            (None, None) => catch_all = true,
            _ => {}
        }
    }
    if !catch_all {
        adds.push(Change::Add {
            table: STAMP.into(),
            entry: EntryDef {
                fields: BTreeMap::new(),
                priority: 0,
                prefix_len: None,
                actions: vec![ActionDef::Goto(ROUTES.into())],
            },
        });
    }
    c.batch(&adds)?;
    for e in c.entries(ROUTES)? {
        if let Some(v) = version_of(&e.fields) {
            on.installed.entry(v).or_default().push(e.id);
        }
    }
    Ok(on)
}

/// Runs `f` for every switch at once.
fn each<T: Send>(
    n: usize,
    f: impl Fn(usize) -> Result<T, Failure> + Sync,
) -> Vec<Result<T, Failure>> {
    super::at_once(n, f)
        .into_iter()
        .map(|r| r.unwrap_or_else(|_| Err(Failure::OutOfReach("the call failed".into()))))
        .collect()
}

/// The changes that make every edge port of every switch stamp `v`, by switch.
fn edge_plans(
    spec: &RoutesSpec,
    switches: &[config::controller::SwitchRef],
    on: &[OnSwitch],
    v: u8,
) -> Vec<Vec<(Change, StampEffect)>> {
    switches
        .iter()
        .zip(on)
        .map(|(s, o)| {
            let want: BTreeMap<u16, u8> = spec
                .edge_ports
                .get(&s.name)
                .into_iter()
                .flatten()
                .map(|&p| (p, v))
                .collect();
            stamp_changes(o, &want)
        })
        .collect()
}

/// Applies each switch's plan, all at once: the ids of each, or why not.
fn apply_plans(
    calls: &[Calls],
    plans: &[Vec<(Change, StampEffect)>],
) -> Vec<Result<Vec<u64>, Failure>> {
    each(calls.len(), |i| {
        let changes: Vec<Change> = plans[i].iter().map(|(c, _)| c.clone()).collect();
        calls[i].batch(&changes)
    })
}

/// The outcome of the last update, for the status and the metrics.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub version: Option<u8>,
    pub ok: bool,
    /// The phase it stopped in, or `done`.
    pub phase: &'static str,
    pub switch: Option<String>,
    pub error: Option<String>,
    /// Problems after the flip that left the update standing (an old version not removed).
    pub warnings: Vec<String>,
    /// How long each phase took.
    pub phases: Vec<(&'static str, Duration)>,
    pub total: Duration,
}

impl Outcome {
    fn doc(&self) -> JsonValue {
        let phases: serde_json::Map<String, JsonValue> = self
            .phases
            .iter()
            .map(|(p, d)| (format!("{p}_ms"), json!(d.as_secs_f64() * 1e3)))
            .collect();
        json!({
            "version": self.version, "ok": self.ok, "phase": self.phase,
            "switch": self.switch, "error": self.error, "warnings": self.warnings,
            "phases": phases, "total_ms": self.total.as_secs_f64() * 1e3,
        })
    }
}

/// The controller's routes state.
#[derive(Debug, Default)]
pub struct RouteState {
    /// The version every edge port stamps, once an update has finished.
    pub current: Option<u8>,
    /// The entries of `current`, by switch.
    pub entries: BTreeMap<String, Vec<EntryDef>>,
    /// An update that has begun and not ended, as stored before its first change: one whose
    /// controller died (or lost the lead, or could not put the stamps back) is finished or
    /// undone by [`resume`] before anything else.
    pub pending: Option<Pending>,
    /// By the switch's position in the file.
    pub switches: Vec<OnSwitch>,
    pub last: Option<Outcome>,
    pub updates: u64,
    pub failed: u64,
    /// Updates left half done that were finished (forward) or undone (back) by [`resume`].
    pub resumed_forward: u64,
    pub resumed_back: u64,
}

/// Shared by the API's handlers: one update at a time.
#[derive(Debug, Default)]
pub struct Routes {
    busy: Mutex<()>,
    state: Mutex<RouteState>,
}

impl Routes {
    fn state(&self) -> MutexGuard<'_, RouteState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The body of `PUT /api/v1/routes`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewRoutes {
    /// Switch name → its entries (in the switch API's entry shape). A switch left out gets
    /// none.
    switches: BTreeMap<String, Vec<EntryDef>>,
}

type Refusal = (StatusCode, JsonValue);

/// Replaces the routes with a new version on every switch; see the module's doc.
fn update(shared: &Shared, want: BTreeMap<String, Vec<EntryDef>>) -> Result<JsonValue, Refusal> {
    let routes = &shared.routes;
    let Ok(_busy) = routes.busy.try_lock() else {
        return Err((
            StatusCode::CONFLICT,
            json!({ "error": "another update of the routes is under way" }),
        ));
    };
    let (spec, switches) = {
        let f = shared.fleet();
        (f.file.routes.clone(), f.file.switches.clone())
    };
    let Some(spec) = spec else {
        return Err((
            StatusCode::NOT_FOUND,
            json!({ "error": "the controller's file has no [routes]" }),
        ));
    };
    // A new leader first lets the calls of the last one land: one still in flight could
    // install a version this update is about to choose.
    after_last_leader(shared);
    let started = Instant::now();
    let leads = || shared.fleet().acting();
    let calls = calls_to(shared, &switches, &leads);
    // With etcd, the routes as stored: another controller may have led since.
    if shared.store.is_some() {
        if let Err(e) = load(shared) {
            let error = format!("the stored routes cannot be read: {e:#}");
            return Err((StatusCode::SERVICE_UNAVAILABLE, json!({ "error": error })));
        }
    }
    // An update the last leader (or this controller) left half done is finished or undone
    // before another begins.
    let pending = routes.state().pending.clone();
    if let Some(p) = pending {
        if let Err((i, f)) = resolve(shared, &calls, &spec, &switches, &p) {
            let error = format!(
                "version {} of an update left half done is neither finished nor undone: switch \
                 {}: {f}",
                p.version, switches[i].name
            );
            return Err((f.status(), json!({ "error": error })));
        }
    }
    let (mut on, current) = {
        let st = routes.state();
        let mut on = st.switches.clone();
        on.resize(switches.len(), OnSwitch::default());
        (on, st.current)
    };
    let mut out = Outcome {
        version: None,
        ok: false,
        phase: "ready",
        switch: None,
        error: None,
        warnings: Vec::new(),
        phases: Vec::new(),
        total: Duration::ZERO,
    };
    let mut mark = Instant::now();
    let mut lap = |out: &mut Outcome, phase: &'static str| {
        out.phases.push((phase, mark.elapsed()));
        mark = Instant::now();
    };
    // What ends the update: the state kept, the outcome recorded and the reply.
    let finish = |on: Vec<OnSwitch>,
                  mut out: Outcome,
                  current: Option<u8>,
                  failure: Option<(usize, Failure)>,
                  split: bool| {
        out.total = started.elapsed();
        let mut st = routes.state();
        st.switches = on;
        st.updates += 1;
        let reply = match failure {
            None => {
                out.ok = true;
                out.phase = "done";
                st.current = current;
                st.entries = want.clone();
                st.pending = None;
                let doc = out.doc();
                Ok(doc)
            }
            Some((i, f)) => {
                st.failed += 1;
                // Undone everywhere it went in, unless some switch may still stamp it: then
                // it stays pending, for `resume` to finish or undo.
                if !split {
                    st.pending = None;
                }
                let name = switches.get(i).map_or("-", |s| s.name.as_str());
                out.switch = Some(name.to_string());
                out.error = Some(f.to_string());
                tracing::warn!(switch = %name, phase = out.phase, "routes not updated: {f}");
                let mut doc = out.doc();
                doc["error"] = json!(format!(
                    "switch {} in phase {}: {f}; version {} stays in force",
                    name,
                    out.phase,
                    st.current.map_or("none".to_string(), |v| v.to_string())
                ));
                Err((f.status(), doc))
            }
        };
        st.last = Some(out);
        let kept = st.kept();
        drop(st);
        let _ = save(shared, &kept);
        reply
    };
    let first_failure = |results: &[Result<(), Failure>]| {
        results
            .iter()
            .enumerate()
            .find_map(|(i, r)| r.as_ref().err().map(|f| (i, f.clone())))
    };

    // Ready: read every switch not known yet; with a store, every switch, since another
    // controller may have led in between.
    let fresh = shared.store.is_some();
    let read = each(calls.len(), |i| match on[i].known && !fresh {
        true => Ok(on[i].clone()),
        false => ready(&calls[i], &spec),
    });
    let mut fails = Vec::new();
    for (i, r) in read.into_iter().enumerate() {
        match r {
            Ok(o) => on[i] = o,
            Err(f) => {
                on[i].known = false;
                fails.push(Err(f));
                continue;
            }
        }
        fails.push(Ok(()));
    }
    lap(&mut out, "ready");
    if let Some(f) = first_failure(&fails) {
        return finish(on, out, current, Some(f), false);
    }
    let taken: BTreeSet<u8> = on
        .iter()
        .flat_map(|o| {
            o.installed
                .keys()
                .copied()
                .chain(o.stamps.values().map(|s| s.1))
        })
        .collect();
    let Some(v) = next_version(current, &taken) else {
        let f = Failure::Refused(format!("every version 1 to {MAX_VERSION} is installed"));
        return finish(on, out, current, Some((0, f)), false);
    };
    out.version = Some(v);
    // Stored before the first change: a controller that dies from here on leaves the update
    // to the next leader, which finishes or undoes it.
    let kept = {
        let mut st = routes.state();
        st.pending = Some(Pending {
            version: v,
            entries: want.clone(),
        });
        st.kept()
    };
    if let Err(e) = save(shared, &kept) {
        routes.state().pending = None;
        let f = Failure::OutOfReach(format!("the update could not be stored: {e:#}"));
        return finish(on, out, current, Some((0, f)), false);
    }

    // Prepare: v's entries on every switch, acknowledged by all before any stamps v.
    out.phase = "prepare";
    let none = Vec::new();
    let added = each(calls.len(), |i| {
        let entries = want.get(&switches[i].name).unwrap_or(&none);
        calls[i].batch(&versioned(entries, v))
    });
    if added.iter().any(Result::is_err) {
        let f = first_failure(
            &added
                .iter()
                .map(|r| r.as_ref().map(|_| ()).map_err(Clone::clone))
                .collect::<Vec<_>>(),
        );
        // Take v out where it went in; a switch that did not answer may hold it or not, so it
        // is read again before the next update.
        let undone = each(calls.len(), |i| match &added[i] {
            Ok(ids) => calls[i].batch(&deletes(ids)),
            Err(_) => Ok(Vec::new()),
        });
        for (i, (a, u)) in added.iter().zip(&undone).enumerate() {
            if let (Ok(ids), Err(_)) = (a, u) {
                on[i].installed.insert(v, ids.clone());
                on[i].known = false;
            }
            // A refusal may mean the switch lost its tables (a restart): read it again.
            if a.is_err() {
                on[i].known = false;
            }
        }
        lap(&mut out, "prepare");
        return finish(on, out, current, f, false);
    }
    for (i, ids) in added.into_iter().enumerate() {
        on[i].installed.insert(v, ids.unwrap_or_default());
    }
    lap(&mut out, "prepare");

    // Flip: every edge port stamps v.
    out.phase = "flip";
    let before = on.clone();
    let plans = edge_plans(&spec, &switches, &on, v);
    let flipped = apply_plans(&calls, &plans);
    let flip_ok = flipped.iter().all(Result::is_ok);
    for (i, r) in flipped.iter().enumerate() {
        if let Ok(ids) = r {
            after_stamps(&mut on[i], &plans[i], ids);
        }
    }
    if !flip_ok {
        let f = first_failure(
            &flipped
                .iter()
                .map(|r| r.as_ref().map(|_| ()).map_err(Clone::clone))
                .collect::<Vec<_>>(),
        );
        // Back to the stamps of before; v stays installed everywhere unless every switch
        // is known to stamp it nowhere.
        let back = each(calls.len(), |i| {
            let want: BTreeMap<u16, u8> = before[i]
                .stamps
                .iter()
                .map(|(&p, &(_, s))| (p, s))
                .collect();
            let plan = stamp_changes(&on[i], &want);
            let changes: Vec<Change> = plan.iter().map(|(c, _)| c.clone()).collect();
            calls[i].batch(&changes).map(|ids| (plan, ids))
        });
        let mut clean = true;
        for (i, (r, b)) in flipped.iter().zip(back).enumerate() {
            match b {
                Ok((plan, ids)) => after_stamps(&mut on[i], &plan, &ids),
                Err(_) => {
                    on[i].known = false;
                    clean = false;
                }
            }
            if r.is_err() {
                on[i].known = false;
            }
            if matches!(r, Err(Failure::OutOfReach(_)) | Err(Failure::NotLeading)) {
                clean = false;
            }
        }
        if clean {
            // Frames stamped v before the stamps went back may still be on their way.
            std::thread::sleep(spec.drain);
            let removed = each(calls.len(), |i| {
                calls[i].batch(&deletes(on[i].installed.get(&v).unwrap_or(&Vec::new())))
            });
            for (i, r) in removed.iter().enumerate() {
                match r {
                    Ok(_) => {
                        on[i].installed.remove(&v);
                    }
                    Err(_) => on[i].known = false,
                }
            }
        }
        lap(&mut out, "flip");
        return finish(on, out, current, f, !clean);
    }
    lap(&mut out, "flip");
    {
        let mut st = routes.state();
        st.current = Some(v);
        st.switches = on.clone();
    }

    // Drain: a frame stamped with the old version before the flip leaves the fabric.
    out.phase = "drain";
    std::thread::sleep(spec.drain);
    lap(&mut out, "drain");

    // Cleanup: every other version goes.
    out.phase = "cleanup";
    let removed = each(calls.len(), |i| {
        let old: Vec<u8> = on[i]
            .installed
            .keys()
            .copied()
            .filter(|&u| u != v)
            .collect();
        let ids: Vec<u64> = old
            .iter()
            .flat_map(|u| on[i].installed[u].clone())
            .collect();
        calls[i].batch(&deletes(&ids)).map(|_| old)
    });
    for (i, r) in removed.into_iter().enumerate() {
        match r {
            Ok(old) => {
                for u in old {
                    on[i].installed.remove(&u);
                }
            }
            Err(f) => {
                on[i].known = false;
                out.warnings.push(format!(
                    "switch {}: the old version is not removed yet ({f}); it goes at the next update",
                    switches[i].name
                ));
            }
        }
    }
    lap(&mut out, "cleanup");
    tracing::info!(version = v, took = ?started.elapsed(), "routes updated");
    finish(on, out, Some(v), None, false)
}

/// An update under way: its version and each switch's entries.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct Pending {
    pub version: u8,
    pub entries: BTreeMap<String, Vec<EntryDef>>,
}

/// The routes in force as the state store keeps them, and an update under way.
#[derive(serde::Serialize, Deserialize)]
struct Kept {
    current: Option<u8>,
    entries: BTreeMap<String, Vec<EntryDef>>,
    #[serde(default)]
    pending: Option<Pending>,
}

impl RouteState {
    /// What the store keeps of it: taken under the lock, stored after it is let go.
    fn kept(&self) -> Kept {
        Kept {
            current: self.current,
            entries: self.entries.clone(),
            pending: self.pending.clone(),
        }
    }
}

/// The state store's key of the routes in force.
const STORE_KEY: &str = "routes";

/// Stores the routes in force, so that a controller that restarts or takes the lead can put
/// them back on a switch that restarts.
fn save(shared: &Shared, kept: &Kept) -> anyhow::Result<()> {
    let saved = serde_json::to_vec(kept)
        .map_err(anyhow::Error::from)
        .and_then(|bytes| shared.save(STORE_KEY, &bytes));
    if let Err(e) = &saved {
        tracing::warn!("the routes are not stored: {e:#}");
    }
    saved
}

/// Takes the stored routes in force, unless this controller has routes of its own already
/// and runs without etcd.
///
/// With etcd the stored routes win over this controller's memory: another controller may have
/// led and changed them since this one last did, so every switch is read afresh too.
pub(super) fn load(shared: &Shared) -> anyhow::Result<()> {
    let shared_store = shared.store.is_some();
    let Some(bytes) = shared.load(STORE_KEY)? else {
        return Ok(());
    };
    let kept: Kept = serde_json::from_slice(&bytes)
        .map_err(|e| anyhow::anyhow!("the stored routes are not readable: {e}"))?;
    let mut st = shared.routes.state();
    if shared_store || (st.current.is_none() && st.pending.is_none()) {
        st.current = kept.current;
        st.entries = kept.entries;
        st.pending = kept.pending;
        for on in &mut st.switches {
            on.known = false;
        }
    }
    Ok(())
}

/// Puts the routes in force back on switch `i`, which restarted and lost them: the tables,
/// the version in force with its entries, and its edge ports' stamps. No other switch
/// changes: each already stamps that version, so frames meet one version as before. Waits
/// for an update under way.
pub(super) fn restore(shared: &Shared, i: usize) -> Result<(), Failure> {
    let routes = &shared.routes;
    let (spec, sw) = {
        let f = shared.fleet();
        (f.file.routes.clone(), f.file.switches[i].clone())
    };
    let Some(spec) = spec else {
        return Ok(());
    };
    let _busy = routes.busy.lock().unwrap_or_else(|p| p.into_inner());
    let (current, entries) = {
        let st = routes.state();
        (
            st.current,
            st.entries.get(&sw.name).cloned().unwrap_or_default(),
        )
    };
    let leads = || shared.fleet().acting();
    let c = Calls {
        client: shared.switch_client(sw.api).with_limit(SWITCH_WAIT),
        leads: &leads,
    };
    let forget = |routes: &Routes| {
        let mut st = routes.state();
        if let Some(on) = st.switches.get_mut(i) {
            on.known = false;
        }
    };
    let Some(v) = current else {
        // No routes in force: the switch is read afresh at the next update.
        forget(routes);
        return Ok(());
    };
    let done = (|| {
        let mut on = ready(&c, &spec)?;
        if let std::collections::btree_map::Entry::Vacant(slot) = on.installed.entry(v) {
            slot.insert(c.batch(&versioned(&entries, v))?);
        }
        let want: BTreeMap<u16, u8> = spec
            .edge_ports
            .get(&sw.name)
            .into_iter()
            .flatten()
            .map(|&p| (p, v))
            .collect();
        let plan = stamp_changes(&on, &want);
        let changes: Vec<Change> = plan.iter().map(|(c, _)| c.clone()).collect();
        let ids = c.batch(&changes)?;
        after_stamps(&mut on, &plan, &ids);
        Ok(on)
    })();
    match done {
        Ok(on) => {
            let mut st = routes.state();
            let n = st.switches.len().max(i + 1);
            st.switches.resize(n, OnSwitch::default());
            st.switches[i] = on;
            tracing::info!(switch = %sw.name, version = v, "routes put back");
            Ok(())
        }
        Err(f) => {
            forget(routes);
            Err(f)
        }
    }
}

/// Finishes or undoes `pending`, an update that began and did not end (its controller died
/// or lost the lead, or could not put every stamp back). If any edge port stamps its version,
/// frames may carry it, so it goes forward: its entries are added where missing, every edge
/// port stamps it, and after a drain every other version goes. Otherwise it goes back: after
/// a drain (a stamp put back may have left frames carrying it) its entries go wherever they
/// went in. Either way one version is left installed and stamped. Every switch must answer;
/// else nothing is decided and the update stays pending.
fn resolve(
    shared: &Shared,
    calls: &[Calls],
    spec: &RoutesSpec,
    switches: &[config::controller::SwitchRef],
    pending: &Pending,
) -> Result<(), (usize, Failure)> {
    let v = pending.version;
    let first_err = |results: Vec<Result<(), Failure>>| {
        results
            .into_iter()
            .enumerate()
            .find_map(|(i, r)| r.err().map(|f| (i, f)))
    };
    let mut on = Vec::with_capacity(calls.len());
    for (i, r) in each(calls.len(), |i| ready(&calls[i], spec))
        .into_iter()
        .enumerate()
    {
        on.push(r.map_err(|f| (i, f))?);
    }
    let forward = on.iter().any(|o| o.stamps.values().any(|&(_, s)| s == v));
    tracing::info!(
        version = v,
        forward,
        "an update left half done: {}",
        if forward {
            "finishing it"
        } else {
            "undoing it"
        }
    );
    let none = Vec::new();
    if forward {
        let added = each(calls.len(), |i| match on[i].installed.contains_key(&v) {
            true => Ok(None),
            false => {
                let entries = pending.entries.get(&switches[i].name).unwrap_or(&none);
                calls[i].batch(&versioned(entries, v)).map(Some)
            }
        });
        let mut results = Vec::new();
        for (i, r) in added.into_iter().enumerate() {
            results.push(r.map(|ids| {
                if let Some(ids) = ids {
                    on[i].installed.insert(v, ids);
                }
            }));
        }
        if let Some(e) = first_err(results) {
            return Err(e);
        }
        let plans = edge_plans(spec, switches, &on, v);
        let flipped = apply_plans(calls, &plans);
        let mut results = Vec::new();
        for (i, r) in flipped.into_iter().enumerate() {
            results.push(r.map(|ids| after_stamps(&mut on[i], &plans[i], &ids)));
        }
        if let Some(e) = first_err(results) {
            return Err(e);
        }
    }
    std::thread::sleep(spec.drain);
    let gone = |o: &OnSwitch| -> Vec<u8> {
        o.installed
            .keys()
            .copied()
            .filter(|&u| if forward { u != v } else { u == v })
            .collect()
    };
    let removed = each(calls.len(), |i| {
        let ids: Vec<u64> = gone(&on[i])
            .iter()
            .flat_map(|u| on[i].installed[u].clone())
            .collect();
        calls[i].batch(&deletes(&ids))
    });
    let mut results = Vec::new();
    for (i, r) in removed.into_iter().enumerate() {
        let versions = gone(&on[i]);
        results.push(r.map(|_| {
            for u in versions {
                on[i].installed.remove(&u);
            }
        }));
    }
    if let Some(e) = first_err(results) {
        return Err(e);
    }
    let mut st = shared.routes.state();
    if forward {
        st.current = Some(v);
        st.entries = pending.entries.clone();
        st.resumed_forward += 1;
    } else {
        st.resumed_back += 1;
    }
    st.pending = None;
    st.switches = on;
    let kept = st.kept();
    drop(st);
    let _ = save(shared, &kept);
    Ok(())
}

/// Finishes or undoes an update left half done, if there is one and no update is under way
/// (which would do it first); called by a controller that leads, each round. Returns whether
/// one is still pending.
pub(super) fn resume(shared: &Shared) -> Result<bool, String> {
    let routes = &shared.routes;
    if routes.state().pending.is_none() {
        return Ok(false);
    }
    let Ok(_busy) = routes.busy.try_lock() else {
        return Ok(true);
    };
    let Some(pending) = routes.state().pending.clone() else {
        return Ok(false);
    };
    let (spec, switches) = {
        let f = shared.fleet();
        (f.file.routes.clone(), f.file.switches.clone())
    };
    let Some(spec) = spec else {
        return Ok(false);
    };
    // As for an update: the last leader's calls land first.
    after_last_leader(shared);
    let leads = || shared.fleet().acting();
    let calls = calls_to(shared, &switches, &leads);
    resolve(shared, &calls, &spec, &switches, &pending)
        .map(|()| false)
        .map_err(|(i, f)| format!("switch {}: {f}", switches[i].name))
}

fn deletes(ids: &[u64]) -> Vec<Change> {
    ids.iter()
        .map(|&id| Change::Delete {
            table: ROUTES.into(),
            id,
        })
        .collect()
}

/// `PUT /api/v1/routes`: a new version of every switch's routes.
pub(super) async fn replace(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Reply {
    authorised(&shared, &headers)?;
    let body: NewRoutes = api::body(&bytes)?;
    {
        let f = shared.fleet();
        leading(&f)?;
        if f.file.routes.is_none() {
            return Err(refuse(
                StatusCode::NOT_FOUND,
                "the controller's file has no [routes]",
            ));
        }
        for (name, entries) in &body.switches {
            if !f.file.switches.iter().any(|s| s.name == *name) {
                return Err(refuse(
                    StatusCode::BAD_REQUEST,
                    format!("switches.{name}: no such switch"),
                ));
            }
            if entries.len() > MAX_ENTRIES {
                return Err(refuse(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "switches.{name}: {} entries; at most {MAX_ENTRIES}",
                        entries.len()
                    ),
                ));
            }
            if let Some(i) = entries
                .iter()
                .position(|e| e.fields.contains_key(DSCP_FIELD))
            {
                return Err(refuse(
                    StatusCode::BAD_REQUEST,
                    format!("switches.{name}[{i}].match.{DSCP_FIELD}: the version is the controller's to match"),
                ));
            }
        }
    }
    let worker = shared.clone();
    match tokio::task::spawn_blocking(move || update(&worker, body.switches)).await {
        Ok(Ok(doc)) => Ok(Json(doc).into_response()),
        Ok(Err((status, doc))) => Err(api::ApiFailure::with_body(status, doc)),
        Err(e) => Err(refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the update failed: {e}"),
        )),
    }
}

/// `GET /api/v1/routes`: the version in force, its entries and what each switch holds.
pub(super) async fn show(State(shared): State<Arc<Shared>>) -> Json<JsonValue> {
    let names: Vec<String> = shared
        .fleet()
        .file
        .switches
        .iter()
        .map(|s| s.name.clone())
        .collect();
    let st = shared.routes.state();
    let switches: serde_json::Map<String, JsonValue> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let o = st.switches.get(i).cloned().unwrap_or_default();
            let stamps: BTreeMap<String, u8> = o
                .stamps
                .iter()
                .map(|(p, (_, v))| (p.to_string(), *v))
                .collect();
            (
                n.clone(),
                json!({
                    "known": o.known,
                    "installed": o.installed.keys().collect::<Vec<_>>(),
                    "stamps": stamps,
                    "entries": st.entries.get(n).cloned().unwrap_or_default(),
                }),
            )
        })
        .collect();
    Json(
        json!({ "version": st.current, "switches": switches, "last_update": st.last.as_ref().map(Outcome::doc) }),
    )
}

/// The routes' part of the controller's status.
pub(super) fn status(routes: &Routes) -> JsonValue {
    let st = routes.state();
    json!({
        "version": st.current, "updates": st.updates, "failed": st.failed,
        "last_update": st.last.as_ref().map(Outcome::doc),
        "pending": st.pending.as_ref().map(|p| p.version),
        "resumed": { "forward": st.resumed_forward, "back": st.resumed_back },
    })
}

/// The routes' metrics.
pub(super) fn metrics(routes: &Routes, m: &mut Exposition) {
    let st = routes.state();
    m.single(
        "kvswitch_controller_routes_version",
        metrics::Kind::Gauge,
        "The routes' version every edge port stamps (0: none yet).",
        st.current.unwrap_or(0),
    );
    m.family(
        "kvswitch_controller_routes_updates_total",
        metrics::Kind::Counter,
        "Updates of the routes, by outcome.",
    );
    for (outcome, n) in [
        ("ok", st.updates - st.failed),
        ("failed", st.failed),
        ("resumed_forward", st.resumed_forward),
        ("resumed_back", st.resumed_back),
    ] {
        m.sample(
            "kvswitch_controller_routes_updates_total",
            &[("outcome", outcome)],
            n,
        );
    }
    m.family(
        "kvswitch_controller_routes_phase_seconds",
        metrics::Kind::Gauge,
        "How long each phase of the last update took (none before the first).",
    );
    if let Some(last) = &st.last {
        for (phase, d) in &last.phases {
            m.sample(
                "kvswitch_controller_routes_phase_seconds",
                &[("phase", phase)],
                d.as_secs_f64(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_cycle_past_those_taken_and_never_zero() {
        let none = BTreeSet::new();
        assert_eq!(next_version(None, &none), Some(1));
        assert_eq!(next_version(Some(1), &none), Some(2));
        assert_eq!(next_version(Some(63), &none), Some(1));
        assert_eq!(next_version(Some(62), &BTreeSet::from([63, 1])), Some(2));
        let all: BTreeSet<u8> = (1..=63).collect();
        assert_eq!(next_version(Some(5), &all), None);
        let but_5: BTreeSet<u8> = (1..=63).filter(|&v| v != 5).collect();
        assert_eq!(next_version(Some(5), &but_5), Some(5));
    }

    #[test]
    fn entries_go_in_under_their_version_and_are_read_back_by_it() {
        let entry = EntryDef {
            fields: BTreeMap::from([("ip_dst".into(), Value::Text("10.9.0.1".into()))]),
            priority: 3,
            prefix_len: None,
            actions: vec![ActionDef::Output(1)],
        };
        let changes = versioned(&[entry], 7);
        let Change::Add { table, entry } = &changes[0] else {
            panic!("an add");
        };
        assert_eq!(table, ROUTES);
        assert_eq!(entry.fields[DSCP_FIELD], dscp_match(7));
        assert_eq!(entry.priority, 3);
        // As the switch lists it.
        let listed = |doc: JsonValue| serde_json::from_value(doc).unwrap();
        let seven =
            listed(json!({ "ip_dst": "10.9.0.1", "dscp": { "value": 28, "mask": "0xfc" } }));
        assert_eq!(version_of(&seven), Some(7));
        let zero = listed(json!({ "dscp": { "value": 0, "mask": "0xfc" } }));
        assert_eq!(version_of(&zero), None);
        assert_eq!(version_of(&BTreeMap::new()), None);
    }

    #[test]
    fn stamps_change_only_where_they_differ() {
        let on = OnSwitch {
            known: true,
            installed: BTreeMap::new(),
            stamps: BTreeMap::from([(0, (10, 4)), (1, (11, 5)), (7, (12, 4))]),
        };
        let want = BTreeMap::from([(0, 5), (1, 5), (2, 5)]);
        let plan = stamp_changes(&on, &want);
        let effects: Vec<&StampEffect> = plan.iter().map(|(_, e)| e).collect();
        assert_eq!(
            effects,
            [
                &StampEffect::Stamps(0, 5),
                &StampEffect::Stamps(2, 5),
                &StampEffect::Gone(7)
            ]
        );
        assert!(matches!(plan[0].0, Change::Modify { id: 10, .. }));
        assert!(matches!(plan[1].0, Change::Add { .. }));
        assert!(matches!(plan[2].0, Change::Delete { id: 12, .. }));
        let mut after = on.clone();
        after_stamps(&mut after, &plan, &[10, 13, 12]);
        assert_eq!(
            after.stamps,
            BTreeMap::from([(0, (10, 5)), (1, (11, 5)), (2, (13, 5))])
        );
        assert!(stamp_changes(&after, &want).is_empty());
    }
}
