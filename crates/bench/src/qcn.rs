//! QCN on kvswitch (ServerSwitch, sections 5.2 and 6.3), and `kvswitch bench qcn`.
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
use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;
use serde_json::{json, Value};
use switch::qcn::{Cp, CpParams, Notification, Rp, RpParams};
use wire::frame::{emit_udp_headers, parse_udp, PAYLOAD_OFFSET};

use super::bed::{Bed, BedSpec, Servers};
use super::output::{fmt, Machine, Output};
use super::plot::{Chart, LineChart, Series};
use super::Common;
use crate::measure::median;

pub const NAME: &str = "qcn";
/// The UDP port the sender's traffic goes to.
pub const DATA_PORT: u16 = 9200;
/// Queue queries: sent to the CPU, answered with the queue's length at once.
pub const QUERY_PORT: u16 = 9201;
/// Probes the sink sends straight back.
pub const ECHO_PORT: u16 = 9202;
/// The DSCP a sender marks frames for sampling with.
pub const MARK_DSCP: u8 = 46;

/// A switch's control API.
#[derive(Clone, Debug)]
pub struct Api {
    pub addr: SocketAddr,
    pub token: Option<String>,
}

impl Api {
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> anyhow::Result<Value> {
        let text = body.map(Value::to_string);
        let (code, answer) = testbed::http(
            self.addr,
            method,
            path,
            self.token.as_deref(),
            text.as_deref(),
        )?;
        if !(200..300).contains(&code) {
            bail!("{method} {path}: {code}: {}", answer.trim());
        }
        Ok(serde_json::from_str(&answer).unwrap_or(Value::Null))
    }

    /// The bytes waiting in `port`'s egress queue.
    pub fn queue_bytes(&self, port: u16) -> anyhow::Result<u64> {
        let r = self.call(
            "GET",
            &format!("/api/v1/registers/port{port}.queue_bytes"),
            None,
        )?;
        r["value"]
            .as_u64()
            .with_context(|| format!("register answer {r}"))
    }
}

/// The congestion point's settings.
#[derive(Clone, Debug)]
pub struct CpConfig {
    pub api: Api,
    /// The port whose egress queue is watched.
    pub port: u16,
    pub params: CpParams,
    /// The DSCP of frames to sample.
    pub dscp: u8,
    pub priority: u32,
}

#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct CpStats {
    /// Marked frames taken (older ones of a source in one batch are skipped).
    pub sampled: u64,
    pub notifications: u64,
    pub queries: u64,
    /// Frames the CPU path handed over that were not IPv4 UDP.
    pub ignored: u64,
}

/// Runs the congestion point until `stop`, then removes its entries (also after an error).
pub fn run_cp(cfg: &CpConfig, stop: &dyn Fn() -> bool) -> anyhow::Result<CpStats> {
    let mut made = Vec::new();
    let entries = [
        json!({
            "match": {"ethertype": "0x0800",
                      "ip_tos": {"value": u32::from(cfg.dscp) << 2, "mask": "0xfc"}},
            "priority": cfg.priority,
            "actions": ["mirror"],
        }),
        json!({
            "match": {"ethertype": "0x0800", "ip_proto": 17, "l4_dst": QUERY_PORT},
            "priority": cfg.priority + 1,
            "actions": ["to_cpu"],
        }),
    ];
    let mut result = Ok(CpStats::default());
    for e in &entries {
        match cfg.api.call("POST", "/api/v1/tables/acl/entries", Some(e)) {
            Ok(v) => made.extend(v["id"].as_u64()),
            Err(e) => {
                result = Err(e.context("installing the congestion point's acl entries"));
                break;
            }
        }
    }
    if result.is_ok() {
        result = serve_cp(cfg, stop);
    }
    for id in made {
        let removed = cfg
            .api
            .call("DELETE", &format!("/api/v1/tables/acl/entries/{id}"), None);
        if let (Ok(_), Err(e)) = (&result, removed) {
            result = Err(e.context("removing the congestion point's acl entries"));
        }
    }
    result
}

