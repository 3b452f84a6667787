//! Figures shared by the side-by-side comparisons (`kvswitch demo`, `kvswitch bench`): medians
//! over runs and a process's CPU time from /proc. Reads /proc only; starts and signals nothing.

/// The median of `v` (the mean of the two middle values for an even count); 0 when empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The median of the values present, or `None` when none is.
pub fn median_of_some(v: impl IntoIterator<Item = Option<f64>>) -> Option<f64> {
    let present: Vec<f64> = v.into_iter().flatten().collect();
    (!present.is_empty()).then(|| median(present))
}

/// `n` a second over `secs`; 0 over no time.
pub fn per_s(n: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}

/// Failed and timed-out requests as a share of all; 1 when none was made.
pub fn loss(r: &loadgen::Report) -> f64 {
    if r.requests == 0 {
        1.0
    } else {
        (r.errors + r.timeouts) as f64 / r.requests as f64
    }
}

/// utime + stime of a process (all its threads), in clock ticks; `None` when it is gone.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_cpu_ticks(&stat)
}

/// utime + stime from the text of /proc/PID/stat.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    // The command name may hold spaces and parentheses; fields resume after the last ')'.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of proc(5), counted from the state (field 3) here.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Clock ticks per second, the unit of [`cpu_ticks`].
pub fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// A process's CPU time from the moment it was made: `start` before a load, `per_request`
/// after it.
#[derive(Clone, Copy, Debug)]
pub struct CpuMeter {
    pid: u32,
    before: Option<u64>,
}

impl CpuMeter {
    pub fn start(pid: u32) -> CpuMeter {
        CpuMeter {
            pid,
            before: cpu_ticks(pid),
        }
    }

    /// Microseconds of CPU (user + system) the process used since [`start`](Self::start),
    /// divided by `requests`; `None` when the process is gone or nothing was served.
    pub fn per_request(&self, requests: u64) -> Option<f64> {
        let after = cpu_ticks(self.pid)?;
        let before = self.before?;
        (requests > 0)
            .then(|| after.saturating_sub(before) as f64 / clock_ticks() * 1e6 / requests as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(vec![]), 0.0);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(
            median_of_some([None, Some(5.0), Some(1.0), None]),
            Some(3.0)
        );
        assert_eq!(median_of_some([None, None]), None);
    }

    #[test]
    fn cpu_ticks_from_stat() {
        // A command name with a space and a parenthesis; utime 1234, stime 56.
        let stat = "4242 (a b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1234 56 0 0 20 0 3 0 \
                    99 1000 200 18446744073709551615";
        assert_eq!(parse_cpu_ticks(stat), Some(1290));
        assert_eq!(parse_cpu_ticks("4242 (short) S 1 2"), None);
        assert_eq!(parse_cpu_ticks("garbage"), None);
    }

    #[test]
    fn this_process_uses_cpu() {
        let pid = std::process::id();
        let meter = CpuMeter::start(pid);
        let mut x = 0u64;
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_millis(50) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        assert!(x > 0);
        assert!(cpu_ticks(pid).is_some());
        assert!(meter.per_request(1).is_some());
        assert_eq!(meter.per_request(0), None);
    }
}
