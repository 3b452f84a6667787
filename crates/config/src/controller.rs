//! The controller's configuration file (TOML): `[controller]` (its API and how it probes),
//! the switches it drives (`[[switches]]`, each by its control API) and the one `[pool]` it
//! owns, with the same pool keys as the proxy's and the switch's files.
//!
//! ```toml
//! [controller]
//! api = "127.0.0.1:9200"        # the controller's own API: status, metrics, pool changes
//! api_hosts = ["ctl.example"]   # names it is reached by besides its address and localhost
//! api_max_connections = 256     # connections past these are closed at once
//! api_header_timeout_ms = 10000 # a request's headers must arrive within this long
//! probe_interval_ms = 100       # each server is asked `version` (`PING` in a Redis pool)
//!                               # this often, over TCP
//! probe_timeout_ms = 100        # ... and must answer within this long
//! probe_udp = false             # also over UDP (memcached started with -U)
//! failover = ["10.0.0.19:11211"]  # spares that take a dead server's keys, in its place
//! down_after = 3                # failed probes in a row before a server is marked down
//! tko_after = 3                 # ... or failed requests the switches report in one interval
//!                               #     (0: their reports are not read)
//! up_after = 2                  # answered probes in a row before it is up again
//! flush_on_return = true        # a server out of the pool is emptied (flush_all; in a Redis
//!                               # pool FLUSHDB of its database, after AUTH) as it is
//!                               # probed, so it comes back without items replaced meanwhile
//! return_warm_ms = 0            # a server back from being down warms up this long (0: not)
//! sync_interval_ms = 1000       # every switch's pool is checked this often anyway
//! switch_token_file = "token"   # optional: the token the switches' APIs want
//! cache_node_port = 11211       # optional: SwitchKV cache nodes the switches' kv_steer entries
//!                               # lead to are probed on this port; one that fails down_after
//!                               # probes in a row loses its entries on every switch
//! fabric = "fabric.toml"        # optional: keep this caching fabric's registration table
//!                               # (relative to this file); [[switches]] and [pool] may then
//!                               # be left out
//! pool_changes = "each"         # "each": every switch brought to the pool on its own (one
//!                               # out of reach holds up no other); "together": every switch
//!                               # takes each change at one instant, or none does
//! keep_switch_state = true      # copy each switch's tables, entries, interfaces, groups,
//!                               # registers and egress rates, and put them back on a switch
//!                               # that restarts
//! state_file = "state.json"     # optional: keep those copies and the routes in this file
//!                               # (relative to this file), so that they outlive the
//!                               # controller too; with --store they are kept in etcd
//! bounded_loads = 0.25          # optional: place the ring's arcs so that no server takes
//!                               # more than 1.25 times its share of the requests the
//!                               # switches count (consistent hashing with bounded loads)
//! balance_interval_ms = 2000    # ... measured and placed again this often
//! balance_min_requests = 1000   # ... when at least this many requests were counted
//!
//! [[switches]]
//! name = "sw1"
//! api = "10.0.0.1:9110"
//!
//! [pool]
//! distribution = "ketama"
//! hash = "md5"
//! [[pool.servers]]
//! addr = "10.0.0.11:11211"
//! name = "s1"
//!
//! # Optional: the pool follows its load, read from each server's own `stats`: weights moved
//! # within bounds toward an even load, spares added and removed with the load.
//! [scale]
//! interval_ms = 1000            # the servers' counters read this often
//! signal = "requests"           # "requests" (commands a second) or "bytes" (read and written)
//! sustain = 3                   # readings in a row past a bound before a change, and between
//! weights = [0.5, 2.0]          # a server's weight kept within these factors of its own ...
//! weight_band = 0.2             # ... moved when its load is this far from its weight's share
//! spares = ["10.0.0.21:11211"]  # added in order (emptied first) when the mean load per
//! add_above = 50000             # server passes this; removed, last added first, when the
//! remove_below = 20000          # pool without one would be under this per server
//! warm_up_ms = 5000             # a spare added warms up this long (0: not)
//!
//! # Optional: routes the controller keeps on the switches, replaced as a whole by
//! # `PUT /api/v1/routes` and updated consistently (each frame meets one version only).
//! [routes]
//! match = { ip_dst = { value = "10.9.0.0", mask = "255.255.255.0" } }  # the frames routed
//! priority = 1000               # of the `acl` entry that sends them to the controller's tables
//! drain_ms = 100                # the old version stays this long after the new one stamps
//! [routes.edge_ports]           # per switch: ports where frames enter the fabric
//! sw1 = [0]
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::api::{ApiServing, RawApiServing};
use super::ConfigError;
use switch::control::Value;
use switch::pool::PoolSpec;

/// Most switches one controller drives.
pub const MAX_SWITCHES: usize = 256;
/// Most spares a list holds: `failover`, and `[scale]`'s `spares`.
pub const MAX_SPARES: usize = 64;

/// One switch the controller drives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwitchRef {
    pub name: String,
    /// Its control API (`[switch].api` of its own file).
    pub api: SocketAddr,
}

