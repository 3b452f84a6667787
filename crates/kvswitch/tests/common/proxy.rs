//! Loopback fixtures for the proxy tests: memcached servers, a reference memcached, a proxy in
//! front of the servers, raw connections, and the framing and masking needed to compare replies
//! byte for byte.
//!
//! The proxy under test is `kvswitch proxy`; nutcracker and memcached itself stand in for it in
//! the tests that prove the harness. Every process is killed by its own PID when its handle is
//! dropped, and every read is bounded in time.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use testbed::local::{self, Ports, Proc, TempDir};
// Not every test binary that includes this module uses each of them.
#[allow(unused_imports)]
pub use testbed::replies::{
    ends_with_sentinel, last_cas, normalise_binary, normalise_text, packets, SENTINEL,
};

/// The servers' names: the proxy's ring hashes these, as nutcracker does for `host:port:w name`.
pub const NAMES: [&str; 3] = ["s1", "s2", "s3"];

/// How long any single read waits before a test gives up on a reply.
pub const REPLY_LIMIT: Duration = Duration::from_secs(5);

/// A TCP port free on 127.0.0.1 now.
pub fn free_port() -> u16 {
    let ports = Ports::default();
    let port = ports.pick([127, 0, 0, 1].into()).expect("a free port");
    ports.release();
    port
}

/// True when something listens on `addr`. A connect to a loopback port nobody listens on can
/// pick that same port as its source and connect to itself, which does not count.
pub fn listening(addr: SocketAddr) -> bool {
    TcpStream::connect(addr).is_ok_and(|s| s.local_addr().ok() != s.peer_addr().ok())
}

/// Waits, at most 10 s, until something listens on every one of `addrs`; `what` (the process
/// started) names it in the failure.
pub fn until_listening(addrs: &[SocketAddr], what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !addrs.iter().all(|&a| listening(a)) {
        assert!(
            std::time::Instant::now() < deadline,
            "{what} never listened on {addrs:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A memcached on a loopback port of its own that a test can kill and start again on the
/// same port; killed by PID when dropped.
pub struct Memcached {
    addr: SocketAddr,
    proc: Option<Proc>,
}

impl Memcached {
    /// memcached on a free port (one thread, 64 MiB, UDP off).
    pub fn start() -> Memcached {
        let mut last = None;
        // Another process may take the port between the pick and memcached's bind.
        for _ in 0..5 {
            let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let mut m = Memcached { addr, proc: None };
            match m.try_restart() {
                Ok(()) => return m,
                Err(e) => last = Some(e),
            }
        }
        panic!("memcached did not start: {last:?}");
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The running process's PID; `None` after [`kill`](Self::kill).
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(Proc::pid)
    }

    /// Kills the process (SIGKILL to its PID) and reaps it: its port refuses connections.
    pub fn kill(&mut self) {
        self.proc = None;
    }

    /// Starts memcached again on the same port, empty.
    pub fn restart(&mut self) {
        self.try_restart().expect("restart memcached");
    }

    fn try_restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        let bin = local::require("memcached")?;
        self.proc = Some(local::memcached(&bin, self.addr)?);
        Ok(())
    }
}

/// What listens where clients connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Front {
    /// `kvswitch proxy --listen ADDR --config FILE.toml`.
    Kvswitch,
    /// `kvswitch proxy --nutcracker-config FILE.yml`.
    KvswitchYaml,
    /// nutcracker (twemproxy) with the same pool: proves the multi-server harness.
    Nutcracker,
    /// One more memcached and no servers behind it: proves the single-server harness.
    Direct,
}

/// The pool's failure handling, in the proxy's TOML terms.
#[derive(Clone, Debug)]
pub struct PoolOpts {
    pub timeout_ms: u64,
    pub auto_eject_hosts: bool,
    pub server_failure_limit: u32,
    pub server_retry_timeout_ms: u64,
    /// Whether a kvswitch proxy from a TOML file serves its control API (`[proxy] api`), on
    /// a port picked at each start; [`Proxy::api`] names it.
    pub api: bool,
    /// `[proxy] workers`, for a kvswitch proxy from a TOML file: with one, every client
    /// shares the same server connections.
    pub workers: usize,
    /// More `[proxy]` keys, one per line, for a kvswitch proxy from a TOML file.
    pub proxy_keys: String,
    /// The descriptor limit (`RLIMIT_NOFILE`, soft and hard) a kvswitch proxy starts with,
    /// set by `prlimit`, which then runs the proxy in its own process.
    pub nofile: Option<u64>,
}

impl Default for PoolOpts {
    fn default() -> PoolOpts {
        PoolOpts {
            timeout_ms: 1000,
            auto_eject_hosts: false,
            server_failure_limit: 2,
            server_retry_timeout_ms: 30_000,
            api: false,
            workers: 2,
            proxy_keys: String::new(),
            nofile: None,
        }
    }
}

/// A proxy (or stand-in) process on a free loopback port, killed by PID when dropped.
pub struct Proxy {
    pub front: Front,
    pub addr: SocketAddr,
    child: Option<Child>,
    direct: Option<Memcached>,
    api: Option<SocketAddr>,
    // Dropped after the child is killed (fields drop in order after `Drop::drop`).
    dir: TempDir,
}

/// The proxy's TOML for `servers` (name, address), listening where `--listen` says.
pub fn toml_config(
    servers: &[(&str, SocketAddr)],
    opts: &PoolOpts,
    api: Option<SocketAddr>,
) -> String {
    let api = api.map(|a| format!("api = \"{a}\"\n")).unwrap_or_default();
    let mut out = format!(
        "[proxy]\nworkers = {}\n{api}{}\n[pool]\ndistribution = \"ketama\"\nhash = \"md5\"\n\
         timeout_ms = {}\nauto_eject_hosts = {}\nserver_failure_limit = {}\n\
         server_retry_timeout_ms = {}\n",
        opts.workers,
        opts.proxy_keys,
        opts.timeout_ms,
        opts.auto_eject_hosts,
        opts.server_failure_limit,
        opts.server_retry_timeout_ms
    );
    for (name, addr) in servers {
        out.push_str(&format!(
            "\n[[pool.servers]]\naddr = \"{addr}\"\nname = \"{name}\"\nweight = 1\n"
        ));
    }
    out
}

/// The kvswitch binary under test (`KVSWITCH_TEST_PROXY_BIN` names another one, for a
/// measurement against an older build), run by `prlimit` when `opts.nofile` says so.
fn kvswitch_command(opts: &PoolOpts) -> Command {
    let bin = std::env::var("KVSWITCH_TEST_PROXY_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_kvswitch").to_string());
    match opts.nofile {
        Some(n) => {
            let mut c = Command::new("prlimit");
            c.arg(format!("--nofile={n}:{n}")).arg("--").arg(bin);
            c
        }
        None => Command::new(bin),
    }
}

