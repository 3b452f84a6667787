//! `kvswitch bench fastpath`: what the XDP fast path saves, side by side with the AF_PACKET
//! path, memcached direct and nutcracker on the same testbed: GET throughput and latency, and the CPU a
//! GET costs — in the kvswitch process, on the whole machine, and in the XDP program itself
//! (the kernel's own BPF run-time statistics).

use std::fmt::Write as _;

use anyhow::Context;
use serde::Serialize;

use super::bed::{Bed, BedSpec, CacheSetup, Servers, System, PEERS};
use super::output::{fmt, ratio, times};
use super::plot::{BarChart, Chart};
use super::runner::{Figures, Keys, Record, Runner, Runs, Stage};
use crate::measure::per_s;

pub const NAME: &str = "fastpath";
/// The datapaths compared, as `switch.datapath` names them.
const DATAPATHS: [&str; 2] = ["xdp", "af_packet"];

/// The same settings as `cost`: closed-loop requesters, keys and value size.
pub use super::cost::Args;

#[derive(Clone, Debug, Serialize)]
pub struct Point {
    /// `switch.datapath` of the testbed's kvswitch.
    pub datapath: &'static str,
    /// Through the VIP (routed by key) or to a server's own address (switched by MAC).
    pub system: System,
    pub get_rps: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// The median round trip of one requester alone (light load), µs.
    pub light_p50_us: f64,
    /// CPU µs per GET of the kvswitch process (user + system).
    pub kvswitch_us: Option<f64>,
    /// CPU µs per GET of nutcracker (user + system); only for nutcracker.
    pub nutcracker_us: Option<f64>,
    /// CPU µs per GET of the whole machine (every core; clients and servers included).
    pub machine_us: Option<f64>,
    /// Run time of the XDP program per GET (its request and its reply), from the kernel's
    /// BPF statistics; none on AF_PACKET.
    pub xdp_ns: Option<f64>,
    pub run: u32,
}

