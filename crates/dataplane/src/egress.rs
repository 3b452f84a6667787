//! Per-port egress queues with a rate ([`switch::shaper::Shaper`]), set at run time through
//! [`EgressSettings`] by the API or the configuration; a port without a rate sends at once.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::Arc;

use kv::Instant;
use kvio::Port;
use switch::shaper::Shaper;
use switch::stats::{Drop, Stats};

/// The rate (bits per second; 0: none) and depth (bytes) of each port's egress queue, shared
/// between the forwarding thread and whoever changes them.
#[derive(Debug)]
pub struct EgressSettings {
    ports: Vec<[AtomicU64; 2]>,
    /// Changes made, and changes the forwarding thread has taken in.
    changes: AtomicU64,
    applied: AtomicU64,
}

/// The depth a queue gets when a rate is set without one: 64 full-size frames.
pub const DEFAULT_DEPTH: u64 = 64 * 1514;

impl EgressSettings {
    pub fn new(ports: usize) -> Arc<EgressSettings> {
        Arc::new(EgressSettings {
            ports: (0..ports)
                .map(|_| [AtomicU64::new(0), AtomicU64::new(DEFAULT_DEPTH)])
                .collect(),
            changes: AtomicU64::new(0),
            applied: AtomicU64::new(0),
        })
    }

    /// Whether the forwarding thread has taken in every change up to `change` (the number
    /// [`EgressSettings::set`] returned).
    pub fn applied(&self, change: u64) -> bool {
        self.applied.load(Acquire) >= change
    }

    /// Sets port `p`'s rate (0 turns the queue off) and depth; the change's number (see
    /// [`EgressSettings::applied`]), or `None` if there is no such port.
    pub fn set(&self, p: usize, rate_bps: u64, depth_bytes: u64) -> Option<u64> {
        let [rate, depth] = self.ports.get(p)?;
        depth.store(depth_bytes.max(1), Relaxed);
        rate.store(rate_bps, Relaxed);
        Some(self.changes.fetch_add(1, AcqRel) + 1)
    }

    /// Port `p`'s (rate, depth).
    pub fn get(&self, p: usize) -> Option<(u64, u64)> {
        self.ports
            .get(p)
            .map(|[rate, depth]| (rate.load(Relaxed), depth.load(Relaxed)))
    }
}

/// The queues themselves, on the forwarding thread.
pub(crate) struct Egress {
    settings: Arc<EgressSettings>,
    shapers: Vec<Option<Shaper>>,
    ready: Vec<Vec<u8>>,
}

impl Egress {
    pub(crate) fn new(settings: Arc<EgressSettings>, ports: usize) -> Egress {
        Egress {
            settings,
            shapers: (0..ports).map(|_| None).collect(),
            ready: Vec::new(),
        }
    }

    pub(crate) fn settings(&self) -> Arc<EgressSettings> {
        self.settings.clone()
    }

    /// Follows the settings: queues made, changed or (sending what waits) removed.
    pub(crate) fn sync(&mut self, ports: &mut [Box<dyn Port>], stats: &Stats) {
        let changes = self.settings.changes.load(Acquire);
        if self.settings.applied.load(Relaxed) == changes {
            return;
        }
        for (p, slot) in self.shapers.iter_mut().enumerate() {
            let (rate, depth) = self.settings.get(p).unwrap_or((0, 0));
            match (slot.as_mut(), rate) {
                (None, 0) => {}
                (None, _) => *slot = Some(Shaper::new(rate, depth)),
                (Some(s), 0) => {
                    let mut rest = Vec::new();
                    s.pop_ready(Instant::from_nanos(u64::MAX), &mut rest);
                    let frames: Vec<&[u8]> = rest.iter().map(Vec::as_slice).collect();
                    if let Some(port) = ports.get_mut(p) {
                        transmit(port.as_mut(), &frames, stats, p);
                    }
                    *slot = None;
                    gauge(stats, p, 0, 0);
                }
                (Some(s), _) if (s.rate(), s.depth()) != (rate, depth) => s.set(rate, depth),
                _ => {}
            }
        }
        self.settings.applied.store(changes, Release);
    }

    /// Whether port `p` sends through a queue.
    pub(crate) fn shaped(&self, p: usize) -> bool {
        matches!(self.shapers.get(p), Some(Some(_)))
    }

    /// Queues `frames` for port `p`; a frame past the queue's depth is dropped and counted.
    pub(crate) fn enqueue(&mut self, p: usize, frames: &[&[u8]], stats: &Stats) {
        let Some(Some(s)) = self.shapers.get_mut(p) else {
            return;
        };
        for f in frames {
            if s.push(f.to_vec()).is_err() {
                stats.count_drop(Drop::EgressQueueFull);
                switch::stats::add(&stats.ports[p].tx_dropped, 1);
            }
        }
        gauge(stats, p, s.queued_bytes(), s.queued_packets() as u64);
    }

    /// Sends what each queue lets go by `now`.
    pub(crate) fn drain(&mut self, now: Instant, ports: &mut [Box<dyn Port>], stats: &Stats) {
        for (p, slot) in self.shapers.iter_mut().enumerate() {
            let Some(s) = slot else { continue };
            if s.queued_packets() == 0 {
                continue;
            }
            self.ready.clear();
            s.pop_ready(now, &mut self.ready);
            if !self.ready.is_empty() {
                let frames: Vec<&[u8]> = self.ready.iter().map(Vec::as_slice).collect();
                if let Some(port) = ports.get_mut(p) {
                    transmit(port.as_mut(), &frames, stats, p);
                }
            }
            gauge(stats, p, s.queued_bytes(), s.queued_packets() as u64);
        }
    }

    /// When the first queued frame may leave.
    pub(crate) fn next_ready(&self, now: Instant) -> Option<Instant> {
        self.shapers
            .iter()
            .flatten()
            .filter_map(|s| s.next_ready(now))
            .min()
    }
}

fn gauge(stats: &Stats, p: usize, bytes: u64, packets: u64) {
    if let Some(c) = stats.ports.get(p) {
        c.queue_bytes.store(bytes, Relaxed);
        c.queue_packets.store(packets, Relaxed);
    }
}

/// Sends `frames` out of `port` at once, counting them as port `p`'s.
pub(crate) fn transmit(port: &mut dyn Port, frames: &[&[u8]], stats: &Stats, p: usize) {
    let sent = match port.send(frames) {
        Ok(n) => n.min(frames.len()),
        Err(e) => {
            tracing::debug!(port = port.name(), "send failed: {e}");
            0
        }
    };
    let pc = &stats.ports[p];
    switch::stats::add(&pc.tx_packets, sent as u64);
    let bytes: usize = frames[..sent].iter().map(|f| f.len()).sum();
    switch::stats::add(&pc.tx_bytes, bytes as u64);
    for _ in sent..frames.len() {
        stats.count_drop(Drop::TxFailed);
    }
    switch::stats::add(&pc.tx_dropped, (frames.len() - sent) as u64);
}
