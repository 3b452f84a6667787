//! `kvswitch bench fabric`: the caching fabric (IncBricks' section 5) on the multi-rooted
//! testbed tree (4 ToRs, 2 roots, a client and a memcached server per rack), with its caches
//! and without them, in one run:
//! - mean latency against throughput, client and server in one rack and in two (IncBricks
//!   Figures 7 and 8);
//! - mean latency against the ToRs' and the roots' cache sizes (Figure 10);
//! - mean latency against the workload's skew (Figure 11);
//! - a conditional put and an increment done by the client (a get, then a set), at the key's
//!   home (the caches off), and in the network (Figure 12). Increments go to the rack whose
//!   server is its own home (`kvswitch node --role home`), where switches compute them.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

use super::output::{fmt, ratio, times, Machine, Output};
use super::plot::{BarChart, Chart, LineChart, Series};
use super::Common;
use crate::measure::median;

pub const NAME: &str = "fabric";
/// IncBricks' cache sizes: 4,096 items at a ToR, 16,384 at a root.
const TOR_ITEMS: usize = 4096;
const ROOT_ITEMS: usize = 16_384;
/// Keys of the conditional-put and increment experiments.
const COMPUTE_KEYS: u64 = 1000;
/// The server of the increment experiment: its own home.
const HOME_NODE: &str = "s3";

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// Offered rates (requests per second, open loop) of the latency-throughput curves
    /// [default: 1000,2500,5000,10000; 1000,3000 with --short]; a closed loop at full speed
    /// ends each curve.
    #[arg(long, value_delimiter = ',', value_name = "RPS,...")]
    pub rates: Vec<f64>,
    /// Seconds measured per point [default: 2; 0.5 with --short].
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Keys preloaded and read [default: 100000; 5000 with --short].
    #[arg(long)]
    pub keys: Option<u64>,
    /// Value size in bytes (IncBricks: 1,024; at most 1,300, so a reply fits one datagram
    /// and may be cached).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=1300))]
    pub value_size: u32,
}

impl Args {
    pub fn with(common: Common) -> Args {
        Args {
            common,
            rates: Vec::new(),
            duration: None,
            keys: None,
            value_size: 1024,
        }
    }

    fn rates(&self) -> Vec<f64> {
        match (self.rates.is_empty(), self.common.short) {
            (false, _) => self.rates.clone(),
            (true, true) => vec![1000.0, 3000.0],
            (true, false) => vec![1000.0, 2500.0, 5000.0, 10_000.0],
        }
    }

    fn duration(&self) -> f64 {
        self.duration
            .unwrap_or(if self.common.short { 0.5 } else { 2.0 })
    }

    fn keys(&self) -> u64 {
        self.keys
            .unwrap_or(if self.common.short { 5000 } else { 100_000 })
    }

    fn sizes(&self) -> Vec<usize> {
        match self.common.short {
            true => vec![512, 8192],
            false => vec![512, 2048, 8192, 16_384],
        }
    }

    fn skews(&self) -> Vec<f64> {
        match self.common.short {
            true => vec![0.5, 0.99],
            false => vec![0.0, 0.5, 0.8, 0.99, 1.2],
        }
    }
}

/// One point of the latency-throughput curves.
#[derive(Clone, Debug, Serialize)]
pub struct CurvePoint {
    /// "within" (client and server under one ToR) or "across" (two racks, through a root).
    pub deployment: &'static str,
    pub caches: bool,
    /// The offered rate; `None` for the closed loop at full speed.
    pub offered_rps: Option<f64>,
    pub throughput_rps: f64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub loss: f64,
    pub run: u32,
}

/// Mean latency with one cache size changed.
#[derive(Clone, Debug, Serialize)]
pub struct SizePoint {
    /// "tor" or "root": which switches' size changed (the others keep IncBricks' size).
    pub level: &'static str,
    pub items: usize,
    pub mean_us: f64,
    pub throughput_rps: f64,
    pub run: u32,
}

#[derive(Clone, Debug, Serialize)]
pub struct SkewPoint {
    pub theta: f64,
    pub caches: bool,
    pub mean_us: f64,
    pub throughput_rps: f64,
    pub run: u32,
}

#[derive(Clone, Debug, Serialize)]
pub struct ComputePoint {
    /// "cond-put" or "increment".
    pub op: &'static str,
    /// "client", "server" or "network".
    pub place: &'static str,
    pub ops_per_s: f64,
    pub mean_us: f64,
    /// Operations without an answer in time.
    pub failed: u64,
    pub run: u32,
}

/// Where a SET's time goes (IncBricks' Figure 9): one client's closed loop of a get (which
/// fills the caches on the way when they are on) and a timed set of the same key.
#[derive(Clone, Debug, Serialize)]
pub struct SetPoint {
    /// "within" or "across", as the curves.
    pub deployment: &'static str,
    pub caches: bool,
    /// Sets answered, and their mean latency at the client.
    pub sets: u64,
    pub mean_us: f64,
    /// Per write, at its home: held for its invalidations' acknowledgements, and from
    /// sending it to its server to the server's reply.
    pub held_us: f64,
    pub server_us: f64,
    /// Sets not answered `STORED` in time.
    pub failed: u64,
    pub run: u32,
}

/// Keys the SET breakdown cycles through.
const SET_KEYS: u64 = 64;

/// One closed-loop run across racks with the switches' caches laid out one way.
#[derive(Clone, Debug, Serialize)]
pub struct IncBoxPoint {
    /// "one program" or "IncBox".
    pub layout: &'static str,
    pub processors: usize,
    pub hit_check: bool,
    pub theta: f64,
    pub throughput_rps: f64,
    pub mean_us: f64,
    pub p50_us: f64,
    /// Every fabric switch's process CPU per request.
    pub switch_cpu_us: f64,
    /// Reads that reached a processor, and those the switch stage passed by, over every
    /// switch.
    pub steered: u64,
    pub bypassed: u64,
    /// Steered reads a processor could not answer.
    pub processor_misses: u64,
    pub run: u32,
}

