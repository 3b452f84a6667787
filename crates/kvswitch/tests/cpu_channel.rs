//! The CPU channel against a switch forwarding on in-memory ports: an agent takes the frames
//! entries send to the CPU in order with none lost below the channel's capacity and the rest
//! counted, sends frames out of ports, reads and writes registers; strangers, wrong tokens, a
//! second taker of the frames and bad messages are refused; an agent finds the channel in the
//! switch's status, and falls back to HTTP (or fails, when told to use the channel) without it.

use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ::api::guard::ApiServing;
use ::api::Client;
use daemon::api::{serve, Api, Exporter};
use daemon::cpu::{Channel, ChannelStatus, HELLO_LIMIT, MAX_AGENTS};
use dataplane::{Driver, RunOptions, Side};
use kv::{Distribution, HashFn};
use kvio::seqpacket::SeqConn;
use kvio::{mem_pair, Batch, MemPort, Port};
use nf::cpu::{Cpu, CpuMode};
use serde_json::{json, Value};
use switch::control::{EntryDef, ACL, CPU_QUEUE};
use switch::frame::{udp_frame, UdpEnds};
use switch::pool::Pool;
use switch::stats::{self, Stats};
use switch::{spec, Switch, SwitchSpec};
use wire::ethernet::Mac;

const PORTS: usize = 3;
/// The UDP port whose datagrams the test's entry sends to the CPU.
const TO_CPU_PORT: u16 = 9999;

struct Status {
    cpu: Arc<ChannelStatus>,
    offer: Offer,
}

/// What the switch's status says of its channel.
#[derive(Clone, Copy, PartialEq)]
enum Offer {
    Nothing,
    Channel,
    /// The path, with an instance that is not the channel's.
    WrongInstance,
}

impl Exporter for Status {
    fn metrics(&self, m: &mut api::metrics::Exposition) {
        self.cpu.metrics(m);
    }

    fn status(&self) -> Value {
        let mut channel = self.cpu.json();
        match self.offer {
            Offer::Channel => json!({ "cpu_channel": channel }),
            Offer::WrongInstance => {
                channel["instance"] = json!("00000000000000ff");
                json!({ "cpu_channel": channel })
            }
            Offer::Nothing => json!({}),
        }
    }
}

