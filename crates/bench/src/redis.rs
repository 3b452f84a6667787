//! `kvswitch bench redis`: redis-server direct, twemproxy (nutcracker) and `kvswitch proxy` on
//! one Redis pool, side by side on loopback in one run: redis-benchmark's GET and SET rates,
//! unpipelined and pipelined, with each proxy's CPU time per request, checked against the
//! Redis proxy's targets. Every process it starts is its child, killed by its PID when the run
//! ends or fails (and by the kernel if this process dies first).

use std::fmt;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context};
use serde::Serialize;
use testbed::local::{self, Ports, Proc, TempDir};

use super::plot::{self, BarChart, Chart};
use super::runner::{self, rotated, Runs};
use super::version_line;
use crate::measure::CpuMeter;

/// The targets, from the issue that asked for Redis: at least 1.5x twemproxy's rate at no
/// more than half its CPU time per request.
const TARGET_RATE: f64 = 1.5;
const TARGET_CPU: f64 = 0.5;

#[derive(clap::Args, Clone, Debug)]
pub struct RedisBenchArgs {
    /// Measure every system this many times, in rotating order, and report medians.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub runs: u32,
    /// Requests of each redis-benchmark test (`-n`).
    #[arg(long, default_value_t = 200_000,
          value_parser = clap::value_parser!(u64).range(1000..=100_000_000))]
    pub requests: u64,
    /// Client connections of redis-benchmark (`-c`).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub clients: u32,
    /// Pipeline depths to measure (`-P`), comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1u32, 16])]
    pub pipeline: Vec<u32>,
    /// Distinct keys (`-r`), spread over the pool's three servers.
    #[arg(long, default_value_t = 100_000,
          value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub keys: u64,
    /// Worker threads of kvswitch proxy (default: one per core).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub workers: Option<u32>,
    /// Where the JSON figures and the PNG and SVG plots go [default: results/redis].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Also measure hot-key GETs of `--keys` keys at the Zipf skew `--zipf` through kvswitch
    /// proxy without its cache and with it (`--clients` closed-loop clients, one GET
    /// outstanding each, for `--hot-seconds` a run).
    #[arg(long)]
    pub hot: bool,
    /// The Zipf skew of `--hot`'s keys.
    #[arg(long, default_value_t = 0.99)]
    pub zipf: f64,
    /// How long each `--hot` run lasts, in seconds.
    #[arg(long, default_value_t = 5.0)]
    pub hot_seconds: f64,
}

/// What serves the clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum System {
    /// The first redis-server, with no proxy in between.
    Direct,
    Twemproxy,
    Kvswitch,
}

impl System {
    const ALL: [System; 3] = [System::Direct, System::Twemproxy, System::Kvswitch];
}

impl fmt::Display for System {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            System::Direct => "redis-server direct",
            System::Twemproxy => "twemproxy",
            System::Kvswitch => "kvswitch proxy",
        })
    }
}

/// One redis-benchmark test against one system.
#[derive(Clone, Debug, Serialize)]
struct Sample {
    system: System,
    /// "GET" or "SET".
    test: &'static str,
    pipeline: u32,
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// The proxy's CPU time (user + system, every thread) per request, in µs; none direct.
    cpu_us_per_request: Option<f64>,
}

