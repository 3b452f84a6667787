//! The program loaded, attached and kept in step with the switch (the `bpf` feature).

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};

use kv::HashFn;
use libbpf_rs::{MapCore, MapFlags, MapHandle, Object, ObjectBuilder, Xdp, XdpFlags};
use switch::fastpath::{changeover, Host, RingWords, RingWrite, Seen, Tables};
use wire::ethernet::Mac;

use crate::{abi, Counters, Error, Mode, TestRun, Verdict, PASS_REASONS};

/// The compiled program.
static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fastpath.o"));
const PROGRAM: &str = "kvswitch_fastpath";

/// The maps the loader writes and reads, as owned handles.
struct Maps {
    cfg: MapHandle,
    ring: MapHandle,
    servers: MapHandle,
    server_ips: MapHandle,
    ports: MapHandle,
    port_ifindex: MapHandle,
    stations: MapHandle,
    hosts: MapHandle,
    own: MapHandle,
    server_stats: MapHandle,
    counters: MapHandle,
    last_port: MapHandle,
    cache: MapHandle,
    xsks: MapHandle,
    keyed: MapHandle,
    leg_slots: MapHandle,
    leg_clients: MapHandle,
    legs: MapHandle,
}

/// `fp_gate`, the newest pool version any path may route by, with the value last written:
/// raised by the pool's fence and by [`FastPath::sync`], under one lock, so it never goes down.
struct Gate {
    map: MapHandle,
    at: Mutex<Option<u64>>,
}

impl Gate {
    /// Raises the gate to `version`, if it is below.
    fn raise(&self, version: u64) -> Result<(), Error> {
        let mut at = self.at.lock().unwrap_or_else(|p| p.into_inner());
        if at.is_some_and(|a| a >= version) {
            return Ok(());
        }
        self.map
            .update(&0u32.to_ne_bytes(), &version.to_ne_bytes(), MapFlags::ANY)
            .map_err(map_err("fp_gate"))?;
        *at = Some(version);
        Ok(())
    }

    fn get(&self) -> u64 {
        self.at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .unwrap_or(0)
    }
}

/// The pool's fence ([`switch::pool::VersionFence`]) for the program: each new version raises
/// `fp_gate` before the pool publishes it, so the program hands requests to the VIP up from
/// then until [`FastPath::sync`] has put that version's ring in use.
pub struct PoolFence(Arc<Gate>);

impl switch::pool::VersionFence for PoolFence {
    fn before_publish(&self, version: u64) {
        if let Err(e) = self.0.raise(version) {
            // An array map's write does not fail for a valid index; should it, reads may follow
            // the old ring until the next sync, as they did before the fence.
            tracing::error!("the XDP program may route by an old ring until its next sync: {e}");
        }
    }
}

/// What the maps hold now, so a sync writes only what changed.
#[derive(Default)]
struct Shadow {
    cfg: Vec<u8>,
    /// The ring copy in use (0 or 1), the pool version and hash it was written for, its points.
    ring_gen: u32,
    /// The pool version the copy in use is stamped with (`fp_config.ring_version`).
    ring_stamp: u64,
    ring_of: Option<(u64, HashFn)>,
    /// How many points the ring in use holds.
    ring_len: usize,
    servers: Vec<Vec<u8>>,
    server_ips: BTreeMap<Ipv4Addr, u32>,
    stations: BTreeMap<Mac, u16>,
    hosts: BTreeSet<Host>,
    own: BTreeSet<Ipv4Addr>,
    keyed_ports: BTreeSet<u16>,
    /// The ring copy in use's arc counts last read, for deltas.
    arcs: Vec<u64>,
    /// Per-server totals last read, for deltas.
    requests: Vec<u64>,
    replies: Vec<u64>,
    reply_limited: u64,
    cache_hits: u64,
    keyed: u64,
}

/// The loaded program and its maps. Dropping it (or the process ending) detaches the program
/// from every interface it was attached to.
pub struct FastPath {
    object: Object,
    program: OwnedFd,
    maps: Maps,
    attached: Vec<(u32, Mode)>,
    /// One BPF link per attached interface: dropping it detaches the program.
    links: Vec<libbpf_rs::Link>,
    shadow: Shadow,
    gate: Arc<Gate>,
    arcs: ArcHits,
}

/// `fp_arc_hits`, mapped read-only: the requests the program routed on each point's arc, in
/// both copies of the ring.
struct ArcHits {
    base: std::ptr::NonNull<u64>,
    len: usize,
}

// SAFETY: the mapping is shared memory the kernel keeps while mapped; it is only read, through
// atomic loads, and unmapped once on drop.
unsafe impl Send for ArcHits {}

impl ArcHits {
    fn new(map: &MapHandle) -> Result<ArcHits, Error> {
        use std::os::fd::AsRawFd;
        let len = 2 * abi::MAX_POINTS as usize;
        // SAFETY: a shared read-only mapping of the array map's memory (BPF_F_MMAPABLE), of
        // its size; the kernel keeps the map alive while it is mapped.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len * 8,
                libc::PROT_READ,
                libc::MAP_SHARED,
                map.as_fd().as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(Error::Map {
                map: "fp_arc_hits",
                reason: format!("mmap: {}", std::io::Error::last_os_error()),
            });
        }
        let base = std::ptr::NonNull::new(base.cast::<u64>()).ok_or_else(|| Error::Map {
            map: "fp_arc_hits",
            reason: "mmap returned null".into(),
        })?;
        Ok(ArcHits { base, len })
    }

    /// The count of slot `i`.
    fn get(&self, i: usize) -> u64 {
        if i >= self.len {
            return 0;
        }
        // SAFETY: within the mapping, 8-byte aligned (the mapping is page aligned); the
        // program adds to it atomically, so it is read atomically.
        let cell = unsafe { &*(self.base.as_ptr().add(i) as *const std::sync::atomic::AtomicU64) };
        cell.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The counts of `len` points of ring copy `copy`.
    fn copy(&self, copy: u32, len: usize) -> Vec<u64> {
        let base = (copy & 1) as usize * abi::MAX_POINTS as usize;
        (0..len).map(|i| self.get(base + i)).collect()
    }
}

impl Drop for ArcHits {
    fn drop(&mut self) {
        // SAFETY: the mapping made in new(), of that length, unmapped once.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len * 8) };
    }
}

