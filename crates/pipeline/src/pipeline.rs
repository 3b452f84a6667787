//! The pipeline: tables, selectors and counters, and the per-frame executor.
//!
//! Control-plane calls (`add_*`, `insert`, `remove`, ...) validate everything they are given so
//! that [`Pipeline::process`] can run without failing, panicking or allocating.

use crate::action::EntryId;
use crate::action::{Action, CounterId, SelectorId, TableId, Verdict};
use crate::error::Error;
use crate::field::{extract, Field, Meta};
use crate::label;
use crate::reason;
use crate::rewrite::{self, Addr, Ttl};
use crate::table::{table_id, Entry, MatchKind, Stored, Table, TableSpec};
use crate::{
    MAX_ACTIONS, MAX_GROUPS, MAX_GROUP_MEMBERS, MAX_INTERFACES, MAX_KEY_LEN, MAX_TABLES,
    MAX_TABLE_IDS, NUM_REGS, NUM_USER_REGS,
};

/// Picks a selector member for a key hash — for example a ketama ring over backends.
///
/// Returning `None` drops the frame with [`reason::NO_SELECTOR_MEMBER`]; an index past the end
/// of the member list drops it with [`reason::SELECTOR_OUT_OF_RANGE`]. Called on the hot path:
/// it should not allocate or block.
pub trait Choose: Send {
    fn choose(&self, key_hash: u32) -> Option<usize>;
}

/// A group of alternative action lists and the chooser that picks among them.
struct Selector {
    members: Vec<Vec<Action>>,
    chooser: Box<dyn Choose>,
    /// Times each member was chosen.
    hits: Vec<u64>,
}

/// A named packet and byte counter.
struct Counter {
    name: String,
    packets: u64,
    bytes: u64,
}

/// An entry of the interface table: where [`Action::Interface`] sends a frame and with which
/// Ethernet addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interface {
    pub eth_dst: [u8; 6],
    pub eth_src: [u8; 6],
    pub port: u16,
}

/// Where [`Action::Multicast`] sends one copy of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Member {
    /// Out of this port, as the frame is.
    Port(u16),
    /// Through this entry of the interface table: its Ethernet addresses, its port.
    Interface(u16),
}

impl core::fmt::Display for Member {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Member::Port(p) => write!(f, "port {p}"),
            Member::Interface(i) => write!(f, "interface {i}"),
        }
    }
}

/// Pipeline-wide statistics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PipelineStats {
    /// Frames processed.
    pub packets: u64,
    /// Rewrites skipped because the frame lacked the header (for example `SetIpv4Dst` on ARP,
    /// `DecTtl` on a truncated frame).
    pub rewrite_skipped: u64,
    /// Drops decided by the pipeline, indexed by `reason code - 1` (see [`reason::ALL`]).
    pub drops: [u64; reason::ALL.len()],
}

impl PipelineStats {
    /// Frames the pipeline itself dropped with `code`; 0 for caller-defined codes.
    pub fn drops(&self, code: u16) -> u64 {
        usize::from(code)
            .checked_sub(1)
            .and_then(|i| self.drops.get(i))
            .copied()
            .unwrap_or(0)
    }
}

/// One table's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableSnapshot {
    pub id: TableId,
    pub name: String,
    pub kind: MatchKind,
    /// Lookup key length in bytes.
    pub key_len: usize,
    /// The fields the key is built from.
    pub key: Vec<Field>,
    /// What runs on a miss.
    pub miss: Vec<Action>,
    /// Most entries it may hold, if limited.
    pub limit: Option<usize>,
    pub entries: usize,
    pub hits: u64,
    /// Lookups that matched no entry, including `absent` ones.
    pub misses: u64,
    /// Lookups whose key reached past the end of the frame (an empty table builds no key).
    pub absent: u64,
}

/// One counter's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterSnapshot {
    pub id: CounterId,
    pub name: String,
    pub packets: u64,
    pub bytes: u64,
}

/// One selector's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelectorSnapshot {
    pub id: SelectorId,
    /// Times each member was chosen, in member order.
    pub member_hits: Vec<u64>,
}

/// The whole pipeline's status, for a status API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub tables: Vec<TableSnapshot>,
    pub counters: Vec<CounterSnapshot>,
    pub selectors: Vec<SelectorSnapshot>,
    pub stats: PipelineStats,
}

/// An entry as seen through the inspection API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryView<'a> {
    pub id: EntryId,
    /// The entry, with key bits outside its prefix or mask cleared.
    pub entry: &'a Entry,
    /// Frames that matched this entry.
    pub hits: u64,
}

/// An entry [`Pipeline::take`] removed, kept whole so that [`Pipeline::restore`] can put it
/// back exactly.
pub struct Taken(Stored);

impl Taken {
    pub fn entry(&self) -> &Entry {
        &self.0.entry
    }

    pub fn hits(&self) -> u64 {
        self.0.hits
    }
}

