//! memcslap (libmemcached's memslap 1.1, in Debian's libmemcached-tools): a memcached client
//! the project did not write, run as a child process and read from the report it prints. It
//! measures the wall time of its phases, not the latency of each request.
//!
//! A GET run (`--test=get --execute-number=N --concurrency=C`) makes N random keys of 20–59
//! bytes with values of 50–4999 bytes, sets them one by one on one connection, then starts C
//! threads, each with its own connections, that get N keys chosen at random. It prints:
//!
//! ```text
//! Time to generate      10000 test keys:                0.036 seconds.
//! Time to set           10000 keys:                     0.530 seconds.
//! Time to start             4 threads:                  0.001 seconds.
//! --------------------------------------------------------------------
//! Time to get           40000 keys by    4 threads:     1.231 seconds.
//! --------------------------------------------------------------------
//! Time total:                                           1.799 seconds.
//! ```
//!
//! where the get count is the gets that found their key; a get that failed for another reason
//! also writes a `Fatal error for key ...` line to stderr.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context};
use testbed::local::{self, Proc};

use super::last_lines;

/// What one GET run printed.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    /// Keys the set phase stored (it stops at the first failed set).
    pub stored: u64,
    /// Seconds of the set phase.
    pub set_s: f64,
    /// Gets that found their key.
    pub hits: u64,
    /// Gets that failed with an error other than a miss.
    pub fatal: u64,
    /// Seconds of the get phase, from starting the threads to the last one ending.
    pub get_s: f64,
}

/// Runs a GET test against `target` (`keys` keys, each of `threads` threads getting `keys`
/// of them), its output in `log`. Fails if memcslap exits with an error, prints no report,
/// or is still running after `limit` (it is then killed).
pub fn run(
    bin: &Path,
    target: SocketAddr,
    threads: usize,
    keys: u64,
    log: &Path,
    limit: Duration,
) -> anyhow::Result<Run> {
    let mut cmd = Command::new(bin);
    cmd.arg(format!("--servers={target}"))
        .arg(format!("--concurrency={threads}"))
        .arg(format!("--execute-number={keys}"))
        .arg("--test=get");
    local::die_with_parent(&mut cmd);
    let mut proc = Proc::spawn_logged("memcslap", &mut cmd, log)?;
    let status = proc.wait_exit(limit)?;
    let text = std::fs::read_to_string(log)
        .with_context(|| format!("reading memcslap's output {}", log.display()))?;
    if !status.success() {
        bail!(
            "memcslap against {target} failed ({status}):\n{}",
            last_lines(&text, 10)
        );
    }
    parse(&text).with_context(|| format!("memcslap against {target}:\n{}", last_lines(&text, 10)))
}

/// Reads the report of a GET run (stdout and stderr together).
pub fn parse(text: &str) -> anyhow::Result<Run> {
    let mut set = None;
    let mut get = None;
    let mut fatal = 0;
    for line in text.lines() {
        if line.starts_with("Fatal error") {
            fatal += 1;
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["Time", "to", "set", n, "keys:", secs, "seconds."] => {
                set = Some((n.parse::<u64>()?, secs.parse::<f64>()?));
            }
            ["Time", "to", "get", n, "keys", "by", _, "threads:", secs, "seconds."] => {
                get = Some((n.parse::<u64>()?, secs.parse::<f64>()?));
            }
            _ => {}
        }
    }
    let (stored, set_s) = set.context("no `Time to set` line")?;
    let (hits, get_s) = get.context("no `Time to get` line")?;
    Ok(Run {
        stored,
        set_s,
        hits,
        fatal,
        get_s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = "\
Time to generate      10000 test keys:                0.036 seconds.
Time to set           10000 keys:                     0.530 seconds.
Time to start             4 threads:                  0.001 seconds.
--------------------------------------------------------------------
Time to get           39998 keys by    4 threads:     1.231 seconds.
--------------------------------------------------------------------
Time total:                                           1.799 seconds.
";

    #[test]
    fn parses_a_get_run() {
        let run = parse(REPORT).expect("parse");
        assert_eq!(
            run,
            Run {
                stored: 10000,
                set_s: 0.530,
                hits: 39998,
                fatal: 0,
                get_s: 1.231,
            }
        );
    }

    #[test]
    fn counts_fatal_errors() {
        let text = format!(
            "Fatal error for key 'abc': SERVER ERROR\nFatal error for key 'def': \
             CONNECTION FAILURE\n{REPORT}"
        );
        assert_eq!(parse(&text).expect("parse").fatal, 2);
    }

    #[test]
    fn refuses_a_report_without_its_phases() {
        assert!(parse("").is_err());
        // A set run has no get phase.
        let set_only = "Time to set           10000 keys:  0.530 seconds.\n";
        assert!(parse(set_only).is_err());
        let bad = REPORT.replace("1.231", "soon");
        assert!(parse(&bad).is_err());
    }
}
