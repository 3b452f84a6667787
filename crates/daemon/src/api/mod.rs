//! The control API: what it shows (`/metrics` in Prometheus text format, the status document,
//! the ports) for the switch (with its proxy, when one runs) or for a proxy running alone, and
//! the HTTP server ([`http`]) that serves it with the switch's tables.

pub mod http;
pub mod pools;

pub use ::api::guard;
pub use ::api::{api_token, TOKEN_ENV};
pub use http::{serve, Api};

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use serde_json::json;

use crate::cache::CacheService;
use ::api::metrics::{Exposition, Kind};
use config::{Config, Mode};
use proxy::ProxyStats;
use switch::control::PortView;
use switch::pool::Pool;
use switch::stats::{get, Answer, Drop, Stats};
use switch::Snapshot;

/// What the API thread can see.
pub struct Shared {
    pub config: Config,
    pub port_names: Vec<String>,
    pub port_macs: Vec<String>,
    pub stats: Arc<Stats>,
    pub snapshot: Mutex<Snapshot>,
    pub started: Instant,
    /// The proxy serving TCP to the VIP, once it runs.
    pub proxy: OnceLock<Arc<ProxyStats>>,
    /// The cache of the UDP path and the proxy, when turned on.
    pub cache: Option<Arc<CacheService>>,
    /// The pool both paths route by, with its servers' health.
    pub pool: Arc<Pool>,
    /// The check of the cache nodes `kv_steer` entries lead to.
    pub steer: Arc<crate::steer::SteerHealth>,
    /// The datapath of each port and the XDP program's counters.
    pub fast: Arc<crate::fast::FastStatus>,
    /// The CPU channel's place and counters.
    pub cpu: Arc<crate::cpu::ChannelStatus>,
}

/// What an API server shows.
pub trait Exporter: Send + Sync + 'static {
    /// Its families of the Prometheus text exposition.
    fn metrics(&self, m: &mut Exposition);
    /// The status document.
    fn status(&self) -> serde_json::Value;
    /// Its ports and their counters (none by default).
    fn ports(&self) -> serde_json::Value {
        serde_json::Value::Array(Vec::new())
    }
    /// The caches it runs, by pool name (none by default).
    fn caches(&self) -> Vec<(String, Arc<CacheService>)> {
        Vec::new()
    }
}

impl Exporter for Shared {
    fn metrics(&self, m: &mut Exposition) {
        metrics(self, m);
        let removed = self
            .steer
            .removed
            .load(std::sync::atomic::Ordering::Relaxed);
        let down = self.steer.down.lock().map_or(0, |d| d.len());
        m.single(
            "kvswitch_steer_removed_total",
            Kind::Counter,
            "kv_steer entries removed because the cache node they led to stopped answering.",
            removed,
        );
        m.single(
            "kvswitch_steer_nodes_down",
            Kind::Gauge,
            "Cache nodes whose steering entries were removed and that have not answered since.",
            down,
        );
        self.cpu.metrics(m);
        if let Some(proxy) = self.proxy.get() {
            proxy.write_metrics(m);
        }
    }

    fn status(&self) -> serde_json::Value {
        let mut doc = status(self);
        if let (Some(proxy), Some(map)) = (self.proxy.get(), doc.as_object_mut()) {
            map.insert("proxy".into(), proxy.status());
        }
        if let Some(map) = doc.as_object_mut() {
            let down: Vec<String> = self
                .steer
                .down
                .lock()
                .map(|d| d.iter().map(ToString::to_string).collect())
                .unwrap_or_default();
            map.insert(
                "steer".into(),
                json!({
                    "removed_entries": self.steer.removed.load(std::sync::atomic::Ordering::Relaxed),
                    "nodes_down": down,
                }),
            );
            map.insert("cpu_channel".into(), self.cpu.json());
        }
        doc
    }

    fn ports(&self) -> serde_json::Value {
        ports(self)
    }