/// One closed-loop run across racks with the homes under one coherence protocol.
#[derive(Clone, Debug, Serialize)]
pub struct CoherencePoint {
    /// "invalidate" or "update".
    pub protocol: &'static str,
    pub get_ratio: f64,
    pub throughput_rps: f64,
    pub mean_us: f64,
    pub p50_us: f64,
    /// Requests the homes sent on to their servers, per request answered (warm-up counted
    /// in both).
    pub to_server_per_request: f64,
    /// Copies of stored values the homes sent (write-update only).
    pub updates_sent: u64,
    pub run: u32,
}

/// The share of GETs in the coherence protocols' workload: writes often enough that what
/// happens to the copies they leave shows.
const COHERENCE_GET_RATIO: f64 = 0.8;

/// The layouts compared: one program per switch, and IncBricks' split.
const LAYOUTS: [(&str, usize, bool); 2] = [("one program", 1, false), ("IncBox", 4, true)];

#[derive(Serialize)]
struct Results {
    scenario: &'static str,
    settings: serde_json::Value,
    machine: Machine,
    curves: Vec<CurvePoint>,
    cache_size: Vec<SizePoint>,
    skew: Vec<SkewPoint>,
    compute: Vec<ComputePoint>,
    incbox: Vec<IncBoxPoint>,
    set_breakdown: Vec<SetPoint>,
    coherence: Vec<CoherencePoint>,
}

/// The fabric testbed and what the scenario does on it.
struct Fabric {
    live: testbed::Live,
}

impl Fabric {
    fn up(prefix: &str) -> anyhow::Result<Fabric> {
        let mut topo = testbed::Topology::shipped("fabric-multi-root")
            .expect("shipped")
            .on_subnet(testbed::Subnet::for_prefix(prefix))?;
        for h in topo
            .hosts
            .iter_mut()
            .filter(|h| h.role == testbed::Role::Server)
        {
            h.memcached_args = vec!["-m".into(), "512".into()];
        }
        // The increments' server keeps its own directory, so that switches compute them.
        let home = topo.hosts.iter().position(|h| h.name == HOME_NODE);
        if let (Some(i), Some(layout)) = (home, topo.fabric.as_mut()) {
            layout.home_node[i] = true;
            topo.hosts[i].memcached_args.clear();
        }
        let exe = std::env::current_exe().context("finding kvswitch itself")?;
        let state = std::env::temp_dir().join(format!("{prefix}-fabric-bench.json"));
        let _ = testbed::down(&state);
        let _ = testbed::down_prefix(prefix);
        let live = testbed::up(
            &topo,
            &testbed::UpOptions {
                prefix: prefix.into(),
                kvswitch_bin: Some(exe),
                state_path: Some(state),
                start_nutcracker: false,
                ..Default::default()
            },
        )?;
        Ok(Fabric { live })
    }

    fn ip(&self, host: &str) -> Ipv4Addr {
        self.live.host(host).expect("a host of the topology").ip
    }

    /// Sets every ToR's and every root's cache size (emptying them when 0).
    fn caches(&self, tor: usize, root: usize) -> anyhow::Result<()> {
        self.put_cache(|role| {
            let items = match role {
                testbed::SwitchRole::Tor => tor,
                testbed::SwitchRole::Root => root,
            };
            format!("{{\"items\": {items}}}")
        })
    }

    /// Lays every switch's cache out as `processors` processors, with or without the switch
    /// stage's hit check (the copies held are dropped).
    fn layout(&self, processors: usize, hit_check: bool) -> anyhow::Result<()> {
        self.put_cache(|_| format!("{{\"processors\": {processors}, \"hit_check\": {hit_check}}}"))
    }

    /// Chooses every switch's coherence protocol.
    fn coherence(&self, protocol: &str) -> anyhow::Result<()> {
        let body = serde_json::json!({ "protocol": protocol }).to_string();
        self.put_each("/api/v1/fabric/coherence", |_| body.clone())
    }

    /// Sends every switch the cache settings `body` gives for its role.
    fn put_cache(&self, body: impl Fn(testbed::SwitchRole) -> String) -> anyhow::Result<()> {
        self.put_each("/api/v1/fabric/cache", body)
    }

    /// `PUT path` on every switch's API, with the body `body` gives for its role.
    fn put_each(
        &self,
        path: &str,
        body: impl Fn(testbed::SwitchRole) -> String,
    ) -> anyhow::Result<()> {
        let fabric = self.live.state.fabric.as_ref().expect("a fabric testbed");
        let token = self.live.state.api_token()?;
        for s in &fabric.switches {
            let (code, text) =
                testbed::http(s.api, "PUT", path, token.as_deref(), Some(&body(s.role)))?;
            anyhow::ensure!(code == 200, "{}: {code} {text}", s.name);
        }
        Ok(())
    }

    /// Figures of every switch's status summed: `group`'s `keys`, in order.
    fn summed<const N: usize>(&self, group: &str, keys: [&str; N]) -> anyhow::Result<[u64; N]> {
        let fabric = self.live.state.fabric.as_ref().expect("a fabric testbed");
        let mut sum = [0; N];
        for s in &fabric.switches {
            let (code, text) = testbed::http_get(s.api, "/api/v1/fabric")?;
            anyhow::ensure!(code == 200, "{}: {code} {text}", s.name);
            let v: serde_json::Value = serde_json::from_str(&text)?;
            for (i, k) in keys.iter().enumerate() {
                sum[i] += v[group][k].as_u64().unwrap_or(0);
            }
        }
        Ok(sum)
    }

    /// The switch stage's counters: steered, bypassed, processor misses.
    fn incbox_counts(&self) -> anyhow::Result<[u64; 3]> {
        self.summed("incbox", ["steered", "bypassed", "processor_misses"])
    }

    /// The homes' write counters: writes forwarded, µs held, writes answered, µs at the
    /// server.
    fn write_counts(&self) -> anyhow::Result<[u64; 4]> {
        let keys = [
            "writes_forwarded",
            "writes_held_us",
            "writes_answered",
            "writes_server_us",
        ];
        self.summed("stats", keys)
    }

