//! The coherent caching fabric of IncBricks (sections 4.2 to 4.4), free of I/O: the global
//! registration table that names each key's designated switches ([`Registration`]), the
//! directory a key's home keeps of where copies may be and of the writes waiting for their
//! invalidations ([`Directory`]), and a switch's fixed-size cache with least-frequently-used
//! eviction ([`Lfu`]).
//!
//! Epochs order a key's writes against the reads whose replies may fill caches. The home
//! draws them from one counter: a write takes a new epoch when it opens and another when it
//! closes; a read is stamped with the counter when it is sent on. A reply may fill only if
//! the key did not change after its read was stamped, and a switch that dropped a key for
//! the write at epoch `e` refuses fills stamped before `e`. Epochs are 32 bits on the wire
//! and compared as serial numbers (RFC 1982), so they may wrap.

mod directory;
mod lfu;
mod registration;

pub use directory::{Directory, DirectoryStats, Due, ReadStamp, WriteStep};
pub use lfu::{Lfu, LfuStats};
pub use registration::{Path, Registration, RegistrationError};

/// A switch of the fabric, by its number in the topology.
pub type SwitchId = u8;

/// Whether epoch `a` comes before `b`, as serial numbers: true when `b` is less than 2^31
/// ahead of `a`.
pub fn epoch_before(a: u32, b: u32) -> bool {
    a != b && b.wrapping_sub(a) < 1 << 31
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_compare_across_the_wrap() {
        assert!(epoch_before(1, 2));
        assert!(!epoch_before(2, 1));
        assert!(!epoch_before(5, 5));
        assert!(epoch_before(u32::MAX, 0));
        assert!(epoch_before(u32::MAX - 3, 2));
        assert!(!epoch_before(2, u32::MAX - 3));
    }
}
