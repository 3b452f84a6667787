//! End to end against a real memcached on loopback: preload, then load over UDP and TCP, in the
//! text and binary protocols, as a closed and as an open loop.

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use loadgen::{preload, LoadArgs, Proto, Protocol, Report};

/// A memcached child process, killed by PID when dropped.
struct Memcached {
    child: Child,
    addr: SocketAddr,
}

impl Memcached {
    fn start() -> Memcached {
        // One port that is free for both TCP and UDP.
        let port = loop {
            let tcp = TcpListener::bind("127.0.0.1:0").expect("bind a TCP port");
            let port = tcp.local_addr().expect("local addr").port();
            if UdpSocket::bind(("127.0.0.1", port)).is_ok() {
                break port;
            }
        };
        let p = port.to_string();
        // memcached refuses to run as root unless told which user to be; `-u` is ignored for
        // other users.
        let child = Command::new("memcached")
            .args([
                "-U",
                &p,
                "-p",
                &p,
                "-l",
                "127.0.0.1",
                "-t",
                "1",
                "-u",
                "root",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start memcached (is it installed and on PATH?): {e}")
            });
        let mut mc = Memcached {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        // memcached binds TCP before UDP: the runs start once both answer.
        while TcpStream::connect(mc.addr).is_err()
            || testbed::memcached_udp_version(mc.addr).is_err()
        {
            if let Ok(Some(status)) = mc.child.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = mc.child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                panic!("memcached exited with {status}: {err}");
            }
            assert!(
                Instant::now() < deadline,
                "memcached did not start listening on {}",
                mc.addr
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        mc
    }
}

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn load(mc: &Memcached, proto: Proto, json: &std::path::Path) -> Report {
    let args = LoadArgs {
        proto,
        keys: 1000,
        duration: 1.0,
        quiet: true,
        json: Some(json.to_path_buf()),
        ..LoadArgs::new(mc.addr.to_string())
    };
    let report = loadgen::run(&args).expect("load run");
    let mut human = Vec::new();
    report.print_human(&mut human);
    println!("{}", String::from_utf8_lossy(&human));
    report
}

fn check(report: &Report, json: &std::path::Path) {
    assert!(report.requests > 0, "{report:?}");
    assert_eq!(report.errors, 0, "{report:?}");
    assert!(report.gets > 0, "{report:?}");
    assert_eq!(
        report.hits, report.gets,
        "every key was preloaded: {report:?}"
    );
    assert!(report.latency_us.p50 > 0, "{report:?}");
    assert!(report.throughput_rps > 0.0);
    let text = std::fs::read_to_string(json).expect("report file");
    let back: Report = serde_json::from_str(&text).expect("report parses");
    assert_eq!(&back, report);
}

fn scratch(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "kvswitch-loadgen-{}-{name}.json",
        std::process::id()
    ))
}

#[test]
fn udp_preload_and_load() {
    let mc = Memcached::start();
    let stored = preload(mc.addr, Proto::Udp, 1000, "key:", 32).expect("preload over UDP");
    assert_eq!(stored, 1000);
    let json = scratch("udp");
    let report = load(&mc, Proto::Udp, &json);
    check(&report, &json);
    let _ = std::fs::remove_file(json);
}

#[test]
fn tcp_preload_and_load() {
    let mc = Memcached::start();
    let stored = preload(mc.addr, Proto::Tcp, 1000, "key:", 32).expect("preload over TCP");
    assert_eq!(stored, 1000);
    let json = scratch("tcp");
    let report = load(&mc, Proto::Tcp, &json);
    check(&report, &json);
    let _ = std::fs::remove_file(json);
}

#[test]
fn request_cap_and_large_values() {
    // Values that need several reply datagrams exercise UDP reassembly against the server.
    let mc = Memcached::start();
    assert_eq!(
        preload(mc.addr, Proto::Tcp, 50, "big:", 20_000).expect("preload"),
        50
    );
    for proto in [Proto::Udp, Proto::Tcp] {
        let args = LoadArgs {
            proto,
            keys: 50,
            key_prefix: "big:".into(),
            value_size: 20_000,
            dist: "zipf:0.99".parse().expect("dist"),
            requests: Some(300),
            duration: 10.0,
            quiet: true,
            ..LoadArgs::new(mc.addr.to_string())
        };
        let r = loadgen::run(&args).expect("load run");
        assert_eq!(r.requests, 300, "{r:?}");
        assert_eq!(r.errors + r.timeouts, 0, "{r:?}");
        assert_eq!(r.hits, r.gets, "{r:?}");
        assert!(r.duration_s < 10.0);
    }
}