/// Sizes of the structures of `fastpath.h`, as this loader lays them out.
const CFG_LEN: u32 = 64;
const POINT_LEN: u32 = 8;
const SERVER_LEN: u32 = 20;
const MAC_KEY_LEN: u32 = 8;
const HOST_KEY_LEN: u32 = 12;
const HOST_SEEN_LEN: u32 = 8;
const SERVER_STATS_LEN: u32 = 16;
const CACHED_LEN: u32 = 24 + 256 + abi::MAX_REPLY;
const LEG_KEY_LEN: u32 = 12;
const LEG_LEN: u32 = 136;

fn map_err(map: &'static str) -> impl Fn(libbpf_rs::Error) -> Error {
    move |e| Error::Map {
        map,
        reason: e.to_string(),
    }
}

impl FastPath {
    /// Loads the program into the kernel (the verifier checks it here) with empty maps: until
    /// [`FastPath::sync`] enables it, it passes every frame up. Needs CAP_BPF and CAP_NET_ADMIN.
    pub fn load() -> Result<FastPath, Error> {
        let open = ObjectBuilder::default()
            .name("kvswitch")
            .map_err(|e| Error::Load(e.to_string()))?
            .open_memory(OBJECT)
            .map_err(|e| Error::Load(e.to_string()))?;
        let object = open.load().map_err(|e| Error::Load(e.to_string()))?;
        let program = object
            .progs()
            .find(|p| p.name() == PROGRAM)
            .ok_or_else(|| Error::Load(format!("the object has no program {PROGRAM}")))?
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| Error::Load(e.to_string()))?;
        let handle = |name: &'static str, key: u32, value: u32| -> Result<MapHandle, Error> {
            let map = object
                .maps()
                .find(|m| m.name() == name)
                .ok_or_else(|| Error::Load(format!("the object has no map {name}")))?;
            for (what, found, expected) in [
                ("key size", map.key_size(), key),
                ("value size", map.value_size(), value),
            ] {
                if found != expected {
                    return Err(Error::Abi {
                        map: name,
                        what,
                        found,
                        expected,
                    });
                }
            }
            MapHandle::try_from(&map).map_err(|e| Error::Load(e.to_string()))
        };
        let maps = Maps {
            cfg: handle("fp_cfg", 4, CFG_LEN)?,
            ring: handle("fp_ring", 4, POINT_LEN)?,
            servers: handle("fp_servers", 4, SERVER_LEN)?,
            server_ips: handle("fp_server_ips", 4, 4)?,
            ports: handle("fp_ports", 4, 4)?,
            port_ifindex: handle("fp_port_ifindex", 4, 4)?,
            stations: handle("fp_stations", MAC_KEY_LEN, 4)?,
            hosts: handle("fp_hosts", HOST_KEY_LEN, HOST_SEEN_LEN)?,
            own: handle("fp_own", 4, 4)?,
            server_stats: handle("fp_server_stats", 4, SERVER_STATS_LEN)?,
            counters: handle("fp_counters", 4, 8)?,
            last_port: handle("fp_last_port", 4, 4)?,
            cache: handle("fp_cache", 4, CACHED_LEN)?,
            xsks: handle("fp_xsks", 4, 4)?,
            keyed: handle("fp_keyed", 4, 4)?,
            leg_slots: handle("fp_leg_slots", LEG_KEY_LEN, 4)?,
            leg_clients: handle("fp_leg_clients", 8, 4)?,
            legs: handle("fp_legs", 4, LEG_LEN)?,
        };
        let gate = Arc::new(Gate {
            map: handle("fp_gate", 4, 8)?,
            at: Mutex::new(None),
        });
        let arcs = ArcHits::new(&handle("fp_arc_hits", 4, 8)?)?;
        Ok(FastPath {
            object,
            program,
            maps,
            attached: Vec::new(),
            links: Vec::new(),
            shadow: Shadow::default(),
            gate,
            arcs,
        })
    }

    /// Attaches the program to interface `ifindex` with a BPF link, which the kernel releases
    /// when this process ends however it ends: a switch that crashed leaves no program behind
    /// forwarding on tables nobody keeps. The kernel runs it natively where the driver can,
    /// generically otherwise; returns which. The error carries the kernel's reason.
    pub fn attach(&mut self, ifindex: u32) -> Result<Mode, Error> {
        let attach_err = |reason: String| Error::Attach { ifindex, reason };
        let index =
            i32::try_from(ifindex).map_err(|_| attach_err("ifindex out of range".into()))?;
        let program = self
            .object
            .progs_mut()
            .find(|p| p.name() == PROGRAM)
            .ok_or_else(|| attach_err(format!("the object has no program {PROGRAM}")))?;
        let link = program
            .attach_xdp(index)
            .map_err(|e| attach_err(e.to_string()))?;
        /// XDP_ATTACHED_SKB, from linux/if_link.h.
        const ATTACHED_SKB: u8 = 2;
        let mode = match Xdp::new(self.program.as_fd()).query(index, XdpFlags::NONE) {
            Ok(q) if q.attach_mode == ATTACHED_SKB => Mode::Generic,
            _ => Mode::Native,
        };
        self.attached.push((ifindex, mode));
        self.links.push(link);
        Ok(mode)
    }

    /// The interfaces the program is attached to, and how.
    pub fn attached(&self) -> &[(u32, Mode)] {
        &self.attached
    }

    /// Whether the program may send frames out of `ifindex`: always where it runs generically;
    /// natively only when the interface takes frames from XDP (`ndo_xdp_xmit`), which a veth
    /// does only while its peer has GRO on or an XDP program of its own.
    pub fn can_send(&self, ifindex: u32) -> bool {
        /// NETDEV_XDP_ACT_NDO_XMIT, from linux/netdev.h.
        const NDO_XMIT: u64 = 1 << 2;
        match self.attached.iter().find(|(i, _)| *i == ifindex) {
            Some((_, Mode::Generic)) => true,
            Some((_, Mode::Native)) => {
                let xdp = Xdp::new(self.program.as_fd());
                i32::try_from(ifindex).is_ok_and(|i| {
                    xdp.query(i, XdpFlags::NONE)
                        .is_ok_and(|q| q.feature_flags & NDO_XMIT != 0)
                })
            }
            None => false,
        }
    }

    /// Names the switch's ports: each port number with the interface it is, and whether the
    /// program may send frames out of it directly (not a port with an egress rate, whose queue
    /// is the user-space driver's, nor one without the program).
    pub fn set_ports(&mut self, ports: &[(u16, u32, bool)]) -> Result<(), Error> {
        for &(port, ifindex, sendable) in ports {
            let p = u32::from(port);
            if p >= abi::MAX_PORTS {
                continue;
            }
            self.maps
                .ports
                .update(&ifindex.to_ne_bytes(), &p.to_ne_bytes(), MapFlags::ANY)
                .map_err(map_err("fp_ports"))?;
            let to = if sendable { ifindex } else { 0 };
            self.maps
                .port_ifindex
                .update(&p.to_ne_bytes(), &to.to_ne_bytes(), MapFlags::ANY)
                .map_err(map_err("fp_port_ifindex"))?;
        }
        Ok(())
    }

    /// Sends the frames of switch port `port` that the program hands to the switch to the
    /// AF_XDP socket `socket` (bound to the port's interface, queue 0) instead of the kernel's
    /// stack.
    pub fn set_xsk(&mut self, port: u16, socket: std::os::fd::RawFd) -> Result<(), Error> {
        self.maps
            .xsks
            .update(
                &u32::from(port).to_ne_bytes(),
                &(socket as u32).to_ne_bytes(),
                MapFlags::ANY,
            )
            .map_err(map_err("fp_xsks"))
    }

    /// The pool's fence for this program: set it on the pool the switch routes by
    /// ([`switch::pool::Pool::set_fence`]), so that no read is routed here by a ring older
    /// than a request the switch or the proxy routed by the pool's newest view.
    pub fn pool_fence(&self) -> PoolFence {
        PoolFence(self.gate.clone())
    }

    /// Brings the maps to `t`, writing only what changed. A disabled table turns the program
    /// off (every frame passes up) and leaves the rest as it was. A new ring is written into
    /// the copy not in use, switched to under the old ring's stamp, then stamped with its
    /// pool version ([`changeover`]): the program routes by it once that version is the
    /// gate's, and a frame sees one ring or the other.
    pub fn sync(&mut self, t: &Tables) -> Result<(), Error> {
        if t.disabled.is_some() || t.servers.len() > abi::MAX_SERVERS as usize {
            let cfg = cfg_bytes(t, false, 0, self.shadow.ring_stamp);
            return self.write_cfg(&cfg);
        }
        self.sync_servers(t)?;
        self.sync_ring(t)?;
        self.sync_own(t)?;
        self.sync_keyed(t)?;
        self.sync_stations(t)?;
        self.sync_hosts(t)?;
        self.write_cfg(&self.cfg_now(t))
    }

    /// `fp_config` for `t` with the ring copy and stamp in use.
    fn cfg_now(&self, t: &Tables) -> Vec<u8> {
        let ring = (self.shadow.ring_gen * abi::RING_GEN_BIT) | self.shadow.ring_len as u32;
        let ring_ok = self.shadow.ring_len > 0 && self.shadow.ring_len <= abi::MAX_POINTS as usize;
        cfg_bytes(t, ring_ok, ring, self.shadow.ring_stamp)
    }

    fn write_cfg(&mut self, cfg: &[u8]) -> Result<(), Error> {
        if self.shadow.cfg == cfg {
            return Ok(());
        }
        self.maps
            .cfg
            .update(&0u32.to_ne_bytes(), cfg, MapFlags::ANY)
            .map_err(map_err("fp_cfg"))?;
        self.shadow.cfg = cfg.to_vec();
        Ok(())
    }

    fn sync_servers(&mut self, t: &Tables) -> Result<(), Error> {
        let want: Vec<Vec<u8>> = t.servers.iter().map(server_bytes).collect();
        let n = want.len().max(self.shadow.servers.len());
        for i in 0..n {
            let bytes = want
                .get(i)
                .cloned()
                .unwrap_or_else(|| vec![0; SERVER_LEN as usize]);
            if self.shadow.servers.get(i) == Some(&bytes) {
                continue;
            }
            self.maps
                .servers
                .update(&(i as u32).to_ne_bytes(), &bytes, MapFlags::ANY)
                .map_err(map_err("fp_servers"))?;
        }
        self.shadow.servers = want;
        // The newest server at an address is the one its replies count for, as in the switch;
        // a removed server's replies are not sent as the VIP's.
        let ips: BTreeMap<Ipv4Addr, u32> = t
            .servers
            .iter()
            .enumerate()
            .filter(|(_, s)| s.in_pool)
            .map(|(i, s)| (s.ip, i as u32))
            .collect();
        for ip in self
            .shadow
            .server_ips
            .keys()
            .filter(|ip| !ips.contains_key(ip))
        {
            let _ = self.maps.server_ips.delete(&ip.octets());
        }
        for (ip, i) in &ips {
            if self.shadow.server_ips.get(ip) != Some(i) {
                self.maps
                    .server_ips
                    .update(&ip.octets(), &i.to_ne_bytes(), MapFlags::ANY)
                    .map_err(map_err("fp_server_ips"))?;
            }
        }
        self.shadow.server_ips = ips;
        Ok(())
    }

    /// Changes over to `t`'s ring when its pool version is not the one in use, in the order
    /// [`changeover`] gives.
    fn sync_ring(&mut self, t: &Tables) -> Result<(), Error> {
        // A pool's version names one ring.
        let of = Some((t.ring_version, t.hash));
        if self.shadow.ring_of == of {
            return Ok(());
        }
        if t.ring.len() > abi::MAX_POINTS as usize {
            self.shadow.ring_of = of;
            self.shadow.ring_len = t.ring.len();
            return Ok(()); // too long: sync leaves the program off (see ring_ok)
        }
        let words = RingWords {
            gate: self.gate.get(),
            copy: self.shadow.ring_gen as u8,
            version: self.shadow.ring_stamp,
        };
        let plan = changeover(&words, t.ring_version);
        if plan.is_empty() {
            return Ok(()); // tables older than the ring in use: it stays
        }
        for write in plan {
            match write {
                RingWrite::Gate(version) => self.gate.raise(version)?,
                RingWrite::Points(copy) => self.write_points(t, copy)?,
                RingWrite::Select(copy) => {
                    // The copy's counts from its last use are where its new ones start.
                    self.shadow.arcs = self.arcs.copy(u32::from(copy), t.ring.len());
                    self.shadow.ring_gen = u32::from(copy);
                    self.shadow.ring_len = t.ring.len();
                    self.write_cfg(&self.cfg_now(t))?;
                }
                RingWrite::Stamp(version) => {
                    self.shadow.ring_stamp = version;
                    self.write_cfg(&self.cfg_now(t))?;
                }
            }
        }
        self.shadow.ring_of = of;
        Ok(())
    }

    /// `t`'s ring into copy `copy` of `fp_ring` (the one not in use).
    fn write_points(&mut self, t: &Tables, copy: u8) -> Result<(), Error> {
        let base = u32::from(copy & 1) * abi::MAX_POINTS;
        for (i, &(value, server)) in t.ring.iter().enumerate() {
            let mut v = [0u8; POINT_LEN as usize];
            v[..4].copy_from_slice(&value.to_ne_bytes());
            v[4..].copy_from_slice(&(server as u32).to_ne_bytes());
            self.maps
                .ring
                .update(&(base + i as u32).to_ne_bytes(), &v, MapFlags::ANY)
                .map_err(map_err("fp_ring"))?;
        }
        Ok(())
    }

    fn sync_own(&mut self, t: &Tables) -> Result<(), Error> {
        let want: BTreeSet<Ipv4Addr> = t.own.iter().copied().collect();
        for ip in self.shadow.own.difference(&want) {
            let _ = self.maps.own.delete(&ip.octets());
        }
        for ip in want.difference(&self.shadow.own) {
            self.maps
                .own
                .update(&ip.octets(), &1u32.to_ne_bytes(), MapFlags::ANY)
                .map_err(map_err("fp_own"))?;
        }
        self.shadow.own = want;
        Ok(())
    }

    fn sync_keyed(&mut self, t: &Tables) -> Result<(), Error> {
        // The program reads the port as it lies in the frame, widened to 32 bits.
        let key = |port: u16| u32::from(u16::from_ne_bytes(port.to_be_bytes())).to_ne_bytes();
        let want: BTreeSet<u16> = t.keyed_ports.iter().copied().collect();
        for &port in self.shadow.keyed_ports.difference(&want) {
            let _ = self.maps.keyed.delete(&key(port));
        }
        for &port in want.difference(&self.shadow.keyed_ports) {
            self.maps
                .keyed
                .update(&key(port), &1u32.to_ne_bytes(), MapFlags::ANY)
                .map_err(map_err("fp_keyed"))?;
        }
        self.shadow.keyed_ports = want;
        Ok(())
    }

    fn sync_stations(&mut self, t: &Tables) -> Result<(), Error> {
        let want: BTreeMap<Mac, u16> = t.stations.iter().copied().collect();
        for mac in self
            .shadow
            .stations
            .keys()
            .filter(|m| !want.contains_key(m))
        {
            let _ = self.maps.stations.delete(&mac_key(*mac));
        }
        let mut kept = BTreeMap::new();
        for (mac, port) in want {
            if self.shadow.stations.get(&mac) != Some(&port) {
                let written = self.maps.stations.update(
                    &mac_key(mac),
                    &u32::from(port).to_ne_bytes(),
                    MapFlags::ANY,
                );
                if written.is_err() {
                    continue; // the map is full: this station's frames go up
                }
            }
            kept.insert(mac, port);
        }
        self.shadow.stations = kept;
        Ok(())
    }

    fn sync_hosts(&mut self, t: &Tables) -> Result<(), Error> {
        let want: BTreeSet<Host> = t.hosts.iter().copied().collect();
        for h in self.shadow.hosts.difference(&want) {
            let _ = self.maps.hosts.delete(&host_key(h));
        }
        let mut kept: BTreeSet<Host> = self.shadow.hosts.intersection(&want).copied().collect();
        for h in want.difference(&self.shadow.hosts) {
            let mut seen = [0u8; HOST_SEEN_LEN as usize];
            seen[..4].copy_from_slice(&u32::from(h.port).to_ne_bytes());
            // A host of the same MAC and address on another port is replaced.
            if self
                .maps
                .hosts
                .update(&host_key(h), &seen, MapFlags::ANY)
                .is_ok()
            {
                kept.insert(*h);
            }
        }
        // Entries of one key on two ports: only the last written is in the map.
        self.shadow.hosts = kept;
        Ok(())
    }

    /// A handle on the kernel cache that follows the user-space cache's values
    /// ([`switch::cache::CacheMirror`]): keys hashed with `hash` (the pool's), leases turned
    /// into the kernel's monotonic clock by `to_ktime`.
    pub fn cache_mirror(
        &self,
        hash: HashFn,
        to_ktime: Box<dyn Fn(kv::Instant) -> u64 + Send + Sync>,
    ) -> Result<CacheMap, Error> {
        Ok(CacheMap {
            map: MapHandle::try_from(&self.maps.cache).map_err(|e| Error::Load(e.to_string()))?,
            hash,
            to_ktime,
        })
    }

    /// The program's spliced legs as the splice's [`switch::fastpath::LegOffload`]: a handle
    /// on `fp_leg_slots` and a memory mapping of `fp_legs`, which the switch's thread then
    /// reads and writes without a system call per request.
    pub fn leg_map(&self) -> Result<LegMap, Error> {
        LegMap::new(
            &self.maps.leg_slots,
            &self.maps.leg_clients,
            &self.maps.legs,
        )
    }

    /// What the program did since the last call, from `counters` (just read with
    /// [`FastPath::counters`]) and its per-server counts and, with `hosts`, the hosts it
    /// switched frames from (their marks cleared, so the next call names only those seen
    /// again).
    pub fn seen(&mut self, counters: &Counters, hosts: bool) -> Seen {
        let n = self.shadow.servers.len();
        let mut seen = Seen {
            hosts: Vec::new(),
            server_requests: vec![0; n],
            server_replies: vec![0; n],
            reply_limited: 0,
            cache_hits: 0,
            keyed: counters.keyed.saturating_sub(self.shadow.keyed),
        };
        self.shadow.keyed = counters.keyed;
        seen.reply_limited = counters
            .reply_limited
            .saturating_sub(self.shadow.reply_limited);
        self.shadow.reply_limited = counters.reply_limited;
        seen.cache_hits = counters.cache_hits.saturating_sub(self.shadow.cache_hits);
        self.shadow.cache_hits = counters.cache_hits;
        self.shadow.requests.resize(n, 0);
        self.shadow.replies.resize(n, 0);
        for i in 0..n {
            let Ok(Some(per_cpu)) = self
                .maps
                .server_stats
                .lookup_percpu(&(i as u32).to_ne_bytes(), MapFlags::ANY)
            else {
                continue;
            };
            let (mut req, mut rep) = (0u64, 0u64);
            for v in &per_cpu {
                req += read_u64(v, 0);
                rep += read_u64(v, 8);
            }
            seen.server_requests[i] = req.saturating_sub(self.shadow.requests[i]);
            seen.server_replies[i] = rep.saturating_sub(self.shadow.replies[i]);
            self.shadow.requests[i] = req;
            self.shadow.replies[i] = rep;
        }
        if hosts {
            for h in &self.shadow.hosts {
                let key = host_key(h);
                let Ok(Some(v)) = self.maps.hosts.lookup(&key, MapFlags::ANY) else {
                    continue;
                };
                if v.get(4..8) == Some(&[0, 0, 0, 0][..]) {
                    continue;
                }
                seen.hosts.push(*h);
                let mut cleared = v.clone();
                cleared[4..8].fill(0);
                let _ = self.maps.hosts.update(&key, &cleared, MapFlags::EXIST);
            }
        }
        seen
    }

    /// The requests the program routed on each arc of the ring in use since the last call
    /// (in the ring's point order; empty while it routes by none). What it counted on a copy
    /// between the last call and that copy's replacement is not given.
    pub fn arc_hits(&mut self) -> Vec<u64> {
        let len = self.shadow.ring_len.min(abi::MAX_POINTS as usize);
        let now = self.arcs.copy(self.shadow.ring_gen, len);
        let deltas = match self.shadow.arcs.len() == len {
            true => now
                .iter()
                .zip(&self.shadow.arcs)
                .map(|(n, b)| n.saturating_sub(*b))
                .collect(),
            false => vec![0; len],
        };
        self.shadow.arcs = now;
        deltas
    }

    /// The program's counters, summed over CPUs.
    pub fn counters(&self) -> Counters {
        let read = |i: u32| -> u64 {
            match self
                .maps
                .counters
                .lookup_percpu(&i.to_ne_bytes(), MapFlags::ANY)
            {
                Ok(Some(per_cpu)) => per_cpu.iter().map(|v| read_u64(v, 0)).sum(),
                _ => 0,
            }
        };
        Counters {
            frames: read(abi::C_FRAMES),
            routed: read(abi::C_ROUTED),
            switched: read(abi::C_SWITCHED),
            replies: read(abi::C_REPLIES),
            passed: read(abi::C_PASSED),
            reply_limited: read(abi::C_REPLY_LIMITED),
            cache_hits: read(abi::C_CACHE_HITS),
            keyed: read(abi::C_KEYED),
            tcp_replies: read(abi::C_TCP_REPLIES),
            tcp_requests: read(abi::C_TCP_REQUESTS),
            passed_by: PASS_REASONS.map(|(_, i)| read(i)),
        }
    }

    /// Runs `frame`, arriving on switch port `in_port`, through the program with
    /// `BPF_PROG_TEST_RUN` (as katran's tests do): nothing is sent. Frames arrive as from the
    /// loopback interface, which stands for `in_port` during the run.
    pub fn test_run(&mut self, frame: &[u8], in_port: u16) -> Result<TestRun, Error> {
        const LOOPBACK: u32 = 1;
        self.maps
            .ports
            .update(
                &LOOPBACK.to_ne_bytes(),
                &u32::from(in_port).to_ne_bytes(),
                MapFlags::ANY,
            )
            .map_err(map_err("fp_ports"))?;
        let cpus = libbpf_rs::num_possible_cpus().map_err(|e| Error::TestRun(e.to_string()))?;
        let none = vec![u32::MAX.to_ne_bytes().to_vec(); cpus];
        self.maps
            .last_port
            .update_percpu(&0u32.to_ne_bytes(), &none, MapFlags::ANY)
            .map_err(map_err("fp_last_port"))?;
        // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index,
        // egress_ifindex.
        // The kernel runs nothing shorter than an Ethernet header, on a port or in a test.
        if frame.len() < 14 {
            return Ok(TestRun {
                verdict: Verdict::Pass,
                frame: frame.to_vec(),
                out_port: None,
            });
        }
        let mut ctx = [0u8; 24];
        let len =
            u32::try_from(frame.len()).map_err(|_| Error::TestRun("frame too long".into()))?;
        ctx[4..8].copy_from_slice(&len.to_ne_bytes());
        ctx[12..16].copy_from_slice(&LOOPBACK.to_ne_bytes());
        // Room for a reply from the kernel cache, which grows the frame.
        let mut out = vec![0u8; 4096];
        let input = libbpf_rs::ProgramInput {
            data_in: Some(frame),
            data_out: Some(&mut out),
            context_in: Some(&mut ctx),
            ..Default::default()
        };
        let program = self
            .object
            .progs_mut()
            .find(|p| p.name() == PROGRAM)
            .ok_or_else(|| Error::TestRun("no program".into()))?;
        let result = program
            .test_run(input)
            .map_err(|e| Error::TestRun(e.to_string()))?;
        let verdict = Verdict::from_action(result.return_value);
        let frame = result.data.map(|d| d.to_vec()).unwrap_or_default();
        let out_port = match self
            .maps
            .last_port
            .lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)
        {
            Ok(Some(per_cpu)) => per_cpu
                .iter()
                .map(|v| read_u32(v, 0))
                .find(|&p| p != u32::MAX)
                .and_then(|p| u16::try_from(p).ok()),
            _ => None,
        };
        Ok(TestRun {
            verdict,
            frame,
            out_port: out_port.filter(|_| matches!(verdict, Verdict::Tx | Verdict::Redirect)),
        })
    }
}

