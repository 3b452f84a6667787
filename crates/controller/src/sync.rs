//! Bringing each switch to the pool: the live servers (a dead one's place given to a spare
//! where the ring allows), and one switch's pool changed to them through its API.

use super::*;

/// How long one call to a switch may take before the switch counts as out of reach.
pub(crate) const SWITCH_WAIT: Duration = Duration::from_secs(2);

/// Brings one switch's pool to `live` (the servers that should be in it, with their
/// weights): a server whose place goes to another address leaves first, then adds, new
/// weights and removals. Servers are named to the switch by their position in its pool (a
/// name that is a number would be read as one). A refused call does not stop the others;
/// every refusal is reported. `leads` is asked before each call, so that a controller that
/// lost the lead stops at once. Returns the changes made.
pub(crate) fn sync_switch(
    client: &Client,
    pool: &str,
    live: &[ServerSpec],
    warm: &HashMap<String, Instant>,
    leads: &dyn Fn() -> bool,
) -> anyhow::Result<u64> {
    let doc = client.call_within("GET", "/api/v1/pool", None, SWITCH_WAIT)?;
    let pools = doc["pools"].as_array().cloned().unwrap_or_default();
    let theirs = match pools.iter().find(|p| p["name"] == pool) {
        Some(p) => p,
        None if pools.len() == 1 => &pools[0],
        None => anyhow::bail!("the switch serves no pool named {pool:?}"),
    };
    let listed: Vec<&Value> = theirs["servers"].as_array().into_iter().flatten().collect();
    // Each server by label and address, both ways, so that a pool of a thousand servers is
    // compared in a thousand lookups.
    let key_of = |v: &Value| {
        (
            v["label"].as_str().unwrap_or_default().to_string(),
            v["addr"].as_str().unwrap_or_default().to_string(),
        )
    };
    let theirs_by_key: HashMap<(String, String), &Value> =
        listed.iter().map(|v| (key_of(v), *v)).collect();
    let ours: Vec<(String, String)> = live
        .iter()
        .map(|s| (s.label(), s.addr.to_string()))
        .collect();
    let our_labels: HashMap<&str, &str> =
        ours.iter().map(|(l, a)| (l.as_str(), a.as_str())).collect();
    let ours_set: std::collections::HashSet<&(String, String)> = ours.iter().collect();
    let enc = |s: &str| api::percent_encode(s.as_bytes());
    let pool_name = theirs["name"].as_str().unwrap_or_default().to_string();
    let mut changes = 0;
    let mut refused: Vec<String> = Vec::new();
    let mut call = |method: &str, path: String, body: Option<Value>, what: String| {
        if !leads() {
            anyhow::bail!("this controller no longer leads");
        }
        match client.call_within(method, &path, body.as_ref(), SWITCH_WAIT) {
            Ok(_) => changes += 1,
            Err(e) => refused.push(format!("{what}: {e:#}")),
        }
        Ok(())
    };
    let position = |v: &Value| v["server"].as_u64().map(|p| p.to_string());
    // A server whose place goes to another address (a spare standing in, or the server back
    // from its spare) leaves first: the switch holds one server per ring name.
    let mut gone = Vec::new();
    for v in &listed {
        let label = v["label"].as_str().unwrap_or_default();
        if our_labels
            .get(label)
            .is_some_and(|addr| Some(*addr) != v["addr"].as_str())
        {
            if let Some(p) = position(v) {
                let path = format!("/api/v1/pool/servers/{p}?pool={}", enc(&pool_name));
                call("DELETE", path, None, format!("removing {label}"))?;
            }
            gone.push(label);
        }
    }
    for (s, key) in live.iter().zip(&ours) {
        match theirs_by_key.get(key) {
            None => {
                let warm_ms = warm
                    .get(&s.label())
                    .map(|t| t.saturating_duration_since(Instant::now()).as_millis() as u64)
                    .filter(|&ms| ms > 0);
                let body = json!({
                    "addr": s.addr.to_string(), "host": s.host, "weight": s.weight,
                    "name": s.name, "pool": pool_name, "warm_ms": warm_ms,
                });
                call(
                    "POST",
                    "/api/v1/pool/servers".into(),
                    Some(body),
                    format!("adding {}", s.label()),
                )?;
            }
            Some(v) if v["weight"].as_u64() != Some(u64::from(s.weight)) => {
                if let Some(p) = position(v) {
                    let body = json!({ "weight": s.weight, "pool": pool_name });
                    let path = format!("/api/v1/pool/servers/{p}");
                    call(
                        "PUT",
                        path,
                        Some(body),
                        format!("reweighting {}", s.label()),
                    )?;
                }
            }
            Some(_) => {}
        }
    }
    let gone: std::collections::HashSet<&str> = gone.into_iter().collect();
    for v in &listed {
        let label = v["label"].as_str().unwrap_or_default();
        if !ours_set.contains(&key_of(v)) && !gone.contains(label) {
            if let Some(p) = position(v) {
                let path = format!("/api/v1/pool/servers/{p}?pool={}", enc(&pool_name));
                call("DELETE", path, None, format!("removing {label}"))?;
            }
        }
    }
    match refused.is_empty() {
        true => Ok(changes),
        false => anyhow::bail!(
            "{} of its changes refused: {}",
            refused.len(),
            refused.join("; ")
        ),
    }
}

