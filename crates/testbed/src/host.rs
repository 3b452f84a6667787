//! One host of a testbed: its namespace and link, the servers started in it and waited for,
//! and the files and processes recorded in the state before they exist.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use anyhow::Context;

use crate::netns::{self, in_netns, ip, ns_run, sysctl};
use crate::probe;
use crate::process;
use crate::state::{HostState, ProcRecord, State};
use crate::topology::{Mode, Role, MEMCACHED_PORT, REDIS_PORT};
use crate::ServerProgram;

/// memcached and nutcracker start in milliseconds; this only bounds a broken start.
pub(crate) const DAEMON_READY: Duration = Duration::from_secs(5);
/// Lines of a daemon log quoted in errors.
pub(crate) const LOG_TAIL: usize = 20;
/// The SwitchKV control port of `kvswitch node` (its default).
pub(crate) const CONTROL_PORT: u16 = 11311;

/// The key the testbed's SwitchKV backends and cache nodes share (`--control-key-file`).
pub(crate) fn control_key_file(state: &State) -> PathBuf {
    state.work_dir.join("switchkv-control-key")
}

/// FNV-1a of the prefix folded to one byte.
pub(crate) fn prefix_byte(prefix: &str) -> u8 {
    let h = wire::fnv::fnv1a(prefix.as_bytes());
    (h ^ (h >> 8) ^ (h >> 16) ^ (h >> 24)) as u8
}

pub(crate) fn free_port() -> anyhow::Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0").context("finding a free port for the kvswitch API")?;
    Ok(l.local_addr()?)
}

/// Creates the namespace and the veth pair and configures both ends.
pub(crate) fn create_host(state: &mut State, h: &HostState) -> anyhow::Result<()> {
    let ns = h.netns.as_str();
    let cidr = format!("{}/{}", h.ip, h.prefix_len);
    host_link(ns, &h.switch_if, &h.mac, &cidr)?;
    if state.mode == Mode::L2 && h.role == Role::Server {
        // Servers accept traffic for the VIP but must not answer ARP for it: only the switch does.
        let vip = format!("{}/32", state.vip);
        ip(&["-n", ns, "addr", "add", &vip, "dev", "lo"])?;
        sysctl(
            Some(ns),
            &[
                ("net.ipv4.conf.all.arp_ignore", "1"),
                ("net.ipv4.conf.all.arp_announce", "2"),
                ("net.ipv4.conf.eth0.arp_ignore", "1"),
                ("net.ipv4.conf.eth0.arp_announce", "2"),
            ],
        )?;
    }
    ip(&["-n", ns, "link", "set", "dev", "eth0", "up"])?;
    // Receive coalescing gives the veth a NAPI context, which frames the switch's XDP program
    // sends here from the kernel need (without it they are dropped). The kernel sets it up
    // only when GRO is turned on while the link is up, hence off above and on here.
    let _ = ns_run(ns, "ethtool", &["-K", "eth0", "gro", "on"]);
    Ok(())
}

/// A host's namespace `ns` with IPv6 off and its `eth0` (MAC `mac`, address `cidr`, still
/// down), joined by a veth pair to `switch_if` in the root namespace (up, no receive
/// coalescing, no transmit offloads, for a switch that reads it with AF_PACKET).
pub(crate) fn host_link(ns: &str, switch_if: &str, mac: &str, cidr: &str) -> anyhow::Result<()> {
    let v6 = netns::have_ipv6();
    ip(&["netns", "add", ns])?;
    // Set before eth0 exists so it is born without IPv6 and never sends router solicitations.
    if v6 {
        sysctl(
            Some(ns),
            &[
                ("net.ipv6.conf.all.disable_ipv6", "1"),
                ("net.ipv6.conf.default.disable_ipv6", "1"),
            ],
        )?;
    }
    ip(&[
        "link", "add", switch_if, "type", "veth", "peer", "name", "eth0", "netns", ns,
    ])?;
    if v6 {
        sysctl(
            None,
            &[(&format!("net.ipv6.conf.{switch_if}.disable_ipv6"), "1")],
        )?;
    }
    ip(&["link", "set", "dev", switch_if, "up"])?;
    // The switch reads this end with AF_PACKET: no coalescing of received segments.
    let _ = super::netns::run("ethtool", &["-K", switch_if, "gro", "off", "tx", "off"]);

    ip(&["-n", ns, "link", "set", "dev", "lo", "up"])?;
    ip(&["-n", ns, "link", "set", "dev", "eth0", "address", mac])?;
    ip(&["-n", ns, "addr", "add", cidr, "dev", "eth0"])?;
    if v6 {
        sysctl(Some(ns), &[("net.ipv6.conf.eth0.disable_ipv6", "1")])?;
    }
    // Without this the kernel leaves TCP/UDP checksums for "hardware" that a veth never has, and
    // the switch reads frames with partial checksums. It also turns off TSO, so no frame is
    // larger than the MTU.
    ns_run(ns, "ethtool", &["-K", "eth0", "tx", "off"])?;
    // Segmentation offloads would hand the switch frames larger than the MTU; best effort, as
    // not every kernel lets each of them be changed.
    let _ = ns_run(ns, "ethtool", &["-K", "eth0", "gso", "off", "gro", "off"]);
    Ok(())
}

