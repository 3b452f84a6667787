//! The testbed description: which hosts exist, their roles and addresses.
//!
//! Pure data and validation; nothing here touches the system. Every error names its origin (the
//! file), the key and what is wrong.

use std::fmt;
use std::net::Ipv4Addr;
use std::path::Path;

use anyhow::{anyhow, bail, Context};
use serde::{Deserialize, Serialize};

/// Linux interface names hold at most 15 bytes (IFNAMSIZ - 1).
pub const MAX_IFNAME: usize = 15;
/// Longest testbed prefix; names are `<prefix>-<host>`.
pub const MAX_PREFIX: usize = 5;
/// Longest host name, so that `<prefix>-<host>` fits an interface name for every prefix.
pub const MAX_HOST_NAME: usize = MAX_IFNAME - MAX_PREFIX - 1;
/// Host MACs end in the host index + 1 and the VIP MAC in 0x64, so hosts stop below that.
pub const MAX_HOSTS: usize = 99;
/// Port memcached listens on (TCP and UDP) on every server, and the VIP port.
pub const MEMCACHED_PORT: u16 = 11211;
/// The port the servers listen on when they run redis-server, and the VIP's then.
pub const REDIS_PORT: u16 = 6379;
/// Host names the testbed keeps for itself: `<prefix>-local` and `<prefix>-local-h` are the two
/// ends of kvswitch's local port.
pub const RESERVED_HOST_NAMES: &[&str] = &["local", "local-h"];

/// Pool distributions nutcracker understands.
const DISTRIBUTIONS: &[&str] = &["ketama", "modula", "random"];
/// Hash functions nutcracker understands.
const HASHES: &[&str] = &[
    "one_at_a_time",
    "md5",
    "crc16",
    "crc32",
    "crc32a",
    "fnv1_64",
    "fnv1a_64",
    "fnv1_32",
    "fnv1a_32",
    "hsieh",
    "murmur",
    "jenkins",
];

/// How kvswitch rewrites packets for the VIP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The switch owns the VIP and rewrites IP and MAC addresses.
    L3,
    /// Servers own the VIP on loopback; the switch only rewrites the destination MAC.
    L2,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::L3 => "l3",
            Mode::L2 => "l2",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a host runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Sends requests; the first client also runs nutcracker.
    Client,
    /// Runs memcached on port 11211, TCP and UDP.
    Server,
    /// A SwitchKV cache node (`kvswitch node --role cache`) beside the switch: the switch
    /// steers reads of the keys it holds to it, and the servers (`kvswitch node --role
    /// backend`) report their hot keys to it. Not in the pool.
    Cache,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Client => "client",
            Role::Server => "server",
            Role::Cache => "cache",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An IPv4 network: a base address with zero host bits and a prefix length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Subnet {
    pub base: Ipv4Addr,
    pub len: u8,
}

impl Subnet {
    /// Parses `a.b.c.d/len`; the host bits must be zero and the network must hold at least two
    /// hosts.
    pub fn parse(text: &str) -> anyhow::Result<Subnet> {
        let (addr, len) = text
            .split_once('/')
            .ok_or_else(|| anyhow!("expected ADDRESS/LENGTH, got {text:?}"))?;
        let base: Ipv4Addr = addr
            .parse()
            .map_err(|_| anyhow!("{addr:?} is not an IPv4 address"))?;
        let len: u8 = len
            .parse()
            .map_err(|_| anyhow!("{len:?} is not a prefix length"))?;
        if !(1..=30).contains(&len) {
            bail!("prefix length {len} is outside 1..=30");
        }
        let subnet = Subnet { base, len };
        if u32::from(base) & !subnet.mask() != 0 {
            bail!(
                "{text} has host bits set (network address is {}/{len})",
                Ipv4Addr::from(u32::from(base) & subnet.mask())
            );
        }
        Ok(subnet)
    }

    fn mask(&self) -> u32 {
        u32::MAX << (32 - u32::from(self.len))
    }

    /// Number of usable host addresses (without network and broadcast).
    pub fn capacity(&self) -> u32 {
        (1u32 << (32 - u32::from(self.len))) - 2
    }

