//! `kvswitch ctl`: one sub-command per call of the control API, tables for people and
//! `--json` for scripts, spoken with [`api::client::Client`].

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use serde_json::{json, Value};

#[derive(Args, Debug)]
#[command(about = "Read and change a running kvswitch through its control API")]
pub struct CtlArgs {
    #[command(flatten)]
    pub switch: api::ApiArgs,
    /// Print the API's JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: CtlCmd,
}

#[derive(Subcommand, Debug)]
pub enum CtlCmd {
    /// Version, mode, VIP, pool and counters.
    Status,
    /// List every table in processing order.
    Tables,
    /// Show, create or delete one table.
    Table {
        #[command(subcommand)]
        action: TableCmd,
    },
    /// List a table's entries with their hits.
    Entries { table: String },
    /// Add, change or delete one entry.
    Entry {
        #[command(subcommand)]
        action: EntryCmd,
    },
    /// Apply a file of changes all or nothing: {"changes": [{"op": "add", ...}, ...]}.
    Batch { file: PathBuf },
    /// The named lookup-key fields and the key of `acl`.
    Fields,
    /// Per-port packets, bytes, transmit drops and egress queues.
    Ports,
    /// Give a port an egress queue with a rate (bits/s; 0 sends at once again) and a depth.
    Egress {
        port: u16,
        #[arg(long)]
        rate_bps: u64,
        #[arg(long)]
        depth_bytes: Option<u64>,
    },
    /// The counters of operators' `count` actions.
    Counters,
    /// Delete a counter that no `count` action feeds any more.
    Counter {
        #[command(subcommand)]
        action: CounterCmd,
    },
    /// The interface table: destination MAC, source MAC and port that `interface:N` actions
    /// send through.
    Interfaces,
    /// Set or delete one entry of the interface table.
    Interface {
        #[command(subcommand)]
        action: InterfaceCmd,
    },
    /// The multicast group table: the ports and interfaces a `multicast:N` action copies a
    /// frame to.
    Groups,
    /// Set or delete one entry of the multicast group table.
    Group {
        #[command(subcommand)]
        action: GroupCmd,
    },
    /// The user registers (user0 to user63) and the ports' figures (port<N>.<figure>).
    Registers,
    /// Read or write one register.
    Register {
        #[command(subcommand)]
        action: RegisterCmd,
    },
    /// Send a frame out of a port, or take the frames entries sent to the CPU.
    Packet {
        #[command(subcommand)]
        action: PacketCmd,
    },
    /// The pool: each server, its weight and whether it is in the ring; or add, remove or
    /// reweight a server while traffic flows.
    Pool {
        #[command(subcommand)]
        action: Option<PoolCmd>,
        /// The pool, when the proxy serves several.
        #[arg(long)]
        pool: Option<String>,
    },
    /// Read the configuration file again and apply its servers and weights (as SIGHUP does).
    Reload,
    /// The cache, or pin, unpin or evict a key (as `kvswitch cache`).
    Cache(crate::cache_cli::CacheCmd),
}

