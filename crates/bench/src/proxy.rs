//! `kvswitch bench proxy`: memcached direct, nutcracker and `kvswitch proxy` side by side on
//! loopback in one run, under the same load from two clients (the project's load generator
//! and memcslap), with each proxy's CPU time per request, checked against the TCP proxy's
//! targets. Every process it starts is its child, killed by its PID when the run ends or fails
//! (and by the kernel if this process dies first).

use std::fmt;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Serialize;
use testbed::local::{self, Ports, Proc, TempDir};

use super::output::loadavg;
use super::runner::{self, progress, rotated, Runs};
use super::{last_lines, memcslap, version_line};
use crate::measure::{per_s, CpuMeter};

/// The proxy's targets, from the issue that asked for it: at least 1.5x nutcracker's GET
/// throughput, a p99 GET latency within 1.3x of memcached direct's, and at most a third of
/// nutcracker's CPU time per request.
const TARGET_THROUGHPUT: f64 = 1.5;
const TARGET_P99: f64 = 1.3;
const TARGET_CPU: f64 = 1.0 / 3.0;

/// memcached's memory in MiB. Every memcslap run stores a fresh keyspace of values up to 5 KB;
/// at memcached's default of 64 MiB a few runs would evict the keys preloaded for the load
/// generator, whose gets would then miss.
const MEMCACHED_MB: u32 = 1024;
/// memcached's worker threads (its default, given so the figures say what ran).
const MEMCACHED_THREADS: u32 = 4;
/// memcslap's keys (and gets per thread) of the run that sizes the measured ones.
const CALIBRATION_KEYS: u64 = 1000;
/// Bounds of memcslap's keys per run: enough gets to time, and few enough that memcached's
/// memory holds many runs of them.
const MEMCSLAP_KEYS: (u64, u64) = (200, 50_000);

#[derive(clap::Args, Clone, Debug)]
pub struct ProxyBenchArgs {
    /// Measure every system with every client this many times, in rotating order, and report
    /// medians.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub runs: u32,
    /// Seconds of each load generator run. memcslap sets and gets a fixed number of keys,
    /// sized to take about this long against memcached direct.
    #[arg(long, default_value_t = 4.0)]
    pub duration: f64,
    /// Connections of each client: closed-loop requesters of kvswitch load, threads of
    /// memcslap.
    #[arg(long, default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub concurrency: u32,
    /// Keys preloaded for kvswitch load (memcslap makes its own).
    #[arg(long, default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub keys: u64,
    /// Value size of the preloaded keys, in bytes.
    #[arg(long, default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub value_size: u32,
    /// Worker threads of kvswitch proxy. One by default, as nutcracker is one thread: the
    /// servers and the clients share the machine's cores with the proxies, and a second
    /// worker takes them from the clients and halves each worker's batches to the servers.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub workers: u32,
    /// Also write every run's figures, the medians and the targets as JSON here.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
}

/// What serves the clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum System {
    /// The first memcached, holding every preloaded key, with no proxy in between.
    Direct,
    Nutcracker,
    Kvswitch,
}

impl System {
    const ALL: [System; 3] = [System::Direct, System::Nutcracker, System::Kvswitch];
}

impl fmt::Display for System {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            System::Direct => "memcached direct",
            System::Nutcracker => "nutcracker",
            System::Kvswitch => "kvswitch proxy",
        })
    }
}

/// What sends the load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Client {
    /// `kvswitch load`: closed-loop TCP gets of the preloaded keys, with latency percentiles.
    Loadgen,
    /// memcslap: gets of its own keys through libmemcached, timed as a whole.
    Memcslap,
}

impl Client {
    const ALL: [Client; 2] = [Client::Loadgen, Client::Memcslap];
}

impl fmt::Display for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Client::Loadgen => "kvswitch load",
            Client::Memcslap => "memcslap",
        })
    }
}

