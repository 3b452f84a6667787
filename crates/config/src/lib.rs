//! The daemon's configuration file (TOML): ports, the virtual IP, the backend pool and the
//! rewrite mode. Every error names the file, the key and what is wrong.
//!
//! The proxy's files live beside it: [`proxy`] (kvswitch's proxy TOML) and [`nutcracker`]
//! (nutcracker's YAML). The `[pool]` keys all three share are checked in one place, so a
//! value means the same and fails the same way in every file.

pub mod api;
pub mod cache;
pub mod controller;
pub mod fabric;
pub mod nutcracker;
pub(crate) mod pool_keys;
pub mod proxy;
mod read;
pub mod scenario;

pub use read::{read_file, secret_line, MAX_FILE_BYTES};

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::time::Duration;

use kv::{Distribution, HashFn};
use serde::Deserialize;
use wire::ethernet::Mac;

use pool_keys::{PoolKeys, RawPool};
use switch::pool::{PoolSpec, ServerSpec};
use switch::source::Prefix;

/// How a routed request is rewritten on its way to the backend: `l3` rewrites destination
/// MAC and IP (and replies' source back to the VIP), `l2` the destination MAC only (the
/// servers own the VIP on their loopback).
pub use switch::Mode;

/// Where a switch's CPU channel listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CpuSocket {
    /// `/run/kvswitch/cpu-<pid>.sock`; none when the switch cannot listen there.
    Default,
    /// No channel: agents use the API.
    Off,
    At(PathBuf),
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub path: PathBuf,
    pub ports: Vec<String>,
    pub mode: Mode,
    pub api: SocketAddr,
    /// `switch.api_token_file`: the file whose first line is the token changes through the
    /// API need (relative to the configuration file's directory).
    pub api_token_file: Option<PathBuf>,
    /// How the API bounds its clients (`switch.api_max_connections`,
    /// `switch.api_header_timeout_ms`, `switch.api_hosts`).
    pub api_serving: api::ApiServing,
    /// After a frame, how long the run loop keeps polling the ports before it sleeps.
    pub busy_poll: std::time::Duration,
    /// `switch.cpu_socket`: where the CPU channel listens for agents.
    pub cpu_socket: CpuSocket,
    /// `switch.datapath`: what carries frames between the ports and the switch.
    pub datapath: Datapath,
    /// How often the cache nodes that `kv_steer` entries lead to are probed (a TCP connection
    /// to their memcached port, through the local port); `None`: not probed.
    pub steer_check: Option<Duration>,
    /// Probes a cache node fails in a row before its steering entries are removed.
    pub steer_check_failures: u32,
    /// `[switch.egress.PORT]`: ports whose frames leave through a queue at a rate, as
    /// (position in `ports`, bits per second, queue depth in bytes).
    pub egress: Vec<(usize, u64, u64)>,
    /// Most stations the MAC table holds.
    pub mac_table_size: usize,
    /// A station not heard from for this long is forgotten.
    pub mac_age: std::time::Duration,
    /// The local port into the host's own network stack; `None` when turned off.
    pub local: Option<LocalPort>,
    /// Run the built-in TCP proxy on the VIP's port behind the local port (`false`: leave that
    /// port to another program on the host). Only meaningful with a local port.
    pub proxy: bool,
    /// Worker threads of the built-in proxy.
    pub proxy_workers: usize,
    /// How TCP to the VIP's memcached port is carried (`switch.tcp`).
    pub tcp: TcpPath,
    /// Most TCP connections the splice holds at once (`switch.tcp_max_flows`).
    pub tcp_max_flows: usize,
    /// A spliced client silent this long is probed, and forgotten if it does not answer
    /// (`switch.tcp_idle_s`).
    pub tcp_idle: std::time::Duration,
    /// TLS for TCP clients of the VIP, terminated by the switch's proxy (`switch.tls_cert`,
    /// `tls_key`, `tls_client_ca`; with `tcp = "proxy"`).
    pub tls: Option<proxy::TlsFiles>,
    /// TLS from the switch's proxy to the servers (`switch.server_tls_*`).
    pub server_tls: Option<proxy::ServerTlsFiles>,
    /// SASL from the switch's proxy to the servers (`switch.server_sasl_*`).
    pub server_sasl: Option<proxy::SaslFiles>,
    pub vip: Ipv4Addr,
    /// Length of the VIP's network, where the clients and servers are: the host's end of the
    /// local port gets the proxy's source address with this prefix.
    pub vip_prefix_len: u8,
    pub vip_mac: Mac,
    pub vip_port: u16,
    /// Source address of the requests kvswitch itself sends when it splits a multi-key get.
    pub agent_ip: Option<Ipv4Addr>,
    /// UDP port the split sub-requests are sent from.
    pub agent_port: u16,
    /// `vip.keyed_ports`: UDP ports of the VIP routed by the key-location header.
    pub keyed_ports: Vec<u16>,
    /// How long a split multi-key get waits for all its parts.
    pub split_timeout_ms: u64,
    pub distribution: Distribution,
    pub hash: HashFn,
    pub servers: Vec<Backend>,
    /// How long a request through the proxy may wait for its reply (`pool.timeout_ms`).
    pub timeout: Duration,
    /// Take a failing server out of the ring (`pool.auto_eject_hosts`).
    pub auto_eject_hosts: bool,
    /// Consecutive failures after which a server is ejected (`pool.server_failure_limit`).
    pub server_failure_limit: u32,
    /// How long an ejected server stays out (`pool.server_retry_timeout_ms`).
    pub server_retry_timeout: Duration,
    /// Connections each proxy worker keeps to each server (`pool.server_connections`).
    pub server_connections: usize,
    /// Servers each key is kept on (`pool.replicas`).
    pub replicas: usize,
    /// A Redis pool (`pool.redis = true`): the VIP's port speaks Redis over TCP.
    pub redis: Option<switch::pool::RedisSpec>,
    /// The in-network cache (`[cache]`), shared by the UDP path and the proxy.
    pub cache: cache::CacheSettings,
    /// The source-address check of the ports (`switch.source_check` and its keys).
    pub source: SourceCheck,
    /// UDP reply bytes a second each client address may receive (0: no limit).
    pub udp_reply_bytes_per_sec: u64,
    /// The most reply bytes a client may receive at once.
    pub udp_reply_burst_bytes: u64,
}

/// `switch.source_check` and the keys that go with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceCheck {
    /// Accept an IPv4 source address only on its own port.
    pub enabled: bool,
    /// A learned address not seen for this long may appear on another port.
    pub age: Duration,
    /// Most addresses learned (each port gets an equal share).
    pub table_size: usize,
    /// Per port (as numbered by `switch.ports`), the prefixes it alone may send from; a port
    /// with none learns its addresses.
    pub prefixes: Vec<Vec<Prefix>>,
    /// The networks requests to the VIP may come from (`switch.client_networks`); empty: the
    /// VIP's network.
    pub client_networks: Vec<Prefix>,
}

/// The local port: a veth pair whose `port` end the switch owns like the ports it is given, and
/// whose `peer` end sits in the host's own network stack with the VIP's MAC and address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalPort {
    /// The switch's end.
    pub port: String,
    /// The host's end.
    pub peer: String,
}

/// One memcached server of the pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    pub addr: SocketAddrV4,
    /// Known MAC; `None` means kvswitch resolves it with ARP.
    pub mac: Option<Mac>,
    pub weight: u32,
    pub name: Option<String>,
}

impl Backend {
    /// The identity this server has on the hash ring, as nutcracker derives it.
    pub fn ring_name(&self) -> String {
        kv::ketama_name(
            &self.addr.ip().to_string(),
            self.addr.port(),
            self.name.as_deref(),
        )
    }

    /// A short label for metrics and logs.
    pub fn label(&self) -> String {
        self.name.clone().unwrap_or_else(|| self.addr.to_string())
    }
}

