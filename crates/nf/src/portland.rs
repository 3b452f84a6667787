//! PortLand on kvswitches (ServerSwitch 3.2.2, after PortLand's section 3): a fat-tree whose
//! hosts are reached by positional pseudo MACs (PMACs), built from each switch's control API
//! and a fabric manager on the CPU path.
//!
//! - A PMAC is `pod.position.port.vmid`: 16, 8, 8 and 16 bits.
//! - Every switch gets a `pmac` table, longest-prefix match on the destination MAC. A core
//!   sends each pod's prefix (16 bits) down to it; an aggregation switch sends each of its
//!   pod's edges' prefixes (24 bits) down and other pods' up, spread over its uplinks by pod;
//!   an edge switch sends other pods and other edges up, and a local host's whole PMAC through
//!   an interface-table entry that writes the host's real MAC back.
//! - Edge host ports send ARP to the CPU; the fabric manager learns the sender's location
//!   there, gives it a PMAC (an `acl` entry rewriting its source MAC on the way in, the
//!   interface and `pmac` entries on the way out) and answers with the target's PMAC. A host
//!   seen at a new place (the same address or MAC on another port) gets a new PMAC; the old
//!   entries go, and every other host is told the new PMAC by an ARP reply.
//! - Frames from other switches go to `pmac` only, whose misses are dropped, so the tree's
//!   loops carry nothing the tables do not send.

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddr};

use serde::Deserialize;
use switch::control::{ActionDef, EntryDef, InterfaceDef, KeyField, Kind, TableDef, Value, ACL};
use wire::arp::{self, Operation};
use wire::ethernet::{self, EtherType, Mac};

use crate::cpu::{Cpu, CpuMode};
use crate::{entry, number, text};

/// What a switch is in the tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case", tag = "role")]
pub enum Role {
    Edge { pod: u16, position: u8 },
    Aggregation { pod: u16, position: u8 },
    Core,
}

/// What a switch's port leads to.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PortTo {
    /// Hosts (an edge switch's down ports).
    Host,
    /// Another switch, by name.
    Switch(String),
}

#[derive(Clone, Debug, Deserialize)]
pub struct SwitchDef {
    pub name: String,
    pub api: SocketAddr,
    #[serde(flatten)]
    pub role: Role,
    /// The switch's own MAC, the source of frames it delivers to hosts.
    pub mac: String,
    pub ports: Vec<PortTo>,
}

/// The tree, as the fabric manager's file gives it (`[[switches]]`).
#[derive(Clone, Debug, Deserialize)]
pub struct Layout {
    pub switches: Vec<SwitchDef>,
}

/// A small fat-tree layout, every field explained, as `kvswitch nf portland --example-layout`
/// prints it.
pub const EXAMPLE_LAYOUT: &str = r#"# A PortLand fat-tree (`kvswitch nf portland --layout`): two pods of one edge and one
# aggregation switch each, under one core. Every switch is a running kvswitch, named by its
# control API. Each lists its ports in the switch's own order: "host" (an edge switch's ports
# to hosts) or { switch = NAME } (a link to that switch). An edge or aggregation switch gives
# its pod and its position in the pod; mac is the switch's own, the source of the frames it
# delivers to hosts.
[[switches]]
name = "e0"
api = "127.0.0.1:9001"
role = "edge"
pod = 0
position = 0
mac = "02:fe:00:00:00:01"
ports = ["host", { switch = "a0" }]

[[switches]]
name = "a0"
api = "127.0.0.1:9002"
role = "aggregation"
pod = 0
position = 0
mac = "02:fe:00:00:00:02"
ports = [{ switch = "e0" }, { switch = "c0" }]

[[switches]]
name = "e1"
api = "127.0.0.1:9003"
role = "edge"
pod = 1
position = 0
mac = "02:fe:00:00:00:03"
ports = ["host", { switch = "a1" }]

[[switches]]
name = "a1"
api = "127.0.0.1:9004"
role = "aggregation"
pod = 1
position = 0
mac = "02:fe:00:00:00:04"
ports = [{ switch = "e1" }, { switch = "c0" }]

[[switches]]
name = "c0"
api = "127.0.0.1:9005"
role = "core"
mac = "02:fe:00:00:00:05"
ports = [{ switch = "a0" }, { switch = "a1" }]
"#;

