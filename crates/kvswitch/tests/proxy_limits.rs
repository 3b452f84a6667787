//! What the proxy holds for clients is bounded: the replies of clients that never read (each
//! client's own limit and a budget over all of them), and the client connections (a cap, and
//! connections that arrive with no descriptor left refused at once rather than left in the
//! listen backlog). Real memcached behind `kvswitch proxy`; every process killed by its PID.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::proxy::{set_request, show, values_reply, Cluster, Conn, Front, PoolOpts, Proxy};

/// The sum of a Prometheus family's samples on the proxy's API, with `label` in them if given.
fn metric(api: SocketAddr, family: &str, label: &str) -> u64 {
    let (status, body) = testbed::http_get(api, "/metrics").expect("/metrics");
    assert_eq!(status, 200);
    body.lines()
        .filter(|l| l.starts_with(family) && l[family.len()..].starts_with(['{', ' ']))
        .filter(|l| l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn api_opts(proxy_keys: &str) -> PoolOpts {
    PoolOpts {
        api: true,
        proxy_keys: proxy_keys.to_string(),
        ..PoolOpts::default()
    }
}

/// One set and get of `key` on `conn`, checked byte for byte.
fn set_and_get(conn: &mut Conn, key: &str, value: &str) -> Duration {
    let t = Instant::now();
    let mut request = set_request(key, value.as_bytes());
    request.extend_from_slice(format!("get {key}\r\n").as_bytes());
    assert!(conn.send(&request), "the honest client's connection closed");
    let reply = conn
        .read_until(|r| r.ends_with(b"END\r\n"), common::proxy::REPLY_LIMIT)
        .bytes;
    let want = [
        b"STORED\r\n".to_vec(),
        values_reply(&[(key, value.as_bytes())]),
    ]
    .concat();
    assert!(
        reply == want,
        "the honest client, after {:?}: {}",
        t.elapsed(),
        show(&reply)
    );
    t.elapsed()
}

/// What [`hogs`] saw.
struct Hogged {
    /// Peak RSS growth while the hogs were connected, MiB.
    growth_mib: u64,
    /// Rounds the honest client completed, and the slowest.
    rounds: usize,
    slowest: Duration,
}

/// The attack: `clients` connections with small receive buffers each pipeline 128 `get`s of
/// one 1 MB value and never read; meanwhile an honest client sets and gets its own key every
/// 50 ms. Stops early once RSS has grown by `stop_mib`.
fn hogs(proxy: &Proxy, clients: usize, watch: Duration, stop_mib: u64) -> Hogged {
    let addr = proxy.addr;
    let value = vec![b'm'; 1_000_000];
    let mut setup = Conn::open(addr);
    assert_eq!(
        setup.call(&set_request("mega", &value), |r| r.ends_with(b"\r\n")),
        b"STORED\r\n"
    );
    let mut honest = Conn::open(addr);
    set_and_get(&mut honest, "honest", "0");
    let before = proxy.rss_kib();
    // RSS is read every 5 ms on a thread of its own: a peak lasts a few tens of ms.
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (stop, pid) = (stop.clone(), proxy.pid());
        thread::spawn(move || {
            let mut peak = 0;
            while !stop.load(Ordering::Relaxed) {
                peak = peak.max(rss_kib(pid));
                thread::sleep(Duration::from_millis(5));
            }
            peak
        })
    };
    let request = b"get mega\r\n".repeat(128);
    let hogs: Vec<TcpStream> = (0..clients)
        .map(|_| {
            let socket = TcpStream::connect(addr).expect("connect");
            testbed::local::set_recv_buffer(&socket, 4096);
            (&socket).write_all(&request).expect("send");
            socket
        })
        .collect();
    let mut slowest = Duration::ZERO;
    let mut rounds = 0;
    let until = Instant::now() + watch;
    while Instant::now() < until && proxy.rss_kib().saturating_sub(before) >> 10 < stop_mib {
        slowest = slowest.max(set_and_get(&mut honest, "honest", &rounds.to_string()));
        rounds += 1;
        thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    let peak = sampler.join().expect("sampler").max(before);
    drop(hogs);
    assert!(proxy.alive(), "the proxy died:\n{}", proxy.log_tail());
    Hogged {
        growth_mib: (peak - before) >> 10,
        rounds,
        slowest,
    }
}

/// Resident set size of process `pid` in KiB (0 once it is gone).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The bound on the proxy's growth with eight hogs: the reply budget (256 MiB by default),
/// a reply or two in the making per client and server connection, and the allocator's
/// slack. Measured: about 200 MiB; without the limits on held replies, 700 MiB to 1.6 GiB.
const HOGS_GROWTH_LIMIT_MIB: u64 = 400;

#[test]
fn eight_clients_that_never_read_a_megabyte_value_leave_the_proxy_bounded() {
    let opts = api_opts("");
    let cluster = Cluster::start(Front::Kvswitch, &opts);
    let api = cluster.proxy.api();
    let h = hogs(
        &cluster.proxy,
        8,
        Duration::from_secs(6),
        2 * HOGS_GROWTH_LIMIT_MIB,
    );
    eprintln!(
        "RSS growth {} MiB; honest rounds {}, slowest {:?}; peak held {} bytes",
        h.growth_mib,
        h.rounds,
        h.slowest,
        metric(api, "kvswitch_proxy_reply_bytes_peak", "")
    );
    assert!(
        h.growth_mib < HOGS_GROWTH_LIMIT_MIB,
        "the proxy grew by {} MiB",
        h.growth_mib
    );
    assert!(h.rounds >= 20, "the honest client got {} rounds", h.rounds);
    // Each hog held more than a client may and was cut off, for one reason or the other.
    let cut = metric(api, "kvswitch_proxy_clients_overflowed_total", "");
    assert_eq!(cut, 8, "clients cut off");
    assert!(metric(api, "kvswitch_proxy_reply_bytes_peak", "") <= (256 + 64) << 20);
    // Once they are gone, nothing is held for them.
    let deadline = Instant::now() + Duration::from_secs(5);
    while metric(api, "kvswitch_proxy_reply_bytes", "") > 0 {
        assert!(Instant::now() < deadline, "reply bytes still held");
        thread::sleep(Duration::from_millis(50));
    }
}

/// A client that pipelines the same 128 gets and reads its replies is served whole.
#[test]
fn a_client_that_pipelines_large_gets_and_reads_is_served() {
    let opts = api_opts("");
    let cluster = Cluster::start(Front::Kvswitch, &opts);
    let api = cluster.proxy.api();
    let value = vec![b'r'; 200_000];
    let mut conn = Conn::open(cluster.addr());
    assert_eq!(
        conn.call(&set_request("big", &value), |r| r.ends_with(b"\r\n")),
        b"STORED\r\n"
    );
    let one = values_reply(&[("big", &value)]);
    for _ in 0..3 {
        assert!(conn.send(&b"get big\r\n".repeat(128)));
        let got = conn.read_until(|r| r.len() >= 128 * one.len(), Duration::from_secs(10));
        assert!(!got.closed && !got.timed_out, "{}", show(&got.bytes));
        assert_eq!(got.bytes, one.repeat(128));
    }
    assert_eq!(
        metric(api, "kvswitch_proxy_clients_overflowed_total", ""),
        0
    );
}

/// How many of `conns` the proxy closed (a read sees the end or a reset) within `limit`, and
/// how many are still open.
fn closed_and_open(conns: &mut [TcpStream], want_closed: usize, limit: Duration) -> (usize, usize) {
    let deadline = Instant::now() + limit;
    let mut closed = vec![false; conns.len()];
    loop {
        for (i, c) in conns.iter_mut().enumerate() {
            if closed[i] {
                continue;
            }
            c.set_nonblocking(true).expect("nonblocking");
            let mut byte = [0u8; 1];
            closed[i] = match c.read(&mut byte) {
                Ok(0) => true,
                Ok(_) => panic!("a refused connection was sent bytes"),
                Err(e) if e.kind() == ErrorKind::WouldBlock => false,
                Err(_) => true,
            };
        }
        let n = closed.iter().filter(|c| **c).count();
        if n >= want_closed || Instant::now() > deadline {
            return (n, conns.len() - n);
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// With `[proxy] client_connections = 50`, the 31 connections past it are closed at once,
/// counted, while a client already connected is served; once connections go, new ones are
/// served again.
#[test]
fn connections_past_the_client_cap_are_closed_at_once() {
    let opts = api_opts("client_connections = 50\n");
    let cluster = Cluster::start(Front::Kvswitch, &opts);
    let api = cluster.proxy.api();
    let mut existing = Conn::open(cluster.addr());
    set_and_get(&mut existing, "k", "before");
    // A connection made before (the start's readiness check) holds a place until the proxy
    // has seen it close, which on a loaded machine can come after the connections below.
    let settled = Instant::now();
    while metric(api, "kvswitch_proxy_client_connections", "") != 1 {
        assert!(
            settled.elapsed() < Duration::from_secs(10),
            "the proxy still counts {} client connections",
            metric(api, "kvswitch_proxy_client_connections", "")
        );
        thread::sleep(Duration::from_millis(20));
    }
    let mut more: Vec<TcpStream> = (0..80)
        .map(|_| TcpStream::connect(cluster.addr()).expect("connect"))
        .collect();
    let t = Instant::now();
    let (closed, open) = closed_and_open(&mut more, 31, Duration::from_secs(3));
    assert_eq!((closed, open), (31, 49), "after {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    set_and_get(&mut existing, "k", "during");
    assert_eq!(
        metric(
            api,
            "kvswitch_proxy_clients_refused_total",
            "reason=\"limit\""
        ),
        31
    );
    assert_eq!(metric(api, "kvswitch_proxy_client_connections", ""), 50);
    drop(more);
    let deadline = Instant::now() + Duration::from_secs(5);
    while metric(api, "kvswitch_proxy_client_connections", "") > 1 {
        assert!(
            Instant::now() < deadline,
            "closed connections still counted"
        );
        thread::sleep(Duration::from_millis(20));
    }
    let mut after = Conn::open(cluster.addr());
    set_and_get(&mut after, "k", "after");
    set_and_get(&mut existing, "k", "again");
}

/// At a descriptor limit of 64 (and a cap set far above it), connections past what the
/// process can open are accepted on the spare descriptor and closed at once, not left to wait
/// in the listen backlog; the client already connected is served throughout.
#[test]
fn out_of_descriptors_connections_are_refused_not_left_waiting() {
    let mut opts = api_opts("client_connections = 100000\n");
    opts.nofile = Some(64);
    let cluster = Cluster::start(Front::Kvswitch, &opts);
    let api = cluster.proxy.api();
    let mut existing = Conn::open(cluster.addr());
    set_and_get(&mut existing, "k", "before");
    // A connection the proxy accepted and closed at once may be reset before connect()
    // returns, on a busy machine: refused too.
    let mut reset = 0;
    let mut more: Vec<TcpStream> = (0..150)
        .filter_map(|_| match TcpStream::connect(cluster.addr()) {
            Ok(c) => Some(c),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => {
                reset += 1;
                None
            }
            Err(e) => panic!("connect: {e}"),
        })
        .collect();
    // The process has fewer than 64 descriptors for clients: at least 87 are refused (waiting
    // for 86 only could stop one short of what the check below needs).
    let t = Instant::now();
    let (closed, open) = closed_and_open(
        &mut more,
        87usize.saturating_sub(reset),
        Duration::from_secs(3),
    );
    let closed = closed + reset;
    assert!(
        closed >= 86 && open < 64,
        "closed {closed}, open {open} after {:?}",
        t.elapsed()
    );
    set_and_get(&mut existing, "k", "during");
    drop(more);
    // The API needs a descriptor too: asked once the flood is gone.
    thread::sleep(Duration::from_millis(200));
    let refused = metric(
        api,
        "kvswitch_proxy_clients_refused_total",
        "reason=\"descriptors\"",
    );
    assert!(
        refused as usize >= closed,
        "{refused} counted, {closed} seen"
    );
    let mut after = Conn::open(cluster.addr());
    set_and_get(&mut after, "k", "after");
    assert!(cluster.proxy_is_alive());
}

/// The same low descriptor limit with no cap configured: the cap the proxy derives from the
/// limit refuses connections before the process runs out (reason `limit`).
#[test]
fn the_default_cap_follows_the_descriptor_limit() {
    let mut opts = api_opts("");
    opts.nofile = Some(128);
    let cluster = Cluster::start(Front::Kvswitch, &opts);
    let api = cluster.proxy.api();
    let cap = metric(api, "kvswitch_proxy_client_connections_limit", "");
    assert!((1..128).contains(&cap), "cap {cap}");
    let mut existing = Conn::open(cluster.addr());
    set_and_get(&mut existing, "k", "before");
    let mut more: Vec<TcpStream> = (0..150)
        .map(|_| TcpStream::connect(cluster.addr()).expect("connect"))
        .collect();
    let want = 150 + 1 - cap as usize;
    let (closed, open) = closed_and_open(&mut more, want, Duration::from_secs(3));
    assert_eq!((closed, open), (want, cap as usize - 1));
    set_and_get(&mut existing, "k", "during");
    assert_eq!(
        metric(
            api,
            "kvswitch_proxy_clients_refused_total",
            "reason=\"limit\""
        ) as usize,
        want
    );
    assert_eq!(
        metric(
            api,
            "kvswitch_proxy_clients_refused_total",
            "reason=\"descriptors\""
        ),
        0
    );
}

/// Not a check: the peak RSS growth of a proxy with eight hogs, printed for a comparison of
/// two builds (`KVSWITCH_TEST_PROXY_BIN=/path/to/old/kvswitch` measures another binary).
/// Run with `--ignored --nocapture`.
#[test]
#[ignore]
fn measure_peak_rss_with_eight_hogs() {
    let cluster = Cluster::start(Front::Kvswitch, &PoolOpts::default());
    let h = hogs(&cluster.proxy, 8, Duration::from_secs(8), u64::MAX);
    eprintln!(
        "binary {}: peak RSS growth {} MiB with 8 hogs; honest client: {} rounds, slowest {:?}",
        std::env::var("KVSWITCH_TEST_PROXY_BIN").unwrap_or_else(|_| "under test".into()),
        h.growth_mib,
        h.rounds,
        h.slowest
    );
}
