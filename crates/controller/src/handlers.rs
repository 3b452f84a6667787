//! The controller's HTTP API: the dashboard and the fleet it reads, the status document,
//! `/metrics`, and servers added to and removed from the pool.

use super::*;

pub(crate) fn serve(listener: TcpListener, shared: Arc<Shared>) -> anyhow::Result<SocketAddr> {
    let app = Router::new()
        .route("/", get(dashboard))
        .route("/api/v1/fleet", get(fleet))
        .route("/metrics", get(metrics))
        .route("/api/v1/status", get(status))
        .route("/api/v1/pool/servers", post(add_server))
        .route("/api/v1/pool/servers/{server}", delete(remove_server))
        .route("/api/v1/routes", get(routes::show).put(routes::replace))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(shared.clone());
    api::server::spawn_server(listener, app, shared.guard.clone(), "controller-api", false)
}

pub(crate) type Reply = Result<Response, ApiFailure>;

pub(crate) fn refuse(status: StatusCode, error: impl Into<String>) -> ApiFailure {
    ApiFailure::new(status, error)
}

pub(crate) fn authorised(shared: &Shared, headers: &HeaderMap) -> Result<(), ApiFailure> {
    let Some(token) = &shared.token else {
        return Ok(());
    };
    match api::server::bearer_is(headers, token) {
        true => Ok(()),
        false => Err(refuse(
            StatusCode::UNAUTHORIZED,
            "changes need the API token: send `Authorization: Bearer <token>`",
        )),
    }
}

/// Refuses a change on a controller that does not lead, naming the one that does.
pub(crate) fn leading(f: &Fleet) -> Result<(), ApiFailure> {
    match f.acting() {
        true => Ok(()),
        false => Err(refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "this controller stands by; the leader is {}",
                f.leader.as_deref().unwrap_or("not known yet")
            ),
        )),
    }
}

/// Stores the pool's new servers before the change is taken, when there is a store.
pub(crate) fn stored(shared: &Shared, list: &[ServerSpec]) -> Result<(), ApiFailure> {
    match shared.store() {
        Some(e) => e.store_servers(list).map_err(|e| {
            refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the change was not stored, so not made: {e:#}"),
            )
        }),
        None => Ok(()),
    }
}

pub(crate) async fn dashboard() -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        api::DASHBOARD,
    )
        .into_response()
}

/// How long the fleet view waits for one switch's status.
pub(crate) const FLEET_WAIT: Duration = Duration::from_millis(500);

/// The controller's status and every switch's own status (fetched now, all at once), for the
/// dashboard.
pub(crate) async fn fleet(State(shared): State<Arc<Shared>>) -> Json<Value> {
    let doc = status_doc(&shared);
    let switches = shared.fleet().file.switches.clone();
    let clients: Vec<Client> = switches
        .iter()
        .map(|sw| shared.switch_client(sw.api))
        .collect();
    let statuses = tokio::task::spawn_blocking(move || {
        std::thread::scope(|s| {
            let jobs: Vec<_> = clients
                .into_iter()
                .map(|client| {
                    s.spawn(move || client.call_within("GET", "/api/v1/status", None, FLEET_WAIT))
                })
                .collect();
            jobs.into_iter()
                .map(|j| {
                    j.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer")))
                })
                .collect::<Vec<_>>()
        })
    })
    .await
    .unwrap_or_default();
    let mut list = doc["switches"].as_array().cloned().unwrap_or_default();
    for (sw, st) in list.iter_mut().zip(statuses) {
        match st {
            Ok(st) => sw["status"] = st,
            Err(e) => sw["error"] = json!(format!("{e:#}")),
        }
    }
    Json(json!({ "controller": doc, "switches": list }))
}

