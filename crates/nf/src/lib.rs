//! `kvswitch nf`: network functions other than memcached's, run on a switch through its control
//! API alone, with an agent on the CPU path where the function needs one.

pub mod bcube;
pub mod cpu;
pub mod portland;
pub mod qcn;
pub mod reqcache;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Subcommand};
use switch::control::{ActionDef, EntryDef, ErrorKind, Value, ACL};

use api::Client;
use reqcache::{ReqCache, Step};

#[derive(Args, Debug)]
#[command(about = "Network functions on a running kvswitch, through its control API")]
pub struct NfArgs {
    #[command(flatten)]
    pub switch: api::ApiArgs,
    #[command(flatten)]
    pub cpu: cpu::CpuArgs,
    #[command(subcommand)]
    pub function: NfCmd,
}

#[derive(Subcommand, Debug)]
pub enum NfCmd {
    /// Cache replies by request id (ServerSwitch 6.1): UDP requests to --port whose payload
    /// starts with an 8-byte id are answered from the CPU path once the server's reply to that
    /// id has passed; the rest go to the server. Runs until SIGINT, SIGTERM or --duration-s,
    /// then removes its entries.
    Reqcache {
        /// The UDP port of the requests (and of the server's replies).
        #[arg(long, default_value_t = 9100)]
        port: u16,
        /// A server whose replies are kept (repeat for several); replies from other hosts are
        /// not.
        #[arg(long = "server", required = true)]
        servers: Vec<std::net::Ipv4Addr>,
        /// Most replies kept (an `acl` entry each; the oldest goes first).
        #[arg(long, default_value_t = 1024)]
        capacity: usize,
        /// The priority of its `acl` entries.
        #[arg(long, default_value_t = 100)]
        priority: u32,
        /// Stop after this many seconds.
        #[arg(long)]
        duration_s: Option<f64>,
        /// Print a line of counters every this many seconds (0: only at the end).
        #[arg(long, default_value_t = 5.0)]
        report_s: f64,
    },
    /// QCN's congestion point (ServerSwitch 5.2): mirrors frames marked with --dscp to the
    /// CPU, reads --queue-port's egress queue for each and sends its source a congestion
    /// notification when the queue is past its set point or growing; answers queue queries
    /// (UDP to port 9201) at once. Give the port a rate first (`kvswitch ctl egress`). Runs
    /// until SIGINT, SIGTERM or --duration-s, then removes its entries.
    QcnCp {
        /// The port whose egress queue is watched.
        #[arg(long)]
        queue_port: u16,
        /// The queue length to steer towards, KB.
        #[arg(long, default_value_t = 20.0)]
        q_eq_kb: f64,
        /// The DSCP senders mark frames for sampling with.
        #[arg(long, default_value_t = qcn::MARK_DSCP)]
        dscp: u8,
        #[arg(long, default_value_t = 100)]
        priority: u32,
        #[arg(long)]
        duration_s: Option<f64>,
    },
    /// QCN's reaction point: sends UDP to --to at a rate QCN adjusts (pseudo-code 2.3,
    /// scaled to --max-mbps), marking frames for sampling; prints its rate every 10 ms as
    /// CSV (t, rate_mbps, target_mbps, notifications). Run it on the sending host.
    QcnSend {
        /// Where to send, IP:PORT (a `kvswitch nf qcn-sink` listens on port 9200).
        #[arg(long)]
        to: std::net::SocketAddrV4,
        #[arg(long, default_value_t = 100.0)]
        max_mbps: f64,
        /// UDP payload bytes.
        #[arg(long, default_value_t = 1000)]
        payload: usize,
        #[arg(long, default_value_t = qcn::MARK_DSCP)]
        dscp: u8,
        #[arg(long, default_value_t = 10.0)]
        duration_s: f64,
        /// Picks which frames are marked.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// PortLand's fabric manager (ServerSwitch 3.2.2): sets up every switch of a fat-tree
    /// described in --layout (a `pmac` table, longest-prefix match on the destination MAC, and
    /// acl entries sending hosts' ARP to the CPU) and answers ARP with positional pseudo MACs,
    /// placing hosts as they appear and again when they move. Runs until SIGINT, SIGTERM or
    /// --duration-s, then removes everything it made.
    Portland {
        /// The fat-tree: `[[switches]]` with name, api, role ("edge", "aggregation" with pod
        /// and position, or "core"), mac, and ports (in the switch's order: "host" or
        /// {switch = NAME}).
        #[arg(long, required_unless_present = "example_layout")]
        layout: Option<PathBuf>,
        #[arg(long)]
        duration_s: Option<f64>,
        /// Print an example layout, every field explained, and exit.
        #[arg(long)]
        example_layout: bool,
        /// Check the layout and exit without touching a switch.
        #[arg(long)]
        check: bool,
    },
    /// A BCube server's card (ServerSwitch 5.1): sets this switch up as the card of server
    /// --id (a `bcube` table routing by the index in the IP TTL and the next hops in the
    /// BCube header, with filters to the host and the CPU), discovers the neighbours on each
    /// level port, fills the interface table from them, and answers available-bandwidth
    /// queries from the ports' byte counters. Runs until SIGINT, SIGTERM or --duration-s,
    /// then removes everything it made.
    BcubeCard {
        #[command(flatten)]
        shape: BcubeShape,
        /// The switch's port to each level, level 0 first, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        level_ports: Vec<u16>,
        /// The switch's port to its host.
        #[arg(long)]
        host_port: u16,
        /// The host's MAC, written on packets delivered to it.
        #[arg(long)]
        host_mac: wire::ethernet::Mac,
        /// The rate of a level link whose port has no egress rate set, Mb/s.
        #[arg(long, default_value_t = 1000.0)]
        link_mbps: f64,
        /// The card's interface-table entries are this plus each next-hop address.
        #[arg(long, default_value_t = 64)]
        interface_base: u16,
        /// The priority of its `acl` entries.
        #[arg(long, default_value_t = 100)]
        priority: u32,
        #[arg(long)]
        duration_s: Option<f64>,
    },
    /// A BCube server's host side: creates a TUN device (--tun), routes every other server
    /// through it, and sends each packet to the card (--dev) with the BCube header of one of
    /// the parallel paths, spread in proportion to their available bandwidth (asked every
    /// --query-ms); packets from the card lose the header and go up the stack. Run it in the
    /// host's network namespace. Prints its counters as JSON when it stops.
    BcubeHost {
        #[command(flatten)]
        shape: BcubeShape,
        #[arg(long, default_value = "bc0")]
        tun: String,
        /// The interface to the card.
        #[arg(long, default_value = "eth0")]
        dev: String,
        /// Use at most this many parallel paths to a server (0: all BCube gives).
        #[arg(long, default_value_t = 0)]
        max_paths: usize,
        /// How often the paths in use are asked their available bandwidth, ms (0: never;
        /// packets are then spread evenly).
        #[arg(long, default_value_t = 1000)]
        query_ms: u64,
        #[arg(long)]
        duration_s: Option<f64>,
    },
    /// Takes QCN traffic on UDP port 9200 and echoes probes on 9202; prints the megabits a
    /// second received per 100 ms as CSV at the end. Run it on the receiving host.
    QcnSink {
        #[arg(long, default_value_t = 10.0)]
        duration_s: f64,
    },
}

/// Which BCube and which server in it.
#[derive(Args, Debug, Clone)]
pub struct BcubeShape {
    /// Ports of each BCube switch.
    #[arg(long, default_value_t = 4)]
    n: u8,
    /// Levels (a BCube1 has 2).
    #[arg(long, default_value_t = 2)]
    levels: u8,
    /// This server's number, 0 to n^levels - 1 (its digits, level 0 the lowest).
    #[arg(long)]
    id: usize,
    /// The address of server 0; server I has this plus I.
    #[arg(long)]
    first_ip: std::net::Ipv4Addr,
}

impl BcubeShape {
    fn geometry(&self) -> anyhow::Result<bcube::Geometry> {
        let g = bcube::Geometry::new(self.n, self.levels)?;
        anyhow::ensure!(
            self.id < g.servers(),
            "--id {}: 0 to {} in a BCube of {} servers",
            self.id,
            g.servers() - 1,
            g.servers()
        );
        Ok(g)
    }
}

pub fn run(args: &NfArgs) -> anyhow::Result<()> {
    let client = args.switch.client()?;
    match &args.function {
        NfCmd::Reqcache {
            port,
            servers,
            capacity,
            priority,
            duration_s,
            report_s,
        } => {
            if *capacity == 0 || *capacity > 4000 {
                anyhow::bail!("--capacity {capacity}: 1 to 4,000 (each reply takes an acl entry)");
            }
            let stop = stopper(*duration_s)?;
            let report = seconds("--report-s", *report_s)?.filter(|d| !d.is_zero());
            let spec = ReqcacheSpec {
                port: *port,
                servers,
                capacity: *capacity,
                priority: *priority,
                report,
                cpu: args.cpu.mode,
            };
            let stats = run_reqcache(&client, &spec, &stop)?;
            println!("{}", serde_json::to_string(&stats)?);
            Ok(())
        }
        NfCmd::QcnCp {
            queue_port,
            q_eq_kb,
            dscp,
            priority,
            duration_s,
        } => {
            anyhow::ensure!(*dscp < 64, "--dscp {dscp}: 0 to 63");
            anyhow::ensure!(*q_eq_kb > 0.0, "--q-eq-kb {q_eq_kb}: more than 0");
            let stop = stopper(*duration_s)?;
            let cfg = qcn::CpConfig {
                api: client.clone(),
                cpu: args.cpu.mode,
                port: *queue_port,
                params: switch::qcn::CpParams {
                    q_eq: (q_eq_kb * 1000.0) as u64,
                    w: 2.0,
                },
                dscp: *dscp,
                priority: *priority,
            };
            let stats = qcn::run_cp(&cfg, &stop)?;
            println!("{}", serde_json::to_string(&stats)?);
            Ok(())
        }
        NfCmd::QcnSend {
            to,
            max_mbps,
            payload,
            dscp,
            duration_s,
            seed,
        } => {
            anyhow::ensure!(*dscp < 64, "--dscp {dscp}: 0 to 63");
            anyhow::ensure!(
                *max_mbps >= 0.1 && *max_mbps <= 100_000.0,
                "--max-mbps {max_mbps}: 0.1 to 100,000"
            );
            anyhow::ensure!(
                (16..=1472).contains(payload),
                "--payload {payload}: 16 to 1,472"
            );
            seconds("--duration-s", *duration_s)?;
            let params = switch::qcn::RpParams::scaled(max_mbps * 1e6);
            let origin = std::time::Instant::now();
            let sent = qcn::send(*to, *payload, params, *dscp, *duration_s, *seed, origin)?;
            println!("t,rate_mbps,target_mbps,notifications");
            for s in &sent.series {
                println!(
                    "{:.3},{:.3},{:.3},{}",
                    s.t, s.rate_mbps, s.target_mbps, s.notifications
                );
            }
            eprintln!(
                "qcn-send: {} datagrams, {} marked, {} notifications",
                sent.datagrams, sent.marked, sent.notifications
            );
            Ok(())
        }
        NfCmd::Portland {
            layout,
            duration_s,
            example_layout,
            check,
        } => {
            if *example_layout {
                print!("{}", portland::EXAMPLE_LAYOUT);
                return Ok(());
            }
            let layout = layout
                .as_deref()
                .ok_or_else(|| anyhow::anyhow!("--layout is required"))?;
            let text = std::fs::read_to_string(layout)
                .with_context(|| format!("reading {}", layout.display()))?;
            let parsed: portland::Layout = toml::from_str(&text)
                .with_context(|| format!("{}: not a PortLand layout", layout.display()))?;
            parsed
                .check()
                .with_context(|| format!("{}", layout.display()))?;
            if *check {
                println!(
                    "{}: ok ({} switches)",
                    layout.display(),
                    parsed.switches.len()
                );
                return Ok(());
            }
            let stop = stopper(*duration_s)?;
            let stats = portland::run(parsed, &client, args.cpu.mode, &stop)?;
            println!("{}", serde_json::to_string(&stats)?);
            Ok(())
        }
        NfCmd::BcubeCard {
            shape,
            level_ports,
            host_port,
            host_mac,
            link_mbps,
            interface_base,
            priority,
            duration_s,
        } => {
            let card = bcube::Card {
                geometry: shape.geometry()?,
                id: shape.id,
                first_ip: shape.first_ip,
                level_ports: level_ports.clone(),
                host_port: *host_port,
                host_mac: *host_mac,
                link_mbps: *link_mbps,
                interface_base: *interface_base,
                priority: *priority,
            };
            card.check()?;
            let stop = stopper(*duration_s)?;
            let stats = bcube::run_card(&client, &card, args.cpu.mode, &stop)?;
            println!("{}", serde_json::to_string(&stats)?);
            Ok(())
        }
        NfCmd::BcubeHost {
            shape,
            tun,
            dev,
            max_paths,
            query_ms,
            duration_s,
        } => {
            let cfg = bcube::HostConfig {
                geometry: shape.geometry()?,
                id: shape.id,
                first_ip: shape.first_ip,
                tun: tun.clone(),
                dev: dev.clone(),
                max_paths: *max_paths,
                query_every: Duration::from_millis(*query_ms),
            };
            let stop = stopper(*duration_s)?;
            let stats = bcube::run_host(&cfg, &stop)?;
            println!("{}", serde_json::to_string(&stats)?);
            Ok(())
        }
        NfCmd::QcnSink { duration_s } => {
            seconds("--duration-s", *duration_s)?;
            let stop = std::sync::atomic::AtomicBool::new(false);
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            let bins = std::thread::scope(|scope| {
                let (stop, origin) = (&stop, std::time::Instant::now());
                let sink = scope.spawn(move || qcn::sink(stop, ready_tx, origin));
                let ready = ready_rx.recv().unwrap_or(false);
                if ready {
                    std::thread::sleep(Duration::from_secs_f64(duration_s.max(0.0)));
                }
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                sink.join().ok().filter(|_| ready)
            })
            .context("could not bind UDP ports 9200 and 9202")?;
            println!("t,received_mbps");
            for (t, mbps) in bins {
                println!("{t:.1},{mbps:.3}");
            }
            Ok(())
        }
    }
}

/// A number of seconds from the command line: finite and not negative.
fn seconds(flag: &str, s: f64) -> anyhow::Result<Option<Duration>> {
    anyhow::ensure!(
        s.is_finite() && (0.0..=1e9).contains(&s),
        "{flag} {s}: a number of seconds, 0 or more"
    );
    Ok(Some(Duration::from_secs_f64(s)))
}

/// Installs the signal handlers and returns what tells a function to stop: SIGINT, SIGTERM,
/// or `--duration-s` run out.
fn stopper(duration_s: Option<f64>) -> anyhow::Result<impl Fn() -> bool + Sync> {
    let until = deadline(duration_s)?;
    kvio::signal::install_stop_handlers();
    Ok(move || kvio::signal::stop_requested() || until.is_some_and(|u| Instant::now() >= u))
}

/// When `--duration-s` runs out.
fn deadline(duration_s: Option<f64>) -> anyhow::Result<Option<Instant>> {
    Ok(match duration_s {
        Some(s) => seconds("--duration-s", s)?.map(|d| Instant::now() + d),
        None => None,
    })
}

/// An entry matching `fields` (name and value; ternary tables match the rest as anything) at
/// `priority`, doing `actions`.
fn entry<const N: usize>(
    fields: [(&str, Value); N],
    priority: u32,
    actions: Vec<ActionDef>,
) -> EntryDef {
    EntryDef {
        fields: fields
            .into_iter()
            .map(|(f, v)| (f.to_string(), v))
            .collect(),
        priority,
        prefix_len: None,
        actions,
    }
}

/// A number to match, big-endian in the field's width.
fn number(n: impl Into<u64>) -> Value {
    Value::Number(n.into())
}

/// An address or `0x` and hex digits to match.
fn text(t: impl ToString) -> Value {
    Value::Text(t.to_string())
}

/// IPv4's ethertype, as an entry matches it.
const IPV4: &str = "0x0800";

/// What a request-id cache serves, and how.
#[derive(Clone, Debug)]
pub struct ReqcacheSpec<'a> {
    /// The UDP port of the requests and the server's replies.
    pub port: u16,
    /// The servers whose replies are kept.
    pub servers: &'a [std::net::Ipv4Addr],
    /// Most replies kept.
    pub capacity: usize,
    /// The priority of its `acl` entries.
    pub priority: u32,
    /// How often a line of counters is printed.
    pub report: Option<Duration>,
    pub cpu: cpu::CpuMode,
}

