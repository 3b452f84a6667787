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
use std::time::{Duration, Instant};

use anyhow::Context;
use api::Client;
use clap::Args;
use kv::rules::Change;
use kv::HashFn;
use switch::control::{self, ActionDef, EntryDef, EntryView, STEER};

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
    /// The switch's API speaks HTTPS: the authorities its certificate is checked against
    /// (PEM).
    #[arg(long, value_name = "FILE")]
    pub switch_api_ca: Option<PathBuf>,
    /// The switch's interface-table entry that leads to this cache node (its MAC, the VIP's
    /// MAC as source, its port): `kvswitch ctl interface set N ...`.
    #[arg(long)]
    pub steer_interface: Option<u16>,
    /// The switch's VIP, the source of the cache node's replies as clients see them.
    #[arg(long)]
    pub vip: Option<Ipv4Addr>,
}

/// A cache node's backends (`--pool-config`): the servers of the pool the kvswitch
/// configuration at `path` describes, each at its address and `control_port`, and the pool's
/// placement of keys with every server in, as the switch places them.
pub fn pool_backends(
    path: &std::path::Path,
    control_port: u16,
) -> anyhow::Result<crate::switchkv::Backends> {
    let cfg = config::Config::load(path)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("--pool-config: reading {}", path.display()))?;
    let spec = cfg.switch_pool_spec();
    let control = spec
        .servers
        .iter()
        .map(|s| SocketAddr::new(s.addr.ip(), control_port))
        .collect();
    // Every server in, as the pool stands before any health check: a key's backend is the
    // server that owns it, wherever a failover sends its reads meanwhile.
    let view = switch::pool::Pool::new(spec)
        .map_err(|e| {
            anyhow::anyhow!(
                "--pool-config {}: the pool has no ring: {e}",
                path.display()
            )
        })?
        .view(kv::Instant::ZERO);
    Ok(crate::switchkv::Backends {
        control,
        place: Box::new(move |key: &[u8]| view.locate(key)),
    })
}

