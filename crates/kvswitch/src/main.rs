//! kvswitch: an application-aware software switch for memcached traffic.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use kvswitch::demo;

#[derive(Parser)]
#[command(
    name = "kvswitch",
    version,
    about = "An application-aware software switch for memcached traffic",
    long_about = "kvswitch forwards Ethernet like any learning switch and understands memcached: \
                  UDP requests to its virtual IP are routed by key (ketama, placed exactly as \
                  twemproxy places them) straight to the right server, and replies go straight \
                  back to the client."
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the switch on the ports of a configuration file (needs root).
    Run {
        /// The configuration file (TOML); see --example-config.
        #[arg(long, short, required_unless_present = "example_config")]
        config: Option<PathBuf>,
        /// Print an example configuration and exit.
        #[arg(long)]
        example_config: bool,
        /// Check the configuration and exit without opening ports.
        #[arg(long)]
        check: bool,
        /// Answer hot keys from kvswitch's own coherent cache, on the UDP path and in the
        /// proxy (settings: the `[cache]` table; defaults otherwise).
        #[arg(long)]
        cache: bool,
    },
    /// Show the cache of a running switch or proxy, or pin, unpin or evict a key.
    Cache(kvswitch::cache_cli::CacheArgs),
    /// Read and change a running switch through its control API: tables, entries, ports,
    /// counters, packets, the pool, the cache.
    Ctl(kvswitch::ctl::CtlArgs),
    /// Run a fleet of switches as one: probe the pool's servers, take a dead one out of every
    /// switch's pool and put it back when it answers, add and remove servers; keep a caching
    /// fabric's registration table.
    Controller(controller::ControllerArgs),
    /// A coherent caching fabric of several kvswitches (IncBricks): run one of its switches,
    /// show them all, install a registration table, inject faults.
    Fabric(kvswitch::fabric::FabricArgs),
    /// One operation of the fabric's client library (get, set, del, incr, cond-put) on a
    /// memcached server behind a kvswitch fabric.
    Inc(kvswitch::inc_cli::IncArgs),
    /// Network functions other than memcached's, run on a switch through its control API:
    /// caching by request id, QCN's congestion point, reaction point and sink.
    Nf(nf::NfArgs),
    /// Build or remove a test network of namespaces, memcached servers and kvswitch.
    Testbed {
        #[command(subcommand)]
        action: TestbedCmd,
    },
    /// Generate memcached load (UDP or TCP) and report throughput and latency.
    Load(loadgen::LoadArgs),
    /// Build the default testbed, compare memcached direct, kvswitch and nutcracker, tear down.
    Demo(demo::DemoArgs),
    /// Reproducible benchmarks: each scenario starts what it measures (the testbed ones need
    /// root), compares kvswitch with its peers in one run, and writes JSON, plots and a
    /// markdown summary; `proxy` checks the proxy's targets on loopback.
    Bench {
        #[command(subcommand)]
        scenario: bench::Scenario,
    },
    Proxy(kvswitch::proxy_cli::ProxyArgs),
    /// Simulate a scenario at datacenter scale on kvswitch's own code, on a virtual clock:
    /// the same scenario and seed give the same results.
    Sim(kvswitch::sim_cli::SimArgs),
    /// Serve the memcached protocol from memory, optionally capacity-limited (a backend for
    /// experiments), or as one of SwitchKV's roles (a backend, a cache node).
    Node {
        #[command(flatten)]
        node: node::NodeArgs,
        #[command(flatten)]
        steer: node::steer::SteerArgs,
    },
}