    /// The `n`-th address of the network (`n` = 1 is the first host).
    pub fn nth(&self, n: u32) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.base) + n)
    }

    /// True for usable host addresses inside the network.
    pub fn holds_host(&self, ip: Ipv4Addr) -> bool {
        let ip = u32::from(ip);
        let base = u32::from(self.base);
        ip & self.mask() == base && ip != base && ip != base | !self.mask()
    }

    /// Whether the two networks share an address.
    pub fn overlaps(&self, other: &Subnet) -> bool {
        let mask = self.mask() & other.mask();
        u32::from(self.base) & mask == u32::from(other.base) & mask
    }

    /// A /24 for the testbed with `prefix`, inside 10.128.0.0/10 and fixed by the prefix
    /// (FNV-1a), so that testbeds with different prefixes can run side by side even though the
    /// host's end of each one's local port sits in the root namespace with the VIP's address
    /// and a route to the subnet. Two prefixes may still hash to one subnet; `up` refuses a
    /// subnet the root namespace already reaches.
    pub fn for_prefix(prefix: &str) -> Subnet {
        let h = wire::fnv::fnv1a(prefix.as_bytes());
        Subnet {
            base: Ipv4Addr::new(10, 128 + (h % 64) as u8, (h >> 8) as u8, 0),
            len: 24,
        }
    }
}

impl fmt::Display for Subnet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.base, self.len)
    }
}

/// One host of the testbed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    pub name: String,
    pub role: Role,
    /// Pool weight (servers only).
    pub weight: u32,
    /// Extra arguments appended to memcached's command line (servers only).
    pub memcached_args: Vec<String>,
}

/// A validated testbed description.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    pub name: String,
    pub subnet: Subnet,
    pub vip: Ipv4Addr,
    pub mode: Mode,
    pub distribution: String,
    pub hash: String,
    /// In file order; host `i` gets address `subnet.nth(i + 1)` (in a fabric, an address in
    /// its rack's part of the subnet).
    pub hosts: Vec<Host>,
    /// Several kvswitches joined into a caching fabric (`[[switches]]`); `None`: one kvswitch
    /// with every host on it.
    pub fabric: Option<FabricLayout>,
}

/// Where a switch of a fabric sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SwitchRole {
    Tor,
    Root,
}

/// One switch of a fabric.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SwitchDef {
    pub name: String,
    pub role: SwitchRole,
    /// A ToR's roots, each joined to it by a link.
    pub uplinks: Vec<String>,
}

/// The switches of a fabric and which ToR each host hangs off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FabricLayout {
    pub switches: Vec<SwitchDef>,
    /// Per host (in `hosts` order), the name of its ToR.
    pub host_switch: Vec<String>,
    /// Per host (in `hosts` order), whether it is a server that is its own fabric home
    /// (`home = "node"`: `kvswitch node --role home` in place of memcached).
    pub home_node: Vec<bool>,
}

/// Most ToRs of a fabric: each rack is a /27 of the testbed's /24, the last one the switches'.
pub const MAX_RACKS: usize = 7;
/// Most hosts in one rack.
pub const MAX_RACK_HOSTS: usize = 28;

