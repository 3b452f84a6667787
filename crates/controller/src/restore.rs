//! What operators put on each switch, kept by the controller and put back on a switch that
//! restarts (`keep_switch_state`, on by default).
//!
//! A switch forgets at a restart everything its API was given: operators' tables and their
//! entries, interfaces, multicast groups, user registers and egress rates. The controller
//! reads each switch's status every sync interval. Its `instance` names the switch's run and
//! `control_changes` counts the changes its API applied; while the instance is the one the
//! copy was taken from and the count has not moved, nothing more is read. When the count
//! moves the switch is read again into a new [`Copy`], kept in the state store (etcd with
//! `--store`, else `state_file`, else memory). When the instance is another, the switch
//! restarted (or the controller did, and finds the switch restarted meanwhile): what the copy
//! holds and the switch lacks is put back, in the order actions need it (interfaces, groups,
//! tables, entries, registers, egress), then the versioned routes (`routes::restore`), and
//! only once all of that is in is a new copy taken. A switch that refuses a step keeps the
//! old copy, and the next round tries again. Each round also finishes or undoes an update of
//! the routes that a controller left half done (`routes::resume`).
//!
//! Left to their own keepers: the controller's route tables (`ctl_*`, and `acl`'s entry into
//! them), put back by the routes; `kv_steer`, whose SwitchKV cache nodes install their rules
//! again; the pool, which the syncers bring back; and a fabric's registration table, which its
//! keeper sends again to a switch that holds an older one.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use switch::control::{
    ActionDef, Change, EntryDef, EntryView, GroupDef, InterfaceDef, TableDef, TableView, ACL,
    MAX_BATCH, STEER,
};

use super::{Shared, CAMPAIGN_INTERVAL, SWITCH_WAIT};
use api::Client;

/// The tables the controller's routes keep; their entries are the routes' to put back.
fn routes_own(table: &str) -> bool {
    table == super::routes::STAMP || table == super::routes::ROUTES
}

/// A copy of what an operator put on one switch, and the run of the switch it was read from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Copy {
    /// The switch's `instance` when it was read.
    pub instance: String,
    /// Its `control_changes` then.
    pub changes: u64,
    /// The operators' tables, in the switch's order.
    pub tables: Vec<TableDef>,
    /// The entries of every writable table, in the switch's order, by table.
    pub entries: BTreeMap<String, Vec<EntryDef>>,
    pub interfaces: BTreeMap<u16, InterfaceDef>,
    pub groups: BTreeMap<u16, GroupDef>,
    /// Writable registers that are not 0.
    pub registers: BTreeMap<String, u64>,
    /// Ports with an egress rate: (rate in bits/s, queue depth in bytes).
    pub egress: BTreeMap<u16, (u64, Option<u64>)>,
}

/// The entry as the API takes it, from how it lists it.
pub fn entry_def(e: &EntryView) -> EntryDef {
    EntryDef {
        fields: e.fields.clone(),
        priority: e.priority,
        prefix_len: e.prefix_len,
        actions: e.actions.clone(),
    }
}

/// The table as the API takes it, from how it lists it.
pub fn table_def(t: &TableView) -> TableDef {
    TableDef {
        name: t.name.clone(),
        kind: t.kind,
        key: t.key.clone(),
        miss: t.miss.clone(),
        size: t.size,
    }
}

/// The entries of `want` that `have` lacks, in `want`'s order: each entry of `have` stands
/// for one equal entry of `want`.
pub fn missing(want: &[EntryDef], have: &[EntryDef]) -> Vec<EntryDef> {
    // Entries by their JSON text, counted: linear in the table's size.
    let text = |e: &EntryDef| serde_json::to_string(e).unwrap_or_default();
    let mut unused: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for h in have {
        *unused.entry(text(h)).or_default() += 1;
    }
    want.iter()
        .filter(|w| match unused.get_mut(&text(w)) {
            Some(n) if *n > 0 => {
                *n -= 1;
                false
            }
            _ => true,
        })
        .cloned()
        .collect()
}