/// A configuration error: which file, which key, what is wrong.
#[derive(Debug)]
pub struct ConfigError {
    pub path: PathBuf,
    pub key: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            write!(f, "{}: {}", self.path.display(), self.message)
        } else {
            write!(
                f,
                "{}: `{}`: {}",
                self.path.display(),
                self.key,
                self.message
            )
        }
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    pub(crate) fn new(path: &Path, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError {
            path: path.to_owned(),
            key: key.to_owned(),
            message: message.into(),
        }
    }

    /// A TOML syntax or type error, on one line with the offending line quoted.
    pub(crate) fn toml(path: &Path, text: &str, e: &toml::de::Error) -> ConfigError {
        let message = e.message().trim();
        match e.span() {
            Some(span) => {
                let line_no = text[..span.start.min(text.len())].matches('\n').count() + 1;
                let line = text.lines().nth(line_no - 1).unwrap_or("").trim();
                ConfigError::new(path, "", format!("line {line_no}: `{line}`: {message}"))
            }
            None => ConfigError::new(path, "", message),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    switch: RawSwitch,
    vip: RawVip,
    pool: RawPool,
    #[serde(default)]
    cache: Option<cache::RawCache>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEgress {
    rate_bps: u64,
    #[serde(default)]
    depth_bytes: Option<u64>,
}

/// An egress queue's depth when `depth_bytes` is not given: 64 full-size frames.
pub const DEFAULT_EGRESS_DEPTH: u64 = 64 * 1514;

/// `switch.datapath`: what carries frames between the ports and the switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Datapath {
    /// Not set: the XDP fast path wherever it attaches, AF_PACKET otherwise (the reason logged).
    Auto,
    /// `"xdp"`: the XDP fast path in front of AF_PACKET; a port it cannot attach to is an error.
    Xdp,
    /// `"af_packet"`: every frame through AF_PACKET to the user-space switch.
    AfPacket,
    /// `"af_xdp"`: the XDP fast path, and what it hands to the switch through an AF_XDP
    /// socket per port (copy mode) rather than the kernel's stack; an error if either fails.
    AfXdp,
}

impl Datapath {
    pub fn as_str(self) -> &'static str {
        match self {
            Datapath::Auto => "auto",
            Datapath::Xdp => "xdp",
            Datapath::AfPacket => "af_packet",
            Datapath::AfXdp => "af_xdp",
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSwitch {
    ports: Vec<String>,
    #[serde(default)]
    datapath: Option<String>,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    api: Option<String>,
    #[serde(default)]
    api_token_file: Option<PathBuf>,
    #[serde(default)]
    api_max_connections: Option<usize>,
    #[serde(default)]
    api_header_timeout_ms: Option<u64>,
    #[serde(default)]
    api_hosts: Option<Vec<String>>,
    #[serde(default)]
    api_tls_cert: Option<PathBuf>,
    #[serde(default)]
    api_tls_key: Option<PathBuf>,
    #[serde(default)]
    api_tls_client_ca: Option<PathBuf>,
    #[serde(default)]
    busy_poll_us: Option<u64>,
    #[serde(default)]
    cpu_socket: Option<PathBuf>,
    #[serde(default)]
    steer_check_ms: Option<u64>,
    #[serde(default)]
    steer_check_failures: Option<u32>,
    #[serde(default)]
    egress: std::collections::BTreeMap<String, RawEgress>,
    #[serde(default)]
    mac_table_size: Option<usize>,
    #[serde(default)]
    mac_age_s: Option<u64>,
    #[serde(default)]
    local_port: Option<String>,
    #[serde(default)]
    local_peer: Option<String>,
    #[serde(default)]
    proxy: Option<bool>,
    #[serde(default)]
    proxy_workers: Option<usize>,
    #[serde(default)]
    tcp: Option<String>,
    #[serde(default)]
    tls_cert: Option<PathBuf>,
    #[serde(default)]
    tls_key: Option<PathBuf>,
    #[serde(default)]
    tls_client_ca: Option<PathBuf>,
    #[serde(default)]
    server_tls_ca: Option<PathBuf>,
    #[serde(default)]
    server_tls_cert: Option<PathBuf>,
    #[serde(default)]
    server_tls_key: Option<PathBuf>,
    #[serde(default)]
    server_sasl_user: Option<String>,
    #[serde(default)]
    server_sasl_password_file: Option<PathBuf>,
    #[serde(default)]
    client_sasl: Option<bool>,
    #[serde(default)]
    tcp_max_flows: Option<usize>,
    #[serde(default)]
    tcp_idle_s: Option<u64>,
    #[serde(default)]
    source_check: Option<bool>,
    #[serde(default)]
    source_age_s: Option<u64>,
    #[serde(default)]
    source_table_size: Option<usize>,
    #[serde(default)]
    source_prefixes: Option<std::collections::BTreeMap<String, Vec<String>>>,
    #[serde(default)]
    client_networks: Option<Vec<String>>,
    #[serde(default)]
    udp_reply_bytes_per_sec: Option<u64>,
    #[serde(default)]
    udp_reply_burst_bytes: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVip {
    ip: String,
    mac: String,
    #[serde(default)]
    port: Option<u16>,
    #[serde(default)]
    prefix_len: Option<u8>,
    #[serde(default)]
    agent_ip: Option<String>,
    #[serde(default)]
    agent_port: Option<u16>,
    #[serde(default)]
    split_timeout_ms: Option<u64>,
    #[serde(default)]
    keyed_ports: Vec<u16>,
}

/// The most keyed ports the VIP serves (`vip.keyed_ports`).
pub const MAX_KEYED_PORTS: usize = 16;
/// Default HTTP address of the metrics and status API.
pub const DEFAULT_API: &str = "127.0.0.1:9110";
/// Default busy-poll window after a frame, in microseconds.
pub const DEFAULT_BUSY_POLL_US: u64 = 200;
/// How often cache nodes that `kv_steer` entries lead to are probed, by default.
pub const DEFAULT_STEER_CHECK_MS: u64 = 200;
/// Failed probes in a row that remove a cache node's steering entries, by default.
pub const DEFAULT_STEER_CHECK_FAILURES: u32 = 3;
/// Default size of the MAC table, in stations.
pub const DEFAULT_MAC_TABLE_SIZE: usize = 8192;
/// Default ageing time of a learned station, in seconds (as a Linux bridge).
pub const DEFAULT_MAC_AGE_S: u64 = 300;
/// Default source port of split sub-requests.
pub const DEFAULT_AGENT_PORT: u16 = 11311;
/// Default name of the switch's end of the local port.
pub const DEFAULT_LOCAL_PORT: &str = "kvs-local";
/// Appended to the local port's name to name the host's end when `switch.local_peer` is unset.
pub const LOCAL_PEER_SUFFIX: &str = "-h";
/// Default prefix length of the VIP's network.
pub const DEFAULT_VIP_PREFIX_LEN: u8 = 24;
/// How TCP to the VIP's memcached port is carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpPath {
    /// The switch answers the handshake, routes each connection to its first request's server
    /// and rewrites its segments; a connection whose requests leave that server is handed to
    /// the local port's proxy.
    Splice,
    /// Every connection goes through the local port to the proxy.
    Proxy,
}

impl TcpPath {
    pub fn name(self) -> &'static str {
        match self {
            TcpPath::Splice => "splice",
            TcpPath::Proxy => "proxy",
        }
    }
}

/// Default of `switch.tcp_max_flows`.
pub const DEFAULT_TCP_MAX_FLOWS: usize = 65_536;

/// Default number of proxy workers: the switch loop already holds one core.
pub const DEFAULT_PROXY_WORKERS: usize = 1;
/// Default ageing time of a learned source address, in seconds: how long a host that moved
/// to another port waits before its address is accepted there.
pub const DEFAULT_SOURCE_AGE_S: u64 = 60;
/// Default size of the source-address table.
pub const DEFAULT_SOURCE_TABLE_SIZE: usize = 8192;
/// Default UDP reply bytes per second to one client: 1 Gbit/s, more than one client of a
/// switch on one core receives, yet a bound on what a forged source address can aim at a host.
pub const DEFAULT_UDP_REPLY_BYTES_PER_SEC: u64 = 125_000_000;
/// Default burst of UDP reply bytes to one client: 16 MiB, a multi-get of sixteen 1 MiB items.
pub const DEFAULT_UDP_REPLY_BURST_BYTES: u64 = 16 << 20;
/// The burst must hold the largest IPv4 datagram, or such a reply could never pass.
pub const MIN_UDP_REPLY_BURST_BYTES: u64 = 65_536;

/// The switch's TLS and SASL settings, their files relative to the configuration's
/// directory.
fn secrets(raw: &RawSwitch, path: &Path) -> Result<proxy::SecretFiles, ConfigError> {
    proxy::RawSecrets {
        tls_cert: raw.tls_cert.clone(),
        tls_key: raw.tls_key.clone(),
        tls_client_ca: raw.tls_client_ca.clone(),
        server_tls_ca: raw.server_tls_ca.clone(),
        server_tls_cert: raw.server_tls_cert.clone(),
        server_tls_key: raw.server_tls_key.clone(),
        server_sasl_user: raw.server_sasl_user.clone(),
        server_sasl_password_file: raw.server_sasl_password_file.clone(),
        client_sasl: raw.client_sasl,
    }
    .check(path, "switch")
}

impl Config {
    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = read_file(path).map_err(|e| ConfigError {
            path: path.to_owned(),
            key: String::new(),
            message: format!("cannot read: {e}"),
        })?;
        Config::parse(&text, path)
    }

    /// Parses and validates configuration text; `path` is used in error messages.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let err = |key: &str, message: String| ConfigError {
            path: path.to_owned(),
            key: key.to_owned(),
            message,
        };
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::toml(path, text, &e))?;

        if raw.switch.ports.is_empty() {
            return Err(err("switch.ports", "at least one port is needed".into()));
        }
        for (i, p) in raw.switch.ports.iter().enumerate() {
            if !kvio::link::valid_ifname(p) {
                return Err(err(
                    &format!("switch.ports[{i}]"),
                    format!("`{p}` is not a valid interface name (1 to 15 characters)"),
                ));
            }
            if raw.switch.ports[..i].contains(p) {
                return Err(err(
                    &format!("switch.ports[{i}]"),
                    format!("`{p}` is listed twice"),
                ));
            }
        }
        let mode = match raw.switch.mode.as_deref().unwrap_or("l3") {
            "l3" => Mode::L3,
            "l2" => Mode::L2,
            other => {
                return Err(err(
                    "switch.mode",
                    format!("`{other}` is not a mode; use \"l3\" or \"l2\""),
                ))
            }
        };
        let api_text = raw.switch.api.as_deref().unwrap_or(DEFAULT_API);
        let api: SocketAddr = api_text.parse().map_err(|_| {
            err(
                "switch.api",
                format!("`{api_text}` is not an address such as 127.0.0.1:9110"),
            )
        })?;

        let api_serving = api::RawApiServing {
            max_connections: raw.switch.api_max_connections,
            header_timeout_ms: raw.switch.api_header_timeout_ms,
            hosts: raw.switch.api_hosts.clone(),
            tls_cert: raw.switch.api_tls_cert.clone(),
            tls_key: raw.switch.api_tls_key.clone(),
            tls_client_ca: raw.switch.api_tls_client_ca.clone(),
        }
        .check(path, "switch")?;

        let datapath = match raw.switch.datapath.as_deref() {
            None => Datapath::Auto,
            Some("xdp") => Datapath::Xdp,
            Some("af_packet") => Datapath::AfPacket,
            Some("af_xdp") => Datapath::AfXdp,
            Some(other) => {
                return Err(err(
                    "switch.datapath",
                    format!("unknown datapath {other:?}; use \"xdp\", \"af_xdp\" or \"af_packet\""),
                ))
            }
        };
        let busy_poll_us = raw.switch.busy_poll_us.unwrap_or(DEFAULT_BUSY_POLL_US);
        if busy_poll_us > 1_000_000 {
            return Err(err(
                "switch.busy_poll_us",
                format!("{busy_poll_us} is more than a second; use 0 to 1000000"),
            ));
        }
        let steer_check_ms = raw.switch.steer_check_ms.unwrap_or(DEFAULT_STEER_CHECK_MS);
        if steer_check_ms > 60_000 {
            return Err(err(
                "switch.steer_check_ms",
                format!("{steer_check_ms} is more than a minute; use 0 (off) to 60000"),
            ));
        }
        let steer_check_failures = raw
            .switch
            .steer_check_failures
            .unwrap_or(DEFAULT_STEER_CHECK_FAILURES);
        if !(1..=100).contains(&steer_check_failures) {
            return Err(err(
                "switch.steer_check_failures",
                format!("{steer_check_failures} is outside 1..=100"),
            ));
        }
        let mut egress = Vec::new();
        for (port, e) in &raw.switch.egress {
            let key = format!("switch.egress.{port}");
            let Some(i) = raw.switch.ports.iter().position(|p| p == port) else {
                return Err(err(&key, format!("`{port}` is not one of `switch.ports`")));
            };
            if e.rate_bps < 1000 {
                return Err(err(
                    &format!("{key}.rate_bps"),
                    format!(
                        "{} bits/s is too slow to send a frame; use 1000 or more",
                        e.rate_bps
                    ),
                ));
            }
            let depth = e.depth_bytes.unwrap_or(DEFAULT_EGRESS_DEPTH);
            if !(1514..=(1 << 30)).contains(&depth) {
                return Err(err(
                    &format!("{key}.depth_bytes"),
                    format!("{depth} bytes: use 1514 (one full frame) to 1073741824"),
                ));
            }
            egress.push((i, e.rate_bps, depth));
        }
        let mac_table_size = raw.switch.mac_table_size.unwrap_or(DEFAULT_MAC_TABLE_SIZE);
        if !(1..=1_000_000).contains(&mac_table_size) {
            return Err(err(
                "switch.mac_table_size",
                format!("{mac_table_size} is out of range; use 1 to 1000000"),
            ));
        }
        let mac_age_s = raw.switch.mac_age_s.unwrap_or(DEFAULT_MAC_AGE_S);
        if !(1..=86_400).contains(&mac_age_s) {
            return Err(err(
                "switch.mac_age_s",
                format!("{mac_age_s} is out of range; use 1 to 86400 seconds"),
            ));
        }
        let vip: Ipv4Addr = raw
            .vip
            .ip
            .parse()
            .map_err(|_| err("vip.ip", format!("`{}` is not an IPv4 address", raw.vip.ip)))?;
        let vip_mac: Mac = raw
            .vip
            .mac
            .parse()
            .map_err(|_| err("vip.mac", format!("`{}` is not a MAC address", raw.vip.mac)))?;
        if !vip_mac.is_unicast() {
            return Err(err("vip.mac", format!("`{vip_mac}` is not a unicast MAC")));
        }
        let redis = pool_keys::redis_toml(&raw.pool)
            .map_err(|(k, e)| err(&format!("pool.{k}"), e.to_string()))?;
        // Redis's port for a Redis pool, memcached's otherwise.
        let vip_port = raw
            .vip
            .port
            .unwrap_or(if redis.is_some() { 6379 } else { 11211 });
        if vip_port == 0 {
            return Err(err("vip.port", "port 0 is not allowed".into()));
        }
        let vip_prefix_len = raw.vip.prefix_len.unwrap_or(DEFAULT_VIP_PREFIX_LEN);
        if !(1..=32).contains(&vip_prefix_len) {
            return Err(err(
                "vip.prefix_len",
                format!("{vip_prefix_len} is not a prefix length; use 1 to 32"),
            ));
        }
        let agent_ip = match raw.vip.agent_ip.as_deref() {
            Some(s) => Some(
                s.parse::<Ipv4Addr>()
                    .map_err(|_| err("vip.agent_ip", format!("`{s}` is not an IPv4 address")))?,
            ),
            None if mode == Mode::L3 => Some(vip),
            None => None,
        };
        let agent_port = raw.vip.agent_port.unwrap_or(DEFAULT_AGENT_PORT);
        if agent_port == 0 || (agent_ip == Some(vip) && agent_port == vip_port) {
            return Err(err(
                "vip.agent_port",
                format!("{agent_port} cannot be used: it must differ from the VIP's port"),
            ));
        }
        let keyed_ports = raw.vip.keyed_ports.clone();
        for (i, &port) in keyed_ports.iter().enumerate() {
            let why = if port == 0 {
                Some("port 0 is no port")
            } else if port == vip_port && redis.is_some() {
                Some("it is the VIP's Redis port")
            } else if port == vip_port {
                Some("it is the VIP's memcached port")
            } else if agent_ip == Some(vip) && port == agent_port {
                Some("it is the agent port")
            } else if keyed_ports[..i].contains(&port) {
                Some("it is listed twice")
            } else {
                None
            };
            if let Some(why) = why {
                return Err(err(
                    "vip.keyed_ports",
                    format!("{port} cannot be used: {why}"),
                ));
            }
        }
        if keyed_ports.len() > MAX_KEYED_PORTS {
            return Err(err(
                "vip.keyed_ports",
                format!("{} ports; at most {MAX_KEYED_PORTS}", keyed_ports.len()),
            ));
        }
        let local = local_port(&raw.switch, &err)?;
        if local.is_some() && mode == Mode::L2 && agent_ip.is_none() {
            return Err(err(
                "vip.agent_ip",
                "l2 mode with a local port needs an address the servers do not own, the source \
                 of the host's connections to them; set it, or turn the local port off with \
                 switch.local_port = \"\""
                    .into(),
            ));
        }
        let proxy = raw.switch.proxy.unwrap_or(true);
        if redis.is_some() && local.is_some() && !proxy {
            // The splice hands a Redis connection to the proxy for much of what clients send
            // first (`HELLO`, `AUTH`, `CLIENT SETINFO`): without it those connections fail.
            return Err(err(
                "switch.proxy",
                "a Redis pool needs the proxy behind the local port, which answers what no one \
                 server does; remove switch.proxy = false"
                    .into(),
            ));
        }
        let proxy_workers = raw.switch.proxy_workers.unwrap_or(DEFAULT_PROXY_WORKERS);
        if !(1..=64).contains(&proxy_workers) {
            return Err(err(
                "switch.proxy_workers",
                format!("{proxy_workers} is out of range; use 1 to 64"),
            ));
        }
        let tcp = match raw.switch.tcp.as_deref() {
            None | Some("splice") => TcpPath::Splice,
            Some("proxy") => TcpPath::Proxy,
            Some(other) => {
                return Err(err(
                    "switch.tcp",
                    format!("\"{other}\" is not a TCP path; use \"splice\" or \"proxy\""),
                ))
            }
        };
        let (tls, server_tls, server_sasl) = secrets(&raw.switch, path)?;
        if tls.is_some() || server_tls.is_some() || server_sasl.is_some() {
            let key = match (&tls, &server_tls) {
                (Some(_), _) => "switch.tls_cert",
                (None, Some(_)) => "switch.server_tls_ca",
                (None, None) => "switch.server_sasl_user",
            };
            if raw.switch.local_port.as_deref() == Some("") || !proxy {
                return Err(err(
                    key,
                    "TLS and SASL are the switch's proxy's: it needs the local port and \
                     switch.proxy"
                        .into(),
                ));
            }
            if tcp != TcpPath::Proxy {
                return Err(err(
                    key,
                    "the splice carries TCP to the servers in clear, with no credentials: set \
                     switch.tcp = \"proxy\" so that the switch's proxy carries it (UDP stays \
                     in clear)"
                        .into(),
                ));
            }
        }
        let tcp_max_flows = raw.switch.tcp_max_flows.unwrap_or(DEFAULT_TCP_MAX_FLOWS);
        if !(1..=1 << 22).contains(&tcp_max_flows) {
            return Err(err(
                "switch.tcp_max_flows",
                format!("{tcp_max_flows} is out of range; use 1 to 4194304"),
            ));
        }
        let tcp_idle_s = raw
            .switch
            .tcp_idle_s
            .unwrap_or(switch::spec::TcpSplice::DEFAULT_IDLE.as_secs());
        if !(1..=604_800).contains(&tcp_idle_s) {
            return Err(err(
                "switch.tcp_idle_s",
                format!("{tcp_idle_s} is out of range; use 1 to 604800 (a week)"),
            ));
        }
        let source = source_check(&raw.switch, &err)?;
        let udp_reply_bytes_per_sec = raw
            .switch
            .udp_reply_bytes_per_sec
            .unwrap_or(DEFAULT_UDP_REPLY_BYTES_PER_SEC);
        let udp_reply_burst_bytes = raw
            .switch
            .udp_reply_burst_bytes
            .unwrap_or(DEFAULT_UDP_REPLY_BURST_BYTES);
        if udp_reply_bytes_per_sec > 0 && udp_reply_burst_bytes < MIN_UDP_REPLY_BURST_BYTES {
            return Err(err(
                "switch.udp_reply_burst_bytes",
                format!(
                    "{udp_reply_burst_bytes} is less than {MIN_UDP_REPLY_BURST_BYTES}, the \
                     largest datagram: such a reply could never pass"
                ),
            ));
        }
        let split_timeout_ms = raw.vip.split_timeout_ms.unwrap_or(1000);
        if split_timeout_ms == 0 || split_timeout_ms > 60_000 {
            return Err(err(
                "vip.split_timeout_ms",
                "must be between 1 and 60000".into(),
            ));
        }

        let keys = PoolKeys::from_toml(&raw.pool)
            .map_err(|(k, e)| err(&format!("pool.{k}"), e.to_string()))?;
        if keys.replicas > 1 && agent_ip.is_none() {
            return Err(err(
                "pool.replicas",
                "the switch sends a replicated pool's writes from its agent address: in l2 mode \
                 set vip.agent_ip"
                    .into(),
            ));
        }
        if keys.hash_tag.is_some() {
            // The switch hashes whole keys; accepting the tag would place keys elsewhere than
            // the proxy and nutcracker do.
            return Err(err(
                "pool.hash_tag",
                "the switch places keys by the whole key; hash_tag is only available in a \
                 proxy configuration"
                    .into(),
            ));
        }

        if raw.pool.servers.is_empty() {
            return Err(err("pool.servers", "at least one server is needed".into()));
        }
        let mut servers = Vec::with_capacity(raw.pool.servers.len());
        for (i, s) in raw.pool.servers.iter().enumerate() {
            let key = |field: &str| format!("pool.servers[{i}].{field}");
            let addr: SocketAddrV4 = s.addr.parse().map_err(|_| {
                err(
                    &key("addr"),
                    format!(
                        "`{}` is not an IPv4 address with a port, such as 10.0.0.1:11211",
                        s.addr
                    ),
                )
            })?;
            let mac = match s.mac.as_deref() {
                Some(m) => {
                    let mac: Mac = m
                        .parse()
                        .map_err(|_| err(&key("mac"), format!("`{m}` is not a MAC address")))?;
                    if !mac.is_unicast() {
                        return Err(err(&key("mac"), format!("`{m}` is not a unicast MAC")));
                    }
                    Some(mac)
                }
                None => None,
            };
            let weight = pool_keys::weight(s.weight.unwrap_or(1).into())
                .map_err(|e| err(&key("weight"), e.to_string()))?;
            if let Some(name) = &s.name {
                pool_keys::server_name(name).map_err(|e| err(&key("name"), e.to_string()))?;
            }
            if *addr.ip() == vip {
                return Err(err(
                    &key("addr"),
                    "a server cannot have the VIP's address".into(),
                ));
            }
            if Some(*addr.ip()) == agent_ip {
                return Err(err(
                    &key("addr"),
                    "a server cannot have the agent address (`vip.agent_ip`)".into(),
                ));
            }
            // The switch rewrites addresses, not ports: a request to the VIP's port must find
            // memcached on the same port, and the reply's source port is left as it is.
            if addr.port() != vip_port {
                return Err(err(
                    &key("addr"),
                    format!(
                        "port {} differs from the VIP's port {vip_port}; in switch mode every \
                         server listens on the VIP's port",
                        addr.port()
                    ),
                ));
            }
            let backend = Backend {
                addr,
                mac,
                weight,
                name: s.name.clone(),
            };
            if servers.iter().any(|b: &Backend| b.addr.ip() == addr.ip()) {
                return Err(err(&key("addr"), format!("{} is listed twice", addr.ip())));
            }
            if servers
                .iter()
                .any(|b: &Backend| b.ring_name() == backend.ring_name())
            {
                return Err(err(
                    &key("name"),
                    format!("ring name `{}` is used twice", backend.ring_name()),
                ));
            }
            servers.push(backend);
        }

        let config = Config {
            path: path.to_owned(),
            ports: raw.switch.ports,
            mode,
            api,
            api_token_file: raw.switch.api_token_file.map(|f| match f.is_relative() {
                true => path.parent().unwrap_or(Path::new(".")).join(f),
                false => f,
            }),
            api_serving,
            busy_poll: std::time::Duration::from_micros(busy_poll_us),
            cpu_socket: match raw.switch.cpu_socket {
                None => CpuSocket::Default,
                Some(f) if f.as_os_str() == "off" => CpuSocket::Off,
                Some(f) if f.is_relative() => {
                    CpuSocket::At(path.parent().unwrap_or(Path::new(".")).join(f))
                }
                Some(f) => CpuSocket::At(f),
            },
            datapath,
            steer_check: (steer_check_ms > 0).then(|| Duration::from_millis(steer_check_ms)),
            steer_check_failures,
            egress,
            mac_table_size,
            mac_age: std::time::Duration::from_secs(mac_age_s),
            local,
            proxy,
            proxy_workers,
            tcp,
            tcp_max_flows,
            tcp_idle: std::time::Duration::from_secs(tcp_idle_s),
            tls,
            server_tls,
            server_sasl,
            vip,
            vip_prefix_len,
            vip_mac,
            vip_port,
            agent_ip,
            agent_port,
            keyed_ports,
            split_timeout_ms,
            distribution: keys.distribution,
            hash: keys.hash,
            servers,
            timeout: keys.timeout,
            auto_eject_hosts: keys.auto_eject_hosts,
            server_failure_limit: keys.server_failure_limit,
            server_retry_timeout: keys.server_retry_timeout,
            server_connections: keys.server_connections,
            replicas: keys.replicas,
            redis,
            cache: {
                let present = raw.cache.is_some();
                raw.cache.unwrap_or_default().settings(present, path)?
            },
            source,
            udp_reply_bytes_per_sec,
            udp_reply_burst_bytes,
        };
        // What is left to check needs the whole list: the ring must build (names short enough
        // for nutcracker's ketama buffer).
        pool_keys::check_servers(&config.pool_spec(proxy::UNSET_LISTEN)).map_err(|e| {
            match e.server() {
                Some(i) => err(&format!("pool.servers[{i}]"), e.to_string()),
                None => err("pool.servers", e.to_string()),
            }
        })?;
        Ok(config)
    }

    /// The pool as the proxy serves it, listening on `listen`: named "default", each server's
    /// `host` the text of its IP address (so its ring name is the switch's), with this file's
    /// distribution, hash and failure handling.
    pub fn pool_spec(&self, listen: SocketAddr) -> PoolSpec {
        let servers = self
            .servers
            .iter()
            .map(|b| ServerSpec {
                host: b.addr.ip().to_string(),
                addr: SocketAddr::V4(b.addr),
                weight: b.weight,
                name: b.name.clone(),
            })
            .collect();
        let mut pool = PoolSpec::new("default", listen, self.distribution, self.hash, servers);
        pool.timeout = self.timeout;
        pool.auto_eject_hosts = self.auto_eject_hosts;
        pool.server_failure_limit = self.server_failure_limit;
        pool.server_retry_timeout = self.server_retry_timeout;
        pool.server_connections = self.server_connections;
        pool.replicas = self.replicas;
        pool.redis = self.redis.clone();
        pool
    }
}

