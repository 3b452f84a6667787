//! `kvswitch load`: a memcached load generator speaking the text or binary protocol over UDP
//! (with the 8-byte memcached frame header) or TCP, as a closed loop or an open loop with
//! Poisson arrivals. It measures throughput and latency, overall and over time, against a
//! memcached server or the switch in front of one; it never retries a request under load.
//!
//! Layers: [`zipf`], [`arrival`], [`text`], [`binary`] and [`frame`] are pure; [`worker`] owns
//! the sockets; [`report`] turns counters into the result.

use std::fmt;
use std::io::{IsTerminal, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kv::rng::Xoshiro256StarStar;
use serde::{Deserialize, Serialize};

pub mod arrival;
pub mod binary;
pub mod encoded;
pub mod frame;
mod poll;
mod preload;
pub mod report;
pub mod text;
mod worker;

/// Key popularity, from the pure `kv` crate where the simulator draws it too.
pub use kv::zipf;

pub use preload::preload;
pub use report::{Latency, Report, Sample};
pub use zipf::ChangeKind;

/// `--change`'s parser: the names of [`ChangeKind`], listed with their meaning in `--help`.
fn change_parser() -> impl clap::builder::TypedValueParser<Value = ChangeKind> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new([
        PossibleValue::new(ChangeKind::HotIn.name())
            .help("The N coldest keys become the N hottest; every other key moves N ranks down"),
        PossibleValue::new(ChangeKind::HotOut.name())
            .help("The N hottest keys become the N coldest; every other key moves N ranks up"),
        PossibleValue::new(ChangeKind::Random.name()).help(
            "N random keys of the hot set (the 10·N hottest) swap places with N random cold keys",
        ),
    ])
    .try_map(|name| name.parse::<ChangeKind>())
}

/// Smallest accepted `--rate`, in requests per second: one request every 1,000 s.
pub const MIN_RATE: f64 = 0.001;

/// Transport to the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    Udp,
    Tcp,
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Proto::Udp => "udp",
            Proto::Tcp => "tcp",
        })
    }
}

/// Memcached protocol spoken to the target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// `get`/`set` command lines.
    #[default]
    Text,
    /// 24-byte binary headers (magic 0x80/0x81).
    Binary,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Text => "text",
            Protocol::Binary => "binary",
        })
    }
}

/// Key popularity: `uniform`, or `zipf:THETA` with `P(rank k) ∝ k^-THETA` (`zipf` alone means
/// theta 0.99, the YCSB default). `zipf:0` is uniform.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum Dist {
    Uniform,
    Zipf(f64),
}

impl Dist {
    /// The Zipf exponent; 0 for uniform.
    pub fn theta(&self) -> f64 {
        match self {
            Dist::Uniform => 0.0,
            Dist::Zipf(t) => *t,
        }
    }
}

impl fmt::Display for Dist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dist::Uniform => f.write_str("uniform"),
            Dist::Zipf(t) => write!(f, "zipf:{t}"),
        }
    }
}

impl FromStr for Dist {
    type Err = DistError;

    fn from_str(s: &str) -> Result<Dist, DistError> {
        let theta = match s {
            "uniform" => return Ok(Dist::Uniform),
            "zipf" => 0.99,
            _ => {
                let t = s
                    .strip_prefix("zipf:")
                    .ok_or_else(|| DistError::Unknown(s.to_owned()))?;
                t.parse::<f64>()
                    .map_err(|_| DistError::BadExponent(t.to_owned()))?
            }
        };
        if !theta.is_finite() || theta < 0.0 {
            return Err(DistError::Exponent(theta));
        }
        Ok(Dist::Zipf(theta))
    }
}

/// Text that is not a [`Dist`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DistError {
    /// Neither `uniform` nor `zipf` nor `zipf:THETA`.
    #[error("unknown distribution {0:?}: expected uniform or zipf:THETA")]
    Unknown(String),
    /// The text after `zipf:`, which is not a number.
    #[error("bad zipf exponent {0:?}")]
    BadExponent(String),
    /// An exponent that is negative, infinite or NaN.
    #[error("zipf exponent must be a finite number >= 0, got {0}")]
    Exponent(f64),
}