/// Whether an entry of `table` is kept in the copy: not one another keeper puts back.
fn kept(table: &str, entry: &EntryDef, routed: bool) -> bool {
    if routes_own(table) || table == STEER {
        return false;
    }
    // The routes' own way in from `acl`.
    let into_routes = [ActionDef::Goto(super::routes::STAMP.into())];
    !(routed && table == ACL && entry.actions == into_routes)
}

/// The switch's `instance` and `control_changes`.
fn run_of(c: &Client) -> anyhow::Result<(String, u64)> {
    let status = c.call_within("GET", "/api/v1/status", None, SWITCH_WAIT)?;
    let instance = status["instance"]
        .as_str()
        .context("the switch's status names no instance (a kvswitch older than the controller?)")?;
    Ok((
        instance.to_string(),
        status["control_changes"].as_u64().unwrap_or(0),
    ))
}

/// Reads what operators put on the switch (with `full`; else only which run it is), from its
/// run `expected` only. A proxy, which has no tables, gives an empty copy.
fn read(c: &Client, routed: bool, full: bool, expected: &str) -> anyhow::Result<Copy> {
    let (instance, changes) = run_of(c)?;
    // A switch that restarted since the round began is not copied: the next round puts back
    // what it held.
    anyhow::ensure!(
        instance == expected,
        "the switch restarted while it was read"
    );
    if !full {
        return Ok(Copy {
            instance,
            changes,
            ..Copy::default()
        });
    }
    let tables = match c.tables() {
        Ok(t) => t,
        Err(e)
            if e.downcast_ref::<api::Refused>()
                .is_some_and(|r| r.status == 404) =>
        {
            // A proxy: nothing of this kind to keep.
            return Ok(Copy {
                instance,
                changes,
                ..Copy::default()
            });
        }
        Err(e) => return Err(e),
    };
    let mut copy = Copy {
        instance: instance.clone(),
        changes,
        ..Copy::default()
    };
    for t in &tables {
        if !t.writable || routes_own(&t.name) || t.name == STEER {
            continue;
        }
        if t.owner == "operator" && !matches!(t.name.as_str(), ACL) {
            copy.tables.push(table_def(t));
        }
        let entries: Vec<EntryDef> = c
            .table_entries(&t.name)?
            .iter()
            .map(entry_def)
            .filter(|e| kept(&t.name, e, routed))
            .collect();
        if !entries.is_empty() {
            copy.entries.insert(t.name.clone(), entries);
        }
    }
    for i in c.interfaces()? {
        let def = InterfaceDef {
            eth_dst: i.eth_dst,
            eth_src: i.eth_src,
            port: i.port,
        };
        copy.interfaces.insert(i.id, def);
    }
    for g in c.groups()? {
        copy.groups.insert(g.id, GroupDef { members: g.members });
    }
    for r in c.registers()? {
        if r.writable && r.value != 0 {
            copy.registers.insert(r.name, r.value);
        }
    }
    for p in c.ports()? {
        if let Some(rate) = p.egress_rate_bps.filter(|&r| r > 0) {
            copy.egress.insert(p.port, (rate, p.egress_depth_bytes));
        }
    }
    // A switch that restarted while it was read gave a mix of two runs.
    let (after, _) = run_of(c)?;
    anyhow::ensure!(after == instance, "the switch restarted while it was read");
    Ok(copy)
}

/// Whether the switch has a table of this name (its program's own, made at start, or one put
/// back already).
fn has_table(tables: &[TableView], name: &str) -> bool {
    tables.iter().any(|t| t.name == name)
}

/// Whether `copy` holds anything to put back (a proxy's never does).
fn holds_nothing(copy: &Copy) -> bool {
    copy.tables.is_empty()
        && copy.entries.is_empty()
        && copy.interfaces.is_empty()
        && copy.groups.is_empty()
        && copy.registers.is_empty()
        && copy.egress.is_empty()
}

