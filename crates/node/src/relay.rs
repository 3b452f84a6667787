//! The UDP relay of a cache node on the path of every request (look-through): a request the
//! role does not answer goes on to the upstream over UDP, as its client would have sent it,
//! under a request id of the relay's own; the reply comes back to the relay's socket and goes
//! to the client under the client's id, from the node's own address.
//!
//! Nothing waits on the upstream. A request it drops (a backend over its capacity) is a reply
//! that never comes, as it would be for a client of that backend: the open request is forgotten
//! after [`WAIT`] and counted (`relay_lost`). A blocking call per request would tie a worker up
//! for each drop, and the requests queued behind it would reach their clients too late.

use std::collections::HashMap;
use std::io::ErrorKind;
use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::Context;
use wire::ethernet::Mac;
use wire::frame::{UdpEnds, PAYLOAD_OFFSET};
use wire::keymac;
use wire::mcudp::{self, Header};

use crate::Shared;
use store::bump;
use store::session::UdpPath;

/// How long a relayed request waits for its reply before it is forgotten.
pub const WAIT: Duration = Duration::from_secs(1);
/// How often the relay's thread looks at the stop flag.
const POLL: Duration = Duration::from_millis(50);

/// What became of a datagram offered to the relay.
pub(crate) enum Offer {
    /// Sent on (its reply, if any, comes back through the relay), or dropped over the node's
    /// capacity.
    Sent,
    /// The role answered it; the reply is in `out`.
    Answered,
    /// Not the relay's: execute it as usual.
    Declined,
}

/// A relayed request waiting for its reply.
#[derive(Clone, Copy, Debug)]
struct Open {
    client: SocketAddr,
    request_id: u16,
    sent: Instant,
    /// A quiet request (`noreply`, meta `q`, a quiet binary get): no reply may be its answer,
    /// so one that never comes is not counted lost.
    quiet: bool,
}

#[derive(Debug, Default)]
struct Table {
    next_id: u16,
    open: HashMap<u16, Open>,
    swept: Option<Instant>,
}

#[derive(Debug)]
pub(crate) struct Relay {
    /// Sends to the upstream and receives its replies.
    socket: UdpSocket,
    /// The node's serving socket: replies leave from the address the client asked.
    serving: UdpSocket,
    upstream: SocketAddr,
    table: Mutex<Table>,
}

/// Where the requests a cache node's role does not answer over UDP go, when not to its store.
#[derive(Clone, Debug)]
pub(crate) enum Onward {
    /// A look-through cache node's relay to its upstream.
    Relay(Arc<Relay>),
    /// A steered cache node's way back through the switch.
    Bounce(Arc<Bounce>),
}

impl Onward {
    /// Offers a datagram's payload from `client` (its request id `request_id`) to the role: a
    /// lone request the role answers, or has sent on, never reaches the store.
    pub(crate) fn offer(
        &self,
        shared: &Shared,
        payload: &[u8],
        client: SocketAddr,
        request_id: u16,
        out: &mut Vec<u8>,
    ) -> Offer {
        let Some(hooks) = shared.hooks.as_deref() else {
            return Offer::Declined;
        };
        let Ok(Some(request)) = wire::memcache::parse(payload) else {
            return Offer::Declined;
        };
        if request.bytes().len() != payload.len() {
            return Offer::Declined;
        }
        // The node's capacity covers what it answers and what it sends on alike.
        if !shared.udp_token() {
            return Offer::Sent;
        }
        match hooks.udp(&request, out) {
            UdpPath::Execute => Offer::Declined,
            UdpPath::Answered => {
                bump(&shared.store.counters.requests);
                Offer::Answered
            }
            UdpPath::SendOn => match self {
                Onward::Relay(relay) => {
                    relay.send(shared, payload, client, request_id, request.noreply());
                    Offer::Sent
                }
                Onward::Bounce(bounce) => {
                    match bounce.send(&request, payload, client, request_id) {
                        Ok(()) => {
                            bump(&shared.store.counters.bounced);
                            Offer::Sent
                        }
                        // The role's own way to the backend, over TCP.
                        Err(e) => {
                            tracing::debug!("sending a read back through the switch: {e}");
                            bump(&shared.store.counters.bounce_failed);
                            Offer::Declined
                        }
                    }
                }
            },
        }
    }
}

