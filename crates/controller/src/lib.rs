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
use api::{ApiFailure, Client};

#[derive(Args, Debug)]
#[command(
    about = "Run a fleet of kvswitches as one: probe the pool's servers, take a dead one \
                   out of every switch and put it back when it answers, add and remove servers"
)]
pub struct ControllerArgs {
    /// The controller's file: [controller], [[switches]] and [pool] (see --example-config).
    #[arg(long, required_unless_present = "example_config")]
    pub config: Option<std::path::PathBuf>,
    /// Print an example file, every key explained, and exit.
    #[arg(long)]
    pub example_config: bool,
    /// Check the file and exit without starting.
    #[arg(long)]
    pub check: bool,
    /// Keep the pool in etcd (etcd://HOST:PORT) and run as one of several controllers, of
    /// which one leads and the others stand by; without it the file is the only state and
    /// this controller leads alone.
    #[arg(long, value_name = "URL")]
    pub store: Option<String>,
    /// etcd speaks TLS (an https:// URL): the authorities its certificate is checked against
    /// (PEM).
    #[arg(long, value_name = "FILE", requires = "store")]
    pub store_ca: Option<std::path::PathBuf>,
    /// The certificate chain (PEM) to show etcd when it asks for one (--client-cert-auth);
    /// with --store-key.
    #[arg(long, value_name = "FILE", requires_all = ["store_key", "store_ca"])]
    pub store_cert: Option<std::path::PathBuf>,
    /// The private key of --store-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "store_cert")]
    pub store_key: Option<std::path::PathBuf>,
    /// etcd has authentication on: authenticate as this user (with --store-password-file).
    #[arg(long, value_name = "USER", requires_all = ["store", "store_password_file"])]
    pub store_user: Option<String>,
    /// The file whose first line is --store-user's password.
    #[arg(long, value_name = "FILE", requires = "store_user")]
    pub store_password_file: Option<std::path::PathBuf>,
}

mod balance;
mod cache_nodes;
mod election;
pub mod etcd;
mod fabric;
mod handlers;
mod health;
pub mod keeper;
pub mod restore;
pub mod routes;
mod scale;
mod state_file;
mod sync;
mod together;

use election::*;
use handlers::*;
use health::*;
pub use health::{probe, probe_and_flush, probe_redis, probe_udp, Health};
use sync::*;

/// How often a standby tries to lead, and a leader renews its lease.
const CAMPAIGN_INTERVAL: Duration = Duration::from_millis(300);

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
    /// The fleet's generation it was last brought in step with.
    generation: u64,
}

/// The last change the switches had to follow, and how long it took to reach every one.
#[derive(Debug, Clone, Copy)]
struct Spread {
    generation: u64,
    at: Instant,
    /// The same instant by the wall clock, which the switches' reports of when they took a
    /// change are in.
    at_wall: std::time::SystemTime,
    /// Once every switch is in step with it (or a later generation).
    reached: Option<std::time::Duration>,
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
    /// What is kept of each switch (`keep_switch_state`), by position in the file.
    kept: Vec<restore::Kept>,
    /// The last change and how long it took to reach every switch.
    spread: Option<Spread>,
    /// The same for the last change that did reach every switch.
    last_spread: Option<Spread>,
    /// With `pool_changes = "together"`: the last change taken, and counts.
    flip: together::Flip,
    /// With `bounded_loads`: what the balancer measured and placed.
    balance: balance::Status,
    /// With `[scale]`: what the scaler read and changed.
    scale: scale::Status,
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
    /// Without a store: the file the switches' copies and the routes are kept in, if any.
    state_file: Option<state_file::StateFile>,
    /// This controller's API address, as it is named in the election.
    me: String,
    /// The token the switches' APIs want, for reading their status.
    switch_token: Option<String>,
    /// HTTPS to the switches' APIs, when they speak it.
    switch_https: Option<api::client::Https>,
    /// The user and password the servers want (SASL), when they want one.
    server_sasl: Option<(String, String)>,
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

    /// A client of the switch API at `api`, with the switches' token, over HTTPS when they
    /// speak it.
    pub(crate) fn switch_client(&self, api: SocketAddr) -> Client {
        Client::new(api, self.switch_token.clone()).with_https(self.switch_https.clone())
    }

    fn bump(&self, fleet: &mut Fleet) {
        fleet.generation += 1;
        fleet.spread = Some(Spread {
            generation: fleet.generation,
            at: Instant::now(),
            at_wall: std::time::SystemTime::now(),
            reached: None,
        });
        self.changed.notify_all();
    }
}

/// Runs `f` for `0..n` at once, a thread each; each outcome, or its panic.
fn at_once<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<std::thread::Result<T>> {
    std::thread::scope(|s| {
        let jobs: Vec<_> = (0..n)
            .map(|i| {
                s.spawn({
                    let f = &f;
                    move || f(i)
                })
            })
            .collect();
        jobs.into_iter().map(|j| j.join()).collect()
    })
}

/// The user and password the pool's servers want (SASL), read from the file `file` names.
fn server_login(file: &ControllerFile) -> anyhow::Result<Option<(String, String)>> {
    let Some(f) = &file.server_sasl else {
        return Ok(None);
    };
    let password =
        config::secret_line(&f.password_file, "SASL password file").map_err(anyhow::Error::msg)?;
    Ok(Some((f.user.clone(), password)))
}

