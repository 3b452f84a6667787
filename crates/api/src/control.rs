//! The switch's control API, typed: what kvswitch's own parts ask of a switch's tables, as the
//! definitions of `switch::control` over [`Client`]. A refusal comes back as a [`Refused`]
//! carrying the switch's [`ErrorKind`] and the field it named.

use anyhow::Context;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use switch::control::{Change, EntryDef, EntryView, TableDef, TableView, MAX_BATCH};

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
            Err(e) if e.downcast_ref::<Refused>().is_some_and(Refused::not_found) => Ok(false),
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

/// `doc` as a `T`, or an error saying the switch answered something else.
fn typed<T: DeserializeOwned>(doc: Value, what: &str) -> anyhow::Result<T> {
    serde_json::from_value(doc).with_context(|| format!("the switch's answer for {what}"))
}