/// The kernel cache as the user-space cache's mirror: a key's entry is written when it is
/// filled and deleted when it is dropped, each a system call made at once, under the cache's
/// lock and before the write that dropped it is forwarded.
pub struct CacheMap {
    map: MapHandle,
    hash: HashFn,
    to_ktime: Box<dyn Fn(kv::Instant) -> u64 + Send + Sync>,
}

impl CacheMap {
    fn key(&self, key: &[u8]) -> [u8; 4] {
        let hash = if key.is_empty() {
            0
        } else {
            self.hash.hash(key)
        };
        hash.to_ne_bytes()
    }
}

impl switch::cache::CacheMirror for CacheMap {
    fn fill(&self, key: &[u8], reply: &[u8], until: kv::Instant) {
        if key.len() > abi::MAX_KEY as usize || reply.len() > abi::MAX_REPLY as usize {
            // Too long to answer from the kernel: make sure no older value is.
            self.drop_key(key);
            return;
        }
        let mut v = vec![0u8; CACHED_LEN as usize];
        v[0..8].copy_from_slice(&(self.to_ktime)(until).to_ne_bytes());
        v[8..12].copy_from_slice(&(key.len() as u32).to_ne_bytes());
        v[12..16].copy_from_slice(&(reply.len() as u32).to_ne_bytes());
        v[16..20].copy_from_slice(&reply_sum(reply).to_ne_bytes());
        v[24..24 + key.len()].copy_from_slice(key);
        v[280..280 + reply.len()].copy_from_slice(reply);
        if let Err(e) = self.map.update(&self.key(key), &v, MapFlags::ANY) {
            // Full (E2BIG) is the common case: the kernel holds as many keys as it can, and
            // the switch answers the others.
            tracing::debug!("the kernel cache did not take a value: {e}");
            self.drop_key(key);
        }
    }

