//! Pins kvswitch's key placement to real twemproxy.
//!
//! Starts memcached instances and one nutcracker with several pools (distributions, hash
//! functions, weights, explicit names, a server on port 11211), stores keys through each pool,
//! asks every memcached directly which keys it holds, and checks that `Ring::locate` names the
//! same server for every key. Requires `nutcracker` and `memcached`; fails if they are missing.

use std::cell::RefCell;
use std::env;
use std::fmt::Write as _;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kv::{ketama_name, Distribution, HashFn, Ring, Server};

/// Keys stored through each pool.
const KEYS_PER_POOL: usize = 10_000;
/// How long a process may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// Read timeout on every test connection, so a wedged peer fails the test instead of hanging.
const IO_TIMEOUT: Duration = Duration::from_secs(20);

/// A child process killed (by its PID) and reaped when dropped.
struct Proc {
    name: &'static str,
    child: Child,
}

impl Proc {
    fn spawn(name: &'static str, cmd: &mut Command) -> Proc {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Proc { name, child }
    }

    /// Waits until `addr` accepts connections; panics if the process exits or time runs out.
    fn wait_listening(&mut self, addr: SocketAddr, log: Option<&Path>) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return;
            }
            let log_text = || {
                log.and_then(|p| fs::read_to_string(p).ok())
                    .unwrap_or_default()
            };
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "{} exited ({status}) before listening on {addr}\n{}",
                    self.name,
                    log_text()
                );
            }
            if Instant::now() > deadline {
                panic!(
                    "{} not listening on {addr} after {START_TIMEOUT:?}\n{}",
                    self.name,
                    log_text()
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // `Child::kill` signals exactly this child's PID.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A private temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir = env::temp_dir().join(format!(
            "kvswitch-nutcracker-{}-{nanos}",
            std::process::id()
        ));
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {dir:?}: {e}"));
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Finds `program` on `PATH`, then in the sbin directories where distributions install
/// nutcracker (often missing from a non-root `PATH`). Panics with a clear message otherwise.
fn require(program: &str) -> PathBuf {
    let path = env::var_os("PATH").unwrap_or_default();
    let extra = ["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from);
    env::split_paths(&path)
        .chain(extra)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`{program}` not found on PATH: this test pins key placement against real \
                 twemproxy and memcached; install them (the project's setup script does)"
            )
        })
}

/// Free ports on 127.0.0.1, each held by a bound listener until [`Ports::release`], so two
/// picks never return the same port.
#[derive(Default)]
struct Ports(RefCell<Vec<TcpListener>>);

impl Ports {
    fn pick(&self) -> u16 {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap_or_else(|e| panic!("cannot pick a free port: {e}"));
        let port = listener
            .local_addr()
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("cannot pick a free port: {e}"));
        self.0.borrow_mut().push(listener);
        port
    }

    /// Frees the picked ports for the processes about to listen on them.
    fn release(&self) {
        self.0.borrow_mut().clear();
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let stream =
        TcpStream::connect(addr).unwrap_or_else(|e| panic!("cannot connect to {addr}: {e}"));
    let _ = stream.set_nodelay(true);
    stream
        .set_read_timeout(Some(IO_TIMEOUT))
        .unwrap_or_else(|e| panic!("set_read_timeout: {e}"));
    stream
}

/// Writes `payload` from a second thread while `read` consumes the replies, so neither side's
/// socket buffer can fill up and deadlock a long pipeline.
fn pipeline<T>(addr: SocketAddr, payload: Vec<u8>, read: impl FnOnce(&mut dyn BufRead) -> T) -> T {
    let stream = connect(addr);
    let mut writer = stream
        .try_clone()
        .unwrap_or_else(|e| panic!("try_clone: {e}"));
    let sender = thread::spawn(move || writer.write_all(&payload));
    let mut reader = BufReader::with_capacity(1 << 16, stream);
    let out = read(&mut reader);
    match sender.join() {
        Ok(Ok(())) => out,
        Ok(Err(e)) => panic!("write to {addr}: {e}"),
        Err(_) => panic!("writer thread for {addr} panicked"),
    }
}

