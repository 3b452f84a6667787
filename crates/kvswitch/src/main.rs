//! kvswitch: an application-aware software switch for memcached traffic.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};

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
    /// How log lines are written to standard error: "text" for people, "json" (one object a
    /// line) for a log collector. The level is set with RUST_LOG (default: info).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
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
    /// Network functions other than memcached's, run on a switch through its control API and
    /// its CPU channel: caching by request id, QCN's congestion point, reaction point and sink,
    /// PortLand's fabric manager, a BCube server's card and host side.
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
    /// Print a shell's completion script for kvswitch (for bash: `kvswitch completions bash >
    /// /etc/bash_completion.d/kvswitch`).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print kvswitch's manual page (roff), or write a page for it and each of its commands
    /// into a directory (`man -l kvswitch.1` reads one).
    Man {
        /// Write kvswitch.1 and kvswitch-<command>.1 here instead of printing kvswitch.1.
        #[arg(long, value_name = "DIR")]
        out_dir: Option<PathBuf>,
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
    let cli = Cli::parse();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().flatten_event(true).init(),
    }
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
        Cmd::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "kvswitch",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Cmd::Man { out_dir } => man(out_dir.as_deref()),
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
                // The TLS and SASL files it names load: a mistake is named here, not at start.
                api::guard::Guard::new(cfg.api_serving.clone())?;
                proxy::Secrets::load(
                    cfg.tls.as_ref(),
                    cfg.server_tls.as_ref(),
                    cfg.server_sasl.as_ref(),
                )?;
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

/// The manual page of kvswitch to standard output, or one page for it and each of its commands
/// into `dir`.
fn man(dir: Option<&std::path::Path>) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let cli = Cli::command();
    let Some(dir) = dir else {
        return Ok(clap_mangen::Man::new(cli).render(&mut std::io::stdout())?);
    };
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut pages = vec![("kvswitch".to_owned(), cli.clone())];
    for sub in cli.get_subcommands() {
        let name = format!("kvswitch-{}", sub.get_name());
        pages.push((name.clone(), sub.clone().name(name)));
    }
    for (name, command) in pages {
        let path = dir.join(format!("{name}.1"));
        let mut page = Vec::new();
        clap_mangen::Man::new(command).render(&mut page)?;
        std::fs::write(&path, page).with_context(|| format!("cannot write {}", path.display()))?;
    }
    println!("{}", dir.display());
    Ok(())
}