    fn drop_key(&self, key: &[u8]) {
        // Absent is as good as deleted; any other failure could leave a stale value, so the
        // whole copy goes.
        if let Err(e) = self.map.delete(&self.key(key)) {
            if e.kind() != libbpf_rs::ErrorKind::NotFound {
                tracing::error!("the kernel cache failed to drop a key ({e}): emptying it");
                self.drop_all();
            }
        }
    }

    fn drop_all(&self) {
        let keys: Vec<Vec<u8>> = self.map.keys().collect();
        for k in keys {
            let _ = self.map.delete(&k);
        }
    }
}

/// The sum of `reply`'s 16-bit words as the program reads them (native order; a last odd
/// byte padded with zero), from which it finishes the UDP checksum.
fn reply_sum(reply: &[u8]) -> u32 {
    let mut sum: u64 = 0;
    for w in reply.chunks(2) {
        let word = [w[0], w.get(1).copied().unwrap_or(0)];
        sum += u64::from(u16::from_ne_bytes(word));
    }
    while sum > 0xffff_ffff {
        sum = (sum & 0xffff_ffff) + (sum >> 32);
    }
    sum as u32
}

fn hash_code(h: HashFn) -> Option<u32> {
    Some(match h {
        HashFn::Md5 => abi::HASH_MD5,
        HashFn::Fnv1a64 => abi::HASH_FNV1A_64,
        HashFn::Fnv1_64 => abi::HASH_FNV1_64,
        HashFn::Fnv1a32 => abi::HASH_FNV1A_32,
        HashFn::Fnv1_32 => abi::HASH_FNV1_32,
        HashFn::OneAtATime => abi::HASH_ONE_AT_A_TIME,
        _ => return None,
    })
}