/// A switch on three in-memory ports with its API and, when `channel`, a CPU channel.
struct Rig {
    client: Client,
    hosts: Vec<MemPort>,
    stats: Arc<Stats>,
    cpu: Arc<ChannelStatus>,
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn rig(name: &str, token: Option<&str>, offer: Offer) -> Rig {
    let channel = offer != Offer::Nothing;
    let servers = vec![spec::Server {
        addr: SocketAddrV4::new(Ipv4Addr::new(10, 0, 1, 1), 11211),
        mac: Some(Mac([2, 0, 0, 0, 1, 1])),
    }];
    let spec = SwitchSpec::new(PORTS, Ipv4Addr::new(10, 0, 0, 100), servers);
    let pool = Arc::new(Pool::new(spec.pool_spec(Distribution::Ketama, HashFn::Md5)).unwrap());
    let stats = Arc::new(Stats::new(PORTS, 1));
    let sw = Switch::new(spec, pool.clone(), stats.clone()).unwrap();
    let mut ports: Vec<Box<dyn Port>> = Vec::new();
    let mut hosts = Vec::new();
    for _ in 0..PORTS {
        let (a, b) = mem_pair().unwrap();
        ports.push(Box::new(a));
        hosts.push(b);
    }
    let cpu = Arc::new(ChannelStatus::default());
    let path = std::env::temp_dir().join(format!(
        "kvswitch-test-cpu-{}-{name}.sock",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    let mut side =
        channel.then(|| Channel::bind(&path, token.map(str::to_string), cpu.clone()).unwrap());
    let (remote, inbox) = dataplane::remote::<Switch>().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let mut driver = Driver::new(ports, sw, None, stats.clone());
    let egress = driver.egress();
    let thread = std::thread::spawn(move || {
        let opts = RunOptions {
            max_sleep: Duration::from_millis(10),
            ..RunOptions::default()
        };
        driver
            .run_with(
                &opts,
                Some(&inbox),
                side.as_mut().map(|c| c as &mut dyn Side<Switch>),
                &|| stopped.load(Ordering::Relaxed),
                &mut |_| {},
            )
            .unwrap();
    });
    let addr = serve(
        TcpListener::bind("127.0.0.1:0").unwrap(),
        Api {
            exporter: Arc::new(Status {
                cpu: cpu.clone(),
                offer,
            }),
            switch: Some(remote),
            token: token.map(str::to_string),
            pools: vec![pool],
            reload: None,
            egress: Some(egress),
            serving: ApiServing::default(),
        },
    )
    .unwrap();
    let client = Client::new(addr, token.map(str::to_string));
    let to_cpu: EntryDef = serde_json::from_value(json!({
        "match": {"ethertype": "0x0800", "ip_proto": 17, "l4_dst": TO_CPU_PORT},
        "actions": ["to_cpu"]
    }))
    .unwrap();
    client.add_entry(ACL, &to_cpu).unwrap();
    Rig {
        client,
        hosts,
        stats,
        cpu,
        path,
        stop,
        thread: Some(thread),
    }
}

/// Datagram `seq` to the CPU's port, its number in the payload.
fn numbered(seq: u32) -> Vec<u8> {
    udp_frame(
        &UdpEnds {
            src_mac: Mac([2, 0, 0, 0, 0, 1]),
            dst_mac: Mac([2, 0, 0, 0, 9, 9]),
            src_ip: Ipv4Addr::new(10, 0, 0, 1),
            dst_ip: Ipv4Addr::new(10, 0, 0, 2),
            src_port: 40000,
            dst_port: TO_CPU_PORT,
        },
        &[&seq.to_be_bytes()],
    )
}

fn seq_of(frame: &[u8]) -> u32 {
    let tail = &frame[frame.len() - 4..];
    u32::from_be_bytes([tail[0], tail[1], tail[2], tail[3]])
}

/// Sends `n` numbered frames from port 0, from `first` on, in bursts the in-memory port holds,
/// and waits until the switch has taken them all.
fn send_numbered(rig: &mut Rig, first: u32, n: u32) {
    let before = stats::get(&rig.stats.ports[0].rx_packets);
    for chunk in (first..first + n).collect::<Vec<_>>().chunks(500) {
        let frames: Vec<Vec<u8>> = chunk.iter().map(|&s| numbered(s)).collect();
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let taken = stats::get(&rig.stats.ports[0].rx_packets);
        rig.hosts[0].send(&refs).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while stats::get(&rig.stats.ports[0].rx_packets) < taken + chunk.len() as u64 {
            assert!(
                Instant::now() < deadline,
                "the switch did not take the frames"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    assert_eq!(
        stats::get(&rig.stats.ports[0].rx_packets),
        before + u64::from(n)
    );
}

/// The frames the agent takes until they and the switch's `cpu_queue_full` drops since
/// `dropped_before` account for `expected` frames (10 s at most), and then 100 ms more.
fn take_all(rig: &Rig, cpu: &mut Cpu, expected: u64, dropped_before: u64) -> Vec<u32> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut settled = false;
    loop {
        let accounted = got.len() as u64 + cpu_queue_full(rig) - dropped_before;
        assert!(accounted <= expected, "{accounted} frames of {expected}");
        let wait = match (accounted == expected, settled) {
            (true, true) => return got,
            (true, false) => {
                settled = true;
                Duration::from_millis(100)
            }
            _ => Duration::from_millis(50),
        };
        assert!(
            Instant::now() < deadline,
            "{accounted} frames of {expected} in 10 s"
        );
        for f in cpu.frames(256, wait).unwrap() {
            assert_eq!((f.in_port, f.reason), (0, "to_cpu"));
            got.push(seq_of(&f.frame));
        }
    }
}

fn cpu_queue_full(rig: &Rig) -> u64 {
    stats::get(&rig.stats.drops[switch::stats::Drop::CpuQueueFull as usize])
}

#[test]
fn frames_arrive_in_order_none_lost_below_capacity_and_the_rest_counted() {
    let mut rig = rig("order", None, Offer::Channel);
    let mut cpu = Cpu::open(&rig.client, CpuMode::Channel, true).unwrap();
    assert!(cpu.over_channel());
    // The agent reads nothing while the whole capacity arrives; the API may not take the
    // frames meanwhile.
    let n = CPU_QUEUE as u32;
    send_numbered(&mut rig, 0, n);
    let e = rig.client.take_packets(10, 0).unwrap_err().to_string();
    assert!(e.contains("CPU channel takes the frames"), "{e}");
    assert!(rig
        .client
        .watch_packets(Duration::from_millis(100), |_| true)
        .is_err());
    assert_eq!(
        take_all(&rig, &mut cpu, u64::from(n), 0),
        (0..n).collect::<Vec<_>>()
    );
    assert_eq!(cpu_queue_full(&rig), 0);
    assert_eq!(
        rig.cpu.frames_to_agents.load(Ordering::Relaxed),
        u64::from(n)
    );
    // Far past it (the queue and what the socket holds, at most 1 MiB): the frames taken
    // are in order, and each one not taken is a counted drop.
    let m = 8 * CPU_QUEUE as u32;
    send_numbered(&mut rig, n, m);
    let got = take_all(&rig, &mut cpu, u64::from(m), 0);
    assert!(got.windows(2).all(|w| w[0] < w[1]), "out of order");
    assert!(got.len() >= CPU_QUEUE, "{} frames taken", got.len());
    assert_eq!(got.first(), Some(&n), "the oldest are kept");
    assert!(cpu_queue_full(&rig) > 0);
    // Once the agent has gone, the API hands the frames out again.
    drop(cpu);
    let deadline = Instant::now() + Duration::from_secs(2);
    while rig.client.take_packets(10, 0).is_err() {
        assert!(Instant::now() < deadline, "the API still refuses");
        std::thread::sleep(Duration::from_millis(10));
    }
    send_numbered(&mut rig, 0, 3);
    let frames = rig.client.take_packets(10, 1000).unwrap();
    assert_eq!(frames.len(), 3);
}

#[test]
fn registers_and_frames_out_of_ports() {
    let mut rig = rig("registers", Some("s3cret"), Offer::Channel);
    let mut cpu = Cpu::open(&rig.client, CpuMode::Auto, false).unwrap();
    assert!(cpu.over_channel());
    cpu.write("user3", 77).unwrap();
    assert_eq!(cpu.read("user3").unwrap(), 77);
    // The same register through HTTP.
    assert_eq!(rig.client.register("user3").unwrap().value, 77);
    send_numbered(&mut rig, 0, 3);
    assert_eq!(cpu.read("port0.rx_packets").unwrap(), 3);
    let e = cpu.write("port0.rx_packets", 1).unwrap_err().to_string();
    assert!(e.contains("read-only"), "{e}");
    let e = cpu.read("user99").unwrap_err().to_string();
    assert!(e.contains("no register"), "{e}");
    let e = cpu.read("port7.rx_packets").unwrap_err().to_string();
    assert!(e.contains("no register"), "{e}");
    // A frame out of port 2, as it is.
    let out = numbered(42);
    cpu.send(2, &out).unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut b = Batch::new(64);
    let mut seen = false;
    while !seen && Instant::now() < deadline {
        b.clear();
        let n = rig.hosts[2].recv(&mut b).unwrap();
        seen = (0..n).any(|j| b.frame(j) == out.as_slice());
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(seen, "the frame did not leave port 2");
    // A port that does not exist: the refusal comes back behind the send and is told at
    // the first call after it arrived, which sends nothing. It is there once a later answer
    // is, so it is told at the read or, at the latest, at the send after the read.
    cpu.send(9, &out).unwrap();
    let e = match cpu.read("user3") {
        Ok(v) => {
            assert_eq!(v, 77);
            cpu.send(2, &out).unwrap_err()
        }
        Err(e) => {
            assert_eq!(cpu.read("user3").unwrap(), 77);
            e
        }
    }
    .to_string();
    assert!(e.contains("port 9 does not exist"), "{e}");
    // Told once.
    cpu.send(2, &out).unwrap();
    assert_eq!(cpu.read("user0").unwrap(), 0);
    assert_eq!(rig.cpu.reads.load(Ordering::Relaxed), 6);
    assert_eq!(rig.cpu.writes.load(Ordering::Relaxed), 2);
    assert_eq!(rig.cpu.frames_from_agents.load(Ordering::Relaxed), 2);
    assert_eq!(rig.cpu.failed.load(Ordering::Relaxed), 4);
    let metrics = rig.client.call("GET", "/metrics", None).unwrap();
    let text = metrics.as_str().unwrap_or_default();
    assert!(
        text.contains("kvswitch_cpu_channel_reads_total 6"),
        "{text}"
    );
}

#[test]
fn strangers_wrong_tokens_a_second_taker_and_bad_messages_are_refused() {
    let rig = rig("refused", Some("s3cret"), Offer::Channel);
    // The socket is its owner's alone: another user cannot even connect.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&rig.path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let stranger = std::process::Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import socket, sys\n\
             s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n\
             try:\n    s.connect(sys.argv[1])\nexcept PermissionError:\n    sys.exit(3)\n",
        ])
        .arg(&rig.path)
        .uid(65534)
        .gid(65534)
        .status()
        .unwrap();
    assert_eq!(stranger.code(), Some(3), "user nobody connected");
    let wrong = Client::new(rig.client.api, Some("guess".into()));
    let e = Cpu::open(&wrong, CpuMode::Channel, true)
        .err()
        .expect("a wrong token is refused")
        .to_string();
    assert!(e.contains("CPU channel"), "{e}");
    let _taker = Cpu::open(&rig.client, CpuMode::Channel, true).unwrap();
    let e = format!(
        "{:#}",
        Cpu::open(&rig.client, CpuMode::Channel, true)
            .err()
            .expect("a second taker is refused")
    );
    assert!(e.contains("another agent takes the frames"), "{e}");
    // Refused is refused: `auto` does not fall back to HTTP, where it would split the frames.
    assert!(Cpu::open(&rig.client, CpuMode::Auto, true).is_err());
    // The switch speaks first, naming its instance; garbage instead of a hello is closed.
    let conn = SeqConn::connect(&rig.path).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut buf = [0u8; 64];
    let n = conn.recv(&mut buf).unwrap();
    let instance = rig.cpu.instance.get().copied().unwrap();
    assert_eq!(
        switch::channel::FromSwitch::decode(&buf[..n]),
        Ok(switch::channel::FromSwitch::Welcome {
            ports: PORTS as u16,
            instance
        })
    );
    conn.send(&[0xee, 1, 2, 3]).unwrap();
    assert_eq!(conn.recv(&mut buf).unwrap(), 0, "the switch closes it");
    // More agents than it takes: the one past them is closed at once.
    let mut open = Vec::new();
    for _ in 0..MAX_AGENTS {
        open.push(Cpu::open(&rig.client, CpuMode::Channel, false));
    }
    let opened = open.iter().filter(|c| c.is_ok()).count();
    // One place is the taker's.
    assert_eq!(opened, MAX_AGENTS - 1);
    assert!(rig.cpu.refused.load(Ordering::Relaxed) >= 4);
    drop(open);
    // Places come back once agents leave.
    let deadline = Instant::now() + Duration::from_secs(2);
    while Cpu::open(&rig.client, CpuMode::Channel, false).is_err() {
        assert!(Instant::now() < deadline, "no place came back");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Every agent but the taker gone: the switch sees a departure on its next round, and a
    // place still held by one that left would close a silent connection below unwelcomed.
    let deadline = Instant::now() + Duration::from_secs(5);
    while rig.cpu.agents.load(Ordering::Relaxed) != 1 {
        assert!(
            Instant::now() < deadline,
            "the agents that left still hold their places"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Connections that never say hello hold the places only until the hello's time is up.
    // Each is welcomed (accepted); one more is closed unwelcomed while they hold the places.
    // Checked on the socket alone, not through the API, whose thread runs below the others
    // and may take longer than the hello's time on a loaded machine.
    let held_since = Instant::now();
    let silent: Vec<SeqConn> = (1..MAX_AGENTS)
        .map(|_| SeqConn::connect(&rig.path).unwrap())
        .collect();
    for c in &silent {
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        assert!(c.recv(&mut buf).unwrap() > 0, "the welcome");
    }
    let one_more = SeqConn::connect(&rig.path).unwrap();
    one_more
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let got = one_more.recv(&mut buf).unwrap();
    // Only meaningful while the silent ones surely still hold their places.
    if held_since.elapsed() < HELLO_LIMIT / 2 {
        assert_eq!(got, 0, "a ninth connection was welcomed");
    }
    let deadline = Instant::now() + HELLO_LIMIT + Duration::from_secs(5);
    while Cpu::open(&rig.client, CpuMode::Channel, false).is_err() {
        assert!(
            Instant::now() < deadline,
            "the silent connections kept their places"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for c in &silent {
        assert_eq!(c.recv(&mut buf).unwrap(), 0, "closed by the switch");
    }
}

#[test]
fn without_a_channel_an_agent_uses_http_or_fails_when_told_to_use_the_channel() {
    let mut rig = rig("absent", None, Offer::Nothing);
    assert!(Cpu::open(&rig.client, CpuMode::Channel, true).is_err());
    let mut cpu = Cpu::open(&rig.client, CpuMode::Auto, true).unwrap();
    assert!(!cpu.over_channel());
    send_numbered(&mut rig, 0, 20);
    assert_eq!(take_all(&rig, &mut cpu, 20, 0), (0..20).collect::<Vec<_>>());
    cpu.write("user1", 5).unwrap();
    assert_eq!(cpu.read("user1").unwrap(), 5);
}

#[test]
fn an_agent_refuses_a_socket_that_is_not_the_switch_s() {
    let rig = rig("instance", None, Offer::WrongInstance);
    let e = format!(
        "{:#}",
        Cpu::open(&rig.client, CpuMode::Channel, true)
            .err()
            .expect("another switch's socket is refused")
    );
    assert!(e.contains("another switch's"), "{e}");
    // `auto` falls back to HTTP: the switch behind the API is still reached, by its API.
    let cpu = Cpu::open(&rig.client, CpuMode::Auto, true).unwrap();
    assert!(!cpu.over_channel());
}