/// A loaded controller configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ControllerFile {
    pub path: PathBuf,
    pub api: SocketAddr,
    /// How the API bounds its clients (`[controller]`'s `api_max_connections`,
    /// `api_header_timeout_ms`, `api_hosts`).
    pub api_serving: ApiServing,
    pub probe_interval: Duration,
    pub probe_timeout: Duration,
    /// Probe over UDP as well as TCP: a server is up only while it answers both.
    pub probe_udp: bool,
    /// Spare servers: a dead server's place on the ring goes to the first free one, instead
    /// of its keys moving to the next server.
    pub failover: Vec<SocketAddr>,
    pub down_after: u32,
    /// Failed requests the switches report for a server within one probe interval that mark
    /// it down at once (TKO), until its probes answer again; 0: the reports are not read.
    pub tko_after: u32,
    pub up_after: u32,
    /// Empty a server that is out of the pool as it is probed (`flush_all`), so that it comes
    /// back without the items that writes made elsewhere while it was out have replaced.
    pub flush_on_return: bool,
    /// A server back from being down is put back warming up for this long (see `warm_ms` of
    /// the pool API): a get through the proxy that misses on it is read where the key was
    /// meanwhile, such as its other replica.
    pub return_warm: Option<Duration>,
    pub sync_interval: Duration,
    /// The memcached port of the SwitchKV cache nodes the switches' `kv_steer` entries lead
    /// to, where they are probed; `None` (the default, or 0): they are not. Every node must
    /// serve on it: one that does not answer there loses its entries.
    pub cache_node_port: Option<u16>,
    /// The file whose first line is the switches' API token (relative to this file's
    /// directory).
    pub switch_token_file: Option<PathBuf>,
    /// HTTPS to the switches' APIs (`switch_tls_ca`; `switch_tls_cert` and `switch_tls_key`
    /// for switches that ask for a client certificate).
    pub switch_tls: Option<crate::proxy::ServerTlsFiles>,
    /// The servers require SASL (`memcached -S`): they are probed in the binary protocol,
    /// authenticated as this user (`server_sasl_user`, `server_sasl_password_file`).
    pub server_sasl: Option<crate::proxy::SaslFiles>,
    /// The fabric file (`kvswitch fabric`) of a caching fabric whose registration table this
    /// controller keeps: its switches are probed, and a new table installed on them all when
    /// one fails or comes back.
    pub fabric: Option<PathBuf>,
    /// How a change of the pool reaches the switches.
    pub pool_changes: PoolChanges,
    /// Copy what an operator put on each switch (tables, entries, interfaces, groups,
    /// registers, egress rates) and put it back on a switch that restarts.
    pub keep_switch_state: bool,
    /// Where those copies and the routes are kept without a store (relative to this file's
    /// directory); `None`: in memory only.
    pub state_file: Option<PathBuf>,
    /// Consistent hashing with bounded loads (`bounded_loads`, ε): the ring's arcs placed so
    /// that no server takes more than `1 + ε` times its share of the requests counted.
    pub balance: Option<Balance>,
    pub switches: Vec<SwitchRef>,
    /// The pool every switch serves; its `listen` is unused.
    pub pool: PoolSpec,
    /// The routes the controller keeps on the switches (`[routes]`), if any.
    pub routes: Option<RoutesSpec>,
    /// How the pool follows its load (`[scale]`), if it does.
    pub scale: Option<Scale>,
}

/// How the pool follows its load (`[scale]`): weights moved within bounds, spares added and
/// removed, by the load the servers' own `stats` give.
#[derive(Debug, Clone, PartialEq)]
pub struct Scale {
    /// Each server's counters read this often.
    pub interval: Duration,
    /// What load is.
    pub signal: Signal,
    /// Readings in a row past a bound before anything changes, and after a change, readings
    /// before the next.
    pub sustain: u32,
    /// Each server's weight is kept within these factors of its own (`[pool]`'s, or the one
    /// it was added with); none: weights stay.
    pub weights: Option<(f64, f64)>,
    /// A server whose load is further than this from its weight's share of the pool's load
    /// has its weight moved.
    pub weight_band: f64,
    /// Added in order when the mean load per server passes `add_above`; removed, last added
    /// first, when the pool without one would be under `remove_below` per server.
    pub spares: Vec<SocketAddr>,
    pub add_above: f64,
    pub remove_below: f64,
    /// A spare added warms up this long (misses asked of the keys' previous owners).
    pub warm_up: Option<Duration>,
}

/// What the scaler counts as load (`signal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// Commands per second: gets, sets, touches, deletes, increments and decrements.
    Requests,
    /// Bytes read and written per second.
    Bytes,
}

impl Signal {
    pub fn name(self) -> &'static str {
        match self {
            Signal::Requests => "requests",
            Signal::Bytes => "bytes",
        }
    }
}

/// How the controller places the ring's arcs by load (`bounded_loads` and its keys).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Balance {
    /// A server may take `1 + epsilon` times its share of the load.
    pub epsilon: f64,
    /// Loads read from the switches, and arcs placed again, this often.
    pub interval: Duration,
    /// Fewer requests counted in an interval than this: too few to judge by; nothing moves.
    pub min_requests: u64,
}

/// The largest `bounded_loads` taken: beyond it no arc would move.
pub const MAX_BOUNDED_LOADS: f64 = 10.0;

/// How a change of the pool reaches the switches (`pool_changes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PoolChanges {
    /// Each switch is brought to the pool on its own: one out of reach holds up no other, and
    /// for a few milliseconds switches may route a moved key by different pools.
    #[default]
    Each,
    /// Staged on every switch and taken by all at one instant; a switch that refuses or is
    /// out of reach stops the change, and the old pool stays in force everywhere.
    Together,
}

impl PoolChanges {
    pub fn name(self) -> &'static str {
        match self {
            PoolChanges::Each => "each",
            PoolChanges::Together => "together",
        }
    }
}

