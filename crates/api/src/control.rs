//! The switch's control API, typed: what kvswitch's own parts ask of a switch (its tables,
//! interfaces, counters, registers, ports and the frames its entries send to the CPU), as the
//! definitions of `switch::control` over [`Client`]. A refusal comes back as a [`Refused`]
//! carrying the switch's [`ErrorKind`](switch::control::ErrorKind) and the field it named.

use std::time::Duration;

use anyhow::Context;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use switch::control::{
    Change, CounterView, CpuFrame, EntryDef, EntryView, GroupDef, GroupView, InterfaceDef,
    InterfaceView, PortView, RegisterView, TableDef, TableView, MAX_BATCH,
};

use crate::{Client, Refused};

/// A table holds at most 2^20 entries: 105 pages of [`switch::control::MAX_PAGE`].
const MAX_PAGES: usize = 128;

impl Client {
    /// Every table, the program's and the operators'.
    pub fn tables(&self) -> anyhow::Result<Vec<TableView>> {
        let doc = self.call("GET", "/api/v1/tables", None)?;
        typed(doc.get("tables").cloned().unwrap_or(doc), "the tables")
    }

    /// Creates an operator's table.
    pub fn add_table(&self, def: &TableDef) -> anyhow::Result<()> {
        self.call("POST", "/api/v1/tables", Some(&json!(def)))
            .with_context(|| format!("creating table {}", def.name))?;
        Ok(())
    }

    /// Removes an operator's table with its entries.
    pub fn remove_table(&self, name: &str) -> anyhow::Result<()> {
        self.call("DELETE", &format!("/api/v1/tables/{name}"), None)
            .with_context(|| format!("removing table {name}"))?;
        Ok(())
    }

    /// Every entry of `table`, page by page.
    pub fn table_entries(&self, table: &str) -> anyhow::Result<Vec<EntryView>> {
        let mut all = Vec::new();
        let mut after = String::new();
        for _ in 0..MAX_PAGES {
            let path = format!("/api/v1/tables/{table}/entries{after}");
            let mut page = self
                .call("GET", &path, None)
                .with_context(|| format!("listing the switch's {table} entries"))?;
            let entries: Vec<EntryView> = typed(page["entries"].take(), "a page of entries")?;
            all.extend(entries);
            match page["next"].as_u64() {
                Some(next) => after = format!("?after={next}"),
                None => return Ok(all),
            }
        }
        anyhow::bail!("the switch's {table} entries ran past {MAX_PAGES} pages")
    }

    /// Adds `entry` to `table`; its id.
    pub fn add_entry(&self, table: &str, entry: &EntryDef) -> anyhow::Result<u64> {
        let made = self.call(
            "POST",
            &format!("/api/v1/tables/{table}/entries"),
            Some(&json!(entry)),
        )?;
        made["id"].as_u64().context("the switch gave no entry id")
    }

