//! `kvswitch cache`, and `kvswitch ctl cache`: the cache of a running switch or proxy, shown
//! or changed through its control API.

/// Arguments of `kvswitch cache`.
#[derive(Debug, clap::Args)]
#[command(
    long_about = "Show the cache of a running switch or proxy (sizes, hit ratio, the most \
                        loaded cached keys, the hot keys detected), or pin, unpin or evict a \
                        key. Talks to the control API (`switch.api`, or the proxy's --api)."
)]
pub struct CacheArgs {
    #[command(flatten)]
    pub switch: api::ApiArgs,
    #[command(flatten)]
    pub cmd: CacheCmd,
}

/// What to do with the cache, for `kvswitch cache` and `kvswitch ctl cache`.
#[derive(Debug, clap::Args)]
pub struct CacheCmd {
    #[command(subcommand)]
    pub action: CacheAction,
    /// The pool whose cache is meant, when a proxy serves several.
    #[arg(long, global = true)]
    pub pool: Option<String>,
}

#[derive(Debug, clap::Subcommand)]
pub enum CacheAction {
    /// Print the cache's state as JSON.
    Show {
        /// How many of the most loaded cached keys and hot keys to list.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Put a key in the cache and keep it there (its rule is installed within the budget).
    Pin { key: String },
    /// Let a pinned key be evicted again like any other.
    Unpin { key: String },
    /// Remove a key from the cache now.
    Evict { key: String },
}

/// Runs `kvswitch cache`.
pub fn run_cli(args: &CacheArgs) -> anyhow::Result<()> {
    let client = args.switch.client()?;
    let doc = call(&client, &args.cmd)?;
    println!("{}", serde_json::to_string_pretty(&doc)?);
    Ok(())
}

/// The API call `cmd` stands for, made with `client`.
pub fn call(client: &api::Client, cmd: &CacheCmd) -> anyhow::Result<serde_json::Value> {
    let pool = cmd
        .pool
        .as_ref()
        .map(|p| format!("&pool={}", api::percent_encode(p.as_bytes())))
        .unwrap_or_default();
    match &cmd.action {
        CacheAction::Show { limit } => {
            client.call("GET", &format!("/api/v1/cache?limit={limit}"), None)
        }
        CacheAction::Pin { key } | CacheAction::Unpin { key } | CacheAction::Evict { key } => {
            let action = match &cmd.action {
                CacheAction::Pin { .. } => "pin",
                CacheAction::Unpin { .. } => "unpin",
                _ => "evict",
            };
            let key = api::percent_encode(key.as_bytes());
            client.call(
                "POST",
                &format!("/api/v1/cache/{action}?key={key}{pool}"),
                None,
            )
        }
    }
}
