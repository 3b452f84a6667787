//! A minimal binding to POSIX `poll(2)`, so that one thread can wait on many requester sockets
//! without spinning. The only unsafe code in the crate lives here.

use std::io;
use std::os::fd::RawFd;
use std::os::raw::{c_int, c_short};
use std::time::Duration;

#[cfg(target_os = "linux")]
type Nfds = std::os::raw::c_ulong;
#[cfg(not(target_os = "linux"))]
type Nfds = std::os::raw::c_uint;

/// `POLLIN` has the same value on Linux, the BSDs and macOS.
const POLLIN: c_short = 0x1;

/// One entry of the set handed to `poll`; layout of `struct pollfd`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PollFd {
    fd: c_int,
    events: c_short,
    revents: c_short,
}

impl PollFd {
    /// Waits for `fd` to become readable (or to report an error or hang-up).
    pub fn readable(fd: RawFd) -> PollFd {
        PollFd {
            fd,
            events: POLLIN,
            revents: 0,
        }
    }

    /// True if `poll` reported any event for this descriptor; errors and hang-ups count, since
    /// the following read reports them.
    pub fn ready(&self) -> bool {
        self.revents != 0
    }
}

extern "C" {
    fn poll(fds: *mut PollFd, nfds: Nfds, timeout: c_int) -> c_int;
}

/// Blocks until a descriptor in `fds` is ready or `timeout` passes (rounded up to a whole
/// millisecond). Returns the number of ready descriptors; an interrupted call returns 0.
pub fn wait(fds: &mut [PollFd], timeout: Duration) -> io::Result<usize> {
    let ms = timeout.as_micros().div_ceil(1000).min(c_int::MAX as u128) as c_int;
    // SAFETY: `fds` is a valid, exclusively borrowed array of `repr(C)` pollfd structs and its
    // length is passed alongside; poll writes only the `revents` fields within it.
    let n = unsafe { poll(fds.as_mut_ptr(), fds.len() as Nfds, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;

    #[test]
    fn readable_after_send() {
        let a = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let b = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let mut fds = [PollFd::readable(a.as_raw_fd())];
        assert_eq!(wait(&mut fds, Duration::from_millis(1)).expect("poll"), 0);
        assert!(!fds[0].ready());
        b.send_to(b"x", a.local_addr().expect("addr"))
            .expect("send");
        let mut fds = [PollFd::readable(a.as_raw_fd())];
        assert_eq!(wait(&mut fds, Duration::from_secs(2)).expect("poll"), 1);
        assert!(fds[0].ready());
    }
}
