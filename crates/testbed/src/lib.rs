//! Builds kvswitch test networks: each host is a network namespace joined to the switch by a
//! veth pair, servers run memcached, the first client runs nutcracker, and the kvswitch daemon
//! runs in the root namespace on the switch-side ends, with its local port into the root
//! namespace's own stack (where its TCP proxy listens on the VIP).
//!
//! Every name carries a prefix so several testbeds can coexist, and everything created is
//! recorded in a JSON state file before it exists, so [`down`] can undo a crashed [`up`]. This
//! crate never kills processes by name and never touches names without its prefix.
//!
//! [`local`] is the small version for tests that need no namespaces: memcached and nutcracker
//! on free loopback ports. [`history`] (the `kvswitch-history` crate, re-exported) checks
//! recorded histories of memcached operations for coherence, and [`history_load`] records them
//! with concurrent clients.

mod config;
pub mod differential;
mod down;
mod fabric;
pub mod history_load;
mod host;
pub mod local;
pub mod net;
mod netns;
mod probe;
pub mod process;
pub mod replies;
pub mod resp_differential;
mod state;
mod sweep;
mod topology;
mod up;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;

pub use config::{kvswitch_config, nutcracker_config};
pub use down::{down, down_prefix};
pub use history;
pub use netns::in_netns;
pub use probe::{
    http, http_get, memcached_stats, memcached_udp_version, memcached_version, stat_u64, wait_for,
};
pub use state::{FabricState, FabricSwitchState, HostState, NutcrackerState, ProcRecord, State};
pub use sweep::sweep;
pub use topology::{
    check_prefix, FabricLayout, Host, Mode, Role, Subnet, SwitchDef, SwitchRole, Topology,
    MAX_HOST_NAME, MAX_PREFIX, MEMCACHED_PORT, RESERVED_HOST_NAMES,
};
pub use up::{NUTCRACKER_PORT, NUTCRACKER_STATS_PORT};

/// Directory of the default state files.
pub const STATE_DIR: &str = "/run/kvswitch";

/// Where a testbed with `prefix` keeps its state unless told otherwise:
/// `/run/kvswitch/<prefix>-testbed.json`. Generated files go to `<prefix>-testbed.d/` beside it.
pub fn default_state_path(prefix: &str) -> PathBuf {
    Path::new(STATE_DIR).join(format!("{prefix}-testbed.json"))
}

/// Where `up` records the path of a state file it was told to write elsewhere than
/// [`default_state_path`], so that `down_prefix` finds the testbed by its prefix alone:
/// `/run/kvswitch/<prefix>-testbed.where`, holding the path as text.
pub fn pointer_path(prefix: &str) -> PathBuf {
    Path::new(STATE_DIR).join(format!("{prefix}-testbed.where"))
}

/// How to bring a testbed up.
#[derive(Clone, Debug)]
pub struct UpOptions {
    /// Prefix of every name (1 to 5 lowercase letters or digits). Default "kvs".
    pub prefix: String,
    /// The kvswitch binary; None builds the network and daemons but no switch.
    pub kvswitch_bin: Option<PathBuf>,
    /// State file; None means [`default_state_path`].
    pub state_path: Option<PathBuf>,
    /// kvswitch API address; None picks a free port on 127.0.0.1.
    pub api: Option<SocketAddr>,
    /// Run nutcracker on the first client. Default true.
    pub start_nutcracker: bool,
    /// Lines added verbatim to the generated kvswitch config's `[vip]` table, such as its
    /// `keyed_ports`.
    pub vip_config: Option<String>,
    /// Lines added verbatim to the generated kvswitch config's `[pool]` table, such as its
    /// failure handling (`auto_eject_hosts`, `server_failure_limit`, ...).
    pub pool_config: Option<String>,
    /// Lines added verbatim to the generated kvswitch config's `[switch]` table, such as its
    /// `tcp_idle_s`.
    pub switch_config: Option<String>,
    /// Appended verbatim to the generated kvswitch config.
    pub extra_config: Option<String>,
    /// kvswitch's `switch.datapath` (`"xdp"`, `"af_xdp"` or `"af_packet"`); None leaves it
    /// unset: XDP wherever it attaches.
    pub datapath: Option<String>,
    /// kvswitch's `switch.tcp` (`"splice"` or `"proxy"`); None leaves it unset: the splice.
    pub tcp: Option<String>,
    /// Give kvswitch a local port into the root namespace (`<prefix>-local`), through which TCP
    /// to the VIP reaches the host's stack. Default true. The root namespace then holds the
    /// VIP and a route to the subnet, so testbeds running side by side need distinct subnets
    /// (see [`Subnet::for_prefix`]); `up` refuses a subnet the root namespace already reaches.
    pub local_port: bool,
    /// Run kvswitch's TCP proxy behind the local port. Default true; false leaves the VIP's
    /// port in the root namespace to another program (a test's own listener, nutcracker).
    pub proxy: bool,
    /// What the servers run. Default memcached. With cache hosts in the topology the servers
    /// must run `kvswitch node`, which `up` makes SwitchKV backends of the cache nodes (each
    /// server of one, in turn); give both the same `--lease-ms`.
    pub servers: ServerProgram,
    /// Appended to the command line of every cache node (`kvswitch node --role cache`), such
    /// as `--lease-ms`, `--cache-items` and `--rule-rate`.
    pub cache_args: Vec<String>,
    /// The cache nodes install steering entries in kvswitch (SwitchKV). Default true; false
    /// leaves the switch alone, for clients that send to a cache node itself (look-through).
    pub steer_to_caches: bool,
}

