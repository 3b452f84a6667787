//! Testbed tests. The ones that build networks need root (namespaces, veth pairs, setns); each
//! uses its own prefix so they run in parallel without touching each other.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::Duration;

use testbed::{
    default_state_path, down, in_netns, memcached_version, sweep, Live, Mode, Role, State,
    Topology, UpOptions,
};

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "these tests create network namespaces and veth pairs and must run as root"
    );
}

/// Clears whatever an earlier, interrupted run with this prefix left behind.
fn fresh(prefix: &str) -> UpOptions {
    require_root();
    down(&default_state_path(prefix)).expect("removing an old testbed");
    sweep(prefix).expect("sweeping old namespaces");
    UpOptions {
        prefix: prefix.to_string(),
        ..UpOptions::default()
    }
}

fn names_with_prefix(prefix: &str) -> Vec<String> {
    let tag = format!("{prefix}-");
    let mut found = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/var/run/netns") {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(&tag) {
                found.push(format!("netns {name}"));
            }
        }
    }
    for e in std::fs::read_dir("/sys/class/net").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(&tag) {
            found.push(format!("link {name}"));
        }
    }
    found
}

fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(") ")
            .is_some_and(|(_, r)| r.starts_with('Z')),
        Err(_) => false,
    }
}

fn all_pids(state: &State) -> Vec<u32> {
    state.procs.iter().map(|p| p.pid).collect()
}

fn assert_gone(prefix: &str, state_path: &Path, work_dir: &Path, pids: &[u32]) {
    assert_eq!(names_with_prefix(prefix), Vec::<String>::new());
    for &pid in pids {
        assert!(!alive(pid), "pid {pid} still alive");
    }
    assert!(!state_path.exists(), "state file left behind");
    assert!(!work_dir.exists(), "work directory left behind");
}

fn ip(args: &[&str]) {
    let st = std::process::Command::new("ip")
        .args(args)
        .status()
        .unwrap();
    assert!(st.success(), "ip {args:?} failed");
}

/// A Linux bridge joining the switch-side ends, standing in for kvswitch (or any link made by
/// a test); removed on drop.
struct Bridge(String);

impl Bridge {
    fn new(name: &str, live: &Live) -> Bridge {
        let _ = std::process::Command::new("ip")
            .args(["link", "del", name])
            .stderr(std::process::Stdio::null())
            .status();
        ip(&["link", "add", name, "type", "bridge"]);
        let br = Bridge(name.to_string());
        for h in &live.state.hosts {
            ip(&["link", "set", "dev", &h.switch_if, "master", name]);
        }
        ip(&["link", "set", "dev", name, "up"]);
        br
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.0])
            .status();
    }
}

/// Sends one memcached text request and reads until the reply ends with `end`.
fn mc(addr: SocketAddr, request: &[u8], end: &[u8]) -> String {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s.write_all(request).unwrap();
    let mut reply = Vec::new();
    let mut buf = [0u8; 1024];
    while !reply.ends_with(end) {
        let n = s.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "connection closed; got {:?}",
            String::from_utf8_lossy(&reply)
        );
        reply.extend_from_slice(&buf[..n]);
    }
    String::from_utf8(reply).unwrap()
}

