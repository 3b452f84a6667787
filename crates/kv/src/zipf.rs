//! Key popularity: a Zipf sampler that needs no per-key table, and the mapping from popularity
//! rank to key index. Pure arithmetic on draws from a caller's [`Rng`]; never touches the
//! network.
//!
//! The sampler is rejection-inversion (W. Hörmann, G. Derflinger, "Rejection-inversion to
//! generate variates from monotone discrete distributions", ACM TOMACS 6(3), 1996), the same
//! construction Apache Commons RNG uses. Setup and each sample cost O(1), so keyspaces of 10^10
//! and more work; the expected number of rejections per sample is below 1.1 for all exponents.

use std::collections::{HashMap, HashSet};

use crate::rng::{Rng, Xoshiro256StarStar};

/// Draws ranks `1..=n` with `P(k) ∝ k^-theta`, `theta > 0`.
#[derive(Clone, Debug)]
pub struct Zipf {
    n: f64,
    theta: f64,
    h_integral_x1: f64,
    h_integral_n: f64,
    s: f64,
    /// The sum of `k^-theta` over every rank (see [`Zipf::share`]).
    total: f64,
}

impl Zipf {
    /// `n` is the number of ranks (≥ 1), `theta` the exponent (> 0 and finite).
    ///
    /// # Panics
    /// If `n == 0` or `theta` is not a positive finite number; callers validate user input first.
    pub fn new(n: u64, theta: f64) -> Zipf {
        assert!(n >= 1, "zipf needs at least one rank");
        assert!(
            theta.is_finite() && theta > 0.0,
            "zipf exponent must be > 0"
        );
        let mut z = Zipf {
            n: n as f64,
            theta,
            h_integral_x1: 0.0,
            h_integral_n: 0.0,
            s: 0.0,
            total: 0.0,
        };
        z.h_integral_x1 = z.h_integral(1.5) - 1.0;
        z.h_integral_n = z.h_integral(z.n + 0.5);
        z.s = 2.0 - z.h_integral_inverse(z.h_integral(2.5) - z.h(2.0));
        z.total = z.sum();
        z
    }

    /// One rank in `1..=n`; rank 1 is the most popular.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> u64 {
        loop {
            let u = rng.f64();
            let u = self.h_integral_n + u * (self.h_integral_x1 - self.h_integral_n);
            let x = self.h_integral_inverse(u);
            // Round to the nearest rank and clamp: x can land a hair outside [0.5, n + 0.5].
            let k = (x + 0.5).floor().clamp(1.0, self.n);
            if k - x <= self.s || u >= self.h_integral(k + 0.5) - self.h(k) {
                return k as u64;
            }
        }
    }

    /// The unnormalised density `x^-theta`.
    /// The share of draws that give `rank` (1-based): `rank^-theta` over the sum for every
    /// rank, that sum taken exactly for the first 10,000 ranks and as an integral (within
    /// one part in 10^8 there) for the rest.
    pub fn share(&self, rank: u64) -> f64 {
        self.h(rank as f64) / self.total
    }

    fn sum(&self) -> f64 {
        const EXACT: u64 = 10_000;
        let exact = (self.n as u64).min(EXACT);
        let mut total: f64 = (1..=exact).map(|k| self.h(k as f64)).sum();
        if (self.n as u64) > EXACT {
            total += self.h_integral(self.n + 0.5) - self.h_integral(EXACT as f64 + 0.5);
        }
        total
    }

    fn h(&self, x: f64) -> f64 {
        (-self.theta * x.ln()).exp()
    }

    /// An antiderivative of `h`, written so that `theta == 1` needs no special case.
    fn h_integral(&self, x: f64) -> f64 {
        let log_x = x.ln();
        helper2((1.0 - self.theta) * log_x) * log_x
    }

    fn h_integral_inverse(&self, x: f64) -> f64 {
        // Clamp guards against rounding pushing ln1p's argument below -1.
        let t = (x * (1.0 - self.theta)).max(-1.0);
        (helper1(t) * x).exp()
    }
}

/// `ln(1 + x) / x`, accurate near 0.
fn helper1(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

/// `(e^x - 1) / x`, accurate near 0.
fn helper2(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x * 0.5 * (1.0 + x / 3.0 * (1.0 + 0.25 * x))
    }
}