/// The program every server host runs: on port 11211 (TCP and UDP), or Redis's 6379.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ServerProgram {
    /// memcached, with the topology's `memcached_args`.
    #[default]
    Memcached,
    /// `<bin> node --listen <host address>:11211 <args>`: kvswitch's own memcached-protocol
    /// server, e.g. with `--capacity` to stand in for a loaded server. Needs `l3` mode: it
    /// listens on one address, and in `l2` mode requests arrive for the VIP.
    Node { bin: PathBuf, args: Vec<String> },
    /// redis-server on port 6379 (TCP), without persistence: kvswitch's pool is then a Redis
    /// pool (`pool.redis = true`) on the VIP's port 6379, and nutcracker's too.
    Redis,
}

impl Default for UpOptions {
    fn default() -> Self {
        UpOptions {
            prefix: "kvs".to_string(),
            kvswitch_bin: None,
            state_path: None,
            api: None,
            start_nutcracker: true,
            vip_config: None,
            pool_config: None,
            switch_config: None,
            extra_config: None,
            datapath: None,
            tcp: None,
            local_port: true,
            proxy: true,
            servers: ServerProgram::Memcached,
            cache_args: Vec::new(),
            steer_to_caches: true,
        }
    }
}

/// Builds the testbed described by `topo`. Needs root. On failure everything built so far is
/// torn down and the error says which step failed (with the tail of the daemon's log when a
/// daemon did not become ready). Fails without touching anything if the state file or a
/// namespace or link with the prefix already exists.
pub fn up(topo: &Topology, opts: &UpOptions) -> anyhow::Result<Live> {
    let state = up::up(topo, opts)?;
    Ok(Live {
        state,
        kept: AtomicBool::new(false),
    })
}

/// A running testbed. Dropping it tears the testbed down unless [`Live::keep`] was called.
#[derive(Debug)]
pub struct Live {
    pub state: State,
    kept: AtomicBool,
}

impl Live {
    pub fn state_path(&self) -> &Path {
        &self.state.state_path
    }

    /// Stops kvswitch (SIGTERM to its recorded PID, SIGKILL past a grace of 2 s): it takes its
    /// local port and its XDP program with it.
    pub fn stop_kvswitch(&self) {
        if let Some(pid) = self.state.kvswitch_pid {
            process::stop_all(&[pid]);
        }
    }

