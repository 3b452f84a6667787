//! Starting and stopping the testbed's daemons.
//!
//! Processes are only ever signalled by recorded PID, and only while /proc/PID/cmdline still
//! shows the command line that was started, so a reused PID is left alone.

use std::fs::{File, OpenOptions};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

/// How long a daemon gets to exit after SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(2);
const POLL: Duration = Duration::from_millis(20);

/// Starts `argv` (inside `ns` via `ip netns exec` when given) with stdin closed and
/// stdout/stderr appended to `log`. The child gets its own process group so a terminal's Ctrl-C
/// aimed at the caller does not reach it.
///
/// `ip netns exec` execs the program in place, so the child's PID is the daemon's PID.
pub fn spawn(ns: Option<&str>, argv: &[String], log: &Path) -> anyhow::Result<Child> {
    start(&mut command(ns, argv, log)?, argv)
}

/// Starts `argv` as [`spawn`] does, and has the kernel kill it when the calling thread exits,
/// so that a caller killed by a signal, without running its destructors, leaves no such
/// process behind. For children that live no longer than the call that starts them (a
/// bench's agents), not for daemons meant to outlive the command.
pub fn spawn_tied(ns: Option<&str>, argv: &[String], log: &Path) -> anyhow::Result<Child> {
    start(
        crate::local::die_with_parent(&mut command(ns, argv, log)?),
        argv,
    )
}

fn command(ns: Option<&str>, argv: &[String], log: &Path) -> anyhow::Result<Command> {
    let out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening log {}", log.display()))?;
    let err = out.try_clone().context("duplicating log descriptor")?;
    let mut cmd = match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).args(argv);
            c
        }
        None => {
            let mut c = Command::new(&argv[0]);
            c.args(&argv[1..]);
            c
        }
    };
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    Ok(cmd)
}

fn start(cmd: &mut Command, argv: &[String]) -> anyhow::Result<Child> {
    cmd.spawn()
        .with_context(|| format!("starting `{}`", argv.join(" ")))
}

/// The command line of `pid`, or None when it is gone.
fn cmdline(pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    // Each argument ends with a NUL; an empty one (`--save ""`) is an argument too.
    let raw = raw.strip_suffix(&[0]).unwrap_or(&raw);
    if raw.is_empty() {
        return Some(Vec::new());
    }
    Some(
        raw.split(|&b| b == 0)
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect(),
    )
}

/// True when `pid` runs `argv`. The recorded command line may be preceded by a wrapper that has
/// not exec'd yet (`ip netns exec NS`) or by an interpreter (a script started by path), so the
/// check is that /proc/PID/cmdline ends with `argv`; the recorded argv holds generated file
/// paths, so an unrelated process matching it is not a practical concern.
pub fn runs(pid: u32, argv: &[String]) -> bool {
    match cmdline(pid) {
        Some(actual) => !argv.is_empty() && actual.ends_with(argv),
        None => false,
    }
}

/// The processes whose command line ends with `argv` (as [`runs`] checks one): for a process
/// started but not yet recorded when its owner died. `argv` names generated files, so only
/// the process started with them matches.
pub fn running(argv: &[String]) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| runs(pid, argv))
        .collect()
}

/// The basename of `pid`'s program, or None when it is gone.
pub fn program(pid: u32) -> Option<String> {
    let argv0 = cmdline(pid)?.into_iter().next()?;
    Some(
        Path::new(&argv0)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or(argv0),
    )
}

/// True while `pid` exists and is not a zombie; reaps it if it is our zombie child.
pub fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the parenthesised command name, which may itself contain ") ".
    let state = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next());
    if state == Some('Z') || state == Some('X') {
        reap(pid);
        return false;
    }
    true
}