/// A fixed bijection on `0..n` that spreads popularity ranks over the keyspace.
///
/// Key names are `prefix + index`; without scrambling the hottest keys would be `key:0`,
/// `key:1`, … and consecutive names can hash to the same server, so a Zipf run would test one
/// backend. The permutation is an invertible mix on the smallest power-of-two domain that holds
/// `n` (add, multiply by an odd constant, xor-shift — each invertible modulo 2^bits), applied by
/// cycle walking until the value falls below `n`; cycle walking keeps it a bijection on `0..n`
/// and takes fewer than two rounds on average. The constants are fixed so runs are reproducible.
#[derive(Clone, Copy, Debug)]
pub struct Scramble {
    n: u64,
    mask: u64,
    shift: u32,
}

impl Scramble {
    /// # Panics
    /// If `n == 0`.
    pub fn new(n: u64) -> Scramble {
        assert!(n >= 1, "scramble needs a non-empty domain");
        let bits = 64 - (n - 1).leading_zeros();
        let mask = if bits >= 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        Scramble {
            n,
            mask,
            shift: (bits / 2).max(1),
        }
    }

    /// The image of `i`; `i` must be below `n`.
    pub fn apply(&self, i: u64) -> u64 {
        debug_assert!(i < self.n);
        let mut x = i;
        loop {
            x = self.round(x);
            if x < self.n {
                return x;
            }
        }
    }

    fn round(&self, mut x: u64) -> u64 {
        // Constants from splitmix64; any odd multiplier keeps the step invertible.
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15) & self.mask;
        x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9) & self.mask;
        x ^= x >> self.shift;
        x = x.wrapping_mul(0x94d0_49bb_1331_11eb) & self.mask;
        x ^= x >> self.shift;
        x
    }
}

/// Key popularity as chosen by `--dist`.
#[derive(Clone, Debug)]
pub enum Popularity {
    Uniform,
    Zipf(Zipf),
}

/// Picks key indexes in `0..keys` according to a popularity distribution.
#[derive(Clone, Debug)]
pub struct KeyGen {
    keys: u64,
    popularity: Popularity,
    scramble: Option<Scramble>,
}

impl KeyGen {
    /// `theta == 0` means uniform. With `scramble == false` rank `r` maps to index `r - 1`.
    ///
    /// # Panics
    /// If `keys == 0` or `theta` is negative or not finite.
    pub fn new(keys: u64, theta: f64, scramble: bool) -> KeyGen {
        assert!(keys >= 1, "keyspace must not be empty");
        assert!(
            theta.is_finite() && theta >= 0.0,
            "zipf exponent must be >= 0"
        );
        let popularity = if theta == 0.0 {
            Popularity::Uniform
        } else {
            Popularity::Zipf(Zipf::new(keys, theta))
        };
        KeyGen {
            keys,
            popularity,
            scramble: scramble.then(|| Scramble::new(keys)),
        }
    }

    /// The next key index in `0..keys`.
    pub fn next_index<R: Rng + ?Sized>(&self, rng: &mut R) -> u64 {
        self.next_index_ranked(rng, None)
    }

    /// The next key index, with popularity ranks first permuted by `ranking` (which must cover
    /// the same keyspace). A uniform distribution ignores the ranking.
    pub fn next_index_ranked<R: Rng + ?Sized>(
        &self,
        rng: &mut R,
        ranking: Option<&Ranking>,
    ) -> u64 {
        self.index_of_draw(self.draw(rng), ranking)
    }

    /// The random part of [`KeyGen::next_index_ranked`], which
    /// [`KeyGen::index_of_draw`] turns into the key index: a caller that draws keys ahead of
    /// their use can take the draws in order and apply the ranking in force when each is used.
    pub fn draw<R: Rng + ?Sized>(&self, rng: &mut R) -> u64 {
        match &self.popularity {
            Popularity::Uniform => rng.below(self.keys),
            Popularity::Zipf(z) => z.sample(rng) - 1,
        }
    }

    /// The key index a [`KeyGen::draw`] gives under `ranking`.
    pub fn index_of_draw(&self, draw: u64, ranking: Option<&Ranking>) -> u64 {
        match &self.popularity {
            // Uniform needs no scrambling: every index is equally likely either way.
            Popularity::Uniform => draw,
            Popularity::Zipf(_) => self.index_of_rank(draw, ranking),
        }
    }

