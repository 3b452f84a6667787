//! `kvswitch bench forwarding`: plain layer-2 forwarding, frames of 64 to 1,514 bytes from one
//! host to another, through kvswitch with its XDP fast path, through kvswitch over AF_PACKET
//! alone, and through a Linux bridge on the same veth pairs: the rate frames arrive at, and the
//! round-trip time of a ping of each size.

use std::fmt::Write as _;
use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

use super::bed::{Bed, BedSpec, Servers};
use super::output::{fmt, ratio, times};
use super::plot::{BarChart, Chart};
use super::runner::{progress, Figures, Record, Runner, Runs};
use super::Common;

pub const NAME: &str = "forwarding";
/// The port frames are sent to: the receiver binds it and never reads, so nothing answers.
const SINK_PORT: u16 = 9;
/// Datagrams handed to the kernel per `sendmmsg`.
const BATCH: usize = 64;
/// Ethernet, IPv4 and UDP headers, and the 4-byte FCS the sizes count as the wire does.
const OVERHEAD: usize = 14 + 20 + 8 + 4;

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// Frame sizes in bytes (FCS included, as on the wire), comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = vec![64usize, 128, 256, 512, 1024, 1514],
          value_parser = parse_size)]
    pub sizes: Vec<usize>,
    /// Seconds of sending per size and system [default: 2; 0.3 with --short].
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Pings per size and system for the round-trip time [default: 200; 20 with --short].
    #[arg(long)]
    pub pings: Option<u32>,
}

fn parse_size(s: &str) -> anyhow::Result<usize> {
    let n: usize = s
        .parse()
        .with_context(|| format!("--sizes: {s:?} is not a number"))?;
    anyhow::ensure!(
        (64..=1518).contains(&n),
        "--sizes: {n} is outside 64..=1518 (Ethernet frames on a 1500-byte MTU)"
    );
    Ok(n)
}

impl Args {
    pub fn with(common: Common) -> Args {
        Args {
            common,
            sizes: vec![64, 128, 256, 512, 1024, 1514],
            duration: None,
            pings: None,
        }
    }

    fn duration(&self) -> f64 {
        self.duration
            .unwrap_or(if self.common.short { 0.3 } else { 2.0 })
    }

