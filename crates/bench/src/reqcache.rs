//! `kvswitch bench reqcache`: ServerSwitch's Figure 10 (shared seed 004, section 6.1). A
//! client sends small UDP requests, each carrying an 8-byte id, through kvswitch to a server
//! that answers each with a full-size frame; `kvswitch nf reqcache` keeps the server's replies
//! and answers the requests whose id it holds from the switch's CPU path. Against the share of
//! requests that hit: the CPU the switch and the agent spend, and the bandwidth the server's
//! link still carries.

use std::fmt::Write as _;
use std::net::{SocketAddrV4, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use kv::rng::Rng as _;
use serde::Serialize;

use super::bed::{Bed, BedSpec};
use super::output::{fmt, Machine, Output};
use super::plot::{Chart, LineChart, Series};
use super::Common;
use crate::measure::{clock_ticks, cpu_ticks};

pub const NAME: &str = "reqcache";
/// The requests' UDP port, where the server answers and whose replies the agent keeps.
const PORT: u16 = 9100;
/// A request's payload: the id and padding, for a 128-byte frame as in the paper.
const REQUEST_LEN: usize = 128 - 42;
/// A reply's payload: the id and padding, for a 1,514-byte frame.
const REPLY_LEN: usize = 1514 - 42;
/// The id every miss's reply carries: kept once, so that the replies to misses pass through
/// the agent (the copy it examines, as ServerSwitch oversees every reply) without pushing the
/// hot ids out of the cache.
const MISS_REPLY_ID: &[u8; 8] = b"miss----";

/// One pass over the hit ratios: `--runs` does not apply.
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// Requests per second the client sends.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(10..=50_000))]
    pub rate: u32,
    /// Seconds measured at each hit ratio [default: 4; 1 with --short].
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Ids the cache holds before the first point: the requests that hit draw from them.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub hot: u32,
}

impl Args {
    pub fn with(common: Common) -> Args {
        Args {
            common,
            rate: 2000,
            duration: None,
            hot: 64,
        }
    }

    fn duration(&self) -> f64 {
        self.duration
            .unwrap_or(if self.common.short { 1.0 } else { 4.0 })
    }

