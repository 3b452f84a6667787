//! Helpers shared by the end-to-end tests: a testbed with the real kvswitch binary, memcached
//! over UDP from inside a client namespace, and direct questions to servers.
#![allow(dead_code)]

pub mod fleet;
pub mod proxy;
pub mod tls;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

/// A process the test started, killed by PID when dropped.
pub struct Running(pub std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether `program` is on the PATH.
pub fn installed(program: &str) -> bool {
    std::process::Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether memtier_benchmark is on the PATH; when it is not, says that the calling test is
/// skipped and why (it is not a Debian package).
pub fn memtier_installed() -> bool {
    let here = installed("memtier_benchmark");
    if !here {
        println!(
            "skipped: memtier_benchmark is not installed (not a Debian package; build it from \
             its source to run this test)"
        );
    }
    here
}

pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(
        uid, 0,
        "the end-to-end tests build network namespaces and need root"
    );
}

/// Brings up the default topology (2 clients, 3 servers) with kvswitch in `mode`.
pub fn testbed(prefix: &str, mode: &str, nutcracker: bool) -> testbed::Live {
    testbed_with(prefix, mode, nutcracker, |_| {})
}

/// The same, with the options changed by `tweak` first. The subnet is the prefix's own
/// ([`testbed::Subnet::for_prefix`]): kvswitch's local port puts the VIP and a route to the
/// subnet into the root namespace, which the tests running side by side share.
pub fn testbed_with(
    prefix: &str,
    mode: &str,
    nutcracker: bool,
    tweak: impl FnOnce(&mut testbed::UpOptions),
) -> testbed::Live {
    testbed_of(prefix, mode, nutcracker, &["s1", "s2", "s3"], tweak)
}

/// The default topology's two clients with the servers `servers` (named as the hosts), and
/// the options changed by `tweak`.
pub fn testbed_of(
    prefix: &str,
    mode: &str,
    nutcracker: bool,
    servers: &[&str],
    tweak: impl FnOnce(&mut testbed::UpOptions),
) -> testbed::Live {
    require_root();
    let mut topo = testbed::Topology::default_topology()
        .on_subnet(testbed::Subnet::for_prefix(prefix))
        .expect("the default topology fits a /24");
    let server = topo
        .hosts
        .iter()
        .find(|h| h.role == testbed::Role::Server)
        .cloned()
        .expect("the default topology has servers");
    topo.hosts.retain(|h| h.role != testbed::Role::Server);
    topo.hosts.extend(servers.iter().map(|name| testbed::Host {
        name: name.to_string(),
        ..server.clone()
    }));
    topo.mode = match mode {
        "l2" => testbed::Mode::L2,
        _ => testbed::Mode::L3,
    };
    let state = std::env::temp_dir().join(format!("{prefix}-testbed-{}.json", std::process::id()));
    // A previous run that was killed may have left this prefix behind.
    let _ = testbed::down(&state);
    // Wherever it was recorded; an error only says nothing was left.
    let _ = testbed::down_prefix(prefix);
    let mut opts = testbed::UpOptions {
        prefix: prefix.into(),
        kvswitch_bin: Some(env!("CARGO_BIN_EXE_kvswitch").into()),
        state_path: Some(state),
        start_nutcracker: nutcracker,
        ..Default::default()
    };
    tweak(&mut opts);
    testbed::up(&topo, &opts).expect("testbed up")
}

/// A memcached UDP reply: where it came from and the reassembled payload.
#[derive(Debug)]
pub struct Reply {
    pub from: SocketAddr,
    pub body: Vec<u8>,
    pub datagrams: usize,
}

/// Sends one memcached UDP request (frame header added) from `host` and waits for the whole
/// reply, or `None` after `timeout`.
pub fn udp_call(
    live: &testbed::Live,
    host: &str,
    target: SocketAddr,
    request: &[u8],
    timeout: Duration,
) -> Option<Reply> {
    let mut datagram = vec![0u8, 7, 0, 0, 0, 1, 0, 0];
    datagram.extend_from_slice(request);
    udp_raw(live, host, target, &datagram, timeout)
}

/// Sends `datagram` as is (the caller writes the frame header) and reassembles the reply to
/// request id 7.
pub fn udp_raw(
    live: &testbed::Live,
    host: &str,
    target: SocketAddr,
    datagram: &[u8],
    timeout: Duration,
) -> Option<Reply> {
    let datagram = datagram.to_vec();
    live.in_host(host, move || -> Option<Reply> {
        let sock = UdpSocket::bind("0.0.0.0:0").ok()?;
        exchange(&sock, target, &datagram, timeout)
    })
    .expect("client namespace")
}

/// Sends `datagram` (frame header included) on `sock` and reassembles the reply whose
/// request id is the datagram's, or `None` after `timeout`. Replies to other ids are skipped.
pub fn exchange(
    sock: &UdpSocket,
    target: SocketAddr,
    datagram: &[u8],
    timeout: Duration,
) -> Option<Reply> {
    let id = [*datagram.first()?, *datagram.get(1)?];
    sock.send_to(datagram, target).ok()?;
    let deadline = Instant::now() + timeout;
    // memcached sends a multi-key reply as one message per item, each numbered on its own; a
    // message bigger than a datagram comes in numbered pieces.
    let mut stream: Vec<u8> = Vec::new();
    let mut parts: Vec<Option<Vec<u8>>> = Vec::new();
    let mut datagrams = 0;
    let mut buf = [0u8; 65536];
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        sock.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .ok()?;
        let (n, src) = sock.recv_from(&mut buf).ok()?;
        if n < 8 || buf[0..2] != id {
            continue;
        }
        datagrams += 1;
        let seq = u16::from_be_bytes([buf[2], buf[3]]) as usize;
        let total = u16::from_be_bytes([buf[4], buf[5]]) as usize;
        if parts.is_empty() {
            parts = vec![None; total.max(1)];
        }
        if seq < parts.len() {
            parts[seq] = Some(buf[8..n].to_vec());
        }
        if !parts.iter().all(Option::is_some) {
            continue;
        }
        stream.extend(parts.drain(..).flatten().flatten());
        let complete = if stream.starts_with(b"VALUE ") || stream.is_empty() {
            stream.ends_with(b"END\r\n")
        } else {
            stream.first() == Some(&0x81) || stream.ends_with(b"\r\n")
        };
        if complete {
            return Some(Reply {
                from: src,
                body: stream,
                datagrams,
            });
        }
    }
}