pub(crate) fn status_doc(shared: &Shared) -> Value {
    let f = shared.fleet();
    let spare = |k: Option<usize>| {
        k.and_then(|k| f.file.failover.get(k))
            .map(|a| a.to_string())
    };
    let servers: Vec<Value> = f
        .servers
        .iter()
        .zip(&f.health)
        .zip(&f.standing_in)
        .map(|((s, h), k)| {
            json!({
                "label": s.label(), "addr": s.addr.to_string(), "weight": s.weight,
                "up": h.up(), "probes": h.probes, "failures": h.failures, "downs": h.downs,
                "tkos": h.tkos, "last_error": h.last_error, "spare": spare(*k),
            })
        })
        .collect();
    let spares: Vec<Value> = f
        .file
        .failover
        .iter()
        .zip(&f.spare_health)
        .enumerate()
        .map(|(k, (a, h))| {
            let for_server = f
                .standing_in
                .iter()
                .position(|&s| s == Some(k))
                .map(|i| f.servers[i].label());
            json!({ "addr": a.to_string(), "up": h.up(), "standing_in_for": for_server })
        })
        .collect();
    let switches: Vec<Value> = f
        .file
        .switches
        .iter()
        .zip(&f.switches)
        .zip(&f.kept)
        .map(|((sw, st), kept)| {
            json!({
                "name": sw.name, "api": sw.api.to_string(), "in_step": st.in_step,
                "syncs": st.syncs, "changes": st.changes, "errors": st.errors,
                "last_error": st.last_error,
                "in_step_ms_ago": st.last_in_step.map(|t| t.elapsed().as_millis() as u64),
                "kept": kept.doc(),
            })
        })
        .collect();
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_s": shared.started.elapsed().as_secs(),
        "pool": f.file.pool.name,
        "role": match (shared.store.is_some(), f.leads) {
            (false, _) => "alone",
            (true, true) => "leader",
            (true, false) => "standby",
        },
        "leader": match (shared.store.is_some(), f.leads) {
            (false, _) => None,
            (true, true) => Some(shared.me.clone()),
            (true, false) => f.leader.clone(),
        },
        "generation": f.generation,
        "last_change": f.spread.map(|c| json!({
            "generation": c.generation,
            "ms_ago": c.at.elapsed().as_secs_f64() * 1e3,
            "reached_every_switch_ms": c.reached.map(|d| d.as_secs_f64() * 1e3),
            "switches_reached": f.switches.iter().filter(|s| s.generation >= c.generation).count(),
        })),
        "pool_changes": f.file.pool_changes.name(),
        "together": (f.file.pool_changes == config::controller::PoolChanges::Together).then(|| json!({
            "taken": f.flip.taken, "stopped": f.flip.stopped,
            "last_skew_ms": f.flip.skew.as_secs_f64() * 1e3,
            "last_prepare_ms": f.flip.prepare.as_secs_f64() * 1e3,
            "last_lead_ms": f.flip.lead.as_secs_f64() * 1e3,
        })),
        "servers": servers,
        "spares": spares,
        "switches": switches,
        "cache_nodes": cache_nodes::status(&f.cache_nodes),
        "routes": routes::status(&shared.routes),
        "fabric": fabric::status(&f.fabric),
        "balance": crate::balance::status(f.file.balance, &f.balance),
        "scale": crate::scale::status(f.file.scale.as_ref(), &f.scale, &f.servers),
    })
}

pub(crate) async fn status(State(shared): State<Arc<Shared>>) -> Json<Value> {
    Json(status_doc(&shared))
}

pub(crate) async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    let f = shared.fleet();
    let mut m = Exposition::new();
    type ServerFigure = (&'static str, &'static str, Kind, fn(&Health) -> u64);
    const SERVERS: [ServerFigure; 5] = [
        (
            "kvswitch_controller_server_up",
            "1 while the server is in the pool.",
            Kind::Gauge,
            |h| u64::from(h.up()),
        ),
        (
            "kvswitch_controller_probes_total",
            "Probes sent.",
            Kind::Counter,
            |h| h.probes,
        ),
        (
            "kvswitch_controller_probe_failures_total",
            "Probes that failed.",
            Kind::Counter,
            |h| h.failures,
        ),
        (
            "kvswitch_controller_server_downs_total",
            "Times the server was marked down.",
            Kind::Counter,
            |h| h.downs,
        ),
        (
            "kvswitch_controller_server_tkos_total",
            "Times the switches' reports of failed requests marked the server down (TKO).",
            Kind::Counter,
            |h| h.tkos,
        ),
    ];
    for (name, help, kind, pick) in SERVERS {
        m.family(name, kind, help);
        for (s, h) in f.servers.iter().zip(&f.health) {
            m.sample(name, &[("server", &s.label())], pick(h));
        }
    }
    type SwitchFigure = (&'static str, &'static str, Kind, fn(&SwitchState) -> u64);
    const SWITCHES: [SwitchFigure; 3] = [
        (
            "kvswitch_controller_switch_in_step",
            "1 while the switch's pool matched at the last sync.",
            Kind::Gauge,
            |s| u64::from(s.in_step),
        ),
        (
            "kvswitch_controller_switch_changes_total",
            "Servers added, removed or reweighted on the switch.",
            Kind::Counter,
            |s| s.changes,
        ),
        (
            "kvswitch_controller_switch_errors_total",
            "Syncs that failed.",
            Kind::Counter,
            |s| s.errors,
        ),
    ];
    for (name, help, kind, pick) in SWITCHES {
        m.family(name, kind, help);
        for (sw, st) in f.file.switches.iter().zip(&f.switches) {
            m.sample(name, &[("switch", &sw.name)], pick(st));
        }
    }
    if let Some(reached) = f.last_spread.and_then(|c| c.reached) {
        m.single(
            "kvswitch_controller_change_spread_seconds",
            Kind::Gauge,
            "How long the last change that reached every switch took to reach the last one.",
            reached.as_secs_f64(),
        );
    }
    if f.file.pool_changes == config::controller::PoolChanges::Together {
        m.family(
            "kvswitch_controller_pool_changes_together_total",
            Kind::Counter,
            "Pool changes staged on every switch: taken by all at one instant, or stopped.",
        );
        for (outcome, n) in [("taken", f.flip.taken), ("stopped", f.flip.stopped)] {
            m.sample(
                "kvswitch_controller_pool_changes_together_total",
                &[("outcome", outcome)],
                n,
            );
        }
        m.single(
            "kvswitch_controller_pool_flip_skew_seconds",
            Kind::Gauge,
            "Between the first switch and the last to take the last change, by their clocks.",
            f.flip.skew.as_secs_f64(),
        );
    }
    crate::restore::metrics(&f.file.switches, &f.kept, &mut m);
    if f.file.balance.is_some() {
        crate::balance::metrics(&f.balance, &mut m);
    }
    if f.file.scale.is_some() {
        crate::scale::metrics(&f.scale, &mut m);
    }
    cache_nodes::metrics(&f.cache_nodes, &mut m);
    fabric::metrics(&f.fabric, &mut m);
    // The fleet is let go before the rest, which reads files.
    drop(f);
    routes::metrics(&shared.routes, &mut m);
    shared.guard.write_metrics(&mut m);
    m.standard("controller");
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], m.finish()).into_response()
}

