//! The control APIs over HTTPS: curl and `kvswitch ctl` against a proxy's API (a client that
//! trusts another authority, or speaks plain HTTP, refused with a clear error; a certificate
//! rotated by SIGHUP); client certificates asked for, and a controller that speaks HTTPS to
//! its switches and serves HTTPS itself; the controller's store in an etcd that speaks TLS and
//! has authentication on.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use api::client::Https;
use api::Client;
use common::fleet::{controller_toml, proxies, servers, until_pools};
use common::proxy::{free_port, until_listening, Memcached, PoolOpts};
use common::tls::{authority, certificate, start_proxy, start_proxy_named};
use common::{installed, Running};
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_kvswitch");

fn skip_without(tools: &[&str]) -> bool {
    for tool in tools {
        if !installed(tool) {
            eprintln!("skipped: {tool} is not installed (scripts/setup.sh installs it)");
            return true;
        }
    }
    false
}

/// curl with `args`, its output; never retries, never waits more than 10 s.
fn curl(args: &[&str]) -> Output {
    Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .args(args)
        .output()
        .expect("curl runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `kvswitch args`, killed after 30 s should it run on (a command expected to stop at once
/// that a regression lets start).
fn kvswitch(args: &[&str]) -> Output {
    Command::new("timeout")
        .args(["30", BIN])
        .args(args)
        .output()
        .expect("kvswitch runs")
}

/// The handshakes an API counted as failed, read over HTTPS by a client it trusts.
fn failed_handshakes(client: &Client) -> f64 {
    let text = client.call("GET", "/metrics", None).unwrap_or_default();
    text.as_str()
        .unwrap_or("")
        .lines()
        .find_map(|l| l.strip_prefix("kvswitch_api_tls_handshakes_total{outcome=\"failed\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// `path` as a string, for command lines.
fn arg(path: &Path) -> String {
    path.display().to_string()
}

#[test]
fn the_proxy_api_over_https_with_curl_and_ctl_and_a_certificate_rotated() {
    if skip_without(&["openssl", "curl", "memcached"]) {
        return;
    }
    let scratch = testbed::local::TempDir::new("kvswitch-api-https").expect("scratch");
    let dir = scratch.path();
    authority(dir, "ca");
    authority(dir, "other-ca");
    authority(dir, "next-ca");
    certificate(dir, "ca", "api", "serverAuth");
    certificate(dir, "next-ca", "next", "serverAuth");
    let server = Memcached::start();
    let (proxy, _listen, api) = start_proxy(
        dir,
        server.addr(),
        "api_tls_cert = \"api.crt\"\napi_tls_key = \"api.key\"",
    );
    let url = format!("https://{api}/metrics");
    let ca = arg(&dir.join("ca.crt"));
    let out = curl(&["--cacert", &ca, &url]);
    assert!(out.status.success(), "{}", text(&out));
    let metrics = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        metrics.contains("kvswitch_api_tls_handshakes_total{outcome=\"done\"}"),
        "{metrics}"
    );
    // In clear, or trusting no authority of the API's: refused.
    // A request in clear is no handshake: refused and counted. curl exits with 60 for a
    // certificate no authority it was given vouches for.
    let trusting =
        Client::new(api, None).with_https(Https::load(&dir.join("ca.crt"), None).unwrap());
    let before = failed_handshakes(&trusting);
    let out = curl(&[&format!("http://{api}/metrics")]);
    assert!(!out.status.success(), "served in clear: {}", text(&out));
    assert!(failed_handshakes(&trusting) > before);
    let out = curl(&["--cacert", &arg(&dir.join("other-ca.crt")), &url]);
    assert_eq!(out.status.code(), Some(60), "{}", text(&out));
    assert!(text(&out).contains("certificate"), "{}", text(&out));

    // kvswitch ctl, as an operator runs it.
    let api_arg = api.to_string();
    let out = kvswitch(&["ctl", "--api", &api_arg, "--api-ca", &ca, "pool"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&server.addr().to_string()),
        "{}",
        text(&out)
    );
    let other = arg(&dir.join("other-ca.crt"));
    let out = kvswitch(&["ctl", "--api", &api_arg, "--api-ca", &other, "pool"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        said.starts_with("kvswitch: ") && said.contains("certificate"),
        "{said}"
    );
    let out = kvswitch(&["ctl", "--api", &api_arg, "pool"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "plain HTTP answered: {}",
        text(&out)
    );

    // A new certificate, from another authority, put in place and SIGHUP sent: new
    // connections get it; the old authority no longer checks.
    std::fs::copy(dir.join("next.crt"), dir.join("api.crt")).unwrap();
    std::fs::copy(dir.join("next.key"), dir.join("api.key")).unwrap();
    // SAFETY: kill sends a signal to the proxy this test started.
    assert_eq!(unsafe { libc::kill(proxy.0.id() as i32, libc::SIGHUP) }, 0);
    let next = arg(&dir.join("next-ca.crt"));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = curl(&["--cacert", &next, &url]);
        if out.status.success() {
            let metrics = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(
                metrics.contains("kvswitch_api_tls_reloads_total{outcome=\"done\"} 1"),
                "{metrics}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never served the new certificate"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(curl(&["--cacert", &ca, &url]).status.code(), Some(60));
}

/// A proxy whose API wants HTTPS with a client certificate, in front of `servers`: the
/// process, and its API's address.
fn strict_proxy(dir: &Path, name: &str, servers: &[(&str, SocketAddr)]) -> (Running, SocketAddr) {
    let extra =
        "api_tls_cert = \"api.crt\"\napi_tls_key = \"api.key\"\napi_tls_client_ca = \"ca.crt\"";
    let (proxy, _, api) = start_proxy_named(dir, name, servers, extra);
    (proxy, api)
}

#[test]
fn client_certificates_and_a_controller_speaking_https_both_ways() {
    if skip_without(&["openssl", "curl", "memcached"]) {
        return;
    }
    let scratch = testbed::local::TempDir::new("kvswitch-api-mtls").expect("scratch");
    let dir = scratch.path();
    authority(dir, "ca");
    certificate(dir, "ca", "api", "serverAuth");
    certificate(dir, "ca", "ops", "clientAuth");
    let (_servers, list) = servers(&["s1", "s2"]);
    let (_p0, api0) = strict_proxy(dir, "p0", &list);
    let (_p1, api1) = strict_proxy(dir, "p1", &list);
    let ca = arg(&dir.join("ca.crt"));
    let (cert, key) = (arg(&dir.join("ops.crt")), arg(&dir.join("ops.key")));
    // Without a certificate the handshake is refused; with one, served.
    let url = format!("https://{api0}/api/v1/pool");
    let https = Https::load(
        &dir.join("ca.crt"),
        Some((&dir.join("ops.crt"), &dir.join("ops.key"))),
    )
    .unwrap();
    let p0 = Client::new(api0, None).with_https(https.clone());
    let before = failed_handshakes(&p0);
    let out = curl(&["--cacert", &ca, &url]);
    assert!(!out.status.success(), "served without a client certificate");
    assert!(
        failed_handshakes(&p0) > before,
        "the refusal is not the handshake's"
    );
    let out = curl(&["--cacert", &ca, "--cert", &cert, "--key", &key, &url]);
    assert!(out.status.success(), "{}", text(&out));

    // The controller: HTTPS to its switches with the same client certificate, and its own
    // API over HTTPS asking for one.
    let ctl_api = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let settings = "probe_interval_ms = 50\nsync_interval_ms = 300\n\
                    switch_tls_ca = \"ca.crt\"\nswitch_tls_cert = \"ops.crt\"\n\
                    switch_tls_key = \"ops.key\"\napi_tls_cert = \"api.crt\"\n\
                    api_tls_key = \"api.key\"\napi_tls_client_ca = \"ca.crt\"";
    let path = dir.join("controller.toml");
    std::fs::write(
        &path,
        controller_toml(ctl_api, settings, &[api0, api1], &list),
    )
    .unwrap();
    let out = kvswitch(&["controller", "--config", &arg(&path), "--check"]);
    assert!(out.status.success(), "{}", text(&out));
    let _controller = Running(
        Command::new(BIN)
            .args(["controller", "--config"])
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("controller.log")).unwrap())
            .spawn()
            .expect("start the controller"),
    );
    until_listening(&[ctl_api], "controller");
    let ctl = Client::new(ctl_api, None).with_https(https.clone());
    let proxies = [api0, api1].map(|a| Client::new(a, None).with_https(https.clone()));
    // A server added through the controller's API reaches both proxies over HTTPS.
    let s3 = Memcached::start();
    let body = json!({"addr": s3.addr().to_string(), "name": "s3"});
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Err(e) = ctl.call("POST", "/api/v1/pool/servers", Some(&body)) {
        // A standalone controller takes changes once every server has been probed.
        assert!(Instant::now() < deadline, "the controller refused: {e:#}");
        std::thread::sleep(Duration::from_millis(50));
    }
    until_pools(&proxies, &["s1", "s2", "s3"], Duration::from_secs(10));
    // The controller sees both switches in step (its syncers say so once their push is
    // answered).
    let in_step = |s: &serde_json::Value| s["in_step"] == json!(true);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = ctl.call("GET", "/api/v1/status", None).unwrap();
        let switches = status["switches"].as_array().cloned().unwrap_or_default();
        let servers = status["servers"].as_array().map(Vec::len);
        if servers == Some(3) && switches.len() == 2 && switches.iter().all(in_step) {
            break;
        }
        assert!(Instant::now() < deadline, "{status}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Without a client certificate, the controller's API refuses too, at the handshake.
    let before = failed_handshakes(&ctl);
    let bare =
        Client::new(ctl_api, None).with_https(Https::load(&dir.join("ca.crt"), None).unwrap());
    assert!(bare.call("GET", "/api/v1/status", None).is_err());
    assert!(failed_handshakes(&ctl) > before);
}

/// etcd on loopback serving its clients over TLS with the certificate `etcd` of `dir`.
fn etcd_tls(dir: &Path) -> (Running, SocketAddr) {
    let client = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let peer = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let etcd = Running(
        Command::new("etcd")
            .args(["--name", "kvswitch-tls", "--data-dir"])
            .arg(dir.join("etcd"))
            .arg("--listen-client-urls")
            .arg(format!("https://{client}"))
            .arg("--advertise-client-urls")
            .arg(format!("https://{client}"))
            .arg("--listen-peer-urls")
            .arg(format!("http://{peer}"))
            .arg("--initial-advertise-peer-urls")
            .arg(format!("http://{peer}"))
            .arg("--initial-cluster")
            .arg(format!("kvswitch-tls=http://{peer}"))
            .arg("--cert-file")
            .arg(dir.join("etcd.crt"))
            .arg("--key-file")
            .arg(dir.join("etcd.key"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("etcd.log")).unwrap())
            .spawn()
            .expect("etcd runs"),
    );
    (etcd, client)
}

#[test]
fn the_controller_keeps_its_pool_in_an_etcd_with_tls_and_users() {
    if skip_without(&["openssl", "etcd", "memcached"]) {
        return;
    }
    let scratch = testbed::local::TempDir::new("kvswitch-etcd-tls").expect("scratch");
    let dir = scratch.path();
    authority(dir, "ca");
    certificate(dir, "ca", "etcd", "serverAuth");
    let (_etcd, etcd) = etcd_tls(dir);
    let https = Https::load(&dir.join("ca.crt"), None).unwrap();
    let admin = Client::new(etcd, None).with_https(https);
    let deadline = Instant::now() + Duration::from_secs(20);
    while admin
        .call("POST", "/v3/kv/range", Some(&json!({"key": "eA=="})))
        .is_err()
    {
        assert!(Instant::now() < deadline, "etcd never answered over TLS");
        std::thread::sleep(Duration::from_millis(100));
    }
    // etcd's users: root, then authentication on.
    for (path, body) in [
        ("/v3/auth/role/add", json!({"name": "root"})),
        (
            "/v3/auth/user/add",
            json!({"name": "root", "password": "s3cret"}),
        ),
        (
            "/v3/auth/user/grant",
            json!({"user": "root", "role": "root"}),
        ),
        ("/v3/auth/enable", json!({})),
    ] {
        admin
            .call("POST", path, Some(&body))
            .unwrap_or_else(|e| panic!("{path}: {e:#}"));
    }
    std::fs::write(dir.join("etcd.password"), "s3cret\n").unwrap();
    std::fs::write(dir.join("wrong.password"), "guess\n").unwrap();
    let (_servers, list) = servers(&["s1"]);
    let (proxies, _) = proxies(1, &list, &PoolOpts::default());
    let ctl_api = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let path = dir.join("controller.toml");
    let file = controller_toml(
        ctl_api,
        "probe_interval_ms = 50",
        &[proxies[0].api()],
        &list,
    );
    std::fs::write(&path, file).unwrap();
    let url = format!("https://{etcd}");
    let ca = arg(&dir.join("ca.crt"));
    let config = arg(&path);
    let base = [
        "controller",
        "--config",
        &config,
        "--store",
        &url,
        "--store-ca",
        &ca,
    ];

    // A wrong password, or no TLS files for an https:// store, stops the controller at once.
    let wrong = arg(&dir.join("wrong.password"));
    let mut args = base.to_vec();
    args.extend(["--store-user", "root", "--store-password-file", &wrong]);
    let out = kvswitch(&args);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("did not authenticate the user \"root\""),
        "{}",
        text(&out)
    );
    let out = kvswitch(&["controller", "--config", &config, "--store", &url]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("--store-ca"), "{}", text(&out));

    let password = arg(&dir.join("etcd.password"));
    let mut args = base.to_vec();
    args.extend(["--store-user", "root", "--store-password-file", &password]);
    let _controller = Running(
        Command::new(BIN)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("controller.log")).unwrap())
            .spawn()
            .expect("start the controller"),
    );
    let ctl = Client::new(ctl_api, None);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status = ctl.call("GET", "/api/v1/status", None).unwrap_or_default();
        if status["role"] == json!("leader") {
            break;
        }
        let log = std::fs::read_to_string(dir.join("controller.log")).unwrap_or_default();
        assert!(Instant::now() < deadline, "never led: {status}\n{log}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Its leader key is in etcd, read as root.
    let as_root = || {
        let token = admin
            .call(
                "POST",
                "/v3/auth/authenticate",
                Some(&json!({"name": "root", "password": "s3cret"})),
            )
            .unwrap()["token"]
            .as_str()
            .unwrap()
            .to_string();
        admin.clone().with_authorization(token)
    };
    let leader = controller::etcd::encode(b"/kvswitch/controller/default/leader");
    let leader_key = || {
        let doc = as_root()
            .call("POST", "/v3/kv/range", Some(&json!({"key": leader})))
            .unwrap();
        let value = doc["kvs"][0]["value"].as_str().unwrap_or("");
        let value = controller::etcd::decode(value).unwrap();
        let lease = doc["kvs"][0]["lease"].as_str().unwrap_or("").to_string();
        (String::from_utf8_lossy(&value).into_owned(), lease)
    };
    let (holder, lease) = leader_key();
    assert_eq!(holder, ctl_api.to_string());
    assert!(!lease.is_empty());

    // Authentication turned off and on again: every token etcd gave is void. The controller
    // asks for a new one: it never stops leading, and a pool change it makes is stored.
    as_root()
        .call("POST", "/v3/auth/disable", Some(&json!({})))
        .unwrap();
    admin
        .call("POST", "/v3/auth/enable", Some(&json!({})))
        .unwrap();
    let s2 = Memcached::start();
    let body = json!({"addr": s2.addr().to_string(), "name": "s2"});
    ctl.call("POST", "/api/v1/pool/servers", Some(&body))
        .unwrap_or_else(|e| panic!("the change was refused: {e:#}"));
    let stored = controller::etcd::encode(b"/kvswitch/controller/default/servers");
    let doc = as_root()
        .call("POST", "/v3/kv/range", Some(&json!({"key": stored})))
        .unwrap();
    let servers = controller::etcd::decode(doc["kvs"][0]["value"].as_str().unwrap_or("")).unwrap();
    let servers = String::from_utf8_lossy(&servers).into_owned();
    assert!(servers.contains(&s2.addr().to_string()), "{servers}");
    let status = ctl.call("GET", "/api/v1/status", None).unwrap();
    assert_eq!(status["role"], json!("leader"), "{status}");
    assert_eq!(leader_key(), (ctl_api.to_string(), lease));
}

/// `kvswitch controller --check` loads the TLS and SASL files its file names: a missing one is
/// named, with exit code 1, before the controller starts.
#[test]
fn controller_check_names_a_file_that_does_not_load() {
    let scratch = testbed::local::TempDir::new("kvswitch-controller-check").expect("scratch");
    let dir = scratch.path();
    let server = SocketAddr::from(([127, 0, 0, 1], 11211));
    let switch = SocketAddr::from(([127, 0, 0, 1], 9110));
    let api = SocketAddr::from(([127, 0, 0, 1], 9200));
    for (settings, named) in [
        (
            "api_tls_cert = \"gone.crt\"\napi_tls_key = \"gone.key\"",
            "gone.crt",
        ),
        ("switch_tls_ca = \"gone-ca.crt\"", "gone-ca.crt"),
        (
            "server_sasl_user = \"kv\"\nserver_sasl_password_file = \"gone.password\"",
            "gone.password",
        ),
    ] {
        let path = dir.join("controller.toml");
        std::fs::write(
            &path,
            controller_toml(api, settings, &[switch], &[("s1", server)]),
        )
        .unwrap();
        let out = kvswitch(&["controller", "--check", "--config", &arg(&path)]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert!(text(&out).contains(named), "{}", text(&out));
    }
}

/// A proxy run from a nutcracker file alone serves its API over HTTPS with the command line's
/// `--api-tls-cert` and `--api-tls-key`.
#[test]
fn a_nutcracker_files_proxy_serves_its_api_over_https_from_the_command_line() {
    if skip_without(&["openssl", "curl", "memcached"]) {
        return;
    }
    let scratch = testbed::local::TempDir::new("kvswitch-api-https-yaml").expect("scratch");
    let dir = scratch.path();
    authority(dir, "ca");
    certificate(dir, "ca", "api", "serverAuth");
    let server = Memcached::start();
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let api = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let yaml = dir.join("nutcracker.yml");
    let text_of =
        common::proxy::yaml_config(listen, &[("s1", server.addr())], &PoolOpts::default());
    std::fs::write(&yaml, text_of).unwrap();
    let _proxy = Running(
        Command::new(BIN)
            .args([
                "proxy",
                "--nutcracker-config",
                &arg(&yaml),
                "--api",
                &api.to_string(),
            ])
            .args(["--api-tls-cert", &arg(&dir.join("api.crt"))])
            .args(["--api-tls-key", &arg(&dir.join("api.key"))])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("proxy.log")).unwrap())
            .spawn()
            .expect("start the proxy"),
    );
    until_listening(&[listen, api], "proxy");
    let url = format!("https://{api}/api/v1/pool");
    let out = curl(&["--cacert", &arg(&dir.join("ca.crt")), &url]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&server.addr().to_string()),
        "{}",
        text(&out)
    );
    let out = curl(&[&format!("http://{api}/api/v1/pool")]);
    assert!(!out.status.success(), "served in clear: {}", text(&out));
}
