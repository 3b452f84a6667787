//! Whether each server answers: its probes (memcached's `version`, through
//! [`client::memcached`]; Redis's `PING` in a Redis pool), the switches' reports of requests that failed, and the one rule that
//! marks a server down after `down_after` failures in a row (or at once on a report of failed
//! requests, a TKO) and up again after `up_after` answers in a row.

use super::*;
use kv::health::{Change, Detector, Thresholds};
use switch::pool::RedisSpec;

/// What a server's probes say of it: whether it is up ([`kv::health::Detector`], the one
/// failure detector, whose first outcome decides), and the counts the status shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    detector: Detector,
    pub probes: u64,
    pub failures: u64,
    /// Times it was marked down.
    pub downs: u64,
    /// Times the switches' reports of its failed requests marked it down (TKO).
    pub tkos: u64,
    pub last_error: Option<String>,
}

impl Default for Health {
    /// A server starts up: it is in the pool until probes say otherwise.
    fn default() -> Health {
        Health {
            detector: Detector::unknown(),
            probes: 0,
            failures: 0,
            downs: 0,
            tkos: 0,
            last_error: None,
        }
    }
}

impl Health {
    /// A target taken for up from the start, that only `down_after` failures in a row take
    /// down (its first probe alone does not decide).
    pub fn up_at_start() -> Health {
        Health {
            detector: Detector::up(),
            ..Health::default()
        }
    }

    /// Whether the server is taken for up (it is, until a probe has said otherwise).
    pub fn up(&self) -> bool {
        self.detector.is_up()
    }

    /// Whether a probe has answered or failed yet: until then the server counts as up, but
    /// the switches are not changed on its account.
    pub fn known(&self) -> bool {
        self.detector.is_known()
    }

    /// Takes in one probe's outcome; returns whether the server changed between up and down.
    /// The first probe says where the server stands, without a run of them: a controller that
    /// has just started, or just taken the lead, puts no dead server back.
    pub fn record(&mut self, outcome: Result<(), String>, down_after: u32, up_after: u32) -> bool {
        self.probes += 1;
        let answered = outcome.is_ok();
        if let Err(e) = outcome {
            self.failures += 1;
            self.last_error = Some(e);
        }
        let t = Thresholds {
            down_after,
            up_after,
        };
        let change = self.detector.record(answered, t);
        if change == Some(Change::Down) {
            self.downs += 1;
        }
        change.is_some()
    }

    /// The switches report `failed` requests to the server within one probe interval, at
    /// least the TKO threshold: it is marked down now, and up again only after its probes
    /// answer. Returns whether it changed.
    pub fn tko(&mut self, failed: u64) -> bool {
        if self.detector.take_down().is_none() {
            return false;
        }
        self.downs += 1;
        self.tkos += 1;
        self.last_error = Some(format!("{failed} failed requests reported by the switches"));
        true
    }
}