/// "memcached" or "kvswitch node", for messages and the state file.
pub(crate) fn server_name(program: &ServerProgram) -> &'static str {
    match program {
        ServerProgram::Memcached => "memcached",
        ServerProgram::Node { .. } => "kvswitch node",
        ServerProgram::Redis => "redis-server",
    }
}

/// Starts server `i`'s program; with `cache`, as a SwitchKV backend of the cache node there.
pub(crate) fn start_server(
    state: &mut State,
    i: usize,
    memcached_args: &[String],
    program: &ServerProgram,
    cache: Option<Ipv4Addr>,
) -> anyhow::Result<Child> {
    let (bin, args) = match program {
        ServerProgram::Memcached => return start_memcached(state, i, memcached_args),
        ServerProgram::Redis => return start_redis(state, i),
        ServerProgram::Node { bin, args } => (bin, args),
    };
    let h = state.hosts[i].clone();
    let mut argv = vec![
        bin.display().to_string(),
        "node".to_string(),
        "--listen".to_string(),
        format!("{}:{MEMCACHED_PORT}", h.ip),
    ];
    if let Some(cache) = cache {
        argv.extend([
            "--role".to_string(),
            "backend".to_string(),
            "--cache-node".to_string(),
            format!("{cache}:{CONTROL_PORT}"),
            "--control-key-file".to_string(),
            control_key_file(state).display().to_string(),
        ]);
    }
    argv.extend(args.iter().cloned());
    let log = state.work_dir.join(format!("node-{}.log", h.name));
    record_file(state, &log)?;
    state.hosts[i].log = Some(log.clone());
    let child = process::spawn(Some(&h.netns), &argv, &log)?;
    record_proc(state, &child, "kvswitch node", Some(&h.netns), argv)?;
    state.hosts[i].pids.push(child.id());
    state.save()?;
    Ok(child)
}

