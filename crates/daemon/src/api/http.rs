//! The control API's HTTP server: the routes of `/api/v1`, described by the OpenAPI document
//! served at `/api/v1/openapi.json` ([`ROUTES`] lists them; a test holds the two together).
//!
//! It runs on a thread of its own with a single-threaded runtime. Reads of counters and status
//! are served here; calls that read or change the switch's tables are handed to the
//! forwarding thread as jobs ([`dataplane::Remote`]) and answered when it has run them, so the
//! data path never waits on a client, however slow. Changes (POST, PUT, DELETE) and taking
//! the CPU's frames need the token when one is set. Before any of that, [`super::guard`]
//! refuses what a web browser could send from another origin, bounds the connections and
//! reads the bodies within their limits.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, RawQuery, Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::{DeserializeOwned, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{json, Value};

use super::pools::{grow_caches, Reloader};
use super::{Exporter, STATUS_ENTRIES};
use crate::cache;
use crate::cache::{cache_query, ApiError};
use ::api::guard::{ApiServing, Guard, MAX_BODY};
use ::api::pool::NewServer;
use ::api::server::{bearer_is, spawn_server};
use ::api::{body, ApiFailure};
use dataplane::{EgressSettings, Remote, RemoteError};
use kv::Instant;
use switch::control::{
    self, ActionDef, Change, ControlError, EntryDef, ErrorKind, GroupDef, InterfaceDef,
    RegisterView, TableDef,
};
use switch::pool::{Pool, PoolChangeError};
use switch::{Emit, Switch};

/// The OpenAPI 3 document of this API.
pub const OPENAPI: &str = include_str!("openapi.json");

/// Every route the server has, with its methods; the OpenAPI document has exactly these.
pub const ROUTES: &[(&str, &[&str])] = &[
    ("/", &["get"]),
    ("/metrics", &["get"]),
    ("/api/v1/openapi.json", &["get"]),
    ("/dashboard", &["get"]),
    ("/api/v1/fleet", &["get"]),
    ("/api/v1/status", &["get"]),
    ("/api/v1/fields", &["get"]),
    ("/api/v1/tables", &["get", "post"]),
    ("/api/v1/tables/{table}", &["get", "delete"]),
    ("/api/v1/tables/{table}/entries", &["get", "post"]),
    ("/api/v1/tables/{table}/entries/{id}", &["put", "delete"]),
    ("/api/v1/batch", &["post"]),
    ("/api/v1/ports", &["get"]),
    ("/api/v1/ports/{port}/egress", &["put"]),
    ("/api/v1/counters", &["get"]),
    ("/api/v1/counters/{name}", &["delete"]),
    ("/api/v1/interfaces", &["get"]),
    ("/api/v1/interfaces/{id}", &["get", "put", "delete"]),
    ("/api/v1/groups", &["get"]),
    ("/api/v1/groups/{id}", &["get", "put", "delete"]),
    ("/api/v1/registers", &["get"]),
    ("/api/v1/registers/{name}", &["get", "put"]),
    ("/api/v1/packets", &["get", "post"]),
    ("/api/v1/packets/stream", &["get"]),
    ("/api/v1/pool", &["get"]),
    ("/api/v1/pool/servers", &["post"]),
    ("/api/v1/pool/servers/{server}", &["put", "delete"]),
    ("/api/v1/pool/staged", &["put", "delete"]),
    ("/api/v1/pool/staged/commit", &["post"]),
    ("/api/v1/pool/arcs", &["get"]),
    ("/api/v1/pool/placement", &["put", "delete"]),
    ("/api/v1/reload", &["post"]),
    ("/api/v1/cache", &["get"]),
    ("/api/v1/cache/{action}", &["post"]),
];

/// How long a call waits for the forwarding thread before it gives up.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// A job not started this long before its call's timeout is not run: longer than any one
/// job takes (batches and listings are bounded), so a call that timed out was not applied.
const CALL_MARGIN: Duration = Duration::from_secs(2);
/// The longest a `GET /api/v1/packets` waits for a frame.
const MAX_WAIT: Duration = Duration::from_secs(30);

/// What the server serves.
pub struct Api {
    pub exporter: Arc<dyn Exporter>,
    /// The switch's tables, when a switch runs (not for a proxy alone).
    pub switch: Option<Remote<Switch>>,
    /// Changes need `Authorization: Bearer <token>` when set.
    pub token: Option<String>,
    /// The pools servers are added to and removed from.
    pub pools: Vec<Arc<Pool>>,
    /// Reads the configuration file again, when there is one.
    pub reload: Option<Reloader>,
    /// The ports' egress rates and depths, when a switch runs.
    pub egress: Option<Arc<EgressSettings>>,
    /// Its connection cap, header timeout and the names it is reached by.
    pub serving: ApiServing,
}