    fn ratios(&self) -> Vec<f64> {
        if self.common.short {
            vec![0.0, 1.0]
        } else {
            vec![0.0, 0.25, 0.5, 0.75, 1.0]
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Point {
    /// The share of requests for an id the agent holds.
    pub hit_ratio: f64,
    pub sent: u64,
    /// Replies the client received, from the server or the agent.
    pub answered: u64,
    /// Requests the server answered itself.
    pub server_replies: u64,
    /// The server's replies in Mb/s: what its link to the switch carries.
    pub server_mbps: f64,
    /// CPU, in % of one core, of the kvswitch process and of the agent.
    pub kvswitch_cpu_pct: f64,
    pub agent_cpu_pct: f64,
}

#[derive(Serialize)]
struct Results {
    scenario: &'static str,
    settings: serde_json::Value,
    machine: Machine,
    points: Vec<Point>,
}

pub fn run(args: &Args) -> anyhow::Result<Vec<Point>> {
    let duration = args.duration();
    super::check_duration(duration)?;
    let machine = Machine::describe();
    let out = Output::create(&super::bed::out_dir(args.common.out.as_ref(), NAME))?;
    eprintln!("{NAME}: building the testbed (1 client, 1 server, kvswitch, the agent)...");
    let bed = Bed::up(&BedSpec::one_server(&args.common.prefix))?;
    let measured = measure(&bed, args, duration);
    bed.down()?;
    let points = measured?;
    let results = Results {
        scenario: NAME,
        settings: serde_json::json!({
            "rate": args.rate, "duration_s": duration, "hot": args.hot, "runs": 1,
            "request_frame": REQUEST_LEN + 42, "reply_frame": REPLY_LEN + 42,
            "short": args.common.short,
        }),
        machine: machine.clone(),
        points,
    };
    out.json(&results)?;
    let mut out = out;
    out.plot("cpu", &Chart::Line(chart(&results.points)))?;
    out.summary(&summary(args, &results.points), &machine)?;
    Ok(results.points)
}

/// Kills the agent however the measurement ends; it removes its entries on SIGTERM.
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        // SAFETY: kill has no memory preconditions; the PID is our own child's.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn measure(bed: &Bed, args: &Args, duration: f64) -> anyhow::Result<Vec<Point>> {
    let state = &bed.live.state;
    let server = (*bed.live.servers().first().context("no server")?).clone();
    let api = api::Client::new(state.api, state.api_token()?);
    let acl_len = || -> anyhow::Result<usize> { Ok(api.table_entries("acl")?.len()) };
    let before = acl_len()?;
    let mut agent = Command::new(std::env::current_exe().context("the kvswitch binary")?);
    agent
        .args(["nf", "reqcache", "--api", &state.api.to_string()])
        .args([
            "--server",
            &server.ip.to_string(),
            "--port",
            &PORT.to_string(),
        ])
        .args(["--capacity", "4000", "--report-s", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        // Its errors, and its counters when it stops, beside the scenario's own lines.
        .stderr(Stdio::inherit());
    if let Some(token) = state.api_token()? {
        agent.env(api::TOKEN_ENV, token);
    }
    let agent = Agent(agent.spawn().context("starting kvswitch nf reqcache")?);
    let until = |what: &str, done: &dyn Fn() -> anyhow::Result<bool>| -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done()? {
            anyhow::ensure!(Instant::now() < deadline, "{what} within 10 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    };
    until("the agent's mirror entry", &|| Ok(acl_len()? > before))?;
    let stop = AtomicBool::new(false);
    let served = AtomicU64::new(0);
    let to = SocketAddrV4::new(server.ip, PORT);
    let live = &bed.live;
    std::thread::scope(|scope| -> anyhow::Result<Vec<Point>> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, served) = (&stop, &served);
        let server_ns = server.name.clone();
        let answering =
            scope.spawn(move || live.in_host(&server_ns, || answer(stop, served, ready_tx)));
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop = StopOnDrop(stop);
        anyhow::ensure!(
            ready_rx
                .recv_timeout(Duration::from_secs(5))
                .unwrap_or(false),
            "the server could not bind UDP port {PORT}"
        );
        // Warm the cache: every hot id once, then wait for the agent's entries.
        let hot = args.hot;
        live.in_host(&bed.client, || warm(to, hot))??;
        until("the agent's entries for the hot ids", &|| {
            Ok(acl_len()? > before + hot as usize)
        })?;
        let mut points = Vec::new();
        for (i, &ratio) in args.ratios().iter().enumerate() {
            let kv_before = cpu_ticks(bed.kvswitch_pid);
            let agent_before = cpu_ticks(agent.0.id());
            let served_before = served.load(Ordering::Relaxed);
            let (sent, answered) = live.in_host(&bed.client, || {
                send(to, args.rate, duration, ratio, hot, i as u64)
            })??;
            let server_replies = served.load(Ordering::Relaxed) - served_before;
            let pct = |pid: u32, before: Option<u64>| {
                let used = cpu_ticks(pid).zip(before).map(|(a, b)| a.saturating_sub(b));
                used.map_or(f64::NAN, |t| t as f64 / clock_ticks() / duration * 100.0)
            };
            let point = Point {
                hit_ratio: ratio,
                sent,
                answered,
                server_replies,
                server_mbps: server_replies as f64 * (REPLY_LEN + 42) as f64 * 8.0 / duration / 1e6,
                kvswitch_cpu_pct: pct(bed.kvswitch_pid, kv_before),
                agent_cpu_pct: pct(agent.0.id(), agent_before),
            };
            eprintln!(
                "  hit ratio {:.2}: sent {}, answered {}, the server {} ({:.1} Mb/s); CPU kvswitch \
                 {:.1}%, agent {:.1}%",
                point.hit_ratio,
                point.sent,
                point.answered,
                point.server_replies,
                point.server_mbps,
                point.kvswitch_cpu_pct,
                point.agent_cpu_pct
            );
            points.push(point);
        }
        stop.store(true, Ordering::Relaxed);
        answering
            .join()
            .map_err(|_| anyhow::anyhow!("the server panicked"))???;
        drop(agent);
        Ok(points)
    })
}

/// The server: answers every request on `PORT` with a full-size reply carrying its id (or
/// [`MISS_REPLY_ID`] for a miss's), counting them in `served`, until `stop`.
fn answer(
    stop: &AtomicBool,
    served: &AtomicU64,
    ready: std::sync::mpsc::Sender<bool>,
) -> anyhow::Result<()> {
    let sock = match UdpSocket::bind(("0.0.0.0", PORT)) {
        Ok(s) => s,
        Err(e) => {
            let _ = ready.send(false);
            return Err(e).context("binding the server's port");
        }
    };
    sock.set_read_timeout(Some(Duration::from_millis(100)))?;
    let _ = ready.send(true);
    let mut buf = [0u8; 2048];
    let mut reply = vec![b'r'; REPLY_LEN];
    while !stop.load(Ordering::Relaxed) {
        let Ok((n, from)) = sock.recv_from(&mut buf) else {
            continue;
        };
        let Some(id) = buf.get(..8).filter(|_| n >= 8) else {
            continue;
        };
        let id = if id[0] == b'm' {
            &MISS_REPLY_ID[..]
        } else {
            id
        };
        reply[..8].copy_from_slice(id);
        if sock.send_to(&reply, from).is_ok() {
            served.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(())
}

fn request(id: &[u8; 8]) -> Vec<u8> {
    let mut r = vec![b'q'; REQUEST_LEN];
    r[..8].copy_from_slice(id);
    r
}

fn hot_id(i: u32) -> [u8; 8] {
    let mut id = *b"h0000000";
    id[1..].copy_from_slice(format!("{i:07}").as_bytes());
    id
}

/// Asks for every hot id once, waiting for each reply, so that the agent keeps them all.
fn warm(to: SocketAddrV4, hot: u32) -> anyhow::Result<()> {
    let sock = UdpSocket::bind("0.0.0.0:0")?;
    sock.set_read_timeout(Some(Duration::from_secs(1)))?;
    let mut buf = [0u8; 2048];
    for i in 0..hot {
        let id = hot_id(i);
        for _ in 0..3 {
            sock.send_to(&request(&id), to)?;
            if matches!(sock.recv_from(&mut buf), Ok((n, _)) if n >= 8 && buf[..8] == id) {
                break;
            }
        }
    }
    Ok(())
}

/// Sends `rate` requests a second for `duration` seconds, a share `ratio` of them (chosen by
/// a generator seeded with `seed`) for hot ids and the rest for ids never asked before;
/// returns (sent, replies received).
fn send(
    to: SocketAddrV4,
    rate: u32,
    duration: f64,
    ratio: f64,
    hot: u32,
    seed: u64,
) -> anyhow::Result<(u64, u64)> {
    let sock = UdpSocket::bind("0.0.0.0:0")?;
    let recv = sock.try_clone()?;
    recv.set_read_timeout(Some(Duration::from_millis(300)))?;
    let done = AtomicBool::new(false);
    let mut rng = kv::rng::Xoshiro256StarStar::seed_from_u64(seed + 1);
    /// Stops the counting thread however the sending ends, so an error cannot leave the
    /// scope waiting for it.
    struct Done<'a>(&'a AtomicBool);
    impl Drop for Done<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    std::thread::scope(|scope| -> anyhow::Result<(u64, u64)> {
        let done = &done;
        let counting = scope.spawn(move || {
            let mut buf = [0u8; 2048];
            let mut got = 0u64;
            loop {
                match recv.recv_from(&mut buf) {
                    Ok(_) => got += 1,
                    Err(_) if done.load(Ordering::Relaxed) => return got,
                    Err(_) => {}
                }
            }
        });
        let stopping = Done(done);
        let start = Instant::now();
        let total = (f64::from(rate) * duration) as u64;
        let mut sent = 0u64;
        let mut miss = 0u64;
        while sent < total {
            // Paced by the clock: what is due by now goes out.
            let due = ((start.elapsed().as_secs_f64() * f64::from(rate)) as u64).min(total);
            while sent < due {
                let id = if rng.f64() < ratio {
                    hot_id(rng.below(u64::from(hot)) as u32)
                } else {
                    miss += 1;
                    let mut id = *b"m0000000";
                    id[1..].copy_from_slice(format!("{:07}", miss % 10_000_000).as_bytes());
                    id
                };
                sock.send_to(&request(&id), to)?;
                sent += 1;
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        // The last replies, then the counter stops at its next timeout.
        std::thread::sleep(Duration::from_millis(200));
        drop(stopping);
        let got = counting
            .join()
            .map_err(|_| anyhow::anyhow!("the receiver panicked"))?;
        Ok((sent, got))
    })
}

fn chart(points: &[Point]) -> LineChart {
    let series = |name: &str, color: usize, f: fn(&Point) -> f64| Series {
        name: name.into(),
        points: points.iter().map(|p| (p.hit_ratio * 100.0, f(p))).collect(),
        color,
        dashed: false,
    };
    LineChart {
        title: "Caching by request id: CPU against the hit ratio (ServerSwitch's Figure 10)".into(),
        x_label: "requests that hit (%)".into(),
        y_label: "CPU (% of one core)".into(),
        x_log: false,
        y_log: false,
        y_from_zero: true,
        series: vec![
            series("kvswitch process", 0, |p| p.kvswitch_cpu_pct),
            series("agent (nf reqcache)", 1, |p| p.agent_cpu_pct),
            series("both", 2, |p| p.kvswitch_cpu_pct + p.agent_cpu_pct),
        ],
    }
}

fn summary(args: &Args, points: &[Point]) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "# Caching by request id: CPU against the hit ratio\n\n\
         A client sends {} requests a second (128-byte frames, an 8-byte id each) through \
         kvswitch to a server that answers each with a 1,514-byte frame; `kvswitch nf \
         reqcache` keeps the server's replies and answers requests for the {} ids it holds \
         from the switch's CPU path. {} s at each share of requests for those ids; the rest \
         ask for ids never asked before, whose replies the agent examines but keeps once (they \
         all carry one id). CPU in % of one core from /proc. ServerSwitch (Figure 10): the \
         bandwidth the server's link carries falls by the hit ratio, the switch's CPU rises \
         with it, from 14% at no hits (its caching of every reply). One pass (`--runs` does \
         not apply).\n",
        args.rate,
        args.hot,
        args.duration()
    );
    let _ = writeln!(
        t,
        "| hit ratio | sent | answered | by the server | server Mb/s | kvswitch CPU % | agent CPU % |\n|--:|--:|--:|--:|--:|--:|--:|"
    );
    for p in points {
        let _ = writeln!(
            t,
            "| {:.2} | {} | {} | {} | {} | {} | {} |",
            p.hit_ratio,
            p.sent,
            p.answered,
            p.server_replies,
            fmt(Some(p.server_mbps), 1),
            fmt(Some(p.kvswitch_cpu_pct), 1),
            fmt(Some(p.agent_cpu_pct), 1)
        );
    }
    t
}