/// One client's run against one system.
#[derive(Clone, Debug, Serialize)]
struct Sample {
    system: System,
    client: Client,
    /// Gets answered (hit or miss, not an error) per second.
    get_rps: f64,
    /// Latency percentiles of the gets in µs; memcslap measures none.
    p50_us: Option<f64>,
    p99_us: Option<f64>,
    /// The proxy's CPU time (user + system, every thread) per request served, in µs; none for
    /// memcached direct.
    cpu_us_per_request: Option<f64>,
    /// Seconds of the measured window (kvswitch load) or of the get phase (memcslap).
    wall_s: f64,
    /// Seconds of memcslap's set phase.
    set_s: Option<f64>,
    /// Requests served: the gets, and memcslap's sets of its keys before them.
    requests: u64,
    gets: u64,
    hits: u64,
    /// Error replies, failed connections and timeouts.
    errors: u64,
}

impl runner::Figures for Sample {
    type At = (System, Client);

    fn at(&self) -> (System, Client) {
        (self.system, self.client)
    }

    /// The median of each figure over the runs of one system and client; counts are summed.
    fn median(runs: &Runs<'_, Sample>) -> Sample {
        let sum = |f: fn(&Sample) -> u64| runs.iter().map(f).sum();
        Sample {
            system: runs.first().system,
            client: runs.first().client,
            get_rps: runs.median(|s| s.get_rps),
            p50_us: runs.median_of_some(|s| s.p50_us),
            p99_us: runs.median_of_some(|s| s.p99_us),
            cpu_us_per_request: runs.median_of_some(|s| s.cpu_us_per_request),
            wall_s: runs.median(|s| s.wall_s),
            set_s: runs.median_of_some(|s| s.set_s),
            requests: sum(|s| s.requests),
            gets: sum(|s| s.gets),
            hits: sum(|s| s.hits),
            errors: sum(|s| s.errors),
        }
    }

    fn line(&self) -> String {
        format!(
            "{:<16}  {:<13}  {:>9.0} GET/s{}",
            self.system,
            self.client,
            self.get_rps,
            self.p99_us
                .map(|p| format!("  p99 {p:.0} µs"))
                .unwrap_or_default()
        )
    }
}

#[derive(Serialize)]
struct RunFigures {
    run: u32,
    /// The systems in the order measured.
    order: Vec<System>,
    samples: Vec<Sample>,
}

/// One target, checked on the medians of one client's runs.
#[derive(Serialize)]
struct Target {
    what: &'static str,
    client: Client,
    /// kvswitch's figure over the reference's; none when either is missing or zero.
    ratio: Option<f64>,
    bound: f64,
    /// The ratio must be at most `bound` (else at least).
    at_most: bool,
    met: bool,
}

#[derive(Serialize)]
struct Settings {
    runs: u32,
    duration_s: f64,
    concurrency: u32,
    keys: u64,
    value_size: u32,
    kvswitch_workers: u32,
    /// memcslap's keys, and gets per thread, of every measured run.
    memcslap_keys: u64,
    cores: usize,
    memcached_threads: u32,
    /// The machine's load averages (1, 5, 15 min) before the first run: other work on the
    /// cores skews every figure.
    loadavg_before: Option<[f64; 3]>,
}

#[derive(Serialize)]
struct Versions {
    memcached: String,
    nutcracker: String,
    memcslap: String,
}

#[derive(Serialize)]
struct Figures {
    scenario: &'static str,
    settings: Settings,
    versions: Versions,
    runs: Vec<RunFigures>,
    medians: Vec<Sample>,
    targets: Vec<Target>,
}

/// The processes measured, each killed by its PID when dropped, then the directory of their
/// configuration and logs.
struct Rig {
    servers: Vec<(SocketAddr, Proc)>,
    nutcracker: (SocketAddr, Proc),
    kvswitch: (SocketAddr, Proc),
    memcslap: PathBuf,
    dir: TempDir,
}

