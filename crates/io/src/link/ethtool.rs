//! Offload features through the kernel's ethtool ioctl (`SIOCETHTOOL`), by the kernel's own
//! names for them (`tx-checksum-ip-generic`, `tx-tcp6-segmentation`, ...), as `ethtool -k`
//! shows them and `ethtool -K` changes them. Reads and switches features; nothing else.
//!
//! Names rather than the old one-group commands (`ETHTOOL_STSO` and the like): the groups those
//! cover are fixed in the kernel and lag behind its features (on Linux 6.18,
//! `tx-tcp-accecn-segmentation` stays on after `ETHTOOL_STSO` turns TSO off), while a name
//! pattern such as `tx-tcp*-segmentation`, the way `ethtool` itself defines its words, takes in
//! new ones.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::sys::cvt;

// The commands and constants, from <linux/ethtool.h>.
const ETHTOOL_GSTRINGS: u32 = 0x1b;
const ETHTOOL_GSSET_INFO: u32 = 0x37;
const ETHTOOL_GFEATURES: u32 = 0x3a;
const ETHTOOL_SFEATURES: u32 = 0x3b;
/// The string set that names the feature bits, bit 0 first.
const ETH_SS_FEATURES: u32 = 4;
/// The room each name has in `ETHTOOL_GSTRINGS`'s answer, NUL padded.
const ETH_GSTRING_LEN: usize = 32;
/// `struct ethtool_get_features_block`: available (changeable), requested, active and
/// never-changed masks of 32 features.
const GET_BLOCK_WORDS: usize = 4;
const AVAILABLE: usize = 0;
const ACTIVE: usize = 2;

/// The features of one interface: the kernel's name for each bit, and which bits can be
/// changed and are on, as read at one moment.
#[derive(Debug)]
pub(super) struct Features {
    names: Vec<String>,
    /// Per feature: (can be changed, is on).
    state: Vec<(bool, bool)>,
}

impl Features {
    /// Reads the features of interface `name` (at most 15 bytes, checked by the caller).
    pub(super) fn read(name: &str) -> io::Result<Features> {
        let device = Device::open(name)?;
        let names = device.feature_names()?;
        let blocks = device.feature_blocks(words(names.len()))?;
        let state = (0..names.len())
            .map(|bit| {
                let block = &blocks[bit / 32];
                let mask = 1 << (bit % 32);
                (block[AVAILABLE] & mask != 0, block[ACTIVE] & mask != 0)
            })
            .collect();
        Ok(Features { names, state })
    }

    /// The names of the features that match `pattern` and are on.
    pub(super) fn on<'a>(&'a self, pattern: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.names
            .iter()
            .zip(&self.state)
            .filter(move |(name, &(_, on))| on && matches(pattern, name))
            .map(|(name, _)| name.as_str())
    }
}

/// Asks the kernel to turn off, on interface `name` whose features are `features`, every
/// changeable feature whose name matches one of `patterns`. The kernel may accept and still
/// leave a feature on (another one it depends on, or the driver, decides): a caller that
/// must know reads them again.
pub(super) fn turn_off(name: &str, features: &Features, patterns: &[&str]) -> io::Result<()> {
    let mut valid = vec![0u32; words(features.names.len())];
    for (bit, (feature, &(changeable, _))) in features.names.iter().zip(&features.state).enumerate()
    {
        if changeable && patterns.iter().any(|p| matches(p, feature)) {
            valid[bit / 32] |= 1 << (bit % 32);
        }
    }
    // `struct ethtool_sfeatures`: cmd, size, then (valid, requested) per block; every
    // requested bit is 0, which is off.
    let mut buf = Vec::with_capacity(8 + valid.len() * 8);
    buf.extend_from_slice(&ETHTOOL_SFEATURES.to_ne_bytes());
    buf.extend_from_slice(&(valid.len() as u32).to_ne_bytes());
    for word in valid {
        buf.extend_from_slice(&word.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes());
    }
    let device = Device::open(name)?;
    // SAFETY: the kernel writes nothing back for ETHTOOL_SFEATURES, and reads `size` blocks,
    // which `buf` holds; it refuses a `size` other than its own.
    unsafe { device.call(&mut buf) }.map(drop)
}

/// Whether feature `name` matches `pattern`, which is a name or a name with one `*` standing
/// for any run of characters (`tx-checksum-*`), as in `ethtool`'s table of its words.
fn matches(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, tail)) => {
            name.len() >= head.len() + tail.len() && name.starts_with(head) && name.ends_with(tail)
        }
    }
}

/// The number of 32-bit blocks `count` features take.
fn words(count: usize) -> usize {
    count.div_ceil(32)
}

/// The `u32` at byte `at` of `buf`; `buf` holds it.
fn u32_at(buf: &[u8], at: usize) -> u32 {
    let mut bytes = [0; 4];
    bytes.copy_from_slice(&buf[at..at + 4]);
    u32::from_ne_bytes(bytes)
}

/// A socket to send one interface's ethtool commands on.
struct Device<'a> {
    socket: OwnedFd,
    name: &'a str,
}

