//! `kvswitch controller`: one pool served by a fleet of switches (or proxies), run as one.
//!
//! The controller owns the pool's servers and the list of switches, and changes the switches
//! only through their control APIs (`/api/v1/pool/servers`). It probes every server over TCP
//! with memcached's `version`; a server that fails [`ControllerFile::down_after`] probes in a
//! row is marked down and taken out of every switch's pool (its keys go to the next server on
//! the ring, as nutcracker's ejection does), and is put back once it has answered
//! [`ControllerFile::up_after`] probes in a row. Each switch is brought to the pool's live
//! servers at once after a change, and checked again every `sync_interval` (a switch that was
//! restarted or changed by hand is put right). Servers are added to and removed from the pool
//! through the controller's own API, which also serves its status and metrics.
//!
//! Threads: the prober, a syncer per switch (woken by a change or its interval) and the API,
//! which also serves the dashboard (`dashboard.html`, reading `/api/v1/fleet` once a second);
//! with a store, a fourth, the elector (see [`etcd`]).

use api::metrics::{Exposition, Kind, CONTENT_TYPE};
use client::memcached;
use std::collections::{BTreeMap, HashMap};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use clap::Args;
use config::controller::ControllerFile;
use serde_json::{json, Value};
use switch::pool::ServerSpec;

use api::guard::{Guard, MAX_BODY};
use api::pool::NewServer;
use api::Client;

#[derive(Args, Debug)]
#[command(
    about = "Run a fleet of kvswitches as one: probe the pool's servers, take a dead one \
                   out of every switch and put it back when it answers, add and remove servers"
)]
pub struct ControllerArgs {
    /// The controller's file: [controller], [[switches]] and [pool] (see the README).
    #[arg(long)]
    pub config: std::path::PathBuf,
    /// Keep the pool in etcd (etcd://HOST:PORT) and run as one of several controllers, of
    /// which one leads and the others stand by; without it the file is the only state and
    /// this controller leads alone.
    #[arg(long)]
    pub store: Option<String>,
}

mod cache_nodes;
pub mod etcd;
mod fabric;
pub mod keeper;
pub mod routes;

/// How often a standby tries to lead, and a leader renews its lease.
const CAMPAIGN_INTERVAL: Duration = Duration::from_millis(300);

/// What a server's probes say of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// Whether a probe has answered or failed yet: until then the server counts as up, but
    /// the switches are not changed on its account.
    pub known: bool,
    pub up: bool,
    /// Probes in a row that failed, or that answered.
    pub failed_in_row: u32,
    pub answered_in_row: u32,
    pub probes: u64,
    pub failures: u64,
    /// Times it was marked down.
    pub downs: u64,
    /// Times the switches' reports of its failed requests marked it down (TKO).
    pub tkos: u64,
    pub last_error: Option<String>,
}

impl Default for Health {
    /// A server starts up: it is in the pool until probes say otherwise.
    fn default() -> Health {
        Health {
            known: false,
            up: true,
            failed_in_row: 0,
            answered_in_row: 0,
            probes: 0,
            failures: 0,
            downs: 0,
            tkos: 0,
            last_error: None,
        }
    }
}

impl Health {
    /// Takes in one probe's outcome; returns whether the server changed between up and down.
    pub fn record(&mut self, outcome: Result<(), String>, down_after: u32, up_after: u32) -> bool {
        self.probes += 1;
        // The first probe says where the server stands, without a run of them: a controller
        // that has just started, or just taken the lead, puts no dead server back.
        if !self.known {
            self.known = true;
            let was = self.up;
            self.up = outcome.is_ok();
            if let Err(e) = outcome {
                self.failures += 1;
                self.failed_in_row = 1;
                self.last_error = Some(e);
                self.downs += 1;
            } else {
                self.answered_in_row = 1;
            }
            return was != self.up;
        }
        match outcome {
            Ok(()) => {
                self.failed_in_row = 0;
                self.answered_in_row = self.answered_in_row.saturating_add(1);
                if !self.up && self.answered_in_row >= up_after {
                    self.up = true;
                    return true;
                }
            }
            Err(e) => {
                self.failures += 1;
                self.answered_in_row = 0;
                self.failed_in_row = self.failed_in_row.saturating_add(1);
                self.last_error = Some(e);
                if self.up && self.failed_in_row >= down_after {
                    self.up = false;
                    self.downs += 1;
                    return true;
                }
            }
        }
        false
    }
}