#[derive(Subcommand, Debug)]
pub enum TableCmd {
    Show {
        name: String,
    },
    /// Create a table after every existing one.
    Create {
        name: String,
        /// exact, lpm or ternary.
        #[arg(long)]
        kind: String,
        /// Key fields, comma-separated names (see `kvswitch ctl fields`), or
        /// NAME@OFFSET:LEN for a byte range of the frame.
        #[arg(long, value_delimiter = ',', required = true)]
        key: Vec<String>,
        /// Actions on a miss (as for `entry add --action`); none drops.
        #[arg(long = "miss")]
        miss: Vec<String>,
        /// Most entries.
        #[arg(long)]
        size: Option<usize>,
    },
    Delete {
        name: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum EntryCmd {
    /// Add an entry: --match FIELD=VALUE (a number, an address, 0xHEX, text:TEXT, or
    /// VALUE/MASK) and --action ACTION (output:PORT, flood, drop, to_cpu, mirror,
    /// count:NAME, goto:TABLE, set_eth_dst:MAC, set_eth_src:MAC, set_ipv4_dst:IP,
    /// set_ipv4_src:IP, set_dscp:N, dec_ttl, interface:ID, multicast:GROUP, set_reg:REG=VALUE,
    /// load_reg:REG=REGISTER, add_register:REGISTER=VALUE).
    Add {
        table: String,
        #[arg(long = "match")]
        fields: Vec<String>,
        #[arg(long = "action")]
        actions: Vec<String>,
        #[arg(long, default_value_t = 0)]
        priority: u32,
        #[arg(long)]
        prefix_len: Option<u16>,
    },
    /// Replace an entry's actions.
    Set {
        table: String,
        id: u64,
        #[arg(long = "action")]
        actions: Vec<String>,
    },
    Delete {
        table: String,
        id: u64,
    },
}

#[derive(Subcommand, Debug)]
pub enum PoolCmd {
    /// Add a server (IP:PORT): only the keys ketama gives it move.
    Add {
        addr: SocketAddr,
        #[arg(long, default_value_t = 1)]
        weight: u32,
        /// nutcracker's server name (hashed instead of host:port).
        #[arg(long)]
        name: Option<String>,
        /// The host as ketama hashes it (default: the address's IP).
        #[arg(long)]
        host: Option<String>,
        /// Warm it up for this many milliseconds: a get through the proxy that misses on it
        /// is also asked of the server that held the key before, and the item found stored.
        #[arg(long)]
        warm_ms: Option<u64>,
    },
    /// Remove a server (its label, ring name or position).
    Remove { server: String },
    /// Give a server a new weight.
    Weight { server: String, weight: u32 },
}

#[derive(Subcommand, Debug)]
pub enum InterfaceCmd {
    /// Add or replace interface ID; every action naming it follows at once.
    Set {
        id: u16,
        #[arg(long)]
        eth_dst: String,
        #[arg(long)]
        eth_src: String,
        #[arg(long)]
        port: u16,
    },
    /// Delete interface ID (refused while an action names it).
    Delete { id: u16 },
}

#[derive(Subcommand, Debug)]
pub enum GroupCmd {
    /// Add or replace group ID: a copy of each frame for every MEMBER, in order (port:N out
    /// of port N as the frame is, interface:N through interface N); every action naming the
    /// group follows at once. A member on the port a frame came in by gets no copy.
    Set {
        id: u16,
        #[arg(required = true, value_name = "MEMBER")]
        members: Vec<String>,
    },
    /// Delete group ID (refused while an action names it).
    Delete { id: u16 },
}

#[derive(Subcommand, Debug)]
pub enum CounterCmd {
    /// Delete counter NAME (refused while a `count` action feeds it); named again, it counts
    /// from zero.
    Delete { name: String },
}

#[derive(Subcommand, Debug)]
pub enum RegisterCmd {
    Show {
        name: String,
    },
    /// Write a user register.
    Set {
        name: String,
        value: u64,
    },
}

#[derive(Subcommand, Debug)]
pub enum PacketCmd {
    /// Send FRAME (hex) out of PORT.
    Send { port: u16, frame: String },
    /// Take up to --max frames handed to the CPU, waiting up to --wait-ms for one.
    Recv {
        #[arg(long, default_value_t = 100)]
        max: usize,
        #[arg(long, default_value_t = 0)]
        wait_ms: u64,
    },
    /// Print the frames handed to the CPU as they come, one a line, until --count frames,
    /// --ms milliseconds or Ctrl-C.
    Watch {
        #[arg(long)]
        count: Option<u64>,
        /// Stop after this many milliseconds.
        #[arg(long)]
        ms: Option<u64>,
    },
}

/// One action as `--action` writes it, as the API's JSON.
pub fn action(text: &str) -> anyhow::Result<Value> {
    let (name, arg) = match text.split_once(':') {
        Some((n, a)) => (n, Some(a)),
        None => (text, None),
    };
    Ok(match (name, arg) {
        ("flood" | "drop" | "to_cpu" | "mirror" | "dec_ttl" | "pop_label", None) => json!(name),
        ("push_label" | "swap_label", Some(l)) => {
            json!({ name: l.parse::<u32>().with_context(|| format!("{text}: an MPLS label, 0 to 1048575"))? })
        }
        ("strip_udp_payload", Some(n)) => {
            json!({ name: n.parse::<u16>().with_context(|| format!("{text}: a number of bytes, even, 2 to 256"))? })
        }
        ("output", Some(p)) => {
            json!({ "output": p.parse::<u16>().with_context(|| format!("{text}: a port number"))? })
        }
        (
            "count" | "goto" | "set_eth_dst" | "set_eth_src" | "set_ipv4_dst" | "set_ipv4_src",
            Some(a),
        ) => json!({ name: a }),
        ("interface", Some(n)) => {
            json!({ "interface": n.parse::<u16>().with_context(|| format!("{text}: an interface id"))? })
        }
        ("multicast", Some(n)) => {
            json!({ "multicast": n.parse::<u16>().with_context(|| format!("{text}: a multicast group id"))? })
        }
        ("set_dscp", Some(n)) => {
            json!({ "set_dscp": n.parse::<u8>().with_context(|| format!("{text}: a DSCP, 0 to 63"))? })
        }
        ("impair", Some(a)) => {
            let mut def = serde_json::Map::new();
            for part in a.split(',') {
                let (k, v) = part
                    .split_once('=')
                    .with_context(|| format!("{text}: write impair:drop_ppm=N,delay_us=N,..."))?;
                if ![
                    "drop_ppm",
                    "duplicate_ppm",
                    "reorder_ppm",
                    "delay_us",
                    "reorder_us",
                ]
                .contains(&k)
                {
                    bail!(
                        "{text}: {k:?} is not drop_ppm, duplicate_ppm, reorder_ppm, delay_us \
                         or reorder_us"
                    );
                }
                let n: u32 = v
                    .parse()
                    .with_context(|| format!("{text}: {v:?} is not a number"))?;
                def.insert(k.to_string(), json!(n));
            }
            json!({ "impair": def })
        }
        ("set_reg" | "load_reg" | "add_register", Some(a)) => {
            let (left, right) = a
                .split_once('=')
                .with_context(|| format!("{text}: write {name}:A=B"))?;
            let number = |s: &str| {
                s.parse::<u64>()
                    .with_context(|| format!("{text}: {s:?} is not a number"))
            };
            let (left, right) = (number(left)?, number(right)?);
            match name {
                "set_reg" => json!({ name: { "reg": left, "value": right } }),
                "load_reg" => json!({ name: { "reg": left, "register": right } }),
                _ => json!({ name: { "register": left, "value": right } }),
            }
        }
        _ => bail!(
            "{text:?} is not an action: output:PORT, flood, drop, to_cpu, mirror, count:NAME, \
             goto:TABLE, set_eth_dst:MAC, set_eth_src:MAC, set_ipv4_dst:IP, set_ipv4_src:IP, \
             set_dscp:N, dec_ttl, interface:ID, multicast:GROUP, set_reg:REG=VALUE, \
             load_reg:REG=REGISTER, add_register:REGISTER=VALUE, push_label:LABEL, pop_label, swap_label:LABEL, \
             strip_udp_payload:BYTES, impair:drop_ppm=N,duplicate_ppm=N,reorder_ppm=N,delay_us=N,reorder_us=N"
        ),
    })
}

/// One `--match FIELD=VALUE` as (field, the API's JSON value).
pub fn match_field(text: &str) -> anyhow::Result<(String, Value)> {
    let (field, value) = text
        .split_once('=')
        .with_context(|| format!("{text:?}: write FIELD=VALUE"))?;
    let one = |v: &str| -> Value {
        if let Some(t) = v.strip_prefix("text:") {
            return json!({ "text": t });
        }
        match v.parse::<u64>() {
            Ok(n) => json!(n),
            Err(_) => json!(v),
        }
    };
    let value = match value.split_once('/') {
        Some((v, m)) if !value.starts_with("text:") => json!({ "value": one(v), "mask": one(m) }),
        _ => one(value),
    };
    Ok((field.to_string(), value))
}

/// A key field as `--key` writes it: a name, or NAME@OFFSET:LEN.
fn key_field(text: &str) -> anyhow::Result<Value> {
    match text.split_once('@') {
        None => Ok(json!(text)),
        Some((name, range)) => {
            let (offset, len) = range
                .split_once(':')
                .with_context(|| format!("{text:?}: write NAME@OFFSET:LEN"))?;
            Ok(json!({
                "name": name,
                "offset": offset.parse::<u16>().with_context(|| format!("{text:?}: offset"))?,
                "len": len.parse::<u8>().with_context(|| format!("{text:?}: length"))?,
            }))
        }
    }
}

/// Runs `kvswitch ctl`.
pub fn run(args: &CtlArgs) -> anyhow::Result<()> {
    let client = args.switch.client()?;
    let enc = |s: &str| api::percent_encode(s.as_bytes());
    let (doc, show): (Value, fn(&Value) -> String) = match &args.command {
        CtlCmd::Status => (client.call("GET", "/api/v1/status", None)?, pretty),
        CtlCmd::Tables => (client.call("GET", "/api/v1/tables", None)?, show_tables),
        CtlCmd::Table { action: cmd } => match cmd {
            TableCmd::Show { name } => (
                client.call("GET", &format!("/api/v1/tables/{}", enc(name)), None)?,
                |t| show_tables(&json!({ "tables": [t] })),
            ),
            TableCmd::Create {
                name,
                kind,
                key,
                miss,
                size,
            } => {
                let def = json!({
                    "name": name,
                    "kind": kind,
                    "key": key.iter().map(|k| key_field(k)).collect::<anyhow::Result<Vec<_>>>()?,
                    "miss": miss.iter().map(|a| action(a)).collect::<anyhow::Result<Vec<_>>>()?,
                    "size": size,
                });
                (client.call("POST", "/api/v1/tables", Some(&def))?, |t| {
                    format!("created table {}\n", t["name"].as_str().unwrap_or("?"))
                })
            }
            TableCmd::Delete { name } => (
                client.call("DELETE", &format!("/api/v1/tables/{}", enc(name)), None)?,
                |_| "deleted\n".to_string(),
            ),
        },
        CtlCmd::Entries { table } => {
            // A page at a time, as the API hands them out.
            let mut all = Vec::new();
            let mut after: Option<u64> = None;
            loop {
                let query = after.map_or(String::new(), |a| format!("?after={a}"));
                let page = client.call(
                    "GET",
                    &format!("/api/v1/tables/{}/entries{query}", enc(table)),
                    None,
                )?;
                all.extend(page["entries"].as_array().cloned().unwrap_or_default());
                match page["next"].as_u64() {
                    Some(n) => after = Some(n),
                    None => break,
                }
            }
            (json!({ "entries": all }), show_entries)
        }
        CtlCmd::Entry { action: cmd } => match cmd {
            EntryCmd::Add {
                table,
                fields,
                actions,
                priority,
                prefix_len,
            } => {
                let fields: serde_json::Map<String, Value> = fields
                    .iter()
                    .map(|f| match_field(f))
                    .collect::<anyhow::Result<_>>()?;
                let mut entry = json!({
                    "match": fields,
                    "priority": priority,
                    "actions": actions.iter().map(|a| action(a)).collect::<anyhow::Result<Vec<_>>>()?,
                });
                if let Some(p) = prefix_len {
                    entry["prefix_len"] = json!(p);
                }
                (
                    client.call(
                        "POST",
                        &format!("/api/v1/tables/{}/entries", enc(table)),
                        Some(&entry),
                    )?,
                    |r| format!("added entry {}\n", r["id"]),
                )
            }
            EntryCmd::Set { table, id, actions } => {
                let body = json!({
                    "actions": actions.iter().map(|a| action(a)).collect::<anyhow::Result<Vec<_>>>()?,
                });
                (
                    client.call(
                        "PUT",
                        &format!("/api/v1/tables/{}/entries/{id}", enc(table)),
                        Some(&body),
                    )?,
                    |r| format!("changed entry {}\n", r["id"]),
                )
            }
            EntryCmd::Delete { table, id } => (
                client.call(
                    "DELETE",
                    &format!("/api/v1/tables/{}/entries/{id}", enc(table)),
                    None,
                )?,
                |_| "deleted\n".to_string(),
            ),
        },
        CtlCmd::Batch { file } => {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("reading {}", file.display()))?;
            let body: Value = serde_json::from_str(&text)
                .with_context(|| format!("{}: not JSON", file.display()))?;
            (client.call("POST", "/api/v1/batch", Some(&body))?, |r| {
                format!("applied {} changes\n", r["applied"])
            })
        }
        CtlCmd::Fields => (client.call("GET", "/api/v1/fields", None)?, show_fields),
        CtlCmd::Ports => (client.call("GET", "/api/v1/ports", None)?, show_ports),
        CtlCmd::Egress {
            port,
            rate_bps,
            depth_bytes,
        } => (
            client.call(
                "PUT",
                &format!("/api/v1/ports/{port}/egress"),
                Some(&json!({ "rate_bps": rate_bps, "depth_bytes": depth_bytes })),
            )?,
            |r| {
                format!(
                    "port {}: {} bits/s, {} bytes deep\n",
                    r["port"], r["rate_bps"], r["depth_bytes"]
                )
            },
        ),
        CtlCmd::Counters => (client.call("GET", "/api/v1/counters", None)?, |d| {
            listing(&d["counters"], &["name", "packets", "bytes"])
        }),
        CtlCmd::Counter {
            action: CounterCmd::Delete { name },
        } => (
            client.call("DELETE", &format!("/api/v1/counters/{name}"), None)?,
            |_| "deleted\n".to_string(),
        ),
        CtlCmd::Interfaces => (client.call("GET", "/api/v1/interfaces", None)?, |d| {
            listing(
                &d["interfaces"],
                &["id", "eth_dst", "eth_src", "port", "used_by"],
            )
        }),
        CtlCmd::Interface { action: cmd } => match cmd {
            InterfaceCmd::Set {
                id,
                eth_dst,
                eth_src,
                port,
            } => (
                client.call(
                    "PUT",
                    &format!("/api/v1/interfaces/{id}"),
                    Some(&json!({ "eth_dst": eth_dst, "eth_src": eth_src, "port": port })),
                )?,
                |i| {
                    format!(
                        "interface {}: to {} from {} out of port {}\n",
                        i["id"],
                        cell(&i["eth_dst"]),
                        cell(&i["eth_src"]),
                        i["port"]
                    )
                },
            ),
            InterfaceCmd::Delete { id } => (
                client.call("DELETE", &format!("/api/v1/interfaces/{id}"), None)?,
                |_| "deleted\n".to_string(),
            ),
        },
        CtlCmd::Groups => (client.call("GET", "/api/v1/groups", None)?, |d| {
            rows(
                &["id", "members", "used_by"],
                d["groups"].as_array().into_iter().flatten().map(|g| {
                    vec![
                        cell(&g["id"]),
                        members_text(&g["members"]),
                        cell(&g["used_by"]),
                    ]
                }),
            )
        }),
        CtlCmd::Group { action: cmd } => match cmd {
            GroupCmd::Set { id, members } => {
                let members = members
                    .iter()
                    .map(|m| member(m))
                    .collect::<anyhow::Result<Vec<Value>>>()?;
                (
                    client.call(
                        "PUT",
                        &format!("/api/v1/groups/{id}"),
                        Some(&json!({ "members": members })),
                    )?,
                    |g| format!("group {}: {}\n", g["id"], members_text(&g["members"])),
                )
            }
            GroupCmd::Delete { id } => (
                client.call("DELETE", &format!("/api/v1/groups/{id}"), None)?,
                |_| "deleted\n".to_string(),
            ),
        },
        CtlCmd::Registers => (client.call("GET", "/api/v1/registers", None)?, |d| {
            listing(&d["registers"], &["name", "value", "writable"])
        }),
        CtlCmd::Register { action: cmd } => {
            let doc = match cmd {
                RegisterCmd::Show { name } => {
                    client.call("GET", &format!("/api/v1/registers/{}", enc(name)), None)?
                }
                RegisterCmd::Set { name, value } => client.call(
                    "PUT",
                    &format!("/api/v1/registers/{}", enc(name)),
                    Some(&json!({ "value": value })),
                )?,
            };
            (doc, |r| format!("{} = {}\n", cell(&r["name"]), r["value"]))
        }
        CtlCmd::Packet { action: cmd } => match cmd {
            PacketCmd::Send { port, frame } => (
                client.call(
                    "POST",
                    "/api/v1/packets",
                    Some(&json!({ "port": port, "frame": frame })),
                )?,
                |_| "sent\n".to_string(),
            ),
            PacketCmd::Recv { max, wait_ms } => (
                client.call(
                    "GET",
                    &format!("/api/v1/packets?max={max}&wait_ms={wait_ms}"),
                    None,
                )?,
                |d| listing(&d["frames"], &["in_port", "reason", "frame"]),
            ),
            PacketCmd::Watch { count, ms } => {
                let query: Vec<String> = [("count", count), ("ms", ms)]
                    .iter()
                    .filter_map(|(k, v)| v.map(|v| format!("{k}={v}")))
                    .collect();
                let path = format!("/api/v1/packets/stream?{}", query.join("&"));
                let json = args.json;
                let mut out = std::io::stdout();
                client.stream(&path, |f| {
                    let line = match json {
                        true => f.to_string(),
                        false => format!(
                            "port {:<3} {:<10} {}",
                            cell(&f["in_port"]),
                            cell(&f["reason"]),
                            cell(&f["frame"])
                        ),
                    };
                    writeln!(out, "{line}").and_then(|_| out.flush()).is_ok()
                })?;
                return Ok(());
            }
        },
        CtlCmd::Pool { action: None, .. } => (client.call("GET", "/api/v1/pool", None)?, show_pool),
        CtlCmd::Pool {
            action: Some(cmd),
            pool,
        } => {
            let doc = match cmd {
                PoolCmd::Add {
                    addr,
                    weight,
                    name,
                    host,
                    warm_ms,
                } => client.call(
                    "POST",
                    "/api/v1/pool/servers",
                    Some(&json!({
                        "addr": addr.to_string(), "weight": weight, "name": name,
                        "host": host, "pool": pool, "warm_ms": warm_ms,
                    })),
                )?,
                PoolCmd::Remove { server } => client.call(
                    "DELETE",
                    &format!(
                        "/api/v1/pool/servers/{}{}",
                        enc(server),
                        pool.as_ref()
                            .map(|p| format!("?pool={}", enc(p)))
                            .unwrap_or_default()
                    ),
                    None,
                )?,
                PoolCmd::Weight { server, weight } => client.call(
                    "PUT",
                    &format!("/api/v1/pool/servers/{}", enc(server)),
                    Some(&json!({ "weight": weight, "pool": pool })),
                )?,
            };
            (doc, |r| {
                format!(
                    "server {} changed; pool version {}\n",
                    r["server"], r["version"]
                )
            })
        }
        CtlCmd::Reload => (client.call("POST", "/api/v1/reload", None)?, |r| {
            let pools = r["pools"].as_array().cloned().unwrap_or_default();
            pools
                .iter()
                .map(|p| {
                    format!(
                        "pool {}: {} servers, version {}\n",
                        cell(&p["pool"]),
                        p["servers"],
                        p["version"]
                    )
                })
                .collect()
        }),
        CtlCmd::Cache(cmd) => (crate::cache_cli::call(&client, cmd)?, pretty),
    };
    match args.json {
        true => println!("{}", serde_json::to_string_pretty(&doc)?),
        false => print!("{}", show(&doc)),
    }
    Ok(())
}

fn pretty(doc: &Value) -> String {
    serde_json::to_string_pretty(doc).unwrap_or_default() + "\n"
}

/// One `port:N` or `interface:N` member of a multicast group, as the API's JSON.
fn member(text: &str) -> anyhow::Result<Value> {
    let parsed = text.split_once(':').and_then(|(kind, n)| {
        let n = n.parse::<u16>().ok()?;
        ["port", "interface"]
            .contains(&kind)
            .then(|| json!({ kind: n }))
    });
    parsed.with_context(|| format!("{text:?} is not a member: write port:N or interface:N"))
}

/// A group's members as `ctl group set` takes them: `port:1 interface:3`.
fn members_text(members: &Value) -> String {
    let text: Vec<String> = members
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| {
            m.as_object()?
                .iter()
                .next()
                .map(|(k, v)| format!("{k}:{v}"))
        })
        .collect();
    text.join(" ")
}

