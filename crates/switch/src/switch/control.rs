//! The control plane's calls on a running switch: tables and entries, counters, frames to
//! and from the CPU. Run on the forwarding thread between frames (see `dataplane::Remote`).

use std::collections::{BTreeMap, BTreeSet};

use pipeline::{CounterId, EntryId, Member, Taken};

use super::impair::REG_IMPAIR;
use super::*;
use crate::control::{
    check_name, describe_field, describe_match, field_name, resolve_field, user_register_name,
    ActionDef, Change, ControlError, CounterView, CpuPacket, EntryDef, EntryView, ErrorKind,
    GroupDef, GroupView, InterfaceDef, InterfaceView, KeyField, MemberDef, RegisterView, TableDef,
    TableView, CPU_QUEUE, DEFAULT_TABLE_SIZE, FIRST_OPERATOR_REG, MAX_BATCH, MAX_DSCP,
    MAX_TABLE_SIZE, TERNARY_TABLE_SIZE,
};

/// The control plane's additions to the switch.
#[derive(Default)]
pub(super) struct Operator {
    /// Tables that take an operator's entries: `acl` and those created through the API.
    pub(super) tables: BTreeSet<TableId>,
    /// Key fields of the tables created through the API, as named at creation (and of
    /// `kv_steer`).
    pub(super) keys: HashMap<TableId, Vec<KeyField>>,
    counters: BTreeMap<String, CounterId>,
    /// Counters made by the call in progress: forgotten again if it is refused.
    made: Vec<String>,
    /// Counters of refused calls, reused before the pipeline makes new ones.
    spare: Vec<CounterId>,
    cpu: VecDeque<CpuPacket>,
    /// An agent on the CPU channel takes the frames for the CPU: the API's readers may not.
    channel_takes: bool,
}

/// How to take back one applied change.
enum Undo {
    Added(TableId, EntryId),
    Modified(TableId, EntryId, Vec<Action>),
    Deleted(TableId, EntryId, Taken),
}

fn member_def(m: Member) -> MemberDef {
    match m {
        Member::Port(p) => MemberDef::Port(p),
        Member::Interface(i) => MemberDef::Interface(i),
    }
}

fn pipeline_error(e: pipeline::Error) -> ControlError {
    let kind = match e {
        pipeline::Error::DuplicateKey(_)
        | pipeline::Error::TableInUse { .. }
        | pipeline::Error::InterfaceInUse { .. }
        | pipeline::Error::GroupInUse { .. } => ErrorKind::Conflict,
        pipeline::Error::TableFull { .. } | pipeline::Error::TooManyTables => ErrorKind::Full,
        pipeline::Error::UnknownEntry(..) => ErrorKind::NotFound,
        _ => ErrorKind::Invalid,
    };
    ControlError::new(kind, "", e.to_string())
}

impl Switch {
    /// Every table, in processing order.
    pub fn tables(&self) -> Vec<TableView> {
        self.pipeline
            .describe()
            .tables
            .iter()
            .map(|t| self.table_view(t))
            .collect()
    }

    /// One table by name.
    pub fn table(&self, name: &str) -> Result<TableView, ControlError> {
        let id = self.table_named(name)?;
        let snap = self
            .pipeline
            .table_snapshot(id)
            .ok_or_else(|| not_found(name))?;
        Ok(self.table_view(&snap))
    }

    fn table_view(&self, t: &pipeline::TableSnapshot) -> TableView {
        let writable = self.operator.tables.contains(&t.id);
        TableView {
            name: t.name.clone(),
            kind: t.kind.into(),
            key: self.key_of(t.id, &t.key),
            key_len: t.key_len,
            miss: t.miss.iter().map(|a| self.describe_action(a)).collect(),
            size: t.limit,
            entries: t.entries,
            hits: t.hits,
            misses: t.misses,
            owner: match writable {
                true => "operator".into(),
                false => "program".into(),
            },
            writable,
        }
    }

    fn key_of(&self, id: TableId, fields: &[Field]) -> Vec<KeyField> {
        match self.operator.keys.get(&id) {
            Some(k) => k.clone(),
            None => fields
                .iter()
                .enumerate()
                .map(|(i, f)| describe_field(*f, i))
                .collect(),
        }
    }

    /// The table's key as (name, field) pairs, for reading and writing entries.
    fn named_key(&self, id: TableId) -> Vec<(String, Field)> {
        let Some(snap) = self.pipeline.table_snapshot(id) else {
            return Vec::new();
        };
        self.key_of(id, &snap.key)
            .iter()
            .zip(&snap.key)
            .map(|(k, f)| (field_name(k).to_string(), *f))
            .collect()
    }