    fn caches(&self) -> Vec<(String, Arc<CacheService>)> {
        self.cache
            .iter()
            .map(|c| ("default".to_string(), c.clone()))
            .collect()
    }
}

impl Exporter for ProxyStats {
    fn metrics(&self, m: &mut Exposition) {
        self.write_metrics(m);
    }

    fn status(&self) -> serde_json::Value {
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "proxy": ProxyStats::status(self),
        })
    }
}

/// Cached keys listed in the status document.
pub(crate) const STATUS_ENTRIES: usize = 20;

/// The switch's families of the Prometheus text exposition.
pub fn metrics(shared: &Shared, m: &mut Exposition) {
    let s = &shared.stats;
    let port_names = &shared.port_names;
    m.family(
        "kvswitch_port_packets_total",
        Kind::Counter,
        "Frames per port and direction.",
    );
    for (name, p) in port_names.iter().zip(&s.ports) {
        for (dir, n) in [("rx", &p.rx_packets), ("tx", &p.tx_packets)] {
            m.sample(
                "kvswitch_port_packets_total",
                &[("port", name), ("dir", dir)],
                get(n),
            );
        }
    }
    let fast = shared.fast.get();
    m.family(
        "kvswitch_xdp_frames_total",
        Kind::Counter,
        "Frames the XDP fast path handled, by outcome (passed: handed to the switch, whose own \
         counters then count them).",
    );
    let c = fast.counters;
    for (outcome, n) in [
        ("cache_hits", c.cache_hits),
        ("routed", c.routed),
        ("switched", c.switched),
        ("replies", c.replies),
        ("tcp_replies", c.tcp_replies),
        ("tcp_requests", c.tcp_requests),
        ("reply_limited", c.reply_limited),
        ("passed", c.passed),
    ] {
        m.sample("kvswitch_xdp_frames_total", &[("outcome", outcome)], n);
    }
    m.family(
        "kvswitch_xdp_passed_total",
        Kind::Counter,
        "Frames the XDP fast path handed to the switch, by why.",
    );
    for ((reason, _), n) in xdp::PASS_REASONS.iter().zip(c.passed_by) {
        m.sample("kvswitch_xdp_passed_total", &[("reason", reason)], n);
    }
    m.family(
        "kvswitch_port_xdp",
        Kind::Gauge,
        "1 when the XDP fast path runs on the port.",
    );
    for (i, name) in port_names.iter().enumerate() {
        let on = fast.ports.get(i).is_some_and(|p| p.starts_with("xdp"));
        m.sample("kvswitch_port_xdp", &[("port", name)], u8::from(on));
    }
    m.family(
        "kvswitch_port_bytes_total",
        Kind::Counter,
        "Bytes per port and direction.",
    );
    for (name, p) in port_names.iter().zip(&s.ports) {
        for (dir, n) in [("rx", &p.rx_bytes), ("tx", &p.tx_bytes)] {
            m.sample(
                "kvswitch_port_bytes_total",
                &[("port", name), ("dir", dir)],
                get(n),
            );
        }
    }
    let servers = shared.pool.spec();
    // The pool's servers (those removed left out) with their labels and counters.
    let in_pool: Vec<(usize, String, &switch::stats::BackendCounters)> = servers
        .servers
        .iter()
        .zip(&s.backends)
        .enumerate()
        .filter(|(i, _)| !shared.pool.health(*i).removed)
        .map(|(i, (server, b))| (i, server.label(), b))
        .collect();
    m.family(
        "kvswitch_backend_requests_total",
        Kind::Counter,
        "memcached requests sent to each server (a read steered to a cache node is none).",
    );
    for (_, label, b) in &in_pool {
        m.sample(
            "kvswitch_backend_requests_total",
            &[("backend", label)],
            get(&b.requests),
        );
    }
    let now = kvio::clock::now();
    m.family(
        "kvswitch_backend_in_ring",
        Kind::Gauge,
        "1 while the server is in the pool's ring (both the UDP path and the proxy route to \
         it), 0 while it is out.",
    );
    for (i, label, _) in &in_pool {
        m.sample(
            "kvswitch_backend_in_ring",
            &[("backend", label)],
            u8::from(!shared.pool.is_down(*i, now)),
        );
    }
    m.single(
        "kvswitch_pool_version",
        Kind::Gauge,
        "The pool's version: changes of its ring since start (a server taken out or put back, \
         added, removed or reweighted). A gauge, not a counter: it names the ring in force, and \
         a restart starts it again.",
        shared.pool.version(),
    );
    m.family(
        "kvswitch_backend_replies_total",
        Kind::Counter,
        "UDP replies from each server's memcached port that crossed the switch.",
    );
    for (_, label, b) in &in_pool {
        m.sample(
            "kvswitch_backend_replies_total",
            &[("backend", label)],
            get(&b.replies),
        );
    }
    m.family(
        "kvswitch_drops_total",
        Kind::Counter,
        "Frames dropped, by reason.",
    );
    for d in Drop::ALL {
        m.sample(
            "kvswitch_drops_total",
            &[("reason", d.name())],
            get(&s.drops[d as usize]),
        );
    }
    m.family(
        "kvswitch_answers_total",
        Kind::Counter,
        "Requests the switch answered itself, by kind.",
    );
    for a in Answer::ALL {
        m.sample(
            "kvswitch_answers_total",
            &[("kind", a.name())],
            get(&s.answers[a as usize]),
        );
    }
    m.family(
        "kvswitch_switchkv_queries_total",
        Kind::Counter,
        "Queries a SwitchKV client encoded (key hash in the destination MAC), by prefix.",
    );
    for (kind, n) in [("get", &s.switchkv_gets), ("other", &s.switchkv_others)] {
        m.sample("kvswitch_switchkv_queries_total", &[("kind", kind)], get(n));
    }
    m.family(
        "kvswitch_tcp_connections_total",
        Kind::Counter,
        "TCP connections to the VIP the switch answered, by path: spliced to their first \
         request's server, handed over from a splice to the proxy, or proxied from the start.",
    );
    for (path, n) in tcp_paths(s) {
        m.sample("kvswitch_tcp_connections_total", &[("path", path)], n);
    }
    let singles: [(&str, &str, u64); 22] = [
        (
            "kvswitch_tcp_legs_total",
            "Connections to a server a spliced connection opened after its first.",
            get(&s.tcp_legs),
        ),
        (
            "kvswitch_tcp_flows",
            "TCP connections the splice holds now (sequence offsets live).",
            get(&s.tcp_flows),
        ),
        (
            "kvswitch_tcp_syn_cookies_total",
            "SYNs to the VIP's memcached port answered with a SYN cookie.",
            get(&s.tcp_syn_cookies),
        ),
        (
            "kvswitch_tcp_requests_total",
            "Requests the TCP splice sent to a server itself.",
            get(&s.tcp_requests),
        ),
        (
            "kvswitch_tcp_keepalive_probes_total",
            "Keepalive probes sent to spliced clients silent for switch.tcp_idle_s.",
            get(&s.tcp_keepalive_probes),
        ),
        (
            "kvswitch_tcp_idle_resets_total",
            "Spliced connections reset because their client answered no keepalive probe.",
            get(&s.tcp_idle_resets),
        ),
        (
            "kvswitch_kv_requests_total",
            "memcached datagrams to the VIP.",
            get(&s.kv_requests),
        ),
        (
            "kvswitch_keyed_requests_total",
            "Datagrams to the VIP's keyed ports (vip.keyed_ports), valid header or not.",
            get(&s.keyed_requests),
        ),
        (
            "kvswitch_kv_forwarded_total",
            "Datagrams forwarded whole to one server.",
            get(&s.kv_forwarded),
        ),
        (
            "kvswitch_kv_route_held_total",
            "Routed datagrams held until their server's port was known.",
            get(&s.route_held),
        ),
        (
            "kvswitch_kv_split_total",
            "Multi-key gets split across servers.",
            get(&s.kv_split),
        ),
        (
            "kvswitch_kv_replicated_writes_total",
            "Writes sent to every replica of their key.",
            get(&s.kv_replicated),
        ),
        (
            "kvswitch_arp_replies_total",
            "ARP replies sent for the VIP.",
            get(&s.arp_replies),
        ),
        (
            "kvswitch_arp_requests_total",
            "ARP requests sent to resolve backends.",
            get(&s.arp_requests_sent),
        ),
        (
            "kvswitch_switched_total",
            "Frames sent out of one port.",
            get(&s.switched),
        ),
        ("kvswitch_flooded_total", "Frames flooded.", get(&s.flooded)),
        (
            "kvswitch_multicast_total",
            "Frames a multicast action copied to a group's members.",
            get(&s.multicast),
        ),
        (
            "kvswitch_multicast_copies_total",
            "Copies multicast actions sent.",
            get(&s.multicast_copies),
        ),
        (
            "kvswitch_mac_learned_total",
            "MAC table updates.",
            get(&s.mac_learned),
        ),
        (
            "kvswitch_splits_in_flight",
            "Split multi-key gets awaiting parts.",
            get(&s.splits_in_flight),
        ),
        (
            "kvswitch_impaired_held",
            "Frames an operator's impair action holds back now.",
            get(&s.impaired_held),
        ),
        (
            "kvswitch_impaired_duplicated_total",
            "Frames an operator's impair action sent twice.",
            get(&s.impaired_duplicated),
        ),
    ];
    for (name, help, value) in singles {
        let kind = if name.ends_with("_total") {
            Kind::Counter
        } else {
            Kind::Gauge
        };
        m.single(name, kind, help, value);
    }
}