fn serve_cp(cfg: &CpConfig, stop: &dyn Fn() -> bool) -> anyhow::Result<CpStats> {
    let mut cp = Cp::new(cfg.params);
    let mut stats = CpStats::default();
    while !stop() {
        let got = cfg
            .api
            .call("GET", "/api/v1/packets?max=256&wait_ms=50", None)?;
        // Every query is answered; of the frames sampled, only each source's newest in the
        // batch: older ones waited behind it, and a notification from a stale reading would
        // cut the rate again for congestion already answered.
        let mut todo: Vec<(u16, wire::frame::UdpEnds, bool)> = Vec::new();
        for f in got["frames"].as_array().into_iter().flatten() {
            let (Some(in_port), Some(hex)) = (f["in_port"].as_u64(), f["frame"].as_str()) else {
                continue;
            };
            let Some(ends) = switch::control::unhex(hex)
                .ok()
                .and_then(|b| parse_udp(&b).map(|(e, _)| e))
            else {
                stats.ignored += 1;
                continue;
            };
            let query = ends.dst_port == QUERY_PORT;
            if query {
                stats.queries += 1;
            } else {
                stats.sampled += 1;
                let source = (ends.src_ip, ends.src_port);
                todo.retain(|(_, e, q)| *q || (e.src_ip, e.src_port) != source);
            }
            todo.push((in_port as u16, ends, query));
        }
        for (in_port, ends, query) in todo {
            // Read when the frame is taken, as ServerSwitch's CPU reads the chip's register.
            let queue = cfg.api.queue_bytes(cfg.port)?;
            let fb = if query {
                0
            } else {
                match cp.sample(queue) {
                    Some(fb) => fb,
                    None => continue,
                }
            };
            let n = Notification {
                fb,
                queue: queue.min(u64::from(u32::MAX)) as u32,
                q_eq: cfg.params.q_eq.min(u64::from(u32::MAX)) as u32,
            };
            let mut reply = vec![0u8; PAYLOAD_OFFSET];
            reply.extend_from_slice(&n.emit());
            if !emit_udp_headers(&mut reply, &ends.reversed()) {
                stats.ignored += 1;
                continue;
            }
            cfg.api.call(
                "POST",
                "/api/v1/packets",
                Some(&json!({"port": in_port, "frame": switch::control::hex(&reply)})),
            )?;
            if fb > 0 {
                stats.notifications += 1;
            }
        }
    }
    Ok(stats)
}

/// One sample of a sender's state.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct SendSample {
    pub t: f64,
    pub rate_mbps: f64,
    pub target_mbps: f64,
    pub notifications: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Sent {
    pub bytes: u64,
    pub datagrams: u64,
    pub marked: u64,
    pub notifications: u64,
    pub series: Vec<SendSample>,
}

