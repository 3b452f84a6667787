//! UDP: workers sharing one socket. Each datagram carries memcached's 8-byte frame header; a
//! datagram that finds the token bucket empty is dropped and counted, never queued.

use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::Context;
use wire::mcudp::{self, Header};

use crate::session::{step, Step};
use crate::store::bump;
use crate::text::After;
use crate::Shared;

/// How often blocked workers look at the stop flag.
const POLL: Duration = Duration::from_millis(50);

pub(crate) fn spawn(socket: UdpSocket, shared: Arc<Shared>) -> anyhow::Result<JoinHandle<()>> {
    socket
        .set_read_timeout(Some(POLL))
        .context("failed to set the udp read timeout")?;
    thread::Builder::new()
        .name("node-udp".into())
        .spawn(move || serve(&socket, &shared))
        .context("failed to start a udp worker")
}

fn serve(socket: &UdpSocket, shared: &Shared) {
    let mut datagram = vec![0u8; 64 * 1024];
    let mut out = Vec::with_capacity(64 * 1024);
    while !shared.stopping() {
        let (n, peer) = match socket.recv_from(&mut datagram) {
            Ok(received) => received,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(e) => {
                tracing::debug!("udp receive failed: {e}");
                continue;
            }
        };
        let Ok((header, payload)) = Header::parse(&datagram[..n]) else {
            continue;
        };
        if !header.is_valid_request() {
            continue;
        }
        if let Some(bucket) = &shared.bucket {
            let admitted = bucket
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .try_take(Instant::now());
            if !admitted {
                bump(&shared.store.counters.capacity_drops);
                continue;
            }
        }
        out.clear();
        execute(shared, payload, &mut out);
        if let Err(e) = reply(socket, peer, header.request_id, &out) {
            tracing::debug!("udp send to {peer} failed: {e}");
        }
    }
}

/// Executes every whole request in the payload; a trailing partial request is ignored.
fn execute(shared: &Shared, payload: &[u8], out: &mut Vec<u8>) {
    let mut at = 0;
    while at < payload.len() {
        match step(&shared.store, &payload[at..], out, &mut |_| true) {
            Some(Step { consumed, after }) => {
                at += consumed;
                if after == After::Close || consumed == 0 {
                    break;
                }
            }
            None => break,
        }
    }
}

/// Sends `message` as one UDP message: datagrams of at most `MAX_PAYLOAD` bytes, numbered
/// `0..total`. An empty message (every request was quiet) sends nothing.
fn reply(
    socket: &UdpSocket,
    peer: SocketAddr,
    request_id: u16,
    message: &[u8],
) -> std::io::Result<()> {
    if message.is_empty() {
        return Ok(());
    }
    let total = mcudp::datagram_count(message.len());
    let Ok(total) = u16::try_from(total) else {
        return Ok(());
    };
    let mut datagram = Vec::with_capacity(mcudp::LEN + mcudp::MAX_PAYLOAD);
    for (seq, piece) in message.chunks(mcudp::MAX_PAYLOAD).enumerate() {
        datagram.clear();
        datagram.resize(mcudp::LEN, 0);
        let header = Header {
            request_id,
            seq: seq as u16,
            total,
            reserved: 0,
        };
        header.emit(&mut datagram);
        datagram.extend_from_slice(piece);
        socket.send_to(&datagram, peer)?;
    }
    Ok(())
}
