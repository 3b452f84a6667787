//! SASL towards `memcached -S` servers, whose users live in a Cyrus SASL password database
//! made by `saslpasswd2`: the proxy authenticates every server connection it opens and serves
//! binary clients, which authenticate to the proxy with the same user; text clients are told
//! why they cannot be served; a wrong password fails the server with a clear log line.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::tls::{memcached_with, metrics, sample, start_proxy};
use common::{installed, Running};
use wire::memcache::binary::{opcode, write_request, Header, HEADER_LEN};

/// A `memcached -S` whose only user is `user` with `password`, its SASL files in `dir`.
fn memcached_sasl(dir: &Path, user: &str, password: &str) -> (Running, SocketAddr) {
    let db = dir.join("sasldb2");
    let mut add = Command::new("saslpasswd2")
        .args(["-p", "-c", "-a", "memcached", "-f"])
        .arg(&db)
        .arg(user)
        .stdin(Stdio::piped())
        .spawn()
        .expect("saslpasswd2 runs");
    add.stdin
        .take()
        .unwrap()
        .write_all(password.as_bytes())
        .unwrap();
    assert!(add.wait().unwrap().success(), "saslpasswd2 failed");
    std::fs::write(
        dir.join("memcached.conf"),
        format!("mech_list: plain\nsasldb_path: {}\n", db.display()),
    )
    .unwrap();
    memcached_with(|command| {
        command.arg("-S").env("SASL_CONF_PATH", dir);
    })
}

/// A binary-protocol connection.
struct Binary(TcpStream);

impl Binary {
    fn connect(addr: SocketAddr) -> Binary {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        Binary(s)
    }

    /// Sends one request; its reply's status and value.
    fn call(&mut self, op: u8, key: &[u8], extras: &[u8], value: &[u8]) -> (u16, Vec<u8>) {
        let mut out = Vec::new();
        write_request(op, key, extras, value, 9, 0, &mut out);
        self.0.write_all(&out).unwrap();
        let mut head = [0u8; HEADER_LEN];
        self.0.read_exact(&mut head).expect("a reply header");
        let h = Header::decode(&head).unwrap();
        let mut body = vec![0u8; h.body_len as usize];
        self.0.read_exact(&mut body).expect("a reply body");
        let skip = h.extras_len as usize + h.key_len as usize;
        (h.vbucket_or_status, body[skip..].to_vec())
    }

    fn auth(&mut self, user: &str, password: &str) -> u16 {
        let plain = format!("\0{user}\0{password}");
        self.call(opcode::SASL_AUTH, b"PLAIN", b"", plain.as_bytes())
            .0
    }
}

fn skip_without_tools() -> bool {
    for tool in ["memcached", "saslpasswd2"] {
        if !installed(tool) {
            eprintln!("skipped: {tool} is not installed (scripts/setup.sh installs it)");
            return true;
        }
    }
    false
}

