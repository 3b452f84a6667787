//! `kvswitch bench SCENARIO`: reproducible measurements that start everything they measure,
//! compare kvswitch with what it replaces in one run, and stop every process they started, also
//! on error. `proxy` runs on loopback; the others build a testbed of namespaces (root needed),
//! run, tear it down, and write JSON, PNG and SVG plots and a markdown summary into a results
//! folder.

pub mod appswitch;
pub mod bcube;
pub mod bed;
pub mod bounded;
pub mod cost;
pub mod fabric;
pub mod fastpath;
pub mod fleet;
pub mod forwarding;
pub mod latency;
pub mod measure;
pub mod memcslap;
pub mod output;
pub mod plot;
pub mod popularity;
pub mod proxy;
pub mod qcn;
pub mod redis;
mod redis_hot;
pub mod reqcache;
pub mod runner;
pub mod skew;
pub mod value_size;

use std::path::PathBuf;

/// The scenarios of `kvswitch bench`.
#[derive(clap::Subcommand, Debug)]
pub enum Scenario {
    /// memcached direct, nutcracker and kvswitch proxy side by side on loopback, under the same
    /// load from two clients (kvswitch load and memcslap): GET throughput, p50/p99 latency and
    /// each proxy's CPU time per request, checked against the proxy's targets.
    Proxy(proxy::ProxyBenchArgs),
    /// redis-server direct, twemproxy and kvswitch proxy on one Redis pool, side by side on
    /// loopback: redis-benchmark's GET and SET rates, unpipelined and pipelined, and each
    /// proxy's CPU time per request, checked against the Redis proxy's targets.
    Redis(redis::RedisBenchArgs),
    /// GET latency (median and p99) against offered rate (open loop, Poisson arrivals) for
    /// memcached direct, nutcracker, kvswitch switch mode and kvswitch proxy, each of kvswitch's
    /// with and without its cache, on a testbed.
    LatencyThroughput(latency::Args),
    /// GET round-trip time for values of 32 bytes to 11 KB for the same systems.
    ValueSize(value_size::Args),
    /// Aggregate throughput of capacity-limited backends behind kvswitch, with and without its
    /// cache, against Zipf skew and cache size, and the load each backend gets.
    Skew(skew::Args),
    /// Throughput over time while the hot keys change (hot-in, hot-out, random) in front of
    /// capacity-limited backends, with and without the cache under a rule-update limit.
    PopularityChange(popularity::Args),
    /// CPU time per request of every middle box (kvswitch, nutcracker), from /proc.
    Cost(cost::Args),
    /// The XDP fast path against AF_PACKET on the same testbed: GET throughput, latency and
    /// CPU per GET (the kvswitch process, the whole machine, the XDP program itself).
    Fastpath(fastpath::Args),
    /// Layer-2 forwarding of 64- to 1,514-byte frames through kvswitch (XDP and AF_PACKET)
    /// and a Linux bridge on the same veth pairs: the rate frames arrive at, and ping times.
    Forwarding(forwarding::Args),
    /// QCN with kvswitch as the congestion point (an agent on its CPU path) and a UDP sender
    /// as the reaction point: the port's rate lowered, then raised step by step; the queue
    /// and the sender's rate over time, drops, and the delay the CPU path adds to a
    /// notification.
    Qcn(qcn::Args),
    /// BCube1 (n = 4) on 16 kvswitch cards and 8 bridges: the CPU each server's card, card
    /// agent and host use while a TCP transfer crosses two parallel paths.
    Bcube(bcube::Args),
    /// SwitchKV (a cache node that kvswitch steers reads to) beside kvswitch's own cache and
    /// no cache, in front of capacity-limited backends: the skew and popularity-change
    /// scenarios, into <out>/skew and <out>/popularity-change.
    Switchkv(SwitchkvArgs),
    /// Caching by request id (ServerSwitch's Figure 10): the CPU the switch and its agent
    /// spend, and the bandwidth the server's link still carries, against the share of
    /// requests the agent answers (one pass: --runs does not apply).
    Reqcache(reqcache::Args),
    /// AppSwitch's Table 1: half SETs and half GETs to one memcached through nutcracker (the
    /// paper's McRouter) or routed by kvswitch (UDP and TCP), beside memcached direct:
    /// requests per second and the mean, p95 and p99 latency.
    Appswitch(appswitch::Args),
    /// The caching fabric of several kvswitches (IncBricks): latency against throughput with
    /// and without its caches, within a rack and across racks; against cache sizes and skew;
    /// conditional puts computed by the client, at the home and in the network.
    Fabric(fabric::Args),
    /// A pool change made through `kvswitch controller`: how long it takes to reach every
    /// switch of a fleet of 2, 8 and 100 (`kvswitch proxy` processes with their APIs, on
    /// loopback; no root needed).
    Fleet(fleet::Args),
    /// Consistent hashing with bounded loads against ketama over a Zipf workload, on the
    /// switches' ring code and the controller's placement: the busiest server over the mean,
    /// and the keys and load moved by adding or removing a server (no processes, no root).
    Bounded(bounded::Args),
    /// Every testbed scenario in turn (not `proxy`), each into its own folder under --out.
    All(AllArgs),
}

