//! One switch of a coherent caching fabric (`kvswitch fabric run`): its ports, its run loop
//! and its HTTP API.
//!
//! The API:
//! - `GET /api/v1/fabric` — its counters, cache, directory, links and ports, as JSON;
//! - `GET /metrics` — the same for Prometheus;
//! - `PUT /api/v1/fabric/registration` `{"version": N, "failed": ["root0"]}` — install the
//!   registration table the fabric file gives with those switches failed (what a controller
//!   does when a switch fails or comes back);
//! - `PUT /api/v1/fabric/faults` `{"drop_invalidations": N}` — drop the next N invalidations
//!   this switch receives (to test that homes send them again);
//! - `PUT /api/v1/fabric/cache` `{"items": N}` — how many items this switch caches (0: none);
//! - `PUT /api/v1/fabric/coherence` `{"protocol": "update"}` — what a write does to the copies
//!   of its key at this home: `invalidate` them, or `update` them once it is stored.
//!
//! It refuses and bounds what the switch's API does ([`api::guard`]): a `Host` that does not
//! name it, a change from another web origin or not sent as JSON, connections past 256, slow
//! headers and large bodies.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use api::guard::{ApiServing, Guard, MAX_BODY};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use config::fabric::FabricConfig;
use dataplane::remote::Remote;
use dataplane::{Driver, RunOptions};
use kvio::{AfPacket, AfPacketOptions, Port};
use serde::Deserialize;
use serde_json::{json, Value};
use switch::fabric::{FabricSnapshot, FabricSwitch};
use switch::stats::Stats;

/// What the API thread shares with the forwarding thread.
struct Shared {
    cfg: FabricConfig,
    name: String,
    snapshot: Mutex<Option<FabricSnapshot>>,
    stats: Arc<Stats>,
    ports: Vec<String>,
    remote: Remote<FabricSwitch>,
    /// What the API refused and the connections it holds (the switch's API's limits).
    guard: Arc<Guard>,
    /// The token a change needs, when the fabric has one.
    token: Option<String>,
}

pub fn run(cfg: FabricConfig, name: &str) -> anyhow::Result<()> {
    kvio::signal::install_stop_handlers();
    let spec = cfg.spec(name)?;
    let me = cfg.switch(name).expect("checked by spec").clone();
    let names: Vec<String> = me.ports.iter().map(|(iface, _)| iface.clone()).collect();
    let _claims = crate::claim_ports(&names, &cfg.path)?;
    let mut ports: Vec<Box<dyn Port>> = Vec::new();
    for (iface, _) in &me.ports {
        let _ = kvio::link::set_ipv4_conf(iface, "arp_ignore", "1");
        let port = AfPacket::open(iface, &AfPacketOptions::default()).with_context(|| {
            format!(
                "{}: switch {name}: cannot open port `{iface}`",
                cfg.path.display()
            )
        })?;
        ports.push(Box::new(port));
    }
    let token = match me.api {
        Some(listen) => api::api_token(cfg.api_token_file.as_deref(), listen)
            .with_context(|| format!("{}: switch {name}", cfg.path.display()))?,
        None => None,
    };
    let stats = Arc::new(Stats::new(ports.len(), 0));
    let fabric = FabricSwitch::new(spec)?;
    let (remote, inbox) = dataplane::remote::<FabricSwitch>()?;
    let shared = Arc::new(Shared {
        cfg: cfg.clone(),
        name: name.to_string(),
        snapshot: Mutex::new(None),
        stats: stats.clone(),
        ports: me.ports.iter().map(|(i, _)| i.clone()).collect(),
        remote,
        guard: Guard::new(ApiServing::default())?,
        token,
    });
    let api = match me.api {
        Some(addr) => Some(serve(addr, shared.clone())?),
        None => None,
    };
    tracing::info!(switch = name, role = me.role.name(), ports = ?shared.ports,
        api = ?api, "kvswitch fabric switch running");
    let mut driver = Driver::new(ports, fabric, None, stats);
    let options = RunOptions {
        busy_poll: cfg.busy_poll,
        ..RunOptions::default()
    };
    let clock = kvio::clock::now;
    driver.run(
        &options,
        Some(&inbox),
        &kvio::signal::stop_requested,
        &mut |fabric| {
            if let Ok(mut s) = shared.snapshot.lock() {
                *s = Some(fabric.snapshot(clock()));
            }
        },
    )?;
    tracing::info!(switch = name, "kvswitch fabric switch stopping");
    Ok(())
}

