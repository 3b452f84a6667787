//! An AF_XDP port in copy mode: frames an XDP program on the interface redirects to this
//! socket (an XSKMAP entry for the queue) arrive in a receive ring over memory shared with the
//! kernel, and frames to send are written into that memory and named in a transmit ring. No
//! copy through the kernel's network stack on the way in. One socket per interface, on queue 0:
//! an interface with more receive queues is refused, since a frame redirected from another
//! queue would be dropped. Frames up to 1,792 bytes (a chunk less the kernel's headroom).

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::afpacket::if_index;
use crate::batch::{Batch, FRAME_CAP};
use crate::port::{Port, PortStats};
use crate::sys::{self, cvt};

/// Frames of the shared memory: half for receiving, half for sending.
const FRAMES: u32 = 4096;
/// Entries of each ring.
const RING: u32 = 2048;
/// One frame's room in the shared memory.
const CHUNK: u32 = FRAME_CAP as u32;

/// One of the four rings: a producer and a consumer index over `size` entries of `T`.
struct Ring<T> {
    map: *mut libc::c_void,
    map_len: usize,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    descs: *mut T,
    mask: u32,
}

impl<T> Ring<T> {
    /// Maps the ring of `fd` at `pgoff` whose offsets the kernel gave.
    fn map(fd: RawFd, off: &libc::xdp_ring_offset, pgoff: u64) -> io::Result<Ring<T>> {
        let map_len = off.desc as usize + RING as usize * size_of::<T>();
        // SAFETY: a shared mapping of the socket's ring, of the length the kernel's offsets
        // give for RING entries; checked against MAP_FAILED below.
        let map = unsafe {
            libc::mmap(
                ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                pgoff as libc::off_t,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = map.cast::<u8>();
        // SAFETY: the offsets lie within the mapping, as the kernel laid it out; the indices
        // are 4-byte aligned u32s that the kernel updates concurrently, hence atomics.
        unsafe {
            Ok(Ring {
                map,
                map_len,
                producer: base.add(off.producer as usize).cast(),
                consumer: base.add(off.consumer as usize).cast(),
                descs: base.add(off.desc as usize).cast(),
                mask: RING - 1,
            })
        }
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: points into the mapping, alive as long as `self`.
        unsafe { &*self.producer }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as above.
        unsafe { &*self.consumer }
    }

    /// Entry `i` (modulo the ring's size).
    fn slot(&self, i: u32) -> *mut T {
        // SAFETY: `i & mask` is below RING, the number of entries mapped.
        unsafe { self.descs.add((i & self.mask) as usize) }
    }
}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`, used by nothing after this.
        unsafe { libc::munmap(self.map, self.map_len) };
    }
}

/// The frames shared with the kernel, unmapped when dropped.
struct Umem {
    ptr: *mut u8,
}

impl Drop for Umem {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `AfXdp::open`, of that length, used by nothing after this.
        unsafe { libc::munmap(self.ptr.cast(), (FRAMES * CHUNK) as usize) };
    }
}

/// An AF_XDP socket on an interface's queue 0, in copy mode. Fields drop in order: the rings
/// are unmapped, the socket closed, and only then the frames unmapped.
pub struct AfXdp {
    name: String,
    ifindex: u32,
    mac: [u8; 6],
    rx: Ring<libc::xdp_desc>,
    tx: Ring<libc::xdp_desc>,
    fill: Ring<u64>,
    comp: Ring<u64>,
    fd: OwnedFd,
    /// Frames of the shared memory free for sending.
    free: Vec<u64>,
    stats: PortStats,
    umem: Umem,
}

// SAFETY: the raw pointers address memory this value maps and owns alone (the shared frames
// and the rings); nothing else in the process refers to them.
unsafe impl Send for AfXdp {}

impl AfXdp {
    /// Opens an AF_XDP socket on `ifname`'s queue 0 with its shared memory and rings, in copy
    /// mode. Frames reach it only once an XDP program redirects them into an XSKMAP holding
    /// [`AfXdp::fd`] at index 0. `mac` is the interface's address, for [`Port::mac`].
    pub fn open(ifname: &str, mac: [u8; 6]) -> io::Result<AfXdp> {
        let ctx = |what: &str, e: io::Error| {
            io::Error::new(e.kind(), format!("AF_XDP on {ifname}: {what}: {e}"))
        };
        let ifindex = if_index(ifname).map_err(|e| ctx("no such interface", e))?;
        let queues = std::fs::read_dir(format!("/sys/class/net/{ifname}/queues"))
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
                    .count()
            })
            .unwrap_or(1);
        if queues > 1 {
            return Err(ctx(
                "one receive queue needed",
                io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("it has {queues}; frames from the others would be dropped"),
                ),
            ));
        }
        // SAFETY: plain socket(2); the result is checked.
        let raw =
            cvt(unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) })
                .map_err(|e| ctx("socket", e))?;
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let umem_len = (FRAMES * CHUNK) as usize;
        // SAFETY: an anonymous private mapping; checked against MAP_FAILED.
        let umem = unsafe {
            libc::mmap(
                ptr::null_mut(),
                umem_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if umem == libc::MAP_FAILED {
            return Err(ctx("mapping the frames", io::Error::last_os_error()));
        }
        let reg = libc::xdp_umem_reg {
            addr: umem as u64,
            len: umem_len as u64,
            chunk_size: CHUNK,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        let setup = || -> io::Result<AfXdp> {
            sys::setsockopt(raw, libc::SOL_XDP, libc::XDP_UMEM_REG, &reg)
                .map_err(|e| ctx("registering the frames", e))?;
            for opt in [
                libc::XDP_UMEM_FILL_RING,
                libc::XDP_UMEM_COMPLETION_RING,
                libc::XDP_RX_RING,
                libc::XDP_TX_RING,
            ] {
                sys::setsockopt(raw, libc::SOL_XDP, opt, &RING)
                    .map_err(|e| ctx("sizing a ring", e))?;
            }
            // SAFETY: xdp_mmap_offsets is plain data; the kernel fills it.
            let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
            sys::getsockopt(raw, libc::SOL_XDP, libc::XDP_MMAP_OFFSETS, &mut off)
                .map_err(|e| ctx("reading the ring offsets", e))?;
            let rx = Ring::map(raw, &off.rx, libc::XDP_PGOFF_RX_RING as u64)
                .map_err(|e| ctx("mapping the receive ring", e))?;
            let tx = Ring::map(raw, &off.tx, libc::XDP_PGOFF_TX_RING as u64)
                .map_err(|e| ctx("mapping the transmit ring", e))?;
            let fill: Ring<u64> = Ring::map(raw, &off.fr, libc::XDP_UMEM_PGOFF_FILL_RING)
                .map_err(|e| ctx("mapping the fill ring", e))?;
            let comp = Ring::map(raw, &off.cr, libc::XDP_UMEM_PGOFF_COMPLETION_RING)
                .map_err(|e| ctx("mapping the completion ring", e))?;
            // The first half of the frames waits in the fill ring for what arrives.
            let half = FRAMES / 2;
            for i in 0..half.min(RING) {
                // SAFETY: a slot of the fill ring, which nobody else writes before the
                // producer index below is published.
                unsafe { fill.slot(i).write(u64::from(i * CHUNK)) };
            }
            fill.producer().store(half.min(RING), Ordering::Release);
            let addr = libc::sockaddr_xdp {
                sxdp_family: libc::AF_XDP as u16,
                sxdp_flags: libc::XDP_COPY,
                sxdp_ifindex: ifindex,
                sxdp_queue_id: 0,
                sxdp_shared_umem_fd: 0,
            };
            // SAFETY: `addr` is a complete sockaddr_xdp and the length passed is its size.
            cvt(unsafe {
                libc::bind(
                    raw,
                    (&addr as *const libc::sockaddr_xdp).cast(),
                    size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
                )
            })
            .map_err(|e| ctx("bind (copy mode, queue 0)", e))?;
            Ok(AfXdp {
                name: ifname.to_owned(),
                ifindex,
                mac,
                fd: fd.try_clone()?,
                rx,
                tx,
                fill,
                comp,
                free: (half..FRAMES).map(|i| u64::from(i * CHUNK)).collect(),
                stats: PortStats::default(),
                umem: Umem { ptr: umem.cast() },
            })
        };
        let port = setup();
        if port.is_err() {
            // SAFETY: the frames mapped above, used by nothing now that setup failed.
            unsafe { libc::munmap(umem, umem_len) };
        }
        port
    }

    /// The socket, for the XSKMAP entry that sends frames here.
    pub fn socket(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Frames the kernel finished sending go back to the free list.
    fn reap(&mut self) {
        let prod = self.comp.producer().load(Ordering::Acquire);
        let mut cons = self.comp.consumer().load(Ordering::Relaxed);
        while cons != prod {
            // SAFETY: a completion slot between consumer and producer, which the kernel wrote.
            self.free.push(unsafe { self.comp.slot(cons).read() });
            cons = cons.wrapping_add(1);
        }
        self.comp.consumer().store(cons, Ordering::Release);
    }

    fn frame_mut(&mut self, addr: u64, len: usize) -> &mut [u8] {
        // SAFETY: `addr` is a chunk offset below FRAMES * CHUNK and `len` at most CHUNK, so
        // the slice lies within the mapping, which this port alone writes while it owns the
        // chunk (not in the kernel's rings).
        unsafe { std::slice::from_raw_parts_mut(self.umem.ptr.add(addr as usize), len) }
    }
}

impl Port for AfXdp {
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
        self.rx.producer().load(Ordering::Acquire) != self.rx.consumer().load(Ordering::Relaxed)
    }

    fn recv(&mut self, batch: &mut Batch) -> io::Result<usize> {
        batch.clear();
        let prod = self.rx.producer().load(Ordering::Acquire);
        let mut cons = self.rx.consumer().load(Ordering::Relaxed);
        let mut fill = self.fill.producer().load(Ordering::Relaxed);
        while cons != prod && !batch.is_full() {
            // SAFETY: a receive slot between consumer and producer, which the kernel wrote.
            let desc = unsafe { self.rx.slot(cons).read() };
            cons = cons.wrapping_add(1);
            let len = desc.len as usize;
            let chunk = desc.addr & !u64::from(CHUNK - 1);
            if chunk >= u64::from(FRAMES * CHUNK) {
                // Not one of ours: nothing to read, nothing to give back.
                self.stats.rx_errors += 1;
                continue;
            }
            if len <= FRAME_CAP && desc.addr + len as u64 <= chunk + u64::from(CHUNK) {
                let addr = desc.addr;
                let frame = self.frame_mut(addr, len).to_vec();
                batch.push(&frame);
                self.stats.rx_packets += 1;
                self.stats.rx_bytes += len as u64;
            } else {
                self.stats.rx_errors += 1;
            }
            // The chunk goes back to the kernel for the next frame.
            // SAFETY: a fill slot past the producer index, not yet published.
            unsafe { self.fill.slot(fill).write(chunk) };
            fill = fill.wrapping_add(1);
        }
        self.rx.consumer().store(cons, Ordering::Release);
        self.fill.producer().store(fill, Ordering::Release);
        Ok(batch.len())
    }

    fn send(&mut self, frames: &[&[u8]]) -> io::Result<usize> {
        self.reap();
        let mut prod = self.tx.producer().load(Ordering::Relaxed);
        let cons = self.tx.consumer().load(Ordering::Acquire);
        let mut done = 0;
        for frame in frames {
            if frame.len() < 14 || frame.len() > FRAME_CAP {
                self.stats.tx_dropped += 1;
                done += 1;
                continue;
            }
            if prod.wrapping_sub(cons) >= RING {
                break;
            }
            let Some(addr) = self.free.pop() else { break };
            self.frame_mut(addr, frame.len()).copy_from_slice(frame);
            let desc = libc::xdp_desc {
                addr,
                len: frame.len() as u32,
                options: 0,
            };
            // SAFETY: a transmit slot past the producer index, not yet published.
            unsafe { self.tx.slot(prod).write(desc) };
            prod = prod.wrapping_add(1);
            self.stats.tx_packets += 1;
            self.stats.tx_bytes += frame.len() as u64;
            done += 1;
        }
        self.tx.producer().store(prod, Ordering::Release);
        // Copy mode sends only when asked.
        // SAFETY: sendto with no data on the socket: the kernel's signal to transmit.
        let ret = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                ptr::null(),
                0,
            )
        };
        if ret < 0 {
            let e = io::Error::last_os_error();
            let retry = matches!(
                e.raw_os_error(),
                Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::EINTR)
            );
            if !retry && done == 0 {
                return Err(e);
            }
        }
        Ok(done)
    }

    fn stats(&self) -> PortStats {
        self.stats
    }
}
