//! SwitchKV's burst detector: a ring of the last N requested keys and, for each key in the
//! ring, how many times it appears there. A key that suddenly takes more than a threshold of
//! the last N requests is worth caching at once instead of waiting for the periodic report.

use super::{FingerprintMap, Fingerprints};

/// Ring size from SwitchKV's evaluation: the last 200 requests.
pub const DEFAULT_LOG_SIZE: usize = 200;

/// Threshold from SwitchKV's evaluation: a key seen more than 8 times in the ring.
pub const DEFAULT_LOG_THRESHOLD: u32 = 8;

/// The last `size` keys seen and a count per key among them.
///
/// The count map holds exactly the keys currently in the ring. A visit inserts the key and
/// pushes out the oldest one: O(1), and allocation-free once the ring has filled. Keys are
/// held as fingerprints (see [`Fingerprints`]). SwitchKV also requires the backend itself to be loaded before it
/// sends an instant report; that check is the caller's.
#[derive(Clone, Debug)]
pub struct CircularLog {
    /// The ring, as fingerprints.
    log: Vec<u64>,
    /// Where the next key goes; once the ring is full, also the oldest entry.
    pos: usize,
    /// Entries of `log` in use (all of them once it has wrapped).
    filled: usize,
    /// Once the ring is full, the oldest entry (`log[pos]`), noted at the end of every visit
    /// while its cache line is at hand: the next visit then looks its count up at once,
    /// alongside its own key's, instead of after reading the ring.
    oldest: u64,
    /// Per key in the ring, its entries there.
    counts: FingerprintMap,
    threshold: u32,
    fingerprints: Fingerprints,
}

impl Default for CircularLog {
    /// SwitchKV's setting: more than 8 visits in the last 200 requests.
    fn default() -> CircularLog {
        CircularLog::new(DEFAULT_LOG_SIZE, DEFAULT_LOG_THRESHOLD)
    }
}

impl CircularLog {
    /// A ring of the last `size` keys that reports a key seen more than `threshold` times in
    /// it. A `threshold` at or above `size` never reports.
    ///
    /// # Panics
    /// If `size` is 0.
    pub fn new(size: usize, threshold: u32) -> CircularLog {
        CircularLog::with_fingerprints(size, threshold, Fingerprints::default())
    }

    /// As [`CircularLog::new`], fingerprinting keys with `fingerprints`: a caller that holds
    /// the same [`Fingerprints`] can fingerprint a key once for this log and others (see
    /// [`CircularLog::see_fingerprint`]).
    pub(crate) fn with_fingerprints(
        size: usize,
        threshold: u32,
        fingerprints: Fingerprints,
    ) -> CircularLog {
        assert!(size > 0, "circular log size must be > 0");
        CircularLog {
            log: vec![0; size],
            pos: 0,
            filled: 0,
            oldest: 0,
            counts: FingerprintMap::with_capacity(size),
            threshold,
            fingerprints,
        }
    }

    /// Records a visit of `key`. Returns true exactly when this visit takes the key's count
    /// in the ring from at most `threshold` to above it: once per crossing, and again only
    /// after other visits have pushed enough of its entries out for the count to fall back to
    /// `threshold` or below. (A visit that pushes out an older entry of the same key leaves
    /// its count unchanged and reports nothing.)
    pub fn see(&mut self, key: &[u8]) -> bool {
        self.see_fingerprint(self.fingerprints.of(key))
    }

    /// As [`CircularLog::see`], for a key whose fingerprint under this log's [`Fingerprints`]
    /// (those it was made with) the caller has already taken.
    pub(crate) fn see_fingerprint(&mut self, fp: u64) -> bool {
        // The oldest entry leaves once the ring is full. When it is this key, the visit
        // leaves the key's count as it was and cannot cross the threshold.
        let mut same = false;
        if self.filled == self.log.len() {
            let oldest = self.oldest;
            debug_assert_eq!(oldest, self.log[self.pos]);
            same = oldest == fp;
            if !same {
                if let Some(c) = self.counts.get_mut(oldest) {
                    *c -= 1;
                    if *c == 0 {
                        self.counts.remove(oldest);
                    }
                }
            }
        } else {
            self.filled += 1;
        }
        let after = if same {
            0
        } else {
            let c = self.counts.get_or_insert(fp, 0);
            *c += 1;
            *c
        };
        self.log[self.pos] = fp;
        self.pos = (self.pos + 1) % self.log.len();
        if self.filled == self.log.len() {
            self.oldest = self.log[self.pos];
        }
        // Without the oldest entry being this key, the count rose by exactly one.
        !same && after - 1 <= self.threshold && after > self.threshold
    }