/// Starts the API on a thread of its own, behind the same guard as the switch's API (Host,
/// Origin and JSON checks, a connection cap, a header timeout, bounded bodies).
fn serve(addr: SocketAddr, shared: Arc<Shared>) -> anyhow::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(addr)
        .with_context(|| format!("the fabric API cannot listen on {addr}"))?;
    let guard = shared.guard.clone();
    let app = Router::new()
        .route("/api/v1/fabric", get(fabric_status))
        .route("/metrics", get(metrics))
        .route("/api/v1/fabric/registration", put(registration))
        .route("/api/v1/fabric/faults", put(faults))
        .route("/api/v1/fabric/cache", put(cache_size))
        .route("/api/v1/fabric/coherence", put(coherence))
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            authorise,
        ))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(shared);
    api::server::spawn_server(listener, app, guard, "fabric-api", false)
}

/// Refuses a change without the fabric's token, when it has one.
async fn authorise(
    State(shared): State<Arc<Shared>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let change = !matches!(
        *req.method(),
        axum::http::Method::GET | axum::http::Method::HEAD
    );
    if let (true, Some(token)) = (change, &shared.token) {
        if !api::server::bearer_is(req.headers(), token) {
            return refused(
                StatusCode::UNAUTHORIZED,
                "changes need the fabric's API token: send `Authorization: Bearer <token>` \
                 (`api_token_file` of the fabric file, or KVSWITCH_API_TOKEN)",
            )
            .into_response();
        }
    }
    next.run(req).await
}

/// A snapshot taken on the forwarding thread now; the last periodic one if that is busy.
async fn fresh(shared: &Shared) -> Option<FabricSnapshot> {
    match on_switch(shared, |f, now, _| f.snapshot(now)).await {
        Ok(s) => Some(s),
        Err(_) => shared.snapshot.lock().ok().and_then(|s| s.clone()),
    }
}

fn status_json(shared: &Shared, snap: Option<FabricSnapshot>) -> Value {
    let ports: Vec<Value> = shared
        .ports
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let p = &shared.stats.ports[i];
            json!({
                "name": name,
                "rx_frames": p.rx_packets.load(Ordering::Relaxed),
                "tx_frames": p.tx_packets.load(Ordering::Relaxed),
            })
        })
        .collect();
    let Some(s) = snap else {
        return json!({"switch": shared.name, "starting": true, "ports": ports});
    };
    let links: Vec<Value> = s
        .links_up
        .iter()
        .enumerate()
        .filter_map(|(p, up)| {
            let up = (*up)?;
            let to = shared
                .cfg
                .switch(&shared.name)
                .and_then(|me| me.ports.get(p))
                .and_then(|(_, link)| *link)
                .and_then(|id| shared.cfg.switches.get(usize::from(id)))
                .map(|sw| sw.name.clone());
            Some(json!({"port": shared.ports.get(p), "to": to, "up": up}))
        })
        .collect();
    let st = s.stats;
    let c = s.cache;
    let d = s.directory;
    let b = &s.incbox;
    json!({
        "switch": shared.name,
        "role": s.role.name(),
        "coherence": s.coherence.name(),
        "registration_version": s.registration_version,
        "stats": {
            "requests_in": st.requests_in, "hits": st.hits, "refused": st.refused,
            "to_server": st.to_server, "replies_out": st.replies_out,
            "to_home_node": st.to_home_node, "from_home_node": st.from_home_node,
            "computed": st.computed, "computed_kept": st.computed_kept,
            "messages_sent": st.messages_sent, "messages_in": st.messages_in,
            "invalidations_sent": st.invalidations_sent, "invalidations_in": st.invalidations_in,
            "invalidations_dropped": st.invalidations_dropped, "acks_sent": st.acks_sent,
            "writes_failed": st.writes_failed, "no_route": st.no_route,
            "malformed": st.malformed, "unexpected": st.unexpected, "routed": st.routed,
            "detours": st.detours, "root_fills": st.root_fills,
            "invalidations_relayed": st.invalidations_relayed,
            "refused_sources": st.refused_sources, "refused_fragments": st.refused_fragments,
            "writes_forwarded": st.writes_forwarded, "writes_held_us": st.writes_held_us,
            "writes_answered": st.writes_answered, "writes_server_us": st.writes_server_us,
            "updates_sent": st.updates_sent,
        },
        "cache": {
            "items": s.cached_items, "capacity": s.cache_capacity, "hits": c.hits, "misses": c.misses, "fills": c.fills,
            "fills_stale": c.fills_stale, "fills_refused": c.fills_refused,
            "evictions": c.evictions,
            "invalidations": c.invalidations,
        },
        "incbox": {
            "processors": b.processors, "hit_check": b.hit_check, "marks": b.marks,
            "fdb_entries": b.fdb_entries, "steered": b.steered, "bypassed": b.bypassed,
            "processor_misses": b.processor_misses, "fills_unmarked": b.fills_unmarked,
            "processor_reads": b.reads, "processor_items": b.items,
        },
        "directory": {
            "fills_allowed": d.fills_allowed, "fills_refused_write": d.fills_refused_write,
            "fills_refused_full": d.fills_refused_full, "writes": d.writes,
            "writes_queued": d.writes_queued, "invalidations": d.invalidations,
            "retransmits": d.retransmits, "acks": d.acks, "acks_stale": d.acks_stale,
            "writes_failed": d.writes_failed, "writes_timed_out": d.writes_timed_out,
        },
        "links": links,
        "ports": ports,
    })
}