/// Whether an error is the switch's refusal (4xx): that one thing is not put back, the rest
/// still is.
fn refused(e: &anyhow::Error) -> bool {
    e.downcast_ref::<api::Refused>()
        .is_some_and(|r| (400..500).contains(&r.status))
}

/// Puts back on the switch what `copy` holds and it lacks; returns how many things it put and
/// what the switch refused. A switch out of reach, or a controller that stops leading, stops
/// it.
fn put_back(
    c: &Client,
    copy: &Copy,
    leads: &dyn Fn() -> bool,
) -> anyhow::Result<(usize, Vec<String>)> {
    if holds_nothing(copy) {
        return Ok((0, Vec::new()));
    }
    let mut put = 0;
    let mut refusals = Vec::new();
    // One step: counted when it went in, noted when refused, the end when anything else.
    let mut step = |what: String, r: anyhow::Result<usize>| -> anyhow::Result<()> {
        anyhow::ensure!(leads(), "this controller no longer leads");
        match r {
            Ok(n) => put += n,
            Err(e) if refused(&e) => refusals.push(format!("{what}: {e:#}")),
            Err(e) => return Err(e.context(what)),
        }
        Ok(())
    };
    let interfaces: BTreeMap<u16, InterfaceDef> = c
        .interfaces()?
        .into_iter()
        .map(|i| {
            let def = InterfaceDef {
                eth_dst: i.eth_dst,
                eth_src: i.eth_src,
                port: i.port,
            };
            (i.id, def)
        })
        .collect();
    for (&id, def) in &copy.interfaces {
        if interfaces.get(&id) != Some(def) {
            step(
                format!("interface {id}"),
                c.set_interface(id, def).map(|_| 1),
            )?;
        }
    }
    let groups: BTreeMap<u16, Vec<_>> =
        c.groups()?.into_iter().map(|g| (g.id, g.members)).collect();
    for (&id, def) in &copy.groups {
        if groups.get(&id) != Some(&def.members) {
            step(format!("group {id}"), c.set_group(id, def).map(|_| 1))?;
        }
    }
    let tables = c.tables()?;
    for t in &copy.tables {
        if !has_table(&tables, &t.name) {
            step(format!("table {}", t.name), c.add_table(t).map(|()| 1))?;
        }
    }
    for (table, want) in &copy.entries {
        let have: Vec<EntryDef> = match c.table_entries(table) {
            Ok(h) => h.iter().map(entry_def).collect(),
            Err(e) => {
                step(format!("{table}'s entries"), Err(e))?;
                continue;
            }
        };
        let adds: Vec<Change> = missing(want, &have)
            .into_iter()
            .map(|entry| Change::Add {
                table: table.clone(),
                entry,
            })
            .collect();
        for chunk in adds.chunks(MAX_BATCH) {
            // A batch is all or nothing: one the switch refuses goes in entry by entry, so
            // that only the entries it refuses stay out.
            match c.batch(chunk) {
                Ok(_) => step(String::new(), Ok(chunk.len()))?,
                Err(e) if refused(&e) => {
                    for change in chunk {
                        let r = c.batch(std::slice::from_ref(change)).map(|_| 1);
                        step(format!("an entry of {table}"), r)?;
                    }
                }
                Err(e) => step(format!("{table}'s entries"), Err(e))?,
            }
        }
    }
    for (name, &value) in &copy.registers {
        let now = c.register(name).map(|r| r.value);
        if now.as_ref().ok() != Some(&value) {
            let r = now.and_then(|_| c.set_register(name, value)).map(|_| 1);
            step(format!("register {name}"), r)?;
        }
    }
    let ports = c.ports()?;
    for (&port, &(rate, depth)) in &copy.egress {
        let now = ports.iter().find(|p| p.port == port);
        if now.map(|p| (p.egress_rate_bps, p.egress_depth_bytes)) != Some((Some(rate), depth)) {
            step(
                format!("port {port}'s egress"),
                c.set_egress(port, rate, depth).map(|_| 1),
            )?;
        }
    }
    Ok((put, refusals))
}

