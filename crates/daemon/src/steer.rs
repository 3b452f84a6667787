//! The switch's side of SwitchKV's cache nodes: a check that probes each cache node its
//! `kv_steer` entries lead to, and removes a node's entries when it stops answering, so that
//! reads of its keys go to their servers again ([`watch`]). The entries themselves are
//! installed by the cache nodes, through the control API.

use kv::health::{Detector, Thresholds};
use std::collections::{BTreeSet, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use switch::Switch;

/// What the steering check saw, for the status document and the metrics.
#[derive(Debug, Default)]
pub struct SteerHealth {
    /// Entries removed because the cache node they led to stopped answering.
    pub removed: AtomicU64,
    /// Cache nodes whose entries were removed, until they answer again.
    pub down: Mutex<BTreeSet<Ipv4Addr>>,
}

/// How the daemon checks the cache nodes its `kv_steer` entries lead to.
#[derive(Debug, Clone, Copy)]
pub struct SteerCheck {
    /// Their memcached port (the VIP's).
    pub port: u16,
    /// The local port's number, and the address the host's stack speaks from through it: the
    /// probes' replies are let back to the host by an `acl` entry the check adds per node.
    pub local_port: u16,
    pub local_source: Ipv4Addr,
    pub every: Duration,
    /// Failed probes in a row that remove a node's entries.
    pub failures: u32,
}

/// Probes, every `check.every`, each cache node that a `kv_steer` entry leads to (the address
/// its `set_ipv4_dst` action names) with memcached's `version` over TCP; a node that fails
/// `check.failures` probes in a row loses every entry leading to it, so that reads of its keys
/// go to their servers again (a node that hangs is caught as well as one that died). The node
/// installs its entries again itself once it runs. Runs until `stop` says so.
pub fn watch(
    remote: dataplane::Remote<Switch>,
    check: SteerCheck,
    health: Arc<SteerHealth>,
    stop: fn() -> bool,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("steer-check".into())
        .spawn(move || {
            // The one failure detector: down after `check.failures` failed probes in a row,
            // up at the first answer.
            let t = Thresholds {
                down_after: check.failures,
                up_after: 1,
            };
            let mut nodes: HashMap<Ipv4Addr, Detector> = HashMap::new();
            while !stop() {
                let started = Instant::now();
                if let Some(targets) = on_switch(&remote, targets) {
                    nodes.retain(|ip, _| targets.contains(ip));
                    for ip in targets {
                        if !nodes.contains_key(&ip) {
                            on_switch(&remote, move |sw| let_replies_in(sw, ip, check));
                        }
                        let answered = answers(SocketAddr::from((ip, check.port)), check.every);
                        let node = nodes.entry(ip).or_insert_with(Detector::up);
                        node.record(answered, t);
                        if answered {
                            lock(&health.down).remove(&ip);
                            continue;
                        }
                        if node.is_up() {
                            continue;
                        }
                        // Down: its entries go (again, if it put some back while down).
                        let removed = on_switch(&remote, move |sw| remove_target(sw, ip));
                        if let Some(removed) = removed.filter(|&r| r > 0) {
                            health.removed.fetch_add(removed, Ordering::Relaxed);
                            lock(&health.down).insert(ip);
                            tracing::warn!(
                                cache_node = %ip, entries = removed,
                                "cache node does not answer: its steering entries are removed"
                            );
                        }
                    }
                }
                std::thread::sleep(check.every.saturating_sub(started.elapsed()));
            }
        })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `f` on the forwarding thread; `None` if it did not answer within a second.
fn on_switch<R: Send + 'static>(
    remote: &dataplane::Remote<Switch>,
    f: impl FnOnce(&mut Switch) -> R + Send + 'static,
) -> Option<R> {
    let (tx, rx) = std::sync::mpsc::channel();
    remote
        .submit(Box::new(move |sw, _, _| {
            let _ = tx.send(f(sw));
        }))
        .ok()?;
    rx.recv_timeout(Duration::from_secs(1)).ok()
}

/// The addresses `kv_steer` entries send reads to.
fn targets(sw: &mut Switch) -> BTreeSet<Ipv4Addr> {
    sw.entries(switch::control::STEER)
        .unwrap_or_default()
        .iter()
        .filter_map(target_of)
        .collect()
}

fn target_of(entry: &switch::control::EntryView) -> Option<Ipv4Addr> {
    entry.actions.iter().find_map(|a| match a {
        switch::control::ActionDef::SetIpv4Dst(ip) => Some(*ip),
        _ => None,
    })
}

/// Adds the `acl` entry that sends TCP from cache node `ip`'s memcached port to the host's
/// stack out of the local port (the replies to the probes), unless it is there.
fn let_replies_in(sw: &mut Switch, ip: Ipv4Addr, check: SteerCheck) {
    use switch::control::{ActionDef, Change, EntryDef, Value};
    let fields: std::collections::BTreeMap<String, Value> = [
        ("ip_src", Value::Text(ip.to_string())),
        ("ip_proto", Value::Number(6)),
        ("l4_src", Value::Number(u64::from(check.port))),
        ("ip_dst", Value::Text(check.local_source.to_string())),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let actions = vec![ActionDef::Output(check.local_port)];
    let acl = switch::control::ACL;
    let there = sw.entries(acl).unwrap_or_default().iter().any(|e| {
        e.actions.first() == actions.first()
            && e.fields.get("ip_src") == fields.get("ip_src")
            && e.fields.get("l4_src") == fields.get("l4_src")
    });
    if there {
        return;
    }
    let entry = EntryDef {
        fields,
        priority: 1000,
        prefix_len: None,
        actions,
    };
    let added = sw.apply(vec![Change::Add {
        table: acl.to_string(),
        entry,
    }]);
    if let Err(e) = added {
        tracing::warn!(cache_node = %ip, "cannot let its probe replies in: {e}");
    }
}

/// Removes every `kv_steer` entry leading to `ip`; returns how many went.
fn remove_target(sw: &mut Switch, ip: Ipv4Addr) -> u64 {
    let ids: Vec<u64> = sw
        .entries(switch::control::STEER)
        .unwrap_or_default()
        .iter()
        .filter(|e| target_of(e) == Some(ip))
        .map(|e| e.id)
        .collect();
    let changes = ids
        .iter()
        .map(|&id| switch::control::Change::Delete {
            table: switch::control::STEER.to_string(),
            id,
        })
        .collect();
    match sw.apply(changes) {
        Ok(_) => ids.len() as u64,
        Err(e) => {
            tracing::warn!(cache_node = %ip, "steering entries not removed: {e}");
            0
        }
    }
}

/// Whether a memcached at `addr` answers `version` within `wait` (at most a second).
fn answers(addr: SocketAddr, wait: Duration) -> bool {
    let wait = wait.clamp(Duration::from_millis(10), Duration::from_secs(1));
    client::memcached::version(addr, wait).is_ok()
}
