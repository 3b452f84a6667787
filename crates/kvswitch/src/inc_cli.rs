//! `kvswitch inc`: one operation of the caching fabric's client library ([`inc`]) from the
//! command line, against a memcached server behind a kvswitch fabric.

use std::net::Ipv4Addr;
use std::time::Duration;

use clap::{Args, Subcommand};

#[derive(Args, Debug)]
pub struct IncArgs {
    /// The memcached server's address (the fabric carries the request to it).
    #[arg(long, short)]
    pub server: Ipv4Addr,
    /// How long to wait for the answer, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub timeout_ms: u64,
    #[command(subcommand)]
    pub op: IncOp,
}

#[derive(Subcommand, Debug)]
pub enum IncOp {
    /// Print a key's value (exit status 1 when it has none).
    Get { key: String },
    /// Store a value.
    Set { key: String, value: String },
    /// Delete a key (exit status 1 when it had no value).
    Del { key: String },
    /// Add to a key's number; print the new number.
    Incr { key: String, delta: u64 },
    /// Set a key to a number if it holds a smaller one or none (exit status 1 when not).
    CondPut { key: String, value: u64 },
}

/// Runs the operation; `Ok(false)` when it found nothing to do (exit status 1).
pub fn run(args: &IncArgs) -> anyhow::Result<bool> {
    let mut c =
        client::fabric::Client::connect(args.server, Duration::from_millis(args.timeout_ms))?;
    Ok(match &args.op {
        IncOp::Get { key } => match c.get(key)? {
            Some(v) => {
                println!("{}", String::from_utf8_lossy(&v));
                true
            }
            None => {
                eprintln!("{key}: no value");
                false
            }
        },
        IncOp::Set { key, value } => {
            c.set(key, value.as_bytes())?;
            println!("stored");
            true
        }
        IncOp::Del { key } => {
            let found = c.del(key)?;
            println!("{}", if found { "deleted" } else { "not found" });
            found
        }
        IncOp::Incr { key, delta } => match c.increment(key, *delta)? {
            Some(n) => {
                println!("{n}");
                true
            }
            None => {
                eprintln!("{key}: no value");
                false
            }
        },
        IncOp::CondPut { key, value } => {
            let stored = c.cond_put(key, *value)?;
            println!("{}", if stored { "stored" } else { "not stored" });
            stored
        }
    })
}