impl Health {
    /// The switches report `failed` requests to the server within one probe interval, at
    /// least the TKO threshold: it is marked down now, and up again only after its probes
    /// answer. Returns whether it changed.
    pub fn tko(&mut self, failed: u64) -> bool {
        if !self.known || !self.up {
            return false;
        }
        self.up = false;
        self.answered_in_row = 0;
        self.downs += 1;
        self.tkos += 1;
        self.last_error = Some(format!("{failed} failed requests reported by the switches"));
        true
    }
}

/// What the controller knows of one switch.
#[derive(Debug, Clone, Default)]
struct SwitchState {
    /// Whether its pool matched the live servers at the last sync.
    in_step: bool,
    syncs: u64,
    errors: u64,
    /// Changes (adds, removals, new weights) made on it.
    changes: u64,
    last_error: Option<String>,
    /// When it was last found in step, for the status.
    last_in_step: Option<Instant>,
}

/// The fleet: the desired pool, the servers' health and the switches' states.
struct Fleet {
    file: ControllerFile,
    servers: Vec<ServerSpec>,
    health: Vec<Health>,
    switches: Vec<SwitchState>,
    /// Bumped on every change the switches must follow.
    generation: u64,
    /// The failover spares' health, by position in `file.failover`.
    spare_health: Vec<Health>,
    /// For each server, the spare standing in its place while it is down.
    standing_in: Vec<Option<usize>>,
    /// Whether this controller acts (probes, syncs, takes changes): always without a store.
    leads: bool,
    /// Whether the warning that every server fails its probes has been given.
    all_down_said: bool,
    /// With a store: the lead ends at this instant unless the lease is renewed (the time the
    /// last renewal was asked for, plus the lease, less a margin).
    lead_until: Option<Instant>,
    /// The leading controller's API, when another leads.
    leader: Option<String>,
    /// With a store: when this controller took the lead. A call the last leader made to a
    /// switch may still land for [`SWITCH_WAIT`] after it stopped leading.
    led_since: Option<Instant>,
    /// Each switch's last count of failed requests per server address, for TKO.
    reported: HashMap<(usize, String), u64>,
    /// Servers added with a warm-up, by label: until when they warm up. A switch that takes
    /// one in before then is asked to warm it for the time left.
    warm_until: HashMap<String, Instant>,
    /// The SwitchKV cache nodes the switches' steering entries lead to, by address.
    cache_nodes: BTreeMap<std::net::Ipv4Addr, cache_nodes::CacheNode>,
    /// The caching fabric whose registration table this controller keeps, if any.
    fabric: Option<fabric::FabricStatus>,
}

/// What the threads share.
struct Shared {
    fleet: Mutex<Fleet>,
    /// Wakes the syncer.
    changed: Condvar,
    stop: AtomicBool,
    token: Option<String>,
    started: Instant,
    /// The pool's state in etcd and the election, when there is a store.
    store: Option<Mutex<etcd::Etcd>>,
    /// This controller's API address, as it is named in the election.
    me: String,
    /// The token the switches' APIs want, for reading their status.
    switch_token: Option<String>,
    /// The versioned routes (`[routes]`, `/api/v1/routes`).
    routes: routes::Routes,
    /// What the API refused and the connections it holds.
    guard: Arc<Guard>,
}

impl Fleet {
    /// Whether this controller may act now: it leads, and (with a store) its lease has not
    /// run out by its own clock.
    fn acting(&self) -> bool {
        self.leads && self.lead_until.is_none_or(|t| Instant::now() < t)
    }
}

impl Shared {
    fn fleet(&self) -> MutexGuard<'_, Fleet> {
        self.fleet.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self, fleet: &mut Fleet) {
        fleet.generation += 1;
        self.changed.notify_all();
    }
}