/// Collects `pid`'s exit status if it is our child; a no-op otherwise.
fn reap(pid: u32) {
    let mut status = 0;
    // SAFETY: waitpid only writes to `status`.
    unsafe {
        libc::waitpid(pid as libc::pid_t, &mut status, libc::WNOHANG);
    }
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill has no memory effects; `pid` is positive so it names one process.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// Sends SIGTERM to every PID, waits up to two seconds for all of them to exit, then sends
/// SIGKILL to the rest and waits a little more. Returns the PIDs still alive at the end.
pub fn stop_all(pids: &[u32]) -> Vec<u32> {
    let pids: Vec<u32> = pids.iter().copied().filter(|&p| p > 1).collect();
    for &pid in &pids {
        signal(pid, libc::SIGTERM);
    }
    let mut left = wait_gone(&pids, TERM_GRACE);
    if !left.is_empty() {
        tracing::warn!(?left, "processes ignored SIGTERM; sending SIGKILL");
        for &pid in &left {
            signal(pid, libc::SIGKILL);
        }
        left = wait_gone(&left, Duration::from_secs(1));
    }
    left
}

/// How long a killed process may take to be gone.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// Kills `pid` with SIGKILL, as a crash would, if it still runs `argv`, and waits up to
/// [`KILL_WAIT`] for it to be gone (reaped, if it is our child). Fails if it was not running
/// `argv` or is still there.
pub fn kill(pid: u32, argv: &[String]) -> anyhow::Result<()> {
    if pid <= 1 || !runs(pid, argv) {
        anyhow::bail!("pid {pid} does not run `{}`", argv.join(" "));
    }
    signal(pid, libc::SIGKILL);
    // A killed process with many threads and mapped rings can take more than a second to be
    // gone on a loaded machine.
    if !wait_gone(&[pid], KILL_WAIT).is_empty() {
        anyhow::bail!("pid {pid} is still alive {KILL_WAIT:?} after SIGKILL");
    }
    Ok(())
}

/// Stops (`SIGSTOP`) or continues (`SIGCONT`) `pid`, only while it runs `argv`.
pub fn pause(pid: u32, argv: &[String], stop: bool) -> anyhow::Result<()> {
    if pid <= 1 || !runs(pid, argv) {
        anyhow::bail!("pid {pid} does not run `{}`", argv.join(" "));
    }
    signal(pid, if stop { libc::SIGSTOP } else { libc::SIGCONT });
    Ok(())
}

fn wait_gone(pids: &[u32], limit: Duration) -> Vec<u32> {
    let deadline = Instant::now() + limit;
    loop {
        let left: Vec<u32> = pids.iter().copied().filter(|&p| alive(p)).collect();
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(POLL);
    }
}

/// The last `lines` lines of a log file, for error messages.
pub fn tail(path: &Path, lines: usize) -> String {
    use std::io::Read;
    let mut text = String::new();
    if let Ok(mut f) = File::open(path) {
        let _ = f.read_to_string(&mut text);
    }
    let all: Vec<&str> = text.lines().collect();
    let start = all.len().saturating_sub(lines);
    if all.is_empty() {
        return "(log is empty)".to_string();
    }
    all[start..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Starts `sleep 30` from a thread that exits at once, and returns its PID.
    fn sleeper(tied: bool, log: &Path) -> u32 {
        let log = log.to_path_buf();
        std::thread::spawn(move || {
            let argv = ["sleep".to_string(), "30".to_string()];
            let child = if tied {
                spawn_tied(None, &argv, &log)
            } else {
                spawn(None, &argv, &log)
            };
            child.expect("sleep starts").id()
        })
        .join()
        .expect("the starting thread returns")
    }

    #[test]
    fn a_tied_child_dies_with_the_thread_that_started_it_and_an_untied_one_does_not() {
        let log = Path::new("/dev/null");
        let tied = sleeper(true, log);
        let untied = sleeper(false, log);
        let gone = wait_gone(&[tied], Duration::from_secs(10));
        let untied_alive = alive(untied);
        let left = stop_all(&[untied]);
        assert!(gone.is_empty(), "tied child {tied} outlived its thread");
        assert!(untied_alive, "untied child {untied} died with its thread");
        assert!(left.is_empty(), "untied child {untied} did not stop");
    }
}
