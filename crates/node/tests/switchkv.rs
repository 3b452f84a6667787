//! SwitchKV's roles on loopback: a backend node and a cache node talking over their control
//! connections, with clients reading through the cache node (which sends what it cannot
//! answer to the backend) and writing to the backend.
//!
//! - a key read often at the backend is reported, admitted, fetched and served by the cache
//!   node, and its switch rule is handed out;
//! - a write to it at the backend reaches the cache node before the backend answers, so the
//!   cache node never serves the value it replaced; a delete too;
//! - with the cache node gone, a write to a key it held is answered once the lease has run out;
//! - a backend that starts again (its values and leases lost) makes its cache node drop its
//!   keys before it serves anything; reads the cache node does not answer itself (gets, mg,
//!   a quiet binary get) reach the backend, writes are refused;
//! - on the path of every request (look-through), writes go on as well, and over UDP what the
//!   cache node does not answer goes on over UDP, its reply back under the client's id; what
//!   the upstream drops is forgotten and counted;
//! - asked first by look-aside clients, a cache node answers a key it does not serve as a
//!   miss, so that they go on to the backend.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use common::{connect, exchange, free_port};
use kv::rules::Change;
use node::auth;
use node::switchkv::Backends;
use node::{Node, NodeArgs, Role};
use wire::switchkv::{self as proto, Seal};

const LEASE_MS: u64 = 400;

/// The switch rule changes the cache node handed out.
type Rules = Vec<Change<Box<[u8]>>>;
/// The same, each with when it was handed out.
type Timed = Vec<(Instant, Change<Box<[u8]>>)>;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn line_or_end(r: &[u8]) -> bool {
    r.ends_with(b"END\r\n") || (!r.starts_with(b"VALUE") && r.ends_with(b"\r\n"))
}

/// The control key the backends and cache nodes of a test share, in a file of its own that
/// goes with it.
struct KeyFile(PathBuf);

impl KeyFile {
    fn new() -> KeyFile {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "kvswitch-node-switchkv-{}-{n}.key",
            std::process::id()
        ));
        std::fs::write(&path, format!("{:064x}\n", 0x5eed_u64 + u64::from(n))).unwrap();
        KeyFile(path)
    }

    fn key(&self) -> auth::Key {
        auth::Key::read(&self.0).unwrap()
    }
}

impl Drop for KeyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A backend on loopback, over TCP only, whose cache node's control port is `cache_control`.
fn backend_args(cache_control: u16, lease_ms: u64, key: &KeyFile) -> NodeArgs {
    NodeArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        no_udp: true,
        role: Role::Backend,
        control_port: free_port(),
        control_key_file: Some(key.0.clone()),
        cache_node: Some(format!("127.0.0.1:{cache_control}").parse().unwrap()),
        lease_ms,
        ..NodeArgs::default()
    }
}

/// A cache node on loopback, over TCP only, with its control port and upstream, no rule limit.
fn cache_args(
    control: u16,
    upstream: std::net::SocketAddr,
    lease_ms: u64,
    key: &KeyFile,
) -> NodeArgs {
    NodeArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        no_udp: true,
        role: Role::Cache,
        control_port: control,
        control_key_file: Some(key.0.clone()),
        upstream: Some(upstream),
        lease_ms,
        rule_rate: 0,
        ..NodeArgs::default()
    }
}

/// The one backend of a cache node on loopback: its control port there.
fn one(backend_control: u16) -> Option<Backends> {
    Some(Backends::one(SocketAddr::from((
        [127, 0, 0, 1],
        backend_control,
    ))))
}