impl Figures for Point {
    type At = (&'static str, System);

    fn at(&self) -> Self::At {
        (self.datapath, self.system)
    }

    fn median(runs: &Runs<'_, Point>) -> Point {
        Point {
            datapath: runs.first().datapath,
            system: runs.first().system,
            get_rps: runs.median(|p| p.get_rps),
            p50_us: runs.median(|p| p.p50_us),
            p99_us: runs.median(|p| p.p99_us),
            light_p50_us: runs.median(|p| p.light_p50_us),
            kvswitch_us: runs.median_of_some(|p| p.kvswitch_us),
            nutcracker_us: runs.median_of_some(|p| p.nutcracker_us),
            machine_us: runs.median_of_some(|p| p.machine_us),
            xdp_ns: runs.median_of_some(|p| p.xdp_ns),
            run: runs.count(),
        }
    }

    fn line(&self) -> String {
        format!(
            "{:<9} {:<24} {:>8.0} GET/s  p50 {:>4.0} µs (alone {:>3.0} µs)  kvswitch {} µs/GET  \
             nutcracker {} µs/GET  machine {} µs/GET  XDP program {} ns/GET",
            self.datapath,
            self.system,
            self.get_rps,
            self.p50_us,
            self.light_p50_us,
            fmt(self.kvswitch_us, 2),
            fmt(self.nutcracker_us, 2),
            fmt(self.machine_us, 2),
            fmt(self.xdp_ns, 0),
        )
    }
}

/// The systems measured on each datapath: the VIP over UDP and over TCP (the splice; on XDP
/// the program sends the servers' replies on), memcached direct over both (the switch forwards
/// its packets by MAC), nutcracker over TCP (the proxy a fleet runs today; the switch carries
/// its frames), and the VIP with the cache on (every key cached once read: on XDP the kernel
/// answers them) on a testbed of its own.
const SYSTEMS: [System; 6] = [
    System::KvswitchUdp,
    System::DirectUdp,
    System::KvswitchTcp,
    System::DirectTcp,
    System::Nutcracker,
    System::KvswitchCacheUdp,
];

pub fn run(args: &Args) -> anyhow::Result<Vec<Point>> {
    let duration = args.duration();
    super::check_duration(duration)?;
    let runner = Runner::start(NAME, &args.common)?;
    let runs = runner.runs();
    let stats = BpfStats::enable()?;
    let stages = DATAPATHS.into_iter().flat_map(|datapath| {
        [false, true].map(|cached| {
            let with = if cached {
                ", its cache holding every key"
            } else {
                ", nutcracker"
            };
            Stage {
                testbed: format!(
                    "1 client, {PEERS} memcached, kvswitch with datapath = {datapath:?}{with}"
                ),
                spec: BedSpec {
                    prefix: args.common.prefix.clone(),
                    servers: Servers::Memcached { n: PEERS },
                    cache: cached.then(|| CacheSetup::whole_keyspace(args.keys)),
                    switchkv: None,
                    nutcracker: !cached,
                    datapath: Some(datapath),
                    tcp: None,
                },
                preload: vec![Keys::new(args.keys, "key:", args.value_size as usize)],
                systems: SYSTEMS
                    .into_iter()
                    .filter(|s| s.cached() == cached)
                    .collect(),
                points: vec![datapath],
            }
        })
    });
    let points = runner.measure(stages, |bed, system, &datapath, run| {
        measure(bed, &stats, args, datapath, system, run)
    })?;
    drop(stats);
    let medians = super::runner::medians(&points);
    runner.finish(
        Record {
            settings: super::cost::Settings::of(args, runs),
            systems: None,
            runs: &points,
            medians: &medians,
            more: (),
        },
        vec![("cpu-per-get".into(), Chart::Bars(chart(&medians)))],
        &summary(args, &medians, runs, duration),
    )?;
    Ok(medians)
}

/// One system on one testbed: a closed loop at full speed, then one requester alone.
fn measure(
    bed: &Bed,
    stats: &BpfStats,
    args: &Args,
    datapath: &'static str,
    system: System,
    run: u32,
) -> anyhow::Result<Point> {
    let load = args.load(run);
    let duration = load.duration;
    let machine_before = machine_ticks()?;
    let port = &bed.live.state.hosts[0].switch_if;
    let xdp_before = stats.program_ns(port)?;
    let m = bed.load(system, &load)?;
    let machine_s = (machine_ticks()? - machine_before) as f64 / crate::measure::clock_ticks();
    let xdp_after = stats.program_ns(port)?;
    let r = &m.report;
    // CPU was read over the warm-up and the window alike: per GET of both.
    let gets = per_s(r.gets, r.duration_s) * (r.duration_s + load.warmup);
    let per = |cpu_s: Option<f64>| cpu_s.filter(|_| gets > 0.0).map(|s| s * 1e6 / gets);
    let xdp_ns = match (datapath, xdp_before, xdp_after) {
        ("xdp", Some(before), Some(after)) if gets > 0.0 => {
            Some(after.saturating_sub(before) as f64 / gets)
        }
        _ => None,
    };
    let light = bed.load(
        system,
        &loadgen::LoadArgs {
            concurrency: 1,
            duration: (duration / 2.0).max(0.3),
            warmup: 0.1,
            ..load.clone()
        },
    )?;
    let lr = &light.report;
    if lr.gets == 0 || lr.timeouts + lr.errors > 0 {
        eprintln!(
            "  {datapath} {system} alone: {} GETs, {} timeouts, {} errors",
            lr.gets, lr.timeouts, lr.errors
        );
    }
    Ok(Point {
        datapath,
        system,
        get_rps: per_s(r.gets, r.duration_s),
        p50_us: r.latency_us.p50 as f64,
        p99_us: r.latency_us.p99 as f64,
        light_p50_us: light.report.latency_us.p50 as f64,
        kvswitch_us: per(m.kvswitch_cpu_s),
        nutcracker_us: per(m.nutcracker_cpu_s.filter(|_| system == System::Nutcracker)),
        machine_us: per(Some(machine_s)),
        xdp_ns,
        run,
    })
}

/// Total CPU ticks of every core (user, nice, system, irq, softirq) from /proc/stat.
pub(crate) fn machine_ticks() -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let line = stat
        .lines()
        .find(|l| l.starts_with("cpu "))
        .context("/proc/stat has no cpu line")?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...
    let busy = [0usize, 1, 2, 5, 6, 7]
        .iter()
        .filter_map(|&i| fields.get(i))
        .sum();
    Ok(busy)
}

/// The kernel's BPF run-time statistics (`kernel.bpf_stats_enabled`), on while it lives and
/// set back as they were when dropped.
struct BpfStats {
    before: String,
}