impl runner::Figures for Sample {
    type At = (System, &'static str, u32);

    fn at(&self) -> Self::At {
        (self.system, self.test, self.pipeline)
    }

    fn median(runs: &Runs<'_, Sample>) -> Sample {
        Sample {
            rps: runs.median(|s| s.rps),
            p50_ms: runs.median(|s| s.p50_ms),
            p99_ms: runs.median(|s| s.p99_ms),
            cpu_us_per_request: runs.median_of_some(|s| s.cpu_us_per_request),
            ..runs.first().clone()
        }
    }

    fn line(&self) -> String {
        format!(
            "{:<20} {} -P {:<3} {:>10.0} req/s  p50 {:.3} ms  cpu {}",
            self.system,
            self.test,
            self.pipeline,
            self.rps,
            self.p50_ms,
            self.cpu_us_per_request
                .map_or("-".into(), |c| format!("{c:.2} µs/req"))
        )
    }
}

/// A target on the medians of one test: kvswitch's figure over twemproxy's.
#[derive(Clone, Debug, Serialize)]
struct Target {
    what: String,
    ratio: Option<f64>,
    bound: f64,
    at_most: bool,
    met: bool,
}

#[derive(Serialize)]
struct Figures<'a> {
    scenario: &'static str,
    settings: &'a RedisBenchArgsView,
    versions: [(&'static str, String); 3],
    runs: &'a [Sample],
    medians: &'a [Sample],
    targets: &'a [Target],
    /// `--hot`: every run, without the cache and with it.
    hot: &'a [super::redis_hot::HotSample],
}

#[derive(Serialize)]
struct RedisBenchArgsView {
    runs: u32,
    requests: u64,
    clients: u32,
    pipeline: Vec<u32>,
    keys: u64,
    kvswitch_workers: u32,
    cores: usize,
}

/// Three redis-servers, and twemproxy and kvswitch proxy over them with one pool file.
struct Rig {
    servers: Vec<(SocketAddr, Proc)>,
    twemproxy: (SocketAddr, Proc),
    kvswitch: (SocketAddr, Proc),
    benchmark: PathBuf,
    dir: TempDir,
}

impl Rig {
    fn start(workers: u32) -> anyhow::Result<Rig> {
        let redis_bin = local::require("redis-server")?;
        let nutcracker_bin = local::require("nutcracker")?;
        let benchmark = local::require("redis-benchmark")?;
        let dir = TempDir::new("kvswitch-bench-redis")?;
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let ports = Ports::default();
        let pick = || -> anyhow::Result<SocketAddr> { Ok(SocketAddr::new(lo, ports.pick(lo)?)) };
        let server_addrs = [pick()?, pick()?, pick()?];
        let (twemproxy_addr, kvswitch_addr) = (pick()?, pick()?);
        let stats_port = pick()?.port();
        ports.release();
        let mut servers = Vec::new();
        for &addr in &server_addrs {
            let mut cmd = Command::new(&redis_bin);
            cmd.args(["--port", &addr.port().to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"]);
            local::die_with_parent(&mut cmd);
            let mut p = Proc::spawn("redis-server", &mut cmd)?;
            p.wait_listening(addr, None)?;
            servers.push((addr, p));
        }
        let (twemproxy, kvswitch) = super::proxy::start_proxies(
            &nutcracker_bin,
            &pool_yaml(twemproxy_addr, &server_addrs),
            dir.path(),
            (twemproxy_addr, stats_port),
            kvswitch_addr,
            workers,
        )?;
        Ok(Rig {
            servers,
            twemproxy: (twemproxy_addr, twemproxy),
            kvswitch: (kvswitch_addr, kvswitch),
            benchmark,
            dir,
        })
    }

    fn addr(&self, system: System) -> SocketAddr {
        match system {
            System::Direct => self.servers[0].0,
            System::Twemproxy => self.twemproxy.0,
            System::Kvswitch => self.kvswitch.0,
        }
    }

    fn proxy_pid(&self, system: System) -> Option<u32> {
        match system {
            System::Direct => None,
            System::Twemproxy => Some(self.twemproxy.1.pid()),
            System::Kvswitch => Some(self.kvswitch.1.pid()),
        }
    }
}

/// One Redis pool over `servers` (ketama, fnv1a_64, as twemproxy's Redis examples use).
fn pool_yaml(listen: SocketAddr, servers: &[SocketAddr]) -> String {
    let mut out = format!(
        "bench:\n  listen: {listen}\n  hash: fnv1a_64\n  distribution: ketama\n  redis: true\n  \
         timeout: 2000\n  auto_eject_hosts: false\n  servers:\n"
    );
    for (i, addr) in servers.iter().enumerate() {
        out.push_str(&format!("   - {addr}:1 r{}\n", i + 1));
    }
    out
}

pub fn run(args: &RedisBenchArgs) -> anyhow::Result<()> {
    if args.pipeline.is_empty() || args.pipeline.iter().any(|&p| p == 0 || p > 1024) {
        bail!("--pipeline: give depths from 1 to 1024");
    }
    if !(0.0..=2.0).contains(&args.zipf) || !(0.5..=600.0).contains(&args.hot_seconds) {
        bail!("--zipf is 0 to 2 and --hot-seconds 0.5 to 600");
    }
    let workers = args
        .workers
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()) as u32);
    eprintln!(
        "starting 3 redis-server, twemproxy and kvswitch proxy ({workers} workers) on loopback..."
    );
    let rig = Rig::start(workers)?;
    let mut samples = Vec::new();
    let tests = ["SET", "GET"];
    let total = args.runs as usize * System::ALL.len() * tests.len() * args.pipeline.len();
    let started = Instant::now();
    for run in 0..args.runs {
        for &pipeline in &args.pipeline {
            for test in tests {
                for system in rotated(&System::ALL, run) {
                    let s = measure(&rig, system, test, pipeline, args)
                        .with_context(|| format!("{test} -P {pipeline} against {system}"))?;
                    eprintln!(
                        "  [{}/{total}, {:.0} s] run {}/{}  {}",
                        samples.len() + 1,
                        started.elapsed().as_secs_f64(),
                        run + 1,
                        args.runs,
                        runner::Figures::line(&s)
                    );
                    samples.push(s);
                }
            }
        }
    }
    let medians = runner::medians(&samples);
    let targets = targets(&medians);
    let hot = if args.hot {
        hot_runs(&rig, args, workers)?
    } else {
        Vec::new()
    };
    let mut out = std::io::stdout().lock();
    report(&mut out, &medians, &targets)?;
    report_hot(&mut out, &hot)?;
    let dir = super::bed::out_dir(args.out.as_ref(), "redis");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let view = RedisBenchArgsView {
        runs: args.runs,
        requests: args.requests,
        clients: args.clients,
        pipeline: args.pipeline.clone(),
        keys: args.keys,
        kvswitch_workers: workers,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let figures = Figures {
        scenario: "redis",
        settings: &view,
        versions: [
            (
                "redis-server",
                version_line(&local::require("redis-server")?, "--version"),
            ),
            (
                "twemproxy",
                version_line(&local::require("nutcracker")?, "-V"),
            ),
            ("redis-benchmark", version_line(&rig.benchmark, "--version")),
        ],
        runs: &samples,
        medians: &medians,
        targets: &targets,
        hot: &hot,
    };
    let json = dir.join("redis.json");
    std::fs::write(&json, serde_json::to_string_pretty(&figures)? + "\n")
        .with_context(|| format!("writing {}", json.display()))?;
    for (stem, chart) in charts(&medians, &args.pipeline) {
        for path in plot::write(&chart, &dir.join(stem))? {
            writeln!(out, "plot: {}", path.display())?;
        }
    }
    writeln!(out, "figures: {}", json.display())?;
    drop(rig);
    Ok(())
}

fn measure(
    rig: &Rig,
    system: System,
    test: &'static str,
    pipeline: u32,
    args: &RedisBenchArgs,
) -> anyhow::Result<Sample> {
    let addr = rig.addr(system);
    let cpu = rig.proxy_pid(system).map(CpuMeter::start);
    let out = Command::new(&rig.benchmark)
        .args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
        .args([
            "-t",
            &test.to_ascii_lowercase(),
            "-n",
            &args.requests.to_string(),
        ])
        .args(["-c", &args.clients.to_string(), "-P", &pipeline.to_string()])
        .args(["-r", &args.keys.to_string(), "--csv"])
        .output()
        .context("running redis-benchmark")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || text.contains("ERR") {
        bail!(
            "redis-benchmark failed: {}{}\n{}",
            text,
            String::from_utf8_lossy(&out.stderr),
            log_tail(&rig.dir.path().join("kvswitch.log"))
        );
    }
    let (rps, p50_ms, p99_ms) = parse_csv(&text, test)
        .with_context(|| format!("no {test} line in redis-benchmark's output: {text}"))?;
    Ok(Sample {
        system,
        test,
        pipeline,
        rps,
        p50_ms,
        p99_ms,
        cpu_us_per_request: cpu.and_then(|m| m.per_request(args.requests)),
    })
}

/// `--hot`: the keys written, the cache warmed (hot-key detection works on 1 s segments),
/// then each run measures kvswitch proxy without its cache and with it, in turn.
fn hot_runs(
    rig: &Rig,
    args: &RedisBenchArgs,
    workers: u32,
) -> anyhow::Result<Vec<super::redis_hot::HotSample>> {
    use super::redis_hot;
    let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let ports = Ports::default();
    let (listen, api) = (
        SocketAddr::new(lo, ports.pick(lo)?),
        SocketAddr::new(lo, ports.pick(lo)?),
    );
    ports.release();
    let conf = rig.dir.path().join("pool.yml");
    let cached = redis_hot::start_cached(&conf, rig.dir.path(), listen, api, workers)?;
    eprintln!("--hot: writing {} keys...", args.keys);
    redis_hot::preload(rig.kvswitch.0, args.keys)?;
    let servers: Vec<SocketAddr> = rig.servers.iter().map(|(a, _)| *a).collect();
    let hits = || cache_replies(api).unwrap_or(0);
    let load = (args.clients, args.keys, args.zipf, args.hot_seconds);
    eprintln!("--hot: warming the cache for 3 s...");
    redis_hot::measure(
        listen,
        cached.pid(),
        &servers,
        hits,
        (args.clients, args.keys, args.zipf, 3.0),
        true,
    )?;
    let mut samples = Vec::new();
    for run in 0..args.runs {
        for cache in rotated(&[false, true], run) {
            let (addr, pid) = match cache {
                true => (listen, cached.pid()),
                false => (rig.kvswitch.0, rig.kvswitch.1.pid()),
            };
            let s = redis_hot::measure(addr, pid, &servers, hits, load, cache)
                .with_context(|| format!("hot GETs, cache {cache}"))?;
            eprintln!(
                "  hot run {}/{}  cache {:<5} {:>9.0} req/s  cpu {}  busiest server {:.0}%  \
                 from the cache {:.0}%",
                run + 1,
                args.runs,
                cache,
                s.rps,
                s.cpu_us_per_request
                    .map_or("-".into(), |c| format!("{c:.2} µs/req")),
                100.0 * s.hottest_server_share,
                100.0 * s.cache_share
            );
            samples.push(s);
        }
    }
    drop(cached);
    Ok(samples)
}

/// The cached proxy's `kvswitch_proxy_cache_replies_total`.
fn cache_replies(api: SocketAddr) -> Option<u64> {
    let (_, body) = testbed::http_get(api, "/metrics").ok()?;
    body.lines()
        .find_map(|l| l.strip_prefix("kvswitch_proxy_cache_replies_total{pool=\"bench\"} "))
        .and_then(|v| v.trim().parse().ok())
}

fn report_hot(out: &mut impl Write, hot: &[super::redis_hot::HotSample]) -> std::io::Result<()> {
    if hot.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "\nhot GETs (medians)    requests/s  CPU µs/request  busiest server  from the cache"
    )?;
    for cache in [false, true] {
        let of = |f: fn(&super::redis_hot::HotSample) -> f64| {
            crate::measure::median(hot.iter().filter(|s| s.cache == cache).map(f).collect())
        };
        let cpu = crate::measure::median_of_some(
            hot.iter()
                .filter(|s| s.cache == cache)
                .map(|s| s.cpu_us_per_request),
        );
        writeln!(
            out,
            "kvswitch, cache {:<5} {:>11.0} {:>15} {:>14.0}% {:>14.0}%",
            cache,
            of(|s| s.rps),
            cpu.map_or("-".into(), |c| format!("{c:.2}")),
            100.0 * of(|s| s.hottest_server_share),
            100.0 * of(|s| s.cache_share)
        )?;
    }
    Ok(())
}

fn log_tail(path: &Path) -> String {
    super::last_lines(&std::fs::read_to_string(path).unwrap_or_default(), 5)
}

/// The rate and the p50 and p99 latencies of `test` from redis-benchmark's `--csv` output.
fn parse_csv(text: &str, test: &str) -> Option<(f64, f64, f64)> {
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("\"{test}\"")))?;
    let fields: Vec<f64> = line
        .split(',')
        .skip(1)
        .map(|f| f.trim_matches('"').parse().ok())
        .collect::<Option<_>>()?;
    // rps, avg, min, p50, p95, p99, max
    Some((*fields.first()?, *fields.get(3)?, *fields.get(5)?))
}

