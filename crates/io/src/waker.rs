//! A [`Waker`]: lets another thread wake a loop that sleeps in [`Poller::wait`](crate::Poller).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use crate::sys;

/// An eventfd that polls readable from [`Waker::wake`] until [`Waker::reset`].
#[derive(Debug)]
pub struct Waker {
    fd: OwnedFd,
}

impl Waker {
    /// Fails only if an eventfd cannot be created.
    pub fn new() -> io::Result<Waker> {
        Ok(Waker {
            fd: sys::eventfd()?,
        })
    }

    /// Makes the descriptor readable; safe from any thread.
    pub fn wake(&self) -> io::Result<()> {
        sys::eventfd_signal(&self.fd)
    }

    /// Makes the descriptor stop polling readable, once the woken loop has looked.
    pub fn reset(&self) -> io::Result<()> {
        sys::eventfd_reset(&self.fd)
    }

    /// The descriptor to poll.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Poller;
    use std::time::Duration;

    #[test]
    fn a_wake_makes_the_poller_return_until_reset() {
        let waker = Waker::new().unwrap();
        let mut poller = Poller::new(&[waker.fd()]);
        let mut ready = Vec::new();
        poller.wait(Duration::ZERO, &mut ready).unwrap();
        assert!(ready.is_empty());
        waker.wake().unwrap();
        waker.wake().unwrap();
        poller.wait(Duration::from_secs(5), &mut ready).unwrap();
        assert_eq!(ready, [0]);
        waker.reset().unwrap();
        poller.wait(Duration::ZERO, &mut ready).unwrap();
        assert!(ready.is_empty());
    }
}