/// The table of every switch that routes by PMAC.
pub const PMAC: &str = "pmac";
/// ARP's ethertype, as an entry matches it.
const ARP: &str = "0x0806";

/// One call on a switch's API.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub switch: usize,
    pub ask: Ask,
}

/// What a call asks of a switch.
#[derive(Clone, Debug, PartialEq)]
pub enum Ask {
    /// Make a table.
    Table(TableDef),
    /// Add an entry to a table (`pmac` or `acl`).
    Entry(&'static str, EntryDef),
    /// Set an entry of the interface table.
    Interface(u16, InterfaceDef),
}

/// A PMAC.
pub fn pmac(pod: u16, position: u8, port: u8, vmid: u16) -> Mac {
    let [p0, p1] = pod.to_be_bytes();
    let [v0, v1] = vmid.to_be_bytes();
    Mac([p0, p1, position, port, v0, v1])
}

/// The `pmac` entry of `switch` sending the first `bits` of `prefix` by `action`.
fn route(switch: usize, prefix: Mac, bits: u16, action: ActionDef) -> Call {
    let entry = EntryDef {
        fields: BTreeMap::from([("eth_dst".to_string(), text(prefix))]),
        priority: 0,
        prefix_len: Some(bits),
        actions: vec![action],
    };
    Call {
        switch,
        ask: Ask::Entry(PMAC, entry),
    }
}

fn acl<const N: usize>(
    switch: usize,
    fields: [(&str, Value); N],
    priority: u32,
    actions: Vec<ActionDef>,
) -> Call {
    Call {
        switch,
        ask: Ask::Entry(ACL, entry(fields, priority, actions)),
    }
}

impl Layout {
    pub fn index(&self, name: &str) -> Option<usize> {
        self.switches.iter().position(|s| s.name == name)
    }

    /// The ports of switch `s` leading to switches for which `pick` holds.
    fn ports_to(&self, s: usize, pick: impl Fn(&Role) -> bool) -> Vec<u16> {
        self.switches[s]
            .ports
            .iter()
            .enumerate()
            .filter_map(|(p, to)| match to {
                PortTo::Switch(n) => self
                    .index(n)
                    .filter(|&i| pick(&self.switches[i].role))
                    .map(|_| p as u16),
                PortTo::Host => None,
            })
            .collect()
    }

    /// Checks the tree: every name known, pods and positions consistent.
    pub fn check(&self) -> anyhow::Result<()> {
        for s in &self.switches {
            for to in &s.ports {
                if let PortTo::Switch(n) = to {
                    anyhow::ensure!(self.index(n).is_some(), "{}: no switch named {n:?}", s.name);
                }
            }
            anyhow::ensure!(
                s.mac.parse::<Mac>().is_ok(),
                "{}: {:?} is not a MAC",
                s.name,
                s.mac
            );
            anyhow::ensure!(s.ports.len() <= 256, "{}: more than 256 ports", s.name);
            if !matches!(s.role, Role::Edge { .. }) {
                anyhow::ensure!(
                    !s.ports.contains(&PortTo::Host),
                    "{}: only edge switches have host ports",
                    s.name
                );
            }
        }
        Ok(())
    }