/// What every testbed scenario takes.
#[derive(clap::Args, Clone, Debug)]
pub struct Common {
    /// Results folder (JSON, PNG and SVG plots, summary.md) [default: results/SCENARIO].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Seconds instead of minutes: fewer points, short runs, one run each. For tests and a
    /// first look, not for figures.
    #[arg(long)]
    pub short: bool,
    /// Measure every point this many times, systems in rotating order, and report medians
    /// [default: 3, 1 with --short].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub runs: Option<u32>,
    /// Prefix of the testbed's namespaces and links (1 to 5 lowercase letters or digits).
    #[arg(long, default_value = "kvb", value_parser = parse_prefix)]
    pub prefix: String,
}

impl Common {
    pub fn runs(&self) -> u32 {
        self.runs.unwrap_or(if self.short { 1 } else { 3 })
    }
}

fn parse_prefix(s: &str) -> anyhow::Result<String> {
    testbed::check_prefix(s)?;
    Ok(s.to_string())
}

#[derive(clap::Args, Clone, Debug)]
pub struct SwitchkvArgs {
    #[command(flatten)]
    pub common: Common,
    /// Backends (kvswitch nodes).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub servers: u32,
    /// Requests per second each backend serves.
    #[arg(long, default_value_t = 500,
          value_parser = clap::value_parser!(u64).range(10..=10_000_000))]
    pub capacity: u64,
    /// Only these systems, by their short names (kvswitch_udp, kvswitch_cache_udp,
    /// switchkv_udp, switchkv_encoded_udp, look_through_udp, look_aside_udp), comma-separated
    /// [default: all].
    #[arg(long, value_delimiter = ',', value_name = "SYSTEM,...")]
    pub systems: Vec<String>,
}

#[derive(clap::Args, Clone, Debug)]
pub struct AllArgs {
    #[command(flatten)]
    pub common: Common,
}

pub fn run(scenario: &Scenario) -> anyhow::Result<()> {
    match scenario {
        Scenario::Proxy(args) => proxy::run(args),
        Scenario::Redis(args) => redis::run(args),
        Scenario::LatencyThroughput(args) => latency::run(args).map(drop),
        Scenario::ValueSize(args) => value_size::run(args).map(drop),
        Scenario::Skew(args) => skew::run(args).map(drop),
        Scenario::PopularityChange(args) => popularity::run(args).map(drop),
        Scenario::Cost(args) => cost::run(args).map(drop),
        Scenario::Fastpath(args) => fastpath::run(args).map(drop),
        Scenario::Forwarding(args) => forwarding::run(args).map(drop),
        Scenario::Qcn(args) => qcn::run(args).map(drop),
        Scenario::Bcube(args) => bcube::run(args).map(drop),
        Scenario::Fabric(args) => fabric::run(args),
        Scenario::Fleet(args) => fleet::run(args).map(drop),
        Scenario::Bounded(args) => bounded::run(args).map(drop),
        Scenario::Appswitch(args) => appswitch::run(args).map(drop),
        Scenario::Reqcache(args) => reqcache::run(args).map(drop),
        Scenario::Switchkv(args) => run_switchkv(args),
        Scenario::All(args) => run_all(&args.common),
    }
}