/// The keeper's view of one switch, for the status.
#[derive(Clone, Debug, Default)]
pub(super) struct Kept {
    /// The copy, once one was read or loaded.
    pub copy: Option<Copy>,
    /// When the copy was last read or confirmed.
    pub checked: Option<Instant>,
    /// Restarts put right, and what was put back at the last one.
    pub restores: u64,
    pub last_put: usize,
    /// What the switch refused to take back at the last restore.
    pub last_refused: Vec<String>,
    pub last_error: Option<String>,
}

impl Kept {
    pub(super) fn doc(&self) -> Value {
        let copy = self.copy.as_ref();
        json!({
            "instance": copy.map(|c| c.instance.clone()),
            "changes": copy.map(|c| c.changes),
            "tables": copy.map_or(0, |c| c.tables.len()),
            "entries": copy.map_or(0, |c| c.entries.values().map(Vec::len).sum::<usize>()),
            "interfaces": copy.map_or(0, |c| c.interfaces.len()),
            "groups": copy.map_or(0, |c| c.groups.len()),
            "registers": copy.map_or(0, |c| c.registers.len()),
            "restores": self.restores,
            "last_restore_put": self.last_put,
            "last_restore_refused": self.last_refused,
            "last_error": self.last_error,
        })
    }
}

/// The key a switch's copy is stored under.
fn store_key(name: &str) -> String {
    format!("switches/{name}/copy")
}

/// One round for switch `i`: nothing, a new copy, or a restore.
fn round(
    shared: &Shared,
    i: usize,
    name: &str,
    c: &Client,
    (routed, full): (bool, bool),
) -> anyhow::Result<()> {
    let (instance, changes) = run_of(c)?;
    let held = shared.fleet().kept[i].copy.clone();
    match held {
        Some(copy) if copy.instance == instance && copy.changes == changes => {
            shared.fleet().kept[i].checked = Some(Instant::now());
            return Ok(());
        }
        Some(copy) if copy.instance != instance => {
            tracing::info!(switch = %name, "the switch restarted: putting back what it held");
            // The routes go back even when something of the copy does not.
            let put = put_back(c, &copy, &|| shared.fleet().acting());
            let routes = super::routes::restore(shared, i);
            let (put, refused) = put?;
            routes.map_err(|e| anyhow::anyhow!("the routes: {e}"))?;
            let mut f = shared.fleet();
            f.kept[i].restores += 1;
            f.kept[i].last_put = put;
            f.kept[i].last_refused = refused.clone();
            drop(f);
            if refused.is_empty() {
                tracing::info!(switch = %name, put, "the switch has what it held again");
            } else {
                tracing::warn!(switch = %name, put, ?refused, "the switch took back all but what it refused");
            }
        }
        _ => {}
    }
    if !shared.fleet().acting() {
        return Ok(());
    }
    let copy = read(c, routed, full, &instance)?;
    let text = serde_json::to_vec(&copy)?;
    shared.save(&store_key(name), &text)?;
    let mut f = shared.fleet();
    f.kept[i].copy = Some(copy);
    f.kept[i].checked = Some(Instant::now());
    Ok(())
}