/// A steered cache node's way back through the switch (SwitchKV, section 3.1.2): a read it
/// cannot answer (a rule the switch still has for a key it dropped, or another key with the
/// same hash) leaves again as its client sent it, from the client's address and port, to the
/// switch's VIP, with the other prefix in the destination MAC ([`wire::keymac`]) so that no
/// steering entry takes it again. The switch routes it by key to its backend, which answers
/// the client directly; the cache node keeps nothing of it.
#[derive(Debug)]
pub(crate) struct Bounce {
    sender: kvio::FrameSender,
    vip: SocketAddrV4,
    hash: kv::HashFn,
}

impl Bounce {
    /// Sends from the interface that holds `serving`'s address (needs `CAP_NET_RAW`) to the
    /// switch at `vip`; `hash` is the switch pool's.
    pub(crate) fn new(
        serving: SocketAddr,
        vip: SocketAddr,
        hash: kv::HashFn,
    ) -> anyhow::Result<Bounce> {
        let (SocketAddr::V4(serving), SocketAddr::V4(vip)) = (serving, vip) else {
            anyhow::bail!("sending reads back through the switch needs IPv4 addresses");
        };
        let sender = kvio::FrameSender::on_address(*serving.ip()).with_context(|| {
            format!(
                "sending reads back through the switch from {}",
                serving.ip()
            )
        })?;
        Ok(Bounce { sender, vip, hash })
    }

    fn send(
        &self,
        request: &wire::memcache::Request<'_>,
        payload: &[u8],
        client: SocketAddr,
        request_id: u16,
    ) -> std::io::Result<()> {
        let SocketAddr::V4(client) = client else {
            return Err(ErrorKind::Unsupported.into());
        };
        let hash = request.key().map_or(0, |k| self.hash.hash(k));
        let ends = UdpEnds {
            src_mac: Mac(self.sender.mac()),
            dst_mac: keymac::encode(keymac::Kind::Other, hash),
            src_ip: *client.ip(),
            dst_ip: *self.vip.ip(),
            src_port: client.port(),
            dst_port: self.vip.port(),
        };
        let mut frame = vec![0u8; PAYLOAD_OFFSET + mcudp::LEN];
        Header::single(request_id).emit(&mut frame[PAYLOAD_OFFSET..]);
        frame.extend_from_slice(payload);
        if !wire::frame::emit_udp_headers(&mut frame, &ends) {
            return Err(ErrorKind::InvalidInput.into());
        }
        self.sender.send(&frame)
    }
}

impl Relay {
    /// A relay to `upstream` from a socket of its own on the address of `serving`.
    pub(crate) fn new(serving: &UdpSocket, upstream: SocketAddr) -> anyhow::Result<Relay> {
        let mut local = serving
            .local_addr()
            .context("failed to read the udp address")?;
        local.set_port(0);
        let socket =
            UdpSocket::bind(local).with_context(|| format!("failed to bind the relay {local}"))?;
        socket
            .set_read_timeout(Some(POLL))
            .context("failed to set the relay's read timeout")?;
        Ok(Relay {
            socket,
            serving: serving
                .try_clone()
                .context("failed to share the udp socket")?,
            upstream,
            table: Mutex::new(Table::default()),
        })
    }

    /// Starts the thread that sends the upstream's replies back to the clients.
    pub(crate) fn spawn(relay: Arc<Relay>, shared: Arc<Shared>) -> anyhow::Result<JoinHandle<()>> {
        thread::Builder::new()
            .name("node-relay".into())
            .spawn(move || relay.replies(&shared))
            .context("failed to start the udp relay")
    }

    fn send(
        &self,
        shared: &Shared,
        payload: &[u8],
        client: SocketAddr,
        request_id: u16,
        quiet: bool,
    ) {
        let counters = &shared.store.counters;
        let now = Instant::now();
        let open = Open {
            client,
            request_id,
            sent: now,
            quiet,
        };
        let id = {
            let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
            table.sweep(now, &counters.relay_lost);
            // An id still open is skipped: a late reply to it must not reach another client.
            let Some(id) = table.free_id() else {
                bump(&counters.relay_lost);
                return;
            };
            table.open.insert(id, open);
            id
        };
        let mut datagram = vec![0u8; mcudp::LEN];
        Header::single(id).emit(&mut datagram);
        datagram.extend_from_slice(payload);
        match self.socket.send_to(&datagram, self.upstream) {
            Ok(_) => bump(&counters.relayed),
            Err(e) => {
                tracing::debug!("relay to {} failed: {e}", self.upstream);
                let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
                table.open.remove(&id);
                bump(&counters.relay_lost);
            }
        }
    }