    fn table_named(&self, name: &str) -> Result<TableId, ControlError> {
        self.pipeline.table_id(name).ok_or_else(|| not_found(name))
    }

    fn writable_table(&self, name: &str) -> Result<TableId, ControlError> {
        let id = self.table_named(name)?;
        if !self.operator.tables.contains(&id) {
            return Err(ControlError::new(
                ErrorKind::Conflict,
                "table",
                format!(
                    "table {name:?} belongs to the memcached program; put entries ahead of it \
                     in {:?}",
                    crate::control::ACL
                ),
            ));
        }
        Ok(id)
    }

    /// Creates an operator's table after every existing one.
    pub fn create_table(&mut self, def: TableDef) -> Result<TableView, ControlError> {
        self.operator.made.clear();
        let done = self.create_table_now(def);
        self.settle_counters(done.is_ok());
        done
    }

    /// Keeps the counters the call made if it succeeded, or forgets them.
    fn settle_counters(&mut self, keep: bool) {
        let made = std::mem::take(&mut self.operator.made);
        if keep {
            return;
        }
        for name in made {
            if let Some(id) = self.operator.counters.remove(&name) {
                self.operator.spare.push(id);
            }
        }
    }

    fn create_table_now(&mut self, def: TableDef) -> Result<TableView, ControlError> {
        check_name(&def.name).map_err(|e| ControlError::invalid("name", e))?;
        if self.pipeline.table_id(&def.name).is_some() {
            return Err(ControlError::new(
                ErrorKind::Conflict,
                "name",
                format!("a table named {:?} exists", def.name),
            ));
        }
        let size = def.size.unwrap_or(match def.kind {
            crate::control::Kind::Ternary => TERNARY_TABLE_SIZE,
            _ => DEFAULT_TABLE_SIZE,
        });
        if size == 0 || size > MAX_TABLE_SIZE {
            return Err(ControlError::invalid(
                "size",
                format!("{size} entries: give 1 to {MAX_TABLE_SIZE}"),
            ));
        }
        if def.key.is_empty() {
            return Err(ControlError::invalid(
                "key",
                "a key needs at least one field",
            ));
        }
        let mut fields = Vec::with_capacity(def.key.len());
        for (i, k) in def.key.iter().enumerate() {
            let (name, field) = resolve_field(k).map_err(|e| e.within(&format!("key[{i}]")))?;
            if fields.iter().any(|(n, _): &(String, Field)| *n == name) {
                return Err(ControlError::invalid(
                    format!("key[{i}]"),
                    format!("two fields are named {name:?}"),
                ));
            }
            fields.push((name, field));
        }
        let id = TableId(self.pipeline.table_count() as u16);
        let miss = self.actions(&def.miss, id).map_err(|e| e.within("miss"))?;
        let spec = TableSpec {
            name: def.name.clone(),
            kind: def.kind.into(),
            key: fields.iter().map(|(_, f)| *f).collect(),
            miss,
        };
        let id = self.pipeline.add_table(spec).map_err(pipeline_error)?;
        // A fresh table exists: its limit cannot be refused.
        let _ = self.pipeline.set_limit(id, Some(size));
        self.operator.tables.insert(id);
        let key = def
            .key
            .iter()
            .zip(&fields)
            .map(|(k, (name, f))| match k {
                KeyField::Named(_) => k.clone(),
                _ => match describe_field(*f, 0) {
                    KeyField::Bytes {
                        offset,
                        len,
                        padded,
                        ..
                    } => KeyField::Bytes {
                        name: name.clone(),
                        offset,
                        len,
                        padded,
                    },
                    KeyField::Meta { meta, .. } => KeyField::Meta {
                        name: name.clone(),
                        meta,
                    },
                    // A byte range that is also a named field keeps the name it was given.
                    KeyField::Named(_) => k.clone(),
                },
            })
            .collect();
        self.operator.keys.insert(id, key);
        self.table(&def.name)
    }

    /// Removes an operator's table and its entries; refused while something jumps to it.
    pub fn delete_table(&mut self, name: &str) -> Result<(), ControlError> {
        let id = self.writable_table(name)?;
        if id == self.tables.acl || id == self.tables.steer {
            return Err(ControlError::new(
                ErrorKind::Conflict,
                "table",
                format!("{name} is part of the switch; delete its entries instead"),
            ));
        }
        self.pipeline.remove_table(id).map_err(|e| {
            let mut err = pipeline_error(e);
            err.error = format!(
                "{}: delete that goto first",
                self.describe_error(&err.error)
            );
            err
        })?;
        self.operator.tables.remove(&id);
        self.operator.keys.remove(&id);
        Ok(())
    }