/// One text request over TCP from inside `host`; reads until `done` says the reply is whole.
pub fn tcp_call(
    live: &testbed::Live,
    host: &str,
    target: SocketAddr,
    request: &[u8],
    done: fn(&[u8]) -> bool,
) -> Vec<u8> {
    try_tcp_call(live, host, target, request, done).expect("tcp call")
}

/// [`tcp_call`], with the connection's error (a reset, a timeout) returned.
#[allow(dead_code)]
pub fn try_tcp_call(
    live: &testbed::Live,
    host: &str,
    target: SocketAddr,
    request: &[u8],
    done: fn(&[u8]) -> bool,
) -> std::io::Result<Vec<u8>> {
    let request = request.to_vec();
    live.in_host(host, move || -> std::io::Result<Vec<u8>> {
        let mut s = TcpStream::connect_timeout(&target, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(3)))?;
        s.write_all(&request)?;
        let mut out = Vec::new();
        let mut buf = [0u8; 65536];
        while !done(&out) {
            let n = s.read(&mut buf)?;
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        Ok(out)
    })
    .expect("namespace")
}

pub fn ends_with_end(b: &[u8]) -> bool {
    b.ends_with(b"END\r\n")
}

pub fn ends_with_line(b: &[u8]) -> bool {
    b.ends_with(b"\r\n")
}

/// Whether `server` holds `key`, asked directly over TCP from inside the server's namespace.
pub fn server_value(live: &testbed::Live, server: &str, key: &str) -> Option<Vec<u8>> {
    let ip = live.host(server).expect("server").ip;
    let reply = tcp_call(
        live,
        server,
        SocketAddr::new(ip.into(), 11211),
        format!("get {key}\r\n").as_bytes(),
        ends_with_end,
    );
    if reply == b"END\r\n" {
        return None;
    }
    // VALUE <key> <flags> <bytes>\r\n<data>\r\nEND\r\n
    let header_end = reply.windows(2).position(|w| w == b"\r\n")?;
    let data = &reply[header_end + 2..reply.len() - b"\r\nEND\r\n".len()];
    Some(data.to_vec())
}

