//! What the testbed scenarios share: the systems measured, the testbed each one needs, and
//! running `kvswitch load` inside a client's namespace against one of them.
//!
//! Every testbed is built with the run's own prefix and torn down when its [`Bed`] is dropped,
//! also on error; processes are stopped by PID from the testbed's state file.

use std::fmt;
use std::net::{SocketAddr, SocketAddrV4};
use std::path::PathBuf;

use anyhow::{bail, Context};
use serde::Serialize;

use crate::measure::cpu_ticks;

/// Times a preload is tried before a scenario gives up on its testbed.
const PRELOAD_ATTEMPTS: u32 = 5;

/// How a scenario runs kvswitch's cache.
#[derive(Clone, Copy, Debug)]
pub struct CacheSetup {
    /// Keys cached at most.
    pub items: u64,
    /// Rule installs and removals a second (none: unlimited).
    pub rule_rate: Option<u64>,
    /// Admit every key read (a cache warmed with the whole keyspace, for what serving from
    /// the cache costs), rather than only the keys hot-key detection finds.
    pub every_read: bool,
    /// How long a value is served before it is fetched again, in milliseconds.
    pub lease_ms: u64,
    /// Hot keys each backend's tracker reports per segment (none: the cache's default, 5).
    pub top_k: Option<u64>,
}

/// Hot keys reported per segment across all backends in SwitchKV's experiments: 5 from each
/// of 128 backends. The scenarios with fewer backends keep this rate, not the per-backend 5.
pub const PAPER_REPORTS_PER_SEGMENT: u64 = 5 * 128;

impl CacheSetup {
    /// A cache that holds every one of `keys` keys once read, for as long as a scenario runs.
    pub fn whole_keyspace(keys: u64) -> CacheSetup {
        CacheSetup {
            items: keys,
            rule_rate: None,
            every_read: true,
            lease_ms: 600_000,
            top_k: None,
        }
    }

    /// SwitchKV's setting: `items` keys chosen by hot-key detection over `backends` backends,
    /// under a rule budget, with as many hot keys reported per segment as the paper's cluster.
    pub fn hot_keys(items: u64, rule_rate: Option<u64>, backends: u32) -> CacheSetup {
        CacheSetup {
            items,
            rule_rate,
            every_read: false,
            lease_ms: 10_000,
            top_k: Some(PAPER_REPORTS_PER_SEGMENT.div_ceil(u64::from(backends.max(1)))),
        }
    }
}

/// How a scenario runs SwitchKV: a cache node beside kvswitch, the backends reporting to it,
/// kvswitch steering reads of its keys to it.
#[derive(Clone, Copy, Debug)]
pub struct SwitchKvSetup {
    /// Keys the cache node holds at most.
    pub items: u64,
    /// Rule installs and removals a second (none: unlimited).
    pub rule_rate: Option<u64>,
    /// The backends' lease, in milliseconds.
    pub lease_ms: u64,
    /// Hot keys each backend reports per segment.
    pub top_k: u64,
    /// How clients reach the cache node. Unless steered, it programs no steering, and its
    /// replies keep its own address.
    pub path: CachePath,
    /// The backends' hot-key reports.
    pub reports: Reports,
    /// Whether the cache node's rule removals wait behind additions (SwitchKV's rule buffer,
    /// up to 2 s) or go first.
    pub rule_buffer: bool,
}

/// Which hot-key reports SwitchKV's backends send (its Figures 15 to 17).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reports {
    /// Periodic and instant reports (SwitchKV's complete updates).
    Complete,
    PeriodicOnly,
    InstantOnly,
    /// Every key read reported at once (the traditional update of SwitchKV's Figure 15).
    EveryRead,
}

/// How clients reach a SwitchKV cache node (SwitchKV's Table 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CachePath {
    /// kvswitch steers reads of its keys to it.
    Steered,
    /// Clients send it every request (on-path look-through).
    LookThrough,
    /// Clients ask it first, the backend on a miss (look-aside).
    LookAside,
}

impl SwitchKvSetup {
    /// SwitchKV's setting, as [`CacheSetup::hot_keys`] gives kvswitch's own cache: `items`
    /// keys, a rule budget, as many hot keys reported per segment as the paper's cluster.
    pub fn paper(items: u64, rule_rate: Option<u64>, backends: u32) -> SwitchKvSetup {
        SwitchKvSetup {
            items,
            rule_rate,
            lease_ms: 2000,
            top_k: PAPER_REPORTS_PER_SEGMENT.div_ceil(u64::from(backends.max(1))),
            path: CachePath::Steered,
            reports: Reports::Complete,
            rule_buffer: true,
        }
    }