/// The file as written, before validation.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTopology {
    name: Option<String>,
    subnet: Option<String>,
    vip: Option<String>,
    mode: Option<String>,
    distribution: Option<String>,
    hash: Option<String>,
    #[serde(default)]
    hosts: Vec<RawHost>,
    #[serde(default)]
    switches: Vec<RawSwitch>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSwitch {
    name: Option<String>,
    role: Option<String>,
    #[serde(default)]
    uplinks: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHost {
    name: Option<String>,
    role: Option<String>,
    weight: Option<i64>,
    memcached_args: Option<Vec<String>>,
    /// In a fabric, the ToR the host hangs off.
    switch: Option<String>,
    /// In a fabric, a server's home: "tor" (its ToR, the default) or "node" (itself).
    home: Option<String>,
}

const DEFAULT_SUBNET: &str = "10.77.0.0/24";
/// The VIP defaults to this host number inside the subnet.
const DEFAULT_VIP_HOST: u32 = 100;

impl Topology {
    /// Two clients `c1`, `c2` and three servers `s1`, `s2`, `s3` on 10.77.0.0/24, VIP
    /// 10.77.0.100, l3 mode, ketama over md5.
    pub fn default_topology() -> Topology {
        let host = |name: &str, role| Host {
            name: name.to_string(),
            role,
            weight: 1,
            memcached_args: Vec::new(),
        };
        let subnet = Subnet {
            base: Ipv4Addr::new(10, 77, 0, 0),
            len: 24,
        };
        Topology {
            name: "default".to_string(),
            subnet,
            vip: subnet.nth(DEFAULT_VIP_HOST),
            mode: Mode::L3,
            distribution: "ketama".to_string(),
            hash: "md5".to_string(),
            hosts: vec![
                host("c1", Role::Client),
                host("c2", Role::Client),
                host("s1", Role::Server),
                host("s2", Role::Server),
                host("s3", Role::Server),
            ],
            fabric: None,
        }
    }

    /// A topology shipped in the repository's `topologies/` folder, by file stem:
    /// `fabric-two-level`, `fabric-multi-root`, `fabric-home-node` or `switchkv`.
    pub fn shipped(name: &str) -> Option<Topology> {
        let text = match name {
            "fabric-two-level" => include_str!("../../../topologies/fabric-two-level.toml"),
            "fabric-home-node" => include_str!("../../../topologies/fabric-home-node.toml"),
            "fabric-multi-root" => include_str!("../../../topologies/fabric-multi-root.toml"),
            "switchkv" => include_str!("../../../topologies/switchkv.toml"),
            _ => return None,
        };
        Some(
            Topology::parse(text, &format!("topologies/{name}.toml"))
                .expect("shipped topologies are valid"),
        )
    }

    /// Reads and validates a topology file.
    pub fn from_file(path: impl AsRef<Path>) -> anyhow::Result<Topology> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading topology file {}", path.display()))?;
        Topology::parse(&text, &path.display().to_string())
    }

    /// Parses and validates topology text; `origin` (usually the file name) starts every error.
    pub fn parse(text: &str, origin: &str) -> anyhow::Result<Topology> {
        let raw: RawTopology =
            toml::from_str(text).map_err(|e| anyhow!("{origin}: {}", e.to_string().trim_end()))?;
        Topology::validate(raw).map_err(|e| anyhow!("{origin}: {e}"))
    }

    fn validate(raw: RawTopology) -> anyhow::Result<Topology> {
        let name = raw.name.unwrap_or_else(|| "default".to_string());
        if name.is_empty() {
            bail!("name: must not be empty");
        }
        let subnet_text = raw.subnet.as_deref().unwrap_or(DEFAULT_SUBNET);
        let subnet = Subnet::parse(subnet_text).map_err(|e| anyhow!("subnet: bad subnet: {e}"))?;
        let mode = match raw.mode.as_deref().unwrap_or("l3") {
            "l3" => Mode::L3,
            "l2" => Mode::L2,
            other => bail!("mode: unknown mode {other:?} (expected \"l3\" or \"l2\")"),
        };
        let distribution = raw.distribution.unwrap_or_else(|| "ketama".to_string());
        if !DISTRIBUTIONS.contains(&distribution.as_str()) {
            bail!(
                "distribution: unknown distribution {distribution:?} (expected one of {})",
                DISTRIBUTIONS.join(", ")
            );
        }
        let hash = raw.hash.unwrap_or_else(|| "md5".to_string());
        if !HASHES.contains(&hash.as_str()) {
            bail!(
                "hash: unknown hash {hash:?} (expected one of {})",
                HASHES.join(", ")
            );
        }

        if raw.hosts.is_empty() {
            bail!("hosts: at least one [[hosts]] entry is required");
        }
        if raw.hosts.len() > MAX_HOSTS {
            bail!(
                "hosts: {} hosts, at most {MAX_HOSTS} are supported",
                raw.hosts.len()
            );
        }
        if raw.hosts.len() as u32 > subnet.capacity() {
            bail!(
                "subnet: {subnet} holds {} hosts, the topology has {}",
                subnet.capacity(),
                raw.hosts.len()
            );
        }
        let host_switch: Vec<Option<String>> = raw.hosts.iter().map(|h| h.switch.clone()).collect();
        let host_home: Vec<Option<String>> = raw.hosts.iter().map(|h| h.home.clone()).collect();
        let mut hosts: Vec<Host> = Vec::with_capacity(raw.hosts.len());
        for (i, h) in raw.hosts.into_iter().enumerate() {
            let host = validate_host(i, h)?;
            if hosts.iter().any(|other| other.name == host.name) {
                bail!("hosts[{i}].name: duplicate host name {:?}", host.name);
            }
            hosts.push(host);
        }
        if !hosts.iter().any(|h| h.role == Role::Server) {
            bail!("hosts: at least one host with role = \"server\" is required");
        }

        let vip = match raw.vip {
            Some(text) => text
                .parse()
                .map_err(|_| anyhow!("vip: {text:?} is not an IPv4 address"))?,
            None => {
                if DEFAULT_VIP_HOST > subnet.capacity() {
                    bail!("vip: the default .{DEFAULT_VIP_HOST} is outside {subnet}; set vip");
                }
                subnet.nth(DEFAULT_VIP_HOST)
            }
        };
        if !subnet.holds_host(vip) {
            bail!("vip: {vip} is not a host address inside {subnet}");
        }
        if let Some(i) = (0..hosts.len()).find(|&i| subnet.nth(i as u32 + 1) == vip) {
            bail!("vip: {vip} is also the address of host {:?}", hosts[i].name);
        }

        let fabric = validate_fabric(raw.switches, &hosts, host_switch, host_home, subnet, mode)?;
        Ok(Topology {
            name,
            subnet,
            vip,
            mode,
            distribution,
            hash,
            hosts,
            fabric,
        })
    }

    /// Address of host `index`.
    pub fn host_ip(&self, index: usize) -> Ipv4Addr {
        self.subnet.nth(index as u32 + 1)
    }

    /// The same topology on `subnet`: hosts keep their order and the VIP its host number.
    /// Fails if the hosts or the VIP do not fit.
    pub fn on_subnet(mut self, subnet: Subnet) -> anyhow::Result<Topology> {
        let vip_host = u32::from(self.vip) - u32::from(self.subnet.base);
        if vip_host > subnet.capacity() || self.hosts.len() as u32 > subnet.capacity() {
            bail!(
                "subnet: {subnet} is too small for {} hosts and the VIP at .{vip_host}",
                self.hosts.len()
            );
        }
        self.subnet = subnet;
        self.vip = subnet.nth(vip_host);
        Ok(self)
    }

    /// An address of the subnet that is neither a host's nor the VIP: the highest one free.
    /// In l2 mode the switch and the host behind its local port speak to the servers from it,
    /// since the servers own the VIP. `None` if the subnet is full.
    pub fn agent_ip(&self) -> Option<Ipv4Addr> {
        (1..=self.subnet.capacity())
            .rev()
            .map(|n| self.subnet.nth(n))
            .find(|&ip| ip != self.vip && !(0..self.hosts.len()).any(|i| self.host_ip(i) == ip))
    }

    pub fn servers(&self) -> impl Iterator<Item = &Host> {
        self.hosts.iter().filter(|h| h.role == Role::Server)
    }

    pub fn clients(&self) -> impl Iterator<Item = &Host> {
        self.hosts.iter().filter(|h| h.role == Role::Client)
    }

    pub fn caches(&self) -> impl Iterator<Item = &Host> {
        self.hosts.iter().filter(|h| h.role == Role::Cache)
    }
}