    /// The share of draws that give popularity rank `rank0` (0-based).
    pub fn share(&self, rank0: u64) -> f64 {
        match &self.popularity {
            Popularity::Uniform => 1.0 / self.keys as f64,
            Popularity::Zipf(z) => z.share(rank0 + 1),
        }
    }

    /// The key index that holds popularity rank `rank0` (0-based: 0 is the hottest) under
    /// `ranking`; for a uniform distribution every key is as popular, and this is `rank0`
    /// scrambled all the same.
    pub fn index_of_rank(&self, rank0: u64, ranking: Option<&Ranking>) -> u64 {
        let rank0 = match ranking {
            Some(r) => r.apply(rank0),
            None => rank0,
        };
        match &self.scramble {
            Some(s) => s.apply(rank0),
            None => rank0,
        }
    }
}

/// How key popularity changes over time (the workloads of SwitchKV, Li et al., NSDI 2016).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum ChangeKind {
    /// The N coldest keys become the N hottest; every other key moves N ranks down.
    HotIn,
    /// The N hottest keys become the N coldest; every other key moves N ranks up.
    HotOut,
    /// N random keys of the hot set (the 10·N hottest) swap places with N random cold keys.
    Random,
}

impl ChangeKind {
    /// Every kind, in the order a command line lists them.
    pub const ALL: [ChangeKind; 3] = [ChangeKind::HotIn, ChangeKind::HotOut, ChangeKind::Random];

    /// The kind's name in command lines and files: `hot-in`, `hot-out`, `random`.
    pub fn name(self) -> &'static str {
        match self {
            ChangeKind::HotIn => "hot-in",
            ChangeKind::HotOut => "hot-out",
            ChangeKind::Random => "random",
        }
    }
}

/// A name that is not one of [`ChangeKind::ALL`]'s.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown popularity change {0:?}: expected hot-in, hot-out or random")]
pub struct UnknownChange(pub String);

impl std::str::FromStr for ChangeKind {
    type Err = UnknownChange;

    fn from_str(s: &str) -> Result<ChangeKind, UnknownChange> {
        ChangeKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownChange(s.to_owned()))
    }
}

/// Size of the hot set for [`ChangeKind::Random`], in multiples of N: the swapped hot keys are
/// drawn from the `RANDOM_HOT_FACTOR * N` hottest ranks.
pub const RANDOM_HOT_FACTOR: u64 = 10;

/// A permutation of popularity ranks that changes in steps ("epochs").
///
/// The permutation is `rank -> swaps(rank + offset mod n)`: hot-in and hot-out only move the
/// offset, and random changes record their transpositions in a map that holds only the ranks
/// that differ from the identity. Nothing is proportional to the keyspace, so 10^10 keys work.
/// Every copy built with the same arguments and advanced to the same epoch is the same
/// permutation, so worker threads need not share one.
#[derive(Clone, Debug)]
pub struct Ranking {
    n: u64,
    kind: ChangeKind,
    keys: u64,
    seed: u64,
    epoch: u64,
    offset: u64,
    swaps: HashMap<u64, u64>,
}

impl Ranking {
    /// The identity on `0..n`, to be changed by `kind` moving `keys` keys per epoch.
    ///
    /// # Panics
    /// If `keys` is 0 or not below `n` (for random: if `2 * keys > n`).
    pub fn new(n: u64, kind: ChangeKind, keys: u64, seed: u64) -> Ranking {
        assert!(keys >= 1 && keys < n, "a change must move 1..n keys");
        assert!(
            kind != ChangeKind::Random || keys.saturating_mul(2) <= n,
            "a random change needs as many cold keys as hot ones"
        );
        Ranking {
            n,
            kind,
            keys,
            seed,
            epoch: 0,
            offset: 0,
            swaps: HashMap::new(),
        }
    }

    /// The epoch the permutation is at; 0 is the identity.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Applies every change up to and including `epoch`; earlier epochs are a no-op.
    pub fn advance_to(&mut self, epoch: u64) {
        while self.epoch < epoch {
            self.epoch += 1;
            self.step();
        }
    }

    /// The rank (0-based) whose key now holds popularity rank `rank0`.
    pub fn apply(&self, rank0: u64) -> u64 {
        let p = self.rotate(rank0);
        self.swaps.get(&p).copied().unwrap_or(p)
    }

