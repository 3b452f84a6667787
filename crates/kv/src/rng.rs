//! Named pseudo-random generators, written out so that a seed gives the same stream on every
//! platform and with every version of every library: xoshiro256** (D. Blackman, S. Vigna,
//! "Scrambled linear pseudorandom number generators", ACM TOMS 47(4), 2021), seeded through
//! SplitMix64 as its authors recommend. Never seeded from the operating system: the caller
//! gives the seed.
//!
//! [`Rng`] turns a generator's words into the draws the simulator and the load generator need
//! (a uniform `f64`, an integer below a bound); any generator with a `next_u64` can be used.

/// One step of SplitMix64 (G. Steele, D. Lea, C. Flood, "Fast splittable pseudorandom number
/// generators", OOPSLA 2014): advances `state` and returns the next output.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A source of uniform 64-bit words and the draws built on them.
pub trait Rng {
    /// The next uniformly distributed word.
    fn next_u64(&mut self) -> u64;

    /// A uniform `f64` in `[0, 1)`: the top 53 bits of a word, scaled.
    fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform integer in `0..n`, without bias: Lemire's widening multiply with rejection
    /// ("Fast random integer generation in an interval", ACM TOMACS 29(1), 2019).
    ///
    /// # Panics
    /// If `n == 0`.
    fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0) has no value to draw");
        let mut m = u128::from(self.next_u64()) * u128::from(n);
        if (m as u64) < n {
            // The low word falls in the biased zone only below 2^64 mod n.
            let threshold = n.wrapping_neg() % n;
            while (m as u64) < threshold {
                m = u128::from(self.next_u64()) * u128::from(n);
            }
        }
        (m >> 64) as u64
    }

    /// A uniform integer in `lo..hi`.
    ///
    /// # Panics
    /// If `lo >= hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(lo < hi, "empty range {lo}..{hi}");
        lo + self.below(hi - lo)
    }
}

/// xoshiro256**: 256 bits of state, period 2^256 - 1, every output of 64 bits; fast and
/// without the low-bit weaknesses of the `+` variants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Xoshiro256StarStar {
    s: [u64; 4],
}

impl Xoshiro256StarStar {
    /// The generator whose state is four SplitMix64 outputs from `seed`; every seed, 0
    /// included, gives a valid (non-zero) state.
    pub fn seed_from_u64(seed: u64) -> Xoshiro256StarStar {
        let mut sm = seed;
        let s = [
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
        ];
        Xoshiro256StarStar::from_state(s)
    }

    /// The generator with state `s`, which must not be all zero (the one state that stays
    /// zero for ever); an all-zero state is replaced by the state of seed 0.
    pub fn from_state(s: [u64; 4]) -> Xoshiro256StarStar {
        if s == [0; 4] {
            return Xoshiro256StarStar::seed_from_u64(0);
        }
        Xoshiro256StarStar { s }
    }
}

impl Rng for Xoshiro256StarStar {
    fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }
}

impl<R: Rng + ?Sized> Rng for &mut R {
    fn next_u64(&mut self) -> u64 {
        (**self).next_u64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_gives_the_reference_outputs() {
        // From the reference implementation (splitmix64.c), seed 0.
        let mut s = 0;
        let got: Vec<u64> = (0..4).map(|_| splitmix64(&mut s)).collect();
        assert_eq!(
            got,
            [
                0xe220_a839_7b1d_cdaf,
                0x6e78_9e6a_a1b9_65f4,
                0x06c4_5d18_8009_454f,
                0xf88b_b8a8_724c_81ec
            ]
        );
    }

    #[test]
    fn xoshiro256starstar_gives_the_reference_outputs() {
        // From the reference implementation (xoshiro256starstar.c), state {1, 2, 3, 4}.
        let mut r = Xoshiro256StarStar::from_state([1, 2, 3, 4]);
        let got: Vec<u64> = (0..10).map(|_| r.next_u64()).collect();
        assert_eq!(
            got,
            [
                11520,
                0,
                1509978240,
                1215971899390074240,
                1216172134540287360,
                607988272756665600,
                16172922978634559625,
                8476171486693032832,
                10595114339597558777,
                2904607092377533576,
            ]
        );
    }

    #[test]
    fn seeding_is_pinned() {
        // The state is four SplitMix64 outputs: a change to seeding changes every run.
        let r = Xoshiro256StarStar::seed_from_u64(0);
        assert_eq!(
            r.s,
            [
                0xe220_a839_7b1d_cdaf,
                0x6e78_9e6a_a1b9_65f4,
                0x06c4_5d18_8009_454f,
                0xf88b_b8a8_724c_81ec
            ]
        );
        let mut r = Xoshiro256StarStar::seed_from_u64(42);
        let got: Vec<u64> = (0..3).map(|_| r.next_u64()).collect();
        assert_eq!(
            got,
            [
                1546998764402558742,
                6990951692964543102,
                12544586762248559009
            ]
        );
        assert_eq!(
            Xoshiro256StarStar::from_state([0; 4]),
            Xoshiro256StarStar::seed_from_u64(0)
        );
    }

    #[test]
    fn draws_are_in_range_and_pinned() {
        // The same draws as an independent implementation of Lemire's method gives.
        let mut r = Xoshiro256StarStar::seed_from_u64(42);
        let got: Vec<u64> = (0..8).map(|_| r.below(10)).collect();
        assert_eq!(got, [0, 3, 6, 9, 9, 7, 7, 8]);
        let mut r = Xoshiro256StarStar::seed_from_u64(7);
        for _ in 0..10_000 {
            let u = r.f64();
            assert!((0.0..1.0).contains(&u));
            assert!((5..9).contains(&r.range(5, 9)));
            assert!(r.below(u64::MAX) < u64::MAX);
        }
        assert_eq!(r.below(1), 0);
    }

    #[test]
    fn below_is_unbiased() {
        // A bound just above 2^63 rejects almost half the words; counts stay even.
        let mut r = Xoshiro256StarStar::seed_from_u64(1);
        let n = (1u64 << 63) + 1;
        let low = (0..100_000).filter(|_| r.below(n) < n / 2).count();
        assert!((49_000..51_000).contains(&low), "{low}");
        let mut counts = [0u32; 6];
        for _ in 0..60_000 {
            counts[r.below(6) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (9_500..10_500).contains(&c)),
            "{counts:?}"
        );
    }
}
