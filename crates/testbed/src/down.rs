//! Tearing a testbed down from its state file, also when `up` died half-way.
//!
//! Every step tolerates things that are already gone, so `down` can be repeated. It never kills
//! by name: recorded PIDs are checked against their command line, and the only unrecorded
//! processes touched are memcached, nutcracker and kvswitch (its `node` servers) inside
//! namespaces carrying the prefix.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};

use crate::netns;
use crate::process;
use crate::state::State;
use crate::sweep::{leftovers, remove_network, sweep};

/// Removes everything the state file at `state_path` records, plus any namespace or link with
/// its prefix, then the generated files and the state file itself. A missing state file means
/// there is nothing to do. If some piece cannot be removed the state file stays, so the call can
/// be repeated, and the error lists what is left.
pub fn down(state_path: &Path) -> anyhow::Result<()> {
    if !state_path.exists() {
        return Ok(());
    }
    let state = State::load(state_path)?;
    let mut problems = Vec::new();

    // kvswitch first, so it stops touching the interfaces, then the daemons in the namespaces.
    let mut pids = Vec::new();
    for p in state.procs.iter().rev() {
        if process::runs(p.pid, &p.argv) {
            pids.push(p.pid);
        } else {
            tracing::debug!(pid = p.pid, what = %p.what, "already gone or PID reused; not signalled");
        }
    }
    let left = process::stop_all(&pids);
    if !left.is_empty() {
        problems.push(format!("processes still alive: {left:?}"));
    }

    let mut namespaces: Vec<String> = state.hosts.iter().map(|h| h.netns.clone()).collect();
    let mut links: Vec<String> = state.hosts.iter().map(|h| h.switch_if.clone()).collect();
    // kvswitch removes its local port when it stops; after a crash it is still here.
    links.extend(state.local_port.iter().chain(&state.local_peer).cloned());
    let tag = format!("{}-", state.prefix);
    for ns in netns::list_netns().unwrap_or_default() {
        if ns.starts_with(&tag) && !namespaces.contains(&ns) {
            namespaces.push(ns);
        }
    }
    for link in netns::list_links().unwrap_or_default() {
        if link.starts_with(&tag) && !links.contains(&link) {
            links.push(link);
        }
    }
    if let Err(e) = remove_network(&namespaces, &links) {
        problems.push(format!("{e:#}"));
    }

    for f in &state.files {
        if let Err(e) = std::fs::remove_file(f) {
            if e.kind() != std::io::ErrorKind::NotFound {
                problems.push(format!("removing {}: {e}", f.display()));
            }
        }
    }
    // Only removed when empty: the directory may have held files before `up`.
    let _ = std::fs::remove_dir(&state.work_dir);
    let _ = std::fs::remove_file(state_path.with_extension("json.tmp"));

    if !problems.is_empty() {
        return Err(anyhow!(
            "testbed {:?} not fully torn down (state kept in {}): {}",
            state.prefix,
            state_path.display(),
            problems.join("; ")
        ));
    }
    std::fs::remove_file(state_path).with_context(|| format!("removing {}", state_path.display()))
}

/// Tears down the testbed of `prefix`, wherever its state file is: the default place, or the
/// path `up --state` recorded in [`crate::pointer_path`]. Without a state file, the namespaces
/// and links of the prefix (and memcached, nutcracker and kvswitch inside those namespaces)
/// are still removed. Fails when nothing of the prefix exists, so a mistyped prefix is not
/// taken for a clean teardown.
pub fn down_prefix(prefix: &str) -> anyhow::Result<()> {
    crate::topology::check_prefix(prefix)?;
    let default = crate::default_state_path(prefix);
    let pointer = crate::pointer_path(prefix);
    let mut found = false;
    for path in [Some(default.clone()), pointed_to(&pointer)]
        .into_iter()
        .flatten()
    {
        if path.exists() {
            down(&path)?;
            found = true;
        }
    }
    // A network of programmable switches (`testbed::net`) keeps its own state file.
    if crate::net::state_path(prefix).exists() {
        crate::net::take_down_prefix(prefix)?;
        found = true;
    }
    // A pointer whose state file is gone (removed by hand) points nowhere.
    if pointer.exists() {
        std::fs::remove_file(&pointer)
            .with_context(|| format!("removing {}", pointer.display()))?;
    }
    if !leftovers(prefix)?.is_empty() {
        sweep(prefix)?;
        found = true;
    }
    if !found {
        return Err(anyhow!(
            "no testbed with prefix {prefix:?}: no state file at {} or recorded in {}, and no \
             namespace or link named {prefix}-*",
            default.display(),
            pointer.display()
        ));
    }
    Ok(())
}

/// The state file a pointer written by `up` names, if there is a pointer.
pub(crate) fn pointed_to(pointer: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string(pointer).ok()?;
    let path = text.trim();
    (!path.is_empty()).then(|| PathBuf::from(path))
}