pub(crate) async fn add_server(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Reply {
    authorised(&shared, &headers)?;
    let s: NewServer = api::body(&bytes)?;
    if s.weight == 0 {
        return Err(refuse(StatusCode::BAD_REQUEST, "weight: use 1 or more"));
    }
    let warm = s.warm().map_err(|e| refuse(StatusCode::BAD_REQUEST, e))?;
    // Probed now, so the switches need not wait for the next round to take it (or to know to
    // leave it out).
    let (timeout, udp, redis) = {
        let f = shared.fleet();
        (
            f.file.probe_timeout,
            f.file.probe_udp,
            f.file.pool.redis.clone(),
        )
    };
    let addr = s.addr;
    let sasl = shared.server_sasl.clone();
    let first = tokio::task::spawn_blocking(move || {
        let login = sasl.as_ref().map(|(u, p)| (u.as_str(), p.as_str()));
        probe_server(addr, timeout, redis.as_ref(), login, false)?;
        match udp {
            true => probe_udp(addr, timeout),
            false => Ok(()),
        }
    })
    .await
    .unwrap_or_else(|_| Err("the probe failed".into()));
    let mut f = shared.fleet();
    leading(&f)?;
    if s.pool.as_ref().is_some_and(|p| *p != f.file.pool.name) {
        return Err(refuse(
            StatusCode::NOT_FOUND,
            format!("pool: the controller's pool is {:?}", f.file.pool.name),
        ));
    }
    let server = s.spec();
    let label = server.label();
    admit(&shared, &mut f, server, first, warm)?;
    Ok((
        StatusCode::CREATED,
        Json(json!({ "server": label, "generation": f.generation })),
    )
        .into_response())
}

pub(crate) async fn remove_server(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(server): Path<String>,
) -> Reply {
    authorised(&shared, &headers)?;
    let mut f = shared.fleet();
    leading(&f)?;
    let Some(i) = f
        .servers
        .iter()
        .position(|s| s.label() == server || s.addr.to_string() == server)
    else {
        return Err(refuse(
            StatusCode::NOT_FOUND,
            format!("no server {server:?} in the pool"),
        ));
    };
    expel(&shared, &mut f, i)?;
    Ok(Json(json!({ "removed": server, "generation": f.generation })).into_response())
}

/// Adds `server` to the pool (stored first, with a store), its first probe's outcome
/// `first`, warming up for `warm` if given; every switch follows.
pub(crate) fn admit(
    shared: &Shared,
    f: &mut Fleet,
    server: ServerSpec,
    first: Result<(), String>,
    warm: Option<std::time::Duration>,
) -> Result<(), ApiFailure> {
    let label = server.label();
    if label.is_empty()
        || label.len() > 250
        || label.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            format!("name: {label:?} is not a server name (1 to 250 characters, no spaces)"),
        ));
    }
    if f.file.failover.contains(&server.addr) {
        return Err(refuse(
            StatusCode::CONFLICT,
            format!("{} is a failover spare", server.addr),
        ));
    }
    if f.servers
        .iter()
        .any(|o| o.label() == label || o.addr == server.addr)
    {
        return Err(refuse(
            StatusCode::CONFLICT,
            format!("{label} is in the pool already"),
        ));
    }
    if f.servers.len() >= switch::pool::MAX_SERVERS {
        return Err(refuse(StatusCode::CONFLICT, "the pool is full"));
    }
    let mut list = f.servers.clone();
    list.push(server);
    stored(shared, &list)?;
    f.servers = list;
    let mut health = Health::default();
    health.record(first, f.file.down_after, f.file.up_after);
    f.health.push(health);
    f.standing_in.push(None);
    if let Some(warm) = warm {
        f.warm_until.insert(label, Instant::now() + warm);
    }
    shared.bump(f);
    Ok(())
}

/// Takes the pool's server at `i` out (stored first, with a store); every switch follows.
pub(crate) fn expel(shared: &Shared, f: &mut Fleet, i: usize) -> Result<(), ApiFailure> {
    let mut list = f.servers.clone();
    list.remove(i);
    stored(shared, &list)?;
    f.servers = list;
    f.health.remove(i);
    f.standing_in.remove(i);
    shared.bump(f);
    Ok(())
}
