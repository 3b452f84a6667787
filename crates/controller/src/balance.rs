//! Consistent hashing with bounded loads across the fleet (`bounded_loads`): every interval the
//! balancer reads the requests each switch counted on each arc of the pool's ketama ring
//! (`GET /api/v1/pool/arcs`), adds them up, and when a server took more than `1 + ε` times its
//! share (or than the heaviest arc alone, when that is more; and a little more, so that a
//! placement within the bound is left alone), places the arcs again with [`kv::bounded::bounded_owners`] and gives every switch the placement
//! (`PUT /api/v1/pool/placement`). A switch that restarted, or holds another placement, is given
//! the one in force. A change of the pool's servers gives a new ring, on which the placement
//! still moves the arcs whose points and servers are still there (the switches apply it so
//! themselves), until a round finds a server past its bound and places the arcs again.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kv::bounded::{
    bounded_owners, moves_of, owners_with_moves, reachable, server_loads, worth_placing, HYSTERESIS,
};
use kv::route::{Distribution, Server};
use serde::Deserialize;
use serde_json::{json, Value};

use super::sync::SWITCH_WAIT;
use super::{at_once, Shared, CAMPAIGN_INTERVAL};

/// What the balancer did, for the status and the metrics.
#[derive(Debug, Default, Clone)]
pub(super) struct Status {
    pub rounds: u64,
    /// Placements computed and given to the switches.
    pub placements: u64,
    /// Arcs given to a server other than their ketama owner by the placement in force.
    pub moved: usize,
    /// The last interval's requests, and the most loaded server's load over its share
    /// under the placement the switches had and the one they were given.
    pub requests: u64,
    pub max_over_share: f64,
    pub placed_max_over_share: Option<f64>,
    /// Each server's share of the last interval's requests, by ring name.
    pub shares: Vec<(String, f64)>,
    pub last_placed: Option<Instant>,
    pub last_error: Option<String>,
}

/// One switch's `GET /api/v1/pool/arcs`.
#[derive(Deserialize, Clone)]
struct Arcs {
    servers: Vec<String>,
    weights: Vec<u32>,
    points: usize,
    values: Vec<u32>,
    counts: Vec<u64>,
    owners: Vec<u32>,
}

/// The placement in force: each moved arc's point value and the ring name of its server. Kept
/// when the ring changes, as the switches keep it: it applies where its points and servers
/// still are.
type Intended = Vec<(u32, String)>;

/// The balancer's loop: runs while the controller lives, acts while it leads.
pub(super) fn balance(shared: &Shared) {
    let mut seen: Vec<Option<Arcs>> = Vec::new();
    let mut intended: Option<Intended> = None;
    while !shared.stop.load(std::sync::atomic::Ordering::Relaxed) {
        let (acting, settings) = {
            let f = shared.fleet();
            (f.acting(), f.file.balance)
        };
        let Some(settings) = settings else { return };
        if !acting {
            // Another controller leads: what it places is in force, not what this one last did.
            seen.clear();
            intended = None;
            std::thread::sleep(CAMPAIGN_INTERVAL);
            continue;
        }
        sleep_unless_stopped(shared, settings.interval);
        if !shared.fleet().acting() {
            continue;
        }
        let outcome = round(shared, &settings, &mut seen, &mut intended);
        let mut f = shared.fleet();
        f.balance.rounds += 1;
        match outcome {
            Ok(()) => f.balance.last_error = None,
            Err(e) => {
                let e = format!("{e:#}");
                if f.balance.last_error.as_ref() != Some(&e) {
                    tracing::warn!("bounded loads: {e}");
                }
                f.balance.last_error = Some(e);
            }
        }
    }
}

pub(super) fn sleep_unless_stopped(shared: &Shared, d: Duration) {
    let until = Instant::now() + d;
    while !shared.stop.load(std::sync::atomic::Ordering::Relaxed) {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(100)));
    }
}

