//! Thin, checked wrappers over the few system calls the ports share.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Turns a `-1`-on-error return value into `io::Result`.
pub(crate) fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Sets a socket option whose value is the plain-old-data `value`.
pub(crate) fn setsockopt<T: Copy>(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    // SAFETY: `value` points to `size_of::<T>()` readable bytes for the duration of the call;
    // the kernel only reads them.
    let ret = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (value as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    cvt(ret).map(drop)
}

/// Reads a socket option into `value`; returns the length the kernel wrote.
pub(crate) fn getsockopt<T: Copy>(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: &mut T,
) -> io::Result<usize> {
    let mut len = size_of::<T>() as libc::socklen_t;
    // SAFETY: `value` points to `len` writable bytes and `len` to a valid socklen_t; the
    // kernel writes at most `len` bytes. `T: Copy` has no drop glue or invariants the raw
    // write could break for the plain C structs and integers this is used with.
    let ret = unsafe { libc::getsockopt(fd, level, name, (value as *mut T).cast(), &mut len) };
    cvt(ret).map(|_| len as usize)
}

/// `poll(2)` over `fds` with a timeout in milliseconds; returns the number of ready entries.
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout_ms: libc::c_int) -> io::Result<usize> {
    // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()` pollfd entries.
    let ret = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    cvt(ret).map(|n| n as usize)
}

/// A non-blocking, close-on-exec eventfd starting at zero.
pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain system call with constant arguments.
    let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
    // SAFETY: `fd` was just returned by eventfd and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds one to an eventfd counter, making it readable.
pub(crate) fn eventfd_signal(fd: &OwnedFd) -> io::Result<()> {
    let one: u64 = 1;
    // SAFETY: writes the 8 bytes of `one`, which outlives the call.
    let ret = unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    if ret == 8 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Resets an eventfd counter to zero so that it stops polling readable. A counter that is
/// already zero (`EAGAIN`) is not an error.
pub(crate) fn eventfd_reset(fd: &OwnedFd) -> io::Result<()> {
    let mut count: u64 = 0;
    // SAFETY: reads at most 8 bytes into `count`, which outlives the call.
    let ret = unsafe { libc::read(fd.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
    if ret == 8 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.kind() == io::ErrorKind::WouldBlock {
        Ok(())
    } else {
        Err(err)
    }
}
