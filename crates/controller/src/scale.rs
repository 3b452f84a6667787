//! The pool following its load (`[scale]`): every interval the scaler reads each server's own
//! counters (memcached's `stats`) and turns them into a load per second, commands or bytes.
//!
//! - Weights (`weights = [lo, hi]`): when a server's load is further than `weight_band` from
//!   its weight's share of the pool's load for `sustain` readings in a row, every weight is
//!   moved halfway (geometrically) toward the one that would even the load out, within `lo`
//!   and `hi` times the server's own weight. Which weight evens it out is judged by each
//!   server's load per unit of weight (its keys' density), so a skew that lasts holds the
//!   weights where they are, and once the load would be even under the servers' own weights
//!   they are put back (the skew ended).
//! - Spares (`spares`): when the mean load per server stays above `add_above`, the next spare
//!   is emptied (`flush_all`: it may hold what it held when it last left) and added, warming
//!   up for `warm_up_ms`; when the pool without its last added spare would stay under
//!   `remove_below` per server, that spare is taken out and its keys go back to the servers
//!   that held them before. Those may hold older values of keys written while the spare held
//!   them, so every key the spare holds (`lru_crawler metadump all`) is deleted on the other
//!   servers before it leaves and again once every switch routes without it: a key read
//!   afterwards is a miss or its last value, never an older one.
//!
//! After any change the readings start again, so the next change waits for `sustain` readings
//! of the pool as it now is. The scaler acts only while this controller leads; the spares it
//! added are known by their addresses, so a new leader carries on.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use client::memcached;
use config::controller::{Scale, Signal};
use serde_json::{json, Value};
use switch::pool::ServerSpec;

use super::balance::sleep_unless_stopped;
use super::handlers::{admit, expel};
use super::health::probe_and_flush;
use super::{at_once, Shared, CAMPAIGN_INTERVAL};

/// Weights are moved in hundredths of a server's own weight (ketama's weights are relative:
/// every weight times 100 is the same ring).
const UNIT: u32 = 100;

/// The counters a `requests` load sums (a multi-key get counts each key).
const REQUEST_FIELDS: [&str; 9] = [
    "cmd_get",
    "cmd_set",
    "cmd_touch",
    "delete_hits",
    "delete_misses",
    "incr_hits",
    "incr_misses",
    "decr_hits",
    "decr_misses",
];

/// What the scaler measured and did, for the status and the metrics.
#[derive(Debug, Default, Clone)]
pub(super) struct Status {
    pub readings: u64,
    pub read_failures: u64,
    /// Each server's load in the last whole reading, by label, with its weight then.
    pub loads: Vec<(String, f64, u32)>,
    /// The mean load per server in the last whole reading.
    pub per_server: f64,
    pub weight_changes: u64,
    pub weights_restored: u64,
    pub added: u64,
    pub removed: u64,
    pub last_change: Option<(Instant, String)>,
    pub last_error: Option<String>,
    /// Readings in a row: above `add_above`, under `remove_below` without the last spare,
    /// with a server off its share, with the load even under the servers' own weights.
    high: u32,
    low: u32,
    uneven: u32,
    calm: u32,
}

impl Status {
    /// Every change made, of any kind.
    fn changes(&self) -> u64 {
        self.weight_changes + self.weights_restored + self.added + self.removed
    }
}

/// One server's counters at one instant.
#[derive(Debug, Clone, Copy)]
struct Reading {
    at: Instant,
    count: u64,
    /// The process that counted: a new one (the server restarted) starts its counts again.
    pid: u64,
}