/// What the handlers share: the API and what the server keeps of its own.
pub struct Served {
    api: Api,
    /// Packet streams open now (at most [`MAX_STREAMS`]).
    streams: std::sync::atomic::AtomicUsize,
    /// What the server refused and the connections it holds, for `/metrics`.
    guard: Arc<Guard>,
    /// Names this run of the switch: a new one after every start, so that a controller can
    /// tell a switch that restarted (and forgot what was put on it) from one that did not.
    instance: String,
    /// Changes of what an operator puts on the switch (tables, entries, interfaces, groups,
    /// registers, egress) applied through this API: a controller that keeps a copy reads the
    /// switch again only when this moves.
    control_changes: std::sync::atomic::AtomicU64,
    /// Pool changes staged by a controller, to be taken at an instant.
    staged: staged::StagedChanges,
}

mod arcs;
mod staged;

/// The paths whose changes [`Served::control_changes`] counts.
const OPERATOR_STATE: [&str; 6] = [
    "/api/v1/tables",
    "/api/v1/batch",
    "/api/v1/interfaces",
    "/api/v1/groups",
    "/api/v1/registers",
    "/api/v1/ports",
];

/// A name for this run: the process, the time it started and the system's random hash keys.
fn new_instance() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    format!("{:016x}", h.finish())
}

impl std::ops::Deref for Served {
    type Target = Api;

    fn deref(&self) -> &Api {
        &self.api
    }
}

type Shared = Arc<Served>;
type Reply = Result<Response, ApiFailure>;

fn ok(v: impl serde::Serialize) -> Reply {
    Ok(Json(v).into_response())
}

/// Binds nothing: serves `api` on `listener` on a thread of its own; returns the address.
pub fn serve(listener: TcpListener, api: Api) -> anyhow::Result<SocketAddr> {
    let guard = Guard::new(api.serving.clone())?;
    let app = router(Arc::new(Served {
        api,
        streams: Default::default(),
        guard: guard.clone(),
        instance: new_instance(),
        control_changes: Default::default(),
        staged: Default::default(),
    }));
    spawn_server(listener, app, guard, "api", true)
}

/// The routes of [`ROUTES`] and their handlers.
pub fn router(api: Shared) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/metrics", get(metrics))
        .route("/api/v1/openapi.json", get(openapi))
        .route("/dashboard", get(dashboard))
        .route("/api/v1/fleet", get(fleet))
        .route("/api/v1/status", get(status))
        .route("/api/v1/fields", get(fields))
        .route("/api/v1/tables", get(list_tables).post(create_table))
        .route(
            "/api/v1/tables/{table}",
            get(show_table).delete(delete_table),
        )
        .route(
            "/api/v1/tables/{table}/entries",
            get(list_entries).post(add_entry),
        )
        .route(
            "/api/v1/tables/{table}/entries/{id}",
            axum::routing::put(modify_entry).delete(delete_entry),
        )
        .route("/api/v1/batch", post(batch))
        .route("/api/v1/ports", get(ports))
        .route(
            "/api/v1/ports/{port}/egress",
            axum::routing::put(set_egress),
        )
        .route("/api/v1/counters", get(counters))
        .route(
            "/api/v1/counters/{name}",
            axum::routing::delete(delete_counter),
        )
        .route("/api/v1/interfaces", get(interfaces))
        .route(
            "/api/v1/interfaces/{id}",
            get(show_interface)
                .put(set_interface)
                .delete(delete_interface),
        )
        .route("/api/v1/groups", get(groups))
        .route(
            "/api/v1/groups/{id}",
            get(show_group).put(set_group).delete(delete_group),
        )
        .route("/api/v1/registers", get(registers))
        .route(
            "/api/v1/registers/{name}",
            get(show_register).put(set_register),
        )
        .route("/api/v1/packets", get(take_packets).post(send_packet))
        .route("/api/v1/packets/stream", get(stream_packets))
        .route("/api/v1/pool", get(pool))
        .route("/api/v1/pool/servers", post(add_server))
        .route(
            "/api/v1/pool/staged",
            axum::routing::put(staged::stage).delete(staged::cancel),
        )
        .route("/api/v1/pool/staged/commit", post(staged::commit))
        .route("/api/v1/pool/arcs", get(arcs::arcs))
        .route(
            "/api/v1/pool/placement",
            axum::routing::put(arcs::set).delete(arcs::clear),
        )
        .route(
            "/api/v1/pool/servers/{server}",
            axum::routing::put(reweight_server).delete(remove_server),
        )
        .route("/api/v1/reload", post(reload))
        .route("/api/v1/cache", get(cache_status))
        .route("/api/v1/cache/{action}", post(cache_action))
        .fallback(no_route)
        .layer(middleware::from_fn_with_state(api.clone(), authorise))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(api)
}