    /// Every fabric switch's process CPU so far, in seconds.
    fn switch_cpu(&self) -> f64 {
        let fabric = self.live.state.fabric.as_ref().expect("a fabric testbed");
        let ticks: u64 = fabric
            .switches
            .iter()
            .filter_map(|s| s.pid.and_then(crate::measure::cpu_ticks))
            .sum();
        ticks as f64 / crate::measure::clock_ticks()
    }

    fn load(&self, client: &str, args: loadgen::LoadArgs) -> anyhow::Result<loadgen::Report> {
        self.live
            .in_host(client, move || loadgen::run(&args))?
            .context("kvswitch load")
    }
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let duration = args.duration();
    super::check_duration(duration)?;
    let runs = args.common.runs();
    let machine = Machine::describe();
    let mut out = Output::create(&super::bed::out_dir(args.common.out.as_ref(), NAME))?;
    eprintln!("{NAME}: building the fabric (4 ToRs, 2 roots, 4 clients, 4 memcached)...");
    let f = Fabric::up(&args.common.prefix)?;
    let server = SocketAddr::from((f.ip("s1"), 11211));
    eprintln!(
        "{NAME}: preloading {} keys of {} B...",
        args.keys(),
        args.value_size
    );
    let keys = args.keys();
    let value_size = args.value_size as usize;
    let stored = f.live.in_host("c1", move || {
        loadgen::preload(server, loadgen::Proto::Tcp, keys, "key:", value_size)
    })??;
    anyhow::ensure!(stored == keys, "only {stored} of {keys} keys stored");
    let base = loadgen::LoadArgs {
        keys,
        dist: loadgen::Dist::Zipf(0.99),
        get_ratio: 0.95,
        value_size,
        concurrency: 8,
        duration,
        warmup: (duration / 2.0).min(1.0),
        quiet: true,
        ..loadgen::LoadArgs::new(server.to_string())
    };
    let mut curves = Vec::new();
    let mut cache_size = Vec::new();
    let mut skew = Vec::new();
    let mut compute = Vec::new();
    let mut incbox = Vec::new();
    let mut set_breakdown = Vec::new();
    let mut coherence = Vec::new();
    for run in 0..runs {
        for caches in [true, false] {
            for (deployment, client) in [("within", "c1"), ("across", "c0")] {
                let (t, r) = if caches {
                    (TOR_ITEMS, ROOT_ITEMS)
                } else {
                    (0, 0)
                };
                f.caches(0, 0)?;
                f.caches(t, r)?;
                let rates = args.rates().into_iter().map(Some).chain([None]);
                for rate in rates {
                    let a = loadgen::LoadArgs {
                        rate,
                        concurrency: if rate.is_some() { 8 } else { 16 },
                        seed: u64::from(run) + 1,
                        ..base.clone()
                    };
                    let rep = f.load(client, a)?;
                    let p = CurvePoint {
                        deployment,
                        caches,
                        offered_rps: rate,
                        throughput_rps: rep.throughput_rps,
                        mean_us: rep.latency_us.mean,
                        p50_us: rep.latency_us.p50 as f64,
                        loss: (rep.errors + rep.timeouts) as f64 / rep.requests.max(1) as f64,
                        run,
                    };
                    eprintln!(
                        "  run {}/{runs} {deployment:<6} caches {:<3} offered {:>6} → {:>7.0} req/s, mean {:>6.0} µs",
                        run + 1,
                        if caches { "on" } else { "off" },
                        rate.map_or("max".to_string(), |r| format!("{r:.0}")),
                        p.throughput_rps,
                        p.mean_us
                    );
                    curves.push(p);
                }
            }
        }
        // Cache sizes and skew: across racks, a closed loop of 4.
        let closed = loadgen::LoadArgs {
            concurrency: 4,
            seed: u64::from(run) + 11,
            ..base.clone()
        };
        for level in ["tor", "root"] {
            for &items in &args.sizes() {
                let (t, r) = match level {
                    "tor" => (items, ROOT_ITEMS),
                    _ => (TOR_ITEMS.min(512), items),
                };
                f.caches(0, 0)?;
                f.caches(t, r)?;
                let rep = f.load("c0", closed.clone())?;
                eprintln!(
                    "  run {}/{runs} {level} cache {items:>6} items: mean {:>6.0} µs",
                    run + 1,
                    rep.latency_us.mean
                );
                cache_size.push(SizePoint {
                    level,
                    items,
                    mean_us: rep.latency_us.mean,
                    throughput_rps: rep.throughput_rps,
                    run,
                });
            }
        }
        for caches in [true, false] {
            for &theta in &args.skews() {
                let (t, r) = if caches {
                    (TOR_ITEMS, ROOT_ITEMS)
                } else {
                    (0, 0)
                };
                f.caches(0, 0)?;
                f.caches(t, r)?;
                let dist = match theta {
                    0.0 => loadgen::Dist::Uniform,
                    t => loadgen::Dist::Zipf(t),
                };
                let rep = f.load(
                    "c0",
                    loadgen::LoadArgs {
                        dist,
                        ..closed.clone()
                    },
                )?;
                eprintln!(
                    "  run {}/{runs} skew {theta:<4} caches {:<3}: mean {:>6.0} µs",
                    run + 1,
                    if caches { "on" } else { "off" },
                    rep.latency_us.mean
                );
                skew.push(SkewPoint {
                    theta,
                    caches,
                    mean_us: rep.latency_us.mean,
                    throughput_rps: rep.throughput_rps,
                    run,
                });
            }
        }
        compute.extend(run_compute(&f, "cond-put", duration, run)?);
        compute.extend(run_compute(&f, "increment", duration, run)?);
        for theta in [0.99, 0.5] {
            for (layout, processors, hit_check) in LAYOUTS {
                f.caches(TOR_ITEMS, ROOT_ITEMS)?;
                f.layout(processors, hit_check)?;
                let a = loadgen::LoadArgs {
                    dist: loadgen::Dist::Zipf(theta),
                    concurrency: 8,
                    seed: u64::from(run) + 21,
                    ..base.clone()
                };
                let warmup = a.warmup;
                let before = (f.incbox_counts()?, f.switch_cpu());
                let rep = f.load("c0", a)?;
                let after = (f.incbox_counts()?, f.switch_cpu());
                // The switches' CPU covers the warm-up too, at about the measured rate.
                let requests = rep.throughput_rps * (duration + warmup);
                let p = IncBoxPoint {
                    layout,
                    processors,
                    hit_check,
                    theta,
                    throughput_rps: rep.throughput_rps,
                    mean_us: rep.latency_us.mean,
                    p50_us: rep.latency_us.p50 as f64,
                    switch_cpu_us: (after.1 - before.1) * 1e6 / requests.max(1.0),
                    steered: after.0[0] - before.0[0],
                    bypassed: after.0[1] - before.0[1],
                    processor_misses: after.0[2] - before.0[2],
                    run,
                };
                eprintln!(
                    "  run {}/{runs} zipf {theta:<4} {layout:<11}: {:>7.0} req/s, mean {:>5.0} µs, switches {:>5.1} µs/req, {} steered, {} passed by",
                    run + 1,
                    p.throughput_rps,
                    p.mean_us,
                    p.switch_cpu_us,
                    p.steered,
                    p.bypassed
                );
                incbox.push(p);
            }
        }
        f.layout(1, false)?;
        set_breakdown.extend(run_set_breakdown(&f, duration, run)?);
        for protocol in ["invalidate", "update"] {
            f.caches(0, 0)?;
            f.caches(TOR_ITEMS, ROOT_ITEMS)?;
            f.coherence(protocol)?;
            let a = loadgen::LoadArgs {
                get_ratio: COHERENCE_GET_RATIO,
                concurrency: 8,
                seed: u64::from(run) + 31,
                ..base.clone()
            };
            let warmup = a.warmup;
            let before = f.summed("stats", ["to_server", "updates_sent"])?;
            let rep = f.load("c0", a)?;
            let after = f.summed("stats", ["to_server", "updates_sent"])?;
            let requests = rep.throughput_rps * (duration + warmup);
            let p = CoherencePoint {
                protocol,
                get_ratio: COHERENCE_GET_RATIO,
                throughput_rps: rep.throughput_rps,
                mean_us: rep.latency_us.mean,
                p50_us: rep.latency_us.p50 as f64,
                to_server_per_request: (after[0] - before[0]) as f64 / requests.max(1.0),
                updates_sent: after[1] - before[1],
                run,
            };
            eprintln!(
                "  run {}/{runs} coherence {protocol:<10}: {:>7.0} req/s, mean {:>5.0} µs, {:.2} to a server a request, {} updates",
                run + 1,
                p.throughput_rps,
                p.mean_us,
                p.to_server_per_request,
                p.updates_sent
            );
            coherence.push(p);
        }
        f.coherence("invalidate")?;
    }
    f.caches(TOR_ITEMS, ROOT_ITEMS)?;
    f.live.down()?;
    let settings = serde_json::json!({
        "short": args.common.short, "duration_s": duration, "runs": runs, "keys": keys, "value_size": value_size,
        "zipf": 0.99, "get_ratio": 0.95, "rates": args.rates(),
        "tor_items": TOR_ITEMS, "root_items": ROOT_ITEMS,
        "compute_keys": COMPUTE_KEYS,
    });
    let results = Results {
        scenario: NAME,
        settings,
        machine: machine.clone(),
        curves,
        cache_size,
        skew,
        compute,
        incbox,
        set_breakdown,
        coherence,
    };
    out.json(&results)?;
    for deployment in ["within", "across"] {
        out.plot(
            &format!("latency-throughput-{deployment}"),
            &Chart::Line(curve_chart(&results.curves, deployment)),
        )?;
    }
    out.plot("cache-size", &Chart::Line(size_chart(&results.cache_size)))?;
    out.plot("skew", &Chart::Line(skew_chart(&results.skew)))?;
    out.plot("compute", &Chart::Bars(compute_chart(&results.compute)))?;
    out.summary(&summary(args, &results, runs), &machine)?;
    Ok(())
}

