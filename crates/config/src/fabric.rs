//! A fabric's file (TOML): every switch of a fabric of kvswitches, its ports and racks, and
//! the memcached servers the fabric carries. One file serves every switch:
//! `kvswitch fabric run --config FILE --switch NAME` takes its own part and knows the rest.
//!
//! ```toml
//! name = "two-level"
//! buckets = 64                       # registration table buckets
//! lease_ms = 2000                    # how long a cached item is served after its fill
//! busy_poll_us = 0                   # polling after a frame before sleeping
//! api_token_file = "fabric.token"    # the switches' API token (optional; relative to this
//!                                    # file; KVSWITCH_API_TOKEN overrides it)
//!
//! [[switch]]
//! name = "tor0"
//! role = "tor"                       # or "root"
//! address = "10.91.0.225"            # where fabric messages to it go
//! mac = "02:91:00:00:00:e1"
//! rack = "10.91.0.0/27"              # a ToR's hosts
//! api = "127.0.0.1:9101"             # its HTTP API (optional)
//! ports = [
//!   { interface = "fab-c0" },                      # a host
//!   { interface = "fab-t0r0", link = "root0" },    # another switch
//! ]
//!
//! [[server]]
//! address = "10.91.0.2"
//! mac = "02:91:00:00:00:02"          # port defaults to 11211
//! home = "tor"                       # its ToR keeps its keys' directory; "node": the server
//!                                    # itself (`kvswitch node --role home`)
//! ```
//!
//! Every error names the file, the key and the problem.

