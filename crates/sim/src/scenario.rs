//! A scenario: what to simulate. Every field is checked before anything runs
//! ([`Scenario::validate`]); an error names the field and what is wrong with it.
//!
//! A scenario file (read by `config::scenario`) may hold variants (`[[variant]]`: the same run
//! with some fields set otherwise, such as the cache taken away) and a sweep (`[sweep]`: one
//! field over a list of values); the run is then every variant at every point ([`File`]).

use std::time::Duration;

pub use kv::zipf::ChangeKind;

use crate::station::Service;

/// One run's settings, after variants and sweeps are applied.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize, serde::Serialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct Scenario {
    pub name: String,
    #[cfg_attr(feature = "serde", serde(default))]
    pub description: String,
    /// Simulated seconds.
    pub duration_s: f64,
    /// Seconds at the start left out of the summary (the cache warms up).
    #[cfg_attr(feature = "serde", serde(default))]
    pub warmup_s: f64,
    /// Length of one time-series bin, in milliseconds.
    #[cfg_attr(feature = "serde", serde(default = "default_bin_ms"))]
    pub bin_ms: u64,
    pub workload: Workload,
    pub clients: Clients,
    #[cfg_attr(feature = "serde", serde(default))]
    pub network: Network,
    pub backends: Backends,
    /// SwitchKV's cache nodes and the switch rules that steer reads to them; none without.
    #[cfg_attr(feature = "serde", serde(default))]
    pub cache: Option<CacheNodes>,
    /// The level of detail: `request` (the `kv` crate's objects per request) or `frame`
    /// (frames through the fabric's switches, `[fabric]`).
    #[cfg_attr(feature = "serde", serde(default = "default_level"))]
    pub level: Level,
    /// The caching fabric of the frame level.
    #[cfg_attr(feature = "serde", serde(default))]
    pub fabric: Option<Fabric>,
    /// What to plot of this scenario's variants and sweep points.
    #[cfg_attr(feature = "serde", serde(default))]
    pub plot: Plot,
}