const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl BpfStats {
    fn enable() -> anyhow::Result<BpfStats> {
        let before = std::fs::read_to_string(BPF_STATS)
            .with_context(|| format!("reading {BPF_STATS}"))?
            .trim()
            .to_string();
        std::fs::write(BPF_STATS, "1").with_context(|| format!("writing {BPF_STATS}"))?;
        Ok(BpfStats { before })
    }

    /// Nanoseconds the XDP program attached to interface `port` has run so far (bpftool's
    /// `run_time_ns`), or `None` when it has none.
    fn program_ns(&self, port: &str) -> anyhow::Result<Option<u64>> {
        let out = std::process::Command::new("ip")
            .args(["-json", "-details", "link", "show", "dev", port])
            .output()
            .context("running ip")?;
        anyhow::ensure!(out.status.success(), "ip link show {port} failed");
        let links: serde_json::Value = serde_json::from_slice(&out.stdout).context("ip's JSON")?;
        let Some(id) = links[0]["xdp"]["prog"]["id"].as_u64() else {
            return Ok(None);
        };
        let out = std::process::Command::new("bpftool")
            .args(["--json", "prog", "show", "id", &id.to_string()])
            .output()
            .context("running bpftool (scripts/setup.sh installs it)")?;
        anyhow::ensure!(out.status.success(), "bpftool prog show id {id} failed");
        let prog: serde_json::Value =
            serde_json::from_slice(&out.stdout).context("bpftool's JSON")?;
        Ok(prog["run_time_ns"].as_u64())
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write(BPF_STATS, &self.before);
    }
}

/// How the summary names a system's target.
fn target(system: System) -> &'static str {
    match system {
        System::DirectUdp => "direct",
        System::DirectTcp => "direct (TCP)",
        System::KvswitchTcp => "VIP (TCP)",
        System::KvswitchCacheUdp => "VIP, cache on",
        System::Nutcracker => "nutcracker (TCP)",
        _ => "VIP",
    }
}

fn label(p: &Point) -> String {
    format!("{} {}", p.datapath, target(p.system))
}

fn chart(medians: &[Point]) -> BarChart {
    BarChart {
        title: "CPU per GET: XDP fast path against AF_PACKET".into(),
        x_label: "datapath and target".into(),
        y_label: "µs of CPU per GET".into(),
        categories: medians.iter().map(label).collect(),
        groups: vec![
            (
                "kvswitch process".into(),
                medians
                    .iter()
                    .map(|p| p.kvswitch_us.unwrap_or(0.0))
                    .collect(),
            ),
            (
                "nutcracker process".into(),
                medians
                    .iter()
                    .map(|p| p.nutcracker_us.unwrap_or(0.0))
                    .collect(),
            ),
            (
                "whole machine".into(),
                medians
                    .iter()
                    .map(|p| p.machine_us.unwrap_or(0.0))
                    .collect(),
            ),
        ],
        line: None,
        stacked: false,
    }
}