#[test]
fn parses_default_and_custom_topologies() {
    let d = Topology::default_topology();
    assert_eq!(d.hosts.len(), 5);
    assert_eq!(d.servers().count(), 3);
    assert_eq!(d.clients().next().unwrap().name, "c1");
    assert_eq!(d.vip.to_string(), "10.77.0.100");
    assert_eq!(d.host_ip(2).to_string(), "10.77.0.3");

    let text = r#"
name = "small"
subnet = "192.168.50.0/26"
vip = "192.168.50.60"
mode = "l2"
distribution = "modula"
hash = "fnv1a_64"
[[hosts]]
name = "client"
role = "client"
[[hosts]]
name = "big"
role = "server"
weight = 3
memcached_args = ["-c", "512"]
"#;
    let t = Topology::parse(text, "small.toml").unwrap();
    assert_eq!(t.name, "small");
    assert_eq!(t.mode, Mode::L2);
    assert_eq!(t.distribution, "modula");
    assert_eq!(t.hash, "fnv1a_64");
    assert_eq!(t.vip.to_string(), "192.168.50.60");
    assert_eq!(t.hosts[1].role, Role::Server);
    assert_eq!(t.hosts[1].weight, 3);
    assert_eq!(t.hosts[1].memcached_args, vec!["-c", "512"]);
    assert_eq!(t.host_ip(1).to_string(), "192.168.50.2");

    let dir = std::env::temp_dir().join(format!("kvs-topo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("small.toml");
    std::fs::write(&file, text).unwrap();
    assert_eq!(Topology::from_file(&file).unwrap(), t);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn errors_name_file_and_key() {
    let server = "[[hosts]]\nname = \"s1\"\nrole = \"server\"\n";
    let cases: &[(&str, String, &[&str])] = &[
        (
            "duplicate host",
            format!("{server}{server}"),
            &["hosts[1].name", "duplicate", "\"s1\""],
        ),
        (
            "name too long",
            "[[hosts]]\nname = \"averylongname\"\nrole = \"server\"\n".to_string(),
            &["hosts[0].name", "too long", "interface name"],
        ),
        (
            "unknown role",
            format!("{server}[[hosts]]\nname = \"x\"\nrole = \"router\"\n"),
            &["hosts[1].role", "unknown role", "\"router\""],
        ),
        (
            "bad subnet",
            format!("subnet = \"10.77.0.1/24\"\n{server}"),
            &["subnet", "bad subnet", "host bits"],
        ),
        (
            "subnet not an address",
            format!("subnet = \"ten/8\"\n{server}"),
            &["subnet", "not an IPv4 address"],
        ),
        (
            "vip outside subnet",
            format!("vip = \"10.0.0.1\"\n{server}"),
            &["vip", "10.77.0.0/24"],
        ),
        (
            "vip on a host",
            format!("vip = \"10.77.0.1\"\n{server}"),
            &["vip", "\"s1\""],
        ),
        (
            "unknown mode",
            format!("mode = \"l4\"\n{server}"),
            &["mode", "\"l4\""],
        ),
        (
            "unknown hash",
            format!("hash = \"sha1\"\n{server}"),
            &["hash", "\"sha1\""],
        ),
        (
            "no servers",
            "[[hosts]]\nname = \"c1\"\nrole = \"client\"\n".to_string(),
            &["hosts", "server"],
        ),
        (
            "weight on client",
            format!("{server}[[hosts]]\nname = \"c1\"\nrole = \"client\"\nweight = 2\n"),
            &["hosts[1].weight"],
        ),
        (
            "zero weight",
            "[[hosts]]\nname = \"s1\"\nrole = \"server\"\nweight = 0\n".to_string(),
            &["hosts[0].weight"],
        ),
        (
            "unknown key",
            format!("{server}colour = \"blue\"\n"),
            &["colour"],
        ),
        (
            "wrong type",
            "[[hosts]]\nname = \"s1\"\nrole = \"server\"\nweight = \"heavy\"\n".to_string(),
            &["weight"],
        ),
    ];
    for (what, text, needles) in cases {
        let err = match Topology::parse(text, "bad.toml") {
            Ok(_) => panic!("{what}: parsed"),
            Err(e) => format!("{e:#}"),
        };
        assert!(err.starts_with("bad.toml: "), "{what}: {err}");
        for n in *needles {
            assert!(err.contains(n), "{what}: {err:?} lacks {n:?}");
        }
    }
    let missing = Topology::from_file("/nonexistent/topo.toml").unwrap_err();
    assert!(format!("{missing:#}").contains("/nonexistent/topo.toml"));
}

#[test]
fn up_serves_memcached_and_down_removes_everything() {
    let prefix = "tb1";
    let opts = fresh(prefix);
    let live = testbed::up(&Topology::default_topology(), &opts).unwrap();
    let state_path = live.state_path().to_path_buf();
    let work_dir = live.state.work_dir.clone();
    let pids = all_pids(&live.state);
    assert_eq!(pids.len(), 4, "three memcached and one nutcracker");
    assert!(live.state.complete);
    assert_eq!(live.state.kvswitch_pid, None);

    // The state file is the live value, as JSON with the documented keys.
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state_path).unwrap()).unwrap();
    for key in [
        "prefix",
        "mode",
        "vip",
        "vip_mac",
        "api",
        "config_path",
        "hosts",
        "nutcracker",
    ] {
        assert!(json.get(key).is_some(), "state lacks {key}");
    }
    assert_eq!(json["hosts"][2]["switch_if"], "tb1-s1");
    assert_eq!(json["hosts"][2]["role"], "server");
    assert_eq!(json["nutcracker"]["listen"], "127.0.0.1:22121");
    assert_eq!(State::load(&state_path).unwrap(), live.state);
    assert!(live.state.config_path.exists());

    for h in &live.state.hosts {
        assert!(Path::new("/var/run/netns").join(&h.netns).exists());
        assert!(Path::new("/sys/class/net").join(&h.switch_if).exists());
        let mac = live
            .exec(&h.name, "cat")
            .arg("/sys/class/net/eth0/address")
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&mac.stdout).trim(), h.mac);
    }
    for s in live.servers() {
        let addr = SocketAddr::from((s.ip, 11211));
        let v = in_netns(&s.netns, || memcached_version(addr))
            .unwrap()
            .unwrap();
        assert!(v.starts_with("VERSION 1."), "{v}");
    }
    let nut = live.state.nutcracker.clone().unwrap();
    assert_eq!(nut.host, "c1");
    assert!(alive(nut.pid.unwrap()));

    // Hosts reach each other once something joins the switch-side ends.
    let s1 = live.host("s1").unwrap().clone();
    let s1_addr = SocketAddr::from((s1.ip, 11211));
    {
        let _br = Bridge::new("tb1br", &live);
        live.in_host("c1", || {
            let reply = mc(s1_addr, b"set direct 0 0 2\r\nhi\r\n", b"\r\n");
            assert_eq!(reply, "STORED\r\n");

            // memcached's UDP frame header: request id, sequence 0, 1 datagram, reserved.
            let udp = UdpSocket::bind("0.0.0.0:0").unwrap();
            udp.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            udp.send_to(b"\x12\x34\x00\x00\x00\x01\x00\x00get direct\r\n", s1_addr)
                .unwrap();
            let mut buf = [0u8; 1500];
            let n = udp.recv(&mut buf).unwrap();
            assert_eq!(&buf[..2], b"\x12\x34");
            assert_eq!(&buf[8..n], b"VALUE direct 0 2\r\nhi\r\nEND\r\n");

            let proxy = nut.listen;
            assert_eq!(
                mc(proxy, b"set viaproxy 0 0 3\r\nabc\r\n", b"\r\n"),
                "STORED\r\n"
            );
            assert_eq!(
                mc(proxy, b"get viaproxy\r\n", b"END\r\n"),
                "VALUE viaproxy 0 3\r\nabc\r\nEND\r\n"
            );
        })
        .unwrap();
        // nutcracker put the key on exactly one server.
        let holders = live
            .servers()
            .iter()
            .filter(|s| {
                let addr = SocketAddr::from((s.ip, 11211));
                live.in_host("c1", || mc(addr, b"get viaproxy\r\n", b"END\r\n"))
                    .unwrap()
                    .contains("VALUE")
            })
            .count();
        assert_eq!(holders, 1);
    }

    live.down().unwrap();
    assert_gone(prefix, &state_path, &work_dir, &pids);
    // Idempotent.
    down(&state_path).unwrap();
}