/// One operation (`cond-put` on s1, whose ToR is its home; `increment` on the home node) in
/// each of three places, from a closed loop of two requesters on each client host, on random
/// keys of [`COMPUTE_KEYS`] with uniform random operands (increments by 1).
fn run_compute(
    f: &Fabric,
    op: &'static str,
    duration: f64,
    run: u32,
) -> anyhow::Result<Vec<ComputePoint>> {
    let server = f.ip(if op == "increment" { HOME_NODE } else { "s1" });
    // Every key starts at 0.
    f.live.in_host("c1", move || -> anyhow::Result<()> {
        let mut c = client::fabric::Client::connect(server, Duration::from_secs(1))?;
        for k in 0..COMPUTE_KEYS {
            c.set(&format!("cp:{k}"), b"0")?;
        }
        Ok(())
    })??;
    let mut points = Vec::new();
    for place in ["client", "server", "network"] {
        if place == "network" {
            f.caches(TOR_ITEMS, ROOT_ITEMS)?;
        } else {
            f.caches(0, 0)?;
        }
        let hosts: Vec<String> = f.live.clients().iter().map(|h| h.netns.clone()).collect();
        if op == "increment" && place == "network" {
            // Increments are computed where a copy is: every client reads every key once.
            for ns in &hosts {
                testbed::in_netns(ns, move || -> anyhow::Result<()> {
                    let sock = UdpSocket::bind("0.0.0.0:0")?;
                    sock.set_read_timeout(Some(Duration::from_millis(500)))?;
                    let target = SocketAddr::from((server, 11211));
                    for k in 0..COMPUTE_KEYS {
                        plain_call(&sock, target, k as u16, &format!("get cp:{k}\r\n"));
                    }
                    Ok(())
                })??;
            }
        }
        let until = Instant::now() + Duration::from_secs_f64(duration);
        let results: Vec<anyhow::Result<(u64, u64, f64)>> = std::thread::scope(|scope| {
            let handles: Vec<_> = hosts
                .iter()
                .flat_map(|ns| [ns.clone(), ns.clone()])
                .enumerate()
                .map(|(i, ns)| {
                    scope.spawn(move || {
                        testbed::in_netns(&ns, move || {
                            requester(op, place, server, until, i as u64)
                        })
                        .and_then(|r| r)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("a requester died")))
                })
                .collect()
        });
        let (mut ops, mut failed, mut total_us) = (0, 0, 0.0);
        for r in results {
            let (o, fl, us) = r?;
            ops += o;
            failed += fl;
            total_us += us;
        }
        let p = ComputePoint {
            op,
            place,
            ops_per_s: ops as f64 / duration,
            mean_us: if ops > 0 {
                total_us / ops as f64
            } else {
                f64::NAN
            },
            failed,
            run,
        };
        eprintln!(
            "  run {} {op} at the {place:<7}: {:>7.0} ops/s, mean {:>6.0} µs",
            run + 1,
            p.ops_per_s,
            p.mean_us
        );
        points.push(p);
    }
    f.caches(TOR_ITEMS, ROOT_ITEMS)?;
    Ok(points)
}

