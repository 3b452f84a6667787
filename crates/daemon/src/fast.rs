//! The XDP fast path in the daemon (`switch.datapath`): loads the program, attaches it to the
//! switch's ports, and keeps its maps in step with the switch from a thread of its own — the
//! switch's tables are taken, and what the program saw handed back, through the run loop's
//! job queue, so the forwarding thread never waits for a map write.

#[cfg(feature = "xdp")]
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
#[cfg(feature = "xdp")]
use std::time::{Duration, Instant};

use anyhow::Context;
use config::{Config, Datapath};
use dataplane::remote::Remote;
use dataplane::EgressSettings;
use proxy::Pool;
#[cfg(feature = "xdp")]
use switch::fastpath::Seen;
use switch::Switch;

/// How often the maps are brought in step with the switch (and at once when the pool changes).
#[cfg(feature = "xdp")]
const SYNC_EVERY: Duration = Duration::from_millis(50);
/// How often the pool's version is looked at between syncs: from a pool change until the
/// sync after it, the program hands requests to the VIP up (see `xdp::PoolFence`).
#[cfg(feature = "xdp")]
const POOL_CHECK: Duration = Duration::from_millis(5);
/// How often the hosts the program switched frames from are read back (their stations and
/// source bindings refreshed); far inside any ageing time.
#[cfg(feature = "xdp")]
const HOSTS_EVERY: Duration = Duration::from_secs(1);

/// What the status API and `/metrics` show of the datapath.
#[derive(Debug, Clone, Default)]
pub struct FastState {
    /// Per port, by number: `xdp (native)`, `xdp (generic)` or `af_packet`.
    pub ports: Vec<String>,
    /// Why XDP is not in use at all, when the datapath fell back to AF_PACKET.
    pub fallback: Option<String>,
    /// Why the program passes every frame up now (the cache on, operator entries, ...).
    pub idle: Option<String>,
    /// Ports the program sends nothing out of (an egress rate, or a veth not ready for it).
    pub unsendable: Vec<String>,
    pub counters: xdp::Counters,
}

#[derive(Default)]
pub struct FastStatus(Mutex<FastState>);