    /// Table names for ids in a pipeline message ("table 3" → "table \"pins\"").
    fn describe_error(&self, message: &str) -> String {
        let mut out = message.to_string();
        for t in self.pipeline.describe().tables.iter().rev() {
            out = out.replace(&format!("table {}", t.id.0), &format!("table {:?}", t.name));
        }
        out
    }

    /// A table's entries, oldest slot first.
    pub fn entries(&self, name: &str) -> Result<Vec<EntryView>, ControlError> {
        Ok(self.entries_page(name, None, usize::MAX)?.0)
    }

    /// Up to `limit` entries of table `name` in id order, from the first id after `after`,
    /// and the id to ask after for the next page (none when this was the last). One page is
    /// one job on the forwarding thread, so a large table is listed a page at a time.
    pub fn entries_page(
        &self,
        name: &str,
        after: Option<u64>,
        limit: usize,
    ) -> Result<(Vec<EntryView>, Option<u64>), ControlError> {
        let id = self.table_named(name)?;
        let key = self.named_key(id);
        let mut entries: Vec<_> = self
            .pipeline
            .entries(id)
            .map_err(pipeline_error)?
            .filter(|e| after.is_none_or(|a| e.id.to_u64() > a))
            .collect();
        entries.sort_unstable_by_key(|e| e.id.to_u64());
        let next = match entries.len() > limit {
            true => entries.get(limit.saturating_sub(1)).map(|e| e.id.to_u64()),
            false => None,
        };
        entries.truncate(limit);
        let views = entries
            .into_iter()
            .map(|e| EntryView {
                id: e.id.to_u64(),
                fields: describe_match(e.entry, &key),
                priority: e.entry.priority,
                prefix_len: e.entry.prefix_len,
                actions: e
                    .entry
                    .actions
                    .iter()
                    .map(|a| self.describe_action(a))
                    .collect(),
                hits: e.hits,
            })
            .collect();
        Ok((views, next))
    }

    /// Applies every change or none: on the first refusal the changes before it are taken
    /// back, and the error names the change (`changes[i]`). Returns each change's entry id
    /// (the new entry's for an add).
    pub fn apply(&mut self, changes: Vec<Change>) -> Result<Vec<u64>, ControlError> {
        self.operator.made.clear();
        // The `impair` numbers no entry holds any more are freed between batches, never
        // within one (whose undo may put an entry back with its number).
        if self.impair.is_full() {
            let live = self.impairments_named();
            self.impair.keep_only(&live);
        }
        let steers = changes.iter().any(|c| c.table() == crate::control::STEER);
        let done = self.apply_now(changes);
        self.settle_counters(done.is_ok());
        if steers && done.is_ok() {
            self.steer_hops = self.hops_steered_to();
        }
        done
    }

    /// The interface-table entries named by `kv_steer` entries, sorted.
    fn hops_steered_to(&self) -> Vec<u16> {
        let mut hops: Vec<u16> = self
            .entries(crate::control::STEER)
            .unwrap_or_default()
            .iter()
            .flat_map(|e| &e.actions)
            .filter_map(|a| match a {
                crate::control::ActionDef::Interface(i) => Some(*i),
                _ => None,
            })
            .collect();
        hops.sort_unstable();
        hops.dedup();
        hops
    }

    fn apply_now(&mut self, changes: Vec<Change>) -> Result<Vec<u64>, ControlError> {
        if changes.len() > MAX_BATCH {
            return Err(ControlError::invalid(
                "changes",
                format!("{} changes in one batch (max {MAX_BATCH})", changes.len()),
            ));
        }
        let mut undo = Vec::with_capacity(changes.len());
        let mut ids = Vec::with_capacity(changes.len());
        for (i, change) in changes.into_iter().enumerate() {
            match self.apply_one(change) {
                Ok((id, u)) => {
                    ids.push(id);
                    undo.push(u);
                }
                Err(e) => {
                    for u in undo.into_iter().rev() {
                        self.undo(u);
                    }
                    return Err(e.within(&format!("changes[{i}]")));
                }
            }
        }
        Ok(ids)
    }

