//! A fabric testbed: several kvswitch processes (`kvswitch fabric run`), ToRs with their racks
//! of hosts below and roots above, joined switch to switch by veth pairs in the root
//! namespace.
//!
//! Addresses: the testbed's /24 is cut into /27 racks, ToR `t`'s hosts numbered from `.2` of
//! the `t`-th; the switches' fabric addresses are in the last /27. Hosts hold a /24, so every
//! host is on their link, and know every other host's MAC (permanent neighbour entries):
//! ARP never has to cross a root. Each switch's API listens on a free port of 127.0.0.1.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};

use anyhow::{bail, Context};

use crate::netns::{self, ip, ns_run, sysctl};
use crate::probe;
use crate::process;
use crate::state::{FabricState, FabricSwitchState, State};
use crate::topology::{Role, SwitchRole, Topology, MEMCACHED_PORT};
use crate::up::{
    answers_version, create_host, exited, free_port, prefix_byte, record_file, record_proc,
    start_memcached, start_server, write_file,
};
use crate::{ServerProgram, UpOptions};

/// A fabric switch's API must answer within this long after start.
const SWITCH_READY: std::time::Duration = std::time::Duration::from_secs(10);
const DAEMON_READY: std::time::Duration = std::time::Duration::from_secs(5);

/// The tag of a switch in interface names: `t0`, `r1`.
fn tag(topo: &Topology, name: &str) -> String {
    let layout = topo.fabric.as_ref().expect("a fabric");
    let role = layout
        .switches
        .iter()
        .find(|s| s.name == name)
        .map(|s| s.role)
        .expect("a switch of the fabric");
    let index = layout
        .switches
        .iter()
        .filter(|s| s.role == role)
        .position(|s| s.name == name)
        .expect("listed");
    match role {
        SwitchRole::Tor => format!("t{index}"),
        SwitchRole::Root => format!("r{index}"),
    }
}

/// The ToRs' names, in file order: ToR `t` has the `t`-th rack.
fn tor_names(layout: &crate::topology::FabricLayout) -> Vec<&str> {
    layout
        .switches
        .iter()
        .filter(|s| s.role == SwitchRole::Tor)
        .map(|s| s.name.as_str())
        .collect()
}

fn nth(base: Ipv4Addr, n: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(base) + n)
}

/// Addresses, MACs and ports of every host and switch; nothing created yet.
pub(crate) fn plan(state: &mut State, topo: &Topology, prefix: &str) -> anyhow::Result<()> {
    let layout = topo.fabric.as_ref().expect("a fabric");
    let base = topo.subnet.base;
    state.local_port = None;
    state.local_peer = None;
    state.proxy = false;
    let tors = tor_names(layout);
    let mut in_rack = vec![0u32; tors.len()];
    for (i, h) in state.hosts.iter_mut().enumerate() {
        let t = tors
            .iter()
            .position(|&n| n == layout.host_switch[i])
            .expect("validated");
        h.ip = nth(base, 32 * t as u32 + 2 + in_rack[t]);
        in_rack[t] += 1;
    }
    let pb = prefix_byte(prefix);
    let mut switches = Vec::new();
    for (j, s) in layout.switches.iter().enumerate() {
        let mut ports: Vec<(String, Option<String>)> = Vec::new();
        match s.role {
            SwitchRole::Tor => {
                for (i, h) in state.hosts.iter().enumerate() {
                    if layout.host_switch[i] == s.name {
                        ports.push((h.switch_if.clone(), None));
                    }
                }
                for up in &s.uplinks {
                    let name = format!("{prefix}-{}{}", tag(topo, &s.name), tag(topo, up));
                    ports.push((name, Some(up.clone())));
                }
            }
            SwitchRole::Root => {
                for tor in layout
                    .switches
                    .iter()
                    .filter(|o| o.uplinks.contains(&s.name))
                {
                    let name = format!("{prefix}-{}{}", tag(topo, &s.name), tag(topo, &tor.name));
                    ports.push((name, Some(tor.name.clone())));
                }
            }
        }
        switches.push(FabricSwitchState {
            name: s.name.clone(),
            role: s.role,
            address: nth(base, 225 + j as u32),
            mac: format!("02:6b:76:{pb:02x}:01:{:02x}", j + 1),
            api: free_port()?,
            ports,
            log: state.work_dir.join(format!("fabric-{}.log", s.name)),
            pid: None,
        });
    }
    if let Some(s) = switches.first() {
        state.api = s.api;
        state.kvswitch_log = s.log.clone();
    }
    state.config_path = state.work_dir.join("fabric.toml");
    state.fabric = Some(FabricState {
        config: state.config_path.clone(),
        switches,
    });
    Ok(())
}