    fn rotate(&self, rank0: u64) -> u64 {
        // Both are below n, so the sum cannot overflow when n <= 2^63; use u128 to be safe.
        ((u128::from(rank0) + u128::from(self.offset)) % u128::from(self.n)) as u64
    }

    fn step(&mut self) {
        match self.kind {
            // New rank r takes the key of old rank r - N: the old bottom N come to the top.
            ChangeKind::HotIn => self.offset = (self.offset + self.n - self.keys) % self.n,
            // New rank r takes the key of old rank r + N: the old top N go to the bottom.
            ChangeKind::HotOut => self.offset = (self.offset + self.keys) % self.n,
            ChangeKind::Random => self.swap_random(),
        }
    }

    fn swap_random(&mut self) {
        let mut rng = Xoshiro256StarStar::seed_from_u64(
            self.seed ^ self.epoch.wrapping_mul(0xd1b5_4a32_d192_ed03),
        );
        let hot = (self.keys * RANDOM_HOT_FACTOR).min(self.n - self.keys);
        let mut hot_ranks = HashSet::new();
        while (hot_ranks.len() as u64) < self.keys {
            hot_ranks.insert(rng.below(hot));
        }
        let mut cold_ranks = HashSet::new();
        while (cold_ranks.len() as u64) < self.keys {
            cold_ranks.insert(rng.range(hot, self.n));
        }
        let mut hot_ranks: Vec<u64> = hot_ranks.into_iter().collect();
        let mut cold_ranks: Vec<u64> = cold_ranks.into_iter().collect();
        // Set iteration order is random per process; sort so every copy swaps the same pairs.
        hot_ranks.sort_unstable();
        cold_ranks.sort_unstable();
        for (a, b) in hot_ranks.into_iter().zip(cold_ranks) {
            let (x, y) = (self.rotate(a), self.rotate(b));
            let (mx, my) = (self.apply(a), self.apply(b));
            self.set(x, my);
            self.set(y, mx);
        }
    }

