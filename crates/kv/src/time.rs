//! The time the pure crates run on: an instant on the caller's clock, in nanoseconds since an
//! origin the caller chose (the daemon's start, a simulator's time zero). Nothing here reads a
//! clock; the daemon maps the wall clock onto it, a test or a simulator counts it up itself, so
//! the same instants give the same run.

use std::fmt;
use std::ops::{Add, AddAssign, Sub};
use std::time::Duration;

/// A point in time on the caller's clock. Differences saturate at zero, as
/// `std::time::Instant`'s do.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant {
    nanos: u64,
}

impl Instant {
    /// The clock's origin.
    pub const ZERO: Instant = Instant { nanos: 0 };

    pub const fn from_nanos(nanos: u64) -> Instant {
        Instant { nanos }
    }

    pub const fn from_micros(micros: u64) -> Instant {
        Instant {
            nanos: micros.saturating_mul(1_000),
        }
    }

    pub const fn from_millis(millis: u64) -> Instant {
        Instant {
            nanos: millis.saturating_mul(1_000_000),
        }
    }

    pub const fn from_secs(secs: u64) -> Instant {
        Instant {
            nanos: secs.saturating_mul(1_000_000_000),
        }
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.nanos
    }

    /// Milliseconds since the origin.
    pub const fn as_millis(self) -> u64 {
        self.nanos / 1_000_000
    }

    /// The time since the origin.
    pub const fn since_origin(self) -> Duration {
        Duration::from_nanos(self.nanos)
    }

    /// The time from `earlier` to `self`; zero if `earlier` is later.
    pub fn duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.nanos.saturating_sub(earlier.nanos))
    }

    /// The same as [`Instant::duration_since`], named as `std::time::Instant` names it.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        self.duration_since(earlier)
    }

    /// The time from `earlier` to `self`, or `None` if `earlier` is later.
    pub fn checked_duration_since(self, earlier: Instant) -> Option<Duration> {
        self.nanos
            .checked_sub(earlier.nanos)
            .map(Duration::from_nanos)
    }

    /// `self + d`, or `None` past the end of the clock (about 584 years from its origin).
    pub fn checked_add(self, d: Duration) -> Option<Instant> {
        let d = u64::try_from(d.as_nanos()).ok()?;
        self.nanos.checked_add(d).map(Instant::from_nanos)
    }

    /// `self - d`, or `None` before the origin.
    pub fn checked_sub(self, d: Duration) -> Option<Instant> {
        let d = u64::try_from(d.as_nanos()).ok()?;
        self.nanos.checked_sub(d).map(Instant::from_nanos)
    }
}

/// Saturates at the end of the clock rather than overflowing: a deadline that far away is
/// never reached either way.
impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        let d = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Instant::from_nanos(self.nanos.saturating_add(d))
    }
}

impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, d: Duration) {
        *self = *self + d;
    }
}

/// Saturates at the origin.
impl Sub<Duration> for Instant {
    type Output = Instant;
    fn sub(self, d: Duration) -> Instant {
        let d = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Instant::from_nanos(self.nanos.saturating_sub(d))
    }
}

/// Saturates at zero.
impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, earlier: Instant) -> Duration {
        self.duration_since(earlier)
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{:09}s",
            self.nanos / 1_000_000_000,
            self.nanos % 1_000_000_000
        )
    }
}

impl fmt::Display for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        let t = Instant::from_millis(1_500);
        assert_eq!(t.as_nanos(), 1_500_000_000);
        assert_eq!(t + Duration::from_millis(500), Instant::from_secs(2));
        assert_eq!(t - Duration::from_secs(5), Instant::ZERO);
        assert_eq!(Instant::ZERO - t, Duration::ZERO);
        assert_eq!(t - Instant::from_secs(1), Duration::from_millis(500));
        assert_eq!(Instant::ZERO.checked_duration_since(t), None);
        assert_eq!(
            Instant::from_nanos(u64::MAX - 1) + Duration::from_secs(1),
            Instant::from_nanos(u64::MAX)
        );
        assert_eq!(
            Instant::from_nanos(u64::MAX).checked_add(Duration::from_nanos(1)),
            None
        );
        assert_eq!(Instant::from_micros(3).as_nanos(), 3_000);
        assert_eq!(format!("{:?}", Instant::from_millis(1_500)), "1.500000000s");
    }
}
