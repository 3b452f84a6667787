//! Filling the keyspace before a run, so gets hit: every key is set once to the standard value.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::frame::{Header, Push, Reassembly, HEADER_LEN};
use crate::text::{self, Op, Outcome};
use crate::worker::{tcp_connect, udp_socket};
use crate::{check_keys, Proto, Protocol};

/// Pipelined TCP: a batch is written whole, then its replies are read. Small enough that the
/// replies (8 bytes each) never fill the socket buffers while we are still writing.
const BATCH_KEYS: u64 = 512;
const BATCH_BYTES: usize = 256 * 1024;
/// How long a batch of replies, or one UDP reply, may take.
const TCP_REPLY_TIMEOUT: Duration = Duration::from_secs(10);
const UDP_REPLY_TIMEOUT: Duration = Duration::from_millis(500);
const UDP_ATTEMPTS: u32 = 5;

/// Sets every key `prefix + i`, `i` in `0..keys`, to `value_size` deterministic bytes.
///
/// Over TCP the sets are pipelined on one connection; over UDP they go one at a time, each
/// retried up to 5 times when no reply arrives within 500 ms. Returns how many sets were
/// answered `STORED`. Fails if the target cannot be reached, stops answering, or sends
/// something that is not a memcached reply.
pub fn preload(
    target: SocketAddr,
    proto: Proto,
    keys: u64,
    key_prefix: &str,
    value_size: usize,
) -> anyhow::Result<u64> {
    preload_with(target, proto, None, keys, key_prefix, value_size)
}

/// [`preload`], over TLS with `tls` (TCP).
pub fn preload_with(
    target: SocketAddr,
    proto: Proto,
    tls: Option<&std::sync::Arc<rustls::ClientConfig>>,
    keys: u64,
    key_prefix: &str,
    value_size: usize,
) -> anyhow::Result<u64> {
    check_keys(proto, Protocol::Text, keys, key_prefix, value_size)?;
    let value = text::value(value_size);
    match proto {
        Proto::Tcp => preload_tcp(target, tls, keys, key_prefix, &value),
        Proto::Udp => preload_udp(target, keys, key_prefix, &value),
    }
}

fn preload_tcp(
    target: SocketAddr,
    tls: Option<&std::sync::Arc<rustls::ClientConfig>>,
    keys: u64,
    prefix: &str,
    value: &[u8],
) -> anyhow::Result<u64> {
    let mut s = tcp_connect(target, tls)?;
    s.set_write_timeout(Some(TCP_REPLY_TIMEOUT))
        .context("failed to set write timeout")?;
    let mut req = Vec::with_capacity(BATCH_BYTES + value.len() + 300);
    let mut rbuf: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let mut stored = 0;
    let mut next = 0;
    while next < keys {
        req.clear();
        let first = next;
        while next < keys && next - first < BATCH_KEYS && req.len() < BATCH_BYTES {
            text::write_set(&mut req, prefix, next, value);
            next += 1;
        }
        s.write_all(&req)
            .with_context(|| format!("failed to send sets to {target}"))?;
        // TLS holds what it has not sent yet until flushed.
        s.flush().context("preload write")?;
        let mut pending = next - first;
        let deadline = Instant::now() + TCP_REPLY_TIMEOUT;
        while pending > 0 {
            while pending > 0 {
                let Some((outcome, used)) = text::check(Op::Set, &rbuf) else {
                    break;
                };
                match outcome {
                    Outcome::Stored => stored += 1,
                    Outcome::Malformed => bail!("{target} sent a reply that is not memcached's"),
                    _ => {}
                }
                rbuf.drain(..used);
                pending -= 1;
            }
            if pending == 0 {
                break;
            }
            if Instant::now() >= deadline {
                bail!("{target} stopped answering during preload ({pending} replies missing)");
            }
            match s.read(&mut chunk) {
                Ok(0) => bail!("{target} closed the connection during preload"),
                Ok(n) => rbuf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(e).with_context(|| format!("failed to read from {target}")),
            }
        }
    }
    Ok(stored)
}

fn preload_udp(target: SocketAddr, keys: u64, prefix: &str, value: &[u8]) -> anyhow::Result<u64> {
    let sock = udp_socket(target)?;
    sock.set_read_timeout(Some(Duration::from_millis(50)))
        .context("failed to set read timeout")?;
    let mut reassembly = Reassembly::default();
    let mut req = Vec::with_capacity(HEADER_LEN + value.len() + 300);
    let mut buf = vec![0u8; 65_536];
    let mut id: u16 = 0;
    let mut stored = 0;
    for key in 0..keys {
        let mut answered = None;
        for _ in 0..UDP_ATTEMPTS {
            id = id.wrapping_add(1);
            reassembly.expect(id);
            req.clear();
            req.resize(HEADER_LEN, 0);
            Header::single(id).emit(&mut req);
            text::write_set(&mut req, prefix, key, value);
            sock.send(&req)
                .with_context(|| format!("failed to send a set to {target}"))?;
            let deadline = Instant::now() + UDP_REPLY_TIMEOUT;
            while answered.is_none() && Instant::now() < deadline {
                let n = match sock.recv(&mut buf) {
                    Ok(n) => n,
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock
                                | std::io::ErrorKind::TimedOut
                                | std::io::ErrorKind::Interrupted
                        ) =>
                    {
                        continue
                    }
                    Err(e) => {
                        return Err(e).with_context(|| format!("failed to receive from {target}"))
                    }
                };
                if let Push::Complete(payload) = reassembly.push(&buf[..n]) {
                    answered =
                        Some(text::check(Op::Set, &payload).map_or(Outcome::Malformed, |(o, _)| o));
                }
            }
            if answered.is_some() {
                break;
            }
        }
        match answered {
            Some(Outcome::Stored) => stored += 1,
            Some(_) => {}
            None => bail!("no reply from {target} for key {key} after {UDP_ATTEMPTS} attempts"),
        }
    }
    Ok(stored)
}