    fn set(&mut self, at: u64, to: u64) {
        if at == to {
            self.swaps.remove(&at);
        } else {
            self.swaps.insert(at, to);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_match_the_sampler_and_sum_to_one() {
        let z = Zipf::new(1_000_000, 0.99);
        let total: f64 = (1..=1_000_000u64).map(|k| z.share(k)).sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        let mut rng = Xoshiro256StarStar::seed_from_u64(3);
        let n = 400_000;
        let ones = (0..n).filter(|_| z.sample(&mut rng) == 1).count();
        let got = ones as f64 / n as f64;
        assert!(
            (got / z.share(1) - 1.0).abs() < 0.03,
            "{got} against {}",
            z.share(1)
        );
    }

    /// Generalised harmonic number `sum_{k=1}^{n} k^-s`: exact up to 10^5 terms, then the
    /// Euler–Maclaurin tail (error far below the test tolerance).
    fn harmonic(n: u64, s: f64) -> f64 {
        const EXACT: u64 = 100_000;
        let m = n.min(EXACT);
        let head: f64 = (1..=m).map(|k| (k as f64).powf(-s)).sum();
        if n <= EXACT {
            return head;
        }
        let (a, b) = (m as f64, n as f64);
        let f = |x: f64| x.powf(-s);
        let df = |x: f64| -s * x.powf(-s - 1.0);
        let integral = if (s - 1.0).abs() < 1e-12 {
            b.ln() - a.ln()
        } else {
            (b.powf(1.0 - s) - a.powf(1.0 - s)) / (1.0 - s)
        };
        // sum_{k=a}^{b} f(k) minus f(a), which the head already counted.
        head + integral + (f(a) + f(b)) / 2.0 + (df(b) - df(a)) / 12.0 - f(a)
    }

    /// Compares P(rank <= k) for each k in `tops` against the analytic value.
    fn check(n: u64, theta: f64, tops: &[u64]) {
        const SAMPLES: usize = 1_000_000;
        let z = Zipf::new(n, theta);
        let mut rng = Xoshiro256StarStar::seed_from_u64(7);
        let mut counts = vec![0u64; tops.len()];
        for _ in 0..SAMPLES {
            let r = z.sample(&mut rng);
            assert!((1..=n).contains(&r));
            for (c, &t) in counts.iter_mut().zip(tops) {
                if r <= t {
                    *c += 1;
                }
            }
        }
        let total = harmonic(n, theta);
        for (&c, &t) in counts.iter().zip(tops) {
            let p = harmonic(t, theta) / total;
            let observed = c as f64 / SAMPLES as f64;
            let sigma = (p * (1.0 - p) / SAMPLES as f64).sqrt();
            let tolerance = 5.0 * sigma + 0.002 * p;
            assert!(
                (observed - p).abs() <= tolerance,
                "n={n} theta={theta} top {t}: observed {observed}, expected {p} ± {tolerance}"
            );
        }
    }

    #[test]
    fn zipf_099_small_keyspace() {
        check(1_000, 0.99, &[1, 2, 10, 100, 500]);
    }

    #[test]
    fn zipf_05_small_keyspace() {
        check(1_000, 0.5, &[1, 2, 10, 100, 500]);
    }

    #[test]
    fn zipf_099_huge_keyspace() {
        check(10_000_000_000, 0.99, &[1, 2, 10, 1_000, 1_000_000]);
    }

    #[test]
    fn zipf_05_huge_keyspace() {
        check(10_000_000_000, 0.5, &[1, 1_000, 1_000_000, 100_000_000]);
    }

    /// Pearson's chi-square of `SAMPLES` ranks drawn through [`KeyGen`] (unscrambled, so index
    /// `r - 1` is rank `r`; `theta == 0` is its uniform case) against the exact distribution,
    /// over bins of ranks: each of the first ranks, then decades, then tenths of the keyspace,
    /// merged until every bin expects at least 20 draws. Fails when the statistic exceeds the
    /// 0.1% critical value, which a correct sampler does once in a thousand seeds.
    fn chi_square(n: u64, theta: f64) {
        const SAMPLES: usize = 1_000_000;
        let mut bounds: Vec<u64> = (1..=10).collect();
        let mut decade = 100u64;
        while decade < n {
            bounds.push(decade);
            decade = decade.saturating_mul(10);
        }
        bounds.extend((1..10).map(|j| n / 10 * j));
        bounds.push(n);
        bounds.retain(|&b| b >= 1 && b <= n);
        bounds.sort_unstable();
        bounds.dedup();
        // P(rank <= b) for each bound, then bins (lo, hi] merged to expect >= 20 draws.
        let total = harmonic(n, theta);
        let cdf = |b: u64| harmonic(b, theta) / total;
        let mut bins: Vec<(u64, f64)> = Vec::new(); // (upper bound, probability)
        let mut lo_p = 0.0;
        for &b in &bounds {
            let p = cdf(b) - lo_p;
            match bins.last_mut() {
                Some(last) if last.1 * (SAMPLES as f64) < 20.0 => {
                    last.0 = b;
                    last.1 += p;
                }
                _ => bins.push((b, p)),
            }
            lo_p = cdf(b);
        }
        if bins.len() > 1 && bins[bins.len() - 1].1 * (SAMPLES as f64) < 20.0 {
            let last = bins.pop().expect("two bins");
            let prev = bins.last_mut().expect("one bin");
            prev.0 = last.0;
            prev.1 += last.1;
        }
        let g = KeyGen::new(n, theta, false);
        let mut rng = Xoshiro256StarStar::seed_from_u64(0x5eed ^ n ^ theta.to_bits());
        let mut counts = vec![0u64; bins.len()];
        for _ in 0..SAMPLES {
            let rank = g.next_index(&mut rng) + 1;
            assert!((1..=n).contains(&rank));
            let i = bins.partition_point(|&(hi, _)| hi < rank);
            counts[i] += 1;
        }
        let stat: f64 = counts
            .iter()
            .zip(&bins)
            .map(|(&c, &(_, p))| {
                let e = p * SAMPLES as f64;
                (c as f64 - e).powi(2) / e
            })
            .sum();
        // Wilson–Hilferty: the chi-square quantile from the normal one (z = 3.09 for 0.1%).
        let df = (bins.len() - 1) as f64;
        let k = 2.0 / (9.0 * df);
        let critical = df * (1.0 - k + 3.09 * k.sqrt()).powi(3);
        assert!(
            stat <= critical,
            "n={n} theta={theta}: chi-square {stat:.1} over {} bins exceeds {critical:.1}; \
             counts {counts:?}",
            bins.len()
        );
        assert!(
            bins.len() >= 5,
            "n={n} theta={theta}: only {} bins",
            bins.len()
        );
    }

    #[test]
    fn chi_square_small_keyspace() {
        for theta in [0.0, 0.5, 0.9, 0.99, 1.0, 1.2] {
            chi_square(1_000, theta);
        }
    }

    #[test]
    fn chi_square_huge_keyspace() {
        for theta in [0.0, 0.5, 0.9, 0.99, 1.0, 1.2] {
            chi_square(10_000_000_000, theta);
        }
    }

    #[test]
    fn zipf_12_huge_keyspace() {
        check(10_000_000_000, 1.2, &[1, 2, 10, 1_000, 1_000_000]);
    }

    #[test]
    fn zipf_rank_one_frequency_matches() {
        // The headline number: share of the single hottest key.
        let z = Zipf::new(1_000, 0.99);
        let mut rng = Xoshiro256StarStar::seed_from_u64(11);
        let hits = (0..200_000).filter(|_| z.sample(&mut rng) == 1).count();
        let expected = 1.0 / harmonic(1_000, 0.99);
        let observed = hits as f64 / 200_000.0;
        assert!(
            (observed / expected - 1.0).abs() < 0.03,
            "{observed} vs {expected}"
        );
    }

    #[test]
    fn single_key() {
        let z = Zipf::new(1, 0.99);
        let mut rng = Xoshiro256StarStar::seed_from_u64(1);
        assert!((0..100).all(|_| z.sample(&mut rng) == 1));
    }

    #[test]
    fn scramble_is_a_bijection() {
        for n in [1u64, 2, 3, 7, 8, 1000, 1024, 4099] {
            let s = Scramble::new(n);
            let mut seen = vec![false; n as usize];
            for i in 0..n {
                let j = s.apply(i);
                assert!(j < n);
                assert!(!seen[j as usize], "n={n}: {j} hit twice");
                seen[j as usize] = true;
            }
        }
    }

    #[test]
    fn scramble_moves_hot_ranks_apart() {
        let s = Scramble::new(1_000_000);
        let hot: Vec<u64> = (0..4).map(|i| s.apply(i)).collect();
        assert!(hot.windows(2).all(|w| w[0].abs_diff(w[1]) > 1), "{hot:?}");
        // Huge domains work without a table.
        let big = Scramble::new(10_000_000_000);
        assert!(big.apply(0) < 10_000_000_000);
    }

    #[test]
    fn keygen_without_scramble_keeps_rank_order() {
        let g = KeyGen::new(1_000, 1.2, false);
        let mut rng = Xoshiro256StarStar::seed_from_u64(3);
        // P(rank 1) is about 0.2 for theta 1.2 over 1000 keys.
        let zeros = (0..10_000).filter(|_| g.next_index(&mut rng) == 0).count();
        assert!(zeros > 10_000 / 8, "rank 1 should be index 0, got {zeros}");
        let scrambled = KeyGen::new(1_000, 1.2, true);
        let hot = Scramble::new(1_000).apply(0);
        let hits = (0..10_000)
            .filter(|_| scrambled.next_index(&mut rng) == hot)
            .count();
        assert!(
            hits > 10_000 / 8,
            "rank 1 should be index {hot}, got {hits}"
        );
        let u = KeyGen::new(10, 0.0, true);
        assert!((0..1000).all(|_| u.next_index(&mut rng) < 10));
    }

    fn counts(g: &KeyGen, ranking: Option<&Ranking>, samples: usize) -> HashMap<u64, usize> {
        let mut rng = Xoshiro256StarStar::seed_from_u64(21);
        let mut c = HashMap::new();
        for _ in 0..samples {
            *c.entry(g.next_index_ranked(&mut rng, ranking)).or_insert(0) += 1;
        }
        c
    }

    /// The `k` most frequent indexes of a sample, as a sorted list.
    fn top(c: &HashMap<u64, usize>, k: usize) -> Vec<u64> {
        let mut v: Vec<(u64, usize)> = c.iter().map(|(&i, &n)| (i, n)).collect();
        v.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut t: Vec<u64> = v.into_iter().take(k).map(|(i, _)| i).collect();
        t.sort_unstable();
        t
    }

    #[test]
    fn draws_taken_ahead_give_the_keys_of_draws_taken_in_turn() {
        let n = 1_000u64;
        let mut r = Ranking::new(n, ChangeKind::HotIn, 50, 1);
        for (theta, scramble) in [(0.0, false), (0.99, false), (0.99, true)] {
            let g = KeyGen::new(n, theta, scramble);
            let mut in_turn = Xoshiro256StarStar::seed_from_u64(5);
            let mut ahead = Xoshiro256StarStar::seed_from_u64(5);
            let draws: Vec<u64> = (0..500).map(|_| g.draw(&mut ahead)).collect();
            // The ranking changes half way; the draws taken before it get the new one.
            for (i, &d) in draws.iter().enumerate() {
                if i == 250 {
                    r.advance_to(r.epoch() + 1);
                }
                let want = g.next_index_ranked(&mut in_turn, Some(&r));
                assert_eq!(
                    g.index_of_draw(d, Some(&r)),
                    want,
                    "theta {theta}, draw {i}"
                );
            }
        }
    }

    #[test]
    fn hot_in_brings_cold_keys_to_the_top() {
        let (n, moved) = (1_000u64, 5u64);
        let g = KeyGen::new(n, 1.2, false);
        let mut r = Ranking::new(n, ChangeKind::HotIn, moved, 1);
        let before = counts(&g, Some(&r), 200_000);
        assert_eq!(top(&before, 5), vec![0, 1, 2, 3, 4]);
        // The five coldest keys, named before the change, were (almost) never drawn.
        let cold: Vec<u64> = (n - moved..n).collect();
        assert!(cold
            .iter()
            .all(|k| before.get(k).copied().unwrap_or(0) < 50));
        r.advance_to(1);
        let after = counts(&g, Some(&r), 200_000);
        assert_eq!(top(&after, 5), cold);
        // The old hottest key is now sixth: it moved down by N.
        assert_eq!(r.apply(5), 0);
        assert_eq!(r.apply(0), n - moved);
    }

    #[test]
    fn hot_out_sends_hot_keys_to_the_bottom() {
        let mut r = Ranking::new(100, ChangeKind::HotOut, 3, 1);
        r.advance_to(1);
        assert_eq!(
            (r.apply(0), r.apply(96), r.apply(97), r.apply(99)),
            (3, 99, 0, 2)
        );
        r.advance_to(2);
        assert_eq!(r.apply(0), 6);
        // Scrambled huge keyspaces work: nothing is proportional to n.
        let g = KeyGen::new(10_000_000_000, 0.99, true);
        let mut big = Ranking::new(10_000_000_000, ChangeKind::HotOut, 1_000, 1);
        big.advance_to(3);
        let mut rng = Xoshiro256StarStar::seed_from_u64(2);
        assert!(g.next_index_ranked(&mut rng, Some(&big)) < 10_000_000_000);
    }

    #[test]
    fn random_swaps_hot_with_cold_and_stays_a_permutation() {
        let n = 1_000u64;
        let mut r = Ranking::new(n, ChangeKind::Random, 10, 4);
        let mut copy = r.clone();
        for epoch in 1..=5 {
            r.advance_to(epoch);
            let mut seen = vec![false; n as usize];
            for i in 0..n {
                let j = r.apply(i);
                assert!(!seen[j as usize], "epoch {epoch}: {j} hit twice");
                seen[j as usize] = true;
            }
            // Each step swaps 10 pairs, so at most 20 more ranks differ from the identity.
            assert!(r.swaps.len() as u64 <= 20 * epoch);
        }
        r = Ranking::new(n, ChangeKind::Random, 10, 4);
        r.advance_to(1);
        let moved_hot = (0..100).filter(|&i| r.apply(i) != i).count();
        assert_eq!(moved_hot, 10);
        assert!((0..100)
            .filter(|&i| r.apply(i) != i)
            .all(|i| r.apply(i) >= 100));
        // Copies advanced separately agree (each worker thread holds one).
        copy.advance_to(5);
        let mut again = Ranking::new(n, ChangeKind::Random, 10, 4);
        again.advance_to(5);
        assert!((0..n).all(|i| copy.apply(i) == again.apply(i)));
    }
}