/// nutcracker's YAML for the same pool.
pub fn yaml_config(listen: SocketAddr, servers: &[(&str, SocketAddr)], opts: &PoolOpts) -> String {
    let mut out = format!(
        "alpha:\n  listen: {listen}\n  hash: md5\n  distribution: ketama\n  timeout: {}\n  \
         auto_eject_hosts: {}\n  server_failure_limit: {}\n  server_retry_timeout: {}\n  \
         servers:\n",
        opts.timeout_ms,
        opts.auto_eject_hosts,
        opts.server_failure_limit,
        opts.server_retry_timeout_ms
    );
    for (name, addr) in servers {
        out.push_str(&format!("   - {addr}:1 {name}\n"));
    }
    out
}

impl Proxy {
    /// Starts `front` before `servers` and waits until it accepts connections. A start that
    /// fails (another process took the port first) is tried again on another port.
    pub fn start(front: Front, servers: &[(&str, SocketAddr)], opts: &PoolOpts) -> Proxy {
        Proxy::start_with(front, servers, opts, "")
    }

    /// [`start`](Self::start), with `extra` appended to a [`Front::Kvswitch`] proxy's TOML
    /// configuration (other fronts ignore it).
    pub fn start_with(
        front: Front,
        servers: &[(&str, SocketAddr)],
        opts: &PoolOpts,
        extra: &str,
    ) -> Proxy {
        let mut why = String::new();
        for _ in 0..3 {
            match Proxy::try_start(front, servers, opts, extra) {
                Ok(proxy) => return proxy,
                Err(log) => why = log,
            }
        }
        panic!("{front:?} exited at start:\n{why}");
    }