    /// The same cache node reached another way.
    pub fn reached(self, path: CachePath) -> SwitchKvSetup {
        SwitchKvSetup { path, ..self }
    }

    /// The setting `setup` needs of a scenario's cache node, if any.
    pub fn of(setup: Setup, items: u64, rule_rate: Option<u64>, backends: u32) -> Option<Self> {
        let paper = SwitchKvSetup::paper(items, rule_rate, backends);
        match setup {
            Setup::SwitchKv => Some(paper),
            Setup::LookThrough => Some(paper.reached(CachePath::LookThrough)),
            Setup::LookAside => Some(paper.reached(CachePath::LookAside)),
            _ => None,
        }
    }
}

/// The `[cache]` section of a kvswitch configuration for `setup`; it turns the cache on for
/// the UDP path and the built-in proxy alike.
pub fn cache_section(setup: &CacheSetup) -> String {
    let mut s = format!(
        "[cache]\nitems = {}\nlease_ms = {}\nadmit = \"{}\"\n",
        setup.items.max(1),
        setup.lease_ms,
        if setup.every_read { "every" } else { "hot" }
    );
    if let Some(rate) = setup.rule_rate {
        s.push_str(&format!("rule_rate = {rate}\n"));
    }
    if let Some(k) = setup.top_k {
        // The tracker must count at least as many keys as it reports.
        s.push_str(&format!(
            "top_k = {k}\ntracked_keys = {}\n",
            (k * 4).max(1024)
        ));
    }
    s
}

/// One way for a client to reach the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum System {
    /// UDP to the first memcached's own address (it holds every key), switched at layer 2.
    DirectUdp,
    /// TCP to the first memcached's own address.
    DirectTcp,
    /// TCP to nutcracker in the client's namespace, over every server.
    Nutcracker,
    /// UDP to the VIP: kvswitch routes each request by key (switch mode).
    KvswitchUdp,
    /// TCP to the VIP on kvswitch's splice (`switch.tcp = "splice"`, the default).
    KvswitchTcp,
    /// TCP to the VIP on the proxy's path (`switch.tcp = "proxy"`): the built-in proxy behind
    /// the local port.
    KvswitchTcpProxy,
    /// UDP to the VIP with kvswitch's cache on.
    KvswitchCacheUdp,
    /// TCP to the VIP with kvswitch's cache on.
    KvswitchCacheTcp,
    /// UDP to the VIP with SwitchKV: kvswitch steers reads of the cache node's keys to it.
    #[serde(rename = "switchkv_udp")]
    SwitchKvUdp,
    /// SwitchKV's own clients: each query a raw frame with its key's hash in the destination
    /// MAC and its backend's address as the destination (`kvswitch load --switchkv`).
    #[serde(rename = "switchkv_encoded_udp")]
    SwitchKvEncodedUdp,
    /// UDP to the SwitchKV cache node itself, which answers what it holds and sends the rest
    /// to the backends (SwitchKV's on-path look-through architecture).
    LookThroughUdp,
    /// UDP gets to the SwitchKV cache node first and, on a miss, to the VIP; sets to the VIP
    /// (SwitchKV's look-aside architecture).
    LookAsideUdp,
}

/// The systems of `wanted` (slugs) among `all`, in `all`'s order; every one when `wanted` is
/// empty. An unknown slug is an error that lists the known ones.
pub fn pick(all: &[System], wanted: &[String]) -> anyhow::Result<Vec<System>> {
    if wanted.is_empty() {
        return Ok(all.to_vec());
    }
    for w in wanted {
        if !all.iter().any(|s| s.slug() == w) {
            let known: Vec<&str> = all.iter().map(|s| s.slug()).collect();
            bail!(
                "--systems: no system {w:?} here (known: {})",
                known.join(", ")
            );
        }
    }
    Ok(all
        .iter()
        .copied()
        .filter(|s| wanted.iter().any(|w| w == s.slug()))
        .collect())
}