#[test]
fn the_proxy_authenticates_to_memcached_s_and_answers_its_clients_sasl() {
    if skip_without_tools() {
        return;
    }
    let scratch = testbed::local::TempDir::new("kvswitch-proxy-sasl").expect("scratch");
    let dir = scratch.path();
    let (_server, server) = memcached_sasl(dir, "kv", "s3cret");
    // The server refuses anyone unauthenticated: the proxy's authentication is what serves.
    let mut direct = Binary::connect(server);
    assert_eq!(direct.call(opcode::GET, b"k", b"", b"").0, 0x20);
    std::fs::write(dir.join("servers.password"), "s3cret\n").unwrap();
    let (_proxy, listen, api) = start_proxy(
        dir,
        server,
        "server_sasl_user = \"kv\"\nserver_sasl_password_file = \"servers.password\"",
    );
    let mut client = Binary::connect(listen);
    assert_eq!(
        client.call(opcode::SASL_LIST_MECHS, b"", b"", b""),
        (0, b"PLAIN".to_vec())
    );
    assert_eq!(
        client.auth("kv", "wrong"),
        0x20,
        "a wrong password is refused"
    );
    assert_eq!(client.auth("kv", "s3cret"), 0);
    for i in 0..50 {
        let key = format!("sasl:{i}");
        let value = format!("value {i}");
        let set = client.call(opcode::SET, key.as_bytes(), &[0; 8], value.as_bytes());
        assert_eq!(set.0, 0, "set {key}: {:?}", String::from_utf8_lossy(&set.1));
        let got = client.call(opcode::GET, key.as_bytes(), b"", b"");
        assert_eq!(got.0, 0);
        // A GET reply's extras are the flags; the value follows.
        assert_eq!(got.1, value.as_bytes());
    }
    // On the server, as a client that authenticated itself reads it (memcached closed the
    // first connection after its refusal).
    let mut direct = Binary::connect(server);
    assert_eq!(direct.auth("kv", "s3cret"), 0);
    assert_eq!(
        direct.call(opcode::GET, b"sasl:7", b"", b""),
        (0, b"value 7".to_vec())
    );

    // Text requests cannot be served by such servers: said, and nothing stored is touched.
    let mut text = TcpStream::connect(listen).unwrap();
    text.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    text.write_all(b"get sasl:7\r\n").unwrap();
    let mut line = [0u8; 256];
    let n = text.read(&mut line).unwrap();
    let line = String::from_utf8_lossy(&line[..n]);
    assert!(
        line.starts_with("SERVER_ERROR") && line.contains("SASL") && line.contains("binary"),
        "{line}"
    );
    assert_eq!(client.call(opcode::GET, b"sasl:7", b"", b"").1, b"value 7");

    let text = metrics(api);
    api::metrics::lint(&text).unwrap_or_else(|e| panic!("/metrics: {e}"));
    let done = "kvswitch_proxy_server_sasl_auths_total{outcome=\"done\"}";
    assert!(sample(&text, done).is_some_and(|n| n >= 1.0), "{text}");
    let refused = "kvswitch_proxy_server_sasl_auths_total{outcome=\"refused\"}";
    assert_eq!(sample(&text, refused), Some(0.0));
    let clients = "kvswitch_proxy_client_sasl_auths_total{outcome=\"refused\"}";
    assert_eq!(sample(&text, clients), Some(1.0));
}

