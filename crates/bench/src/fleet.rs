//! `kvswitch bench fleet`: how long a pool change made through the controller takes to reach
//! every switch of a fleet (AppSwitch section 5.2 asks that it reach them all as one
//! update). On loopback: memcached servers, N `kvswitch proxy` processes each with its control
//! API, and `kvswitch controller` driving them; a spare server is added through the
//! controller's API and removed again, and after each change the controller's status says
//! when the last switch was brought in step with it (`last_change.reached_every_switch_ms`).
//! Each fleet size runs with each way of changing (`pool_changes`: `each`, `together`, with
//! the skew between the switches' taking a change); medians over the changes.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;
use testbed::local::{self, Proc, TempDir};

use super::output::{fmt, Machine, Output};
use super::Common;

pub const NAME: &str = "fleet";
/// Servers every switch starts with, by default.
const SERVERS: usize = 3;
/// The most servers `--servers` takes: with the spare, a pool's most.
const MAX_SERVERS: usize = switch::pool::MAX_SERVERS - 1;
/// Past this many servers they share memcached processes, each listening on this many
/// loopback addresses (127.0.2.1 and on, one port).
const SHARED_PAST: usize = 16;
const LISTENS_PER_PROCESS: usize = 250;
/// The most switches one run starts (the controller's file takes 256).
const MAX_SWITCHES: u32 = 200;

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// Fleet sizes, comma-separated [default: 2,8,100; 2,8 with --short].
    #[arg(long, value_delimiter = ',', value_name = "N,...")]
    pub switches: Vec<u32>,
    /// Changes timed at each size, alternately adding and removing the spare server
    /// [default: 10; 4 with --short].
    #[arg(long, value_parser = clap::value_parser!(u32).range(2..=200))]
    pub changes: Option<u32>,
    /// Servers in the pool, besides the spare added and removed [default: 3]. Past 16 they
    /// share memcached processes, each listening on 250 loopback addresses; the controller
    /// then probes them every `servers` ms rather than every 100 ms.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1023))]
    pub servers: Option<u32>,
}

impl Args {
    pub fn with(common: Common) -> Args {
        Args {
            common,
            switches: Vec::new(),
            changes: None,
            servers: None,
        }
    }

    fn sizes(&self) -> Vec<u32> {
        match (self.switches.is_empty(), self.common.short) {
            (false, _) => self.switches.clone(),
            (true, true) => vec![2, 8],
            (true, false) => vec![2, 8, 100],
        }
    }

    fn changes(&self) -> u32 {
        self.changes
            .unwrap_or(if self.common.short { 4 } else { 10 })
    }
}

/// One fleet size's figures, one way of changing.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    pub switches: u32,
    /// `each` or `together`.
    pub mode: &'static str,
    /// Together: between the first switch and the last to take each change, median.
    pub skew_ms: Option<f64>,
    /// Each change's time to reach every switch, in order (adds and removes alternate).
    pub reached_ms: Vec<f64>,
    pub median_ms: f64,
    pub max_ms: f64,
    /// Time from the API call's start to its answer (the change taken), median.
    pub api_ms: f64,
}