use std::collections::{BTreeSet, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use kv::fabric::{Registration, SwitchId};
use serde::Deserialize;
use switch::fabric::{Coherence, FabricServer, FabricSpec, Member, PortRole, Rack, Role};
use wire::ethernet::Mac;

/// Registration table buckets unless the file says.
pub const DEFAULT_BUCKETS: usize = 64;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFabric {
    name: String,
    #[serde(default)]
    buckets: Option<usize>,
    #[serde(default)]
    invalidate_retry_ms: Option<u64>,
    #[serde(default)]
    invalidate_give_up_ms: Option<u64>,
    #[serde(default)]
    hello_ms: Option<u64>,
    #[serde(default)]
    dead_ms: Option<u64>,
    #[serde(default)]
    lease_ms: Option<u64>,
    #[serde(default)]
    busy_poll_us: Option<u64>,
    #[serde(default)]
    coherence: Option<String>,
    #[serde(default)]
    api_token_file: Option<PathBuf>,
    #[serde(default, rename = "switch")]
    switches: Vec<RawSwitch>,
    #[serde(default, rename = "server")]
    servers: Vec<RawServer>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSwitch {
    name: String,
    role: String,
    address: Ipv4Addr,
    mac: String,
    #[serde(default)]
    rack: Option<String>,
    #[serde(default)]
    api: Option<SocketAddr>,
    #[serde(default)]
    cache_items: Option<usize>,
    #[serde(default)]
    processors: Option<usize>,
    #[serde(default)]
    hit_check: Option<bool>,
    #[serde(default)]
    fdb_entries: Option<usize>,
    #[serde(default)]
    ports: Vec<RawPort>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPort {
    interface: String,
    #[serde(default)]
    link: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    address: Ipv4Addr,
    #[serde(default = "memcached_port")]
    port: u16,
    mac: String,
    #[serde(default)]
    home: Option<String>,
}

fn memcached_port() -> u16 {
    11211
}

/// A fabric file of two racks under one root, every key explained, as `kvswitch fabric run
/// --example-config` prints it.
pub const EXAMPLE: &str = r#"# fabric.toml: one file for every switch of a caching fabric (`kvswitch fabric run
# --config fabric.toml --switch NAME` on each). `kvswitch testbed up topologies/...` writes one
# for its test networks.
name = "two-level"
# buckets = 64                # of the registration table (which root is home of which keys)
# busy_poll_us = 0            # polling after a frame before sleeping (0: always sleep)
# What a write does to the copies of its key (IncBricks' `inc_init` choice): "invalidate"
# takes them away and the next reads refill them; "update" also sends the value a `set`
# stored to the switches that held the key, so their next reads hit. A server that is
# its own home (`home = "node"`) follows `kvswitch node --coherence` instead.
# coherence = "invalidate"
# The file whose first line is the token every switch's API wants for a change, and the
# controller sends; an API that listens beyond its host must have one, as these do. Make it
# with `head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > fabric.token`.
api_token_file = "fabric.token"

# Each switch: a ToR (`role = "tor"`, with its rack's prefix) or a root. `address` and `mac`
# are its own on the fabric; each port is an interface, with `link` naming the switch at the
# other end (none: hosts). `api` (its control API) and `cache_items` are optional, and so
# is the cache's split (IncBricks' IncBox): `processors` (1 to 16, 1 by default), the caches a
# key's hash chooses among, and `hit_check` (false by default), a switch stage that sends a
# read to a processor only when its table marks the key as held there (`fdb_entries` marks at
# most, 16384 by default).
[[switch]]
name = "tor0"
role = "tor"
address = "10.91.0.225"
api = "10.91.0.225:9110"
mac = "02:91:00:00:00:e1"
rack = "10.91.0.0/27"
ports = [{ interface = "f-c0" }, { interface = "f-t0r0", link = "root0" }]

[[switch]]
name = "tor1"
role = "tor"
address = "10.91.0.226"
api = "10.91.0.226:9110"
mac = "02:91:00:00:00:e2"
rack = "10.91.0.32/27"
ports = [{ interface = "f-s0" }, { interface = "f-t1r0", link = "root0" }]

[[switch]]
name = "root0"
role = "root"
address = "10.91.0.227"
api = "10.91.0.227:9110"
mac = "02:91:00:00:00:e3"
ports = [{ interface = "f-r0t0", link = "tor0" }, { interface = "f-r0t1", link = "tor1" }]

# The memcached servers, each in a rack; `port` defaults to 11211.
[[server]]
address = "10.91.0.34"
mac = "02:91:00:00:00:22"
"#;

/// One switch as the file describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FabricSwitchConfig {
    pub name: String,
    pub id: SwitchId,
    pub role: Role,
    pub address: Ipv4Addr,
    pub mac: Mac,
    pub rack: Option<(Ipv4Addr, u8)>,
    pub api: Option<SocketAddr>,
    pub cache_items: Option<usize>,
    /// The cache's split into a switch stage and processors, where the file sets it.
    pub processors: Option<usize>,
    pub hit_check: Option<bool>,
    pub fdb_entries: Option<usize>,
    /// Interface names, and the switch behind each link.
    pub ports: Vec<(String, Option<SwitchId>)>,
}

/// A validated fabric file.
#[derive(Debug, Clone)]
pub struct FabricConfig {
    pub path: PathBuf,
    pub name: String,
    pub buckets: usize,
    pub switches: Vec<FabricSwitchConfig>,
    pub servers: Vec<FabricServer>,
    /// After a frame, how long a switch keeps polling its ports before it sleeps (0: it
    /// always sleeps; several switches of a fabric sharing a host's cores would spin
    /// against each other).
    pub busy_poll: Duration,
    /// The file whose first line is the token every switch's API wants for a change (relative
    /// paths resolved against the fabric file's directory). An API that listens beyond its
    /// host must have one.
    pub api_token_file: Option<PathBuf>,
    /// What the ToR homes do for the copies a write leaves behind.
    pub coherence: Coherence,
    invalidate_retry: Option<Duration>,
    invalidate_give_up: Option<Duration>,
    hello: Option<Duration>,
    dead: Option<Duration>,
    lease: Option<Duration>,
}

fn err(path: &Path, key: &str, problem: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{}: `{key}`: {problem}", path.display())
}

fn parse_prefix(text: &str) -> Option<(Ipv4Addr, u8)> {
    let (a, l) = text.split_once('/')?;
    let len: u8 = l.parse().ok()?;
    (len <= 32).then_some(())?;
    Some((a.parse().ok()?, len))
}

impl FabricConfig {
    pub fn load(path: &Path) -> anyhow::Result<FabricConfig> {
        let text = crate::read_file(path)
            .map_err(|e| anyhow::anyhow!("{}: cannot read: {e}", path.display()))?;
        FabricConfig::parse(&text, path)
    }

    pub fn parse(text: &str, path: &Path) -> anyhow::Result<FabricConfig> {
        let raw: RawFabric = toml::from_str(text)
            .map_err(|e| anyhow::anyhow!("{}: {}", path.display(), e.to_string().trim()))?;
        if raw.switches.is_empty() {
            return Err(err(path, "switch", "a fabric needs at least one switch"));
        }
        if raw.switches.len() > 255 {
            return Err(err(path, "switch", "at most 255 switches"));
        }
        let ids: HashMap<&str, SwitchId> = raw
            .switches
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.as_str(), i as SwitchId))
            .collect();
        if ids.len() != raw.switches.len() {
            return Err(err(path, "switch.name", "two switches share a name"));
        }
        let mut switches = Vec::new();
        for (i, s) in raw.switches.iter().enumerate() {
            let key = |k: &str| format!("switch[{}].{k}", s.name);
            let role = match s.role.as_str() {
                "tor" => Role::Tor,
                "root" => Role::Root,
                other => {
                    return Err(err(
                        path,
                        &key("role"),
                        format!("{other:?}: `tor` or `root`"),
                    ))
                }
            };
            let mac: Mac = s
                .mac
                .parse()
                .map_err(|_| err(path, &key("mac"), format!("{:?} is not a MAC", s.mac)))?;
            let rack = match (&s.rack, role) {
                (Some(r), Role::Tor) => Some(parse_prefix(r).ok_or_else(|| {
                    err(path, &key("rack"), format!("{r:?} is not ADDRESS/LENGTH"))
                })?),
                (None, Role::Tor) => return Err(err(path, &key("rack"), "a ToR needs its rack")),
                (Some(_), Role::Root) => return Err(err(path, &key("rack"), "a root has no rack")),
                (None, Role::Root) => None,
            };
            let mut ports = Vec::new();
            for p in &s.ports {
                let link = match &p.link {
                    None => None,
                    Some(n) => Some(*ids.get(n.as_str()).ok_or_else(|| {
                        err(
                            path,
                            &key("ports.link"),
                            format!("no switch is named {n:?}"),
                        )
                    })?),
                };
                ports.push((p.interface.clone(), link));
            }
            switches.push(FabricSwitchConfig {
                name: s.name.clone(),
                id: i as SwitchId,
                role,
                address: s.address,
                mac,
                rack,
                api: s.api,
                cache_items: s.cache_items,
                processors: s.processors,
                hit_check: s.hit_check,
                fdb_entries: s.fdb_entries,
                ports,
            });
        }
        let mut servers = Vec::new();
        for (i, s) in raw.servers.iter().enumerate() {
            let mac: Mac = s.mac.parse().map_err(|_| {
                err(
                    path,
                    &format!("server[{i}].mac"),
                    format!("{:?} is not a MAC", s.mac),
                )
            })?;
            let home_node = match s.home.as_deref() {
                None | Some("tor") => false,
                Some("node") => true,
                Some(other) => {
                    return Err(err(
                        path,
                        &format!("server[{i}].home"),
                        format!("{other:?} is not \"tor\" or \"node\""),
                    ))
                }
            };
            let shared = |o: &RawServer| o.address == s.address && !std::ptr::eq(o, s);
            if home_node && raw.servers.iter().any(shared) {
                return Err(err(
                    path,
                    &format!("server[{i}].home"),
                    format!(
                        "a home node is the only server at its address; {} has several",
                        s.address
                    ),
                ));
            }
            servers.push(FabricServer {
                ip: s.address,
                port: s.port,
                mac,
                home_node,
            });
        }
        let coherence = match raw.coherence.as_deref() {
            None => Coherence::default(),
            Some(name) => Coherence::parse(name).ok_or_else(|| {
                err(
                    path,
                    "coherence",
                    format!("\"{name}\": the protocols are \"invalidate\" and \"update\""),
                )
            })?,
        };
        let ms = |v: Option<u64>| v.map(Duration::from_millis);
        let config = FabricConfig {
            coherence,
            path: path.to_path_buf(),
            name: raw.name,
            buckets: raw.buckets.unwrap_or(DEFAULT_BUCKETS),
            switches,
            servers,
            busy_poll: Duration::from_micros(raw.busy_poll_us.unwrap_or(0)),
            api_token_file: raw.api_token_file.map(|f| match f.is_relative() {
                true => path.parent().unwrap_or(Path::new("")).join(f),
                false => f,
            }),
            invalidate_retry: ms(raw.invalidate_retry_ms),
            invalidate_give_up: ms(raw.invalidate_give_up_ms),
            hello: ms(raw.hello_ms),
            dead: ms(raw.dead_ms),
            lease: ms(raw.lease_ms),
        };
        // Every switch's spec must hold together.
        for s in &config.switches {
            config.spec(&s.name)?;
        }
        Ok(config)
    }

    pub fn switch(&self, name: &str) -> Option<&FabricSwitchConfig> {
        self.switches.iter().find(|s| s.name == name)
    }

    pub fn roots(&self) -> Vec<SwitchId> {
        self.switches
            .iter()
            .filter(|s| s.role == Role::Root)
            .map(|s| s.id)
            .collect()
    }

    /// The registration table the controller installs first: buckets spread over the roots.
    pub fn registration(
        &self,
        version: u64,
        failed: &BTreeSet<SwitchId>,
    ) -> anyhow::Result<Registration> {
        let roots = self.roots();
        if roots.is_empty() {
            // A fabric of one rack: no key is ever designated at a root.
            return Registration::new(version, vec![0], failed.clone())
                .map_err(|e| anyhow::anyhow!("{e}"));
        }
        Registration::spread(version, &roots, failed, self.buckets).ok_or_else(|| {
            anyhow::anyhow!(
                "{}: no root is left to designate ({} buckets, {} roots, {} failed)",
                self.path.display(),
                self.buckets,
                roots.len(),
                failed.len()
            )
        })
    }

    /// The spec of the switch named `name`.
    pub fn spec(&self, name: &str) -> anyhow::Result<FabricSpec> {
        let me = self.switch(name).ok_or_else(|| {
            anyhow::anyhow!("{}: no switch is named {name:?}", self.path.display())
        })?;
        let members = self
            .switches
            .iter()
            .map(|s| Member {
                id: s.id,
                role: s.role,
                ip: s.address,
                mac: s.mac,
            })
            .collect();
        let racks = self
            .switches
            .iter()
            .filter_map(|s| {
                s.rack.map(|(prefix, prefix_len)| Rack {
                    tor: s.id,
                    prefix,
                    prefix_len,
                })
            })
            .collect();
        let ports = me
            .ports
            .iter()
            .map(|(_, link)| link.map_or(PortRole::Host, PortRole::Link))
            .collect();
        let registration = match self.roots().is_empty() {
            // With no root, a table naming switch 0 is never read: every path stays in a rack.
            true => None,
            false => Some(self.registration(1, &BTreeSet::new())?),
        };
        let registration = match registration {
            Some(r) => r,
            None => {
                return Err(err(
                    &self.path,
                    "switch",
                    "a fabric needs at least one root (a single rack is one kvswitch)",
                ))
            }
        };
        let mut spec = FabricSpec::new(
            me.id,
            members,
            ports,
            racks,
            self.servers.clone(),
            registration,
        );
        if let Some(n) = me.cache_items {
            spec.cache_items = n;
        }
        if let Some(n) = me.processors {
            spec.incbox.processors = n;
        }
        if let Some(on) = me.hit_check {
            spec.incbox.hit_check = on;
        }
        if let Some(n) = me.fdb_entries {
            spec.incbox.fdb_entries = n;
        }
        if let Some(d) = self.invalidate_retry {
            spec.invalidate_retry = d;
        }
        if let Some(d) = self.invalidate_give_up {
            spec.invalidate_give_up = d;
        }
        if let Some(d) = self.hello {
            spec.hello_every = d;
        }
        if let Some(d) = self.dead {
            spec.dead_after = d;
        }
        if let Some(d) = self.lease {
            spec.lease = d;
        }
        spec.coherence = self.coherence;
        spec.validate()
            .map_err(|e| err(&self.path, &format!("switch[{name}]"), e))?;
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
name = "two-level"
[[switch]]
name = "tor0"
role = "tor"
address = "10.91.0.225"
mac = "02:91:00:00:00:e1"
rack = "10.91.0.0/27"
ports = [{ interface = "f-c0" }, { interface = "f-t0r0", link = "root0" }]
[[switch]]
name = "tor1"
role = "tor"
address = "10.91.0.226"
mac = "02:91:00:00:00:e2"
rack = "10.91.0.32/27"
ports = [{ interface = "f-s0" }, { interface = "f-t1r0", link = "root0" }]
[[switch]]
name = "root0"
role = "root"
address = "10.91.0.227"
mac = "02:91:00:00:00:e3"
ports = [{ interface = "f-r0t0", link = "tor0" }, { interface = "f-r0t1", link = "tor1" }]
[[server]]
address = "10.91.0.34"
mac = "02:91:00:00:00:22"
"#;

    #[test]
    fn the_example_is_a_working_file() {
        let c = FabricConfig::parse(EXAMPLE, Path::new("fabric.toml")).unwrap();
        assert_eq!(c.switches.len(), 3);
        for name in ["tor0", "tor1", "root0"] {
            c.spec(name).unwrap();
        }
    }

    #[test]
    fn a_file_gives_each_switch_its_spec() {
        let c = FabricConfig::parse(FILE, Path::new("f.toml")).unwrap();
        let tor = c.spec("tor0").unwrap();
        assert_eq!(tor.ports, vec![PortRole::Host, PortRole::Link(2)]);
        assert_eq!(tor.cache_items, 4096);
        let root = c.spec("root0").unwrap();
        assert_eq!(root.cache_items, 16_384);
        assert_eq!(root.registration.buckets().len(), DEFAULT_BUCKETS);
        assert_eq!(c.servers[0].port, 11211);
        assert!(c.spec("nobody").is_err());
    }

    #[test]
    fn a_switch_may_split_its_cache_as_an_incbox() {
        let split = FILE.replace(
            "name = \"tor1\"\n",
            "name = \"tor1\"\nprocessors = 4\nhit_check = true\nfdb_entries = 1024\ncache_items = 1024\n",
        );
        let c = FabricConfig::parse(&split, Path::new("f.toml")).unwrap();
        let tor = c.spec("tor1").unwrap();
        assert_eq!(
            (
                tor.incbox.processors,
                tor.incbox.hit_check,
                tor.incbox.fdb_entries
            ),
            (4, true, 1024)
        );
        let other = c.spec("tor0").unwrap();
        assert_eq!(other.incbox, switch::fabric::IncBoxSpec::default());
        for bad in [
            "processors = 0",
            "processors = 17",
            "fdb_entries = 0",
            "hit_check = true\nfdb_entries = 100",
        ] {
            let text = FILE.replace("name = \"tor1\"\n", &format!("name = \"tor1\"\n{bad}\n"));
            let e = format!(
                "{:#}",
                FabricConfig::parse(&text, Path::new("f.toml")).unwrap_err()
            );
            assert!(
                e.contains("f.toml") && e.contains("switch[tor1]"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn the_coherence_protocol_is_the_files_for_every_switch() {
        let c = FabricConfig::parse(FILE, Path::new("f.toml")).unwrap();
        assert_eq!(c.spec("tor0").unwrap().coherence, Coherence::Invalidate);
        let text = format!("coherence = \"update\"\n{FILE}");
        let c = FabricConfig::parse(&text, Path::new("f.toml")).unwrap();
        for name in ["tor0", "tor1", "root0"] {
            assert_eq!(c.spec(name).unwrap().coherence, Coherence::Update);
        }
    }

    #[test]
    fn mistakes_name_the_file_and_key() {
        let cases = [
            (FILE.replace("role = \"root\"", "role = \"spine\""), "role"),
            (FILE.replace("link = \"tor1\"", "link = \"tor9\""), "tor9"),
            (
                FILE.replace("rack = \"10.91.0.32/27\"", "rack = \"x\""),
                "rack",
            ),
            (FILE.replace("10.91.0.34", "10.92.0.34"), "no rack"),
            (
                FILE.replace("mac = \"02:91:00:00:00:22\"", "mac = \"zz\""),
                "server[0].mac",
            ),
            (format!("bogus = 1\n{FILE}"), "bogus"),
            (
                format!("coherence = \"snoop\"\n{FILE}"),
                "`coherence`: \"snoop\"",
            ),
            (
                FILE.replace(
                    "role = \"tor\"\naddress = \"10.91.0.226\"",
                    "role = \"root\"\naddress = \"10.91.0.226\"",
                ),
                "rack",
            ),
        ];
        for (text, needle) in cases {
            let e = FabricConfig::parse(&text, Path::new("f.toml"));
            let e = format!("{:#}", e.unwrap_err());
            assert!(e.contains("f.toml") && e.contains(needle), "{e}");
        }
    }
}
