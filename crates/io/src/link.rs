//! Creating the interfaces a port is opened on: veth pairs and the few settings a local port
//! needs (MAC, IPv4 addresses and routes, alias, offloads, per-interface sysctls).
//!
//! Links, addresses and routes are set over rtnetlink (`rtnl`), offloads through the
//! kernel's ethtool ioctl (`ethtool`), sysctls in `/proc/sys`; no program is run. Nothing
//! here decides which names or addresses to use; the caller does. Every error names the
//! interface and what was being done, and a refusal carries the kernel's errno.

mod ethtool;
mod rtnl;

use std::fmt::Display;
use std::io;
use std::net::Ipv4Addr;
use std::path::Path;

use netlink_packet_core::{DefaultNla, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
use netlink_packet_route::address::{AddressAttribute, AddressMessage, AddressScope};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

/// Linux interface names hold at most 15 bytes (`IFNAMSIZ` - 1).
pub const MAX_IFNAME: usize = 15;

/// Whether `name` can name an interface: 1 to 15 bytes, no `/`, `:` or whitespace, and not
/// `.` or `..`.
pub fn valid_ifname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_IFNAME
        && name != "."
        && name != ".."
        && !name.contains(['/', ':', '\0'])
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

/// Turns an error of doing `what` to interface `name` into one that says so, of the same kind.
fn failed<'a>(name: &'a str, what: impl Display + 'a) -> impl FnOnce(io::Error) -> io::Error + 'a {
    move |e| io::Error::new(e.kind(), format!("{name}: {what}: {e}"))
}

/// A request about interface `name`, which the kernel finds by name.
fn link_message(name: &str) -> LinkMessage {
    let mut message = LinkMessage::default();
    message
        .attributes
        .push(LinkAttribute::IfName(name.to_string()));
    message
}

/// Changes interface `name` as `message` (built on [`link_message`]) says.
fn set_link(name: &str, what: impl Display, message: LinkMessage) -> io::Result<()> {
    rtnl::request(RouteNetlinkMessage::SetLink(message), 0).map_err(failed(name, what))
}

/// The index of interface `name`, which addresses and routes are attached by.
fn index(name: &str) -> io::Result<u32> {
    crate::afpacket::if_index(name)
        .map_err(|e| io::Error::new(e.kind(), "there is no interface of that name"))
}

/// Whether an interface called `name` exists in this network namespace.
pub fn exists(name: &str) -> bool {
    valid_ifname(name) && Path::new("/sys/class/net").join(name).exists()
}

/// Deletes interface `name`; one that does not exist is not an error. Deleting either end of a
/// veth pair deletes both.
pub fn delete(name: &str) -> io::Result<()> {
    check_name(name)?;
    match rtnl::request(RouteNetlinkMessage::DelLink(link_message(name)), 0) {
        // It never existed, or went in the meantime (its peer was deleted).
        Err(e) if rtnl::errno(&e) == Some(libc::ENODEV) => Ok(()),
        other => other.map_err(failed(name, "deleting the interface")),
    }
}

/// Brings interface `name` up.
pub fn set_up(name: &str) -> io::Result<()> {
    check_name(name)?;
    let mut message = link_message(name);
    message.header.flags = LinkFlags::Up;
    message.header.change_mask = LinkFlags::Up;
    set_link(name, "bringing the interface up", message)
}

/// Sets the MAC address of interface `name`.
pub fn set_mac(name: &str, mac: [u8; 6]) -> io::Result<()> {
    check_name(name)?;
    let text = mac.map(|b| format!("{b:02x}")).join(":");
    let mut message = link_message(name);
    message
        .attributes
        .push(LinkAttribute::Address(mac.to_vec()));
    set_link(name, format!("setting the MAC address to {text}"), message)
}

/// Sets the alias of interface `name` (`ip link show` prints it; readable with [`alias`]).
/// An empty alias removes it; one longer than 255 bytes is refused.
pub fn set_alias(name: &str, alias: &str) -> io::Result<()> {
    check_name(name)?;
    // `IFLA_IFALIAS`, sent as `ip` sends it: without a terminating NUL, which the kernel would
    // count against the 255 bytes an alias may have, and which would make "" an empty alias
    // rather than none.
    const IFLA_IFALIAS: u16 = 20;
    let mut message = link_message(name);
    message
        .attributes
        .push(LinkAttribute::Other(DefaultNla::new(
            IFLA_IFALIAS,
            alias.as_bytes().to_vec(),
        )));
    set_link(name, format!("setting the alias to {alias:?}"), message)
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
/// that network through the interface, as `ip addr add` does. Fails if the interface already
/// has `addr`.
pub fn add_ipv4(name: &str, addr: Ipv4Addr, prefix_len: u8) -> io::Result<()> {
    check_name(name)?;
    let what = format!("adding address {addr}/{prefix_len}");
    if prefix_len > 32 {
        return Err(failed(name, what)(io::Error::new(
            io::ErrorKind::InvalidInput,
            "an IPv4 prefix is at most 32 bits long",
        )));
    }
    let mut message = AddressMessage::default();
    message.header.family = AddressFamily::Inet;
    message.header.prefix_len = prefix_len;
    message.header.index = index(name).map_err(failed(name, &what))?;
    // As `ip` does: a loopback address is only good inside this host.
    message.header.scope = if addr.is_loopback() {
        AddressScope::Host
    } else {
        AddressScope::Universe
    };
    message.attributes = vec![
        AddressAttribute::Local(addr.into()),
        AddressAttribute::Address(addr.into()),
    ];
    rtnl::request(
        RouteNetlinkMessage::NewAddress(message),
        NLM_F_CREATE | NLM_F_EXCL,
    )
    .map_err(failed(name, what))
}

/// Asks for a route to the one address `dest` through interface `name`, on link, preferring
/// source `src`, in the main table: what `ip route <add|replace> <dest>/32 dev <name> src <src>`
/// sends, with `flags` saying which.
fn host_route(name: &str, dest: Ipv4Addr, src: Ipv4Addr, flags: u16, what: &str) -> io::Result<()> {
    let mut message = RouteMessage::default();
    message.header.address_family = AddressFamily::Inet;
    message.header.destination_prefix_length = 32;
    message.header.table = RouteHeader::RT_TABLE_MAIN;
    message.header.protocol = RouteProtocol::Boot;
    message.header.scope = RouteScope::Link;
    message.header.kind = RouteType::Unicast;
    message.attributes = vec![
        RouteAttribute::Destination(RouteAddress::Inet(dest)),
        RouteAttribute::Oif(index(name).map_err(failed(name, what))?),
        RouteAttribute::PrefSource(RouteAddress::Inet(src)),
    ];
    rtnl::request(RouteNetlinkMessage::NewRoute(message), flags).map_err(failed(name, what))
}

/// Routes `dest` (one address) through interface `name`, on link, preferring source `src`.
/// Fails if a route to `dest` is already there.
pub fn add_host_route(name: &str, dest: Ipv4Addr, src: Ipv4Addr) -> io::Result<()> {
    check_name(name)?;
    let what = format!("adding a route to {dest} from {src}");
    host_route(name, dest, src, NLM_F_CREATE | NLM_F_EXCL, &what)
}

/// Routes `dest` (one address) through interface `name` like [`add_host_route`], replacing
/// a route to it that is already there.
pub fn replace_host_route(name: &str, dest: Ipv4Addr, src: Ipv4Addr) -> io::Result<()> {
    check_name(name)?;
    let what = format!("replacing the route to {dest} from {src}");
    host_route(name, dest, src, NLM_F_CREATE | NLM_F_REPLACE, &what)
}

/// Sets the MTU of interface `name`.
pub fn set_mtu(name: &str, mtu: usize) -> io::Result<()> {
    check_name(name)?;
    let what = format!("setting the MTU to {mtu}");
    let Ok(value) = u32::try_from(mtu) else {
        return Err(failed(name, what)(io::Error::new(
            io::ErrorKind::InvalidInput,
            "no interface has an MTU that large",
        )));
    };
    let mut message = link_message(name);
    message.attributes.push(LinkAttribute::Mtu(value));
    set_link(name, what, message)
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

/// The offloads [`disable_offloads`] turns off, as `ethtool` defines its words `tx`, `tso`,
/// `gso` and `gro` (its table `off_flag_def`): patterns over the kernel's feature names.
const TX_CHECKSUM: &str = "tx-checksum-*";
const OFFLOADS: [&str; 4] = [
    TX_CHECKSUM,
    "tx-tcp*-segmentation",
    "tx-generic-segmentation",
    "rx-gro",
];

/// Turns off the offloads that would hand a port on the other end of a veth frames it cannot
/// forward as they are: transmit checksumming (frames would leave with only the pseudo-header
/// sum in place) and TCP segmentation (frames larger than the MTU), plus generic segmentation
/// and receive coalescing, each where the kernel lets it be changed: what
/// `ethtool -K <name> tx off tso off gso off gro off` does.
///
/// Fails only if a transmit checksum stays on (naming it) or the features cannot be read.
pub fn disable_offloads(name: &str) -> io::Result<()> {
    check_name(name)?;
    let what = "turning offloads off";
    let features = ethtool::Features::read(name).map_err(failed(name, what))?;
    // The kernel may refuse, or accept and leave a feature on: only what it reads back
    // afterwards counts.
    let refused = ethtool::turn_off(name, &features, &OFFLOADS).err();
    let features = ethtool::Features::read(name).map_err(failed(name, what))?;
    let still_on: Vec<&str> = features.on(TX_CHECKSUM).collect();
    if still_on.is_empty() {
        return Ok(());
    }
    let text = format!("still on: {}", still_on.join(", "));
    let cause = match refused {
        Some(e) => io::Error::new(e.kind(), format!("{text}: {e}")),
        None => io::Error::other(text),
    };
    Err(failed(name, what)(cause))
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
        let mut message = link_message(a);
        message.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Veth),
            LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(link_message(b)))),
        ]));
        rtnl::request(
            RouteNetlinkMessage::NewLink(message),
            NLM_F_CREATE | NLM_F_EXCL,
        )
        .map_err(failed(a, format!("creating a veth pair with peer {b}")))?;
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
        assert!(
            !valid_ifname("eth0\0x"),
            "the kernel would cut it at the NUL"
        );
        assert!(!exists("no/such"));
        assert_eq!(alias("no such"), None);
    }
}
