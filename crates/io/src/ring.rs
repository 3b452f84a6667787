//! A `TPACKET_V2` receive ring: the kernel writes frames into memory shared with the port, so
//! receiving and checking for frames take no system call.
//!
//! The ring is `FRAME_NR` slots of `FRAME_SIZE` bytes, packed `FRAMES_PER_BLOCK` to a block of
//! `BLOCK_SIZE`. The kernel fills the slots in order and hands each over as soon as it holds a
//! frame (slot status `TP_STATUS_USER`); the port copies the frame out and hands the slot back
//! (`TP_STATUS_KERNEL`).
//!
//! `TPACKET_V3`, which packs frames of any length into blocks, was tried and rejected: it hands
//! a block to user space only when the block is full or its retire timer (at least 1 ms) fires,
//! which at a few thousand frames per second adds about a millisecond to every frame.
//!
//! Everything the kernel wrote is treated as untrusted: offsets and lengths are checked against
//! the slot before they are used, and a bad one costs that frame (counted as an error), never
//! memory safety.

use std::io;
use std::os::fd::RawFd;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::batch::{Batch, Meta, FRAME_CAP};
use crate::sys;

/// Bytes per slot: a [`FRAME_CAP`] frame plus the slot header and the padding the kernel puts
/// before the Ethernet header (`tp_mac` is 66 on 64-bit Linux: the 32-byte `tpacket2_hdr` and a
/// 20-byte `sockaddr_ll`, aligned so that the network header lands on 16 bytes). A multiple of
/// the kernel's 16-byte `TPACKET_ALIGNMENT`.
const FRAME_SIZE: usize = FRAME_CAP + 128;
/// Bytes per block; the kernel allocates the ring a block at a time and a slot never spans two
/// blocks. 64 KiB holds 30 slots, leaving 256 bytes unused.
const BLOCK_SIZE: usize = 64 << 10;
const FRAMES_PER_BLOCK: usize = BLOCK_SIZE / FRAME_SIZE;
/// Blocks in the ring: 8 MiB and 3840 slots, as much slack as the 8 MiB socket buffer gives
/// small frames on the `recvmmsg` path.
const BLOCK_NR: usize = 128;
const FRAME_NR: usize = FRAMES_PER_BLOCK * BLOCK_NR;

/// Field offsets of `struct tpacket2_hdr` (linux/if_packet.h).
mod field {
    pub const STATUS: usize = 0;
    pub const LEN: usize = 4;
    pub const SNAPLEN: usize = 8;
    /// `tp_mac` and `tp_net` share this 4-byte word; `tp_mac` is the low half.
    pub const MAC_NET: usize = 12;
    /// `tp_vlan_tci` and `tp_vlan_tpid` share this word; `tp_vlan_tci` is the low half.
    pub const VLAN: usize = 24;
    /// Header size.
    pub const HDR_LEN: usize = 32;
}

/// The ring layout `RxRing` reads.
const TPACKET_V2: libc::c_int = libc::tpacket_versions::TPACKET_V2 as libc::c_int;