/// A programmable match-action pipeline. See the crate documentation.
pub struct Pipeline {
    /// Tables in processing order; the index is the [`TableId`].
    tables: Vec<Table>,
    /// Selectors by [`SelectorId`]; never removed, so ids in entries stay valid.
    selectors: Vec<Selector>,
    /// Counters by [`CounterId`]; never removed.
    counters: Vec<Counter>,
    /// The interface table, by id.
    interfaces: Vec<Option<Interface>>,
    /// The multicast group table, by id.
    groups: Vec<Option<Vec<Member>>>,
    /// User registers.
    registers: Vec<u64>,
    stats: PipelineStats,
    /// The lookup key being built; capacity [`MAX_KEY_LEN`].
    key: Vec<u8>,
    /// Masked copies of the key for LPM lookups; capacity [`MAX_KEY_LEN`].
    scratch: Vec<u8>,
    /// The last frame processed, when an action changed its length.
    resized: Vec<u8>,
    moved: bool,
}

impl Default for Pipeline {
    fn default() -> Self {
        Pipeline::new()
    }
}

/// Where an action list is written, which decides what it may contain.
#[derive(Clone, Copy)]
enum ListSite {
    /// An entry or the miss list of this table.
    Table(TableId),
    /// A selector member: no `Select`, and `Goto` is checked when it runs.
    Selector,
}

/// What to do after running an action or a list.
enum Flow {
    Next,
    Goto(TableId),
    Stop(u16),
}

/// The frame as the actions see it: the caller's bytes, until an action changes its length and
/// it moves to the pipeline's own buffer for the rest of its trip.
struct Frame<'a> {
    given: &'a mut [u8],
    own: &'a mut Vec<u8>,
    moved: bool,
}

impl Frame<'_> {
    fn bytes(&self) -> &[u8] {
        if self.moved {
            self.own
        } else {
            self.given
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        if self.moved {
            self.own
        } else {
            self.given
        }
    }

    /// Replaces `remove` bytes at `at` with `insert`; false when `at + remove` is past the end.
    fn splice(&mut self, at: usize, remove: usize, insert: &[u8]) -> bool {
        if at + remove > self.bytes().len() {
            return false;
        }
        if !self.moved {
            self.own.clear();
            self.own.extend_from_slice(self.given);
            self.moved = true;
        }
        self.own.splice(at..at + remove, insert.iter().copied());
        true
    }
}

/// Mutable state of one frame's trip through the pipeline.
struct Exec<'a> {
    frame: Frame<'a>,
    meta: &'a mut Meta,
    counters: &'a mut [Counter],
    interfaces: &'a [Option<Interface>],
    registers: &'a mut [u64],
    stats: &'a mut PipelineStats,
    verdict: Option<Verdict>,
}