    fn apply_one(&mut self, change: Change) -> Result<(u64, Undo), ControlError> {
        match change {
            Change::Add { table, entry } => {
                let t = self.writable_table(&table)?;
                let id = self.add_entry(t, &entry).map_err(|e| e.within("entry"))?;
                Ok((id.to_u64(), Undo::Added(t, id)))
            }
            Change::Modify { table, id, actions } => {
                let t = self.writable_table(&table)?;
                let entry = EntryId::from_u64(id);
                let old = self
                    .pipeline
                    .entry(t, entry)
                    .map(|e| e.entry.actions.clone())
                    .ok_or_else(|| no_entry(&table, id))?;
                let actions = self.actions(&actions, t).map_err(|e| e.within("actions"))?;
                self.pipeline
                    .set_actions(t, entry, actions)
                    .map_err(|e| pipeline_error(e).within("actions"))?;
                Ok((id, Undo::Modified(t, entry, old)))
            }
            Change::Delete { table, id } => {
                let t = self.writable_table(&table)?;
                let entry = EntryId::from_u64(id);
                let taken = self
                    .pipeline
                    .take(t, entry)
                    .map_err(|_| no_entry(&table, id))?;
                Ok((id, Undo::Deleted(t, entry, taken)))
            }
        }
    }

    fn add_entry(&mut self, t: TableId, def: &EntryDef) -> Result<EntryId, ControlError> {
        let kind = self
            .pipeline
            .table_snapshot(t)
            .map(|s| s.kind)
            .unwrap_or(MatchKind::Exact);
        let key = self.named_key(t);
        let actions = self
            .actions(&def.actions, t)
            .map_err(|e| e.within("actions"))?;
        let entry = crate::control::build_entry(def, kind, &key, actions)?;
        self.pipeline.insert(t, entry).map_err(|e| {
            let mut err = pipeline_error(e);
            err.error = self.describe_error(&err.error);
            if err.kind == ErrorKind::Conflict {
                err.field = "match".into();
            }
            err
        })
    }

    fn undo(&mut self, u: Undo) {
        // Each step reverses one that was just made, so none can fail.
        match u {
            Undo::Added(t, id) => {
                let _ = self.pipeline.remove(t, id);
            }
            Undo::Modified(t, id, actions) => {
                let _ = self.pipeline.set_actions(t, id, actions);
            }
            Undo::Deleted(t, id, taken) => {
                let _ = self.pipeline.restore(t, id, taken);
            }
        }
    }

