//! What one switch of a fabric is built from: the fabric's members and racks, this switch's
//! ports, the memcached servers whose traffic the fabric carries, and the sizes and times of
//! its cache and its homes' directories. Every switch of a fabric gets the same members, racks,
//! servers and registration table; only `id` and `ports` differ.

use std::fmt;
use std::net::Ipv4Addr;
use std::time::Duration;

use kv::fabric::{Registration, SwitchId};
use wire::ethernet::Mac;

/// Where a switch sits in the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Top of rack: hosts below, roots above; the client side's first cache and the home of
    /// its rack's servers.
    Tor,
    /// Joins ToRs; caches the keys the registration table designates it for.
    Root,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Tor => "tor",
            Role::Root => "root",
        }
    }
}

/// One switch of the fabric, as every other knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    pub id: SwitchId,
    pub role: Role,
    /// The address fabric messages to it are sent to.
    pub ip: Ipv4Addr,
    pub mac: Mac,
}

/// What is behind one of this switch's ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortRole {
    /// Hosts (a ToR's rack).
    Host,
    /// Another switch of the fabric.
    Link(SwitchId),
}

impl PortRole {
    /// The ports of switch `id` in a two-level tree whose `tors` ToRs come first and `roots`
    /// roots after them, every ToR linked to every root: a ToR's `hosts` host ports, then a
    /// link to each root; a root's link to each ToR.
    pub fn two_level(id: usize, tors: usize, roots: usize, hosts: usize) -> Vec<PortRole> {
        if id < tors {
            (0..hosts)
                .map(|_| PortRole::Host)
                .chain((0..roots).map(|r| PortRole::Link((tors + r) as SwitchId)))
                .collect()
        } else {
            (0..tors).map(|t| PortRole::Link(t as SwitchId)).collect()
        }
    }
}

/// The hosts below one ToR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rack {
    pub tor: SwitchId,
    pub prefix: Ipv4Addr,
    pub prefix_len: u8,
}

impl Rack {
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let mask = match self.prefix_len {
            0 => 0,
            n => u32::MAX << (32 - u32::from(n.min(32))),
        };
        u32::from(ip) & mask == u32::from(self.prefix) & mask
    }
}

/// A memcached server whose UDP traffic the fabric carries and caches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FabricServer {
    pub ip: Ipv4Addr,
    pub port: u16,
    pub mac: Mac,
    /// The server keeps its own keys' directory (`kvswitch node --role home`): its ToR
    /// passes it the requests that reach the home, and relays its invalidations and replies.
    pub home_node: bool,
}

/// Everything one fabric switch is built from.
#[derive(Debug, Clone)]
pub struct FabricSpec {
    /// This switch.
    pub id: SwitchId,
    pub members: Vec<Member>,
    /// Per port of this switch, what is behind it.
    pub ports: Vec<PortRole>,
    pub racks: Vec<Rack>,
    pub servers: Vec<FabricServer>,
    pub registration: Registration,
    /// Items this switch caches (IncBricks used 4,096 at a ToR and 16,384 at a root).
    pub cache_items: usize,
    /// How the cache is split between a switch stage and its processors (one processor and
    /// no hit check by default: one program per switch).
    pub incbox: super::IncBoxSpec,
    /// Keys a home's directory remembers sharers for.
    pub directory_keys: usize,
    /// How long an invalidation waits for its ACK before it is sent again.
    pub invalidate_retry: Duration,
    /// How long a write waits for all its ACKs before it fails.
    pub invalidate_give_up: Duration,
    /// How long a home waits for a server's reply to a request it sent on.
    pub reply_timeout: Duration,
    /// How long a switch refuses fills older than an invalidation it took.
    pub tombstone_for: Duration,
    /// How long a cached item is served after its fill: the longest a write that did not
    /// pass the key's home (TCP, or a client on the server's own host) leaves it stale.
    pub lease: Duration,
    /// How often a switch greets its neighbours.
    pub hello_every: Duration,
    /// A neighbour not heard from for this long is down.
    pub dead_after: Duration,
    /// What this switch, as a home, does for the copies a write leaves behind: invalidate
    /// them (IncBricks' protocol, the default) or update them once the write is applied.
    pub coherence: Coherence,
}

/// The coherence protocol a home runs (what IncBricks' `inc_init` chooses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Coherence {
    /// A write takes every copy away before it is applied; the next read refills.
    #[default]
    Invalidate,
    /// As `Invalidate`, and once the server has stored a `set` (or `add`, `replace`, `cas`)
    /// the home sends its value to every switch the write invalidated, stamped after the
    /// write: their next reads hit. Writes of several datagrams, quiet writes and the
    /// other commands update nothing.
    Update,
}

impl Coherence {
    pub fn name(self) -> &'static str {
        match self {
            Coherence::Invalidate => "invalidate",
            Coherence::Update => "update",
        }
    }

    pub fn parse(name: &str) -> Option<Coherence> {
        match name {
            "invalidate" => Some(Coherence::Invalidate),
            "update" => Some(Coherence::Update),
            _ => None,
        }
    }
}