fn read_line(r: &mut dyn BufRead, addr: SocketAddr) -> Vec<u8> {
    let mut line = Vec::new();
    match r.read_until(b'\n', &mut line) {
        Ok(0) => panic!("{addr} closed the connection"),
        Ok(_) => line,
        Err(e) => panic!("read from {addr}: {e}"),
    }
}

/// One memcached server, as twemproxy's configuration names it.
#[derive(Clone)]
struct Backend {
    host: &'static str,
    port: u16,
}

impl Backend {
    fn addr(&self) -> SocketAddr {
        let ip: Ipv4Addr = self
            .host
            .parse()
            .unwrap_or_else(|e| panic!("bad host {}: {e}", self.host));
        SocketAddr::from((ip, self.port))
    }
}

/// A pool to compare: a twemproxy pool definition and the same pool as a kvswitch `Ring`.
struct Shape {
    label: String,
    dist: Distribution,
    hash: HashFn,
    /// (backend, weight, explicit name).
    servers: Vec<(Backend, u32, Option<&'static str>)>,
    listen: SocketAddr,
}

impl Shape {
    fn yaml(&self, out: &mut String) {
        let _ = writeln!(out, "{}:", self.label);
        let _ = writeln!(out, "  listen: {}", self.listen);
        let _ = writeln!(out, "  distribution: {}", self.dist);
        let _ = writeln!(out, "  hash: {}", self.hash);
        let _ = writeln!(out, "  timeout: 10000");
        let _ = writeln!(out, "  auto_eject_hosts: false");
        let _ = writeln!(out, "  servers:");
        for (b, weight, name) in &self.servers {
            let _ = write!(out, "   - {}:{}:{weight}", b.host, b.port);
            if let Some(name) = name {
                let _ = write!(out, " {name}");
            }
            out.push('\n');
        }
    }

    fn ring(&self) -> Ring {
        let servers: Vec<Server> = self
            .servers
            .iter()
            .map(|(b, weight, name)| Server::new(ketama_name(b.host, b.port, *name), *weight))
            .collect();
        Ring::new(self.dist, self.hash, &servers)
            .unwrap_or_else(|e| panic!("{}: cannot build ring: {e}", self.label))
    }
}

/// Deterministic keys for pool `pool`: mixed lengths up to 250 bytes, printable ASCII and bytes
/// `0x80..=0xff` (which some of twemproxy's hashes sign-extend), never space or control bytes.
fn keys(pool: usize) -> Vec<Vec<u8>> {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64 ^ (pool as u64).wrapping_mul(0xd1b5_4a32_d192_ed03);
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..KEYS_PER_POOL)
        .map(|i| {
            let mut key = format!("{pool}.{i}:").into_bytes();
            let r = next();
            let len = match r % 10 {
                0 => 200 + (r >> 8) % 40,
                1..=3 => (r >> 8) % 4,
                _ => 4 + (r >> 8) % 40,
            };
            let high = r % 3 == 0;
            for _ in 0..len {
                let x = next();
                let b = if high && x % 4 == 0 {
                    0x80 + (x >> 8) % 0x80
                } else {
                    0x21 + (x >> 8) % 0x5e
                };
                key.push(b as u8);
            }
            key.truncate(250);
            key
        })
        .collect()
}

/// Stores every key through a twemproxy pool with pipelined `set`s, waiting for each reply.
fn store_through(listen: SocketAddr, keys: &[Vec<u8>]) {
    let mut payload = Vec::with_capacity(keys.len() * 64);
    for k in keys {
        payload.extend_from_slice(b"set ");
        payload.extend_from_slice(k);
        payload.extend_from_slice(b" 0 0 1\r\nx\r\n");
    }
    pipeline(listen, payload, |r| {
        for k in keys {
            let line = read_line(r, listen);
            assert_eq!(
                line,
                b"STORED\r\n",
                "set {} through {listen}: {}",
                String::from_utf8_lossy(k),
                String::from_utf8_lossy(&line)
            );
        }
    });
}

