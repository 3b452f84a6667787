//! A send-only packet socket for a host that writes whole frames of its own: SwitchKV's
//! clients, whose queries carry their key in the destination MAC, and a cache node that sends
//! a query it cannot answer back through the switch. It is opened on the interface that holds
//! one of the host's IPv4 addresses and receives nothing.

use std::ffi::CStr;
use std::io;
use std::mem::size_of;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::afpacket::{if_index, local_mac, sockaddr_ll};
use crate::sys::cvt;

/// Frames out of one interface.
#[derive(Debug)]
pub struct FrameSender {
    fd: OwnedFd,
    mac: [u8; 6],
}

impl FrameSender {
    /// Opens the sender on the interface that holds `ip`; needs `CAP_NET_RAW`.
    pub fn on_address(ip: Ipv4Addr) -> io::Result<FrameSender> {
        let ifname = interface_holding(ip)?;
        let ifindex = if_index(&ifname)?;
        // Protocol 0: no frame is ever delivered to this socket.
        // SAFETY: socket(2) takes no pointers; the descriptor is owned at once below.
        let raw =
            cvt(unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) })
                .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("a packet socket (it needs CAP_NET_RAW): {e}"),
                )
            })?;
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let addr = sockaddr_ll(ifindex);
        // SAFETY: `addr` is a valid sockaddr_ll that outlives the call; the length is its size.
        cvt(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_ll).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        })?;
        let mac = local_mac(fd.as_raw_fd())?;
        Ok(FrameSender { fd, mac })
    }

    /// The interface's hardware address: the source of the frames it sends.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// Sends one whole frame without waiting; a full queue is an error of kind `WouldBlock`.
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        // SAFETY: the buffer is borrowed for the call and the kernel only reads `frame.len()`
        // bytes of it.
        let n = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// The name of the interface that holds `ip`.
fn interface_holding(ip: Ipv4Addr) -> io::Result<String> {
    let mut addrs: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into `addrs`, freed below.
    cvt(unsafe { libc::getifaddrs(&mut addrs) })?;
    let mut found = None;
    let mut at = addrs;
    while !at.is_null() {
        // SAFETY: `at` walks the list getifaddrs returned, valid until it is freed.
        let a = unsafe { &*at };
        at = a.ifa_next;
        if a.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: the address is not null; its family says which sockaddr it is.
        if i32::from(unsafe { (*a.ifa_addr).sa_family }) != libc::AF_INET {
            continue;
        }
        // SAFETY: an AF_INET address is a sockaddr_in.
        let sin = unsafe { &*(a.ifa_addr as *const libc::sockaddr_in) };
        if Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)) == ip {
            // SAFETY: ifa_name is a NUL-terminated string owned by the list.
            let name = unsafe { CStr::from_ptr(a.ifa_name) };
            found = Some(name.to_string_lossy().into_owned());
            break;
        }
    }
    // SAFETY: freed once, after the last use of the list.
    unsafe { libc::freeifaddrs(addrs) };
    found.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no interface holds {ip}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_no_interface_holds_is_refused() {
        let e = FrameSender::on_address(Ipv4Addr::new(192, 0, 2, 77)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("192.0.2.77"), "{e}");
    }

    #[test]
    fn loopback_is_not_an_ethernet_interface() {
        // Loopback has no Ethernet address: refused, never used to send. Without root the
        // packet socket itself is refused first, and says why.
        let e = FrameSender::on_address(Ipv4Addr::LOCALHOST).unwrap_err();
        // SAFETY: geteuid takes no arguments and cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        let why = if root { "Ethernet" } else { "CAP_NET_RAW" };
        assert!(e.to_string().contains(why), "{e}");
    }
}