/// The TCP splice's connections by path.
fn tcp_paths(s: &Stats) -> [(&'static str, u64); 3] {
    [
        ("spliced", get(&s.tcp_spliced)),
        ("handed_over", get(&s.tcp_handed_over)),
        ("proxied", get(&s.tcp_proxied)),
    ]
}

/// Each port with its counters.
pub fn ports(shared: &Shared) -> serde_json::Value {
    let fast = shared.fast.get();
    shared
        .stats
        .ports
        .iter()
        .enumerate()
        .map(|(i, p)| {
            json!(PortView {
                port: i as u16,
                name: shared.port_names.get(i).cloned(),
                mac: shared.port_macs.get(i).cloned(),
                datapath: fast.ports.get(i).map_or("af_packet", String::as_str).into(),
                rx_packets: get(&p.rx_packets),
                rx_bytes: get(&p.rx_bytes),
                tx_packets: get(&p.tx_packets),
                tx_bytes: get(&p.tx_bytes),
                tx_dropped: get(&p.tx_dropped),
                queue_bytes: get(&p.queue_bytes),
                queue_packets: get(&p.queue_packets),
                egress_rate_bps: None,
                egress_depth_bytes: None,
            })
        })
        .collect()
}

/// The datapath: XDP or AF_PACKET per port, why XDP is off or idle, and what the program did.
fn datapath_status(shared: &Shared) -> serde_json::Value {
    let f = shared.fast.get();
    let c = f.counters;
    json!({
        "setting": shared.config.datapath.as_str(),
        "xdp": f.ports.iter().any(|p| p.starts_with("xdp")),
        "fallback": f.fallback,
        "idle": f.idle,
        "unsendable_ports": f.unsendable,
        "xdp_frames": {
            "seen": c.frames, "routed": c.routed, "switched": c.switched,
            "replies": c.replies, "passed": c.passed, "reply_limited": c.reply_limited,
            "cache_hits": c.cache_hits, "tcp_replies": c.tcp_replies,
            "tcp_requests": c.tcp_requests,
        },
        "xdp_passed": xdp::PASS_REASONS
            .iter()
            .zip(c.passed_by)
            .map(|((name, _), n)| (name.to_string(), json!(n)))
            .collect::<serde_json::Map<_, _>>(),
    })
}

/// The status document.
pub fn status(shared: &Shared) -> serde_json::Value {
    let s = &shared.stats;
    let snap = shared
        .snapshot
        .lock()
        .map(|g| g.clone())
        .unwrap_or_default();
    let cfg = &shared.config;
    let ports = ports(shared);
    let now = kvio::clock::now();
    let servers = shared.pool.spec();
    let view = shared.pool.view(now);
    let pool: Vec<_> = servers
        .servers
        .iter()
        .enumerate()
        .filter(|(i, _)| !shared.pool.health(*i).removed)
        .map(|(i, b)| {
            json!({
                "server": i,
                "addr": b.addr.to_string(),
                "name": b.name,
                "label": b.label(),
                "ring_name": b.ring_name(),
                "weight": b.weight,
                "mac": snap.backend_macs.get(i).cloned().flatten(),
                "in_ring": view.live().contains(&i),
                "requests": s.backends.get(i).map_or(0, |c| get(&c.requests)),
                "replies": s.backends.get(i).map_or(0, |c| get(&c.replies)),
            })
        })
        .collect();
    let drops: serde_json::Map<String, serde_json::Value> = Drop::ALL
        .iter()
        .map(|d| (d.name().to_string(), json!(get(&s.drops[*d as usize]))))
        .collect();
    let answers: serde_json::Map<String, serde_json::Value> = Answer::ALL
        .iter()
        .map(|a| (a.name().to_string(), json!(get(&s.answers[*a as usize]))))
        .collect();
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_s": shared.started.elapsed().as_secs_f64(),
        "mode": match cfg.mode { Mode::L3 => "l3", Mode::L2 => "l2" },
        "vip": { "ip": cfg.vip.to_string(), "mac": cfg.vip_mac.to_string(), "port": cfg.vip_port },
        "pool": {
            "distribution": cfg.distribution.to_string(),
            "hash": cfg.hash.to_string(),
            "version": shared.pool.version(),
            "servers": pool,
        },
        "ports": ports,
        "datapath": datapath_status(shared),
        "counters": {
            "kv_requests": get(&s.kv_requests),
            "keyed_requests": get(&s.keyed_requests),
            "switchkv_gets": get(&s.switchkv_gets),
            "switchkv_others": get(&s.switchkv_others),
            "kv_forwarded": get(&s.kv_forwarded),
            "kv_split": get(&s.kv_split),
            "kv_replicated": get(&s.kv_replicated),
            "route_held": get(&s.route_held),
            "arp_replies": get(&s.arp_replies),
            "switched": get(&s.switched),
            "flooded": get(&s.flooded),
            "multicast": get(&s.multicast),
            "multicast_copies": get(&s.multicast_copies),
            "drops": drops,
            "answers": answers,
        },
        "tcp": {
            "path": cfg.tcp_path().0.name(),
            "why": cfg.tcp_path().1,
            "connections": tcp_paths(s).into_iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "flows": get(&s.tcp_flows),
            "syn_cookies": get(&s.tcp_syn_cookies),
            "requests": get(&s.tcp_requests),
            "legs": get(&s.tcp_legs),
            "keepalive_probes": get(&s.tcp_keepalive_probes),
            "idle_resets": get(&s.tcp_idle_resets),
        },
        "mac_table": snap.mac_table,
        "splits_in_flight": snap.splits_in_flight,
        "tables": snap.tables.iter().map(|t| json!({
            "name": t.name, "kind": t.kind, "entries": t.entries, "hits": t.hits,
            "misses": t.misses,
        })).collect::<Vec<_>>(),
    })
}