/// Sends UDP datagrams of `payload` bytes to `to` for `secs` at the reaction point's rate,
/// marking the share it says with `dscp`; a sample of its state every 10 ms, timed from
/// `origin`. Run it on the sending host. `seed` picks which frames are marked.
pub fn send(
    to: SocketAddrV4,
    payload: usize,
    params: RpParams,
    dscp: u8,
    secs: f64,
    seed: u64,
    origin: Instant,
) -> anyhow::Result<Sent> {
    let plain = UdpSocket::bind("0.0.0.0:0")?;
    let marked = socket2::Socket::from(UdpSocket::bind("0.0.0.0:0")?);
    marked.set_tos_v4(u32::from(dscp) << 2)?;
    let marked: UdpSocket = marked.into();
    for s in [&plain, &marked] {
        s.set_nonblocking(true)?;
    }
    let buf = vec![0x51u8; payload];
    let started = Instant::now();
    let clock = |now: Instant| kv::Instant::ZERO + now.duration_since(origin);
    let mut rp = Rp::new(params);
    let mut rng = seed | 1;
    let mut credit = 0.0f64;
    let mut last = started;
    let mut out = Sent {
        bytes: 0,
        datagrams: 0,
        marked: 0,
        notifications: 0,
        series: Vec::new(),
    };
    let mut next_sample = started;
    let frame_bytes = (payload + PAYLOAD_OFFSET + 4) as f64;
    let end = started + Duration::from_secs_f64(secs);
    let mut cn = [0u8; 64];
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        // At most 2 ms of credit: a sender held up does not burst.
        credit = (credit + rp.rate() / 8.0 * now.duration_since(last).as_secs_f64())
            .min(rp.rate() / 8.0 * 0.002 + frame_bytes);
        last = now;
        while credit >= frame_bytes {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let mark = (rng % 1_000_000) as f64 / 1e6 < rp.mark_probability();
            let sock = if mark { &marked } else { &plain };
            match sock.send_to(&buf, to) {
                Ok(_) => {
                    credit -= frame_bytes;
                    out.bytes += frame_bytes as u64;
                    out.datagrams += 1;
                    out.marked += u64::from(mark);
                    rp.sent(frame_bytes as u64, clock(now));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e).context("sending"),
            }
        }
        for s in [&plain, &marked] {
            while let Ok(n) = s.recv(&mut cn) {
                if let Some(note) = Notification::parse(&cn[..n]) {
                    if note.fb > 0 {
                        out.notifications += 1;
                    }
                    rp.notified(note.fb, clock(Instant::now()));
                }
            }
        }
        rp.tick(clock(now));
        if now >= next_sample {
            out.series.push(SendSample {
                t: round3(now.saturating_duration_since(origin).as_secs_f64()),
                rate_mbps: round3(rp.rate() / 1e6),
                target_mbps: round3(rp.target() / 1e6),
                notifications: out.notifications,
            });
            next_sample += Duration::from_millis(10);
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(out)
}

/// Takes traffic on [`DATA_PORT`] and echoes datagrams on [`ECHO_PORT`] until `stop`; returns
/// the megabits a second received in each 100 ms from `origin`. Run it on the receiving host;
/// `ready` is told once both ports are bound (or not).
pub fn sink(
    stop: &AtomicBool,
    ready: std::sync::mpsc::Sender<bool>,
    origin: Instant,
) -> Vec<(f64, f64)> {
    let (Ok(data), Ok(echo)) = (
        UdpSocket::bind(("0.0.0.0", DATA_PORT)),
        UdpSocket::bind(("0.0.0.0", ECHO_PORT)),
    ) else {
        let _ = ready.send(false);
        return Vec::new();
    };
    let ok = data.set_nonblocking(true).is_ok() && echo.set_nonblocking(true).is_ok();
    let _ = ready.send(ok);
    let mut bins: Vec<(f64, f64)> = Vec::new();
    let mut buf = vec![0u8; 65_536];
    while !stop.load(Ordering::Relaxed) {
        let mut idle = true;
        while let Ok((n, _)) = data.recv_from(&mut buf) {
            idle = false;
            let since = Instant::now().saturating_duration_since(origin);
            let bin = (since.as_millis() / 100) as usize;
            while bins.len() <= bin {
                bins.push(((bins.len() + 1) as f64 * 0.1, 0.0));
            }
            bins[bin].1 += (n + PAYLOAD_OFFSET + 4) as f64 * 8.0 / 0.1 / 1e6;
        }
        while let Ok((n, from)) = echo.recv_from(&mut buf) {
            idle = false;
            let _ = echo.send_to(&buf[..n], from);
        }
        if idle {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    bins.into_iter()
        .map(|(t, m)| (round3(t), round3(m)))
        .collect()
}

/// To the thousandth: the results' series stay readable and small.
fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Round-trip times in µs of `count` 64-byte-frame probes to `to`, one at a time (a probe
/// with no answer in 200 ms is left out). Run it on the sending host.
pub fn probe(to: SocketAddrV4, count: u32) -> anyhow::Result<Vec<f64>> {
    let sock = UdpSocket::bind("0.0.0.0:0")?;
    sock.connect(to)?;
    sock.set_read_timeout(Some(Duration::from_millis(200)))?;
    let mut rtts = Vec::new();
    let mut buf = [0u8; 128];
    for i in 0..count {
        // 64 bytes on the wire with the headers and FCS.
        let mut payload = [0u8; 64 - PAYLOAD_OFFSET - 4];
        payload[..4].copy_from_slice(&i.to_be_bytes());
        let started = Instant::now();
        sock.send(&payload)?;
        let deadline = started + Duration::from_millis(200);
        while Instant::now() < deadline {
            match sock.recv(&mut buf) {
                Ok(n) => {
                    let mine = n == payload.len() && buf[..4] == i.to_be_bytes();
                    if mine || Notification::parse(&buf[..n]).is_some() {
                        rtts.push(started.elapsed().as_secs_f64() * 1e6);
                        break;
                    }
                }
                Err(_) => break,
            }
        }
    }
    Ok(rtts)
}

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
    /// Queue queries (and echoes) timed for the notification's delay [default: 2000; 200 with
    /// --short].
    #[arg(long)]
    pub probes: Option<u32>,
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
    /// Medians of the probes: queue queries answered by the agent, and echoes from the
    /// receiving host; the difference is what the CPU path adds.
    pub query_rtt_us: Option<f64>,
    pub echo_rtt_us: Option<f64>,
    pub queue: Vec<QueueSample>,
    pub sender: Vec<SendSample>,
    pub received: Vec<(f64, f64)>,
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
    let bed = Bed::up(&BedSpec {
        prefix: args.common.prefix.clone(),
        servers: Servers::Memcached { n: 1 },
        cache: None,
        switchkv: None,
        nutcracker: false,
        datapath: Some("af_packet"),
    })?;
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
    let api = Api {
        addr: state.api,
        token: match &state.api_token_file {
            Some(f) => Some(std::fs::read_to_string(f)?.trim().to_string()),
            None => None,
        },
    };
    let q_eq = (args.q_eq_kb * 1000.0) as u64;
    // Deep enough that QCN, not the queue's limit, keeps it short: a second at the lowest rate.
    let depth = ((args.steps_mbps.iter().cloned().fold(f64::MAX, f64::min) * 1e6 / 8.0) as u64)
        .max(20 * q_eq);
    let set_rate = |mbps: f64| {
        api.call(
            "PUT",
            &format!("/api/v1/ports/{port}/egress"),
            Some(&json!({"rate_bps": (mbps * 1e6) as u64, "depth_bytes": depth})),
        )
    };
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
        let ports = api.call("GET", "/api/v1/ports", None)?;
        Ok(ports["ports"][usize::from(port)]["tx_dropped"]
            .as_u64()
            .unwrap_or(0))
    };
    let dropped_before = tx_dropped()?;
    let to = SocketAddrV4::new(server.ip, DATA_PORT);
    let stop = AtomicBool::new(false);
    let live = &bed.live;
    let client = bed.client.clone();
    let cp_cfg = CpConfig {
        api: api.clone(),
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
                queue_bytes: api.queue_bytes(port)?,
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
        let query = live.in_host(&client, || {
            probe(SocketAddrV4::new(server.ip, QUERY_PORT), n)
        })??;
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
            query_rtt_us: (!query.is_empty()).then(|| median(query)),
            echo_rtt_us: (!echo.is_empty()).then(|| median(echo)),
            queue,
            sender: sent.series,
            received,
        })
    })
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
        "Notification delay: a queue query answered on the CPU path takes {} µs round trip \
         (median), an echo from the receiving host {} µs; the difference, {} µs, is what the \
         CPU path adds (ServerSwitch: 41 and 18 µs, 23 µs).",
        fmt(r.query_rtt_us, 0),
        fmt(r.echo_rtt_us, 0),
        fmt(r.query_rtt_us.zip(r.echo_rtt_us).map(|(a, b)| a - b), 0)
    );
    s
}