/// Refuses a change without the token, when one is set.
async fn authorise(State(api): State<Shared>, req: Request, next: Next) -> Response {
    // Reading the CPU's frames takes them from the queue, so it needs the token too.
    let change = !matches!(*req.method(), Method::GET | Method::HEAD)
        || req.uri().path().starts_with("/api/v1/packets");
    if let (true, Some(token)) = (change, &api.token) {
        if !bearer_is(req.headers(), token) {
            return ApiFailure::new(
                StatusCode::UNAUTHORIZED,
                "changes, and taking frames sent to the CPU, need the API token: send `Authorization: Bearer <token>` \
                 (kvswitch ctl --token-file FILE, or KVSWITCH_API_TOKEN)",
            )
            .into_response();
        }
    }
    let counted = change
        && *req.method() != Method::GET
        && OPERATOR_STATE
            .iter()
            .any(|p| req.uri().path().starts_with(p));
    // Counted before it runs (a change whose caller gave up may still apply) and again once
    // it has run (a copy read in between must be read again): a copy read again for nothing
    // costs less than one that misses a change.
    let count = || {
        if counted {
            api.control_changes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    };
    count();
    let response = next.run(req).await;
    count();
    response
}

async fn no_route(method: Method, uri: axum::http::Uri) -> ApiFailure {
    ApiFailure::new(
        StatusCode::NOT_FOUND,
        format!(
            "no route {method} {}; see GET /api/v1/openapi.json",
            uri.path()
        ),
    )
}

/// Runs `f` on the forwarding thread and waits for its answer.
async fn call<R: Send + 'static>(
    api: &Api,
    f: impl FnOnce(&mut Switch, Instant, &mut Vec<Emit>) -> R + Send + 'static,
) -> Result<R, ApiFailure> {
    let remote = api.switch.as_ref().ok_or_else(|| {
        ApiFailure::new(
            StatusCode::NOT_FOUND,
            "this kvswitch runs the proxy alone: it has no switch tables",
        )
    })?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    // A job that starts so late that its caller may have given up is not run, so that a 504
    // means the call was not applied.
    let latest = std::time::Instant::now() + CALL_TIMEOUT.saturating_sub(CALL_MARGIN);
    remote
        .submit(Box::new(move |sw, now, emit| {
            let answer = (std::time::Instant::now() <= latest).then(|| f(sw, now, emit));
            let _ = tx.send(answer);
        }))
        .map_err(|e| match e {
            RemoteError::Busy => ApiFailure::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
            RemoteError::Stopped => ApiFailure::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        })?;
    let late = || {
        ApiFailure::new(
            StatusCode::GATEWAY_TIMEOUT,
            format!("the switch did not answer within {CALL_TIMEOUT:?}; nothing was applied"),
        )
    };
    match tokio::time::timeout(CALL_TIMEOUT, rx).await {
        Ok(Ok(Some(r))) => Ok(r),
        Ok(Ok(None)) => Err(late()),
        Ok(Err(_)) => Err(ApiFailure::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the switch stopped before answering",
        )),
        Err(_) => Err(late()),
    }
}

async fn index() -> Response {
    let mut text = String::from("kvswitch control API; routes (see /api/v1/openapi.json):\n");
    for (path, methods) in ROUTES {
        text.push_str(&format!(
            "  {:<8} {path}\n",
            methods.join(",").to_uppercase()
        ));
    }
    text.into_response()
}

async fn metrics(State(api): State<Shared>) -> Response {
    let mut m = ::api::metrics::Exposition::new();
    api.exporter.metrics(&mut m);
    cache::write_metrics(&mut m, &api.exporter.caches());
    api.guard.write_metrics(&mut m);
    m.standard(if api.switch.is_some() {
        "switch"
    } else {
        "proxy"
    });
    (
        [(header::CONTENT_TYPE, ::api::metrics::CONTENT_TYPE)],
        m.finish(),
    )
        .into_response()
}

/// The controller's dashboard, for this switch (or proxy) alone.
async fn dashboard() -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        ::api::DASHBOARD,
    )
        .into_response()
}

