//! Networks of programmable switches: several `kvswitch run` processes, each a switch with its
//! own control API and the memcached program idle (a placeholder server whose MAC is
//! configured, so it never asks for it), joined to hosts and to each other by veth pairs. The
//! network functions that run on kvswitch's pipeline (tags, and designs such as BCube and
//! PortLand) are programmed onto them through the API.
//!
//! Hosts get addresses in the prefix's subnet, no IPv6, and (unless the design answers ARP
//! itself) permanent neighbour entries for each other, so no neighbour discovery crosses the
//! network: topologies with loops carry only what their tables send. A state file (`/run/kvswitch/<prefix>-net.json`) records every
//! process and link, so a network whose owner died is taken down by [`Net::up`] with the same
//! prefix, or by `kvswitch testbed down --prefix`.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use switch::control::{ActionDef, EntryDef, Value, ACL};

use crate::netns::{self, ip, sysctl};
use crate::process;
use crate::topology::{check_prefix, Subnet};

/// What to build.
#[derive(Clone, Debug)]
pub struct NetSpec {
    pub prefix: String,
    /// The switches, by name.
    pub switches: Vec<String>,
    /// (host, the switch it hangs off).
    pub hosts: Vec<(String, String)>,
    /// Plain learning bridges (Linux bridges in the root namespace), by name: the commodity
    /// switches of designs such as BCube, whose programmable parts are the servers' cards.
    pub bridges: Vec<String>,
    /// Links between two switches, or a switch and a bridge.
    pub links: Vec<(String, String)>,
    /// The kvswitch binary.
    pub bin: PathBuf,
    /// Give every host a permanent neighbour entry for every other (no ARP crosses the
    /// network); off for designs that answer ARP themselves.
    pub static_neighbours: bool,
}

