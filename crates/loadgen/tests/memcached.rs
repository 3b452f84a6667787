//! End to end against a real memcached on loopback: preload, then a second of load over UDP
//! and over TCP.

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use loadgen::{preload, LoadArgs, Proto, Report};

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
        while TcpStream::connect(mc.addr).is_err() {
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