/// The servers the switches should have: those up, and in a down server's place (its ring
/// name, its weight) the failover spare standing in for it, if one is free and up. A spare
/// takes a place only where the ring would not tell it from the server: a named server, or one
/// on the spare's port.
pub(crate) fn live_servers(f: &mut Fleet) -> Vec<ServerSpec> {
    for i in 0..f.servers.len() {
        if let Some(k) = f.standing_in[i] {
            if f.health[i].up() || !f.spare_health[k].up() {
                f.standing_in[i] = None;
            }
        }
    }
    let mut live = Vec::with_capacity(f.servers.len());
    for i in 0..f.servers.len() {
        let s = &f.servers[i];
        if f.health[i].up() {
            live.push(s.clone());
            continue;
        }
        if f.standing_in[i].is_none() {
            f.standing_in[i] = (0..f.file.failover.len()).find(|&k| {
                let spare = f.file.failover[k];
                f.spare_health[k].up()
                    && !f.standing_in.contains(&Some(k))
                    && (s.name.is_some() || spare.port() == s.addr.port())
            });
        }
        if let Some(k) = f.standing_in[i] {
            live.push(ServerSpec {
                host: s.host.clone(),
                addr: f.file.failover[k],
                weight: s.weight,
                name: s.name.clone(),
            });
        }
    }
    live
}

/// Brings every switch to the live servers on each change, and every interval.
pub(crate) fn syncer(shared: &Shared, i: usize) {
    let mut done = 0u64;
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
        let switch = shared.fleet().file.switches[i].clone();
        let client = shared.switch_client(switch.api);
        let outcome = sync_switch(&client, &pool, &live, &warm, &|| shared.fleet().acting());
        let mut f = shared.fleet();
        let st = &mut f.switches[i];
        st.syncs += 1;
        let ok = outcome.is_ok();
        match outcome {
            Ok(changes) => {
                if changes > 0 {
                    tracing::info!(switch = %switch.name, changes, "switch brought in step");
                }
                st.changes += changes;
                st.in_step = true;
                st.last_in_step = Some(Instant::now());
                st.last_error = None;
                st.generation = generation;
                done = generation;
                note_reached(&mut f);
            }
            Err(e) => {
                if st.last_error.is_none() {
                    tracing::warn!(switch = %switch.name, "cannot bring the switch in step: {e:#}");
                }
                st.in_step = false;
                st.errors += 1;
                st.last_error = Some(format!("{e:#}"));
            }
        }
        wait_for_change(shared, f, generation, done, ok);
    }
}

/// What a round of bringing switches to the pool works from.
pub(crate) struct Round {
    pub generation: u64,
    pub pool: String,
    /// The servers every switch should have ([`desired`]).
    pub live: Vec<ServerSpec>,
    /// Servers warming up, by label: until when.
    pub warm: HashMap<String, Instant>,
}

/// The next round's inputs; `None` while this controller stands by, or before every server
/// has been probed once.
pub(crate) fn next_round(shared: &Shared) -> Option<Round> {
    let mut f = shared.fleet();
    let probed = f.health.iter().chain(&f.spare_health).all(|h| h.known());
    if !f.acting() || !probed {
        return None;
    }
    let live = desired(&mut f);
    let now = Instant::now();
    f.warm_until.retain(|_, t| *t > now);
    Some(Round {
        generation: f.generation,
        pool: f.file.pool.name.clone(),
        live,
        warm: f.warm_until.clone(),
    })
}

/// After a round that brought the switches to `generation` (`ok`), or failed: waits for the
/// next change, or the sync interval; a failure is retried soon.
pub(crate) fn wait_for_change(
    shared: &Shared,
    f: MutexGuard<'_, Fleet>,
    generation: u64,
    done: u64,
    ok: bool,
) {
    let wait = match ok {
        true => f.file.sync_interval,
        false => f.file.sync_interval.min(Duration::from_millis(200)),
    };
    if f.generation == done || !ok {
        let (g, _) = shared
            .changed
            .wait_timeout_while(f, wait, |f| {
                f.generation == generation && !shared.stop.load(Ordering::Relaxed)
            })
            .unwrap_or_else(|p| p.into_inner());
        drop(g);
    }
}

/// Records when the last change has reached every switch.
pub(crate) fn note_reached(f: &mut Fleet) {
    note_reached_at(f, None);
}

/// As [`note_reached`]; with `taken`, the wall-clock instant the last switch took the change
/// (a change taken together: the switches' own reports), else now.
pub(crate) fn note_reached_at(f: &mut Fleet, taken: Option<std::time::SystemTime>) {
    let Some(spread) = &mut f.spread else {
        return;
    };
    if spread.reached.is_some() || f.switches.iter().any(|s| s.generation < spread.generation) {
        return;
    }
    spread.reached = Some(match taken {
        Some(t) => t.duration_since(spread.at_wall).unwrap_or_default(),
        None => spread.at.elapsed(),
    });
    f.last_spread = f.spread;
}

/// The servers every switch should have now ([`live_servers`]), but never none: when every
/// server fails its probes, the controller is more likely cut off than the servers all dead,
/// and an empty ring answers no one, so the switches keep every server (and their own
/// failure handling).
pub(crate) fn desired(f: &mut Fleet) -> Vec<ServerSpec> {
    let live = live_servers(f);
    if !live.is_empty() || f.servers.is_empty() {
        f.all_down_said = false;
        return live;
    }
    if !f.all_down_said {
        tracing::warn!("every server fails its probes: keeping them all in the switches' pools");
        f.all_down_said = true;
    }
    f.servers.clone()
}