    fn pings(&self) -> u32 {
        self.pings
            .unwrap_or(if self.common.short { 20 } else { 200 })
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Point {
    pub system: &'static str,
    pub size: usize,
    /// Frames a second the sender handed to the kernel.
    pub offered_fps: f64,
    /// Frames a second that reached the receiving host's interface.
    pub forwarded_fps: f64,
    /// Every core's busy time per frame that arrived (sender, forwarding, receiver), ns.
    pub machine_ns: Option<f64>,
    /// Mean round-trip time of a ping of this size, µs.
    pub rtt_us: Option<f64>,
    pub run: u32,
}

impl Figures for Point {
    type At = (&'static str, usize);

    fn at(&self) -> Self::At {
        (self.system, self.size)
    }

    fn median(runs: &Runs<'_, Point>) -> Point {
        Point {
            system: runs.first().system,
            size: runs.first().size,
            offered_fps: runs.median(|p| p.offered_fps),
            forwarded_fps: runs.median(|p| p.forwarded_fps),
            machine_ns: runs.median_of_some(|p| p.machine_ns),
            rtt_us: runs.median_of_some(|p| p.rtt_us),
            run: runs.count(),
        }
    }

    fn line(&self) -> String {
        format!(
            "{:<22} {:>5} B  offered {:>9.0}/s  forwarded {:>9.0}/s  machine {} ns/frame  \
             ping {} µs",
            self.system,
            self.size,
            self.offered_fps,
            self.forwarded_fps,
            fmt(self.machine_ns, 0),
            fmt(self.rtt_us, 0)
        )
    }
}

const XDP: &str = "kvswitch (XDP)";
const AF_PACKET: &str = "kvswitch (AF_PACKET)";
const BRIDGE: &str = "Linux bridge";
const SYSTEMS: [&str; 3] = [XDP, AF_PACKET, BRIDGE];

pub fn run(args: &Args) -> anyhow::Result<Vec<Point>> {
    let duration = args.duration();
    super::check_duration(duration)?;
    let runner = Runner::start(NAME, &args.common)?;
    let runs = runner.runs();
    let mut points = Vec::new();
    for datapath in ["xdp", "af_packet"] {
        let bed = runner.up(
            &format!("1 client, 1 server, datapath = {datapath:?}"),
            &BedSpec {
                prefix: args.common.prefix.clone(),
                servers: Servers::Memcached { n: 1 },
                cache: None,
                switchkv: None,
                nutcracker: false,
                datapath: Some(datapath),
                tcp: None,
            },
        )?;
        let system = if datapath == "xdp" { XDP } else { AF_PACKET };
        points.extend(measure(&bed, system, args, runs, duration)?);
        if datapath == "af_packet" {
            eprintln!("{NAME}: kvswitch stopped, the same links joined by a Linux bridge...");
            bed.live.stop_kvswitch();
            let bridge = bed.live.bridge_up()?;
            let measured = measure(&bed, BRIDGE, args, runs, duration);
            bed.live.bridge_down(&bridge);
            points.extend(measured?);
        }
        bed.down()?;
    }
    let medians = super::runner::medians(&points);
    runner.finish(
        Record {
            settings: serde_json::json!({
                "sizes": args.sizes, "duration_s": duration, "pings": args.pings(), "runs": runs,
                "short": args.common.short,
            }),
            systems: None,
            runs: &points,
            medians: &medians,
            more: (),
        },
        vec![
            (
                "forwarding-rate".into(),
                Chart::Bars(rate_chart(args, &medians)),
            ),
            ("round-trip".into(), Chart::Bars(rtt_chart(args, &medians))),
        ],
        &summary(args, &medians, runs, duration),
    )?;
    Ok(medians)
}

/// Every size, `runs` times, from the client to the server through whatever joins them now.
fn measure(
    bed: &Bed,
    system: &'static str,
    args: &Args,
    runs: u32,
    duration: f64,
) -> anyhow::Result<Vec<Point>> {
    let server = (*bed.live.servers().first().context("no server")?).clone();
    let to = SocketAddr::V4(SocketAddrV4::new(server.ip, SINK_PORT));
    // The receiver: a socket on the sink port that nobody reads, so the server's stack takes
    // the frames without answering (no ICMP port unreachable).
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let server_ns = server.name.clone();
    let live = &bed.live;
    std::thread::scope(|scope| -> anyhow::Result<Vec<Point>> {
        // A receiver that cannot enter the namespace drops `ready_tx`, which the wait sees.
        scope.spawn(|| {
            let _ = live.in_host(&server_ns, move || {
                let sock = UdpSocket::bind(("0.0.0.0", SINK_PORT));
                let _ = ready_tx.send(sock.is_ok());
                let _ = stop_rx.recv();
                drop(sock);
            });
        });
        anyhow::ensure!(
            ready_rx
                .recv_timeout(Duration::from_secs(5))
                .unwrap_or(false),
            "the receiver could not bind UDP port {SINK_PORT} on {server_ns}"
        );
        // Teach the path both hosts (and, with XDP, let the switch publish them).
        ping(bed, server.ip, 64, 5)?;
        std::thread::sleep(Duration::from_millis(200));
        let mut points = Vec::new();
        for run in 0..runs {
            for &size in &args.sizes {
                let before = rx_packets(bed, &server_ns)?;
                let ticks = super::fastpath::machine_ticks()?;
                let started = Instant::now();
                let client = bed.client.clone();
                let sent = bed
                    .live
                    .in_host(&client, move || blast(to, size - OVERHEAD, duration))??;
                let secs = started.elapsed().as_secs_f64();
                // Frames still in flight arrive within a moment.
                std::thread::sleep(Duration::from_millis(50));
                let got = rx_packets(bed, &server_ns)? - before;
                let busy_s = (super::fastpath::machine_ticks()? - ticks) as f64
                    / crate::measure::clock_ticks();
                let machine_ns = (got > 0).then(|| busy_s * 1e9 / got as f64);
                let rtt_us = ping(bed, server.ip, size, args.pings())?;
                let p = Point {
                    system,
                    size,
                    offered_fps: sent as f64 / secs,
                    forwarded_fps: got as f64 / secs,
                    machine_ns,
                    rtt_us,
                    run,
                };
                progress(run, runs, &p);
                points.push(p);
            }
        }
        let _ = stop_tx.send(());
        Ok(points)
    })
}

/// Sends datagrams of `payload` bytes to `to` as fast as the kernel takes them, `BATCH` per
/// `sendmmsg`, for `secs`; returns how many went.
fn blast(to: SocketAddr, payload: usize, secs: f64) -> anyhow::Result<u64> {
    use std::os::fd::AsRawFd;
    let sock = UdpSocket::bind("0.0.0.0:0")?;
    sock.connect(to)?;
    let buf = vec![0x6bu8; payload];
    let mut iov: Vec<libc::iovec> = (0..BATCH)
        .map(|_| libc::iovec {
            iov_base: buf.as_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        })
        .collect();
    // SAFETY: mmsghdr is plain data; zeroed is a valid empty header.
    let mut msgs: Vec<libc::mmsghdr> = (0..BATCH).map(|_| unsafe { std::mem::zeroed() }).collect();
    for (m, v) in msgs.iter_mut().zip(iov.iter_mut()) {
        m.msg_hdr.msg_iov = v as *mut libc::iovec;
        m.msg_hdr.msg_iovlen = 1;
    }
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut sent = 0u64;
    while Instant::now() < end {
        // SAFETY: every header points at an iovec of `buf`, all alive across the call.
        let n = unsafe {
            libc::sendmmsg(
                sock.as_raw_fd(),
                msgs.as_mut_ptr(),
                BATCH as libc::c_uint,
                0,
            )
        };
        if n > 0 {
            sent += n as u64;
        }
    }
    Ok(sent)
}

/// Frames received on a host's interface so far, from the host's own namespace (sysfs shows
/// the namespace it was mounted in; `/proc/thread-self/net` the calling thread's).
fn rx_packets(bed: &Bed, host: &str) -> anyhow::Result<u64> {
    bed.live.in_host(host, || -> anyhow::Result<u64> {
        let text = std::fs::read_to_string("/proc/thread-self/net/dev")?;
        // "  eth0: rx_bytes rx_packets ..."
        text.lines()
            .find_map(|l| l.trim_start().strip_prefix("eth0:"))
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|n| n.parse().ok())
            .context("no eth0 in /proc/net/dev")
    })?
}

/// The mean round-trip time of `count` pings of `size`-byte frames from the client, µs.
fn ping(bed: &Bed, to: std::net::Ipv4Addr, size: usize, count: u32) -> anyhow::Result<Option<f64>> {
    // ICMP echo: Ethernet, IPv4 and ICMP headers and the FCS around the payload.
    let payload = size.saturating_sub(14 + 20 + 8 + 4).to_string();
    let ns = bed
        .live
        .host(&bed.client)
        .context("no client")?
        .netns
        .clone();
    let out = std::process::Command::new("ip")
        .args([
            "netns", "exec", &ns, "ping", "-q", "-n", "-i", "0.002", "-W", "1",
        ])
        .args(["-c", &count.to_string(), "-s", &payload, &to.to_string()])
        .output()
        .context("running ping")?;
    let text = String::from_utf8_lossy(&out.stdout);
    // rtt min/avg/max/mdev = 0.045/0.061/0.130/0.011 ms
    Ok(text
        .lines()
        .find(|l| l.starts_with("rtt") || l.starts_with("round-trip"))
        .and_then(|l| l.split('=').nth(1))
        .and_then(|v| v.trim().split('/').nth(1))
        .and_then(|avg| avg.parse::<f64>().ok())
        .map(|ms| ms * 1000.0))
}

fn rate_chart(args: &Args, medians: &[Point]) -> BarChart {
    size_chart(
        args,
        medians,
        "Layer-2 forwarding rate by frame size",
        "frames/s arriving",
        |p| Some(p.forwarded_fps),
    )
}

fn rtt_chart(args: &Args, medians: &[Point]) -> BarChart {
    size_chart(
        args,
        medians,
        "Ping round-trip time by frame size",
        "µs",
        |p| p.rtt_us,
    )
}

/// One bar per system and frame size of what `value` reads of its median.
fn size_chart(
    args: &Args,
    medians: &[Point],
    title: &str,
    y_label: &str,
    value: fn(&Point) -> Option<f64>,
) -> BarChart {
    BarChart {
        title: title.into(),
        x_label: "frame size (bytes)".into(),
        y_label: y_label.into(),
        categories: args.sizes.iter().map(|s| s.to_string()).collect(),
        groups: SYSTEMS
            .iter()
            .map(|&s| {
                let v = args
                    .sizes
                    .iter()
                    .map(|&z| find(medians, s, z).and_then(value).unwrap_or(0.0))
                    .collect();
                (s.to_string(), v)
            })
            .collect(),
        line: None,
        stacked: false,
    }
}

fn find<'a>(medians: &'a [Point], system: &str, size: usize) -> Option<&'a Point> {
    medians
        .iter()
        .find(|p| p.system == system && p.size == size)
}