/// redis-server on host `i`, port 6379, keeping nothing on disk.
fn start_redis(state: &mut State, i: usize) -> anyhow::Result<Child> {
    let h = state.hosts[i].clone();
    let bind = match state.mode {
        Mode::L3 => h.ip.to_string(),
        // In l2 mode requests arrive for the VIP, which the host owns on lo.
        Mode::L2 => format!("{} {}", h.ip, state.vip),
    };
    let argv: Vec<String> = [
        "redis-server",
        "--bind",
        &bind,
        "--port",
        &REDIS_PORT.to_string(),
        "--protected-mode",
        "no",
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        // Its command line stays as started: processes are signalled only while it matches.
        "--set-proc-title",
        "no",
        "--dir",
        &state.work_dir.display().to_string(),
        "--dbfilename",
        &format!("redis-{}.rdb", h.name),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let log = state.work_dir.join(format!("redis-{}.log", h.name));
    record_file(state, &log)?;
    state.hosts[i].log = Some(log.clone());
    let child = process::spawn(Some(&h.netns), &argv, &log)?;
    record_proc(state, &child, "redis-server", Some(&h.netns), argv)?;
    state.hosts[i].pids.push(child.id());
    state.save()?;
    Ok(child)
}

pub(crate) fn start_memcached(
    state: &mut State,
    i: usize,
    extra: &[String],
) -> anyhow::Result<Child> {
    let h = state.hosts[i].clone();
    let listen = match state.mode {
        Mode::L3 => h.ip.to_string(),
        // The VIP sits on lo, so memcached listens on it as well as on the host address: a
        // socket bound to the VIP answers UDP from the VIP, which is what the client expects.
        Mode::L2 => format!("{},{}", state.vip, h.ip),
    };
    let port = MEMCACHED_PORT.to_string();
    let mut argv: Vec<String> = [
        "memcached",
        "-U",
        &port,
        "-p",
        &port,
        "-l",
        &listen,
        // memcached refuses to run as root unless told which user to run as.
        "-u",
        "root",
        "-m",
        "64",
        "-t",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    argv.extend(extra.iter().cloned());
    let log = state.work_dir.join(format!("memcached-{}.log", h.name));
    record_file(state, &log)?;
    state.hosts[i].log = Some(log.clone());
    let child = process::spawn(Some(&h.netns), &argv, &log)?;
    record_proc(state, &child, "memcached", Some(&h.netns), argv)?;
    state.hosts[i].pids.push(child.id());
    state.save()?;
    Ok(child)
}

/// Waits until `what`, just started as `child` on host `i`, answers `version` on memcached's
/// port, or fails with the tail of its log.
pub(crate) fn answers_version(
    state: &State,
    i: usize,
    mut child: Child,
    limit: Duration,
    what: &str,
) -> anyhow::Result<()> {
    let h = &state.hosts[i];
    let redis = what == server_name(&ServerProgram::Redis);
    let port = if redis { REDIS_PORT } else { MEMCACHED_PORT };
    let addr = SocketAddr::V4(SocketAddrV4::new(h.ip, port));
    let log = h.log.clone().unwrap_or_default();
    probe::wait_for(
        limit,
        || exited(&mut child),
        || match redis {
            true => in_netns(&h.netns, || probe::redis_ping(addr))?,
            false => in_netns(&h.netns, || probe::memcached_version(addr))?.map(drop),
        },
    )
    .with_context(|| {
        format!(
            "{what} on {:?} did not answer `{}` on {addr}; log:\n{}",
            h.name,
            if redis { "PING" } else { "version" },
            process::tail(&log, LOG_TAIL)
        )
    })?;
    Ok(())
}

/// A fresh API token: 128 bits from the operating system, in hex.
pub(crate) fn new_token() -> anyhow::Result<String> {
    random_hex::<16>().context("reading /dev/urandom for the API token")
}

/// `N` random bytes as hex digits.
pub(crate) fn random_hex<const N: usize>() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; N];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Some(reason) once the child has exited, so readiness polling stops early.
pub(crate) fn exited(child: &mut Child) -> Option<String> {
    match child.try_wait() {
        Ok(Some(status)) => Some(format!("process {} exited ({status})", child.id())),
        _ => None,
    }
}

pub(crate) fn record_proc(
    state: &mut State,
    child: &Child,
    what: &str,
    netns: Option<&str>,
    argv: Vec<String>,
) -> anyhow::Result<()> {
    state.procs.push(ProcRecord {
        pid: child.id(),
        what: what.to_string(),
        netns: netns.map(str::to_string),
        argv,
    });
    state.save()
}

/// Records a file before it is created.
pub(crate) fn record_file(state: &mut State, path: &Path) -> anyhow::Result<()> {
    if !state.files.iter().any(|f| f == path) {
        state.files.push(path.to_path_buf());
        state.save()?;
    }
    Ok(())
}

pub(crate) fn write_file(state: &mut State, path: &Path, text: &str) -> anyhow::Result<()> {
    record_file(state, path)?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Writes a secret (`text`) to `path`, readable by its owner alone, recorded in the state.
pub(crate) fn write_secret(state: &mut State, path: &Path, text: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    record_file(state, path)?;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()))
        .with_context(|| format!("writing {}", path.display()))
}