/// Figure 9: where one client's SETs spend their time, within a rack and across racks, with
/// the caches on (each set invalidates the copies the get before it filled) and off.
fn run_set_breakdown(f: &Fabric, duration: f64, run: u32) -> anyhow::Result<Vec<SetPoint>> {
    let server = SocketAddr::from((f.ip("s1"), 11211));
    let mut points = Vec::new();
    for caches in [true, false] {
        for (deployment, client) in [("within", "c1"), ("across", "c0")] {
            f.caches(0, 0)?;
            if caches {
                f.caches(TOR_ITEMS, ROOT_ITEMS)?;
            }
            let before = f.write_counts()?;
            let until = Instant::now() + Duration::from_secs_f64(duration);
            let (sets, failed, total_us) = f.live.in_host(client, move || {
                let sock = UdpSocket::bind("0.0.0.0:0")?;
                sock.set_read_timeout(Some(Duration::from_millis(500)))?;
                let (mut sets, mut failed, mut total_us) = (0u64, 0u64, 0.0);
                let mut i = 0u64;
                while Instant::now() < until {
                    let key = format!("bd:{}", i % SET_KEYS);
                    let id = (i % 30_000) as u16 * 2;
                    plain_call(&sock, server, id, &format!("get {key}\r\n"));
                    let start = Instant::now();
                    let reply = plain_call(
                        &sock,
                        server,
                        id + 1,
                        &format!("set {key} 0 0 4\r\nvvvv\r\n"),
                    );
                    if reply.as_deref() == Some("STORED\r\n") {
                        sets += 1;
                        total_us += start.elapsed().as_secs_f64() * 1e6;
                    } else {
                        failed += 1;
                    }
                    i += 1;
                }
                anyhow::Ok((sets, failed, total_us))
            })??;
            let after = f.write_counts()?;
            let per = |us: usize, n: usize| {
                let n = after[n].saturating_sub(before[n]);
                (n > 0).then(|| after[us].saturating_sub(before[us]) as f64 / n as f64)
            };
            let p = SetPoint {
                deployment,
                caches,
                sets,
                mean_us: if sets > 0 {
                    total_us / sets as f64
                } else {
                    f64::NAN
                },
                held_us: per(1, 0).unwrap_or(f64::NAN),
                server_us: per(3, 2).unwrap_or(f64::NAN),
                failed,
                run,
            };
            eprintln!(
                "  run {} set {deployment:<6} caches {:<3}: mean {:>5.0} µs, held {:>5.0} µs, server {:>5.0} µs ({} sets)",
                run + 1,
                if caches { "on" } else { "off" },
                p.mean_us,
                p.held_us,
                p.server_us,
                p.sets
            );
            points.push(p);
        }
    }
    f.caches(TOR_ITEMS, ROOT_ITEMS)?;
    Ok(points)
}

/// One requester's closed loop until `until`: operations done, failed, and their summed
/// latency in µs.
fn requester(
    op: &'static str,
    place: &'static str,
    server: Ipv4Addr,
    until: Instant,
    seed: u64,
) -> anyhow::Result<(u64, u64, f64)> {
    let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let timeout = Duration::from_millis(500);
    let mut client = client::fabric::Client::connect(server, timeout)?;
    let plain = UdpSocket::bind("0.0.0.0:0")?;
    plain.set_read_timeout(Some(timeout))?;
    let target = SocketAddr::from((server, 11211));
    let (mut ops, mut failed, mut total) = (0u64, 0u64, 0.0);
    let mut id: u16 = 0;
    while Instant::now() < until {
        let key = format!("cp:{}", next() % COMPUTE_KEYS);
        let operand = next() % 1_000_000;
        let began = Instant::now();
        let ok = match (op, place) {
            (_, "client") => {
                // Fetch, compute, write the result back: two requests, and not atomic.
                id = id.wrapping_add(1);
                match plain_call(&plain, target, id, &format!("get {key}\r\n")) {
                    Some(reply) => {
                        let value = reply
                            .split("\r\n")
                            .nth(1)
                            .and_then(|v| v.trim_end().parse::<u64>().ok());
                        let v = match op {
                            "increment" => value.unwrap_or(0).wrapping_add(1),
                            _ => value.map_or(operand, |v| v.max(operand)),
                        }
                        .to_string();
                        id = id.wrapping_add(1);
                        let set = format!("set {key} 0 0 {}\r\n{v}\r\n", v.len());
                        plain_call(&plain, target, id, &set).is_some()
                    }
                    None => false,
                }
            }
            ("increment", _) => {
                // memcached's own incr, through the fabric's path.
                id = id.wrapping_add(1);
                plain_call(&plain, target, id, &format!("incr {key} 1\r\n"))
                    .is_some_and(|r| r.as_bytes().first().is_some_and(u8::is_ascii_digit))
            }
            _ => client.cond_put(&key, operand).is_ok(),
        };
        if ok {
            ops += 1;
            total += began.elapsed().as_secs_f64() * 1e6;
        } else {
            failed += 1;
        }
    }
    Ok((ops, failed, total))
}

