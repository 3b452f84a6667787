//! The wall clock, read at the edge and handed to the pure crates as a [`kv::Instant`]: the
//! time since this process first asked. The switch loop, the proxy and the control API of one
//! process all read it, so their instants are on one clock.

use std::sync::OnceLock;

static ORIGIN: OnceLock<std::time::Instant> = OnceLock::new();

/// Now, on the process's clock.
pub fn now() -> kv::Instant {
    at(std::time::Instant::now())
}

/// A wall-clock instant on the process's clock (the origin if it came before the first call).
pub fn at(t: std::time::Instant) -> kv::Instant {
    let origin = *ORIGIN.get_or_init(std::time::Instant::now);
    let nanos = t.saturating_duration_since(origin).as_nanos();
    kv::Instant::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_clock_moves_forward() {
        let a = super::now();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = super::now();
        assert!(b.duration_since(a) >= std::time::Duration::from_millis(2));
    }
}
