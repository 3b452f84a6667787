//! A server's host side (`kvswitch nf bcube-host`): a TUN device whose packets leave along
//! BCube's parallel paths, spread by the bandwidth each has left.

use super::*;

/// A server's host side.
#[derive(Clone, Debug)]
pub struct HostConfig {
    pub geometry: Geometry,
    pub id: usize,
    pub first_ip: Ipv4Addr,
    /// The TUN device to create.
    pub tun: String,
    /// The interface to the card.
    pub dev: String,
    /// Use at most this many of the parallel paths to a server (0: all).
    pub max_paths: usize,
    /// How often each path in use is asked its available bandwidth (zero: never; the paths
    /// then share packets evenly).
    pub query_every: Duration,
}

/// What a host side counted.
#[derive(Clone, Debug, Default, Serialize)]
pub struct HostStats {
    /// Packets sent, by destination server and path number.
    pub sent: std::collections::BTreeMap<String, Vec<u64>>,
    pub received: u64,
    pub queries_sent: u64,
    pub replies: u64,
    /// Packets from the TUN device that were not IPv4 to another server of the BCube.
    pub not_bcube: u64,
    /// Packets from the card that did not read as BCube data or replies.
    pub malformed: u64,
    /// Data packets the kernel would not take from the TUN device.
    pub undelivered: u64,
    /// Each destination's paths' last answered bandwidth, kb/s.
    pub available_kbps: std::collections::BTreeMap<String, Vec<u32>>,
}

/// The paths to one server and how packets are spread over them.
pub(super) struct Spread {
    pub(super) paths: Vec<Vec<u8>>,
    /// Each path's weight (its last answered bandwidth; all equal until answered).
    pub(super) weight: Vec<u64>,
    /// Smooth weighted round robin: each path's credit.
    pub(super) credit: Vec<i64>,
    pub(super) sent: Vec<u64>,
    /// When each path last answered a query.
    pub(super) answered_at: Vec<Option<Instant>>,
    /// When the spread was made (a path that never answered is silent since then).
    pub(super) since: Instant,
    pub(super) last_used: Instant,
}

impl Spread {
    pub(super) fn new(paths: Vec<Vec<u8>>) -> Spread {
        let k = paths.len();
        Spread {
            paths,
            weight: vec![1; k],
            credit: vec![0; k],
            sent: vec![0; k],
            answered_at: vec![None; k],
            since: Instant::now(),
            last_used: Instant::now(),
        }
    }

    /// The next path: each gets packets in proportion to its weight, interleaved.
    pub(super) fn pick(&mut self) -> usize {
        let total: i64 = self.weight.iter().map(|&w| w as i64).sum();
        for (c, &w) in self.credit.iter_mut().zip(&self.weight) {
            *c += w as i64;
        }
        let best = (0..self.credit.len())
            .max_by_key(|&i| (self.credit[i], std::cmp::Reverse(i)))
            .unwrap_or(0);
        self.credit[best] -= total;
        self.sent[best] += 1;
        best
    }

    pub(super) fn answered(&mut self, path: usize, kbps: u32, now: Instant) {
        if path < self.weight.len() {
            // A path with nothing left still gets a trickle, so its next answer is heard.
            self.weight[path] = u64::from(kbps.max(1));
            self.answered_at[path] = Some(now);
        }
    }

    /// Paths that have not answered for `silent` (their queries lost, as on a path through a
    /// server that is gone) keep a trickle only; while none has ever answered, all share
    /// evenly.
    pub(super) fn age(&mut self, now: Instant, silent: Duration) {
        if self.answered_at.iter().all(Option::is_none) {
            return;
        }
        for (w, at) in self.weight.iter_mut().zip(&self.answered_at) {
            if now.duration_since(at.unwrap_or(self.since)) > silent {
                *w = 1;
            }
        }
    }
}

