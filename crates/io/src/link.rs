//! Creating the interfaces a port is opened on: veth pairs and the few settings a local port
//! needs (MAC, IPv4 addresses and routes, alias, offloads, per-interface sysctls).
//!
//! Thin wrappers over iproute2's `ip` and `ethtool`, run as child processes, and over
//! `/proc/sys` and `/sys/class/net`. Nothing here decides which names or addresses to use; the
//! caller does. Every error names the interface and the command that failed.

use std::io;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Stdio};

/// Linux interface names hold at most 15 bytes (`IFNAMSIZ` - 1).
pub const MAX_IFNAME: usize = 15;

/// Whether `name` can name an interface: 1 to 15 bytes, no `/`, `:` or whitespace, and not
/// `.` or `..`.
pub fn valid_ifname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_IFNAME
        && name != "."
        && name != ".."
        && !name.contains(['/', ':'])
        && !name.contains(char::is_whitespace)
}

fn check_name(name: &str) -> io::Result<()> {
    if valid_ifname(name) {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a valid interface name"),
        ))
    }
}

/// Runs `program args...`; a failure to start or a non-zero exit becomes an error carrying the
/// command line and its stderr.
fn run(program: &str, args: &[&str]) -> io::Result<()> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot run `{program}` (is it installed?): {e}"),
            )
        })?;
    if out.status.success() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "`{program} {}` failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

fn ip(args: &[&str]) -> io::Result<()> {
    run("ip", args)
}

/// Whether an interface called `name` exists in this network namespace.
pub fn exists(name: &str) -> bool {
    valid_ifname(name) && Path::new("/sys/class/net").join(name).exists()
}

/// Deletes interface `name`; one that does not exist is not an error. Deleting either end of a
/// veth pair deletes both.
pub fn delete(name: &str) -> io::Result<()> {
    check_name(name)?;
    if !exists(name) {
        return Ok(());
    }
    match ip(&["link", "delete", "dev", name]) {
        // It may have gone in the meantime (its peer was deleted).
        Err(_) if !exists(name) => Ok(()),
        other => other,
    }
}

/// Brings interface `name` up.
pub fn set_up(name: &str) -> io::Result<()> {
    check_name(name)?;
    ip(&["link", "set", "dev", name, "up"])
}

/// Sets the MAC address of interface `name`.
pub fn set_mac(name: &str, mac: [u8; 6]) -> io::Result<()> {
    check_name(name)?;
    let text = mac.map(|b| format!("{b:02x}")).join(":");
    ip(&["link", "set", "dev", name, "address", &text])
}

/// Sets the alias of interface `name` (`ip link show` prints it; readable with [`alias`]).
pub fn set_alias(name: &str, alias: &str) -> io::Result<()> {
    check_name(name)?;
    ip(&["link", "set", "dev", name, "alias", alias])
}

/// The alias of interface `name`; `None` if it has none or does not exist.
pub fn alias(name: &str) -> Option<String> {
    if !valid_ifname(name) {
        return None;
    }
    let text =
        std::fs::read_to_string(Path::new("/sys/class/net").join(name).join("ifalias")).ok()?;
    let text = text.trim_end_matches('\n');
    (!text.is_empty()).then(|| text.to_string())
}

/// Adds `addr/prefix_len` to interface `name`. A prefix shorter than 32 also adds the route to
/// that network through the interface, as `ip addr add` does.
pub fn add_ipv4(name: &str, addr: Ipv4Addr, prefix_len: u8) -> io::Result<()> {
    check_name(name)?;
    ip(&["addr", "add", &format!("{addr}/{prefix_len}"), "dev", name])
}

/// Routes `dest` (one address) through interface `name`, on link, preferring source `src`.
pub fn add_host_route(name: &str, dest: Ipv4Addr, src: Ipv4Addr) -> io::Result<()> {
    check_name(name)?;
    ip(&[
        "route",
        "add",
        &format!("{dest}/32"),
        "dev",
        name,
        "src",
        &src.to_string(),
    ])
}

