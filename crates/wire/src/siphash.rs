//! SipHash-2-4 (Aumasson and Bernstein), the keyed hash of short inputs: what an attacker may not
//! guess or forge without the key, such as the switch's SYN cookies.

/// SipHash-2-4 of `parts` in turn (the same as of their concatenation) under the 128-bit key
/// `(k0, k1)`, each half read as the little-endian half of the 16 key bytes.
pub fn siphash24(k0: u64, k1: u64, parts: &[&[u8]]) -> u64 {
    let mut v = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ 0x646f_7261_6e64_6f6d,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    let mut len: u64 = 0;
    let mut word = [0u8; 8];
    let mut filled = 0;
    for &b in parts.iter().flat_map(|p| p.iter()) {
        word[filled] = b;
        filled += 1;
        len += 1;
        if filled == 8 {
            compress(&mut v, u64::from_le_bytes(word));
            filled = 0;
        }
    }
    let mut last = [0u8; 8];
    last[..filled].copy_from_slice(&word[..filled]);
    last[7] = len as u8;
    compress(&mut v, u64::from_le_bytes(last));
    v[2] ^= 0xff;
    for _ in 0..4 {
        round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

fn compress(v: &mut [u64; 4], m: u64) {
    v[3] ^= m;
    round(v);
    round(v);
    v[0] ^= m;
}

fn round(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13) ^ v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16) ^ v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21) ^ v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17) ^ v[2];
    v[2] = v[2].rotate_left(32);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> (u64, u64) {
        let k: Vec<u8> = (0u8..16).collect();
        (
            u64::from_le_bytes(k[..8].try_into().unwrap()),
            u64::from_le_bytes(k[8..].try_into().unwrap()),
        )
    }

    #[test]
    fn the_papers_test_vector() {
        // Appendix A of the SipHash paper: key 00..0f, message 00..0e.
        let (k0, k1) = key();
        let msg: Vec<u8> = (0u8..15).collect();
        assert_eq!(siphash24(k0, k1, &[&msg]), 0xa129_ca61_49be_45e5);
    }

    #[test]
    fn parts_hash_as_their_concatenation() {
        let (k0, k1) = key();
        let msg: Vec<u8> = (0u8..40).collect();
        let whole = siphash24(k0, k1, &[&msg]);
        for cut in [0, 1, 7, 8, 9, 39, 40] {
            assert_eq!(siphash24(k0, k1, &[&msg[..cut], &msg[cut..]]), whole);
        }
        assert_ne!(siphash24(k0 ^ 1, k1, &[&msg]), whole);
        // The empty message of the reference implementation's vectors.
        assert_eq!(siphash24(k0, k1, &[]), 0x726f_db47_dd0e_0e31);
    }
}
