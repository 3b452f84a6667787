//! TCP: an acceptor and one thread per connection. Over capacity a request waits for its
//! token; replies already produced are sent first so that a pipelining client is not held back.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::Context;

use wire::memcache::binary::REQUEST_MAGIC;
use wire::memcache::MAX_LINE_LEN;

use crate::Shared;
use store::session::{step, Step};
use store::text::After;
use store::SPILL_AT;
use store::{bump, read, ITEM_SIZE_MAX};

/// How often blocked threads look at the stop flag.
const POLL: Duration = Duration::from_millis(50);

/// A connection whose unparsed input grows past this is closed (a multi-get line bigger than
/// any client sends, or a binary body announced and never completed). Room for the largest
/// item and a generous command line.
const MAX_PENDING: usize = 2 * 1024 * 1024 + ITEM_SIZE_MAX;

/// Connections served at once; more are accepted and closed straight away.
pub const MAX_CONNECTIONS: u64 = 4096;

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
    // Joined when the node stops, so that no connection outlives it.
    let mut connections: Vec<JoinHandle<()>> = Vec::new();
    while !shared.stopping() {
        connections.retain(|c| !c.is_finished());
        match listener.accept() {
            Ok((stream, _)) => {
                let counters = &shared.store.counters;
                if read(&counters.curr_connections) >= MAX_CONNECTIONS {
                    tracing::debug!("refused a connection: {MAX_CONNECTIONS} already open");
                    drop(stream);
                    continue;
                }
                // Counted here, before the thread starts, so that a burst of connections cannot
                // overshoot the cap.
                bump(&counters.total_connections);
                bump(&counters.curr_connections);
                let thread_shared = shared.clone();
                let spawned = thread::Builder::new()
                    .name("node-conn".into())
                    .spawn(move || serve(stream, &thread_shared));
                match spawned {
                    Ok(c) => connections.push(c),
                    Err(e) => {
                        counters.curr_connections.fetch_sub(1, Ordering::Relaxed);
                        tracing::warn!("failed to start a connection thread: {e}");
                    }
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(5)),
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                thread::sleep(POLL);
            }
        }
    }
    drop(listener);
    for c in connections {
        let _ = c.join();
    }
}

fn serve(mut stream: TcpStream, shared: &Shared) {
    let counters = &shared.store.counters;
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
    let mut spill_writer = stream.try_clone()?;
    // A long multi-get is sent as it is produced rather than held whole.
    let mut spill = |out: &mut Vec<u8>| {
        if spill_writer.write_all(out).is_err() {
            return false;
        }
        out.clear();
        true
    };
    // Bytes at the front of `input` known to hold no `\n`, once they are a long multi-get
    // line still arriving: it is only parsed again once its end has come.
    let mut partial_line = 0;
    // Bytes of a refused request still to be thrown away as they arrive.
    let mut skip = 0usize;
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
        let mut fresh = &chunk[..n];
        if skip > 0 {
            let dropped = skip.min(fresh.len());
            skip -= dropped;
            fresh = &fresh[dropped..];
        }
        input.extend_from_slice(fresh);
        if partial_line > 0 && !input[partial_line..].contains(&b'\n') {
            partial_line = input.len();
            if input.len() > MAX_PENDING {
                return Ok(());
            }
            continue;
        }
        let mut at = 0;
        let mut close = false;
        while at < input.len() {
            let Some(Step {
                consumed,
                skip: to_skip,
                after,
            }) = step(
                &shared.store,
                &input[at..],
                &mut out,
                &mut admit,
                &mut spill,
                shared.hooks.as_deref(),
            )
            else {
                break;
            };
            // A step that uses no bytes would repeat forever on the same input.
            if after == After::Close || consumed == 0 {
                close = true;
                break;
            }
            at += consumed;
            if to_skip > 0 {
                let here = to_skip.min(input.len() - at);
                at += here;
                skip = to_skip - here;
            }
            if out.len() > SPILL_AT {
                stream.write_all(&out)?;
                out.clear();
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
        partial_line = long_partial_line(&input);
    }
}

/// The length of `input` if it is the start of a text line of [`MAX_LINE_LEN`] bytes or more
/// that has not ended, else 0. The parser has already accepted such a line as a multi-get, a
/// decision taken on its first [`MAX_LINE_LEN`] bytes, and will wait until its `\n` arrives.
fn long_partial_line(input: &[u8]) -> usize {
    let long_text = input.len() >= MAX_LINE_LEN && input.first() != Some(&REQUEST_MAGIC);
    if long_text && !input.contains(&b'\n') {
        input.len()
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_long_unfinished_text_lines_are_left_unscanned() {
        let mut line = b"get ".to_vec();
        line.resize(MAX_LINE_LEN, b'k');
        assert_eq!(long_partial_line(&line), line.len());
        assert_eq!(long_partial_line(&line[..MAX_LINE_LEN - 1]), 0);
        line.extend_from_slice(b"\r\n");
        assert_eq!(long_partial_line(&line), 0);
        let mut binary = vec![REQUEST_MAGIC];
        binary.resize(MAX_LINE_LEN * 2, 0);
        assert_eq!(long_partial_line(&binary), 0);
    }
}