    /// Joins the switch-side ends of every host's link with a Linux bridge named after the
    /// prefix (`<prefix>-br`, which `down` removes too), in kvswitch's place: stop kvswitch
    /// first. Returns the bridge's name.
    pub fn bridge_up(&self) -> anyhow::Result<String> {
        let name = format!("{}-br", self.state.prefix);
        let ip = |args: &[&str]| -> anyhow::Result<()> {
            let out = std::process::Command::new("ip").args(args).output()?;
            anyhow::ensure!(
                out.status.success(),
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
            Ok(())
        };
        ip(&["link", "add", &name, "type", "bridge"])?;
        let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6"), "1");
        for h in &self.state.hosts {
            ip(&["link", "set", "dev", &h.switch_if, "master", &name])?;
        }
        ip(&["link", "set", "dev", &name, "up"])?;
        Ok(name)
    }

    /// Removes a bridge [`Live::bridge_up`] made.
    pub fn bridge_down(&self, name: &str) {
        let _ = std::process::Command::new("ip")
            .args(["link", "del", name])
            .output();
    }

    pub fn host(&self, name: &str) -> Option<&HostState> {
        self.state.host(name)
    }

    pub fn servers(&self) -> Vec<&HostState> {
        self.state.servers().collect()
    }

    pub fn clients(&self) -> Vec<&HostState> {
        self.state.clients().collect()
    }

    /// kvswitch's API address (also when kvswitch was not started).
    pub fn api(&self) -> SocketAddr {
        self.state.api
    }

    /// `ip netns exec <prefix>-<host> program`; add arguments and run it as usual. An unknown
    /// host makes the command fail when run, naming the missing namespace.
    pub fn exec(&self, host: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let ns = self
            .host(host)
            .map(|h| h.netns.clone())
            .unwrap_or_else(|| format!("{}-{host}", self.state.prefix));
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec"]).arg(ns).arg(program);
        cmd
    }

    /// Runs `f` inside `host`'s namespace (see [`in_netns`]).
    pub fn in_host<T: Send>(&self, host: &str, f: impl FnOnce() -> T + Send) -> anyhow::Result<T> {
        let h = self.host(host).ok_or_else(|| {
            anyhow::anyhow!("no host {host:?} in testbed {:?}", self.state.prefix)
        })?;
        in_netns(&h.netns, f)
    }

    /// Kills the program serving on `host` (memcached or `kvswitch node` on a server, the
    /// cache node on a cache host) with SIGKILL, as a crash would, and waits until it is gone;
    /// the host's namespace and link stay. Only the PID `up` recorded for it is signalled, and
    /// only while it runs the recorded command line. Returns that PID. Fails for a client, or
    /// a host whose program is no longer running.
    pub fn kill_server(&self, host: &str) -> anyhow::Result<u32> {
        let record = self.program_of(host)?;
        process::kill(record.pid, &record.argv)
            .with_context(|| format!("killing {} on {host:?}", record.what))?;
        Ok(record.pid)
    }

    /// Stops the program serving on `host` with SIGSTOP (`stop`), as a process that hangs
    /// would, or lets it go on with SIGCONT. Same checks as [`Live::kill_server`].
    pub fn pause_server(&self, host: &str, stop: bool) -> anyhow::Result<u32> {
        let record = self.program_of(host)?;
        process::pause(record.pid, &record.argv, stop)
            .with_context(|| format!("signalling {} on {host:?}", record.what))?;
        Ok(record.pid)
    }

    /// The API of fabric switch `name` (a testbed with `[[switches]]`).
    pub fn switch_api(&self, name: &str) -> Option<SocketAddr> {
        fabric::switch_api(&self.state, name)
    }

    /// Kills fabric switch `name` with SIGKILL, as a crash would, and waits until it is gone;
    /// its links stay (the neighbours see it fall silent). Only the PID `up` recorded is
    /// signalled, and only while it runs the recorded command line.
    pub fn kill_switch(&self, name: &str) -> anyhow::Result<u32> {
        let s = self
            .state
            .fabric
            .as_ref()
            .and_then(|f| f.switches.iter().find(|s| s.name == name))
            .ok_or_else(|| {
                anyhow::anyhow!("no fabric switch {name:?} in {:?}", self.state.prefix)
            })?;
        let pid = s
            .pid
            .ok_or_else(|| anyhow::anyhow!("fabric switch {name:?} was not started"))?;
        let record = self
            .state
            .procs
            .iter()
            .find(|p| p.pid == pid)
            .ok_or_else(|| anyhow::anyhow!("no process recorded for switch {name:?}"))?;
        process::kill(pid, &record.argv).with_context(|| format!("killing switch {name:?}"))?;
        Ok(pid)
    }

    /// The live program `up` (or a restart) started on server or cache host `host`.
    fn program_of(&self, host: &str) -> anyhow::Result<state::ProcRecord> {
        let h = self
            .host(host)
            .filter(|h| matches!(h.role, Role::Server | Role::Cache))
            .ok_or_else(|| {
                anyhow::anyhow!("no server {host:?} in testbed {:?}", self.state.prefix)
            })?;
        self.state
            .procs
            .iter()
            .rev()
            .find(|p| p.netns.as_deref() == Some(h.netns.as_str()) && h.pids.contains(&p.pid))
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("no process recorded on server {host:?}"))
    }

    /// Starts the program of server `host` again, after [`Live::kill_server`]: the command
    /// line recorded for it, in its namespace, logging where it did. The new process is
    /// recorded, so teardown stops it. Returns its PID.
    pub fn restart_server(&mut self, host: &str) -> anyhow::Result<u32> {
        let i = self
            .state
            .hosts
            .iter()
            .position(|h| h.name == host && matches!(h.role, Role::Server | Role::Cache))
            .ok_or_else(|| {
                anyhow::anyhow!("no server {host:?} in testbed {:?}", self.state.prefix)
            })?;
        let h = self.state.hosts[i].clone();
        let record = self
            .state
            .procs
            .iter()
            .rev()
            .find(|p| p.netns.as_deref() == Some(h.netns.as_str()) && h.pids.contains(&p.pid))
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("no process recorded on server {host:?}"))?;
        if process::alive(record.pid) && process::runs(record.pid, &record.argv) {
            anyhow::bail!(
                "{} on {host:?} still runs (pid {})",
                record.what,
                record.pid
            );
        }
        let log = h
            .log
            .clone()
            .ok_or_else(|| anyhow::anyhow!("no log recorded for server {host:?}"))?;
        let child = process::spawn(Some(&h.netns), &record.argv, &log)?;
        let pid = child.id();
        self.state.procs.push(state::ProcRecord {
            pid,
            what: record.what.clone(),
            netns: record.netns.clone(),
            argv: record.argv.clone(),
        });
        self.state.hosts[i].pids.push(pid);
        self.state.save()?;
        Ok(pid)
    }

    /// Leaves the testbed running when this value is dropped; `down(state_path)` removes it
    /// later.
    pub fn keep(&self) {
        self.kept.store(true, Ordering::Relaxed);
    }

    /// Tears the testbed down now and reports failures (which `Drop` can only log).
    pub fn down(self) -> anyhow::Result<()> {
        self.keep();
        down(self.state_path())
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        if !self.kept.load(Ordering::Relaxed) {
            if let Err(e) = down(self.state_path()) {
                tracing::warn!("tearing down testbed {:?}: {e:#}", self.state.prefix);
            }
        }
    }
}