/// Asks `addr` for memcached's `version` over TCP, within `timeout`.
pub fn probe(addr: SocketAddr, timeout: Duration) -> Result<(), String> {
    memcached::version(addr, timeout)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Empties the server at `addr` (`flush_all`), then asks it `version`, within `timeout`: the
/// probe of a server that is out of the pool, so that it comes back without the items it
/// held while writes to its keys went to other servers.
pub fn probe_and_flush(addr: SocketAddr, timeout: Duration) -> Result<(), String> {
    memcached::flush_then_version(addr, timeout)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Asks the Redis server at `addr` for `PING` over TCP, within `timeout`, after the pool's
/// password (`AUTH`) when it has one; with `flush`, first empties the pool's database
/// (`SELECT`, `FLUSHDB`), as [`probe_and_flush`] does a memcached.
pub fn probe_redis(
    addr: SocketAddr,
    timeout: Duration,
    redis: &RedisSpec,
    flush: bool,
) -> Result<(), String> {
    use std::io::{Read, Write};
    let deadline = Instant::now() + timeout;
    let mut request = Vec::new();
    let mut want = Vec::new();
    if let Some(password) = &redis.auth {
        wire::resp::encode_command(&["AUTH", password.as_str()], &mut request);
        want.extend_from_slice(b"+OK\r\n");
    }
    if flush {
        let db = redis.db.to_string();
        wire::resp::encode_command(&["SELECT", db.as_str()], &mut request);
        wire::resp::encode_command(&["FLUSHDB"], &mut request);
        want.extend_from_slice(b"+OK\r\n+OK\r\n");
    }
    request.extend_from_slice(b"PING\r\n");
    want.extend_from_slice(b"+PONG\r\n");
    let (request, want) = (&request[..], &want[..]);
    let mut s = std::net::TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| format!("connecting: {e}"))?;
    let _ = s.set_nodelay(true);
    s.set_write_timeout(Some(timeout))
        .and_then(|_| s.write_all(request))
        .map_err(|e| format!("sending PING: {e}"))?;
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while got.len() < want.len() && !got.contains(&b'-') {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("no answer to PING in time".into());
        }
        let n = s
            .set_read_timeout(Some(left))
            .and_then(|_| s.read(&mut buf))
            .map_err(|e| format!("reading the answer to PING: {e}"))?;
        if n == 0 {
            return Err("closed before answering PING".into());
        }
        got.extend_from_slice(&buf[..n]);
    }
    match got == want {
        true => Ok(()),
        false => Err(format!(
            "answered PING with {:?}",
            String::from_utf8_lossy(&got).trim_end()
        )),
    }
}

/// Probes the server at `addr` as its pool speaks (`redis`: a Redis pool's settings; `sasl`:
/// the user and password of memcached servers that require SASL), emptying it first with
/// `flush`.
pub(crate) fn probe_server(
    addr: SocketAddr,
    timeout: Duration,
    redis: Option<&RedisSpec>,
    sasl: Option<(&str, &str)>,
    flush: bool,
) -> Result<(), String> {
    match (redis, sasl, flush) {
        (Some(redis), _, flush) => probe_redis(addr, timeout, redis, flush),
        (None, Some(login), flush) => memcached::version_sasl(addr, timeout, login, flush)
            .map(drop)
            .map_err(|e| e.to_string()),
        (None, None, true) => probe_and_flush(addr, timeout),
        (None, None, false) => probe(addr, timeout),
    }
}

/// Asks `addr` for memcached's `version` over UDP, within `timeout` (matched by request id,
/// not source: a switch in `l3` mode sends servers' replies from the VIP).
pub fn probe_udp(addr: SocketAddr, timeout: Duration) -> Result<(), String> {
    memcached::version_udp(addr, timeout)
        .map(drop)
        .map_err(|e| format!("udp: {e}"))
}