    /// The pipeline's actions for an operator's list written in table `site`.
    fn actions(&mut self, defs: &[ActionDef], site: TableId) -> Result<Vec<Action>, ControlError> {
        let mut out = Vec::with_capacity(defs.len() + 1);
        for (i, d) in defs.iter().enumerate() {
            let at = format!("[{i}]");
            let bad = |msg: String| ControlError::invalid(at.clone(), msg);
            out.push(match d {
                ActionDef::Output(p) if usize::from(*p) >= self.ports => {
                    return Err(bad(format!(
                        "port {p} does not exist (the switch has ports 0 to {})",
                        self.ports.saturating_sub(1)
                    )));
                }
                ActionDef::Output(p) => Action::Output(*p),
                ActionDef::Flood => Action::Flood,
                ActionDef::ToCpu => Action::ToCpu(CPU_OPERATOR),
                ActionDef::Mirror => Action::SetReg(REG_MIRROR as u8, 1),
                ActionDef::Impair(def) => {
                    let n = self.impair.number(def).map_err(bad)?;
                    Action::SetReg(REG_IMPAIR as u8, n)
                }
                ActionDef::Drop => Action::Drop(Drop::Operator.code()),
                ActionDef::Count(name) => {
                    check_name(name).map_err(bad)?;
                    let next = self.operator.counters.len();
                    match self.operator.counters.get(name) {
                        Some(&id) => Action::Count(id),
                        None if next >= 4096 => {
                            return Err(bad("4096 counters exist; no more".into()))
                        }
                        None => {
                            let id = match self.operator.spare.pop() {
                                Some(id) => {
                                    self.pipeline.reset_counter(id, name.clone());
                                    id
                                }
                                None => self.pipeline.add_counter(name.clone()),
                            };
                            self.operator.counters.insert(name.clone(), id);
                            self.operator.made.push(name.clone());
                            Action::Count(id)
                        }
                    }
                }
                ActionDef::SetEthDst(m) | ActionDef::SetEthSrc(m) => {
                    let mac: Mac = m
                        .parse()
                        .map_err(|_| bad(format!("{m:?} is not a MAC address")))?;
                    match d {
                        ActionDef::SetEthDst(_) => Action::SetEthDst(mac.0),
                        _ => Action::SetEthSrc(mac.0),
                    }
                }
                ActionDef::SetIpv4Dst(ip) => Action::SetIpv4Dst(ip.octets()),
                ActionDef::SetIpv4Src(ip) => Action::SetIpv4Src(ip.octets()),
                ActionDef::SetDscp(d) if *d > MAX_DSCP => {
                    return Err(bad(format!(
                        "set_dscp {d}: a DSCP is 0 to {MAX_DSCP} (the top 6 bits of the ToS byte)"
                    )));
                }
                ActionDef::SetDscp(d) => Action::SetDscp(*d),
                ActionDef::DecTtl => Action::DecTtl,
                ActionDef::PushLabel(l) | ActionDef::SwapLabel(l) if *l > pipeline::MAX_LABEL => {
                    return Err(bad(format!(
                        "label {l}: an MPLS label is 0 to {} (20 bits)",
                        pipeline::MAX_LABEL
                    )));
                }
                ActionDef::PushLabel(l) => Action::PushLabel(*l),
                ActionDef::PopLabel => Action::PopLabel,
                ActionDef::SwapLabel(l) => Action::SwapLabel(*l),
                ActionDef::StripUdpPayload(n)
                    if *n == 0 || n % 2 == 1 || *n > pipeline::MAX_STRIP =>
                {
                    return Err(bad(format!(
                        "strip_udp_payload {n}: an even number of bytes from 2 to {}",
                        pipeline::MAX_STRIP
                    )));
                }
                ActionDef::StripUdpPayload(n) => Action::StripUdpPayload(*n),
                ActionDef::Goto(name) => {
                    let to = self
                        .pipeline
                        .table_id(name)
                        .ok_or_else(|| bad(format!("no table named {name:?}")))?;
                    if to <= site || i + 1 != defs.len() {
                        return Err(bad(format!(
                            "goto {name:?} must be the last action and go to a later table"
                        )));
                    }
                    Action::Goto(to)
                }
                ActionDef::Interface(n) => {
                    if self.pipeline.interface(*n).is_none() {
                        return Err(bad(format!(
                            "no interface {n}; add it with PUT /api/v1/interfaces/{n} first"
                        )));
                    }
                    Action::Interface(*n)
                }
                ActionDef::Multicast(n) => {
                    if self.pipeline.group(*n).is_none() {
                        return Err(bad(format!(
                            "no multicast group {n}; add it with PUT /api/v1/groups/{n} first"
                        )));
                    }
                    Action::Multicast(*n)
                }
                ActionDef::SetReg { reg, .. } | ActionDef::LoadReg { reg, .. }
                    if !(FIRST_OPERATOR_REG..REG_IMPAIR as u8).contains(reg) =>
                {
                    return Err(bad(format!(
                        "reg{reg}: operators write metadata registers {FIRST_OPERATOR_REG} to {} \
                         (the others belong to the memcached program and to `impair`)",
                        REG_IMPAIR - 1
                    )));
                }
                ActionDef::LoadReg { register, .. } | ActionDef::AddRegister { register, .. }
                    if usize::from(*register) >= pipeline::NUM_USER_REGS =>
                {
                    return Err(bad(format!(
                        "user register {register} does not exist (there are 0 to {})",
                        pipeline::NUM_USER_REGS - 1
                    )));
                }
                ActionDef::SetReg { reg, value } => Action::SetReg(*reg, *value),
                ActionDef::LoadReg { reg, register } => Action::LoadReg(*reg, *register),
                ActionDef::AddRegister { register, value } => Action::AddReg(*register, *value),
                ActionDef::Program(_) => {
                    return Err(bad("program actions are written by the switch only".into()))
                }
            });
        }
        // In `acl`, an entry that decides nothing goes on to the program.
        if site == self.tables.acl
            && !out
                .iter()
                .any(|a| a.is_terminal() || matches!(a, Action::Goto(_)))
        {
            out.push(Action::Goto(self.tables.program));
        }
        Ok(out)
    }

    /// The `impair` profiles the operator's tables name, in entries and misses.
    fn impairments_named(&self) -> BTreeSet<u32> {
        let mut live = BTreeSet::new();
        let mut note = |actions: &[Action]| {
            for a in actions {
                if let Action::SetReg(r, n) = *a {
                    if usize::from(r) == REG_IMPAIR {
                        live.insert(n);
                    }
                }
            }
        };
        for &t in &self.operator.tables {
            if let Ok(entries) = self.pipeline.entries(t) {
                for e in entries {
                    note(&e.entry.actions);
                }
            }
            if let Some(snapshot) = self.pipeline.table_snapshot(t) {
                note(&snapshot.miss);
            }
        }
        live
    }

