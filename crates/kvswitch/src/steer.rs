//! `kvswitch node --role cache` in front of a kvswitch: its rules, installed through the
//! switch's control API (SwitchKV section 3.1.1 on kvswitch's pipeline). A read of one key
//! (the parser's one-read mark) whose key hash has an entry in `kv_steer` is sent to the
//! cache node: its IPv4 destination rewritten, out through an interface-table entry that
//! leads there. The cache node's replies leave with the VIP as their source (an `acl` entry),
//! as a server's do. Other reads, writes and reads of other keys go through the program to
//! their backend as before.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use kv::rules::Change;
use kv::HashFn;
use serde_json::{json, Value};

use crate::ctl::Client;

/// Where a cache node's rules go.
#[derive(Args, Debug, Clone)]
pub struct SteerArgs {
    /// The switch whose `kv_steer` table sends reads of the cache node's keys to it (its
    /// control API). Without it the cache node installs no rules.
    #[arg(long)]
    pub switch_api: Option<SocketAddr>,
    /// A file whose first line is the switch API's token (or KVSWITCH_API_TOKEN).
    #[arg(long)]
    pub switch_token_file: Option<PathBuf>,
    /// The switch's interface-table entry that leads to this cache node (its MAC, the VIP's
    /// MAC as source, its port): `kvswitch ctl interface set N ...`.
    #[arg(long)]
    pub steer_interface: Option<u16>,
    /// The switch's VIP, the source of the cache node's replies as clients see them.
    #[arg(long)]
    pub vip: Option<Ipv4Addr>,
    /// The switch pool's hash function, which the switch hashes keys with.
    #[arg(long, default_value = "md5")]
    pub hash: String,
}

/// The rule sink of a cache node at `cache` (its address and memcached port), installing
/// entries in the switch's `kv_steer` table. Makes the `acl` entry for the cache node's
/// replies first. `Ok(None)` without `--switch-api`.
pub fn rule_sink(
    args: &SteerArgs,
    cache: SocketAddr,
) -> anyhow::Result<Option<node::switchkv::RuleSink>> {
    let Some(api) = args.switch_api else {
        return Ok(None);
    };
    let interface = args
        .steer_interface
        .context("--switch-api needs --steer-interface N (the entry that leads to this node)")?;
    let vip = args
        .vip
        .context("--switch-api needs --vip (the switch's VIP)")?;
    let SocketAddr::V4(cache) = cache else {
        anyhow::bail!("a cache node steered to by a switch listens on IPv4");
    };
    let hash: HashFn = args
        .hash
        .parse()
        .map_err(|e| anyhow::anyhow!("--hash {}: {e}", args.hash))?;
    let client = Client {
        api,
        token: crate::ctl::token(args.switch_token_file.as_deref())?,
    };
    // Replies from the cache node's memcached port leave with the VIP as source.
    let replies = json!({
        "match": {
            "ip_src": cache.ip().to_string(),
            "ip_proto": 17,
            "l4_src": cache.port(),
        },
        "priority": 1000,
        "actions": [{ "set_ipv4_src": vip.to_string() }],
    });
    // A cache node that starts again finds its reply entry there, and its old steering
    // entries, which lead to a node that holds nothing now: those go.
    let acl = entries(&client, "acl")?;
    // (Listed with the switch's own goto on to the program after its action.)
    let ours =
        |e: &Value| e["match"] == replies["match"] && e["actions"][0] == replies["actions"][0];
    if !acl.iter().any(ours) {
        client
            .call("POST", "/api/v1/tables/acl/entries", Some(&replies))
            .context("adding the acl entry for the cache node's replies")?;
    }
    let mine = json!({ "set_ipv4_dst": cache.ip().to_string() });
    for old in entries(&client, switch::control::STEER)? {
        if old["actions"][0] == mine {
            let id = old["id"].as_u64().unwrap_or_default();
            let path = format!("/api/v1/tables/{}/entries/{id}", switch::control::STEER);
            client
                .call("DELETE", &path, None)
                .context("removing a steering entry left from before")?;
        }
    }
    let mut steer = Steer {
        client,
        hash,
        interface,
        cache: *cache.ip(),
        entries: HashMap::new(),
    };
    Ok(Some(Box::new(move |changes| steer.apply(changes))))
}

/// Every entry of `table`, page by page.
fn entries(client: &Client, table: &str) -> anyhow::Result<Vec<Value>> {
    let mut all = Vec::new();
    let mut after = String::new();
    loop {
        let page = client
            .call(
                "GET",
                &format!("/api/v1/tables/{table}/entries{after}"),
                None,
            )
            .with_context(|| format!("listing the switch's {table} entries"))?;
        all.extend(page["entries"].as_array().cloned().unwrap_or_default());
        match page["next"].as_u64() {
            Some(next) => after = format!("?after={next}"),
            None => return Ok(all),
        }
    }
}

/// The cache node's entries in `kv_steer`, by key hash (keys whose hashes collide share one).
struct Steer {
    client: Client,
    hash: HashFn,
    interface: u16,
    cache: Ipv4Addr,
    /// Key hash → (entry id, keys that hold it).
    entries: HashMap<u32, (u64, usize)>,
}

impl Steer {
    fn apply(&mut self, changes: Vec<Change<Box<[u8]>>>) -> anyhow::Result<()> {
        for change in changes {
            match change {
                Change::Add(key) => {
                    let h = self.hash.hash(&key);
                    if let Some((_, n)) = self.entries.get_mut(&h) {
                        *n += 1;
                        continue;
                    }
                    let entry = json!({
                        "match": { "one_read": 1, "key_hash": h },
                        "actions": [
                            { "set_ipv4_dst": self.cache.to_string() },
                            { "interface": self.interface },
                        ],
                    });
                    let made: Value = self
                        .client
                        .call(
                            "POST",
                            &format!("/api/v1/tables/{}/entries", switch::control::STEER),
                            Some(&entry),
                        )
                        .with_context(|| format!("steering key hash {h}"))?;
                    let id = made["id"].as_u64().context("the switch gave no entry id")?;
                    self.entries.insert(h, (id, 1));
                }
                Change::Remove(key) => {
                    let h = self.hash.hash(&key);
                    let Some((id, n)) = self.entries.get_mut(&h) else {
                        continue;
                    };
                    *n -= 1;
                    if *n > 0 {
                        continue;
                    }
                    let id = *id;
                    self.entries.remove(&h);
                    self.client
                        .call(
                            "DELETE",
                            &format!("/api/v1/tables/{}/entries/{id}", switch::control::STEER),
                            None,
                        )
                        .with_context(|| format!("no longer steering key hash {h}"))?;
                }
            }
        }
        Ok(())
    }
}