/// Routes `dest` (one address) through interface `name` like [`add_host_route`], replacing
/// a route to it that is already there.
pub fn replace_host_route(name: &str, dest: Ipv4Addr, src: Ipv4Addr) -> io::Result<()> {
    check_name(name)?;
    ip(&[
        "route",
        "replace",
        &format!("{dest}/32"),
        "dev",
        name,
        "src",
        &src.to_string(),
    ])
}

/// Sets the MTU of interface `name`.
pub fn set_mtu(name: &str, mtu: usize) -> io::Result<()> {
    check_name(name)?;
    ip(&["link", "set", "dev", name, "mtu", &mtu.to_string()])
}

/// Writes `value` to `/proc/sys/net/ipv4/conf/<name>/<key>` (e.g. `arp_ignore`).
pub fn set_ipv4_conf(name: &str, key: &str, value: &str) -> io::Result<()> {
    check_name(name)?;
    let path = Path::new("/proc/sys/net/ipv4/conf").join(name).join(key);
    std::fs::write(&path, value)
        .map_err(|e| io::Error::new(e.kind(), format!("{name}: writing {}: {e}", path.display())))
}

/// Turns IPv6 off on interface `name`, so that it sends no router solicitations, neighbour
/// discovery or MLD reports. Nothing to do on a kernel without IPv6.
pub fn disable_ipv6(name: &str) -> io::Result<()> {
    check_name(name)?;
    let path = Path::new("/proc/sys/net/ipv6/conf")
        .join(name)
        .join("disable_ipv6");
    if !Path::new("/proc/sys/net/ipv6").exists() {
        return Ok(());
    }
    std::fs::write(&path, "1")
        .map_err(|e| io::Error::new(e.kind(), format!("{name}: writing {}: {e}", path.display())))
}

/// Turns off the offloads that would hand a port on the other end of a veth frames it cannot
/// forward as they are: transmit checksumming (frames would leave with only the pseudo-header
/// sum in place) and with it TCP segmentation (frames larger than the MTU), plus generic
/// segmentation and receive coalescing where the kernel lets them be changed.
///
/// Fails only if transmit checksumming stays on (`ethtool -K <name> tx off`).
pub fn disable_offloads(name: &str) -> io::Result<()> {
    check_name(name)?;
    run("ethtool", &["-K", name, "tx", "off"])?;
    // Best effort: not every kernel lets each of these be changed, and `tx off` already
    // turns off TSO, the one that matters.
    for feature in ["tso", "gso", "gro"] {
        let _ = run("ethtool", &["-K", name, feature, "off"]);
    }
    Ok(())
}

/// A veth pair in this network namespace, deleted when dropped.
#[derive(Debug)]
pub struct VethPair {
    a: String,
    b: String,
    removed: bool,
}

impl VethPair {
    /// Creates the pair `a` ↔ `b`, both down. Fails if either name is taken or invalid.
    pub fn create(a: &str, b: &str) -> io::Result<VethPair> {
        check_name(a)?;
        check_name(b)?;
        if a == b {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a veth pair needs two names, got {a:?} twice"),
            ));
        }
        for name in [a, b] {
            if exists(name) {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("interface {name} already exists"),
                ));
            }
        }
        ip(&["link", "add", a, "type", "veth", "peer", "name", b])?;
        Ok(VethPair {
            a: a.to_string(),
            b: b.to_string(),
            removed: false,
        })
    }

    /// The first end.
    pub fn a(&self) -> &str {
        &self.a
    }

    /// The second end.
    pub fn b(&self) -> &str {
        &self.b
    }

    /// Deletes the pair now, reporting a failure that dropping could only ignore.
    pub fn remove(mut self) -> io::Result<()> {
        self.removed = true;
        delete(&self.a)?;
        delete(&self.b)
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        if !self.removed {
            let _ = delete(&self.a);
            let _ = delete(&self.b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_names() {
        assert!(valid_ifname("kvs-local"));
        assert!(valid_ifname("a23456789012345"));
        assert!(!valid_ifname("a234567890123456"));
        assert!(!valid_ifname(""));
        assert!(!valid_ifname("a/b"));
        assert!(!valid_ifname("a b"));
        assert!(!valid_ifname("eth0:1"));
        assert!(!valid_ifname(".."));
        assert!(!exists("no/such"));
        assert_eq!(alias("no such"), None);
    }
}