    /// The calls that set up every switch: the `pmac` table, its routes, and the `acl`
    /// entries that send frames to it (or ARP to the CPU).
    pub fn setup(&self) -> Vec<Call> {
        let mut calls = Vec::new();
        for (s, sw) in self.switches.iter().enumerate() {
            calls.push(Call {
                switch: s,
                ask: Ask::Table(TableDef {
                    name: PMAC.into(),
                    kind: Kind::Lpm,
                    key: vec![KeyField::Named("eth_dst".into())],
                    miss: vec![ActionDef::Drop],
                    size: None,
                }),
            });
            let pods: Vec<u16> = {
                let mut p: Vec<u16> = self
                    .switches
                    .iter()
                    .filter_map(|s| match s.role {
                        Role::Edge { pod, .. } => Some(pod),
                        _ => None,
                    })
                    .collect();
                p.sort_unstable();
                p.dedup();
                p
            };
            match sw.role {
                Role::Core => {
                    for &pod in &pods {
                        if let Some(&port) = self
                            .ports_to(
                                s,
                                |r| matches!(r, Role::Aggregation { pod: q, .. } if *q == pod),
                            )
                            .first()
                        {
                            calls.push(route(s, pmac(pod, 0, 0, 0), 16, ActionDef::Output(port)));
                        }
                    }
                }
                Role::Aggregation { pod, .. } => {
                    for e in self.switches.iter() {
                        if let Role::Edge { pod: q, position } = e.role {
                            if q != pod {
                                continue;
                            }
                            let name = &e.name;
                            if let Some(port) = sw
                                .ports
                                .iter()
                                .position(|t| matches!(t, PortTo::Switch(n) if n == name))
                            {
                                calls.push(route(
                                    s,
                                    pmac(pod, position, 0, 0),
                                    24,
                                    ActionDef::Output(port as u16),
                                ));
                            }
                        }
                    }
                    let up = self.ports_to(s, |r| matches!(r, Role::Core));
                    for &other in pods.iter().filter(|&&q| q != pod) {
                        if !up.is_empty() {
                            let port = up[usize::from(other) % up.len()];
                            calls.push(route(s, pmac(other, 0, 0, 0), 16, ActionDef::Output(port)));
                        }
                    }
                }
                Role::Edge { pod, position } => {
                    let up = self.ports_to(s, |r| matches!(r, Role::Aggregation { .. }));
                    if !up.is_empty() {
                        for &other in pods.iter().filter(|&&q| q != pod) {
                            let port = up[usize::from(other) % up.len()];
                            calls.push(route(s, pmac(other, 0, 0, 0), 16, ActionDef::Output(port)));
                        }
                        for e in self.switches.iter() {
                            if let Role::Edge {
                                pod: q,
                                position: p,
                            } = e.role
                            {
                                if q == pod && p != position {
                                    let port = up[usize::from(p) % up.len()];
                                    calls.push(route(
                                        s,
                                        pmac(pod, p, 0, 0),
                                        24,
                                        ActionDef::Output(port),
                                    ));
                                }
                            }
                        }
                    }
                }
            }
            for (p, to) in sw.ports.iter().enumerate() {
                let in_port = number(p as u64);
                calls.push(match to {
                    PortTo::Switch(_) => acl(
                        s,
                        [("in_port", in_port.clone())],
                        10,
                        vec![ActionDef::Goto(PMAC.into())],
                    ),
                    PortTo::Host => acl(
                        s,
                        [("in_port", in_port.clone()), ("ethertype", text(ARP))],
                        30,
                        vec![ActionDef::ToCpu],
                    ),
                });
                if *to == PortTo::Host {
                    // From a host not given a PMAC yet: nothing (its ARP comes first).
                    calls.push(acl(s, [("in_port", in_port)], 5, vec![ActionDef::Drop]));
                }
            }
        }
        calls
    }
}

/// Where a host is, and what it was given there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    pub ip: Ipv4Addr,
    pub mac: Mac,
    pub switch: usize,
    pub port: u16,
    pub pmac: Mac,
}

/// The fabric manager's table of hosts: ARP in, calls out.
pub struct Manager {
    layout: Layout,
    pub hosts: Vec<Host>,
    /// Interface ids handed out per edge switch.
    next_interface: HashMap<usize, u16>,
    /// VM ids handed out per (switch, port).
    next_vmid: HashMap<(usize, u16), u16>,
    /// Entry and interface ids of each host's entries, by its PMAC: (switch, acl id, pmac id,
    /// interface id), filled in as the calls are answered.
    pub installed: HashMap<Mac, (usize, Option<u64>, Option<u64>, u16)>,
    pub moves: u64,
    pub answered: u64,
}

/// A frame to send: (edge switch, port, bytes).
pub type Out = (usize, u16, Vec<u8>);

/// An ARP reply telling `to` that `about`'s address is at `about`'s PMAC.
fn reply(about: &Host, to: &Host) -> Vec<u8> {
    let repr = arp::Repr {
        operation: Operation::Reply,
        sender_mac: about.pmac,
        sender_ip: about.ip,
        target_mac: to.mac,
        target_ip: to.ip,
    };
    switch::frame::arp_frame(to.mac, &repr)
}

/// What a host's ARP makes the manager do.
#[derive(Debug, PartialEq)]
pub enum Learned {
    /// Nothing new about the sender.
    Known,
    /// A new host, or a host moved: install its entries (and, after a move, remove the old
    /// ones and tell the others).
    Placed { host: Host, old: Option<Host> },
}