async fn fabric_status(State(shared): State<Arc<Shared>>) -> Json<Value> {
    let snap = fresh(&shared).await;
    Json(status_json(&shared, snap))
}

/// Every number of the status as a Prometheus counter (`kvswitch_fabric_{group}_{name}_total`)
/// or, for the cache's items and capacity and each link, a gauge.
async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    use api::metrics::{Exposition, Kind, CONTENT_TYPE};
    let snap = fresh(&shared).await;
    let v = status_json(&shared, snap);
    let mut m = Exposition::new();
    let switch = shared.name.as_str();
    for group in ["stats", "cache", "incbox", "directory"] {
        let Some(map) = v[group].as_object() else {
            continue;
        };
        for (k, n) in map {
            let Some(n) = n.as_u64() else { continue };
            let (name, kind) = match (group, k.as_str()) {
                ("cache", "items" | "capacity")
                | ("incbox", "processors" | "marks" | "fdb_entries") => {
                    (format!("kvswitch_fabric_{group}_{k}"), Kind::Gauge)
                }
                _ => (format!("kvswitch_fabric_{group}_{k}_total"), Kind::Counter),
            };
            let help = format!("The fabric switch's {group} figure `{k}` (see its status).");
            m.family(&name, kind, &help);
            m.sample(&name, &[("switch", switch)], n);
        }
    }
    m.family(
        "kvswitch_fabric_write_update",
        Kind::Gauge,
        "1 while the switch, as a home, sends a stored write's value to the switches it invalidated (coherence \"update\").",
    );
    m.sample(
        "kvswitch_fabric_write_update",
        &[("switch", switch)],
        u8::from(v["coherence"] == "update"),
    );
    m.family(
        "kvswitch_fabric_incbox_hit_check",
        Kind::Gauge,
        "1 while the switch stage sends a read to a cache processor only for a marked key.",
    );
    m.sample(
        "kvswitch_fabric_incbox_hit_check",
        &[("switch", switch)],
        u8::from(v["incbox"]["hit_check"] == true),
    );
    for (figure, name, kind, help) in [
        (
            "processor_reads",
            "kvswitch_fabric_incbox_processor_reads_total",
            Kind::Counter,
            "Reads the switch stage gave the cache processor (since the cache was last laid out).",
        ),
        (
            "processor_items",
            "kvswitch_fabric_incbox_processor_items",
            Kind::Gauge,
            "Items the cache processor holds.",
        ),
    ] {
        m.family(name, kind, help);
        for (p, n) in v["incbox"][figure]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let p = p.to_string();
            m.sample(
                name,
                &[("switch", switch), ("processor", &p)],
                n.as_u64().unwrap_or(0),
            );
        }
    }
    m.family(
        "kvswitch_fabric_link_up",
        Kind::Gauge,
        "1 while the link to the switch `to` answers.",
    );
    for l in v["links"].as_array().into_iter().flatten() {
        m.sample(
            "kvswitch_fabric_link_up",
            &[("switch", switch), ("to", l["to"].as_str().unwrap_or("?"))],
            u8::from(l["up"] == true),
        );
    }
    shared.guard.write_metrics(&mut m);
    m.standard("fabric");
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], m.finish()).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TableRequest {
    version: u64,
    #[serde(default)]
    failed: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CacheRequest {
    #[serde(default)]
    items: Option<usize>,
    #[serde(default)]
    processors: Option<usize>,
    #[serde(default)]
    hit_check: Option<bool>,
    #[serde(default)]
    fdb_entries: Option<usize>,
}

/// Most items a switch may be told to cache.
const MAX_CACHE_ITEMS: usize = 1 << 24;

async fn cache_size(State(shared): State<Arc<Shared>>, body: axum::body::Bytes) -> Reply {
    let req: CacheRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return refused(StatusCode::BAD_REQUEST, e),
    };
    if let Some(items) = req.items.filter(|&n| n > MAX_CACHE_ITEMS) {
        return refused(
            StatusCode::BAD_REQUEST,
            format!("{items} items: at most {MAX_CACHE_ITEMS}"),
        );
    }
    let named = [req.items, req.processors, req.fdb_entries]
        .iter()
        .any(Option::is_some);
    if !named && req.hit_check.is_none() {
        return refused(
            StatusCode::BAD_REQUEST,
            "name `items`, `processors`, `hit_check` or `fdb_entries`",
        );
    }
    let done = on_switch(&shared, move |f, now, _| {
        let mut spec = f.incbox();
        spec.processors = req.processors.unwrap_or(spec.processors);
        spec.hit_check = req.hit_check.unwrap_or(spec.hit_check);
        spec.fdb_entries = req.fdb_entries.unwrap_or(spec.fdb_entries);
        f.set_cache(req.items.unwrap_or(f.cache_items()), spec)?;
        Ok::<_, String>(f.snapshot(now))
    })
    .await;
    match done {
        Ok(Ok(s)) => (
            StatusCode::OK,
            Json(json!({
                "items": s.cache_capacity,
                "processors": s.incbox.processors,
                "hit_check": s.incbox.hit_check,
                "fdb_entries": s.incbox.fdb_entries,
            })),
        ),
        Ok(Err(why)) => refused(StatusCode::BAD_REQUEST, why),
        Err(reply) => reply,
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CoherenceRequest {
    protocol: String,
}

/// Chooses the switch's coherence protocol as a home: `{"protocol": "invalidate"}` or
/// `"update"`.
async fn coherence(State(shared): State<Arc<Shared>>, body: axum::body::Bytes) -> Reply {
    let req: CoherenceRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return refused(StatusCode::BAD_REQUEST, e),
    };
    let Some(protocol) = switch::fabric::Coherence::parse(&req.protocol) else {
        return refused(
            StatusCode::BAD_REQUEST,
            format!("protocol {:?}: \"invalidate\" or \"update\"", req.protocol),
        );
    };
    match on_switch(&shared, move |f, _, _| f.set_coherence(protocol)).await {
        Ok(()) => (StatusCode::OK, Json(json!({ "protocol": protocol.name() }))),
        Err(reply) => reply,
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FaultRequest {
    drop_invalidations: u64,
}

type Reply = (StatusCode, Json<Value>);

fn refused(code: StatusCode, message: impl std::fmt::Display) -> Reply {
    (code, Json(json!({ "error": message.to_string() })))
}

/// Runs `job` on the forwarding thread and waits for its answer.
async fn on_switch<T: Send + 'static>(
    shared: &Shared,
    job: impl FnOnce(&mut FabricSwitch, kv::Instant, &mut Vec<switch::Emit>) -> T + Send + 'static,
) -> Result<T, Reply> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    shared
        .remote
        .submit(Box::new(move |f, now, emit| {
            let _ = tx.send(job(f, now, emit));
        }))
        .map_err(|e| refused(StatusCode::SERVICE_UNAVAILABLE, e))?;
    rx.await
        .map_err(|_| refused(StatusCode::SERVICE_UNAVAILABLE, "the switch stopped"))
}

async fn registration(State(shared): State<Arc<Shared>>, body: axum::body::Bytes) -> Reply {
    let req: TableRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return refused(StatusCode::BAD_REQUEST, e),
    };
    let mut failed = BTreeSet::new();
    for name in &req.failed {
        match shared.cfg.switch(name) {
            Some(s) => {
                failed.insert(s.id);
            }
            None => return refused(StatusCode::BAD_REQUEST, format!("no switch {name:?}")),
        }
    }
    let table = match shared.cfg.registration(req.version, &failed) {
        Ok(t) => t,
        Err(e) => return refused(StatusCode::BAD_REQUEST, format!("{e:#}")),
    };
    match on_switch(&shared, move |f, now, emit| {
        f.set_registration(table, now, emit)
    })
    .await
    {
        Ok(Ok(())) => (StatusCode::OK, Json(json!({"version": req.version}))),
        Ok(Err(e)) => refused(StatusCode::CONFLICT, e),
        Err(reply) => reply,
    }
}

async fn faults(State(shared): State<Arc<Shared>>, body: axum::body::Bytes) -> Reply {
    let req: FaultRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return refused(StatusCode::BAD_REQUEST, e),
    };
    let n = req.drop_invalidations;
    match on_switch(&shared, move |f, _, _| f.drop_invalidations(n)).await {
        Ok(()) => (StatusCode::OK, Json(json!({ "drop_invalidations": n }))),
        Err(reply) => reply,
    }
}
