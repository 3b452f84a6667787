//! A port on a Linux network interface through an `AF_PACKET` raw socket.
//!
//! Frames are received through a memory-mapped `TPACKET_V2` ring (see `ring`), which costs no
//! system call per batch, or with `recvmmsg` where the ring is turned off or unavailable; they
//! are sent with `sendmmsg`, one system call per batch. Either way each frame is copied once
//! between the kernel and the caller's [`Batch`] or slices. The port never blocks and never
//! allocates on the data path once its scratch space has grown to the largest batch it has seen.

use std::cell::Cell;
use std::ffi::CString;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;

use crate::batch::{Batch, Meta, FRAME_CAP, MAX_BATCH};
use crate::port::{Port, PortStats};
use crate::ring::RxRing;
use crate::sys::{self, cvt};

/// How [`AfPacket::open`] sets up the socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AfPacketOptions {
    /// Put the interface in promiscuous mode while the port is open, so that frames addressed
    /// to any MAC reach the switch. The kernel counts memberships and drops this one when the
    /// socket closes.
    pub promiscuous: bool,
    /// Do not receive the frames this host transmits on the interface (including the port's
    /// own), via `PACKET_IGNORE_OUTGOING` (Linux 4.20 and later).
    pub ignore_outgoing: bool,
    /// Requested socket receive buffer in bytes. Root may exceed `net.core.rmem_max`
    /// (`SO_RCVBUFFORCE`); otherwise the kernel caps it there.
    pub rcvbuf: usize,
    /// Requested socket send buffer in bytes, capped like `rcvbuf` by `net.core.wmem_max`.
    pub sndbuf: usize,
    /// Hand transmitted frames straight to the driver, past the interface's queueing
    /// discipline (`PACKET_QDISC_BYPASS`): cheaper per frame, but traffic shaping on the
    /// interface no longer applies and a full device queue drops instead of queueing.
    pub qdisc_bypass: bool,
    /// Receive through a memory-mapped `TPACKET_V2` ring (8 MiB per port) rather than
    /// `recvmmsg`: no system call to receive a batch or to check for frames
    /// ([`Port::rx_ready`]). If the ring cannot be set up, the port silently receives with
    /// `recvmmsg` instead; [`AfPacket::uses_rx_ring`] tells which. `rcvbuf` only matters
    /// without the ring.
    pub rx_ring: bool,
}

impl Default for AfPacketOptions {
    fn default() -> AfPacketOptions {
        AfPacketOptions {
            promiscuous: true,
            ignore_outgoing: true,
            rcvbuf: 8 << 20,
            sndbuf: 8 << 20,
            qdisc_bypass: true,
            rx_ring: true,
        }
    }
}

/// A switch port bound to one interface. Closing it (drop) releases promiscuous mode.
pub struct AfPacket {
    /// Declared before `fd` so that the ring is unmapped before the socket closes.
    ring: Option<RxRing>,
    fd: OwnedFd,
    name: String,
    ifindex: u32,
    mac: [u8; 6],
    scratch: Scratch,
    stats: PortStats,
    /// Kernel receive-queue drops read so far; reading `PACKET_STATISTICS` resets the kernel's
    /// counter, so they accumulate here.
    kernel_drops: Cell<u64>,
}

impl AfPacket {
    /// Opens a port on interface `ifname`.
    ///
    /// Fails with `NotFound` naming the interface if it does not exist, `InvalidInput` if the
    /// name is malformed or the interface is not Ethernet, and `PermissionDenied` without
    /// `CAP_NET_RAW`. Every error message starts with the interface name.
    pub fn open(ifname: &str, opts: &AfPacketOptions) -> io::Result<AfPacket> {
        let ifindex = if_index(ifname)?;
        if opts.rx_ring {
            // Any failure is retried on a fresh socket without the ring (older kernels, memory
            // limits); if that fails too, its error is the one reported.
            if let Ok(port) = AfPacket::open_socket(ifname, ifindex, opts, true) {
                return Ok(port);
            }
        }
        AfPacket::open_socket(ifname, ifindex, opts, false)
    }

