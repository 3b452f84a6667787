//! Routing by key-location header, end to end, for an application that is not memcached: DNS.
//! Each of the testbed's three servers runs Debian's dnsmasq, unchanged, on port 5300 with a
//! hosts file holding only the names the pool's ring gives it (a name's key is its wire form,
//! the labels up to the zero that ends them). Clients ask the VIP's keyed port 5300 for every
//! name three ways: with the Rust crate (`keyloc::KeyedSocket`), with the Python module, and
//! with dig, unchanged, under the LD_PRELOAD shim. A server asked for a name it does not hold
//! answers REFUSED, so every right address is a name routed to its server, with the header
//! gone before dnsmasq read the query. A query without the header is dropped and counted.

mod common;

use std::io::Write;
use std::net::{SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const PORT: u16 = 5300;
const NAMES: usize = 24;
/// How long one query waits for its answer.
const WAIT: Duration = Duration::from_secs(2);

/// dnsmasq on each server, killed (by PID) and reaped when the test ends however it ends.
struct Servers(Vec<Child>);

impl Drop for Servers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The `i`th name and the address it resolves to.
fn name(i: usize) -> (String, [u8; 4]) {
    (
        format!("h{i}.shard.test"),
        [10, 200, (i / 200) as u8, (i % 200) as u8 + 1],
    )
}

/// A name in DNS's wire form without its final zero: the key the shim and the clients point
/// the header at.
fn wire_name(name: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for label in name.split('.') {
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out
}

/// A query for `name`'s A record, id `id`, recursion desired, nothing else.
fn query(id: u16, name: &str) -> Vec<u8> {
    let mut q = id.to_be_bytes().to_vec();
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    q.extend_from_slice(&wire_name(name));
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

/// The address in an answer to [`query`]: one A record, which ends the reply. `None` for
/// anything else (REFUSED from a server that does not hold the name, above all).
fn answer(reply: &[u8], id: u16) -> Option<[u8; 4]> {
    let ok = reply.len() > 16
        && reply[..2] == id.to_be_bytes()
        && reply[3] & 0x0f == 0
        && reply[6..8] == [0, 1];
    ok.then(|| reply[reply.len() - 4..].try_into().expect("four bytes"))
}

fn shim() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new("bash")
        .arg(root.join("scripts/keyloc-shim.sh"))
        .output()
        .expect("scripts/keyloc-shim.sh runs");
    assert!(
        out.status.success(),
        "building the shim: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).expect("a path").trim())
}

/// Starts dnsmasq on every server with the names the ring gives it; waits until each answers
/// one of its names asked directly.
fn start_dns(live: &testbed::Live, dir: &Path) -> Servers {
    let ring = default_ring();
    let mut servers = Servers(Vec::new());
    let mut first_of = [None, None, None];
    for (s, host) in ["s1", "s2", "s3"].iter().enumerate() {
        let hosts = dir.join(format!("{host}.hosts"));
        let mut f = std::fs::File::create(&hosts).expect("a hosts file");
        for i in 0..NAMES {
            let (n, addr) = name(i);
            if ring.locate(&wire_name(&n)) == s {
                writeln!(f, "{} {n}", std::net::Ipv4Addr::from(addr)).expect("write");
                first_of[s].get_or_insert(i);
            }
        }
        let child = live
            .exec(host, "dnsmasq")
            .args([
                "--keep-in-foreground",
                "--conf-file=/dev/null",
                "--no-resolv",
            ])
            .args([
                "--no-hosts",
                "--bind-interfaces",
                "--user=root",
                "--pid-file",
            ])
            .arg(format!("--port={PORT}"))
            .arg(format!("--listen-address={}", ip_of(live, host)))
            .arg(format!("--addn-hosts={}", hosts.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("dnsmasq starts (scripts/setup.sh installs it)");
        servers.0.push(child);
    }
    for (s, host) in ["s1", "s2", "s3"].iter().enumerate() {
        let i = first_of[s].expect("the ring gives every server a name");
        let target = SocketAddr::new(ip_of(live, host).into(), PORT);
        let (n, addr) = name(i);
        let start = Instant::now();
        loop {
            let got = live
                .in_host(host, || {
                    let sock = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
                    sock.set_read_timeout(Some(Duration::from_millis(200)))
                        .ok()?;
                    sock.send_to(&query(9, &n), target).ok()?;
                    let mut buf = [0u8; 512];
                    let len = sock.recv(&mut buf).ok()?;
                    answer(&buf[..len], 9)
                })
                .expect("server namespace");
            if got == Some(addr) {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "dnsmasq on {host} did not answer {n}"
            );
        }
    }
    servers
}

#[test]
fn an_unmodified_dns_service_is_sharded_by_name_through_the_vip() {
    let live = testbed_with("kkey", "l3", false, |o| {
        o.vip_config = Some(format!("keyed_ports = [{PORT}]"));
    });
    let dir = live.state.work_dir.join("dns");
    std::fs::create_dir_all(&dir).expect("a directory for the hosts files");
    let _dns = start_dns(&live, &dir);
    let vip = SocketAddrV4::new(live.state.vip, PORT);
    let bad_before = drops(&live, "bad_key_header");

    // The Rust crate, from c1: every name answered with its address, from the VIP.
    let answers = live
        .in_host("c1", move || {
            let sock = keyloc::KeyedSocket::connect("0.0.0.0:0", vip).expect("a socket");
            sock.socket().set_read_timeout(Some(WAIT)).expect("timeout");
            (0..NAMES)
                .map(|i| {
                    let (n, _) = name(i);
                    let q = query(i as u16, &n);
                    sock.send(&q, 12..12 + wire_name(&n).len()).expect("send");
                    let mut buf = [0u8; 512];
                    let len = sock.recv(&mut buf).unwrap_or(0);
                    answer(&buf[..len], i as u16)
                })
                .collect::<Vec<_>>()
        })
        .expect("client namespace");
    for (i, got) in answers.iter().enumerate() {
        assert_eq!(
            *got,
            Some(name(i).1),
            "{} through the Rust crate",
            name(i).0
        );
    }

    // The Python module, from c2.
    let module = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../keyloc");
    let script = format!(
        r#"
import struct, kvswitch_keyloc as kl
def wire(n): return b"".join(bytes([len(l)]) + l.encode() for l in n.split("."))
s = kl.KeyedSocket(("{ip}", {PORT}), timeout={wait})
for i in range({NAMES}):
    n = "h%d.shard.test" % i
    q = struct.pack(">HHHHHH", i, 0x0100, 1, 0, 0, 0) + wire(n) + b"\0\0\1\0\1"
    s.send(q, 12, 12 + len(wire(n)))
    r = s.recv(512)
    ok = r[:2] == struct.pack(">H", i) and r[3] & 15 == 0 and r[6:8] == b"\0\1"
    print(n, ".".join(map(str, r[-4:])) if ok else "-")
"#,
        ip = live.state.vip,
        wait = WAIT.as_secs(),
    );
    let out = live
        .exec("c2", "/usr/bin/python3")
        .args(["-c", &script])
        .env("PYTHONPATH", &module)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "the Python client: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = String::from_utf8_lossy(&out.stdout).into_owned();
    for i in 0..NAMES {
        let (n, addr) = name(i);
        let want = format!("{n} {}", std::net::Ipv4Addr::from(addr));
        assert!(
            lines.lines().any(|l| l == want),
            "{want} from Python: {lines}"
        );
    }

    // dig, unchanged, under the shim (the name is from byte 12 to the zero that ends it).
    let shim = shim();
    let dig = |host: &str, n: &str, shimmed: bool| {
        let mut cmd = live.exec(host, "dig");
        cmd.args(["+short", "+tries=1", "+time=2", "-p", &PORT.to_string()])
            .arg(format!("@{}", live.state.vip))
            .arg(n);
        if shimmed {
            cmd.env("LD_PRELOAD", &shim)
                .env("KVSWITCH_KEYLOC", format!("{PORT}:12:@00"));
        }
        let out = cmd
            .output()
            .expect("dig runs (scripts/setup.sh installs it)");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    for i in (0..NAMES).step_by(5) {
        let (n, addr) = name(i);
        assert_eq!(
            dig("c1", &n, true),
            std::net::Ipv4Addr::from(addr).to_string(),
            "{n} with dig under the shim"
        );
    }

    // Without the header, a query is dropped and counted, never forwarded.
    let (n, _) = name(0);
    let answered = dig("c2", &n, false);
    assert!(
        !answered.chars().next().is_some_and(|c| c.is_ascii_digit()),
        "a query without a header was answered: {answered}"
    );
    assert!(drops(&live, "bad_key_header") > bad_before);

    // Counted as keyed requests (what the XDP program routed reaches the switch's counters
    // within 50 ms), and the program routed some itself.
    let sent = (2 * NAMES + NAMES.div_ceil(5) + 1) as u64;
    let start = Instant::now();
    let st = loop {
        let st = status(&live);
        let keyed = st["counters"]["keyed_requests"]
            .as_u64()
            .expect("keyed_requests");
        if keyed >= sent {
            assert_eq!(keyed, sent, "keyed requests counted that were not sent");
            break st;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{sent} keyed requests sent, {keyed} counted: {}",
            st["datapath"]
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let m = metrics(&live);
    assert!(m.contains("kvswitch_keyed_requests_total"), "{m}");
    if st["datapath"]["xdp"] == true {
        let routed = st["datapath"]["xdp_frames"]["routed"].as_u64().unwrap_or(0);
        assert!(
            routed > 0,
            "the XDP program routed no keyed query: {}",
            st["datapath"]
        );
    }
}