/// `common` for one scenario of several: its results in `<out>/<name>`, `<default>/<name>`
/// without `--out`.
fn within(common: &Common, default: &str, name: &str) -> Common {
    Common {
        out: Some(
            common
                .out
                .clone()
                .unwrap_or_else(|| PathBuf::from(default))
                .join(name),
        ),
        ..common.clone()
    }
}

/// Every testbed scenario with its default settings and the shared ones, each into
/// `<out>/<scenario>` (default `results/<scenario>`).
fn run_all(common: &Common) -> anyhow::Result<()> {
    let sub = |name: &str| within(common, "results", name);
    latency::run(&latency::Args::with(sub(latency::NAME)))?;
    value_size::run(&value_size::Args::with(sub(value_size::NAME)))?;
    skew::run(&skew::Args::with(sub(skew::NAME)))?;
    popularity::run(&popularity::Args::with(sub(popularity::NAME)))?;
    cost::run(&cost::Args::with(sub(cost::NAME)))?;
    fastpath::run(&fastpath::Args::with(sub(fastpath::NAME)))?;
    forwarding::run(&forwarding::Args::with(sub(forwarding::NAME)))?;
    qcn::run(&qcn::Args::with(sub(qcn::NAME)))?;
    bcube::run(&bcube::Args::with(sub(bcube::NAME)))?;
    fabric::run(&fabric::Args::with(sub(fabric::NAME)))?;
    appswitch::run(&appswitch::Args::with(sub(appswitch::NAME)))?;
    reqcache::run(&reqcache::Args::with(sub(reqcache::NAME)))?;
    fleet::run(&fleet::Args::with(sub(fleet::NAME)))?;
    bounded::run(&bounded::Args::with(sub(bounded::NAME)))?;
    Ok(())
}

/// The scenarios that compare SwitchKV with kvswitch's cache, at `args.servers` backends,
/// each into `<out>/<scenario>` (default `results/switchkv/<scenario>`).
fn run_switchkv(args: &SwitchkvArgs) -> anyhow::Result<()> {
    let sub = |name: &str| within(&args.common, "results/switchkv", name);
    let mut skew = skew::Args::with(sub(skew::NAME));
    skew.servers = args.servers;
    skew.capacity = args.capacity;
    skew.systems = args.systems.clone();
    skew::run(&skew)?;
    let mut popularity = popularity::Args::with(sub(popularity::NAME));
    popularity.servers = args.servers;
    popularity.capacity = args.capacity;
    popularity.systems = args.systems.clone();
    popularity::run(&popularity)?;
    Ok(())
}

/// The first line `bin arg` prints (stdout, else stderr), e.g. its version; "unknown" when it
/// prints nothing or does not start.
pub fn version_line(bin: &std::path::Path, arg: &str) -> String {
    let Ok(out) = std::process::Command::new(bin).arg(arg).output() else {
        return "unknown".into();
    };
    [&out.stdout, &out.stderr]
        .iter()
        .flat_map(|b| {
            String::from_utf8_lossy(b)
                .lines()
                .map(|l| l.trim().to_owned())
                .collect::<Vec<_>>()
        })
        .find(|l| !l.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// The last `n` lines of `text`, for error messages.
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Refuses a measuring time that is not a positive number of seconds up to an hour.
fn check_duration(secs: f64) -> anyhow::Result<()> {
    if !secs.is_finite() || secs <= 0.0 || secs > 3600.0 {
        anyhow::bail!("--duration must be between 0 and 3600 seconds, got {secs}");
    }
    Ok(())
}