impl Exec<'_> {
    /// Runs one action other than `Select`.
    fn step(&mut self, action: &Action) -> Flow {
        match *action {
            Action::Output(p) => self.verdict = Some(Verdict::Output(p)),
            Action::Flood => self.verdict = Some(Verdict::Flood),
            Action::ToCpu(r) => self.verdict = Some(Verdict::ToCpu(r)),
            Action::Drop(r) => self.verdict = Some(Verdict::Drop(r)),
            Action::Multicast(g) => self.verdict = Some(Verdict::Multicast(g)),
            Action::Count(id) => {
                if let Some(c) = self.counters.get_mut(id.0 as usize) {
                    c.packets += 1;
                    c.bytes += self.frame.bytes().len() as u64;
                }
            }
            Action::SetEthDst(mac) => {
                let done = rewrite::set_mac(self.frame.bytes_mut(), 0, mac);
                self.applied(done);
            }
            Action::SetEthSrc(mac) => {
                let done = rewrite::set_mac(self.frame.bytes_mut(), 6, mac);
                self.applied(done);
            }
            Action::SetIpv4Dst(a) => {
                let done = rewrite::set_ipv4(self.frame.bytes_mut(), Addr::Dst, a);
                self.applied(done);
            }
            Action::SetIpv4Src(a) => {
                let done = rewrite::set_ipv4(self.frame.bytes_mut(), Addr::Src, a);
                self.applied(done);
            }
            Action::SetDscp(d) => {
                let done = rewrite::set_dscp(self.frame.bytes_mut(), d);
                self.applied(done);
            }
            Action::DecTtl => match rewrite::dec_ttl(self.frame.bytes_mut()) {
                Ttl::Decremented => {}
                Ttl::Expired => return Flow::Stop(reason::TTL_EXPIRED),
                Ttl::NotIpv4 => self.applied(false),
            },
            Action::SetReg(n, v) => {
                if let Some(r) = self.meta.regs.get_mut(usize::from(n)) {
                    *r = v;
                }
            }
            Action::LoadReg(n, user) => {
                let value = self.registers.get(usize::from(user)).copied();
                if let (Some(r), Some(v)) = (self.meta.regs.get_mut(usize::from(n)), value) {
                    // The low 32 bits, as documented.
                    *r = v as u32;
                }
            }
            Action::AddReg(n, amount) => {
                if let Some(r) = self.registers.get_mut(usize::from(n)) {
                    *r = r.wrapping_add(u64::from(amount));
                }
            }
            Action::Interface(i) => {
                // Insertion checks the id and removal is refused while it is named, so the
                // entry is there; a frame that finds none all the same is dropped.
                let Some(Some(it)) = self.interfaces.get(usize::from(i)) else {
                    return Flow::Stop(reason::NO_INTERFACE);
                };
                let done = rewrite::set_mac(self.frame.bytes_mut(), 0, it.eth_dst)
                    && rewrite::set_mac(self.frame.bytes_mut(), 6, it.eth_src);
                self.applied(done);
                self.verdict = Some(Verdict::Output(it.port));
            }
            Action::PushLabel(label) => {
                if self.frame.bytes().len() + label::LEN > crate::MAX_FRAME_LEN {
                    return Flow::Stop(reason::FRAME_TOO_LONG);
                }
                let Some((ethertype, entry)) = label::push(self.frame.bytes(), label) else {
                    self.applied(false);
                    return Flow::Next;
                };
                let mut shim = [0u8; 2 + label::LEN];
                shim[..2].copy_from_slice(&ethertype);
                shim[2..].copy_from_slice(&entry);
                self.frame.splice(label::AT - 2, 2, &shim);
            }
            Action::PopLabel => match label::pop(self.frame.bytes()) {
                Err(code) => return Flow::Stop(code),
                Ok(ethertype) => {
                    self.frame.splice(label::AT - 2, 2 + label::LEN, &ethertype);
                }
            },
            Action::SwapLabel(l) => {
                if let Err(code) = label::swap(self.frame.bytes_mut(), l) {
                    return Flow::Stop(code);
                }
            }
            Action::StripUdpPayload(n) => match rewrite::udp_strip_at(self.frame.bytes(), n) {
                None => return Flow::Stop(reason::NO_UDP_PAYLOAD),
                Some((at, removed)) => {
                    // Removed first, so the frame the caller gave stays as it came (it may be
                    // run through the tables again).
                    self.frame.splice(at, usize::from(n), &[]);
                    rewrite::stripped_udp_headers(self.frame.bytes_mut(), n, removed);
                }
            },
            Action::Goto(t) => return Flow::Goto(t),
            // Selector members cannot select (checked at insertion); treat as a no-op.
            Action::Select(_) => {}
        }
        Flow::Next
    }

    fn applied(&mut self, done: bool) {
        if !done {
            self.stats.rewrite_skipped += 1;
        }
    }

    /// Runs an action list until it ends, jumps or stops.
    fn run(&mut self, selectors: &mut [Selector], actions: &[Action]) -> Flow {
        for a in actions {
            let flow = match a {
                Action::Select(id) => self.select(selectors, *id),
                _ => self.step(a),
            };
            if !matches!(flow, Flow::Next) {
                return flow;
            }
        }
        Flow::Next
    }

    fn select(&mut self, selectors: &mut [Selector], id: SelectorId) -> Flow {
        let Some(sel) = selectors.get_mut(id.0 as usize) else {
            return Flow::Stop(reason::NO_SELECTOR_MEMBER);
        };
        let i = match sel.chooser.choose(self.meta.key_hash) {
            None => return Flow::Stop(reason::NO_SELECTOR_MEMBER),
            Some(i) if i >= sel.members.len() => return Flow::Stop(reason::SELECTOR_OUT_OF_RANGE),
            Some(i) => i,
        };
        sel.hits[i] += 1;
        for a in &sel.members[i] {
            let flow = self.step(a);
            if !matches!(flow, Flow::Next) {
                return flow;
            }
        }
        Flow::Next
    }
}

impl Pipeline {
    /// An empty pipeline. Processing a frame before a table is added drops it with
    /// [`reason::NO_TABLES`].
    pub fn new() -> Self {
        Pipeline {
            tables: Vec::new(),
            selectors: Vec::new(),
            counters: Vec::new(),
            interfaces: vec![None; MAX_INTERFACES],
            groups: vec![None; MAX_GROUPS],
            registers: vec![0; NUM_USER_REGS],
            stats: PipelineStats::default(),
            key: Vec::with_capacity(MAX_KEY_LEN),
            scratch: Vec::with_capacity(MAX_KEY_LEN),
            resized: Vec::new(),
            moved: false,
        }
    }