impl Config {
    /// The switch this file describes, with `ports` ports (the configured ones, then the local
    /// port if there is one) and the seed `seed`.
    pub fn switch_spec(&self, ports: usize, seed: u64) -> switch::SwitchSpec {
        use switch::spec;
        let local = self.local.as_ref().map(|_| spec::Local {
            port: self.ports.len() as u16,
            addrs: self.local_addrs().into_iter().map(|(ip, _)| ip).collect(),
            source: self.local_source(),
        });
        switch::SwitchSpec {
            ports,
            local,
            mode: self.mode,
            vip: spec::Vip {
                ip: self.vip,
                prefix_len: self.vip_prefix_len,
                mac: self.vip_mac,
                port: self.vip_port,
            },
            agent_ip: self.agent_ip,
            agent_port: self.agent_port,
            servers: self
                .servers
                .iter()
                .map(|b| spec::Server {
                    addr: b.addr,
                    mac: b.mac,
                })
                .collect(),
            split_timeout: Duration::from_millis(self.split_timeout_ms),
            mac_table_size: self.mac_table_size,
            mac_age: self.mac_age,
            source_check: self.source.enabled.then(|| spec::SourceCheck {
                age: self.source.age,
                table_size: self.source.table_size,
                prefixes: self.source.prefixes.clone(),
            }),
            client_networks: self.source.client_networks.clone(),
            reply_limit: (self.udp_reply_bytes_per_sec > 0).then_some(spec::ReplyLimit {
                rate: self.udp_reply_bytes_per_sec,
                burst: self.udp_reply_burst_bytes,
            }),
            cache: self.cache.enabled,
            tcp_splice: self.tcp_splice().then_some(spec::TcpSplice {
                max_flows: self.tcp_max_flows,
                idle: self.tcp_idle,
            }),
            keyed_ports: self.keyed_ports.clone(),
            redis: self.redis.is_some(),
            seed,
        }
    }

