//! QCN on kvswitch (ServerSwitch, sections 5.2 and 6.3):
//!
//! - The congestion point is kvswitch with an agent on its CPU path ([`run_cp`]): an `acl`
//!   entry mirrors frames the source marked (a DSCP) to the CPU as they go on; for each, the
//!   agent reads the congested port's egress queue through the control API, computes QCN's
//!   feedback (`switch::qcn::Cp`) and, when it is negative, sends the source a notification
//!   out of the port the frame came in on. A second entry sends queue queries (UDP to
//!   [`QUERY_PORT`]) to the CPU, answered at once with the queue's length.
//! - The reaction point is a UDP sender on a host ([`send`]): a token bucket at the rate of
//!   `switch::qcn::Rp`, marking frames with the probability QCN samples at.
//! - [`sink`] takes the traffic on the receiving host and echoes probes on [`ECHO_PORT`];
//!   [`probe`] times queue queries against echoes.

use std::net::{SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use api::Client;
use serde::Serialize;
use switch::control::{ActionDef, Value, ACL};
use switch::qcn::{Cp, CpParams, Notification, Rp, RpParams};
use wire::frame::{emit_udp_headers, parse_udp, PAYLOAD_OFFSET};

use crate::cpu::{Cpu, CpuMode};
use crate::{entry, number, text, IPV4};

/// The UDP port the sender's traffic goes to.
pub const DATA_PORT: u16 = 9200;
/// Queue queries: sent to the CPU, answered with the queue's length at once.
pub const QUERY_PORT: u16 = 9201;
/// Probes the sink sends straight back.
pub const ECHO_PORT: u16 = 9202;
/// The DSCP a sender marks frames for sampling with.
pub const MARK_DSCP: u8 = 46;

/// The bytes waiting in `port`'s egress queue, read from a switch's register.
pub fn queue_bytes(cpu: &mut Cpu, port: u16) -> anyhow::Result<u64> {
    cpu.read(&format!("port{port}.queue_bytes"))
}

/// The congestion point's settings.
#[derive(Clone, Debug)]
pub struct CpConfig {
    pub api: Client,
    /// How the agent reaches the CPU path (frames and the queue's register).
    pub cpu: CpuMode,
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
    /// Whether the agent took its frames over the CPU channel (else HTTP).
    pub over_channel: bool,
}

/// Runs the congestion point until `stop`, then removes its entries (also after an error).
pub fn run_cp(cfg: &CpConfig, stop: &dyn Fn() -> bool) -> anyhow::Result<CpStats> {
    let mut made = Vec::new();
    let marked = Value::Masked {
        value: Box::new(number(u32::from(cfg.dscp) << 2)),
        mask: Box::new(text("0xfc")),
    };
    let entries = [
        entry(
            [("ethertype", text(IPV4)), ("ip_tos", marked)],
            cfg.priority,
            vec![ActionDef::Mirror],
        ),
        entry(
            [
                ("ethertype", text(IPV4)),
                ("ip_proto", number(17u8)),
                ("l4_dst", number(QUERY_PORT)),
            ],
            cfg.priority + 1,
            vec![ActionDef::ToCpu],
        ),
    ];
    let mut result = Ok(CpStats::default());
    for e in &entries {
        match cfg.api.add_entry(ACL, e) {
            Ok(id) => made.push(id),
            Err(e) => {
                result = Err(e.context("installing the congestion point's acl entries"));
                break;
            }
        }
    }
    if result.is_ok() {
        result =
            Cpu::open(&cfg.api, cfg.cpu, true).and_then(|mut cpu| serve_cp(cfg, &mut cpu, stop));
    }
    for id in made {
        let removed = cfg.api.remove_entry(ACL, id);
        if let (Ok(_), Err(e)) = (&result, removed) {
            result = Err(e.context("removing the congestion point's acl entries"));
        }
    }
    result
}

fn serve_cp(cfg: &CpConfig, cpu: &mut Cpu, stop: &dyn Fn() -> bool) -> anyhow::Result<CpStats> {
    let mut cp = Cp::new(cfg.params);
    let mut stats = CpStats {
        over_channel: cpu.over_channel(),
        ..CpStats::default()
    };
    while !stop() {
        let got = cpu.frames(256, Duration::from_millis(50))?;
        // Every query is answered; of the frames sampled, only each source's newest in the
        // batch: older ones waited behind it, and a notification from a stale reading would
        // cut the rate again for congestion already answered.
        let mut todo: Vec<(u16, wire::frame::UdpEnds, bool)> = Vec::new();
        for f in got {
            let Some((ends, _)) = parse_udp(&f.frame) else {
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
            todo.push((f.in_port, ends, query));
        }
        for (in_port, ends, query) in todo {
            // Read when the frame is taken, as ServerSwitch's CPU reads the chip's register.
            let queue = queue_bytes(cpu, cfg.port)?;
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
            cpu.send(in_port, &reply)?;
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
    let ok = data.set_nonblocking(true).is_ok()
        && echo
            .set_read_timeout(Some(Duration::from_millis(20)))
            .is_ok();
    let _ = ready.send(ok);
    let mut bins: Vec<(f64, f64)> = Vec::new();
    std::thread::scope(|scope| {
        // Echoes on a thread of their own that waits in the kernel for each: their round
        // trip is the baseline of the notification's delay, so it must not include a poll.
        scope.spawn(|| {
            let mut buf = [0u8; 2048];
            while !stop.load(Ordering::Relaxed) {
                if let Ok((n, from)) = echo.recv_from(&mut buf) {
                    let _ = echo.send_to(&buf[..n], from);
                }
            }
        });
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
            if idle {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    });
    bins.into_iter()
        .map(|(t, m)| (round3(t), round3(m)))
        .collect()
}

/// To the thousandth: the results' series stay readable and small.
pub fn round3(x: f64) -> f64 {
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