#[test]
fn a_hot_key_is_served_by_the_cache_node_and_kept_coherent_with_writes() {
    let cache_control = free_port();
    let key = KeyFile::new();
    let args = backend_args(cache_control, LEASE_MS, &key);
    let backend = Node::start(&args).unwrap();
    let backend_addr = backend.tcp_addr().unwrap();
    let changes: Arc<Mutex<Rules>> = Arc::default();
    let sink = changes.clone();
    let cache = Node::start_with(
        &cache_args(cache_control, backend_addr, LEASE_MS, &key),
        Some(Box::new(move |c| {
            sink.lock().unwrap().extend(c);
            Ok(())
        })),
        one(args.control_port),
    )
    .unwrap();
    let mut to_backend = connect(backend_addr);
    let mut to_cache = connect(cache.tcp_addr().unwrap());
    let call = |stream: &mut std::net::TcpStream, request: &str| {
        text(&exchange(stream, request.as_bytes(), line_or_end))
    };

    assert_eq!(
        call(&mut to_backend, "set hot 5 0 2\r\nv1\r\n"),
        "STORED\r\n"
    );
    // Not cached yet: the cache node sends the read on to the backend.
    assert_eq!(
        call(&mut to_cache, "get hot\r\n"),
        "VALUE hot 5 2\r\nv1\r\nEND\r\n"
    );
    // Read often at the backend: an instant report (more than 8 of the last 200 reads).
    for _ in 0..20 {
        call(&mut to_backend, "get hot\r\n");
    }
    let started = Instant::now();
    while cache
        .cache_counters()
        .unwrap()
        .served
        .load(std::sync::atomic::Ordering::Relaxed)
        == 0
    {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "never served by the cache node"
        );
        assert_eq!(
            call(&mut to_cache, "get hot\r\n"),
            "VALUE hot 5 2\r\nv1\r\nEND\r\n"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        changes
            .lock()
            .unwrap()
            .contains(&Change::Add(b"hot".to_vec().into())),
        "the rule that steers reads of the key to the cache node"
    );

    // A write at the backend reaches the cache node before it is answered.
    for i in 0..20 {
        let value = format!("w{i:02}");
        assert_eq!(
            call(&mut to_backend, &format!("set hot 5 0 3\r\n{value}\r\n")),
            "STORED\r\n"
        );
        assert_eq!(
            call(&mut to_cache, "get hot\r\n"),
            format!("VALUE hot 5 3\r\n{value}\r\nEND\r\n"),
            "the cache node served a value a write had replaced"
        );
    }
    let served_before = cache
        .cache_counters()
        .unwrap()
        .served
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        served_before >= 20,
        "{served_before} reads served by the cache node"
    );
    assert_eq!(call(&mut to_backend, "delete hot\r\n"), "DELETED\r\n");
    assert_eq!(call(&mut to_cache, "get hot\r\n"), "END\r\n");

    // The cache node gone, a write to a key it held waits out the lease, then is answered.
    assert_eq!(
        call(&mut to_backend, "set hot 5 0 2\r\nv3\r\n"),
        "STORED\r\n"
    );
    let timeouts = |b: &Node| {
        b.backend_counters()
            .unwrap()
            .update_timeouts
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let before = timeouts(&backend);
    drop(to_cache);
    drop(cache);
    assert_eq!(
        call(&mut to_backend, "set hot 5 0 2\r\nv4\r\n"),
        "STORED\r\n"
    );
    assert_eq!(timeouts(&backend), before + 1);
    assert_eq!(
        call(&mut to_backend, "get hot\r\n"),
        "VALUE hot 5 2\r\nv4\r\nEND\r\n"
    );
}