/// Why a spec cannot build a switch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FabricSpecError {
    UnknownSelf(SwitchId),
    DuplicateMember(SwitchId),
    /// A port links to a switch that is not a member, or to itself.
    BadLink {
        port: usize,
        to: SwitchId,
    },
    /// A root with a host port.
    HostOnRoot(usize),
    /// A rack's ToR is not a ToR member.
    BadRack(SwitchId),
    /// A server outside every rack.
    ServerOutsideRacks(Ipv4Addr),
    /// The registration table names a switch that is not a root.
    NotARoot(SwitchId),
    TooManyPorts(usize),
    /// A time that must not be zero is.
    ZeroTime(&'static str),
    /// The cache's processors or forwarding table are out of bounds.
    BadIncBox(String),
}

impl fmt::Display for FabricSpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FabricSpecError::UnknownSelf(id) => write!(f, "switch {id} is not a member"),
            FabricSpecError::DuplicateMember(id) => write!(f, "switch {id} is listed twice"),
            FabricSpecError::BadLink { port, to } => {
                write!(
                    f,
                    "port {port} links to switch {to}, which is not another member"
                )
            }
            FabricSpecError::HostOnRoot(port) => {
                write!(f, "port {port} of a root has hosts; only ToRs have hosts")
            }
            FabricSpecError::BadRack(id) => write!(f, "rack of switch {id}, which is not a ToR"),
            FabricSpecError::ServerOutsideRacks(ip) => {
                write!(f, "server {ip} is in no rack, so it has no home")
            }
            FabricSpecError::NotARoot(id) => {
                write!(
                    f,
                    "the registration table designates switch {id}, which is not a root"
                )
            }
            FabricSpecError::TooManyPorts(n) => write!(f, "{n} ports: at most 256"),
            FabricSpecError::ZeroTime(what) => write!(f, "{what} must be more than zero"),
            FabricSpecError::BadIncBox(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for FabricSpecError {}

impl FabricSpec {
    /// A spec with IncBricks' sizes and kvswitch's default times.
    pub fn new(
        id: SwitchId,
        members: Vec<Member>,
        ports: Vec<PortRole>,
        racks: Vec<Rack>,
        servers: Vec<FabricServer>,
        registration: Registration,
    ) -> FabricSpec {
        let root = members.iter().any(|m| m.id == id && m.role == Role::Root);
        FabricSpec {
            id,
            members,
            ports,
            racks,
            servers,
            registration,
            cache_items: if root { 16_384 } else { 4_096 },
            incbox: super::IncBoxSpec::default(),
            directory_keys: 1 << 20,
            invalidate_retry: Duration::from_millis(20),
            invalidate_give_up: Duration::from_secs(2),
            reply_timeout: Duration::from_secs(1),
            tombstone_for: Duration::from_secs(2),
            lease: Duration::from_secs(2),
            hello_every: Duration::from_millis(50),
            dead_after: Duration::from_millis(200),
            coherence: Coherence::Invalidate,
        }
    }

    pub fn member(&self, id: SwitchId) -> Option<&Member> {
        self.members.iter().find(|m| m.id == id)
    }

    /// Checks the spec as a whole.
    pub fn validate(&self) -> Result<(), FabricSpecError> {
        let me = self
            .member(self.id)
            .ok_or(FabricSpecError::UnknownSelf(self.id))?;
        for (i, m) in self.members.iter().enumerate() {
            if self.members[..i].iter().any(|o| o.id == m.id) {
                return Err(FabricSpecError::DuplicateMember(m.id));
            }
        }
        if self.ports.len() > 256 {
            return Err(FabricSpecError::TooManyPorts(self.ports.len()));
        }
        for (port, role) in self.ports.iter().enumerate() {
            match *role {
                PortRole::Host if me.role == Role::Root => {
                    return Err(FabricSpecError::HostOnRoot(port))
                }
                PortRole::Link(to) if to == self.id || self.member(to).is_none() => {
                    return Err(FabricSpecError::BadLink { port, to })
                }
                _ => {}
            }
        }
        for rack in &self.racks {
            if self.member(rack.tor).map(|m| m.role) != Some(Role::Tor) {
                return Err(FabricSpecError::BadRack(rack.tor));
            }
        }
        for s in &self.servers {
            if !self.racks.iter().any(|r| r.contains(s.ip)) {
                return Err(FabricSpecError::ServerOutsideRacks(s.ip));
            }
        }
        for &root in self.registration.buckets() {
            if self.member(root).map(|m| m.role) != Some(Role::Root) {
                return Err(FabricSpecError::NotARoot(root));
            }
        }
        for (what, d) in [
            ("invalidate_retry", self.invalidate_retry),
            ("invalidate_give_up", self.invalidate_give_up),
            ("reply_timeout", self.reply_timeout),
            ("hello_every", self.hello_every),
            ("dead_after", self.dead_after),
            ("lease", self.lease),
            ("tombstone_for", self.tombstone_for),
        ] {
            if d.is_zero() {
                return Err(FabricSpecError::ZeroTime(what));
            }
        }
        self.incbox.validate().map_err(FabricSpecError::BadIncBox)?;
        super::check_table(self.incbox, self.cache_items).map_err(FabricSpecError::BadIncBox)?;
        Ok(())
    }
}