impl From<Dist> for String {
    fn from(d: Dist) -> String {
        d.to_string()
    }
}

impl TryFrom<String> for Dist {
    type Error = DistError;
    fn try_from(s: String) -> Result<Dist, DistError> {
        s.parse()
    }
}

/// Arguments of `kvswitch load`.
#[derive(clap::Args, Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoadArgs {
    /// Server or switch to load, ADDR:PORT.
    #[arg(long)]
    pub target: String,
    /// Transport.
    #[arg(long, value_enum, default_value_t = Proto::Udp)]
    pub proto: Proto,
    /// TCP over TLS, trusting the certificates of this PEM file (an authority, or the
    /// server's own); the name checked is the target's address.
    #[arg(long, value_name = "FILE")]
    #[serde(default)]
    pub tls_ca: Option<std::path::PathBuf>,
    /// Look-aside clients (SwitchKV's Table 1): every get asks this cache node first, ADDR:PORT,
    /// and on a miss the target; its latency runs over both. Sets go to the target. UDP only.
    #[arg(long, value_name = "ADDR:PORT")]
    #[serde(default)]
    pub look_aside: Option<String>,
    /// SwitchKV's clients: every request leaves as a raw frame with its key's hash in the
    /// destination MAC (the get prefix for reads, the other for writes) and its backend's
    /// address as the destination, placed as the pool in CONFIG (the switch's kvswitch
    /// configuration) places keys; the switch sends a read to its key's cache node when it
    /// has a rule for it. Replies come to the requesters' sockets from the target, a backend
    /// or a cache node. UDP only; needs CAP_NET_RAW.
    #[arg(long, value_name = "CONFIG")]
    #[serde(default)]
    pub switchkv: Option<PathBuf>,
    /// Number of distinct keys.
    #[arg(long, default_value_t = 10_000)]
    pub keys: u64,
    /// Key names are this prefix followed by the key index.
    #[arg(long, default_value = "key:")]
    pub key_prefix: String,
    /// Key popularity: uniform or zipf:THETA.
    #[arg(long, default_value = "uniform")]
    pub dist: Dist,
    /// Keep Zipf ranks in key order (rank 1 is index 0) instead of spreading them.
    #[arg(long)]
    pub no_scramble: bool,
    /// Key popularity of the sets alone: uniform or zipf:THETA [default: the gets', --dist].
    /// SwitchKV's Figure 12 writes uniformly while it reads by Zipf. Popularity changes
    /// (--change) move the gets' keys alone when it is given.
    #[arg(long, value_name = "DIST")]
    #[serde(default)]
    pub write_dist: Option<Dist>,
    /// Fraction of requests that are gets; the rest are sets.
    #[arg(long, default_value_t = 0.9)]
    pub get_ratio: f64,
    /// Size of the value in every set, in bytes.
    #[arg(long, default_value_t = 32)]
    pub value_size: usize,
    /// Number of requesters. Without --rate each is a closed loop with one outstanding
    /// request; with --rate they share the arrivals and may each have many outstanding.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Open loop: send this many requests per second in total, with Poisson (exponentially
    /// spaced) arrivals spread over the requesters, whether or not replies keep up. Latency is
    /// measured from each request's scheduled send time, so queueing delay counts. At least
    /// 0.001.
    #[arg(long, value_name = "RPS")]
    #[serde(default)]
    pub rate: Option<f64>,
    /// With --rate, where the rate starts: each worker raises its rate by 2% after a period in
    /// which under 0.5% of the requests it sent went unanswered, and lowers it by 2% after one
    /// over 1% (SwitchKV's clients), so a run measures what the system answers at its limit.
    /// A period is 10 ms and at least 100 requests (or a second); start near the rate
    /// expected, and give it a warm-up. The rate stays between a hundredth and a hundred
    /// times the start.
    #[arg(long, requires = "rate")]
    #[serde(default)]
    pub rate_control: bool,
    /// Memcached protocol: text or binary.
    #[arg(long, value_enum, default_value_t = Protocol::Text)]
    #[serde(default)]
    pub protocol: Protocol,
    /// Change key popularity every --change-every seconds: hot-in moves the N coldest keys to
    /// the top, hot-out the N hottest to the bottom, random swaps N keys among the 10·N hottest
    /// with N cold ones. Needs --dist zipf.
    #[arg(long, value_parser = change_parser())]
    #[serde(default)]
    pub change: Option<ChangeKind>,
    /// N, the number of keys each popularity change moves.
    #[arg(long, default_value_t = 100, value_name = "N")]
    #[serde(default = "default_change_keys")]
    pub change_keys: u64,
    /// Seconds between popularity changes; the first happens this long into the measured window.
    #[arg(long, default_value_t = 1.0, value_name = "SECS")]
    #[serde(default = "default_change_every")]
    pub change_every: f64,
    /// Length of one interval of the report's time series, in milliseconds.
    #[arg(long, default_value_t = 100)]
    #[serde(default = "default_interval_ms")]
    pub interval_ms: u64,
    /// Length of the measured window in seconds.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// Stop after this many measured requests (or at the end of --duration, if sooner).
    #[arg(long)]
    pub requests: Option<u64>,
    /// How long to wait for a UDP reply before counting a timeout, in milliseconds.
    #[arg(long, default_value_t = 500)]
    pub timeout_ms: u64,
    /// Seconds of load before the measured window starts.
    #[arg(long, default_value_t = 0.0)]
    pub warmup: f64,
    /// Write the report as JSON to this file.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// Do not show the progress line.
    #[arg(long)]
    pub quiet: bool,
    /// Worker threads; default min(concurrency, available cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Set every key once before the load starts (in the text protocol, which memcached stores
    /// the same way).
    #[arg(long)]
    pub preload: bool,
    /// Seed of the per-requester random generators (key and operation choice).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