/// The kvswitch deployment a system needs: each is measured on a testbed of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setup {
    /// kvswitch without a cache.
    Plain,
    /// kvswitch with its own cache.
    Cache,
    /// kvswitch without a cache, TCP to the VIP on the proxy's path.
    TcpProxy,
    /// kvswitch without a cache, steering to a SwitchKV cache node.
    SwitchKv,
    /// kvswitch without a cache, and a cache node the clients send every request to.
    LookThrough,
    /// kvswitch without a cache, and a cache node the clients ask first.
    LookAside,
}

impl System {
    /// The systems a latency comparison measures, in table order.
    pub fn compared() -> Vec<System> {
        vec![
            System::DirectUdp,
            System::DirectTcp,
            System::Nutcracker,
            System::KvswitchUdp,
            System::KvswitchTcp,
            System::KvswitchTcpProxy,
            System::KvswitchCacheUdp,
            System::KvswitchCacheTcp,
        ]
    }

    /// The systems in front of capacity-limited backends: switch mode without a cache, with
    /// kvswitch's cache, and with SwitchKV's cache node.
    pub fn switched() -> Vec<System> {
        vec![
            System::KvswitchUdp,
            System::KvswitchCacheUdp,
            System::SwitchKvUdp,
            System::SwitchKvEncodedUdp,
            System::LookThroughUdp,
            System::LookAsideUdp,
        ]
    }

    pub fn proto(self) -> loadgen::Proto {
        match self {
            System::DirectUdp
            | System::KvswitchUdp
            | System::KvswitchCacheUdp
            | System::SwitchKvUdp
            | System::SwitchKvEncodedUdp
            | System::LookThroughUdp
            | System::LookAsideUdp => loadgen::Proto::Udp,
            _ => loadgen::Proto::Tcp,
        }
    }

    /// Whether kvswitch runs with its cache for this system.
    pub fn cached(self) -> bool {
        matches!(self, System::KvswitchCacheUdp | System::KvswitchCacheTcp)
    }

    /// Whether a cache learns the hot keys while the load runs (kvswitch's or SwitchKV's).
    pub fn caches(self) -> bool {
        self.cached()
            || matches!(
                self.setup(),
                Setup::SwitchKv | Setup::LookThrough | Setup::LookAside
            )
    }

    /// The deployment it runs on.
    pub fn setup(self) -> Setup {
        match self {
            System::SwitchKvUdp | System::SwitchKvEncodedUdp => Setup::SwitchKv,
            System::LookThroughUdp => Setup::LookThrough,
            System::LookAsideUdp => Setup::LookAside,
            System::KvswitchTcpProxy => Setup::TcpProxy,
            s if s.cached() => Setup::Cache,
            _ => Setup::Plain,
        }
    }

    /// A short name for files and JSON.
    pub fn slug(self) -> &'static str {
        match self {
            System::DirectUdp => "direct_udp",
            System::DirectTcp => "direct_tcp",
            System::Nutcracker => "nutcracker",
            System::KvswitchUdp => "kvswitch_udp",
            System::KvswitchTcp => "kvswitch_tcp",
            System::KvswitchTcpProxy => "kvswitch_tcp_proxy",
            System::KvswitchCacheUdp => "kvswitch_cache_udp",
            System::KvswitchCacheTcp => "kvswitch_cache_tcp",
            System::SwitchKvUdp => "switchkv_udp",
            System::SwitchKvEncodedUdp => "switchkv_encoded_udp",
            System::LookThroughUdp => "look_through_udp",
            System::LookAsideUdp => "look_aside_udp",
        }
    }

    /// Its colour in every plot, so a system looks the same across figures.
    pub fn color(self) -> usize {
        match self {
            System::DirectUdp => 6,
            System::DirectTcp => 5,
            System::Nutcracker => 1,
            System::KvswitchUdp => 0,
            System::KvswitchTcp => 2,
            // SwitchKvUdp's, which never runs beside it.
            System::KvswitchTcpProxy => 7,
            System::KvswitchCacheUdp => 3,
            System::KvswitchCacheTcp => 4,
            System::SwitchKvUdp => 7,
            // KvswitchTcp's, which never runs beside it.
            System::SwitchKvEncodedUdp => 2,
            // DirectTcp's, which never runs beside it.
            System::LookThroughUdp => 5,
            // Nutcracker's, which never runs beside it.
            System::LookAsideUdp => 1,
        }
    }
}