/// The values a file may leave out; the fields a file must give are zero, empty or the first
/// choice, for a caller to set.
impl Default for Scenario {
    fn default() -> Scenario {
        Scenario {
            name: Default::default(),
            description: Default::default(),
            duration_s: Default::default(),
            warmup_s: Default::default(),
            bin_ms: default_bin_ms(),
            workload: Default::default(),
            clients: Default::default(),
            network: Default::default(),
            backends: Default::default(),
            cache: Default::default(),
            level: default_level(),
            fabric: Default::default(),
            plot: Default::default(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize, serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum Level {
    Request,
    Frame,
}

fn default_level() -> Level {
    Level::Request
}

/// IncBricks' multi-rooted tree (every ToR linked to every root) or a k-ary fat-tree, a rack
/// of hosts under each ToR, servers on the first hosts of the racks in turn, closed-loop
/// clients on the others.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize, serde::Serialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct Fabric {
    #[cfg_attr(feature = "serde", serde(default))]
    pub topology: Topology,
    /// The tree's ToRs and roots (a fat-tree's follow from `k`).
    #[cfg_attr(feature = "serde", serde(default))]
    pub tors: usize,
    #[cfg_attr(feature = "serde", serde(default))]
    pub roots: usize,
    /// A fat-tree's arity: `k` pods of `k / 2` ToRs and `k / 2` aggregation switches, and
    /// `(k / 2)^2` core switches, each linked to one aggregation switch of every pod.
    #[cfg_attr(feature = "serde", serde(default))]
    pub k: usize,
    /// Hosts under each ToR.
    pub hosts_per_rack: usize,
    /// Servers (`backends.count` is ignored at this level).
    pub servers: usize,
    /// Cached items at each ToR and each root (0: no cache there).
    pub tor_items: usize,
    #[cfg_attr(feature = "serde", serde(default))]
    pub root_items: usize,
    /// With `cross_rack`, cached items at the ToRs of the servers' racks, `tor_items` when not
    /// given; 0 caches only in the clients' racks and at the roots (IncBricks' designated
    /// caching, section 4.4, for servers and clients in clusters of their own).
    #[cfg_attr(feature = "serde", serde(default))]
    pub server_tor_items: Option<usize>,
    /// Gigabits a second of a host's link and of a ToR-root link.
    #[cfg_attr(feature = "serde", serde(default = "default_host_gbps"))]
    pub host_gbps: f64,
    #[cfg_attr(feature = "serde", serde(default = "default_core_gbps"))]
    pub core_gbps: f64,
    /// Frames a link's queue holds; more are dropped.
    #[cfg_attr(feature = "serde", serde(default = "default_link_queue"))]
    pub link_queue: usize,
    /// Microseconds a switch takes over each frame it handles.
    #[cfg_attr(feature = "serde", serde(default = "default_switch_us"))]
    pub switch_us: f64,
    /// Frames a second each switch's cache processor handles (IncBricks' network
    /// accelerator, which sees every fabric frame: a request, the reply that fills it, an
    /// invalidation), one at a time in arrival order; 0: as many as arrive, each after
    /// `switch_us` only.
    #[cfg_attr(feature = "serde", serde(default))]
    pub switch_capacity: f64,
    /// Frames waiting for a switch's processor, the one in hand included; more are dropped.
    #[cfg_attr(feature = "serde", serde(default = "default_link_queue"))]
    pub switch_queue: usize,
    /// Servers packed into the first racks and clients only in the others (IncBricks'
    /// cross-cluster runs); otherwise servers are spread over the racks and clients share
    /// them.
    #[cfg_attr(feature = "serde", serde(default))]
    pub cross_rack: bool,
    /// A root (a fat-tree's core; numbered from 0) that fails at `fail_at_s`: it takes no
    /// frame and sends none from then on, and the others find out as its greetings stop.
    #[cfg_attr(feature = "serde", serde(default))]
    pub fail_root: Option<usize>,
    #[cfg_attr(feature = "serde", serde(default))]
    pub fail_at_s: f64,
    /// How long after the failure the controller installs a registration table naming the
    /// failed root (the fabric's own `Registration::spread`): its keys move to the others,
    /// and the writes that waited for it go on a lease later. Never, when not given.
    #[cfg_attr(feature = "serde", serde(default))]
    pub controller_ms: Option<f64>,
    /// How long a cached item is served after its fill (the fabric's `lease_ms`).
    #[cfg_attr(feature = "serde", serde(default = "default_fabric_lease_ms"))]
    pub lease_ms: f64,
}

/// The values a file may leave out; the fields a file must give are zero, empty or the first
/// choice, for a caller to set.
impl Default for Fabric {
    fn default() -> Fabric {
        Fabric {
            topology: Default::default(),
            tors: Default::default(),
            roots: Default::default(),
            k: Default::default(),
            hosts_per_rack: Default::default(),
            servers: Default::default(),
            tor_items: Default::default(),
            root_items: Default::default(),
            server_tor_items: Default::default(),
            host_gbps: default_host_gbps(),
            core_gbps: default_core_gbps(),
            link_queue: default_link_queue(),
            switch_us: default_switch_us(),
            switch_capacity: Default::default(),
            switch_queue: default_link_queue(),
            cross_rack: Default::default(),
            fail_root: Default::default(),
            fail_at_s: Default::default(),
            controller_ms: Default::default(),
            lease_ms: default_fabric_lease_ms(),
        }
    }
}

fn default_fabric_lease_ms() -> f64 {
    2000.0
}

/// How the fabric's switches are linked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize, serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum Topology {
    /// Two levels: every ToR linked straight to every root.
    #[default]
    Tree,
    /// One kvswitch: the switch application of `kvswitch run` (ARP, learning, the memcached
    /// program that routes each request to the VIP by its key over the backends' ring, the
    /// coherent cache on the UDP path with its hot-key detection) with every host on a port
    /// of its own, the first `servers` of them servers; `tor_items` is its cache's size (0:
    /// no cache).
    Switch,
    /// Three levels: the cores are the fabric's roots, and a ToR reaches a core through the
    /// one aggregation switch of its pod that links to that core, so two racks in different
    /// pods are joined by `(k / 2)^2` paths and each key takes the one through its designated
    /// core. Aggregation switches cache nothing (no key designates them): they forward.
    FatTree,
}

impl Fabric {
    /// ToRs, roots (a fat-tree's cores) and aggregation switches.
    pub fn shape(&self) -> (usize, usize, usize) {
        match self.topology {
            Topology::Tree => (self.tors, self.roots, 0),
            Topology::Switch => (1, 0, 0),
            Topology::FatTree => (
                self.k * self.k / 2,
                self.k * self.k / 4,
                self.k * self.k / 2,
            ),
        }
    }
}

fn default_host_gbps() -> f64 {
    10.0
}
fn default_core_gbps() -> f64 {
    40.0
}
fn default_link_queue() -> usize {
    1000
}
fn default_switch_us() -> f64 {
    1.0
}

fn default_bin_ms() -> u64 {
    100
}

#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize, serde::Serialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct Workload {
    /// Keys in the keyspace (up to 10^10 and beyond: nothing is kept per key).
    pub keys: u64,
    /// Zipf exponent; 0 is uniform.
    #[cfg_attr(feature = "serde", serde(default))]
    pub skew: f64,
    /// Share of requests that are writes, 0 to 1.
    #[cfg_attr(feature = "serde", serde(default))]
    pub write_ratio: f64,
    /// Bytes of each value.
    #[cfg_attr(feature = "serde", serde(default = "default_value_size"))]
    pub value_size: usize,
    /// Popularity changes, SwitchKV's hot-in, hot-out and random; none without.
    #[cfg_attr(feature = "serde", serde(default))]
    pub change: Option<Change>,
}

/// The values a file may leave out; the fields a file must give are zero, empty or the first
/// choice, for a caller to set.
impl Default for Workload {
    fn default() -> Workload {
        Workload {
            keys: Default::default(),
            skew: Default::default(),
            write_ratio: Default::default(),
            value_size: default_value_size(),
            change: Default::default(),
        }
    }
}

fn default_value_size() -> usize {
    128
}

#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize, serde::Serialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct Change {
    pub kind: ChangeKind,
    /// Keys moved by each change.
    pub keys: u64,
    /// Seconds between changes.
    pub every_s: f64,
    /// First change at this many seconds [default: every_s].
    #[cfg_attr(feature = "serde", serde(default))]
    pub start_s: Option<f64>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize, serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum ClientModel {
    #[default]
    /// Poisson arrivals at `rate`.
    Open,
    /// `count` clients, each waiting for its answer (or `timeout_ms`) before the next.
    Closed,
    /// SwitchKV's clients: Poisson arrivals whose rate is adjusted every `adjust_ms` to keep
    /// the loss between `loss_low` and `loss_high`.
    RateControl,
}

#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize, serde::Serialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct Clients {
    pub model: ClientModel,
    /// Requests a second (open loop; rate control: where it starts).
    #[cfg_attr(feature = "serde", serde(default))]
    pub rate: f64,
    /// Closed-loop clients.
    #[cfg_attr(feature = "serde", serde(default))]
    pub count: usize,
    /// Closed loop: microseconds between an answer and the next request.
    #[cfg_attr(feature = "serde", serde(default))]
    pub think_us: f64,
    /// Closed loop: milliseconds after which a request without an answer counts as lost and
    /// the next goes.
    #[cfg_attr(feature = "serde", serde(default = "default_timeout_ms"))]
    pub timeout_ms: f64,
    #[cfg_attr(feature = "serde", serde(default = "default_adjust_ms"))]
    pub adjust_ms: f64,
    #[cfg_attr(feature = "serde", serde(default = "default_loss_low"))]
    pub loss_low: f64,
    #[cfg_attr(feature = "serde", serde(default = "default_loss_high"))]
    pub loss_high: f64,
    /// Rate control: the rate is multiplied by 1 + step below `loss_low` and by 1 − step
    /// above `loss_high`.
    #[cfg_attr(feature = "serde", serde(default = "default_step"))]
    pub step: f64,
}