/// How the controller keeps versioned routes on its switches (`[routes]`).
#[derive(Debug, Clone, PartialEq)]
pub struct RoutesSpec {
    /// The frames the controller routes, as a match in the fields of the switches' `acl`
    /// table (never empty: the controller takes no switch's whole traffic by default).
    pub traffic: BTreeMap<String, Value>,
    /// The priority of the `acl` entry that sends those frames to the controller's tables.
    pub priority: u32,
    /// How long the old version stays installed after every switch stamps the new one: longer
    /// than a frame can spend inside the fabric.
    pub drain: Duration,
    /// Per switch (by name): the ports where frames enter the fabric and are stamped.
    pub edge_ports: BTreeMap<String, Vec<u16>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    controller: Option<RawController>,
    #[serde(default)]
    switches: Vec<RawSwitchRef>,
    /// Required unless the controller keeps only a fabric's table.
    pool: Option<toml::Table>,
    #[serde(default)]
    routes: Option<RawRoutes>,
    #[serde(default)]
    scale: Option<RawScale>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScale {
    interval_ms: Option<u64>,
    signal: Option<String>,
    sustain: Option<u32>,
    weights: Option<[f64; 2]>,
    weight_band: Option<f64>,
    #[serde(default)]
    spares: Vec<String>,
    add_above: Option<f64>,
    remove_below: Option<f64>,
    warm_up_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoutes {
    #[serde(rename = "match", default)]
    traffic: BTreeMap<String, Value>,
    priority: Option<u32>,
    drain_ms: Option<u64>,
    #[serde(default)]
    edge_ports: BTreeMap<String, Vec<u16>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawController {
    api: Option<String>,
    api_max_connections: Option<usize>,
    api_header_timeout_ms: Option<u64>,
    api_hosts: Option<Vec<String>>,
    api_tls_cert: Option<PathBuf>,
    api_tls_key: Option<PathBuf>,
    api_tls_client_ca: Option<PathBuf>,
    probe_interval_ms: Option<u64>,
    probe_timeout_ms: Option<u64>,
    probe_udp: Option<bool>,
    #[serde(default)]
    failover: Vec<String>,
    down_after: Option<u32>,
    tko_after: Option<u32>,
    up_after: Option<u32>,
    flush_on_return: Option<bool>,
    return_warm_ms: Option<u64>,
    sync_interval_ms: Option<u64>,
    switch_token_file: Option<String>,
    switch_tls_ca: Option<PathBuf>,
    switch_tls_cert: Option<PathBuf>,
    switch_tls_key: Option<PathBuf>,
    server_sasl_user: Option<String>,
    server_sasl_password_file: Option<PathBuf>,
    cache_node_port: Option<u16>,
    fabric: Option<String>,
    keep_switch_state: Option<bool>,
    state_file: Option<String>,
    pool_changes: Option<String>,
    bounded_loads: Option<f64>,
    balance_interval_ms: Option<u64>,
    balance_min_requests: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSwitchRef {
    name: String,
    api: String,
}

/// A controller file with every key it takes, as `kvswitch controller --example-config`
/// prints it and the README shows it.
pub const EXAMPLE: &str = r#"# controller.toml: a fleet of two switches serving one pool (`kvswitch controller --config`).
[controller]
api = "127.0.0.1:9200"        # its own API: status, metrics, pool changes
probe_interval_ms = 100       # each server is asked `version` (`PING` in a Redis pool) over TCP this often ...
probe_timeout_ms = 100        # ... and must answer within this long
probe_udp = false             # also over UDP, for servers reached without an l3 switch
                              # in between (through one, their UDP replies come from the VIP)
failover = ["10.0.0.19:11211"]  # optional spares: a dead server's place goes to one of them
down_after = 3                # failed probes in a row: out of every switch's pool
tko_after = 3                 # or this many failed requests the switches report in one
                              # probe interval (TKO); 0 reads no reports
up_after = 2                  # answered probes in a row: back in
flush_on_return = true        # empty a server that is out as it is probed (below)
return_warm_ms = 0            # a server back from being down warms up this long (0: off)
sync_interval_ms = 1000       # every switch is checked this often anyway
# switch_token_file = "token" # optional: the file of the token the switches' APIs want
                              # (the controller's own API takes KVSWITCH_API_TOKEN)
# switch_tls_ca = "ca.crt"    # optional: speak HTTPS to the switches' APIs, trusting this
                              # authority (switch_tls_cert and switch_tls_key: a client
                              # certificate for switches that ask for one)
# server_sasl_user = "kvswitch"   # optional: the servers require SASL (memcached -S): they
# server_sasl_password_file = "servers.password"  # are probed in the binary protocol as this user
# api_tls_cert = "controller.crt"  # optional: the controller's own API over HTTPS
# api_tls_key = "controller.key"   # (api_tls_client_ca: clients must show a certificate)
cache_node_port = 11211       # optional: SwitchKV cache nodes are probed on this port
pool_changes = "each"         # "each": every switch brought to the pool on its own (one
                              # out of reach holds up no other); "together": every switch
                              # takes each change at one instant, or none does
keep_switch_state = true      # copy each switch's tables, entries, interfaces, groups,
                              # registers and egress rates; put them back when it restarts
# state_file = "state.json"   # optional: keep the copies and the routes in this file (with
                              # --store: in etcd), so that they outlive the controller
# bounded_loads = 0.25        # optional: place the ring's arcs by the requests the switches
                              # count, so that no server takes over 1.25 times its share
                              # (consistent hashing with bounded loads; ketama pools only)
# balance_interval_ms = 2000  # ... loads read and arcs placed again this often
# balance_min_requests = 1000 # ... when at least this many requests were counted

[[switches]]
name = "sw1"
api = "10.0.0.1:9110"

[[switches]]
name = "sw2"
api = "10.0.0.2:9110"

[pool]                        # the same keys as a switch's or proxy's [pool]
distribution = "ketama"
hash = "md5"
[[pool.servers]]
addr = "10.0.0.11:11211"
name = "s1"

[scale]                       # optional: the pool follows its load, read from each server's
                              # own `stats` (memcached pools)
interval_ms = 1000            # the servers' counters read this often
signal = "requests"           # "requests" (commands a second) or "bytes" (read and written)
sustain = 3                   # readings in a row past a bound before a change, and between
weights = [0.5, 2.0]          # optional: a server's weight kept within these factors of its
                              # own, moved toward an even load ...
weight_band = 0.2             # ... when its load is this far from its weight's share
spares = ["10.0.0.21:11211"]  # optional: added in order, emptied first, when the mean load
add_above = 50000             # per server passes this; removed, last added first, when the
remove_below = 20000          # pool without one would be under this per server
warm_up_ms = 5000             # a spare added warms up this long (0: not)

[routes]                      # optional: routes kept on the switches, updated consistently
match = { ethertype = "0x0800", ip_dst = { value = "10.9.0.0", mask = "255.255.255.0" } }
priority = 1000               # of the acl entry that sends those frames to the routes
drain_ms = 100                # the old version stays this long after the new one stamps
[routes.edge_ports]           # per switch: ports where frames enter the fabric
sw1 = [0, 1]
"#;

/// A list of spares' addresses under `key`: at most [`MAX_SPARES`], each an address (such as
/// `example`), none twice.
fn spare_list(
    texts: &[String],
    key: &str,
    example: &str,
    path: &Path,
) -> Result<Vec<SocketAddr>, ConfigError> {
    if texts.len() > MAX_SPARES {
        return Err(ConfigError::new(
            path,
            key,
            format!("{} spares; at most {MAX_SPARES}", texts.len()),
        ));
    }
    let mut list: Vec<SocketAddr> = Vec::with_capacity(texts.len());
    for (i, text) in texts.iter().enumerate() {
        let at = format!("{key}[{i}]");
        let addr = text.parse::<SocketAddr>().map_err(|_| {
            ConfigError::new(
                path,
                &at,
                format!("`{text}` is not an address such as {example}"),
            )
        })?;
        if list.contains(&addr) {
            return Err(ConfigError::new(
                path,
                &at,
                format!("{addr} is listed twice"),
            ));
        }
        list.push(addr);
    }
    Ok(list)
}

/// `[scale]`, checked.
fn scale(r: RawScale, path: &Path) -> Result<Scale, ConfigError> {
    let err = |key: &str, message: String| ConfigError::new(path, &format!("scale.{key}"), message);
    let interval = r.interval_ms.unwrap_or(1000);
    if !(100..=3_600_000).contains(&interval) {
        return Err(err(
            "interval_ms",
            format!("{interval} is out of range; use 100 to 3600000"),
        ));
    }
    let signal = match r.signal.as_deref() {
        None | Some("requests") => Signal::Requests,
        Some("bytes") => Signal::Bytes,
        Some(other) => {
            return Err(err(
                "signal",
                format!("{other:?}: use \"requests\" or \"bytes\""),
            ))
        }
    };
    let sustain = r.sustain.unwrap_or(3);
    if !(1..=1000).contains(&sustain) {
        return Err(err(
            "sustain",
            format!("{sustain} is out of range; use 1 to 1000"),
        ));
    }
    let weights = match r.weights {
        None => None,
        Some([lo, hi]) if (0.05..=1.0).contains(&lo) && (1.0..=100.0).contains(&hi) && lo < hi => {
            Some((lo, hi))
        }
        Some([lo, hi]) => {
            return Err(err(
                "weights",
                format!(
                    "[{lo}, {hi}]: the least factor must be 0.05 to 1, the most \
                     at least 1 and at most 100, and they must differ"
                ),
            ))
        }
    };
    let weight_band = r.weight_band.unwrap_or(0.2);
    if !(weight_band > 0.0 && weight_band < 1.0) {
        return Err(err(
            "weight_band",
            format!("{weight_band}: use a fraction above 0 and below 1"),
        ));
    }
    if r.weight_band.is_some() && weights.is_none() {
        return Err(err("weight_band", "it needs weights".into()));
    }
    let spares = spare_list(&r.spares, "scale.spares", "10.0.0.21:11211", path)?;
    let (add_above, remove_below) = match (spares.is_empty(), r.add_above, r.remove_below) {
        (true, None, None) => (f64::INFINITY, 0.0),
        (true, _, _) => {
            return Err(err(
                "spares",
                "add_above and remove_below need spares to add and remove".into(),
            ))
        }
        (false, Some(add), _) if !(add > 0.0 && add.is_finite()) => {
            return Err(err(
                "add_above",
                format!("{add}: a load per server per second above 0"),
            ))
        }
        (false, Some(add), Some(remove)) if remove > 0.0 && remove < add => (add, remove),
        (false, Some(add), Some(remove)) => {
            return Err(err(
                "remove_below",
                format!(
                    "{remove} (add_above is {add}): a load per server per second above 0 (or \
                     a spare would never leave) and below add_above (or a spare added would \
                     be taken out at once)"
                ),
            ))
        }
        (false, None, _) => {
            return Err(err(
                "add_above",
                "spares need add_above and remove_below (loads per server per second)".into(),
            ))
        }
        (false, Some(_), None) => {
            return Err(err(
                "remove_below",
                "spares need add_above and remove_below (loads per server per second)".into(),
            ))
        }
    };
    if weights.is_none() && spares.is_empty() {
        return Err(err(
            "weights",
            "[scale] needs weights, spares or both: with neither it would only watch".into(),
        ));
    }
    if r.warm_up_ms.is_some() && spares.is_empty() {
        return Err(err("warm_up_ms", "it needs spares".into()));
    }
    let warm_up = match r.warm_up_ms.unwrap_or(0) {
        0 => None,
        n if n <= 86_400_000 => Some(Duration::from_millis(n)),
        n => {
            return Err(err(
                "warm_up_ms",
                format!("{n} is out of range; use 0 to 86400000"),
            ))
        }
    };
    Ok(Scale {
        interval: Duration::from_millis(interval),
        signal,
        sustain,
        weights,
        weight_band,
        spares,
        add_above,
        remove_below,
        warm_up,
    })
}

/// Reads a controller configuration, resolving every hostname in its pool.
pub fn load(path: &Path) -> Result<ControllerFile, ConfigError> {
    let text = crate::read_file(path)
        .map_err(|e| ConfigError::new(path, "", format!("cannot read: {e}")))?;
    parse(&text, path)
}

/// Parses configuration text as [`load`] does; `path` is used in messages.
pub fn parse(text: &str, path: &Path) -> Result<ControllerFile, ConfigError> {
    let raw: RawFile = toml::from_str(text).map_err(|e| ConfigError::toml(path, text, &e))?;
    let err = |key: &str, message: String| ConfigError::new(path, key, message);
    let c = raw.controller.unwrap_or_default();
    let api_text = c.api.as_deref().unwrap_or("127.0.0.1:9200");
    let api = api_text.parse::<SocketAddr>().map_err(|_| {
        err(
            "controller.api",
            format!("`{api_text}` is not an address such as 127.0.0.1:9200"),
        )
    })?;
    let api_serving = RawApiServing {
        max_connections: c.api_max_connections,
        header_timeout_ms: c.api_header_timeout_ms,
        hosts: c.api_hosts.clone(),
        tls_cert: c.api_tls_cert.clone(),
        tls_key: c.api_tls_key.clone(),
        tls_client_ca: c.api_tls_client_ca.clone(),
    }
    .check(path, "controller")?;
    let ms = |key: &str, value: Option<u64>, default: u64, range: (u64, u64)| {
        let v = value.unwrap_or(default);
        match (range.0..=range.1).contains(&v) {
            true => Ok(Duration::from_millis(v)),
            false => Err(err(
                &format!("controller.{key}"),
                format!("{v} is out of range; use {} to {}", range.0, range.1),
            )),
        }
    };
    let probe_interval = ms("probe_interval_ms", c.probe_interval_ms, 100, (10, 60_000))?;
    let probe_timeout = ms("probe_timeout_ms", c.probe_timeout_ms, 100, (1, 60_000))?;
    let sync_interval = ms(
        "sync_interval_ms",
        c.sync_interval_ms,
        1000,
        (50, 3_600_000),
    )?;
    let count = |key: &str, value: Option<u32>, default: u32| {
        let v = value.unwrap_or(default);
        match (1..=1000).contains(&v) {
            true => Ok(v),
            false => Err(err(
                &format!("controller.{key}"),
                format!("{v} is out of range; use 1 to 1000"),
            )),
        }
    };
    let down_after = count("down_after", c.down_after, 3)?;
    let up_after = count("up_after", c.up_after, 2)?;
    let tko_after = match c.tko_after {
        Some(0) => 0,
        other => count("tko_after", other, 3)?,
    };
    let return_warm = match c.return_warm_ms.unwrap_or(0) {
        0 => None,
        n => Some(ms("return_warm_ms", Some(n), 0, (1, 86_400_000))?),
    };
    let base = path.parent().unwrap_or(Path::new("."));
    let switch_token_file = c.switch_token_file.map(|f| base.join(f));
    let switch_tls = crate::proxy::ServerTlsFiles::from_parts(
        c.switch_tls_ca.map(|f| base.join(f)),
        c.switch_tls_cert.map(|f| base.join(f)),
        c.switch_tls_key.map(|f| base.join(f)),
        |k| format!("controller.{}", k.replacen("server", "switch", 1)),
    )
    .map_err(|(k, e)| err(&k, e.replace("server_tls", "switch_tls")))?;
    let server_sasl = crate::proxy::SaslFiles::from_parts(
        c.server_sasl_user.clone(),
        c.server_sasl_password_file.map(|f| base.join(f)),
        |k| format!("controller.{k}"),
    )
    .map_err(|(k, e)| err(&k, e))?;
    let fabric = c.fabric.map(|f| base.join(f));
    let pool_changes = match c.pool_changes.as_deref() {
        None | Some("each") => PoolChanges::Each,
        Some("together") => PoolChanges::Together,
        Some(other) => {
            return Err(err(
                "controller.pool_changes",
                format!("{other:?}: use \"each\" or \"together\""),
            ))
        }
    };
    let balance = match c.bounded_loads {
        None => {
            if c.balance_interval_ms.is_some() || c.balance_min_requests.is_some() {
                return Err(err(
                    "controller.bounded_loads",
                    "balance_interval_ms and balance_min_requests need bounded_loads".into(),
                ));
            }
            None
        }
        Some(e) if !(e > 0.0 && e <= MAX_BOUNDED_LOADS) => {
            return Err(err(
                "controller.bounded_loads",
                format!("{e}: ε must be above 0 and at most {MAX_BOUNDED_LOADS}"),
            ))
        }
        Some(epsilon) => Some(Balance {
            epsilon,
            interval: ms(
                "balance_interval_ms",
                c.balance_interval_ms,
                2000,
                (100, 3_600_000),
            )?,
            min_requests: c.balance_min_requests.unwrap_or(1000),
        }),
    };
    let state_file = match c.state_file {
        Some(f) if f.trim().is_empty() => {
            return Err(err(
                "controller.state_file",
                "an empty path: leave the key out".into(),
            ))
        }
        Some(f) => Some(base.join(f)),
        None => None,
    };

    let failover = spare_list(&c.failover, "controller.failover", "10.0.0.19:11211", path)?;
    if raw.switches.is_empty() && fabric.is_none() {
        return Err(err(
            "switches",
            "no switches: add [[switches]] with a name and the api of each (or a `fabric` \
             file under [controller])"
                .into(),
        ));
    }
    if raw.switches.len() > MAX_SWITCHES {
        return Err(err(
            "switches",
            format!(
                "{} switches; one controller drives at most {MAX_SWITCHES}",
                raw.switches.len()
            ),
        ));
    }
    let mut switches: Vec<SwitchRef> = Vec::with_capacity(raw.switches.len());
    for (i, s) in raw.switches.iter().enumerate() {
        let key = |field: &str| format!("switches[{i}].{field}");
        if s.name.is_empty() || switches.iter().any(|o| o.name == s.name) {
            return Err(err(
                &key("name"),
                format!("`{}` is empty or names another switch too", s.name),
            ));
        }
        let api = s.api.parse::<SocketAddr>().map_err(|_| {
            err(
                &key("api"),
                format!("`{}` is not an address such as 10.0.0.1:9110", s.api),
            )
        })?;
        switches.push(SwitchRef {
            name: s.name.clone(),
            api,
        });
    }

    // The pool is read as the proxy reads its own: the same keys, the same messages.
    let only_fabric = raw.pool.is_none() && fabric.is_some();
    // Without one, the pool's settings at their defaults (read with a stand-in server, taken
    // out below: a pool file must name one).
    let empty_pool = || {
        let mut server = toml::Table::new();
        server.insert("addr".into(), "127.0.0.1:1".into());
        let mut t = toml::Table::new();
        t.insert("servers".into(), toml::Value::Array(vec![server.into()]));
        t
    };
    let Some(raw_pool) = raw.pool.or_else(|| only_fabric.then(empty_pool)) else {
        return Err(err(
            "pool",
            "no [pool]: add the pool the switches serve (or a `fabric` file under [controller])"
                .into(),
        ));
    };
    let mut pool_only = toml::Table::new();
    pool_only.insert("pool".into(), toml::Value::Table(raw_pool));
    let pool_text = toml::to_string(&pool_only)
        .map_err(|e| err("pool", format!("cannot be read back: {e}")))?;
    let mut pool = super::proxy::parse_toml(&pool_text, path)
        .map_err(|mut e| {
            // A line number would count lines of the pool alone: name the table instead.
            if let Some((_, rest)) = e
                .message
                .strip_prefix("line ")
                .and_then(|m| m.split_once(": "))
            {
                e.message = format!("in [pool]: {rest}");
            }
            e
        })?
        .pool;
    if only_fabric {
        pool.servers.clear();
    }
    if pool.servers.is_empty() && !only_fabric {
        return Err(err(
            "pool.servers",
            "no servers: add [[pool.servers]] with the addr of each".into(),
        ));
    }
    if balance.is_some() && (pool.distribution != kv::Distribution::Ketama || pool.replicas > 1) {
        return Err(err(
            "controller.bounded_loads",
            "bounded loads place the arcs of a ketama ring: the pool must be ketama, \
             without replicas"
                .into(),
        ));
    }
    if pool.redis.is_some() && c.probe_udp == Some(true) {
        return Err(err(
            "controller.probe_udp",
            "a Redis pool's servers speak TCP only: remove it".into(),
        ));
    }
    if let Some(i) = failover
        .iter()
        .position(|a| pool.servers.iter().any(|s| s.addr == *a))
    {
        return Err(err(
            &format!("controller.failover[{i}]"),
            format!(
                "{} is a server of the pool; a spare stands apart",
                failover[i]
            ),
        ));
    }
    let routes = match raw.routes {
        Some(r) => Some(routes(r, &switches, path)?),
        None => None,
    };
    let scale = match raw.scale {
        Some(r) => Some(scale(r, path)?),
        None => None,
    };
    if let Some(scale) = &scale {
        let refuse = |message: &str| Err(err("scale", message.into()));
        if pool.redis.is_some() {
            return refuse("the scaler reads memcached's `stats`; a Redis pool cannot scale");
        }
        if server_sasl.is_some() {
            return refuse("the scaler reads `stats` in the text protocol, which servers that require SASL refuse");
        }
        if pool.distribution != kv::Distribution::Ketama || pool.replicas > 1 {
            return refuse(
                "the scaler moves weights in a ketama ring and adds servers to it: the pool \
                 must be ketama, without replicas (under modula or jump a change moves keys \
                 between every server)",
            );
        }
        if let Some((_, hi)) = scale.weights {
            // Moved weights are hundredths of the servers' own: their sum must fit.
            let most: f64 = pool
                .servers
                .iter()
                .map(|s| f64::from(s.weight))
                .sum::<f64>()
                * 100.0
                * hi
                * 2.0;
            if most > f64::from(u32::MAX) {
                return Err(err(
                    "scale.weights",
                    format!(
                        "the pool's weights times 100 times {hi}, spares included, would pass \
                         2^32: use smaller weights in [pool] or a smaller factor"
                    ),
                ));
            }
        }
        if scale.weights.is_some() && balance.is_some() {
            return refuse(
                "weights and bounded_loads would both even out the load, each undoing the \
                 other: keep one",
            );
        }
        for (i, a) in scale.spares.iter().enumerate() {
            let key = format!("scale.spares[{i}]");
            if pool.servers.iter().any(|s| s.addr == *a) {
                return Err(err(&key, format!("{a} is a server of the pool already")));
            }
            if failover.contains(a) {
                return Err(err(&key, format!("{a} is a failover spare too")));
            }
        }
    }
    Ok(ControllerFile {
        path: path.to_owned(),
        api,
        api_serving,
        probe_interval,
        probe_timeout,
        probe_udp: c.probe_udp.unwrap_or(false),
        failover,
        down_after,
        tko_after,
        flush_on_return: c.flush_on_return.unwrap_or(true),
        return_warm,
        up_after,
        sync_interval,
        cache_node_port: c.cache_node_port.filter(|&p| p != 0),
        switch_token_file,
        switch_tls,
        server_sasl,
        fabric,
        pool_changes,
        scale,
        keep_switch_state: c.keep_switch_state.unwrap_or(true),
        state_file,
        balance,
        switches,
        pool,
        routes,
    })
}

/// Checks `[routes]`: a match to route by, a drain time in range, edge ports of known switches.
fn routes(r: RawRoutes, switches: &[SwitchRef], path: &Path) -> Result<RoutesSpec, ConfigError> {
    let err = |key: &str, message: String| ConfigError::new(path, key, message);
    if r.traffic.is_empty() {
        return Err(err(
            "routes.match",
            "say which frames the controller routes, as a match in acl's fields \
             (for example ip_dst with a mask)"
                .into(),
        ));
    }
    let drain_ms = r.drain_ms.unwrap_or(100);
    if drain_ms > 60_000 {
        return Err(err(
            "routes.drain_ms",
            format!("{drain_ms} is out of range; use 0 to 60000"),
        ));
    }
    for (name, ports) in &r.edge_ports {
        if !switches.iter().any(|s| s.name == *name) {
            return Err(err(
                &format!("routes.edge_ports.{name}"),
                format!("no switch named `{name}` in [[switches]]"),
            ));
        }
        if let Some(p) = ports
            .iter()
            .enumerate()
            .find_map(|(i, p)| ports[..i].contains(p).then_some(p))
        {
            return Err(err(
                &format!("routes.edge_ports.{name}"),
                format!("port {p} is listed twice"),
            ));
        }
    }
    Ok(RoutesSpec {
        traffic: r.traffic,
        priority: r.priority.unwrap_or(1000),
        drain: Duration::from_millis(drain_ms),
        edge_ports: r.edge_ports,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_is_a_working_file() {
        let c = parse(EXAMPLE, Path::new("controller.toml")).expect("the example parses");
        assert_eq!(c.switches.len(), 2);
        assert_eq!(c.pool.servers.len(), 1);
        assert!(c.routes.is_some());
        assert_eq!(c.cache_node_port, Some(11211));
        let scale = c.scale.expect("[scale]");
        assert_eq!(scale.weights, Some((0.5, 2.0)));
        assert_eq!(scale.spares.len(), 1);
        assert_eq!(scale.warm_up, Some(Duration::from_secs(5)));
    }

    #[test]
    fn scale_takes_weights_or_spares_with_sane_bounds_and_says_what_is_wrong() {
        let with = |table: &str| format!("{GOOD}\n[scale]\n{table}\n");
        let good = |table: &str| {
            parse(&with(table), Path::new("c.toml"))
                .unwrap()
                .scale
                .unwrap()
        };
        let bad = |table: &str| {
            parse(&with(table), Path::new("c.toml"))
                .unwrap_err()
                .to_string()
        };
        let s = good("weights = [0.5, 2.0]");
        assert_eq!(
            (s.interval, s.signal, s.sustain, s.weight_band),
            (Duration::from_secs(1), Signal::Requests, 3, 0.2)
        );
        assert!(s.spares.is_empty() && s.add_above.is_infinite());
        let s = good(
            "spares = [\"127.0.0.1:11300\"]\nadd_above = 100\nremove_below = 40\nsignal = \"bytes\"",
        );
        assert_eq!(
            (s.add_above, s.remove_below, s.signal),
            (100.0, 40.0, Signal::Bytes)
        );
        assert_eq!(s.weights, None);
        for (table, key) in [
            ("sustain = 3", "scale.weights"),
            ("weights = [0.0, 2.0]", "scale.weights"),
            ("weights = [1.0, 1.0]", "scale.weights"),
            (
                "weights = [0.5, 2.0]\nweight_band = 1.5",
                "scale.weight_band",
            ),
            ("spares = [\"127.0.0.1:11300\"]", "scale.add_above"),
            (
                "spares = [\"127.0.0.1:11300\"]\nadd_above = 10\nremove_below = 10",
                "scale.remove_below",
            ),
            (
                "spares = [\"127.0.0.1:11211\"]\nadd_above = 10\nremove_below = 5",
                "scale.spares[0]",
            ),
            (
                "spares = [\"nowhere\"]\nadd_above = 10\nremove_below = 5",
                "scale.spares[0]",
            ),
            (
                "weights = [0.5, 2.0]\nadd_above = 10\nremove_below = 5",
                "scale.spares",
            ),
            ("weights = [0.5, 2.0]\nsignal = \"joules\"", "scale.signal"),
            ("weights = [0.5, 2.0]\ninterval_ms = 5", "scale.interval_ms"),
            ("weights = [0.5, 2.0]\nspeed = 1", "speed"),
            ("weights = [0.5, 2.0]\nwarm_up_ms = 10", "scale.warm_up_ms"),
            (
                "spares = [\"127.0.0.1:11300\"]\nadd_above = 0\nremove_below = 0",
                "scale.add_above",
            ),
            (
                "spares = [\"127.0.0.1:11300\"]\nadd_above = 10",
                "scale.remove_below",
            ),
            (
                "spares = [\"127.0.0.1:11300\"]\nadd_above = 10\nremove_below = 0",
                "scale.remove_below",
            ),
        ] {
            let e = bad(table);
            assert!(e.contains(key), "{table}: {e}");
        }
        let both = GOOD.replace("down_after = 2", "bounded_loads = 0.25");
        let e = parse(
            &format!("{both}\n[scale]\nweights = [0.5, 2.0]\n"),
            Path::new("c.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("bounded_loads"), "{e}");
        let modula = GOOD.replace("\"ketama\"", "\"modula\"");
        let e = parse(
            &format!("{modula}\n[scale]\nweights = [0.5, 2.0]\n"),
            Path::new("c.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("ketama"), "{e}");
        let heavy = GOOD.replace("weight = 2", "weight = 20000000");
        let e = parse(
            &format!("{heavy}\n[scale]\nweights = [0.5, 2.0]\n"),
            Path::new("c.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("scale.weights"), "{e}");
    }

    const GOOD: &str = r#"
[controller]
api = "127.0.0.1:9200"
down_after = 2

[[switches]]
name = "sw1"
api = "127.0.0.1:9110"

[[switches]]
name = "sw2"
api = "127.0.0.1:9111"

[pool]
distribution = "ketama"
hash = "md5"
[[pool.servers]]
addr = "127.0.0.1:11211"
name = "s1"
[[pool.servers]]
addr = "127.0.0.1:11212"
weight = 2
"#;

    #[test]
    fn a_good_file_reads_whole() {
        let f = parse(GOOD, Path::new("c.toml")).unwrap();
        assert_eq!(f.switches.len(), 2);
        assert!(f.failover.is_empty());
        let spare = GOOD.replace("down_after = 2", "failover = [\"127.0.0.1:11299\"]");
        let f2 = parse(&spare, Path::new("c.toml")).unwrap();
        assert_eq!(
            f2.failover,
            ["127.0.0.1:11299".parse::<SocketAddr>().unwrap()]
        );
        assert_eq!(f.switches[1].api, "127.0.0.1:9111".parse().unwrap());
        assert_eq!((f.down_after, f.up_after, f.tko_after), (2, 2, 3));
        let off = GOOD.replace("down_after = 2", "tko_after = 0");
        assert_eq!(parse(&off, Path::new("c.toml")).unwrap().tko_after, 0);
        assert_eq!((f.flush_on_return, f.return_warm), (true, None));
        let warm = GOOD.replace("down_after = 2", "return_warm_ms = 500");
        assert_eq!(
            parse(&warm, Path::new("c.toml")).unwrap().return_warm,
            Some(Duration::from_millis(500))
        );
        let long = GOOD.replace("down_after = 2", "return_warm_ms = 90000000");
        let e = parse(&long, Path::new("c.toml")).unwrap_err().to_string();
        assert!(e.contains("controller.return_warm_ms"), "{e}");
        assert_eq!(f.probe_interval, Duration::from_millis(100));
        assert_eq!(f.pool.servers.len(), 2);
        assert_eq!(f.pool.servers[0].name.as_deref(), Some("s1"));
        assert_eq!(f.pool.servers[1].weight, 2);
        // SwitchKV cache nodes are probed only when a port is given.
        assert_eq!(f.cache_node_port, None);
        let port = |text: String| parse(&text, Path::new("c.toml")).unwrap().cache_node_port;
        assert_eq!(
            port(GOOD.replace("down_after = 2", "cache_node_port = 0")),
            None
        );
        assert_eq!(
            port(GOOD.replace("down_after = 2", "cache_node_port = 11311")),
            Some(11311)
        );
    }

    #[test]
    fn pool_changes_are_each_by_default_together_when_asked_and_nothing_else() {
        assert_eq!(
            parse(GOOD, Path::new("c.toml")).unwrap().pool_changes,
            PoolChanges::Each
        );
        let together = GOOD.replacen(
            "[controller]\n",
            "[controller]\npool_changes = \"together\"\n",
            1,
        );
        assert_eq!(
            parse(&together, Path::new("c.toml")).unwrap().pool_changes,
            PoolChanges::Together
        );
        let bad = GOOD.replacen(
            "[controller]\n",
            "[controller]\npool_changes = \"all\"\n",
            1,
        );
        let e = parse(&bad, Path::new("c.toml")).unwrap_err().to_string();
        assert!(e.contains("pool_changes") && e.contains("together"), "{e}");
        let state = GOOD.replacen("[controller]\n", "[controller]\nstate_file = \"\"\n", 1);
        let e = parse(&state, Path::new("c.toml")).unwrap_err().to_string();
        assert!(e.contains("state_file"), "{e}");
    }

    #[test]
    fn a_fabric_file_lets_the_switches_go_and_is_read_beside_the_file() {
        let no_switches = GOOD
            .replace(
                "[[switches]]\nname = \"sw1\"\napi = \"127.0.0.1:9110\"\n",
                "",
            )
            .replace(
                "[[switches]]\nname = \"sw2\"\napi = \"127.0.0.1:9111\"\n",
                "",
            );
        let e = parse(&no_switches, Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("switches") && e.contains("fabric"), "{e}");
        let with = no_switches.replace("down_after = 2", "fabric = \"fabric.toml\"");
        let f = parse(&with, Path::new("/etc/kv/c.toml")).unwrap();
        assert!(f.switches.is_empty());
        assert_eq!(f.fabric, Some(PathBuf::from("/etc/kv/fabric.toml")));
        // A controller of a fabric alone has no pool.
        let alone = "[controller]\nfabric = \"fabric.toml\"\n";
        let f = parse(alone, Path::new("c.toml")).unwrap();
        assert!(f.pool.servers.is_empty() && f.switches.is_empty());
        let e = parse("[controller]\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("switches") || e.contains("pool"), "{e}");
        assert_eq!(parse(GOOD, Path::new("c.toml")).unwrap().fabric, None);
    }

    #[test]
    fn mistakes_name_the_key() {
        let cases = [
            (
                GOOD.replace("down_after = 2", "down_after = 0"),
                "controller.down_after",
            ),
            (
                GOOD.replace("\"127.0.0.1:9111\"", "\"nowhere\""),
                "switches[1].api",
            ),
            (
                GOOD.replace("name = \"sw2\"", "name = \"sw1\""),
                "switches[1].name",
            ),
            (
                GOOD.replace("weight = 2", "weight = 0"),
                "pool.servers[1].weight",
            ),
            (
                GOOD.replace("weight = 2", "weight = -1"),
                "in [pool]: `weight = -1`",
            ),
            (
                GOOD.replace("api = \"127.0.0.1:9200\"", "api = \"x\""),
                "controller.api",
            ),
            (
                GOOD.replace("down_after = 2", "failover = [\"spare\"]"),
                "controller.failover[0]",
            ),
            (
                GOOD.replace("down_after = 2", "failover = [\"127.0.0.1:11212\"]"),
                "a spare stands apart",
            ),
        ];
        for (text, key) in cases {
            let e = parse(&text, Path::new("c.toml")).unwrap_err();
            assert!(e.to_string().contains(key), "{key}: {e}");
        }
        let routes =
            "\n[routes]\nmatch = { ip_dst = \"10.9.0.1\" }\n[routes.edge_ports]\nsw1 = [0]\n";
        let f = parse(&(GOOD.to_string() + routes), Path::new("c.toml")).unwrap();
        let r = f.routes.unwrap();
        assert_eq!(r.edge_ports["sw1"], [0]);
        assert_eq!((r.drain, r.priority), (Duration::from_millis(100), 1000));
        for (bad, key) in [
            (
                routes.replace("sw1 = [0]", "sw9 = [0]"),
                "routes.edge_ports.sw9",
            ),
            (routes.replace("sw1 = [0]", "sw1 = [0, 0]"), "listed twice"),
            (
                routes.replace("match = { ip_dst = \"10.9.0.1\" }", ""),
                "routes.match",
            ),
            (
                routes.replace("[routes.edge", "drain_ms = 70000\n[routes.edge"),
                "routes.drain_ms",
            ),
        ] {
            let e = parse(&(GOOD.to_string() + &bad), Path::new("c.toml")).unwrap_err();
            assert!(e.to_string().contains(key), "{key}: {e}");
        }
        let none = GOOD.split("[[switches]]").next().unwrap().to_string()
            + "[pool]\n[[pool.servers]]\naddr = \"127.0.0.1:1\"\n";
        let e = parse(&none, Path::new("c.toml")).unwrap_err();
        assert!(e.to_string().contains("switches"), "{e}");
    }
}