/// One memcached UDP request and its single-datagram reply.
fn plain_call(sock: &UdpSocket, target: SocketAddr, id: u16, request: &str) -> Option<String> {
    let mut d = vec![(id >> 8) as u8, id as u8, 0, 0, 0, 1, 0, 0];
    d.extend_from_slice(request.as_bytes());
    sock.send_to(&d, target).ok()?;
    let mut buf = [0u8; 2048];
    loop {
        let (n, _) = sock.recv_from(&mut buf).ok()?;
        if n >= 8 && buf[0..2] == d[0..2] {
            return Some(String::from_utf8_lossy(&buf[8..n]).into_owned());
        }
    }
}

/// The points `keep` selects, grouped by `x` in the order each value first appears, with
/// the median of each of `ys` over the points of the group (one per run).
fn medians_by<P, X: PartialEq + Copy, const N: usize>(
    points: &[P],
    keep: impl Fn(&P) -> bool,
    x: impl Fn(&P) -> X,
    ys: [fn(&P) -> f64; N],
) -> Vec<(X, [f64; N])> {
    let mut xs: Vec<X> = Vec::new();
    for p in points.iter().filter(|p| keep(p)) {
        if !xs.contains(&x(p)) {
            xs.push(x(p));
        }
    }
    xs.into_iter()
        .map(|at| {
            let of: Vec<&P> = points.iter().filter(|p| keep(p) && x(p) == at).collect();
            (at, ys.map(|y| median(of.iter().map(|p| y(p)).collect())))
        })
        .collect()
}

/// Per offered rate: the median throughput and mean latency.
fn curve_medians(
    curves: &[CurvePoint],
    deployment: &str,
    caches: bool,
) -> Vec<(Option<f64>, f64, f64)> {
    medians_by(
        curves,
        |p| p.deployment == deployment && p.caches == caches,
        |p| p.offered_rps,
        [|p| p.throughput_rps, |p| p.mean_us],
    )
    .into_iter()
    .map(|(o, [t, l])| (o, t, l))
    .collect()
}

fn label(caches: bool) -> String {
    match caches {
        true => "with the fabric's caches".into(),
        false => "caches off (plain network)".into(),
    }
}

fn curve_chart(curves: &[CurvePoint], deployment: &str) -> LineChart {
    let place = match deployment {
        "within" => "client and server in one rack",
        _ => "client and server in two racks",
    };
    LineChart {
        title: format!("Mean GET/SET latency against throughput, {place}"),
        x_label: "throughput (requests/s)".into(),
        y_label: "mean latency (µs)".into(),
        x_log: false,
        y_log: true,
        y_from_zero: false,
        series: [true, false]
            .iter()
            .enumerate()
            .map(|(i, &caches)| Series {
                name: label(caches),
                points: curve_medians(curves, deployment, caches)
                    .into_iter()
                    .map(|(_, t, l)| (t, l))
                    .collect(),
                color: i,
                dashed: !caches,
            })
            .collect(),
    }
}

/// Per cache size (in the order measured, ascending): the median mean latency.
fn size_medians(sizes: &[SizePoint], level: &str) -> Vec<(usize, f64)> {
    medians_by(sizes, |p| p.level == level, |p| p.items, [|p| p.mean_us])
        .into_iter()
        .map(|(n, [l])| (n, l))
        .collect()
}

fn size_chart(sizes: &[SizePoint]) -> LineChart {
    LineChart {
        title: "Mean latency against cache size (two racks)".into(),
        x_label: "items in the cache".into(),
        y_label: "mean latency (µs)".into(),
        x_log: true,
        y_log: false,
        y_from_zero: true,
        series: [
            ("tor", "ToR caches (roots 16,384)"),
            ("root", "root caches (ToRs 512)"),
        ]
        .iter()
        .enumerate()
        .map(|(i, (level, name))| Series {
            name: name.to_string(),
            points: size_medians(sizes, level)
                .into_iter()
                .map(|(n, l)| (n as f64, l))
                .collect(),
            color: i,
            dashed: false,
        })
        .collect(),
    }
}

/// Per Zipf exponent: the median mean latency.
fn skew_medians(skews: &[SkewPoint], caches: bool) -> Vec<(f64, f64)> {
    medians_by(skews, |p| p.caches == caches, |p| p.theta, [|p| p.mean_us])
        .into_iter()
        .map(|(t, [l])| (t, l))
        .collect()
}

fn skew_chart(skews: &[SkewPoint]) -> LineChart {
    LineChart {
        title: "Mean latency against the workload's skew (two racks)".into(),
        x_label: "Zipf exponent (0: uniform)".into(),
        y_label: "mean latency (µs)".into(),
        x_log: false,
        y_log: false,
        y_from_zero: true,
        series: [true, false]
            .iter()
            .enumerate()
            .map(|(i, &caches)| Series {
                name: label(caches),
                points: skew_medians(skews, caches),
                color: i,
                dashed: !caches,
            })
            .collect(),
    }
}

/// Per operation and place (client, server, network, as measured): the median rate and mean
/// latency.
fn compute_medians(compute: &[ComputePoint], op: &str) -> Vec<(&'static str, f64, f64)> {
    medians_by(
        compute,
        |p| p.op == op,
        |p| p.place,
        [|p| p.ops_per_s, |p| p.mean_us],
    )
    .into_iter()
    .map(|(place, [o, l])| (place, o, l))
    .collect()
}