    /// The replies' loop: each datagram goes to its request's client under the client's id;
    /// the last datagram of a reply closes its request.
    fn replies(&self, shared: &Shared) {
        let counters = &shared.store.counters;
        let mut datagram = vec![0u8; 64 * 1024];
        while !shared.stopping() {
            let n = match self.socket.recv_from(&mut datagram) {
                Ok((n, from)) if from == self.upstream => n,
                Ok(_) => {
                    bump(&counters.relay_stray);
                    continue;
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    // Quiet: requests still waiting are given up on time all the same.
                    let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
                    table.sweep(Instant::now(), &counters.relay_lost);
                    continue;
                }
                Err(e) => {
                    tracing::debug!("relay receive failed: {e}");
                    continue;
                }
            };
            let Ok((header, _)) = Header::parse(&datagram[..n]) else {
                bump(&counters.relay_stray);
                continue;
            };
            let open = {
                let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
                let last = header.seq.saturating_add(1) >= header.total;
                match last {
                    true => table.open.remove(&header.request_id),
                    false => table.open.get(&header.request_id).copied(),
                }
            };
            let Some(open) = open else {
                bump(&counters.relay_stray);
                continue;
            };
            Header {
                request_id: open.request_id,
                ..header
            }
            .emit(&mut datagram[..mcudp::LEN]);
            if let Err(e) = self.serving.send_to(&datagram[..n], open.client) {
                tracing::debug!("relayed reply to {} failed: {e}", open.client);
            }
        }
    }
}

impl Table {
    /// The next id not in use, if any is free.
    fn free_id(&mut self) -> Option<u16> {
        if self.open.len() > usize::from(u16::MAX) {
            return None;
        }
        loop {
            let id = self.next_id;
            self.next_id = id.wrapping_add(1);
            if !self.open.contains_key(&id) {
                return Some(id);
            }
        }
    }

    /// Forgets the requests that have waited longer than [`WAIT`], at most once per tenth of
    /// it.
    fn sweep(&mut self, now: Instant, lost: &std::sync::atomic::AtomicU64) {
        if self
            .swept
            .is_some_and(|at| now.saturating_duration_since(at) < WAIT / 10)
        {
            return;
        }
        self.swept = Some(now);
        let mut gone = 0;
        self.open.retain(|_, o| {
            let keep = now.saturating_duration_since(o.sent) < WAIT;
            gone += u64::from(!keep && !o.quiet);
            keep
        });
        lost.fetch_add(gone, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    fn open(sent: Instant) -> Open {
        Open {
            client: "127.0.0.1:1".parse().unwrap(),
            request_id: 7,
            sent,
            quiet: false,
        }
    }

    #[test]
    fn requests_waiting_too_long_are_forgotten_and_counted() {
        // Later than now, so that times before it exist.
        let t0 = Instant::now() + WAIT * 2;
        let lost = AtomicU64::new(0);
        let mut table = Table::default();
        table.open.insert(1, open(t0));
        table.open.insert(2, open(t0 + WAIT / 2));
        table.sweep(t0 + WAIT, &lost);
        assert_eq!(table.open.keys().copied().collect::<Vec<_>>(), vec![2]);
        assert_eq!(lost.load(Ordering::Relaxed), 1);
        // Not again within a tenth of the wait, even for a request long overdue.
        table.open.insert(3, open(t0 - WAIT));
        table.sweep(t0 + WAIT + WAIT / 20, &lost);
        assert_eq!(table.open.len(), 2);
        table.sweep(t0 + WAIT * 2, &lost);
        assert!(table.open.is_empty());
        assert_eq!(lost.load(Ordering::Relaxed), 3);
        // A quiet request that gets no reply is not lost.
        table.open.insert(
            4,
            Open {
                quiet: true,
                ..open(t0)
            },
        );
        table.sweep(t0 + WAIT * 3, &lost);
        assert!(table.open.is_empty());
        assert_eq!(lost.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn ids_still_open_are_skipped_and_a_full_table_refuses() {
        let t0 = Instant::now();
        let mut table = Table {
            next_id: u16::MAX,
            ..Table::default()
        };
        table.open.insert(0, open(t0));
        table.open.insert(1, open(t0));
        assert_eq!(table.free_id(), Some(u16::MAX));
        assert_eq!(table.free_id(), Some(2), "0 and 1 are open");
        for id in 0..=u16::MAX {
            table.open.insert(id, open(t0));
        }
        assert_eq!(table.free_id(), None);
    }
}