    fn describe_action(&self, a: &Action) -> ActionDef {
        let table_name = |t: TableId| {
            self.pipeline
                .table_snapshot(t)
                .map_or(format!("table {}", t.0), |s| s.name)
        };
        match *a {
            Action::Output(p) => ActionDef::Output(p),
            Action::Flood => ActionDef::Flood,
            Action::ToCpu(CPU_OPERATOR) => ActionDef::ToCpu,
            Action::SetReg(r, 1) if usize::from(r) == REG_MIRROR => ActionDef::Mirror,
            Action::SetReg(r, n) if usize::from(r) == REG_IMPAIR => match self.impair.def(n) {
                Some(def) => ActionDef::Impair(def),
                None => ActionDef::Program(format!("impair {n}")),
            },
            Action::Drop(c) if c == Drop::Operator.code() => ActionDef::Drop,
            Action::Count(id) => match self.operator.counters.iter().find(|(_, &c)| c == id) {
                Some((name, _)) => ActionDef::Count(name.clone()),
                None => ActionDef::Program(format!("count {}", id.0)),
            },
            Action::SetEthDst(m) => ActionDef::SetEthDst(Mac(m).to_string()),
            Action::SetEthSrc(m) => ActionDef::SetEthSrc(Mac(m).to_string()),
            Action::SetIpv4Dst(ip) => ActionDef::SetIpv4Dst(ip.into()),
            Action::SetIpv4Src(ip) => ActionDef::SetIpv4Src(ip.into()),
            Action::SetDscp(d) => ActionDef::SetDscp(d),
            Action::DecTtl => ActionDef::DecTtl,
            Action::Goto(t) => ActionDef::Goto(table_name(t)),
            Action::ToCpu(CPU_ARP) => ActionDef::Program("answer arp".into()),
            Action::ToCpu(CPU_CACHE) => ActionDef::Program("ask the cache".into()),
            Action::ToCpu(c) => ActionDef::Program(format!("to cpu {c}")),
            Action::Drop(c) => ActionDef::Program(format!(
                "drop {}",
                Drop::from_code(c).map_or_else(|| c.to_string(), |d| d.name().to_string())
            )),
            Action::Select(_) => ActionDef::Program("select a server on the ring".into()),
            Action::SetReg(reg, value) if reg >= FIRST_OPERATOR_REG => {
                ActionDef::SetReg { reg, value }
            }
            Action::SetReg(r, v) => ActionDef::Program(format!("set reg{r} = {v}")),
            Action::LoadReg(reg, register) => ActionDef::LoadReg { reg, register },
            Action::AddReg(register, value) => ActionDef::AddRegister { register, value },
            Action::Interface(n) => ActionDef::Interface(n),
            Action::Multicast(n) => ActionDef::Multicast(n),
            Action::PushLabel(l) => ActionDef::PushLabel(l),
            Action::PopLabel => ActionDef::PopLabel,
            Action::SwapLabel(l) => ActionDef::SwapLabel(l),
            Action::StripUdpPayload(n) => ActionDef::StripUdpPayload(n),
        }
    }

    /// The interface table.
    pub fn interfaces(&self) -> Vec<InterfaceView> {
        self.pipeline
            .interfaces()
            .map(|(id, it)| self.interface_view(id, it))
            .collect()
    }

    fn interface_view(&self, id: u16, it: pipeline::Interface) -> InterfaceView {
        InterfaceView {
            id,
            eth_dst: Mac(it.eth_dst).to_string(),
            eth_src: Mac(it.eth_src).to_string(),
            port: it.port,
            used_by: self.pipeline.interface_uses(id),
        }
    }

    /// Adds or replaces entry `id` of the interface table; every action naming it sends
    /// through the new one from the next frame on.
    pub fn set_interface(
        &mut self,
        id: u16,
        def: InterfaceDef,
    ) -> Result<InterfaceView, ControlError> {
        if usize::from(id) >= pipeline::MAX_INTERFACES {
            return Err(ControlError::invalid(
                "id",
                format!(
                    "interface ids are 0 to {}, not {id}",
                    pipeline::MAX_INTERFACES - 1
                ),
            ));
        }
        let mac = |field: &str, text: &str| {
            text.parse::<Mac>()
                .map_err(|_| ControlError::invalid(field, format!("{text:?} is not a MAC address")))
        };
        let (eth_dst, eth_src) = (mac("eth_dst", &def.eth_dst)?, mac("eth_src", &def.eth_src)?);
        if usize::from(def.port) >= self.ports {
            return Err(ControlError::invalid(
                "port",
                format!(
                    "port {} does not exist (the switch has ports 0 to {})",
                    def.port,
                    self.ports.saturating_sub(1)
                ),
            ));
        }
        let it = pipeline::Interface {
            eth_dst: eth_dst.0,
            eth_src: eth_src.0,
            port: def.port,
        };
        self.pipeline
            .set_interface(id, it)
            .map_err(pipeline_error)?;
        Ok(self.interface_view(id, it))
    }

