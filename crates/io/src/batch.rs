//! A fixed set of frame buffers that ports receive into and the switch transmits from.
//!
//! All memory is allocated once in [`Batch::new`]; receiving, editing and clearing never
//! allocate, so a batch can be reused for the life of a port.

/// Bytes per frame slot. Room for a 1500-byte MTU frame with Ethernet header and two VLAN tags,
/// rounded up to a power of two so that slots stay cache-line aligned within the buffer.
pub const FRAME_CAP: usize = 2048;

/// Largest batch a port moves in one system call. Linux clamps the vector length of
/// `recvmmsg`/`sendmmsg` to `UIO_MAXIOV` (1024), so larger batches would be silently cut.
pub const MAX_BATCH: usize = 1024;

/// Per-frame metadata flags.
const CSUM_NOT_READY: u8 = 1 << 0;
const VLAN_VALID: u8 = 1 << 1;

/// What the port learned about a frame besides its bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Meta {
    pub len: u16,
    pub flags: u8,
    pub vlan_tci: u16,
}

impl Meta {
    pub(crate) fn new(len: usize, csum_not_ready: bool, vlan_tci: Option<u16>) -> Meta {
        debug_assert!(len <= FRAME_CAP);
        let mut flags = 0;
        if csum_not_ready {
            flags |= CSUM_NOT_READY;
        }
        if vlan_tci.is_some() {
            flags |= VLAN_VALID;
        }
        Meta {
            len: len as u16,
            flags,
            vlan_tci: vlan_tci.unwrap_or(0),
        }
    }
}

/// Up to `capacity` frames of at most [`FRAME_CAP`] bytes each, with their lengths and receive
/// metadata.
///
/// Frames are indexed `0..len()`. Every accessor taking an index panics if it is `>= len()`,
/// as slice indexing does.
pub struct Batch {
    data: Box<[u8]>,
    meta: Box<[Meta]>,
    len: usize,
}

impl Batch {
    /// Allocates a batch of `capacity` slots of [`FRAME_CAP`] bytes each.
    ///
    /// # Panics
    /// If `capacity` is 0 or greater than [`MAX_BATCH`].
    pub fn new(capacity: usize) -> Batch {
        assert!(
            (1..=MAX_BATCH).contains(&capacity),
            "batch capacity {capacity} outside 1..={MAX_BATCH}"
        );
        Batch {
            data: vec![0; capacity * FRAME_CAP].into_boxed_slice(),
            meta: vec![Meta::default(); capacity].into_boxed_slice(),
            len: 0,
        }
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.meta.len()
    }

