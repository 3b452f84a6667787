//! In-memory ports, so that the switch can be tested without root, interfaces or a kernel.
//!
//! [`mem_pair`] returns two ports joined like the ends of a cable: what one sends, the other
//! receives, in order. Give one end to the code under test and drive the other from the test.
//! Each receive queue has an eventfd that polls readable while frames wait, so poll loops work
//! unchanged.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::batch::{Batch, Meta, FRAME_CAP};
use crate::port::{Port, PortStats};
use crate::sys;

/// Frames a queue holds by default before `send` reports it full.
pub const MEM_QUEUE_LIMIT: usize = 4096;

/// Shortest frame a port transmits: an Ethernet header. The kernel refuses shorter frames on
/// `AF_PACKET` sockets, and so does [`MemPort`].
const ETH_HEADER_LEN: usize = 14;

struct Frame {
    bytes: Vec<u8>,
    csum_not_ready: bool,
}

struct State {
    frames: VecDeque<Frame>,
    limit: usize,
}

/// One direction of the cable.
struct Queue {
    state: Mutex<State>,
    /// Readable while `state.frames` is not empty.
    ready: OwnedFd,
}

impl Queue {
    fn new() -> io::Result<Arc<Queue>> {
        Ok(Arc::new(Queue {
            state: Mutex::new(State {
                frames: VecDeque::new(),
                limit: MEM_QUEUE_LIMIT,
            }),
            ready: sys::eventfd()?,
        }))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere cannot leave the queue half-updated: every change is one
        // VecDeque operation.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One end of an in-memory link. See [`mem_pair`].
pub struct MemPort {
    name: String,
    ifindex: u32,
    mac: [u8; 6],
    rx: Arc<Queue>,
    tx: Arc<Queue>,
    stats: PortStats,
}

/// Two connected in-memory ports, named `mem0` and `mem1`, with interface indexes 1 and 2 and
/// locally administered MACs `02:00:00:00:00:01` and `02:00:00:00:00:02`.
///
/// Fails only if an eventfd cannot be created.
pub fn mem_pair() -> io::Result<(MemPort, MemPort)> {
    let a_to_b = Queue::new()?;
    let b_to_a = Queue::new()?;
    let a = MemPort {
        name: "mem0".to_owned(),
        ifindex: 1,
        mac: [0x02, 0, 0, 0, 0, 1],
        rx: b_to_a.clone(),
        tx: a_to_b.clone(),
        stats: PortStats::default(),
    };
    let b = MemPort {
        name: "mem1".to_owned(),
        ifindex: 2,
        mac: [0x02, 0, 0, 0, 0, 2],
        rx: a_to_b,
        tx: b_to_a,
        stats: PortStats::default(),
    };
    Ok((a, b))
}

impl MemPort {
    /// Renames the port and changes its interface index and MAC.
    pub fn with_identity(mut self, name: &str, ifindex: u32, mac: [u8; 6]) -> MemPort {
        self.name = name.to_owned();
        self.ifindex = ifindex;
        self.mac = mac;
        self
    }

    /// Sets how many frames the queue this port transmits into may hold; `send` stops short
    /// when it is full, as a real port does when the kernel's buffer is.
    pub fn with_queue_limit(self, limit: usize) -> MemPort {
        self.tx.lock().limit = limit;
        self
    }

    /// Number of frames waiting to be received by this port.
    pub fn pending(&self) -> usize {
        self.rx.lock().frames.len()
    }

    /// Sends one frame that the peer will see with [`Batch::csum_not_ready`] set to
    /// `csum_not_ready`, as if a local sender had offloaded its checksum. Same contract as
    /// [`Port::send`] for a single frame: returns 0 if the queue is full, 1 otherwise.
    pub fn send_marked(&mut self, frame: &[u8], csum_not_ready: bool) -> io::Result<usize> {
        self.send_frames(&[frame], csum_not_ready)
    }

    fn send_frames(&mut self, frames: &[&[u8]], csum_not_ready: bool) -> io::Result<usize> {
        let mut state = self.tx.lock();
        let was_empty = state.frames.is_empty();
        let mut done = 0;
        for frame in frames {
            if !(ETH_HEADER_LEN..=FRAME_CAP).contains(&frame.len()) {
                self.stats.tx_dropped += 1;
                done += 1;
                continue;
            }
            if state.frames.len() >= state.limit {
                break;
            }
            state.frames.push_back(Frame {
                bytes: frame.to_vec(),
                csum_not_ready,
            });
            self.stats.tx_packets += 1;
            self.stats.tx_bytes += frame.len() as u64;
            done += 1;
        }
        if was_empty && !state.frames.is_empty() {
            sys::eventfd_signal(&self.tx.ready)?;
        }
        Ok(done)
    }
}

impl Port for MemPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn ifindex(&self) -> u32 {
        self.ifindex
    }

    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn fd(&self) -> RawFd {
        self.rx.ready.as_raw_fd()
    }

    fn rx_ready(&self) -> bool {
        !self.rx.lock().frames.is_empty()
    }

    fn recv(&mut self, batch: &mut Batch) -> io::Result<usize> {
        batch.clear();
        let mut state = self.rx.lock();
        let mut n = 0;
        while n < batch.capacity() {
            let Some(frame) = state.frames.pop_front() else {
                break;
            };
            let len = frame.bytes.len();
            batch.slot_mut(n)[..len].copy_from_slice(&frame.bytes);
            batch.set_meta(n, Meta::new(len, frame.csum_not_ready, None));
            n += 1;
            self.stats.rx_packets += 1;
            self.stats.rx_bytes += len as u64;
        }
        batch.set_len(n);
        if state.frames.is_empty() {
            sys::eventfd_reset(&self.rx.ready)?;
        }
        Ok(n)
    }

    fn send(&mut self, frames: &[&[u8]]) -> io::Result<usize> {
        self.send_frames(frames, false)
    }

    fn stats(&self) -> PortStats {
        self.stats
    }
}

impl std::fmt::Debug for MemPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemPort")
            .field("name", &self.name)
            .field("ifindex", &self.ifindex)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::wait_readable;
    use std::time::Duration;

