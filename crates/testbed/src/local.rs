//! Tests on loopback, without namespaces: memcached and nutcracker on free ports, each stopped
//! by its own PID when dropped, and pipelined memcached exchanges to store keys through a proxy
//! and ask each server which of them it holds. Needs no root. Never signals a process it did
//! not start, and every wait is bounded.

use std::cell::RefCell;
use std::env;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context};

/// How long a process may take to start listening.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);
/// Read timeout of every exchange, so a wedged peer fails a test instead of hanging it.
pub const IO_TIMEOUT: Duration = Duration::from_secs(20);

/// Finds `program` on `PATH`, then in the sbin directories where distributions install
/// nutcracker (often missing from a non-root `PATH`).
pub fn require(program: &str) -> anyhow::Result<PathBuf> {
    let path = env::var_os("PATH").unwrap_or_default();
    let extra = ["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from);
    env::split_paths(&path)
        .chain(extra)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            anyhow!("`{program}` not found on PATH or in sbin: install it (scripts/setup.sh does)")
        })
}

/// A child process, killed (by its PID) and reaped when dropped.
pub struct Proc {
    name: String,
    child: Child,
}

impl Proc {
    /// Starts `cmd` with its standard streams closed.
    pub fn spawn(name: &str, cmd: &mut Command) -> anyhow::Result<Proc> {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        Ok(Proc {
            name: name.to_owned(),
            child,
        })
    }