    /// Appends a table; the first one added is table 0, where processing starts.
    ///
    /// Fails if the name is taken, the key is empty, too long or has a malformed field, or the
    /// miss actions are invalid (see [`Pipeline::insert`]).
    pub fn add_table(&mut self, spec: TableSpec) -> Result<TableId, Error> {
        let live = self.tables.iter().filter(|t| !t.removed).count();
        if live >= MAX_TABLES {
            return Err(Error::TooManyTables);
        }
        if self
            .tables
            .iter()
            .any(|t| !t.removed && t.name == spec.name)
        {
            return Err(Error::DuplicateTableName(spec.name));
        }
        // A removed table's id is given again only once every id has been used, so that a
        // client holding an old id meets an error rather than another table for as long as
        // ids last, and a switch that creates and removes tables for ever never runs out.
        let slot = if self.tables.len() < MAX_TABLE_IDS {
            self.tables.len()
        } else {
            self.tables
                .iter()
                .position(|t| t.removed)
                .ok_or(Error::TooManyTables)?
        };
        let id = table_id(slot);
        self.check_actions(&spec.miss, ListSite::Table(id))?;
        let table = Table::new(spec)?;
        match self.tables.get_mut(slot) {
            Some(old) => *old = table,
            None => self.tables.push(table),
        }
        Ok(id)
    }

    /// The id of the table called `name`.
    pub fn table_id(&self, name: &str) -> Option<TableId> {
        self.tables
            .iter()
            .position(|t| !t.removed && t.name == name)
            .map(table_id)
    }

    /// Number of table ids handed out, removed tables included: ids are never reused.
    pub fn table_count(&self) -> usize {
        self.tables.len()
    }

    /// Limits table `t` to `limit` entries (`None`: no limit). A table already holding more
    /// keeps them, but takes no more until it is under the limit.
    pub fn set_limit(&mut self, t: TableId, limit: Option<usize>) -> Result<(), Error> {
        self.table_mut(t)?.limit = limit;
        Ok(())
    }

    /// Removes table `t` with its entries; its id and name stop naming it, and a frame that
    /// still reaches its id is dropped with [`reason::BAD_GOTO`]. Refused with
    /// [`Error::TableInUse`] while an entry or miss list of another table jumps to it.
    pub fn remove_table(&mut self, t: TableId) -> Result<(), Error> {
        self.table(t)?;
        for (i, other) in self.tables.iter().enumerate() {
            if other.removed || i == usize::from(t.0) {
                continue;
            }
            let jumps = |list: &[Action]| list.contains(&Action::Goto(t));
            if jumps(&other.miss) || other.iter().any(|(_, s)| jumps(&s.entry.actions)) {
                return Err(Error::TableInUse {
                    table: t,
                    by: table_id(i),
                });
            }
        }
        let table = self.table_mut(t)?;
        let ids: Vec<EntryId> = table.iter().map(|(id, _)| id).collect();
        for id in ids {
            table.remove(id);
        }
        // What is left is a name-less placeholder holding no memory of the entries.
        let empty = TableSpec {
            name: String::new(),
            kind: table.kind,
            key: table.fields.clone(),
            miss: Vec::new(),
        };
        if let Ok(placeholder) = Table::new(empty) {
            *table = placeholder;
        }
        table.miss.clear();
        table.removed = true;
        Ok(())
    }

    /// Replaces a table's miss actions.
    pub fn set_miss(&mut self, t: TableId, actions: Vec<Action>) -> Result<(), Error> {
        self.check_actions(&actions, ListSite::Table(t))?;
        self.table_mut(t)?.miss = actions;
        Ok(())
    }

    /// Adds an entry to table `t`.
    ///
    /// Fails if the key, mask or prefix does not fit the table (see [`Entry`]), an exact or LPM
    /// entry with the same key (and prefix length) exists ([`Error::DuplicateKey`] names it), or
    /// the actions are invalid: more than [`MAX_ACTIONS`], a `Goto` that is not last or not to a
    /// later table, an unknown counter or selector, a register out of range, or a `Drop` reason
    /// below [`reason::USER_BASE`].
    pub fn insert(&mut self, t: TableId, entry: Entry) -> Result<EntryId, Error> {
        self.check_actions(&entry.actions, ListSite::Table(t))?;
        let table = self.table_mut(t)?;
        let entry = table.normalise(entry)?;
        if let Some(limit) = table.limit.filter(|&l| table.len() >= l) {
            // A duplicate says more than "full".
            if let Some(id) = table.duplicate_of(&entry) {
                return Err(Error::DuplicateKey(id));
            }
            return Err(Error::TableFull { table: t, limit });
        }
        table.insert(entry)
    }

    /// Removes an entry and returns it.
    pub fn remove(&mut self, t: TableId, id: EntryId) -> Result<Entry, Error> {
        self.table_mut(t)?
            .remove(id)
            .ok_or(Error::UnknownEntry(t, id))
    }

    /// Removes an entry and returns it with its hit count, for [`Pipeline::restore`].
    pub fn take(&mut self, t: TableId, id: EntryId) -> Result<Taken, Error> {
        let stored = self
            .table_mut(t)?
            .take(id)
            .ok_or(Error::UnknownEntry(t, id))?;
        Ok(Taken(stored))
    }

    /// Puts back an entry [`Pipeline::take`] removed, under the same id and with its hits:
    /// for undoing the steps of a change that failed part way. Returns whether it could.
    pub fn restore(&mut self, t: TableId, id: EntryId, taken: Taken) -> bool {
        match self.table_mut(t) {
            Ok(table) => table.restore(id, taken.0),
            Err(_) => false,
        }
    }

