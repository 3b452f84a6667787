//! `kvswitch bench SCENARIO`: reproducible measurements that start everything they measure on
//! loopback, compare kvswitch with what it replaces in one run, and check the figures against
//! the project's targets. Each scenario stops every process it started, also on error.

pub mod memcslap;
pub mod proxy;

/// The scenarios of `kvswitch bench`.
#[derive(clap::Subcommand, Debug)]
pub enum Scenario {
    /// memcached direct, nutcracker and kvswitch proxy side by side on loopback, under the same
    /// load from two clients (kvswitch load and memcslap): GET throughput, p50/p99 latency and
    /// each proxy's CPU time per request, checked against the proxy's targets.
    Proxy(proxy::ProxyBenchArgs),
}

pub fn run(scenario: &Scenario) -> anyhow::Result<()> {
    match scenario {
        Scenario::Proxy(args) => proxy::run(args),
    }
}

/// The first line `bin arg` prints (stdout, else stderr), e.g. its version; "unknown" when it
/// prints nothing or does not start.
pub fn version_line(bin: &std::path::Path, arg: &str) -> String {
    let Ok(out) = std::process::Command::new(bin).arg(arg).output() else {
        return "unknown".into();
    };
    [&out.stdout, &out.stderr]
        .iter()
        .flat_map(|b| {
            String::from_utf8_lossy(b)
                .lines()
                .map(|l| l.trim().to_owned())
                .collect::<Vec<_>>()
        })
        .find(|l| !l.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// The last `n` lines of `text`, for error messages.
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