impl LoadArgs {
    /// Arguments with every default, aimed at `target`.
    pub fn new(target: impl Into<String>) -> LoadArgs {
        LoadArgs {
            target: target.into(),
            proto: Proto::Udp,
            tls_ca: None,
            look_aside: None,
            switchkv: None,
            keys: 10_000,
            key_prefix: "key:".into(),
            dist: Dist::Uniform,
            no_scramble: false,
            write_dist: None,
            get_ratio: 0.9,
            value_size: 32,
            concurrency: 4,
            rate: None,
            rate_control: false,
            protocol: Protocol::Text,
            change: None,
            change_keys: default_change_keys(),
            change_every: default_change_every(),
            interval_ms: default_interval_ms(),
            duration: 5.0,
            requests: None,
            timeout_ms: 500,
            warmup: 0.0,
            json: None,
            quiet: false,
            threads: None,
            preload: false,
            seed: 1,
        }
    }

    fn validate(&self) -> anyhow::Result<()> {
        if self.keys == 0 {
            bail!("--keys must be at least 1");
        }
        if !(0.0..=1.0).contains(&self.get_ratio) {
            bail!(
                "--get-ratio must be between 0 and 1, got {}",
                self.get_ratio
            );
        }
        if self.concurrency == 0 {
            bail!("--concurrency must be at least 1");
        }
        if self.tls_ca.is_some() && self.proto != Proto::Tcp {
            bail!("--tls-ca speaks TLS over TCP: use --proto tcp");
        }
        if self.threads == Some(0) {
            bail!("--threads must be at least 1");
        }
        if !self.duration.is_finite() || self.duration <= 0.0 || self.duration > 1e9 {
            bail!(
                "--duration must be a positive number of seconds, got {}",
                self.duration
            );
        }
        if !self.warmup.is_finite() || self.warmup < 0.0 || self.warmup > 1e9 {
            bail!(
                "--warmup must be a non-negative number of seconds, got {}",
                self.warmup
            );
        }
        if self.timeout_ms == 0 {
            bail!("--timeout-ms must be at least 1");
        }
        if self.look_aside.is_some() && self.proto != Proto::Udp {
            bail!("--look-aside asks its cache node over UDP: use --proto udp");
        }
        if self.switchkv.is_some() && self.proto != Proto::Udp {
            bail!("--switchkv encodes keys in UDP queries: use --proto udp");
        }
        if self.switchkv.is_some() && self.look_aside.is_some() {
            bail!("--switchkv and --look-aside are two kinds of client: choose one");
        }
        if let Some(rate) = self.rate {
            if !rate.is_finite() || rate <= 0.0 || rate > 1e9 {
                bail!("--rate must be a positive number of requests per second, got {rate}");
            }
            if rate < MIN_RATE {
                bail!("--rate must be at least {MIN_RATE} requests per second, got {rate}");
            }
        } else if self.rate_control {
            bail!("--rate-control needs --rate, the rate it starts from");
        }
        if self.interval_ms == 0 {
            bail!("--interval-ms must be at least 1");
        }
        if let Some(kind) = self.change {
            if self.dist.theta() == 0.0 {
                bail!("--change needs a skewed popularity (--dist zipf:THETA)");
            }
            if self.change_keys == 0 || self.change_keys >= self.keys {
                bail!("--change-keys must be between 1 and --keys - 1");
            }
            if kind == ChangeKind::Random && self.change_keys.saturating_mul(2) > self.keys {
                bail!("--change random needs --change-keys at most half of --keys");
            }
            if !self.change_every.is_finite() || self.change_every < 1e-3 || self.change_every > 1e9
            {
                bail!(
                    "--change-every must be at least 0.001 seconds, got {}",
                    self.change_every
                );
            }
        }
        // Only a set carries the value: gets of big values (preloaded over TCP) fit UDP.
        let sent_value = if self.get_ratio < 1.0 || self.preload {
            self.value_size
        } else {
            0
        };
        check_keys(
            self.proto,
            self.protocol,
            self.keys,
            &self.key_prefix,
            sent_value,
        )?;
        Ok(())
    }
}

