//! `kvswitch bench redis --hot`: hot-key GETs over a Redis pool at a Zipf skew, through
//! `kvswitch proxy` without its cache and with it, side by side: the rate, the proxy's CPU
//! time per request, the share of the GETs the busiest server took, and the share the cache
//! answered. The clients are closed-loop, one connection each, one GET outstanding.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kv::rng::Xoshiro256StarStar;
use kv::zipf::KeyGen;
use serde::Serialize;
use testbed::local::{self, Proc};
use wire::resp::{encode_command, ReplyFramer};

use crate::measure::CpuMeter;

/// One side of the comparison, measured once.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct HotSample {
    pub cache: bool,
    pub rps: f64,
    pub cpu_us_per_request: Option<f64>,
    /// The busiest server's share of the GETs the servers executed.
    pub hottest_server_share: f64,
    /// The share of the clients' GETs the cache answered.
    pub cache_share: f64,
}

/// `kvswitch proxy --cache` over the pool file `conf`, on `listen`, its API on `api`.
pub(crate) fn start_cached(
    conf: &Path,
    dir: &Path,
    listen: SocketAddr,
    api: SocketAddr,
    workers: u32,
) -> anyhow::Result<Proc> {
    let log = dir.join("kvswitch-cache.log");
    let mut cmd = Command::new(std::env::current_exe().context("finding kvswitch itself")?);
    cmd.arg("proxy")
        .arg("--nutcracker-config")
        .arg(conf)
        .args(["--listen", &listen.to_string()])
        .args(["--workers", &workers.to_string()])
        .args(["--cache", "--api", &api.to_string()])
        .env("RUST_LOG", "warn");
    local::die_with_parent(&mut cmd);
    let mut proxy = Proc::spawn_logged("kvswitch proxy --cache", &mut cmd, &log)?;
    proxy.wait_listening(listen, Some(&log))?;
    Ok(proxy)
}

/// Writes `keys` keys (`key:0` ...) with 32-byte values through `addr`, pipelined.
pub(crate) fn preload(addr: SocketAddr, keys: u64) -> anyhow::Result<()> {
    let mut conn = Conn::open(addr)?;
    let value = "v".repeat(32);
    for chunk in (0..keys).collect::<Vec<_>>().chunks(500) {
        let mut out = Vec::new();
        for i in chunk {
            encode_command(&["SET", &format!("key:{i}"), &value], &mut out);
        }
        conn.stream.write_all(&out)?;
        for _ in chunk {
            let reply = conn.reply()?;
            if reply != b"+OK\r\n" {
                bail!("preloading: {}", String::from_utf8_lossy(&reply));
            }
        }
    }
    Ok(())
}

/// GETs executed by each server so far (`INFO commandstats`).
pub(crate) fn server_gets(servers: &[SocketAddr]) -> anyhow::Result<Vec<u64>> {
    servers
        .iter()
        .map(|&addr| {
            let mut conn = Conn::open(addr)?;
            let mut out = Vec::new();
            encode_command(&["INFO", "commandstats"], &mut out);
            conn.stream.write_all(&out)?;
            let reply = String::from_utf8_lossy(&conn.reply()?).into_owned();
            Ok(reply
                .lines()
                .find_map(|l| l.strip_prefix("cmdstat_get:calls="))
                .and_then(|rest| rest.split(',').next()?.parse().ok())
                .unwrap_or(0))
        })
        .collect()
}

/// `clients` closed-loop clients sending GETs of Zipf-chosen keys to `addr` for `secs`.
pub(crate) fn measure(
    addr: SocketAddr,
    proxy_pid: u32,
    servers: &[SocketAddr],
    cache_hits: impl Fn() -> u64,
    (clients, keys, theta, secs): (u32, u64, f64, f64),
    cache: bool,
) -> anyhow::Result<HotSample> {
    let gen = KeyGen::new(keys, theta, true);
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let before = server_gets(servers)?;
    let hits_before = cache_hits();
    let cpu = CpuMeter::start(proxy_pid);
    let started = Instant::now();
    let failures = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..clients)
            .map(|c| {
                let (gen, stop, done) = (&gen, &stop, &done);
                scope.spawn(move || -> anyhow::Result<()> {
                    let mut rng = Xoshiro256StarStar::seed_from_u64(0x407 + u64::from(c));
                    let mut conn = Conn::open(addr)?;
                    let mut out = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        out.clear();
                        let key = format!("key:{}", gen.next_index(&mut rng));
                        encode_command(&["GET", &key], &mut out);
                        conn.stream.write_all(&out)?;
                        let reply = conn.reply()?;
                        if !reply.starts_with(b"$") {
                            bail!("GET {key}: {}", String::from_utf8_lossy(&reply));
                        }
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(())
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
        handles
            .into_iter()
            .filter_map(|h| h.join().ok().and_then(|r| r.err()))
            .collect::<Vec<_>>()
    });
    if let Some(e) = failures.into_iter().next() {
        return Err(e);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let n = done.load(Ordering::Relaxed);
    let after = server_gets(servers)?;
    let per_server: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    let served: u64 = per_server.iter().sum();
    let hottest = per_server.iter().copied().max().unwrap_or(0);
    let hits = cache_hits().saturating_sub(hits_before);
    Ok(HotSample {
        cache,
        rps: n as f64 / elapsed,
        cpu_us_per_request: cpu.per_request(n),
        hottest_server_share: if served == 0 {
            0.0
        } else {
            hottest as f64 / served as f64
        },
        cache_share: if n == 0 { 0.0 } else { hits as f64 / n as f64 },
    })
}

/// A client connection, replies framed as they come.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    fn open(addr: SocketAddr) -> anyhow::Result<Conn> {
        let stream = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        Ok(Conn {
            stream,
            buf: Vec::new(),
        })
    }

    fn reply(&mut self) -> anyhow::Result<Vec<u8>> {
        let mut framer = ReplyFramer::default();
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(n) = framer.reply_len(&self.buf).context("a broken reply")? {
                return Ok(self.buf.drain(..n).collect());
            }
            let n = self.stream.read(&mut chunk).context("reading a reply")?;
            if n == 0 {
                bail!("the connection closed");
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}
