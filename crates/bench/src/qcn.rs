//! `kvswitch bench qcn`: QCN on kvswitch (ServerSwitch, sections 5.2 and 6.3), its parts
//! (the congestion point, the reaction point, the sink) run from [`nf::qcn`].
//!
//! - The congestion point is kvswitch with an agent on its CPU path ([`run_cp`]): an `acl`
//!   entry mirrors frames the source marked (a DSCP) to the CPU as they go on; for each, the
//!   agent reads the congested port's egress queue through the control API, computes QCN's
//!   feedback (`switch::qcn::Cp`) and, when it is negative, sends the source a notification
//!   out of the port the frame came in on. A second entry sends queue queries (UDP to
//!   [`QUERY_PORT`]) to the CPU, answered at once with the queue's length.
//! - The reaction point is a UDP sender on a host ([`send`]): a token bucket at the rate of
//!   `switch::qcn::Rp`, marking frames with the probability QCN samples at.
//! - [`sink`] takes the traffic on the receiving host and echoes probes on [`ECHO_PORT`].
//! - The scenario lowers the congested port's rate, then raises it step by step, and records
//!   the queue and the sender's rate over time; [`probe`] times queue queries against echoes.

use std::fmt::Write as _;
use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;
use serde_json::{json, Value};
use switch::qcn::{CpParams, RpParams};

use nf::cpu::{Cpu, CpuMode};
use nf::qcn::{
    probe, queue_bytes, round3, run_cp, send, sink, CpConfig, CpStats, SendSample, DATA_PORT,
    ECHO_PORT, MARK_DSCP, QUERY_PORT,
};

use super::bed::{Bed, BedSpec};
use super::output::{fmt, Machine, Output};
use super::plot::{Chart, LineChart, Series};
use super::Common;
use crate::measure::median;

pub const NAME: &str = "qcn";
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// The sender's line rate, Mb/s: the congested port's rate before the first step and
    /// after the last.
    #[arg(long, default_value_t = 100.0)]
    pub max_mbps: f64,
    /// The port's rate at each step, in Mb/s, comma-separated (ServerSwitch: 200 Mb/s, then
    /// 200 Mb/s more every 20 s, of a 1 Gb/s port; here scaled to the sender's line rate).
    #[arg(long, value_delimiter = ',', default_values_t = vec![20.0, 40.0, 60.0, 80.0])]
    pub steps_mbps: Vec<f64>,
    /// Seconds at each rate [default: 8; 2 with --short].
    #[arg(long)]
    pub step_s: Option<f64>,
    /// The queue length QCN steers towards, KB.
    #[arg(long, default_value_t = 20.0)]
    pub q_eq_kb: f64,
    /// UDP payload bytes of the sender's datagrams.
    #[arg(long, default_value_t = 1000)]
    pub payload: usize,
    /// Queue queries (and echoes) timed for the notification's delay, and register reads and
    /// writes timed, over each way to the CPU path [default: 2000; 200 with --short].
    #[arg(long)]
    pub probes: Option<u32>,
    /// How the congestion point's agent reaches the CPU path during the run (the delay and
    /// the registers are timed over both ways after it).
    #[arg(long, value_enum, default_value_t = CpuMode::Auto)]
    pub cpu: CpuMode,
}

impl Args {
    pub fn with(common: Common) -> Args {
        Args {
            common,
            max_mbps: 100.0,
            steps_mbps: vec![20.0, 40.0, 60.0, 80.0],
            step_s: None,
            q_eq_kb: 20.0,
            payload: 1000,
            probes: None,
            cpu: CpuMode::Auto,
        }
    }

    fn step_s(&self) -> f64 {
        self.step_s
            .unwrap_or(if self.common.short { 2.0 } else { 8.0 })
    }

    fn probes(&self) -> u32 {
        self.probes
            .unwrap_or(if self.common.short { 200 } else { 2000 })
    }
}

/// The queue, sampled through the API.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct QueueSample {
    pub t: f64,
    pub queue_bytes: u64,
    pub port_mbps: f64,
}

