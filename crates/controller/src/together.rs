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
const MIN_LEAD: Duration = Duration::from_millis(20);
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
    listed.len() == live.len()
        && live.iter().all(|s| {
            listed.iter().any(|v| {
                v["label"].as_str() == Some(s.label().as_str())
                    && v["addr"].as_str() == Some(s.addr.to_string().as_str())
                    && v["weight"].as_u64() == Some(u64::from(s.weight))
            })
        })
}

/// Runs `f` for every switch at once.
fn each<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    super::at_once(n, f)
        .into_iter()
        .map(|r| r.unwrap_or_else(|p| std::panic::resume_unwind(p)))
        .collect()
}

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
) -> Result<Option<SystemTime>, (usize, String)> {
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
            }))?;
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
    // Ids from the clock: a controller that restarts or takes over never reuses one.
    let id = unix_ms(SystemTime::now());
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
    let cancel_all = || {
        each(n, |i| {
            let path = format!(
                "/api/v1/pool/staged?pool={}",
                api::percent_encode(names[i].as_bytes())
            );
            let _ = call(i, "DELETE", &path, None);
        });
    };
    let started = Instant::now();
    let staged = first_err(each(n, |i| {
        let body = json!({"id": id, "pool": names[i], "servers": servers});
        call(i, "PUT", "/api/v1/pool/staged", Some(&body))
    }));
    if let Err(e) = staged {
        cancel_all();
        return Err(e);
    }
    let lead = started.elapsed().mul_f64(1.5).clamp(MIN_LEAD, MAX_LEAD);
    let at = SystemTime::now() + lead;
    let deadline = Instant::now() + lead;
    let committed = each(n, |i| {
        let body = json!({"id": id, "pool": names[i], "at_unix_ms": unix_ms(at)});
        let r = call(i, "POST", "/api/v1/pool/staged/commit", Some(&body));
        match r {
            Ok(_) if Instant::now() >= deadline => {
                Err("acknowledged the instant only after it".to_string())
            }
            r => r,
        }
    });
    let prepare = started.elapsed();
    if let Err((i, e)) = first_err(committed) {
        cancel_all();
        // A switch that took it before the cancel arrived: the others follow it at once.
        let took = each(n, |k| {
            call(k, "GET", "/api/v1/pool", None)
                .ok()
                .and_then(|d| their_pool(&d, pool).ok())
                .is_some_and(|p| {
                    p["staged"]["id"] == id && p["staged"]["taken_unix_ms"].is_number()
                })
        });
        if took.iter().any(|&t| t) {
            tracing::warn!("a switch took change {id} before it was cancelled: the others follow");
            each(n, |k| {
                if !took[k] {
                    let body = json!({"id": id, "pool": names[k]});
                    let _ = call(k, "POST", "/api/v1/pool/staged/commit", Some(&body));
                }
            });
        }
        return Err((i, e));
    }
    std::thread::sleep(lead.saturating_sub(prepare) + Duration::from_millis(2));
    // Every switch says when it took it.
    let mut taken = Vec::with_capacity(n);
    for _ in 0..50 {
        taken = each(n, |i| {
            call(i, "GET", "/api/v1/pool", None)
                .ok()
                .and_then(|d| their_pool(&d, pool).ok())
                .filter(|p| p["staged"]["id"] == id)
                .and_then(|p| p["staged"]["taken_unix_ms"].as_f64())
        });
        if taken.iter().all(Option::is_some) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if let Some(i) = taken.iter().position(Option::is_none) {
        return Err((i, format!("change {id} was committed but not taken")));
    }
    let times: Vec<f64> = taken.into_iter().flatten().collect();
    *cache = Some(names_kept);
    let skew = times.iter().copied().fold(f64::MIN, f64::max)
        - times.iter().copied().fold(f64::MAX, f64::min);
    let mut f = shared.fleet();
    f.flip = Flip {
        skew: Duration::from_secs_f64(skew.max(0.0) / 1e3),
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
    Ok(Some(
        UNIX_EPOCH + Duration::from_secs_f64(last.max(0.0) / 1e3),
    ))
}

/// Brings every switch to the live servers together, on each change and every interval.
pub(crate) fn changer(shared: &Shared) {
    let mut done = 0u64;
    // Each switch's name of the pool, once read; read again after a failure and on rounds
    // that only check.
    let mut names: Option<Vec<String>> = None;
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
        let outcome = round(shared, &clients, &pool, &live, &warm, &mut names);
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
            Err((i, e)) => {
                f.flip.stopped += 1;
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