impl fmt::Display for System {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            System::DirectUdp => "memcached direct (UDP)",
            System::DirectTcp => "memcached direct (TCP)",
            System::Nutcracker => "nutcracker (TCP)",
            System::KvswitchUdp => "kvswitch switch (UDP)",
            System::KvswitchTcp => "kvswitch splice (TCP)",
            System::KvswitchTcpProxy => "kvswitch proxy path (TCP)",
            System::KvswitchCacheUdp => "kvswitch + cache (UDP)",
            System::KvswitchCacheTcp => "kvswitch + cache (TCP)",
            System::SwitchKvUdp => "SwitchKV cache node (UDP)",
            System::SwitchKvEncodedUdp => "SwitchKV, client-encoded (UDP)",
            System::LookThroughUdp => "look-through cache node (UDP)",
            System::LookAsideUdp => "look-aside cache node (UDP)",
        })
    }
}

/// `systems` split by the kvswitch deployment they need, each group measured on a testbed of
/// its own: those without a cache, those with kvswitch's, then SwitchKV, look-through and
/// look-aside.
pub fn by_setup(systems: &[System]) -> Vec<(Setup, Vec<System>)> {
    [
        Setup::Plain,
        Setup::Cache,
        Setup::TcpProxy,
        Setup::SwitchKv,
        Setup::LookThrough,
        Setup::LookAside,
    ]
    .into_iter()
    .map(|setup| {
        let group: Vec<System> = systems
            .iter()
            .copied()
            .filter(|s| s.setup() == setup)
            .collect();
        (setup, group)
    })
    .filter(|(_, group)| !group.is_empty())
    .collect()
}

/// The servers of a testbed.
#[derive(Clone, Debug)]
pub enum Servers {
    /// `n` memcached in `l2` mode, so that a client reaches a server's own address over UDP
    /// through the switch as well as the VIP; the peers' testbed.
    Memcached { n: usize },
    /// `n` kvswitch nodes, each serving at most `capacity` requests a second, in `l3` mode.
    Nodes { n: usize, capacity: u64 },
}

/// The token bucket of a node of `capacity` requests a second: 50 ms of requests, so that the
/// bursts of Poisson arrivals below the capacity are served rather than dropped.
pub fn node_burst(capacity: u64) -> u64 {
    (capacity / 20).max(1)
}

/// How to build a testbed.
#[derive(Clone, Debug)]
pub struct BedSpec {
    pub prefix: String,
    pub servers: Servers,
    /// The kvswitch cache. None: no cache.
    pub cache: Option<CacheSetup>,
    /// SwitchKV: a cache host beside kvswitch, the servers its backends (steered to, or on
    /// the path of every request). Needs [`Servers::Nodes`].
    pub switchkv: Option<SwitchKvSetup>,
    pub nutcracker: bool,
    /// kvswitch's `switch.datapath`; None: unset (XDP wherever it attaches).
    pub datapath: Option<&'static str>,
    /// kvswitch's `switch.tcp`; None: unset (the splice).
    pub tcp: Option<&'static str>,
}

impl BedSpec {
    /// One client and one memcached server joined by kvswitch over AF_PACKET, with nothing
    /// else: the testbed of the scenarios whose agents run on the switch's CPU path.
    pub fn one_server(prefix: &str) -> BedSpec {
        BedSpec {
            prefix: prefix.to_string(),
            servers: Servers::Memcached { n: 1 },
            cache: None,
            switchkv: None,
            nutcracker: false,
            datapath: Some("af_packet"),
            tcp: None,
        }
    }
}

/// Servers on the peers' testbed, where memcached direct, nutcracker and kvswitch are measured
/// side by side.
pub const PEERS: usize = 3;

/// memcached's memory on the peers' testbed, in MiB: the first server holds every key of the
/// direct runs, values up to 11 KB included.
const MEMCACHED_MB: &str = "1024";

/// A running testbed and where each system is reached; torn down when dropped.
pub struct Bed {
    pub live: testbed::Live,
    /// The client namespace the load comes from.
    pub client: String,
    pub vip: SocketAddr,
    /// Each server's own address (its name on the ring in `server_names`).
    pub servers: Vec<SocketAddr>,
    pub server_names: Vec<String>,
    pub nutcracker: Option<SocketAddr>,
    pub kvswitch_pid: u32,
    pub nutcracker_pid: Option<u32>,
    pub spec: BedSpec,
}