    /// Whether the switch splices TCP to the VIP: `switch.tcp = "splice"` and a local port,
    /// where the connections it cannot carry alone go.
    pub fn tcp_splice(&self) -> bool {
        self.tcp_path().0 == TcpPath::Splice
    }

    /// The TCP path the switch takes, and why it is not the one configured when it is not.
    pub fn tcp_path(&self) -> (TcpPath, Option<&'static str>) {
        match (self.tcp, &self.local) {
            (TcpPath::Splice, None) => (
                TcpPath::Proxy,
                Some("switch.tcp = \"splice\" needs the local port, where connections the switch cannot carry alone go"),
            ),
            (path, _) => (path, None),
        }
    }

    /// The pool the switch's UDP path and its proxy share, its servers all in the ring.
    /// What servers added to the pool at run time must be: on the VIP's port, not at the
    /// switch's own addresses, at an IPv4 host address not in the pool already (what
    /// `[[pool.servers]]` takes).
    pub fn server_rules(&self) -> switch::pool::ServerRules {
        let mut refused = vec![std::net::IpAddr::V4(self.vip)];
        refused.extend(self.agent_ip.map(std::net::IpAddr::V4));
        switch::pool::ServerRules {
            port: Some(self.vip_port),
            refused,
            host_addresses: true,
        }
    }