/// Reads key `k` through the cache node until it answers one itself (it holds `v1`).
fn until_served(cache: &Node, to_cache: &mut std::net::TcpStream) {
    let started = Instant::now();
    while served(cache) == 0 {
        assert!(started.elapsed() < Duration::from_secs(5), "never cached");
        let reply = exchange(to_cache, b"get k\r\n", line_or_end);
        assert_eq!(text(&reply), "VALUE k 0 2\r\nv1\r\nEND\r\n");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads the cache node answered itself.
fn served(cache: &Node) -> u64 {
    cache
        .cache_counters()
        .unwrap()
        .served
        .load(std::sync::atomic::Ordering::Relaxed)
}

#[test]
fn a_restarted_backend_makes_its_cache_node_drop_its_keys_and_other_reads_are_forwarded() {
    let cache_control = free_port();
    let key = KeyFile::new();
    let backend_args = NodeArgs {
        listen: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
        ..backend_args(cache_control, 60_000, &key)
    };
    let cache = Node::start_with(
        &cache_args(cache_control, backend_args.listen, 60_000, &key),
        None,
        one(backend_args.control_port),
    )
    .unwrap();
    // With the cache node up, the backend's start is acknowledged at once, long before the
    // minute a lease lasts.
    let started = Instant::now();
    let backend = Node::start(&backend_args).unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    let mut to_backend = connect(backend.tcp_addr().unwrap());
    let mut to_cache = connect(cache.tcp_addr().unwrap());
    let call = |stream: &mut std::net::TcpStream, request: &[u8]| {
        text(&exchange(stream, request, line_or_end))
    };
    assert_eq!(
        call(&mut to_backend, b"set k 0 0 2\r\nv1\r\n"),
        "STORED\r\n"
    );
    for _ in 0..20 {
        call(&mut to_backend, b"get k\r\n");
    }
    until_served(&cache, &mut to_cache);
    // Reads it does not serve itself go on to the backend; writes are refused; the rest is
    // answered as any node answers it.
    let gets = call(&mut to_cache, b"gets k\r\n");
    assert!(
        gets.starts_with("VALUE k 0 2 ") && gets.ends_with("\r\nv1\r\nEND\r\n"),
        "{gets}"
    );
    let mg = exchange(&mut to_cache, b"mg k v\r\n", |r| r.ends_with(b"\r\nv1\r\n"));
    assert_eq!(text(&mg), "VA 2\r\nv1\r\n");
    // A quiet binary get that misses has no reply of its own: the cache node still answers.
    let mut getq = vec![0x80, 0x09, 0, 4, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 7];
    getq.extend_from_slice(&[0; 8]);
    getq.extend_from_slice(b"none");
    let mut hit = getq.clone();
    hit[3] = 1;
    hit[11] = 1;
    hit[15] = 8;
    hit.truncate(24);
    hit.push(b'k');
    let miss_then_hit = [getq, hit].concat();
    let replies = exchange(&mut to_cache, &miss_then_hit[..28], |r| r.is_empty());
    assert!(replies.is_empty(), "a quiet miss has no reply: {replies:?}");
    let replies = exchange(&mut to_cache, &miss_then_hit[28..], |r| {
        r.len() >= 24 + 4 + 2
    });
    assert_eq!(
        replies.len(),
        24 + 4 + 2,
        "the hit's reply alone: {replies:?}"
    );
    assert_eq!((replies[1], replies[15]), (0x09, 8), "{replies:?}");
    assert_eq!(&replies[replies.len() - 2..], b"v1");
    assert!(call(&mut to_cache, b"set k 0 0 1\r\nx\r\n").starts_with("SERVER_ERROR"));
    assert!(call(&mut to_cache, b"version\r\n").starts_with("VERSION "));
    // `stats` shows the role's counters after the node's own.
    let stats = call(&mut to_cache, b"stats\r\n");
    assert!(stats.contains("STAT switchkv_served 1\r\n"), "{stats}");
    assert!(
        stats.contains("STAT curr_items ") && stats.ends_with("END\r\n"),
        "{stats}"
    );

    // The backend restarts and lost its values; the cache node must not serve the old one.
    drop(to_backend);
    drop(backend);
    let backend = Node::start(&backend_args).unwrap();
    let mut to_backend = connect(backend.tcp_addr().unwrap());
    let before = served(&cache);
    assert_eq!(call(&mut to_cache, b"get k\r\n"), "END\r\n");
    assert_eq!(served(&cache), before, "served after its backend restarted");
    assert_eq!(
        call(&mut to_backend, b"set k 0 0 2\r\nv2\r\n"),
        "STORED\r\n"
    );
    assert_eq!(
        call(&mut to_cache, b"get k\r\n"),
        "VALUE k 0 2\r\nv2\r\nEND\r\n"
    );
}

#[test]
fn rules_follow_the_cache_under_the_rule_update_limit_additions_first() {
    const RATE: u32 = 20;
    const KEYS: usize = 30;
    let cache_control = free_port();
    let key = KeyFile::new();
    let args = NodeArgs {
        top_k: KEYS as u32,
        ..backend_args(cache_control, 2000, &key)
    };
    let changes: Arc<Mutex<Timed>> = Arc::default();
    let sink = changes.clone();
    let cache = Node::start_with(
        &NodeArgs {
            cache_items: KEYS,
            rule_rate: RATE,
            top_k: KEYS as u32,
            ..cache_args(cache_control, "127.0.0.1:9".parse().unwrap(), 2000, &key)
        },
        Some(Box::new(move |c| {
            let now = Instant::now();
            sink.lock().unwrap().extend(c.into_iter().map(|c| (now, c)));
            Ok(())
        })),
        one(args.control_port),
    )
    .unwrap();
    let backend = Node::start(&args).unwrap();
    let mut to_backend = connect(backend.tcp_addr().unwrap());
    let mut call =
        |request: String| text(&exchange(&mut to_backend, request.as_bytes(), line_or_end));
    // Two waves of hot keys: the second read more, so that it replaces the first.
    let wave = |w: usize| (0..KEYS).map(move |i| format!("w{w}:{i}"));
    for key in wave(1).chain(wave(2)) {
        assert_eq!(call(format!("set {key} 0 0 1\r\nv\r\n")), "STORED\r\n");
    }
    let added = |w: usize, all: &[(Instant, Change<Box<[u8]>>)]| {
        all.iter()
            .filter(
                |(_, c)| matches!(c, Change::Add(k) if k.starts_with(format!("w{w}:").as_bytes())),
            )
            .count()
    };
    for (w, reads) in [(1, 20), (2, 60)] {
        let started = Instant::now();
        while added(w, &changes.lock().unwrap()) < KEYS {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "wave {w} not cached"
            );
            for key in wave(w) {
                for _ in 0..reads / 10 {
                    call(format!("get {key}\r\n"));
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let all = changes.lock().unwrap().clone();
    // Never more than the budget allows: its burst (a second's worth) and the rate since.
    let first = all[0].0;
    for (i, (at, _)) in all.iter().enumerate() {
        let allowed = RATE as f64 * (1.0 + at.duration_since(first).as_secs_f64()) + 1.0;
        assert!(
            (i + 1) as f64 <= allowed,
            "change {} at {:?}: {all:?}",
            i + 1,
            *at - first
        );
    }
    // The first wave's keys leave only after the second's have started to come in.
    let first_removal = all
        .iter()
        .position(|(_, c)| matches!(c, Change::Remove(_)))
        .expect("the first wave was evicted");
    assert!(
        all[..first_removal]
            .iter()
            .any(|(_, c)| matches!(c, Change::Add(k) if k.starts_with(b"w2:"))),
        "a removal went before any addition of the second wave: {all:?}"
    );
    drop(cache);
}

/// A cache node reached as `how` says (its `look_through`, `look_aside` and `no_udp`), then its
/// backend, over UDP too if the cache node is: the backend's start is acknowledged at once.
/// The key file they share goes with them.
fn cache_then_backend(how: NodeArgs) -> (Node, Node, KeyFile) {
    let pair = pair(how);
    (pair.cache, pair.backend, pair.key)
}

/// A cache node and its backend, with their control ports and the key they share.
struct Pair {
    cache: Node,
    backend: Node,
    cache_control: u16,
    backend_control: u16,
    key: KeyFile,
}

/// As [`cache_then_backend`], with the control ports.
fn pair(how: NodeArgs) -> Pair {
    let cache_control = free_port();
    let key = KeyFile::new();
    let backend_at: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let args = NodeArgs {
        listen: backend_at,
        no_udp: how.no_udp,
        ..backend_args(cache_control, 60_000, &key)
    };
    let cache = Node::start_with(
        &NodeArgs {
            look_through: how.look_through,
            look_aside: how.look_aside,
            no_udp: how.no_udp,
            ..cache_args(cache_control, backend_at, 60_000, &key)
        },
        None,
        one(args.control_port),
    )
    .unwrap();
    let backend = Node::start(&args).unwrap();
    Pair {
        cache,
        backend,
        cache_control,
        backend_control: args.control_port,
        key,
    }
}

#[test]
fn a_look_through_cache_node_sends_writes_on_and_serves_what_they_wrote() {
    let (cache, _backend, _key) = cache_then_backend(NodeArgs {
        look_through: true,
        no_udp: false,
        ..NodeArgs::default()
    });
    let mut to_cache = connect(cache.tcp_addr().unwrap());
    let call = |stream: &mut std::net::TcpStream, request: &[u8]| {
        text(&exchange(stream, request, line_or_end))
    };
    // Every request goes to the cache node: reads make the key hot at the backend.
    assert_eq!(call(&mut to_cache, b"set k 0 0 2\r\nv1\r\n"), "STORED\r\n");
    until_served(&cache, &mut to_cache);
    // Writes through it reach the backend, which tells it before answering.
    for (i, write) in [
        &b"set k 0 0 2\r\nv2\r\n"[..],
        b"set k 0 0 2 noreply\r\nv3\r\n",
        b"ms k 2 q\r\nv4\r\n",
    ]
    .iter()
    .enumerate()
    {
        let reply = match i {
            0 => call(&mut to_cache, write),
            // No reply of its own: what follows is answered alone.
            _ => {
                let sent = [*write, b"version\r\n"].concat();
                text(&exchange(&mut to_cache, &sent, |r| r.ends_with(b"\r\n")))
            }
        };
        assert!(
            reply == "STORED\r\n" || reply.starts_with("VERSION "),
            "{reply}"
        );
        let value = format!("v{}", i + 2);
        let before = served(&cache);
        assert_eq!(
            call(&mut to_cache, b"get k\r\n"),
            format!("VALUE k 0 2\r\n{value}\r\nEND\r\n")
        );
        assert_eq!(
            served(&cache),
            before + 1,
            "served by the cache node itself"
        );
    }
    // Over UDP: a get of keys served here is answered here; anything else goes on over UDP,
    // and its reply comes back from the cache node under the client's request id.
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let at = cache.udp_addr().unwrap();
    let ask = |id: u16, request: &[u8]| -> String {
        let mut datagram = id.to_be_bytes().to_vec();
        datagram.extend_from_slice(&[0, 0, 0, 1, 0, 0]);
        datagram.extend_from_slice(request);
        udp.send_to(&datagram, at).unwrap();
        let mut buf = [0u8; 2048];
        let (n, from) = udp.recv_from(&mut buf).unwrap();
        assert_eq!(from, at, "the reply comes from the cache node");
        assert_eq!(buf[..2], id.to_be_bytes(), "under the client's request id");
        text(&buf[8..n])
    };
    let (served_before, relayed_before) = (served(&cache), stat(&mut to_cache, "relayed"));
    assert_eq!(ask(1, b"get k\r\n"), "VALUE k 0 2\r\nv4\r\nEND\r\n");
    assert_eq!(served(&cache), served_before + 1);
    assert_eq!(ask(300, b"set u 0 0 1\r\nx\r\n"), "STORED\r\n");
    assert_eq!(
        ask(301, b"get u k\r\n"),
        "VALUE u 0 1\r\nx\r\nVALUE k 0 2\r\nv4\r\nEND\r\n"
    );
    assert_eq!(stat(&mut to_cache, "relayed"), relayed_before + 2);
    assert_eq!(call(&mut to_cache, b"delete k\r\n"), "DELETED\r\n");
    assert_eq!(call(&mut to_cache, b"get k\r\n"), "END\r\n");
    assert_eq!(ask(2, b"get k\r\n"), "END\r\n");
}

/// One `STAT name value` of a node's `stats`.
fn stat(stream: &mut std::net::TcpStream, name: &str) -> u64 {
    let reply = text(&exchange(stream, b"stats\r\n", |r| r.ends_with(b"END\r\n")));
    let prefix = format!("STAT {name} ");
    reply
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {reply}"))
}

#[test]
fn a_look_aside_cache_node_answers_what_it_does_not_serve_as_a_miss() {
    let (cache, backend, _key) = cache_then_backend(NodeArgs {
        look_aside: true,
        ..NodeArgs::default()
    });
    let mut to_cache = connect(cache.tcp_addr().unwrap());
    let mut to_backend = connect(backend.tcp_addr().unwrap());
    let call = |stream: &mut std::net::TcpStream, request: &[u8]| {
        text(&exchange(stream, request, line_or_end))
    };
    assert_eq!(
        call(&mut to_backend, b"set k 0 0 2\r\nv1\r\n"),
        "STORED\r\n"
    );
    assert_eq!(
        call(&mut to_backend, b"set cold 0 0 1\r\nc\r\n"),
        "STORED\r\n"
    );
    // A look-aside client: the cache node first, the backend on a miss. The backend's reads
    // make the key hot, and the cache node takes it in.
    let started = Instant::now();
    loop {
        let reply = call(&mut to_cache, b"get k\r\n");
        if reply != "END\r\n" {
            assert_eq!(reply, "VALUE k 0 2\r\nv1\r\nEND\r\n");
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "never cached");
        assert_eq!(
            call(&mut to_backend, b"get k\r\n"),
            "VALUE k 0 2\r\nv1\r\nEND\r\n"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let misses = stat(&mut to_cache, "switchkv_misses");
    assert!(misses >= 1);
    // A key it does not hold is a miss, not sent on.
    assert_eq!(call(&mut to_cache, b"get cold\r\n"), "END\r\n");
    assert_eq!(stat(&mut to_cache, "switchkv_misses"), misses + 1);
    assert_eq!(stat(&mut to_cache, "switchkv_forwarded"), 0);
    // Writes go to the backend, which updates the cache node before it answers.
    assert!(call(&mut to_cache, b"set k 0 0 2\r\nv2\r\n").starts_with("SERVER_ERROR"));
    assert_eq!(
        call(&mut to_backend, b"set k 0 0 2\r\nv2\r\n"),
        "STORED\r\n"
    );
    assert_eq!(
        call(&mut to_cache, b"get k\r\n"),
        "VALUE k 0 2\r\nv2\r\nEND\r\n"
    );
}

#[test]
fn a_look_through_cache_node_forgets_what_its_upstream_drops() {
    // An upstream that takes every datagram and answers none (a backend over capacity).
    let upstream = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let key = KeyFile::new();
    let cache = Node::start_with(
        &NodeArgs {
            look_through: true,
            no_udp: false,
            ..cache_args(free_port(), upstream.local_addr().unwrap(), 60_000, &key)
        },
        None,
        one(free_port()),
    )
    .unwrap();
    let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    client
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let at = cache.udp_addr().unwrap();
    let sent = Instant::now();
    client
        .send_to(b"\0\x07\0\0\0\x01\0\0get a\r\n", at)
        .unwrap();
    // It reached the upstream as the client sent it, under an id of the relay's own.
    upstream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 256];
    let (n, relay) = upstream.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[2..n], b"\0\0\0\x01\0\0get a\r\n");
    let forgotten = [buf[0], buf[1]];
    assert!(
        client.recv_from(&mut buf).is_err(),
        "nothing to answer with"
    );
    let mut to_cache = connect(cache.tcp_addr().unwrap());
    // Forgotten once the relay's wait has passed, at the next request sent on.
    let started = Instant::now();
    while stat(&mut to_cache, "relay_lost") == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never forgotten"
        );
        std::thread::sleep(Duration::from_millis(200));
        client
            .send_to(b"\0\x08\0\0\0\x01\0\0get b\r\n", at)
            .unwrap();
    }
    assert!(
        sent.elapsed() >= Duration::from_secs(1),
        "forgotten too soon"
    );
    // A reply to a request it forgot is counted, not sent.
    let mut late = forgotten.to_vec();
    late.extend_from_slice(b"\0\0\0\x01\0\0END\r\n");
    upstream.send_to(&late, relay).unwrap();
    let started = Instant::now();
    while stat(&mut to_cache, "relay_stray") == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "a stray reply not counted"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(client.recv_from(&mut buf).is_err());
}

// ---- the control channel's authentication -----------------------------------------------------

/// Sends `bytes` to `to` on a connection of its own and reads back one message: its seal, if
/// it has one, and its bytes (empty if the connection closed first).
fn send(to: SocketAddr, bytes: &[u8]) -> (Option<Seal>, Vec<u8>) {
    let mut conn = connect(to);
    conn.write_all(bytes).unwrap();
    read_message(&mut conn)
}

/// Reads one message from `conn` (waiting at most 5 s): its seal, if any, and its bytes.
fn read_message(conn: &mut std::net::TcpStream) -> (Option<Seal>, Vec<u8>) {
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Ok(Some((seal, at))) = proto::parse_seal(&buf) {
            if let Ok(Some((_, used))) = proto::parse(&buf[at..]) {
                return (seal, buf[at..at + used].to_vec());
            }
        }
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return (None, buf),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Both ends of a loopback connection.
fn loopback() -> auth::Ends {
    auth::Ends::new([127, 0, 0, 1].into(), [127, 0, 0, 1].into())
}

/// `message` sealed by `sender` as the next request on `stream`, seal line first.
fn sealed(sender: &auth::Sender, stream: u8, message: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    proto::write_seal(&sender.seal(stream, loopback(), message), &mut out);
    out.extend_from_slice(message);
    out
}

/// A UDP `get` of `key` from `to`, its reply's text.
fn udp_get(udp: &std::net::UdpSocket, to: SocketAddr, id: u16, key: &str) -> String {
    let mut datagram = id.to_be_bytes().to_vec();
    datagram.extend_from_slice(&[0, 0, 0, 1, 0, 0]);
    datagram.extend_from_slice(format!("get {key}\r\n").as_bytes());
    udp.send_to(&datagram, to).unwrap();
    let mut buf = [0u8; 2048];
    let (n, _) = udp.recv_from(&mut buf).unwrap();
    assert_eq!(buf[..2], id.to_be_bytes());
    text(&buf[8..n])
}

#[test]
fn an_unsigned_or_forged_update_is_refused_and_udp_readers_keep_the_real_value() {
    let p = pair(NodeArgs {
        no_udp: false,
        ..NodeArgs::default()
    });
    let mut to_backend = connect(p.backend.tcp_addr().unwrap());
    let mut to_cache = connect(p.cache.tcp_addr().unwrap());
    let call = |stream: &mut std::net::TcpStream, request: &[u8]| {
        text(&exchange(stream, request, line_or_end))
    };
    assert_eq!(
        call(&mut to_backend, b"set k 0 0 2\r\nv1\r\n"),
        "STORED\r\n"
    );
    for _ in 0..20 {
        call(&mut to_backend, b"get k\r\n");
    }
    until_served(&p.cache, &mut to_cache);
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let at = p.cache.udp_addr().unwrap();
    assert_eq!(udp_get(&udp, at, 1, "k"), "VALUE k 0 2\r\nv1\r\nEND\r\n");

    // Anyone who reaches the control port: an update without a seal.
    let control = SocketAddr::from(([127, 0, 0, 1], p.cache_control));
    let (seal, reply) = send(control, b"update k 0 6\r\nforged\r\n");
    assert_eq!(
        (seal, text(&reply)),
        (None, "error refused unsigned\r\n".into())
    );
    // One who names the backend but has not its key: a MAC that is not the message's.
    let forged = format!(
        "auth {} 0123456789abcdef 2 1 {}\r\nupdate k 0 6\r\nforged\r\n",
        p.backend_control,
        "00".repeat(32)
    );
    let (seal, reply) = send(control, forged.as_bytes());
    assert_eq!(
        (seal, text(&reply)),
        (None, "error refused bad_mac\r\n".into())
    );
    // And a delete.
    let (_, reply) = send(control, b"delete k\r\n");
    assert_eq!(text(&reply), "error refused unsigned\r\n");
    assert_eq!(stat(&mut to_cache, "switchkv_refused_unsigned"), 2);
    assert_eq!(stat(&mut to_cache, "switchkv_refused_bad_mac"), 1);
    assert_eq!(stat(&mut to_cache, "switchkv_updates"), 0);
    assert_eq!(
        p.cache
            .cache_counters()
            .unwrap()
            .refused
            .get(auth::Refusal::Unsigned),
        2
    );

    // UDP readers keep getting the real value, from the cache node itself.
    for id in 2..12 {
        let before = served(&p.cache);
        assert_eq!(udp_get(&udp, at, id, "k"), "VALUE k 0 2\r\nv1\r\nEND\r\n");
        assert_eq!(served(&p.cache), before + 1);
    }
    // The backend's own updates still reach it.
    assert_eq!(
        call(&mut to_backend, b"set k 0 0 2\r\nv2\r\n"),
        "STORED\r\n"
    );
    assert_eq!(udp_get(&udp, at, 12, "k"), "VALUE k 0 2\r\nv2\r\nEND\r\n");
    assert_eq!(stat(&mut to_cache, "switchkv_updates"), 1);
    assert_eq!(stat(&mut to_cache, "switchkv_update_timeouts"), 0);
}

#[test]
fn reports_from_anyone_but_a_configured_backend_replays_and_bad_macs_are_refused() {
    let key = KeyFile::new();
    // Two configured backends, played by hand: keys `b:...` are the second's.
    let first = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let second = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    // Someone else, with a control port of its own.
    let stranger = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = |l: &std::net::TcpListener| l.local_addr().unwrap().port();
    let (pa, pb, ps) = (port(&first), port(&second), port(&stranger));
    let cache_control = free_port();
    let changes: Arc<Mutex<Rules>> = Arc::default();
    let sink = changes.clone();
    let cache = Node::start_with(
        &cache_args(cache_control, "127.0.0.1:9".parse().unwrap(), 60_000, &key),
        Some(Box::new(move |c| {
            sink.lock().unwrap().extend(c);
            Ok(())
        })),
        Some(Backends {
            control: vec![
                SocketAddr::from(([127, 0, 0, 1], pa)),
                SocketAddr::from(([127, 0, 0, 1], pb)),
            ],
            place: Box::new(|k: &[u8]| Some(usize::from(k.starts_with(b"b:")))),
        }),
    )
    .unwrap();
    let control = SocketAddr::from(([127, 0, 0, 1], cache_control));
    let mut to_cache = connect(cache.tcp_addr().unwrap());

    // The stranger reports a key with its value: unsigned, then sealed under the key (the
    // worst case), then sealed as the first backend but naming its own port.
    let hot = format!("hot {ps} k 100000 0 6\r\nforged\r\n");
    let (_, reply) = send(control, hot.as_bytes());
    assert_eq!(text(&reply), "error refused unsigned\r\n");
    let as_stranger = auth::Sender::new(key.key(), ps, 1);
    let (_, reply) = send(control, &sealed(&as_stranger, 1, hot.as_bytes()));
    assert_eq!(text(&reply), "error refused unknown_peer\r\n");
    let report = format!("report {ps} 1\r\nk 100000\r\n");
    let (_, reply) = send(control, &sealed(&as_stranger, 1, report.as_bytes()));
    assert_eq!(text(&reply), "error refused unknown_peer\r\n");
    let as_first = auth::Sender::new(key.key(), pa, 0xfeed);
    let (_, reply) = send(control, &sealed(&as_first, 1, hot.as_bytes()));
    assert_eq!(text(&reply), "error refused unknown_peer\r\n");
    // Nothing was fetched from anyone, nor steered.
    std::thread::sleep(Duration::from_millis(300));
    for l in [&first, &second, &stranger] {
        l.set_nonblocking(true).unwrap();
        assert!(l.accept().is_err(), "a fetch from {:?}", l.local_addr());
    }
    assert!(changes.lock().unwrap().is_empty());
    assert_eq!(stat(&mut to_cache, "switchkv_fetches"), 0);

    // The first backend reports a key of the second's: refused, and not fetched either.
    let theirs = format!("hot {pa} b:x 100000 0 1\r\nv\r\n");
    let (seal, reply) = send(control, &sealed(&as_first, 1, theirs.as_bytes()));
    assert_eq!(text(&reply), "no\r\n");
    assert!(seal.is_some(), "a reply sealed by the cache node");
    assert_eq!(stat(&mut to_cache, "switchkv_refused_not_its_key"), 1);

    // The first backend reports one of its own: taken, and fetched from it alone.
    let mine = format!("hot {pa} k 100000 0 2\r\nv1\r\n");
    let request = sealed(&as_first, 1, mine.as_bytes());
    let (seal, reply) = send(control, &request);
    assert_eq!(text(&reply), "ok\r\n");
    let seal = seal.expect("sealed");
    let as_cache = auth::Sender::new(key.key(), cache_control, 0);
    assert!(auth::verify(
        as_cache.key(),
        auth::Kind::Reply,
        loopback(),
        &seal,
        &reply
    ));
    assert_eq!(seal.port, cache_control);
    let started = Instant::now();
    let mut fetching = loop {
        match first.accept() {
            Ok((conn, _)) => break conn,
            Err(_) => {
                assert!(started.elapsed() < Duration::from_secs(5), "never fetched");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    };
    fetching.set_nonblocking(false).unwrap();
    let (seal, fetch) = read_message(&mut fetching);
    assert_eq!(text(&fetch), "fetch k\r\n");
    let seal = seal.expect("a sealed fetch");
    assert!(auth::verify(
        as_cache.key(),
        auth::Kind::Request,
        loopback(),
        &seal,
        &fetch
    ));
    let value = b"value 0 2\r\nv1\r\n";
    let answer = auth::Sender::new(key.key(), pa, 0xfeed).seal_reply(&seal, loopback(), value);
    let mut out = Vec::new();
    proto::write_seal(&answer, &mut out);
    out.extend_from_slice(value);
    fetching.write_all(&out).unwrap();
    let started = Instant::now();
    while served(&cache) == 0 {
        assert!(started.elapsed() < Duration::from_secs(5), "never served");
        let reply = exchange(&mut to_cache, b"get k\r\n", line_or_end);
        assert!(
            reply == b"VALUE k 0 2\r\nv1\r\nEND\r\n" || reply.starts_with(b"SERVER_ERROR"),
            "{}",
            text(&reply)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(changes
        .lock()
        .unwrap()
        .contains(&Change::Add(b"k".to_vec().into())));

    // The same bytes again: a replay. One byte of the value changed: another message.
    let (_, reply) = send(control, &request);
    assert_eq!(text(&reply), "error refused replayed\r\n");
    let mut tampered = sealed(&as_first, 2, b"update k 0 2\r\nv2\r\n");
    let last = tampered.len() - 3;
    tampered[last] = b'X';
    let (_, reply) = send(control, &tampered);
    assert_eq!(text(&reply), "error refused bad_mac\r\n");
    assert_eq!(
        text(&exchange(&mut to_cache, b"get k\r\n", line_or_end)),
        "VALUE k 0 2\r\nv1\r\nEND\r\n"
    );
    for (name, n) in [
        ("unsigned", 1),
        ("unknown_peer", 3),
        ("not_its_key", 1),
        ("replayed", 1),
        ("bad_mac", 1),
        ("old_session", 0),
        ("malformed", 0),
    ] {
        assert_eq!(
            stat(&mut to_cache, &format!("switchkv_refused_{name}")),
            n,
            "{name}"
        );
    }
    // An earlier session of the backend, once it started again, is refused too.
    let restarted = auth::Sender::new(key.key(), pa, 0xbeef);
    let (_, reply) = send(
        control,
        &sealed(&restarted, 0, format!("reset {pa}\r\n").as_bytes()),
    );
    assert_eq!(text(&reply), "ok\r\n");
    let (_, reply) = send(
        control,
        &sealed(&as_first, 1, format!("reset {pa}\r\n").as_bytes()),
    );
    assert_eq!(text(&reply), "error refused old_session\r\n");
    drop(fetching);
}

#[test]
fn a_backend_takes_control_messages_only_sealed_by_its_cache_node() {
    let key = KeyFile::new();
    // No cache node answers: the backend starts once a lease has passed.
    let cache_control = free_port();
    let args = backend_args(cache_control, 200, &key);
    let backend = Node::start(&args).unwrap();
    let mut to_backend = connect(backend.tcp_addr().unwrap());
    let control = SocketAddr::from(([127, 0, 0, 1], args.control_port));
    // An unsigned evict (which would stop the backend telling its cache node of writes).
    let (_, reply) = send(control, b"evict k\r\n");
    assert_eq!(text(&reply), "error refused unsigned\r\n");
    // Sealed under the key, but from another port than the cache node's.
    let other = auth::Sender::new(key.key(), free_port(), 3);
    let (_, reply) = send(control, &sealed(&other, 0, b"fetch k\r\n"));
    assert_eq!(text(&reply), "error refused unknown_peer\r\n");
    // As the cache node: taken once, and a sealed reply.
    let as_cache = auth::Sender::new(key.key(), cache_control, 3);
    let request = sealed(&as_cache, 0, b"evict k\r\n");
    let (seal, reply) = send(control, &request);
    assert_eq!(text(&reply), "ok\r\n");
    assert!(auth::verify(
        as_cache.key(),
        auth::Kind::Reply,
        loopback(),
        &seal.expect("sealed"),
        &reply
    ));
    let (_, reply) = send(control, &request);
    assert_eq!(text(&reply), "error refused replayed\r\n");
    let garbage = format!("auth {cache_control} 12 0 1 00\r\nevict k\r\n");
    let (_, reply) = send(control, garbage.as_bytes());
    assert!(
        text(&reply).starts_with("error refused malformed"),
        "{}",
        text(&reply)
    );
    for (name, n) in [
        ("unsigned", 1),
        ("unknown_peer", 1),
        ("replayed", 1),
        ("malformed", 1),
    ] {
        assert_eq!(
            stat(&mut to_backend, &format!("switchkv_refused_{name}")),
            n,
            "{name}"
        );
    }
}

#[test]
fn a_role_without_a_good_control_key_does_not_start() {
    let no_key = NodeArgs {
        control_key_file: None,
        ..backend_args(free_port(), 100, &KeyFile::new())
    };
    let e = Node::start(&no_key).unwrap_err();
    assert!(format!("{e:#}").contains("--control-key-file"), "{e:#}");
    let short = KeyFile::new();
    std::fs::write(&short.0, "short\n").unwrap();
    let e = Node::start(&backend_args(free_port(), 100, &short)).unwrap_err();
    assert!(format!("{e:#}").contains("at least 32"), "{e:#}");
    let key = KeyFile::new();
    let missing = NodeArgs {
        control_key_file: Some(key.0.with_extension("missing")),
        ..cache_args(free_port(), "127.0.0.1:9".parse().unwrap(), 100, &key)
    };
    let e = Node::start_with(&missing, None, one(free_port())).unwrap_err();
    assert!(format!("{e:#}").contains("cannot read"), "{e:#}");
    // A cache node needs its backends.
    let e = Node::start(&cache_args(
        free_port(),
        "127.0.0.1:9".parse().unwrap(),
        100,
        &key,
    ))
    .unwrap_err();
    assert!(format!("{e:#}").contains("--pool-config"), "{e:#}");
}
