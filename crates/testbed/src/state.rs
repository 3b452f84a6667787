//! The live testbed as JSON: everything `up` created, written before each step so that `down`
//! can undo a half-built testbed after a crash.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::topology::{Mode, Role};

/// The state file's contents.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// Prefix of every namespace, link and file name (`<prefix>-<host>`).
    pub prefix: String,
    /// Topology name.
    pub name: String,
    pub mode: Mode,
    pub subnet: String,
    pub vip: Ipv4Addr,
    /// The VIP's port, which is every server's too.
    pub vip_port: u16,
    pub vip_mac: String,
    /// The servers run redis-server, and the pool is a Redis pool.
    #[serde(default)]
    pub redis: bool,
    /// Where the switch (split gets) and the proxy (connections to the servers) speak from
    /// when it is not the VIP: set in l2 mode, where the servers own the VIP.
    #[serde(default)]
    pub agent_ip: Option<Ipv4Addr>,
    /// kvswitch's local port, the switch's end (`<prefix>-local`); None when turned off.
    #[serde(default)]
    pub local_port: Option<String>,
    /// The host's end of the local port (`<prefix>-local-h`), in the root namespace with the
    /// VIP's MAC and address.
    #[serde(default)]
    pub local_peer: Option<String>,
    /// Whether kvswitch runs its TCP proxy behind the local port.
    #[serde(default)]
    pub proxy: bool,
    pub distribution: String,
    pub hash: String,
    /// kvswitch's HTTP API.
    pub api: SocketAddr,
    /// The API's token, when the API is reachable from the hosts (a testbed with cache
    /// nodes): changes need it.
    #[serde(default)]
    pub api_token_file: Option<PathBuf>,
    /// This file.
    pub state_path: PathBuf,
    /// Directory holding the generated configs and logs.
    pub work_dir: PathBuf,
    /// Generated kvswitch config.
    pub config_path: PathBuf,
    pub kvswitch_log: PathBuf,
    /// None when kvswitch was not started.
    pub kvswitch_pid: Option<u32>,
    pub hosts: Vec<HostState>,
    /// None when nutcracker was not started.
    pub nutcracker: Option<NutcrackerState>,
    /// Every process started, with the command line `down` checks before signalling it.
    pub procs: Vec<ProcRecord>,
    /// Every file generated, removed by `down`.
    pub files: Vec<PathBuf>,
    /// True once `up` finished every step.
    pub complete: bool,
    /// A fabric of several kvswitches in place of the one (`kvswitch_pid` then stays empty).
    #[serde(default)]
    pub fabric: Option<FabricState>,
}

/// The switches of a fabric testbed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricState {
    /// The fabric file every switch reads.
    pub config: PathBuf,
    pub switches: Vec<FabricSwitchState>,
}

/// One switch of a fabric testbed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricSwitchState {
    pub name: String,
    pub role: crate::topology::SwitchRole,
    /// Where fabric messages to it go.
    pub address: Ipv4Addr,
    pub mac: String,
    pub api: SocketAddr,
    /// Its ports' interfaces in the root namespace, in port order, each with the switch at
    /// the other end (`None`: a host).
    pub ports: Vec<(String, Option<String>)>,
    pub log: PathBuf,
    pub pid: Option<u32>,
}

/// One host: a namespace joined to the switch by a veth pair.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostState {
    pub name: String,
    pub role: Role,
    /// Namespace name, `<prefix>-<name>`.
    pub netns: String,
    /// Address of `eth0` inside the namespace.
    pub ip: Ipv4Addr,
    /// Prefix length of `ip`.
    pub prefix_len: u8,
    /// MAC of `eth0` inside the namespace.
    pub mac: String,
    /// Switch-side end of the veth pair, in the root namespace.
    pub switch_if: String,
    /// Pool weight (servers).
    pub weight: u32,
    /// Processes running inside the namespace.
    pub pids: Vec<u32>,
    /// memcached's log (servers).
    pub log: Option<PathBuf>,
}

/// The nutcracker proxy on the first client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NutcrackerState {
    /// Host (and so namespace) it runs in.
    pub host: String,
    /// Listen address, reachable from inside that namespace only.
    pub listen: SocketAddr,
    pub stats_port: u16,
    pub config: PathBuf,
    pub log: PathBuf,
    pub pid: Option<u32>,
}

/// A process started by `up`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcRecord {
    pub pid: u32,
    /// "memcached", "nutcracker" or "kvswitch".
    pub what: String,
    /// Namespace it runs in; None for the root namespace.
    pub netns: Option<String>,
    /// Its command line, compared with /proc/PID/cmdline so a reused PID is never signalled.
    pub argv: Vec<String>,
}

impl State {
    /// Writes the state atomically (temporary file, then rename).
    pub fn save(&self) -> anyhow::Result<()> {
        let path = &self.state_path;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating directory {}", dir.display()))?;
        }
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_string_pretty(self).context("serialising testbed state")?;
        std::fs::write(&tmp, text + "\n").with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, path)
            .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
    }

    pub fn load(path: &Path) -> anyhow::Result<State> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading testbed state {}", path.display()))?;
        serde_json::from_str(&text)
            .with_context(|| format!("parsing testbed state {}", path.display()))
    }

    pub fn host(&self, name: &str) -> Option<&HostState> {
        self.hosts.iter().find(|h| h.name == name)
    }

    pub fn servers(&self) -> impl Iterator<Item = &HostState> {
        self.hosts.iter().filter(|h| h.role == Role::Server)
    }

    pub fn clients(&self) -> impl Iterator<Item = &HostState> {
        self.hosts.iter().filter(|h| h.role == Role::Client)
    }

    pub fn caches(&self) -> impl Iterator<Item = &HostState> {
        self.hosts.iter().filter(|h| h.role == Role::Cache)
    }

    /// The API's token, if it has one.
    pub fn api_token(&self) -> anyhow::Result<Option<String>> {
        let Some(path) = &self.api_token_file else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the API token {}", path.display()))?;
        Ok(Some(text.trim().to_string()))
    }
}
