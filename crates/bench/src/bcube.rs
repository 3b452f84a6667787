//! `kvswitch bench bcube`: the CPU each server of a BCube1 (n = 4) spends while a TCP
//! transfer crosses it (ServerSwitch's section 6.2: forwarding in the card's pipeline
//! costs the server's host nothing).
//!
//! Each of the 16 servers is a host namespace behind its own kvswitch (its card), with a card
//! agent (`kvswitch nf bcube-card`) and a host side (`kvswitch nf bcube-host`) as processes of
//! their own; 8 Linux bridges are the BCube switches. A TCP transfer from server 0 to server
//! 15 runs over both parallel paths (through servers 3 and 12); the CPU time of every process
//! is read from /proc before and after.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use testbed::net::{Net, NetSpec};

use super::output::{fmt, Machine, Output};
use super::plot::{BarChart, Chart};
use super::Common;
use crate::measure::{clock_ticks, cpu_ticks, median};

pub const NAME: &str = "bcube";
/// Ports per BCube switch, and so servers per level-0 group.
pub const N: usize = 4;
/// Servers of the BCube1.
pub const SERVERS: usize = N * N;
/// The transfer's ends: digits 00 and 33, two parallel paths apart.
const FROM: usize = 0;
const TO: usize = 15;
const TCP_PORT: u16 = 9310;

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// Seconds the transfer runs each time [default: 10; 2 with --short].
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
}

impl Args {
    pub fn with(common: Common) -> Args {
        Args {
            common,
            duration: None,
        }
    }

    fn duration(&self) -> f64 {
        self.duration
            .unwrap_or(if self.common.short { 2.0 } else { 10.0 })
    }
}

/// Card `id`'s switch name in the network.
pub fn card(id: usize) -> String {
    format!("c{id}")
}

/// A BCube1 of n = 4 as a testbed network: server `id` is host `h<id>` on card `c<id>`
/// (port 0 to the host, 1 to its level-0 bridge `l0-<id / 4>`, 2 to its level-1 bridge
/// `l1-<id % 4>`).
pub fn spec(prefix: &str, bin: PathBuf) -> NetSpec {
    let mut links = Vec::new();
    for id in 0..SERVERS {
        links.push((card(id), format!("l0-{}", id / N)));
        links.push((card(id), format!("l1-{}", id % N)));
    }
    NetSpec {
        prefix: prefix.into(),
        switches: (0..SERVERS).map(card).collect(),
        hosts: (0..SERVERS)
            .map(|id| (format!("h{id}"), card(id)))
            .collect(),
        bridges: (0..N)
            .flat_map(|i| [format!("l0-{i}"), format!("l1-{i}")])
            .collect(),
        links,
        bin,
        static_neighbours: false,
    }
}

/// What one server is in the transfer.
fn role(id: usize) -> &'static str {
    match id {
        FROM => "source",
        TO => "destination",
        3 | 12 => "relay",
        _ => "idle",
    }
}

/// CPU each part of one server used, in percent of one core.
#[derive(Clone, Debug, Serialize)]
pub struct Server {
    pub id: usize,
    pub role: &'static str,
    /// The card's kvswitch: its pipeline forwards.
    pub card_pct: f64,
    /// The card's agent (neighbour discovery, bandwidth queries).
    pub agent_pct: f64,
    /// The host side (the TUN device's header work); all the host spends on BCube.
    pub host_pct: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Run {
    pub run: u32,
    pub mbps: f64,
    pub servers: Vec<Server>,
}

#[derive(Serialize)]
pub struct Settings {
    pub duration_s: f64,
    pub runs: u32,
    pub short: bool,
}

#[derive(Serialize)]
pub struct Results {
    pub scenario: &'static str,
    pub settings: Settings,
    pub machine: Machine,
    pub runs: Vec<Run>,
    /// Medians over runs, by role (idle: the median idle server).
    pub medians: Vec<Server>,
    pub median_mbps: f64,
}

/// The card agents and host sides a run started, by server; stopped by PID when dropped.
struct Procs {
    agents: Vec<u32>,
    hosts: Vec<u32>,
}

impl Procs {
    fn all(&self) -> impl Iterator<Item = u32> + '_ {
        self.agents.iter().chain(&self.hosts).copied()
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        let pids: Vec<u32> = self.all().collect();
        let left = testbed::process::stop_all(&pids);
        if !left.is_empty() {
            eprintln!("{NAME}: processes left running: {left:?}");
        }
    }
}