/// Asks `addr` for memcached's `version` over TCP, within `timeout`.
pub fn probe(addr: SocketAddr, timeout: Duration) -> Result<(), String> {
    memcached::version(addr, timeout)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Empties the server at `addr` (`flush_all`), then asks it `version`, within `timeout`: the
/// probe of a server that is out of the pool, so that it comes back without the items it
/// held while writes to its keys went to other servers.
pub fn probe_and_flush(addr: SocketAddr, timeout: Duration) -> Result<(), String> {
    memcached::flush_then_version(addr, timeout)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Asks `addr` for memcached's `version` over UDP, within `timeout` (matched by request id,
/// not source: a switch in `l3` mode sends servers' replies from the VIP).
pub fn probe_udp(addr: SocketAddr, timeout: Duration) -> Result<(), String> {
    memcached::version_udp(addr, timeout)
        .map(drop)
        .map_err(|e| format!("udp: {e}"))
}

/// How long one call to a switch may take before the switch counts as out of reach.
pub(crate) const SWITCH_WAIT: Duration = Duration::from_secs(2);

/// Brings one switch's pool to `live` (the servers that should be in it, with their
/// weights): a server whose place goes to another address leaves first, then adds, new
/// weights and removals. Servers are named to the switch by their position in its pool (a
/// name that is a number would be read as one). A refused call does not stop the others;
/// every refusal is reported. `leads` is asked before each call, so that a controller that
/// lost the lead stops at once. Returns the changes made.
fn sync_switch(
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
    let same = |s: &ServerSpec, v: &Value| {
        v["label"].as_str() == Some(s.label().as_str())
            && v["addr"].as_str() == Some(s.addr.to_string().as_str())
    };
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
        if live.iter().any(|s| s.label() == label && !same(s, v)) {
            if let Some(p) = position(v) {
                let path = format!("/api/v1/pool/servers/{p}?pool={}", enc(&pool_name));
                call("DELETE", path, None, format!("removing {label}"))?;
            }
            gone.push(label);
        }
    }
    for s in live {
        match listed.iter().find(|v| same(s, v)) {
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
    for v in &listed {
        let label = v["label"].as_str().unwrap_or_default();
        if !live.iter().any(|s| same(s, v)) && !gone.contains(&label) {
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

/// Runs the controller until the process is stopped.
pub fn run(args: &ControllerArgs) -> anyhow::Result<()> {
    let file = config::controller::load(&args.config)?;
    let token = api::api_token(None, file.api)?;
    // The switches' token comes from the file alone: KVSWITCH_API_TOKEN is this
    // controller's own.
    let switch_token = match &file.switch_token_file {
        Some(f) => {
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("reading the switches' token file {}", f.display()))?;
            Some(text.lines().next().unwrap_or("").trim().to_string())
        }
        None => None,
    };
    let listener = TcpListener::bind(file.api)
        .with_context(|| format!("the controller's API cannot listen on {}", file.api))?;
    let store = match &args.store {
        Some(url) => Some(etcd::Etcd::new(url, &file.pool.name)?),
        None => None,
    };
    kvio::signal::install_stop_handlers();
    let running = start(file, listener, token, switch_token, store)?;
    tracing::info!(api = %running.api, "controller running");
    while !kvio::signal::stop_requested() {
        std::thread::sleep(Duration::from_millis(100));
    }
    tracing::info!("stopping");
    running.resign();
    Ok(())
}

/// A running controller, for tests and the command.
pub struct Running {
    pub api: SocketAddr,
    shared: Arc<Shared>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Running {
    /// Stops, and gives up the lead at once: the lease is revoked, so that a standby takes
    /// over now rather than when the lease would have run out (what `kvswitch controller`
    /// does on SIGINT or SIGTERM; a controller that dies keeps the lease until it runs out).
    pub fn resign(mut self) {
        self.halt();
        if let Some(mut e) = self.shared.store() {
            if e.leads() {
                tracing::info!("giving up the lead");
            }
            e.forget();
        }
    }

    /// Stops every thread and waits for them.
    fn halt(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        // Under the lock, so that the syncer cannot miss it between its check and its wait.
        let f = self.shared.fleet();
        self.shared.changed.notify_all();
        drop(f);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Starts the prober, the syncer and the API on `listener`.
pub fn start(
    file: ControllerFile,
    listener: TcpListener,
    token: Option<String>,
    switch_token: Option<String>,
    store: Option<etcd::Etcd>,
) -> anyhow::Result<Running> {
    let servers = file.pool.servers.clone();
    let guard = Guard::new(file.api_serving.clone());
    let keeper = match &file.fabric {
        Some(path) => {
            let cfg = config::fabric::FabricConfig::load(path)?;
            Some((
                keeper::Keeper::new(&cfg, file.down_after)?,
                path.display().to_string(),
            ))
        }
        None => None,
    };
    let fleet = Fleet {
        health: vec![Health::default(); servers.len()],
        spare_health: vec![Health::default(); file.failover.len()],
        standing_in: vec![None; servers.len()],
        switches: vec![SwitchState::default(); file.switches.len()],
        servers,
        file,
        generation: 1,
        leads: store.is_none(),
        lead_until: None,
        all_down_said: false,
        leader: None,
        reported: HashMap::new(),
        led_since: None,
        warm_until: HashMap::new(),
        cache_nodes: BTreeMap::new(),
        fabric: keeper.as_ref().map(|(_, file)| fabric::FabricStatus {
            file: file.clone(),
            ..Default::default()
        }),
    };
    let me = listener.local_addr()?.to_string();
    let elects = store.is_some();
    let shared = Arc::new(Shared {
        fleet: Mutex::new(fleet),
        changed: Condvar::new(),
        stop: AtomicBool::new(false),
        token,
        started: Instant::now(),
        store: store.map(Mutex::new),
        me,
        switch_token: switch_token.clone(),
        routes: routes::Routes::default(),
        guard,
    });
    let api = serve(listener, shared.clone())?;
    let mut threads = Vec::new();
    if elects {
        let shared = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("elector".into())
                .spawn(move || elector(&shared))?,
        );
    }
    let prober = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("prober".into())
            .spawn(move || prober(&shared))?
    };
    threads.push(prober);
    let watch = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("cache-nodes".into())
            .spawn(move || cache_nodes::watch(&shared))?
    };
    threads.push(watch);
    if let Some((keeper, _)) = keeper {
        let shared = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("fabric".into())
                .spawn(move || fabric::keep(&shared, keeper))?,
        );
    }
    // One syncer per switch: a switch out of reach holds up only its own.
    let switches = shared.fleet().file.switches.len();
    for i in 0..switches {
        let (shared, token) = (shared.clone(), switch_token.clone());
        threads.push(
            std::thread::Builder::new()
                .name(format!("syncer-{i}"))
                .spawn(move || syncer(&shared, i, token))?,
        );
    }
    Ok(Running {
        api,
        shared,
        threads,
    })
}

impl Shared {
    fn store(&self) -> Option<MutexGuard<'_, etcd::Etcd>> {
        self.store
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Leads when it can: takes the pool from etcd (or puts the file's there, the first time),
/// keeps the lease alive while leading, and stops acting the moment it cannot.
fn elector(shared: &Shared) {
    let mut complained = false;
    let until = |asked: Instant| Some(asked + etcd::LEASE_TTL.saturating_sub(etcd::LEAD_MARGIN));
    while !shared.stop.load(Ordering::Relaxed) {
        let leading = shared.fleet().leads;
        if leading {
            let asked = Instant::now();
            let kept = shared.store().is_some_and(|mut e| e.keep_leading());
            let mut f = shared.fleet();
            match kept {
                true => f.lead_until = until(asked),
                false => {
                    tracing::warn!("lost the lead (the lease ran out or etcd is out of reach)");
                    f.leads = false;
                    f.lead_until = None;
                    f.leader = None;
                }
            }
        } else {
            let asked = Instant::now();
            let outcome = shared.store().map(|mut e| {
                let won = e.campaign(&shared.me)?;
                if !won {
                    return anyhow::Ok((false, None, e.leader()?));
                }
                match e.servers() {
                    Ok(stored) => Ok((true, stored, None)),
                    Err(err) => {
                        // Not leading on a lease that is not being kept alive.
                        e.forget();
                        Err(err)
                    }
                }
            });
            match outcome {
                Some(Ok((true, stored, _))) => {
                    let mut f = shared.fleet();
                    if let Some(list) = stored {
                        f.standing_in = vec![None; list.len()];
                        f.servers = list;
                    } else {
                        let list = f.servers.clone();
                        if let Some(e) = shared.store() {
                            if let Err(err) = e.store_servers(&list) {
                                tracing::warn!("cannot store the pool: {err:#}");
                            }
                        }
                    }
                    // Health starts unknown: the switches change only after a probe round.
                    f.health = vec![Health::default(); f.servers.len()];
                    f.spare_health = vec![Health::default(); f.file.failover.len()];
                    f.leads = true;
                    f.led_since = Some(Instant::now());
                    f.lead_until = until(asked);
                    f.leader = None;
                    tracing::info!("leading");
                    shared.bump(&mut f);
                    complained = false;
                }
                Some(Ok((false, _, leader))) => {
                    shared.fleet().leader = leader;
                    complained = false;
                }
                Some(Err(e)) => {
                    if !complained {
                        tracing::warn!("cannot reach etcd: {e:#}");
                        complained = true;
                    }
                }
                None => return,
            }
        }
        std::thread::sleep(CAMPAIGN_INTERVAL);
    }
}

/// Probes every server each interval, all at once, and marks them up or down.
fn prober(shared: &Shared) {
    while !shared.stop.load(Ordering::Relaxed) {
        let began = Instant::now();
        if !shared.fleet().acting() {
            std::thread::sleep(CAMPAIGN_INTERVAL);
            continue;
        }
        let (servers, flush, interval, timeout, udp, switches, tko_after, pool) = {
            let f = shared.fleet();
            // The servers, then the failover spares.
            let addrs: Vec<SocketAddr> = f
                .servers
                .iter()
                .map(|s| s.addr)
                .chain(f.file.failover.iter().copied())
                .collect();
            // A server out of the pool is emptied as it is probed, so that it comes back
            // without items that writes made meanwhile, elsewhere, have replaced. Not while
            // every server is down: the switches then keep them all (see `desired`).
            let kept_all =
                f.health.iter().all(|h| !h.up) && f.standing_in.iter().all(Option::is_none);
            let flush: Vec<bool> = f
                .health
                .iter()
                .map(|h| f.file.flush_on_return && !kept_all && h.known && !h.up)
                .collect();
            (
                addrs,
                flush,
                f.file.probe_interval,
                f.file.probe_timeout,
                f.file.probe_udp,
                f.file.switches.clone(),
                f.file.tko_after,
                f.file.pool.name.clone(),
            )
        };
        let (outcomes, reports) = std::thread::scope(|s| {
            let reports: Vec<_> = switches
                .iter()
                .filter(|_| tko_after > 0)
                .map(|sw| {
                    let client = Client {
                        api: sw.api,
                        token: shared.switch_token.clone(),
                    };
                    let pool = &pool;
                    s.spawn(move || failures_reported(&client, pool, timeout.max(REPORT_WAIT)))
                })
                .collect();
            let probes: Vec<_> = servers
                .iter()
                .enumerate()
                .map(|(i, &addr)| {
                    let flush = flush.get(i).copied().unwrap_or(false);
                    s.spawn(move || {
                        match flush {
                            true => probe_and_flush(addr, timeout)?,
                            false => probe(addr, timeout)?,
                        }
                        match udp {
                            true => probe_udp(addr, timeout),
                            false => Ok(()),
                        }
                    })
                })
                .collect();
            let outcomes: Vec<Result<(), String>> = probes
                .into_iter()
                .map(|p| p.join().unwrap_or_else(|_| Err("the probe failed".into())))
                .collect();
            let reports: Vec<Option<Vec<(String, u64)>>> = reports
                .into_iter()
                .map(|r| r.join().ok().flatten())
                .collect();
            (outcomes, reports)
        });
        {
            let mut f = shared.fleet();
            let (down_after, up_after) = (f.file.down_after, f.file.up_after);
            let mut changed = false;
            let spares_at = servers.len() - f.file.failover.len();
            let mut outcomes = outcomes.into_iter();
            let mine: Vec<_> = outcomes.by_ref().take(spares_at).collect();
            for (k, outcome) in outcomes.enumerate() {
                if let Some(h) = f.spare_health.get_mut(k) {
                    // A spare's change matters only to a server it stands in for, or could.
                    changed |= h.record(outcome, down_after, up_after);
                }
            }
            let failed = new_failures(&mut f.reported, &reports);
            let mut returned = Vec::new();
            for (i, (addr, outcome)) in servers.iter().zip(mine).enumerate() {
                // The list may have changed while the probes ran.
                let Some(s) = f.servers.get(i).filter(|s| s.addr == *addr) else {
                    continue;
                };
                let label = s.label();
                let reported = failed.get(&addr.to_string()).copied().unwrap_or(0);
                let h = &mut f.health[i];
                if tko_after > 0 && reported >= u64::from(tko_after) && h.tko(reported) {
                    changed = true;
                    tracing::warn!(
                        server = %label,
                        failed = reported,
                        "server down: the switches report its requests failing (TKO)"
                    );
                    continue;
                }
                if h.record(outcome, down_after, up_after) {
                    changed = true;
                    if h.up {
                        returned.push(label.clone());
                    }
                    match h.up {
                        true => tracing::info!(server = %label, "server up: back in the pool"),
                        false => tracing::warn!(
                            server = %label,
                            error = h.last_error.as_deref().unwrap_or(""),
                            "server down: taken out of the pool"
                        ),
                    }
                }
            }
            // Back from being down, it warms up from where its keys were meanwhile.
            if let Some(warm) = f.file.return_warm.filter(|_| !returned.is_empty()) {
                let until = Instant::now() + warm;
                for label in returned {
                    f.warm_until.insert(label, until);
                }
            }
            if changed {
                shared.bump(&mut f);
            }
        }
        std::thread::sleep(interval.saturating_sub(began.elapsed()));
    }
}

/// How long the prober waits at least for a switch's report of failed requests.
const REPORT_WAIT: Duration = Duration::from_millis(200);

/// Each server's failed requests as one switch counts them (`GET /api/v1/pool`), by address;
/// `None` if the switch did not answer.
fn failures_reported(client: &Client, pool: &str, wait: Duration) -> Option<Vec<(String, u64)>> {
    let doc = client.call_within("GET", "/api/v1/pool", None, wait).ok()?;
    let pools = doc["pools"].as_array()?;
    // The controller's pool, or the only one (as the syncer picks it).
    let theirs = match pools.iter().find(|p| p["name"] == pool) {
        Some(p) => p,
        None if pools.len() == 1 => &pools[0],
        None => return None,
    };
    let servers = theirs["servers"].as_array().into_iter().flatten();
    Some(
        servers
            .filter_map(|v| Some((v["addr"].as_str()?.to_string(), v["failures"].as_u64()?)))
            .collect(),
    )
}

/// The failed requests each server's address gained, summed over the switches, since their
/// last reports (`last`, by switch and address, is brought up to date). A switch's first
/// report of a server, or a count that went down (the switch restarted), only sets where
/// counting starts; a server a switch no longer lists is forgotten, so that failures counted
/// while it was out (requests sent before it left) do not count when it is back.
fn new_failures(
    last: &mut HashMap<(usize, String), u64>,
    reports: &[Option<Vec<(String, u64)>>],
) -> HashMap<String, u64> {
    let mut gained: HashMap<String, u64> = HashMap::new();
    for (switch, report) in reports.iter().enumerate() {
        if let Some(listed) = report {
            last.retain(|(s, addr), _| *s != switch || listed.iter().any(|(a, _)| a == addr));
        }
        for (addr, failures) in report.iter().flatten() {
            let before = last.insert((switch, addr.clone()), *failures);
            if let Some(before) = before.filter(|b| b <= failures) {
                *gained.entry(addr.clone()).or_default() += failures - before;
            }
        }
    }
    gained
}

/// The servers the switches should have: those up, and in a down server's place (its ring
/// name, its weight) the failover spare standing in for it, if one is free and up. A spare
/// takes a place only where the ring would not tell it from the server: a named server, or one
/// on the spare's port.
fn live_servers(f: &mut Fleet) -> Vec<ServerSpec> {
    for i in 0..f.servers.len() {
        if let Some(k) = f.standing_in[i] {
            if f.health[i].up || !f.spare_health[k].up {
                f.standing_in[i] = None;
            }
        }
    }
    let mut live = Vec::with_capacity(f.servers.len());
    for i in 0..f.servers.len() {
        let s = &f.servers[i];
        if f.health[i].up {
            live.push(s.clone());
            continue;
        }
        if f.standing_in[i].is_none() {
            f.standing_in[i] = (0..f.file.failover.len()).find(|&k| {
                let spare = f.file.failover[k];
                f.spare_health[k].up
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
fn syncer(shared: &Shared, i: usize, token: Option<String>) {
    let mut done = 0u64;
    while !shared.stop.load(Ordering::Relaxed) {
        {
            let f = shared.fleet();
            // Not while standing by, nor before every server has been probed once.
            let probed = f.health.iter().chain(&f.spare_health).all(|h| h.known);
            if !f.acting() || !probed {
                drop(f);
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        }
        let (generation, pool, live, switch, warm) = {
            let mut f = shared.fleet();
            let live = desired(&mut f);
            let now = Instant::now();
            f.warm_until.retain(|_, t| *t > now);
            (
                f.generation,
                f.file.pool.name.clone(),
                live,
                f.file.switches[i].clone(),
                f.warm_until.clone(),
            )
        };
        let client = Client {
            api: switch.api,
            token: token.clone(),
        };
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
                done = generation;
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
        // Wait for a change, or the interval; retry a failure soon.
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
}

/// The servers every switch should have now ([`live_servers`]), but never none: when every
/// server fails its probes, the controller is more likely cut off than the servers all dead,
/// and an empty ring answers no one, so the switches keep every server (and their own
/// failure handling).
fn desired(f: &mut Fleet) -> Vec<ServerSpec> {
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

fn serve(listener: TcpListener, shared: Arc<Shared>) -> anyhow::Result<SocketAddr> {
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

type Reply = Result<Response, (StatusCode, Json<Value>)>;

fn refuse(status: StatusCode, error: impl Into<String>) -> (StatusCode, Json<Value>) {
    (status, Json(json!({ "error": error.into() })))
}

fn authorised(shared: &Shared, headers: &HeaderMap) -> Result<(), (StatusCode, Json<Value>)> {
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
fn leading(f: &Fleet) -> Result<(), (StatusCode, Json<Value>)> {
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
fn stored(shared: &Shared, list: &[ServerSpec]) -> Result<(), (StatusCode, Json<Value>)> {
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

async fn dashboard() -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        api::DASHBOARD,
    )
        .into_response()
}

/// How long the fleet view waits for one switch's status.
const FLEET_WAIT: Duration = Duration::from_millis(500);

/// The controller's status and every switch's own status (fetched now, all at once), for the
/// dashboard.
async fn fleet(State(shared): State<Arc<Shared>>) -> Json<Value> {
    let doc = status_doc(&shared);
    let switches = shared.fleet().file.switches.clone();
    let token = shared.switch_token.clone();
    let statuses = tokio::task::spawn_blocking(move || {
        std::thread::scope(|s| {
            let jobs: Vec<_> = switches
                .iter()
                .map(|sw| {
                    let client = Client {
                        api: sw.api,
                        token: token.clone(),
                    };
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

fn status_doc(shared: &Shared) -> Value {
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
                "up": h.up, "probes": h.probes, "failures": h.failures, "downs": h.downs,
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
            json!({ "addr": a.to_string(), "up": h.up, "standing_in_for": for_server })
        })
        .collect();
    let switches: Vec<Value> = f
        .file
        .switches
        .iter()
        .zip(&f.switches)
        .map(|(sw, st)| {
            json!({
                "name": sw.name, "api": sw.api.to_string(), "in_step": st.in_step,
                "syncs": st.syncs, "changes": st.changes, "errors": st.errors,
                "last_error": st.last_error,
                "in_step_ms_ago": st.last_in_step.map(|t| t.elapsed().as_millis() as u64),
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
        "servers": servers,
        "spares": spares,
        "switches": switches,
        "cache_nodes": cache_nodes::status(&f.cache_nodes),
        "routes": routes::status(&shared.routes),
        "fabric": fabric::status(&f.fabric),
    })
}

async fn status(State(shared): State<Arc<Shared>>) -> Json<Value> {
    Json(status_doc(&shared))
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    let f = shared.fleet();
    let mut m = Exposition::new();
    type ServerFigure = (&'static str, &'static str, Kind, fn(&Health) -> u64);
    const SERVERS: [ServerFigure; 5] = [
        (
            "kvswitch_controller_server_up",
            "1 while the server is in the pool.",
            Kind::Gauge,
            |h| u64::from(h.up),
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
    cache_nodes::metrics(&f.cache_nodes, &mut m);
    routes::metrics(&shared.routes, &mut m);
    fabric::metrics(&f.fabric, &mut m);
    shared.guard.write_metrics(&mut m);
    m.standard("controller");
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], m.finish()).into_response()
}

async fn add_server(State(shared): State<Arc<Shared>>, headers: HeaderMap, bytes: Bytes) -> Reply {
    authorised(&shared, &headers)?;
    let s: NewServer = serde_json::from_slice(&bytes)
        .map_err(|e| refuse(StatusCode::BAD_REQUEST, format!("body: {e}")))?;
    if s.weight == 0 {
        return Err(refuse(StatusCode::BAD_REQUEST, "weight: use 1 or more"));
    }
    let warm = s.warm().map_err(|e| refuse(StatusCode::BAD_REQUEST, e))?;
    // Probed now, so the switches need not wait for the next round to take it (or to know to
    // leave it out).
    let (timeout, udp) = {
        let f = shared.fleet();
        (f.file.probe_timeout, f.file.probe_udp)
    };
    let addr = s.addr;
    let first = tokio::task::spawn_blocking(move || {
        probe(addr, timeout)?;
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
    stored(&shared, &list)?;
    f.servers = list;
    let mut health = Health::default();
    health.record(first, f.file.down_after, f.file.up_after);
    f.health.push(health);
    f.standing_in.push(None);
    if let Some(warm) = warm {
        f.warm_until.insert(label.clone(), Instant::now() + warm);
    }
    shared.bump(&mut f);
    Ok((
        StatusCode::CREATED,
        Json(json!({ "server": label, "generation": f.generation })),
    )
        .into_response())
}

async fn remove_server(
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
    let mut list = f.servers.clone();
    list.remove(i);
    stored(&shared, &list)?;
    f.servers = list;
    f.health.remove(i);
    f.standing_in.remove(i);
    shared.bump(&mut f);
    Ok(Json(json!({ "removed": server, "generation": f.generation })).into_response())
}

/// The servers' health by label, for tests.
pub fn health(running: &Running) -> BTreeMap<String, Health> {
    let f = running.shared.fleet();
    f.servers
        .iter()
        .zip(&f.health)
        .map(|(s, h)| (s.label(), h.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_goes_down_after_its_failures_and_up_after_its_answers() {
        let fail = || Err("refused".to_string());
        // The first probe says where it stands at once.
        let mut dead = Health::default();
        assert!(dead.record(fail(), 3, 2));
        assert!(!dead.up && dead.known);
        let mut h = Health::default();
        assert!(!h.record(Ok(()), 3, 2));
        assert!(h.up && h.known);
        assert!(!h.record(fail(), 3, 2));
        assert!(!h.record(fail(), 3, 2));
        assert!(!h.record(Ok(()), 3, 2), "an answer starts the count again");
        assert!(!h.record(fail(), 3, 2));
        assert!(!h.record(fail(), 3, 2));
        assert!(h.record(fail(), 3, 2));
        assert!(!h.up);
        assert!(!h.record(fail(), 3, 2), "down once");
        assert!(!h.record(Ok(()), 3, 2));
        assert!(h.record(Ok(()), 3, 2));
        assert!(h.up);
        assert_eq!((h.probes, h.failures, h.downs), (10, 6, 1));
    }

    #[test]
    fn failed_requests_the_switches_report_mark_a_server_down_until_it_answers() {
        let mut h = Health::default();
        assert!(!h.tko(5), "not before its first probe");
        assert!(!h.record(Ok(()), 3, 2));
        assert!(h.tko(5));
        assert!(!h.up && h.tkos == 1 && h.downs == 1);
        assert!(!h.tko(5), "down once");
        assert!(!h.record(Ok(()), 3, 2));
        assert!(h.record(Ok(()), 3, 2), "up after its answers");

        // Counts are per switch and address; the first report only sets where they start, and
        // a count that fell (a restarted switch) starts again.
        let mut last = HashMap::new();
        let report = |n: u64, m: u64| Some(vec![("a:1".to_string(), n), ("b:1".to_string(), m)]);
        assert!(new_failures(&mut last, &[report(7, 1), report(2, 0)])
            .values()
            .all(|&n| n == 0));
        let gained = new_failures(&mut last, &[report(9, 1), report(3, 0)]);
        assert_eq!(gained.get("a:1"), Some(&3));
        assert_eq!(gained.get("b:1"), Some(&0));
        let gained = new_failures(&mut last, &[report(1, 1), None]);
        assert_eq!(
            gained.get("a:1"),
            None,
            "a restarted switch's counts start again"
        );
        let gained = new_failures(&mut last, &[report(2, 1), report(3, 0)]);
        assert_eq!(gained.get("a:1"), Some(&1));
        // Out of a switch's pool, then back with failures counted meanwhile: they do not
        // count.
        let without = Some(vec![("b:1".to_string(), 0)]);
        new_failures(&mut last, &[without, report(3, 0)]);
        let gained = new_failures(&mut last, &[report(9, 0), report(3, 0)]);
        assert_eq!(gained.get("a:1").copied().unwrap_or(0), 0);
    }

    #[test]
    fn a_probe_of_nothing_says_why() {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap();
        // Nothing listens there any more.
        let e = probe(port, Duration::from_millis(200)).unwrap_err();
        assert!(!e.is_empty());
        // Something that is not memcached.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            if let Ok((mut c, _)) = l.accept() {
                let _ = std::io::Write::write_all(&mut c, b"HELLO\r\n");
            }
        });
        let e = probe(addr, Duration::from_millis(500)).unwrap_err();
        assert!(e.contains("HELLO"), "{e}");
        let _ = t.join();
    }

    #[test]
    fn a_udp_probe_reads_the_frame_header() {
        let server = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            for reply in [&b"VERSION 1.6\r\n"[..], b"ERROR\r\n"] {
                if let Ok((n, from)) = server.recv_from(&mut buf) {
                    assert!(buf[8..n].starts_with(b"version"));
                    let mut out = buf[..8].to_vec();
                    out.extend_from_slice(reply);
                    let _ = server.send_to(&out, from);
                }
            }
        });
        assert_eq!(probe_udp(addr, Duration::from_secs(2)), Ok(()));
        let e = probe_udp(addr, Duration::from_secs(2)).unwrap_err();
        assert!(e.contains("ERROR"), "{e}");
        let _ = t.join();
        let e = probe_udp(addr, Duration::from_millis(50)).unwrap_err();
        assert!(e.contains("udp"), "{e}");
    }
}
