//! The local port: a veth pair from the switch into this host's own network stack. TCP to the
//! VIP's port reaches the proxy through it, and the proxy's connections to the servers leave
//! through it, so to the testbed's clients and servers the host is one more station behind the
//! switch, owning the VIP's MAC and address.
//!
//! Made when the daemon starts and removed when it stops; one a crashed daemon left behind is
//! recognised by its alias and removed on the next start. Interfaces kvswitch did not make, or
//! that a running kvswitch still uses, are never touched.

use std::net::Ipv4Addr;
use std::path::Path;

use anyhow::{bail, Context};
use kvio::link::{self, VethPair};

use config::{Config, LocalPort as LocalPortConfig};

/// Every local port's alias starts with this; the rest is the owner's PID.
const ALIAS_PREFIX: &str = "kvswitch local port, pid ";

/// A local port that exists; dropping it deletes the pair.
#[derive(Debug)]
pub struct LocalPort {
    pair: VethPair,
}

impl LocalPort {
    /// Makes the pair `local.port` (the switch's end, left without addresses) ↔ `local.peer`
    /// (the host's end: the VIP's MAC, [`Config::local_addrs`], routes to servers outside the
    /// VIP's network, IPv6 and transmit offloads off), both up. A pair a crashed kvswitch left
    /// behind is removed first.
    ///
    /// Fails, removing whatever it made, if an interface of that name exists that kvswitch did
    /// not make or that a running kvswitch owns, or if a step fails (it needs CAP_NET_ADMIN).
    pub fn create(cfg: &Config, local: &LocalPortConfig) -> anyhow::Result<LocalPort> {
        let what = |key: &str| format!("{}: `switch.{key}`", cfg.path.display());
        clear_stale(&local.port).with_context(|| what("local_port"))?;
        clear_stale(&local.peer).with_context(|| what("local_peer"))?;
        let pair = VethPair::create(&local.port, &local.peer)
            .with_context(|| format!("{}: creating the local port", what("local_port")))?;
        let port = LocalPort { pair };
        port.configure(cfg)
            .with_context(|| format!("setting up local port {}", local.port))?;
        Ok(port)
    }

    fn configure(&self, cfg: &Config) -> anyhow::Result<()> {
        let (port, peer) = (self.port(), self.peer());
        let alias = format!("{ALIAS_PREFIX}{}", std::process::id());
        for end in [port, peer] {
            link::set_alias(end, &alias)?;
            // Set before the link is up, so that no IPv6 router solicitation or neighbour
            // discovery is ever sent into the switch.
            link::disable_ipv6(end)?;
        }
        link::set_mac(peer, cfg.vip_mac.0)?;
        // Answer ARP only for the host end's own addresses (the switch answers for them
        // anyway), and ask with the address on the target's network.
        link::set_ipv4_conf(peer, "arp_ignore", "1")?;
        link::set_ipv4_conf(peer, "arp_announce", "2")?;
        // Frames from the host's stack must reach the switch whole and with checksums filled.
        link::disable_offloads(peer)?;
        // The switch reads this end: no coalescing of received segments (best effort, as the
        // testbed does for its ports).
        let _ = link::disable_offloads(port);
        link::set_up(port)?;
        // Addresses after the link is up, so that their local routes exist at once and the
        // proxy can bind the VIP.
        link::set_up(peer)?;
        let addrs = cfg.local_addrs();
        for (ip, len) in &addrs {
            link::add_ipv4(peer, *ip, *len)?;
        }
        let (source, len) = addrs[0];
        for b in &cfg.servers {
            if !same_network(*b.addr.ip(), source, len) {
                link::add_host_route(peer, *b.addr.ip(), source)?;
            }
        }
        Ok(())
    }

    /// The switch's end, opened as a port.
    pub fn port(&self) -> &str {
        self.pair.a()
    }

    /// The host's end.
    pub fn peer(&self) -> &str {
        self.pair.b()
    }

    /// Deletes the pair now, reporting a failure that dropping could only ignore.
    pub fn remove(self) -> anyhow::Result<()> {
        let name = self.port().to_string();
        self.pair
            .remove()
            .with_context(|| format!("removing local port {name}"))
    }
}

/// Whether `a` is inside `net/len`.
fn same_network(a: Ipv4Addr, net: Ipv4Addr, len: u8) -> bool {
    let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
    u32::from(a) & mask == u32::from(net) & mask
}

/// Removes interface `name` if a kvswitch that is no longer running made it; fails if it
/// exists and is someone else's.
fn clear_stale(name: &str) -> anyhow::Result<()> {
    if !link::exists(name) {
        return Ok(());
    }
    let owner = link::alias(name)
        .as_deref()
        .and_then(|a| a.strip_prefix(ALIAS_PREFIX))
        .and_then(|pid| pid.parse::<u32>().ok());
    let Some(pid) = owner else {
        bail!("interface {name} exists and was not made by kvswitch; choose another name");
    };
    if pid != std::process::id() && is_kvswitch(pid) {
        bail!("interface {name} is the local port of kvswitch process {pid}, which still runs");
    }
    tracing::warn!(
        interface = name,
        pid,
        "removing a local port left behind by a kvswitch that is gone"
    );
    link::delete(name).with_context(|| format!("removing stale local port {name}"))
}

/// Whether process `pid` is alive (not a zombie) and runs the same program as this one (by its
/// name, which survives the binary being replaced on disk).
fn is_kvswitch(pid: u32) -> bool {
    let read = |p: &Path| std::fs::read_to_string(p).ok();
    // "PID (comm) S ...": the state follows the last parenthesis; Z and X are dead.
    let alive = read(Path::new(&format!("/proc/{pid}/stat"))).is_some_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X')
    });
    match (
        read(Path::new(&format!("/proc/{pid}/comm"))),
        read(Path::new("/proc/self/comm")),
    ) {
        (Some(theirs), Some(ours)) => alive && theirs == ours,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks() {
        let net = Ipv4Addr::new(10, 77, 0, 100);
        assert!(same_network(Ipv4Addr::new(10, 77, 0, 3), net, 24));
        assert!(!same_network(Ipv4Addr::new(10, 77, 1, 3), net, 24));
        assert!(same_network(Ipv4Addr::new(10, 77, 1, 3), net, 16));
        assert!(!same_network(Ipv4Addr::new(10, 77, 0, 3), net, 32));
        assert!(same_network(Ipv4Addr::new(192, 0, 2, 1), net, 0));
    }

    #[test]
    fn a_running_process_of_this_program_is_recognised() {
        assert!(is_kvswitch(std::process::id()));
        assert!(!is_kvswitch(u32::MAX));
    }
}
