//! The interface every port backend offers the switch, and waiting on several ports at once.
//!
//! Ports never block on the data path: `recv` and `send` return what they could do now, and the
//! caller sleeps in [`wait_readable`] (or its own poll loop) when every port is idle.

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

use crate::batch::Batch;
use crate::sys;

/// Counters a port keeps since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Frames handed to the caller by `recv`.
    pub rx_packets: u64,
    /// Bytes of those frames, from the Ethernet header on.
    pub rx_bytes: u64,
    /// Frames dropped on receive because they did not fit a [`crate::FRAME_CAP`] slot.
    pub rx_errors: u64,
    /// Frames the kernel dropped before the port read them (its receive queue was full).
    pub rx_dropped: u64,
    /// Frames accepted for transmission.
    pub tx_packets: u64,
    /// Bytes of those frames.
    pub tx_bytes: u64,
    /// Frames `send` consumed but could not transmit: too short, longer than the device MTU,
    /// or refused by the device queue.
    pub tx_dropped: u64,
}

/// A switch port: moves whole Ethernet frames, in batches, without blocking.
pub trait Port: Send {
    /// The interface name.
    fn name(&self) -> &str;

    /// The interface index (for in-memory ports, the number they were created with).
    fn ifindex(&self) -> u32;

    /// The interface's own MAC address, as read when the port was opened.
    fn mac(&self) -> [u8; 6];

    /// A descriptor that polls readable (`POLLIN`) while frames are waiting to be received.
    /// It stays owned by the port.
    fn fd(&self) -> RawFd;

    /// Whether frames may be waiting, answered without a system call so that a busy-polling
    /// caller can spin on it. `false` means `recv` would return nothing now; `true` means it
    /// may return something. Ports that cannot tell cheaply answer `true`.
    fn rx_ready(&self) -> bool {
        true
    }

    /// Clears `batch` and fills it with up to `batch.capacity()` waiting frames, without
    /// blocking. Returns how many frames it holds now (0 if none were waiting).
    ///
    /// Frames too large for a slot are dropped and counted in `rx_errors`; a call may
    /// therefore return 0 while the descriptor remains readable.
    fn recv(&mut self, batch: &mut Batch) -> io::Result<usize>;

    /// Transmits `frames` in order, without blocking for long. Returns `n`, the number of
    /// frames consumed from the front: each of `frames[..n]` was either sent (`tx_packets`) or
    /// found unsendable and dropped (`tx_dropped`). `frames[n..]` were not attempted because
    /// the transmit queue is full; the caller may retry them later or drop them.
    ///
    /// Fails only if the first frame hits an error that is not about that frame (for example,
    /// the interface went down); later errors cut the count short and recur on the next call.
    fn send(&mut self, frames: &[&[u8]]) -> io::Result<usize>;

    /// Transmits every frame of `batch`; same contract as [`Port::send`].
    fn send_batch(&mut self, batch: &Batch) -> io::Result<usize> {
        const CHUNK: usize = 64;
        let mut refs: [&[u8]; CHUNK] = [&[]; CHUNK];
        let mut done = 0;
        while done < batch.len() {
            let n = (batch.len() - done).min(CHUNK);
            for (k, r) in refs[..n].iter_mut().enumerate() {
                *r = batch.frame(done + k);
            }
            let sent = self.send(&refs[..n])?;
            done += sent;
            if sent < n {
                break;
            }
        }
        Ok(done)
    }

    /// A snapshot of the counters.
    fn stats(&self) -> PortStats;
}

/// Waits until at least one of `fds` is readable or `timeout` passes.
///
/// Clears `ready`, then pushes the positions in `fds` of descriptors that are readable or in an
/// error state (so that the next `recv` reports the error). An interrupted wait (`EINTR`)
/// returns with `ready` empty. The timeout is rounded up to whole milliseconds, so a non-zero
/// timeout never degrades into a busy loop.
pub fn wait_readable(fds: &[RawFd], timeout: Duration, ready: &mut Vec<usize>) -> io::Result<()> {
    Poller::new(fds).wait(timeout, ready)
}

/// [`wait_readable`] over a fixed set of descriptors, without allocating per wait.
#[derive(Debug)]
pub struct Poller {
    fds: Vec<libc::pollfd>,
}

impl Poller {
    /// Prepares to wait on `fds`. The descriptors are borrowed, not owned: they must stay
    /// open while the poller is used.
    pub fn new(fds: &[RawFd]) -> Poller {
        let fds = fds
            .iter()
            .map(|&fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        Poller { fds }
    }

    /// Convenience for polling every port of a switch.
    pub fn for_ports(ports: &[&dyn Port]) -> Poller {
        let fds: Vec<RawFd> = ports.iter().map(|p| p.fd()).collect();
        Poller::new(&fds)
    }

    /// See [`wait_readable`].
    pub fn wait(&mut self, timeout: Duration, ready: &mut Vec<usize>) -> io::Result<()> {
        ready.clear();
        for p in &mut self.fds {
            p.revents = 0;
        }
        match sys::poll(&mut self.fds, timeout_ms(timeout)) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(()),
            Err(e) => return Err(e),
        }
        let wake = libc::POLLIN | libc::POLLERR | libc::POLLHUP | libc::POLLNVAL;
        ready.extend(
            self.fds
                .iter()
                .enumerate()
                .filter(|(_, p)| p.revents & wake != 0)
                .map(|(i, _)| i),
        );
        Ok(())
    }
}

fn timeout_ms(timeout: Duration) -> libc::c_int {
    let ms = timeout.as_nanos().div_ceil(1_000_000);
    ms.min(libc::c_int::MAX as u128) as libc::c_int
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_rounds_up() {
        assert_eq!(timeout_ms(Duration::ZERO), 0);
        assert_eq!(timeout_ms(Duration::from_micros(1)), 1);
        assert_eq!(timeout_ms(Duration::from_millis(250)), 250);
        assert_eq!(timeout_ms(Duration::from_secs(u64::MAX)), libc::c_int::MAX);
    }
}