#[derive(Subcommand)]
enum TestbedCmd {
    /// Build the testbed (default: 2 clients, 3 memcached servers) and leave it running.
    Up {
        /// A topology file (TOML); the built-in default when left out.
        topology: Option<PathBuf>,
        /// Prefix of every namespace and link made (at most 5 characters).
        #[arg(long, default_value = "kvs")]
        prefix: String,
        /// Where to write the live topology (JSON).
        #[arg(long)]
        state: Option<PathBuf>,
        /// Do not start nutcracker on the first client.
        #[arg(long)]
        no_nutcracker: bool,
        /// The servers run redis-server on port 6379 instead of memcached, and the pool (the
        /// switch's, nutcracker's) is a Redis pool on the VIP's port 6379.
        #[arg(long)]
        redis: bool,
        /// kvswitch's datapath: "xdp" (the fast path, an error if it cannot attach), "af_xdp"
        /// (the fast path, and AF_XDP sockets to the switch) or "af_packet" (none) [default:
        /// XDP wherever it attaches].
        #[arg(long, value_parser = ["xdp", "af_xdp", "af_packet"])]
        datapath: Option<String>,
    },
    /// Remove every namespace, link and process the testbed made (also after a crash);
    /// fails if no testbed of the prefix exists.
    Down {
        #[arg(long, default_value = "kvs")]
        prefix: String,
        /// The live topology file written by `up`; by default the one `up --prefix` wrote,
        /// wherever `--state` put it.
        #[arg(long)]
        state: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match dispatch(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvswitch: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Run {
            config,
            example_config,
            check,
            cache,
        } => {
            if example_config {
                print!("{}\n{}", config::EXAMPLE, config::cache::CACHE_EXAMPLE);
                return Ok(());
            }
            let path = config.ok_or_else(|| anyhow::anyhow!("--config is required"))?;
            let mut cfg = config::Config::load(&path)?;
            cfg.cache.enabled |= cache;
            if check {
                println!(
                    "{}: ok ({} ports, {} servers, {} mode, cache {})",
                    path.display(),
                    cfg.ports.len(),
                    cfg.servers.len(),
                    if cfg.mode == config::Mode::L3 {
                        "l3"
                    } else {
                        "l2"
                    },
                    if cfg.cache.enabled { "on" } else { "off" }
                );
                return Ok(());
            }
            daemon::run(cfg)
        }
        Cmd::Proxy(args) => kvswitch::proxy_cli::run(args),
        Cmd::Sim(args) => kvswitch::sim_cli::run(&args),
        Cmd::Nf(args) => nf::run(&args),
        Cmd::Cache(args) => kvswitch::cache_cli::run_cli(&args),
        Cmd::Ctl(args) => kvswitch::ctl::run(&args),
        Cmd::Fabric(args) => kvswitch::fabric::run_cli(&args),
        Cmd::Inc(args) => {
            if !kvswitch::inc_cli::run(&args)? {
                std::process::exit(1);
            }
            Ok(())
        }
        Cmd::Controller(args) => controller::run(&args),
        Cmd::Testbed { action } => match action {
            TestbedCmd::Up {
                topology,
                prefix,
                state,
                no_nutcracker,
                redis,
                datapath,
            } => {
                let topo = match &topology {
                    Some(p) => testbed::Topology::from_file(p)?,
                    None => testbed::Topology::default_topology(),
                };
                let bin = std::env::current_exe()?;
                // SwitchKV: the servers are `kvswitch node` backends of the cache hosts.
                let servers = match topo.caches().next() {
                    Some(_) => testbed::ServerProgram::Node {
                        bin: bin.clone(),
                        args: Vec::new(),
                    },
                    None if redis => testbed::ServerProgram::Redis,
                    None => testbed::ServerProgram::Memcached,
                };
                let opts = testbed::UpOptions {
                    prefix,
                    kvswitch_bin: Some(bin),
                    state_path: state,
                    start_nutcracker: !no_nutcracker,
                    servers,
                    datapath,
                    ..Default::default()
                };
                let live = testbed::up(&topo, &opts)?;
                let path = live.state_path().to_path_buf();
                live.keep();
                println!("{}", path.display());
                Ok(())
            }
            TestbedCmd::Down { prefix, state } => match state {
                Some(path) if !path.exists() => {
                    anyhow::bail!("{}: no such testbed state file", path.display())
                }
                Some(path) => testbed::down(&path),
                // Wherever `up --state` put the state file; an error if nothing of the
                // prefix exists.
                None => testbed::down_prefix(&prefix),
            },
        },
        Cmd::Load(args) => {
            let report = loadgen::run(&args)?;
            report.print_human(&mut std::io::stdout());
            Ok(())
        }
        Cmd::Demo(args) => demo::run(&args),
        Cmd::Bench { scenario } => bench::run(&scenario),
        Cmd::Node { node, steer } => {
            let (rules, backends) = match node.role {
                node::Role::Cache => (
                    node::steer::rule_sink(&steer, node.listen, &node.hash)?,
                    node.pool_config
                        .as_deref()
                        .map(|path| node::steer::pool_backends(path, node.backend_control_port))
                        .transpose()?,
                ),
                _ => (None, None),
            };
            node::run_with(&node, rules, backends)
        }
    }
}