fn summary(args: &Args, medians: &[Point], runs: u32, duration: f64) -> String {
    let mut t = String::new();
    let _ = writeln!(t, "# Layer-2 forwarding: kvswitch against a Linux bridge\n");
    let _ = writeln!(
        t,
        "One client sends UDP datagrams to one server as fast as its kernel takes them \
         (`sendmmsg`, {BATCH} at a time) for {duration} s per frame size, through kvswitch with \
         its XDP fast path, kvswitch over AF_PACKET alone, and a Linux bridge joining the same \
         veth pairs with kvswitch stopped; forwarded is what reached the server's interface \
         (its rx_packets), per second of sending, and ns/frame every core's busy time (from \
         /proc/stat: sender, forwarding and receiver together) per frame that arrived. The \
         sender runs on the same 2 cores as what forwards: in the kernel (XDP, the bridge) a \
         frame is forwarded in the sender's own system call, on its core, so the rate there is \
         what one core does end to end, while AF_PACKET forwards on the other core. The \
         round-trip time is the mean \
         of {} pings of the frame size. Medians of {runs} run(s).\n",
        args.pings()
    );
    let _ = writeln!(
        t,
        "| size (B) | {} |",
        SYSTEMS
            .iter()
            .map(|s| format!("{s} frames/s | ns/frame | ping µs"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let _ = writeln!(t, "|--:|{}", "--:|--:|--:|".repeat(SYSTEMS.len()));
    for &size in &args.sizes {
        let cells: Vec<String> = SYSTEMS
            .iter()
            .map(|&s| match find(medians, s, size) {
                Some(p) => format!(
                    "{:.0} | {} | {}",
                    p.forwarded_fps,
                    fmt(p.machine_ns, 0),
                    fmt(p.rtt_us, 0)
                ),
                None => "- | - | -".into(),
            })
            .collect();
        let _ = writeln!(t, "| {size} | {} |", cells.join(" | "));
    }
    let _ = writeln!(t);
    for &size in &args.sizes {
        let (x, a, b) = (
            find(medians, XDP, size),
            find(medians, AF_PACKET, size),
            find(medians, BRIDGE, size),
        );
        let _ = writeln!(
            t,
            "- {size} B: XDP / bridge {} (rate), {} (CPU per frame), {} (ping); XDP / \
             AF_PACKET {} (rate), {} (CPU per frame).",
            times(ratio(
                x.map(|p| p.forwarded_fps),
                b.map(|p| p.forwarded_fps)
            )),
            times(ratio(
                x.and_then(|p| p.machine_ns),
                b.and_then(|p| p.machine_ns)
            )),
            times(ratio(x.and_then(|p| p.rtt_us), b.and_then(|p| p.rtt_us))),
            times(ratio(
                x.map(|p| p.forwarded_fps),
                a.map(|p| p.forwarded_fps)
            )),
            times(ratio(
                x.and_then(|p| p.machine_ns),
                a.and_then(|p| p.machine_ns)
            )),
        );
    }
    t
}