fn targets(medians: &[Sample]) -> Vec<Target> {
    let mut out = Vec::new();
    let find = |s: System, test: &str, p: u32| {
        medians
            .iter()
            .find(|m| m.system == s && m.test == test && m.pipeline == p)
    };
    for m in medians.iter().filter(|m| m.system == System::Kvswitch) {
        let Some(t) = find(System::Twemproxy, m.test, m.pipeline) else {
            continue;
        };
        let rate = (t.rps > 0.0).then(|| m.rps / t.rps);
        out.push(Target {
            what: format!("{} -P {} rate vs twemproxy", m.test, m.pipeline),
            ratio: rate,
            bound: TARGET_RATE,
            at_most: false,
            met: rate.is_some_and(|r| r >= TARGET_RATE),
        });
        let cpu = match (m.cpu_us_per_request, t.cpu_us_per_request) {
            (Some(k), Some(t)) if t > 0.0 => Some(k / t),
            _ => None,
        };
        out.push(Target {
            what: format!("{} -P {} CPU per request vs twemproxy", m.test, m.pipeline),
            ratio: cpu,
            bound: TARGET_CPU,
            at_most: true,
            met: cpu.is_some_and(|r| r <= TARGET_CPU),
        });
    }
    out
}

fn report(out: &mut impl Write, medians: &[Sample], targets: &[Target]) -> std::io::Result<()> {
    writeln!(
        out,
        "\n{:<20} {:<4} {:>3} {:>12} {:>9} {:>9} {:>14}",
        "system", "test", "-P", "requests/s", "p50 ms", "p99 ms", "CPU µs/request"
    )?;
    for m in medians {
        writeln!(
            out,
            "{:<20} {:<4} {:>3} {:>12.0} {:>9.3} {:>9.3} {:>14}",
            m.system.to_string(),
            m.test,
            m.pipeline,
            m.rps,
            m.p50_ms,
            m.p99_ms,
            m.cpu_us_per_request
                .map_or("-".into(), |c| format!("{c:.2}"))
        )?;
    }
    writeln!(out)?;
    for t in targets {
        writeln!(
            out,
            "{:<40} {:>6}  target {} {:.2}  {}",
            t.what,
            t.ratio.map_or("-".into(), |r| format!("{r:.2}x")),
            if t.at_most { "≤" } else { "≥" },
            t.bound,
            if t.met { "met" } else { "NOT met" }
        )?;
    }
    Ok(())
}