/// Whether the program hashes keys with `h` (otherwise the switch routes every request).
pub fn supports_hash(h: HashFn) -> bool {
    hash_code(h).is_some()
}

/// `struct fp_config`, with the ring selector `ring` and the ring's pool version `stamp`.
fn cfg_bytes(t: &Tables, ring_ok: bool, ring: u32, stamp: u64) -> Vec<u8> {
    let hash = hash_code(t.hash);
    let enabled = t.disabled.is_none() && ring_ok && hash.is_some();
    let mut b = Vec::with_capacity(CFG_LEN as usize);
    b.extend_from_slice(&u32::from(enabled).to_ne_bytes());
    b.extend_from_slice(&t.vip.octets());
    b.extend_from_slice(&t.vip_broadcast.map_or([0; 4], |a| a.octets()));
    b.extend_from_slice(&t.vip_mac.0);
    b.extend_from_slice(&t.vip_port.to_be_bytes());
    b.extend_from_slice(&u32::from(t.l3).to_ne_bytes());
    b.extend_from_slice(&hash.unwrap_or(0).to_ne_bytes());
    b.extend_from_slice(&ring.to_ne_bytes());
    b.extend_from_slice(&u32::from(t.cache_only).to_ne_bytes());
    b.extend_from_slice(&u32::from(t.tcp_splice.unwrap_or(0)).to_ne_bytes());
    // The program's refill multiplies by the rate: keep it under 2^34 bytes a second.
    let (rate, burst) = t.reply_limit.map_or((0, 0), |(r, b)| (r.min(1 << 34), b));
    b.extend_from_slice(&rate.to_ne_bytes());
    b.extend_from_slice(&burst.to_ne_bytes());
    b.extend_from_slice(&stamp.to_ne_bytes());
    debug_assert_eq!(b.len(), CFG_LEN as usize);
    b
}

