//! Servers that die, come back, or never answer. With `auto_eject_hosts` a dead server's keys
//! move to the next server on the ring and return once it is back after the retry timeout;
//! without it they fail at once with `SERVER_ERROR`. A server that accepts and never answers
//! costs a request `timeout_ms`, then `SERVER_ERROR`. No request ever waits much past
//! `timeout_ms`, and keys on healthy servers are never disturbed.
//!
//! The `harness_*` tests run the same scenarios with nutcracker in front.

mod common;

use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::proxy::{
    keys_on, ring, set_request, show, text_replies, values_reply, Cluster, Conn, Front, Memcached,
    PoolOpts, Proxy, NAMES,
};

/// Slack over `timeout_ms` for scheduling on a loaded two-core machine.
const SLACK: Duration = Duration::from_millis(400);

/// One request and its single reply, timed. The reply is empty if the proxy closed the
/// connection or sent nothing within `limit`.
fn timed(conn: &mut Conn, request: &[u8], limit: Duration) -> (Vec<u8>, Duration) {
    let start = Instant::now();
    if !conn.send(request) {
        return (Vec::new(), start.elapsed());
    }
    let seen = conn.read_until(|r| text_replies(r) >= 1, limit);
    (seen.bytes, start.elapsed())
}

fn is_server_error(reply: &[u8]) -> bool {
    reply.starts_with(b"SERVER_ERROR") && reply.ends_with(b"\r\n")
}

/// A set and a get of `key` on one connection: `Ok` when the value reads back, the first
/// reply that is not what a healthy server says otherwise. Each of the two is timed.
fn set_get(
    conn: &mut Conn,
    key: &str,
    value: &str,
    limit: Duration,
) -> (Result<(), Vec<u8>>, Duration) {
    let (stored, t1) = timed(conn, &set_request(key, value.as_bytes()), limit);
    if stored != b"STORED\r\n" {
        return (Err(stored), t1);
    }
    let (got, t2) = timed(conn, format!("get {key}\r\n").as_bytes(), limit);
    let want = values_reply(&[(key, value.as_bytes())]);
    (if got == want { Ok(()) } else { Err(got) }, t1.max(t2))
}

/// Which server (if any) holds `key`, asked directly.
fn holder(servers: &[Memcached], key: &str) -> Vec<usize> {
    servers
        .iter()
        .enumerate()
        .filter(|(_, s)| s.pid().is_some())
        .filter(|(_, s)| {
            let reply = Conn::open(s.addr()).call(format!("get {key}\r\n").as_bytes(), |r| {
                r.ends_with(b"END\r\n")
            });
            reply != b"END\r\n"
        })
        .map(|(i, _)| i)
        .collect()
}

/// The value `server` holds under `key`, asked directly.
fn value_on(server: &Memcached, key: &str) -> Option<Vec<u8>> {
    let reply = Conn::open(server.addr()).call(format!("get {key}\r\n").as_bytes(), |r| {
        r.ends_with(b"END\r\n")
    });
    let start = reply.windows(2).position(|w| w == b"\r\n")? + 2;
    reply
        .get(start..reply.len().checked_sub(7)?)
        .map(<[u8]>::to_vec)
}

