//! TLS between clients and `kvswitch proxy`, as `memcached -Z` serves it: Python's ssl with
//! pymemcache through the proxy to a plain memcached, certificates made by openssl; a client
//! that does not trust the certificate refused; a certificate rotated by SIGHUP while clients
//! flow; client certificates asked for with an authority.

mod common;

use common::Running;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::proxy::Memcached;
use common::tls::{authority, certificate, memcached_with, metrics, sample, start_proxy};

const BIN: &str = env!("CARGO_BIN_EXE_kvswitch");

/// `kvswitch load` in `dir` against `listen` with `extra` arguments: `keys` keys preloaded,
/// then 1 s of pipelined gets and sets (80% gets) by `concurrency` connections; its report.
fn load(
    dir: &Path,
    listen: SocketAddr,
    extra: &[&str],
    keys: u32,
    concurrency: u32,
) -> serde_json::Value {
    let out = Command::new(BIN)
        .args(["load", "--proto", "tcp", "--target"])
        .arg(listen.to_string())
        .args(extra)
        .args(["--preload", "--keys", &keys.to_string()])
        .args(["--concurrency", &concurrency.to_string(), "--duration", "1"])
        .args(["--get-ratio", "0.8", "--json", "load.json"])
        .current_dir(dir)
        .output()
        .expect("kvswitch load runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(dir.join("load.json")).unwrap()).unwrap()
}

/// Runs a Python program with `args`; its standard output.
fn python(program: &str, args: &[String]) -> Output {
    Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(program)
        .args(args)
        .output()
        .expect("python3 runs")
}

/// Sets and gets `n` keys over TLS trusting `ca`, optionally with a client certificate; prints
/// "ok N" or the error.
const CLIENT: &str = r#"
import ssl, sys
from pymemcache.client.base import Client
port, ca, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
ctx = ssl.create_default_context(cafile=ca)
if len(sys.argv) > 4:
    ctx.load_cert_chain(sys.argv[4], sys.argv[5])
try:
    c = Client(("127.0.0.1", port), tls_context=ctx, connect_timeout=5, timeout=5)
    good = 0
    for i in range(n):
        value = ("v%d-" % i) * (1 + i % 50)
        c.set("tls:%d" % i, value)
        if c.get("tls:%d" % i) == value.encode():
            good += 1
    print("ok", good)
except Exception as e:
    print("error", type(e).__name__, e)
"#;

#[test]
fn tls_clients_are_served_and_a_client_that_does_not_trust_the_proxy_refused() {
    let scratch = testbed::local::TempDir::new("kvswitch-proxy-tls").expect("scratch");
    let dir = scratch.path();
    authority(dir, "ca");
    authority(dir, "other-ca");
    certificate(dir, "ca", "proxy", "serverAuth");
    let server = Memcached::start();
    let (_proxy, listen, api) = start_proxy(
        dir,
        server.addr(),
        "tls_cert = \"proxy.crt\"\ntls_key = \"proxy.key\"",
    );
    // The probe that saw the proxy listen made no handshake: counted from here on.
    let failed = "kvswitch_proxy_tls_handshakes_total{outcome=\"failed\"}";
    let before = handshakes_failed(api);
    let port = listen.port().to_string();
    let ca = dir.join("ca.crt").display().to_string();
    let out = python(CLIENT, &[port.clone(), ca, "200".into()]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok 200");
    // kvswitch's own load generator over TLS: preloaded, then 1 s of pipelined gets and sets.
    let report = load(dir, listen, &["--tls-ca", "ca.crt"], 100, 4);
    assert_eq!(report["errors"], 0, "{report}");
    assert_eq!(report["timeouts"], 0, "{report}");
    assert!(report["gets"].as_u64().unwrap() > 100, "{report}");
    assert_eq!(report["misses"], 0, "every key was preloaded: {report}");
    // The values are on the server, in clear: the proxy's own connection is plain.
    let mut plain = common::proxy::Conn::open(server.addr());
    let got = plain.call(b"get tls:7\r\n", common::ends_with_end);
    assert!(got.starts_with(b"VALUE tls:7 0"), "{got:?}");

    // A client trusting another authority is refused in the handshake, and counted.
    let other = dir.join("other-ca.crt").display().to_string();
    let out = python(CLIENT, &[port, other, "1".into()]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("CERTIFICATE_VERIFY_FAILED"), "{said}");
    // A client that speaks memcached in clear gets no reply: its bytes are no handshake.
    let mut clear = std::net::TcpStream::connect(listen).unwrap();
    clear
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    use std::io::{Read, Write};
    clear.write_all(b"version\r\n").unwrap();
    let mut reply = Vec::new();
    let _ = clear.read_to_end(&mut reply);
    assert!(!reply.starts_with(b"VERSION"), "{reply:?}");

    let text = until_sample(api, failed, before + 2.0);
    api::metrics::lint(&text).unwrap_or_else(|e| panic!("/metrics: {e}"));
    // pymemcache's one connection, the load's preload and its four.
    let done = "kvswitch_proxy_tls_handshakes_total{outcome=\"done\"}";
    assert_eq!(sample(&text, done), Some(6.0), "{text}");
    // Both refused clients are gone from the gauges.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = metrics(api);
        let open = sample(&text, "kvswitch_proxy_client_connections{pool=\"default\"}");
        if open == Some(0.0) {
            break;
        }
        assert!(Instant::now() < deadline, "{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Four clients at about 1,000 requests a second together, over TLS, while the certificate
/// is replaced and the proxy sent SIGHUP: no request fails, and new connections see the new
/// certificate. Files that do not load on a later SIGHUP are refused and the last good ones
/// kept.
#[test]
fn a_certificate_rotated_by_sighup_while_clients_flow_fails_no_request() {
    let scratch = testbed::local::TempDir::new("kvswitch-proxy-tls-rotate").expect("scratch");
    let dir = scratch.path();
    authority(dir, "ca");
    certificate(dir, "ca", "first", "serverAuth");
    certificate(dir, "ca", "second", "serverAuth");
    for ext in ["crt", "key"] {
        std::fs::copy(
            dir.join(format!("first.{ext}")),
            dir.join(format!("proxy.{ext}")),
        )
        .unwrap();
    }
    let server = Memcached::start();
    let (proxy, listen, api) = start_proxy(
        dir,
        server.addr(),
        "tls_cert = \"proxy.crt\"\ntls_key = \"proxy.key\"",
    );
    const LOAD: &str = r#"
import ssl, sys, threading, time
from pymemcache.client.base import Client
port, ca, seconds = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
ctx = ssl.create_default_context(cafile=ca)
ok, errors = [0], []
def run(t):
    end = time.monotonic() + seconds
    i = 0
    c = None
    while time.monotonic() < end:
        try:
            # A new connection, so a new handshake, every 25 requests: handshakes go on
            # before, across and after the reload.
            if i % 25 == 0:
                if c is not None:
                    c.close()
                c = Client(("127.0.0.1", port), tls_context=ctx, connect_timeout=5, timeout=5)
            c.set("rot:%d:%d" % (t, i % 100), "x" * 20)
            ok[0] += 1
        except Exception as e:
            errors.append(repr(e))
        i += 1
        time.sleep(0.004)
threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
[t.start() for t in threads]
[t.join() for t in threads]
print(ok[0], len(errors), errors[:3])
"#;
    let load = Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(LOAD)
        .args([
            listen.port().to_string(),
            dir.join("ca.crt").display().to_string(),
            "3".to_string(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    std::thread::sleep(Duration::from_millis(1200));
    for ext in ["crt", "key"] {
        std::fs::copy(
            dir.join(format!("second.{ext}")),
            dir.join(format!("proxy.{ext}")),
        )
        .unwrap();
    }
    // SAFETY: kill takes no pointers; the PID is our own child's.
    unsafe { libc::kill(proxy.0.id() as libc::pid_t, libc::SIGHUP) };
    let out = load.wait_with_output().expect("the load ends");
    let said = String::from_utf8_lossy(&out.stdout);
    let mut words = said.split_whitespace();
    let ok: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
    let failed: u64 = words
        .next()
        .and_then(|w| w.parse().ok())
        .unwrap_or(u64::MAX);
    assert_eq!(failed, 0, "{said}");
    // At most about 2,600 in 3 s (four clients pausing 4 ms between requests); a loaded
    // machine gives fewer, but far more than the 100 that span the reload.
    assert!(ok > 300, "only {ok} requests in 3 s: {said}");

    // A new connection is shown the second certificate.
    const PEER: &str = r#"
import socket, ssl, sys, hashlib
ctx = ssl.create_default_context(cafile=sys.argv[2])
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5) as s:
    with ctx.wrap_socket(s, server_hostname="127.0.0.1") as t:
        print(hashlib.sha256(t.getpeercert(binary_form=True)).hexdigest())
print(hashlib.sha256(ssl.PEM_cert_to_DER_cert(open(sys.argv[3]).read())).hexdigest())
"#;
    let peer = |expected: &str| {
        let out = python(
            PEER,
            &[
                listen.port().to_string(),
                dir.join("ca.crt").display().to_string(),
                dir.join(expected).display().to_string(),
            ],
        );
        let said = String::from_utf8_lossy(&out.stdout).to_string();
        let lines: Vec<&str> = said.lines().collect();
        assert_eq!(
            lines.len(),
            2,
            "{said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        lines[0] == lines[1]
    };
    assert!(
        peer("second.crt"),
        "the proxy still shows the first certificate"
    );
    // A broken file on the next SIGHUP is refused; the second certificate stays in use.
    std::fs::write(dir.join("proxy.crt"), "not a certificate\n").unwrap();
    // SAFETY: as above.
    unsafe { libc::kill(proxy.0.id() as libc::pid_t, libc::SIGHUP) };
    let deadline = Instant::now() + Duration::from_secs(5);
    let refused = "kvswitch_proxy_tls_reloads_total{outcome=\"refused\"}";
    while sample(&metrics(api), refused) != Some(1.0) {
        assert!(Instant::now() < deadline, "{}", metrics(api));
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = metrics(api);
    assert_eq!(
        sample(&text, "kvswitch_proxy_tls_reloads_total{outcome=\"done\"}"),
        Some(1.0)
    );
    assert!(peer("second.crt"));
    let log = std::fs::read_to_string(dir.join("proxy.log")).unwrap();
    assert!(
        log.contains("clients' TLS files kept as they were") && log.contains("proxy.crt"),
        "{log}"
    );
}

/// With an authority for clients, a client must show a certificate it signed.
#[test]
fn a_client_certificate_is_asked_for_with_tls_client_ca() {
    let scratch = testbed::local::TempDir::new("kvswitch-proxy-tls-clients").expect("scratch");
    let dir = scratch.path();
    authority(dir, "ca");
    authority(dir, "clients-ca");
    authority(dir, "stranger-ca");
    certificate(dir, "ca", "proxy", "serverAuth");
    certificate(dir, "clients-ca", "alice", "clientAuth");
    certificate(dir, "stranger-ca", "mallory", "clientAuth");
    let server = Memcached::start();
    let (_proxy, listen, api) = start_proxy(
        dir,
        server.addr(),
        "tls_cert = \"proxy.crt\"\ntls_key = \"proxy.key\"\ntls_client_ca = \"clients-ca.crt\"",
    );
    let before = handshakes_failed(api);
    let path = |f: &str| dir.join(f).display().to_string();
    let port = listen.port().to_string();
    let with = |name: Option<&str>| {
        let mut args = vec![port.clone(), path("ca.crt"), "5".to_string()];
        if let Some(name) = name {
            args.push(path(&format!("{name}.crt")));
            args.push(path(&format!("{name}.key")));
        }
        String::from_utf8_lossy(&python(CLIENT, &args).stdout)
            .trim()
            .to_string()
    };
    assert_eq!(with(Some("alice")), "ok 5");
    assert!(with(None).starts_with("error"), "no certificate");
    assert!(
        with(Some("mallory")).starts_with("error"),
        "another authority's"
    );
    until_sample(
        api,
        "kvswitch_proxy_tls_handshakes_total{outcome=\"failed\"}",
        before + 2.0,
    );
}

/// The metrics once `series` reads `value`, within 5 s (a refused handshake is counted just
/// after its connection closes); fails naming what it read.
fn until_sample(api: SocketAddr, series: &str, value: f64) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = metrics(api);
        if sample(&text, series) == Some(value) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{series} is not {value}:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Handshakes failed so far, once the count has settled (the probe that saw the proxy listen
/// closes without one).
fn handshakes_failed(api: SocketAddr) -> f64 {
    let series = "kvswitch_proxy_tls_handshakes_total{outcome=\"failed\"}";
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = metrics(api);
        let open = sample(&text, "kvswitch_proxy_client_connections{pool=\"default\"}");
        let accepted = sample(
            &text,
            "kvswitch_proxy_client_connections_total{pool=\"default\"}",
        );
        let settled = open == Some(0.0) && accepted.is_some_and(|n| n >= 1.0);
        if settled || Instant::now() > deadline {
            return sample(&text, series).unwrap_or(0.0);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Files that are missing, hold no certificate, or a key of another certificate are refused
/// at `--check` with the file named.
#[test]
fn tls_files_that_do_not_load_are_refused_by_name() {
    let scratch = testbed::local::TempDir::new("kvswitch-proxy-tls-files").expect("scratch");
    let dir = scratch.path();
    authority(dir, "ca");
    certificate(dir, "ca", "one", "serverAuth");
    certificate(dir, "ca", "two", "serverAuth");
    std::fs::write(dir.join("empty.pem"), "").unwrap();
    let check = |cert: &str, key: &str| {
        let out = Command::new(BIN)
            .args(["proxy", "--check", "--listen", "127.0.0.1:1", "--config"])
            .arg(dir.join("proxy.toml"))
            .args(["--tls-cert", cert, "--tls-key", key])
            .current_dir(dir)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    std::fs::write(
        dir.join("proxy.toml"),
        "[pool]\n[[pool.servers]]\naddr = \"127.0.0.1:11211\"\n",
    )
    .unwrap();
    let (code, said) = check("missing.crt", "one.key");
    assert_eq!(code, Some(1));
    assert!(
        said.contains("missing.crt") && said.contains("cannot read"),
        "{said}"
    );
    let (_, said) = check("empty.pem", "one.key");
    assert!(
        said.contains("empty.pem") && said.contains("no certificate"),
        "{said}"
    );
    let (_, said) = check("one.crt", "two.key");
    assert!(said.contains("does not go with"), "{said}");
    let (code, said) = check("one.crt", "one.key");
    assert_eq!(code, Some(0), "{said}");
}

/// memcached serving TLS only (`memcached -Z`) on a free port of 127.0.0.1, its certificate
/// `name`.crt/.key in `dir`.
fn memcached_tls(dir: &Path, name: &str) -> (Running, SocketAddr) {
    memcached_with(|command| {
        command.args(["-Z", "-o"]).arg(format!(
            "ssl_chain_cert={},ssl_key={}",
            dir.join(format!("{name}.crt")).display(),
            dir.join(format!("{name}.key")).display()
        ));
    })
}

/// With `server_tls_ca`, the proxy's connections to a `memcached -Z` server are TLS, its
/// certificate checked: clients in clear are served; a proxy that trusts another authority
/// fails their requests with SERVER_ERROR and counts the refused handshakes.
#[test]
fn the_proxy_speaks_tls_to_memcached_z_servers() {
    let scratch = testbed::local::TempDir::new("kvswitch-proxy-tls-servers").expect("scratch");
    let dir = scratch.path();
    authority(dir, "ca");
    authority(dir, "other-ca");
    certificate(dir, "ca", "server", "serverAuth");
    let (_server, server) = memcached_tls(dir, "server");
    let (_proxy, listen, api) = start_proxy(dir, server, "server_tls_ca = \"ca.crt\"");
    let mut conn = common::proxy::Conn::open(listen);
    for i in 0..50 {
        let set = format!("set st:{i} 0 0 5\r\nv{i:04}\r\n");
        assert_eq!(
            conn.call(set.as_bytes(), |r| r.ends_with(b"\r\n")),
            b"STORED\r\n"
        );
    }
    let got = conn.call(b"get st:0 st:7 st:49\r\n", common::ends_with_end);
    assert_eq!(
        String::from_utf8_lossy(&got),
        "VALUE st:0 0 5\r\nv0000\r\nVALUE st:7 0 5\r\nv0007\r\nVALUE st:49 0 5\r\nv0049\r\nEND\r\n"
    );
    // Pipelined: eight clients' requests share the proxy's TLS connection to the server.
    let report = load(dir, listen, &[], 500, 8);
    assert_eq!(report["errors"], 0, "{report}");
    assert_eq!(report["timeouts"], 0, "{report}");
    assert_eq!(report["misses"], 0, "{report}");
    let text = metrics(api);
    let done = "kvswitch_proxy_server_tls_handshakes_total{outcome=\"done\"}";
    assert!(sample(&text, done).is_some_and(|n| n >= 1.0), "{text}");

    // Trusting another authority: no request reaches the server.
    let other = testbed::local::TempDir::new("kvswitch-proxy-tls-servers-2").expect("scratch");
    std::fs::copy(dir.join("other-ca.crt"), other.path().join("ca.crt")).unwrap();
    let (_wary, listen, api) = start_proxy(other.path(), server, "server_tls_ca = \"ca.crt\"");
    let mut conn = common::proxy::Conn::open(listen);
    let got = conn.call(b"get st:0\r\n", |r| r.ends_with(b"\r\n"));
    assert!(
        got.starts_with(b"SERVER_ERROR"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    let text = metrics(api);
    let failed = "kvswitch_proxy_server_tls_handshakes_total{outcome=\"failed\"}";
    assert!(sample(&text, failed).is_some_and(|n| n >= 1.0), "{text}");
}

/// A server that takes connections and never says a word: the proxy's handshake with it runs
/// out of the pool's timeout (1 s), the request fails with SERVER_ERROR, and the handshake is
/// counted as timed out.
#[test]
fn a_server_silent_in_the_handshake_is_counted_as_timed_out() {
    let scratch = testbed::local::TempDir::new("kvswitch-proxy-tls-silent").expect("scratch");
    let dir = scratch.path();
    authority(dir, "ca");
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let server = silent.local_addr().unwrap();
    // Holds what it accepts until the test ends (the listener is dropped with it).
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in silent.incoming().take(16) {
            match conn {
                Ok(c) => held.push(c),
                Err(_) => break,
            }
        }
    });
    let (_proxy, listen, api) = start_proxy(dir, server, "server_tls_ca = \"ca.crt\"");
    let mut conn = common::proxy::Conn::open(listen);
    let got = conn.call(b"get silent\r\n", |r| r.ends_with(b"\r\n"));
    assert!(
        got.starts_with(b"SERVER_ERROR"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    let text = metrics(api);
    let timed_out = "kvswitch_proxy_server_tls_handshakes_total{outcome=\"timed_out\"}";
    assert!(sample(&text, timed_out).is_some_and(|n| n >= 1.0), "{text}");
}