fn default_change_keys() -> u64 {
    100
}

fn default_change_every() -> f64 {
    1.0
}

fn default_interval_ms() -> u64 {
    100
}

/// Rejects keyspaces whose names memcached would refuse and values a UDP datagram cannot hold.
fn check_keys(
    proto: Proto,
    protocol: Protocol,
    keys: u64,
    prefix: &str,
    value_size: usize,
) -> anyhow::Result<()> {
    if keys == 0 {
        bail!("the keyspace is empty");
    }
    if prefix.bytes().any(|b| b <= b' ' || b == 0x7f) {
        bail!("the key prefix must not contain spaces or control characters");
    }
    let key_len = text::max_key_len(prefix, keys);
    if key_len > text::MAX_KEY {
        bail!(
            "keys would be up to {key_len} bytes; memcached allows {}",
            text::MAX_KEY
        );
    }
    if proto == Proto::Udp {
        // "set <key> 0 0 <len>\r\n<value>\r\n" or a binary SET after the frame header, in one
        // datagram.
        let set_len = match protocol {
            Protocol::Text => 4 + key_len + 5 + value_size.to_string().len() + 2 + value_size + 2,
            Protocol::Binary => binary::overhead(text::Op::Set) + key_len + value_size,
        };
        let len = frame::HEADER_LEN + set_len;
        if len > frame::MAX_DATAGRAM {
            bail!(
                "a set of {value_size} bytes does not fit in one UDP datagram ({len} > {}); use --proto tcp",
                frame::MAX_DATAGRAM
            );
        }
    }
    Ok(())
}