pub fn run(args: &Args) -> anyhow::Result<Results> {
    let duration = args.duration();
    super::check_duration(duration)?;
    let runs = args.common.runs();
    let machine = Machine::describe();
    let out = Output::create(&super::bed::out_dir(args.common.out.as_ref(), NAME))?;
    let exe = std::env::current_exe().context("finding kvswitch itself")?;
    eprintln!("{NAME}: building a BCube1 of n = {N}: {SERVERS} kvswitch cards, 8 bridges...");
    let net = Net::up(&spec(&args.common.prefix, exe.clone()))?;
    let measured = measure(&net, &exe, duration, runs, &out);
    net.down()?;
    let runs = measured?;
    let medians = medians(&runs);
    let results = Results {
        scenario: NAME,
        settings: Settings {
            duration_s: duration,
            runs: args.common.runs(),
            short: args.common.short,
        },
        machine: machine.clone(),
        median_mbps: median(runs.iter().map(|r| r.mbps).collect()),
        runs,
        medians,
    };
    out.json(&results)?;
    let mut out = out;
    out.plot("cpu", &Chart::Bars(chart(&results)))?;
    out.summary(&summary(&results), &machine)?;
    Ok(results)
}

fn measure(
    net: &Net,
    exe: &std::path::Path,
    duration: f64,
    runs: u32,
    out: &Output,
) -> anyhow::Result<Vec<Run>> {
    let first_ip = net.host("h0").ip;
    let logs = out.dir().join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let exe = exe.display().to_string();
    let mut procs = Procs {
        agents: Vec::new(),
        hosts: Vec::new(),
    };
    for id in 0..SERVERS {
        let h = net.host(&format!("h{id}"));
        let shape = [
            "--id".to_string(),
            id.to_string(),
            "--first-ip".into(),
            first_ip.to_string(),
        ];
        let mut argv: Vec<String> = vec![
            exe.clone(),
            "nf".into(),
            "--api".into(),
            net.switch(&card(id)).api.to_string(),
            "bcube-card".into(),
        ];
        argv.extend(shape.iter().cloned());
        argv.extend(
            [
                "--level-ports",
                "1,2",
                "--host-port",
                "0",
                "--host-mac",
                &h.mac,
            ]
            .map(String::from),
        );
        let child = testbed::process::spawn_tied(None, &argv, &logs.join(format!("card{id}.log")))?;
        procs.agents.push(child.id());
        let mut argv: Vec<String> = vec![exe.clone(), "nf".into(), "bcube-host".into()];
        argv.extend(shape.iter().cloned());
        let child = testbed::process::spawn_tied(
            Some(&h.netns),
            &argv,
            &logs.join(format!("host{id}.log")),
        )?;
        procs.hosts.push(child.id());
    }
    eprintln!("{NAME}: waiting for neighbour discovery...");
    let started = Instant::now();
    loop {
        let filled = (0..SERVERS).all(|id| {
            net.client(&card(id))
                .interfaces()
                .is_ok_and(|l| l.len() == 2 * (N - 1))
        });
        if filled {
            break;
        }
        if let Some(pid) = procs.all().find(|&pid| !testbed::process::alive(pid)) {
            anyhow::bail!("process {pid} stopped; logs in {}", logs.display());
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(30),
            "neighbour discovery did not fill the interface tables in 30 s; logs in {}",
            logs.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let cards: Vec<u32> = (0..SERVERS)
        .map(|id| {
            net.switch(&card(id))
                .pid
                .context("a card without a process")
        })
        .collect::<anyhow::Result<_>>()?;
    let mut out_runs = Vec::new();
    for run in 0..runs {
        eprintln!(
            "{NAME}: run {}/{runs}: TCP from server {FROM} to server {TO} for {duration} s...",
            run + 1
        );
        let ticks =
            |pids: &[u32]| -> Vec<Option<u64>> { pids.iter().map(|&p| cpu_ticks(p)).collect() };
        let before = (ticks(&cards), ticks(&procs.agents), ticks(&procs.hosts));
        let t0 = Instant::now();
        let bytes = transfer(net, duration)?;
        let secs = t0.elapsed().as_secs_f64();
        let after = (ticks(&cards), ticks(&procs.agents), ticks(&procs.hosts));
        let pct = |b: &[Option<u64>], a: &[Option<u64>], id: usize| -> f64 {
            match (b[id], a[id]) {
                (Some(b), Some(a)) => a.saturating_sub(b) as f64 / clock_ticks() / secs * 100.0,
                _ => f64::NAN,
            }
        };
        let servers = (0..SERVERS)
            .map(|id| Server {
                id,
                role: role(id),
                card_pct: pct(&before.0, &after.0, id),
                agent_pct: pct(&before.1, &after.1, id),
                host_pct: pct(&before.2, &after.2, id),
            })
            .collect();
        let mbps = bytes as f64 * 8.0 / secs / 1e6;
        eprintln!("{NAME}: {:.1} Mb/s", mbps);
        out_runs.push(Run { run, mbps, servers });
    }
    drop(procs);
    Ok(out_runs)
}

/// Sends as much as TCP carries from server [`FROM`] to [`TO`] for `duration` seconds;
/// returns the bytes the receiver got.
fn transfer(net: &Net, duration: f64) -> anyhow::Result<u64> {
    let (a, b) = (
        net.host(&format!("h{FROM}")).clone(),
        net.host(&format!("h{TO}")).clone(),
    );
    let dest = SocketAddrV4::new(b.ip, TCP_PORT);
    let (bound_tx, bound_rx) = std::sync::mpsc::channel();
    let receiver = std::thread::spawn(move || {
        testbed::in_netns(&b.netns, || -> anyhow::Result<u64> {
            let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, TCP_PORT))?;
            let _ = bound_tx.send(());
            let (mut conn, _) = listener.accept()?;
            conn.set_read_timeout(Some(Duration::from_secs(10)))?;
            let mut buf = vec![0u8; 1 << 16];
            let mut got = 0u64;
            loop {
                match conn.read(&mut buf)? {
                    0 => return Ok(got),
                    n => got += n as u64,
                }
            }
        })?
    });
    bound_rx
        .recv_timeout(Duration::from_secs(5))
        .context("the receiver did not start")?;
    testbed::in_netns(&a.netns, || -> anyhow::Result<()> {
        let mut conn = TcpStream::connect_timeout(&dest.into(), Duration::from_secs(5))
            .context("connecting across the BCube")?;
        conn.set_write_timeout(Some(Duration::from_secs(10)))?;
        let chunk = vec![0x5au8; 1 << 16];
        let until = Instant::now() + Duration::from_secs_f64(duration);
        while Instant::now() < until {
            conn.write_all(&chunk)?;
        }
        Ok(())
    })??;
    receiver
        .join()
        .map_err(|_| anyhow::anyhow!("the receiver panicked"))?
}

