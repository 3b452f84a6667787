//! Unix sequenced-packet sockets (`SOCK_SEQPACKET`): the local channel between a switch and
//! the agents on its CPU path. Each send is one message, delivered whole, in order, or not at
//! all; the kernel holds a bounded queue of them per connection, so a sender that outpaces its
//! reader is told so (`WouldBlock`) rather than losing messages silently. The listening socket
//! is a file: its mode and the peer's credentials say who may connect.

use std::ffi::OsStr;
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::sys::{cvt, getsockopt, setsockopt};

/// The longest message either side sends: a jumbo frame and its header.
pub const MAX_MESSAGE: usize = 9216;

fn socket(nonblocking: bool) -> io::Result<OwnedFd> {
    let flags = libc::SOCK_SEQPACKET
        | libc::SOCK_CLOEXEC
        | if nonblocking { libc::SOCK_NONBLOCK } else { 0 };
    // SAFETY: plain system call with constant arguments.
    let fd = cvt(unsafe { libc::socket(libc::AF_UNIX, flags, 0) })?;
    // SAFETY: `fd` was just returned by socket and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn address(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is a plain C struct for which all zero bytes are valid.
    let mut addr: libc::sockaddr_un = unsafe { zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = OsStr::as_bytes(path.as_os_str());
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: a socket path has 1 to {} bytes and no NUL",
                path.display(),
                addr.sun_path.len() - 1
            ),
        ));
    }
    for (dst, &b) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = b as libc::c_char;
    }
    let len = size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

/// A listening socket, non-blocking: [`SeqListener::accept`] returns `None` when nobody waits.
#[derive(Debug)]
pub struct SeqListener {
    fd: OwnedFd,
}