#[test]
fn a_wrong_password_fails_the_server_with_a_clear_log_line() {
    if skip_without_tools() {
        return;
    }
    let scratch = testbed::local::TempDir::new("kvswitch-proxy-sasl-wrong").expect("scratch");
    let dir = scratch.path();
    let (_server, server) = memcached_sasl(dir, "kv", "s3cret");
    std::fs::write(dir.join("servers.password"), "not-it\n").unwrap();
    let (_proxy, listen, api) = start_proxy(
        dir,
        server,
        "server_sasl_user = \"kv\"\nserver_sasl_password_file = \"servers.password\"",
    );
    let mut client = Binary::connect(listen);
    let (status, said) = client.call(opcode::GET, b"k", b"", b"");
    assert_ne!(
        status, 0,
        "served although the proxy could not authenticate"
    );
    let said = String::from_utf8_lossy(&said).into_owned();
    assert!(said.contains("SASL"), "{said}");
    let refused = "kvswitch_proxy_server_sasl_auths_total{outcome=\"refused\"}";
    let deadline = Instant::now() + Duration::from_secs(5);
    while sample(&metrics(api), refused).unwrap_or(0.0) < 1.0 {
        assert!(Instant::now() < deadline, "{}", metrics(api));
        std::thread::sleep(Duration::from_millis(20));
    }
    let text = metrics(api);
    let errors = text
        .lines()
        .filter(|l| l.starts_with("kvswitch_proxy_server_errors_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>();
    assert!(
        errors >= 1.0,
        "the server's failure is not counted:\n{text}"
    );
    let log = std::fs::read_to_string(dir.join("proxy.log")).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("WARN") && l.contains("SASL authentication as \"kv\""))
        .unwrap_or_else(|| panic!("no warning in the log:\n{log}"));
    assert!(line.contains("counts as failed"), "{line}");

    // The password mended and read again on SIGHUP: served, with nothing restarted.
    std::fs::write(dir.join("servers.password"), "s3cret\n").unwrap();
    // SAFETY: kill sends a signal to the proxy this test started.
    assert_eq!(unsafe { libc::kill(_proxy.0.id() as i32, libc::SIGHUP) }, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, _) = client.call(opcode::SET, b"k", &[0; 8], b"v");
        if status == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never served after the password was mended"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn with_client_sasl_a_client_must_authenticate_first() {
    if skip_without_tools() {
        return;
    }
    let scratch = testbed::local::TempDir::new("kvswitch-proxy-sasl-clients").expect("scratch");
    let dir = scratch.path();
    let (_server, server) = memcached_sasl(dir, "kv", "s3cret");
    std::fs::write(dir.join("servers.password"), "s3cret\n").unwrap();
    let (_proxy, listen, api) = start_proxy(
        dir,
        server,
        "server_sasl_user = \"kv\"\nserver_sasl_password_file = \"servers.password\"\n\
         client_sasl = true",
    );
    // Not authenticated: refused as memcached -S refuses it, and the connection closed.
    let mut stranger = Binary::connect(listen);
    assert_eq!(stranger.call(opcode::GET, b"k", b"", b"").0, 0x20);
    let mut rest = Vec::new();
    assert_eq!(
        stranger.0.read_to_end(&mut rest).unwrap_or(0),
        0,
        "{rest:?}"
    );
    // A wrong password does not let it in either; the right one does.
    let mut client = Binary::connect(listen);
    assert_eq!(client.auth("kv", "guess"), 0x20);
    assert_eq!(client.call(opcode::GET, b"k", b"", b"").0, 0x20);
    let mut client = Binary::connect(listen);
    assert_eq!(client.auth("kv", "s3cret"), 0);
    assert_eq!(client.call(opcode::SET, b"k", &[0; 8], b"v").0, 0);
    assert_eq!(client.call(opcode::GET, b"k", b"", b""), (0, b"v".to_vec()));
    let refused = "kvswitch_proxy_client_sasl_auths_total{outcome=\"refused\"}";
    assert_eq!(sample(&metrics(api), refused), Some(3.0));
}

/// The status of the pool's first server as a controller with `settings` over `switch` sees
/// it once it is `up` (or down), within 10 s.
fn first_server_seen(
    dir: &std::path::Path,
    settings: &str,
    switch: SocketAddr,
    server: SocketAddr,
    up: bool,
) -> (controller::Running, serde_json::Value) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let api = listener.local_addr().unwrap();
    let text = common::fleet::controller_toml(api, settings, &[switch], &[("s1", server)]);
    let file = config::controller::parse(&text, &dir.join("controller.toml")).unwrap();
    let running = controller::start(file, listener, None, None, None).unwrap();
    let ctl = api::Client::new(api, None);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = ctl.call("GET", "/api/v1/status", None).unwrap();
        let s1 = status["servers"][0].clone();
        if s1["probes"].as_u64().unwrap_or(0) >= 1 && s1["up"] == serde_json::json!(up) {
            return (running, s1);
        }
        assert!(Instant::now() < deadline, "never seen up = {up}: {status}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_controller_probes_memcached_s_servers_with_the_pools_credentials() {
    if skip_without_tools() {
        return;
    }
    let scratch = testbed::local::TempDir::new("kvswitch-sasl-controller").expect("scratch");
    let dir = scratch.path();
    let (_server, server) = memcached_sasl(dir, "kv", "s3cret");
    std::fs::write(dir.join("servers.password"), "s3cret\n").unwrap();
    let (_proxy, _listen, proxy_api) = start_proxy(
        dir,
        server,
        "server_sasl_user = \"kv\"\nserver_sasl_password_file = \"servers.password\"",
    );
    // A generous probe timeout: a probe authenticates against the SASL database, which a
    // loaded machine may take a while over.
    let base = "probe_interval_ms = 50\nprobe_timeout_ms = 2000\ndown_after = 2\nup_after = 1";
    // With the credentials: the server answers its binary probes and is up.
    let sasl = format!(
        "{base}\nserver_sasl_user = \"kv\"\nserver_sasl_password_file = \"servers.password\""
    );
    let (_with, s1) = first_server_seen(dir, &sasl, proxy_api, server, true);
    assert_eq!(s1["failures"], serde_json::json!(0), "{s1}");
    // Without them: such a server does not answer `version` in text, which counts as down.
    let (_without, s1) = first_server_seen(dir, base, proxy_api, server, false);
    assert!(s1["last_error"].is_string(), "{s1}");
}
