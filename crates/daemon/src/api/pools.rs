//! Run-time changes of the pools: a server added, removed or reweighted through the API, and
//! the configuration file read again (SIGHUP, `kvswitch ctl reload`). Both paths route by the
//! one [`Pool`], so the UDP path and the proxy change over together.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::cache::CacheService;
use switch::pool::{Pool, PoolSpec};

/// Reads the configuration again and applies it; what it changed, or why it refused.
pub type Reloader = Arc<dyn Fn() -> anyhow::Result<Value> + Send + Sync>;

/// Runs `reload` for a SIGHUP, logging what came of it.
pub fn reload_on_hangup(reload: &Reloader) {
    match reload() {
        Ok(done) => tracing::info!(%done, "configuration reloaded"),
        Err(e) => tracing::error!("configuration not reloaded, the running one is kept: {e:#}"),
    }
}

/// Makes the running `pools` what `new` (a configuration read again) says: the same pools
/// with the same settings, their servers and weights changed. A pool added or removed, or a
/// setting other than the servers changed, refuses the whole reload: those need a restart.
pub fn apply(
    pools: &[Arc<Pool>],
    new: &[PoolSpec],
    caches: &[(String, Arc<CacheService>)],
) -> anyhow::Result<Value> {
    let names = |specs: Vec<String>| specs.join(", ");
    let running: Vec<Arc<PoolSpec>> = pools.iter().map(|p| p.spec()).collect();
    if running.len() != new.len() || running.iter().zip(new).any(|(r, n)| r.name != n.name) {
        anyhow::bail!(
            "the pools changed ({} running, {} in the file): restart to serve other pools; \
             nothing was changed",
            names(running.iter().map(|p| p.name.clone()).collect()),
            names(new.iter().map(|p| p.name.clone()).collect()),
        );
    }
    for (r, n) in running.iter().zip(new) {
        let changed = settings_changed(r, n);
        if !changed.is_empty() {
            anyhow::bail!(
                "pool `{}`: {} changed: restart to apply; nothing was changed",
                n.name,
                changed.join(", ")
            );
        }
    }
    // Every pool's new list is checked before any pool changes, so a file refused for its
    // second pool leaves the first as it was too.
    for (pool, n) in pools.iter().zip(new) {
        pool.check_servers(&n.servers)
            .map_err(|e| anyhow::anyhow!("pool `{}`: {e}; nothing was changed", n.name))?;
    }
    let mut done = Vec::with_capacity(pools.len());
    for (pool, n) in pools.iter().zip(new) {
        let version = pool
            .set_servers(&n.servers)
            .map_err(|e| anyhow::anyhow!("pool `{}`: {e}", n.name))?;
        grow_caches(pool, &n.name, caches);
        done.push(json!({ "pool": n.name, "servers": n.servers.len(), "version": version }));
    }
    Ok(json!({ "pools": done }))
}

/// Makes each cache of `pool` track hot keys for every server it has had.
pub fn grow_caches(pool: &Pool, name: &str, caches: &[(String, Arc<CacheService>)]) {
    let servers = pool.spec().servers.len();
    for (_, c) in caches
        .iter()
        .filter(|(n, _)| n == name || caches.len() == 1)
    {
        c.lock().ensure_groups(servers);
    }
}

/// The settings other than the servers that differ.
fn settings_changed(a: &PoolSpec, b: &PoolSpec) -> Vec<&'static str> {
    let mut out = Vec::new();
    let mut check = |same: bool, name| {
        if !same {
            out.push(name);
        }
    };
    check(a.listen == b.listen, "listen");
    check(a.distribution == b.distribution, "distribution");
    check(a.hash == b.hash, "hash");
    check(a.hash_tag == b.hash_tag, "hash_tag");
    check(a.timeout == b.timeout, "timeout");
    check(a.auto_eject_hosts == b.auto_eject_hosts, "auto_eject_hosts");
    check(
        a.server_failure_limit == b.server_failure_limit,
        "server_failure_limit",
    );
    check(
        a.server_retry_timeout == b.server_retry_timeout,
        "server_retry_timeout",
    );
    check(
        a.server_connections == b.server_connections,
        "server_connections",
    );
    check(a.redis.is_some() == b.redis.is_some(), "redis");
    check(
        a.redis.as_ref().map(|r| &r.auth) == b.redis.as_ref().map(|r| &r.auth),
        "redis_auth",
    );
    check(
        a.redis.as_ref().map(|r| r.db) == b.redis.as_ref().map(|r| r.db),
        "redis_db",
    );
    check(
        a.redis.as_ref().map(|r| r.cluster) == b.redis.as_ref().map(|r| r.cluster),
        "redis_cluster",
    );
    out
}