/// The scaler's loop: runs while the controller lives, acts while it leads.
pub(super) fn scale(shared: &Shared) {
    let mut last: HashMap<SocketAddr, Reading> = HashMap::new();
    // Each server's own weight, by label: the file's, or the one it was added with.
    let mut own: HashMap<String, u32> = HashMap::new();
    while !shared.stop.load(std::sync::atomic::Ordering::Relaxed) {
        let (acting, settings) = {
            let f = shared.fleet();
            (f.acting(), f.file.scale.clone())
        };
        let Some(settings) = settings else { return };
        if !acting {
            last.clear();
            std::thread::sleep(CAMPAIGN_INTERVAL);
            continue;
        }
        sleep_unless_stopped(shared, settings.interval);
        if !shared.fleet().acting() {
            continue;
        }
        let changes = shared.fleet().scale.changes();
        let outcome = round(shared, &settings, &mut last, &mut own);
        let mut f = shared.fleet();
        if f.scale.changes() != changes {
            // The next reading starts from the pool as it now is.
            last.clear();
        }
        if let Err(e) = outcome {
            if f.scale.last_error.as_ref() != Some(&e) {
                tracing::warn!("scale: {e}");
            }
            f.scale.last_error = Some(e);
            // A change that failed waits for `sustain` readings again, not one.
            let st = &mut f.scale;
            (st.high, st.low, st.uneven, st.calm) = (0, 0, 0, 0);
        }
    }
}

