//! The SwitchKV cache nodes the switches steer reads to, with `cache_node_port` set: every
//! address a `kv_steer` entry of any switch leads to (its `set_ipv4_dst`) is asked memcached's
//! `version` on that port each probe interval. A node that fails `down_after` probes in a row
//! loses its steering entries on every switch, so that reads of its keys go to their backends
//! again (it may have died, or hung past its leases); entries found leading to it while its
//! probes still fail go too. Once it answers, its rule sink finds them gone (it lists its
//! entries every few seconds) and installs them again.
//! A switch also checks the nodes it steers to on its own (`switch.steer_check_ms`); the
//! controller's check covers every switch of the fleet from one place, and switches without a
//! local port, which cannot probe.

use api::metrics::{Exposition, Kind};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::Instant;

use serde_json::{json, Value};

use super::{probe, Health, Shared, CAMPAIGN_INTERVAL};
use api::Client;
use switch::control::{ActionDef, EntryView, STEER};

/// What the controller knows of one cache node.
#[derive(Debug, Clone)]
pub(super) struct CacheNode {
    pub health: Health,
    /// Steering entries that led to it at the last round, over every switch.
    pub entries: usize,
    /// Entries removed because it did not answer.
    pub removed: u64,
}

impl Default for CacheNode {
    /// A node found in a steering entry installed it, and so served a moment ago: up, and
    /// down only after `down_after` failed probes in a row (a server's first probe alone
    /// decides, which does not suit a node that has just shown it runs).
    fn default() -> CacheNode {
        CacheNode {
            health: Health::up_at_start(),
            entries: 0,
            removed: 0,
        }
    }
}

/// The cache nodes' watch: runs until the controller stops; returns at once without
/// `cache_node_port`.
pub(super) fn watch(shared: &Shared) {
    while !shared.stop.load(Ordering::Relaxed) {
        let began = Instant::now();
        if !shared.fleet().acting() {
            std::thread::sleep(CAMPAIGN_INTERVAL);
            continue;
        }
        let (port, switches, interval, timeout) = {
            let f = shared.fleet();
            (
                f.file.cache_node_port,
                f.file.switches.clone(),
                f.file.probe_interval,
                f.file.probe_timeout,
            )
        };
        let Some(port) = port else {
            return;
        };
        let clients: Vec<Client> = switches
            .iter()
            .map(|sw| shared.switch_client(sw.api))
            .collect();
        // Each switch's steering entries, by the address they lead to: (switch, entry id).
        let mut leading: BTreeMap<Ipv4Addr, Vec<(usize, u64)>> = BTreeMap::new();
        for (i, client) in clients.iter().enumerate() {
            // A switch out of reach (its syncer says so), or a proxy without tables.
            let Ok(entries) = client.table_entries(STEER) else {
                continue;
            };
            for e in &entries {
                if let Some(ip) = target(e) {
                    leading.entry(ip).or_default().push((i, e.id));
                }
            }
        }
        let outcomes: Vec<(Ipv4Addr, Result<(), String>)> = std::thread::scope(|s| {
            let probes: Vec<_> = leading
                .keys()
                .map(|&ip| {
                    (
                        ip,
                        s.spawn(move || probe(SocketAddr::from((ip, port)), timeout)),
                    )
                })
                .collect();
            probes
                .into_iter()
                .map(|(ip, p)| {
                    let outcome = p.join().unwrap_or_else(|_| Err("the probe failed".into()));
                    (ip, outcome)
                })
                .collect()
        });
        let mut remove: Vec<(Ipv4Addr, Vec<(usize, u64)>)> = Vec::new();
        {
            let mut f = shared.fleet();
            let (down_after, up_after) = (f.file.down_after, f.file.up_after);
            for node in f.cache_nodes.values_mut() {
                node.entries = 0;
            }
            for (ip, outcome) in outcomes {
                let node = f.cache_nodes.entry(ip).or_default();
                let entries = leading.remove(&ip).unwrap_or_default();
                node.entries = entries.len();
                let failed = outcome.is_err();
                if node.health.record(outcome, down_after, up_after) && node.health.up() {
                    tracing::info!(cache_node = %ip, "cache node answers again");
                }
                // Not once it answers again: what it installs on its way back up stays.
                if !node.health.up() && failed {
                    remove.push((ip, entries));
                }
            }
        }
        for (ip, entries) in remove {
            let mut gone = 0u64;
            for (i, id) in entries {
                // An entry the switch removed meanwhile (its own check) is not counted.
                if let Ok(true) = clients[i].remove_entry(STEER, id) {
                    gone += 1;
                }
            }
            if gone > 0 {
                tracing::warn!(
                    cache_node = %ip, entries = gone,
                    "cache node does not answer: its steering entries are removed"
                );
                let mut f = shared.fleet();
                if let Some(node) = f.cache_nodes.get_mut(&ip) {
                    node.removed += gone;
                    node.entries = node.entries.saturating_sub(gone as usize);
                }
            }
        }
        std::thread::sleep(interval.saturating_sub(began.elapsed()));
    }
}

/// The address a steering entry sends reads to.
fn target(entry: &EntryView) -> Option<Ipv4Addr> {
    entry.actions.iter().find_map(|a| match a {
        ActionDef::SetIpv4Dst(ip) => Some(*ip),
        _ => None,
    })
}

/// The cache nodes for the status document.
pub(super) fn status(nodes: &BTreeMap<Ipv4Addr, CacheNode>) -> Value {
    nodes
        .iter()
        .map(|(ip, n)| {
            json!({
                "addr": ip.to_string(), "up": n.health.up(), "entries": n.entries,
                "probes": n.health.probes, "failures": n.health.failures,
                "downs": n.health.downs, "removed_entries": n.removed,
                "last_error": n.health.last_error,
            })
        })
        .collect()
}

/// The cache nodes' metric families.
pub(super) fn metrics(nodes: &BTreeMap<Ipv4Addr, CacheNode>, m: &mut Exposition) {
    type Figure = (&'static str, &'static str, Kind, fn(&CacheNode) -> u64);
    const FIGURES: [Figure; 3] = [
        (
            "kvswitch_controller_cache_node_up",
            "1 while the cache node answers its probes.",
            Kind::Gauge,
            |n| u64::from(n.health.up()),
        ),
        (
            "kvswitch_controller_cache_node_entries",
            "Steering entries leading to the cache node, over every switch.",
            Kind::Gauge,
            |n| n.entries as u64,
        ),
        (
            "kvswitch_controller_steer_removed_total",
            "Steering entries removed because the cache node they led to did not answer.",
            Kind::Counter,
            |n| n.removed,
        ),
    ];
    for (name, help, kind, pick) in FIGURES {
        m.family(name, kind, help);
        for (ip, n) in nodes {
            m.sample(name, &[("cache_node", &ip.to_string())], pick(n));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_leads_to_the_address_of_its_ip_rewrite() {
        let entry = |actions| EntryView {
            id: 3,
            fields: BTreeMap::new(),
            priority: 0,
            prefix_len: None,
            actions,
            hits: 0,
        };
        let node = Ipv4Addr::new(10, 0, 0, 9);
        let steer = entry(vec![ActionDef::SetIpv4Dst(node), ActionDef::Interface(2)]);
        assert_eq!(target(&steer), Some(node));
        assert_eq!(target(&entry(vec![ActionDef::Interface(2)])), None);
        assert_eq!(target(&entry(Vec::new())), None);
    }
}