/// A shared mapping of a packet socket's ring, unmapped on drop.
struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base` and `len` describe a mapping created by `mmap` in `RxRing::new` and
        // owned by this value alone; nothing refers to it after drop.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// The receive ring of one packet socket.
pub(crate) struct RxRing {
    map: Mapping,
    /// Index of the slot the kernel fills next after the ones already handed over, i.e. the
    /// slot to read next.
    next: usize,
}

// SAFETY: the mapping belongs to this ring alone; the kernel is the only other party, and the
// hand-over of each slot through its status word works the same from any thread.
unsafe impl Send for RxRing {}

impl RxRing {
    /// Switches `sock` to `TPACKET_V2` and maps a receive ring for it. Must be called before the
    /// socket is bound. On failure the socket may be left with a version set but no ring; the
    /// caller should close it.
    pub(crate) fn new(sock: RawFd) -> io::Result<RxRing> {
        sys::setsockopt(sock, libc::SOL_PACKET, libc::PACKET_VERSION, &TPACKET_V2)?;
        let req = libc::tpacket_req {
            tp_block_size: BLOCK_SIZE as u32,
            tp_block_nr: BLOCK_NR as u32,
            tp_frame_size: FRAME_SIZE as u32,
            tp_frame_nr: FRAME_NR as u32,
        };
        sys::setsockopt(sock, libc::SOL_PACKET, libc::PACKET_RX_RING, &req)?;
        let len = BLOCK_SIZE * BLOCK_NR;
        // SAFETY: maps `len` bytes of the socket's ring, which the kernel just allocated with
        // exactly that size; no existing memory is touched.
        let addr = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                sock,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(addr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap"))?;
        Ok(RxRing {
            map: Mapping { base, len },
            next: 0,
        })
    }

    /// Whether a frame is waiting. One memory read, no system call.
    pub(crate) fn ready(&self) -> bool {
        self.status(self.next).load(Ordering::Acquire) & libc::TP_STATUS_USER != 0
    }

    /// Clears `batch` and copies up to `batch.capacity()` waiting frames into it, handing each
    /// slot back to the kernel once copied. Returns `(frames, bytes, errors)`: frames and bytes
    /// delivered, and frames dropped as unusable (truncated to the slot, larger than
    /// [`FRAME_CAP`], or described by offsets outside their slot).
    pub(crate) fn recv(&mut self, batch: &mut Batch) -> (usize, u64, u64) {
        batch.clear();
        let (mut n, mut bytes, mut errors) = (0, 0u64, 0u64);
        while n < batch.capacity() {
            let slot = self.next;
            // Acquire: the kernel stores the status (after a write barrier) once the frame and
            // the rest of the header are written, so they are visible after this load.
            let status = self.status(slot).load(Ordering::Acquire);
            if status & libc::TP_STATUS_USER == 0 {
                break;
            }
            match self.frame_info(slot) {
                Some((data, len, vlan_tci)) => {
                    let dst = batch.slot_mut(n);
                    // SAFETY: `frame_info` checked that `data + len` lies within the slot, which
                    // is ours until its status is stored back below; `len <= FRAME_CAP ==
                    // dst.len()`, and the ring and the batch never overlap.
                    unsafe { ptr::copy_nonoverlapping(data, dst.as_mut_ptr(), len) };
                    let csum_not_ready = status & libc::TP_STATUS_CSUMNOTREADY != 0;
                    let vlan = (status & libc::TP_STATUS_VLAN_VALID != 0 || vlan_tci != 0)
                        .then_some(vlan_tci);
                    batch.set_meta(n, Meta::new(len, csum_not_ready, vlan));
                    n += 1;
                    bytes += len as u64;
                }
                None => errors += 1,
            }
            // Release: our reads of the slot happen before the kernel may reuse it.
            self.status(slot)
                .store(libc::TP_STATUS_KERNEL, Ordering::Release);
            self.next = (slot + 1) % FRAME_NR;
        }
        batch.set_len(n);
        (n, bytes, errors)
    }

    /// The Ethernet header's address, the frame length and the VLAN TCI of the user-owned
    /// `slot`, or `None` if the frame is unusable: cut short by the slot (`tp_snaplen <
    /// tp_len`), longer than [`FRAME_CAP`], or placed by the header outside the slot.
    fn frame_info(&self, slot: usize) -> Option<(*const u8, usize, u16)> {
        let len = self.read_u32(slot, field::LEN) as usize;
        let snaplen = self.read_u32(slot, field::SNAPLEN) as usize;
        let mac = (self.read_u32(slot, field::MAC_NET) & 0xffff) as usize;
        let vlan_tci = (self.read_u32(slot, field::VLAN) & 0xffff) as u16;
        if snaplen < len || len > FRAME_CAP || mac < field::HDR_LEN || mac + len > FRAME_SIZE {
            return None;
        }
        Some((
            self.slot_base(slot).wrapping_add(mac).cast_const(),
            len,
            vlan_tci,
        ))
    }

    fn slot_base(&self, slot: usize) -> *mut u8 {
        debug_assert!(slot < FRAME_NR);
        let offset = slot / FRAMES_PER_BLOCK * BLOCK_SIZE + slot % FRAMES_PER_BLOCK * FRAME_SIZE;
        self.map.base.as_ptr().wrapping_add(offset)
    }

    /// The status word of `slot`, shared with the kernel.
    fn status(&self, slot: usize) -> &AtomicU32 {
        let p = self
            .slot_base(slot)
            .wrapping_add(field::STATUS)
            .cast::<u32>();
        // SAFETY: `p` is 16-byte aligned (page-aligned blocks, slots a multiple of 16 apart)
        // and lies within the mapping, which lives as long as `self`. The kernel accesses the
        // word only as an aligned u32, so viewing it as an atomic is sound.
        unsafe { AtomicU32::from_ptr(p) }
    }

    /// A volatile read of the header word at `offset` (a `field` constant) of `slot`.
    fn read_u32(&self, slot: usize, offset: usize) -> u32 {
        debug_assert!(offset & 3 == 0 && offset + 4 <= field::HDR_LEN);
        let p = self.slot_base(slot).wrapping_add(offset).cast::<u32>();
        // SAFETY: `offset` is a 4-aligned field offset within the 32-byte header, and `slot`
        // starts 16-aligned within the live mapping (`slot < FRAME_NR`). The volatile read keeps
        // the compiler from assuming the kernel leaves the word alone.
        unsafe { ptr::read_volatile(p) }
    }
}

impl std::fmt::Debug for RxRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxRing").field("next", &self.next).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_is_what_the_kernel_accepts() {
        assert_eq!(BLOCK_SIZE % 4096, 0);
        assert_eq!(FRAME_SIZE % 16, 0);
        assert_eq!(FRAMES_PER_BLOCK, 30);
        assert!(BLOCK_SIZE * BLOCK_NR <= u32::MAX as usize);
        // The kernel places the MAC header at TPACKET_ALIGN(TPACKET2_HDRLEN + 16) - 14 (more
        // with a VLAN header left in place); a FRAME_CAP frame must still fit after it.
        let netoff = (libc::TPACKET2_HDRLEN + 16).next_multiple_of(16);
        assert!(netoff - 14 + FRAME_CAP <= FRAME_SIZE);
    }

    #[test]
    fn offsets_match_the_c_struct() {
        let h = std::mem::MaybeUninit::<libc::tpacket2_hdr>::uninit();
        let base = h.as_ptr() as usize;
        // SAFETY: addr_of! only computes field addresses; nothing is read.
        let at = unsafe {
            let p = h.as_ptr();
            [
                ptr::addr_of!((*p).tp_status) as usize,
                ptr::addr_of!((*p).tp_len) as usize,
                ptr::addr_of!((*p).tp_snaplen) as usize,
                ptr::addr_of!((*p).tp_mac) as usize,
                ptr::addr_of!((*p).tp_vlan_tci) as usize,
            ]
        };
        let want = [
            field::STATUS,
            field::LEN,
            field::SNAPLEN,
            field::MAC_NET,
            field::VLAN,
        ];
        assert_eq!(at.map(|a| a - base), want);
        assert_eq!(std::mem::size_of::<libc::tpacket2_hdr>(), field::HDR_LEN);
    }
}