impl Rig {
    /// Starts 3 memcached, then nutcracker and kvswitch proxy over them with one nutcracker
    /// file (ketama, md5), each on a free loopback port, and waits until all accept
    /// connections.
    fn start(workers: u32) -> anyhow::Result<Rig> {
        let memcached_bin = local::require("memcached")?;
        let nutcracker_bin = local::require("nutcracker")?;
        let memcslap = local::require("memcslap")?;
        let dir = TempDir::new("kvswitch-bench-proxy")?;
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let ports = Ports::default();
        let server_addrs = [
            SocketAddr::new(lo, ports.pick(lo)?),
            SocketAddr::new(lo, ports.pick(lo)?),
            SocketAddr::new(lo, ports.pick(lo)?),
        ];
        let nutcracker_addr = SocketAddr::new(lo, ports.pick(lo)?);
        let nutcracker_stats = ports.pick(lo)?;
        let kvswitch_addr = SocketAddr::new(lo, ports.pick(lo)?);
        ports.release();

        let mut servers = Vec::new();
        for (i, &addr) in server_addrs.iter().enumerate() {
            let log = dir.path().join(format!("memcached-s{}.log", i + 1));
            let mut cmd = Command::new(&memcached_bin);
            cmd.args(["-U", "0", "-l", "127.0.0.1", "-u", "root"])
                .args(["-p", &addr.port().to_string()])
                .args(["-m", &MEMCACHED_MB.to_string()])
                .args(["-t", &MEMCACHED_THREADS.to_string()]);
            local::die_with_parent(&mut cmd);
            let mut p = Proc::spawn_logged("memcached", &mut cmd, &log)?;
            p.wait_listening(addr, Some(&log))?;
            servers.push((addr, p));
        }

        let text = pool_yaml(nutcracker_addr, &server_addrs);
        let (nutcracker, kvswitch) = start_proxies(
            &nutcracker_bin,
            &text,
            dir.path(),
            (nutcracker_addr, nutcracker_stats),
            kvswitch_addr,
            workers,
        )?;

        Ok(Rig {
            servers,
            nutcracker: (nutcracker_addr, nutcracker),
            kvswitch: (kvswitch_addr, kvswitch),
            memcslap,
            dir,
        })
    }

    fn addr(&self, system: System) -> SocketAddr {
        match system {
            System::Direct => self.servers[0].0,
            System::Nutcracker => self.nutcracker.0,
            System::Kvswitch => self.kvswitch.0,
        }
    }

    /// The proxy's PID, whose CPU time is measured; none for memcached direct.
    fn proxy_pid(&self, system: System) -> Option<u32> {
        match system {
            System::Direct => None,
            System::Nutcracker => Some(self.nutcracker.1.pid()),
            System::Kvswitch => Some(self.kvswitch.1.pid()),
        }
    }

    fn memcslap_log(&self) -> PathBuf {
        self.dir.path().join("memcslap.log")
    }

    /// The last lines of a proxy's log, for a report of its errors.
    fn log_tail(&self, system: System) -> String {
        let name = match system {
            System::Direct => "memcached-s1.log",
            System::Nutcracker => "nutcracker.log",
            System::Kvswitch => "kvswitch.log",
        };
        let text = std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        last_lines(&text, 5)
    }
}

/// nutcracker (its stats on `stats_port`) and `kvswitch proxy` (with `workers`) on one
/// nutcracker file, `pool`, written into `dir` (with their logs): nutcracker at the file's own
/// address, `nutcracker.0`, and kvswitch at `kvswitch` (`--listen` replaces the pool's). Both
/// are children that die with this process; waited for until they accept connections.
pub(crate) fn start_proxies(
    nutcracker_bin: &std::path::Path,
    pool: &str,
    dir: &std::path::Path,
    (nutcracker, stats_port): (SocketAddr, u16),
    kvswitch: SocketAddr,
    workers: u32,
) -> anyhow::Result<(Proc, Proc)> {
    let conf = dir.join("pool.yml");
    std::fs::write(&conf, pool).with_context(|| format!("writing {}", conf.display()))?;
    let mut cmd = local::nutcracker_command(nutcracker_bin, &conf, dir, stats_port);
    local::die_with_parent(&mut cmd);
    let mut twemproxy = Proc::spawn("nutcracker", &mut cmd)?;
    twemproxy.wait_listening(nutcracker, Some(&dir.join("nutcracker.log")))?;
    let log = dir.join("kvswitch.log");
    let mut cmd = Command::new(std::env::current_exe().context("finding kvswitch itself")?);
    cmd.arg("proxy")
        .arg("--nutcracker-config")
        .arg(&conf)
        .args(["--listen", &kvswitch.to_string()])
        .args(["--workers", &workers.to_string()])
        .env("RUST_LOG", "warn");
    local::die_with_parent(&mut cmd);
    let mut proxy = Proc::spawn_logged("kvswitch proxy", &mut cmd, &log)?;
    proxy.wait_listening(kvswitch, Some(&log))?;
    Ok((twemproxy, proxy))
}

