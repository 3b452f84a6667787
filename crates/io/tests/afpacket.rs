//! AF_PACKET ports against real interfaces: a veth pair with one end in a private network
//! namespace, the port on the other end.
//!
//! These tests need root (CAP_NET_ADMIN for namespaces and veth pairs, CAP_NET_RAW for
//! AF_PACKET), `ip` and `python3`; they fail, not skip, without them. Every namespace and
//! interface is named after the process id and the test, and removed by a guard on drop.

use std::io::{BufRead, BufReader, Read};
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kvio::{AfPacket, AfPacketOptions, Batch, Port, FRAME_CAP};

const PORT_IP: Ipv4Addr = Ipv4Addr::new(10, 99, 7, 1);
const NS_IP: Ipv4Addr = Ipv4Addr::new(10, 99, 7, 2);

fn require_root() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "AF_PACKET tests need root (network namespaces, veth pairs, raw sockets); \
         run them as root"
    );
}

/// Runs a command, panicking with its stderr if it fails.
fn run(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn has_tool(name: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn parse_mac(text: &str) -> [u8; 6] {
    let mut mac = [0; 6];
    let parts: Vec<&str> = text.trim().split(':').collect();
    assert_eq!(parts.len(), 6, "bad MAC {text:?}");
    for (b, p) in mac.iter_mut().zip(parts) {
        *b = u8::from_str_radix(p, 16).unwrap();
    }
    mac
}

fn mac_text(mac: [u8; 6]) -> String {
    mac.map(|b| format!("{b:02x}")).join(":")
}

/// A veth pair `kioA<pid><tag>` (root namespace, no address) and `kioB<pid><tag>` (inside
/// namespace `kio-ns-<pid>-<tag>`, address 10.99.7.2/24), both up with IPv6 off. Removed on drop.
struct Net {
    ns: String,
    root_if: String,
    ns_if: String,
}

impl Net {
    fn new(tag: &str) -> Net {
        require_root();
        assert!(has_tool("ip"), "these tests need iproute2's `ip`");
        assert!(has_tool("python3"), "these tests need python3");
        let pid = std::process::id();
        let net = Net {
            ns: format!("kio-ns-{pid}-{tag}"),
            root_if: format!("kioA{pid}{tag}"),
            ns_if: format!("kioB{pid}{tag}"),
        };
        run(&["ip", "netns", "add", &net.ns]);
        run(&[
            "ip",
            "link",
            "add",
            &net.root_if,
            "type",
            "veth",
            "peer",
            "name",
            &net.ns_if,
        ]);
        run(&["ip", "link", "set", &net.ns_if, "netns", &net.ns]);
        // IPv6 would add router solicitations and MLD reports to what the port receives.
        if Path::new("/proc/sys/net/ipv6").exists() {
            let knob = format!("/proc/sys/net/ipv6/conf/{}/disable_ipv6", net.root_if);
            std::fs::write(&knob, "1").unwrap_or_else(|e| panic!("writing {knob}: {e}"));
            net.exec(&[
                "sysctl",
                "-qw",
                &format!("net.ipv6.conf.{}.disable_ipv6=1", net.ns_if),
            ]);
        }
        let cidr = format!("{NS_IP}/24");
        run(&["ip", "-n", &net.ns, "addr", "add", &cidr, "dev", &net.ns_if]);
        run(&["ip", "-n", &net.ns, "link", "set", "lo", "up"]);
        run(&["ip", "-n", &net.ns, "link", "set", &net.ns_if, "up"]);
        run(&["ip", "link", "set", &net.root_if, "up"]);
        // The port answers no ARP, so tell the namespace where 10.99.7.1 is.
        let port_mac = mac_text(net.root_mac());
        run(&[
            "ip",
            "-n",
            &net.ns,
            "neigh",
            "replace",
            &PORT_IP.to_string(),
            "lladdr",
            &port_mac,
            "dev",
            &net.ns_if,
            "nud",
            "permanent",
        ]);
        net
    }

    /// `ip netns exec <ns> args...`
    fn exec(&self, args: &[&str]) -> String {
        let mut all = vec!["ip", "netns", "exec", &self.ns];
        all.extend_from_slice(args);
        run(&all)
    }

    fn root_mac(&self) -> [u8; 6] {
        parse_mac(&run(&[
            "cat",
            &format!("/sys/class/net/{}/address", self.root_if),
        ]))
    }

    fn ns_mac(&self) -> [u8; 6] {
        parse_mac(&self.exec(&["cat", &format!("/sys/class/net/{}/address", self.ns_if)]))
    }

    fn root_flags(&self) -> u32 {
        let text = run(&["cat", &format!("/sys/class/net/{}/flags", self.root_if)]);
        u32::from_str_radix(text.trim().trim_start_matches("0x"), 16).unwrap()
    }

    /// Sends one UDP datagram per payload length from inside the namespace to 10.99.7.1:9999.
    fn send_udp_from_ns(&self, payload_lens: &[usize]) {
        let lens: Vec<String> = payload_lens.iter().map(usize::to_string).collect();
        let script = format!(
            "import socket\n\
             s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
             s.bind(('{NS_IP}', 5555))\n\
             for n in [{}]:\n    s.sendto(bytes([0x6b]) * n, ('{PORT_IP}', 9999))\n",
            lens.join(", ")
        );
        self.exec(&["python3", "-c", &script]);
    }

    /// Opens the port with default options, which receive through the ring.
    fn open_port(&self) -> AfPacket {
        let port = self.open_port_with(&AfPacketOptions::default());
        assert!(port.uses_rx_ring(), "the receive ring could not be set up");
        port
    }

    fn open_port_with(&self, opts: &AfPacketOptions) -> AfPacket {
        AfPacket::open(&self.root_if, opts)
            .unwrap_or_else(|e| panic!("opening {}: {e}", self.root_if))
    }

    /// Opens the port receiving with `recvmmsg` instead of the ring.
    fn open_port_without_ring(&self) -> AfPacket {
        let opts = AfPacketOptions {
            rx_ring: false,
            ..AfPacketOptions::default()
        };
        let port = self.open_port_with(&opts);
        assert!(!port.uses_rx_ring());
        port
    }

    /// Sends `count` UDP datagrams from inside the namespace to 10.99.7.1:9999; datagram `i`
    /// carries `seq_payload(i)`.
    fn send_seq_burst_from_ns(&self, count: usize) {
        let script = format!(
            "import socket, struct\n\
             s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
             s.bind(('{NS_IP}', 5555))\n\
             for i in range({count}):\n    \
             s.sendto(struct.pack('>I', i) + bytes([i & 0xff]) * (i * 7 % 1000), \
             ('{PORT_IP}', 9999))\n"
        );
        self.exec(&["python3", "-c", &script]);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Deleting the namespace destroys the end inside it, and with it the pair; the explicit
        // link delete covers a failure before the move.
        for args in [
            vec!["ip", "netns", "del", &self.ns],
            vec!["ip", "link", "del", &self.root_if],
        ] {
            let _ = Command::new(args[0])
                .args(&args[1..])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// A child process killed (by its own pid) and reaped on drop.
struct Guarded(Child);

impl Drop for Guarded {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn ones_sum(data: &[u8], mut sum: u32) -> u32 {
    for chunk in data.chunks(2) {
        let word = if chunk.len() == 2 {
            u16::from_be_bytes([chunk[0], chunk[1]])
        } else {
            u16::from_be_bytes([chunk[0], 0])
        };
        sum += u32::from(word);
    }
    sum
}

fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// Ethernet + IPv4 + UDP with a correct IPv4 header checksum and a zero (absent) UDP checksum.
fn udp_frame(
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    payload: &[u8],
) -> Vec<u8> {
    let udp_len = 8 + payload.len();
    let ip_len = 20 + udp_len;
    let mut f = Vec::with_capacity(14 + ip_len);
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&[0x08, 0x00]);
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&(ip_len as u16).to_be_bytes());
    ip[6] = 0x40; // don't fragment
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    let csum = !fold(ones_sum(&ip, 0));
    ip[10..12].copy_from_slice(&csum.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&4000u16.to_be_bytes());
    f.extend_from_slice(&7777u16.to_be_bytes());
    f.extend_from_slice(&(udp_len as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    f
}

/// If `frame` is IPv4/UDP, its destination port.
fn udp_dst_port(frame: &[u8]) -> Option<u16> {
    if frame.len() < 42 || frame[12..14] != [0x08, 0x00] || frame[23] != 17 {
        return None;
    }
    let ihl = usize::from(frame[14] & 0x0f) * 4;
    let udp = frame.get(14 + ihl..14 + ihl + 4)?;
    Some(u16::from_be_bytes([udp[2], udp[3]]))
}

/// Whether the UDP checksum of an IPv4/UDP frame (20-byte IP header) verifies.
fn udp_checksum_ok(frame: &[u8]) -> bool {
    let ip = &frame[14..34];
    let udp = &frame[34..];
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&ip[12..20]);
    pseudo.extend_from_slice(&[0, 17]);
    pseudo.extend_from_slice(&(udp.len() as u16).to_be_bytes());
    fold(ones_sum(udp, ones_sum(&pseudo, 0))) == 0xffff
}

/// Receives until `want` frames to UDP port 9999 have arrived or 3 s pass. Returns those
/// frames with their checksum flags, and the size of every non-empty batch seen.
fn collect_udp(
    port: &mut AfPacket,
    batch: &mut Batch,
    want: usize,
) -> (Vec<(Vec<u8>, bool)>, Vec<usize>) {
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut frames = Vec::new();
    let mut batches = Vec::new();
    let mut ready = Vec::new();
    while frames.len() < want && Instant::now() < deadline {
        kvio::wait_readable(&[port.fd()], Duration::from_millis(100), &mut ready).unwrap();
        let n = port.recv(batch).unwrap();
        assert_eq!(n, batch.len());
        if n > 0 {
            batches.push(n);
        }
        for i in 0..n {
            if udp_dst_port(batch.frame(i)) == Some(9999) {
                frames.push((batch.frame(i).to_vec(), batch.csum_not_ready(i)));
            }
        }
    }
    (frames, batches)
}

#[test]
fn missing_interface_is_an_error_naming_it() {
    let name = format!("kioX{}", std::process::id());
    let err = AfPacket::open(&name, &AfPacketOptions::default()).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    assert!(
        err.to_string().contains(&name),
        "error does not name the interface: {err}"
    );
}

#[test]
fn frames_sent_by_the_port_arrive_in_the_namespace() {
    let net = Net::new("t");
    let mut port = net.open_port();
    assert_eq!(port.name(), net.root_if);
    assert_eq!(port.mac(), net.root_mac());
    assert!(port.ifindex() > 0);
    assert_ne!(
        net.root_flags() & libc::IFF_PROMISC as u32,
        0,
        "port did not enable promiscuous mode"
    );

    let script = format!(
        "import socket\n\
         s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         s.bind(('{NS_IP}', 7777))\n\
         s.settimeout(3)\n\
         print('ready', flush=True)\n\
         for _ in range(4):\n    d, a = s.recvfrom(4096)\n    print(a[0], d.decode(), flush=True)\n"
    );
    let mut child = Guarded(
        Command::new("ip")
            .args(["netns", "exec", &net.ns, "python3", "-c", &script])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning the receiver"),
    );
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    let first = lines.next().map(|l| l.unwrap());
    assert_eq!(
        first.as_deref(),
        Some("ready"),
        "receiver failed: {}",
        stderr_of(&mut child)
    );

    let payloads: Vec<String> = (0..4).map(|i| format!("kvswitch-{i}")).collect();
    let frames: Vec<Vec<u8>> = payloads
        .iter()
        .map(|p| udp_frame(net.ns_mac(), port.mac(), PORT_IP, NS_IP, p.as_bytes()))
        .collect();
    let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    assert_eq!(port.send(&refs).unwrap(), 4);

    let got: Vec<String> = lines.by_ref().take(4).map(|l| l.unwrap()).collect();
    let want: Vec<String> = payloads.iter().map(|p| format!("{PORT_IP} {p}")).collect();
    assert_eq!(got, want, "receiver stderr: {}", stderr_of(&mut child));

    let st = port.stats();
    assert_eq!(st.tx_packets, 4);
    assert_eq!(
        st.tx_bytes,
        refs.iter().map(|f| f.len() as u64).sum::<u64>()
    );
    assert_eq!(st.tx_dropped, 0);

    // The port must not read back what it sent.
    let mut batch = Batch::new(16);
    std::thread::sleep(Duration::from_millis(50));
    port.recv(&mut batch).unwrap();
    assert!(
        batch.iter().all(|f| udp_dst_port(f) != Some(7777)),
        "port received its own transmissions"
    );

    // Closing the socket ends the membership. Another test thread forking at that moment
    // briefly holds a copy of the descriptor until its child execs, so allow a short delay.
    drop(port);
    let deadline = Instant::now() + Duration::from_secs(1);
    while net.root_flags() & libc::IFF_PROMISC as u32 != 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        net.root_flags() & libc::IFF_PROMISC as u32,
        0,
        "promiscuous mode outlived the port"
    );
}

fn stderr_of(child: &mut Guarded) -> String {
    let _ = child.0.kill();
    let mut text = String::new();
    if let Some(mut e) = child.0.stderr.take() {
        let _ = e.read_to_string(&mut text);
    }
    text
}

#[test]
fn frames_from_the_namespace_arrive_in_batches() {
    let net = Net::new("r");
    let port = net.open_port();
    frames_arrive_in_batches(&net, port);
}

#[test]
fn frames_from_the_namespace_arrive_in_batches_without_ring() {
    let net = Net::new("m");
    let port = net.open_port_without_ring();
    frames_arrive_in_batches(&net, port);
}

fn frames_arrive_in_batches(net: &Net, mut port: AfPacket) {
    let mut batch = Batch::new(3);
    let sizes = [10, 100, 1000, 1400];
    let want_lens: Vec<usize> = sizes.iter().map(|n| 14 + 20 + 8 + n).collect();

    // veth offloads checksums by default: the frames cross with the UDP checksum unfinished.
    net.send_udp_from_ns(&sizes);
    let (frames, batches) = collect_udp(&mut port, &mut batch, sizes.len());
    assert_eq!(
        frames.iter().map(|(f, _)| f.len()).collect::<Vec<_>>(),
        want_lens
    );
    assert!(
        batches.iter().all(|&n| n <= 3),
        "batch overfilled: {batches:?}"
    );
    assert!(
        batches.iter().any(|&n| n >= 2),
        "no recv returned more than one frame: {batches:?}"
    );
    for (f, csum_not_ready) in &frames {
        assert_eq!(f[0..6], net.root_mac());
        assert_eq!(f[6..12], net.ns_mac());
        assert!(
            *csum_not_ready,
            "expected an offloaded checksum on a {}-byte frame",
            f.len()
        );
    }
    let st = port.stats();
    assert!(st.rx_packets >= 4 && st.rx_bytes >= want_lens.iter().sum::<usize>() as u64);
    assert_eq!(st.rx_errors, 0);

    if !has_tool("ethtool") {
        eprintln!("ethtool not found: the checksum-complete case is not exercised");
        return;
    }
    net.exec(&["ethtool", "-K", &net.ns_if, "tx", "off"]);
    net.send_udp_from_ns(&sizes);
    let (frames, _) = collect_udp(&mut port, &mut batch, sizes.len());
    assert_eq!(
        frames.iter().map(|(f, _)| f.len()).collect::<Vec<_>>(),
        want_lens
    );
    for (f, csum_not_ready) in &frames {
        assert!(!csum_not_ready);
        assert!(
            udp_checksum_ok(f),
            "bad UDP checksum on a {}-byte frame",
            f.len()
        );
    }
}

/// The payload `Net::send_seq_burst_from_ns` sends in datagram `i`.
fn seq_payload(i: usize) -> Vec<u8> {
    let mut p = (i as u32).to_be_bytes().to_vec();
    p.resize(4 + i * 7 % 1000, i as u8);
    p
}

#[test]
fn a_burst_arrives_complete_and_in_order() {
    let net = Net::new("b");
    let port = net.open_port();
    burst_arrives_complete_and_in_order(&net, port);
}

#[test]
fn a_burst_arrives_complete_and_in_order_without_ring() {
    let net = Net::new("n");
    let port = net.open_port_without_ring();
    burst_arrives_complete_and_in_order(&net, port);
}

fn burst_arrives_complete_and_in_order(net: &Net, mut port: AfPacket) {
    const COUNT: usize = 500;
    const BATCH: usize = 64;
    let ring = port.uses_rx_ring();
    if ring {
        assert!(!port.rx_ready(), "frames waiting before any were sent");
    }
    net.send_seq_burst_from_ns(COUNT);

    // Everything was sent before the first receive; wait for the first frame to land.
    let mut ready = Vec::new();
    kvio::wait_readable(&[port.fd()], Duration::from_secs(1), &mut ready).unwrap();
    assert_eq!(ready, [0], "the port did not poll readable");
    if ring {
        assert!(port.rx_ready(), "frames wait but rx_ready() is false");
    }

    let mut batch = Batch::new(BATCH);
    let mut payloads = Vec::new();
    let mut calls = 0;
    let deadline = Instant::now() + Duration::from_secs(3);
    while payloads.len() < COUNT && Instant::now() < deadline {
        let n = port.recv(&mut batch).unwrap();
        assert!(n <= BATCH && n == batch.len());
        if n == 0 {
            kvio::wait_readable(&[port.fd()], Duration::from_millis(100), &mut ready).unwrap();
            continue;
        }
        calls += 1;
        for f in batch.iter() {
            if udp_dst_port(f) == Some(9999) {
                let ip_len = usize::from(u16::from_be_bytes([f[16], f[17]]));
                assert_eq!(
                    f.len(),
                    14 + ip_len,
                    "frame length disagrees with IP length"
                );
                payloads.push(f[42..].to_vec());
            }
        }
    }
    assert_eq!(payloads.len(), COUNT, "frames lost");
    assert!(calls >= COUNT.div_ceil(BATCH), "only {calls} receive calls");
    for (i, p) in payloads.iter().enumerate() {
        assert!(
            *p == seq_payload(i),
            "datagram {i} differs: {} bytes, sequence {:?}",
            p.len(),
            p.get(..4)
        );
    }

    assert_eq!(port.recv(&mut batch).unwrap(), 0, "unexpected extra frames");
    if ring {
        assert!(!port.rx_ready(), "rx_ready() still true after draining");
    }
    let st = port.stats();
    assert_eq!((st.rx_errors, st.rx_dropped), (0, 0));
    assert!(st.rx_packets >= COUNT as u64);
}

#[test]
fn oversized_frames_are_dropped_and_counted() {
    let net = Net::new("o");
    run(&["ip", "link", "set", &net.root_if, "mtu", "4000"]);
    run(&[
        "ip", "-n", &net.ns, "link", "set", &net.ns_if, "mtu", "4000",
    ]);
    let mut port = net.open_port();
    let mut batch = Batch::new(8);

    let big = FRAME_CAP; // payload alone fills a slot, so the frame cannot fit
    net.send_udp_from_ns(&[big, 20]);
    let (frames, _) = collect_udp(&mut port, &mut batch, 1);
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].0.len(), 14 + 20 + 8 + 20);
    assert_eq!(port.stats().rx_errors, 1);
}

#[test]
fn unsendable_frames_are_consumed_and_counted() {
    let net = Net::new("d");
    let mut port = net.open_port();
    let short = [0u8; 10];
    let over_mtu = udp_frame(net.ns_mac(), port.mac(), PORT_IP, NS_IP, &[0; 1600]);
    let good = udp_frame(net.ns_mac(), port.mac(), PORT_IP, NS_IP, b"ok");
    assert_eq!(port.send(&[&short, &over_mtu, &good]).unwrap(), 3);
    let st = port.stats();
    assert_eq!((st.tx_packets, st.tx_dropped), (1, 2));
}