/// One interval: read, add up, judge, place.
fn round(
    shared: &Shared,
    settings: &config::controller::Balance,
    seen: &mut Vec<Option<Arcs>>,
    intended: &mut Option<Intended>,
) -> anyhow::Result<()> {
    let (switches, pool, hash) = {
        let f = shared.fleet();
        (
            f.file.switches.clone(),
            f.file.pool.name.clone(),
            f.file.pool.hash,
        )
    };
    seen.resize(switches.len(), None);
    let path = format!("/api/v1/pool/arcs?pool={pool}");
    let read = at_once(switches.len(), |i| {
        let c = shared
            .switch_client(switches[i].api)
            .with_limit(SWITCH_WAIT);
        let v = c.call("GET", &path, None)?;
        let arcs: Arcs = serde_json::from_value(v).context("reading its arcs")?;
        if arcs.counts.len() != arcs.points
            || arcs.owners.len() != arcs.points
            || arcs.values.len() != arcs.points
            || arcs.weights.len() != arcs.servers.len()
        {
            bail!("its arcs do not match its ring's {} points", arcs.points);
        }
        Ok::<_, anyhow::Error>(arcs)
    });
    let mut now: Vec<Option<Arcs>> = Vec::with_capacity(switches.len());
    let mut unread = Vec::new();
    for (sw, r) in switches.iter().zip(read) {
        match r {
            Ok(Ok(a)) => now.push(Some(a)),
            Ok(Err(e)) => {
                unread.push(format!("{}: {e:#}", sw.name));
                now.push(None);
            }
            Err(_) => {
                unread.push(format!("{}: reading it failed", sw.name));
                now.push(None);
            }
        }
    }
    let Some(first) = now.iter().flatten().next().cloned() else {
        *seen = now;
        bail!("no switch's arcs could be read ({})", unread.join("; "));
    };
    if now
        .iter()
        .flatten()
        .any(|a| a.servers != first.servers || a.values != first.values)
    {
        *seen = now;
        bail!("the switches' rings differ (a pool change is under way): nothing placed");
    }
    // This interval's requests on each arc, from every switch: what it counted since the last
    // read of the same ring (all it counted, when it restarted or the ring is new to it).
    let mut loads = vec![0u64; first.points];
    for (a, before) in now.iter().zip(seen.iter()) {
        let Some(a) = a else { continue };
        let base = before
            .as_ref()
            .filter(|b| b.servers == a.servers && b.values == a.values)
            .filter(|b| b.counts.iter().zip(&a.counts).all(|(x, y)| x <= y));
        for (k, &c) in a.counts.iter().enumerate() {
            loads[k] = loads[k].saturating_add(c - base.map_or(0, |b| b.counts[k]));
        }
    }
    *seen = now.clone();
    let ring_servers: Vec<Server> = first
        .servers
        .iter()
        .zip(&first.weights)
        .map(|(n, &w)| Server::new(n.clone(), w))
        .collect();
    let ring = kv::Ring::new(Distribution::Ketama, hash, &ring_servers)?;
    if !ring
        .points()
        .map(|(v, _)| v)
        .eq(first.values.iter().copied())
    {
        bail!(
            "the switches' ring ({} points) is not the one their servers and weights make: \
             is the pool the same?",
            first.points,
        );
    }
    // A controller that starts, or takes the lead, carries on with the placement most switches
    // hold.
    if intended.is_none() {
        let mut held: Vec<(&Vec<u32>, usize)> = Vec::new();
        for a in now.iter().flatten() {
            match held.iter_mut().find(|(o, _)| **o == a.owners) {
                Some((_, n)) => *n += 1,
                None => held.push((&a.owners, 1)),
            }
        }
        if held.len() > 1 {
            let most = held.iter().map(|(_, n)| *n).max().unwrap_or(0);
            if let Some((owners, _)) = held.iter().find(|(_, n)| *n == most) {
                *intended = Some(moves_of(&ring, &first.servers, owners));
            }
        }
    }
    let requests = loads.iter().fold(0u64, |a, &l| a.saturating_add(l));
    let over =
        |owners: &[u32]| over_share(&server_loads(ring.len(), owners, &loads), &first.weights);
    let in_force = over(&first.owners);
    {
        let mut f = shared.fleet();
        f.balance.requests = requests;
        if requests > 0 {
            f.balance.max_over_share = in_force;
            let per = server_loads(ring.len(), &first.owners, &loads);
            f.balance.shares = first
                .servers
                .iter()
                .zip(per)
                .map(|(n, l)| (n.clone(), l as f64 / requests as f64))
                .collect();
        }
    }
    let judged = requests >= settings.min_requests.max(1);
    let bound = reachable(&loads, &first.weights, ring.len(), settings.epsilon);
    if judged && in_force > bound + HYSTERESIS {
        let owners = bounded_owners(&ring, &loads, &first.weights, settings.epsilon);
        let after = over(&owners);
        // Past what is reachable (one hot arc alone may be past 1 + ε), and better by enough to
        // be worth its moves: a steady load is not placed again at every interval.
        if worth_placing(in_force, after, bound) {
            *intended = Some(moves_of(&ring, &first.servers, &owners));
            let mut f = shared.fleet();
            f.balance.placements += 1;
            f.balance.placed_max_over_share = Some(after);
            f.balance.last_placed = Some(Instant::now());
            tracing::info!(
                requests,
                before = in_force,
                after,
                "bounded loads: the arcs placed again"
            );
        }
    }
    // Every switch that reads the ring the placement is for, and has other owners, is given it.
    let Some(plan) = intended.as_ref() else {
        return match unread.is_empty() {
            true => Ok(()),
            false => bail!("{}", unread.join("; ")),
        };
    };
    let owners = owners_with_moves(&ring, &first.servers, plan);
    let moves = moves_of(&ring, &first.servers, &owners);
    shared.fleet().balance.moved = moves.len();
    let body = json!({
        "pool": pool,
        "servers": first.servers,
        "points": first.points,
        "moves": moves,
    });
    let given = at_once(switches.len(), |i| {
        let Some(a) = &now[i] else { return Ok(()) };
        if a.owners == owners {
            return Ok(());
        }
        let c = shared
            .switch_client(switches[i].api)
            .with_limit(SWITCH_WAIT);
        c.call("PUT", "/api/v1/pool/placement", Some(&body))
            .map(drop)
            .with_context(|| format!("{}: giving it the placement", switches[i].name))
    });
    for g in given {
        match g {
            Ok(Err(e)) => unread.push(format!("{e:#}")),
            Err(_) => unread.push("giving a switch the placement failed".into()),
            Ok(Ok(())) => {}
        }
    }
    match unread.is_empty() {
        true => Ok(()),
        false => bail!("{}", unread.join("; ")),
    }
}