    /// Replaces an entry's actions, keeping its key and hit count (for example when a learned
    /// MAC moves to another port).
    pub fn set_actions(
        &mut self,
        t: TableId,
        id: EntryId,
        actions: Vec<Action>,
    ) -> Result<(), Error> {
        self.check_actions(&actions, ListSite::Table(t))?;
        let stored = self
            .table_mut(t)?
            .get_mut(id)
            .ok_or(Error::UnknownEntry(t, id))?;
        stored.entry.actions = actions;
        Ok(())
    }

    /// The entry of exact table `t` whose key is `key`; `None` for other kinds of table.
    pub fn lookup_exact(&self, t: TableId, key: &[u8]) -> Option<EntryId> {
        let table = self.table(t).ok()?;
        if table.kind != MatchKind::Exact {
            return None;
        }
        self.lookup(t, key).ok().flatten()
    }

    /// The entry of table `t` that a frame producing lookup key `key` would match, by the
    /// table's own rules. Changes no statistics. Fails only for an unknown table; a key of the
    /// wrong length matches nothing.
    pub fn lookup(&self, t: TableId, key: &[u8]) -> Result<Option<EntryId>, Error> {
        let table = self.table(t)?;
        if key.len() != table.key_len {
            return Ok(None);
        }
        let mut scratch = Vec::with_capacity(key.len());
        Ok(table.find(key, &mut scratch).map(|s| table.id(s)))
    }

