//! `kvswitch load --rate-control` against a real `kvswitch node` of a fixed capacity on
//! loopback: SwitchKV's clients' rate control finds the rate the node answers, with little
//! loss, where a fixed rate past it loses most of what it sends.

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use loadgen::{LoadArgs, Proto, Report};

const CAPACITY: f64 = 2000.0;

/// A `kvswitch node` child process serving UDP at most [`CAPACITY`] requests a second,
/// killed by PID when dropped.
struct Node {
    child: Child,
    addr: SocketAddr,
}

impl Node {
    fn start() -> Node {
        let port = loop {
            let tcp = TcpListener::bind("127.0.0.1:0").expect("bind a TCP port");
            let port = tcp.local_addr().expect("local addr").port();
            if UdpSocket::bind(("127.0.0.1", port)).is_ok() {
                break port;
            }
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let child = Command::new(env!("CARGO_BIN_EXE_kvswitch"))
            .args([
                "node",
                "--listen",
                &addr.to_string(),
                "--capacity",
                &(CAPACITY as u64).to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start kvswitch node");
        let node = Node { child, addr };
        let deadline = Instant::now() + Duration::from_secs(10);
        while testbed::memcached_udp_version(addr).is_err() {
            assert!(Instant::now() < deadline, "kvswitch node never answered");
            std::thread::sleep(Duration::from_millis(50));
        }
        node
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn load(node: &Node, rate: f64, rate_control: bool) -> Report {
    let args = LoadArgs {
        proto: Proto::Udp,
        keys: 100,
        get_ratio: 1.0,
        concurrency: 4,
        rate: Some(rate),
        rate_control,
        // One worker: its periods of 100 requests last 50 ms at the capacity, so from half of
        // it the rate needs 35 periods, about 2.5 s, to get there.
        threads: Some(1),
        warmup: 4.0,
        duration: 2.0,
        timeout_ms: 100,
        quiet: true,
        ..LoadArgs::new(node.addr.to_string())
    };
    loadgen::run(&args).expect("kvswitch load")
}

/// Replies a second.
fn answered(r: &Report) -> f64 {
    (r.requests - r.timeouts - r.errors) as f64 / r.duration_s
}

fn lost(r: &Report) -> f64 {
    (r.timeouts + r.errors) as f64 / r.requests.max(1) as f64
}

#[test]
fn rate_control_settles_at_what_the_node_answers() {
    let node = Node::start();
    let fixed = load(&node, 3.0 * CAPACITY, false);
    let controlled = load(&node, CAPACITY / 2.0, true);
    // The node answers its capacity either way (its bucket holds a hundredth of a second
    // more); a fixed rate of three times it loses about two thirds.
    assert!(lost(&fixed) > 0.4, "fixed rate: {fixed:?}");
    assert!(
        answered(&fixed) < CAPACITY * 1.2,
        "the node answered past its capacity: {fixed:?}"
    );
    // Rate control climbs from half the capacity to about it, and holds there with SwitchKV's
    // small loss (0.5 to 1% a period, a few percent over a run as it probes).
    assert!(
        answered(&controlled) > CAPACITY * 0.7,
        "rate control stayed low: {} answered a second",
        answered(&controlled)
    );
    assert!(
        controlled.achieved_rps < CAPACITY * 1.3,
        "rate control overshot: {} sent a second",
        controlled.achieved_rps
    );
    assert!(
        lost(&controlled) < 0.05,
        "rate control lost: {controlled:?}"
    );
}

#[test]
fn rate_control_needs_a_rate_to_start_from() {
    let args = LoadArgs {
        rate_control: true,
        ..LoadArgs::new("127.0.0.1:1")
    };
    let e = loadgen::run(&args).expect_err("refused");
    assert!(
        format!("{e:#}").contains("--rate-control needs --rate"),
        "{e:#}"
    );
}