/// The most loaded server's load over its share of the total (by weight); 0 with no load.
fn over_share(loads: &[u64], weights: &[u32]) -> f64 {
    let total = loads.iter().fold(0u64, |a, &l| a.saturating_add(l));
    let all: u64 = weights.iter().map(|&w| u64::from(w.max(1))).sum();
    if total == 0 || all == 0 {
        return 0.0;
    }
    loads
        .iter()
        .zip(weights)
        .map(|(&l, &w)| l as f64 / (total as f64 * f64::from(w.max(1)) / all as f64))
        .fold(0.0, f64::max)
}

/// The `balance` part of the controller's status.
pub(super) fn status(settings: Option<config::controller::Balance>, s: &Status) -> Value {
    let Some(settings) = settings else {
        return Value::Null;
    };
    json!({
        "epsilon": settings.epsilon,
        "interval_ms": settings.interval.as_millis() as u64,
        "rounds": s.rounds,
        "placements": s.placements,
        "moved_arcs": s.moved,
        "last_requests": s.requests,
        "max_over_share": s.max_over_share,
        "placed_max_over_share": s.placed_max_over_share,
        "shares": s.shares.iter().map(|(n, v)| json!({"server": n, "share": v})).collect::<Vec<_>>(),
        "last_placed_ms_ago": s.last_placed.map(|t| t.elapsed().as_secs_f64() * 1e3),
        "last_error": s.last_error,
    })
}

/// The balancer's metrics.
pub(super) fn metrics(s: &Status, m: &mut api::metrics::Exposition) {
    use api::metrics::Kind;
    m.single(
        "kvswitch_controller_balance_placements_total",
        Kind::Counter,
        "Placements of the ring's arcs computed with bounded loads and given to the switches.",
        s.placements,
    );
    m.single(
        "kvswitch_controller_balance_moved_arcs",
        Kind::Gauge,
        "Arcs the placement in force gives to a server other than their ketama owner.",
        s.moved as u64,
    );
    m.single(
        "kvswitch_controller_balance_max_over_share",
        Kind::Gauge,
        "The most loaded server's requests over its share, in the last interval read.",
        s.max_over_share,
    );
}

#[cfg(test)]
mod tests {
    use super::over_share;

    #[test]
    fn a_server_s_load_is_judged_against_its_weight() {
        assert_eq!(over_share(&[0, 0], &[1, 1]), 0.0);
        assert!((over_share(&[50, 50], &[1, 1]) - 1.0).abs() < 1e-9);
        assert!((over_share(&[75, 25], &[3, 1]) - 1.0).abs() < 1e-9);
        assert!((over_share(&[60, 40], &[1, 1]) - 1.2).abs() < 1e-9);
    }
}