fn validate_host(i: usize, raw: RawHost) -> anyhow::Result<Host> {
    let name = raw
        .name
        .ok_or_else(|| anyhow!("hosts[{i}].name: missing"))?;
    check_host_name(&name).map_err(|e| anyhow!("hosts[{i}].name: {e}"))?;
    let role = match raw.role.as_deref() {
        Some("client") => Role::Client,
        Some("server") => Role::Server,
        Some("cache") => Role::Cache,
        Some(other) => bail!(
            "hosts[{i}].role: unknown role {other:?} for host {name:?} (expected \"client\", \"server\" or \"cache\")"
        ),
        None => bail!("hosts[{i}].role: missing for host {name:?}"),
    };
    let weight = match raw.weight {
        None => 1,
        Some(w) if role != Role::Server => {
            bail!("hosts[{i}].weight: {w} given for {role} {name:?}; only servers have a weight")
        }
        Some(w) if !(1..=i64::from(u16::MAX)).contains(&w) => {
            bail!("hosts[{i}].weight: {w} is outside 1..=65535")
        }
        Some(w) => w as u32,
    };
    let memcached_args = match raw.memcached_args {
        None => Vec::new(),
        Some(_) if role != Role::Server => {
            bail!("hosts[{i}].memcached_args: {role} {name:?} does not run memcached")
        }
        Some(args) => args,
    };
    Ok(Host {
        name,
        role,
        weight,
        memcached_args,
    })
}