    pub fn pool(&self) -> Result<switch::pool::Pool, ConfigError> {
        switch::pool::Pool::new(self.switch_pool_spec())
            .map_err(|e| ConfigError::new(&self.path, "pool", e.to_string()))
    }

    /// The pool of the switch: its servers, listened for on the VIP's port.
    pub fn switch_pool_spec(&self) -> PoolSpec {
        self.pool_spec(SocketAddr::new(self.vip.into(), self.vip_port))
    }
}

impl Config {
    /// Where the host's connections to the servers come from: the agent address, which is the
    /// VIP in l3 mode unless set otherwise. In l2 mode the servers own the VIP, so it cannot be.
    pub fn local_source(&self) -> Ipv4Addr {
        self.agent_ip.unwrap_or(self.vip)
    }

    /// The addresses of the host's end of the local port, with their prefix lengths: the
    /// source address on the VIP's network first (it adds the route to that network), then
    /// the VIP alone if it differs.
    pub fn local_addrs(&self) -> Vec<(Ipv4Addr, u8)> {
        let source = self.local_source();
        let mut addrs = vec![(source, self.vip_prefix_len)];
        if source != self.vip {
            addrs.push((self.vip, 32));
        }
        addrs
    }
}

/// `switch.source_check` with its age, table size and per-port prefixes, validated.
fn source_check(
    raw: &RawSwitch,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<SourceCheck, ConfigError> {
    let age_s = raw.source_age_s.unwrap_or(DEFAULT_SOURCE_AGE_S);
    if !(1..=86_400).contains(&age_s) {
        return Err(err(
            "switch.source_age_s",
            format!("{age_s} is out of range; use 1 to 86400 seconds"),
        ));
    }
    let table_size = raw.source_table_size.unwrap_or(DEFAULT_SOURCE_TABLE_SIZE);
    if !(1..=1_000_000).contains(&table_size) {
        return Err(err(
            "switch.source_table_size",
            format!("{table_size} is out of range; use 1 to 1000000"),
        ));
    }
    let mut prefixes = vec![Vec::new(); raw.ports.len()];
    for (port, list) in raw.source_prefixes.iter().flatten() {
        let key = format!("switch.source_prefixes.{port}");
        let Some(i) = raw.ports.iter().position(|p| p == port) else {
            return Err(err(&key, format!("`{port}` is not in switch.ports")));
        };
        for text in list {
            let prefix: Prefix = text
                .parse()
                .map_err(|e: switch::source::PrefixError| err(&key, e.to_string()))?;
            prefixes[i].push(prefix);
        }
    }
    let mut client_networks = Vec::new();
    for text in raw.client_networks.iter().flatten() {
        let prefix: Prefix = text.parse().map_err(|e: switch::source::PrefixError| {
            err("switch.client_networks", e.to_string())
        })?;
        client_networks.push(prefix);
    }
    Ok(SourceCheck {
        enabled: raw.source_check.unwrap_or(true),
        client_networks,
        age: Duration::from_secs(age_s),
        table_size,
        prefixes,
    })
}

/// `switch.local_port` and `switch.local_peer`, validated; `None` when turned off.
fn local_port(
    raw: &RawSwitch,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<Option<LocalPort>, ConfigError> {
    let port = raw.local_port.as_deref().unwrap_or(DEFAULT_LOCAL_PORT);
    if port.is_empty() {
        if raw.local_peer.as_deref().is_some_and(|p| !p.is_empty()) {
            return Err(err(
                "switch.local_peer",
                "set without a local port (switch.local_port is \"\")".into(),
            ));
        }
        return Ok(None);
    }
    if !kvio::link::valid_ifname(port) {
        return Err(err(
            "switch.local_port",
            format!("`{port}` is not a valid interface name (1 to 15 characters)"),
        ));
    }
    let peer = match raw.local_peer.as_deref() {
        Some(p) => p.to_string(),
        None => format!("{port}{LOCAL_PEER_SUFFIX}"),
    };
    if !kvio::link::valid_ifname(&peer) {
        let message = if raw.local_peer.is_some() {
            format!("`{peer}` is not a valid interface name (1 to 15 characters)")
        } else {
            format!(
                "the default name `{peer}` is longer than 15 characters; set \
                 switch.local_peer or use a shorter switch.local_port"
            )
        };
        return Err(err("switch.local_peer", message));
    }
    if peer == port {
        return Err(err(
            "switch.local_peer",
            format!("`{peer}` is also the local port's name"),
        ));
    }
    for (key, name) in [("switch.local_port", port), ("switch.local_peer", &peer)] {
        if raw.ports.iter().any(|p| p == name) {
            return Err(err(
                key,
                format!(
                    "`{name}` is also listed in switch.ports; the local port is made by kvswitch"
                ),
            ));
        }
    }
    Ok(Some(LocalPort {
        port: port.to_string(),
        peer,
    }))
}

/// An example configuration, shown by `kvswitch run --example-config`.
pub const EXAMPLE: &str = r#"# kvswitch.toml
[switch]
# Interfaces kvswitch owns; frames are switched between them.
ports = ["veth-c1", "veth-s1", "veth-s2", "veth-s3"]
# "l3": rewrite destination MAC and IP, and the source IP of replies to the VIP.
# "l2": rewrite the destination MAC only (servers own the VIP on loopback).
mode = "l3"
# HTTP: the control API (/api/v1/..., see /api/v1/openapi.json) and /metrics (Prometheus
# text). Changes through it need a token when it listens beyond this host.
api = "127.0.0.1:9110"
# api_token_file = "api.token"   # or the environment's KVSWITCH_API_TOKEN
# The API answers only requests whose Host names it (its address, localhost, or these), and
# takes changes only as JSON from no other web origin. Past api_max_connections a connection
# is closed at once; a request's headers must arrive within api_header_timeout_ms.
# api_hosts = ["switch1.example"]
# api_max_connections = 256
# api_header_timeout_ms = 10000
# HTTPS for the API: the certificate chain and its key (PEM, relative to this file; read
# again on SIGHUP). With api_tls_client_ca, clients must show a certificate it signed.
# Clients give the authority with --api-ca (kvswitch ctl) or switch_tls_ca (the controller).
# api_tls_cert = "api.crt"
# api_tls_key = "api.key"
# api_tls_client_ca = "operators-ca.crt"
# A port whose frames leave through a queue at a rate (to make congestion on a testbed):
# [switch.egress.veth-s1]
# rate_bps = 100000000
# depth_bytes = 96896
# Agents on the CPU path (kvswitch nf ...) take frames and read registers over a local
# socket: by default /run/kvswitch/cpu-<pid>.sock (the status's cpu_channel.path says
# which; where the switch cannot listen there it runs without one), or this path, or "off"
# (agents then use the API's HTTP routes).
# cpu_socket = "/run/kvswitch/switch1.cpu"
# After a frame, keep polling the ports this long before sleeping (0: always sleep).
# Longer windows cut latency and CPU per frame under load, at the price of a busy core.
busy_poll_us = 200
# What carries frames to the switch. Unset: an XDP program on the ports routes single-key
# reads and switches known unicast in the kernel, handing the rest to the switch over
# AF_PACKET, wherever it attaches (AF_PACKET alone otherwise, with the reason logged).
# "xdp": the same, and a port it cannot attach to is an error. "af_xdp": XDP, and what it
# hands to the switch goes through an AF_XDP socket per port instead of the kernel's stack.
# "af_packet": no XDP.
# datapath = "xdp"
# SwitchKV cache nodes (kvswitch node --role cache) steer reads of their keys to themselves
# with kv_steer entries. kvswitch probes each such node (a TCP connection to its memcached
# port, through the local port) every steer_check_ms (0: never) and removes its entries
# after steer_check_failures failures in a row: its keys' reads go to their servers again.
steer_check_ms = 200
steer_check_failures = 3
# MAC learning: most stations held, and how long an unheard one is kept.
mac_table_size = 8192
mac_age_s = 300
# The local port: a veth pair into this host's own network stack (kvswitch creates it at start
# and removes it at exit). TCP to the VIP's port goes through it to the built-in memcached
# proxy, and the proxy reaches the servers through it. The host's end ("kvs-local-h" unless
# local_peer says otherwise) gets the VIP's MAC and address. "" turns both off: TCP to the
# VIP is then dropped.
local_port = "kvs-local"
# local_peer = "kvs-local-h"
# false: run no proxy and leave the VIP's port on this host to another program.
proxy = true
proxy_workers = 1
# TCP to the VIP's port: "splice" (the switch answers the handshake and carries each request
# to its key's server on a connection of its own in the client's name, and what it cannot
# route to the proxy) or "proxy" (every connection through the local port to the proxy).
# Splicing needs the local port; without it TCP takes the proxy's path.
tcp = "splice"
# TLS on the VIP's TCP port, terminated by the switch's proxy (memcached's TLS, as
# `memcached -Z` serves it), with tcp = "proxy"; files relative to this file, read again on
# SIGHUP. tls_client_ca asks clients for certificates. The proxy speaks TLS to `memcached -Z`
# servers with server_tls_ca (server_tls_cert and server_tls_key: its own certificate), and
# authenticates to `memcached -S` servers with SASL (binary clients only). UDP stays in clear.
# tls_cert = "vip.crt"
# tls_key = "vip.key"
# tls_client_ca = "clients-ca.crt"
# server_tls_ca = "servers-ca.crt"
# server_sasl_user = "kvswitch"
# server_sasl_password_file = "servers.password"
# client_sasl = false    # true: TCP clients must authenticate first, as memcached -S wants
# Most connections spliced at once; a new one past them is reset.
tcp_max_flows = 65536
# Seconds a spliced client may stay silent before the switch sends it keepalive probes; one
# that answers none of three is reset, and its connection forgotten.
tcp_idle_s = 300
# Replies over UDP (from the servers' memcached ports, and the switch's own answers) to one
# client address: at most this many bytes a second, this many at once; further datagrams are
# dropped (`reply_rate_limited`), so a forged source cannot aim the pool at a host. 0: no limit.
udp_reply_bytes_per_sec = 125000000
udp_reply_burst_bytes = 16777216
# Host identity (port security and IP source guard), on unless turned off: an IPv4 source
# address (IPv4 or ARP) is accepted only on the port it was first seen on, for as long as it
# keeps being seen there, or on the port configured for it below; a frame from it on another
# port is dropped (`source_spoofed`). A station's MAC stays on its port the same way
# (`source_mac_moved`). A host that moves to another port is accepted there once it has been
# silent for source_age_s. A server's MAC and address are bound to the port they are
# configured on (a server's `mac`, and its address in source_prefixes) or first resolved on,
# for as long as the server is in the pool, however quiet it is (`source_mac_bound`); to move
# one, remove the server from the pool and add it again. Configure them to leave nothing to
# whoever speaks first. The local port, where the host's own stack sends from the VIP, is not
# checked. false: a plain learning switch that believes every frame's addresses.
source_check = true
source_age_s = 60
source_table_size = 8192   # each port may learn an equal share
# Networks requests to the VIP may come from (default: the VIP's network, vip.prefix_len); a
# request from elsewhere is dropped (`source_off_net`), as nothing would route its answer.
# client_networks = ["10.0.0.0/24", "10.9.0.0/16"]
# Per port, the only sources it accepts (and no other port may use); keep this table last.
# [switch.source_prefixes]
# "veth-c1" = ["10.0.0.1/32"]

[vip]
ip = "10.0.0.100"
mac = "02:00:00:00:00:64"
port = 11211
# The VIP's network (clients and servers): the host reaches it through the local port.
prefix_len = 24
# Source of the sub-requests of a multi-key get split across servers, and of the proxy's
# connections to the servers (defaults to the VIP in l3 mode; required in l2 mode for split
# gets and the local port).
# agent_ip = "10.0.0.101"
# agent_port = 11311
# split_timeout_ms = 1000
# UDP ports of the VIP whose datagrams carry kvswitch's key-location header (docs/keyloc.md):
# each is routed by the key the header points at, with the pool's hash and ring, to the key's
# server at the same port, the header removed on the way. Any UDP service sharded by key can
# sit behind them, unchanged. At most 16.
# keyed_ports = [5300]

[pool]
distribution = "ketama"   # ketama | modula | jump
hash = "md5"              # nutcracker's hash names: md5, fnv1a_64, crc32, ...
# Failure handling of TCP requests through the proxy, as nutcracker's keys of the same names
# (times in milliseconds). nutcracker waits forever for a reply unless told otherwise;
# kvswitch always bounds a request, by timeout_ms.
# timeout_ms = 1000                # a request without a reply by then fails
# auto_eject_hosts = false         # take a failing server out of the ring ...
# server_failure_limit = 2         # ... after this many failures in a row ...
# server_retry_timeout_ms = 30000  # ... for this long
# server_connections = 1           # connections to each server, per proxy worker
# replicas = 1                     # servers each key is kept on (writes to all, reads to one)
# A pool of redis-servers (the VIP's port is then 6379 unless vip.port says otherwise): the
# switch splices Redis over TCP by key, its proxy answers the rest. redis_auth (the password
# the servers want, asked of clients too) and redis_db (selected on every server connection)
# make every connection the proxy's.
# redis = true
# redis_auth = "secret"
# redis_db = 0

[[pool.servers]]
addr = "10.0.0.11:11211"
mac = "02:00:00:00:00:0b"   # optional: resolved with ARP when left out
weight = 1
name = "s1"                 # optional: the server's identity on the ring

[[pool.servers]]
addr = "10.0.0.12:11211"
name = "s2"

[[pool.servers]]
addr = "10.0.0.13:11211"
name = "s3"
"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("test.toml"))
    }

    #[test]
    fn example_parses() {
        let c = parse(EXAMPLE).expect("example must parse");
        assert_eq!(c.ports.len(), 4);
        assert_eq!(c.mode, Mode::L3);
        assert_eq!(c.servers.len(), 3);
        assert_eq!(c.servers[0].weight, 1);
        assert_eq!(c.servers[1].mac, None);
        assert_eq!(c.agent_ip, Some(c.vip));
        assert_eq!(c.servers[0].ring_name(), "s1");
        assert_eq!(c.steer_check, Some(Duration::from_millis(200)));
        assert_eq!(c.steer_check_failures, 3);
    }

    #[test]
    fn the_steering_check_is_bounded_and_may_be_off() {
        let off = EXAMPLE.replace("steer_check_ms = 200", "steer_check_ms = 0");
        assert_eq!(parse(&off).unwrap().steer_check, None);
        for (from, to, key) in [
            (
                "steer_check_ms = 200",
                "steer_check_ms = 60001",
                "switch.steer_check_ms",
            ),
            (
                "steer_check_failures = 3",
                "steer_check_failures = 0",
                "switch.steer_check_failures",
            ),
            (
                "steer_check_failures = 3",
                "steer_check_failures = 101",
                "switch.steer_check_failures",
            ),
        ] {
            let e = parse(&EXAMPLE.replace(from, to)).unwrap_err().to_string();
            assert!(e.contains(key), "{e}");
        }
    }

    #[test]
    fn keyed_ports_reach_the_switch_and_bad_ones_are_refused() {
        assert!(parse(EXAMPLE).unwrap().keyed_ports.is_empty());
        let with = |ports: &str| {
            parse(&EXAMPLE.replace("# keyed_ports = [5300]", &format!("keyed_ports = {ports}")))
        };
        let c = with("[5300, 5353]").unwrap();
        assert_eq!(c.switch_spec(5, 0).keyed_ports, vec![5300, 5353]);
        for (ports, why) in [
            ("[0]", "no port"),
            ("[11211]", "memcached port"),
            ("[11311]", "agent port"),
            ("[5300, 5300]", "twice"),
            ("[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]", "at most 16"),
        ] {
            let e = with(ports).unwrap_err().to_string();
            assert!(
                e.contains("vip.keyed_ports") && e.contains(why),
                "{ports}: {e}"
            );
        }
    }

    #[test]
    fn tls_and_sasl_on_the_vip_take_the_proxy_path() {
        let c = parse(EXAMPLE).unwrap();
        assert_eq!((c.tls, c.server_tls, c.server_sasl), (None, None, None));
        let tls = "tls_cert = \"vip.crt\"\ntls_key = \"vip.key\"";
        let spliced = EXAMPLE.replace("# tls_cert = \"vip.crt\"", tls);
        let e = parse(&spliced).unwrap_err();
        assert_eq!(e.key, "switch.tls_cert");
        assert!(e.to_string().contains("switch.tcp = \"proxy\""), "{e}");
        let proxied = spliced.replace("tcp = \"splice\"", "tcp = \"proxy\"");
        let c = Config::parse(&proxied, Path::new("/etc/kvswitch/switch.toml")).unwrap();
        let files = c.tls.expect("tls");
        assert_eq!(files.cert, Path::new("/etc/kvswitch/vip.crt"));
        let sasl = EXAMPLE
            .replace("tcp = \"splice\"", "tcp = \"proxy\"")
            .replace(
                "# server_sasl_user = \"kvswitch\"",
                "server_sasl_user = \"kvswitch\"",
            );
        let e = parse(&sasl).unwrap_err();
        assert_eq!(e.key, "switch.server_sasl_password_file");
        let no_proxy = proxied.replace("proxy = true", "proxy = false");
        assert!(parse(&no_proxy)
            .unwrap_err()
            .to_string()
            .contains("switch.proxy"));
    }

    #[test]
    fn tcp_is_spliced_by_default_and_falls_back_without_a_local_port() {
        let c = parse(EXAMPLE).unwrap();
        assert_eq!((c.tcp, c.tcp_max_flows), (TcpPath::Splice, 65_536));
        assert_eq!(c.tcp_idle, std::time::Duration::from_secs(300));
        let quick = parse(&EXAMPLE.replace("tcp_idle_s = 300", "tcp_idle_s = 2")).unwrap();
        let idle = quick.switch_spec(5, 0).tcp_splice.map(|t| t.idle);
        assert_eq!(idle, Some(std::time::Duration::from_secs(2)));
        assert_eq!(c.tcp_path(), (TcpPath::Splice, None));
        assert!(c.switch_spec(5, 0).tcp_splice.is_some());
        let proxy = parse(&EXAMPLE.replace("tcp = \"splice\"", "tcp = \"proxy\"")).unwrap();
        assert_eq!(proxy.tcp_path(), (TcpPath::Proxy, None));
        assert!(proxy.switch_spec(5, 0).tcp_splice.is_none());
        let no_local =
            parse(&EXAMPLE.replace("local_port = \"kvs-local\"", "local_port = \"\"")).unwrap();
        let (path, why) = no_local.tcp_path();
        assert_eq!(path, TcpPath::Proxy);
        assert!(why.is_some_and(|w| w.contains("local port")), "{why:?}");
        assert!(no_local.switch_spec(4, 0).tcp_splice.is_none());
        for (from, to, key) in [
            ("tcp = \"splice\"", "tcp = \"udp\"", "switch.tcp"),
            (
                "tcp_max_flows = 65536",
                "tcp_max_flows = 0",
                "switch.tcp_max_flows",
            ),
            ("tcp_idle_s = 300", "tcp_idle_s = 0", "switch.tcp_idle_s"),
            (
                "tcp_idle_s = 300",
                "tcp_idle_s = 604801",
                "switch.tcp_idle_s",
            ),
        ] {
            let e = parse(&EXAMPLE.replace(from, to)).unwrap_err().to_string();
            assert!(e.contains(key), "{e}");
        }
    }

    #[test]
    fn errors_name_file_and_key() {
        let bad = EXAMPLE.replace("mode = \"l3\"", "mode = \"l4\"");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(
            e.contains("test.toml") && e.contains("switch.mode") && e.contains("l4"),
            "{e}"
        );

        let bad = EXAMPLE.replace("addr = \"10.0.0.12:11211\"", "addr = \"10.0.0.12\"");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.contains("pool.servers[1].addr"), "{e}");

        let bad = EXAMPLE.replace("weight = 1", "weight = 0");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.contains("pool.servers[0].weight"), "{e}");

        let bad = EXAMPLE.replace("hash = \"md5\"", "hash = \"sha9\"");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.contains("pool.hash"), "{e}");

        let bad = EXAMPLE.replace("[vip]", "[vip]\nbogus = 1");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.contains("bogus"), "{e}");

        let bad = EXAMPLE.replace("weight = 1", "weight = -1");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.contains("`weight = -1`") && e.contains("line "), "{e}");

        let bad = EXAMPLE.replace("10.0.0.13:11211", "10.0.0.12:11211");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.contains("twice"), "{e}");

        let bad = EXAMPLE.replace("10.0.0.13:11211", "10.0.0.13:11212");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(
            e.contains("pool.servers[2].addr") && e.contains("VIP's port"),
            "{e}"
        );
    }

    #[test]
    fn l2_mode_has_no_default_agent() {
        let text = EXAMPLE
            .replace("mode = \"l3\"", "mode = \"l2\"")
            .replace("local_port = \"kvs-local\"", "local_port = \"\"");
        let c = parse(&text).unwrap();
        assert_eq!(c.mode, Mode::L2);
        assert_eq!(c.agent_ip, None);
        assert_eq!(c.local, None);
    }

    #[test]
    fn local_port_defaults() {
        let c = parse(EXAMPLE).unwrap();
        let local = c.local.clone().expect("on by default");
        assert_eq!(local.port, "kvs-local");
        assert_eq!(local.peer, "kvs-local-h");
        assert!(c.proxy);
        assert_eq!(c.proxy_workers, 1);
        assert_eq!(c.vip_prefix_len, 24);
        assert_eq!(c.local_source(), c.vip);
        assert_eq!(c.local_addrs(), vec![(c.vip, 24)]);

        // Left out entirely: the same defaults.
        let bare = EXAMPLE
            .replace("local_port = \"kvs-local\"\n", "")
            .replace("prefix_len = 24\n", "");
        assert_eq!(parse(&bare).unwrap().local, Some(local));
    }

    #[test]
    fn local_port_in_l2_mode_needs_an_agent_address() {
        let l2 = EXAMPLE.replace("mode = \"l3\"", "mode = \"l2\"");
        let e = parse(&l2).unwrap_err().to_string();
        assert!(
            e.contains("vip.agent_ip") && e.contains("local_port"),
            "{e}"
        );

        let c =
            parse(&l2.replace("# agent_ip = \"10.0.0.101\"", "agent_ip = \"10.0.0.101\"")).unwrap();
        let agent = Ipv4Addr::new(10, 0, 0, 101);
        assert_eq!(c.local_source(), agent);
        assert_eq!(c.local_addrs(), vec![(agent, 24), (c.vip, 32)]);
    }

    #[test]
    fn a_replicated_pool_in_l2_mode_needs_an_agent_address() {
        let l2 = EXAMPLE
            .replace("mode = \"l3\"", "mode = \"l2\"")
            .replace("local_port = \"kvs-local\"", "local_port = \"\"")
            .replace("# replicas = 1", "replicas = 2");
        let e = parse(&l2).unwrap_err().to_string();
        assert!(
            e.contains("pool.replicas") && e.contains("vip.agent_ip"),
            "{e}"
        );
        let with_agent = l2.replace("# agent_ip = \"10.0.0.101\"", "agent_ip = \"10.0.0.101\"");
        assert_eq!(parse(&with_agent).unwrap().replicas, 2);
        let l3 = EXAMPLE.replace("# replicas = 1", "replicas = 2");
        assert_eq!(parse(&l3).unwrap().replicas, 2);
    }

    #[test]
    fn local_port_names_are_checked() {
        let with = |line: &str| EXAMPLE.replace("local_port = \"kvs-local\"", line);
        let c = parse(&with("local_port = \"lp0\"\nlocal_peer = \"host0\"")).unwrap();
        assert_eq!(
            c.local,
            Some(LocalPort {
                port: "lp0".into(),
                peer: "host0".into()
            })
        );
        for (line, key) in [
            ("local_port = \"veth-s1\"", "switch.local_port"),
            ("local_port = \"a/b\"", "switch.local_port"),
            ("local_port = \"fifteen-chars-x\"", "switch.local_peer"),
            (
                "local_port = \"lp\"\nlocal_peer = \"lp\"",
                "switch.local_peer",
            ),
            (
                "local_port = \"lp\"\nlocal_peer = \"veth-c1\"",
                "switch.local_peer",
            ),
            ("local_port = \"\"\nlocal_peer = \"x\"", "switch.local_peer"),
        ] {
            let e = parse(&with(line)).unwrap_err().to_string();
            assert!(e.contains(key), "{line}: {e}");
        }
        let e = parse(&EXAMPLE.replace("proxy_workers = 1", "proxy_workers = 0"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("switch.proxy_workers"), "{e}");
        let e = parse(&EXAMPLE.replace("prefix_len = 24", "prefix_len = 33"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("vip.prefix_len"), "{e}");
        let e = parse(&EXAMPLE.replace("# agent_ip = \"10.0.0.101\"", "agent_ip = \"10.0.0.12\""))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("pool.servers[1].addr") && e.contains("agent"),
            "{e}"
        );
    }

    #[test]
    fn failure_keys_default_to_nutcrackers_but_the_timeout() {
        let c = parse(EXAMPLE).unwrap();
        assert_eq!(c.timeout, Duration::from_millis(1000));
        assert!(!c.auto_eject_hosts);
        assert_eq!(c.server_failure_limit, 2);
        assert_eq!(c.server_retry_timeout, Duration::from_secs(30));
        assert_eq!(c.server_connections, 1);
    }

    #[test]
    fn failure_keys_uncommented() {
        let text = EXAMPLE
            .replace("# timeout_ms = 1000", "timeout_ms = 250")
            .replace("# auto_eject_hosts = false", "auto_eject_hosts = true")
            .replace("# server_failure_limit = 2", "server_failure_limit = 5")
            .replace(
                "# server_retry_timeout_ms = 30000",
                "server_retry_timeout_ms = 100",
            )
            .replace("# server_connections = 1", "server_connections = 3");
        let c = parse(&text).unwrap();
        assert_eq!(c.timeout, Duration::from_millis(250));
        assert!(c.auto_eject_hosts);
        assert_eq!(c.server_failure_limit, 5);
        assert_eq!(c.server_retry_timeout, Duration::from_millis(100));
        assert_eq!(c.server_connections, 3);

        let listen: SocketAddr = "127.0.0.1:22121".parse().unwrap();
        let p = c.pool_spec(listen);
        assert_eq!(p.name, "default");
        assert_eq!(p.listen, listen);
        assert_eq!(
            (p.distribution, p.hash, p.hash_tag),
            (c.distribution, c.hash, None)
        );
        assert_eq!(p.timeout, Duration::from_millis(250));
        assert!(p.auto_eject_hosts);
        assert_eq!(p.server_failure_limit, 5);
        assert_eq!(p.server_retry_timeout, Duration::from_millis(100));
        assert_eq!(p.server_connections, 3);
        assert_eq!(p.servers.len(), c.servers.len());
        for (s, b) in p.servers.iter().zip(&c.servers) {
            assert_eq!(s.host, b.addr.ip().to_string());
            assert_eq!(s.addr, SocketAddr::V4(b.addr));
            assert_eq!((s.weight, &s.name), (b.weight, &b.name));
            assert_eq!(s.ring_name(), b.ring_name());
        }
    }

    #[test]
    fn failure_key_errors() {
        for (from, to, key) in [
            ("# timeout_ms = 1000", "timeout_ms = 0", "pool.timeout_ms"),
            (
                "# server_failure_limit = 2",
                "server_failure_limit = 0",
                "pool.server_failure_limit",
            ),
            (
                "# server_retry_timeout_ms = 30000",
                "server_retry_timeout_ms = 3600001",
                "pool.server_retry_timeout_ms",
            ),
            (
                "# server_connections = 1",
                "server_connections = 0",
                "pool.server_connections",
            ),
            (
                "# auto_eject_hosts = false",
                "auto_eject_hosts = 1",
                "auto_eject_hosts",
            ),
            // The switch hashes whole keys, so it cannot honour a hash tag.
            (
                "hash = \"md5\"",
                "hash = \"md5\"\nhash_tag = \"{}\"",
                "pool.hash_tag",
            ),
            // A Redis pool's keys in a memcached pool, and what a Redis pool cannot do.
            (
                "hash = \"md5\"",
                "hash = \"md5\"\nredis_db = 1",
                "pool.redis_db",
            ),
            (
                "hash = \"md5\"",
                "hash = \"md5\"\nredis = true\nredis_auth = \"\"",
                "pool.redis_auth",
            ),
            (
                "hash = \"md5\"",
                "hash = \"md5\"\nredis = true\nreplicas = 2",
                "pool.replicas",
            ),
        ] {
            let e = parse(&EXAMPLE.replace(from, to)).unwrap_err().to_string();
            assert!(e.contains("test.toml") && e.contains(key), "{to}: {e}");
        }
    }

    #[test]
    fn unnamed_server_on_default_port_hashes_by_host() {
        let c = parse(&EXAMPLE.replace("name = \"s2\"", "")).unwrap();
        assert_eq!(c.servers[1].ring_name(), "10.0.0.12");
    }

    #[test]
    fn a_redis_pool_needs_its_proxy() {
        let text = EXAMPLE
            .replace("hash = \"md5\"", "hash = \"md5\"\nredis = true")
            .replace("\nproxy = true", "\nproxy = false");
        let e = parse(&text).unwrap_err().to_string();
        assert!(e.contains("switch.proxy") && e.contains("Redis"), "{e}");
    }

    #[test]
    fn a_redis_pool_listens_on_redis_port_and_the_switch_speaks_redis() {
        let c = parse(&EXAMPLE.replace("hash = \"md5\"", "hash = \"md5\"\nredis = true"))
            .expect("a Redis pool");
        let redis = c.redis.clone().expect("redis");
        assert_eq!((redis.auth, redis.db), (None, 0));
        let spec = c.switch_spec(c.ports.len() + 1, 0);
        assert!(spec.redis);
        assert!(c.switch_pool_spec().redis.is_some());
        let c = parse(EXAMPLE).expect("the example");
        assert!(c.redis.is_none() && !c.switch_spec(c.ports.len() + 1, 0).redis);
    }
}