/// Runs a server's host side until `stop`: creates the TUN device, routes every other
/// server's address through it, and carries packets between it and the card.
pub fn run_host(cfg: &HostConfig, stop: &(dyn Fn() -> bool + Sync)) -> anyhow::Result<HostStats> {
    let g = cfg.geometry;
    anyhow::ensure!(
        cfg.id < g.servers(),
        "server {} is not in the BCube",
        cfg.id
    );
    let me = address(cfg.first_ip, cfg.id);
    let tun = kvio::Tun::open(&cfg.tun)?;
    // Room for the BCube header inside the card link's MTU.
    let mtu = std::fs::read_to_string(format!("/sys/class/net/{}/mtu", cfg.dev))
        .with_context(|| format!("reading the MTU of {}", cfg.dev))?
        .trim()
        .parse::<usize>()
        .context("the interface's MTU")?;
    anyhow::ensure!(
        mtu >= 576 + HEADER_LEN,
        "{}'s MTU of {mtu} leaves no room for the BCube header",
        cfg.dev
    );
    kvio::link::set_mtu(&cfg.tun, mtu - HEADER_LEN)?;
    kvio::link::set_up(&cfg.tun)?;
    for id in (0..g.servers()).filter(|&id| id != cfg.id) {
        kvio::link::replace_host_route(&cfg.tun, address(cfg.first_ip, id), me)?;
    }
    // Packets from other servers come in on the card's link but are routed back through
    // the TUN device: reverse-path filtering would drop them.
    for conf in ["all", "default", cfg.dev.as_str(), cfg.tun.as_str()] {
        kvio::link::set_ipv4_conf(conf, "rp_filter", "0")?;
    }
    let opts = kvio::AfPacketOptions {
        promiscuous: false,
        ignore_outgoing: true,
        rcvbuf: 1 << 16,
        sndbuf: 4 << 20,
        qdisc_bypass: false,
        rx_ring: false,
    };
    let mut port = kvio::AfPacket::open(&cfg.dev, &opts)?;
    let host_mac = Mac(kvio::Port::mac(&port));
    // Receives BCube packets for this host; holding it also keeps the kernel from answering
    // them with ICMP "protocol unreachable".
    let raw = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::RAW,
        Some(socket2::Protocol::from(PROTO as i32)),
    )
    .context("a raw IP socket for BCube packets (needs CAP_NET_RAW)")?;
    raw.set_read_timeout(Some(Duration::from_millis(100)))?;
    let spreads: std::sync::Mutex<HashMap<usize, Spread>> = std::sync::Mutex::new(HashMap::new());
    let stats = std::sync::Mutex::new(HostStats::default());
    let lock = |m: &'static str| anyhow::anyhow!("{m} poisoned");
    let frame_for = |packet: &[u8], host_mac: Mac| {
        let mut f = Vec::with_capacity(14 + packet.len());
        f.extend_from_slice(&[0xff; 6]);
        f.extend_from_slice(&host_mac.0);
        f.extend_from_slice(&[0x08, 0x00]);
        f.extend_from_slice(packet);
        f
    };
    let server_of = |ip: Ipv4Addr| server(cfg.first_ip, g, ip);
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let receiver = scope.spawn(|| -> anyhow::Result<()> {
            let mut buf = vec![0u8; 65536];
            while !stop() && !done.load(std::sync::atomic::Ordering::Relaxed) {
                let n = match std::io::Read::read(&mut &raw, &mut buf) {
                    Ok(n) => n,
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock
                                | std::io::ErrorKind::TimedOut
                                | std::io::ErrorKind::Interrupted
                        ) =>
                    {
                        continue
                    }
                    Err(e) => return Err(e).context("receiving BCube packets"),
                };
                let packet = &buf[..n];
                let Some(h) = header(packet) else {
                    stats.lock().map_err(|_| lock("stats"))?.malformed += 1;
                    continue;
                };
                match h.kind {
                    kind::DATA => {
                        // A packet the kernel will not take (a bad inner header) is counted,
                        // not fatal.
                        let inner = decapsulate(packet);
                        let taken = inner.as_ref().map(|p| tun.write(p).is_ok());
                        let mut st = stats.lock().map_err(|_| lock("stats"))?;
                        match taken {
                            Some(true) => st.received += 1,
                            Some(false) => st.undelivered += 1,
                            None => st.malformed += 1,
                        }
                    }
                    kind::ABQ_REPLY => {
                        let src = Ipv4Addr::new(packet[12], packet[13], packet[14], packet[15]);
                        let q = Query::read(&packet[20 + HEADER_LEN..]);
                        if let (Some(q), Some(from)) = (q, server_of(src)) {
                            let mut s = spreads.lock().map_err(|_| lock("paths"))?;
                            if let Some(spread) = s.get_mut(&from) {
                                spread.answered(q.path as usize, q.kbps, Instant::now());
                            }
                            stats.lock().map_err(|_| lock("stats"))?.replies += 1;
                        }
                    }
                    _ => stats.lock().map_err(|_| lock("stats"))?.malformed += 1,
                }
            }
            Ok(())
        });
        // The sending side: any error ends it, and the receiver with it.
        let sending = (|| -> anyhow::Result<()> {
            let mut buf = vec![0u8; 65536];
            let mut next_query = Instant::now() + cfg.query_every;
            let mut seq = 0u32;
            while !stop() && !receiver.is_finished() {
                let n = tun.read(&mut buf, Duration::from_millis(50))?;
                if n > 0 {
                    let packet = &buf[..n];
                    let dst = (n >= 20 && packet[0] == 0x45)
                        .then(|| Ipv4Addr::new(packet[16], packet[17], packet[18], packet[19]))
                        .and_then(server_of)
                        .filter(|&id| id != cfg.id);
                    let Some(dst) = dst else {
                        stats.lock().map_err(|_| lock("stats"))?.not_bcube += 1;
                        continue;
                    };
                    let route = {
                        let mut s = spreads.lock().map_err(|_| lock("paths"))?;
                        let spread = s.entry(dst).or_insert_with(|| {
                            let mut paths = g.paths(cfg.id, dst);
                            if cfg.max_paths > 0 {
                                paths.truncate(cfg.max_paths);
                            }
                            Spread::new(paths)
                        });
                        spread.last_used = Instant::now();
                        let i = spread.pick();
                        spread.paths[i].clone()
                    };
                    match encapsulate(packet, &route, kind::DATA) {
                        Some(out) => {
                            kvio::Port::send(&mut port, &[&frame_for(&out, host_mac)])
                                .context("sending to the card")?;
                        }
                        None => stats.lock().map_err(|_| lock("stats"))?.not_bcube += 1,
                    }
                }
                if !cfg.query_every.is_zero() && Instant::now() >= next_query {
                    let now = Instant::now();
                    next_query = now + cfg.query_every;
                    let mut s = spreads.lock().map_err(|_| lock("paths"))?;
                    for (&dst, spread) in s.iter_mut() {
                        if spread.last_used.elapsed() > 10 * cfg.query_every {
                            continue;
                        }
                        // A path silent for three rounds (a relay gone) gets a trickle only.
                        spread.age(now, 3 * cfg.query_every);
                        for (i, route) in spread.paths.iter().enumerate() {
                            seq = seq.wrapping_add(1);
                            let q = Query {
                                seq,
                                path: i as u8,
                                kbps: u32::MAX,
                            };
                            let h = Header {
                                kind: kind::ABQ,
                                route: route.clone(),
                                inner: 0,
                            };
                            let f = control_frame(
                                (Mac([0xff; 6]), host_mac),
                                me,
                                address(cfg.first_ip, dst),
                                route.len() as u8 + 1,
                                &h,
                                &q.bytes(),
                            );
                            kvio::Port::send(&mut port, &[&f]).context("sending a query")?;
                            stats.lock().map_err(|_| lock("stats"))?.queries_sent += 1;
                        }
                    }
                }
            }
            Ok(())
        })();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let result = sending;
        let received = receiver
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the receiver panicked")));
        result.and(received)
    })?;
    let mut out = stats.into_inner().map_err(|_| lock("stats"))?;
    for (dst, s) in spreads.into_inner().map_err(|_| lock("paths"))? {
        let name = address(cfg.first_ip, dst).to_string();
        out.sent.insert(name.clone(), s.sent);
        out.available_kbps.insert(
            name,
            s.weight
                .iter()
                .map(|&w| w.min(u32::MAX as u64) as u32)
                .collect(),
        );
    }
    Ok(out)
}
