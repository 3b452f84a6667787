//! `kvswitch demo`: builds the default testbed, preloads keys through the switch, shows where
//! the keys went, and measures memcached direct, kvswitch (UDP) and nutcracker (TCP) side by
//! side in one run. Tears everything down at the end, also on error.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;

use anyhow::Context;
use serde::Serialize;

use bench::measure::{median, median_of_some, CpuMeter};

#[derive(clap::Args, Clone, Debug)]
pub struct DemoArgs {
    /// Keys to preload.
    #[arg(long, default_value_t = 10_000)]
    pub keys: u64,
    /// Value size in bytes.
    #[arg(long, default_value_t = 100)]
    pub value_size: usize,
    /// Seconds of each load run.
    #[arg(long, default_value_t = 3.0)]
    pub duration: f64,
    /// Concurrent requesters of the throughput runs (the latency runs use one).
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Measure each system this many times and report medians.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub runs: u32,
    /// Namespace and link prefix of the testbed.
    #[arg(long, default_value = "kvs")]
    pub prefix: String,
    /// Also write the figures as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Serialize, Clone)]
struct Row {
    system: String,
    proto: String,
    light_p50_us: f64,
    light_p99_us: f64,
    max_rps: f64,
    heavy_p50_us: f64,
    heavy_p99_us: f64,
    errors: u64,
    timeouts: u64,
    middlebox_cpu_us_per_request: Option<f64>,
}

#[derive(Serialize)]
struct Figures {
    keys: u64,
    placement: Vec<(String, u64)>,
    rows: Vec<Row>,
}

pub fn run(args: &DemoArgs) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let topo = testbed::Topology::default_topology();
    let opts = testbed::UpOptions {
        prefix: args.prefix.clone(),
        kvswitch_bin: Some(exe.clone()),
        start_nutcracker: true,
        ..Default::default()
    };
    println!("building the default testbed (2 clients, 3 memcached servers, kvswitch)...");
    let live = testbed::up(&topo, &opts)?;
    let state = live.state.clone();
    let client = live
        .clients()
        .first()
        .map(|h| h.name.clone())
        .context("the default topology has no client")?;
    let servers: Vec<(String, String)> = live
        .servers()
        .iter()
        .map(|h| (h.name.clone(), h.ip.to_string()))
        .collect();
    let vip: SocketAddr = format!("{}:11211", state.vip).parse()?;

    // 1. Preload through the VIP: kvswitch places each key by ketama.
    println!(
        "preloading {} keys through kvswitch (UDP to {vip})...",
        args.keys
    );
    preload(&live, &client, vip, loadgen::Proto::Udp, args)?;
    let mut placement = Vec::new();
    for (name, ip) in &servers {
        let items = curr_items(&live, name, ip)?;
        placement.push((name.clone(), items));
    }
    println!("\nwhere the keys went (ketama, md5, as nutcracker places them):");
    for (name, items) in &placement {
        println!("  {name:<4} {items:>7} keys");
    }

    // 2. For the direct runs, give the first server every key too.
    let direct: SocketAddr = format!("{}:11211", servers[0].1).parse()?;
    preload(&live, &client, direct, loadgen::Proto::Tcp, args)?;

    let nutcracker: SocketAddr = state
        .nutcracker
        .as_ref()
        .map(|n| n.listen)
        .context("nutcracker did not start")?;
    let nutcracker_pid = state.nutcracker.as_ref().and_then(|n| n.pid);
    let kvswitch_pid = state.kvswitch_pid;
    let measure = |name: &str, target: SocketAddr, proto: &str, pid: Option<u32>| {
        measure(&live, &client, &exe, args, name, target, proto, pid)
    };