/// With ejection: the dead server's keys fail fast at most `server_failure_limit` times, then
/// move to another server; after the retry timeout, restarted, the server gets its keys again.
fn eject_and_return(front: Front) {
    let opts = PoolOpts {
        timeout_ms: 500,
        auto_eject_hosts: true,
        server_failure_limit: 1,
        server_retry_timeout_ms: 2000,
        ..PoolOpts::default()
    };
    // nutcracker, run only to check this test itself, may spend a whole timeout reconnecting
    // to the returning server: give it room on a loaded machine.
    let slack = if front == Front::Nutcracker {
        SLACK * 3
    } else {
        SLACK
    };
    let limit = Duration::from_millis(opts.timeout_ms) + slack;
    let mut cluster = Cluster::start(front, &opts);
    let ring = ring();
    let dead = 1;
    let doomed = keys_on(&ring, dead, "doomed:", 20);
    let healthy: Vec<String> = [0, 2]
        .iter()
        .flat_map(|&s| keys_on(&ring, s, "healthy:", 10))
        .collect();
    let mut conn = Conn::open(cluster.addr());
    for k in doomed.iter().chain(&healthy) {
        assert_eq!(
            set_get(&mut conn, k, "before", limit).0,
            Ok(()),
            "{front:?}: {k}"
        );
    }

    cluster.servers[dead].kill();
    // Fail fast, then move: every request answers within the limit; the doomed keys fail at
    // most a few times before they are served by another server.
    let mut failures = 0;
    for (round, k) in doomed.iter().enumerate() {
        let (result, took) = set_get(&mut conn, k, "moved", limit);
        assert!(took < limit, "{front:?}: {k} took {took:?}");
        match result {
            Ok(()) => {}
            Err(reply) => {
                assert!(is_server_error(&reply), "{front:?}: {k}: {}", show(&reply));
                failures += 1;
                assert!(
                    round < 5,
                    "{front:?}: {k} still fails after {round} requests"
                );
            }
        }
        let h = &healthy[round % healthy.len()];
        let (result, took) = set_get(&mut conn, h, &format!("r{round}"), limit);
        assert_eq!(result, Ok(()), "{front:?}: healthy {h} disturbed");
        assert!(took < limit, "{front:?}: healthy {h} took {took:?}");
    }
    assert!(
        failures <= opts.server_failure_limit as usize + 1,
        "{front:?}: {failures} failures"
    );
    // The moved keys now live on the servers still up.
    let last = doomed.last().expect("keys");
    let on = holder(&cluster.servers, last);
    assert!(
        on.len() == 1 && on[0] != dead,
        "{front:?}: {last} on {on:?}"
    );

    // Back on the same port; after the retry timeout the proxy places the keys on it again.
    cluster.servers[dead].restart();
    let deadline = Instant::now()
        + Duration::from_millis(opts.server_retry_timeout_ms)
        + Duration::from_secs(5);
    let mut back = false;
    let mut i = 0;
    while !back && Instant::now() < deadline {
        let k = &doomed[i % doomed.len()];
        let (result, took) = set_get(&mut conn, k, "back", limit);
        assert!(
            took < limit,
            "{front:?}: {k} took {took:?} while the server returned"
        );
        match result {
            Ok(()) => back = value_on(&cluster.servers[dead], k).as_deref() == Some(b"back"),
            // The round whose set and get straddle the server's return: the set went to the
            // key's stand-in, the get to the server, back and empty (so with nutcracker too).
            Err(reply) if reply == b"END\r\n" => {}
            Err(reply) => assert!(is_server_error(&reply), "{front:?}: {}", show(&reply)),
        }
        i += 1;
        thread::sleep(Duration::from_millis(50));
    }
    assert!(back, "{front:?}: {} never used again", NAMES[dead]);
    for k in &doomed {
        let (result, _) = set_get(&mut conn, k, "home", limit);
        assert_eq!(result, Ok(()), "{front:?}: {k}");
        let home = value_on(&cluster.servers[dead], k);
        assert_eq!(
            home.as_deref(),
            Some(&b"home"[..]),
            "{front:?}: {k} not home"
        );
    }
}

#[test]
fn an_ejected_server_gives_its_keys_away_and_takes_them_back() {
    eject_and_return(Front::Kvswitch);
}

#[test]
fn harness_ejection_on_nutcracker() {
    eject_and_return(Front::Nutcracker);
}

/// Without ejection: the dead server's keys get `SERVER_ERROR` at once, every time; the rest
/// are served; once the server is back, its keys work again.
fn no_eject(front: Front) {
    let opts = PoolOpts {
        timeout_ms: 1000,
        ..PoolOpts::default()
    };
    let fast = Duration::from_millis(250);
    let mut cluster = Cluster::start(front, &opts);
    let ring = ring();
    let dead = 2;
    let doomed = keys_on(&ring, dead, "down:", 10);
    let healthy: Vec<String> = [0, 1]
        .iter()
        .flat_map(|&s| keys_on(&ring, s, "up:", 10))
        .collect();
    let mut conn = Conn::open(cluster.addr());
    for k in doomed.iter().chain(&healthy) {
        assert_eq!(
            set_get(&mut conn, k, "v", fast + SLACK).0,
            Ok(()),
            "{front:?}: {k}"
        );
    }
    cluster.servers[dead].kill();
    for round in 0..3 {
        for (k, h) in doomed.iter().zip(&healthy) {
            let (reply, took) = timed(&mut conn, format!("get {k}\r\n").as_bytes(), fast + SLACK);
            assert!(is_server_error(&reply), "{front:?}: {k}: {}", show(&reply));
            assert!(took < fast, "{front:?}: {k} took {took:?}");
            let (reply, took) = timed(&mut conn, &set_request(k, b"x"), fast + SLACK);
            assert!(
                is_server_error(&reply),
                "{front:?}: set {k}: {}",
                show(&reply)
            );
            assert!(took < fast, "{front:?}: set {k} took {took:?}");
            let (result, took) = set_get(&mut conn, h, &format!("{round}"), fast + SLACK);
            assert_eq!(result, Ok(()), "{front:?}: healthy {h}");
            assert!(took < fast, "{front:?}: healthy {h} took {took:?}");
        }
    }
    // A multi-get that touches the dead server is answered, in time, and the connection
    // stays usable (kvswitch keeps it; nutcracker does not).
    let (reply, took) = timed(
        &mut conn,
        format!("get {} {} {}\r\n", healthy[0], doomed[0], healthy[1]).as_bytes(),
        fast + SLACK,
    );
    assert!(
        !reply.is_empty() && took < fast,
        "{front:?}: {} after {took:?}",
        show(&reply)
    );
    assert!(
        is_server_error(&reply) || reply.ends_with(b"END\r\n"),
        "{front:?}: {}",
        show(&reply)
    );
    if front == Front::Nutcracker {
        // nutcracker closes a client's connection once a multi-get failed on one server.
        conn = Conn::open(cluster.addr());
    }
    assert_eq!(
        set_get(&mut conn, &healthy[2], "after", fast + SLACK).0,
        Ok(())
    );

    cluster.servers[dead].restart();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut back = false;
    while !back && Instant::now() < deadline {
        back = set_get(&mut conn, &doomed[0], "again", fast + SLACK)
            .0
            .is_ok();
        thread::sleep(Duration::from_millis(50));
    }
    assert!(back, "{front:?}: the restarted server is not used again");
    assert_eq!(holder(&cluster.servers, &doomed[0]), [dead]);
}