/// nutcracker's pool over `servers`, named s1, s2, s3 on the ring: the file both proxies read.
fn pool_yaml(listen: SocketAddr, servers: &[SocketAddr]) -> String {
    let mut out = format!(
        "bench:\n  listen: {listen}\n  hash: md5\n  distribution: ketama\n  timeout: 1000\n  \
         auto_eject_hosts: false\n  servers:\n"
    );
    for (i, addr) in servers.iter().enumerate() {
        out.push_str(&format!("   - {addr}:1 s{}\n", i + 1));
    }
    out
}

pub fn run(args: &ProxyBenchArgs) -> anyhow::Result<()> {
    if !args.duration.is_finite() || args.duration <= 0.0 || args.duration > 3600.0 {
        bail!(
            "--duration must be between 0 and 3600 seconds, got {}",
            args.duration
        );
    }
    let workers = args.workers;
    eprintln!(
        "starting 3 memcached, nutcracker and kvswitch proxy ({workers} workers) on loopback..."
    );
    let loadavg_before = loadavg();
    let rig = Rig::start(workers)?;
    let versions = Versions {
        memcached: version_line(&local::require("memcached")?, "-V"),
        nutcracker: version_line(&local::require("nutcracker")?, "-V"),
        memcslap: version_line(&rig.memcslap, "--version"),
    };

    preload(&rig, args)?;
    let memcslap_keys = calibrate_memcslap(&rig, args)?;
    warm_up(&rig, args)?;
    eprintln!(
        "measuring: {} run(s); kvswitch load for {} s, then memcslap with {memcslap_keys} keys \
         and {memcslap_keys} gets per thread, on each system...",
        args.runs, args.duration
    );
    let runs = measure_runs(&rig, args, memcslap_keys)?;
    let samples: Vec<Sample> = runs.iter().flat_map(|r| r.samples.clone()).collect();
    let medians = runner::medians(&samples);
    let targets = targets(&medians);
    let settings = Settings {
        runs: args.runs,
        duration_s: args.duration,
        concurrency: args.concurrency,
        keys: args.keys,
        value_size: args.value_size,
        kvswitch_workers: workers,
        memcslap_keys,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        memcached_threads: MEMCACHED_THREADS,
        loadavg_before,
    };
    let mut out = std::io::stdout().lock();
    print_report(&mut out, &settings, &versions, &medians, &targets)?;
    print_notes(&mut out, &rig, &runs)?;
    if let Some(path) = &args.json {
        let figures = Figures {
            scenario: "proxy",
            settings,
            versions,
            runs,
            medians,
            targets,
        };
        let json = serde_json::to_string_pretty(&figures)?;
        std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))?;
        writeln!(out, "\nfigures written to {}", path.display())?;
    }
    // `rig` goes here: every process is killed by its PID and the directory removed.
    Ok(())
}

/// The load generator's keys: placed by ketama through kvswitch (nutcracker places them the
/// same way), and all of them on the first server for the direct runs.
fn preload(rig: &Rig, args: &ProxyBenchArgs) -> anyhow::Result<()> {
    eprintln!("preloading {} keys...", args.keys);
    for system in [System::Kvswitch, System::Direct] {
        let addr = rig.addr(system);
        let stored = loadgen::preload(
            addr,
            loadgen::Proto::Tcp,
            args.keys,
            "key:",
            args.value_size as usize,
        )?;
        if stored != args.keys {
            bail!(
                "only {stored} of {} keys were stored through {system}",
                args.keys
            );
        }
    }
    Ok(())
}

/// Every run: each client against each system, the systems in the run's order.
fn measure_runs(
    rig: &Rig,
    args: &ProxyBenchArgs,
    memcslap_keys: u64,
) -> anyhow::Result<Vec<RunFigures>> {
    let mut runs = Vec::new();
    for run in 0..args.runs {
        let order = rotated(&System::ALL, run);
        let mut samples = Vec::new();
        for client in Client::ALL {
            for &system in &order {
                let s = measure(rig, system, client, args, memcslap_keys)?;
                progress(run, args.runs, &s);
                samples.push(s);
            }
        }
        runs.push(RunFigures {
            run,
            order,
            samples,
        });
    }

    Ok(runs)
}

