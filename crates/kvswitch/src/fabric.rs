//! `kvswitch fabric`: one switch of a coherent caching fabric (`run`), and the operator's
//! view of a running fabric (`status`, `table`, `cache`, `coherence`, `fault`), all read from one fabric file.
//!
//! The switch itself runs from [`daemon::fabric`].

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use config::fabric::FabricConfig;
use serde_json::{json, Value};

#[derive(Args, Debug)]
pub struct FabricArgs {
    #[command(subcommand)]
    pub action: FabricCmd,
}

#[derive(Subcommand, Debug)]
pub enum FabricCmd {
    /// Run one switch of the fabric on its ports (needs root).
    Run {
        /// The fabric file (TOML; see --example-config).
        #[arg(long, short, required_unless_present = "example_config")]
        config: Option<PathBuf>,
        /// Which switch of the file this is.
        #[arg(long, required_unless_present = "example_config")]
        switch: Option<String>,
        /// Check the file and exit without opening ports.
        #[arg(long)]
        check: bool,
        /// Print an example fabric file, every key explained, and exit.
        #[arg(long)]
        example_config: bool,
    },
    /// Show every switch's counters, cache and links.
    Status {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Install a registration table on every switch: the file's roots, those named failed
    /// left out (a controller's job when a switch fails or comes back).
    Table {
        #[arg(long, short)]
        config: PathBuf,
        /// The table's version; must be newer than the one each switch holds.
        #[arg(long)]
        version: u64,
        /// Switches that failed (names), comma-separated.
        #[arg(long, value_delimiter = ',')]
        failed: Vec<String>,
    },
    /// Watch every switch and keep the registration table right: a switch whose API fails
    /// `--failures` probes in a row is declared failed in a new table sent to the others;
    /// one that answers again is taken back the same way. Runs until SIGINT or SIGTERM.
    Watch {
        #[arg(long, short)]
        config: PathBuf,
        /// Milliseconds between probes.
        #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(10..=60_000))]
        every_ms: u64,
        /// Probes failed in a row before a switch is declared failed.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
        failures: u32,
    },
    /// Set how many items switches cache (0: none), and how each splits its cache into a
    /// switch stage and processors (IncBricks' IncBox; a new split drops the copies held):
    /// one switch, or every ToR or root.
    Cache {
        #[arg(long, short)]
        config: PathBuf,
        /// A switch's name, `tor` (every ToR) or `root` (every root).
        #[arg(long)]
        switch: String,
        /// Items the switch caches, shared among its processors.
        #[arg(long, required_unless_present_any = ["processors", "hit_check", "fdb_entries"])]
        items: Option<usize>,
        /// Cache processors (1 to 16): a key's hash picks its processor.
        #[arg(long)]
        processors: Option<usize>,
        /// Whether the switch stage sends a read to a processor only when its table marks
        /// the key as held there (otherwise every read reaches its processor).
        #[arg(long, value_parser = clap::builder::BoolishValueParser::new())]
        hit_check: Option<bool>,
        /// The switch stage's table size, in marks.
        #[arg(long)]
        fdb_entries: Option<usize>,
    },
    /// Choose what a write does to the copies of its key (IncBricks' `inc_init` choice), on
    /// every switch: `invalidate` takes them away, `update` also sends the value a `set`
    /// stored to the switches that held the key. The file's `coherence` is the choice at
    /// start.
    Coherence {
        #[arg(long, short)]
        config: PathBuf,
        #[arg(value_parser = ["invalidate", "update"])]
        protocol: String,
    },
    /// Make a switch drop the next N invalidations it receives.
    Fault {
        #[arg(long, short)]
        config: PathBuf,
        #[arg(long)]
        switch: String,
        #[arg(long)]
        drop_invalidations: u64,
    },
}

pub fn run_cli(args: &FabricArgs) -> anyhow::Result<()> {
    match &args.action {
        FabricCmd::Run {
            config,
            switch,
            check,
            example_config,
        } => {
            if *example_config {
                print!("{}", config::fabric::EXAMPLE);
                return Ok(());
            }
            let (Some(config), Some(switch)) = (config, switch) else {
                anyhow::bail!("--config and --switch are required");
            };
            let cfg = FabricConfig::load(config)?;
            cfg.spec(switch)?;
            if *check {
                println!("{}: switch {switch} is fine", config.display());
                return Ok(());
            }
            daemon::fabric::run(cfg, switch)
        }
        FabricCmd::Status { config } => status(&FabricConfig::load(config)?),
        FabricCmd::Watch {
            config,
            every_ms,
            failures,
        } => {
            kvio::signal::install_stop_handlers();
            controller::keeper::watch(
                &FabricConfig::load(config)?,
                std::time::Duration::from_millis(*every_ms),
                *failures,
                &kvio::signal::stop_requested,
            )
        }
        FabricCmd::Table {
            config,
            version,
            failed,
        } => {
            let cfg = FabricConfig::load(config)?;
            let body = json!({"version": version, "failed": failed});
            for_each_switch(&cfg, "PUT", "/api/v1/fabric/registration", &body)
        }
        FabricCmd::Cache {
            config,
            switch,
            items,
            processors,
            hit_check,
            fdb_entries,
        } => {
            let cfg = FabricConfig::load(config)?;
            let mut body = serde_json::Map::new();
            for (key, value) in [
                ("items", items.map(|n| json!(n))),
                ("processors", processors.map(|n| json!(n))),
                ("hit_check", hit_check.map(|b| json!(b))),
                ("fdb_entries", fdb_entries.map(|n| json!(n))),
            ] {
                if let Some(v) = value {
                    body.insert(key.into(), v);
                }
            }
            let body = serde_json::Value::Object(body);
            let chosen: Vec<_> = cfg
                .switches
                .iter()
                .filter(|s| s.name == *switch || s.role.name() == switch)
                .collect();
            if chosen.is_empty() {
                anyhow::bail!("{}: no switch or role {switch:?}", config.display());
            }
            for s in chosen {
                let api = s
                    .api
                    .with_context(|| format!("switch {} has no `api`", s.name))?;
                let done = call(&cfg, api, "PUT", "/api/v1/fabric/cache", &body)?;
                println!(
                    "{}: {} items, {} processor(s), hit check {}",
                    s.name,
                    done["items"],
                    done["processors"],
                    if done["hit_check"] == true {
                        "on"
                    } else {
                        "off"
                    }
                );
            }
            Ok(())
        }
        FabricCmd::Coherence { config, protocol } => {
            let cfg = FabricConfig::load(config)?;
            let body = json!({ "protocol": protocol });
            for_each_switch(&cfg, "PUT", "/api/v1/fabric/coherence", &body)
        }
        FabricCmd::Fault {
            config,
            switch,
            drop_invalidations,
        } => {
            let cfg = FabricConfig::load(config)?;
            let s = cfg
                .switch(switch)
                .with_context(|| format!("{}: no switch {switch:?}", config.display()))?;
            let api = s
                .api
                .with_context(|| format!("{}: switch {switch} has no `api`", config.display()))?;
            let body = json!({ "drop_invalidations": drop_invalidations });
            call(&cfg, api, "PUT", "/api/v1/fabric/faults", &body)?;
            println!("{switch}: dropping the next {drop_invalidations} invalidations");
            Ok(())
        }
    }
}

/// How long the operator's commands wait for a switch's answer.
const ANSWER_WITHIN: std::time::Duration = std::time::Duration::from_secs(1);

/// A client of one switch's API, with the fabric's token.
fn client(cfg: &FabricConfig, api: SocketAddr) -> anyhow::Result<::api::Client> {
    Ok(::api::Client::new(
        api,
        ::api::client::token(cfg.api_token_file.as_deref())?,
    ))
}

/// `method path` with a JSON body to one switch's API; an error unless it answers 2xx.
fn call(
    cfg: &FabricConfig,
    api: SocketAddr,
    method: &str,
    path: &str,
    body: &Value,
) -> anyhow::Result<Value> {
    client(cfg, api)?
        .call_within(method, path, Some(body), ANSWER_WITHIN)
        .with_context(|| format!("switch API {api}"))
}

fn for_each_switch(
    cfg: &FabricConfig,
    method: &str,
    path: &str,
    body: &Value,
) -> anyhow::Result<()> {
    let mut failures = Vec::new();
    for s in &cfg.switches {
        let Some(api) = s.api else {
            continue;
        };
        match call(cfg, api, method, path, body) {
            Ok(_) => println!("{}: done", s.name),
            Err(e) => {
                println!("{}: {e:#}", s.name);
                failures.push(s.name.clone());
            }
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("not done on {}", failures.join(", "))
    }
}

fn status(cfg: &FabricConfig) -> anyhow::Result<()> {
    println!(
        "{:<8} {:<5} {:>9} {:>9} {:>8} {:>8} {:>9} {:>8}  links up",
        "switch", "role", "requests", "hits", "items", "fills", "invalid.", "no route"
    );
    for s in &cfg.switches {
        let Some(api) = s.api else {
            println!("{:<8} (no api)", s.name);
            continue;
        };
        // A read needs no token: one that cannot be read does not stop the status.
        let reader = ::api::Client::new(api, None);
        match reader.call_within("GET", "/api/v1/fabric", None, ANSWER_WITHIN) {
            Ok(v) => {
                let n = |p: &str| v.pointer(p).and_then(Value::as_u64).unwrap_or(0);
                let links: Vec<String> = v["links"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter(|l| l["up"] == true)
                            .filter_map(|l| l["to"].as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default();
                println!(
                    "{:<8} {:<5} {:>9} {:>9} {:>8} {:>8} {:>9} {:>8}  {}",
                    s.name,
                    v["role"].as_str().unwrap_or("?"),
                    n("/stats/requests_in"),
                    n("/cache/hits"),
                    n("/cache/items"),
                    n("/cache/fills"),
                    n("/directory/invalidations"),
                    n("/stats/no_route"),
                    links.join(",")
                );
            }
            Err(e) => match e.downcast_ref::<::api::Refused>() {
                Some(r) => println!("{:<8} {}: {}", s.name, r.status, r.message),
                None => println!("{:<8} down: {e:#}", s.name),
            },
        }
    }
    Ok(())
}
