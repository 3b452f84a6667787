//! Certificates for the TLS tests, made by openssl, and a `kvswitch proxy` started on a
//! configuration of the test's own.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use super::proxy::{free_port, until_listening};
use super::Running;

const BIN: &str = env!("CARGO_BIN_EXE_kvswitch");

pub fn run(program: &str, args: &[&str], dir: &Path) -> Output {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A certificate authority `name`.crt/.key in `dir`.
pub fn authority(dir: &Path, name: &str) {
    run(
        "openssl",
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.crt"),
        ],
        dir,
    );
}

/// A certificate `name`.crt/.key in `dir` signed by the authority `ca`, for a server at
/// 127.0.0.1 (`usage` "serverAuth") or a client ("clientAuth").
pub fn certificate(dir: &Path, ca: &str, name: &str, usage: &str) {
    std::fs::write(
        dir.join(format!("{name}.ext")),
        format!("subjectAltName=IP:127.0.0.1\nextendedKeyUsage={usage}\n"),
    )
    .unwrap();
    run(
        "openssl",
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
        ],
        dir,
    );
    run(
        "openssl",
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.crt"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
            "-out",
            &format!("{name}.crt"),
        ],
        dir,
    );
}

/// The proxy with `extra` lines in `[proxy]`, in `dir`, in front of `server`; its client
/// address and API.
pub fn start_proxy(
    dir: &Path,
    server: SocketAddr,
    extra: &str,
) -> (Running, SocketAddr, SocketAddr) {
    start_proxy_named(dir, "proxy", &[("s1", server)], extra)
}

/// The same, its file `name.toml` and log `name.log` in `dir`, in front of the named
/// `servers`.
pub fn start_proxy_named(
    dir: &Path,
    name: &str,
    servers: &[(&str, SocketAddr)],
    extra: &str,
) -> (Running, SocketAddr, SocketAddr) {
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let api = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let config = dir.join(format!("{name}.toml"));
    let mut text = format!(
        "[proxy]\nlisten = \"{listen}\"\napi = \"{api}\"\nworkers = 1\n{extra}\n\n[pool]\n"
    );
    for (n, addr) in servers {
        text.push_str(&format!(
            "[[pool.servers]]\naddr = \"{addr}\"\nname = \"{n}\"\n"
        ));
    }
    std::fs::write(&config, text).unwrap();
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    let proxy = Running(
        Command::new(BIN)
            .args(["proxy", "--config"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start the proxy"),
    );
    until_listening(&[listen, api], "proxy");
    (proxy, listen, api)
}

pub fn metrics(api: SocketAddr) -> String {
    testbed::http_get(api, "/metrics").expect("metrics").1
}

pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// A memcached on a free loopback port (one thread, UDP off) with what `configure` adds to
/// its command line and environment, such as `-Z` or `-S`; killed by PID when dropped.
pub fn memcached_with(configure: impl FnOnce(&mut Command)) -> (Running, SocketAddr) {
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut command = Command::new("memcached");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        command.args(["-u", "root"]);
    }
    command
        .args(["-U", "0", "-t", "1", "-l"])
        .arg(addr.to_string());
    configure(&mut command);
    let server = Running(
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("memcached runs"),
    );
    until_listening(&[addr], "memcached");
    (server, addr)
}