/// A JSON value as a table cell: strings bare, the rest as JSON.
fn cell(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// Aligned columns under a header.
/// A table of the objects in `list`, one column per field, headed by the field's name.
fn listing(list: &Value, fields: &[&str]) -> String {
    rows(
        fields,
        list.as_array()
            .into_iter()
            .flatten()
            .map(|item| fields.iter().map(|f| cell(&item[*f])).collect()),
    )
}

fn rows(header: &[&str], rows: impl Iterator<Item = Vec<String>>) -> String {
    let rows: Vec<Vec<String>> = rows.collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<&str>, out: &mut String| {
        let text: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(text.join("  ").trim_end());
        out.push('\n');
    };
    line(header.to_vec(), &mut out);
    for r in &rows {
        line(r.iter().map(String::as_str).collect(), &mut out);
    }
    out
}

fn list(v: &Value) -> String {
    v.as_array()
        .map(|a| a.iter().map(cell).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn show_tables(doc: &Value) -> String {
    rows(
        &[
            "table", "kind", "owner", "entries", "size", "hits", "misses", "key", "miss",
        ],
        doc["tables"].as_array().into_iter().flatten().map(|t| {
            vec![
                cell(&t["name"]),
                cell(&t["kind"]),
                cell(&t["owner"]),
                cell(&t["entries"]),
                cell(&t["size"]),
                cell(&t["hits"]),
                cell(&t["misses"]),
                t["key"]
                    .as_array()
                    .map(|k| {
                        k.iter()
                            .map(|f| f.as_str().map_or_else(|| cell(&f["name"]), str::to_string))
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .unwrap_or_default(),
                list(&t["miss"]),
            ]
        }),
    )
}

fn show_entries(doc: &Value) -> String {
    rows(
        &["id", "priority", "hits", "match", "actions"],
        doc["entries"].as_array().into_iter().flatten().map(|e| {
            let fields = e["match"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| format!("{k}={}", cell(v)))
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default();
            let prefix = e["prefix_len"]
                .as_u64()
                .map(|p| format!(" /{p}"))
                .unwrap_or_default();
            vec![
                cell(&e["id"]),
                cell(&e["priority"]),
                cell(&e["hits"]),
                fields + &prefix,
                list(&e["actions"]),
            ]
        }),
    )
}

fn show_fields(doc: &Value) -> String {
    rows(
        &["field", "bytes", "about"],
        doc["fields"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|f| vec![cell(&f["name"]), cell(&f["width"]), cell(&f["about"])]),
    ) + &format!("acl key: {}\n", list(&doc["acl_key"]))
}

fn show_ports(doc: &Value) -> String {
    rows(
        &[
            "port",
            "name",
            "rx_packets",
            "rx_bytes",
            "tx_packets",
            "tx_bytes",
            "tx_dropped",
        ],
        doc["ports"].as_array().into_iter().flatten().map(|p| {
            [
                "port",
                "name",
                "rx_packets",
                "rx_bytes",
                "tx_packets",
                "tx_bytes",
                "tx_dropped",
            ]
            .iter()
            .map(|k| cell(&p[*k]))
            .collect()
        }),
    )
}

fn show_pool(doc: &Value) -> String {
    let mut out = String::new();
    for p in doc["pools"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "pool {}: {} / {}, version {}\n",
            cell(&p["name"]),
            cell(&p["distribution"]),
            cell(&p["hash"]),
            cell(&p["version"])
        ));
        out.push_str(&rows(
            &["server", "label", "addr", "weight", "in_ring"],
            p["servers"].as_array().into_iter().flatten().map(|s| {
                ["server", "label", "addr", "weight", "in_ring"]
                    .iter()
                    .map(|k| cell(&s[*k]))
                    .collect()
            }),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_and_matches_read_as_the_api_writes_them() {
        assert_eq!(action("output:3").unwrap(), json!({"output": 3}));
        assert_eq!(action("drop").unwrap(), json!("drop"));
        assert_eq!(action("goto:pins").unwrap(), json!({"goto": "pins"}));
        assert!(action("output:x").is_err());
        assert!(action("teleport").is_err());
        assert_eq!(action("interface:4").unwrap(), json!({"interface": 4}));
        assert_eq!(action("multicast:9").unwrap(), json!({"multicast": 9}));
        assert_eq!(member("port:2").unwrap(), json!({"port": 2}));
        assert_eq!(member("interface:7").unwrap(), json!({"interface": 7}));
        for bad in ["port", "port:x", "vlan:3", "interface:-1"] {
            assert!(member(bad).is_err(), "{bad}");
        }
        assert_eq!(
            members_text(&json!([{"port": 2}, {"interface": 7}])),
            "port:2 interface:7"
        );
        assert_eq!(
            action("impair:drop_ppm=10000,delay_us=500").unwrap(),
            json!({"impair": {"drop_ppm": 10000, "delay_us": 500}})
        );
        assert!(action("impair:loss=1").is_err());
        assert!(action("impair:drop_ppm=-1").is_err());
        assert_eq!(
            action("load_reg:3=7").unwrap(),
            json!({"load_reg": {"reg": 3, "register": 7}})
        );
        assert_eq!(
            action("add_register:8=1").unwrap(),
            json!({"add_register": {"register": 8, "value": 1}})
        );
        assert!(action("set_reg:3").is_err());
        assert_eq!(
            match_field("l4_dst=11211").unwrap(),
            ("l4_dst".into(), json!(11211))
        );
        assert_eq!(
            match_field("ip_dst=10.0.0.0/255.0.0.0").unwrap().1,
            json!({"value": "10.0.0.0", "mask": "255.0.0.0"})
        );
        assert_eq!(
            match_field("mc_request=text:get a/b").unwrap().1,
            json!({"text": "get a/b"})
        );
        assert!(match_field("nothing").is_err());
        assert_eq!(
            key_field("cmd@50:8").unwrap(),
            json!({"name": "cmd", "offset": 50, "len": 8})
        );
    }
}