    /// Whether frames are received through the memory-mapped ring (`false`: `recvmmsg`).
    pub fn uses_rx_ring(&self) -> bool {
        self.ring.is_some()
    }

    fn open_socket(
        ifname: &str,
        ifindex: u32,
        opts: &AfPacketOptions,
        with_ring: bool,
    ) -> io::Result<AfPacket> {
        let ctx = |what: &str, err: io::Error| {
            io::Error::new(err.kind(), format!("{ifname}: {what}: {err}"))
        };

        // Protocol 0 until bind: a socket created with ETH_P_ALL would start queueing frames of
        // every interface before it is bound to ours.
        // SAFETY: plain system call with constant arguments.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        let raw = cvt(raw).map_err(|e| ctx("AF_PACKET socket (needs CAP_NET_RAW)", e))?;
        // SAFETY: `raw` is a descriptor we just created and own exclusively.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let sock = fd.as_raw_fd();

        let one: libc::c_int = 1;
        sys::setsockopt(sock, libc::SOL_PACKET, libc::PACKET_AUXDATA, &one)
            .map_err(|e| ctx("setsockopt(PACKET_AUXDATA)", e))?;
        if opts.ignore_outgoing {
            sys::setsockopt(sock, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, &one)
                .map_err(|e| ctx("setsockopt(PACKET_IGNORE_OUTGOING)", e))?;
        }
        if opts.qdisc_bypass {
            sys::setsockopt(sock, libc::SOL_PACKET, libc::PACKET_QDISC_BYPASS, &one)
                .map_err(|e| ctx("setsockopt(PACKET_QDISC_BYPASS)", e))?;
        }
        set_buffer(sock, libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, opts.rcvbuf)
            .map_err(|e| ctx("setsockopt(SO_RCVBUF)", e))?;
        set_buffer(sock, libc::SO_SNDBUFFORCE, libc::SO_SNDBUF, opts.sndbuf)
            .map_err(|e| ctx("setsockopt(SO_SNDBUF)", e))?;

        // The ring must exist before the socket is bound and starts receiving.
        let ring = if with_ring {
            Some(RxRing::new(sock).map_err(|e| ctx("setting up the receive ring", e))?)
        } else {
            None
        };

        let mut addr = sockaddr_ll(ifindex);
        addr.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: `addr` is a fully initialised sockaddr_ll and the length passed is its size.
        let ret = unsafe {
            libc::bind(
                sock,
                (&addr as *const libc::sockaddr_ll).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        cvt(ret).map_err(|e| ctx("bind", e))?;

        if opts.promiscuous {
            let mreq = libc::packet_mreq {
                mr_ifindex: ifindex as libc::c_int,
                mr_type: libc::PACKET_MR_PROMISC as libc::c_ushort,
                mr_alen: 0,
                mr_address: [0; 8],
            };
            sys::setsockopt(sock, libc::SOL_PACKET, libc::PACKET_ADD_MEMBERSHIP, &mreq)
                .map_err(|e| ctx("setsockopt(PACKET_ADD_MEMBERSHIP, promiscuous)", e))?;
        }

        let mac = local_mac(sock).map_err(|e| ctx("reading the MAC address", e))?;
        Ok(AfPacket {
            ring,
            fd,
            name: ifname.to_owned(),
            ifindex,
            mac,
            scratch: Scratch::default(),
            stats: PortStats::default(),
            kernel_drops: Cell::new(0),
        })
    }

    /// Moves the kernel's drop counter into `kernel_drops`.
    fn collect_kernel_drops(&self) {
        let mut st = TpacketStats::default();
        if sys::getsockopt(
            self.fd.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_STATISTICS,
            &mut st,
        )
        .is_ok()
        {
            self.kernel_drops
                .set(self.kernel_drops.get() + u64::from(st.tp_drops));
        }
    }
}

impl Port for AfPacket {
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
        self.fd.as_raw_fd()
    }

    fn rx_ready(&self) -> bool {
        match &self.ring {
            Some(ring) => ring.ready(),
            None => true,
        }
    }

    fn recv(&mut self, batch: &mut Batch) -> io::Result<usize> {
        if let Some(ring) = &mut self.ring {
            let (n, bytes, errors) = ring.recv(batch);
            self.stats.rx_packets += n as u64;
            self.stats.rx_bytes += bytes;
            self.stats.rx_errors += errors;
            return Ok(n);
        }
        batch.clear();
        let n = batch.capacity();
        self.scratch.prepare_recv(batch.as_mut_ptr(), n);
        // SAFETY: `prepare_recv` set up `n` message headers whose iovecs each cover one
        // distinct FRAME_CAP slot of `batch` (which holds `n` slots) and whose control buffers
        // point into `self.scratch.ctrl`; both stay alive and unaliased for the call.
        let ret = unsafe {
            libc::recvmmsg(
                self.fd.as_raw_fd(),
                self.scratch.hdrs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
                ptr::null_mut(),
            )
        };
        let got = match cvt(ret) {
            Ok(got) => got as usize,
            Err(e) if would_block_or_interrupted(&e) => return Ok(0),
            Err(e) => return Err(e),
        };

        let mut kept = 0;
        for i in 0..got {
            let hdr = &self.scratch.hdrs[i];
            let len = hdr.msg_len as usize;
            if hdr.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 || len > FRAME_CAP {
                self.stats.rx_errors += 1;
                continue;
            }
            let aux = auxdata(&hdr.msg_hdr);
            let csum_not_ready =
                aux.is_some_and(|a| a.tp_status & libc::TP_STATUS_CSUMNOTREADY != 0);
            let vlan = aux.and_then(|a| {
                let valid = a.tp_status & libc::TP_STATUS_VLAN_VALID != 0 || a.tp_vlan_tci != 0;
                valid.then_some(a.tp_vlan_tci)
            });
            if kept != i {
                batch.move_slot(i, kept, len);
            }
            batch.set_meta(kept, Meta::new(len, csum_not_ready, vlan));
            kept += 1;
            self.stats.rx_packets += 1;
            self.stats.rx_bytes += len as u64;
        }
        batch.set_len(kept);
        Ok(kept)
    }

    fn send(&mut self, frames: &[&[u8]]) -> io::Result<usize> {
        let mut done = 0;
        while done < frames.len() {
            let chunk = &frames[done..frames.len().min(done + MAX_BATCH)];
            self.scratch.prepare_send(chunk);
            // SAFETY: `prepare_send` set up `chunk.len()` message headers whose iovecs cover
            // the frames of `chunk`, borrowed for the call; the kernel only reads them.
            let ret = unsafe {
                libc::sendmmsg(
                    self.fd.as_raw_fd(),
                    self.scratch.hdrs.as_mut_ptr(),
                    chunk.len() as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            match cvt(ret) {
                // sendmmsg reports at least one frame or an error; treat anything else as a
                // full queue rather than spin.
                Ok(0) => break,
                Ok(sent) => {
                    let sent = (sent as usize).min(chunk.len());
                    for frame in &chunk[..sent] {
                        self.stats.tx_packets += 1;
                        self.stats.tx_bytes += frame.len() as u64;
                    }
                    done += sent;
                }
                Err(e) => match e.raw_os_error() {
                    Some(libc::EINTR) => {}
                    Some(libc::EAGAIN) => break,
                    // About this frame alone: shorter than an Ethernet header, longer than the
                    // MTU, or dropped by the device queue after the kernel took it.
                    Some(libc::EINVAL | libc::EMSGSIZE | libc::ENOBUFS) => {
                        self.stats.tx_dropped += 1;
                        done += 1;
                    }
                    _ if done > 0 => break,
                    // As it is, like recv's: this runs once per batch while an interface is
                    // down, and the caller knows which port it asked.
                    _ => return Err(e),
                },
            }
        }
        Ok(done)
    }

    fn stats(&self) -> PortStats {
        self.collect_kernel_drops();
        PortStats {
            rx_dropped: self.kernel_drops.get(),
            ..self.stats
        }
    }
}

impl std::fmt::Debug for AfPacket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AfPacket")
            .field("name", &self.name)
            .field("ifindex", &self.ifindex)
            .field("fd", &self.fd.as_raw_fd())
            .finish()
    }
}

/// Control-message space per received frame: one `PACKET_AUXDATA` message (40 bytes on 64-bit
/// Linux) with room to spare, aligned for `cmsghdr`.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct CtrlBuf([u8; 64]);

/// Message headers for `recvmmsg`/`sendmmsg`, reused across calls.
#[derive(Default)]
struct Scratch {
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
    ctrl: Vec<CtrlBuf>,
}

// SAFETY: the raw pointers inside `hdrs` and `iovs` are rewritten by `prepare_recv` or
// `prepare_send` before every system call and never dereferenced afterwards, so no pointer is
// ever used from a thread other than the one that set it.
unsafe impl Send for Scratch {}

impl Scratch {
    fn grow(&mut self, n: usize) {
        if self.hdrs.len() >= n {
            return;
        }
        // SAFETY: mmsghdr and iovec are C structs of integers and raw pointers, for which all
        // zero bytes (null pointers, zero lengths) is a valid value.
        let (hdr, iov) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        self.hdrs.resize(n, hdr);
        self.iovs.resize(n, iov);
        self.ctrl.resize(n, CtrlBuf([0; 64]));
    }