    /// Removes entry `id` of the interface table; refused while an action names it.
    pub fn delete_interface(&mut self, id: u16) -> Result<(), ControlError> {
        match self.pipeline.remove_interface(id) {
            Ok(_) => Ok(()),
            Err(pipeline::Error::UnknownInterface(_)) => Err(ControlError::new(
                ErrorKind::NotFound,
                "id",
                format!("no interface {id}"),
            )),
            Err(e) => Err(pipeline_error(e).within("id")),
        }
    }

    /// The multicast group table.
    pub fn groups(&self) -> Vec<GroupView> {
        self.pipeline
            .groups()
            .map(|(id, members)| GroupView {
                id,
                members: members.iter().map(|&m| member_def(m)).collect(),
                used_by: self.pipeline.group_uses(id),
            })
            .collect()
    }

    /// Adds or replaces entry `id` of the multicast group table; every action naming it
    /// copies to the new members from the next frame on.
    pub fn set_group(&mut self, id: u16, def: GroupDef) -> Result<GroupView, ControlError> {
        if usize::from(id) >= pipeline::MAX_GROUPS {
            return Err(ControlError::invalid(
                "id",
                format!(
                    "multicast group ids are 0 to {}, not {id}",
                    pipeline::MAX_GROUPS - 1
                ),
            ));
        }
        if def.members.is_empty() || def.members.len() > pipeline::MAX_GROUP_MEMBERS {
            return Err(ControlError::invalid(
                "members",
                format!(
                    "a multicast group has 1 to {} members, not {}",
                    pipeline::MAX_GROUP_MEMBERS,
                    def.members.len()
                ),
            ));
        }
        let mut members = Vec::with_capacity(def.members.len());
        for m in &def.members {
            members.push(match *m {
                MemberDef::Port(p) if usize::from(p) >= self.ports => {
                    return Err(ControlError::invalid(
                        "members",
                        format!(
                            "port {p} does not exist (the switch has ports 0 to {})",
                            self.ports.saturating_sub(1)
                        ),
                    ));
                }
                MemberDef::Port(p) => Member::Port(p),
                MemberDef::Interface(i) if self.pipeline.interface(i).is_none() => {
                    return Err(ControlError::invalid(
                        "members",
                        format!("no interface {i}; add it with PUT /api/v1/interfaces/{i} first"),
                    ));
                }
                MemberDef::Interface(i) => Member::Interface(i),
            });
        }
        self.pipeline
            .set_group(id, members)
            .map_err(|e| pipeline_error(e).within("members"))?;
        Ok(GroupView {
            id,
            members: def.members,
            used_by: self.pipeline.group_uses(id),
        })
    }

    /// Removes entry `id` of the multicast group table; refused while an action names it.
    pub fn delete_group(&mut self, id: u16) -> Result<(), ControlError> {
        match self.pipeline.remove_group(id) {
            Ok(_) => Ok(()),
            Err(pipeline::Error::UnknownGroup(_)) => Err(ControlError::new(
                ErrorKind::NotFound,
                "id",
                format!("no multicast group {id}"),
            )),
            Err(e) => Err(pipeline_error(e).within("id")),
        }
    }

    /// The user registers, in order.
    pub fn registers(&self) -> Vec<RegisterView> {
        self.pipeline
            .registers()
            .iter()
            .enumerate()
            .map(|(n, &value)| RegisterView {
                name: user_register_name(n),
                value,
                writable: true,
            })
            .collect()
    }

    /// Writes user register `n`.
    pub fn set_register(&mut self, n: u8, value: u64) -> Result<(), ControlError> {
        self.pipeline
            .set_register(n, value)
            .map_err(|e| ControlError::new(ErrorKind::NotFound, "register", e.to_string()))
    }

    /// A register by name: a user register `user<N>`, or a port's figure
    /// `port<N>.<figure>` ([`PortCounters::figure`](crate::stats::PortCounters::figure)).
    pub fn read_register(&self, name: &str) -> Result<u64, ControlError> {
        if let Some(n) = crate::control::user_register(name) {
            return Ok(self.pipeline.register(n).unwrap_or(0));
        }
        self.port_figure(name)
            .ok_or_else(|| crate::control::no_register(name))
    }

    /// Writes the user register `name`; a port's figure is read-only.
    pub fn write_register(&mut self, name: &str, value: u64) -> Result<(), ControlError> {
        match crate::control::user_register(name) {
            Some(n) => self.set_register(n, value),
            None if self.port_figure(name).is_some() => Err(ControlError::new(
                ErrorKind::Conflict,
                "name",
                format!("{name} is a port's figure and is read-only"),
            )),
            None => Err(crate::control::no_register(name)),
        }
    }