/// The values a file may leave out; the fields a file must give are zero, empty or the first
/// choice, for a caller to set.
impl Default for Clients {
    fn default() -> Clients {
        Clients {
            model: Default::default(),
            rate: Default::default(),
            count: Default::default(),
            think_us: Default::default(),
            timeout_ms: default_timeout_ms(),
            adjust_ms: default_adjust_ms(),
            loss_low: default_loss_low(),
            loss_high: default_loss_high(),
            step: default_step(),
        }
    }
}

fn default_timeout_ms() -> f64 {
    10.0
}
fn default_adjust_ms() -> f64 {
    10.0
}
fn default_loss_low() -> f64 {
    0.005
}
fn default_loss_high() -> f64 {
    0.01
}
fn default_step() -> f64 {
    0.02
}

#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize, serde::Serialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct Network {
    /// One-way propagation and switching delay of each link a request or reply crosses, in
    /// microseconds (a request to a backend and its reply cross four).
    #[cfg_attr(feature = "serde", serde(default = "default_link_us"))]
    pub link_us: f64,
}

fn default_link_us() -> f64 {
    2.0
}

impl Default for Network {
    fn default() -> Network {
        Network {
            link_us: default_link_us(),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize, serde::Serialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct Backends {
    pub count: usize,
    /// Requests a second each serves.
    pub capacity: f64,
    /// Requests each holds, the one in service included; more are dropped.
    #[cfg_attr(feature = "serde", serde(default = "default_queue"))]
    pub queue: usize,
    #[cfg_attr(feature = "serde", serde(default = "default_service"))]
    pub service: Service,
    /// How the switch places keys on backends: ketama (as nutcracker) or modula.
    #[cfg_attr(feature = "serde", serde(default = "default_distribution"))]
    pub distribution: String,
    /// nutcracker's hash function name.
    #[cfg_attr(feature = "serde", serde(default = "default_hash"))]
    pub hash: String,
}

/// The values a file may leave out; the fields a file must give are zero, empty or the first
/// choice, for a caller to set.
impl Default for Backends {
    fn default() -> Backends {
        Backends {
            count: Default::default(),
            capacity: Default::default(),
            queue: default_queue(),
            service: default_service(),
            distribution: default_distribution(),
            hash: default_hash(),
        }
    }
}

fn default_queue() -> usize {
    64
}
fn default_service() -> Service {
    Service::Fixed
}
fn default_distribution() -> String {
    "ketama".into()
}
fn default_hash() -> String {
    "fnv1a_64".into()
}

#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize, serde::Serialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct CacheNodes {
    /// Cache nodes; backend `b` reports to node `b mod nodes`.
    #[cfg_attr(feature = "serde", serde(default = "default_nodes"))]
    pub nodes: usize,
    /// Keys each cache node holds (SwitchKV: 10,000 in all).
    pub items: usize,
    /// Requests a second each cache node serves; 0: as many as come.
    #[cfg_attr(feature = "serde", serde(default))]
    pub capacity: f64,
    #[cfg_attr(feature = "serde", serde(default = "default_node_queue"))]
    pub queue: usize,
    /// Exact-match rules the switch holds; past it an install is refused and counted.
    #[cfg_attr(feature = "serde", serde(default = "default_rule_table"))]
    pub rule_table: usize,
    /// Rule updates a second the switch accepts (SwitchKV: 400); 0: unlimited.
    #[cfg_attr(feature = "serde", serde(default))]
    pub rule_rate: u32,
    /// Periodic report: segment length in milliseconds and keys reported per segment.
    #[cfg_attr(feature = "serde", serde(default = "default_report_ms"))]
    pub report_ms: u64,
    #[cfg_attr(feature = "serde", serde(default = "default_top_k"))]
    pub top_k: usize,
    /// EWMA weight of the segment just ended.
    #[cfg_attr(feature = "serde", serde(default = "default_alpha"))]
    pub alpha: f64,
    /// Keys each backend's counter tracks.
    #[cfg_attr(feature = "serde", serde(default = "default_counter"))]
    pub counter_capacity: usize,
    /// Count one request in `sample` at the backends (1: every one).
    #[cfg_attr(feature = "serde", serde(default = "default_sample"))]
    pub sample: u32,
    /// Instant reports: a key read more than `log_threshold` times in the last `log_size`;
    /// `log_size` 0 turns them off.
    #[cfg_attr(feature = "serde", serde(default = "default_log_size"))]
    pub log_size: usize,
    #[cfg_attr(feature = "serde", serde(default = "default_log_threshold"))]
    pub log_threshold: u32,
    /// Instant reports only from a backend serving at least this many reads a second.
    #[cfg_attr(feature = "serde", serde(default))]
    pub load_floor: f64,
    /// Admission threshold percentile among cached loads.
    #[cfg_attr(feature = "serde", serde(default = "default_admit"))]
    pub admit_percentile: f64,
    /// Lease a backend grants, in milliseconds.
    #[cfg_attr(feature = "serde", serde(default = "default_lease_ms"))]
    pub lease_ms: u64,
    /// How often a cache node fetches, releases rule changes and renews, in milliseconds
    /// (the node's tick).
    #[cfg_attr(feature = "serde", serde(default = "default_tick_ms"))]
    pub tick_ms: u64,
    /// How reads reach a cache node: `steered` (SwitchKV: the switch's rules send reads of
    /// cached keys to it) or `look-aside` (every read asks its backend's cache node first,
    /// and its backend on a miss).
    #[cfg_attr(feature = "serde", serde(default = "default_path"))]
    pub path: CachePath,
    /// Periodic reports on (off: only instant reports admit keys).
    #[cfg_attr(feature = "serde", serde(default = "yes"))]
    pub periodic: bool,
    /// The hottest keys the cache nodes hold before requests start, as SwitchKV's
    /// experiments start: reported by their backends with their loads, fetched, and their
    /// rules installed at the rule rate during a quiet lead-in the results leave out.
    #[cfg_attr(feature = "serde", serde(default))]
    pub prefill: u64,
}

/// The values a file may leave out; the fields a file must give are zero, empty or the first
/// choice, for a caller to set.
impl Default for CacheNodes {
    fn default() -> CacheNodes {
        CacheNodes {
            nodes: default_nodes(),
            items: Default::default(),
            capacity: Default::default(),
            queue: default_node_queue(),
            rule_table: default_rule_table(),
            rule_rate: Default::default(),
            report_ms: default_report_ms(),
            top_k: default_top_k(),
            alpha: default_alpha(),
            counter_capacity: default_counter(),
            sample: default_sample(),
            log_size: default_log_size(),
            log_threshold: default_log_threshold(),
            load_floor: Default::default(),
            admit_percentile: default_admit(),
            lease_ms: default_lease_ms(),
            tick_ms: default_tick_ms(),
            path: default_path(),
            periodic: yes(),
            prefill: Default::default(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize, serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum CachePath {
    Steered,
    LookAside,
}

fn default_path() -> CachePath {
    CachePath::Steered
}
fn yes() -> bool {
    true
}

fn default_nodes() -> usize {
    1
}
fn default_node_queue() -> usize {
    256
}
fn default_rule_table() -> usize {
    1 << 20
}
fn default_report_ms() -> u64 {
    1000
}
fn default_top_k() -> usize {
    5
}
fn default_alpha() -> f64 {
    0.5
}
fn default_counter() -> usize {
    1024
}
fn default_sample() -> u32 {
    1
}
fn default_log_size() -> usize {
    200
}
fn default_log_threshold() -> u32 {
    8
}
fn default_admit() -> f64 {
    10.0
}
fn default_lease_ms() -> u64 {
    2000
}
fn default_tick_ms() -> u64 {
    10
}

/// What the plots of a scenario show.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize, serde::Serialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct Plot {
    /// Summary figures drawn against the sweep's values (one line per variant), or, with no
    /// sweep, time-series columns drawn over time. Default: throughput.
    #[cfg_attr(feature = "serde", serde(default))]
    pub y: Vec<String>,
    /// Draw the sweep's axis on a log scale.
    #[cfg_attr(feature = "serde", serde(default))]
    pub x_log: bool,
    /// Also draw each run's per-backend loads, busiest first (SwitchKV's Figure 9).
    #[cfg_attr(feature = "serde", serde(default))]
    pub backends: bool,
    /// A title for the plots; the scenario's name without.
    #[cfg_attr(feature = "serde", serde(default))]
    pub title: String,
    /// The axis label of the sweep; its key without.
    #[cfg_attr(feature = "serde", serde(default))]
    pub x_label: String,
}

/// A scenario file: the base run, its variants and its sweep.
#[derive(Clone, Debug)]
pub struct File {
    /// Every run: (variant name, sweep value as written, the run's scenario).
    pub runs: Vec<Run>,
    /// The sweep's key (the first, when it sets several), if any.
    pub sweep: Option<String>,
    pub base: Scenario,
}

#[derive(Clone, Debug)]
pub struct Run {
    pub variant: String,
    pub x: Option<f64>,
    pub scenario: Scenario,
}

/// `v` within `[low, high]`: bounds that keep every time a field gives at least a
/// nanosecond and every count within what one machine can simulate.
fn within(name: &str, v: f64, low: f64, high: f64) -> Result<(), String> {
    if v.is_finite() && (low..=high).contains(&v) {
        Ok(())
    } else {
        Err(format!("{name} must be {low} to {high}, not {v}"))
    }
}

/// At most this many requests a second from clients, and of service from one server.
pub const MAX_RATE: f64 = 1e9;
/// At most this many requests or frames held by one queue.
pub const MAX_QUEUE: usize = 1_000_000;
/// The longest lead-in a cache prefill may take (its keys at the rule rate).
pub const MAX_LEAD_IN_S: f64 = 3600.0;

fn positive(name: &str, v: f64) -> Result<(), String> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(format!("{name} must be a number above 0, not {v}"))
    }
}

impl Scenario {
    /// Checks every field's range.
    pub fn validate(&self) -> Result<(), String> {
        within("duration_s", self.duration_s, 0.001, 1e6)?;
        if !(self.warmup_s >= 0.0 && self.warmup_s <= self.duration_s - 0.001) {
            return Err(format!(
                "warmup_s must be at least 0 and below duration_s, not {}",
                self.warmup_s
            ));
        }
        if self.bin_ms == 0 {
            return Err("bin_ms must be above 0".into());
        }
        if self.duration_s * 1000.0 / self.bin_ms as f64 > 1e6 {
            return Err("duration_s / bin_ms gives more than a million bins".into());
        }
        let w = &self.workload;
        if w.keys == 0 {
            return Err("workload.keys must be above 0".into());
        }
        if !(w.skew.is_finite() && w.skew >= 0.0) {
            return Err(format!("workload.skew must be 0 or above, not {}", w.skew));
        }
        if !(0.0..=1.0).contains(&w.write_ratio) {
            return Err(format!(
                "workload.write_ratio must be 0 to 1, not {}",
                w.write_ratio
            ));
        }
        if w.value_size == 0 || w.value_size > 1 << 20 {
            return Err("workload.value_size must be 1 to 1048576 bytes".into());
        }
        if let Some(c) = &w.change {
            within("workload.change.every_s", c.every_s, 0.001, 1e6)?;
            if c.keys == 0
                || c.keys >= w.keys
                || (c.kind == ChangeKind::Random && c.keys.saturating_mul(2) > w.keys)
            {
                return Err(format!("workload.change.keys must be 1 to below workload.keys (half of it for random), not {}", c.keys));
            }
            if c.kind != ChangeKind::Random && w.skew == 0.0 {
                return Err(
                    "workload.change moves popularity ranks: it needs workload.skew above 0".into(),
                );
            }
            if let Some(s) = c.start_s {
                if !(s.is_finite() && s >= 0.0) {
                    return Err("workload.change.start_s must be 0 or above".into());
                }
            }
        }
        let c = &self.clients;
        match c.model {
            ClientModel::Open | ClientModel::RateControl => {
                within("clients.rate", c.rate, 1.0, MAX_RATE)?
            }
            ClientModel::Closed => {
                if c.count == 0 || c.count > 1_000_000 {
                    return Err("clients.count must be 1 to 1000000 for closed-loop clients".into());
                }
                within("clients.timeout_ms", c.timeout_ms, 0.001, 1e6)?;
                if !(c.think_us.is_finite() && c.think_us >= 0.0) {
                    return Err("clients.think_us must be 0 or above".into());
                }
            }
        }
        if c.model == ClientModel::RateControl {
            within("clients.adjust_ms", c.adjust_ms, 0.001, 1e6)?;
            if !(0.0 <= c.loss_low && c.loss_low < c.loss_high && c.loss_high < 1.0) {
                return Err(
                    "clients.loss_low and loss_high must satisfy 0 <= low < high < 1".into(),
                );
            }
            if !(c.step > 0.0 && c.step < 1.0) {
                return Err("clients.step must be between 0 and 1".into());
            }
        }
        within("network.link_us", self.network.link_us, 0.0, 1e6)?;
        if self.level == Level::Frame {
            let Some(f) = &self.fabric else {
                return Err("level = \"frame\" needs a [fabric] table".into());
            };
            match f.topology {
                Topology::Tree => {
                    if f.tors == 0 || f.tors > 200 || f.roots == 0 || f.roots > 50 {
                        return Err("fabric.tors must be 1 to 200 and fabric.roots 1 to 50".into());
                    }
                    if f.k != 0 {
                        return Err("fabric.k is a fat-tree's (topology = \"fat-tree\")".into());
                    }
                }
                Topology::Switch => {
                    if f.tors != 0 || f.roots != 0 || f.k != 0 {
                        return Err(
                            "fabric.tors, fabric.roots and fabric.k are not a single switch's"
                                .into(),
                        );
                    }
                    if f.root_items != 0 {
                        return Err("fabric.root_items: a single switch has no root".into());
                    }
                }
                Topology::FatTree => {
                    if f.k < 2 || f.k > 16 || f.k % 2 != 0 {
                        return Err(format!(
                            "fabric.k must be an even number from 2 to 16, not {}",
                            f.k
                        ));
                    }
                    if f.tors != 0 || f.roots != 0 {
                        return Err(
                            "fabric.tors and fabric.roots follow from fabric.k in a fat-tree"
                                .into(),
                        );
                    }
                }
            }
            let (tors, roots, _) = f.shape();
            if f.hosts_per_rack < 2 || f.hosts_per_rack > 250 {
                return Err("fabric.hosts_per_rack must be 2 to 250".into());
            }
            // A ToR has a port for each host and each root, a root one for each ToR.
            if f.hosts_per_rack + roots > 256 {
                return Err(format!(
                    "fabric.hosts_per_rack: a ToR has a port for each of its {} hosts and {roots} \
                     roots, more than 256",
                    f.hosts_per_rack
                ));
            }
            if f.servers == 0 || f.servers >= tors * f.hosts_per_rack {
                return Err("fabric.servers must be 1 to fewer than the hosts".into());
            }
            if f.cross_rack && tors < 2 {
                return Err("fabric.cross_rack needs at least 2 ToRs".into());
            }
            if f.server_tor_items.is_some() && !f.cross_rack {
                return Err(
                    "fabric.server_tor_items needs cross_rack = true (otherwise clients share \
                     the servers' racks)"
                        .into(),
                );
            }
            positive("fabric.host_gbps", f.host_gbps)?;
            positive("fabric.core_gbps", f.core_gbps)?;
            if f.link_queue == 0 || f.link_queue > MAX_QUEUE {
                return Err(format!("fabric.link_queue must be 1 to {MAX_QUEUE}"));
            }
            if !(f.switch_us.is_finite() && f.switch_us >= 0.0) {
                return Err("fabric.switch_us must be 0 or above".into());
            }
            if f.switch_capacity != 0.0 {
                within(
                    "fabric.switch_capacity (0: unlimited)",
                    f.switch_capacity,
                    1.0,
                    MAX_RATE,
                )?;
            }
            if f.switch_queue == 0 || f.switch_queue > MAX_QUEUE {
                return Err(format!("fabric.switch_queue must be 1 to {MAX_QUEUE}"));
            }
            if let Some(r) = f.fail_root {
                if roots == 0 {
                    return Err("fabric.fail_root: a single switch has no root".into());
                }
                if r >= roots {
                    return Err(format!(
                        "fabric.fail_root must be a root's number, 0 to {}, not {r}",
                        roots - 1
                    ));
                }
                within("fabric.fail_at_s", f.fail_at_s, 0.0, self.duration_s)?;
                if roots < 2 && f.controller_ms.is_some() {
                    return Err("fabric.controller_ms: no root would be left".into());
                }
            }
            if f.fail_root.is_none() && f.fail_at_s != 0.0 {
                return Err("fabric.fail_at_s needs fabric.fail_root".into());
            }
            if let Some(ms) = f.controller_ms {
                if f.fail_root.is_none() {
                    return Err("fabric.controller_ms needs fabric.fail_root".into());
                }
                within("fabric.controller_ms", ms, 0.0, 3_600_000.0)?;
            }
            within("fabric.lease_ms", f.lease_ms, 1.0, 3_600_000.0)?;
            if self.clients.model != ClientModel::Closed {
                return Err(
                    "the frame level has closed-loop clients only (clients.model = \"closed\")"
                        .into(),
                );
            }
            if self.workload.value_size > 1200 {
                return Err("the frame level keeps a value in one datagram: workload.value_size at most 1200".into());
            }
            if self.cache.is_some() {
                return Err("[cache] is SwitchKV's, of the request level; the fabric caches in its switches".into());
            }
            if self.workload.change.is_some() {
                return Err("workload.change is not simulated at the frame level".into());
            }
        }
        let b = &self.backends;
        if b.count == 0 || b.count > 65_536 {
            return Err("backends.count must be 1 to 65536".into());
        }
        within("backends.capacity", b.capacity, 0.001, MAX_RATE)?;
        if b.queue == 0 || b.queue > MAX_QUEUE {
            return Err(format!("backends.queue must be 1 to {MAX_QUEUE}"));
        }
        b.distribution
            .parse::<kv::Distribution>()
            .map_err(|e| format!("backends.distribution: {e}"))?;
        b.hash
            .parse::<kv::HashFn>()
            .map_err(|e| format!("backends.hash: {e}"))?;
        if let Some(n) = &self.cache {
            if n.nodes == 0 || n.nodes > b.count {
                return Err("cache.nodes must be 1 to backends.count".into());
            }
            if n.items == 0 {
                return Err("cache.items must be above 0".into());
            }
            if n.capacity != 0.0 {
                within("cache.capacity (0: unlimited)", n.capacity, 0.001, MAX_RATE)?;
            }
            if n.queue > MAX_QUEUE {
                return Err(format!("cache.queue must be 1 to {MAX_QUEUE}"));
            }
            if n.prefill > 0
                && n.rule_rate > 0
                && n.prefill as f64 / f64::from(n.rule_rate) > MAX_LEAD_IN_S
            {
                return Err(format!(
                    "cache.prefill / cache.rule_rate gives a lead-in of more than {MAX_LEAD_IN_S} s"
                ));
            }
            if n.queue == 0
                || n.rule_table == 0
                || n.report_ms == 0
                || n.lease_ms == 0
                || n.tick_ms == 0
            {
                return Err(
                    "cache.queue, rule_table, report_ms, lease_ms and tick_ms must be above 0"
                        .into(),
                );
            }
            if n.top_k == 0 || n.top_k > n.counter_capacity {
                return Err("cache.top_k must be 1 to cache.counter_capacity".into());
            }
            if !(n.alpha > 0.0 && n.alpha <= 1.0) {
                return Err("cache.alpha must be in (0, 1]".into());
            }
            if n.sample == 0 {
                return Err("cache.sample must be at least 1".into());
            }
            if n.prefill > w.keys || n.prefill > 10_000_000 {
                return Err("cache.prefill must be at most workload.keys and 10000000".into());
            }
            if !(0.0..=100.0).contains(&n.admit_percentile) {
                return Err("cache.admit_percentile must be 0 to 100".into());
            }
        }
        Ok(())
    }

    pub fn duration(&self) -> Duration {
        Duration::from_secs_f64(self.duration_s)
    }
}