    fn frame(tag: u8, len: usize) -> Vec<u8> {
        let mut f = vec![0u8; len];
        f[0] = tag;
        f
    }

    fn readable(port: &MemPort) -> bool {
        let mut ready = Vec::new();
        wait_readable(&[port.fd()], Duration::ZERO, &mut ready).unwrap();
        ready == [0]
    }

    #[test]
    fn frames_cross_in_order_and_in_batches() {
        let (mut a, mut b) = mem_pair().unwrap();
        let frames: Vec<Vec<u8>> = (0..5).map(|i| frame(i, 60 + i as usize)).collect();
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        assert!(!readable(&b));
        assert!(!b.rx_ready());
        assert_eq!(a.send(&refs).unwrap(), 5);
        assert!(readable(&b));
        assert!(b.rx_ready());
        assert!(!a.rx_ready());
        assert!(!readable(&a));

        let mut batch = Batch::new(3);
        assert_eq!(b.recv(&mut batch).unwrap(), 3);
        assert_eq!(batch.iter().map(|f| f[0]).collect::<Vec<_>>(), [0, 1, 2]);
        assert!(readable(&b));
        assert_eq!(b.recv(&mut batch).unwrap(), 2);
        assert_eq!(batch.frame(1), &frames[4][..]);
        assert!(!readable(&b));
        assert!(!b.rx_ready());
        assert_eq!(b.recv(&mut batch).unwrap(), 0);
        assert!(batch.is_empty());

        let sa = a.stats();
        assert_eq!((sa.tx_packets, sa.tx_bytes), (5, 60 + 61 + 62 + 63 + 64));
        let sb = b.stats();
        assert_eq!((sb.rx_packets, sb.rx_bytes), (5, sa.tx_bytes));
    }

    #[test]
    fn both_directions_are_independent() {
        let (mut a, mut b) = mem_pair().unwrap();
        assert_eq!(a.mac(), [2, 0, 0, 0, 0, 1]);
        assert_eq!(b.name(), "mem1");
        b.send(&[&frame(7, 20)]).unwrap();
        let mut batch = Batch::new(4);
        assert_eq!(b.recv(&mut batch).unwrap(), 0);
        assert_eq!(a.recv(&mut batch).unwrap(), 1);
        assert_eq!(batch.frame(0)[0], 7);
    }

    #[test]
    fn full_queue_stops_send() {
        let (a, mut b) = mem_pair().unwrap();
        let mut a = a.with_queue_limit(2);
        let f = frame(1, 30);
        assert_eq!(a.send(&[&f, &f, &f]).unwrap(), 2);
        assert_eq!(a.send(&[&f]).unwrap(), 0);
        let mut batch = Batch::new(1);
        assert_eq!(b.recv(&mut batch).unwrap(), 1);
        assert_eq!(a.send(&[&f, &f]).unwrap(), 1);
        assert_eq!(b.pending(), 2);
    }

    #[test]
    fn unsendable_frames_are_consumed_and_counted() {
        let (mut a, b) = mem_pair().unwrap();
        let short = frame(1, 13);
        let long = frame(2, FRAME_CAP + 1);
        let ok = frame(3, 14);
        assert_eq!(a.send(&[&short, &long, &ok]).unwrap(), 3);
        let st = a.stats();
        assert_eq!((st.tx_packets, st.tx_dropped), (1, 2));
        assert_eq!(b.pending(), 1);
    }

    #[test]
    fn checksum_mark_reaches_peer() {
        let (mut a, b) = mem_pair().unwrap();
        let mut b = b.with_identity("eth1", 9, [2, 9, 9, 9, 9, 9]);
        assert_eq!(
            (b.name(), b.ifindex(), b.mac()),
            ("eth1", 9, [2, 9, 9, 9, 9, 9])
        );
        a.send_marked(&frame(1, 40), true).unwrap();
        a.send(&[&frame(2, 40)]).unwrap();
        let mut batch = Batch::new(4);
        assert_eq!(b.recv(&mut batch).unwrap(), 2);
        assert!(batch.csum_not_ready(0));
        assert!(!batch.csum_not_ready(1));
        assert_eq!(batch.vlan_tci(0), None);
    }

    #[test]
    fn port_is_usable_as_trait_object_across_threads() {
        let (a, mut b) = mem_pair().unwrap();
        let mut boxed: Box<dyn Port> = Box::new(a);
        let handle = std::thread::spawn(move || {
            boxed.send(&[&[0u8; 64][..]]).unwrap();
            boxed
        });
        let _a = handle.join().unwrap();
        let mut ready = Vec::new();
        wait_readable(&[b.fd()], Duration::from_secs(1), &mut ready).unwrap();
        assert_eq!(ready, [0]);
        let mut batch = Batch::new(2);
        assert_eq!(b.recv(&mut batch).unwrap(), 1);
    }
}