#[test]
fn without_ejection_a_dead_servers_keys_fail_at_once() {
    no_eject(Front::Kvswitch);
}

#[test]
fn harness_no_ejection_on_nutcracker() {
    no_eject(Front::Nutcracker);
}

/// Clients keep working while a server is killed under them: no request waits past the
/// timeout, healthy keys are always right, the dead server's keys fail only with
/// `SERVER_ERROR` (or, with ejection, read as a miss from the server that took them over).
fn kill_mid_run(front: Front, eject: bool) {
    let opts = PoolOpts {
        timeout_ms: 500,
        auto_eject_hosts: eject,
        server_failure_limit: 1,
        server_retry_timeout_ms: 60_000,
        ..PoolOpts::default()
    };
    // nutcracker, run only to check this test itself, may spend a whole timeout reconnecting
    // to the returning server: give it room on a loaded machine.
    let slack = if front == Front::Nutcracker {
        SLACK * 3
    } else {
        SLACK
    };
    let limit = Duration::from_millis(opts.timeout_ms) + slack;
    let mut cluster = Cluster::start(front, &opts);
    let ring = ring();
    let dead = 0;
    let addr = cluster.addr();
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let stop = stop.clone();
            let keys: Vec<(String, bool)> = (0..3)
                .flat_map(|s| {
                    keys_on(&ring, s, &format!("run{w}:"), 5)
                        .into_iter()
                        .map(move |k| (k, s == dead))
                })
                .collect();
            thread::spawn(move || -> Result<(usize, usize), String> {
                let mut conn = Conn::open(addr);
                let (mut ok, mut errors) = (0, 0);
                let deadline = Instant::now() + Duration::from_secs(20);
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                    let (k, doomed) = &keys[i % keys.len()];
                    let (result, took) = set_get(&mut conn, k, &format!("{w}.{i}"), limit);
                    if took >= limit {
                        return Err(format!("{k} took {took:?}"));
                    }
                    match result {
                        Ok(()) => ok += 1,
                        Err(reply) if *doomed && is_server_error(&reply) => errors += 1,
                        // Stored on the server just before it died, read from the next one.
                        Err(reply) if *doomed && eject && reply == b"END\r\n" => errors += 1,
                        Err(reply) => {
                            return Err(format!("{k} (doomed {doomed}): {}", show(&reply)))
                        }
                    }
                    i += 1;
                }
                Ok((ok, errors))
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(700));
    cluster.servers[dead].kill();
    thread::sleep(Duration::from_millis(2000));
    stop.store(true, Ordering::Relaxed);
    let mut total_errors = 0;
    for w in workers {
        let (ok, errors) = w
            .join()
            .expect("worker thread")
            .unwrap_or_else(|e| panic!("{front:?} eject={eject}: {e}"));
        assert!(ok > 20, "{front:?}: only {ok} requests served");
        total_errors += errors;
    }
    if !eject {
        assert!(
            total_errors > 0,
            "{front:?}: the dead server's keys never failed"
        );
    }
}

#[test]
fn killing_a_server_mid_run_bounds_every_request() {
    kill_mid_run(Front::Kvswitch, true);
    kill_mid_run(Front::Kvswitch, false);
}