/// One step of the port's rate.
#[derive(Clone, Debug, Serialize)]
pub struct Step {
    pub port_mbps: f64,
    pub start_s: f64,
    pub end_s: f64,
    /// Over the step's second half: the queue's median and 90th percentile, the sender's median
    /// rate, and what the receiver got.
    pub queue_median: f64,
    pub queue_p90: f64,
    pub sender_mbps: f64,
    pub received_mbps: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Results {
    pub scenario: &'static str,
    pub settings: Value,
    pub machine: Machine,
    pub steps: Vec<Step>,
    /// Frames the congested port dropped over the run.
    pub drops: u64,
    pub cp: CpStats,
    pub sent: u64,
    pub marked: u64,
    pub notifications_received: u64,
    /// Whether the run's congestion point took its frames over the CPU channel (else HTTP).
    pub over_channel: bool,
    /// The median of the echoes from the receiving host: the round trip without the CPU.
    pub echo_rtt_us: Option<f64>,
    /// The CPU path's figures over HTTP and over the CPU channel.
    pub ways: Vec<WayFigures>,
    pub queue: Vec<QueueSample>,
    pub sender: Vec<SendSample>,
    pub received: Vec<(f64, f64)>,
}

/// The CPU path's figures over one way to it.
#[derive(Clone, Debug, Serialize)]
pub struct WayFigures {
    /// `http` or `channel`.
    pub way: &'static str,
    /// The median round trip of a queue query answered by the agent; less the echo's, it is
    /// what the CPU path adds to a notification.
    pub query_rtt_us: Option<f64>,
    pub notification_delay_us: Option<f64>,
    /// Register reads (the congested port's queue length, as the agent reads it) and writes
    /// (a user register), one at a time: each call's time in µs, as (mean, median, p99).
    pub register_read_us: (f64, f64, f64),
    pub register_write_us: (f64, f64, f64),
}

pub fn run(args: &Args) -> anyhow::Result<Results> {
    anyhow::ensure!(
        args.max_mbps >= 1.0 && args.max_mbps <= 10_000.0,
        "--max-mbps {}: 1 to 10,000",
        args.max_mbps
    );
    for &s in &args.steps_mbps {
        anyhow::ensure!(
            s >= 1.0 && s <= args.max_mbps,
            "--steps-mbps {s}: 1 to --max-mbps ({})",
            args.max_mbps
        );
    }
    anyhow::ensure!(
        !args.steps_mbps.is_empty(),
        "--steps-mbps: at least one rate"
    );
    anyhow::ensure!(
        (16..=1472).contains(&args.payload),
        "--payload {}: 16 to 1,472 bytes",
        args.payload
    );
    let step_s = args.step_s();
    super::check_duration(step_s)?;
    let machine = Machine::describe();
    let out = Output::create(&super::bed::out_dir(args.common.out.as_ref(), NAME))?;
    eprintln!("{NAME}: building the testbed (1 client, 1 server, datapath = \"af_packet\")...");
    let bed = Bed::up(&BedSpec::one_server(&args.common.prefix))?;
    let measured = measure(&bed, args, step_s);
    bed.down()?;
    let results = Results {
        machine: machine.clone(),
        ..measured?
    };
    out.json(&results)?;
    let mut out = out;
    out.plot("queue", &Chart::Line(queue_chart(args, &results)))?;
    out.plot("rate", &Chart::Line(rate_chart(&results)))?;
    out.summary(&summary(args, &results), &machine)?;
    Ok(results)
}

fn measure(bed: &Bed, args: &Args, step_s: f64) -> anyhow::Result<Results> {
    let state = &bed.live.state;
    let server = (*bed.live.servers().first().context("no server")?).clone();
    let port = state
        .hosts
        .iter()
        .position(|h| h.name == server.name)
        .context("the server's port")? as u16;
    let api = api::Client::new(state.api, state.api_token()?);
    let q_eq = (args.q_eq_kb * 1000.0) as u64;
    // Deep enough that QCN, not the queue's limit, keeps it short: a second at the lowest rate.
    let depth = ((args.steps_mbps.iter().cloned().fold(f64::MAX, f64::min) * 1e6 / 8.0) as u64)
        .max(20 * q_eq);
    let set_rate = |mbps: f64| api.set_egress(port, (mbps * 1e6) as u64, Some(depth));
    let lead_s = step_s.min(2.0);
    // The schedule: the line rate, each step, the line rate again.
    let mut schedule = vec![(0.0, args.max_mbps * 1.5)];
    for (i, &s) in args.steps_mbps.iter().enumerate() {
        schedule.push((lead_s + i as f64 * step_s, s));
    }
    let total = lead_s + args.steps_mbps.len() as f64 * step_s + step_s;
    schedule.push((total - step_s, args.max_mbps * 1.5));
    set_rate(schedule[0].1)?;
    let tx_dropped = || -> anyhow::Result<u64> {
        let ports = api.ports()?;
        Ok(ports.get(usize::from(port)).map_or(0, |p| p.tx_dropped))
    };
    let dropped_before = tx_dropped()?;
    let to = SocketAddrV4::new(server.ip, DATA_PORT);
    let stop = AtomicBool::new(false);
    let live = &bed.live;
    let client = bed.client.clone();
    let cp_cfg = CpConfig {
        api: api.clone(),
        cpu: args.cpu,
        port,
        params: CpParams { q_eq, w: 2.0 },
        dscp: MARK_DSCP,
        priority: 100,
    };
    /// Stops the sink and the congestion point however the scope ends, so an error cannot
    /// leave them running and the scope waiting for them.
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    std::thread::scope(|scope| -> anyhow::Result<Results> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let server_ns = server.name.clone();
        let stop = &stop;
        let _stop = StopOnDrop(stop);
        // One clock for the schedule, the queue, the sender and the receiver.
        let origin = Instant::now() + Duration::from_millis(500);
        let sink = scope.spawn(move || live.in_host(&server_ns, || sink(stop, ready_tx, origin)));
        let cp = scope.spawn(|| run_cp(&cp_cfg, &|| stop.load(Ordering::Relaxed)));
        let mut register = Cpu::open(&api, args.cpu, false)?;
        let ready = ready_rx
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or(false);
        let finish = |stop: &AtomicBool| stop.store(true, Ordering::Relaxed);
        if !ready {
            bail!("the receiver could not bind UDP ports {DATA_PORT} and {ECHO_PORT}");
        }
        // Teach the switch both hosts before the clock starts.
        live.in_host(&client, || {
            probe(SocketAddrV4::new(server.ip, ECHO_PORT), 5)
        })??;
        std::thread::sleep(origin.saturating_duration_since(Instant::now()));
        let params = RpParams::scaled(args.max_mbps * 1e6);
        let (payload, client2) = (args.payload, client.clone());
        let sender = scope.spawn(move || {
            live.in_host(&client2, move || {
                send(to, payload, params, MARK_DSCP, total, 7, origin)
            })
        });
        let mut queue = Vec::new();
        let mut next = 0;
        let mut port_mbps = schedule[0].1;
        while origin.elapsed().as_secs_f64() < total {
            let t = origin.elapsed().as_secs_f64();
            if next < schedule.len() && t >= schedule[next].0 {
                port_mbps = schedule[next].1;
                set_rate(port_mbps)?;
                next += 1;
            }
            queue.push(QueueSample {
                t: round3(t),
                queue_bytes: queue_bytes(&mut register, port)?,
                port_mbps,
            });
            std::thread::sleep(Duration::from_millis(10));
        }
        let sent = sender
            .join()
            .map_err(|_| anyhow::anyhow!("the sender panicked"))???;
        std::thread::sleep(Duration::from_millis(200));
        let drops = tx_dropped()? - dropped_before;
        let n = args.probes();
        let echo = live.in_host(&client, || {
            probe(SocketAddrV4::new(server.ip, ECHO_PORT), n)
        })??;
        finish(stop);
        let received = sink
            .join()
            .map_err(|_| anyhow::anyhow!("the receiver panicked"))??;
        let cp_stats = cp
            .join()
            .map_err(|_| anyhow::anyhow!("the congestion point panicked"))??;
        let echo_rtt_us = (!echo.is_empty()).then(|| median(echo));
        let mut ways = Vec::new();
        for (way, mode) in [("http", CpuMode::Http), ("channel", CpuMode::Channel)] {
            eprintln!("{NAME}: timing the CPU path over {way} ({n} queries, reads, writes)...");
            let query = timed_queries(live, &client, &cp_cfg, mode, server.ip, n)?;
            // ServerSwitch's register test: one read or write at a time, as an agent makes
            // them, with no agent running.
            let mut cpu = Cpu::open(&api, mode, false)?;
            let register_read_us = timed(n, &mut |_| queue_bytes(&mut cpu, port).map(drop))?;
            let register_write_us = timed(n, &mut |i| cpu.write("user0", u64::from(i)))?;
            let query_rtt_us = (!query.is_empty()).then(|| median(query));
            ways.push(WayFigures {
                way,
                query_rtt_us,
                notification_delay_us: query_rtt_us.zip(echo_rtt_us).map(|(q, e)| q - e),
                register_read_us,
                register_write_us,
            });
        }
        let steps = args
            .steps_mbps
            .iter()
            .enumerate()
            .map(|(i, &mbps)| {
                let start = lead_s + i as f64 * step_s;
                let half = start + step_s / 2.0;
                let end = start + step_s;
                let mut q: Vec<f64> = queue
                    .iter()
                    .filter(|s| s.t >= half && s.t < end)
                    .map(|s| s.queue_bytes as f64)
                    .collect();
                q.sort_by(f64::total_cmp);
                let p90 = q.get(q.len() * 9 / 10).copied().unwrap_or(f64::NAN);
                let sender_mbps = median(
                    sent.series
                        .iter()
                        .filter(|s| s.t >= half && s.t < end)
                        .map(|s| s.rate_mbps)
                        .collect(),
                );
                let got: Vec<f64> = received
                    .iter()
                    .filter(|(t, _)| *t > half && *t <= end)
                    .map(|(_, m)| *m)
                    .collect();
                let received_mbps = got.iter().sum::<f64>() / got.len().max(1) as f64;
                Step {
                    port_mbps: mbps,
                    start_s: start,
                    end_s: end,
                    queue_median: median(q.clone()),
                    queue_p90: p90,
                    sender_mbps,
                    received_mbps,
                }
            })
            .collect();
        Ok(Results {
            scenario: NAME,
            settings: json!({
                "max_mbps": args.max_mbps, "steps_mbps": args.steps_mbps, "step_s": step_s,
                "q_eq_bytes": q_eq, "payload": args.payload, "depth_bytes": depth,
                "probes": n, "short": args.common.short,
            }),
            machine: Machine::describe(),
            steps,
            drops,
            cp: cp_stats,
            sent: sent.datagrams,
            marked: sent.marked,
            notifications_received: sent.notifications,
            over_channel: cp_stats.over_channel,
            echo_rtt_us,
            ways,
            queue,
            sender: sent.series,
            received,
        })
    })
}