/// Runs the controller until the process is stopped.
pub fn run(args: &ControllerArgs) -> anyhow::Result<()> {
    if args.example_config {
        print!("{}", config::controller::EXAMPLE);
        return Ok(());
    }
    let path = args
        .config
        .as_deref()
        .ok_or_else(|| anyhow::anyhow!("--config is required"))?;
    let file = config::controller::load(path)?;
    if args.check {
        // The files it names load (TLS for its API and towards the switches, the servers'
        // SASL password): a mistake is named here, not at start.
        Guard::new(file.api_serving.clone())?;
        if let Some(f) = &file.switch_tls {
            let own = f.own.as_ref().map(|(c, k)| (c.as_path(), k.as_path()));
            api::client::Https::load(&f.ca, own).context("HTTPS to the switches")?;
        }
        server_login(&file)?;
        println!(
            "{}: ok ({} switches, {} servers, api {}{}{})",
            path.display(),
            file.switches.len(),
            file.pool.servers.len(),
            file.api,
            if file.routes.is_some() {
                ", routes"
            } else {
                ""
            },
            if file.fabric.is_some() {
                ", fabric"
            } else {
                ""
            },
        );
        return Ok(());
    }
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
        Some(url) => {
            let https = match &args.store_ca {
                Some(ca) => Some(
                    api::client::Https::load(
                        ca,
                        args.store_cert.as_deref().zip(args.store_key.as_deref()),
                    )
                    .context("TLS to etcd")?,
                ),
                None => None,
            };
            let user = args
                .store_user
                .clone()
                .zip(args.store_password_file.clone());
            Some(etcd::Etcd::new(
                url,
                &file.pool.name,
                etcd::Access { https, user },
            )?)
        }
        None => None,
    };
    kvio::signal::install_stop_handlers();
    kvio::signal::install_reload_handler();
    let running = start(file, listener, token, switch_token, store)?;
    tracing::info!(api = %running.api, "controller running");
    while !kvio::signal::stop_requested() {
        std::thread::sleep(Duration::from_millis(100));
        if kvio::signal::reload_requested() {
            // The API's certificate files; the configuration itself takes a restart.
            api::server::reload_tls();
        }
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
    let guard = Guard::new(file.api_serving.clone())?;
    let keeper = match &file.fabric {
        Some(path) => {
            let cfg = config::fabric::FabricConfig::load(path)?;
            Some((
                keeper::Keeper::new(&cfg, file.down_after, keeper::fabric_token(&cfg)?)?,
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
        kept: vec![restore::Kept::default(); file.switches.len()],
        spread: None,
        last_spread: None,
        flip: together::Flip::default(),
        balance: balance::Status::default(),
        scale: scale::Status::default(),
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
    let switch_https = match &fleet.file.switch_tls {
        Some(f) => Some(
            api::client::Https::load(
                &f.ca,
                f.own.as_ref().map(|(c, k)| (c.as_path(), k.as_path())),
            )
            .context("HTTPS to the switches")?,
        ),
        None => None,
    };
    let server_sasl = server_login(&fleet.file)?;
    // With etcd the state is kept there; the file is for a controller that runs alone.
    let state_file = match (&fleet.file.state_file, &store) {
        (Some(path), None) => Some(state_file::StateFile::open(path)?),
        _ => None,
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
        state_file,
        me,
        switch_token,
        switch_https,
        server_sasl,
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
    let (keeps, routed) = {
        let f = shared.fleet();
        (f.file.keep_switch_state, f.file.routes.is_some())
    };
    if keeps || routed {
        let shared = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("restore".into())
                .spawn(move || restore::keep(&shared))?,
        );
    }
    if shared.fleet().file.balance.is_some() {
        let shared = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("balancer".into())
                .spawn(move || balance::balance(&shared))?,
        );
    }
    if shared.fleet().file.scale.is_some() {
        let shared = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("scaler".into())
                .spawn(move || scale::scale(&shared))?,
        );
    }
    // One syncer per switch: a switch out of reach holds up only its own; or, with changes
    // taken together, one changer for all.
    let (switches, together) = {
        let f = shared.fleet();
        (
            f.file.switches.len(),
            f.file.pool_changes == config::controller::PoolChanges::Together,
        )
    };
    if together {
        let shared = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("changer".into())
                .spawn(move || together::changer(&shared))?,
        );
    }
    for i in (0..switches).filter(|_| !together) {
        let shared = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("syncer-{i}"))
                .spawn(move || syncer(&shared, i))?,
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

    /// Keeps `value` (JSON) under `key`: in etcd with a store (only while this controller
    /// leads), else in the state file, else nowhere but in memory.
    fn save(&self, key: &str, value: &[u8]) -> anyhow::Result<()> {
        if let Some(e) = self.store() {
            return e.put_while_leading(key, value);
        }
        match &self.state_file {
            Some(f) => f.put(key, value),
            None => Ok(()),
        }
    }

    /// The value [`Shared::save`] kept under `key`, if any.
    fn load(&self, key: &str) -> anyhow::Result<Option<Vec<u8>>> {
        if let Some(e) = self.store() {
            return e.get(key);
        }
        Ok(self.state_file.as_ref().and_then(|f| f.get(key)))
    }
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