/// The rule sink of a cache node at `cache` (its address and memcached port), installing
/// entries in the switch's `kv_steer` table. Makes the `acl` entry for the cache node's
/// replies first. `Ok(None)` without `--switch-api`.
pub fn rule_sink(
    args: &SteerArgs,
    cache: SocketAddr,
    hash: &str,
) -> anyhow::Result<Option<crate::switchkv::RuleSink>> {
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
    if cache.ip().is_unspecified() {
        anyhow::bail!(
            "a cache node steered to by a switch listens on one address, the one its steering \
             entries lead to: give --listen ADDRESS:PORT"
        );
    }
    let hash: HashFn = hash
        .parse()
        .map_err(|e| anyhow::anyhow!("--hash {hash}: {e}"))?;
    let client = Client::new(api, api::client::token(args.switch_token_file.as_deref())?);
    let client = match &args.switch_api_ca {
        Some(ca) => client.with_https(api::client::Https::load(ca, None)?),
        None => client,
    };
    // Replies from the cache node's memcached port leave with the VIP as source.
    let replies = EntryDef {
        fields: [
            ("ip_src", control::Value::Text(cache.ip().to_string())),
            ("ip_proto", control::Value::Number(17)),
            ("l4_src", control::Value::Number(u64::from(cache.port()))),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect(),
        priority: 1000,
        prefix_len: None,
        actions: vec![ActionDef::SetIpv4Src(vip)],
    };
    // A cache node that starts again finds its reply entry there, and its old steering
    // entries, which lead to a node that holds nothing now: those go.
    // (Listed with the switch's own goto on to the program after its action.)
    let ours =
        |e: &EntryView| e.fields == replies.fields && e.actions.first() == replies.actions.first();
    if !client.table_entries(control::ACL)?.iter().any(ours) {
        client
            .add_entry(control::ACL, &replies)
            .context("adding the acl entry for the cache node's replies")?;
    }
    let mine = ActionDef::SetIpv4Dst(*cache.ip());
    for old in client.table_entries(STEER)? {
        if old.actions.first() == Some(&mine) {
            client
                .remove_entry(STEER, old.id)
                .context("removing a steering entry left from before")?;
        }
    }
    let mut steer = Steer {
        client,
        hash,
        interface,
        cache: *cache.ip(),
        entries: HashMap::new(),
        removed_seen: None,
        listed: None,
    };
    Ok(Some(Box::new(move |changes| steer.apply(changes))))
}

/// The cache node's entries in `kv_steer`, by key hash (keys whose hashes collide share one).
struct Steer {
    client: Client,
    hash: HashFn,
    interface: u16,
    cache: Ipv4Addr,
    /// Key hash → (entry id, keys that hold it).
    entries: HashMap<u32, (u64, usize)>,
    /// The switch's count of steering entries it removed (its check of the cache nodes), when
    /// last synced: a sync lists the entries when it moved ...
    removed_seen: Option<u64>,
    /// ... or [`AUDIT_EVERY`] after the last listing: entries removed by others (the
    /// controller, an operator) move no count.
    listed: Option<Instant>,
}

/// How often a cache node's rule sink lists its entries whatever the switch's count says.
pub const AUDIT_EVERY: Duration = Duration::from_secs(10);

impl Steer {
    /// Applies the cache node's rule changes, in one batch when it can; with none, makes the
    /// switch's entries match the node's keys again (see [`Steer::sync`]).
    fn apply(&mut self, changes: Vec<Change<Box<[u8]>>>) -> anyhow::Result<()> {
        if changes.is_empty() {
            return self.sync();
        }
        // What the changes do to the switch's entries, by key hash: an entry added, or one
        // removed (keys whose hashes collide share one).
        let mut counts: HashMap<u32, usize> =
            self.entries.iter().map(|(&h, &(_, n))| (h, n)).collect();
        let mut ops: Vec<(u32, bool)> = Vec::new();
        for change in &changes {
            match change {
                Change::Add(key) => {
                    let h = self.hash.hash(key);
                    let n = counts.entry(h).or_default();
                    *n += 1;
                    if *n == 1 {
                        ops.push((h, true));
                    }
                }
                Change::Remove(key) => {
                    let h = self.hash.hash(key);
                    let Some(n) = counts.get_mut(&h).filter(|n| **n > 0) else {
                        continue;
                    };
                    *n -= 1;
                    if *n == 0 {
                        // Added in this batch: the two cancel out.
                        match ops.iter().rposition(|&(o, _)| o == h) {
                            Some(i) if ops[i].1 => {
                                ops.remove(i);
                            }
                            _ => ops.push((h, false)),
                        }
                    }
                }
            }
        }
        if self.apply_batch(&ops).is_ok() {
            for (&h, &n) in &counts {
                if n == 0 {
                    self.entries.remove(&h);
                } else if let Some(e) = self.entries.get_mut(&h) {
                    e.1 = n;
                }
            }
            return Ok(());
        }
        // Refused as a whole (an entry the switch removed itself, say): one by one, every
        // change tried, the first failure reported.
        let mut failed = None;
        for change in changes {
            let outcome = match change {
                Change::Add(key) => {
                    let h = self.hash.hash(&key);
                    if let Some((_, n)) = self.entries.get_mut(&h) {
                        *n += 1;
                        continue;
                    }
                    self.install(h).map(|id| {
                        self.entries.insert(h, (id, 1));
                    })
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
                    self.remove(id)
                        .with_context(|| format!("no longer steering key hash {h}"))
                }
            };
            if let Err(e) = outcome {
                failed.get_or_insert(e);
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Adds (true) and removes (false) the entries of key hashes in one batch, all or
    /// nothing; the entries added are recorded with one key each.
    fn apply_batch(&mut self, ops: &[(u32, bool)]) -> anyhow::Result<()> {
        for chunk in ops.chunks(control::MAX_BATCH) {
            let changes: Vec<control::Change> = chunk
                .iter()
                .map(|&(h, add)| match add {
                    true => control::Change::Add {
                        table: STEER.into(),
                        entry: self.entry(h),
                    },
                    false => control::Change::Delete {
                        table: STEER.into(),
                        id: self.entries.get(&h).map(|e| e.0).unwrap_or_default(),
                    },
                })
                .collect();
            let ids = self.client.batch(&changes)?;
            for (&(h, add), id) in chunk.iter().zip(ids) {
                if add {
                    self.entries.insert(h, (id, 1));
                }
            }
        }
        Ok(())
    }

    /// The entry steering reads of key hash `h` here.
    fn entry(&self, h: u32) -> EntryDef {
        EntryDef {
            fields: [
                ("one_read".to_string(), control::Value::Number(1)),
                ("key_hash".to_string(), control::Value::Number(u64::from(h))),
            ]
            .into_iter()
            .collect(),
            priority: 0,
            prefix_len: None,
            actions: vec![
                ActionDef::SetIpv4Dst(self.cache),
                ActionDef::Interface(self.interface),
            ],
        }
    }

    /// Adds the entry steering reads of key hash `h` here; returns its id.
    fn install(&self, h: u32) -> anyhow::Result<u64> {
        self.client
            .add_entry(STEER, &self.entry(h))
            .with_context(|| format!("steering key hash {h}"))
    }

    /// Removes entry `id`; one already gone (the switch removed it) is not an error.
    fn remove(&self, id: u64) -> anyhow::Result<()> {
        self.client.remove_entry(STEER, id).map(|_| ())
    }

    /// Makes the switch's entries leading here those of the node's keys: an entry the
    /// switch removed (it found this node not answering, as while it was paused) is
    /// installed again, and one the node does not know of (a removal that failed) goes.
    fn sync(&mut self) -> anyhow::Result<()> {
        // Only when the switch removed steering entries since the last look (or on the
        // first): listing them all is the costly part.
        let status = self.client.call("GET", "/api/v1/status", None)?;
        let removed = status["steer"]["removed_entries"].as_u64();
        let due = self.listed.is_none_or(|t| t.elapsed() >= AUDIT_EVERY);
        if removed.is_some() && removed == self.removed_seen && !due {
            return Ok(());
        }
        let mine = ActionDef::SetIpv4Dst(self.cache);
        let there: std::collections::HashSet<u64> = self
            .client
            .table_entries(STEER)?
            .iter()
            .filter(|e| e.actions.first() == Some(&mine))
            .map(|e| e.id)
            .collect();
        let hashes: Vec<u32> = self.entries.keys().copied().collect();
        for h in hashes {
            let Some(&(id, n)) = self.entries.get(&h) else {
                continue;
            };
            if !there.contains(&id) {
                let id = self.install(h)?;
                self.entries.insert(h, (id, n));
            }
        }
        let known: std::collections::HashSet<u64> =
            self.entries.values().map(|&(id, _)| id).collect();
        for id in there.difference(&known) {
            self.remove(*id)?;
        }
        // Only once it all went through: a sync that failed is tried again.
        self.removed_seen = removed;
        self.listed = Some(Instant::now());
        Ok(())
    }
}