/// Keeps every switch's copy while this controller acts; runs until the controller stops.
pub(super) fn keep(shared: &Shared) {
    let mut loaded = false;
    while !shared.stop.load(Ordering::Relaxed) {
        let began = Instant::now();
        let (acting, interval, switches, what) = {
            let f = shared.fleet();
            (
                f.acting(),
                f.file.sync_interval,
                f.file.switches.clone(),
                (f.file.routes.is_some(), f.file.keep_switch_state),
            )
        };
        if !acting {
            loaded = false;
            std::thread::sleep(CAMPAIGN_INTERVAL);
            continue;
        }
        if !loaded {
            // A controller that starts or takes the lead carries on from the stored copies.
            let mut failed = super::routes::load(shared).err();
            for (i, s) in switches.iter().enumerate() {
                match shared.load(&store_key(&s.name)) {
                    Ok(Some(bytes)) => match serde_json::from_slice::<Copy>(&bytes) {
                        Ok(copy) => shared.fleet().kept[i].copy = Some(copy),
                        Err(e) => {
                            tracing::warn!(switch = %s.name, "the stored copy is not one: {e}")
                        }
                    },
                    Ok(None) => {}
                    Err(e) => failed = Some(e),
                }
            }
            if let Some(e) = failed {
                tracing::warn!("reading the switches' stored copies: {e:#}");
                std::thread::sleep(CAMPAIGN_INTERVAL);
                continue;
            }
            loaded = true;
        }
        if let Err(e) = super::routes::resume(shared) {
            tracing::warn!("routes: an update left half done waits: {e}");
        }
        std::thread::scope(|s| {
            for (i, sw) in switches.iter().enumerate() {
                s.spawn(move || {
                    let c = shared.switch_client(sw.api).with_limit(SWITCH_WAIT);
                    let outcome = round(shared, i, &sw.name, &c, what);
                    let mut f = shared.fleet();
                    match outcome {
                        Ok(()) => f.kept[i].last_error = None,
                        Err(e) => {
                            let e = format!("{e:#}");
                            if f.kept[i].last_error.as_ref() != Some(&e) {
                                tracing::warn!(switch = %sw.name, "keeping its state: {e}");
                            }
                            f.kept[i].last_error = Some(e);
                        }
                    }
                });
            }
        });
        std::thread::sleep(
            interval
                .saturating_sub(began.elapsed())
                .max(Duration::from_millis(10)),
        );
    }
}

/// The keeper's metrics.
pub(super) fn metrics(
    switches: &[config::controller::SwitchRef],
    kept: &[Kept],
    m: &mut api::metrics::Exposition,
) {
    use api::metrics::Kind;
    let name = "kvswitch_controller_switch_restores_total";
    m.family(
        name,
        Kind::Counter,
        "Restarts of the switch after which the controller put back what it held.",
    );
    for (sw, k) in switches.iter().zip(kept) {
        m.sample(name, &[("switch", &sw.name)], k.restores);
    }
    let name = "kvswitch_controller_switch_kept_entries";
    m.family(
        name,
        Kind::Gauge,
        "Entries of the switch's copy the controller keeps.",
    );
    for (sw, k) in switches.iter().zip(kept) {
        let n = k
            .copy
            .as_ref()
            .map_or(0, |c| c.entries.values().map(Vec::len).sum::<usize>());
        m.sample(name, &[("switch", &sw.name)], n as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switch::control::Value as Field;

    fn entry(port: u64, priority: u32) -> EntryDef {
        EntryDef {
            fields: BTreeMap::from([("l4_dst".to_string(), Field::Number(port))]),
            priority,
            prefix_len: None,
            actions: vec![ActionDef::Output(1)],
        }
    }

    #[test]
    fn only_what_the_switch_lacks_is_put_back_counting_equal_entries_one_by_one() {
        let want = [entry(7, 0), entry(9, 0), entry(7, 0), entry(11, 2)];
        // The switch's program made one (7, 0) again at start.
        let have = [entry(7, 0), entry(5, 0)];
        assert_eq!(
            missing(&want, &have),
            [entry(9, 0), entry(7, 0), entry(11, 2)]
        );
        assert!(missing(&want, &want).is_empty());
        assert_eq!(missing(&want, &[]), want);
    }

    #[test]
    fn the_routes_and_the_cache_nodes_entries_are_left_to_their_own_keepers() {
        let e = entry(7, 0);
        assert!(kept("krst_ops", &e, true));
        assert!(kept(ACL, &e, true));
        assert!(!kept(STEER, &e, false));
        assert!(!kept(super::super::routes::ROUTES, &e, true));
        assert!(!kept(super::super::routes::STAMP, &e, true));
        let into_routes = EntryDef {
            actions: vec![ActionDef::Goto(super::super::routes::STAMP.into())],
            ..e
        };
        assert!(!kept(ACL, &into_routes, true));
        // Without [routes] such an entry is an operator's own.
        assert!(kept(ACL, &into_routes, false));
    }
}