/// What the dashboard reads, as a fleet of one: this switch's status, and its pool's servers
/// (up while they are in the ring).
async fn fleet(State(api): State<Shared>) -> Reply {
    let mut st = api.exporter.status();
    let caches = api.exporter.caches();
    if let (false, Some(map)) = (caches.is_empty(), st.as_object_mut()) {
        map.insert("cache".into(), cache::status(&caches, STATUS_ENTRIES));
    }
    let now = kvio::clock::now();
    let pool = api.pools.first();
    let servers: Vec<Value> = pool
        .map(|pool| {
            let spec = pool.spec();
            let view = pool.view(now);
            spec.servers
                .iter()
                .enumerate()
                .filter(|(i, _)| !pool.health(*i).removed)
                .map(|(i, s)| {
                    let h = pool.health(i);
                    json!({
                        "label": s.label(), "addr": s.addr.to_string(), "weight": s.weight,
                        "up": view.live().contains(&i), "failures": h.failures,
                        "downs": h.ejections, "last_error": null,
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    ok(json!({
        "controller": {
            "pool": pool.map(|p| p.spec().name.clone()),
            "role": "alone",
            "leader": null,
            "generation": pool.map(|p| p.version()),
            "servers": servers,
        },
        "switches": [{ "name": "this switch", "api": null, "in_step": true, "status": st }],
    }))
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

async fn status(State(api): State<Shared>) -> Reply {
    let mut doc = api.exporter.status();
    let caches = api.exporter.caches();
    if let Some(map) = doc.as_object_mut() {
        if !caches.is_empty() {
            map.insert("cache".into(), cache::status(&caches, STATUS_ENTRIES));
        }
        map.insert("instance".into(), json!(api.instance));
        map.insert(
            "control_changes".into(),
            json!(api
                .control_changes
                .load(std::sync::atomic::Ordering::Relaxed)),
        );
    }
    ok(doc)
}

async fn fields() -> Reply {
    let fields: Vec<Value> = control::NAMED_FIELDS
        .iter()
        .map(|(name, field, about)| json!({"name": name, "width": field.width(), "about": about}))
        .collect();
    ok(json!({ "fields": fields, "acl_key": control::ACL_KEY }))
}

async fn list_tables(State(api): State<Shared>) -> Reply {
    ok(json!({ "tables": call(&api, |sw, _, _| sw.tables()).await? }))
}

async fn create_table(State(api): State<Shared>, bytes: Bytes) -> Reply {
    let def: TableDef = body(&bytes)?;
    let view = call(&api, move |sw, _, _| sw.create_table(def)).await??;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

async fn show_table(State(api): State<Shared>, Path(table): Path<String>) -> Reply {
    ok(call(&api, move |sw, _, _| sw.table(&table)).await??)
}

async fn delete_table(State(api): State<Shared>, Path(table): Path<String>) -> Reply {
    call(&api, move |sw, _, _| sw.delete_table(&table)).await??;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Page {
    /// List from the first entry id after this one.
    after: Option<u64>,
    /// Most entries (at most `MAX_PAGE`, which is also the default).
    limit: Option<usize>,
}

async fn list_entries(
    State(api): State<Shared>,
    Path(table): Path<String>,
    RawQuery(query): RawQuery,
) -> Reply {
    let page: Page = query_args(query.as_deref().unwrap_or(""))?;
    let limit = page
        .limit
        .unwrap_or(control::MAX_PAGE)
        .clamp(1, control::MAX_PAGE);
    let (entries, next) = call(&api, move |sw, _, _| {
        sw.entries_page(&table, page.after, limit)
    })
    .await??;
    ok(json!({ "entries": entries, "next": next }))
}

async fn add_entry(State(api): State<Shared>, Path(table): Path<String>, bytes: Bytes) -> Reply {
    let entry: EntryDef = body(&bytes)?;
    let ids = call(&api, move |sw, _, _| {
        sw.apply(vec![Change::Add { table, entry }])
            .map_err(|e| strip_change(e, "changes[0]."))
    })
    .await??;
    Ok((StatusCode::CREATED, Json(json!({ "id": ids[0] }))).into_response())
}

/// The error of a one-change batch, without the batch's part of its field.
fn strip_change(mut e: ControlError, prefix: &str) -> ControlError {
    let batch = prefix.trim_end_matches('.');
    if e.field == batch || e.field == format!("{prefix}entry") {
        e.error = e.error.replacen(&format!("{}: ", e.field), "", 1);
        e.field = String::new();
    } else if let Some(rest) = e.field.strip_prefix(prefix) {
        let rest = rest.strip_prefix("entry.").unwrap_or(rest);
        e.error = e.error.replacen(&e.field, rest, 1);
        e.field = rest.to_string();
    }
    e
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Actions {
    actions: Vec<ActionDef>,
}

fn entry_id(id: &str) -> Result<u64, ApiFailure> {
    id.parse().map_err(|_| {
        ApiFailure::from(ControlError::new(
            ErrorKind::Invalid,
            "id",
            format!("{id:?} is not an entry id (a number from the entry list)"),
        ))
    })
}

async fn modify_entry(
    State(api): State<Shared>,
    Path((table, id)): Path<(String, String)>,
    bytes: Bytes,
) -> Reply {
    let id = entry_id(&id)?;
    let Actions { actions } = body(&bytes)?;
    call(&api, move |sw, _, _| {
        sw.apply(vec![Change::Modify { table, id, actions }])
            .map_err(|e| strip_change(e, "changes[0]."))
    })
    .await??;
    ok(json!({ "id": id }))
}

async fn delete_entry(
    State(api): State<Shared>,
    Path((table, id)): Path<(String, String)>,
) -> Reply {
    let id = entry_id(&id)?;
    call(&api, move |sw, _, _| {
        sw.apply(vec![Change::Delete { table, id }])
            .map_err(|e| strip_change(e, "changes[0]."))
    })
    .await??;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Batch {
    #[serde(deserialize_with = "at_most_a_batch")]
    changes: Vec<Change>,
}

/// The changes of a batch, refused at the first past [`control::MAX_BATCH`], so that a body
/// of many small changes is not parsed whole (and held, at several times its size) first.
fn at_most_a_batch<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Change>, D::Error> {
    struct Bounded;
    impl<'de> Visitor<'de> for Bounded {
        type Value = Vec<Change>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "a list of at most {} changes", control::MAX_BATCH)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Change>, A::Error> {
            let mut changes = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
            while let Some(change) = seq.next_element()? {
                if changes.len() == control::MAX_BATCH {
                    return Err(serde::de::Error::custom(format!(
                        "more than {} changes in one batch (max {}); send them as several",
                        control::MAX_BATCH,
                        control::MAX_BATCH
                    )));
                }
                changes.push(change);
            }
            Ok(changes)
        }
    }
    d.deserialize_seq(Bounded)
}

async fn batch(State(api): State<Shared>, bytes: Bytes) -> Reply {
    let Batch { changes } = body(&bytes)?;
    let ids = call(&api, move |sw, _, _| sw.apply(changes)).await??;
    ok(json!({ "applied": ids.len(), "ids": ids }))
}

async fn ports(State(api): State<Shared>) -> Reply {
    let mut ports = api.exporter.ports();
    if let (Some(egress), Some(list)) = (&api.egress, ports.as_array_mut()) {
        for (p, port) in list.iter_mut().enumerate() {
            if let (Some((rate, depth)), Some(map)) = (egress.get(p), port.as_object_mut()) {
                map.insert("egress_rate_bps".into(), json!(rate));
                map.insert("egress_depth_bytes".into(), json!(depth));
            }
        }
    }
    ok(json!({ "ports": ports }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EgressBody {
    /// Bits per second; 0 sends at once again.
    rate_bps: u64,
    depth_bytes: Option<u64>,
}

async fn set_egress(State(api): State<Shared>, Path(port): Path<String>, bytes: Bytes) -> Reply {
    let e: EgressBody = body(&bytes)?;
    let egress = api.egress.as_ref().ok_or_else(|| {
        ApiFailure::new(
            StatusCode::NOT_FOUND,
            "this kvswitch runs the proxy alone: it has no ports",
        )
    })?;
    let invalid =
        |field: &str, e: String| ApiFailure::from(ControlError::new(ErrorKind::Invalid, field, e));
    let p: usize = port
        .parse()
        .map_err(|_| invalid("port", format!("{port:?} is not a port number")))?;
    if e.rate_bps != 0 && e.rate_bps < 1000 {
        return Err(invalid(
            "rate_bps",
            format!(
                "{} bits/s is too slow to send a frame; use 0 (no queue) or 1000 and up",
                e.rate_bps
            ),
        ));
    }
    let depth = e.depth_bytes.unwrap_or(dataplane::DEFAULT_DEPTH);
    if !(1514..=(1 << 30)).contains(&depth) {
        return Err(invalid(
            "depth_bytes",
            format!("{depth} bytes: use 1514 (one full frame) to 1073741824"),
        ));
    }
    let Some(change) = egress.set(p, e.rate_bps, depth) else {
        return Err(ApiFailure::from(ControlError::new(
            ErrorKind::NotFound,
            "port",
            format!("no port {p}"),
        )));
    };
    // Answered once the forwarding thread has taken it in: a job wakes it.
    let deadline = tokio::time::Instant::now() + CALL_TIMEOUT;
    while !egress.applied(change) {
        call(&api, |_, _, _| ()).await?;
        if tokio::time::Instant::now() >= deadline {
            return Err(ApiFailure::new(
                StatusCode::GATEWAY_TIMEOUT,
                "the switch did not take the change in",
            ));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    ok(json!({ "port": p, "rate_bps": e.rate_bps, "depth_bytes": depth }))
}

async fn counters(State(api): State<Shared>) -> Reply {
    ok(json!({ "counters": call(&api, |sw, _, _| sw.counters()).await? }))
}

async fn delete_counter(State(api): State<Shared>, Path(name): Path<String>) -> Reply {
    call(&api, move |sw, _, _| sw.delete_counter(&name)).await??;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn interfaces(State(api): State<Shared>) -> Reply {
    ok(json!({ "interfaces": call(&api, |sw, _, _| sw.interfaces()).await? }))
}

/// A table id from a route's path: `what` ids are 0 to `max`.
fn path_id(id: &str, what: &str, max: usize) -> Result<u16, ApiFailure> {
    id.parse().map_err(|_| {
        ApiFailure::from(ControlError::new(
            ErrorKind::Invalid,
            "id",
            format!("{id:?} is not {what} id (0 to {max})"),
        ))
    })
}

fn interface_id(id: &str) -> Result<u16, ApiFailure> {
    path_id(id, "an interface", control::MAX_INTERFACES - 1)
}

async fn show_interface(State(api): State<Shared>, Path(id): Path<String>) -> Reply {
    let id = interface_id(&id)?;
    let all = call(&api, |sw, _, _| sw.interfaces()).await?;
    match all.into_iter().find(|it| it.id == id) {
        Some(it) => ok(it),
        None => Err(ApiFailure::from(ControlError::new(
            ErrorKind::NotFound,
            "id",
            format!("no interface {id}"),
        ))),
    }
}

async fn set_interface(State(api): State<Shared>, Path(id): Path<String>, bytes: Bytes) -> Reply {
    let id = interface_id(&id)?;
    let def: InterfaceDef = body(&bytes)?;
    ok(call(&api, move |sw, _, _| sw.set_interface(id, def)).await??)
}

async fn delete_interface(State(api): State<Shared>, Path(id): Path<String>) -> Reply {
    let id = interface_id(&id)?;
    call(&api, move |sw, _, _| sw.delete_interface(id)).await??;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn groups(State(api): State<Shared>) -> Reply {
    ok(json!({ "groups": call(&api, |sw, _, _| sw.groups()).await? }))
}

fn group_id(id: &str) -> Result<u16, ApiFailure> {
    path_id(id, "a multicast group", control::MAX_GROUPS - 1)
}

async fn show_group(State(api): State<Shared>, Path(id): Path<String>) -> Reply {
    let id = group_id(&id)?;
    let all = call(&api, |sw, _, _| sw.groups()).await?;
    match all.into_iter().find(|g| g.id == id) {
        Some(g) => ok(g),
        None => Err(ApiFailure::from(ControlError::new(
            ErrorKind::NotFound,
            "id",
            format!("no multicast group {id}"),
        ))),
    }
}

async fn set_group(State(api): State<Shared>, Path(id): Path<String>, bytes: Bytes) -> Reply {
    let id = group_id(&id)?;
    let def: GroupDef = body(&bytes)?;
    ok(call(&api, move |sw, _, _| sw.set_group(id, def)).await??)
}

async fn delete_group(State(api): State<Shared>, Path(id): Path<String>) -> Reply {
    let id = group_id(&id)?;
    call(&api, move |sw, _, _| sw.delete_group(id)).await??;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The user registers (from the switch) and the ports' figures as read-only registers
/// `port<N>.<figure>`: packets, bytes, drops and egress queue lengths.
async fn all_registers(api: &Api) -> Result<Vec<RegisterView>, ApiFailure> {
    let mut out = call(api, |sw, _, _| sw.registers()).await?;
    for (p, port) in api
        .exporter
        .ports()
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        for (figure, value) in port.as_object().into_iter().flatten() {
            // The port's own number is not a figure.
            if figure == "port" {
                continue;
            }
            if let Some(value) = value.as_u64() {
                out.push(RegisterView {
                    name: format!("port{p}.{figure}"),
                    value,
                    writable: false,
                });
            }
        }
    }
    Ok(out)
}

async fn registers(State(api): State<Shared>) -> Reply {
    ok(json!({ "registers": all_registers(&api).await? }))
}

fn no_register(name: &str) -> ApiFailure {
    ApiFailure::from(control::no_register(name))
}

async fn show_register(State(api): State<Shared>, Path(name): Path<String>) -> Reply {
    let all = all_registers(&api).await?;
    match all.into_iter().find(|r| r.name == name) {
        Some(r) => ok(r),
        None => Err(no_register(&name)),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RegisterValue {
    value: u64,
}

async fn set_register(State(api): State<Shared>, Path(name): Path<String>, bytes: Bytes) -> Reply {
    let RegisterValue { value } = body(&bytes)?;
    let Some(n) = control::user_register(&name) else {
        if name.starts_with("port") && all_registers(&api).await?.iter().any(|r| r.name == name) {
            return Err(ApiFailure::from(ControlError::new(
                ErrorKind::Conflict,
                "name",
                format!("{name} is a port's figure and is read-only"),
            )));
        }
        return Err(no_register(&name));
    };
    call(&api, move |sw, _, _| sw.set_register(n, value)).await??;
    ok(RegisterView {
        name,
        value,
        writable: true,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PacketOut {
    port: u16,
    /// The frame in hex.
    frame: String,
}

async fn send_packet(State(api): State<Shared>, bytes: Bytes) -> Reply {
    let PacketOut { port, frame } = body(&bytes)?;
    let frame = control::unhex(&frame)
        .map_err(|e| ApiFailure::from(ControlError::new(ErrorKind::Invalid, "frame", e)))?;
    call(&api, move |sw, _, emit| sw.send_frame(port, frame, emit)).await??;
    Ok(StatusCode::ACCEPTED.into_response())
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Take {
    /// Most frames returned.
    max: Option<usize>,
    /// Milliseconds to wait for a first frame when none is queued.
    wait_ms: Option<u64>,
}

async fn take_packets(State(api): State<Shared>, RawQuery(query): RawQuery) -> Reply {
    let take: Take = query_args(query.as_deref().unwrap_or(""))?;
    let max = take.max.unwrap_or(100).clamp(1, control::CPU_QUEUE);
    let deadline = tokio::time::Instant::now()
        + Duration::from_millis(take.wait_ms.unwrap_or(0)).min(MAX_WAIT);
    loop {
        let frames: Vec<_> = call(&api, move |sw, _, _| sw.take_cpu(max))
            .await??
            .iter()
            .map(|p| p.view())
            .collect();
        if !frames.is_empty() || tokio::time::Instant::now() >= deadline {
            return ok(json!({ "frames": frames }));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Watch {
    /// End the stream after this many frames; unbounded if not given.
    count: Option<u64>,
    /// End the stream after this many milliseconds; unbounded if not given.
    ms: Option<u64>,
}

/// Most packet streams open at once; past it a new one is refused (503).
pub const MAX_STREAMS: usize = 4;

/// Holds one of the [`MAX_STREAMS`] places while a stream is open.
struct StreamPlace(Shared);

impl Drop for StreamPlace {
    fn drop(&mut self) {
        self.0
            .streams
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Refused calls in a row (one every [`STREAM_POLL`]) after which a stream ends.
const STREAM_PATIENCE: u32 = 100;

/// How often a stream looks for frames when none came last time.
const STREAM_POLL: Duration = Duration::from_millis(10);

/// The frames sent to the CPU as they come, one JSON object a line (NDJSON), until `count`
/// frames, `ms` milliseconds, the client goes away or the switch stops. Each frame goes to one reader: a stream
/// and `GET /api/v1/packets` share the queue.
async fn stream_packets(State(api): State<Shared>, RawQuery(query): RawQuery) -> Reply {
    let watch: Watch = query_args(query.as_deref().unwrap_or(""))?;
    // Refuse at once, before the 200, when there is no switch, an agent on the CPU channel
    // takes the frames, or too many streams are open.
    call(&api, |sw, _, _| sw.take_cpu(0).map(drop)).await??;
    let open = api
        .streams
        .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    let place = StreamPlace(api.clone());
    if open >= MAX_STREAMS {
        return Err(ApiFailure::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{MAX_STREAMS} packet streams are open already; close one first"),
        ));
    }
    let left = watch.count.unwrap_or(u64::MAX);
    let until = watch
        .ms
        .and_then(|ms| tokio::time::Instant::now().checked_add(Duration::from_millis(ms)));
    let frames = futures_util::stream::unfold((place, left), move |(place, left)| async move {
        if left == 0 {
            return None;
        }
        let max = usize::try_from(left)
            .unwrap_or(usize::MAX)
            .min(control::CPU_QUEUE);
        // A busy switch is asked again; one that does not answer for a second ends the stream.
        let mut refused = 0;
        loop {
            let frames = match call(&place.0, move |sw, _, _| sw.take_cpu(max)).await {
                Ok(Ok(frames)) => frames,
                // An agent on the CPU channel took the frames over: the stream ends.
                Ok(Err(_)) => return None,
                Err(_) if refused < STREAM_PATIENCE => {
                    refused += 1;
                    tokio::time::sleep(STREAM_POLL).await;
                    continue;
                }
                Err(_) => return None,
            };
            refused = 0;
            if frames.is_empty() {
                if until.is_some_and(|t| tokio::time::Instant::now() >= t) {
                    return None;
                }
                tokio::time::sleep(STREAM_POLL).await;
                continue;
            }
            let mut lines = String::new();
            for f in &frames {
                lines.push_str(&serde_json::to_string(&f.view()).unwrap_or_default());
                lines.push('\n');
            }
            let left = left - frames.len() as u64;
            return Some((
                Ok::<_, std::convert::Infallible>(Bytes::from(lines)),
                (place, left),
            ));
        }
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        axum::body::Body::from_stream(frames),
    )
        .into_response())
}

/// Parses `a=1&b=2` into `T`, naming a bad parameter.
fn query_args<T: DeserializeOwned>(query: &str) -> Result<T, ApiFailure> {
    let mut map = serde_json::Map::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = match value.parse::<u64>() {
            Ok(n) => json!(n),
            Err(_) => json!(value),
        };
        map.insert(name.to_string(), value);
    }
    serde_json::from_value(Value::Object(map))
        .map_err(|e| ApiFailure::new(StatusCode::BAD_REQUEST, format!("query: {e}")))
}

async fn pool(State(api): State<Shared>) -> Reply {
    let now = kvio::clock::now();
    let pools: Vec<Value> = api
        .pools
        .iter()
        .map(|pool| {
            let spec = pool.spec();
            let view = pool.view(now);
            let servers: Vec<Value> = spec
                .servers
                .iter()
                .enumerate()
                .filter(|(i, _)| !pool.health(*i).removed)
                .map(|(i, s)| {
                    json!({
                        "server": i,
                        "label": s.label(),
                        "addr": s.addr.to_string(),
                        "name": s.name,
                        "weight": s.weight,
                        "in_ring": view.live().contains(&i),
                        "failures": pool.health(i).failures,
                    })
                })
                .collect();
            json!({
                "name": spec.name,
                "distribution": spec.distribution.to_string(),
                "hash": spec.hash.to_string(),
                "replicas": spec.replicas,
                "version": pool.version(),
                "servers": servers,
                "staged": api.staged.doc(&spec.name),
            })
        })
        .collect();
    ok(json!({ "pools": pools }))
}

/// The pool `name` names, or the only one.
fn pool_named(api: &Api, name: Option<&str>) -> Result<Arc<Pool>, ApiFailure> {
    let invalid = |e: String| ApiFailure::from(ControlError::new(ErrorKind::Invalid, "pool", e));
    match (name, api.pools.as_slice()) {
        (_, []) => Err(ApiFailure::new(
            StatusCode::NOT_FOUND,
            "no pool is served here",
        )),
        (None, [one]) => Ok(one.clone()),
        (None, _) => Err(invalid("several pools: say which with \"pool\"".into())),
        (Some(n), pools) => pools
            .iter()
            .find(|p| p.spec().name == n)
            .cloned()
            .ok_or_else(|| ApiFailure::new(StatusCode::NOT_FOUND, format!("no pool {n:?}"))),
    }
}

fn pool_failure(e: PoolChangeError) -> ApiFailure {
    let kind = match e {
        PoolChangeError::UnknownServer(_) => ErrorKind::NotFound,
        PoolChangeError::Duplicate(_) => ErrorKind::Conflict,
        PoolChangeError::Full => ErrorKind::Full,
        PoolChangeError::BadWeight(_) => ErrorKind::Invalid,
        PoolChangeError::Ring(_) | PoolChangeError::BadServer(..) => ErrorKind::Invalid,
    };
    let field = match e {
        PoolChangeError::BadWeight(_) => "weight",
        _ => "server",
    };
    ControlError::new(kind, field, e.to_string()).into()
}

async fn add_server(State(api): State<Shared>, bytes: Bytes) -> Reply {
    let s: NewServer = body(&bytes)?;
    let pool = pool_named(&api, s.pool.as_deref())?;
    let warm = s
        .warm()
        .map_err(|e| ApiFailure::from(ControlError::new(ErrorKind::Invalid, "warm_ms", e)))?;
    let until = warm.map(|w| kvio::clock::now() + w);
    let server = s.spec();
    let changed = pool.add_warming(server, until).map_err(pool_failure)?;
    grow_caches(&pool, &pool.spec().name, &api.exporter.caches());
    Ok((
        StatusCode::CREATED,
        Json(json!({ "server": changed.server, "version": changed.version })),
    )
        .into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Weight {
    weight: u32,
    pool: Option<String>,
}

fn server_named(pool: &Pool, server: &str) -> Result<usize, ApiFailure> {
    pool.find(server)
        .ok_or_else(|| pool_failure(PoolChangeError::UnknownServer(server.to_string())))
}

async fn reweight_server(
    State(api): State<Shared>,
    Path(server): Path<String>,
    bytes: Bytes,
) -> Reply {
    let w: Weight = body(&bytes)?;
    let pool = pool_named(&api, w.pool.as_deref())?;
    let i = server_named(&pool, &server)?;
    let changed = pool.set_weight(i, w.weight).map_err(pool_failure)?;
    ok(json!({ "server": changed.server, "version": changed.version }))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Which {
    pool: Option<String>,
}

async fn remove_server(
    State(api): State<Shared>,
    Path(server): Path<String>,
    RawQuery(query): RawQuery,
) -> Reply {
    let which: Which = query_args(query.as_deref().unwrap_or(""))?;
    let pool = pool_named(&api, which.pool.as_deref())?;
    let i = server_named(&pool, &server)?;
    let changed = pool.remove_server(i).map_err(pool_failure)?;
    ok(json!({ "server": changed.server, "version": changed.version }))
}

async fn reload(State(api): State<Shared>) -> Reply {
    let reload = api.reload.clone().ok_or_else(|| {
        ApiFailure::new(
            StatusCode::NOT_FOUND,
            "started without a configuration file to read",
        )
    })?;
    // Reading a file is blocking work: off the runtime's thread.
    match tokio::task::spawn_blocking(move || reload()).await {
        Ok(Ok(done)) => ok(done),
        Ok(Err(e)) => Err(ApiFailure::new(
            StatusCode::BAD_REQUEST,
            format!("the configuration was not reloaded, the running one is kept: {e:#}"),
        )),
        Err(e) => Err(ApiFailure::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            e.to_string(),
        )),
    }
}

async fn cache_status(State(api): State<Shared>, RawQuery(query): RawQuery) -> Reply {
    let q = cache_query(query.as_deref().unwrap_or(""))
        .map_err(|e| ApiFailure::new(StatusCode::BAD_REQUEST, e.to_string()))?;
    let limit = q.limit.unwrap_or(STATUS_ENTRIES);
    ok(cache::status(&api.exporter.caches(), limit))
}

async fn cache_action(
    State(api): State<Shared>,
    Path(action): Path<String>,
    RawQuery(query): RawQuery,
    _headers: HeaderMap,
) -> Reply {
    let q = cache_query(query.as_deref().unwrap_or(""))
        .map_err(|e| ApiFailure::new(StatusCode::BAD_REQUEST, e.to_string()))?;
    match cache::control(&api.exporter.caches(), &action, &q.pool, &q.key) {
        Ok(doc) => ok(doc),
        Err(ApiError::UnknownAction(a)) => Err(ApiFailure::new(
            StatusCode::NOT_FOUND,
            format!("unknown cache action {a:?}: pin, unpin or evict"),
        )),
        Err(e) => Err(ApiFailure::new(StatusCode::BAD_REQUEST, e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn the_document_describes_exactly_the_routes_served() {
        let doc: Value = serde_json::from_str(OPENAPI).expect("the OpenAPI document is JSON");
        assert!(doc["openapi"].as_str().unwrap_or("").starts_with("3."));
        let mut documented = BTreeSet::new();
        for (path, ops) in doc["paths"].as_object().expect("paths") {
            for method in ops.as_object().expect("operations").keys() {
                if method != "parameters" {
                    documented.insert((path.clone(), method.clone()));
                }
            }
        }
        let served: BTreeSet<(String, String)> = ROUTES
            .iter()
            .flat_map(|(p, ms)| ms.iter().map(move |m| (p.to_string(), m.to_string())))
            .collect();
        assert_eq!(
            served.difference(&documented).collect::<Vec<_>>(),
            Vec::<&(String, String)>::new(),
            "served but not documented"
        );
        assert_eq!(
            documented.difference(&served).collect::<Vec<_>>(),
            Vec::<&(String, String)>::new(),
            "documented but not served"
        );
    }
}