/// What is at the far end of a switch's port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Peer {
    Host(usize),
    Switch { switch: usize, port: u16 },
    Bridge(usize),
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NetPort {
    pub ifname: String,
    pub peer: Peer,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NetSwitch {
    pub name: String,
    pub api: SocketAddr,
    pub ports: Vec<NetPort>,
    pub pid: Option<u32>,
    pub argv: Vec<String>,
    pub log: PathBuf,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NetHost {
    pub name: String,
    pub netns: String,
    pub ip: Ipv4Addr,
    pub mac: String,
    /// The switch and port it hangs off.
    pub switch: usize,
    pub port: u16,
}

/// A running network; dropping it takes it down.
#[derive(Debug, Serialize, Deserialize)]
pub struct Net {
    pub prefix: String,
    pub switches: Vec<NetSwitch>,
    pub hosts: Vec<NetHost>,
    /// The bridges' interface names.
    #[serde(default)]
    pub bridges: Vec<String>,
    /// Root-namespace ends of every veth pair, and the bridges.
    links: Vec<String>,
    work_dir: PathBuf,
    #[serde(skip)]
    down: bool,
}

/// Where a network's state file lives.
pub fn state_path(prefix: &str) -> PathBuf {
    PathBuf::from(format!("/run/kvswitch/{prefix}-net.json"))
}

const READY: Duration = Duration::from_secs(20);
/// The MTU of links between switches: a full-size frame with labels pushed still fits.
const LINK_MTU: u32 = 9000;

fn host_mac(prefix_tag: u8, i: usize) -> String {
    format!("02:6e:{prefix_tag:02x}:00:{:02x}:{:02x}", i >> 8, i & 0xff)
}

impl Net {
    /// Builds the network and starts its switches; on any failure takes down what it made.
    /// A network left by an earlier owner of the prefix is taken down first.
    pub fn up(spec: &NetSpec) -> anyhow::Result<Net> {
        check_prefix(&spec.prefix)?;
        take_down_prefix(&spec.prefix)?;
        let subnet = Subnet::for_prefix(&spec.prefix);
        anyhow::ensure!(
            spec.hosts.len() < 250 && spec.switches.len() < 100,
            "a network holds at most 249 hosts and 99 switches"
        );
        let index = |name: &str| {
            spec.switches
                .iter()
                .position(|s| s == name)
                .with_context(|| format!("no switch named {name:?}"))
        };
        let tag = spec
            .prefix
            .bytes()
            .fold(0u8, |h, b| h.wrapping_mul(31).wrapping_add(b));
        let work_dir = PathBuf::from(format!("/run/kvswitch/{}-net.d", spec.prefix));
        std::fs::create_dir_all(&work_dir)
            .with_context(|| format!("creating {}", work_dir.display()))?;
        let mut net = Net {
            prefix: spec.prefix.clone(),
            switches: spec
                .switches
                .iter()
                .map(|name| NetSwitch {
                    name: name.clone(),
                    api: SocketAddr::from(([127, 0, 0, 1], 0)),
                    ports: Vec::new(),
                    pid: None,
                    argv: Vec::new(),
                    log: work_dir.join(format!("{name}.log")),
                })
                .collect(),
            hosts: Vec::new(),
            bridges: Vec::new(),
            links: Vec::new(),
            work_dir,
            down: false,
        };
        let built = net.build(spec, &subnet, tag, &index);
        if let Err(e) = built {
            net.take_down();
            return Err(e);
        }
        Ok(net)
    }

    fn ifname(&self, switch: usize, port: usize) -> String {
        format!("{}-s{switch}p{port}", self.prefix)
    }

    fn build(
        &mut self,
        spec: &NetSpec,
        subnet: &Subnet,
        tag: u8,
        index: &dyn Fn(&str) -> anyhow::Result<usize>,
    ) -> anyhow::Result<()> {
        let v6 = netns::have_ipv6();
        for (i, (name, sw)) in spec.hosts.iter().enumerate() {
            let s = index(sw)?;
            let port = self.switches[s].ports.len();
            let ifname = self.ifname(s, port);
            let h = NetHost {
                name: name.clone(),
                netns: format!("{}-{name}", self.prefix),
                ip: subnet.nth(i as u32 + 1),
                mac: host_mac(tag, i),
                switch: s,
                port: port as u16,
            };
            self.links.push(ifname.clone());
            self.hosts.push(h.clone());
            self.switches[s].ports.push(NetPort {
                ifname: ifname.clone(),
                peer: Peer::Host(i),
            });
            self.save()?;
            let ns = h.netns.as_str();
            let cidr = format!("{}/{}", h.ip, subnet.len);
            crate::host::host_link(ns, &ifname, &h.mac, &cidr)?;
            ip(&["-n", ns, "link", "set", "dev", "eth0", "up"])?;
        }
        for h in self.hosts.iter().filter(|_| spec.static_neighbours) {
            for other in self.hosts.iter().filter(|o| o.name != h.name) {
                ip(&[
                    "-n",
                    &h.netns,
                    "neigh",
                    "replace",
                    &other.ip.to_string(),
                    "lladdr",
                    &other.mac,
                    "dev",
                    "eth0",
                    "nud",
                    "permanent",
                ])?;
            }
        }
        for (i, name) in spec.bridges.iter().enumerate() {
            anyhow::ensure!(
                !spec.switches.contains(name),
                "{name:?} names both a switch and a bridge"
            );
            let br = format!("{}-b{i}", self.prefix);
            self.links.push(br.clone());
            self.bridges.push(br.clone());
            self.save()?;
            ip(&["link", "add", &br, "type", "bridge", "stp_state", "0"])?;
            switch_end(&br, v6)?;
        }
        let bridge = |name: &str| spec.bridges.iter().position(|b| b == name);
        let mut bridge_ports = vec![0usize; spec.bridges.len()];
        for (a, b) in &spec.links {
            let (a, b) = match bridge(a) {
                Some(_) => (b, a),
                None => (a, b),
            };
            if let Some(br) = bridge(b) {
                let sa = index(a)?;
                let pa = self.switches[sa].ports.len();
                let ia = self.ifname(sa, pa);
                let ib = format!("{}p{}", self.bridges[br], bridge_ports[br]);
                bridge_ports[br] += 1;
                self.links.push(ia.clone());
                self.switches[sa].ports.push(NetPort {
                    ifname: ia.clone(),
                    peer: Peer::Bridge(br),
                });
                self.save()?;
                link_pair(&ia, &ib, Some(&self.bridges[br]), v6)?;
                continue;
            }
            let (sa, sb) = (index(a)?, index(b)?);
            anyhow::ensure!(sa != sb, "a link from {a:?} to itself");
            let (pa, pb) = (self.switches[sa].ports.len(), self.switches[sb].ports.len());
            let (ia, ib) = (self.ifname(sa, pa), self.ifname(sb, pb));
            self.links.push(ia.clone());
            self.switches[sa].ports.push(NetPort {
                ifname: ia.clone(),
                peer: Peer::Switch {
                    switch: sb,
                    port: pb as u16,
                },
            });
            self.switches[sb].ports.push(NetPort {
                ifname: ib.clone(),
                peer: Peer::Switch {
                    switch: sa,
                    port: pa as u16,
                },
            });
            self.save()?;
            link_pair(&ia, &ib, None, v6)?;
        }
        // Each switch drops what comes from another switch (or a bridge) until a function's
        // entries say otherwise: the memcached program would flood it, and the topology may
        // loop. (The links are up from the start: a port kvswitch opens on a link that is down
        // loses a few frames in every hundred once it comes up.)
        for s in 0..self.switches.len() {
            anyhow::ensure!(
                !self.switches[s].ports.is_empty(),
                "switch {:?} has no ports",
                self.switches[s].name
            );
            self.start_switch(s, &spec.bin)?;
            let name = self.switches[s].name.clone();
            for p in 0..self.switches[s].ports.len() {
                if !matches!(self.switches[s].ports[p].peer, Peer::Host(_)) {
                    let guard = EntryDef {
                        fields: BTreeMap::from([("in_port".to_string(), Value::Number(p as u64))]),
                        priority: 0,
                        prefix_len: None,
                        actions: vec![ActionDef::Drop],
                    };
                    self.client(&name)
                        .add_entry(ACL, &guard)
                        .with_context(|| format!("{name}: the entry guarding port {p}"))?;
                }
            }
        }
        Ok(())
    }

    fn start_switch(&mut self, s: usize, bin: &Path) -> anyhow::Result<()> {
        let api = crate::host::free_port()?;
        let sw = &mut self.switches[s];
        sw.api = api;
        let ports: Vec<String> = sw.ports.iter().map(|p| format!("{:?}", p.ifname)).collect();
        // The memcached program idles: a placeholder VIP and server outside every host's
        // subnet, the server's MAC given so the switch never asks for it. These networks
        // carry one host's frames over several paths (BCube's servers relay, PortLand's
        // fabric spreads flows), so an address or MAC arrives on more than one port: the
        // switches are plain learning switches, the source check off.
        let config = format!(
            "[switch]\nports = [{}]\nmode = \"l3\"\napi = \"{api}\"\nlocal_port = \"\"\n\
             source_check = false\nproxy = false\ndatapath = \"af_packet\"\nbusy_poll_us = 0\nsteer_check_ms = 0\n\
             udp_reply_bytes_per_sec = 0\n\n[vip]\nip = \"198.18.{s}.100\"\n\
             mac = \"02:fe:00:00:{s:02x}:64\"\n\n[pool]\n[[pool.servers]]\n\
             addr = \"198.18.{s}.1:11211\"\nmac = \"02:fe:00:00:{s:02x}:01\"\n",
            ports.join(", ")
        );
        let path = self.work_dir.join(format!("{}.toml", sw.name));
        std::fs::write(&path, config).with_context(|| format!("writing {}", path.display()))?;
        sw.argv = vec![
            bin.display().to_string(),
            "run".into(),
            "--config".into(),
            path.display().to_string(),
        ];
        let (argv, log) = (sw.argv.clone(), sw.log.clone());
        // Recorded before it starts: a network whose owner dies between the two is still
        // taken down (by its command line, which names this network's own file).
        self.save()?;
        let mut child = process::spawn(None, &argv, &log)?;
        self.switches[s].pid = Some(child.id());
        self.save()?;
        crate::probe::wait_for(
            READY,
            || match child.try_wait() {
                Ok(Some(status)) => Some(format!("kvswitch exited: {status}")),
                _ => None,
            },
            || match crate::probe::http_get(api, "/api/v1/status")? {
                (200, _) => Ok(()),
                (code, body) => bail!("GET /api/v1/status answered {code}: {}", body.trim()),
            },
        )
        .with_context(|| {
            format!(
                "switch {:?} did not become ready on {api}; log {}:\n{}",
                self.switches[s].name,
                log.display(),
                process::tail(&log, 20)
            )
        })
    }

    /// Writes the state file whole or not at all (a file written half-way would keep the
    /// prefix from being taken down).
    fn save(&self) -> anyhow::Result<()> {
        let path = state_path(&self.prefix);
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))
    }

    pub fn switch(&self, name: &str) -> &NetSwitch {
        self.switches
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no switch {name:?}"))
    }

    pub fn host(&self, name: &str) -> &NetHost {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .unwrap_or_else(|| panic!("no host {name:?}"))
    }

    /// The port of switch `from` that leads to switch `to`.
    pub fn port_to(&self, from: &str, to: &str) -> Option<u16> {
        let to = self.switches.iter().position(|s| s.name == to)?;
        self.switch(from)
            .ports
            .iter()
            .position(|p| matches!(p.peer, Peer::Switch { switch, .. } if switch == to))
            .map(|p| p as u16)
    }

    /// The client of switch `name`'s API.
    pub fn client(&self, name: &str) -> api::Client {
        api::Client::new(self.switch(name).api, None)
    }

    /// A call to switch `name`'s API; an answer other than 2xx is an error.
    pub fn api(
        &self,
        name: &str,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> anyhow::Result<serde_json::Value> {
        let api = self.switch(name).api;
        let text = body.map(|b| b.to_string());
        let (code, answer) = crate::probe::http(api, method, path, None, text.as_deref())?;
        if !(200..300).contains(&code) {
            bail!("{name}: {method} {path}: {code}: {}", answer.trim());
        }
        Ok(serde_json::from_str(&answer).unwrap_or(serde_json::Value::Null))
    }

    /// What network functions write on switch `name`, without the hit counts traffic moves:
    /// every table (name, kind, key, miss actions, owner, and entry count but for the
    /// learning table `l2`'s), the `acl` entries (match, priority, actions), the interface
    /// and multicast group tables and the counters' names. A function that cleans up after itself leaves this as
    /// it found it.
    pub fn programmed(&self, name: &str) -> anyhow::Result<serde_json::Value> {
        let client = self.client(name);
        let read = || format!("reading what switch {name} is programmed with");
        let tables: Vec<serde_json::Value> = client
            .tables()
            .with_context(read)?
            .iter()
            .map(|t| {
                // The learning table's entries come and go with traffic.
                let entries = (t.name != "l2").then_some(t.entries);
                serde_json::json!([t.name, t.kind, t.key, t.miss, entries, t.owner])
            })
            .collect();
        let acl: Vec<serde_json::Value> = client
            .table_entries(ACL)
            .with_context(read)?
            .iter()
            .map(|e| serde_json::json!([e.fields, e.priority, e.actions]))
            .collect();
        let interfaces = client.interfaces().with_context(read)?;
        let groups = client.groups().with_context(read)?;
        // Counters by name: their counts come and go with traffic.
        let counters: Vec<String> = client
            .counters()
            .with_context(read)?
            .into_iter()
            .map(|c| c.name)
            .collect();
        Ok(
            serde_json::json!({"tables": tables, "acl": acl, "interfaces": interfaces,
                              "groups": groups, "counters": counters}),
        )
    }

    /// Packets each port of switch `name` received so far.
    pub fn rx_packets(&self, name: &str) -> anyhow::Result<Vec<u64>> {
        let ports = self.client(name).ports()?;
        Ok(ports.iter().map(|p| p.rx_packets).collect())
    }

    /// Takes the network down now (dropping it does the same).
    pub fn down(mut self) -> anyhow::Result<()> {
        let left = self.take_down();
        match left.is_empty() {
            true => Ok(()),
            false => bail!("left behind: {}", left.join(", ")),
        }
    }

    fn take_down(&mut self) -> Vec<String> {
        self.down = true;
        let mut left = Vec::new();
        let pids: Vec<u32> = self
            .switches
            .iter()
            .filter(|s| !s.argv.is_empty())
            .flat_map(|s| match s.pid {
                Some(p) if process::runs(p, &s.argv) => vec![p],
                Some(_) => Vec::new(),
                None => process::running(&s.argv),
            })
            .collect();
        let alive = process::stop_all(&pids);
        left.extend(alive.iter().map(|p| format!("process {p}")));
        for h in &self.hosts {
            if netns::netns_exists(&h.netns) && ip(&["netns", "del", &h.netns]).is_err() {
                left.push(format!("netns {}", h.netns));
            }
        }
        for l in &self.links {
            if netns::link_exists(l) && ip(&["link", "del", l]).is_err() && netns::link_exists(l) {
                left.push(format!("link {l}"));
            }
        }
        let _ = std::fs::remove_dir_all(&self.work_dir);
        if left.is_empty() {
            let _ = std::fs::remove_file(state_path(&self.prefix));
        }
        left
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        if !self.down {
            let left = self.take_down();
            if !left.is_empty() {
                eprintln!("network {:?}: left behind {}", self.prefix, left.join(", "));
            }
        }
    }
}

/// A veth pair between switches (or a switch and a bridge, which takes end `b` when `master`
/// names it), both ends in the root namespace and up, with room for the labels and tags a
/// function pushes between switches.
fn link_pair(a: &str, b: &str, master: Option<&str>, v6: bool) -> anyhow::Result<()> {
    ip(&["link", "add", a, "type", "veth", "peer", "name", b])?;
    if let Some(bridge) = master {
        ip(&["link", "set", "dev", b, "master", bridge])?;
    }
    for end in [a, b] {
        ip(&["link", "set", "dev", end, "mtu", &LINK_MTU.to_string()])?;
        switch_end(end, v6)?;
    }
    Ok(())
}

/// The root-namespace end of a link a switch reads with AF_PACKET.
fn switch_end(ifname: &str, v6: bool) -> anyhow::Result<()> {
    if v6 {
        sysctl(
            None,
            &[(&format!("net.ipv6.conf.{ifname}.disable_ipv6"), "1")],
        )?;
    }
    ip(&["link", "set", "dev", ifname, "up"])?;
    let _ = netns::run("ethtool", &["-K", ifname, "gro", "off", "tx", "off"]);
    Ok(())
}

/// Takes down a network whose state file `prefix` names (its owner died): its recorded
/// switches (only while they run the recorded command line), namespaces and links.
pub fn take_down_prefix(prefix: &str) -> anyhow::Result<()> {
    let path = state_path(prefix);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(());
    };
    let mut net: Net = match serde_json::from_str(&text) {
        Ok(net) => net,
        Err(e) => {
            // Not ours to read: its namespaces and links still carry the prefix.
            crate::sweep::sweep(prefix)?;
            let _ = std::fs::remove_file(&path);
            return Err(anyhow::anyhow!(
                "the state file {} did not read ({e}); its namespaces and links were removed, \
                 its switches (if any) may still run",
                path.display()
            ));
        }
    };
    let left = net.take_down();
    anyhow::ensure!(left.is_empty(), "left behind: {}", left.join(", "));
    Ok(())
}