impl Bed {
    /// Builds the testbed: 1 client, the servers, kvswitch (with its proxy) and nutcracker when
    /// asked, on the prefix's own subnet. Sweeps leftovers of the prefix from a run that was
    /// killed first.
    pub fn up(spec: &BedSpec) -> anyhow::Result<Bed> {
        testbed::check_prefix(&spec.prefix)?;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            bail!("the testbed scenarios build network namespaces: run as root");
        }
        let exe = std::env::current_exe().context("finding kvswitch itself")?;
        let (n, mode, program) = match spec.servers {
            Servers::Memcached { n } => (n, testbed::Mode::L2, testbed::ServerProgram::Memcached),
            Servers::Nodes { n, capacity } => {
                let mut args: Vec<String> = vec![
                    "--capacity".into(),
                    capacity.to_string(),
                    "--burst".into(),
                    node_burst(capacity).to_string(),
                    "--threads".into(),
                    "1".into(),
                ];
                if let Some(k) = &spec.switchkv {
                    args.extend(switchkv_args(k, false));
                }
                let program = testbed::ServerProgram::Node {
                    bin: exe.clone(),
                    args,
                };
                (n, testbed::Mode::L3, program)
            }
        };
        if spec.switchkv.is_some() && !matches!(spec.servers, Servers::Nodes { .. }) {
            bail!("SwitchKV's backends are kvswitch nodes");
        }
        let mut text = format!("name = \"bench\"\nmode = \"{}\"\n", mode.as_str());
        text.push_str("[[hosts]]\nname = \"c1\"\nrole = \"client\"\n");
        if spec.switchkv.is_some() {
            text.push_str("[[hosts]]\nname = \"k1\"\nrole = \"cache\"\n");
        }
        for i in 1..=n {
            text.push_str(&format!(
                "[[hosts]]\nname = \"s{i}\"\nrole = \"server\"\nmemcached_args = [\"-m\", \
                 \"{MEMCACHED_MB}\"]\n"
            ));
        }
        let topo = testbed::Topology::parse(&text, "bench topology")?
            .on_subnet(testbed::Subnet::for_prefix(&spec.prefix))?;
        let state_path = testbed::default_state_path(&spec.prefix);
        // A run that was killed leaves its state file and names behind.
        testbed::down(&state_path).context("removing a testbed left by an earlier run")?;
        testbed::sweep(&spec.prefix)?;
        let opts = testbed::UpOptions {
            prefix: spec.prefix.clone(),
            kvswitch_bin: Some(exe),
            state_path: Some(state_path),
            start_nutcracker: spec.nutcracker,
            extra_config: spec.cache.as_ref().map(cache_section),
            datapath: spec.datapath.map(str::to_string),
            tcp: spec.tcp.map(str::to_string),
            servers: program,
            cache_args: spec
                .switchkv
                .as_ref()
                .map(|k| switchkv_args(k, true))
                .unwrap_or_default(),
            steer_to_caches: spec.switchkv.is_none_or(|k| k.path == CachePath::Steered),
            ..Default::default()
        };
        let live = testbed::up(&topo, &opts)?;
        let state = &live.state;
        let client = live
            .clients()
            .first()
            .map(|h| h.name.clone())
            .context("the bench topology has no client")?;
        let servers = live
            .servers()
            .iter()
            .map(|h| SocketAddr::V4(SocketAddrV4::new(h.ip, testbed::MEMCACHED_PORT)))
            .collect();
        let server_names = live.servers().iter().map(|h| h.name.clone()).collect();
        let vip = SocketAddr::V4(SocketAddrV4::new(state.vip, testbed::MEMCACHED_PORT));
        let nutcracker = state.nutcracker.as_ref().map(|n| n.listen);
        let nutcracker_pid = state.nutcracker.as_ref().and_then(|n| n.pid);
        let kvswitch_pid = state.kvswitch_pid.context("kvswitch did not start")?;
        Ok(Bed {
            client,
            vip,
            servers,
            server_names,
            nutcracker,
            kvswitch_pid,
            nutcracker_pid,
            spec: spec.clone(),
            live,
        })
    }

    /// Where `system` is reached from the client.
    pub fn target(&self, system: System) -> anyhow::Result<SocketAddr> {
        match system {
            System::DirectUdp | System::DirectTcp => {
                if !matches!(self.spec.servers, Servers::Memcached { .. }) {
                    bail!("{system} runs on the memcached testbed only");
                }
                Ok(self.servers[0])
            }
            System::Nutcracker => self.nutcracker.context("this testbed runs no nutcracker"),
            System::KvswitchUdp | System::KvswitchTcp => Ok(self.vip),
            System::KvswitchTcpProxy => {
                if self.spec.tcp != Some("proxy") {
                    bail!("{system} needs a testbed with switch.tcp = \"proxy\"");
                }
                Ok(self.vip)
            }
            System::KvswitchCacheUdp | System::KvswitchCacheTcp => {
                if self.spec.cache.is_none() {
                    bail!("{system} needs a testbed with kvswitch's cache");
                }
                Ok(self.vip)
            }
            System::SwitchKvUdp | System::SwitchKvEncodedUdp => {
                if self.spec.switchkv.is_none() {
                    bail!("{system} needs a testbed with a SwitchKV cache node");
                }
                Ok(self.vip)
            }
            System::LookThroughUdp => self.cache_node(system),
            // The cache node is asked first (see [`Bed::load`]).
            System::LookAsideUdp => {
                self.cache_node(system)?;
                Ok(self.vip)
            }
        }
    }

    /// The address of the testbed's (first) cache node, for `system`.
    fn cache_node(&self, system: System) -> anyhow::Result<SocketAddr> {
        let cache = self
            .live
            .state
            .caches()
            .next()
            .with_context(|| format!("{system} needs a testbed with a SwitchKV cache node"))?;
        Ok(SocketAddr::V4(SocketAddrV4::new(
            cache.ip,
            testbed::MEMCACHED_PORT,
        )))
    }

    /// Sets `keys` keys `prefix<i>` of `value_size` bytes through kvswitch's proxy (placed by
    /// ketama, as switch mode and nutcracker place them) and, on the memcached testbed, on the
    /// first server too for the direct runs.
    pub fn preload(&self, keys: u64, prefix: &str, value_size: usize) -> anyhow::Result<()> {
        let mut targets = vec![self.vip];
        if matches!(self.spec.servers, Servers::Memcached { .. }) {
            targets.push(self.servers[0]);
        }
        for target in targets {
            // Just after the testbed comes up, the proxy's first connections to the servers
            // may still wait on ARP or a retransmitted SYN and fail their first requests: sets
            // are idempotent, so the preload is tried again for a few seconds.
            let mut stored = 0;
            for attempt in 0..PRELOAD_ATTEMPTS {
                if attempt > 0 {
                    eprintln!("  only {stored} of {keys} keys stored through {target}; again");
                    std::thread::sleep(std::time::Duration::from_secs(1));
                }
                let p = prefix.to_string();
                stored = self.live.in_host(&self.client, move || {
                    loadgen::preload(target, loadgen::Proto::Tcp, keys, &p, value_size)
                })??;
                if stored == keys {
                    break;
                }
            }
            if stored != keys {
                bail!("only {stored} of {keys} keys were stored through {target}");
            }
        }
        Ok(())
    }

    /// Runs `args` (its target replaced by `system`'s) in the client's namespace, with the CPU
    /// time kvswitch and nutcracker used meanwhile.
    pub fn load(&self, system: System, args: &loadgen::LoadArgs) -> anyhow::Result<Measured> {
        let look_aside = match system {
            System::LookAsideUdp => Some(self.cache_node(system)?.to_string()),
            _ => None,
        };
        // SwitchKV's clients place keys as the switch's pool does.
        let switchkv =
            (system == System::SwitchKvEncodedUdp).then(|| self.live.state.config_path.clone());
        let args = loadgen::LoadArgs {
            target: self.target(system)?.to_string(),
            look_aside,
            switchkv,
            proto: system.proto(),
            quiet: true,
            json: None,
            ..args.clone()
        };
        let kv_before = cpu_ticks(self.kvswitch_pid);
        let nc_before = self.nutcracker_pid.and_then(cpu_ticks);
        let report = self
            .live
            .in_host(&self.client, move || loadgen::run(&args))?
            .with_context(|| format!("kvswitch load against {system}"))?;
        if report.errors + report.timeouts > 0 {
            // An overloaded system leaves queues behind (socket buffers, a proxy's backlog):
            // let them drain before the next system is measured.
            std::thread::sleep(SETTLE);
        }
        let ticks = |pid: Option<u32>, before: Option<u64>| -> Option<f64> {
            let after = cpu_ticks(pid?)?;
            Some(after.saturating_sub(before?) as f64 / crate::measure::clock_ticks())
        };
        Ok(Measured {
            kvswitch_cpu_s: ticks(Some(self.kvswitch_pid), kv_before),
            nutcracker_cpu_s: ticks(self.nutcracker_pid, nc_before),
            report,
        })
    }

    /// Requests each server has been sent so far, in server order: on `kvswitch node`
    /// servers, what each took (served and dropped over capacity, from its `stats`), which
    /// also counts what reaches them other than through kvswitch's routing (a SwitchKV cache
    /// node's misses); on memcached, what kvswitch routed to each (its metrics).
    pub fn backend_requests(&self) -> anyhow::Result<Vec<u64>> {
        if matches!(self.spec.servers, Servers::Nodes { .. }) {
            let servers = self.servers.clone();
            return self.live.in_host(&self.client, move || {
                servers.iter().map(|&s| node_requests(s)).collect()
            })?;
        }
        let (code, body) = testbed::http_get(self.live.api(), "/metrics")?;
        if code != 200 {
            bail!("kvswitch's /metrics answered {code}");
        }
        self.server_names
            .iter()
            .map(|name| {
                let head = format!("kvswitch_backend_requests_total{{backend=\"{name}\"}} ");
                body.lines()
                    .find_map(|l| l.strip_prefix(head.as_str()))
                    .and_then(|v| v.trim().parse().ok())
                    .with_context(|| format!("no request count for server {name} in /metrics"))
            })
            .collect()
    }

    /// Stops everything and removes the testbed, reporting what could not be removed.
    pub fn down(self) -> anyhow::Result<()> {
        self.live.down()
    }
}