/// Resolves `ADDR:PORT` (a host name is allowed) to its first address.
pub fn resolve(target: &str) -> anyhow::Result<SocketAddr> {
    target
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve target {target:?} (expected ADDR:PORT)"))?
        .next()
        .with_context(|| format!("target {target:?} resolved to no address"))
}

/// Runs the load described by `args` and returns the report; also writes it to `--json`.
///
/// Fails before sending any load if the arguments are invalid, the target does not resolve or
/// (TCP) cannot be connected. Network errors during the run are counted, not returned. The run
/// ends after `warmup + duration` seconds at the latest.
pub fn run(args: &LoadArgs) -> anyhow::Result<Report> {
    args.validate()?;
    let target = resolve(&args.target)?;
    let aside = args.look_aside.as_deref().map(resolve).transpose()?;
    let placement = args
        .switchkv
        .as_deref()
        .map(encoded::Placement::from_config)
        .transpose()?
        .map(Arc::new);
    let tls = args.tls_ca.as_deref().map(worker::tls_client).transpose()?;
    if args.preload {
        preload::preload_with(
            target,
            args.proto,
            tls.as_ref(),
            args.keys,
            &args.key_prefix,
            args.value_size,
        )?;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = args.threads.unwrap_or(cores).min(args.concurrency).max(1);

    let mut groups: Vec<Vec<worker::Requester>> = (0..threads).map(|_| Vec::new()).collect();
    for i in 0..args.concurrency {
        // Distinct, reproducible streams per requester.
        let seed = args.seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let arrivals = args.rate.map(|rate| {
            let rng = Xoshiro256StarStar::seed_from_u64(seed ^ 0x6a09_e667_f3bc_c908);
            arrival::Arrivals::new(rate / args.concurrency as f64, rng)
        });
        let mut r = worker::Requester::connect(
            args.proto,
            target,
            tls.as_ref(),
            Xoshiro256StarStar::seed_from_u64(seed),
            arrivals,
        )?;
        if let Some(cache) = aside {
            r = r.look_aside(cache)?;
        }
        if let Some(placement) = &placement {
            r = r.encoded(target, placement.clone())?;
        }
        groups[i % threads].push(r);
    }

    let start = Instant::now();
    for r in groups.iter_mut().flatten() {
        r.start_schedule(start);
    }
    let measure_start = start + Duration::from_secs_f64(args.warmup);
    let end = measure_start + Duration::from_secs_f64(args.duration);
    let ranking = args.change.map(|kind| {
        (
            zipf::Ranking::new(args.keys, kind, args.change_keys, args.seed),
            Duration::from_secs_f64(args.change_every),
        )
    });
    let interval = Duration::from_millis(args.interval_ms);
    let plan = Arc::new(worker::Plan {
        target,
        tls,
        protocol: args.protocol,
        key_prefix: args.key_prefix.clone(),
        keygen: zipf::KeyGen::new(args.keys, args.dist.theta(), !args.no_scramble),
        write_keygen: args
            .write_dist
            .map(|d| zipf::KeyGen::new(args.keys, d.theta(), !args.no_scramble)),
        ranking,
        interval,
        get_ratio: args.get_ratio,
        value: text::value(args.value_size),
        timeout: Duration::from_millis(args.timeout_ms),
        measure_start,
        end,
        cap: args.requests,
        rate_control: args.rate_control,
        issued: AtomicU64::new(0),
        completed: AtomicU64::new(0),
    });

    let (series_tx, series_rx) = mpsc::channel();
    let mut series = report::SeriesBuilder::new(interval.as_secs_f64(), threads);
    let mut handles = Vec::with_capacity(threads);
    for (i, group) in groups.into_iter().enumerate() {
        let plan = Arc::clone(&plan);
        let tx = series_tx.clone();
        let h = std::thread::Builder::new()
            .name(format!("loadgen-{i}"))
            .spawn(move || worker::run(&plan, group, i, tx))
            .context("failed to start a worker thread")?;
        handles.push(h);
    }
    drop(series_tx);

    let progress = !args.quiet && std::io::stderr().is_terminal();
    let mut last_print = start;
    while !handles.iter().all(|h| h.is_finished()) {
        if let Ok(slice) = series_rx.recv_timeout(Duration::from_millis(25)) {
            series.add(slice);
        }
        if progress && last_print.elapsed() >= Duration::from_millis(250) {
            last_print = Instant::now();
            print_progress(start, plan.completed.load(Ordering::Relaxed));
        }
    }
    if progress {
        eprint!("\r\x1b[K");
    }

    let mut stats = report::Stats::default();
    let mut stopped = measure_start;
    for h in handles {
        let (s, at) = h
            .join()
            .map_err(|_| anyhow::anyhow!("a worker thread panicked"))?;
        stats.merge(&s);
        stopped = stopped.max(at);
    }
    for slice in series_rx.try_iter() {
        series.add(slice);
    }
    let duration_s = stopped
        .min(end)
        .saturating_duration_since(measure_start)
        .as_secs_f64();
    let report = Report::new(
        args,
        target.to_string(),
        duration_s,
        &stats,
        series.finish(duration_s),
    );
    if let Some(path) = &args.json {
        let json =
            serde_json::to_string_pretty(&report).context("failed to serialise the report")?;
        std::fs::write(path, json + "\n")
            .with_context(|| format!("failed to write the report to {}", path.display()))?;
    }
    Ok(report)
}

fn print_progress(start: Instant, completed: u64) {
    let elapsed = start.elapsed().as_secs_f64();
    let rps = if elapsed > 0.0 {
        completed as f64 / elapsed
    } else {
        0.0
    };
    let mut err = std::io::stderr().lock();
    let _ = write!(
        err,
        "\r\x1b[K{elapsed:6.1} s  {completed:>12} requests  {rps:>10.0} req/s"
    );
    let _ = err.flush();
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        load: LoadArgs,
    }

    #[test]
    fn defaults_match_new() {
        let cli = Cli::try_parse_from(["load", "--target", "127.0.0.1:11211"]).expect("parse");
        assert_eq!(cli.load, LoadArgs::new("127.0.0.1:11211"));
    }

    #[test]
    fn parses_every_flag() {
        let cli = Cli::try_parse_from([
            "load",
            "--target",
            "h:1",
            "--proto",
            "tcp",
            "--keys",
            "5",
            "--key-prefix",
            "k",
            "--dist",
            "zipf:1.2",
            "--no-scramble",
            "--get-ratio",
            "0.5",
            "--value-size",
            "10",
            "--concurrency",
            "8",
            "--duration",
            "0.5",
            "--requests",
            "100",
            "--timeout-ms",
            "20",
            "--warmup",
            "1",
            "--json",
            "out.json",
            "--quiet",
            "--threads",
            "2",
            "--preload",
            "--seed",
            "9",
        ])
        .expect("parse");
        let a = cli.load;
        assert_eq!(a.proto, Proto::Tcp);
        assert_eq!(a.dist, Dist::Zipf(1.2));
        assert_eq!(
            (a.keys, a.concurrency, a.threads, a.requests),
            (5, 8, Some(2), Some(100))
        );
        assert!(a.no_scramble && a.quiet && a.preload);
        assert!(
            Cli::try_parse_from(["load"]).is_err(),
            "--target is required"
        );
    }

    #[test]
    fn parses_open_loop_and_change_flags() {
        let cli = Cli::try_parse_from([
            "load",
            "--target",
            "h:1",
            "--rate",
            "2500.5",
            "--protocol",
            "binary",
            "--dist",
            "zipf",
            "--change",
            "hot-out",
            "--change-keys",
            "7",
            "--change-every",
            "0.5",
            "--interval-ms",
            "250",
        ])
        .expect("parse");
        let a = cli.load;
        assert_eq!(a.rate, Some(2500.5));
        assert_eq!(a.protocol, Protocol::Binary);
        assert_eq!(a.change, Some(ChangeKind::HotOut));
        assert_eq!(
            (a.change_keys, a.change_every, a.interval_ms),
            (7, 0.5, 250)
        );
        assert!(a.validate().is_ok());
        for kind in ["hot-in", "random"] {
            assert!(Cli::try_parse_from(["load", "--target", "h:1", "--change", kind]).is_ok());
        }
        assert!(Cli::try_parse_from(["load", "--target", "h:1", "--protocol", "ascii"]).is_err());
    }

    #[test]
    fn args_from_before_the_new_flags_still_parse() {
        // A report's args as written before --rate, --protocol, --change and --interval-ms.
        let mut json = serde_json::to_value(LoadArgs::new("h:1")).expect("json");
        let obj = json.as_object_mut().expect("object");
        for k in [
            "rate",
            "protocol",
            "change",
            "change_keys",
            "change_every",
            "interval_ms",
        ] {
            assert!(obj.remove(k).is_some(), "{k}");
        }
        let back: LoadArgs = serde_json::from_value(json).expect("old args parse");
        assert_eq!(back, LoadArgs::new("h:1"));
        let json = serde_json::to_string(&LoadArgs {
            change: Some(ChangeKind::HotIn),
            protocol: Protocol::Binary,
            ..LoadArgs::new("h:1")
        })
        .expect("json");
        assert!(
            json.contains("\"hot-in\"") && json.contains("\"binary\""),
            "{json}"
        );
    }

    #[test]
    fn dist_round_trips() {
        assert_eq!("uniform".parse::<Dist>(), Ok(Dist::Uniform));
        assert_eq!("zipf".parse::<Dist>(), Ok(Dist::Zipf(0.99)));
        assert_eq!("zipf:0.5".parse::<Dist>(), Ok(Dist::Zipf(0.5)));
        assert_eq!("zipf:-1".parse::<Dist>(), Err(DistError::Exponent(-1.0)));
        assert!(matches!(
            "zipf:nan".parse::<Dist>(),
            Err(DistError::Exponent(t)) if t.is_nan()
        ));
        assert_eq!(
            "zipf:x".parse::<Dist>(),
            Err(DistError::BadExponent("x".into()))
        );
        let e = "pareto".parse::<Dist>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown distribution \"pareto\": expected uniform or zipf:THETA"
        );
        let json = serde_json::to_string(&Dist::Zipf(0.99)).expect("json");
        assert_eq!(json, "\"zipf:0.99\"");
        assert_eq!(
            serde_json::from_str::<Dist>(&json).expect("parse"),
            Dist::Zipf(0.99)
        );
    }

    #[test]
    fn rejects_bad_arguments() {
        let ok = LoadArgs::new("127.0.0.1:1");
        assert!(ok.validate().is_ok());
        let bad = [
            LoadArgs {
                keys: 0,
                ..ok.clone()
            },
            LoadArgs {
                get_ratio: 1.5,
                ..ok.clone()
            },
            LoadArgs {
                concurrency: 0,
                ..ok.clone()
            },
            LoadArgs {
                duration: 0.0,
                ..ok.clone()
            },
            LoadArgs {
                duration: f64::INFINITY,
                ..ok.clone()
            },
            LoadArgs {
                key_prefix: "a b".into(),
                ..ok.clone()
            },
            LoadArgs {
                key_prefix: "k".repeat(250),
                ..ok.clone()
            },
            LoadArgs {
                value_size: 70_000,
                ..ok.clone()
            },
            LoadArgs {
                timeout_ms: 0,
                ..ok.clone()
            },
            LoadArgs {
                look_aside: Some("127.0.0.1:11211".into()),
                proto: Proto::Tcp,
                ..ok.clone()
            },
            LoadArgs {
                rate: Some(0.0),
                ..ok.clone()
            },
            LoadArgs {
                rate: Some(f64::NAN),
                ..ok.clone()
            },
            LoadArgs {
                rate: Some(1e-300),
                ..ok.clone()
            },
            LoadArgs {
                rate: Some(MIN_RATE / 2.0),
                ..ok.clone()
            },
            LoadArgs {
                interval_ms: 0,
                ..ok.clone()
            },
            // A popularity change needs a skewed distribution ...
            LoadArgs {
                change: Some(ChangeKind::HotIn),
                ..ok.clone()
            },
            // ... and fewer keys to move than there are.
            LoadArgs {
                change: Some(ChangeKind::HotIn),
                dist: Dist::Zipf(0.99),
                change_keys: 10_000,
                ..ok.clone()
            },
            LoadArgs {
                change: Some(ChangeKind::Random),
                dist: Dist::Zipf(0.99),
                change_keys: 5_001,
                ..ok.clone()
            },
            LoadArgs {
                change: Some(ChangeKind::HotOut),
                dist: Dist::Zipf(0.99),
                change_every: 0.0,
                ..ok.clone()
            },
            LoadArgs {
                protocol: Protocol::Binary,
                value_size: 65_460,
                ..ok.clone()
            },
        ];
        for a in bad {
            assert!(a.validate().is_err(), "{a:?}");
        }
        // Gets only: the value is never sent, so its size does not matter to UDP.
        let big_gets = LoadArgs {
            value_size: 70_000,
            get_ratio: 1.0,
            ..ok.clone()
        };
        assert!(big_gets.validate().is_ok());
        let big_tcp = LoadArgs {
            value_size: 70_000,
            proto: Proto::Tcp,
            ..ok
        };
        assert!(big_tcp.validate().is_ok());
    }

    #[test]
    fn run_stops_when_nobody_answers() {
        // A bound UDP socket that never replies: every request times out, and the run still
        // ends on time.
        let silent = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let args = LoadArgs {
            duration: 0.3,
            timeout_ms: 50,
            concurrency: 2,
            quiet: true,
            ..LoadArgs::new(silent.local_addr().expect("addr").to_string())
        };
        let t = Instant::now();
        let r = run(&args).expect("run");
        assert!(t.elapsed() < Duration::from_secs(2));
        assert_eq!(r.gets + r.sets, 0);
        assert!(r.timeouts >= 2, "{r:?}");
        assert_eq!(r.requests, r.timeouts + r.errors);
    }

    #[test]
    fn tcp_run_ends_on_time_when_reconnects_hang() {
        use std::net::{TcpListener, TcpStream};
        use std::os::fd::AsRawFd;

        const REQUESTERS: usize = 4;
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        // The server accepts the requesters' first connections, then stops accepting and fills
        // its backlog, so later connects get no answer; finally it closes what it accepted,
        // which makes every requester reconnect.
        let server = std::thread::spawn(move || {
            let accepted: Vec<TcpStream> = (0..REQUESTERS)
                .map(|_| listener.accept().expect("accept").0)
                .collect();
            // Listening again only changes the backlog: one queued connection fills it.
            // SAFETY: a plain syscall on a socket this thread owns.
            let rc = unsafe { libc::listen(listener.as_raw_fd(), 0) };
            assert_eq!(rc, 0, "listen");
            let mut fillers = Vec::new();
            while fillers.len() < 16 {
                match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
                    Ok(s) => fillers.push(s),
                    Err(_) => break,
                }
            }
            drop(accepted);
            (listener, fillers)
        });
        let args = LoadArgs {
            proto: Proto::Tcp,
            duration: 1.0,
            concurrency: REQUESTERS,
            threads: Some(1),
            quiet: true,
            ..LoadArgs::new(addr.to_string())
        };
        let t = Instant::now();
        let r = run(&args).expect("run");
        let elapsed = t.elapsed();
        let (_listener, fillers) = server.join().expect("server");
        assert!(!fillers.is_empty(), "the backlog was never filled");
        assert!(
            elapsed < Duration::from_secs_f64(args.duration + 1.0),
            "the run took {elapsed:?}"
        );
        assert!(r.errors > 0, "{r:?}");
    }
}