    println!(
        "\nmeasuring: {} run(s) of {} s per system and load level...",
        args.runs, args.duration
    );
    let mut samples: Vec<Vec<Row>> = vec![Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..args.runs {
        samples[1].push(measure("kvswitch", vip, "udp", kvswitch_pid)?);
        samples[2].push(measure("nutcracker", nutcracker, "tcp", nutcracker_pid)?);
    }
    // memcached direct: the same hosts and links with kvswitch stopped and a plain Linux bridge
    // in its place (kvswitch gives replies from a server's memcached port the VIP as source, so
    // a client cannot talk UDP to a server's own address through it).
    println!("stopping kvswitch and joining the hosts with a Linux bridge for the direct runs...");
    live.stop_kvswitch();
    let bridge = live.bridge_up()?;
    for _ in 0..args.runs {
        samples[0].push(measure("memcached direct", direct, "udp", None)?);
    }
    live.bridge_down(&bridge);
    let rows: Vec<Row> = samples.iter().map(|s| median_row(s)).collect();

    println!(
        "\n{:<18} {:<5} {:>10} {:>10} {:>12} {:>10} {:>10} {:>14}",
        "system", "proto", "p50 (µs)", "p99 (µs)", "max GET/s", "p50@max", "p99@max", "CPU µs/req"
    );
    for r in &rows {
        println!(
            "{:<18} {:<5} {:>10.1} {:>10.1} {:>12.0} {:>10.1} {:>10.1} {:>14}",
            r.system,
            r.proto,
            r.light_p50_us,
            r.light_p99_us,
            r.max_rps,
            r.heavy_p50_us,
            r.heavy_p99_us,
            r.middlebox_cpu_us_per_request
                .map(|c| format!("{c:.2}"))
                .unwrap_or_else(|| "-".into())
        );
    }
    println!(
        "(p50/p99: one requester; max GET/s and p50/p99@max: {} requesters; {}; \
         CPU: user+system time of the middle box per request at max load)",
        args.concurrency,
        if args.runs > 1 {
            "medians of the runs"
        } else {
            "one run"
        }
    );
    let (d, k, n) = (&rows[0], &rows[1], &rows[2]);
    if d.light_p50_us > 0.0 && n.light_p50_us > 0.0 {
        println!(
            "\nkvswitch vs memcached direct: median latency {:.2}x, throughput {:.2}x.",
            k.light_p50_us / d.light_p50_us,
            k.max_rps / d.max_rps.max(1.0)
        );
        println!(
            "kvswitch vs nutcracker: median latency {:.2}x, throughput {:.2}x.",
            k.light_p50_us / n.light_p50_us,
            k.max_rps / n.max_rps.max(1.0)
        );
    }
    if let Some(path) = &args.json {
        let figures = Figures {
            keys: args.keys,
            placement,
            rows,
        };
        std::fs::write(path, serde_json::to_string_pretty(&figures)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("figures written to {}", path.display());
    }
    println!("\ntearing down the testbed...");
    live.down()?;
    Ok(())
}

/// Light load (one requester) then heavy load, with the middle box's CPU time over the heavy
/// run.
#[allow(clippy::too_many_arguments)]
fn measure(
    live: &testbed::Live,
    client: &str,
    exe: &PathBuf,
    args: &DemoArgs,
    name: &str,
    target: SocketAddr,
    proto: &str,
    pid: Option<u32>,
) -> anyhow::Result<Row> {
    let target = target.to_string();
    let light = load_report(live, client, exe, &target, proto, args, 1)?;
    let cpu = pid.map(CpuMeter::start);
    let heavy = load_report(live, client, exe, &target, proto, args, args.concurrency)?;
    let cpu = cpu.and_then(|m| m.per_request(heavy.requests));
    Ok(Row {
        system: name.to_string(),
        proto: proto.to_string(),
        light_p50_us: light.latency_us.p50 as f64,
        light_p99_us: light.latency_us.p99 as f64,
        max_rps: heavy.throughput_rps,
        heavy_p50_us: heavy.latency_us.p50 as f64,
        heavy_p99_us: heavy.latency_us.p99 as f64,
        errors: light.errors + heavy.errors,
        timeouts: light.timeouts + heavy.timeouts,
        middlebox_cpu_us_per_request: cpu,
    })
}

/// The median of each figure over several runs of one system.
fn median_row(rows: &[Row]) -> Row {
    let m = |f: fn(&Row) -> f64| median(rows.iter().map(f).collect());
    Row {
        system: rows[0].system.clone(),
        proto: rows[0].proto.clone(),
        light_p50_us: m(|r| r.light_p50_us),
        light_p99_us: m(|r| r.light_p99_us),
        max_rps: m(|r| r.max_rps),
        heavy_p50_us: m(|r| r.heavy_p50_us),
        heavy_p99_us: m(|r| r.heavy_p99_us),
        errors: rows.iter().map(|r| r.errors).sum(),
        timeouts: rows.iter().map(|r| r.timeouts).sum(),
        middlebox_cpu_us_per_request: median_of_some(
            rows.iter().map(|r| r.middlebox_cpu_us_per_request),
        ),
    }
}

/// Sets every key once from inside `host`.
fn preload(
    live: &testbed::Live,
    host: &str,
    target: SocketAddr,
    proto: loadgen::Proto,
    args: &DemoArgs,
) -> anyhow::Result<()> {
    let (keys, size) = (args.keys, args.value_size);
    let stored = live.in_host(host, move || {
        loadgen::preload(target, proto, keys, "key:", size)
    })??;
    anyhow::ensure!(
        stored == keys,
        "only {stored} of {keys} keys were stored at {target}"
    );
    Ok(())
}

fn base_load_args(args: &DemoArgs) -> Vec<String> {
    vec![
        "--keys".into(),
        args.keys.to_string(),
        "--value-size".into(),
        args.value_size.to_string(),
        "--quiet".into(),
    ]
}

/// Runs `kvswitch load` inside the client's namespace.
fn load(
    live: &testbed::Live,
    host: &str,
    exe: &PathBuf,
    extra: &[&str],
    args: &DemoArgs,
    duration: f64,
    concurrency: usize,
) -> anyhow::Result<loadgen::Report> {
    let json = std::env::temp_dir().join(format!("kvswitch-demo-{}.json", std::process::id()));
    let mut cmd = live.exec(host, exe);
    cmd.arg("load")
        .args(base_load_args(args))
        .args(extra)
        .args(["--duration", &format!("{duration}")])
        .args(["--concurrency", &concurrency.to_string()])
        .arg("--json")
        .arg(&json);
    run_load(cmd, &json)
}

fn load_report(
    live: &testbed::Live,
    host: &str,
    exe: &PathBuf,
    target: &str,
    proto: &str,
    args: &DemoArgs,
    concurrency: usize,
) -> anyhow::Result<loadgen::Report> {
    load(
        live,
        host,
        exe,
        &["--target", target, "--proto", proto, "--get-ratio", "1.0"],
        args,
        args.duration,
        concurrency,
    )
}

fn run_load(mut cmd: Command, json: &PathBuf) -> anyhow::Result<loadgen::Report> {
    let out = cmd.output().context("starting kvswitch load")?;
    if !out.status.success() {
        anyhow::bail!(
            "kvswitch load failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = std::fs::read_to_string(json).context("reading the load report")?;
    let _ = std::fs::remove_file(json);
    Ok(serde_json::from_str(&text)?)
}

/// Asks one memcached how many items it holds.
fn curr_items(live: &testbed::Live, host: &str, ip: &str) -> anyhow::Result<u64> {
    let addr: SocketAddr = format!("{ip}:11211").parse()?;
    let stats = live.in_host(host, move || testbed::memcached_stats(addr))??;
    testbed::stat_u64(&stats, "curr_items", addr)
}
