//! Network namespaces and links: thin wrappers over `ip`, `sysctl` and `ethtool`, and
//! [`in_netns`] to run Rust code inside a namespace.
//!
//! Nothing here remembers what it created; the caller records names in the state file first.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{anyhow, bail, Context};

/// Where `ip netns add` bind-mounts namespaces.
const NETNS_DIR: &str = "/var/run/netns";

/// Runs `f` on a fresh thread that has joined network namespace `ns` (as created by
/// `ip netns add`) and returns its result.
///
/// Only the helper thread changes namespace; the caller's thread is untouched, and sockets opened
/// inside `f` stay in `ns` after it returns. Fails if the namespace does not exist or `setns(2)`
/// is refused (it needs CAP_SYS_ADMIN). A panic in `f` is returned as an error.
pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> anyhow::Result<T> {
    let path = Path::new(NETNS_DIR).join(ns);
    let file = File::open(&path)
        .with_context(|| format!("opening network namespace {ns:?} ({})", path.display()))?;
    std::thread::scope(|scope| {
        let worker = scope.spawn(move || -> anyhow::Result<T> {
            // SAFETY: setns only reads the descriptor, which `file` keeps open for the call.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            if rc != 0 {
                let err = std::io::Error::last_os_error();
                bail!("setns into network namespace {ns:?}: {err}");
            }
            drop(file);
            Ok(f())
        });
        worker
            .join()
            .map_err(|_| anyhow!("closure panicked inside network namespace {ns:?}"))?
    })
}

/// Runs a command to completion; a non-zero exit becomes an error carrying the command line and
/// its stderr.
pub fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `ip ARGS...`
pub fn ip(args: &[&str]) -> anyhow::Result<String> {
    run("ip", args)
}

/// `ip netns exec NS PROGRAM ARGS...`
pub fn ns_run(ns: &str, program: &str, args: &[&str]) -> anyhow::Result<String> {
    let mut full = vec!["netns", "exec", ns, program];
    full.extend_from_slice(args);
    ip(&full)
}

/// Sets `key=value` pairs with one `sysctl -w`, inside `ns` when given.
pub fn sysctl(ns: Option<&str>, settings: &[(&str, &str)]) -> anyhow::Result<()> {
    let pairs: Vec<String> = settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut args = vec!["-q", "-w"];
    args.extend(pairs.iter().map(String::as_str));
    match ns {
        Some(ns) => ns_run(ns, "sysctl", &args)?,
        None => run("sysctl", &args)?,
    };
    Ok(())
}

/// True when the kernel has IPv6, i.e. the `disable_ipv6` sysctls exist.
pub fn have_ipv6() -> bool {
    Path::new("/proc/sys/net/ipv6").exists()
}

/// Names of all namespaces known to `ip netns`.
pub fn list_netns() -> anyhow::Result<Vec<String>> {
    // Lines look like "kvs-c1 (id: 3)" or just "kvs-c1".
    Ok(ip(&["netns", "list"])?
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

/// Names of all links in the root namespace.
pub fn list_links() -> anyhow::Result<Vec<String>> {
    // Lines look like "5: kvs-c1@if2: <BROADCAST,...> ...".
    Ok(ip(&["-o", "link", "show"])?
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|name| name.split('@').next().unwrap_or(name).to_string())
        .collect())
}

pub fn netns_exists(ns: &str) -> bool {
    Path::new(NETNS_DIR).join(ns).exists()
}

pub fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// PIDs of processes inside namespace `ns` (`ip netns pids`).
pub fn netns_pids(ns: &str) -> Vec<u32> {
    ip(&["netns", "pids", ns])
        .map(|out| out.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}