/// `struct fp_server`.
fn server_bytes(s: &switch::fastpath::FastServer) -> Vec<u8> {
    let mut b = Vec::with_capacity(SERVER_LEN as usize);
    b.extend_from_slice(&s.ip.octets());
    let (mac, port, valid) = match s.to {
        Some((mac, port)) => (mac.0, u32::from(port), 1u32),
        None => ([0; 6], 0, 0),
    };
    b.extend_from_slice(&mac);
    b.extend_from_slice(&s.udp_port.to_be_bytes());
    b.extend_from_slice(&port.to_ne_bytes());
    b.extend_from_slice(&valid.to_ne_bytes());
    b
}

/// `struct fp_mac`.
fn mac_key(mac: Mac) -> [u8; MAC_KEY_LEN as usize] {
    let mut k = [0u8; MAC_KEY_LEN as usize];
    k[..6].copy_from_slice(&mac.0);
    k
}

/// `struct fp_host`.
fn host_key(h: &Host) -> [u8; HOST_KEY_LEN as usize] {
    let mut k = [0u8; HOST_KEY_LEN as usize];
    k[..6].copy_from_slice(&h.mac.0);
    k[8..].copy_from_slice(&h.ip.octets());
    k
}

fn read_u64(v: &[u8], at: usize) -> u64 {
    v.get(at..at + 8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map_or(0, u64::from_ne_bytes)
}

fn read_u32(v: &[u8], at: usize) -> u32 {
    v.get(at..at + 4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map_or(0, u32::from_ne_bytes)
}

/// The program's spliced legs (`fp_legs`, `fp_leg_slots`): a slot per leg handed over, filled
/// in place through a shared mapping. Handing a leg over writes its slot and then `armed`;
/// taking it back clears `armed` and waits out any pass of the program already under way
/// (`busy` against `done`), after which the slot's second half is what the program sent.
pub struct LegMap {
    slots: MapHandle,
    /// `fp_leg_clients`, and what it holds: each client's home slot, whose `client_slot` names
    /// the slot that holds the client's side. (A slot's client is in the slot itself:
    /// [`LegMap::client_of`].)
    clients: MapHandle,
    client_home: std::collections::HashMap<[u8; 8], u32>,
    base: std::ptr::NonNull<u8>,
    len: usize,
    free: Vec<u32>,
    held: std::collections::HashMap<switch::fastpath::LegKey, u32>,
}

// SAFETY: the mapping is owned by the LegMap and lives until it is dropped; the program's
// side of each slot is reached through atomics and volatile reads only.
unsafe impl Send for LegMap {}

/// Where each field of `struct fp_leg` lies.
mod leg_at {
    pub const ARMED: usize = 0;
    pub const BUSY: usize = 4;
    pub const DONE: usize = 8;
    pub const IN_PORT: usize = 12;
    pub const KEY: usize = 16;
    pub const SERVER_MAC: usize = 28;
    pub const CLIENT_MAC: usize = 34;
    pub const CLIENT_PORT: usize = 40;
    pub const VIP_PORT: usize = 42;
    pub const TARGET_SHIFT: usize = 44;
    pub const VIP: usize = 48;
    pub const OUT_PORT: usize = 52;
    pub const SEQ_FROM: usize = 56;
    pub const SEQ_OFF: usize = 60;
    pub const ACK_FROM: usize = 64;
    pub const ACK_TO: usize = 68;
    pub const ACK_OFF: usize = 72;
    pub const OWED: usize = 76;
    pub const READ: usize = 80;
    pub const ANSWERED: usize = 84;
    pub const DATA: usize = 88;
    pub const ACKED: usize = 92;
    pub const LAST_ACK: usize = 96;
    pub const WINDOW: usize = 100;
    pub const SENT: usize = 104;
    pub const SERVER: usize = 108;
    pub const NEXT_IN: usize = 112;
    pub const REQUESTS: usize = 116;
    pub const CLIENT_ACKED: usize = 120;
    pub const ACKED_TO: usize = 124;
    pub const CLIENT_WINDOW: usize = 128;
    pub const LEG_SHIFT: usize = 130;
    pub const REQUESTS_OK: usize = 131;
    pub const CLIENT_SLOT: usize = 132;
}

/// A client as `fp_leg_clients` keys it: its address and port as a segment carries them.
fn client_key(ip: Ipv4Addr, port: u16) -> [u8; 8] {
    let mut k = [0u8; 8];
    k[0..4].copy_from_slice(&ip.octets());
    k[4..6].copy_from_slice(&port.to_be_bytes());
    k
}

fn leg_key_bytes(key: &switch::fastpath::LegKey) -> [u8; LEG_KEY_LEN as usize] {
    let mut k = [0u8; LEG_KEY_LEN as usize];
    k[0..4].copy_from_slice(&key.target.0.octets());
    k[4..8].copy_from_slice(&key.leg.0.octets());
    k[8..10].copy_from_slice(&key.target.1.to_be_bytes());
    k[10..12].copy_from_slice(&key.leg.1.to_be_bytes());
    k
}

impl LegMap {
    fn new(slots: &MapHandle, clients: &MapHandle, legs: &MapHandle) -> Result<LegMap, Error> {
        let slots = MapHandle::try_from(slots).map_err(map_err("fp_leg_slots"))?;
        let clients = MapHandle::try_from(clients).map_err(map_err("fp_leg_clients"))?;
        let len = abi::MAX_LEGS as usize * LEG_LEN as usize;
        use std::os::fd::AsRawFd;
        // SAFETY: a shared mapping of the array map's memory (BPF_F_MMAPABLE), of its size;
        // the kernel keeps the map alive while it is mapped.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                legs.as_fd().as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(Error::Map {
                map: "fp_legs",
                reason: format!("mmap: {}", std::io::Error::last_os_error()),
            });
        }
        let base = std::ptr::NonNull::new(base.cast::<u8>()).ok_or_else(|| Error::Map {
            map: "fp_legs",
            reason: "mmap returned null".into(),
        })?;
        Ok(LegMap {
            slots,
            clients,
            client_home: std::collections::HashMap::new(),
            base,
            len,
            free: (0..abi::MAX_LEGS).rev().collect(),
            held: std::collections::HashMap::new(),
        })
    }

    fn field(&self, slot: u32, at: usize) -> *mut u8 {
        let off = slot as usize * LEG_LEN as usize + at;
        assert!(off + 4 <= self.len, "slot {slot} out of the mapping");
        // SAFETY: in bounds of the mapping, checked above.
        unsafe { self.base.as_ptr().add(off) }
    }

    fn atomic(&self, slot: u32, at: usize) -> &std::sync::atomic::AtomicU32 {
        // SAFETY: 4-aligned (the mapping is page-aligned, slots and fields 4-aligned) and in
        // bounds; the program touches these words only atomically or by aligned loads.
        unsafe { &*(self.field(slot, at) as *const std::sync::atomic::AtomicU32) }
    }

    fn put(&self, slot: u32, at: usize, bytes: &[u8]) {
        for (i, b) in bytes.iter().enumerate() {
            // SAFETY: in bounds (field() checks the word; fields end inside their slot).
            unsafe { std::ptr::write_volatile(self.field(slot, at).add(i), *b) };
        }
    }

    fn get(&self, slot: u32, at: usize) -> u32 {
        // SAFETY: an aligned word in bounds.
        unsafe { std::ptr::read_volatile(self.field(slot, at) as *const u32) }
    }

    fn byte(&self, slot: u32, at: usize) -> u8 {
        // SAFETY: in bounds (field() checks the word the byte is in).
        unsafe { std::ptr::read_volatile(self.field(slot, at & !3).add(at & 3)) }
    }

    /// Makes `client`'s segments find `slot`: a store into the client's home slot, and a map
    /// write only when the client has no home yet (its first leg handed over with its side,
    /// or its home forgotten).
    fn point_client(&mut self, client: [u8; 8], slot: u32) -> bool {
        if let Some(&home) = self.client_home.get(&client) {
            self.set_client_slot(home, slot);
            return true;
        }
        // The home's pointer is set before the program can find the home.
        self.set_client_slot(slot, slot);
        match self
            .clients
            .update(&client, &slot.to_ne_bytes(), MapFlags::ANY)
        {
            Ok(()) => {
                self.client_home.insert(client, slot);
                true
            }
            Err(e) => {
                tracing::debug!("fp_leg_clients did not take a client: {e}");
                false
            }
        }
    }

    /// The client of the leg in `slot` (`key`'s), as `fp_leg_clients` keys it: its address
    /// from the key, its port from the slot, where every hand-over writes it.
    fn client_of(&self, key: &switch::fastpath::LegKey, slot: u32) -> [u8; 8] {
        let port = [leg_at::CLIENT_PORT, leg_at::CLIENT_PORT + 1].map(|at| self.byte(slot, at));
        client_key(key.leg.0, u16::from_be_bytes(port))
    }

    /// Points home slot `home` at `slot`, in one store: the program reads the word while it
    /// runs.
    fn set_client_slot(&self, home: u32, slot: u32) {
        self.atomic(home, leg_at::CLIENT_SLOT)
            .store(slot, std::sync::atomic::Ordering::SeqCst);
    }

    fn disarm(&self, slot: u32) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        if self.atomic(slot, leg_at::ARMED).swap(0, SeqCst) == 0 {
            return false;
        }
        // A pass of the program takes microseconds at most, with preemption off.
        let started = std::time::Instant::now();
        while self.atomic(slot, leg_at::BUSY).load(SeqCst)
            != self.atomic(slot, leg_at::DONE).load(SeqCst)
        {
            if started.elapsed() > std::time::Duration::from_millis(100) {
                tracing::error!("an XDP pass over a spliced leg did not end in 100 ms");
                break;
            }
            std::hint::spin_loop();
        }
        true
    }
}

