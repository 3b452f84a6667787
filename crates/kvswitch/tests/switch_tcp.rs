//! TCP to the VIP in switch mode. The switch sends it out of its local port into the root
//! namespace's own stack, where the built-in proxy listens on the VIP; the proxy's connections
//! to the servers leave through the same port and cross the switch like anyone's.
//!
//! The client is an ordinary memcached client kvswitch did not write: libmemcached's tools
//! (`memccp`, `memccat`, `memcrm`), run inside a client namespace against the VIP. Each key is
//! then looked for on every server directly, from inside the server's namespace.
//!
//! The plumbing is tested on its own, without the built-in proxy (`switch.proxy = false`): a
//! listener of the test's own on the VIP, the root namespace's connections to the servers, and
//! nutcracker on the VIP in place of the proxy, with the same client checks.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

const SERVERS: [&str; 3] = ["s1", "s2", "s3"];

/// How long one client command may take; a broken path fails long before.
const COMMAND_TIMEOUT_S: &str = "20";

fn require_client_tools() {
    for tool in ["memccp", "memccat", "memcrm", "timeout"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            found,
            "`{tool}` is missing: these tests need libmemcached-tools \
             (apt-get install libmemcached-tools, or run scripts/setup.sh)"
        );
    }
}

/// Runs `program args...` inside `host`'s namespace, bounded in time.
fn exec(live: &testbed::Live, host: &str, program: &str, args: &[String]) -> Output {
    live.exec(host, "timeout")
        .arg(COMMAND_TIMEOUT_S)
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {program} in {host}: {e}"))
}

fn servers_arg(addr: SocketAddr) -> String {
    format!("--servers={addr}")
}

/// What the host behind the local port speaks to the servers from: the VIP in l3 mode, the
/// agent address in l2 mode (the servers own the VIP there).
fn source(live: &testbed::Live) -> Ipv4Addr {
    live.state.agent_ip.unwrap_or(live.state.vip)
}

/// One value per key, some of them larger than a frame, so that replies span segments.
fn value_for(i: usize, key: &str) -> String {
    let mut v = format!("{key}={i}:");
    while v.len() < 40 + i * 900 {
        v.push(char::from(b'a' + (v.len() % 26) as u8));
    }
    v
}