/// Probes every server each interval, all at once, and marks them up or down.
pub(crate) fn prober(shared: &Shared) {
    while !shared.stop.load(Ordering::Relaxed) {
        let began = Instant::now();
        if !shared.fleet().acting() {
            std::thread::sleep(CAMPAIGN_INTERVAL);
            continue;
        }
        let (servers, flush, interval, timeout, udp, switches, tko_after, pool, redis) = {
            let f = shared.fleet();
            // The servers, then the failover spares.
            let addrs: Vec<SocketAddr> = f
                .servers
                .iter()
                .map(|s| s.addr)
                .chain(f.file.failover.iter().copied())
                .collect();
            // A server out of the pool is emptied as it is probed, so that it comes back
            // without items that writes made meanwhile, elsewhere, have replaced. Not while
            // every server is down: the switches then keep them all (see `desired`).
            let kept_all =
                f.health.iter().all(|h| !h.up()) && f.standing_in.iter().all(Option::is_none);
            let flush: Vec<bool> = f
                .health
                .iter()
                .map(|h| f.file.flush_on_return && !kept_all && h.known() && !h.up())
                .collect();
            (
                addrs,
                flush,
                f.file.probe_interval,
                f.file.probe_timeout,
                f.file.probe_udp,
                f.file.switches.clone(),
                f.file.tko_after,
                f.file.pool.name.clone(),
                f.file.pool.redis.clone(),
            )
        };
        let (outcomes, reports) = std::thread::scope(|s| {
            let reports: Vec<_> = switches
                .iter()
                .filter(|_| tko_after > 0)
                .map(|sw| {
                    let client = shared.switch_client(sw.api);
                    let pool = &pool;
                    s.spawn(move || failures_reported(&client, pool, timeout.max(REPORT_WAIT)))
                })
                .collect();
            let probes: Vec<_> = servers
                .iter()
                .enumerate()
                .map(|(i, &addr)| {
                    let flush = flush.get(i).copied().unwrap_or(false);
                    let redis = redis.as_ref();
                    let sasl = shared
                        .server_sasl
                        .as_ref()
                        .map(|(u, p)| (u.as_str(), p.as_str()));
                    s.spawn(move || {
                        probe_server(addr, timeout, redis, sasl, flush)?;
                        match udp {
                            true => probe_udp(addr, timeout),
                            false => Ok(()),
                        }
                    })
                })
                .collect();
            let outcomes: Vec<Result<(), String>> = probes
                .into_iter()
                .map(|p| p.join().unwrap_or_else(|_| Err("the probe failed".into())))
                .collect();
            let reports: Vec<Option<Vec<(String, u64)>>> = reports
                .into_iter()
                .map(|r| r.join().ok().flatten())
                .collect();
            (outcomes, reports)
        });
        {
            let mut f = shared.fleet();
            let (down_after, up_after) = (f.file.down_after, f.file.up_after);
            let mut changed = false;
            let spares_at = servers.len() - f.file.failover.len();
            let mut outcomes = outcomes.into_iter();
            let mine: Vec<_> = outcomes.by_ref().take(spares_at).collect();
            for (k, outcome) in outcomes.enumerate() {
                if let Some(h) = f.spare_health.get_mut(k) {
                    // A spare's change matters only to a server it stands in for, or could.
                    changed |= h.record(outcome, down_after, up_after);
                }
            }
            let failed = new_failures(&mut f.reported, &reports);
            let mut returned = Vec::new();
            for (i, (addr, outcome)) in servers.iter().zip(mine).enumerate() {
                // The list may have changed while the probes ran.
                let Some(s) = f.servers.get(i).filter(|s| s.addr == *addr) else {
                    continue;
                };
                let label = s.label();
                let reported = failed.get(&addr.to_string()).copied().unwrap_or(0);
                let h = &mut f.health[i];
                if tko_after > 0 && reported >= u64::from(tko_after) && h.tko(reported) {
                    changed = true;
                    tracing::warn!(
                        server = %label,
                        failed = reported,
                        "server down: the switches report its requests failing (TKO)"
                    );
                    continue;
                }
                if h.record(outcome, down_after, up_after) {
                    changed = true;
                    if h.up() {
                        returned.push(label.clone());
                    }
                    match h.up() {
                        true => tracing::info!(server = %label, "server up: back in the pool"),
                        false => tracing::warn!(
                            server = %label,
                            error = h.last_error.as_deref().unwrap_or(""),
                            "server down: taken out of the pool"
                        ),
                    }
                }
            }
            // Back from being down, it warms up from where its keys were meanwhile.
            if let Some(warm) = f.file.return_warm.filter(|_| !returned.is_empty()) {
                let until = Instant::now() + warm;
                for label in returned {
                    f.warm_until.insert(label, until);
                }
            }
            if changed {
                shared.bump(&mut f);
            }
        }
        std::thread::sleep(interval.saturating_sub(began.elapsed()));
    }
}

/// How long the prober waits at least for a switch's report of failed requests.
pub(crate) const REPORT_WAIT: Duration = Duration::from_millis(200);