/// Runs the request-id cache until `stop`, then removes every entry it made (also after an
/// error). Returns its counters.
pub fn run_reqcache(
    client: &Client,
    spec: &ReqcacheSpec,
    stop: &dyn Fn() -> bool,
) -> anyhow::Result<reqcache::Stats> {
    let ReqcacheSpec {
        port,
        servers,
        capacity,
        priority,
        report,
        cpu,
    } = spec.clone();
    anyhow::ensure!(
        !servers.is_empty(),
        "a request-id cache needs at least one server"
    );
    let mut mirrors = Vec::new();
    let mut made = Ok(());
    for server in servers {
        let mirror = entry(
            [
                ("ethertype", text(IPV4)),
                ("ip_proto", number(17u8)),
                ("ip_src", text(server)),
                ("l4_src", number(port)),
            ],
            priority,
            vec![ActionDef::Mirror],
        );
        match client.add_entry(ACL, &mirror) {
            Ok(id) => mirrors.push(id),
            Err(e) => {
                made = Err(e.context("installing the entry that copies replies to the CPU"));
                break;
            }
        }
    }
    let mut cache = ReqCache::new(port, capacity, servers);
    let served = made
        .and_then(|()| cpu::Cpu::open(client, cpu, true))
        .and_then(|mut cpu| serve(client, &mut cpu, &mut cache, (port, priority), report, stop));
    let mut cleanup = Ok(());
    for id in mirrors
        .into_iter()
        .chain(cache.entries().collect::<Vec<_>>())
    {
        cleanup = cleanup.and(client.remove_entry(ACL, id).map(drop));
    }
    served?;
    cleanup.context("removing the request-id cache's entries")?;
    Ok(cache.stats)
}

