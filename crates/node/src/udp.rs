//! UDP: workers sharing one socket. Each datagram carries memcached's 8-byte frame header; a
//! datagram that finds the token bucket empty is dropped and counted, never queued.

use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use anyhow::Context;
use wire::mcudp::{self, Header};

use crate::relay::{Offer, Onward};
use crate::Shared;
use store::bump;
use store::session::{step, Step};
use store::text::{After, NO_MEMORY_GET};

/// How often blocked workers look at the stop flag.
const POLL: Duration = Duration::from_millis(50);

pub(crate) fn spawn(
    socket: UdpSocket,
    shared: Arc<Shared>,
    onward: Option<Onward>,
) -> anyhow::Result<JoinHandle<()>> {
    socket
        .set_read_timeout(Some(POLL))
        .context("failed to set the udp read timeout")?;
    thread::Builder::new()
        .name("node-udp".into())
        .spawn(move || serve(&socket, &shared, onward.as_ref()))
        .context("failed to start a udp worker")
}

fn serve(socket: &UdpSocket, shared: &Shared, onward: Option<&Onward>) {
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
        out.clear();
        let offer = onward.map(|o| o.offer(shared, payload, peer, header.request_id, &mut out));
        match offer {
            Some(Offer::Sent) => continue,
            Some(Offer::Answered) => {}
            Some(Offer::Declined) | None => execute(shared, payload, &mut out),
        }
        if let Err(e) = reply(socket, peer, header.request_id, &out) {
            tracing::debug!("udp send to {peer} failed: {e}");
        }
    }
}

/// The longest reply one UDP message can carry: its datagrams are numbered with 16 bits.
pub(crate) const MAX_MESSAGE: usize = u16::MAX as usize * mcudp::MAX_PAYLOAD;

/// Executes every whole request in the payload; a trailing partial request is ignored.
///
/// Each request takes a token from the bucket; once one finds it empty, it and the rest of the
/// datagram's requests are dropped and counted. A reply that would not fit in one message
/// ([`MAX_MESSAGE`]) is replaced with memcached's out-of-memory error and ends the datagram.
pub(crate) fn execute(shared: &Shared, payload: &[u8], out: &mut Vec<u8>) {
    let mut refused = false;
    let mut admit = |_: &mut Vec<u8>| {
        if refused {
            bump(&shared.store.counters.capacity_drops);
        } else {
            refused = !shared.udp_token();
        }
        !refused
    };
    let mut spill = |out: &mut Vec<u8>| out.len() <= MAX_MESSAGE;
    let mut at = 0;
    while at < payload.len() {
        let before = out.len();
        match step(
            &shared.store,
            &payload[at..],
            out,
            &mut admit,
            &mut spill,
            shared.hooks.as_deref(),
        ) {
            Some(Step {
                consumed, after, ..
            }) => {
                at += consumed;
                if out.len() > MAX_MESSAGE {
                    out.truncate(before);
                    out.extend_from_slice(NO_MEMORY_GET);
                    break;
                }
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
    let Some(pieces) = mcudp::pieces(request_id, message) else {
        return Ok(());
    };
    let mut datagram = Vec::with_capacity(mcudp::LEN + mcudp::MAX_PAYLOAD);
    for (header, piece) in pieces {
        datagram.clear();
        datagram.resize(mcudp::LEN, 0);
        header.emit(&mut datagram);
        datagram.extend_from_slice(piece);
        socket.send_to(&datagram, peer)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::sync::Mutex;
    use std::time::Instant;

    use super::*;
    use crate::Bucket;
    use store::{read, Mode, Store};

    fn shared(bucket: Option<Bucket>) -> Shared {
        Shared {
            store: Arc::new(Store::new(None, Box::new(crate::SystemHost::start()))),
            bucket: bucket.map(Mutex::new),
            stop: AtomicBool::new(false),
            hooks: None,
        }
    }

    #[test]
    fn each_request_takes_a_token() {
        let shared = shared(Some(Bucket::new(1, 2, Instant::now())));
        let mut out = Vec::new();
        execute(&shared, b"mn\r\nmn\r\nmn\r\nmn\r\n", &mut out);
        assert_eq!(out, b"MN\r\nMN\r\n".to_vec());
        assert_eq!(read(&shared.store.counters.capacity_drops), 2);
        assert_eq!(read(&shared.store.counters.requests), 2);
    }

    #[test]
    fn a_reply_too_long_for_one_message_is_refused() {
        let shared = shared(None);
        let value = vec![b'x'; 1_000_000];
        shared.store.store(Mode::Set, b"k", &value, 0, 0, 0);
        let keys = MAX_MESSAGE / value.len() + 2;
        let mut payload = b"get".to_vec();
        for _ in 0..keys {
            payload.extend_from_slice(b" k");
        }
        payload.extend_from_slice(b"\r\nmn\r\n");
        let mut out = Vec::new();
        execute(&shared, &payload, &mut out);
        assert_eq!(out, NO_MEMORY_GET.to_vec());
    }

    #[test]
    fn replies_up_to_one_message_are_kept() {
        let shared = shared(None);
        shared.store.store(Mode::Set, b"k", b"v", 0, 0, 0);
        let mut out = Vec::new();
        execute(&shared, b"get k k\r\nmn\r\n", &mut out);
        assert_eq!(
            out,
            b"VALUE k 0 1\r\nv\r\nVALUE k 0 1\r\nv\r\nEND\r\nMN\r\n".to_vec()
        );
    }
}