    /// Number of frames held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn is_full(&self) -> bool {
        self.len == self.capacity()
    }

    /// Forgets all frames; the buffers are kept.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// The bytes of frame `i`, starting at the Ethernet header.
    pub fn frame(&self, i: usize) -> &[u8] {
        let len = self.meta_of(i).len as usize;
        &self.data[i * FRAME_CAP..i * FRAME_CAP + len]
    }

    /// The bytes of frame `i` for editing in place. Its length is fixed; use
    /// [`Batch::set_frame_len`] to grow or shrink it first.
    pub fn frame_mut(&mut self, i: usize) -> &mut [u8] {
        let len = self.meta_of(i).len as usize;
        &mut self.data[i * FRAME_CAP..i * FRAME_CAP + len]
    }

    /// Sets the length of frame `i`. Bytes exposed by growing hold whatever the slot held before.
    ///
    /// # Panics
    /// If `i >= len()` or `len > FRAME_CAP`.
    pub fn set_frame_len(&mut self, i: usize, len: usize) {
        assert!(len <= FRAME_CAP, "frame length {len} exceeds {FRAME_CAP}");
        self.meta_of(i);
        self.meta[i].len = len as u16;
    }

    /// Whether the kernel handed over frame `i` with its transport checksum not yet computed
    /// (`TP_STATUS_CSUMNOTREADY`: the sender offloaded it and no device filled it in). The
    /// checksum field then holds only the pseudo-header sum; whoever forwards the frame off
    /// this host must complete it.
    pub fn csum_not_ready(&self, i: usize) -> bool {
        self.meta_of(i).flags & CSUM_NOT_READY != 0
    }

    /// The 802.1Q tag control information of frame `i` if the kernel stripped a VLAN tag from
    /// it on receive (the bytes returned by [`Batch::frame`] then lack the tag).
    pub fn vlan_tci(&self, i: usize) -> Option<u16> {
        let meta = self.meta_of(i);
        (meta.flags & VLAN_VALID != 0).then_some(meta.vlan_tci)
    }

    /// Appends a copy of `frame` for transmission, with no metadata flags.
    ///
    /// Returns `false`, leaving the batch unchanged, if the batch is full or `frame` is longer
    /// than [`FRAME_CAP`].
    pub fn push(&mut self, frame: &[u8]) -> bool {
        if self.is_full() || frame.len() > FRAME_CAP {
            return false;
        }
        let i = self.len;
        self.slot_mut(i)[..frame.len()].copy_from_slice(frame);
        self.meta[i] = Meta::new(frame.len(), false, None);
        self.len += 1;
        true
    }

    /// Iterates over the frames in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        (0..self.len).map(move |i| self.frame(i))
    }

    fn meta_of(&self, i: usize) -> &Meta {
        assert!(
            i < self.len,
            "frame index {i} out of range (len {})",
            self.len
        );
        &self.meta[i]
    }

    /// The whole slot `i`, regardless of `len()`; backends receive into it.
    pub(crate) fn slot_mut(&mut self, i: usize) -> &mut [u8] {
        &mut self.data[i * FRAME_CAP..(i + 1) * FRAME_CAP]
    }

    /// The start of slot 0; slot `i` spans `FRAME_CAP` bytes from `i * FRAME_CAP`.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.data.as_mut_ptr()
    }

    /// Moves the first `len` bytes of slot `from` into slot `to` (`to < from`), used to close
    /// the gap a dropped frame leaves.
    pub(crate) fn move_slot(&mut self, from: usize, to: usize, len: usize) {
        self.data
            .copy_within(from * FRAME_CAP..from * FRAME_CAP + len, to * FRAME_CAP);
    }

    /// Records that slots `0..len` hold frames described by `meta[..len]` (set with
    /// [`Batch::set_meta`]).
    pub(crate) fn set_len(&mut self, len: usize) {
        debug_assert!(len <= self.capacity());
        self.len = len;
    }

    pub(crate) fn set_meta(&mut self, i: usize, meta: Meta) {
        self.meta[i] = meta;
    }
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_and_read_back() {
        let mut b = Batch::new(2);
        assert!(b.is_empty());
        assert!(b.push(&[1, 2, 3]));
        assert!(b.push(&[4; 60]));
        assert!(b.is_full());
        assert!(!b.push(&[5]));
        assert_eq!(b.len(), 2);
        assert_eq!(b.frame(0), &[1, 2, 3]);
        assert_eq!(b.frame(1), &[4; 60][..]);
        assert!(!b.csum_not_ready(0));
        assert_eq!(b.vlan_tci(1), None);
        assert_eq!(b.iter().map(<[u8]>::len).collect::<Vec<_>>(), [3, 60]);
        b.clear();
        assert_eq!(b.len(), 0);
        assert!(b.push(&[9]));
        assert_eq!(b.frame(0), &[9]);
    }

    #[test]
    fn oversized_push_is_refused() {
        let mut b = Batch::new(1);
        assert!(!b.push(&[0; FRAME_CAP + 1]));
        assert!(b.is_empty());
        assert!(b.push(&[0; FRAME_CAP]));
    }

    #[test]
    fn edit_and_resize() {
        let mut b = Batch::new(1);
        b.push(&[0; 10]);
        b.frame_mut(0)[9] = 7;
        b.set_frame_len(0, 12);
        assert_eq!(b.frame(0).len(), 12);
        assert_eq!(b.frame(0)[9], 7);
        b.set_frame_len(0, 4);
        assert_eq!(b.frame(0), &[0; 4]);
    }

    #[test]
    fn metadata_flags() {
        let mut b = Batch::new(2);
        b.slot_mut(0)[..2].copy_from_slice(&[1, 2]);
        b.set_meta(0, Meta::new(2, true, Some(0x0123)));
        b.set_meta(1, Meta::new(0, false, Some(0)));
        b.set_len(2);
        assert!(b.csum_not_ready(0));
        assert_eq!(b.vlan_tci(0), Some(0x0123));
        assert!(!b.csum_not_ready(1));
        assert_eq!(b.vlan_tci(1), Some(0));
    }

    #[test]
    fn move_slot_compacts() {
        let mut b = Batch::new(3);
        b.slot_mut(2)[..3].copy_from_slice(&[7, 8, 9]);
        b.move_slot(2, 0, 3);
        b.set_meta(0, Meta::new(3, false, None));
        b.set_len(1);
        assert_eq!(b.frame(0), &[7, 8, 9]);
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn index_past_len_panics() {
        let b = Batch::new(4);
        b.frame(0);
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn zero_capacity_panics() {
        Batch::new(0);
    }
}
