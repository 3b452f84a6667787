//! A TUN device: a network interface whose IP packets are read and written by this process.
//!
//! The kernel routes packets to the device like to any interface; [`Tun::read`] returns each as
//! an IP packet (no link header, no packet-information prefix), and [`Tun::write`] hands one to
//! the kernel as if it had arrived on the device. The device exists while the descriptor is
//! open.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::sys::cvt;

/// An open TUN device; dropping it removes the device.
pub struct Tun {
    fd: OwnedFd,
    name: String,
}

impl Tun {
    /// Creates TUN device `name` (or attaches to an existing one of that name). Fails with
    /// `InvalidInput` for a malformed name and `PermissionDenied` without `CAP_NET_ADMIN`; every
    /// message names the device.
    pub fn open(name: &str) -> io::Result<Tun> {
        if !crate::link::valid_ifname(name) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("`{name}` is not a valid interface name"),
            ));
        }
        let ctx = |what: &str, err: io::Error| {
            io::Error::new(err.kind(), format!("{name}: {what}: {err}"))
        };
        let path = CString::new("/dev/net/tun").map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: `path` is a NUL-terminated string that outlives the call.
        let raw = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        let raw = cvt(raw).map_err(|e| ctx("opening /dev/net/tun", e))?;
        // SAFETY: `raw` is a descriptor we just opened and own exclusively.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: `ifreq` is a C structure of integers, arrays and a union of them; all zeroes
        // is a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
            *dst = src as libc::c_char;
        }
        req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
        // SAFETY: TUNSETIFF reads and writes one `ifreq`, which lives across the call.
        let ret = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut req) };
        cvt(ret).map_err(|e| ctx("TUNSETIFF", e))?;
        Ok(Tun {
            fd,
            name: name.to_string(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Reads one packet into `buf`, waiting at most `timeout`; `Ok(0)` when none came. A
    /// packet longer than `buf` is cut to its length.
    pub fn read(&self, buf: &mut [u8], timeout: Duration) -> io::Result<usize> {
        let mut ready = Vec::with_capacity(1);
        crate::port::wait_readable(&[self.fd()], timeout, &mut ready)?;
        if ready.is_empty() {
            return Ok(0);
        }
        // SAFETY: `buf` is valid for `buf.len()` writable bytes for the call.
        let n = unsafe { libc::read(self.fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let err = io::Error::last_os_error();
            return match err.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(0),
                _ => Err(io::Error::new(
                    err.kind(),
                    format!("{}: read: {err}", self.name),
                )),
            };
        }
        Ok(n as usize)
    }

    /// Hands one IP packet to the kernel as received on the device.
    pub fn write(&self, packet: &[u8]) -> io::Result<()> {
        // SAFETY: `packet` is valid for `packet.len()` readable bytes for the call.
        let n = unsafe { libc::write(self.fd(), packet.as_ptr().cast(), packet.len()) };
        if n < 0 {
            let err = io::Error::last_os_error();
            return Err(io::Error::new(
                err.kind(),
                format!("{}: write: {err}", self.name),
            ));
        }
        Ok(())
    }
}