/// Each server's failed requests as one switch counts them (`GET /api/v1/pool`), by address;
/// `None` if the switch did not answer.
pub(crate) fn failures_reported(
    client: &Client,
    pool: &str,
    wait: Duration,
) -> Option<Vec<(String, u64)>> {
    let doc = client.call_within("GET", "/api/v1/pool", None, wait).ok()?;
    let pools = doc["pools"].as_array()?;
    // The controller's pool, or the only one (as the syncer picks it).
    let theirs = match pools.iter().find(|p| p["name"] == pool) {
        Some(p) => p,
        None if pools.len() == 1 => &pools[0],
        None => return None,
    };
    let servers = theirs["servers"].as_array().into_iter().flatten();
    Some(
        servers
            .filter_map(|v| Some((v["addr"].as_str()?.to_string(), v["failures"].as_u64()?)))
            .collect(),
    )
}

/// The failed requests each server's address gained, summed over the switches, since their
/// last reports (`last`, by switch and address, is brought up to date). A switch's first
/// report of a server, or a count that went down (the switch restarted), only sets where
/// counting starts; a server a switch no longer lists is forgotten, so that failures counted
/// while it was out (requests sent before it left) do not count when it is back.
pub(crate) fn new_failures(
    last: &mut HashMap<(usize, String), u64>,
    reports: &[Option<Vec<(String, u64)>>],
) -> HashMap<String, u64> {
    let mut gained: HashMap<String, u64> = HashMap::new();
    for (switch, report) in reports.iter().enumerate() {
        if let Some(listed) = report {
            last.retain(|(s, addr), _| *s != switch || listed.iter().any(|(a, _)| a == addr));
        }
        for (addr, failures) in report.iter().flatten() {
            let before = last.insert((switch, addr.clone()), *failures);
            if let Some(before) = before.filter(|b| b <= failures) {
                *gained.entry(addr.clone()).or_default() += failures - before;
            }
        }
    }
    gained
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_goes_down_after_its_failures_and_up_after_its_answers() {
        let fail = || Err("refused".to_string());
        // The first probe says where it stands at once.
        let mut dead = Health::default();
        assert!(dead.record(fail(), 3, 2));
        assert!(!dead.up() && dead.known());
        let mut h = Health::default();
        assert!(!h.record(Ok(()), 3, 2));
        assert!(h.up() && h.known());
        assert!(!h.record(fail(), 3, 2));
        assert!(!h.record(fail(), 3, 2));
        assert!(!h.record(Ok(()), 3, 2), "an answer starts the count again");
        assert!(!h.record(fail(), 3, 2));
        assert!(!h.record(fail(), 3, 2));
        assert!(h.record(fail(), 3, 2));
        assert!(!h.up());
        assert!(!h.record(fail(), 3, 2), "down once");
        assert!(!h.record(Ok(()), 3, 2));
        assert!(h.record(Ok(()), 3, 2));
        assert!(h.up());
        assert_eq!((h.probes, h.failures, h.downs), (10, 6, 1));
    }

    #[test]
    fn failed_requests_the_switches_report_mark_a_server_down_until_it_answers() {
        let mut h = Health::default();
        assert!(!h.tko(5), "not before its first probe");
        assert!(!h.record(Ok(()), 3, 2));
        assert!(h.tko(5));
        assert!(!h.up() && h.tkos == 1 && h.downs == 1);
        assert!(!h.tko(5), "down once");
        assert!(!h.record(Ok(()), 3, 2));
        assert!(h.record(Ok(()), 3, 2), "up after its answers");

        // Counts are per switch and address; the first report only sets where they start, and
        // a count that fell (a restarted switch) starts again.
        let mut last = HashMap::new();
        let report = |n: u64, m: u64| Some(vec![("a:1".to_string(), n), ("b:1".to_string(), m)]);
        assert!(new_failures(&mut last, &[report(7, 1), report(2, 0)])
            .values()
            .all(|&n| n == 0));
        let gained = new_failures(&mut last, &[report(9, 1), report(3, 0)]);
        assert_eq!(gained.get("a:1"), Some(&3));
        assert_eq!(gained.get("b:1"), Some(&0));
        let gained = new_failures(&mut last, &[report(1, 1), None]);
        assert_eq!(
            gained.get("a:1"),
            None,
            "a restarted switch's counts start again"
        );
        let gained = new_failures(&mut last, &[report(2, 1), report(3, 0)]);
        assert_eq!(gained.get("a:1"), Some(&1));
        // Out of a switch's pool, then back with failures counted meanwhile: they do not
        // count.
        let without = Some(vec![("b:1".to_string(), 0)]);
        new_failures(&mut last, &[without, report(3, 0)]);
        let gained = new_failures(&mut last, &[report(9, 0), report(3, 0)]);
        assert_eq!(gained.get("a:1").copied().unwrap_or(0), 0);
    }

    #[test]
    fn a_probe_of_nothing_says_why() {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap();
        // Nothing listens there any more.
        let e = probe(port, Duration::from_millis(200)).unwrap_err();
        assert!(!e.is_empty());
        // Something that is not memcached.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            if let Ok((mut c, _)) = l.accept() {
                let _ = std::io::Write::write_all(&mut c, b"HELLO\r\n");
            }
        });
        let e = probe(addr, Duration::from_millis(500)).unwrap_err();
        assert!(e.contains("HELLO"), "{e}");
        let _ = t.join();
    }

    #[test]
    fn a_redis_probe_wants_pong_and_says_what_came_instead() {
        let serve = |replies: Vec<&'static [u8]>| {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let t = std::thread::spawn(move || {
                for reply in replies {
                    if let Ok((mut c, _)) = l.accept() {
                        let mut buf = [0u8; 64];
                        let _ = std::io::Read::read(&mut c, &mut buf);
                        let _ = std::io::Write::write_all(&mut c, reply);
                    }
                }
            });
            (addr, t)
        };
        let plain = RedisSpec::default();
        let second = Duration::from_secs(2);
        let (addr, t) = serve(vec![b"+PONG\r\n", b"-NOAUTH Authentication required.\r\n"]);
        assert_eq!(probe_redis(addr, second, &plain, false), Ok(()));
        let e = probe_redis(addr, second, &plain, false).unwrap_err();
        assert!(e.contains("NOAUTH"), "{e}");
        let _ = t.join();
        // The pool's password first; its database emptied, not the others.
        let guarded = RedisSpec {
            auth: Some("s3cret".into()),
            db: 2,
            cluster: false,
        };
        let (addr, t) = serve(vec![b"+OK\r\n+PONG\r\n", b"+OK\r\n+OK\r\n+OK\r\n+PONG\r\n"]);
        assert_eq!(probe_redis(addr, second, &guarded, false), Ok(()));
        assert_eq!(probe_redis(addr, second, &guarded, true), Ok(()));
        let _ = t.join();
        // A memcached answers `version`, not `PING`: the probe must not take it for a server.
        let (addr, t) = serve(vec![b"ERROR\r\n"]);
        let e = probe_server(addr, second, Some(&plain), None, false).unwrap_err();
        assert!(e.contains("ERROR"), "{e}");
        let _ = t.join();
    }

    #[test]
    fn a_udp_probe_reads_the_frame_header() {
        let server = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            for reply in [&b"VERSION 1.6\r\n"[..], b"ERROR\r\n"] {
                if let Ok((n, from)) = server.recv_from(&mut buf) {
                    assert!(buf[8..n].starts_with(b"version"));
                    let mut out = buf[..8].to_vec();
                    out.extend_from_slice(reply);
                    let _ = server.send_to(&out, from);
                }
            }
        });
        assert_eq!(probe_udp(addr, Duration::from_secs(2)), Ok(()));
        let e = probe_udp(addr, Duration::from_secs(2)).unwrap_err();
        assert!(e.contains("ERROR"), "{e}");
        let _ = t.join();
        let e = probe_udp(addr, Duration::from_millis(50)).unwrap_err();
        assert!(e.contains("udp"), "{e}");
    }
}