/// Which of `keys` the memcached at `addr` holds, by pipelined meta gets (`HD` hit, `EN` miss).
fn held_by(addr: SocketAddr, keys: &[Vec<u8>]) -> Vec<bool> {
    let mut payload = Vec::with_capacity(keys.len() * 64);
    for k in keys {
        payload.extend_from_slice(b"mg ");
        payload.extend_from_slice(k);
        payload.extend_from_slice(b"\r\n");
    }
    pipeline(addr, payload, |r| {
        keys.iter()
            .map(|k| match read_line(r, addr).as_slice() {
                b"HD\r\n" => true,
                b"EN\r\n" => false,
                other => panic!(
                    "mg {} at {addr}: {}",
                    String::from_utf8_lossy(k),
                    String::from_utf8_lossy(other)
                ),
            })
            .collect()
    })
}

/// Compares one pool; returns a failure description, or `None` when every key matched.
fn check(shape: &Shape, pool: usize) -> Option<String> {
    let keys = keys(pool);
    store_through(shape.listen, &keys);
    let mut owner: Vec<Option<usize>> = vec![None; keys.len()];
    for (index, (backend, _, _)) in shape.servers.iter().enumerate() {
        for (k, held) in held_by(backend.addr(), &keys).into_iter().enumerate() {
            if held {
                if let Some(other) = owner[k] {
                    return Some(format!(
                        "{}: key {:?} on servers {other} and {index}",
                        shape.label,
                        String::from_utf8_lossy(&keys[k])
                    ));
                }
                owner[k] = Some(index);
            }
        }
    }
    let ring = shape.ring();
    let mut bad = 0usize;
    let mut examples = String::new();
    for (key, owner) in keys.iter().zip(&owner) {
        let ours = ring.locate(key);
        if *owner != Some(ours) {
            bad += 1;
            if bad <= 5 {
                let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
                let _ = write!(
                    examples,
                    "\n  key {hex}: twemproxy {owner:?}, kvswitch {ours}"
                );
            }
        }
    }
    eprintln!(
        "{:<30} {:>6} keys, {:>6} mismatches",
        shape.label,
        keys.len(),
        bad
    );
    (bad > 0).then(|| {
        format!(
            "{}: {bad} of {} keys differ{examples}",
            shape.label,
            keys.len()
        )
    })
}

fn start_memcached(bin: &Path, backend: &Backend) -> Proc {
    let mut p = Proc::spawn(
        "memcached",
        Command::new(bin).args([
            "-p",
            &backend.port.to_string(),
            "-U",
            "0",
            "-l",
            backend.host,
            "-t",
            "1",
            "-m",
            "64",
            // Only used when running as root, where memcached refuses to start without it.
            "-u",
            "nobody",
        ]),
    );
    p.wait_listening(backend.addr(), None);
    p
}

