//! Pool changes staged by a controller and taken by every switch at one instant: `PUT
//! /api/v1/pool/staged` checks a whole server list against the pool and keeps it without
//! taking it; `POST /api/v1/pool/staged/commit` takes it at a wall-clock instant (or at once);
//! `DELETE /api/v1/pool/staged` drops it, if it has not been taken. A controller stages a
//! change on every switch, commits it on all for one instant a little ahead, and cancels it
//! everywhere if any switch refuses or does not answer before that instant, so that either
//! every switch takes the new pool at that instant or none does.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::*;
use switch::pool::ServerSpec;

/// The furthest ahead a commit may be scheduled.
const MAX_AHEAD: Duration = Duration::from_secs(10);

/// One pool's staged change.
#[derive(Clone, Debug)]
pub(super) struct Staged {
    id: u64,
    servers: Vec<ServerSpec>,
    warm: Vec<Option<Duration>>,
    /// When it is to be taken, once committed.
    at: Option<SystemTime>,
    /// When it was taken, and the pool's version then.
    taken: Option<(SystemTime, u64)>,
    /// Why taking it failed, if it did.
    failed: Option<String>,
}

/// The staged changes, by pool name.
#[derive(Default)]
pub(super) struct StagedChanges(Mutex<BTreeMap<String, Staged>>);

impl StagedChanges {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Staged>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What `GET /api/v1/pool` shows of pool `name`'s staged change.
    pub(super) fn doc(&self, name: &str) -> Value {
        match self.lock().get(name) {
            None => Value::Null,
            Some(s) => json!({
                "id": s.id,
                "servers": s.servers.iter().map(ServerSpec::label).collect::<Vec<_>>(),
                "at_unix_ms": s.at.map(unix_ms),
                "taken_unix_ms": s.taken.map(|(t, _)| unix_ms(t)),
                "taken_version": s.taken.map(|(_, v)| v),
                "failed": s.failed,
            }),
        }
    }
}

fn unix_ms(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Stage {
    id: u64,
    pool: Option<String>,
    servers: Vec<NewServer>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Commit {
    id: u64,
    pool: Option<String>,
    /// Milliseconds since the Unix epoch; at once when absent or past.
    at_unix_ms: Option<u64>,
}

fn invalid(field: &str, e: impl Into<String>) -> ApiFailure {
    ControlError::new(ErrorKind::Invalid, field, e.into()).into()
}

fn conflict(field: &str, e: impl Into<String>) -> ApiFailure {
    ControlError::new(ErrorKind::Conflict, field, e.into()).into()
}

/// `PUT /api/v1/pool/staged`.
pub(super) async fn stage(State(api): State<Shared>, bytes: Bytes) -> Reply {
    let s: Stage = body(&bytes)?;
    let pool = pool_named(&api, s.pool.as_deref())?;
    if s.servers.is_empty() {
        return Err(invalid("servers", "a pool needs a server"));
    }
    let mut warm = Vec::with_capacity(s.servers.len());
    let mut servers = Vec::with_capacity(s.servers.len());
    for (k, n) in s.servers.into_iter().enumerate() {
        warm.push(
            n.warm()
                .map_err(|e| invalid(&format!("servers[{k}].warm_ms"), e))?,
        );
        servers.push(n.spec());
    }
    pool.check_servers(&servers).map_err(pool_failure)?;
    let name = pool.spec().name.clone();
    let mut staged = api.staged.lock();
    if let Some(old) = staged.get(&name) {
        if old.at.is_some() && old.taken.is_none() && old.failed.is_none() {
            return Err(conflict(
                "id",
                format!("change {} is committed and not taken yet", old.id),
            ));
        }
    }
    staged.insert(
        name,
        Staged {
            id: s.id,
            servers,
            warm,
            at: None,
            taken: None,
            failed: None,
        },
    );
    ok(json!({ "id": s.id, "staged": true }))
}

/// Takes pool `name`'s staged change `id` now, if it is still staged and not taken.
fn take(api: &Api, staged: &StagedChanges, name: &str, id: u64) {
    let Ok(pool) = pool_named(api, Some(name)) else {
        return;
    };
    let mut all = staged.lock();
    let Some(s) = all.get_mut(name) else {
        return;
    };
    // Only a change still committed: one cancelled, staged again or taken is left alone.
    if s.id != id || s.at.is_none() || s.taken.is_some() || s.failed.is_some() {
        return;
    }
    let now = kvio::clock::now();
    let until: Vec<Option<kv::Instant>> = s.warm.iter().map(|w| w.map(|w| now + w)).collect();
    match pool.set_servers_warming(&s.servers, &until) {
        Ok(version) => {
            s.taken = Some((SystemTime::now(), version));
            drop(all);
            grow_caches(&pool, name, &api.exporter.caches());
            tracing::info!(pool = %name, id, version, "staged pool change taken");
        }
        Err(e) => {
            tracing::warn!(pool = %name, id, "staged pool change not taken: {e}");
            s.failed = Some(e.to_string());
        }
    }
}

/// `POST /api/v1/pool/staged/commit`.
pub(super) async fn commit(State(api): State<Shared>, bytes: Bytes) -> Reply {
    let c: Commit = body(&bytes)?;
    let pool = pool_named(&api, c.pool.as_deref())?;
    let name = pool.spec().name.clone();
    let at = c
        .at_unix_ms
        .map(|ms| UNIX_EPOCH + Duration::from_millis(ms));
    let wait = at.and_then(|t| t.duration_since(SystemTime::now()).ok());
    if wait.is_some_and(|w| w > MAX_AHEAD) {
        return Err(invalid(
            "at_unix_ms",
            format!("more than {MAX_AHEAD:?} ahead"),
        ));
    }
    {
        let mut all = api.staged.lock();
        let Some(s) = all.get_mut(&name) else {
            return Err(conflict(
                "id",
                format!("no change is staged for pool {name}"),
            ));
        };
        if s.id != c.id {
            return Err(conflict(
                "id",
                format!("change {} is staged, not {}", s.id, c.id),
            ));
        }
        if s.taken.is_some() {
            return ok(json!({ "id": c.id, "taken": true }));
        }
        s.at = Some(at.unwrap_or_else(SystemTime::now));
    }
    match wait {
        None => take(&api, &api.staged, &name, c.id),
        Some(w) => {
            let served = api.clone();
            tokio::spawn(async move {
                tokio::time::sleep(w).await;
                take(&served, &served.staged, &name, c.id);
            });
        }
    }
    ok(json!({ "id": c.id, "at_unix_ms": at.map(unix_ms) }))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct CancelQuery {
    pool: Option<String>,
    /// Only this change: a cancel meant for an earlier one leaves a later one alone.
    id: Option<u64>,
}

/// `DELETE /api/v1/pool/staged`: drops the staged change unless it was taken.
pub(super) async fn cancel(State(api): State<Shared>, RawQuery(query): RawQuery) -> Reply {
    let which: CancelQuery = query_args(query.as_deref().unwrap_or(""))?;
    let pool = pool_named(&api, which.pool.as_deref())?;
    let name = pool.spec().name.clone();
    let mut all = api.staged.lock();
    match all.get(&name) {
        Some(s) if which.id.is_some_and(|id| id != s.id) => {
            ok(json!({ "cancelled": false, "staged": s.id }))
        }
        Some(s) if s.taken.is_some() => {
            Err(conflict("id", format!("change {} was taken already", s.id)))
        }
        Some(_) => {
            all.remove(&name);
            ok(json!({ "cancelled": true }))
        }
        None => ok(json!({ "cancelled": false })),
    }
}
