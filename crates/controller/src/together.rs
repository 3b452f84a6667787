//! Pool changes taken by every switch at one instant (`pool_changes = "together"`), in place
//! of a syncer per switch: each change is staged on every switch (`PUT /api/v1/pool/staged`,
//! checked there against the pool, nothing taken), then committed on every switch for one
//! wall-clock instant a little ahead (`POST /api/v1/pool/staged/commit`), so that every switch
//! routes by the old pool until that instant and by the new one from it, the UDP path, the
//! fast path and the proxy alike. A switch that refuses or does not answer stops the change:
//! before the commit nothing is taken anywhere; a commit not acknowledged by every switch
//! before the instant is cancelled on every switch (`DELETE /api/v1/pool/staged`), and a
//! switch that took it all the same has the others follow at once. The instant is three times
//! the staging's time ahead (20 ms at least), so that every commit lands before it.

use std::time::{SystemTime, UNIX_EPOCH};

use super::sync::{next_round, wait_for_change, Round, SWITCH_WAIT};
use super::*;

/// The least time between the commits' sending and the instant they name.
const MIN_LEAD: Duration = Duration::from_millis(30);
/// The most.
const MAX_LEAD: Duration = Duration::from_secs(2);

/// What the last change taken together showed.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Flip {
    /// Between the first switch and the last to take it, by their own clocks.
    pub skew: Duration,
    /// From the first staging to the last switch's acknowledgement of the instant.
    pub prepare: Duration,
    /// How far ahead the instant was.
    pub lead: Duration,
    pub taken: u64,
    pub stopped: u64,
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The pool a switch serves that the controller's is, from its `GET /api/v1/pool`.
fn their_pool(doc: &Value, pool: &str) -> anyhow::Result<Value> {
    let pools = doc["pools"].as_array().cloned().unwrap_or_default();
    match pools.iter().find(|p| p["name"] == pool) {
        Some(p) => Ok(p.clone()),
        None if pools.len() == 1 => Ok(pools[0].clone()),
        None => anyhow::bail!("the switch serves no pool named {pool:?}"),
    }
}

