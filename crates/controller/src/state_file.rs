//! The controller's state kept in a file (`state_file`), for a controller that runs without
//! etcd: one JSON object, each key's value as the controller stored it, written whole to a
//! file beside it and renamed over it, so that a crash leaves the old file or the new one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::Context;
use serde_json::Value;

/// The file and what it holds.
#[derive(Debug)]
pub struct StateFile {
    path: PathBuf,
    held: Mutex<BTreeMap<String, Value>>,
}

impl StateFile {
    /// Reads `path`, or starts empty when there is none yet.
    pub fn open(path: &Path) -> anyhow::Result<StateFile> {
        let held = match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes).with_context(|| {
                format!(
                    "the state file {} is not a JSON object: move it away to start afresh",
                    path.display()
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => {
                return Err(e).with_context(|| format!("reading the state file {}", path.display()))
            }
        };
        Ok(StateFile {
            path: path.to_path_buf(),
            held: Mutex::new(held),
        })
    }

    /// The value stored under `key`.
    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.get(key).map(|v| v.to_string().into_bytes())
    }

    /// Stores `value` (JSON) under `key` and writes the file.
    pub fn put(&self, key: &str, value: &[u8]) -> anyhow::Result<()> {
        let value: Value = serde_json::from_slice(value).context("a value that is not JSON")?;
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.get(key) == Some(&value) {
            return Ok(());
        }
        let before = held.insert(key.to_string(), value);
        let text = serde_json::to_vec_pretty(&*held)?;
        let mut tmp = self.path.clone().into_os_string();
        tmp.push(".new");
        let written = (|| {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&text)?;
            // On disk before it replaces the old file, so a crash leaves one or the other.
            f.sync_all()?;
            std::fs::rename(&tmp, &self.path)
        })();
        if written.is_err() {
            // Not kept, so that the next put of the same value writes it again.
            match before {
                Some(v) => held.insert(key.to_string(), v),
                None => held.remove(key),
            };
        }
        written.with_context(|| format!("writing the state file {}", self.path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_put_is_read_back_by_the_next_opening_and_a_bad_file_is_named() {
        let dir = std::env::temp_dir().join(format!("kvswitch-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.json");
        let _ = std::fs::remove_file(&path);
        let file = StateFile::open(&path).unwrap();
        assert_eq!(file.get("routes"), None);
        file.put("routes", br#"{"current": 3}"#).unwrap();
        file.put("switches/a/copy", br#"{"instance": "x"}"#)
            .unwrap();
        assert!(file.put("bad", b"not json").is_err());
        let again = StateFile::open(&path).unwrap();
        let routes: Value = serde_json::from_slice(&again.get("routes").unwrap()).unwrap();
        assert_eq!(routes["current"], 3);
        assert!(again.get("switches/a/copy").is_some());
        assert_eq!(again.get("bad"), None);
        std::fs::write(&path, b"{ torn").unwrap();
        let e = StateFile::open(&path).unwrap_err();
        assert!(format!("{e:#}").contains("state.json"), "{e:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