    fn try_start(
        front: Front,
        servers: &[(&str, SocketAddr)],
        opts: &PoolOpts,
        extra: &str,
    ) -> Result<Proxy, String> {
        let dir = TempDir::new("kvswitch-proxy-test").expect("a scratch directory");
        if front == Front::Direct {
            let m = Memcached::start();
            return Ok(Proxy {
                front,
                addr: m.addr(),
                child: None,
                direct: Some(m),
                api: None,
                dir,
            });
        }
        let port = free_port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        // Picked at each attempt: a port taken by another test between the pick and the
        // proxy's bind fails this attempt only.
        let api = (opts.api && front == Front::Kvswitch)
            .then(|| SocketAddr::from(([127, 0, 0, 1], free_port())));
        let log = std::fs::File::create(dir.path().join("log")).expect("create the proxy log");
        let mut cmd = match front {
            Front::Kvswitch => {
                let path = dir.path().join("proxy.toml");
                let mut text = toml_config(servers, opts, api);
                if !extra.is_empty() {
                    text.push('\n');
                    text.push_str(extra);
                    if !extra.ends_with('\n') {
                        text.push('\n');
                    }
                }
                std::fs::write(&path, text).expect("write config");
                let mut c = kvswitch_command(opts);
                c.arg("proxy")
                    .arg("--listen")
                    .arg(addr.to_string())
                    .arg("--config")
                    .arg(path);
                c
            }
            Front::KvswitchYaml => {
                let path = dir.path().join("proxy.yml");
                std::fs::write(&path, yaml_config(addr, servers, opts)).expect("write config");
                let mut c = kvswitch_command(opts);
                c.arg("proxy").arg("--nutcracker-config").arg(path);
                c
            }
            Front::Nutcracker => {
                let path = dir.path().join("nutcracker.yml");
                std::fs::write(&path, yaml_config(addr, servers, opts)).expect("write config");
                let mut c = Command::new(local::require("nutcracker").expect("nutcracker"));
                c.arg("-c")
                    .arg(path)
                    .args(["-a", "127.0.0.1", "-s", &free_port().to_string()]);
                c
            }
            Front::Direct => unreachable!("handled above"),
        };
        cmd.env(
            "RUST_LOG",
            std::env::var("KVSWITCH_TEST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log descriptor"))
        .stderr(log);
        let child = cmd.spawn().expect("start the proxy");
        let proxy = Proxy {
            front,
            addr,
            child: Some(child),
            direct: None,
            api,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !(listening(addr) && api.is_none_or(listening)) {
            if !proxy.alive() {
                return Err(proxy.log_tail());
            }
            if Instant::now() > deadline {
                panic!("{front:?} not accepting on {addr}:\n{}", proxy.log_tail());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(proxy)
    }

    /// The control API of a kvswitch proxy started with [`PoolOpts::api`].
    pub fn api(&self) -> SocketAddr {
        self.api.expect("a proxy started with PoolOpts::api")
    }

    /// The configuration file a kvswitch front was started with.
    pub fn config_path(&self) -> std::path::PathBuf {
        match self.front {
            Front::KvswitchYaml => self.dir.path().join("proxy.yml"),
            Front::Nutcracker => self.dir.path().join("nutcracker.yml"),
            _ => self.dir.path().join("proxy.toml"),
        }
    }

    pub fn pid(&self) -> u32 {
        match (&self.child, &self.direct) {
            (Some(c), _) => c.id(),
            (None, Some(m)) => m.pid().expect("memcached running"),
            (None, None) => unreachable!("a proxy runs a child or a memcached"),
        }
    }

    /// False once the process has exited (a zombie counts as exited).
    pub fn alive(&self) -> bool {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())) else {
            return false;
        };
        // The state follows the parenthesised command name.
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next());
        !matches!(state, Some('Z') | Some('X') | None)
    }

    /// Resident set size in KiB, from /proc/PID/status.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("the proxy's /proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .expect("VmRSS in /proc status")
    }

    /// The last lines of the proxy's output, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Three memcached servers with a proxy in front, and one more memcached as the reference that
/// the same bytes are sent to directly.
pub struct Cluster {
    pub servers: Vec<Memcached>,
    pub reference: Memcached,
    pub proxy: Proxy,
    pub ring: kv::Ring,
}