/// Requests a `kvswitch node` at `addr` has taken: `requests` and `capacity_drops` of its
/// `stats`, asked over TCP.
fn node_requests(addr: SocketAddr) -> anyhow::Result<u64> {
    let stats = testbed::memcached_stats(addr)?;
    let stat = |name| testbed::stat_u64(&stats, name, addr);
    Ok(stat("requests")? + stat("capacity_drops")?)
}

/// The arguments of a SwitchKV backend (`cache_node` false) or cache node for `setup`.
fn switchkv_args(setup: &SwitchKvSetup, cache_node: bool) -> Vec<String> {
    let mut args = vec![
        "--lease-ms".to_string(),
        setup.lease_ms.to_string(),
        "--top-k".to_string(),
        setup.top_k.to_string(),
    ];
    match (cache_node, setup.path) {
        (true, CachePath::LookThrough) => args.push("--look-through".to_string()),
        (true, CachePath::LookAside) => args.push("--look-aside".to_string()),
        _ => {}
    }
    match (cache_node, setup.reports) {
        (false, Reports::PeriodicOnly) => args.extend(["--reports".into(), "periodic".into()]),
        (false, Reports::InstantOnly) => args.extend(["--reports".into(), "instant".into()]),
        (false, Reports::EveryRead) => args.extend(["--reports".into(), "every".into()]),
        _ => {}
    }
    if cache_node && !setup.rule_buffer {
        args.extend(["--rule-buffer-ms".to_string(), "0".to_string()]);
    }
    if cache_node {
        args.extend([
            "--cache-items".to_string(),
            setup.items.max(1).to_string(),
            "--rule-rate".to_string(),
            setup.rule_rate.unwrap_or(0).to_string(),
        ]);
    }
    args
}

/// The pause after a run that lost requests.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(1);

/// One load run and the middle boxes' CPU time over it.
pub struct Measured {
    pub report: loadgen::Report,
    /// Seconds of CPU (user + system) kvswitch and nutcracker used during the run.
    pub kvswitch_cpu_s: Option<f64>,
    pub nutcracker_cpu_s: Option<f64>,
}

/// The path of the results folder: `--out`, else `results/<scenario>`; for `bench all`, a
/// folder per scenario under `--out`.
pub fn out_dir(out: Option<&PathBuf>, scenario: &str) -> PathBuf {
    out.cloned()
        .unwrap_or_else(|| PathBuf::from("results").join(scenario))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_name_each_system_as_systems_does() {
        for system in System::compared().into_iter().chain(System::switched()) {
            assert_eq!(
                serde_json::to_value(system).unwrap(),
                serde_json::Value::from(system.slug())
            );
        }
    }
}