/// The `[[switches]]` of a fabric, and each host's `switch`.
fn validate_fabric(
    raw: Vec<RawSwitch>,
    hosts: &[Host],
    host_switch: Vec<Option<String>>,
    host_home: Vec<Option<String>>,
    subnet: Subnet,
    mode: Mode,
) -> anyhow::Result<Option<FabricLayout>> {
    if raw.is_empty() {
        if let Some(i) = host_switch.iter().position(Option::is_some) {
            bail!("hosts[{i}].switch: only a fabric (with [[switches]]) has switches");
        }
        if let Some(i) = host_home.iter().position(Option::is_some) {
            bail!("hosts[{i}].home: only a fabric (with [[switches]]) has homes");
        }
        return Ok(None);
    }
    let mut home_node = Vec::with_capacity(hosts.len());
    for (i, home) in host_home.iter().enumerate() {
        home_node.push(match home.as_deref() {
            None | Some("tor") => false,
            Some("node") if hosts[i].role == Role::Server => true,
            Some("node") => bail!("hosts[{i}].home: only a server is a home"),
            Some(other) => bail!("hosts[{i}].home: {other:?} is not \"tor\" or \"node\""),
        });
    }
    if subnet.len != 24 {
        bail!("subnet: a fabric needs a /24 (a /27 per rack), not {subnet}");
    }
    if mode != Mode::L3 {
        bail!("mode: a fabric carries hosts' own addresses; leave mode at \"l3\"");
    }
    let mut switches: Vec<SwitchDef> = Vec::new();
    for (i, s) in raw.into_iter().enumerate() {
        let name = s
            .name
            .ok_or_else(|| anyhow!("switches[{i}].name: missing"))?;
        check_host_name(&name).map_err(|e| anyhow!("switches[{i}].name: {e}"))?;
        if switches.iter().any(|o| o.name == name) || hosts.iter().any(|h| h.name == name) {
            bail!("switches[{i}].name: {name:?} is already the name of a switch or host");
        }
        let role = match s.role.as_deref() {
            Some("tor") => SwitchRole::Tor,
            Some("root") => SwitchRole::Root,
            Some(other) => {
                bail!("switches[{i}].role: unknown role {other:?} (expected \"tor\" or \"root\")")
            }
            None => bail!("switches[{i}].role: missing for switch {name:?}"),
        };
        if role == SwitchRole::Root && !s.uplinks.is_empty() {
            bail!("switches[{i}].uplinks: root {name:?} has no uplinks; give them on the ToRs");
        }
        switches.push(SwitchDef {
            name,
            role,
            uplinks: s.uplinks,
        });
    }
    let tors = switches
        .iter()
        .filter(|s| s.role == SwitchRole::Tor)
        .count();
    if tors == 0 || tors > MAX_RACKS {
        bail!("switches: a fabric has 1 to {MAX_RACKS} ToRs, this one {tors}");
    }
    if !switches.iter().any(|s| s.role == SwitchRole::Root) {
        bail!("switches: a fabric needs at least one root");
    }
    for (i, s) in switches.iter().enumerate() {
        for up in &s.uplinks {
            if !switches
                .iter()
                .any(|o| &o.name == up && o.role == SwitchRole::Root)
            {
                bail!("switches[{i}].uplinks: {up:?} is not a root of this fabric");
            }
        }
        if s.role == SwitchRole::Tor && s.uplinks.is_empty() {
            bail!(
                "switches[{i}].uplinks: ToR {:?} needs at least one root",
                s.name
            );
        }
    }
    let mut per_rack = std::collections::HashMap::new();
    let mut host_switch_names = Vec::new();
    for (i, s) in host_switch.into_iter().enumerate() {
        let Some(s) = s else {
            bail!("hosts[{i}].switch: missing; in a fabric every host hangs off a ToR");
        };
        if !switches
            .iter()
            .any(|o| o.name == s && o.role == SwitchRole::Tor)
        {
            bail!("hosts[{i}].switch: {s:?} is not a ToR of this fabric");
        }
        if hosts[i].role == Role::Cache {
            bail!("hosts[{i}].role: a fabric has no cache hosts; its switches cache");
        }
        let n = per_rack.entry(s.clone()).or_insert(0usize);
        *n += 1;
        if *n > MAX_RACK_HOSTS {
            bail!("hosts[{i}].switch: more than {MAX_RACK_HOSTS} hosts under {s:?}");
        }
        host_switch_names.push(s);
    }
    Ok(Some(FabricLayout {
        switches,
        host_switch: host_switch_names,
        home_node,
    }))
}