    fn port_figure(&self, name: &str) -> Option<u64> {
        let (port, figure) = name.strip_prefix("port")?.split_once('.')?;
        let p: usize = port.parse().ok()?;
        (port == p.to_string()).then_some(())?;
        self.stats.ports.get(p)?.figure(figure)
    }

    /// Removes the counter `name`, which no action may still feed; a `count` action naming it
    /// later makes a new one, from zero.
    pub fn delete_counter(&mut self, name: &str) -> Result<(), ControlError> {
        let Some(&id) = self.operator.counters.get(name) else {
            return Err(ControlError::new(
                ErrorKind::NotFound,
                "name",
                format!("no counter {name:?}"),
            ));
        };
        if let Some(by) = self.pipeline.used_by(&Action::Count(id)) {
            return Err(ControlError::new(
                ErrorKind::Conflict,
                "name",
                format!("counter {name:?} is fed by a count action in {by}"),
            ));
        }
        self.operator.counters.remove(name);
        self.operator.spare.push(id);
        Ok(())
    }

    /// The counters operators' `count` actions feed.
    pub fn counters(&self) -> Vec<CounterView> {
        self.operator
            .counters
            .iter()
            .map(|(name, &id)| {
                let (packets, bytes) = self.pipeline.counter(id).unwrap_or_default();
                CounterView {
                    name: name.clone(),
                    packets,
                    bytes,
                }
            })
            .collect()
    }

    /// Sends `frame` out of `port` as it is (the control plane's packet-out).
    pub fn send_frame(
        &mut self,
        port: u16,
        frame: Vec<u8>,
        emit: &mut Vec<Emit>,
    ) -> Result<(), ControlError> {
        if usize::from(port) >= self.ports {
            return Err(ControlError::invalid(
                "port",
                format!(
                    "port {port} does not exist (the switch has ports 0 to {})",
                    self.ports.saturating_sub(1)
                ),
            ));
        }
        if frame.len() < ethernet::HEADER_LEN || frame.len() > 9000 {
            return Err(ControlError::invalid(
                "frame",
                format!(
                    "{} bytes: a frame has {} to 9000",
                    frame.len(),
                    ethernet::HEADER_LEN
                ),
            ));
        }
        emit.push(Emit {
            dest: Dest::Port(port),
            frame,
        });
        Ok(())
    }

    /// Takes up to `max` of the frames entries handed to the CPU, oldest first; refused
    /// while an agent on the CPU channel takes them ([`Switch::set_channel_takes`]), so that
    /// it gets every one.
    pub fn take_cpu(&mut self, max: usize) -> Result<Vec<CpuPacket>, ControlError> {
        if self.operator.channel_takes {
            return Err(ControlError::new(
                ErrorKind::Conflict,
                "",
                "an agent on the CPU channel takes the frames for the CPU",
            ));
        }
        let n = max.min(self.operator.cpu.len());
        Ok(self.operator.cpu.drain(..n).collect())
    }

    /// Whether an agent on the CPU channel takes the frames for the CPU (the API then
    /// refuses to hand them out).
    pub fn set_channel_takes(&mut self, takes: bool) {
        self.operator.channel_takes = takes;
    }

    /// Whether frames wait for the CPU.
    pub fn cpu_waiting(&self) -> bool {
        !self.operator.cpu.is_empty()
    }

    /// Hands the frames waiting for the CPU, oldest first, to `deliver` until it says it took
    /// none more (`false`); the ones it took leave the queue. Returns how many it took.
    pub fn deliver_cpu(&mut self, mut deliver: impl FnMut(&CpuPacket) -> bool) -> usize {
        let mut n = 0;
        while let Some(p) = self.operator.cpu.front() {
            if !deliver(p) {
                break;
            }
            self.operator.cpu.pop_front();
            n += 1;
        }
        n
    }

    /// Queues a frame for the control plane, or counts it dropped when the queue is full.
    pub(super) fn queue_for_cpu(&mut self, in_port: u16, reason: &'static str, frame: &[u8]) {
        if self.operator.cpu.len() >= CPU_QUEUE {
            self.stats.count_drop(Drop::CpuQueueFull);
            return;
        }
        self.operator.cpu.push_back(CpuPacket {
            in_port,
            reason,
            frame: frame.to_vec(),
        });
    }
}

fn not_found(name: &str) -> ControlError {
    ControlError::new(
        ErrorKind::NotFound,
        "table",
        format!("no table named {name:?}"),
    )
}

fn no_entry(table: &str, id: u64) -> ControlError {
    ControlError::new(
        ErrorKind::NotFound,
        "id",
        format!("table {table:?} has no entry {id}"),
    )
}
