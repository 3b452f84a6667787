//! 32-bit FNV-1a, the textbook hash, each byte taken as unsigned: the same on every platform.
//!
//! kvswitch uses it for hashes of its own (the fabric header's key hash, a fabric's flows, the
//! testbed's subnets and MACs), never for key placement: nutcracker's FNV variants, which
//! widen bytes above 0x7f as C chars, live with the other placement hashes in `kv::hash`.

const INIT: u32 = 0x811c_9dc5;
const PRIME: u32 = 0x0100_0193;

/// FNV-1a of `bytes`.
pub fn fnv1a(bytes: &[u8]) -> u32 {
    fnv1a_parts(&[bytes])
}

/// FNV-1a over `parts` in turn: the same as over their concatenation.
pub fn fnv1a_parts(parts: &[&[u8]]) -> u32 {
    parts
        .iter()
        .flat_map(|p| p.iter())
        .fold(INIT, |h, &b| (h ^ u32::from(b)).wrapping_mul(PRIME))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_vectors() {
        // From the FNV authors' test suite.
        assert_eq!(fnv1a(b""), 0x811c_9dc5);
        assert_eq!(fnv1a(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a(b"foobar"), 0xbf9c_f968);
    }

    #[test]
    fn parts_hash_as_their_concatenation() {
        assert_eq!(fnv1a_parts(&[b"foo", b"bar"]), fnv1a(b"foobar"));
        assert_eq!(fnv1a_parts(&[b"", b"foobar", b""]), fnv1a(b"foobar"));
        assert_eq!(fnv1a_parts(&[]), fnv1a(b""));
    }

    #[test]
    fn bytes_above_0x7f_count_unsigned() {
        assert_eq!(
            fnv1a_parts(&[&[192, 168, 200, 250], &[10, 0, 0, 255]]),
            0x8550_c3b0
        );
    }
}