#[derive(Serialize)]
struct Results {
    scenario: &'static str,
    settings: serde_json::Value,
    machine: Machine,
    points: Vec<Point>,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// A free port on loopback.
fn free(ports: &local::Ports) -> anyhow::Result<SocketAddr> {
    Ok(SocketAddr::from((
        [127, 0, 0, 1],
        ports.pick([127, 0, 0, 1].into())?,
    )))
}

/// Everything one fleet size runs: killed on drop.
struct Fleet {
    _servers: Vec<Proc>,
    _proxies: Vec<Proc>,
    spare: SocketAddr,
    /// The controller's file, but for `pool_changes`.
    controller_file: String,
    controller_api: SocketAddr,
}

/// How the controller changes the switches' pools: `each` or `together`.
pub const MODES: [&str; 2] = ["each", "together"];

/// The controller of `fleet`, changing pools `mode`'s way; killed on drop.
fn controller(dir: &TempDir, fleet: &Fleet, mode: &str) -> anyhow::Result<(Proc, api::Client)> {
    let path = dir.path().join(format!("controller-{mode}.toml"));
    let text = fleet.controller_file.replacen(
        "[controller]\n",
        &format!("[controller]\npool_changes = \"{mode}\"\n"),
        1,
    );
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    let log = dir.path().join(format!("controller-{mode}.log"));
    let exe = std::env::current_exe().context("finding kvswitch itself")?;
    let mut cmd = Command::new(exe);
    cmd.arg("controller")
        .arg("--config")
        .arg(&path)
        .env("RUST_LOG", "warn");
    local::die_with_parent(&mut cmd);
    let mut proc = Proc::spawn_logged("kvswitch controller", &mut cmd, &log)?;
    proc.wait_listening(fleet.controller_api, Some(&log))?;
    Ok((proc, api::Client::new(fleet.controller_api, None)))
}

/// memcached listening on every address of `addrs` (one port), killed on drop.
fn shared_memcached(bin: &std::path::Path, addrs: &[SocketAddr]) -> anyhow::Result<Proc> {
    let listen: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
    let mut p = Proc::spawn(
        "memcached",
        Command::new(bin).args([
            "-U",
            "0",
            "-t",
            "1",
            "-m",
            "64",
            "-c",
            "4096",
            "-l",
            &listen.join(","),
            "-u",
            "nobody",
        ]),
    )?;
    for a in [addrs[0], addrs[addrs.len() - 1]] {
        p.wait_listening(a, None)?;
    }
    Ok(p)
}

fn start(dir: &TempDir, n: u32, server_count: usize) -> anyhow::Result<Fleet> {
    let memcached = local::require("memcached")?;
    let ports = local::Ports::default();
    let shared = server_count > SHARED_PAST;
    let mut addrs = Vec::new();
    let port = free(&ports)?.port();
    for i in 0..=server_count {
        addrs.push(match shared {
            // 127.0.2.1 and on, all on one port.
            true => SocketAddr::from(([127, 0, 2 + (i / 250) as u8, 1 + (i % 250) as u8], port)),
            false => free(&ports)?,
        });
    }
    let mut proxy_addrs = Vec::new();
    for _ in 0..n {
        proxy_addrs.push((free(&ports)?, free(&ports)?));
    }
    let controller_api = free(&ports)?;
    ports.release();
    let mut servers = Vec::new();
    match shared {
        true => {
            for chunk in addrs.chunks(LISTENS_PER_PROCESS) {
                servers.push(shared_memcached(&memcached, chunk)?);
            }
        }
        false => {
            for &a in &addrs {
                servers.push(local::memcached(&memcached, a)?);
            }
        }
    }
    let (spare, pool) = (addrs[server_count], &addrs[..server_count]);
    let mut pool_toml = String::from("[pool]\ndistribution = \"ketama\"\nhash = \"md5\"\n");
    for (i, a) in pool.iter().enumerate() {
        let _ = write!(
            pool_toml,
            "[[pool.servers]]\naddr = \"{a}\"\nname = \"s{}\"\n",
            i + 1
        );
    }
    let exe = std::env::current_exe().context("finding kvswitch itself")?;
    let mut proxies = Vec::new();
    for (k, (listen, api)) in proxy_addrs.iter().enumerate() {
        let path = dir.path().join(format!("proxy{k}.toml"));
        let text =
            format!("[proxy]\nlisten = \"{listen}\"\napi = \"{api}\"\nworkers = 1\n\n{pool_toml}");
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        let log = dir.path().join(format!("proxy{k}.log"));
        let mut cmd = Command::new(&exe);
        cmd.arg("proxy")
            .arg("--config")
            .arg(&path)
            .env("RUST_LOG", "warn");
        local::die_with_parent(&mut cmd);
        proxies.push(Proc::spawn_logged("kvswitch proxy", &mut cmd, &log)?);
    }
    for ((k, p), (_, api)) in proxies.iter_mut().enumerate().zip(&proxy_addrs) {
        p.wait_listening(*api, Some(&dir.path().join(format!("proxy{k}.log"))))?;
    }
    // Every server probed each interval, a thread each: a large pool is probed less often.
    let probe_ms = server_count.max(100);
    let mut text = format!(
        "[controller]\napi = \"{controller_api}\"\nprobe_interval_ms = {probe_ms}\n\
         probe_timeout_ms = 1000\nsync_interval_ms = 5000\nkeep_switch_state = false\n\n"
    );
    for (k, (_, api)) in proxy_addrs.iter().enumerate() {
        let _ = write!(text, "[[switches]]\nname = \"p{k}\"\napi = \"{api}\"\n");
    }
    text.push('\n');
    text.push_str(&pool_toml);
    Ok(Fleet {
        _servers: servers,
        _proxies: proxies,
        spare,
        controller_file: text,
        controller_api,
    })
}

/// Waits until the controller's last change is `generation` or later and has reached every
/// switch; its time to do so.
fn reached(ctl: &api::Client, generation: u64, limit: Duration) -> anyhow::Result<f64> {
    let started = Instant::now();
    loop {
        let status = ctl.call("GET", "/api/v1/status", None)?;
        let change = &status["last_change"];
        if change["generation"].as_u64().unwrap_or(0) >= generation {
            if let Some(ms) = change["reached_every_switch_ms"].as_f64() {
                return Ok(ms);
            }
        }
        if started.elapsed() > limit {
            bail!(
                "change {generation} had not reached every switch after {limit:?}: {}",
                status["last_change"]
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The fleet in step with its file's pool: every switch synced once.
fn settled(ctl: &api::Client, n: u32, limit: Duration) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let status = ctl.call("GET", "/api/v1/status", None)?;
        let in_step = status["switches"]
            .as_array()
            .map_or(0, |s| s.iter().filter(|s| s["in_step"] == true).count());
        if in_step == n as usize {
            return Ok(());
        }
        if started.elapsed() > limit {
            bail!("{in_step} of {n} switches in step after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn measure(
    dir: &TempDir,
    fleet: &Fleet,
    n: u32,
    mode: &'static str,
    changes: u32,
) -> anyhow::Result<Point> {
    let (_controller, ctl) = controller(dir, fleet, mode)?;
    let ctl = &ctl;
    settled(ctl, n, Duration::from_secs(30 + u64::from(n) / 2))?;
    let mut times = Vec::new();
    let mut api_times = Vec::new();
    let mut skews = Vec::new();
    for k in 0..changes {
        let asked = Instant::now();
        let answer = match k % 2 {
            0 => ctl.call(
                "POST",
                "/api/v1/pool/servers",
                Some(&serde_json::json!({"addr": fleet.spare.to_string(), "name": "spare"})),
            ),
            _ => ctl.call("DELETE", "/api/v1/pool/servers/spare", None),
        }
        .with_context(|| format!("change {k}"))?;
        api_times.push(asked.elapsed().as_secs_f64() * 1e3);
        let generation = answer["generation"]
            .as_u64()
            .context("the controller named no generation")?;
        times.push(reached(ctl, generation, Duration::from_secs(30))?);
        if mode == "together" {
            let status = ctl.call("GET", "/api/v1/status", None)?;
            if let Some(skew) = status["together"]["last_skew_ms"].as_f64() {
                skews.push(skew);
            }
        }
        // Let the fleet rest between changes.
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(Point {
        switches: n,
        mode,
        skew_ms: (!skews.is_empty()).then(|| median(&skews)),
        median_ms: median(&times),
        max_ms: times.iter().copied().fold(0.0, f64::max),
        api_ms: median(&api_times),
        reached_ms: times,
    })
}

fn summary(points: &[Point], changes: u32, servers: usize) -> String {
    let mut s = format!(
        "# Fleet: a pool change through the controller, to every switch\n\n\
         `kvswitch controller` drives N `kvswitch proxy` processes (each with its control API) \
         on loopback, in front of {servers} memcached servers; a spare is added through the \
         controller's API and removed again, {changes} changes in all, with each way of \
         changing (`pool_changes`). A change's time runs from the controller taking it to \
         the last switch brought in step with it (the status's \
         `last_change.reached_every_switch_ms`). `each`: every switch changed on its own (a \
         syncer per switch), so until the last one is, switches route some keys by \
         different pools. `together`: the change staged on every switch, then committed on \
         all for one instant ahead (three times the staging's time, 30 ms at least); the \
         time includes that lead and the controller's check that every switch took it. \
         Skew: between the first switch and the last to take it, by their own clocks.\n\n\
         | switches | each: median ms | each: max ms | together: median ms | together: max ms | together: skew ms |\n\
         |--:|--:|--:|--:|--:|--:|\n"
    );
    let mut sizes: Vec<u32> = points.iter().map(|p| p.switches).collect();
    sizes.dedup();
    for n in sizes {
        let of = |mode: &str| points.iter().find(|p| p.switches == n && p.mode == mode);
        let (each, together) = (of("each"), of("together"));
        let _ = writeln!(
            s,
            "| {n} | {} | {} | {} | {} | {} |",
            fmt(each.map(|p| p.median_ms), 1),
            fmt(each.map(|p| p.max_ms), 1),
            fmt(together.map(|p| p.median_ms), 1),
            fmt(together.map(|p| p.max_ms), 1),
            fmt(together.and_then(|p| p.skew_ms), 2),
        );
    }
    s
}

pub fn run(args: &Args) -> anyhow::Result<Vec<Point>> {
    let sizes = args.sizes();
    if let Some(&n) = sizes.iter().find(|&&n| n == 0 || n > MAX_SWITCHES) {
        bail!("--switches: {n}; each size must be 1 to {MAX_SWITCHES}");
    }
    let changes = args.changes();
    let server_count = args
        .servers
        .map_or(SERVERS, |n| n as usize)
        .min(MAX_SERVERS);
    let machine = Machine::describe();
    let out = Output::create(&super::bed::out_dir(args.common.out.as_ref(), NAME))?;
    let mut points = Vec::new();
    for &n in &sizes {
        let dir = TempDir::new("kvswitch-bench-fleet")?;
        let fleet = start(&dir, n, server_count)?;
        for mode in MODES {
            eprintln!("{NAME}: {n} switches, {server_count} servers, {changes} changes, {mode}...");
            let point = measure(&dir, &fleet, n, mode, changes)?;
            eprintln!(
                "{NAME}: {n} switches, {mode}: median {:.1} ms, max {:.1} ms to reach every switch",
                point.median_ms, point.max_ms
            );
            points.push(point);
        }
    }
    let results = Results {
        scenario: NAME,
        settings: serde_json::json!({
            "switches": sizes, "changes": changes, "servers": server_count, "modes": MODES,
            "short": args.common.short,
        }),
        machine: machine.clone(),
        points: points.clone(),
    };
    out.json(&results)?;
    out.summary(&summary(&points, changes, server_count), &machine)?;
    Ok(points)
}