    /// Removes entry `id` of `table`; `Ok(false)` when it was not there (removed by another).
    pub fn remove_entry(&self, table: &str, id: u64) -> anyhow::Result<bool> {
        match self.call(
            "DELETE",
            &format!("/api/v1/tables/{table}/entries/{id}"),
            None,
        ) {
            Ok(_) => Ok(true),
            Err(e) if e.downcast_ref::<Refused>().is_some_and(Refused::entry_gone) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Applies `changes` in batches of at most [`MAX_BATCH`], each all or nothing; the ids
    /// the switch gave, one per change (an added entry's id, else the id changed).
    pub fn batch(&self, changes: &[Change]) -> anyhow::Result<Vec<u64>> {
        let mut ids = Vec::with_capacity(changes.len());
        for chunk in changes.chunks(MAX_BATCH) {
            let done = self.call("POST", "/api/v1/batch", Some(&json!({ "changes": chunk })))?;
            let got: Vec<u64> = typed(done["ids"].clone(), "a batch's ids")?;
            anyhow::ensure!(
                got.len() == chunk.len(),
                "the switch gave {} ids for {} changes",
                got.len(),
                chunk.len()
            );
            ids.extend(got);
        }
        Ok(ids)
    }
}

impl Client {
    /// The interface table.
    pub fn interfaces(&self) -> anyhow::Result<Vec<InterfaceView>> {
        let mut doc = self.call("GET", "/api/v1/interfaces", None)?;
        typed(doc["interfaces"].take(), "the interfaces")
    }

    /// Makes or replaces entry `id` of the interface table: every action naming it sends
    /// through `def` from the next frame on.
    pub fn set_interface(&self, id: u16, def: &InterfaceDef) -> anyhow::Result<InterfaceView> {
        let path = format!("/api/v1/interfaces/{id}");
        let set = self
            .call("PUT", &path, Some(&json!(def)))
            .with_context(|| format!("setting interface {id}"))?;
        typed(set, "an interface")
    }

    /// Removes entry `id` of the interface table; refused while an action names it.
    pub fn remove_interface(&self, id: u16) -> anyhow::Result<()> {
        self.call("DELETE", &format!("/api/v1/interfaces/{id}"), None)
            .with_context(|| format!("removing interface {id}"))?;
        Ok(())
    }

    /// The multicast group table.
    pub fn groups(&self) -> anyhow::Result<Vec<GroupView>> {
        let mut doc = self.call("GET", "/api/v1/groups", None)?;
        typed(doc["groups"].take(), "the multicast groups")
    }

    /// Makes or replaces entry `id` of the multicast group table: every action naming it
    /// copies to `def`'s members from the next frame on.
    pub fn set_group(&self, id: u16, def: &GroupDef) -> anyhow::Result<GroupView> {
        let set = self
            .call("PUT", &format!("/api/v1/groups/{id}"), Some(&json!(def)))
            .with_context(|| format!("setting multicast group {id}"))?;
        typed(set, "a multicast group")
    }

    /// Removes entry `id` of the multicast group table; refused while an action names it.
    pub fn remove_group(&self, id: u16) -> anyhow::Result<()> {
        self.call("DELETE", &format!("/api/v1/groups/{id}"), None)
            .with_context(|| format!("removing multicast group {id}"))?;
        Ok(())
    }

    /// The counters operators' `count` actions feed.
    pub fn counters(&self) -> anyhow::Result<Vec<CounterView>> {
        let mut doc = self.call("GET", "/api/v1/counters", None)?;
        typed(doc["counters"].take(), "the counters")
    }

    /// Removes counter `name`; refused while a `count` action feeds it.
    pub fn remove_counter(&self, name: &str) -> anyhow::Result<()> {
        self.call("DELETE", &format!("/api/v1/counters/{name}"), None)
            .with_context(|| format!("removing counter {name}"))?;
        Ok(())
    }

    /// Register `name`: a user register (`user<N>`) or a port's figure (`port<N>.<figure>`).
    pub fn register(&self, name: &str) -> anyhow::Result<RegisterView> {
        let doc = self.call("GET", &format!("/api/v1/registers/{name}"), None)?;
        typed(doc, "a register")
    }

    /// Every register: the user registers and the ports' figures.
    pub fn registers(&self) -> anyhow::Result<Vec<RegisterView>> {
        let mut doc = self.call("GET", "/api/v1/registers", None)?;
        typed(doc["registers"].take(), "the registers")
    }

    /// Writes the user register `name`.
    pub fn set_register(&self, name: &str, value: u64) -> anyhow::Result<RegisterView> {
        let path = format!(
            "/api/v1/registers/{}",
            crate::percent_encode(name.as_bytes())
        );
        let doc = self.call("PUT", &path, Some(&serde_json::json!({ "value": value })))?;
        typed(doc, "a register")
    }

    /// Every port with its counters.
    pub fn ports(&self) -> anyhow::Result<Vec<PortView>> {
        let mut doc = self.call("GET", "/api/v1/ports", None)?;
        typed(doc["ports"].take(), "the ports")
    }

    /// Gives `port` an egress queue sending `rate_bps` (0: at once again) and holding
    /// `depth_bytes` (the switch's default if `None`); the depth it holds.
    pub fn set_egress(
        &self,
        port: u16,
        rate_bps: u64,
        depth_bytes: Option<u64>,
    ) -> anyhow::Result<u64> {
        let body = json!({ "rate_bps": rate_bps, "depth_bytes": depth_bytes });
        let set = self
            .call("PUT", &format!("/api/v1/ports/{port}/egress"), Some(&body))
            .with_context(|| format!("setting port {port}'s egress rate"))?;
        set["depth_bytes"]
            .as_u64()
            .context("the switch gave no queue depth")
    }

    /// Sends `frame` out of `port` as the switch's own.
    pub fn send_frame(&self, port: u16, frame: &[u8]) -> anyhow::Result<()> {
        let body = json!({ "port": port, "frame": switch::control::hex(frame) });
        self.call("POST", "/api/v1/packets", Some(&body))?;
        Ok(())
    }

    /// Takes at most `max` of the frames entries sent to the CPU, waiting up to `wait_ms` for
    /// a first one when none is queued; none when none came.
    pub fn take_packets(&self, max: usize, wait_ms: u64) -> anyhow::Result<Vec<CpuFrame>> {
        let path = format!("/api/v1/packets?max={max}&wait_ms={wait_ms}");
        let mut doc = self.call("GET", &path, None)?;
        typed(doc["frames"].take(), "the frames sent to the CPU")
    }

    /// The frames entries send to the CPU as they come, for `within` at most: calls `each`
    /// with every one until then, or until `each` returns false. Each frame goes to one
    /// reader: this and [`Client::take_packets`] share the switch's queue.
    pub fn watch_packets(
        &self,
        within: Duration,
        mut each: impl FnMut(CpuFrame) -> bool,
    ) -> anyhow::Result<()> {
        let mut stream = self.open(&format!("/api/v1/packets/stream?ms={}", within.as_millis()))?;
        while let Some(line) = stream.next_line()? {
            if !each(typed(line, "a frame sent to the CPU")?) {
                break;
            }
        }
        Ok(())
    }
}

/// `doc` as a `T`, or an error saying the switch answered something else.
fn typed<T: DeserializeOwned>(doc: Value, what: &str) -> anyhow::Result<T> {
    serde_json::from_value(doc).with_context(|| format!("the switch's answer for {what}"))
}