    /// Reads the log's own fields, which [`CircularLog::touch`] starts from.
    pub(crate) fn touch_header(&self) -> u64 {
        self.oldest ^ self.pos as u64
    }

    /// Reads what a visit of the key with fingerprint `fp` will read first: its count, the
    /// oldest entry's count and the ring where it goes (see [`super::touch`]). Changes
    /// nothing.
    pub(crate) fn touch(&self, fp: u64) -> u64 {
        self.counts.touch(fp) ^ self.counts.touch(self.oldest) ^ self.log[self.pos]
    }

    /// How many of the last `size` visits were for `key`.
    pub fn count(&self, key: &[u8]) -> u32 {
        self.counts.get(self.fingerprints.of(key)).unwrap_or(0)
    }

    /// Number of distinct keys in the ring.
    pub fn distinct(&self) -> usize {
        self.counts.len()
    }

    /// Ring size.
    pub fn size(&self) -> usize {
        self.log.len()
    }

    /// The count a key must exceed to be reported.
    pub fn threshold(&self) -> u32 {
        self.threshold
    }

    /// Empties the ring.
    pub fn clear(&mut self) {
        self.counts.clear();
        self.pos = 0;
        self.filled = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filler(i: usize) -> Vec<u8> {
        format!("filler:{i}").into_bytes()
    }

    #[test]
    fn reports_the_ninth_visit_in_two_hundred() {
        let mut log = CircularLog::default();
        let mut next = 0;
        let mut fill = |log: &mut CircularLog, n: usize| {
            for _ in 0..n {
                assert!(!log.see(&filler(next)));
                next += 1;
            }
        };
        fill(&mut log, 100);
        for i in 1..=8 {
            assert!(!log.see(b"x"), "visit {i}");
            fill(&mut log, 5);
        }
        assert_eq!(log.count(b"x"), 8);
        assert!(log.see(b"x"), "the 9th visit crosses");
        assert_eq!(log.count(b"x"), 9);
        assert!(!log.see(b"x"), "already above: reported once");
        assert_eq!(log.count(b"x"), 10);

        // Window so far: 100 fillers, x, 5 fillers, ..., x, 5, x, x (150 entries). 50 more
        // fillers fill the ring; the next 101 push out the first 100 fillers and the first x.
        fill(&mut log, 50);
        assert_eq!(log.count(b"x"), 10);
        fill(&mut log, 101);
        assert_eq!(log.count(b"x"), 9);
        assert!(!log.see(b"x"), "still above, never fell back");
        assert_eq!(log.count(b"x"), 10);
        // Push out two more x: the count falls to 8, the threshold.
        fill(&mut log, 12);
        assert_eq!(log.count(b"x"), 8);
        assert!(log.see(b"x"), "crossed again");

        // Everything falls out of the window.
        fill(&mut log, 200);
        assert_eq!(log.count(b"x"), 0);
        assert_eq!(log.distinct(), 200);
        for i in 1..=8 {
            assert!(!log.see(b"x"), "visit {i} after the reset");
        }
        assert!(log.see(b"x"));
    }

    #[test]
    fn pushing_out_the_same_key_is_not_a_crossing() {
        let mut log = CircularLog::new(3, 2);
        assert!(!log.see(b"x"));
        assert!(!log.see(b"x"));
        assert!(log.see(b"x"));
        // Each visit now pushes out an x and adds one: the count stays at 3.
        for _ in 0..10 {
            assert!(!log.see(b"x"));
            assert_eq!(log.count(b"x"), 3);
        }
        assert_eq!(log.distinct(), 1);
        assert!(!log.see(b"y"));
        assert_eq!(log.count(b"x"), 2);
        // The next two visits push out the two older x: still 2. The third pushes out y.
        assert!(!log.see(b"x"));
        assert!(!log.see(b"x"));
        assert_eq!(log.count(b"x"), 2);
        assert!(log.see(b"x"));
        assert_eq!(log.count(b"y"), 0);
    }

    #[test]
    fn clear_empties_the_window() {
        let mut log = CircularLog::new(4, 1);
        log.see(b"a");
        assert!(log.see(b"a"));
        log.clear();
        assert_eq!(log.count(b"a"), 0);
        assert!(!log.see(b"a"));
        assert!(log.see(b"a"));
        for k in [b"b", b"c", b"d", b"e"] {
            log.see(k);
        }
        assert_eq!(log.count(b"a"), 0);
        assert_eq!(log.distinct(), 4);
    }
}
