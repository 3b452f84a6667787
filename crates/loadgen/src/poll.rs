//! A minimal binding to POSIX `poll(2)` (`ppoll(2)` on Linux, for a nanosecond timeout), so
//! that one thread can wait on many requester sockets without spinning, and wake in time for an
//! open-loop send. The only unsafe code in the crate lives here.

use std::io;
use std::os::fd::RawFd;
use std::os::raw::{c_int, c_short};
use std::time::Duration;

#[cfg(not(target_os = "linux"))]
type Nfds = std::os::raw::c_uint;

/// `POLLIN` has the same value on Linux, the BSDs and macOS. Checked against libc in the tests.
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

#[cfg(not(target_os = "linux"))]
extern "C" {
    fn poll(fds: *mut PollFd, nfds: Nfds, timeout: c_int) -> c_int;
}

/// Blocks until a descriptor in `fds` is ready or `timeout` passes (on Linux to the
/// nanosecond, elsewhere rounded up to a whole millisecond). Returns the number of ready
/// descriptors; an interrupted call returns 0.
pub fn wait(fds: &mut [PollFd], timeout: Duration) -> io::Result<usize> {
    let n = raw_wait(fds, timeout);
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(n as usize)
}

#[cfg(target_os = "linux")]
fn raw_wait(fds: &mut [PollFd], timeout: Duration) -> c_int {
    // Capped at a day: the callers never wait that long, and the seconds fit any time_t.
    let timeout = timeout.min(Duration::from_secs(86_400));
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `fds` is a valid, exclusively borrowed array of `repr(C)` structs with the layout
    // of `struct pollfd` and its length is passed alongside; ppoll writes only the `revents`
    // fields within it. `ts` outlives the call; a null signal mask leaves the mask unchanged.
    unsafe {
        libc::ppoll(
            fds.as_mut_ptr().cast::<libc::pollfd>(),
            fds.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        )
    }
}

#[cfg(not(target_os = "linux"))]
fn raw_wait(fds: &mut [PollFd], timeout: Duration) -> c_int {
    let ms = timeout.as_micros().div_ceil(1000).min(c_int::MAX as u128) as c_int;
    // SAFETY: `fds` is a valid, exclusively borrowed array of `repr(C)` pollfd structs and its
    // length is passed alongside; poll writes only the `revents` fields within it.
    unsafe { poll(fds.as_mut_ptr(), fds.len() as Nfds, ms) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;

    #[test]
    #[cfg(target_os = "linux")]
    fn layout_matches_libc() {
        assert_eq!(POLLIN, libc::POLLIN);
        assert_eq!(
            std::mem::size_of::<PollFd>(),
            std::mem::size_of::<libc::pollfd>()
        );
    }

    #[test]
    fn short_timeouts_are_not_rounded_to_milliseconds() {
        let a = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let mut fds = [PollFd::readable(a.as_raw_fd())];
        // The fastest of a few waits, so a busy machine does not fail the test.
        let fastest = (0..20)
            .map(|_| {
                let t = std::time::Instant::now();
                wait(&mut fds, Duration::from_micros(100)).expect("poll");
                t.elapsed()
            })
            .min()
            .expect("non-empty");
        assert!(fastest >= Duration::from_micros(100), "{fastest:?}");
        if cfg!(target_os = "linux") {
            // A poll rounded to milliseconds would take at least 1 ms.
            assert!(fastest < Duration::from_micros(900), "{fastest:?}");
        }
    }

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