fn medians(runs: &[Run]) -> Vec<Server> {
    let ids = [FROM, 3, 12, TO, 1];
    ids.iter()
        .map(|&id| {
            let of = |f: &dyn Fn(&Server) -> f64| {
                median(
                    runs.iter()
                        .map(|r| f(&r.servers[id]))
                        .filter(|x| x.is_finite())
                        .collect(),
                )
            };
            Server {
                id,
                role: role(id),
                card_pct: of(&|s| s.card_pct),
                agent_pct: of(&|s| s.agent_pct),
                host_pct: of(&|s| s.host_pct),
            }
        })
        .collect()
}

fn chart(r: &Results) -> BarChart {
    let label = |s: &Server| format!("{} ({})", s.id, s.role);
    BarChart {
        title: format!(
            "CPU per BCube server during a TCP transfer ({} Mb/s)",
            fmt(Some(r.median_mbps), 0)
        ),
        x_label: "server".into(),
        y_label: "CPU, % of one core".into(),
        categories: r.medians.iter().map(label).collect(),
        groups: vec![
            (
                "card (kvswitch pipeline)".into(),
                r.medians.iter().map(|s| s.card_pct).collect(),
            ),
            (
                "card agent".into(),
                r.medians.iter().map(|s| s.agent_pct).collect(),
            ),
            (
                "host (BCube header)".into(),
                r.medians.iter().map(|s| s.host_pct).collect(),
            ),
        ],
        line: None,
        stacked: false,
    }
}

fn summary(r: &Results) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# CPU of BCube forwarding on kvswitch cards\n\nA BCube1 of n = {N}: {SERVERS} servers, \
         each a host behind its own kvswitch card, and 8 Linux bridges. A TCP transfer from \
         server {FROM} to server {TO} runs {} s over both parallel paths (relays 3 and 12), \
         {} times: {} Mb/s (median). CPU in percent of one core, from /proc. ServerSwitch \
         (6.1): forwarding in the card costs the server nothing, where software BCube \
         forwarding on a server used 65.6% CPU for 1,514-byte frames.\n",
        r.settings.duration_s,
        r.runs.len(),
        fmt(Some(r.median_mbps), 1)
    );
    let _ = writeln!(
        s,
        "| server | role | card (pipeline) % | card agent % | host % |\n|---|---|---|---|---|"
    );
    for m in &r.medians {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} |",
            m.id,
            m.role,
            fmt(Some(m.card_pct), 1),
            fmt(Some(m.agent_pct), 1),
            fmt(Some(m.host_pct), 1)
        );
    }
    let _ = writeln!(
        s,
        "\nA relay's host spends nothing on the packets it forwards: its card's pipeline \
         forwards them, and its host side sees none. The card here is software (a kvswitch \
         process on the same cores), so its share is what a switching chip would take off the \
         server; the source and destination hosts pay for adding and removing the header on a \
         TUN device."
    );
    s
}