    /// Starts `cmd` with stdin closed and stdout and stderr written to the file `log`
    /// (created, or emptied).
    pub fn spawn_logged(name: &str, cmd: &mut Command, log: &Path) -> anyhow::Result<Proc> {
        let out = fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone().context("duplicating a log descriptor")?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        Ok(Proc {
            name: name.to_owned(),
            child,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `limit` for the process to exit and returns its status. Past `limit` it is
    /// killed and reaped, and the wait fails.
    pub fn wait_exit(&mut self, limit: Duration) -> anyhow::Result<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!("{} still running after {limit:?}; killed", self.name);
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until `addr` accepts connections. Fails if the process exits first or
    /// [`START_TIMEOUT`] passes; the error then holds `log`'s content when given.
    pub fn wait_listening(&mut self, addr: SocketAddr, log: Option<&Path>) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        let log_text = || {
            log.and_then(|p| fs::read_to_string(p).ok())
                .unwrap_or_default()
        };
        loop {
            if let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
                // A connect to a loopback port nobody listens on can pick that same port as
                // its source and connect to itself; that is not the process listening.
                if s.local_addr().ok() != s.peer_addr().ok() {
                    return Ok(());
                }
            }
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "{} exited ({status}) before listening on {addr}\n{}",
                    self.name,
                    log_text()
                );
            }
            if Instant::now() > deadline {
                bail!(
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
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new directory under the system's temporary directory, named after `tag`, this
    /// process and the time.
    pub fn new(tag: &str) -> anyhow::Result<TempDir> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir = env::temp_dir().join(format!("{tag}-{}-{nanos}", std::process::id()));
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(TempDir(dir))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Free TCP ports, each held by a bound listener until [`Ports::release`], so two picks never
/// return the same port.
#[derive(Default)]
pub struct Ports(RefCell<Vec<TcpListener>>);

impl Ports {
    /// A port free on `ip` now.
    pub fn pick(&self, ip: IpAddr) -> anyhow::Result<u16> {
        let listener = TcpListener::bind((ip, 0)).context("picking a free port")?;
        let port = listener.local_addr().context("picking a free port")?.port();
        self.0.borrow_mut().push(listener);
        Ok(port)
    }

    /// Frees the picked ports for the processes about to listen on them.
    pub fn release(&self) {
        self.0.borrow_mut().clear();
    }
}

/// Starts memcached `bin` on TCP `addr` only (UDP off, one thread, 64 MiB) and waits until it
/// listens.
pub fn memcached(bin: &Path, addr: SocketAddr) -> anyhow::Result<Proc> {
    let mut p = Proc::spawn(
        "memcached",
        Command::new(bin).args([
            "-p",
            &addr.port().to_string(),
            "-U",
            "0",
            "-l",
            &addr.ip().to_string(),
            "-t",
            "1",
            "-m",
            "64",
            // Only used when running as root, where memcached refuses to start without it.
            "-u",
            "nobody",
        ]),
    )?;
    p.wait_listening(addr, None)?;
    Ok(p)
}

/// redis-server `bin` on `addr`, in memory only (no snapshots, no append-only file), with
/// `extra` settings (`--requirepass secret`, ...).
pub fn redis_server(bin: &Path, addr: SocketAddr, extra: &[&str]) -> anyhow::Result<Proc> {
    let mut cmd = Command::new(bin);
    cmd.args([
        "--port",
        &addr.port().to_string(),
        "--bind",
        &addr.ip().to_string(),
    ])
    .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
    .args(extra);
    let mut p = Proc::spawn("redis-server", &mut cmd)?;
    p.wait_listening(addr, None)?;
    Ok(p)
}

/// Has the kernel SIGKILL the child `cmd` starts when the thread that starts it exits, so a
/// caller killed without running its destructors leaves no process behind. Only for callers
/// whose starting thread outlives the child's use (a command's main thread, not a test's).
pub fn die_with_parent(cmd: &mut Command) -> &mut Command {
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// nutcracker `bin` on configuration `conf` with its stats on 127.0.0.1:`stats_port` and its
/// log (`nutcracker.log`) and PID file in `dir`.
pub fn nutcracker_command(bin: &Path, conf: &Path, dir: &Path, stats_port: u16) -> Command {
    let mut cmd = Command::new(bin);
    cmd.arg("-c")
        .arg(conf)
        .args(["-s", &stats_port.to_string(), "-a", "127.0.0.1"])
        .arg("-p")
        .arg(dir.join("nutcracker.pid"))
        .arg("-o")
        .arg(dir.join("nutcracker.log"));
    cmd
}

/// Starts nutcracker as [`nutcracker_command`] says and waits until every address in `listen`
/// accepts connections (the error then holds nutcracker's log).
pub fn nutcracker(
    bin: &Path,
    conf: &Path,
    dir: &Path,
    stats_port: u16,
    listen: &[SocketAddr],
) -> anyhow::Result<Proc> {
    let log = dir.join("nutcracker.log");
    let mut p = Proc::spawn(
        "nutcracker",
        &mut nutcracker_command(bin, conf, dir, stats_port),
    )?;
    for &addr in listen {
        p.wait_listening(addr, Some(&log))?;
    }
    Ok(p)
}

/// Sends `payload` from a second thread while `read` consumes the replies, so neither side's
/// socket buffer can fill up and deadlock a long pipeline.
fn pipeline<T>(
    addr: SocketAddr,
    payload: Vec<u8>,
    read: impl FnOnce(&mut dyn BufRead) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let stream = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    let _ = stream.set_nodelay(true);
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    let mut writer = stream.try_clone()?;
    let sender = thread::spawn(move || writer.write_all(&payload));
    let mut reader = BufReader::with_capacity(1 << 16, stream);
    let out = read(&mut reader);
    match sender.join() {
        Ok(Ok(())) => out,
        Ok(Err(e)) => Err(anyhow!(e).context(format!("writing to {addr}"))),
        Err(_) => bail!("writer thread for {addr} panicked"),
    }
}

fn read_line(r: &mut dyn BufRead, addr: SocketAddr) -> anyhow::Result<Vec<u8>> {
    let mut line = Vec::new();
    match r.read_until(b'\n', &mut line) {
        Ok(0) => bail!("{addr} closed the connection"),
        Ok(_) => Ok(line),
        Err(e) => Err(anyhow!(e).context(format!("reading from {addr}"))),
    }
}

/// Stores every key (value `x`) at `addr`, a memcached or a proxy, with pipelined `set`s,
/// and checks that each is `STORED`.
pub fn store(addr: SocketAddr, keys: &[Vec<u8>]) -> anyhow::Result<()> {
    let mut payload = Vec::with_capacity(keys.len() * 64);
    for k in keys {
        payload.extend_from_slice(b"set ");
        payload.extend_from_slice(k);
        payload.extend_from_slice(b" 0 0 1\r\nx\r\n");
    }
    pipeline(addr, payload, |r| {
        for k in keys {
            let line = read_line(r, addr)?;
            if line != b"STORED\r\n" {
                bail!(
                    "set {} through {addr}: {}",
                    String::from_utf8_lossy(k),
                    String::from_utf8_lossy(&line)
                );
            }
        }
        Ok(())
    })
}

/// Which of `keys` the memcached at `addr` holds, by pipelined meta gets (`HD` hit, `EN`
/// miss).
pub fn held_by(addr: SocketAddr, keys: &[Vec<u8>]) -> anyhow::Result<Vec<bool>> {
    let mut payload = Vec::with_capacity(keys.len() * 64);
    for k in keys {
        payload.extend_from_slice(b"mg ");
        payload.extend_from_slice(k);
        payload.extend_from_slice(b"\r\n");
    }
    pipeline(addr, payload, |r| {
        keys.iter()
            .map(|k| match read_line(r, addr)?.as_slice() {
                b"HD\r\n" => Ok(true),
                b"EN\r\n" => Ok(false),
                other => bail!(
                    "mg {} at {addr}: {}",
                    String::from_utf8_lossy(k),
                    String::from_utf8_lossy(other)
                ),
            })
            .collect()
    })
}

/// For each key, the index in `servers` of the memcached that holds it (`None`: none does).
/// Fails if a key is held by two servers.
pub fn owners(servers: &[SocketAddr], keys: &[Vec<u8>]) -> anyhow::Result<Vec<Option<usize>>> {
    let mut owner: Vec<Option<usize>> = vec![None; keys.len()];
    for (index, &addr) in servers.iter().enumerate() {
        for (k, held) in held_by(addr, keys)?.into_iter().enumerate() {
            if !held {
                continue;
            }
            if let Some(other) = owner[k] {
                bail!(
                    "key {:?} is on servers {other} and {index}",
                    String::from_utf8_lossy(&keys[k])
                );
            }
            owner[k] = Some(index);
        }
    }
    Ok(owner)
}

/// Shrinks a socket's receive buffer to about `bytes` (the kernel doubles it), so that a
/// client that does not read leaves its replies in the server it talks to.
pub fn set_recv_buffer(socket: &std::net::TcpStream, bytes: i32) {
    use std::os::fd::AsRawFd;
    // SAFETY: setsockopt reads `size_of::<i32>()` bytes from a live i32 on an open socket.
    unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&bytes as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        );
    }
}