/// The whole client check: keys on every server set through the VIP with `memccp` from c1,
/// read back through the VIP with `memccat` from c2, each found on its ketama server and on no
/// other (asked directly inside each server's namespace), then one per server deleted through
/// the VIP. Returns the keys still stored, with their values.
fn check_memcached_client(live: &testbed::Live, tag: &str) -> Vec<(String, String)> {
    require_client_tools();
    let ring = default_ring();
    let vip = vip(live);
    let keys = keys_spanning_servers(&ring, &format!("{tag}-"), 3);
    // memccp stores each file under its base name.
    let dir = std::env::temp_dir().join(format!("{tag}-tcp-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("key directory");
    let mut files = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let path = dir.join(key);
        std::fs::write(&path, value_for(i, key)).expect("key file");
        files.push(path.display().to_string());
    }
    let mut args = vec![servers_arg(vip)];
    args.extend(files);
    let out = exec(live, "c1", "memccp", &args);
    std::fs::remove_dir_all(&dir).expect("removing the key files");
    // One error line per key; the first says what went wrong.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "memccp to the VIP {vip} failed ({}): {}\nswitch log:\n{}",
        out.status,
        stderr.lines().next().unwrap_or(""),
        log_tail(live, 10)
    );

    for (i, key) in keys.iter().enumerate() {
        let want = value_for(i, key);
        // memccat prints each value followed by a newline.
        let out = exec(live, "c2", "memccat", &[servers_arg(vip), key.clone()]);
        assert!(
            out.status.success(),
            "memccat {key} through the VIP failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("{want}\n"),
            "{key} through the VIP"
        );

        let owner = SERVERS[ring.locate(key.as_bytes())];
        for s in SERVERS {
            let direct = SocketAddr::new(ip_of(live, s).into(), testbed::MEMCACHED_PORT);
            let out = exec(live, s, "memccat", &[servers_arg(direct), key.clone()]);
            if s == owner {
                assert!(out.status.success(), "{key} must be on its server {s}");
                assert_eq!(
                    String::from_utf8_lossy(&out.stdout),
                    format!("{want}\n"),
                    "{key} on {s}"
                );
            } else {
                assert!(!out.status.success(), "{key} must not be on {s}");
            }
        }
    }

    // A delete through the VIP reaches the owner too.
    for key in keys.iter().take(SERVERS.len()) {
        let out = exec(live, "c1", "memcrm", &[servers_arg(vip), key.clone()]);
        assert!(
            out.status.success(),
            "memcrm {key} through the VIP failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let owner = SERVERS[ring.locate(key.as_bytes())];
        assert_eq!(
            server_value(live, owner, key),
            None,
            "{key} deleted on {owner}"
        );
        let out = exec(live, "c2", "memccat", &[servers_arg(vip), key.clone()]);
        assert!(!out.status.success(), "{key} is gone through the VIP too");
    }
    keys.iter()
        .enumerate()
        .skip(SERVERS.len())
        .map(|(i, k)| (k.clone(), value_for(i, k)))
        .collect()
}

/// One text `get` over TCP to the VIP whose keys live on every server (and a missing one)
/// comes back as one memcached holding them all would answer it, in the client's order.
fn check_multiget(live: &testbed::Live, stored: &[(String, String)]) {
    let mut request = String::from("get");
    let mut want = String::new();
    for (key, value) in stored {
        request.push_str(&format!(" {key}"));
        want.push_str(&format!("VALUE {key} 0 {}\r\n{value}\r\n", value.len()));
    }
    request.push_str(" no-such-key\r\n");
    want.push_str("END\r\n");
    let servers: std::collections::HashSet<usize> = stored
        .iter()
        .map(|(k, _)| default_ring().locate(k.as_bytes()))
        .collect();
    assert_eq!(servers.len(), SERVERS.len(), "the keys span every server");
    let reply = tcp_call(live, "c1", vip(live), request.as_bytes(), ends_with_end);
    assert_eq!(String::from_utf8_lossy(&reply), want);
}

/// A listener of the test's own on the VIP's port in the root namespace answers a client in
/// c1; the root namespace reaches every server's memcached from the proxy's source address;
/// the frames went through the local port and nothing was dropped.
fn check_plumbing(live: &testbed::Live) {
    let vip = vip(live);
    let listener = TcpListener::bind(vip).expect("binding the VIP's port in the root namespace");
    let server = std::thread::spawn(move || -> std::io::Result<(SocketAddr, SocketAddr)> {
        listener.set_nonblocking(false)?;
        let (mut conn, peer) = listener.accept()?;
        conn.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut line = String::new();
        BufReader::new(conn.try_clone()?).read_line(&mut line)?;
        write!(conn, "echo {} from {}\r\n", line.trim_end(), peer.ip())?;
        Ok((conn.local_addr()?, peer))
    });
    let reply = tcp_call(live, "c1", vip, b"hello\r\n", ends_with_line);
    let (local, peer) = server.join().expect("listener thread").expect("listener");
    let c1 = ip_of(live, "c1");
    assert_eq!(
        String::from_utf8_lossy(&reply),
        format!("echo hello from {c1}\r\n"),
        "the client's segment reached the host unchanged and the answer came back"
    );
    assert_eq!(local, vip, "the host accepted the connection on the VIP");
    assert_eq!(
        peer.ip(),
        IpAddr::V4(c1),
        "the host saw the client's own address"
    );

    // The host's own connections to the servers: out of the local port, answered back into it.
    for s in SERVERS {
        let addr = SocketAddr::new(ip_of(live, s).into(), testbed::MEMCACHED_PORT);
        let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(3))
            .unwrap_or_else(|e| panic!("connecting to {s} at {addr} from the host: {e}"));
        assert_eq!(
            conn.local_addr().expect("local address").ip(),
            IpAddr::V4(source(live)),
            "the host speaks to the servers from the proxy's source address"
        );
        conn.set_read_timeout(Some(Duration::from_secs(3)))
            .expect("timeout");
        conn.write_all(b"version\r\n").expect("version");
        let mut buf = [0u8; 64];
        let n = conn.read(&mut buf).expect("version reply");
        assert!(
            buf[..n].starts_with(b"VERSION "),
            "{s}: {:?}",
            String::from_utf8_lossy(&buf[..n])
        );
    }

    let st = status(live);
    let local_port = live.state.local_port.as_deref().expect("a local port");
    let counters = st["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .find(|p| p["name"] == local_port)
        .unwrap_or_else(|| panic!("the status lists no port {local_port}: {}", st["ports"]));
    assert!(counters["rx_packets"].as_u64().unwrap() > 0, "{counters}");
    assert!(counters["tx_packets"].as_u64().unwrap() > 0, "{counters}");
    assert_eq!(drops(live, "vip_unhandled"), 0);
}

/// A TCP port free on 127.0.0.1 a moment ago.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// nutcracker, started in the root namespace on the VIP's port with the testbed's pool,
/// standing in for the built-in proxy; stopped by its PID when dropped.
struct RootNutcracker {
    child: Child,
    dir: PathBuf,
}

impl RootNutcracker {
    fn start(live: &testbed::Live) -> RootNutcracker {
        let vip = vip(live);
        let dir = std::env::temp_dir().join(format!(
            "{}-root-nutcracker-{}",
            live.state.prefix,
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("nutcracker directory");
        let conf = dir.join("nutcracker.yml");
        std::fs::write(&conf, testbed::nutcracker_config(&live.state, vip)).expect("config");
        let child = Command::new("nutcracker")
            .arg("-c")
            .arg(&conf)
            .arg("-o")
            .arg(dir.join("nutcracker.log"))
            // Not its default stats port, which another nutcracker on this host may hold.
            .args(["-a", "127.0.0.1", "-s", &free_port().to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("stderr")).expect("stderr file"))
            .spawn()
            .expect("starting nutcracker");
        let nut = RootNutcracker { child, dir };
        let deadline = Instant::now() + Duration::from_secs(5);
        while TcpStream::connect_timeout(&vip, Duration::from_millis(200)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nutcracker is not listening on {vip}: {}{}",
                std::fs::read_to_string(nut.dir.join("stderr")).unwrap_or_default(),
                std::fs::read_to_string(nut.dir.join("nutcracker.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        nut
    }
}

impl Drop for RootNutcracker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What the local port leaves in the root namespace while it exists: (the link, the VIP).
fn root_holds(live: &testbed::Live) -> (bool, bool) {
    let port = live.state.local_port.clone().expect("local port");
    root_holds_named(&port, live.state.vip)
}

fn root_holds_named(port: &str, vip: Ipv4Addr) -> (bool, bool) {
    let link = Path::new("/sys/class/net").join(port).exists();
    let addrs = Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .expect("ip addr");
    let vip = format!("inet {vip}/");
    (link, String::from_utf8_lossy(&addrs.stdout).contains(&vip))
}

/// Stops a kvswitch child by its PID with SIGTERM and waits for it.
fn terminate(child: &mut Child) -> std::process::ExitStatus {
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill has no memory preconditions; `pid` is our own unreaped child.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().expect("waiting for kvswitch") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("kvswitch did not stop on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A kvswitch a test started itself: killed by its PID if the test fails before stopping it,
/// and its log removed.
struct Restarted {
    child: Child,
    log: PathBuf,
}

impl Drop for Restarted {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A daemon killed without a chance to clean up leaves its local port; the next one started
/// with the same configuration removes it and makes its own, which it removes on SIGTERM.
fn check_crash_recovery(live: &testbed::Live) {
    let pid = live.state.kvswitch_pid.expect("kvswitch runs");
    // SAFETY: kill has no memory preconditions; the PID is the daemon the testbed started.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) }, 0);
    // Dead once it is a zombie (the testbed started it and never reaps it) or gone.
    let dead = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X']))
        })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !dead() {
        assert!(
            Instant::now() < deadline,
            "kvswitch still runs after SIGKILL"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(root_holds(live), (true, true), "left behind by the crash");

    // Beside the testbed's files, removed when `restarted` goes so that `down` finds the
    // testbed's directory empty.
    let log_path = live.state.work_dir.join("kvswitch-restart.log");
    let log = std::fs::File::create(&log_path).expect("restart log");
    let child = Command::new(env!("CARGO_BIN_EXE_kvswitch"))
        .args(["run", "--config"])
        .arg(&live.state.config_path)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("restarting kvswitch");
    let mut restarted = Restarted {
        child,
        log: log_path.clone(),
    };
    let child = &mut restarted.child;
    let deadline = Instant::now() + Duration::from_secs(10);
    while testbed::http_get(live.api(), "/api/v1/status").is_err() {
        if let Some(status) = child.try_wait().expect("wait") {
            panic!(
                "the restarted kvswitch exited ({status}): {}",
                std::fs::read_to_string(&log_path).unwrap_or_default()
            );
        }
        assert!(
            Instant::now() < deadline,
            "the restarted kvswitch is not ready"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let port = live.state.local_port.as_deref().expect("local port");
    let alias = std::fs::read_to_string(Path::new("/sys/class/net").join(port).join("ifalias"))
        .expect("alias");
    assert!(
        alias.trim_end().ends_with(&format!("pid {}", child.id())),
        "the local port is the new daemon's: {alias:?}"
    );
    // The new pair works like the first.
    check_plumbing(live);

    let status = terminate(child);
    assert!(
        status.success(),
        "kvswitch exited with {status} on SIGTERM: {}",
        std::fs::read_to_string(&log_path).unwrap_or_default()
    );
    assert_eq!(
        root_holds(live),
        (false, false),
        "kvswitch removes its local port when it stops"
    );
}

/// The built-in proxy: `memccat` over the binary protocol gets the same values, and the
/// switch's status shows the proxy with its pool on the VIP, every server having answered.
fn check_proxy(live: &testbed::Live, stored: &[(String, String)]) {
    for (key, value) in stored {
        let out = exec(
            live,
            "c2",
            "memccat",
            &["--binary".into(), servers_arg(vip(live)), key.clone()],
        );
        assert!(out.status.success(), "binary get {key}: {out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{value}\n"));
    }
    let st = status(live);
    let pool = &st["proxy"]["pools"][0];
    assert_eq!(
        pool["listen"].as_str(),
        Some(vip(live).to_string().as_str())
    );
    let servers = pool["servers"].as_array().expect("the proxy's servers");
    assert_eq!(servers.len(), SERVERS.len());
    for s in servers {
        assert!(s["replies"].as_u64().unwrap() > 0, "{s}");
        assert_eq!(s["errors"].as_u64(), Some(0), "{s}");
    }
    assert_eq!(drops(live, "vip_unhandled"), 0);
}

#[test]
fn local_port_carries_tcp_both_ways_l3() {
    let live = testbed_with("kp3", "l3", false, |o| o.proxy = false);
    assert_eq!(root_holds(&live), (true, true));
    check_plumbing(&live);
    {
        let _nut = RootNutcracker::start(&live);
        let stored = check_memcached_client(&live, "kp3");
        check_multiget(&live, &stored);
    }
    check_crash_recovery(&live);
    live.down().expect("down");
}

#[test]
fn local_port_carries_tcp_both_ways_l2() {
    let live = testbed_with("kp2", "l2", false, |o| o.proxy = false);
    assert_eq!(root_holds(&live), (true, true));
    assert!(
        live.state.agent_ip.is_some(),
        "l2 testbeds have an agent address"
    );
    check_plumbing(&live);
    {
        let _nut = RootNutcracker::start(&live);
        let stored = check_memcached_client(&live, "kp2");
        check_multiget(&live, &stored);
    }
    // `testbed down` takes the local port with it.
    let port = live.state.local_port.clone().expect("local port");
    let vip = live.state.vip;
    live.down().expect("down");
    assert_eq!(root_holds_named(&port, vip), (false, false));
}

/// The built-in proxy behind the local port: an ordinary memcached client talking TCP to the
/// VIP gets correct answers for keys on every server.
#[test]
fn memcached_client_over_tcp_through_the_proxy_l3() {
    let live = testbed("kt3", "l3", false);
    let stored = check_memcached_client(&live, "kt3");
    check_multiget(&live, &stored);
    check_proxy(&live, &stored);
    live.down().expect("down");
}

#[test]
fn memcached_client_over_tcp_through_the_proxy_l2() {
    let live = testbed("kt2", "l2", false);
    let stored = check_memcached_client(&live, "kt2");
    check_multiget(&live, &stored);
    check_proxy(&live, &stored);
    live.down().expect("down");
}