impl switch::fastpath::LegOffload for LegMap {
    fn hand_over(
        &mut self,
        key: switch::fastpath::LegKey,
        leg: &switch::fastpath::LegHandOver,
    ) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        let slot = match self.held.get(&key) {
            Some(&slot) => {
                self.disarm(slot);
                slot
            }
            None => {
                let Some(slot) = self.free.pop() else {
                    return false;
                };
                if let Err(e) =
                    self.slots
                        .update(&leg_key_bytes(&key), &slot.to_ne_bytes(), MapFlags::ANY)
                {
                    tracing::debug!("fp_leg_slots did not take a leg: {e}");
                    self.free.push(slot);
                    return false;
                }
                self.held.insert(key, slot);
                slot
            }
        };
        self.put(
            slot,
            leg_at::IN_PORT,
            &u32::from(leg.target_port).to_ne_bytes(),
        );
        self.put(slot, leg_at::KEY, &leg_key_bytes(&key));
        self.put(slot, leg_at::SERVER_MAC, &leg.target_mac.0);
        self.put(slot, leg_at::CLIENT_MAC, &leg.client_mac.0);
        self.put(slot, leg_at::CLIENT_PORT, &leg.client_port.to_be_bytes());
        self.put(slot, leg_at::VIP_PORT, &leg.vip.1.to_be_bytes());
        // The target's shift, then the client's.
        self.put(
            slot,
            leg_at::TARGET_SHIFT,
            &[leg.target_shift, leg.client_shift],
        );
        self.put(slot, leg_at::VIP, &leg.vip.0.octets());
        for (at, v) in [
            (leg_at::OUT_PORT, u32::from(leg.client_at)),
            (leg_at::SEQ_FROM, leg.seq_from),
            (leg_at::SEQ_OFF, leg.seq_off),
            (leg_at::ACK_FROM, leg.ack_from),
            (leg_at::ACK_TO, leg.ack_to),
            (leg_at::ACK_OFF, leg.ack_off),
            (leg_at::OWED, leg.owed),
            (leg_at::READ, leg.seq_from),
            (leg_at::ANSWERED, 0),
            (leg_at::DATA, leg.data),
            (leg_at::ACKED, leg.ack_from),
            (leg_at::LAST_ACK, 0),
            (leg_at::WINDOW, 0),
            (leg_at::SENT, 0),
            (leg_at::SERVER, leg.server as u32),
            (leg_at::REQUESTS, 0),
        ] {
            self.put(slot, at, &v.to_ne_bytes());
        }
        let client = client_key(key.leg.0, leg.client_port);
        let side = leg.requests.filter(|_| self.point_client(client, slot));
        if let Some(c) = side {
            for (at, v) in [
                (leg_at::NEXT_IN, c.next_in),
                (leg_at::CLIENT_ACKED, c.acked),
                (leg_at::ACKED_TO, c.acked_to),
            ] {
                self.put(slot, at, &v.to_ne_bytes());
            }
            self.put(slot, leg_at::CLIENT_WINDOW, &c.window.to_ne_bytes());
            self.put(slot, leg_at::LEG_SHIFT, &[c.leg_shift]);
        }
        self.put(slot, leg_at::REQUESTS_OK, &[u8::from(side.is_some())]);
        self.atomic(slot, leg_at::ARMED).store(1, SeqCst);
        true
    }

    fn take_back(&mut self, key: switch::fastpath::LegKey) -> Option<switch::fastpath::LegSent> {
        let slot = *self.held.get(&key)?;
        if !self.disarm(slot) {
            return None;
        }
        let sent = self.get(slot, leg_at::SENT);
        Some(switch::fastpath::LegSent {
            read: self.get(slot, leg_at::READ),
            answered: self.get(slot, leg_at::ANSWERED),
            data: self.get(slot, leg_at::DATA),
            acked: self.get(slot, leg_at::ACKED),
            last: (sent > 0).then(|| {
                (
                    self.get(slot, leg_at::LAST_ACK),
                    self.get(slot, leg_at::WINDOW) as u16,
                )
            }),
            requests: self.get(slot, leg_at::REQUESTS),
            client: (self.byte(slot, leg_at::REQUESTS_OK) == 1).then(|| {
                switch::fastpath::ClientSide {
                    next_in: self.get(slot, leg_at::NEXT_IN),
                    acked: self.get(slot, leg_at::CLIENT_ACKED),
                    window: (self.get(slot, leg_at::CLIENT_WINDOW) & 0xffff) as u16,
                    acked_to: self.get(slot, leg_at::ACKED_TO),
                    leg_shift: self.byte(slot, leg_at::LEG_SHIFT),
                }
            }),
        })
    }

    fn forget(&mut self, key: switch::fastpath::LegKey) {
        let Some(slot) = self.held.remove(&key) else {
            return;
        };
        self.disarm(slot);
        let client = self.client_of(&key, slot);
        match self.client_home.get(&client).copied() {
            Some(home) if home == slot => {
                // A client whose home goes is found no more; its next leg handed over with
                // its side becomes its home.
                self.client_home.remove(&client);
                if let Err(e) = self.clients.delete(&client) {
                    if e.kind() != libbpf_rs::ErrorKind::NotFound {
                        tracing::error!("fp_leg_clients kept a client it was told to forget: {e}");
                    }
                }
            }
            Some(home) if self.get(home, leg_at::CLIENT_SLOT) == slot => {
                // The slot may go to another leg: the client's home points nowhere until its
                // next hand-over.
                self.set_client_slot(home, u32::MAX);
            }
            _ => {}
        }
        if let Err(e) = self.slots.delete(&leg_key_bytes(&key)) {
            if e.kind() != libbpf_rs::ErrorKind::NotFound {
                // The slot stays out of use: the program still finds it by the key, and passes
                // its segments up for as long as it is disarmed.
                tracing::error!("fp_leg_slots kept a leg it was told to forget: {e}");
                return;
            }
        }
        self.free.push(slot);
    }
}

impl Drop for LegMap {
    fn drop(&mut self) {
        // SAFETY: the mapping made in new(), of that length, unmapped once.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}