/// One reading, and the change it calls for, if any.
fn round(
    shared: &Shared,
    settings: &Scale,
    last: &mut HashMap<SocketAddr, Reading>,
    own: &mut HashMap<String, u32>,
) -> Result<(), String> {
    let (servers, up, timeout, typical, file_weights) = {
        let f = shared.fleet();
        let up: Vec<bool> = f
            .health
            .iter()
            .zip(&f.standing_in)
            .map(|(h, s)| h.up() && s.is_none())
            .collect();
        let file: HashMap<String, u32> = f
            .file
            .pool
            .servers
            .iter()
            .map(|s| (s.label(), s.weight))
            .collect();
        let typical = typical_weight(&f.file.pool.servers);
        (f.servers.clone(), up, f.file.probe_timeout, typical, file)
    };
    for s in &servers {
        // The file's weight; a spare's is the pool's typical one; a server added through the
        // API has the one it came with.
        let weight = match file_weights.get(&s.label()) {
            Some(w) => *w,
            None if settings.spares.contains(&s.addr) => typical,
            None => s.weight,
        };
        own.entry(s.label()).or_insert(weight);
    }
    own.retain(|label, _| servers.iter().any(|s| s.label() == *label));
    let wait = timeout.max(Duration::from_millis(500));
    let counted = at_once(servers.len(), |i| match up[i] {
        true => read(servers[i].addr, settings.signal, wait).map(Some),
        false => Ok(None),
    });
    let mut loads: Vec<Option<f64>> = vec![None; servers.len()];
    let mut failures: Vec<String> = Vec::new();
    for (i, c) in counted.into_iter().enumerate() {
        let now = match c {
            Ok(Ok(Some(r))) => r,
            Ok(Ok(None)) => continue,
            Ok(Err(e)) => {
                failures.push(format!("{}: {e}", servers[i].label()));
                continue;
            }
            Err(_) => {
                failures.push(format!("{}: the read failed", servers[i].label()));
                continue;
            }
        };
        let addr = servers[i].addr;
        if let Some(before) = last.insert(addr, now) {
            let secs = now.at.duration_since(before.at).as_secs_f64();
            if before.pid == now.pid && now.count >= before.count && secs > 0.0 {
                loads[i] = Some((now.count - before.count) as f64 / secs);
            }
        }
    }
    last.retain(|a, _| servers.iter().any(|s| s.addr == *a));
    let mut f = shared.fleet();
    f.scale.readings += 1;
    f.scale.read_failures += failures.len() as u64;
    // Judged on the servers up: a server up but not read twice yet, or whose stats could not
    // be read, means no judgement this time.
    let whole = loads.iter().zip(&up).all(|(l, u)| l.is_some() || !u)
        && up.iter().any(|u| *u)
        && failures.is_empty();
    if !whole {
        let st = &mut f.scale;
        (st.high, st.low, st.uneven, st.calm) = (0, 0, 0, 0);
        return match failures.is_empty() {
            true => Ok(()),
            false => Err(format!("stats not read: {}", failures.join("; "))),
        };
    }
    f.scale.last_error = None;
    // The servers read, with their loads, weights then, and own weights.
    let read: Vec<(usize, f64, u32, u32)> = (0..servers.len())
        .filter(|&i| up[i])
        .map(|i| {
            let s = &servers[i];
            (i, loads[i].unwrap_or(0.0), s.weight, own[&s.label()])
        })
        .collect();
    let total: f64 = read.iter().map(|r| r.1).sum();
    let n = read.len() as f64;
    // With the weights moved, every server's is in hundredths of its own.
    let moved = read.iter().any(|r| r.2 != r.3);
    f.scale.per_server = total / n;
    f.scale.loads = read
        .iter()
        .map(|&(i, l, w, _)| (servers[i].label(), l, w))
        .collect();

    // Spares: the pool's load per server, and without the last spare added.
    let spare_in = servers
        .iter()
        .enumerate()
        .filter(|(_, s)| settings.spares.contains(&s.addr))
        .max_by_key(|(_, s)| settings.spares.iter().position(|a| *a == s.addr));
    let next_spare = settings
        .spares
        .iter()
        .find(|a| !servers.iter().any(|s| s.addr == **a))
        .copied();
    let st = &mut f.scale;
    st.high = match total / n > settings.add_above && next_spare.is_some() {
        true => st.high + 1,
        false => 0,
    };
    st.low = match spare_in.is_some() && n > 1.0 && total / (n - 1.0) < settings.remove_below {
        true => st.low + 1,
        false => 0,
    };
    // Weights are judged and moved only with every server of the pool read, so that all of
    // them are in one unit.
    let all_up = up.iter().all(|u| *u);
    let weights = match all_up {
        true => weighing(settings, &read, total),
        false => Weighing::Even,
    };
    let st = &mut f.scale;
    match weights {
        Weighing::Even => (st.uneven, st.calm) = (0, 0),
        Weighing::Uneven(_) => (st.uneven, st.calm) = (st.uneven + 1, 0),
        Weighing::Calm => (st.uneven, st.calm) = (0, st.calm + 1),
    }
    let sustain = settings.sustain;
    if st.high >= sustain {
        let Some(addr) = next_spare else {
            return Ok(());
        };
        drop(f);
        // Emptied first, outside the fleet's lock: it may hold what it held when it last left.
        let first = probe_and_flush(addr, wait);
        if let Err(e) = &first {
            return Err(format!("spare {addr} could not be emptied: {e}"));
        }
        let spec = ServerSpec {
            host: addr.ip().to_string(),
            addr,
            weight: typical.saturating_mul(if moved { UNIT } else { 1 }),
            name: None,
        };
        let mut f = shared.fleet();
        if !f.acting() {
            return Ok(());
        }
        let label = spec.label();
        admit(shared, &mut f, spec, first, settings.warm_up)
            .map_err(|e| format!("adding spare {addr}: {e}"))?;
        changed(
            &mut f,
            format!("added spare {label}: {:.0} per server", total / n),
        );
        f.scale.added += 1;
        return Ok(());
    }
    if st.low >= sustain {
        let Some((_, spare)) = spare_in else {
            return Ok(());
        };
        let (label, addr) = (spare.label(), spare.addr);
        let others: Vec<SocketAddr> = servers
            .iter()
            .filter(|s| s.addr != addr)
            .map(|s| s.addr)
            .collect();
        drop(f);
        // What the spare holds was written while it held those keys: their other copies, on
        // the servers they go back to, are older. They go first, so that a key read after the
        // spare left is a miss, never a value older than the last written.
        forget(addr, &others, wait)?;
        let mut f = shared.fleet();
        if !f.acting() {
            return Ok(());
        }
        // Found again: the pool may have changed while the keys were deleted.
        let Some(i) = f.servers.iter().position(|s| s.addr == addr) else {
            return Ok(());
        };
        expel(shared, &mut f, i).map_err(|e| format!("removing spare {label}: {e}"))?;
        changed(
            &mut f,
            format!(
                "removed spare {label}: {:.0} per server without it",
                total / (n - 1.0)
            ),
        );
        f.scale.removed += 1;
        let generation = f.generation;
        drop(f);
        // And again once every switch routes without it: keys first written on it after the
        // first pass.
        let started = Instant::now();
        loop {
            let f = shared.fleet();
            if f.switches
                .iter()
                .all(|s| s.in_step && s.generation >= generation)
            {
                break;
            }
            drop(f);
            if started.elapsed() > IN_STEP_WAIT {
                tracing::warn!(
                    "scale: not every switch routes without spare {label} after \
                     {IN_STEP_WAIT:?}; its keys are deleted again now"
                );
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        forget(addr, &others, wait)?;
        return Ok(());
    }
    // A server at its own weight while the others' are moved (added through the API
    // meanwhile) is brought into their unit at once.
    let unmoved: Vec<(usize, u32)> = read
        .iter()
        .filter(|r| moved && all_up && r.2 == r.3)
        .map(|r| (r.0, r.3.saturating_mul(UNIT)))
        .collect();
    let (target, restore) = match weights {
        _ if !unmoved.is_empty() => (unmoved, false),
        Weighing::Uneven(target) if f.scale.uneven >= sustain => (target, false),
        Weighing::Calm if f.scale.calm >= sustain => {
            let target: Vec<(usize, u32)> = read.iter().map(|&(i, _, _, o)| (i, o)).collect();
            (target, true)
        }
        _ => return Ok(()),
    };
    if !f.acting() {
        return Ok(());
    }
    let mut list = f.servers.clone();
    for &(i, w) in &target {
        match list.get_mut(i) {
            Some(s) if s.label() == servers[i].label() => s.weight = w,
            // The pool changed meanwhile: judge it again next time.
            _ => return Ok(()),
        }
    }
    super::handlers::stored(shared, &list).map_err(|e| e.to_string())?;
    let said: Vec<String> = target
        .iter()
        .map(|&(i, w)| format!("{} {w}", servers[i].label()))
        .collect();
    f.servers = list;
    shared.bump(&mut f);
    changed(&mut f, format!("weights: {}", said.join(", ")));
    match restore {
        true => f.scale.weights_restored += 1,
        false => f.scale.weight_changes += 1,
    }
    Ok(())
}

/// How long a removal waits for the switches to route without the spare before its second
/// pass.
const IN_STEP_WAIT: Duration = Duration::from_secs(10);

/// The most keys a spare may hold to be removed: past it, what it holds is not read, and it
/// stays.
const MAX_SPARE_KEYS: usize = 4_000_000;

/// Deletes every key the spare at `addr` holds from the servers `others`.
fn forget(addr: SocketAddr, others: &[SocketAddr], wait: Duration) -> Result<(), String> {
    let long = wait.max(Duration::from_secs(30));
    let keys = memcached::keys(addr, long, MAX_SPARE_KEYS)
        .map_err(|e| format!("the keys of spare {addr} could not be read: {e}"))?
        .ok_or_else(|| format!("spare {addr} holds over {MAX_SPARE_KEYS} keys: it stays"))?;
    let done = at_once(others.len(), |i| {
        memcached::delete_keys(others[i], &keys, long)
    });
    for (o, d) in others.iter().zip(done) {
        match d {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(format!("deleting spare {addr}'s keys at {o}: {e}")),
            Err(_) => return Err(format!("deleting spare {addr}'s keys at {o} failed")),
        }
    }
    Ok(())
}

/// Notes a change, and starts the readings again.
fn changed(f: &mut super::Fleet, what: String) {
    tracing::info!("scale: {what}");
    let st = &mut f.scale;
    st.last_change = Some((Instant::now(), what));
    (st.high, st.low, st.uneven, st.calm) = (0, 0, 0, 0);
}

/// The pool's typical weight: the most common of the file's servers' (the least of them on
/// a tie), given to a spare.
fn typical_weight(servers: &[ServerSpec]) -> u32 {
    let mut counts: HashMap<u32, usize> = HashMap::new();
    for s in servers {
        *counts.entry(s.weight).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by_key(|&(w, n)| (n, std::cmp::Reverse(w)))
        .map_or(1, |(w, _)| w.max(1))
}

/// What the weights call for.
#[derive(Debug, Clone, PartialEq)]
enum Weighing {
    /// Nothing: no weights moved, or every load within its band.
    Even,
    /// A server off its share: the weights, by position in the pool, halfway to evening it.
    Uneven(Vec<(usize, u32)>),
    /// Weights are moved, and the load would be even under the servers' own weights.
    Calm,
}

/// Judges the weights from the servers read: `(position, load, weight, own weight)`.
fn weighing(settings: &Scale, read: &[(usize, f64, u32, u32)], total: f64) -> Weighing {
    let Some((lo, hi)) = settings.weights else {
        return Weighing::Even;
    };
    if total <= 0.0 || read.len() < 2 {
        return Weighing::Even;
    }
    let band = settings.weight_band;
    // Weights moved are in hundredths of the servers' own: each server's weight as a factor
    // of its own.
    let moved = read.iter().any(|r| r.2 != r.3);
    let unit = if moved { f64::from(UNIT) } else { 1.0 };
    let factor: Vec<f64> = read
        .iter()
        .map(|r| f64::from(r.2) / (f64::from(r.3.max(1)) * unit))
        .collect();
    let own = |r: &(usize, f64, u32, u32)| f64::from(r.3.max(1));
    let sum_own: f64 = read.iter().map(own).sum();
    let sum_now: f64 = read.iter().zip(&factor).map(|(r, f)| own(r) * f).sum();
    // Each server's load over its share of the ring now (its keys' density), and the mean
    // of those weighed by own weights: under its own weight a server would take
    // `density / mean` times its share.
    let density: Vec<f64> = read
        .iter()
        .zip(&factor)
        .map(|(r, f)| (r.1 / total) / (own(r) * f / sum_now))
        .collect();
    let mean = read
        .iter()
        .zip(&density)
        .map(|(r, d)| d * own(r))
        .sum::<f64>()
        / sum_own;
    let off = |q: f64| q > 1.0 + band || q < 1.0 - band;
    if moved && mean > 0.0 && !density.iter().any(|d| off(d / mean)) {
        return Weighing::Calm;
    }
    let uneven = read.iter().any(|r| off((r.1 / total) / (own(r) / sum_own)));
    if !uneven || mean <= 0.0 {
        return Weighing::Even;
    }
    let target = read
        .iter()
        .zip(density.iter().zip(&factor))
        .map(|(r, (d, now))| {
            // The factor at which this server's keys would take its share of the load, and
            // halfway (geometrically) to it from where it is.
            let even = mean / d.max(mean * 1e-3);
            let f = (now * even).sqrt().clamp(lo, hi);
            (r.0, ((own(r) * f64::from(UNIT) * f).round() as u32).max(1))
        })
        .collect();
    Weighing::Uneven(target)
}

/// A server's count of `signal`, read from its `stats`.
fn read(addr: SocketAddr, signal: Signal, wait: Duration) -> Result<Reading, String> {
    let fields = memcached::stats(addr, wait).map_err(|e| e.to_string())?;
    let at = Instant::now();
    let get = |name: &str| {
        fields
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.parse::<u64>().ok())
    };
    let count = match signal {
        Signal::Requests => REQUEST_FIELDS
            .iter()
            .filter_map(|f| get(f))
            .fold(0u64, u64::saturating_add),
        Signal::Bytes => get("bytes_read")
            .unwrap_or(0)
            .saturating_add(get("bytes_written").unwrap_or(0)),
    };
    let pid = get("pid").ok_or("its stats have no pid")?;
    Ok(Reading { at, count, pid })
}

/// The `scale` part of the controller's status.
pub(super) fn status(settings: Option<&Scale>, s: &Status, servers: &[ServerSpec]) -> Value {
    let Some(settings) = settings else {
        return Value::Null;
    };
    let finite = |v: f64| v.is_finite().then_some(v);
    json!({
        "interval_ms": settings.interval.as_millis() as u64,
        "signal": settings.signal.name(),
        "sustain": settings.sustain,
        "weights": settings.weights.map(|(lo, hi)| [lo, hi]),
        "weight_band": settings.weight_band,
        "add_above": finite(settings.add_above),
        "remove_below": settings.remove_below,
        "spares": settings.spares.iter().map(|a| json!({
            "addr": a.to_string(),
            "in_pool": servers.iter().any(|s| s.addr == *a),
        })).collect::<Vec<_>>(),
        "readings": s.readings,
        "read_failures": s.read_failures,
        "per_server": s.per_server,
        "loads": s.loads.iter().map(|(n, l, w)| json!({"server": n, "load": l, "weight": w})).collect::<Vec<_>>(),
        "weight_changes": s.weight_changes,
        "weights_restored": s.weights_restored,
        "added": s.added,
        "removed": s.removed,
        "last_change": s.last_change.as_ref().map(|(_, w)| w),
        "last_change_ms_ago": s.last_change.as_ref().map(|(t, _)| t.elapsed().as_secs_f64() * 1e3),
        "last_error": s.last_error,
    })
}

/// The scaler's metrics.
pub(super) fn metrics(s: &Status, m: &mut api::metrics::Exposition) {
    use api::metrics::Kind;
    m.single(
        "kvswitch_controller_scale_load_per_server",
        Kind::Gauge,
        "The pool's mean load per server in the last reading (the signal's unit a second).",
        s.per_server,
    );
    m.family(
        "kvswitch_controller_scale_changes_total",
        Kind::Counter,
        "Changes the scaler made to the pool, by kind.",
    );
    for (kind, n) in [
        ("weights", s.weight_changes),
        ("weights_restored", s.weights_restored),
        ("spare_added", s.added),
        ("spare_removed", s.removed),
    ] {
        m.sample(
            "kvswitch_controller_scale_changes_total",
            &[("kind", kind)],
            n,
        );
    }
    m.single(
        "kvswitch_controller_scale_read_failures_total",
        Kind::Counter,
        "Servers' stats the scaler could not read.",
        s.read_failures,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(weights: Option<(f64, f64)>) -> Scale {
        Scale {
            interval: Duration::from_secs(1),
            signal: Signal::Requests,
            sustain: 3,
            weights,
            weight_band: 0.2,
            spares: Vec::new(),
            add_above: f64::INFINITY,
            remove_below: 0.0,
            warm_up: None,
        }
    }

    #[test]
    fn a_hot_server_loses_weight_within_its_bound_and_gets_it_back_when_the_load_is_even() {
        let s = settings(Some((0.5, 2.0)));
        // Even: nothing moves.
        let even = [(0, 100.0, 1, 1), (1, 100.0, 1, 1), (2, 100.0, 1, 1)];
        assert_eq!(weighing(&s, &even, 300.0), Weighing::Even);
        // Server 0 takes twice its share: its weight goes down, halfway (geometrically) to the
        // weight that would even the load, the others' up.
        let hot = [(0, 200.0, 1, 1), (1, 100.0, 1, 1), (2, 100.0, 1, 1)];
        let Weighing::Uneven(w) = weighing(&s, &hot, 400.0) else {
            panic!("uneven")
        };
        assert!(w[0].1 < 100 && w[0].1 >= 50, "{w:?}");
        assert!(w[1].1 > 100 && w[2].1 == w[1].1, "{w:?}");
        // Far hotter, and staying so: step by step no lower than half its own weight.
        let mut weights = [1, 1, 1];
        for _ in 0..10 {
            let hotter = [
                (0, 5000.0, weights[0], 1),
                (1, 100.0, weights[1], 1),
                (2, 100.0, weights[2], 1),
            ];
            if let Weighing::Uneven(w) = weighing(&s, &hotter, 5200.0) {
                weights = [w[0].1, w[1].1, w[2].1];
            }
        }
        assert_eq!(weights[0], 50, "{weights:?}");
        assert!(weights[1] > 100 && weights[1] <= 200, "{weights:?}");
        // The skew lasts: the moved weights even the load, so they stay.
        let held = [(0, 100.0, 60, 1), (1, 100.0, 120, 1), (2, 100.0, 120, 1)];
        assert_eq!(weighing(&s, &held, 300.0), Weighing::Even);
        // It ended: the load follows the moved weights, so under the servers' own it would be
        // even; they are put back.
        let ended = [(0, 60.0, 60, 1), (1, 120.0, 120, 1), (2, 120.0, 120, 1)];
        assert_eq!(weighing(&s, &ended, 300.0), Weighing::Calm);
        // Without weights in [scale], nothing is judged.
        assert_eq!(weighing(&settings(None), &hot, 400.0), Weighing::Even);
    }

    #[test]
    fn a_spare_takes_the_pool_s_most_common_weight() {
        let spec = |w: u32| ServerSpec {
            host: "127.0.0.1".into(),
            addr: "127.0.0.1:1".parse().unwrap(),
            weight: w,
            name: None,
        };
        assert_eq!(typical_weight(&[spec(2), spec(3), spec(3)]), 3);
        assert_eq!(typical_weight(&[spec(2), spec(3)]), 2);
        assert_eq!(typical_weight(&[]), 1);
    }
}