impl Cluster {
    pub fn start(front: Front, opts: &PoolOpts) -> Cluster {
        let servers: Vec<Memcached> = NAMES.iter().map(|_| Memcached::start()).collect();
        let reference = Memcached::start();
        let pool: Vec<(&str, SocketAddr)> = NAMES
            .iter()
            .zip(&servers)
            .map(|(n, m)| (*n, m.addr()))
            .collect();
        let proxy = Proxy::start(front, &pool, opts);
        Cluster {
            servers,
            reference,
            proxy,
            ring: ring(),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.proxy.addr
    }

    pub fn proxy_is_alive(&self) -> bool {
        self.proxy.alive()
    }

    /// The server (index into `servers`) that holds `key`.
    pub fn server_of(&self, key: &str) -> usize {
        self.ring.locate(key.as_bytes())
    }
}

/// The pool's ring, built from the names alone (ketama, md5, weight 1), as nutcracker builds it.
pub fn ring() -> kv::Ring {
    let servers: Vec<kv::Server> = NAMES.iter().map(|n| kv::Server::new(*n, 1)).collect();
    kv::Ring::new(kv::Distribution::Ketama, kv::HashFn::Md5, &servers).expect("ring")
}

/// `per` keys on each server, `prefix` followed by a number, in server order 0, 1, 2, 0, 1, ...
pub fn spread_keys(ring: &kv::Ring, prefix: &str, per: usize) -> Vec<String> {
    let mut by_server: Vec<Vec<String>> = vec![Vec::new(); ring.len()];
    let mut i = 0;
    while by_server.iter().any(|v| v.len() < per) {
        let key = format!("{prefix}{i}");
        let s = ring.locate(key.as_bytes());
        if by_server[s].len() < per {
            by_server[s].push(key);
        }
        i += 1;
        assert!(i < 1_000_000, "the ring leaves a server without keys");
    }
    (0..per)
        .flat_map(|j| by_server.iter().map(move |v| v[j].clone()))
        .collect()
}

/// `n` keys that all land on `server`.
pub fn keys_on(ring: &kv::Ring, server: usize, prefix: &str, n: usize) -> Vec<String> {
    (0..1_000_000)
        .map(|i| format!("{prefix}{i}"))
        .filter(|k| ring.locate(k.as_bytes()) == server)
        .take(n)
        .collect()
}

/// What a bounded read saw.
#[derive(Debug, Default)]
pub struct Seen {
    pub bytes: Vec<u8>,
    /// The peer closed (or reset) the connection.
    pub closed: bool,
    /// `done` never held before the limit.
    pub timed_out: bool,
}

/// A raw client connection.
pub struct Conn {
    pub stream: TcpStream,
}

impl Conn {
    pub fn open(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        stream
            .set_write_timeout(Some(REPLY_LIMIT))
            .expect("write timeout");
        Conn { stream }
    }

    /// Sends all of `bytes`; false when the peer has closed.
    pub fn send(&mut self, bytes: &[u8]) -> bool {
        self.stream.write_all(bytes).is_ok()
    }

    /// Reads until `done` holds for everything read, the peer closes, or `limit` passes.
    pub fn read_until(&mut self, done: impl Fn(&[u8]) -> bool, limit: Duration) -> Seen {
        let deadline = Instant::now() + limit;
        let mut out = Seen::default();
        let mut chunk = vec![0u8; 64 * 1024];
        while !done(&out.bytes) {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                out.timed_out = true;
                break;
            };
            self.stream
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .expect("read timeout");
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    out.closed = true;
                    break;
                }
                Ok(n) => out.bytes.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    out.timed_out = true;
                    break;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    out.closed = true;
                    break;
                }
            }
        }
        out
    }

    /// Sends `request` and reads until `done`; the error describes an incomplete reply (the
    /// peer closed, or [`REPLY_LIMIT`] passed).
    pub fn try_call(
        &mut self,
        request: &[u8],
        done: impl Fn(&[u8]) -> bool,
    ) -> Result<Vec<u8>, String> {
        if !self.send(request) {
            return Err("connection closed before the request".into());
        }
        let r = self.read_until(&done, REPLY_LIMIT);
        if done(&r.bytes) {
            return Ok(r.bytes);
        }
        Err(format!(
            "incomplete reply (closed: {}, timed out: {}): {}",
            r.closed,
            r.timed_out,
            show(&r.bytes)
        ))
    }

    /// [`try_call`](Self::try_call), panicking on an incomplete reply.
    pub fn call(&mut self, request: &[u8], done: impl Fn(&[u8]) -> bool) -> Vec<u8> {
        self.try_call(request, done)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Sends `request` followed by `mn`, and returns the reply up to and without the `MN`
    /// that answers it.
    pub fn try_text(&mut self, request: &[u8]) -> Result<Vec<u8>, String> {
        let sentinels = 1 + count(request, b"mn\r\n");
        let mut bytes = request.to_vec();
        bytes.extend_from_slice(b"mn\r\n");
        let mut reply = self.try_call(&bytes, |r| {
            r.ends_with(b"MN\r\n") && count(r, b"MN\r\n") >= sentinels
        })?;
        reply.truncate(reply.len() - 4);
        Ok(reply)
    }

    /// [`try_text`](Self::try_text), panicking on an incomplete reply.
    pub fn text(&mut self, request: &[u8]) -> Vec<u8> {
        self.try_text(request).unwrap_or_else(|e| panic!("{e}"))
    }

    /// True when the peer has closed: nothing more arrives and the read sees end of stream.
    pub fn is_closed(&mut self, limit: Duration) -> bool {
        self.read_until(|_| false, limit).closed
    }
}