impl Manager {
    pub fn new(layout: Layout) -> Manager {
        Manager {
            layout,
            hosts: Vec::new(),
            next_interface: HashMap::new(),
            next_vmid: HashMap::new(),
            installed: HashMap::new(),
            moves: 0,
            answered: 0,
        }
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Every host port of every edge switch.
    fn host_ports(&self) -> Vec<(usize, u16)> {
        let mut out = Vec::new();
        for (s, sw) in self.layout.switches.iter().enumerate() {
            for (p, to) in sw.ports.iter().enumerate() {
                if *to == PortTo::Host {
                    out.push((s, p as u16));
                }
            }
        }
        out
    }

    /// An ARP frame from host port `port` of edge switch `switch`: what the manager learned of
    /// its sender, and the ARP frames to send (edge, port, frame).
    ///
    /// - A request for a known host is answered with its PMAC.
    /// - A request for a host not seen yet is sent on to every other host port, with the
    ///   requester's PMAC as its sender, so the target answers to a PMAC.
    /// - A reply (to such a request) tells its target host the sender's PMAC.
    pub fn arp(&mut self, switch: usize, port: u16, frame: &[u8]) -> Option<(Learned, Vec<Out>)> {
        let eth = ethernet::Frame::new_checked(frame).ok()?;
        if eth.ethertype() != EtherType::ARP {
            return None;
        }
        let a = arp::Repr::parse(&arp::Packet::new_checked(eth.payload()).ok()?).ok()?;
        let Role::Edge { pod, position } = self.layout.switches.get(switch)?.role else {
            return None;
        };
        if a.sender_ip.is_unspecified() || eth.src() != a.sender_mac || port > u16::from(u8::MAX) {
            return None;
        }
        let here = |h: &Host| h.switch == switch && h.port == port;
        let learned = match self
            .hosts
            .iter()
            .position(|h| h.ip == a.sender_ip || h.mac == a.sender_mac)
        {
            Some(i)
                if here(&self.hosts[i])
                    && self.hosts[i].mac == a.sender_mac
                    && self.hosts[i].ip == a.sender_ip =>
            {
                Learned::Known
            }
            found => {
                let old = found.map(|i| self.hosts.remove(i));
                let vmid = self.next_vmid.entry((switch, port)).or_insert(0);
                let host = Host {
                    ip: a.sender_ip,
                    mac: a.sender_mac,
                    switch,
                    port,
                    pmac: pmac(pod, position, port as u8, *vmid),
                };
                *vmid = vmid.wrapping_add(1);
                self.hosts.push(host.clone());
                if old.is_some() {
                    self.moves += 1;
                }
                Learned::Placed { host, old }
            }
        };
        let sender = self.hosts.iter().find(|h| h.ip == a.sender_ip)?.clone();
        let target = self.hosts.iter().find(|h| h.ip == a.target_ip).cloned();
        let mut out = Vec::new();
        match (a.operation, target) {
            (Operation::Request, Some(t)) => {
                self.answered += 1;
                out.push((switch, port, reply(&t, &sender)));
            }
            (Operation::Request, None) => {
                let mut ask = a;
                ask.sender_mac = sender.pmac;
                let frame = switch::frame::arp_frame(Mac([0xff; 6]), &ask);
                for (s, p) in self.host_ports() {
                    if (s, p) != (switch, port) {
                        out.push((s, p, frame.clone()));
                    }
                }
            }
            (Operation::Reply, Some(t)) if t.ip != sender.ip => {
                out.push((t.switch, t.port, reply(&sender, &t)));
            }
            _ => {}
        }
        Some((learned, out))
    }

    /// The calls that give `host` its entries at its edge: the source rewrite, the interface
    /// entry and the route to it. The interface id is the edge's next.
    pub fn install(&mut self, host: &Host) -> (u16, Vec<Call>) {
        let next = self.next_interface.entry(host.switch).or_insert(0);
        let interface = *next;
        *next = next.wrapping_add(1);
        let edge_mac = self.layout.switches[host.switch].mac.clone();
        let s = host.switch;
        let calls = vec![
            Call {
                switch: s,
                ask: Ask::Interface(
                    interface,
                    InterfaceDef {
                        eth_dst: host.mac.to_string(),
                        eth_src: edge_mac,
                        port: host.port,
                    },
                ),
            },
            route(s, host.pmac, 48, ActionDef::Interface(interface)),
            acl(
                s,
                [("in_port", number(host.port)), ("eth_src", text(host.mac))],
                20,
                vec![
                    ActionDef::SetEthSrc(host.pmac.to_string()),
                    ActionDef::Goto(PMAC.into()),
                ],
            ),
        ];
        (interface, calls)
    }

    /// ARP replies telling every other host `host`'s PMAC, each with the edge and port to send
    /// it out of.
    pub fn announce(&self, host: &Host) -> Vec<Out> {
        self.hosts
            .iter()
            .filter(|h| h.ip != host.ip)
            .map(|h| (h.switch, h.port, reply(host, h)))
            .collect()
    }
}

/// What the fabric manager did, for its report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    pub hosts: u64,
    pub moves: u64,
    pub arp_answered: u64,
    pub announcements: u64,
}