/// The fabric file every switch reads.
pub(crate) fn fabric_file(state: &State, topo: &Topology) -> String {
    let fabric = state.fabric.as_ref().expect("planned");
    let layout = topo.fabric.as_ref().expect("a fabric");
    let mut out = format!(
        "# Generated by `kvswitch testbed up` for testbed {:?}.\nname = {:?}\n",
        state.prefix, topo.name
    );
    if let Some(token) = &state.api_token_file {
        let _ = writeln!(out, "api_token_file = {:?}", token.display().to_string());
    }
    let tors = tor_names(layout);
    for s in &fabric.switches {
        let _ = writeln!(out, "\n[[switch]]\nname = {:?}", s.name);
        let role = match s.role {
            SwitchRole::Tor => "tor",
            SwitchRole::Root => "root",
        };
        let _ = writeln!(out, "role = \"{role}\"\naddress = \"{}\"", s.address);
        let _ = writeln!(out, "mac = \"{}\"\napi = \"{}\"", s.mac, s.api);
        if let Some(t) = tors.iter().position(|&n| n == s.name) {
            let _ = writeln!(
                out,
                "rack = \"{}/27\"",
                nth(topo.subnet.base, 32 * t as u32)
            );
        }
        out.push_str("ports = [\n");
        for (iface, link) in &s.ports {
            match link {
                Some(l) => {
                    let _ = writeln!(out, "  {{ interface = {iface:?}, link = {l:?} }},");
                }
                None => {
                    let _ = writeln!(out, "  {{ interface = {iface:?} }},");
                }
            }
        }
        out.push_str("]\n");
    }
    let layout = topo.fabric.as_ref().expect("a fabric");
    for (i, h) in state.hosts.iter().enumerate() {
        if h.role != Role::Server {
            continue;
        }
        let _ = writeln!(
            out,
            "\n[[server]]\naddress = \"{}\"\nport = {MEMCACHED_PORT}\nmac = \"{}\"",
            h.ip, h.mac
        );
        if layout.home_node[i] {
            out.push_str("home = \"node\"\n");
        }
    }
    out
}