#[test]
fn down_cleans_up_after_a_crash() {
    let prefix = "tb2";
    let opts = fresh(prefix);
    let live = testbed::up(&Topology::default_topology(), &opts).unwrap();
    let state_path = live.state_path().to_path_buf();
    let work_dir = live.state.work_dir.clone();
    let pids = all_pids(&live.state);
    // The process that built the testbed goes away without tearing it down.
    live.keep();
    drop(live);
    assert_eq!(names_with_prefix(prefix).len(), 10);
    for &pid in &pids {
        assert!(alive(pid));
    }

    // Something created by hand with the prefix is removed too.
    ip(&["netns", "add", "tb2-stray"]);
    down(&state_path).unwrap();
    assert_gone(prefix, &state_path, &work_dir, &pids);
    down(&state_path).unwrap();
}

#[test]
fn drop_tears_down_and_a_half_built_state_is_undone() {
    let prefix = "tb3";
    let opts = fresh(prefix);
    let topo = Topology::parse(
        "[[hosts]]\nname = \"c1\"\nrole = \"client\"\n[[hosts]]\nname = \"s1\"\nrole = \"server\"\n",
        "two.toml",
    )
    .unwrap();
    let (state_path, work_dir, pids) = {
        let live = testbed::up(&topo, &opts).unwrap();
        (
            live.state_path().to_path_buf(),
            live.state.work_dir.clone(),
            all_pids(&live.state),
        )
    };
    assert_gone(prefix, &state_path, &work_dir, &pids);

    // A second `up` with the same prefix refuses while the first is still there.
    let live = testbed::up(&topo, &opts).unwrap();
    let err = testbed::up(&topo, &opts).unwrap_err();
    assert!(format!("{err:#}").contains("already exists"), "{err:#}");
    drop(live);
}

