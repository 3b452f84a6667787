//! The host a node's store runs on: this process and the system's clocks.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The monotonic clock from the moment [`SystemHost::start`] is called, the system's unix
/// time, and this process's id.
#[derive(Debug)]
pub struct SystemHost {
    started: Instant,
    started_unix: i64,
}

impl SystemHost {
    /// A host whose store starts now.
    pub fn start() -> SystemHost {
        SystemHost {
            started: Instant::now(),
            started_unix: unix_now() as i64,
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl store::Host for SystemHost {
    fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    fn started_unix(&self) -> i64 {
        self.started_unix
    }

    fn unix_now(&self) -> u64 {
        unix_now()
    }

    fn pid(&self) -> u32 {
        std::process::id()
    }
}