#[test]
fn placement_matches_nutcracker() {
    let started = Instant::now();
    let nutcracker = require("nutcracker");
    let memcached = require("memcached");
    let dir = TempDir::new();
    let lo = Ipv4Addr::LOCALHOST;
    let ports = Ports::default();

    let local: Vec<Backend> = (0..3)
        .map(|_| Backend {
            host: "127.0.0.1",
            port: ports.pick(),
        })
        .collect();
    // A server on the default port, on another loopback address, exercises the rule that
    // twemproxy leaves port 11211 out of the ketama name.
    let default_port = Backend {
        host: "127.0.0.2",
        port: kv::MEMCACHED_DEFAULT_PORT,
    };
    let have_default_port = TcpListener::bind(default_port.addr()).is_ok();
    if !have_default_port {
        eprintln!(
            "warning: {} is busy; the port-11211 naming pool is skipped",
            default_port.addr()
        );
    }

    let mut backends = local.clone();
    if have_default_port {
        backends.push(default_port.clone());
    }
    ports.release();
    let _memcached: Vec<Proc> = backends
        .iter()
        .map(|b| start_memcached(&memcached, b))
        .collect();

    let equal = |_: usize| 1;
    let weighted = |i: usize| i as u32 + 1;
    let pool = |label: &str, dist, hash, weight: &dyn Fn(usize) -> u32| Shape {
        label: label.to_owned(),
        dist,
        hash,
        servers: local
            .iter()
            .enumerate()
            .map(|(i, b)| (b.clone(), weight(i), None))
            .collect(),
        listen: SocketAddr::from((lo, ports.pick())),
    };
    use Distribution::{Ketama, Modula};
    let mut shapes = vec![
        pool("ketama_md5_equal", Ketama, HashFn::Md5, &equal),
        pool("ketama_md5_weighted", Ketama, HashFn::Md5, &weighted),
        pool("ketama_fnv1a_64_equal", Ketama, HashFn::Fnv1a64, &equal),
        pool("modula_md5_weighted", Modula, HashFn::Md5, &weighted),
        pool("modula_fnv1a_64_equal", Modula, HashFn::Fnv1a64, &equal),
    ];
    let mut named = pool("ketama_md5_named", Ketama, HashFn::Md5, &weighted);
    for (server, name) in named.servers.iter_mut().zip(["alpha", "beta", "gamma"]) {
        server.2 = Some(name);
    }
    shapes.push(named);
    // Modula slots follow twemproxy's name-sorted server order ("mid" < "zeta" < "alpha"),
    // not the listed order.
    let mut modula_named = pool("modula_md5_named", Modula, HashFn::Md5, &weighted);
    for (server, name) in modula_named
        .servers
        .iter_mut()
        .zip(["zeta", "alpha", "mid"])
    {
        server.2 = Some(name);
    }
    shapes.push(modula_named);
    if have_default_port {
        let mut port_rule = pool("ketama_md5_port_11211", Ketama, HashFn::Md5, &equal);
        port_rule.servers[2].0 = default_port.clone();
        shapes.push(port_rule);
    }
    // Every other hash function, on a weighted ketama pool (ketama reads all 32 bits).
    for hash in HashFn::ALL {
        if hash != HashFn::Md5 && hash != HashFn::Fnv1a64 {
            let label = format!("ketama_{hash}_weighted");
            shapes.push(pool(&label, Ketama, hash, &weighted));
        }
    }

    let mut yaml = String::new();
    for shape in &shapes {
        shape.yaml(&mut yaml);
    }
    let conf = dir.0.join("nutcracker.yml");
    let log = dir.0.join("nutcracker.log");
    fs::write(&conf, &yaml).unwrap_or_else(|e| panic!("write {conf:?}: {e}"));
    let stats_port = ports.pick();
    ports.release();
    let mut proxy = Proc::spawn(
        "nutcracker",
        Command::new(&nutcracker)
            .arg("-c")
            .arg(&conf)
            .args(["-s", &stats_port.to_string(), "-a", "127.0.0.1"])
            .arg("-p")
            .arg(dir.0.join("nutcracker.pid"))
            .arg("-o")
            .arg(&log),
    );
    for shape in &shapes {
        proxy.wait_listening(shape.listen, Some(&log));
    }

    let failures: Vec<String> = thread::scope(|s| {
        let handles: Vec<_> = shapes
            .iter()
            .enumerate()
            .map(|(i, shape)| s.spawn(move || check(shape, i)))
            .collect();
        handles
            .into_iter()
            .filter_map(|h| match h.join() {
                Ok(result) => result,
                Err(_) => Some("a pool check panicked (see above)".to_owned()),
            })
            .collect()
    });

    eprintln!(
        "{} pools, {} keys each, in {:?}",
        shapes.len(),
        KEYS_PER_POOL,
        started.elapsed()
    );
    if !failures.is_empty() {
        panic!(
            "kvswitch placement differs from twemproxy:\n{}",
            failures.join("\n")
        );
    }
}