impl<'a> Device<'a> {
    fn open(name: &'a str) -> io::Result<Device<'a>> {
        // SAFETY: plain system call with constant arguments.
        let raw =
            cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
        // SAFETY: `raw` was just returned by socket and is owned by nobody else.
        let socket = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(Device { socket, name })
    }

    /// Runs the ethtool command whose structure is `buf` (its first four bytes are the
    /// command); returns the ioctl's result.
    ///
    /// # Safety
    ///
    /// `buf` must be at least as long as what the kernel reads and writes for that command.
    unsafe fn call(&self, buf: &mut [u8]) -> io::Result<libc::c_int> {
        // SAFETY: `ifreq` is a C structure of integers, arrays, pointers and unions of them;
        // all zeroes is a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (dst, src) in req.ifr_name.iter_mut().zip(self.name.bytes()) {
            *dst = src as libc::c_char;
        }
        req.ifr_ifru.ifru_data = buf.as_mut_ptr().cast();
        // SAFETY: SIOCETHTOOL reads the `ifreq`, which lives across the call, and the command
        // structure it points to, which our caller guarantees is large enough for the command.
        cvt(unsafe { libc::ioctl(self.socket.as_raw_fd(), libc::SIOCETHTOOL, &mut req) })
    }

    /// The kernel's names of the feature bits, bit 0 first.
    fn feature_names(&self) -> io::Result<Vec<String>> {
        // `struct ethtool_sset_info` asking for one set: cmd, reserved, sset_mask (u64), then
        // one u32 count.
        let mut info = [0u8; 20];
        info[..4].copy_from_slice(&ETHTOOL_GSSET_INFO.to_ne_bytes());
        info[8..16].copy_from_slice(&(1u64 << ETH_SS_FEATURES).to_ne_bytes());
        // SAFETY: the kernel writes one count per set asked for, of which there is room for
        // the one.
        unsafe { self.call(&mut info) }?;
        // The kernel clears the bit of a set it has no count for.
        if info[8..16] != (1u64 << ETH_SS_FEATURES).to_ne_bytes() {
            return Err(io::Error::other("the kernel does not name the features"));
        }
        let count = u32_at(&info, 16) as usize;

        // `struct ethtool_gstrings`: cmd, string_set, len, then `len` names.
        let mut strings = vec![0u8; 12 + count * ETH_GSTRING_LEN];
        strings[..4].copy_from_slice(&ETHTOOL_GSTRINGS.to_ne_bytes());
        strings[4..8].copy_from_slice(&ETH_SS_FEATURES.to_ne_bytes());
        strings[8..12].copy_from_slice(&(count as u32).to_ne_bytes());
        // SAFETY: the kernel writes as many names as it counts in the set, and the feature
        // set's size is fixed when the kernel is built, so it is the `count` just read.
        unsafe { self.call(&mut strings) }?;
        let names = strings[12..]
            .chunks_exact(ETH_GSTRING_LEN)
            .map(|raw| {
                let raw = raw.split(|&b| b == 0).next().unwrap_or(raw);
                String::from_utf8_lossy(raw).into_owned()
            })
            .collect();
        Ok(names)
    }

    /// The features' `ethtool_get_features_block`s, `words` of them.
    fn feature_blocks(&self, words: usize) -> io::Result<Vec<[u32; GET_BLOCK_WORDS]>> {
        // `struct ethtool_gfeatures`: cmd, size, then `size` blocks.
        let mut buf = vec![0u8; 8 + words * GET_BLOCK_WORDS * 4];
        buf[..4].copy_from_slice(&ETHTOOL_GFEATURES.to_ne_bytes());
        buf[4..8].copy_from_slice(&(words as u32).to_ne_bytes());
        // SAFETY: the kernel writes at most `size` blocks, for which `buf` has room.
        unsafe { self.call(&mut buf) }?;
        let blocks = buf[8..]
            .chunks_exact(GET_BLOCK_WORDS * 4)
            .map(|block| std::array::from_fn(|i| u32_at(block, i * 4)))
            .collect();
        Ok(blocks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_as_ethtool_words_do() {
        for name in [
            "tx-tcp-segmentation",
            "tx-tcp6-segmentation",
            "tx-tcp-accecn-segmentation",
        ] {
            assert!(matches("tx-tcp*-segmentation", name), "{name}");
        }
        assert!(!matches("tx-tcp*-segmentation", "tx-udp-segmentation"));
        assert!(matches("tx-checksum-*", "tx-checksum-ip-generic"));
        assert!(!matches("tx-checksum-*", "rx-checksum"));
        assert!(matches("rx-gro", "rx-gro"));
        assert!(!matches("rx-gro", "rx-gro-hw"));
        // The `*` may stand for nothing, but head and tail may not overlap.
        assert!(matches("tx-tcp*-segmentation", "tx-tcp-segmentation"));
        assert!(!matches("ab*ba", "aba"));
    }

    #[test]
    fn blocks_of_32() {
        assert_eq!(words(0), 0);
        assert_eq!(words(32), 1);
        assert_eq!(words(33), 2);
    }
}