    /// Points header `i` at slot `i` of the `n` FRAME_CAP slots starting at `base`.
    fn prepare_recv(&mut self, base: *mut u8, n: usize) {
        self.grow(n);
        for i in 0..n {
            self.iovs[i] = libc::iovec {
                iov_base: base.wrapping_add(i * FRAME_CAP).cast(),
                iov_len: FRAME_CAP,
            };
            let msg = &mut self.hdrs[i].msg_hdr;
            msg.msg_name = ptr::null_mut();
            msg.msg_namelen = 0;
            msg.msg_iov = &mut self.iovs[i];
            msg.msg_iovlen = 1;
            msg.msg_control = self.ctrl[i].0.as_mut_ptr().cast();
            msg.msg_controllen = size_of::<CtrlBuf>() as _;
            msg.msg_flags = 0;
            self.hdrs[i].msg_len = 0;
        }
    }

    /// Points header `i` at `frames[i]`.
    fn prepare_send(&mut self, frames: &[&[u8]]) {
        self.grow(frames.len());
        for (i, frame) in frames.iter().enumerate() {
            self.iovs[i] = libc::iovec {
                // The kernel only reads through this pointer on send.
                iov_base: frame.as_ptr() as *mut libc::c_void,
                iov_len: frame.len(),
            };
            let msg = &mut self.hdrs[i].msg_hdr;
            msg.msg_name = ptr::null_mut();
            msg.msg_namelen = 0;
            msg.msg_iov = &mut self.iovs[i];
            msg.msg_iovlen = 1;
            msg.msg_control = ptr::null_mut();
            msg.msg_controllen = 0;
            msg.msg_flags = 0;
            self.hdrs[i].msg_len = 0;
        }
    }
}

/// The `PACKET_AUXDATA` control message of a received frame, if the kernel attached one.
fn auxdata(msg: &libc::msghdr) -> Option<libc::tpacket_auxdata> {
    // SAFETY: `msg` was filled by recvmmsg: msg_control points to our control buffer and
    // msg_controllen is the length the kernel wrote, which is what the CMSG walk relies on.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(msg) };
    while !cmsg.is_null() {
        // SAFETY: non-null headers returned by the CMSG walk lie within the control buffer.
        let (level, kind, len) =
            unsafe { ((*cmsg).cmsg_level, (*cmsg).cmsg_type, (*cmsg).cmsg_len) };
        // SAFETY: CMSG_LEN is pure arithmetic.
        let need = unsafe { libc::CMSG_LEN(size_of::<libc::tpacket_auxdata>() as u32) };
        if level == libc::SOL_PACKET
            && kind == libc::PACKET_AUXDATA
            && len as u64 >= u64::from(need)
        {
            // SAFETY: the message is long enough to hold a tpacket_auxdata after its header;
            // the read is unaligned-safe.
            return Some(unsafe {
                ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::tpacket_auxdata>())
            });
        }
        // SAFETY: `cmsg` is a valid header within `msg`'s control buffer.
        cmsg = unsafe { libc::CMSG_NXTHDR(msg, cmsg) };
    }
    None
}