struct Shared {
    manager: Manager,
    /// `acl` entries the setup made, per switch, for removal.
    setup_acl: Vec<(usize, u64)>,
    announcements: u64,
}

/// Makes `c` on its switch; the id of the entry it added, if it added one.
fn run_call(clients: &[api::Client], c: &Call) -> anyhow::Result<Option<u64>> {
    let client = &clients[c.switch];
    let made = match &c.ask {
        Ask::Table(def) => client.add_table(def).map(|()| None),
        Ask::Entry(table, entry) => client.add_entry(table, entry).map(Some),
        Ask::Interface(id, def) => client.set_interface(*id, def).map(|_| None),
    };
    made.map_err(|e| e.context(format!("switch {}", c.switch)))
}

/// Runs the fabric manager over `layout` until `stop`: sets every switch up, answers ARP and
/// places hosts, then removes everything it made (also after an error). Each switch's API is
/// reached as `reach` reaches its own (token, HTTPS), at the address the layout gives.
pub fn run(
    layout: Layout,
    reach: &api::Client,
    cpu: CpuMode,
    stop: &(dyn Fn() -> bool + Sync),
) -> anyhow::Result<Stats> {
    layout.check()?;
    let clients: Vec<api::Client> = layout.switches.iter().map(|s| reach.at(s.api)).collect();
    let edges: Vec<usize> = (0..layout.switches.len())
        .filter(|&s| matches!(layout.switches[s].role, Role::Edge { .. }))
        .collect();
    let shared = std::sync::Mutex::new(Shared {
        manager: Manager::new(layout),
        setup_acl: Vec::new(),
        announcements: 0,
    });
    let setup = shared
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .manager
        .layout()
        .setup();
    let mut result = Ok(());
    for c in &setup {
        match run_call(&clients, c) {
            Ok(made) => {
                if let (Ask::Entry(ACL, _), Some(id), Ok(mut g)) = (&c.ask, made, shared.lock()) {
                    g.setup_acl.push((c.switch, id));
                }
            }
            Err(e) => {
                result = Err(e.context("setting the switches up"));
                break;
            }
        }
    }
    // Frames out of any switch go through these; each edge's worker takes its switch's frames
    // on a connection of its own.
    let senders = clients
        .iter()
        .map(|c| Cpu::open(c, cpu, false).map(std::sync::Mutex::new))
        .collect::<anyhow::Result<Vec<_>>>();
    let senders = match (senders, &result) {
        (Ok(s), Ok(())) => s,
        (Err(e), Ok(())) => {
            result = Err(e.context("opening the switches' CPU paths"));
            Vec::new()
        }
        (_, Err(_)) => Vec::new(),
    };
    if result.is_ok() {
        result = std::thread::scope(|scope| {
            let workers: Vec<_> = edges
                .iter()
                .map(|&edge| {
                    let (clients, shared, senders) = (&clients, &shared, &senders);
                    scope.spawn(move || {
                        let taker = Cpu::open(&clients[edge], cpu, true)?;
                        serve_edge(clients, senders, taker, shared, edge, stop)
                    })
                })
                .collect();
            let mut r = Ok(());
            for w in workers {
                let done = w
                    .join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("an edge's worker panicked")));
                if r.is_ok() {
                    r = done;
                }
            }
            r
        });
    }
    let g = shared
        .into_inner()
        .map_err(|_| anyhow::anyhow!("poisoned"))?;
    let mut cleanup: anyhow::Result<()> = Ok(());
    let mut keep = |r: anyhow::Result<()>| {
        if let (Ok(()), Err(e)) = (&cleanup, r) {
            cleanup = Err(e);
        }
    };
    for &(s, id) in &g.setup_acl {
        keep(clients[s].remove_entry(ACL, id).map(drop));
    }
    for &(s, acl_id, _, _) in g.manager.installed.values() {
        if let Some(id) = acl_id {
            keep(clients[s].remove_entry(ACL, id).map(drop));
        }
    }
    for c in &clients {
        keep(c.remove_table(PMAC));
    }
    for &(s, _, _, interface) in g.manager.installed.values() {
        keep(clients[s].remove_interface(interface));
    }
    result?;
    cleanup.map_err(|e| e.context("removing the fabric manager's entries"))?;
    Ok(Stats {
        hosts: g.manager.hosts.len() as u64,
        moves: g.manager.moves,
        arp_answered: g.manager.answered,
        announcements: g.announcements,
    })
}