impl FastStatus {
    pub fn get(&self) -> FastState {
        self.0.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn update(&self, f: impl FnOnce(&mut FastState)) {
        if let Ok(mut s) = self.0.lock() {
            f(&mut s);
        }
    }
}

/// The program attached: the thread that keeps its maps in step, and its spliced legs for the
/// switch to hand replies to (when the switch splices TCP).
pub struct Attached {
    pub thread: JoinHandle<()>,
    pub legs: Option<Box<dyn switch::fastpath::LegOffload>>,
}

/// The ports the program runs on: each port's number, name and interface index.
pub struct FastPorts {
    pub ports: Vec<(u16, String, u32)>,
    /// All ports, the local port included (which never gets the program).
    pub count: usize,
    /// With `switch.datapath = "af_xdp"`: each port's AF_XDP socket.
    pub xsks: Vec<(u16, std::os::fd::RawFd)>,
}

/// Loads and attaches the program as `cfg.datapath` asks, and starts the thread that keeps it
/// in step. `Ok(None)`: AF_PACKET alone (asked for, or the fallback of an unset datapath, with
/// the reason in `status`). An explicit `"xdp"` that cannot attach is an error with the
/// kernel's reason. The thread stops once `stop` says so, detaching the program.
#[allow(clippy::too_many_arguments)]
pub fn start(
    cfg: &Config,
    ports: FastPorts,
    remote: Remote<Switch>,
    egress: Arc<EgressSettings>,
    pool: Arc<Pool>,
    cache: Option<Arc<switch::cache::CacheService>>,
    status: Arc<FastStatus>,
    stop: fn() -> bool,
) -> anyhow::Result<Option<Attached>> {
    let af_packet = vec!["af_packet".to_string(); ports.count];
    status.update(|s| s.ports = af_packet.clone());
    if cfg.datapath == Datapath::AfPacket {
        return Ok(None);
    }
    #[cfg(not(feature = "xdp"))]
    {
        let _ = (ports, remote, egress, pool, cache, stop);
        let why = "kvswitch was built without the XDP fast path (cargo feature `xdp`)";
        fall_back(cfg, &status, anyhow::anyhow!(why))
    }
    #[cfg(feature = "xdp")]
    attach_and_keep(cfg, ports, remote, egress, pool, cache, status, stop)
}

/// What an unset datapath does when XDP cannot run: AF_PACKET, with the reason in the status;
/// an explicit "xdp" or "af_xdp" is an error instead.
fn fall_back(
    cfg: &Config,
    status: &FastStatus,
    e: anyhow::Error,
) -> anyhow::Result<Option<Attached>> {
    if matches!(cfg.datapath, Datapath::Xdp | Datapath::AfXdp) {
        return Err(e).with_context(|| {
            format!(
                "{}: `switch.datapath = {:?}`: the XDP program did not attach \
                 (\"af_packet\" runs without it)",
                cfg.path.display(),
                cfg.datapath.as_str()
            )
        });
    }
    let reason = format!("{e:#}");
    tracing::warn!("XDP fast path not in use, every frame goes through AF_PACKET: {reason}");
    status.update(|s| s.fallback = Some(reason));
    Ok(None)
}

/// Loads and attaches the program, and starts the thread that keeps its maps in step.
#[cfg(feature = "xdp")]
#[allow(clippy::too_many_arguments)]
fn attach_and_keep(
    cfg: &Config,
    ports: FastPorts,
    remote: Remote<Switch>,
    egress: Arc<EgressSettings>,
    pool: Arc<Pool>,
    cache: Option<Arc<switch::cache::CacheService>>,
    status: Arc<FastStatus>,
    stop: fn() -> bool,
) -> anyhow::Result<Option<Attached>> {
    let af_packet = vec!["af_packet".to_string(); ports.count];
    let (ready_tx, ready_rx) = mpsc::channel();
    let status_thread = status.clone();
    let (hash, with_cache) = (cfg.hash, cache.is_some());
    let splice = cfg.tcp_splice();
    let thread = std::thread::Builder::new()
        .name("xdp-sync".into())
        .spawn(move || {
            let attached = attach(&ports).and_then(|(mut fp, modes)| {
                for &(port, socket) in &ports.xsks {
                    fp.set_xsk(port, socket)?;
                }
                let mirror = match with_cache {
                    true => Some(fp.cache_mirror(hash, Box::new(to_ktime()))?),
                    false => None,
                };
                let legs = match splice {
                    true => match fp.leg_map() {
                        Ok(legs) => Some(legs),
                        Err(e) => {
                            tracing::warn!("spliced replies go through the switch: {e}");
                            None
                        }
                    },
                    false => None,
                };
                Ok((fp, modes, mirror, legs))
            });
            let fp = match attached {
                Ok((fp, modes, mirror, legs)) => {
                    // From here every new pool version stops the program routing reads
                    // before any path can route by it, until its ring is in use.
                    if !pool.set_fence(Arc::new(fp.pool_fence())) {
                        tracing::warn!(
                            "the pool has a fence already: reads routed in the kernel may \
                             follow the old ring for a sync after a pool change"
                        );
                    }
                    let _ = ready_tx.send(Ok((modes, mirror, legs)));
                    fp
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            keep_in_step(fp, &ports, remote, egress, pool, status_thread, stop);
        })?;
    match ready_rx
        .recv()
        .context("the XDP thread ended before attaching")?
    {
        Ok((modes, mirror, legs)) => {
            // Reads of one key the cache holds are answered in the kernel from here on.
            if let (Some(cache), Some(mirror)) = (&cache, mirror) {
                if !cache.set_mirror(Arc::new(mirror)) {
                    tracing::warn!("the cache already has a mirror: no answers from the kernel");
                }
            }
            status.update(|s| {
                s.ports = af_packet;
                for (port, mode) in &modes {
                    if let Some(p) = s.ports.get_mut(usize::from(*port)) {
                        *p = match cfg.datapath {
                            Datapath::AfXdp => format!("xdp ({mode}) and af_xdp"),
                            _ => format!("xdp ({mode})"),
                        };
                    }
                }
            });
            tracing::info!(ports = ?modes, "XDP fast path attached");
            let legs = legs.map(|l| Box::new(l) as Box<dyn switch::fastpath::LegOffload>);
            Ok(Some(Attached { thread, legs }))
        }
        Err(e) => {
            let _ = thread.join();
            fall_back(cfg, &status, e)
        }
    }
}

/// Loads the program and attaches it to every port (natively where the driver can, else
/// generically); all or nothing (what attached is detached again on failure).
#[cfg(feature = "xdp")]
fn attach(ports: &FastPorts) -> anyhow::Result<(xdp::FastPath, Vec<(u16, xdp::Mode)>)> {
    let mut fp = xdp::FastPath::load()?;
    let mut modes = Vec::new();
    for (port, name, ifindex) in &ports.ports {
        let mode = fp
            .attach(*ifindex)
            .with_context(|| format!("port `{name}`"))?;
        modes.push((*port, mode));
    }
    Ok((fp, modes))
}

/// Turns the process's instants ([`kvio::clock`], on the monotonic clock) into the kernel's
/// `bpf_ktime_get_ns`, which counts the same clock from boot.
#[cfg(feature = "xdp")]
fn to_ktime() -> impl Fn(kv::Instant) -> u64 + Send + Sync {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given, nothing else.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let kernel_now = (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64;
    let origin = kernel_now.saturating_sub(kvio::clock::now().as_nanos());
    move |t: kv::Instant| origin.saturating_add(t.as_nanos())
}

/// Each port with whether the program may send out of it: not a port with an egress rate
/// (whose queue is the driver's), nor one that cannot take frames from XDP (a veth whose peer
/// has neither GRO nor a program of its own; frames to it then go through the switch).
#[cfg(feature = "xdp")]
fn port_table(
    fp: &xdp::FastPath,
    ports: &FastPorts,
    egress: &Arc<EgressSettings>,
) -> Vec<(u16, u32, bool)> {
    ports
        .ports
        .iter()
        .map(|(p, _, ifindex)| {
            let shaped = egress
                .get(usize::from(*p))
                .is_some_and(|(rate, _)| rate > 0);
            (*p, *ifindex, !shaped && fp.can_send(*ifindex))
        })
        .collect()
}

#[cfg(feature = "xdp")]
fn keep_in_step(
    mut fp: xdp::FastPath,
    ports: &FastPorts,
    remote: Remote<Switch>,
    egress: Arc<EgressSettings>,
    pool: Arc<Pool>,
    status: Arc<FastStatus>,
    stop: fn() -> bool,
) {
    let mut table = port_table(&fp, ports, &egress);
    report_ports(&table, ports, &status);
    if let Err(e) = fp.set_ports(&table) {
        tracing::warn!("XDP ports: {e}");
    }
    let mut pending = Seen::default();
    let mut idle = Some(String::from("not yet in step"));
    let mut last_hosts = Instant::now();
    let mut last_version = pool.version();
    // The arcs' counts of the ring last given to the program.
    let mut ring_arcs: Option<Arc<switch::pool::ArcLoads>> = None;
    while !stop() {
        let due = Instant::now() + SYNC_EVERY;
        while Instant::now() < due && pool.version() == last_version && !stop() {
            std::thread::sleep(POOL_CHECK);
        }
        last_version = pool.version();
        let now_table = port_table(&fp, ports, &egress);
        if now_table != table {
            table = now_table;
            report_ports(&table, ports, &status);
            if let Err(e) = fp.set_ports(&table) {
                tracing::warn!("XDP ports: {e}");
            }
        }
        let hosts = last_hosts.elapsed() >= HOSTS_EVERY;
        if hosts {
            last_hosts = Instant::now();
        }
        let counters = fp.counters();
        merge(&mut pending, fp.seen(&counters, hosts));
        // The requests routed on each arc, counted with the ring the program routes by.
        if let Some(arcs) = &ring_arcs {
            let hits = fp.arc_hits();
            if hits.len() == arcs.len() && arcs.counting() {
                arcs.add(&hits);
            }
        }
        let seen = std::mem::take(&mut pending);
        let (tx, rx) = mpsc::sync_channel(1);
        let kept = seen.clone();
        let job = Box::new(move |sw: &mut Switch, now, _: &mut Vec<switch::Emit>| {
            sw.fast_seen(&seen, now);
            let _ = tx.send(sw.fast_tables());
        });
        if remote.submit(job).is_err() {
            pending = kept; // the loop is busy: hand it over next round
            continue;
        }
        let Ok(tables) = rx.recv_timeout(Duration::from_secs(1)) else {
            continue;
        };
        if let Err(e) = fp.sync(&tables) {
            tracing::warn!("XDP maps: {e}");
        }
        let view = pool.view(kvio::clock::now());
        if view.version() == tables.ring_version {
            ring_arcs = view.arcs().cloned();
        }
        // A switch that had not yet seen the pool's version made tables of an older ring,
        // which the program does not route by: sync again at the next look.
        last_version = last_version.min(tables.ring_version);
        if idle.as_deref() != tables.disabled {
            match tables.disabled {
                None => tracing::info!("XDP fast path in step with the switch"),
                Some(why) => tracing::info!("XDP fast path passes every frame up: {why}"),
            }
            idle = tables.disabled.map(str::to_string);
        }
        status.update(|s| {
            s.idle = tables.disabled.map(str::to_string);
            s.counters = counters;
        });
    }
    // Dropping `fp` detaches the program from every port.
}

/// Says in the status which ports the program cannot send to, and logs it once per change.
#[cfg(feature = "xdp")]
fn report_ports(table: &[(u16, u32, bool)], ports: &FastPorts, status: &FastStatus) {
    let blocked: Vec<&str> = table
        .iter()
        .filter(|(_, _, ok)| !ok)
        .filter_map(|(p, _, _)| ports.ports.iter().find(|(q, _, _)| q == p))
        .map(|(_, name, _)| name.as_str())
        .collect();
    if !blocked.is_empty() {
        tracing::info!(
            ports = ?blocked,
            "XDP sends nothing out of these ports (an egress rate, or a veth whose peer has \
             neither GRO on nor an XDP program): frames to them go through the switch"
        );
    }
    status.update(|s| {
        s.unsendable = blocked.iter().map(|n| n.to_string()).collect();
    });
}

#[cfg(feature = "xdp")]
fn merge(into: &mut Seen, more: Seen) {
    into.hosts.extend(more.hosts);
    into.hosts.sort();
    into.hosts.dedup();
    for (a, b) in [
        (&mut into.server_requests, more.server_requests),
        (&mut into.server_replies, more.server_replies),
    ] {
        if a.len() < b.len() {
            a.resize(b.len(), 0);
        }
        for (x, y) in a.iter_mut().zip(b) {
            *x += y;
        }
    }
    into.reply_limited += more.reply_limited;
    into.cache_hits += more.cache_hits;
    into.keyed += more.keyed;
}