/// Whether the switch's pool holds `live`, no more and no less (addresses and weights).
fn matches(theirs: &Value, live: &[ServerSpec]) -> bool {
    let listed: Vec<&Value> = theirs["servers"].as_array().into_iter().flatten().collect();
    // Compared as sets, so that a pool of a thousand servers takes a thousand lookups.
    let theirs: std::collections::HashSet<(&str, &str, u64)> = listed
        .iter()
        .map(|v| {
            (
                v["label"].as_str().unwrap_or_default(),
                v["addr"].as_str().unwrap_or_default(),
                v["weight"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    listed.len() == live.len()
        && live.iter().all(|s| {
            let (label, addr) = (s.label(), s.addr.to_string());
            theirs.contains(&(label.as_str(), addr.as_str(), u64::from(s.weight)))
        })
}

/// Runs `f` for every switch at once.
fn each<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    super::at_once(n, f)
        .into_iter()
        .map(|r| r.unwrap_or_else(|p| std::panic::resume_unwind(p)))
        .collect()
}

/// Why a round ended without its change: the switch, the reason, and whether a change was
/// staged at all (not when the switches' pools could not even be read).
type Stopped = (usize, String, bool);

/// One round: every switch brought to the live servers at one instant. With `names` (each
/// switch's name of the pool, learned in an earlier round) the change is staged at once: a
/// switch that has the servers already takes nothing new. Without them every switch's pool is
/// read first, and nothing is changed if every one holds the servers. Returns when the last
/// switch took the change, by its clock, if one was taken; an error names the switch that
/// stopped it.
fn round(
    shared: &Shared,
    clients: &[(String, Client)],
    pool: &str,
    live: &[ServerSpec],
    warm: &HashMap<String, Instant>,
    cache: &mut Option<Vec<String>>,
    last_id: &mut u64,
) -> Result<Option<SystemTime>, Stopped> {
    let leads = || shared.fleet().acting();
    let call = |i: usize, method: &str, path: &str, body: Option<&Value>| {
        if !leads() {
            return Err("this controller no longer leads".to_string());
        }
        clients[i]
            .1
            .call_within(method, path, body, SWITCH_WAIT)
            .map_err(|e| format!("{e:#}"))
    };
    let first_err = |results: Vec<Result<Value, String>>| -> Result<Vec<Value>, (usize, String)> {
        let mut out = Vec::with_capacity(results.len());
        for (i, r) in results.into_iter().enumerate() {
            out.push(r.map_err(|e| (i, e))?);
        }
        Ok(out)
    };
    let n = clients.len();
    let names: Vec<String> = match cache.take() {
        Some(known) => known,
        None => {
            let pools = first_err(each(n, |i| {
                call(i, "GET", "/api/v1/pool", None)
                    .and_then(|d| their_pool(&d, pool).map_err(|e| e.to_string()))
            }))
            .map_err(|(i, e)| (i, e, false))?;
            let found: Vec<String> = pools
                .iter()
                .map(|p| p["name"].as_str().unwrap_or(pool).to_string())
                .collect();
            if pools.iter().all(|p| matches(p, live)) {
                *cache = Some(found);
                return Ok(None);
            }
            found
        }
    };
    // Ids from the clock, and always past the last: a controller that restarts or takes over
    // does not reuse one.
    let id = unix_ms(SystemTime::now()).max(*last_id + 1);
    *last_id = id;
    let servers: Vec<Value> = live
        .iter()
        .map(|s| {
            let warm_ms = warm
                .get(&s.label())
                .map(|t| t.saturating_duration_since(Instant::now()).as_millis() as u64)
                .filter(|&ms| ms > 0);
            json!({"addr": s.addr.to_string(), "host": s.host, "weight": s.weight,
                   "name": s.name, "warm_ms": warm_ms})
        })
        .collect();
    let names_kept = names.clone();
    // A call that must be answered by `by`.
    let call_by = |i: usize, method: &str, path: &str, body: Option<&Value>, by: Instant| {
        let left = by.saturating_duration_since(Instant::now());
        if left < Duration::from_millis(1) {
            return Err("no time left before the instant".to_string());
        }
        if !leads() {
            return Err("this controller no longer leads".to_string());
        }
        clients[i]
            .1
            .call_within(method, path, body, left)
            .map_err(|e| format!("{e:#}"))
    };
    let cancel = |i: usize, by: Instant| {
        let path = format!(
            "/api/v1/pool/staged?pool={}&id={id}",
            api::percent_encode(names[i].as_bytes())
        );
        let _ = call_by(i, "DELETE", &path, None, by);
    };
    // Whether switch `i` took change `id`: `None` when it does not say.
    let took = |i: usize| -> Option<Result<f64, String>> {
        let p = call(i, "GET", "/api/v1/pool", None)
            .ok()
            .and_then(|d| their_pool(&d, pool).ok())?;
        let s = &p["staged"];
        if s["id"] != id {
            return Some(Err("the change is not staged there".into()));
        }
        Some(match (s["taken_unix_ms"].as_f64(), s["failed"].as_str()) {
            (Some(t), _) => Ok(t),
            (None, Some(why)) => Err(format!("not taken: {why}")),
            (None, None) => Err("not taken".into()),
        })
    };
    let started = Instant::now();
    let staged = first_err(each(n, |i| {
        let body = json!({"id": id, "pool": names[i], "servers": servers});
        call(i, "PUT", "/api/v1/pool/staged", Some(&body))
    }));
    if let Err((i, e)) = staged {
        let by = Instant::now() + SWITCH_WAIT;
        each(n, |i| cancel(i, by));
        return Err((i, e, true));
    }
    // Two thirds of the lead for the commits to be acknowledged, the last third to cancel
    // them everywhere if one is not: no switch takes the change unless every switch has it
    // committed before the instant.
    let lead = (started.elapsed() * 3).clamp(MIN_LEAD, MAX_LEAD);
    let at = SystemTime::now() + lead;
    let instant = Instant::now() + lead;
    let commit_by = instant - lead / 3;
    let committed = first_err(each(n, |i| {
        let body = json!({"id": id, "pool": names[i], "at_unix_ms": unix_ms(at)});
        call_by(
            i,
            "POST",
            "/api/v1/pool/staged/commit",
            Some(&body),
            commit_by,
        )
    }));
    let prepare = started.elapsed();
    if let Err((i, e)) = committed {
        each(n, |k| cancel(k, instant));
        std::thread::sleep(
            instant.saturating_duration_since(Instant::now()) + Duration::from_millis(5),
        );
        // A cancel that came too late: the switch took the change, and every other one that
        // answers follows it at once (staged again, taken now), so that none stays behind.
        let outcomes = each(n, took);
        if outcomes.iter().any(|o| matches!(o, Some(Ok(_)))) {
            tracing::warn!("change {id} was taken before its cancel arrived: the others follow");
            each(n, |k| {
                if matches!(outcomes[k], Some(Err(_))) {
                    let body = json!({"id": id, "pool": names[k], "servers": servers});
                    let _ = call(k, "PUT", "/api/v1/pool/staged", Some(&body));
                    let body = json!({"id": id, "pool": names[k]});
                    let _ = call(k, "POST", "/api/v1/pool/staged/commit", Some(&body));
                }
            });
        }
        return Err((i, format!("the change stops here: {e}"), true));
    }
    std::thread::sleep(
        instant.saturating_duration_since(Instant::now()) + Duration::from_millis(2),
    );
    // Every switch says when it took it.
    let mut taken: Vec<Option<Result<f64, String>>> = Vec::new();
    for _ in 0..50 {
        taken = each(n, took);
        if taken.iter().all(|t| matches!(t, Some(Ok(_)))) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if let Some(i) = taken.iter().position(|t| !matches!(t, Some(Ok(_)))) {
        let why = match &taken[i] {
            Some(Err(e)) => e.clone(),
            _ => "does not say whether it took it".into(),
        };
        return Err((i, format!("change {id} was committed: {why}"), true));
    }
    let taken: Vec<Option<f64>> = taken.into_iter().map(|t| t.and_then(Result::ok)).collect();
    let times: Vec<f64> = taken.into_iter().flatten().collect();
    *cache = Some(names_kept);
    let skew = times.iter().copied().fold(f64::MIN, f64::max)
        - times.iter().copied().fold(f64::MAX, f64::min);
    let mut f = shared.fleet();
    f.flip = Flip {
        skew: Duration::try_from_secs_f64(skew / 1e3).unwrap_or_default(),
        prepare,
        lead,
        taken: f.flip.taken + 1,
        stopped: f.flip.stopped,
    };
    tracing::info!(
        id,
        ?lead,
        skew_ms = skew,
        "pool change taken by every switch together"
    );
    let last = times.iter().copied().fold(f64::MIN, f64::max);
    let last = Duration::try_from_secs_f64(last / 1e3)
        .ok()
        .and_then(|d| UNIX_EPOCH.checked_add(d))
        .unwrap_or_else(SystemTime::now);
    Ok(Some(last))
}

/// Brings every switch to the live servers together, on each change and every interval.
pub(crate) fn changer(shared: &Shared) {
    let mut done = 0u64;
    // Each switch's name of the pool, once read; read again after a failure and on rounds
    // that only check.
    let mut names: Option<Vec<String>> = None;
    let mut last_id = 0u64;
    while !shared.stop.load(Ordering::Relaxed) {
        let Some(Round {
            generation,
            pool,
            live,
            warm,
        }) = next_round(shared)
        else {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        let clients: Vec<(String, Client)> = shared
            .fleet()
            .file
            .switches
            .iter()
            .map(|s| (s.name.clone(), shared.switch_client(s.api)))
            .collect();
        if generation == done {
            names = None;
        }
        let outcome = round(
            shared,
            &clients,
            &pool,
            &live,
            &warm,
            &mut names,
            &mut last_id,
        );
        let mut f = shared.fleet();
        let ok = outcome.is_ok();
        match outcome {
            Ok(taken) => {
                for st in &mut f.switches {
                    st.syncs += 1;
                    st.changes += u64::from(taken.is_some());
                    st.in_step = true;
                    st.last_in_step = Some(Instant::now());
                    st.last_error = None;
                    st.generation = generation;
                }
                done = generation;
                super::sync::note_reached_at(&mut f, taken);
            }
            Err((i, e, attempted)) => {
                f.flip.stopped += u64::from(attempted);
                let name = clients[i].0.clone();
                if f.switches[i].last_error.is_none() {
                    tracing::warn!(switch = %name, "the pool change stops here: {e}");
                }
                for (k, st) in f.switches.iter_mut().enumerate() {
                    st.syncs += 1;
                    st.in_step = false;
                    if k == i {
                        st.errors += 1;
                        st.last_error = Some(e.clone());
                    }
                }
            }
        }
        wait_for_change(shared, f, generation, done, ok);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(label: &str, port: u16, weight: u32) -> ServerSpec {
        ServerSpec {
            host: "127.0.0.1".into(),
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            weight,
            name: Some(label.into()),
        }
    }

    #[test]
    fn a_switch_matches_only_with_the_same_servers_addresses_and_weights() {
        let live = [server("s1", 1, 1), server("s2", 2, 1)];
        let theirs = json!({"servers": [
            {"label": "s2", "addr": "127.0.0.1:2", "weight": 1},
            {"label": "s1", "addr": "127.0.0.1:1", "weight": 1},
        ]});
        assert!(matches(&theirs, &live));
        assert!(!matches(&theirs, &live[..1]));
        assert!(!matches(&theirs, &[server("s1", 1, 1), server("s2", 3, 1)]));
        assert!(!matches(&theirs, &[server("s1", 1, 1), server("s2", 2, 2)]));
    }
}