/// UDP datagrams delivered to sockets inside a host's namespace, from its own /proc.
pub fn udp_in_datagrams(live: &testbed::Live, host: &str) -> u64 {
    live.in_host(host, || {
        let snmp = std::fs::read_to_string("/proc/thread-self/net/snmp").expect("snmp");
        let mut lines = snmp.lines().filter(|l| l.starts_with("Udp:"));
        let names: Vec<&str> = lines
            .next()
            .expect("Udp header")
            .split_whitespace()
            .collect();
        let values: Vec<&str> = lines
            .next()
            .expect("Udp values")
            .split_whitespace()
            .collect();
        let i = names
            .iter()
            .position(|n| *n == "InDatagrams")
            .expect("InDatagrams");
        values[i].parse::<u64>().expect("number")
    })
    .expect("namespace")
}

/// The switch's status document.
pub fn status(live: &testbed::Live) -> serde_json::Value {
    let (code, body) = testbed::http_get(live.api(), "/api/v1/status").expect("status");
    assert_eq!(code, 200);
    serde_json::from_str(&body).expect("status is JSON")
}

/// Reads through the XDP fast path: once a client has been seen by the switch, its single-key
/// reads are routed by the program in the kernel (the status API's `xdp_frames.routed` moves),
/// answered right, and counted for their servers as the switch counts them.
#[allow(dead_code)]
pub fn check_fast_path(live: &testbed::Live) {
    let st = status(live);
    let d = &st["datapath"];
    assert_eq!(d["xdp"], true, "the XDP fast path is not in use: {d}");
    let xdp_ports = st["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .filter(|p| p["datapath"].as_str().is_some_and(|x| x.starts_with("xdp")))
        .count();
    assert_eq!(
        xdp_ports,
        live.state.hosts.len(),
        "ports with XDP: {}",
        st["ports"]
    );
    assert_eq!(d["unsendable_ports"], serde_json::json!([]), "{d}");
    let counter = |st: &serde_json::Value, name: &str| {
        st["datapath"]["xdp_frames"][name]
            .as_u64()
            .expect("an XDP counter")
    };
    let requests = |st: &serde_json::Value| -> u64 {
        st["pool"]["servers"]
            .as_array()
            .expect("servers")
            .iter()
            .map(|s| s["requests"].as_u64().expect("requests"))
            .sum()
    };
    let ring = default_ring();
    let keys = keys_spanning_servers(&ring, "fast:", 2);
    let vip = vip(live);
    for key in &keys {
        let set = format!("set {key} 0 0 {}\r\n{key}\r\n", key.len());
        let r = udp_call(live, "c1", vip, set.as_bytes(), T_FAST).expect("set");
        assert_eq!(r.body, b"STORED\r\n");
    }
    let get = |host: &str, key: &str| {
        let r = udp_call(live, host, vip, format!("get {key}\r\n").as_bytes(), T_FAST)
            .expect("a reply to a get");
        assert_eq!(
            r.body,
            format!("VALUE {key} 0 {}\r\n{key}\r\nEND\r\n", key.len()).as_bytes()
        );
        assert_eq!(r.from, vip);
    };
    // The switch publishes a sender it has seen every 50 ms: read until the program routes.
    let start = std::time::Instant::now();
    while counter(&status(live), "routed") == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "XDP routed nothing: {}",
            status(live)["datapath"]
        );
        get("c2", &keys[0]);
        std::thread::sleep(Duration::from_millis(20));
    }
    // Both clients are known now; counters reach the status API within 50 ms.
    get("c1", &keys[0]);
    std::thread::sleep(Duration::from_millis(200));
    let before = status(live);
    for _ in 0..5 {
        for key in &keys {
            get("c1", key);
            get("c2", key);
        }
    }
    let n = 10 * keys.len() as u64;
    let start = std::time::Instant::now();
    loop {
        let after = status(live);
        let routed = counter(&after, "routed") - counter(&before, "routed");
        let counted = requests(&after) - requests(&before);
        if routed >= n && counted >= n {
            assert_eq!(routed, n, "the program routed reads that were not sent");
            assert_eq!(
                counted, n,
                "the servers' request counters: {}",
                after["pool"]
            );
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{n} reads: the program routed {routed}, the servers counted {counted}: {}",
            after["datapath"]
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How long a call of [`check_fast_path`] waits for its reply.
const T_FAST: Duration = Duration::from_secs(2);

/// The switch's `/metrics`, checked against the exposition's conventions.
pub fn metrics(live: &testbed::Live) -> String {
    let (code, body) = testbed::http_get(live.api(), "/metrics").expect("metrics");
    assert_eq!(code, 200);
    if let Err(e) = api::metrics::lint(&body) {
        panic!("the switch's /metrics: {e}");
    }
    body
}

pub fn drops(live: &testbed::Live, reason: &str) -> u64 {
    status(live)["counters"]["drops"][reason]
        .as_u64()
        .unwrap_or_else(|| panic!("no drop counter {reason}"))
}

/// The ring kvswitch uses for the default topology, built independently from the names.
pub fn default_ring() -> kv::Ring {
    let servers: Vec<kv::Server> = ["s1", "s2", "s3"]
        .iter()
        .map(|n| kv::Server::new(*n, 1))
        .collect();
    kv::Ring::new(kv::Distribution::Ketama, kv::HashFn::Md5, &servers).expect("ring")
}

pub fn vip(live: &testbed::Live) -> SocketAddr {
    SocketAddr::new(live.state.vip.into(), live.state.vip_port)
}

pub fn ip_of(live: &testbed::Live, host: &str) -> Ipv4Addr {
    live.host(host).expect("host").ip
}

/// Keys that land on each of the three servers, `per` each, in round-robin order.
pub fn keys_spanning_servers(ring: &kv::Ring, prefix: &str, per: usize) -> Vec<String> {
    let mut by_server: Vec<Vec<String>> = vec![Vec::new(); ring.len()];
    let mut i = 0;
    while by_server.iter().any(|v| v.len() < per) {
        let k = format!("{prefix}{i}");
        let s = ring.locate(k.as_bytes());
        if by_server[s].len() < per {
            by_server[s].push(k);
        }
        i += 1;
    }
    let mut out = Vec::new();
    for j in 0..per {
        for v in &by_server {
            out.push(v[j].clone());
        }
    }
    out
}

/// The last lines of the switch's log, for failure messages.
pub fn log_tail(live: &testbed::Live, lines: usize) -> String {
    let text = std::fs::read_to_string(&live.state.kvswitch_log).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The clients of a recorded history, to the VIP: in each of `hosts`, one per transport of
/// `per_host`, in order. A UDP client gives up after `udp_timeout` (a lost datagram stays
/// lost); a TCP one after 3 s, longer than a pool's server timeout, which answers
/// `SERVER_ERROR` first.
pub fn history_clients(
    live: &testbed::Live,
    hosts: &[&str],
    per_host: &[testbed::history_load::Transport],
    udp_timeout: Duration,
) -> Vec<testbed::history_load::Client> {
    use testbed::history_load::{Client, Transport};
    let mut clients = Vec::new();
    for host in hosts {
        let netns = live.host(host).expect("client host").netns.clone();
        for &transport in per_host {
            let timeout = match transport {
                Transport::Udp => udp_timeout,
                Transport::Tcp | Transport::Redis => Duration::from_secs(3),
            };
            clients.push(Client {
                id: clients.len() as u32 + 1,
                transport,
                target: vip(live),
                timeout,
                netns: Some(netns.clone()),
            });
        }
    }
    clients
}

/// Prints what a recorded history did, and fails on any reply memcached never gives.
pub fn recorded_ok(recorded: &testbed::history_load::Recorded) {
    use testbed::history_load::Transport;
    println!(
        "history: {} ops in {:.1?} ({} over UDP, {} over TCP, {} over Redis), {} unanswered, \
         {} errors",
        recorded.ops.len(),
        recorded.elapsed,
        recorded.ops_over(Transport::Udp),
        recorded.ops_over(Transport::Tcp),
        recorded.ops_over(Transport::Redis),
        recorded.timeouts(),
        recorded.server_errors()
    );
    assert!(
        recorded.bad_replies.is_empty(),
        "{} replies memcached would not give, first: {:#?}",
        recorded.bad_replies.len(),
        &recorded.bad_replies[..recorded.bad_replies.len().min(5)]
    );
}

/// Runs the history checker on `ops`, prints its figures, and fails on any read of a value
/// older than an acknowledged write, naming the first ones.
pub fn no_stale_read(ops: &[testbed::history::Op]) {
    let report = testbed::history::check(ops);
    println!("history: {}", report.stats);
    assert!(
        report.ok(),
        "{} reads saw a value older than an acknowledged write; the first:\n{}",
        report.violations.len(),
        report.first_violations(10)
    );
}

/// A host's MAC, as the testbed gave it.
pub fn mac_of(live: &testbed::Live, host: &str) -> wire::ethernet::Mac {
    live.host(host)
        .expect("host")
        .mac
        .parse()
        .expect("a host's MAC")
}

/// A memcached UDP datagram: frame header with `id`, then `text`.
pub fn datagram(id: u16, text: &str) -> Vec<u8> {
    let mut d = vec![0u8; 8];
    d[0..2].copy_from_slice(&id.to_be_bytes());
    d[5] = 1;
    d.extend_from_slice(text.as_bytes());
    d
}

/// Frames the attacker's interface receives that are the honest client's requests: to a
/// server's address or MAC, or carrying the honest keys' prefix from the honest client.
pub fn sniff_diverted(
    netns_ip: Ipv4Addr,
    servers: &[(Ipv4Addr, wire::ethernet::Mac)],
    victim_ip: Ipv4Addr,
    stop: &std::sync::atomic::AtomicBool,
    diverted: &std::sync::atomic::AtomicU64,
) {
    let ifname = interface_of(netns_ip);
    // SAFETY: a packet socket opened, bound to one interface, read into a buffer that outlives
    // each call, and closed; the sockaddr and timeval are fully initialised.
    unsafe {
        let proto = (libc::ETH_P_ALL as u16).to_be();
        let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(proto));
        assert!(fd >= 0, "packet socket");
        let name = std::ffi::CString::new(ifname).expect("name");
        let index = libc::if_nametoindex(name.as_ptr());
        let mut addr: libc::sockaddr_ll = std::mem::zeroed();
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = proto;
        addr.sll_ifindex = index as i32;
        let bound = libc::bind(
            fd,
            (&addr as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        );
        assert_eq!(bound, 0, "bind the packet socket");
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 100_000,
        };
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        );
        let mut buf = vec![0u8; 65_536];
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let n = libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0);
            if n < 34 {
                continue;
            }
            let f = &buf[..n as usize];
            let mut dst_mac = [0u8; 6];
            dst_mac.copy_from_slice(&f[0..6]);
            let ipv4 = f[12..14] == [0x08, 0x00];
            let src_ip = Ipv4Addr::new(f[26], f[27], f[28], f[29]);
            let dst_ip = Ipv4Addr::new(f[30], f[31], f[32], f[33]);
            let to_server = servers
                .iter()
                .any(|(ip, mac)| dst_mac == mac.0 || (ipv4 && dst_ip == *ip));
            if ipv4 && src_ip == victim_ip && to_server {
                diverted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        libc::close(fd);
    }
}

/// The name of the interface holding `ip` in the current namespace.
pub fn interface_of(ip: Ipv4Addr) -> String {
    let out = std::process::Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .expect("ip addr");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find(|l| l.contains(&format!("inet {ip}/")))
        .and_then(|l| l.split_whitespace().nth(1))
        .expect("the interface holding the address")
        .to_string()
}

/// Gives every arc of the ring that `arcs` (a `GET /api/v1/pool/arcs`) shows to `server`,
/// through the switch's API.
pub fn place_every_arc(api: &api::Client, arcs: &serde_json::Value, server: &str) {
    let moves: Vec<serde_json::Value> = arcs["values"]
        .as_array()
        .expect("values")
        .iter()
        .map(|v| serde_json::json!([v, server]))
        .collect();
    let body = serde_json::json!({
        "servers": arcs["servers"],
        "points": arcs["points"],
        "moves": moves,
    });
    api.call("PUT", "/api/v1/pool/placement", Some(&body))
        .expect("placement");
}
