//! TCP: an acceptor and one thread per connection. Over capacity a request waits for its
//! token; replies already produced are sent first so that a pipelining client is not held back.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::session::{step, Step};
use crate::store::bump;
use crate::text::After;
use crate::Shared;

/// How often blocked threads look at the stop flag.
const POLL: Duration = Duration::from_millis(50);

/// A connection whose unparsed input grows past this is closed (a multi-get line bigger than
/// any client sends, or a binary body announced and never completed).
const MAX_PENDING: usize = 64 * 1024 * 1024;

pub(crate) fn spawn(listener: TcpListener, shared: Arc<Shared>) -> anyhow::Result<JoinHandle<()>> {
    listener
        .set_nonblocking(true)
        .context("failed to make the listener non-blocking")?;
    thread::Builder::new()
        .name("node-accept".into())
        .spawn(move || accept(listener, shared))
        .context("failed to start the acceptor")
}

fn accept(listener: TcpListener, shared: Arc<Shared>) {
    while !shared.stopping() {
        match listener.accept() {
            Ok((stream, _)) => {
                let shared = shared.clone();
                let spawned = thread::Builder::new()
                    .name("node-conn".into())
                    .spawn(move || serve(stream, &shared));
                if let Err(e) = spawned {
                    tracing::warn!("failed to start a connection thread: {e}");
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(5)),
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                thread::sleep(POLL);
            }
        }
    }
}

fn serve(mut stream: TcpStream, shared: &Shared) {
    let counters = &shared.store.counters;
    bump(&counters.total_connections);
    bump(&counters.curr_connections);
    if let Err(e) = connection(&mut stream, shared) {
        tracing::debug!("connection closed: {e}");
    }
    counters.curr_connections.fetch_sub(1, Ordering::Relaxed);
}

fn connection(stream: &mut TcpStream, shared: &Shared) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(POLL))?;
    let mut input = Vec::with_capacity(16 * 1024);
    let mut out = Vec::with_capacity(16 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    let mut writer = stream.try_clone()?;
    let mut admit = |out: &mut Vec<u8>| {
        let Some(bucket) = &shared.bucket else {
            return true;
        };
        let wait = bucket
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .reserve(Instant::now());
        if !wait.is_zero() {
            bump(&shared.store.counters.capacity_delays);
            if !out.is_empty() && writer.write_all(out).is_ok() {
                out.clear();
            }
            thread::sleep(wait);
        }
        true
    };
    loop {
        if shared.stopping() {
            return Ok(());
        }
        let n = match stream.read(&mut chunk) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        input.extend_from_slice(&chunk[..n]);
        let mut at = 0;
        let mut close = false;
        while at < input.len() {
            let Some(Step { consumed, after }) =
                step(&shared.store, &input[at..], &mut out, &mut admit)
            else {
                break;
            };
            at += consumed;
            if after == After::Close {
                close = true;
                break;
            }
        }
        input.drain(..at);
        if !out.is_empty() {
            stream.write_all(&out)?;
            out.clear();
        }
        if close || input.len() > MAX_PENDING {
            return Ok(());
        }
    }
}