fn compute_chart(compute: &[ComputePoint]) -> BarChart {
    let m: Vec<(String, f64, f64)> = ["cond-put", "increment"]
        .iter()
        .flat_map(|op| {
            compute_medians(compute, op)
                .into_iter()
                .map(move |(place, o, l)| (format!("{op}, {place}"), o, l))
        })
        .collect();
    BarChart {
        title: "Conditional put and increment: operations per second and mean latency".into(),
        x_label: "operation, where it is computed".into(),
        y_label: "ops/s, µs".into(),
        categories: m.iter().map(|(p, ..)| p.clone()).collect(),
        groups: vec![
            (
                "thousand ops/s".into(),
                m.iter().map(|(_, o, _)| o / 1000.0).collect(),
            ),
            (
                "mean latency (µs)".into(),
                m.iter().map(|(_, _, l)| *l).collect(),
            ),
        ],
        line: None,
        stacked: false,
    }
}

fn summary(args: &Args, results: &Results, runs: u32) -> String {
    let (curves, sizes, skews) = (&results.curves, &results.cache_size, &results.skew);
    let (compute, incbox, sets) = (&results.compute, &results.incbox, &results.set_breakdown);
    let mut t = String::new();
    let _ = writeln!(t, "# The caching fabric (IncBricks' evaluation)\n");
    let _ = writeln!(
        t,
        "The multi-rooted testbed tree: 4 ToRs and 2 roots (each ToR linked to both), each a \
         `kvswitch fabric run` process, a client and a memcached server under every ToR. {} \
         keys of {} B preloaded on one server; Zipf 0.99, 95% GETs and 5% SETs (IncBricks' \
         workload, with fewer keys). \"within\": the client under the server's ToR; \
         \"across\": a client under another ToR, so every request crosses a root. Caches on: \
         4,096 items per ToR and 16,384 per root, as IncBricks; off: 0 items, the same \
         switches forwarding only. Points of {} s after a warm-up; medians of {runs} run(s).\n",
        args.keys(),
        args.value_size,
        args.duration()
    );
    for deployment in ["within", "across"] {
        let _ = writeln!(
            t,
            "## Latency against throughput, {deployment} (Figures 7 and 8)\n"
        );
        let _ = writeln!(t, "| offered req/s | caches on: req/s | mean µs | caches off: req/s | mean µs | latency on/off |");
        let _ = writeln!(t, "|--:|--:|--:|--:|--:|--:|");
        let on = curve_medians(curves, deployment, true);
        let off = curve_medians(curves, deployment, false);
        for ((o, t_on, l_on), (_, t_off, l_off)) in on.iter().zip(&off) {
            let _ = writeln!(
                t,
                "| {} | {t_on:.0} | {l_on:.0} | {t_off:.0} | {l_off:.0} | {} |",
                o.map_or("max (closed loop)".to_string(), |r| format!("{r:.0}")),
                times(ratio(Some(*l_on), Some(*l_off)))
            );
        }
        if let (Some(a), Some(b)) = (on.last(), off.last()) {
            let _ = writeln!(
                t,
                "\nHighest throughput with the caches: {} that without them (IncBricks: about \
                 2x for 1 KB values).\n",
                times(ratio(Some(a.1), Some(b.1)))
            );
        }
    }
    let _ = writeln!(t, "## Latency against cache size (Figure 10)\n");
    let _ = writeln!(
        t,
        "| items | ToR caches changed: mean µs | root caches changed: mean µs |"
    );
    let _ = writeln!(t, "|--:|--:|--:|");
    let tor = size_medians(sizes, "tor");
    let root = size_medians(sizes, "root");
    for ((n, a), (_, b)) in tor.iter().zip(&root) {
        let _ = writeln!(t, "| {n} | {a:.0} | {b:.0} |");
    }
    let _ = writeln!(
        t,
        "\nIncBricks found the ToRs' size to matter (194 to 49 µs from 512 to 16,384 items) \
         and the roots' hardly, their caches being inclusive.\n"
    );
    let _ = writeln!(t, "## Latency against skew (Figure 11)\n");
    let _ = writeln!(
        t,
        "| Zipf exponent | caches on: mean µs | caches off: mean µs |"
    );
    let _ = writeln!(t, "|--:|--:|--:|");
    for ((th, a), (_, b)) in skew_medians(skews, true)
        .iter()
        .zip(&skew_medians(skews, false))
    {
        let _ = writeln!(t, "| {th} | {a:.0} | {b:.0} |");
    }
    let _ = writeln!(t, "\n## Conditional put and increment (Figure 12)\n");
    let _ = writeln!(t, "| operation | computed at | ops/s | mean µs |");
    let _ = writeln!(t, "|--|--|--:|--:|");
    for op in ["cond-put", "increment"] {
        for (place, o, l) in compute_medians(compute, op) {
            let _ = writeln!(t, "| {op} | {place} | {o:.0} | {} |", fmt(Some(l), 0));
        }
    }
    let m = compute_medians(compute, "cond-put");
    if let (Some(c), Some(n)) = (m.first(), m.last()) {
        let _ = writeln!(
            t,
            "\nIn the network against the client: {} the throughput at {} the latency \
             (IncBricks: 3.3x at 0.3x). \"client\": a get, then a set of the larger of the \
             value and the operand (two requests, not atomic), caches off; \"server\": the \
             fabric's request executed at the key's home on the server's value, caches off; \
             \"network\": the same with the caches on, where a put that would not change the \
             cached number is answered by the first switch holding it (the home sends the \
             value it read along the way after a put that changed nothing).",
            times(ratio(Some(n.1), Some(c.1))),
            times(ratio(Some(n.2), Some(c.2)))
        );
    }
    let m = compute_medians(compute, "increment");
    if let (Some(c), Some(s), Some(n)) = (m.first(), m.get(1), m.last()) {
        let _ = writeln!(
            t,
            "\nIncrements (`incr KEY 1`) of keys of {HOME_NODE}, which runs `kvswitch node --role \
             home`: in the network against the client {} the throughput at {} the latency, \
             against the server {} at {}. \"client\": a get, then a set of the value plus one; \
             \"server\": memcached's incr through the fabric, ordered and executed by the home \
             node, caches off; \"network\": the same with the caches on, each client having \
             read every key once, so that the first switch holding a key computes the increment \
             on its copy and keeps the result when the home's agrees (an increment still waits \
             for the home: every other copy must go first).",
            times(ratio(Some(n.1), Some(c.1))),
            times(ratio(Some(n.2), Some(c.2))),
            times(ratio(Some(n.1), Some(s.1))),
            times(ratio(Some(n.2), Some(s.2)))
        );
    }
    let _ = writeln!(
        t,
        "\n## Where a SET's time goes (Figure 9)\n\nOne client's closed loop of `get KEY` then a \
         timed `set KEY` over memcached UDP, on {SET_KEYS} keys of s1: within its rack (c1) and \
         across racks (c0). With the caches on, each set finds the copies the get before it \
         filled (the client's ToR and, across racks, the key's root) and waits at the home for \
         their invalidations. \"held\": per write, at the home, from its arrival to its \
         sending on (its invalidations acknowledged, and any earlier write to the key done); \
         \"server\": from the home to the server's reply back at the home (the server's host \
         and its link); \"the rest\": the client's host, the links and the switches on the way \
         there and back. With the caches off (0 items) the homes still invalidate: a home \
         records the switches a reply may fill, and does not know they cache nothing.\n"
    );
    let _ = writeln!(
        t,
        "| deployment | caches | set mean µs | held for invalidations µs | server µs | the rest µs |"
    );
    let _ = writeln!(t, "|--|--|--:|--:|--:|--:|");
    for deployment in ["within", "across"] {
        for caches in [true, false] {
            let points: Vec<&SetPoint> = sets
                .iter()
                .filter(|p| p.deployment == deployment && p.caches == caches)
                .collect();
            if points.is_empty() {
                continue;
            }
            let med = |f: fn(&SetPoint) -> f64| median(points.iter().map(|p| f(p)).collect());
            let (mean, held, server) =
                (med(|p| p.mean_us), med(|p| p.held_us), med(|p| p.server_us));
            let _ = writeln!(
                t,
                "| {deployment} | {} | {mean:.0} | {held:.0} | {server:.0} | {:.0} |",
                if caches { "on" } else { "off" },
                mean - held - server
            );
        }
    }
    let _ = writeln!(
        t,
        "\n## The IncBox split (section 4.5)\n\nAcross racks (c0 to s1), caches on, a closed \
         loop of 8. \"one program\": each switch's cache one processor that every read \
         reaches; \"IncBox\": four processors chosen by key hash behind a switch stage that \
         sends a read to one only when its table marks the key as held. \"reached a \
         processor\": of the reads every switch looked up, the share a processor took (a miss \
         passed by takes none). Switch CPU: all six fabric switches' process CPU per request.\n"
    );
    let _ = writeln!(
        t,
        "| Zipf | layout | req/s | mean µs | p50 µs | switch CPU µs/req | reached a processor | processor misses |"
    );
    let _ = writeln!(t, "|--:|--|--:|--:|--:|--:|--:|--:|");
    for theta in [0.99, 0.5] {
        for (layout, _, _) in LAYOUTS {
            let points: Vec<&IncBoxPoint> = incbox
                .iter()
                .filter(|p| p.layout == layout && p.theta == theta)
                .collect();
            if points.is_empty() {
                continue;
            }
            let med = |f: fn(&IncBoxPoint) -> f64| median(points.iter().map(|p| f(p)).collect());
            let share = med(|p| p.steered as f64 / (p.steered + p.bypassed).max(1) as f64);
            let misses = med(|p| p.processor_misses as f64 / p.steered.max(1) as f64);
            let _ = writeln!(
                t,
                "| {theta} | {layout} | {:.0} | {:.0} | {:.0} | {:.1} | {:.0}% | {:.1}% |",
                med(|p| p.throughput_rps),
                med(|p| p.mean_us),
                med(|p| p.p50_us),
                med(|p| p.switch_cpu_us),
                share * 100.0,
                misses * 100.0
            );
        }
    }
    let _ = writeln!(
        t,
        "\n## Coherence protocols (`inc_init`'s choice)\n\nAcross racks (c0 to s1), caches on, \
         a closed loop of 8 at {:.0}% GETs (Zipf 0.99). \"invalidate\": a write takes every copy \
         of its key away and the next reads refill them from the server; \"update\": once the \
         server has stored a `set`, the home sends its value to the switches the write \
         invalidated. \"to a server\": requests the homes sent on to a server, per request \
         answered.\n",
        COHERENCE_GET_RATIO * 100.0
    );
    let _ = writeln!(
        t,
        "| protocol | req/s | mean µs | p50 µs | to a server per request | updates sent |"
    );
    let _ = writeln!(t, "|--|--:|--:|--:|--:|--:|");
    for protocol in ["invalidate", "update"] {
        let points: Vec<&CoherencePoint> = results
            .coherence
            .iter()
            .filter(|p| p.protocol == protocol)
            .collect();
        if points.is_empty() {
            continue;
        }
        let med = |f: fn(&CoherencePoint) -> f64| median(points.iter().map(|p| f(p)).collect());
        let _ = writeln!(
            t,
            "| {protocol} | {:.0} | {:.0} | {:.0} | {:.2} | {:.0} |",
            med(|p| p.throughput_rps),
            med(|p| p.mean_us),
            med(|p| p.p50_us),
            med(|p| p.to_server_per_request),
            med(|p| p.updates_sent as f64)
        );
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_group_by_x_in_the_order_measured() {
        // (x, y, kept) per run.
        let points = [
            (2, 10.0, true),
            (1, 5.0, true),
            (2, 30.0, true),
            (2, 20.0, true),
            (1, 9.0, false),
        ];
        let m = medians_by(&points, |p| p.2, |p| p.0, [|p| p.1]);
        assert_eq!(m, vec![(2, [20.0]), (1, [5.0])]);
    }
}