impl SeqListener {
    /// Listens at `path`, which must not exist, readable and writable by the owner only.
    pub fn bind(path: &Path) -> io::Result<SeqListener> {
        let fd = socket(true)?;
        let (addr, len) = address(path)?;
        // SAFETY: `addr` is a valid sockaddr_un of `len` bytes that outlives the call.
        cvt(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast(),
                len,
            )
        })?;
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        // SAFETY: plain system call on a socket this function owns.
        cvt(unsafe { libc::listen(fd.as_raw_fd(), 16) })?;
        Ok(SeqListener { fd })
    }

    /// A waiting connection, non-blocking, or `None`.
    pub fn accept(&self) -> io::Result<Option<SeqConn>> {
        // SAFETY: null address arguments are allowed: the peer's address is not wanted.
        let ret = unsafe {
            libc::accept4(
                self.fd.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            )
        };
        match cvt(ret) {
            Ok(fd) => Ok(Some(SeqConn {
                // SAFETY: `fd` was just returned by accept4 and is owned by nobody else.
                fd: unsafe { OwnedFd::from_raw_fd(fd) },
            })),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// One end of a connection.
#[derive(Debug)]
pub struct SeqConn {
    fd: OwnedFd,
}

impl SeqConn {
    /// Connects to the listener at `path`; the connection blocks on send and receive.
    pub fn connect(path: &Path) -> io::Result<SeqConn> {
        let fd = socket(false)?;
        let (addr, len) = address(path)?;
        // SAFETY: `addr` is a valid sockaddr_un of `len` bytes that outlives the call.
        cvt(unsafe {
            libc::connect(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast(),
                len,
            )
        })?;
        Ok(SeqConn { fd })
    }

    /// Sends `msg` as one message. On a non-blocking end a full queue is `WouldBlock`; a
    /// peer gone is an error, never a signal.
    pub fn send(&self, msg: &[u8]) -> io::Result<()> {
        // SAFETY: `msg` points to `msg.len()` readable bytes for the duration of the call.
        let ret = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Receives one message into `buf`; `Ok(0)` is the peer's close. A message longer than
    /// `buf` is an error (its tail would be lost).
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv_with(buf, 0)
    }

    /// [`SeqConn::recv`] that never waits: `WouldBlock` when no message is there.
    pub fn try_recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv_with(buf, libc::MSG_DONTWAIT)
    }

    fn recv_with(&self, buf: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
        // SAFETY: `buf` points to `buf.len()` writable bytes for the duration of the call.
        let ret = unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_TRUNC | flags,
            )
        };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = ret as usize;
        if n > buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "a message of {n} bytes, past the {} this end takes",
                    buf.len()
                ),
            ));
        }
        Ok(n)
    }

    /// Waits at most `timeout` for a message before [`SeqConn::recv`] gives up with
    /// `WouldBlock` (none: wait for ever).
    pub fn set_read_timeout(&self, timeout: Option<std::time::Duration>) -> io::Result<()> {
        setsockopt(
            self.fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &timeval(timeout),
        )
    }

    /// Waits at most `timeout` for room before [`SeqConn::send`] on a blocking end gives up
    /// with `WouldBlock` (none: wait for ever).
    pub fn set_write_timeout(&self, timeout: Option<std::time::Duration>) -> io::Result<()> {
        setsockopt(
            self.fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            &timeval(timeout),
        )
    }

    /// The bytes of messages the kernel queues for the peer to read.
    pub fn set_send_buffer(&self, bytes: usize) -> io::Result<()> {
        let v = bytes.min(i32::MAX as usize) as libc::c_int;
        setsockopt(self.fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_SNDBUF, &v)
    }

    /// The user id of the process at the other end, as the kernel saw it connect.
    pub fn peer_uid(&self) -> io::Result<u32> {
        let mut cred = libc::ucred {
            pid: 0,
            uid: u32::MAX,
            gid: u32::MAX,
        };
        let len = getsockopt(
            self.fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred,
        )?;
        if len != size_of::<libc::ucred>() {
            return Err(io::Error::other("the peer's credentials were cut short"));
        }
        Ok(cred.uid)
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// A socket timeout: at least a microsecond when given, since zero means for ever.
fn timeval(timeout: Option<std::time::Duration>) -> libc::timeval {
    let micros = timeout.map_or(0, |t| t.as_micros().max(1));
    libc::timeval {
        tv_sec: (micros / 1_000_000).min(i32::MAX as u128) as libc::time_t,
        tv_usec: (micros % 1_000_000) as libc::suseconds_t,
    }
}

/// This process's effective user id.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid cannot fail and has no arguments.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_arrive_whole_and_in_order_and_a_full_queue_says_so() {
        let dir = std::env::temp_dir().join(format!("kvio-seq-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        let listener = SeqListener::bind(&dir).unwrap();
        assert!(listener.accept().unwrap().is_none());
        let client = SeqConn::connect(&dir).unwrap();
        let server = listener.accept().unwrap().expect("a connection waits");
        assert_eq!(server.peer_uid().unwrap(), effective_uid());
        for i in 0..10u8 {
            client.send(&[i; 100][..usize::from(i) + 1]).unwrap();
        }
        let mut buf = [0u8; 256];
        for i in 0..10u8 {
            let n = server.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], &[i; 100][..usize::from(i) + 1]);
        }
        // The server's end does not block: a queue the client does not read fills.
        server.set_send_buffer(4096).unwrap();
        let mut sent = 0;
        let full = loop {
            match server.send(&[7u8; 1000]) {
                Ok(()) => sent += 1,
                Err(e) => break e,
            }
            assert!(sent < 100_000, "the queue never filled");
        };
        assert_eq!(full.kind(), io::ErrorKind::WouldBlock);
        let mut big = [0u8; 2000];
        for _ in 0..sent {
            assert_eq!(client.recv(&mut big).unwrap(), 1000);
        }
        // Too long for the buffer: an error, not a cut message.
        client.send(&[1u8; 300]).unwrap();
        assert_eq!(
            server.recv(&mut buf).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        drop(client);
        assert_eq!(server.recv(&mut buf).unwrap(), 0);
        assert!(SeqListener::bind(&dir).is_err(), "the path is taken");
        std::fs::remove_file(&dir).unwrap();
        assert!(SeqListener::bind(Path::new("")).is_err());
    }
}