/// Host names become parts of interface, namespace and nutcracker server names.
fn check_host_name(name: &str) -> anyhow::Result<()> {
    if name.is_empty() {
        bail!("must not be empty");
    }
    if RESERVED_HOST_NAMES.contains(&name) {
        bail!("host name {name:?} is reserved for the switch's local port");
    }
    if name.len() > MAX_HOST_NAME {
        bail!(
            "host name {name:?} is too long for an interface name ({} > {MAX_HOST_NAME} characters; \
             \"<prefix>-<host>\" must fit in {MAX_IFNAME})",
            name.len()
        );
    }
    let first_ok = name.as_bytes()[0].is_ascii_alphanumeric();
    let rest_ok = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !first_ok || !rest_ok {
        bail!("host name {name:?} must be ASCII letters, digits, '-' or '_', starting with a letter or digit");
    }
    Ok(())
}

/// Checks a testbed prefix: 1 to 5 lowercase letters or digits, so `<prefix>-` never matches the
/// names of another testbed.
pub fn check_prefix(prefix: &str) -> anyhow::Result<()> {
    if prefix.is_empty() || prefix.len() > MAX_PREFIX {
        bail!("prefix {prefix:?} must be 1 to {MAX_PREFIX} characters");
    }
    if !prefix
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        bail!("prefix {prefix:?} must be lowercase ASCII letters or digits");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_fabrics_parse_and_fabric_mistakes_are_named() {
        let t = Topology::shipped("fabric-multi-root").unwrap();
        let f = t.fabric.as_ref().unwrap();
        assert_eq!(f.switches.len(), 6);
        assert_eq!(f.host_switch.len(), t.hosts.len());
        assert!(Topology::shipped("fabric-two-level")
            .unwrap()
            .fabric
            .is_some());
        assert!(Topology::shipped("nothing").is_none());
        let switchkv = Topology::shipped("switchkv").unwrap();
        assert_eq!(switchkv.caches().count(), 1);
        assert!(switchkv.fabric.is_none());
        let home = Topology::shipped("fabric-home-node").unwrap();
        let homes = &home.fabric.as_ref().unwrap().home_node;
        let s1 = home.hosts.iter().position(|h| h.name == "s1").unwrap();
        assert!(homes[s1] && homes.iter().filter(|&&h| h).count() == 1);
        let base = include_str!("../../../topologies/fabric-two-level.toml");
        for (text, needle) in [
            (
                base.replace("uplinks = [\"root0\"]", "uplinks = [\"tor1\"]"),
                "not a root",
            ),
            (
                base.replace("switch = \"tor1\"", "switch = \"root0\""),
                "not a ToR",
            ),
            (
                base.replace("role = \"root\"", "role = \"spine\""),
                "unknown role",
            ),
            (
                base.replace("subnet = \"10.78.0.0/24\"", "subnet = \"10.78.0.0/25\""),
                "/24",
            ),
            (
                base.replace("switch = \"tor1\"\n", "\n"),
                "every host hangs off a ToR",
            ),
            (
                base.replace(
                    "role = \"client\"\nswitch = \"tor0\"",
                    "role = \"client\"\nswitch = \"tor0\"\nhome = \"node\"",
                ),
                "only a server",
            ),
            (
                base.replace(
                    "role = \"server\"\nswitch = \"tor0\"",
                    "role = \"server\"\nswitch = \"tor0\"\nhome = \"self\"",
                ),
                "\"tor\" or \"node\"",
            ),
        ] {
            let e = Topology::parse(&text, "f.toml").unwrap_err().to_string();
            assert!(e.contains("f.toml") && e.contains(needle), "{e}");
        }
        let plain = "[[hosts]]\nname = \"s1\"\nrole = \"server\"\nswitch = \"tor0\"\n";
        assert!(Topology::parse(plain, "p.toml")
            .unwrap_err()
            .to_string()
            .contains("only a fabric"));
    }

    #[test]
    fn subnet_parse() {
        let s = Subnet::parse("10.77.0.0/24").unwrap();
        assert_eq!(s.nth(3), Ipv4Addr::new(10, 77, 0, 3));
        assert_eq!(s.capacity(), 254);
        assert!(s.holds_host(Ipv4Addr::new(10, 77, 0, 100)));
        assert!(!s.holds_host(Ipv4Addr::new(10, 77, 0, 255)));
        assert!(!s.holds_host(Ipv4Addr::new(10, 77, 1, 1)));
        assert!(Subnet::parse("10.77.0.1/24").is_err());
        assert!(Subnet::parse("10.77.0.0").is_err());
        assert!(Subnet::parse("10.77.0.0/31").is_err());
    }

    #[test]
    fn defaults_fill_in() {
        let t = Topology::parse(
            "[[hosts]]\nname = \"a\"\nrole = \"client\"\n[[hosts]]\nname = \"b\"\nrole = \"server\"\n",
            "t.toml",
        )
        .unwrap();
        assert_eq!(t.vip, Ipv4Addr::new(10, 77, 0, 100));
        assert_eq!(t.mode, Mode::L3);
        assert_eq!(t.host_ip(1), Ipv4Addr::new(10, 77, 0, 2));
    }

    #[test]
    fn cache_hosts_are_neither_clients_nor_servers_and_take_no_server_settings() {
        let t = Topology::parse(
            "[[hosts]]\nname = \"k\"\nrole = \"cache\"\n[[hosts]]\nname = \"s\"\nrole = \"server\"\n",
            "t.toml",
        )
        .unwrap();
        assert_eq!(
            t.caches().map(|h| h.name.as_str()).collect::<Vec<_>>(),
            ["k"]
        );
        assert_eq!(t.clients().count(), 0);
        for extra in ["weight = 2", "memcached_args = [\"-v\"]"] {
            let text = format!(
                "[[hosts]]\nname = \"k\"\nrole = \"cache\"\n{extra}\n[[hosts]]\nname = \"s\"\nrole = \"server\"\n"
            );
            let e = Topology::parse(&text, "t.toml").unwrap_err().to_string();
            assert!(e.contains("hosts[0]") && e.contains("cache"), "{e}");
        }
    }

    #[test]
    fn subnets_per_prefix() {
        let prefixes = [
            "kvs", "kvd", "ku2", "ku3", "kp2", "kp3", "kt2", "kt3", "tb1", "tb2", "tb3", "tb4",
            "tb5", "tb6", "kpf", "kpl", "kctl", "kcoh", "kcsw", "kcs2", "krep", "kver", "kskv",
            "kskw", "kskn", "kvtdn", "kux", "kfa", "kfb", "kfc", "kfd", "kfe", "kvsa", "kvbq",
            "kvtg", "kkey",
        ];
        let subnets: Vec<Subnet> = prefixes.iter().map(|p| Subnet::for_prefix(p)).collect();
        for (i, s) in subnets.iter().enumerate() {
            assert_eq!(s.len, 24);
            assert_eq!(s.base.octets()[0], 10);
            assert!(s.base.octets()[1] >= 128);
            assert_eq!(Subnet::parse(&s.to_string()).unwrap(), *s);
            for (j, t) in subnets.iter().enumerate().skip(i + 1) {
                assert!(
                    !s.overlaps(t),
                    "{} and {} share {s}",
                    prefixes[i],
                    prefixes[j]
                );
            }
        }
        let a = Subnet::parse("10.0.0.0/8").unwrap();
        assert!(a.overlaps(&subnets[0]) && subnets[0].overlaps(&a));
        assert!(!Subnet::parse("192.0.2.0/24").unwrap().overlaps(&subnets[0]));
    }

    #[test]
    fn moving_to_another_subnet_keeps_host_numbers() {
        let t = Topology::default_topology()
            .on_subnet(Subnet::parse("10.200.3.0/24").unwrap())
            .unwrap();
        assert_eq!(t.vip, Ipv4Addr::new(10, 200, 3, 100));
        assert_eq!(t.host_ip(0), Ipv4Addr::new(10, 200, 3, 1));
        assert_eq!(t.agent_ip(), Some(Ipv4Addr::new(10, 200, 3, 254)));
        assert!(Topology::default_topology()
            .on_subnet(Subnet::parse("10.200.3.0/28").unwrap())
            .is_err());
        let e = Topology::parse("[[hosts]]\nname = \"local\"\nrole = \"server\"\n", "t.toml")
            .unwrap_err();
        assert!(format!("{e}").contains("reserved"), "{e}");
    }

    #[test]
    fn prefix_rules() {
        assert!(check_prefix("kvs").is_ok());
        assert!(check_prefix("tb12a").is_ok());
        assert!(check_prefix("toolong").is_err());
        assert!(check_prefix("a-b").is_err());
        assert!(check_prefix("").is_err());
    }
}