/// memcslap's keys per measured run, so that one run against memcached direct (its sets, then
/// as many gets per thread) takes about `--duration`: a short run times both phases there
/// first.
fn calibrate_memcslap(rig: &Rig, args: &ProxyBenchArgs) -> anyhow::Result<u64> {
    let probe = memcslap::run(
        &rig.memcslap,
        rig.addr(System::Direct),
        args.concurrency as usize,
        CALIBRATION_KEYS,
        &rig.memcslap_log(),
        memcslap_limit(args),
    )?;
    let secs_per_key = (probe.set_s + probe.get_s).max(1e-3) / CALIBRATION_KEYS as f64;
    let keys = (args.duration / secs_per_key).round() as u64;
    Ok(keys.clamp(MEMCSLAP_KEYS.0, MEMCSLAP_KEYS.1))
}

/// One short memcslap run through each proxy, unmeasured: without it the first measured run
/// through a proxy came out at about half the rate of the later ones.
fn warm_up(rig: &Rig, args: &ProxyBenchArgs) -> anyhow::Result<()> {
    for system in [System::Nutcracker, System::Kvswitch] {
        memcslap::run(
            &rig.memcslap,
            rig.addr(system),
            args.concurrency as usize,
            CALIBRATION_KEYS,
            &rig.memcslap_log(),
            memcslap_limit(args),
        )
        .with_context(|| format!("warming up {system}"))?;
    }
    Ok(())
}

/// How long one memcslap run may take before it is killed: a proxy several times slower than
/// memcached direct still finishes.
fn memcslap_limit(args: &ProxyBenchArgs) -> Duration {
    Duration::from_secs_f64(60.0 + 10.0 * args.duration)
}

fn measure(
    rig: &Rig,
    system: System,
    client: Client,
    args: &ProxyBenchArgs,
    memcslap_keys: u64,
) -> anyhow::Result<Sample> {
    let addr = rig.addr(system);
    let cpu = rig.proxy_pid(system).map(CpuMeter::start);
    let sample = match client {
        Client::Loadgen => {
            let load = loadgen::LoadArgs {
                proto: loadgen::Proto::Tcp,
                keys: args.keys,
                value_size: args.value_size as usize,
                get_ratio: 1.0,
                concurrency: args.concurrency as usize,
                duration: args.duration,
                quiet: true,
                ..loadgen::LoadArgs::new(addr.to_string())
            };
            let r =
                loadgen::run(&load).with_context(|| format!("kvswitch load against {system}"))?;
            Sample {
                system,
                client,
                get_rps: per_s(r.gets, r.duration_s),
                p50_us: Some(r.latency_us.p50 as f64),
                p99_us: Some(r.latency_us.p99 as f64),
                cpu_us_per_request: cpu.and_then(|m| m.per_request(r.requests)),
                wall_s: r.duration_s,
                set_s: None,
                requests: r.requests,
                gets: r.gets,
                hits: r.hits,
                errors: r.errors + r.timeouts,
            }
        }
        Client::Memcslap => {
            let threads = args.concurrency as usize;
            let m = memcslap::run(
                &rig.memcslap,
                addr,
                threads,
                memcslap_keys,
                &rig.memcslap_log(),
                memcslap_limit(args),
            )
            .with_context(|| format!("memcslap against {system}"))?;
            let issued = memcslap_keys * threads as u64;
            let gets = issued.saturating_sub(m.fatal);
            let requests = m.stored + issued;
            Sample {
                system,
                client,
                get_rps: per_s(gets, m.get_s),
                p50_us: None,
                p99_us: None,
                cpu_us_per_request: cpu.and_then(|c| c.per_request(requests)),
                wall_s: m.get_s,
                set_s: Some(m.set_s),
                requests,
                gets,
                hits: m.hits,
                errors: m.fatal,
            }
        }
    };
    Ok(sample)
}