/// Requests per second and CPU per request, grouped by test and pipeline depth.
fn charts(medians: &[Sample], pipelines: &[u32]) -> Vec<(&'static str, Chart)> {
    let categories: Vec<(String, &str, u32)> = pipelines
        .iter()
        .flat_map(|&p| ["GET", "SET"].map(|t| (format!("{t} -P {p}"), t, p)))
        .collect();
    let value = |s: System, test: &str, p: u32, f: fn(&Sample) -> Option<f64>| {
        medians
            .iter()
            .find(|m| m.system == s && m.test == test && m.pipeline == p)
            .and_then(f)
            .unwrap_or(0.0)
    };
    let groups = |systems: &[System], f: fn(&Sample) -> Option<f64>| {
        systems
            .iter()
            .map(|&s| {
                let values = categories
                    .iter()
                    .map(|(_, t, p)| value(s, t, *p, f))
                    .collect();
                (s.to_string(), values)
            })
            .collect()
    };
    let names: Vec<String> = categories.iter().map(|(n, _, _)| n.clone()).collect();
    vec![
        (
            "redis-rate",
            Chart::Bars(BarChart {
                title: "redis-benchmark through each system (loopback)".into(),
                x_label: "test and pipeline depth".into(),
                y_label: "requests per second".into(),
                categories: names.clone(),
                groups: groups(&System::ALL, |m| Some(m.rps)),
                line: None,
                stacked: false,
            }),
        ),
        (
            "redis-cpu",
            Chart::Bars(BarChart {
                title: "CPU time of the proxy per request".into(),
                x_label: "test and pipeline depth".into(),
                y_label: "CPU µs per request".into(),
                categories: names,
                groups: groups(&[System::Twemproxy, System::Kvswitch], |m| {
                    m.cpu_us_per_request
                }),
                line: None,
                stacked: false,
            }),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_benchmarks_csv_is_read() {
        let text = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\
                    \"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\
                    \"GET\",\"78740.16\",\"0.063\",\"0.024\",\"0.063\",\"0.087\",\"0.151\",\"0.967\"\n";
        assert_eq!(parse_csv(text, "GET"), Some((78740.16, 0.063, 0.151)));
        assert_eq!(parse_csv(text, "SET"), None);
    }

    #[test]
    fn targets_are_ratios_to_twemproxy() {
        let sample = |system, rps, cpu| Sample {
            system,
            test: "GET",
            pipeline: 1,
            rps,
            p50_ms: 0.1,
            p99_ms: 0.2,
            cpu_us_per_request: cpu,
        };
        let medians = [
            sample(System::Twemproxy, 100.0, Some(10.0)),
            sample(System::Kvswitch, 160.0, Some(6.0)),
        ];
        let t = targets(&medians);
        assert_eq!(t.len(), 2);
        assert!(t[0].met && (t[0].ratio.unwrap() - 1.6).abs() < 1e-9);
        assert!(!t[1].met && (t[1].ratio.unwrap() - 0.6).abs() < 1e-9);
    }
}