/// Builds the planned fabric: hosts, links, servers, switches.
pub(crate) fn build(state: &mut State, topo: &Topology, opts: &UpOptions) -> anyhow::Result<()> {
    std::fs::create_dir_all(&state.work_dir)
        .with_context(|| format!("creating {}", state.work_dir.display()))?;
    for i in 0..state.hosts.len() {
        let h = state.hosts[i].clone();
        create_host(state, &h).with_context(|| format!("creating host {:?}", h.name))?;
    }
    // Every host knows every other's MAC: ARP stays in its rack.
    for h in &state.hosts {
        for o in state.hosts.iter().filter(|o| o.name != h.name) {
            ns_run(
                &h.netns,
                "ip",
                &[
                    "neigh",
                    "replace",
                    &o.ip.to_string(),
                    "lladdr",
                    &o.mac,
                    "dev",
                    "eth0",
                    "nud",
                    "permanent",
                ],
            )?;
        }
    }
    let fabric = state.fabric.clone().expect("planned");
    let v6 = netns::have_ipv6();
    for s in &fabric.switches {
        if s.role != SwitchRole::Root {
            continue;
        }
        for (iface, tor) in &s.ports {
            let tor = tor.as_deref().expect("a root's ports are links");
            let peer = fabric
                .switches
                .iter()
                .find(|o| o.name == tor)
                .and_then(|o| {
                    o.ports
                        .iter()
                        .find(|(_, l)| l.as_deref() == Some(&s.name))
                        .map(|(i, _)| i.clone())
                })
                .expect("planned from the same layout");
            ip(&["link", "add", iface, "type", "veth", "peer", "name", &peer])?;
            for end in [iface.as_str(), peer.as_str()] {
                if v6 {
                    sysctl(None, &[(&format!("net.ipv6.conf.{end}.disable_ipv6"), "1")])?;
                }
                ip(&["link", "set", "dev", end, "up"])?;
                let _ = netns::run("ethtool", &["-K", end, "gro", "off", "tx", "off"]);
            }
        }
    }
    let layout = topo.fabric.as_ref().expect("a fabric");
    let mut servers = Vec::new();
    for (i, host) in topo.hosts.iter().enumerate() {
        if host.role != Role::Server {
            continue;
        }
        if layout.home_node[i] {
            let bin = opts.kvswitch_bin.as_ref().with_context(|| {
                format!(
                    "host {:?} is its own home: kvswitch node needs the kvswitch binary",
                    host.name
                )
            })?;
            let tor = fabric
                .switches
                .iter()
                .find(|s| s.name == layout.host_switch[i])
                .map(|s| s.address)
                .expect("planned from the same layout");
            // kvswitch node as the server, memcached to its clients and the home of its keys.
            let node = ServerProgram::Node {
                bin: bin.clone(),
                args: ["--role", "home", "--tor", &tor.to_string()]
                    .map(String::from)
                    .to_vec(),
            };
            servers.push((
                i,
                start_server(state, i, &[], &node, None)?,
                "kvswitch node",
            ));
        } else {
            servers.push((
                i,
                start_memcached(state, i, &host.memcached_args)?,
                "memcached",
            ));
        }
    }
    for (i, child, what) in servers {
        answers_version(state, i, child, DAEMON_READY, what)?;
    }
    if let Some(path) = state.api_token_file.clone() {
        let token = crate::up::new_token()?;
        write_file(state, &path, &format!("{token}\n"))?;
    }
    let text = fabric_file(state, topo);
    write_file(state, &state.config_path.clone(), &text)?;
    if let Some(bin) = &opts.kvswitch_bin {
        for j in 0..fabric.switches.len() {
            start_switch(state, bin, j)?;
        }
    }
    state.complete = true;
    state.save()
}

/// Starts switch `j` of the fabric and waits for its API.
fn start_switch(state: &mut State, bin: &std::path::Path, j: usize) -> anyhow::Result<()> {
    let s = state.fabric.as_ref().expect("planned").switches[j].clone();
    record_file(state, &s.log)?;
    let argv = vec![
        bin.display().to_string(),
        "fabric".into(),
        "run".into(),
        "--config".into(),
        state.config_path.display().to_string(),
        "--switch".into(),
        s.name.clone(),
    ];
    let mut child = process::spawn(None, &argv, &s.log)?;
    record_proc(state, &child, "kvswitch", None, argv)?;
    if let Some(f) = state.fabric.as_mut() {
        f.switches[j].pid = Some(child.id());
    }
    state.save()?;
    probe::wait_for(
        SWITCH_READY,
        || exited(&mut child),
        || match probe::http_get(s.api, "/api/v1/fabric")? {
            (200, _) => Ok(()),
            (code, body) => bail!("GET /api/v1/fabric answered {code}: {}", body.trim()),
        },
    )
    .with_context(|| {
        format!(
            "fabric switch {} did not become ready on http://{}/api/v1/fabric; log {}:\n{}",
            s.name,
            s.api,
            s.log.display(),
            process::tail(&s.log, 20)
        )
    })
}

/// The API of fabric switch `name`.
pub fn switch_api(state: &State, name: &str) -> Option<SocketAddr> {
    state
        .fabric
        .as_ref()?
        .switches
        .iter()
        .find(|s| s.name == name)
        .map(|s| s.api)
}