#[test]
fn harness_kill_mid_run_on_nutcracker() {
    kill_mid_run(Front::Nutcracker, true);
    kill_mid_run(Front::Nutcracker, false);
}

/// A server that accepts connections and reads requests but never answers; stops (and its
/// thread ends) when dropped.
struct Silent {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Silent {
    fn start() -> Silent {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = thread::spawn(move || {
            let mut conns = Vec::new();
            let mut buf = [0u8; 4096];
            // Bounded: the test drops this long before a minute passes.
            let deadline = Instant::now() + Duration::from_secs(60);
            while !flag.load(Ordering::Relaxed) && Instant::now() < deadline {
                if let Ok((s, _)) = listener.accept() {
                    let _ = s.set_nonblocking(true);
                    conns.push(s);
                }
                for c in &mut conns {
                    while matches!(c.read(&mut buf), Ok(n) if n > 0) {}
                }
                thread::sleep(Duration::from_millis(5));
            }
        });
        Silent {
            addr,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Silent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Requests to a server that never answers fail with `SERVER_ERROR` after `timeout_ms`, one by
/// one and pipelined; the other servers' keys are served meanwhile.
fn silent_server(front: Front) {
    let opts = PoolOpts {
        timeout_ms: 300,
        ..PoolOpts::default()
    };
    let timeout = Duration::from_millis(opts.timeout_ms);
    let servers = [Memcached::start(), Memcached::start()];
    let silent = Silent::start();
    let pool = [
        (NAMES[0], servers[0].addr()),
        (NAMES[1], silent.addr),
        (NAMES[2], servers[1].addr()),
    ];
    let proxy = Proxy::start(front, &pool, &opts);
    let ring = ring();
    let stuck = keys_on(&ring, 1, "stuck:", 5);
    let fine: Vec<String> = [0, 2]
        .iter()
        .flat_map(|&s| keys_on(&ring, s, "fine:", 3))
        .collect();

    // Healthy keys are served while a request to the silent server is outstanding.
    let addr = proxy.addr;
    let other = thread::spawn(move || {
        let mut conn = Conn::open(addr);
        for (i, k) in fine.iter().enumerate() {
            let (result, took) = set_get(&mut conn, k, &i.to_string(), Duration::from_secs(2));
            assert_eq!(result, Ok(()), "{front:?}: {k}");
            assert!(
                took < Duration::from_millis(200),
                "{front:?}: {k} took {took:?}"
            );
        }
    });
    // The first request waits out the timeout; later ones fail no later, at once if the
    // proxy keeps the server marked down for a while (nutcracker waits every time).
    let mut conn = Conn::open(proxy.addr);
    for (i, k) in stuck[..3].iter().enumerate() {
        let (reply, took) = timed(&mut conn, format!("get {k}\r\n").as_bytes(), timeout * 4);
        assert!(is_server_error(&reply), "{front:?}: {k}: {}", show(&reply));
        let least = if i == 0 {
            timeout.mul_f32(0.9)
        } else {
            Duration::ZERO
        };
        assert!(
            took >= least && took < timeout + SLACK,
            "{front:?}: request {i} ({k}) failed after {took:?}: {}",
            show(&reply)
        );
    }
    other.join().expect("healthy keys served");

    // Pipelined: every request gets its own SERVER_ERROR, all within about one timeout.
    let start = Instant::now();
    let request: String = stuck.iter().map(|k| format!("get {k}\r\n")).collect();
    assert!(conn.send(request.as_bytes()));
    let seen = conn.read_until(|r| text_replies(r) >= stuck.len(), timeout * 2 + SLACK * 2);
    let took = start.elapsed();
    let lines: Vec<&[u8]> = seen.bytes.split_inclusive(|&b| b == b'\n').collect();
    assert_eq!(lines.len(), stuck.len(), "{front:?}: {}", show(&seen.bytes));
    assert!(
        lines.iter().all(|l| is_server_error(l)),
        "{front:?}: {}",
        show(&seen.bytes)
    );
    assert!(
        took < timeout * 2 + SLACK,
        "{front:?}: pipelined failures took {took:?}"
    );
    // The connection is still served.
    let k = keys_on(&ring, 0, "after:", 1).remove(0);
    assert_eq!(
        set_get(&mut conn, &k, "ok", Duration::from_secs(2)).0,
        Ok(())
    );
}

#[test]
fn a_server_that_never_answers_fails_requests_after_the_timeout() {
    silent_server(Front::Kvswitch);
}

#[test]
fn harness_silent_server_on_nutcracker() {
    silent_server(Front::Nutcracker);
}