#[test]
fn open_loop_achieves_the_target_rate() {
    let mc = Memcached::start();
    assert_eq!(
        preload(mc.addr, Proto::Tcp, 1000, "key:", 32).expect("preload"),
        1000
    );
    for proto in [Proto::Udp, Proto::Tcp] {
        let args = LoadArgs {
            proto,
            keys: 1000,
            rate: Some(2000.0),
            duration: 2.0,
            quiet: true,
            ..LoadArgs::new(mc.addr.to_string())
        };
        let r = loadgen::run(&args).expect("load run");
        let mut human = Vec::new();
        r.print_human(&mut human);
        println!("{}", String::from_utf8_lossy(&human));
        assert_eq!(r.offered_rps, Some(2000.0));
        let err = (r.achieved_rps / 2000.0 - 1.0).abs();
        assert!(err <= 0.05, "{proto}: achieved {} req/s", r.achieved_rps);
        // Loopback memcached keeps up, so completions track the offered load too.
        assert!((r.throughput_rps / 2000.0 - 1.0).abs() <= 0.05, "{r:?}");
        assert_eq!(r.errors + r.timeouts, 0, "{r:?}");
        assert_eq!(r.hits, r.gets, "{r:?}");
        // 2 s in 100 ms intervals; together they hold every request.
        assert_eq!(r.series.len(), 20, "{:?}", r.series);
        assert_eq!(r.series.iter().map(|s| s.requests).sum::<u64>(), r.requests);
        assert!(r.series.iter().all(|s| s.requests > 0 && s.p50_us > 0));
    }
}

#[test]
fn binary_protocol_preloaded_load() {
    let mc = Memcached::start();
    for proto in [Proto::Udp, Proto::Tcp] {
        let json = scratch(&format!("binary-{proto}"));
        let args = LoadArgs {
            proto,
            protocol: Protocol::Binary,
            keys: 1000,
            key_prefix: format!("bin-{proto}:"),
            preload: true,
            duration: 1.0,
            quiet: true,
            json: Some(json.clone()),
            ..LoadArgs::new(mc.addr.to_string())
        };
        let r = loadgen::run(&args).expect("load run");
        check(&r, &json);
        assert!(r.sets > 0, "{r:?}");
        assert_eq!(r.timeouts, 0, "{r:?}");
        let _ = std::fs::remove_file(json);
    }
    // Large values: binary replies spread over several UDP datagrams.
    let args = LoadArgs {
        protocol: Protocol::Binary,
        keys: 20,
        key_prefix: "binbig:".into(),
        value_size: 20_000,
        preload: true,
        requests: Some(200),
        duration: 10.0,
        quiet: true,
        ..LoadArgs::new(mc.addr.to_string())
    };
    let r = loadgen::run(&args).expect("load run");
    assert_eq!(r.requests, 200, "{r:?}");
    assert_eq!((r.errors, r.timeouts), (0, 0), "{r:?}");
    assert_eq!(r.hits, r.gets, "{r:?}");
}

#[test]
fn open_loop_with_popularity_changes_and_binary() {
    let mc = Memcached::start();
    let args = LoadArgs {
        proto: Proto::Udp,
        protocol: Protocol::Binary,
        keys: 1000,
        dist: "zipf:0.99".parse().expect("dist"),
        change: Some(loadgen::ChangeKind::HotIn),
        change_keys: 10,
        change_every: 0.2,
        preload: true,
        rate: Some(1000.0),
        duration: 1.0,
        interval_ms: 250,
        quiet: true,
        ..LoadArgs::new(mc.addr.to_string())
    };
    let r = loadgen::run(&args).expect("load run");
    assert_eq!((r.errors, r.timeouts), (0, 0), "{r:?}");
    assert_eq!(r.hits, r.gets, "{r:?}");
    assert_eq!(r.series.len(), 4, "{:?}", r.series);
}
