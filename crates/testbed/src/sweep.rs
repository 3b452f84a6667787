//! Namespaces and links a testbed left without a state file (or beside one): finding them and
//! removing them, with the daemons of kvswitch's own still inside.

use std::time::{Duration, Instant};

use anyhow::anyhow;

use crate::netns::{self, ip};
use crate::process;

/// Programs `up` starts inside namespaces; leftovers of these are stopped before the namespace
/// goes away, since deleting a namespace does not end the processes in it.
const NS_DAEMONS: &[&str] = &["memcached", "nutcracker", "kvswitch"];

/// Removes namespaces and links with `prefix` that exist without a state file. Processes other
/// than memcached, nutcracker and kvswitch inside those namespaces are not stopped.
pub fn sweep(prefix: &str) -> anyhow::Result<()> {
    crate::topology::check_prefix(prefix)?;
    let tag = format!("{prefix}-");
    let namespaces: Vec<String> = netns::list_netns()?
        .into_iter()
        .filter(|n| n.starts_with(&tag))
        .collect();
    let links: Vec<String> = netns::list_links()?
        .into_iter()
        .filter(|l| l.starts_with(&tag))
        .collect();
    remove_network(&namespaces, &links)
}

/// Names of namespaces and root-namespace links that carry `prefix`.
pub(crate) fn leftovers(prefix: &str) -> anyhow::Result<Vec<String>> {
    let tag = format!("{prefix}-");
    let mut found: Vec<String> = netns::list_netns()?
        .into_iter()
        .filter(|n| n.starts_with(&tag))
        .map(|n| format!("netns {n}"))
        .collect();
    found.extend(
        netns::list_links()?
            .into_iter()
            .filter(|l| l.starts_with(&tag))
            .map(|l| format!("link {l}")),
    );
    Ok(found)
}

/// Deletes the namespaces (stopping our daemons still inside them) and then whatever of the
/// links outlived them; deleting a namespace removes its veth pair, but asynchronously.
pub(crate) fn remove_network(namespaces: &[String], links: &[String]) -> anyhow::Result<()> {
    let mut problems = Vec::new();
    for ns in namespaces {
        if !netns::netns_exists(ns) {
            continue;
        }
        let strays: Vec<u32> = netns::netns_pids(ns)
            .into_iter()
            .filter(|&pid| process::program(pid).is_some_and(|p| NS_DAEMONS.contains(&p.as_str())))
            .collect();
        if !strays.is_empty() {
            tracing::warn!(ns = %ns, ?strays, "stopping unrecorded daemons");
            let left = process::stop_all(&strays);
            if !left.is_empty() {
                problems.push(format!("processes in {ns} still alive: {left:?}"));
            }
        }
        if let Err(e) = ip(&["netns", "delete", ns]) {
            if netns::netns_exists(ns) {
                problems.push(format!("{e:#}"));
            }
        }
    }

    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let present: Vec<&String> = links.iter().filter(|l| netns::link_exists(l)).collect();
        if present.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            for l in present {
                // The link may vanish between the check and the delete; only a survivor counts.
                if ip(&["link", "delete", "dev", l]).is_err() && netns::link_exists(l) {
                    problems.push(format!("link {l} could not be deleted"));
                }
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }

    if problems.is_empty() {
        Ok(())
    } else {
        Err(anyhow!(problems.join("; ")))
    }
}