    /// One entry of table `t`.
    pub fn entry(&self, t: TableId, id: EntryId) -> Option<EntryView<'_>> {
        let stored = self.table(t).ok()?.get(id)?;
        Some(EntryView {
            id,
            entry: &stored.entry,
            hits: stored.hits,
        })
    }

    /// All entries of table `t`, in no particular order.
    pub fn entries(&self, t: TableId) -> Result<impl Iterator<Item = EntryView<'_>>, Error> {
        Ok(self.table(t)?.iter().map(|(id, s)| EntryView {
            id,
            entry: &s.entry,
            hits: s.hits,
        }))
    }

    /// Number of entries in table `t`.
    pub fn len(&self, t: TableId) -> Result<usize, Error> {
        Ok(self.table(t)?.len())
    }

    /// Whether table `t` has no entries.
    pub fn is_empty(&self, t: TableId) -> Result<bool, Error> {
        Ok(self.table(t)?.len() == 0)
    }

    /// Adds a selector. Member lists follow the rules of [`Pipeline::insert`], except that they
    /// may not contain `Select` and a `Goto` in them is checked when it runs (a `Goto` to a
    /// table that is not after the current one drops the frame with [`reason::BAD_GOTO`]).
    pub fn add_selector(
        &mut self,
        members: Vec<Vec<Action>>,
        chooser: Box<dyn Choose>,
    ) -> Result<SelectorId, Error> {
        for m in &members {
            self.check_actions(m, ListSite::Selector)?;
        }
        // Selector count is bounded by memory long before u32::MAX.
        let id = SelectorId(self.selectors.len() as u32);
        self.selectors.push(Selector {
            hits: vec![0; members.len()],
            members,
            chooser,
        });
        Ok(id)
    }

    /// Replaces a selector's members and chooser together, so no frame sees one without the
    /// other. Member hit counts restart from zero.
    pub fn set_selector(
        &mut self,
        id: SelectorId,
        members: Vec<Vec<Action>>,
        chooser: Box<dyn Choose>,
    ) -> Result<(), Error> {
        if id.0 as usize >= self.selectors.len() {
            return Err(Error::UnknownSelector(id));
        }
        for m in &members {
            self.check_actions(m, ListSite::Selector)?;
        }
        self.selectors[id.0 as usize] = Selector {
            hits: vec![0; members.len()],
            members,
            chooser,
        };
        Ok(())
    }

    /// Adds a counter, zeroed.
    pub fn add_counter(&mut self, name: impl Into<String>) -> CounterId {
        // Counter count is bounded by memory long before u32::MAX.
        let id = CounterId(self.counters.len() as u32);
        self.counters.push(Counter {
            name: name.into(),
            packets: 0,
            bytes: 0,
        });
        id
    }

    /// Renames a counter and zeroes it, for reuse; `false` if there is no such counter.
    pub fn reset_counter(&mut self, id: CounterId, name: impl Into<String>) -> bool {
        match self.counters.get_mut(id.0 as usize) {
            Some(c) => {
                *c = Counter {
                    name: name.into(),
                    packets: 0,
                    bytes: 0,
                };
                true
            }
            None => false,
        }
    }

    /// A counter's `(packets, bytes)`, or `None` if there is no such counter.
    pub fn counter(&self, id: CounterId) -> Option<(u64, u64)> {
        self.counters
            .get(id.0 as usize)
            .map(|c| (c.packets, c.bytes))
    }

    /// Entry `i` of the interface table.
    pub fn interface(&self, i: u16) -> Option<Interface> {
        self.interfaces.get(usize::from(i)).copied().flatten()
    }

    /// The interface table's entries, by id.
    pub fn interfaces(&self) -> impl Iterator<Item = (u16, Interface)> + '_ {
        self.interfaces
            .iter()
            .enumerate()
            .filter_map(|(i, it)| Some((i as u16, (*it)?)))
    }

    /// How many entries, miss lists, selector members and multicast groups name interface
    /// `i`.
    pub fn interface_uses(&self, i: u16) -> usize {
        self.uses(&Action::Interface(i)) + self.groups_naming(i).count()
    }

    /// The multicast groups that have interface `i` among their members.
    fn groups_naming(&self, i: u16) -> impl Iterator<Item = u16> + '_ {
        self.groups()
            .filter(move |(_, members)| members.contains(&Member::Interface(i)))
            .map(|(g, _)| g)
    }

    /// How many entries, miss lists and selector members hold `action`.
    fn uses(&self, action: &Action) -> usize {
        let names = |list: &[Action]| list.contains(action);
        let tables: usize = self
            .tables
            .iter()
            .filter(|t| !t.removed)
            .map(|t| {
                usize::from(names(&t.miss))
                    + t.iter().filter(|(_, s)| names(&s.entry.actions)).count()
            })
            .sum();
        let selectors: usize = self
            .selectors
            .iter()
            .map(|s| s.members.iter().filter(|m| names(m)).count())
            .sum();
        tables + selectors
    }

    /// Sets entry `i` of the interface table, adding it or replacing it; frames that name it
    /// use the new addresses and port from the next frame on.
    pub fn set_interface(&mut self, i: u16, it: Interface) -> Result<(), Error> {
        let slot = self
            .interfaces
            .get_mut(usize::from(i))
            .ok_or(Error::UnknownInterface(i))?;
        *slot = Some(it);
        Ok(())
    }

    /// Removes entry `i` of the interface table. Refused with [`Error::InterfaceInUse`] while
    /// an entry, a miss list or a selector member names it.
    pub fn remove_interface(&mut self, i: u16) -> Result<Interface, Error> {
        let it = self.interface(i).ok_or(Error::UnknownInterface(i))?;
        if let Some(by) = self.used_by(&Action::Interface(i)) {
            return Err(Error::InterfaceInUse { interface: i, by });
        }
        if let Some(g) = self.groups_naming(i).next() {
            return Err(Error::InterfaceInUse {
                interface: i,
                by: format!("multicast group {g}"),
            });
        }
        self.interfaces[usize::from(i)] = None;
        Ok(it)
    }

    /// Entry `g` of the multicast group table: its members, in the order copies are made.
    pub fn group(&self, g: u16) -> Option<&[Member]> {
        self.groups.get(usize::from(g))?.as_deref()
    }

    /// The multicast group table's entries, by id.
    pub fn groups(&self) -> impl Iterator<Item = (u16, &[Member])> + '_ {
        self.groups
            .iter()
            .enumerate()
            .filter_map(|(g, members)| Some((g as u16, members.as_deref()?)))
    }

    /// How many entries, miss lists and selector members name multicast group `g`.
    pub fn group_uses(&self, g: u16) -> usize {
        self.uses(&Action::Multicast(g))
    }

    /// Sets entry `g` of the multicast group table, adding it or replacing it; frames that
    /// name it are copied to the new members from the next frame on. A group has 1 to
    /// [`MAX_GROUP_MEMBERS`] members, each once, and the interface entries it names must
    /// exist.
    pub fn set_group(&mut self, g: u16, members: Vec<Member>) -> Result<(), Error> {
        if usize::from(g) >= MAX_GROUPS {
            return Err(Error::UnknownGroup(g));
        }
        if members.is_empty() || members.len() > MAX_GROUP_MEMBERS {
            return Err(Error::BadGroupSize(members.len()));
        }
        for (n, m) in members.iter().enumerate() {
            if members[..n].contains(m) {
                return Err(Error::DuplicateMember(*m));
            }
            if let Member::Interface(i) = *m {
                if self.interface(i).is_none() {
                    return Err(Error::UnknownInterface(i));
                }
            }
        }
        self.groups[usize::from(g)] = Some(members);
        Ok(())
    }

    /// The copies of `frame` that multicast group `g` makes for the ports `to` accepts, in its
    /// members' order, each with the port it leaves by: the frame as it is for a port, with
    /// the entry's Ethernet addresses for an interface (as [`Action::Interface`] rewrites
    /// them). `None` for a group that is not there.
    pub fn copies(
        &self,
        g: u16,
        frame: &[u8],
        to: impl Fn(u16) -> bool,
    ) -> Option<Vec<(u16, Vec<u8>)>> {
        let mut out = Vec::new();
        for m in self.group(g)? {
            let (port, macs) = match *m {
                Member::Port(p) => (p, None),
                // Removal is refused while a group names the entry.
                Member::Interface(i) => match self.interface(i) {
                    Some(it) => (it.port, Some((it.eth_dst, it.eth_src))),
                    None => continue,
                },
            };
            if !to(port) {
                continue;
            }
            let mut copy = frame.to_vec();
            if let Some((dst, src)) = macs {
                rewrite::set_mac(&mut copy, 0, dst);
                rewrite::set_mac(&mut copy, 6, src);
            }
            out.push((port, copy));
        }
        Some(out)
    }

    /// Removes entry `g` of the multicast group table. Refused with [`Error::GroupInUse`]
    /// while an entry, a miss list or a selector member names it.
    pub fn remove_group(&mut self, g: u16) -> Result<Vec<Member>, Error> {
        if self.group(g).is_none() {
            return Err(Error::UnknownGroup(g));
        }
        if let Some(by) = self.used_by(&Action::Multicast(g)) {
            return Err(Error::GroupInUse { group: g, by });
        }
        Ok(self.groups[usize::from(g)].take().unwrap_or_default())
    }

    /// The first table (its id) or selector (`selector N`) with an action list, an entry's, a
    /// table's miss or a selector member's, that holds `action`; `None` when none does.
    pub fn used_by(&self, action: &Action) -> Option<String> {
        let names = |list: &[Action]| list.contains(action);
        for (t, table) in self.tables.iter().enumerate() {
            if !table.removed
                && (names(&table.miss) || table.iter().any(|(_, s)| names(&s.entry.actions)))
            {
                return Some(table_id(t).to_string());
            }
        }
        self.selectors
            .iter()
            .position(|s| s.members.iter().any(|m| names(m)))
            .map(|s| format!("selector {s}"))
    }

    /// User register `n`.
    pub fn register(&self, n: u8) -> Option<u64> {
        self.registers.get(usize::from(n)).copied()
    }

    /// All user registers, in order.
    pub fn registers(&self) -> &[u64] {
        &self.registers
    }

    /// Writes user register `n`.
    pub fn set_register(&mut self, n: u8, value: u64) -> Result<(), Error> {
        let r = self
            .registers
            .get_mut(usize::from(n))
            .ok_or(Error::BadUserRegister(n))?;
        *r = value;
        Ok(())
    }

    /// Pipeline-wide statistics.
    pub fn stats(&self) -> &PipelineStats {
        &self.stats
    }

    /// Status of table `t`.
    pub fn table_snapshot(&self, t: TableId) -> Option<TableSnapshot> {
        let table = self.table(t).ok()?;
        Some(TableSnapshot {
            id: t,
            name: table.name.clone(),
            kind: table.kind,
            key_len: table.key_len,
            key: table.fields.clone(),
            miss: table.miss.clone(),
            limit: table.limit,
            entries: table.len(),
            hits: table.hits,
            misses: table.misses,
            absent: table.absent,
        })
    }

    /// Status of everything, for a status API.
    pub fn describe(&self) -> Snapshot {
        Snapshot {
            tables: (0..self.tables.len())
                .filter_map(|i| self.table_snapshot(table_id(i)))
                .collect(),
            counters: self
                .counters
                .iter()
                .enumerate()
                .map(|(i, c)| CounterSnapshot {
                    id: CounterId(i as u32),
                    name: c.name.clone(),
                    packets: c.packets,
                    bytes: c.bytes,
                })
                .collect(),
            selectors: self
                .selectors
                .iter()
                .enumerate()
                .map(|(i, s)| SelectorSnapshot {
                    id: SelectorId(i as u32),
                    member_hits: s.hits.clone(),
                })
                .collect(),
            stats: self.stats.clone(),
        }
    }

    /// Runs `frame` through the tables from table 0, rewriting it in place, and returns the
    /// verdict.
    ///
    /// Each table builds its key from the frame and `meta`, runs the matched entry's actions
    /// (or its miss actions if nothing matches or the key reaches past the end of the frame),
    /// and either ends processing or jumps forward with `Goto`. The last terminal action run
    /// gives the verdict; if none ran, the verdict is `Drop(`[`reason::NO_VERDICT`]`)`. The
    /// pipeline's own drops (see [`crate::reason`]) end processing at once.
    ///
    /// An action that changes the frame's length (`PushLabel`, `PopLabel`, `StripUdpPayload`)
    /// moves it to a buffer of the pipeline's, where later actions work on it: the caller then
    /// sends
    /// [`Pipeline::resized`] instead of `frame`.
    ///
    /// Never panics on any frame contents. It allocates only when a frame first needs a longer
    /// buffer for a change of length. `meta.regs` may be changed by `SetReg`.
    pub fn process(&mut self, frame: &mut [u8], meta: &mut Meta) -> Verdict {
        self.stats.packets += 1;
        self.moved = false;
        let verdict = self.run(frame, meta);
        if let Verdict::Drop(code) = verdict {
            if let Some(n) = usize::from(code)
                .checked_sub(1)
                .and_then(|i| self.stats.drops.get_mut(i))
            {
                *n += 1;
            }
        }
        verdict
    }

    /// The frame the last [`Pipeline::process`] ended with, when an action changed its length;
    /// `None` when it was rewritten in place (or not at all).
    pub fn resized(&self) -> Option<&[u8]> {
        self.moved.then_some(&self.resized[..])
    }

    fn run(&mut self, frame: &mut [u8], meta: &mut Meta) -> Verdict {
        let Pipeline {
            tables,
            selectors,
            counters,
            interfaces,
            groups: _,
            registers,
            stats,
            key,
            scratch,
            resized,
            moved,
        } = self;
        if tables.is_empty() {
            return Verdict::Drop(reason::NO_TABLES);
        }
        let mut exec = Exec {
            frame: Frame {
                given: frame,
                own: resized,
                moved: false,
            },
            meta,
            counters,
            interfaces,
            registers,
            stats,
            verdict: None,
        };
        let mut current = 0usize;
        let verdict = loop {
            let table = &mut tables[current];
            if table.removed {
                break Verdict::Drop(reason::BAD_GOTO);
            }
            key.clear();
            // An empty table misses whatever the key: it is not built (nor counted absent).
            let slot = if table.len() == 0 {
                None
            } else if extract(&table.fields, exec.frame.bytes(), exec.meta, key) {
                table.find(key, scratch)
            } else {
                table.absent += 1;
                None
            };
            let actions = match slot {
                Some(s) => table.hit(s),
                None => {
                    table.misses += 1;
                    &table.miss
                }
            };
            match exec.run(selectors, actions) {
                Flow::Next => break exec.verdict.unwrap_or(Verdict::Drop(reason::NO_VERDICT)),
                Flow::Stop(code) => break Verdict::Drop(code),
                Flow::Goto(next) => {
                    let next = usize::from(next.0);
                    if next <= current || next >= tables.len() {
                        break Verdict::Drop(reason::BAD_GOTO);
                    }
                    current = next;
                }
            }
        };
        *moved = exec.frame.moved;
        verdict
    }

    fn table(&self, t: TableId) -> Result<&Table, Error> {
        self.tables
            .get(usize::from(t.0))
            .filter(|table| !table.removed)
            .ok_or(Error::UnknownTable(t))
    }

    fn table_mut(&mut self, t: TableId) -> Result<&mut Table, Error> {
        self.tables
            .get_mut(usize::from(t.0))
            .filter(|table| !table.removed)
            .ok_or(Error::UnknownTable(t))
    }

    /// Checks an action list written at `site`; see [`Pipeline::insert`] for the rules.
    fn check_actions(&self, actions: &[Action], site: ListSite) -> Result<(), Error> {
        if actions.len() > MAX_ACTIONS {
            return Err(Error::TooManyActions(actions.len()));
        }
        for (i, a) in actions.iter().enumerate() {
            match *a {
                Action::Goto(to) => {
                    if i + 1 != actions.len() {
                        return Err(Error::GotoNotLast);
                    }
                    if usize::from(to.0) >= MAX_TABLE_IDS {
                        return Err(Error::UnknownTable(to));
                    }
                    if let ListSite::Table(from) = site {
                        if to <= from {
                            return Err(Error::GotoNotForward { from, to });
                        }
                    }
                }
                Action::Select(id) => {
                    if matches!(site, ListSite::Selector) {
                        return Err(Error::NestedSelect);
                    }
                    if id.0 as usize >= self.selectors.len() {
                        return Err(Error::UnknownSelector(id));
                    }
                }
                Action::Count(id) if id.0 as usize >= self.counters.len() => {
                    return Err(Error::UnknownCounter(id));
                }
                Action::SetReg(n, _) | Action::LoadReg(n, _) if usize::from(n) >= NUM_REGS => {
                    return Err(Error::BadRegister(n));
                }
                Action::LoadReg(_, n) | Action::AddReg(n, _) if usize::from(n) >= NUM_USER_REGS => {
                    return Err(Error::BadUserRegister(n));
                }
                Action::Interface(i) if self.interface(i).is_none() => {
                    return Err(Error::UnknownInterface(i));
                }
                Action::Multicast(g) if self.group(g).is_none() => {
                    return Err(Error::UnknownGroup(g));
                }
                Action::Drop(code) if code < reason::USER_BASE => {
                    return Err(Error::ReservedReason(code));
                }
                Action::SetDscp(d) if d > crate::MAX_DSCP => return Err(Error::BadDscp(d)),
                Action::PushLabel(l) | Action::SwapLabel(l) if l > crate::MAX_LABEL => {
                    return Err(Error::BadLabel(l));
                }
                Action::StripUdpPayload(n) if n == 0 || n % 2 == 1 || n > crate::MAX_STRIP => {
                    return Err(Error::BadStrip(n));
                }
                _ => {}
            }
        }
        Ok(())
    }
}