fn serve_edge(
    clients: &[api::Client],
    senders: &[std::sync::Mutex<Cpu>],
    mut taker: Cpu,
    shared: &std::sync::Mutex<Shared>,
    edge: usize,
    stop: &(dyn Fn() -> bool + Sync),
) -> anyhow::Result<()> {
    let send = |s: usize, p: u16, frame: &[u8]| -> anyhow::Result<()> {
        senders[s]
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .send(p, frame)
    };
    while !stop() {
        for f in taker.frames(64, std::time::Duration::from_millis(100))? {
            let frame = f.frame;
            let mut g = shared.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
            let Some((learned, frames)) = g.manager.arp(edge, f.in_port, &frame) else {
                continue;
            };
            if let Learned::Placed { host, old } = learned {
                if let Some(old) = old {
                    if let Some((s, acl_id, pmac_id, interface)) =
                        g.manager.installed.remove(&old.pmac)
                    {
                        if let Some(id) = acl_id {
                            clients[s].remove_entry(ACL, id)?;
                        }
                        if let Some(id) = pmac_id {
                            clients[s].remove_entry(PMAC, id)?;
                        }
                        clients[s].remove_interface(interface)?;
                    }
                }
                let (interface, calls) = g.manager.install(&host);
                g.manager
                    .installed
                    .insert(host.pmac, (host.switch, None, None, interface));
                let mut ids = [None, None];
                for c in &calls {
                    let made = run_call(clients, c)?;
                    match c.ask {
                        Ask::Entry(PMAC, _) => ids[0] = made,
                        Ask::Entry(ACL, _) => ids[1] = made,
                        _ => {}
                    }
                }
                g.manager
                    .installed
                    .insert(host.pmac, (host.switch, ids[1], ids[0], interface));
                for (s, p, frame) in g.manager.announce(&host) {
                    send(s, p, &frame)?;
                    g.announcements += 1;
                }
            }
            for (s, p, frame) in frames {
                send(s, p, &frame)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAYOUT: &str = EXAMPLE_LAYOUT;

    /// The entries `calls` add to `switch`'s `table`.
    fn entries<'a>(calls: &'a [Call], switch: usize, table: &str) -> Vec<&'a EntryDef> {
        calls
            .iter()
            .filter(|c| c.switch == switch)
            .filter_map(|c| match &c.ask {
                Ask::Entry(t, e) if *t == table => Some(e),
                _ => None,
            })
            .collect()
    }

    fn routes(calls: &[Call], switch: usize) -> Vec<(Value, Option<u16>, Vec<ActionDef>)> {
        entries(calls, switch, PMAC)
            .into_iter()
            .map(|e| (e.fields["eth_dst"].clone(), e.prefix_len, e.actions.clone()))
            .collect()
    }

    #[test]
    fn a_layout_file_sets_every_level_up_by_prefix() {
        let layout: Layout = toml::from_str(LAYOUT).unwrap();
        layout.check().unwrap();
        let calls = layout.setup();
        let pod = |p: u16| text(pmac(p, 0, 0, 0));
        let out = |port: u16| vec![ActionDef::Output(port)];
        // The core sends each pod down; an aggregation switch its edge down and the other pod
        // up; an edge the other pod up.
        assert_eq!(
            routes(&calls, 4),
            [(pod(0), Some(16), out(0)), (pod(1), Some(16), out(1))]
        );
        assert_eq!(
            routes(&calls, 1),
            [(pod(0), Some(24), out(0)), (pod(1), Some(16), out(1))]
        );
        assert_eq!(routes(&calls, 0), [(pod(1), Some(16), out(1))]);
        // ARP from the host port goes to the CPU; what comes from a switch goes to pmac.
        let acl = entries(&calls, 0, ACL);
        assert!(acl
            .iter()
            .any(|e| e.fields.get("ethertype") == Some(&text(ARP))
                && e.actions == [ActionDef::ToCpu]));
        assert!(acl
            .iter()
            .any(|e| e.fields.get("in_port") == Some(&number(1u8))
                && e.actions == [ActionDef::Goto(PMAC.into())]));
    }

    #[test]
    fn a_layout_naming_an_unknown_switch_or_host_ports_off_the_edge_is_refused() {
        let bad = LAYOUT.replace(
            "{ switch = \"c0\" }]\n\n[[switches]]\nname = \"e1\"",
            "{ switch = \"c9\" }]\n\n[[switches]]\nname = \"e1\"",
        );
        let layout: Layout = toml::from_str(&bad).unwrap();
        assert!(layout.check().unwrap_err().to_string().contains("c9"));
        let bad = LAYOUT.replace(
            "ports = [{ switch = \"a0\" }, { switch = \"a1\" }]",
            "ports = [\"host\", { switch = \"a1\" }]",
        );
        let layout: Layout = toml::from_str(&bad).unwrap();
        assert!(layout.check().unwrap_err().to_string().contains("edge"));
    }

    #[test]
    fn arp_places_hosts_answers_for_known_ones_and_asks_for_unknown_ones() {
        let layout: Layout = toml::from_str(LAYOUT).unwrap();
        let mut m = Manager::new(layout);
        let mac = |n: u8| Mac([2, 0, 0, 0, 0, n]);
        let ip = |n: u8| Ipv4Addr::new(10, 0, 0, n);
        let request = |from: u8, to: u8| {
            let repr = arp::Repr {
                operation: Operation::Request,
                sender_mac: mac(from),
                sender_ip: ip(from),
                target_mac: Mac([0; 6]),
                target_ip: ip(to),
            };
            switch::frame::arp_frame(Mac([0xff; 6]), &repr)
        };
        // h1 at e0 asks for h2, not seen yet: placed, and the question goes to e1's host.
        let (learned, out) = m.arp(0, 0, &request(1, 2)).unwrap();
        assert!(
            matches!(learned, Learned::Placed { ref host, old: None } if host.pmac == pmac(0, 0, 0, 0))
        );
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].0, out[0].1), (2, 0));
        // h2 at e1 asks for h1: answered with h1's PMAC, from h1's PMAC.
        let (_, out) = m.arp(2, 0, &request(2, 1)).unwrap();
        assert_eq!(out.len(), 1);
        let eth = ethernet::Frame::new_checked(&out[0].2[..]).unwrap();
        let a = arp::Repr::parse(&arp::Packet::new_checked(eth.payload()).unwrap()).unwrap();
        assert_eq!(
            (a.operation, a.sender_mac, a.sender_ip),
            (Operation::Reply, pmac(0, 0, 0, 0), ip(1))
        );
        // h1 again from the same place: nothing new. From e1: it moved, with a new PMAC.
        assert_eq!(m.arp(0, 0, &request(1, 2)).unwrap().0, Learned::Known);
        let (learned, _) = m.arp(2, 0, &request(1, 2)).unwrap();
        assert!(
            matches!(learned, Learned::Placed { ref host, old: Some(_) } if host.pmac == pmac(1, 0, 0, 1))
        );
        assert_eq!(m.moves, 1);
        // Not ARP, a truncated frame, or a frame from a core: nothing.
        let mut cut = request(3, 1);
        cut.truncate(30);
        assert!(m.arp(0, 0, &cut).is_none());
        assert!(m.arp(4, 0, &request(3, 1)).is_none());
    }
}