/// `struct tpacket_stats` from linux/if_packet.h.
#[derive(Clone, Copy, Default)]
#[repr(C)]
struct TpacketStats {
    tp_packets: u32,
    tp_drops: u32,
}

fn would_block_or_interrupted(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

/// Resolves an interface name, with errors that name it.
pub(crate) fn if_index(ifname: &str) -> io::Result<u32> {
    if ifname.is_empty() || ifname.len() >= libc::IFNAMSIZ || ifname.contains(['\0', '/']) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("`{ifname}` is not a valid interface name"),
        ));
    }
    let cname = CString::new(ifname).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: `cname` is a NUL-terminated string that outlives the call.
    let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    if index == 0 {
        let err = io::Error::last_os_error();
        let kind = match err.raw_os_error() {
            Some(libc::ENODEV) | Some(libc::ENXIO) => io::ErrorKind::NotFound,
            _ => err.kind(),
        };
        return Err(io::Error::new(
            kind,
            format!("interface `{ifname}` does not exist ({err})"),
        ));
    }
    Ok(index)
}

pub(crate) fn sockaddr_ll(ifindex: u32) -> libc::sockaddr_ll {
    libc::sockaddr_ll {
        sll_family: libc::AF_PACKET as libc::c_ushort,
        sll_protocol: 0,
        sll_ifindex: ifindex as libc::c_int,
        sll_hatype: 0,
        sll_pkttype: 0,
        sll_halen: 0,
        sll_addr: [0; 8],
    }
}