/// Each of `n` calls' time in µs, one at a time: (mean, median, p99).
fn timed(
    n: u32,
    call: &mut dyn FnMut(u32) -> anyhow::Result<()>,
) -> anyhow::Result<(f64, f64, f64)> {
    let mut us = Vec::with_capacity(n as usize);
    for i in 0..n {
        let t = Instant::now();
        call(i)?;
        us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(spread(us))
}

/// Round trips of `n` queue queries from the client, answered by a congestion point's agent
/// run for them alone over `mode`.
fn timed_queries(
    live: &testbed::Live,
    client: &str,
    cfg: &CpConfig,
    mode: CpuMode,
    server: std::net::Ipv4Addr,
    n: u32,
) -> anyhow::Result<Vec<f64>> {
    let stop = AtomicBool::new(false);
    let cfg = CpConfig {
        cpu: mode,
        ..cfg.clone()
    };
    let to = SocketAddrV4::new(server, QUERY_PORT);
    std::thread::scope(|scope| {
        let cp = scope.spawn(|| run_cp(&cfg, &|| stop.load(Ordering::Relaxed)));
        let rtts = (|| {
            // The agent answers once its entries are in: a query at a time until one is.
            let deadline = Instant::now() + Duration::from_secs(10);
            while live.in_host(client, || probe(to, 1))??.is_empty() {
                anyhow::ensure!(
                    Instant::now() < deadline && !cp.is_finished(),
                    "the congestion point answered no query over {mode:?}"
                );
            }
            live.in_host(client, || probe(to, n))?
        })();
        stop.store(true, Ordering::Relaxed);
        let cp = cp
            .join()
            .map_err(|_| anyhow::anyhow!("the congestion point panicked"))?;
        cp?;
        rtts
    })
}

/// The mean, median and 99th percentile of `v`.
fn spread(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
    let p99 = v
        .get((v.len() * 99 / 100).min(v.len().saturating_sub(1)))
        .copied()
        .unwrap_or(f64::NAN);
    (mean, median(v), p99)
}

fn queue_chart(args: &Args, r: &Results) -> LineChart {
    let q_eq = args.q_eq_kb;
    let end = r.queue.last().map_or(0.0, |s| s.t);
    LineChart {
        title: "QCN: the congested port's egress queue".into(),
        x_label: "time (s)".into(),
        y_label: "queue (KB)".into(),
        x_log: false,
        y_log: false,
        y_from_zero: true,
        series: vec![
            Series {
                name: "queue".into(),
                points: r
                    .queue
                    .iter()
                    .map(|s| (s.t, s.queue_bytes as f64 / 1e3))
                    .collect(),
                color: 0,
                dashed: false,
            },
            Series {
                name: "set point".into(),
                points: vec![(0.0, q_eq), (end, q_eq)],
                color: 1,
                dashed: true,
            },
        ],
    }
}

fn rate_chart(r: &Results) -> LineChart {
    LineChart {
        title: "QCN: the sender's rate follows the port's".into(),
        x_label: "time (s)".into(),
        y_label: "Mb/s".into(),
        x_log: false,
        y_log: false,
        y_from_zero: true,
        series: vec![
            Series {
                name: "port rate".into(),
                points: r.queue.iter().map(|s| (s.t, s.port_mbps)).collect(),
                color: 1,
                dashed: true,
            },
            Series {
                name: "sender rate (QCN)".into(),
                points: r.sender.iter().map(|s| (s.t, s.rate_mbps)).collect(),
                color: 0,
                dashed: false,
            },
            Series {
                name: "received".into(),
                points: r.received.clone(),
                color: 2,
                dashed: false,
            },
        ],
    }
}

fn summary(args: &Args, r: &Results) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# QCN on kvswitch\n\nA UDP sender (the reaction point, QCN pseudo-code 2.3 scaled to \
         a {} Mb/s line rate) sends through kvswitch, whose agent on the CPU path is the \
         congestion point for the receiver's port (set point {} KB). The port's rate is lowered \
         to {} Mb/s, then raised step by step ({} s a step). ServerSwitch (Figure 11): the \
         queue stays around its set point, the sender follows the port, no drops.\n",
        args.max_mbps, args.q_eq_kb, args.steps_mbps[0], r.settings["step_s"]
    );
    let _ = writeln!(
        s,
        "| port Mb/s | sender Mb/s | received Mb/s | queue median KB | queue p90 KB |\n|---|---|---|---|---|"
    );
    for st in &r.steps {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} |",
            fmt(Some(st.port_mbps), 0),
            fmt(Some(st.sender_mbps), 1),
            fmt(Some(st.received_mbps), 1),
            fmt(Some(st.queue_median / 1e3), 1),
            fmt(Some(st.queue_p90 / 1e3), 1)
        );
    }
    let _ = writeln!(
        s,
        "\nDrops at the congested port: {}. Frames sent {}, marked {}; the agent sampled {} and \
         sent {} notifications ({} reached the sender).\n",
        r.drops, r.sent, r.marked, r.cp.sampled, r.cp.notifications, r.notifications_received
    );
    let _ = writeln!(
        s,
        "The CPU path, timed over HTTP and over the CPU channel after the run ({} of each, one \
         at a time, with no other agent running). A queue query answered on the CPU path, less \
         an echo from the receiving host ({} µs median round trip), is what the CPU path adds \
         to a notification (ServerSwitch: 41 less 18, 23 µs). ServerSwitch reads its chip's \
         registers in 6.94 µs and writes them in 4.61 µs on average.\n\n\
         | way | query µs (median) | notification delay µs | register read µs (mean / median / p99) | register write µs (mean / median / p99) |\n|---|---|---|---|---|",
        r.settings["probes"],
        fmt(r.echo_rtt_us, 0),
    );
    for w in &r.ways {
        let (rm, r50, r99) = w.register_read_us;
        let (wm, w50, w99) = w.register_write_us;
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} / {} / {} | {} / {} / {} |",
            w.way,
            fmt(w.query_rtt_us, 0),
            fmt(w.notification_delay_us, 0),
            fmt(Some(rm), 1),
            fmt(Some(r50), 1),
            fmt(Some(r99), 1),
            fmt(Some(wm), 1),
            fmt(Some(w50), 1),
            fmt(Some(w99), 1)
        );
    }
    s
}