fn serve(
    client: &Client,
    cpu: &mut cpu::Cpu,
    cache: &mut ReqCache,
    (port, priority): (u16, u32),
    report: Option<Duration>,
    stop: &dyn Fn() -> bool,
) -> anyhow::Result<()> {
    let mut next_report = report.map(|r| Instant::now() + r);
    while !stop() {
        for f in cpu.frames(256, Duration::from_millis(250))? {
            act(client, cpu, cache, port, priority, f.in_port, &f.frame)?;
            if stop() {
                break;
            }
        }
        if let (Some(at), Some(every)) = (next_report, report) {
            if Instant::now() >= at {
                let s = cache.stats;
                eprintln!(
                    "reqcache: {} kept, {} hits, {} passed to the server, {} evicted, {} ignored",
                    cache.len(),
                    s.hits,
                    s.passed,
                    s.evicted,
                    s.ignored
                );
                next_report = Some(at + every);
            }
        }
    }
    Ok(())
}

fn act(
    client: &Client,
    cpu: &mut cpu::Cpu,
    cache: &mut ReqCache,
    port: u16,
    priority: u32,
    in_port: u16,
    frame: &[u8],
) -> anyhow::Result<()> {
    match cache.take(in_port, frame) {
        Step::Keep { id, evict } => {
            if let Some(old) = evict {
                if let Err(e) = client.remove_entry(ACL, old) {
                    cache.orphaned(old);
                    return Err(e);
                }
            }
            let answer = entry(
                [
                    ("ethertype", text(IPV4)),
                    ("ip_proto", number(17u8)),
                    ("l4_dst", number(port)),
                    ("l4_payload", text(switch::control::hex(&id))),
                ],
                priority + 1,
                vec![ActionDef::ToCpu],
            );
            match client.add_entry(ACL, &answer) {
                Ok(made) => {
                    cache.installed(id, made);
                }
                // A full acl: the reply is not kept, the function goes on.
                Err(e) if full(&e) => cache.forget(id),
                Err(e) => return Err(e),
            }
        }
        Step::Send { port, frame } => cpu.send(port, &frame)?,
        Step::Ignore(_) => {}
    }
    Ok(())
}

/// Whether the switch refused a change because the table is full.
fn full(e: &anyhow::Error) -> bool {
    e.downcast_ref::<api::Refused>()
        .is_some_and(|r| r.kind == Some(ErrorKind::Full))
}