fn summary(args: &Args, medians: &[Point], runs: u32, duration: f64) -> String {
    let mut t = String::new();
    let _ = writeln!(t, "# The XDP fast path against AF_PACKET\n");
    let _ = writeln!(
        t,
        "{} closed-loop requesters read {} keys of {} bytes (over UDP, or TCP where named) as \
         fast as each system answers, {duration} s per system, medians of {runs} run(s). The same testbed ({PEERS} \
         memcached in `l2` mode, 1 client) is built once with `switch.datapath = \"xdp\"` and \
         once with `\"af_packet\"`; \"VIP\" reads are routed by key, \"direct\" reads go to a \
         server's own address and are switched by MAC, \"nutcracker\" reads go over TCP to a \
         nutcracker in front of the same servers (its frames cross the switch too), and \
         \"(TCP)\" reads go over TCP, to the VIP's splice or to a server, and \
         \"VIP, cache on\" reads go to a \
         testbed of their own whose kvswitch caches every key once read (on XDP the kernel \
         answers them from its copy of the cache). p50 alone is one requester's median round \
         trip, the others are of the closed loop. kvswitch µs/GET and nutcracker \
         µs/GET are those processes' user + system time; machine µs/GET is every core's busy time from /proc/stat \
         (client, servers and softirq included); the XDP program's time is the kernel's BPF \
         run-time statistics for kvswitch's program, per GET (its request and its reply).\n",
        args.concurrency, args.keys, args.value_size
    );
    let _ = writeln!(
        t,
        "| datapath | target | GET/s | p50 µs | p99 µs | p50 alone µs | kvswitch µs/GET | nutcracker µs/GET | machine µs/GET | XDP ns/GET |"
    );
    let _ = writeln!(t, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|");
    for p in medians {
        let _ = writeln!(
            t,
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {} | {} | {} |",
            p.datapath,
            target(p.system),
            p.get_rps,
            p.p50_us,
            p.p99_us,
            p.light_p50_us,
            fmt(p.kvswitch_us, 2),
            fmt(p.nutcracker_us, 2),
            fmt(p.machine_us, 2),
            fmt(p.xdp_ns, 0)
        );
    }
    let find = |d: &str, s: System| medians.iter().find(|p| p.datapath == d && p.system == s);
    let _ = writeln!(t);
    if let (Some(x), Some(a)) = (
        find("xdp", System::KvswitchUdp),
        find("af_packet", System::KvswitchUdp),
    ) {
        let _ = writeln!(
            t,
            "- VIP, XDP / AF_PACKET: GET/s {}, kvswitch CPU per GET {}, machine CPU per GET {}.",
            times(ratio(Some(x.get_rps), Some(a.get_rps))),
            times(ratio(x.kvswitch_us, a.kvswitch_us)),
            times(ratio(x.machine_us, a.machine_us)),
        );
    }
    if let (Some(k), Some(d), Some(u)) = (
        find("xdp", System::KvswitchCacheUdp),
        find("xdp", System::DirectUdp),
        find("af_packet", System::KvswitchCacheUdp),
    ) {
        let _ = writeln!(
            t,
            "- A GET answered from the kernel cache, one requester alone: p50 {} of memcached \
             direct's, {} of the user-space cache's (AF_PACKET); GET/s at full speed {} of \
             direct's.",
            times(ratio(Some(k.light_p50_us), Some(d.light_p50_us))),
            times(ratio(Some(k.light_p50_us), Some(u.light_p50_us))),
            times(ratio(Some(k.get_rps), Some(d.get_rps))),
        );
    }
    if let (Some(v), Some(n)) = (
        find("xdp", System::KvswitchUdp),
        find("xdp", System::Nutcracker),
    ) {
        let _ = writeln!(
            t,
            "- On XDP, VIP / nutcracker: GET/s {}, p50 {}, CPU per GET of the middle box \
             (kvswitch's process and program / nutcracker's process) {}.",
            times(ratio(Some(v.get_rps), Some(n.get_rps))),
            times(ratio(Some(v.p50_us), Some(n.p50_us))),
            times(ratio(
                v.kvswitch_us.zip(v.xdp_ns).map(|(k, x)| k + x / 1000.0),
                n.nutcracker_us
            )),
        );
    }
    if let (Some(x), Some(a), Some(d), Some(n)) = (
        find("xdp", System::KvswitchTcp),
        find("af_packet", System::KvswitchTcp),
        find("xdp", System::DirectTcp),
        find("xdp", System::Nutcracker),
    ) {
        let middle = |p: &Point| p.kvswitch_us.map(|k| k + p.xdp_ns.unwrap_or(0.0) / 1000.0);
        let _ = writeln!(
            t,
            "- TCP to the VIP, XDP / AF_PACKET: GET/s {}, p50 alone {}, kvswitch CPU per GET \
             (process, and program on XDP) {}.",
            times(ratio(Some(x.get_rps), Some(a.get_rps))),
            times(ratio(Some(x.light_p50_us), Some(a.light_p50_us))),
            times(ratio(middle(x), middle(a))),
        );
        let _ = writeln!(
            t,
            "- On XDP, TCP to the VIP / TCP direct: GET/s {}, p50 alone {}, p99 {}; against \
             nutcracker: GET/s {}, CPU per GET of the middle box {}.",
            times(ratio(Some(x.get_rps), Some(d.get_rps))),
            times(ratio(Some(x.light_p50_us), Some(d.light_p50_us))),
            times(ratio(Some(x.p99_us), Some(d.p99_us))),
            times(ratio(Some(x.get_rps), Some(n.get_rps))),
            times(ratio(middle(x), n.nutcracker_us)),
        );
    }
    if let (Some(v), Some(d)) = (
        find("xdp", System::KvswitchUdp),
        find("xdp", System::DirectUdp),
    ) {
        let _ = writeln!(
            t,
            "- On XDP, VIP / direct: GET/s {}, p50 {}.",
            times(ratio(Some(v.get_rps), Some(d.get_rps))),
            times(ratio(Some(v.p50_us), Some(d.p50_us))),
        );
    }
    t
}