/// The targets, on the medians, for every client that measures the figure.
fn targets(medians: &[Sample]) -> Vec<Target> {
    let find = |s: System, c: Client| medians.iter().find(|x| x.system == s && x.client == c);
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if a > 0.0 && b > 0.0 => Some(a / b),
        _ => None,
    };
    let check = |what, client, ratio: Option<f64>, bound: f64, at_most: bool| Target {
        what,
        client,
        ratio,
        bound,
        at_most,
        met: ratio.is_some_and(|r| if at_most { r <= bound } else { r >= bound }),
    };
    let mut out = Vec::new();
    for client in Client::ALL {
        let (Some(d), Some(n), Some(k)) = (
            find(System::Direct, client),
            find(System::Nutcracker, client),
            find(System::Kvswitch, client),
        ) else {
            continue;
        };
        out.push(check(
            "GET/s, kvswitch / nutcracker",
            client,
            ratio(Some(k.get_rps), Some(n.get_rps)),
            TARGET_THROUGHPUT,
            false,
        ));
        if client == Client::Loadgen {
            out.push(check(
                "p99, kvswitch / memcached direct",
                client,
                ratio(k.p99_us, d.p99_us),
                TARGET_P99,
                true,
            ));
        }
        out.push(check(
            "CPU per request, kvswitch / nutcracker",
            client,
            ratio(k.cpu_us_per_request, n.cpu_us_per_request),
            TARGET_CPU,
            true,
        ));
    }
    out
}

fn opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.decimals$}"))
}

fn print_report(
    out: &mut impl Write,
    settings: &Settings,
    versions: &Versions,
    medians: &[Sample],
    targets: &[Target],
) -> std::io::Result<()> {
    writeln!(
        out,
        "\n{} run(s) on loopback, {} connections per client, medians of the runs; {}, {}, \
         kvswitch proxy on {} worker thread(s), {} cores (load average {} before).\n",
        settings.runs,
        settings.concurrency,
        versions.memcached,
        versions.nutcracker.trim_start_matches("This is "),
        settings.kvswitch_workers,
        settings.cores,
        settings
            .loadavg_before
            .map_or_else(|| "unknown".into(), |l| format!("{:.2}", l[0]))
    )?;
    writeln!(
        out,
        "| system | client | GET/s | p50 (µs) | p99 (µs) | CPU µs/req | time (s) | errors |"
    )?;
    writeln!(out, "|---|---|--:|--:|--:|--:|--:|--:|")?;
    for s in medians {
        writeln!(
            out,
            "| {} | {} | {:.0} | {} | {} | {} | {:.2} | {} |",
            s.system,
            s.client,
            s.get_rps,
            opt(s.p50_us, 0),
            opt(s.p99_us, 0),
            opt(s.cpu_us_per_request, 2),
            s.wall_s,
            s.errors
        )?;
    }
    writeln!(out, "\n| target | client | measured | goal | |")?;
    writeln!(out, "|---|---|--:|--:|---|")?;
    for t in targets {
        writeln!(
            out,
            "| {} | {} | {} | {} {:.2}x | {} |",
            t.what,
            t.client,
            t.ratio.map_or_else(|| "-".into(), |r| format!("{r:.2}x")),
            if t.at_most { "≤" } else { "≥" },
            t.bound,
            if t.met { "met" } else { "**not met**" }
        )?;
    }
    writeln!(
        out,
        "\nkvswitch load: {} s of closed-loop TCP gets of {} preloaded keys ({}-byte values), \
         uniform. memcslap ({}): {} keys of 50-4999 bytes set through the system, then {} \
         gets per thread; it measures no percentiles, its time is that of its gets, and its \
         CPU per request counts its sets too. CPU: user + system time of the proxy process \
         over the run, per request. memcached direct: the first of the three servers, holding \
         every key.",
        settings.duration_s,
        settings.keys,
        settings.value_size,
        versions.memcslap,
        settings.memcslap_keys,
        settings.memcslap_keys
    )?;
    Ok(())
}