#[test]
fn failed_kvswitch_start_is_reported_and_undone() {
    let prefix = "tb4";
    let mut opts = fresh(prefix);
    let dir = std::env::temp_dir().join(format!("kvs-tb4-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bin = write_script(
        &dir,
        "broken-kvswitch",
        "#!/bin/sh\necho \"no such interface: $3\" >&2\nexit 3\n",
    );
    opts.kvswitch_bin = Some(bin);
    opts.start_nutcracker = false;
    let state_path = default_state_path(prefix);
    let err = testbed::up(&Topology::default_topology(), &opts).unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("kvswitch did not become ready"), "{msg}");
    assert!(msg.contains("no such interface"), "log tail missing: {msg}");
    assert_eq!(names_with_prefix(prefix), Vec::<String>::new());
    assert!(!state_path.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn kvswitch_is_started_with_the_generated_config() {
    let prefix = "tb5";
    let mut opts = fresh(prefix);
    let dir = std::env::temp_dir().join(format!("kvs-tb5-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Stands in for the daemon: serves the status endpoint on the configured API address.
    let bin = write_script(
        &dir,
        "fake-kvswitch",
        r#"#!/usr/bin/python3
import http.server, re, sys
assert sys.argv[1:3] == ["run", "--config"]
conf = open(sys.argv[3]).read()
host, port = re.search(r'^api = "([^"]+):(\d+)"', conf, re.M).groups()
class Status(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/api/v1/status" else 404)
        self.end_headers()
        self.wfile.write(b'{"ok": true}')
    def log_message(self, *args):
        pass
http.server.HTTPServer((host, int(port)), Status).serve_forever()
"#,
    );
    opts.kvswitch_bin = Some(bin);
    opts.extra_config = Some("[cache]\nenabled = true\n".to_string());
    let topo = Topology::parse(
        "mode = \"l2\"\n[[hosts]]\nname = \"c1\"\nrole = \"client\"\n\
         [[hosts]]\nname = \"s1\"\nrole = \"server\"\nweight = 2\n",
        "l2.toml",
    )
    .unwrap();
    let live = testbed::up(&topo, &opts).unwrap();
    let kvs = live.state.kvswitch_pid.unwrap();
    assert!(alive(kvs));
    let (code, body) = testbed::http_get(live.api(), "/api/v1/status").unwrap();
    assert_eq!((code, body.as_str()), (200, "{\"ok\": true}"));

    let conf: toml::Value =
        toml::from_str(&std::fs::read_to_string(&live.state.config_path).unwrap()).unwrap();
    assert_eq!(conf["switch"]["mode"].as_str(), Some("l2"));
    assert_eq!(
        conf["switch"]["api"].as_str(),
        Some(live.api().to_string().as_str())
    );
    assert_eq!(conf["switch"]["ports"][1].as_str(), Some("tb5-s1"));
    assert_eq!(
        conf["vip"]["mac"].as_str(),
        Some(live.state.vip_mac.as_str())
    );
    assert_eq!(conf["pool"]["servers"][0]["weight"].as_integer(), Some(2));
    assert_eq!(conf["cache"]["enabled"].as_bool(), Some(true));
    // The local port carries the prefix; l2 mode gets an agent address for it.
    assert_eq!(conf["switch"]["local_port"].as_str(), Some("tb5-local"));
    assert_eq!(conf["switch"]["local_peer"].as_str(), Some("tb5-local-h"));
    assert_eq!(conf["vip"]["agent_ip"].as_str(), Some("10.77.0.254"));
    assert_eq!(live.state.local_port.as_deref(), Some("tb5-local"));

    // l2: the server owns the VIP on lo, keeps quiet about it on ARP, and memcached accepts it.
    let vip = live.state.vip;
    let v = live
        .in_host("s1", || {
            let ignore = std::fs::read_to_string("/proc/sys/net/ipv4/conf/eth0/arp_ignore");
            (
                ignore.unwrap(),
                memcached_version(SocketAddr::from((vip, 11211))),
            )
        })
        .unwrap();
    assert_eq!(v.0.trim(), "1");
    assert!(v.1.unwrap().starts_with("VERSION"));

    let state_path = live.state_path().to_path_buf();
    let work_dir = live.state.work_dir.clone();
    let pids = all_pids(&live.state);
    live.down().unwrap();
    assert_gone(prefix, &state_path, &work_dir, &pids);
    assert!(!alive(kvs));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// kvswitch's local port puts the VIP and a route to the subnet into the root namespace, so
/// `up` refuses a subnet the root namespace already reaches, before building anything.
#[test]
fn up_refuses_a_subnet_the_root_namespace_reaches() {
    let prefix = "tb6";
    let mut opts = fresh(prefix);
    let subnet = testbed::Subnet::for_prefix(prefix);
    let topo = Topology::default_topology().on_subnet(subnet).unwrap();
    // Never run: the check comes first.
    opts.kvswitch_bin = Some("/nonexistent/kvswitch".into());
    opts.start_nutcracker = false;

    // Not the testbed's prefix, which `up` would refuse for another reason.
    let taken = "tb6x-taken";
    let _ = std::process::Command::new("ip")
        .args(["link", "del", taken])
        .stderr(std::process::Stdio::null())
        .status();
    ip(&[
        "link",
        "add",
        taken,
        "type",
        "veth",
        "peer",
        "name",
        "tb6x-taken-p",
    ]);
    let guard = Bridge(taken.to_string());
    ip(&[
        "addr",
        "add",
        &format!("{}/24", subnet.nth(200)),
        "dev",
        taken,
    ]);
    let err = testbed::up(&topo, &opts).unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains("already reached") && msg.contains(taken),
        "{msg}"
    );
    assert!(!default_state_path(prefix).exists());

    // Without a local port nothing reaches the root namespace: no objection.
    opts.local_port = false;
    opts.kvswitch_bin = None;
    let live = testbed::up(&topo, &opts).unwrap();
    live.down().unwrap();
    drop(guard);
    assert_eq!(names_with_prefix(prefix), Vec::<String>::new());
}

fn write_script(dir: &Path, name: &str, text: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}