/// Sets a socket buffer size, beyond the sysctl cap if privileged.
fn set_buffer(sock: RawFd, force: libc::c_int, plain: libc::c_int, bytes: usize) -> io::Result<()> {
    let bytes = bytes.min(libc::c_int::MAX as usize) as libc::c_int;
    sys::setsockopt(sock, libc::SOL_SOCKET, force, &bytes)
        .or_else(|_| sys::setsockopt(sock, libc::SOL_SOCKET, plain, &bytes))
}

/// The hardware address of the interface a bound packet socket is on; the kernel reports it
/// through `getsockname`.
pub(crate) fn local_mac(sock: RawFd) -> io::Result<[u8; 6]> {
    let mut addr = sockaddr_ll(0);
    let mut len = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
    // SAFETY: `addr` is a writable sockaddr_ll and `len` its size; the kernel writes at most
    // `len` bytes.
    let ret =
        unsafe { libc::getsockname(sock, (&mut addr as *mut libc::sockaddr_ll).cast(), &mut len) };
    cvt(ret)?;
    if addr.sll_hatype != libc::ARPHRD_ETHER || addr.sll_halen != 6 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "not an Ethernet interface (hardware type {}, address length {})",
                addr.sll_hatype, addr.sll_halen
            ),
        ));
    }
    let mut mac = [0; 6];
    mac.copy_from_slice(&addr.sll_addr[..6]);
    Ok(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_names_are_rejected_with_the_name() {
        for name in ["", "a-name-longer-than-ifnamsiz", "a/b", "nul\0"] {
            let err = if_index(name).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{name:?}");
        }
        let err = if_index("kvsw-missing0").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(err.to_string().contains("kvsw-missing0"), "{err}");
    }

    #[test]
    fn auxdata_fits_control_buffer() {
        // SAFETY: CMSG_SPACE is pure arithmetic.
        let space = unsafe { libc::CMSG_SPACE(size_of::<libc::tpacket_auxdata>() as u32) };
        assert!(space as usize <= size_of::<CtrlBuf>());
    }
}