/// Anything that makes the figures suspect: errors, misses, a proxy that used no CPU.
fn print_notes(out: &mut impl Write, rig: &Rig, runs: &[RunFigures]) -> std::io::Result<()> {
    let mut errors_of = Vec::new();
    for s in runs.iter().flat_map(|r| &r.samples) {
        if s.errors > 0 {
            writeln!(
                out,
                "note: {} under {}: {} request(s) failed (error reply, broken connection or \
                 timeout)",
                s.system, s.client, s.errors
            )?;
            if !errors_of.contains(&s.system) {
                errors_of.push(s.system);
            }
        }
        if s.client == Client::Loadgen && s.hits < s.gets {
            writeln!(
                out,
                "note: {} under {}: {} of {} gets missed a preloaded key",
                s.system,
                s.client,
                s.gets - s.hits,
                s.gets
            )?;
        }
        if s.system != System::Direct && s.cpu_us_per_request.is_none() {
            writeln!(out, "note: no CPU time for {} under {}", s.system, s.client)?;
        }
    }
    for system in errors_of {
        let tail = rig.log_tail(system);
        if !tail.is_empty() {
            writeln!(out, "{system}'s log ends:\n{tail}")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(
        system: System,
        client: Client,
        rps: f64,
        p99: Option<f64>,
        cpu: Option<f64>,
    ) -> Sample {
        Sample {
            system,
            client,
            get_rps: rps,
            p50_us: p99.map(|p| p / 2.0),
            p99_us: p99,
            cpu_us_per_request: cpu,
            wall_s: 1.0,
            set_s: None,
            requests: 10,
            gets: 10,
            hits: 10,
            errors: 0,
        }
    }

    #[test]
    fn medians_per_figure_and_summed_counts() {
        let a = sample(
            System::Kvswitch,
            Client::Loadgen,
            100.0,
            Some(10.0),
            Some(2.0),
        );
        let b = sample(System::Kvswitch, Client::Loadgen, 300.0, Some(30.0), None);
        let c = sample(
            System::Kvswitch,
            Client::Loadgen,
            200.0,
            Some(20.0),
            Some(4.0),
        );
        let m = &runner::medians(&[a, b, c])[0];
        assert_eq!(m.get_rps, 200.0);
        assert_eq!(m.p99_us, Some(20.0));
        assert_eq!(m.cpu_us_per_request, Some(3.0));
        assert_eq!(m.requests, 30);
    }

    #[test]
    fn targets_are_checked_on_ratios() {
        let l = Client::Loadgen;
        let medians = [
            sample(System::Direct, l, 1000.0, Some(100.0), None),
            sample(System::Nutcracker, l, 400.0, Some(300.0), Some(9.0)),
            sample(System::Kvswitch, l, 600.0, Some(131.0), Some(3.0)),
            sample(System::Direct, Client::Memcslap, 1000.0, None, None),
            sample(System::Nutcracker, Client::Memcslap, 0.0, None, Some(9.0)),
            sample(System::Kvswitch, Client::Memcslap, 500.0, None, Some(4.0)),
        ];
        let t = targets(&medians);
        let got: Vec<(&str, Client, bool)> = t.iter().map(|t| (t.what, t.client, t.met)).collect();
        assert_eq!(
            got,
            [
                ("GET/s, kvswitch / nutcracker", l, true),
                ("p99, kvswitch / memcached direct", l, false),
                ("CPU per request, kvswitch / nutcracker", l, true),
                // Nothing served: no ratio, not met.
                ("GET/s, kvswitch / nutcracker", Client::Memcslap, false),
                (
                    "CPU per request, kvswitch / nutcracker",
                    Client::Memcslap,
                    false
                ),
            ]
        );
        assert_eq!(t[0].ratio, Some(1.5));
        assert_eq!(t[3].ratio, None);
    }

    #[test]
    fn pool_file_names_the_servers_for_the_ring() {
        let lo = |p| SocketAddr::from(([127, 0, 0, 1], p));
        let yaml = pool_yaml(lo(9000), &[lo(9001), lo(9002), lo(9003)]);
        assert!(
            yaml.starts_with("bench:\n  listen: 127.0.0.1:9000\n"),
            "{yaml}"
        );
        assert!(yaml.contains("   - 127.0.0.1:9003:1 s3\n"), "{yaml}");
        assert!(yaml.contains("distribution: ketama") && yaml.contains("hash: md5"));
    }
}