/// How often `needle` occurs in `hay`.
pub fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

/// Bytes as text with control characters escaped, cut to a readable length.
pub fn show(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(600)]).into_owned();
    let more = if bytes.len() > 600 {
        format!("... ({} bytes)", bytes.len())
    } else {
        String::new()
    };
    format!("{text:?}{more}")
}

/// The number of complete text replies at the front of `buf`: a run of `VALUE` blocks closed by
/// `END`, a meta `VA` line with its data block, or any other single line.
pub fn text_replies(buf: &[u8]) -> usize {
    let mut at = 0;
    let mut replies = 0;
    while let Some(eol) = buf[at..].windows(2).position(|w| w == b"\r\n") {
        let line = &buf[at..at + eol];
        let data_len = |token: usize| -> Option<usize> {
            std::str::from_utf8(line)
                .ok()?
                .split(' ')
                .nth(token)?
                .parse()
                .ok()
        };
        let block = if line.starts_with(b"VALUE ") {
            data_len(3)
        } else if line.starts_with(b"VA ") {
            replies += 1;
            data_len(1)
        } else {
            // `END` closes a run of values; any other line is a reply of its own.
            replies += 1;
            None
        };
        let next = at + eol + 2 + block.map_or(0, |n| n + 2);
        if next > buf.len() {
            return replies - usize::from(line.starts_with(b"VA "));
        }
        at = next;
    }
    replies
}

/// One binary request packet.
pub fn binary_request(
    op: u8,
    key: &[u8],
    extras: &[u8],
    value: &[u8],
    opaque: u32,
    cas: u64,
) -> Vec<u8> {
    let mut packet = Vec::new();
    wire::memcache::binary::write_request(op, key, extras, value, opaque, cas, &mut packet);
    packet
}

pub fn noop_sentinel() -> Vec<u8> {
    binary_request(0x0a, b"", b"", b"", SENTINEL, 0)
}

/// The value of `field` in a text `stats` reply.
pub fn stat(reply: &[u8], field: &str) -> Option<u64> {
    let text = String::from_utf8_lossy(reply);
    let prefix = format!("STAT {field} ");
    text.split("\r\n")
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.parse().ok())
}

/// The field names of a text `stats` reply, in order.
pub fn stat_names(reply: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(reply)
        .split("\r\n")
        .filter_map(|l| l.strip_prefix("STAT "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_string)
        .collect()
}

/// A `set` of `value` under `key`.
pub fn set_request(key: &str, value: &[u8]) -> Vec<u8> {
    let mut r = format!("set {key} 0 0 {}\r\n", value.len()).into_bytes();
    r.extend_from_slice(value);
    r.extend_from_slice(b"\r\n");
    r
}

/// The reply to a `get` of `(key, value)` pairs, hits only, in order.
pub fn values_reply(items: &[(&str, &[u8])]) -> Vec<u8> {
    let mut r = Vec::new();
    for (k, v) in items {
        r.extend_from_slice(format!("VALUE {k} 0 {}\r\n", v.len()).as_bytes());
        r.extend_from_slice(v);
        r.extend_from_slice(b"\r\n");
    }
    r.extend_from_slice(b"END\r\n");
    r
}

/// Runs `kvswitch cache ARGS --api API` and returns its output.
pub fn cache_cli(api: SocketAddr, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kvswitch"))
        .arg("cache")
        .args(args)
        .args(["--api", &api.to_string()])
        .output()
        .expect("run kvswitch cache");
    assert!(
        out.status.success(),
        "kvswitch cache {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
