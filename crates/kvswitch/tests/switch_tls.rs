//! TLS on the switch's TCP path: with `tcp = "proxy"` and a certificate, the switch's proxy
//! terminates memcached's TLS on the VIP. pymemcache over Python's ssl from a client host,
//! values landing on the servers in clear; a client in clear refused and counted.

mod common;

use std::process::Stdio;

use common::tls::{authority, certificate};
use common::{installed, metrics, server_value, testbed_with, vip};

const CLIENT: &str = r#"
import ssl, sys
from pymemcache.client.base import Client
vip, ca = sys.argv[1], sys.argv[2]
ctx = ssl.create_default_context(cafile=ca)
# The certificate is checked against the authority; the VIP's address is the testbed's.
ctx.check_hostname = False
c = Client((vip, 11211), tls_context=ctx, connect_timeout=5, timeout=5)
for i in range(200):
    v = ("tls%d-" % i).encode() * (1 + i % 30)
    assert c.set("swtls:%d" % i, v), i
    assert c.get("swtls:%d" % i) == v, i
got = c.get_many(["swtls:%d" % i for i in range(0, 200, 9)])
assert len(got) == len(range(0, 200, 9)), len(got)
print("ok")
"#;

#[test]
fn memcached_tls_clients_through_the_switch() {
    for tool in ["openssl", "python3"] {
        if !installed(tool) {
            eprintln!("skipped: {tool} is not installed (scripts/setup.sh installs it)");
            return;
        }
    }
    let pymemcache = std::process::Command::new("/usr/bin/python3")
        .args(["-c", "import pymemcache"])
        .status();
    if !pymemcache.is_ok_and(|s| s.success()) {
        eprintln!("skipped: python3-pymemcache is not installed (scripts/setup.sh installs it)");
        return;
    }
    let scratch = testbed::local::TempDir::new("kvswitch-switch-tls").expect("scratch");
    let dir = scratch.path();
    authority(dir, "ca");
    certificate(dir, "ca", "vip", "serverAuth");
    let lines = format!(
        "tls_cert = \"{}\"\ntls_key = \"{}\"",
        dir.join("vip.crt").display(),
        dir.join("vip.key").display()
    );
    let live = testbed_with("kstl", "l3", false, |o| {
        o.tcp = Some("proxy".into());
        o.switch_config = Some(lines);
    });
    let vip = vip(&live).ip().to_string();
    let ca = dir.join("ca.crt").display().to_string();
    let out = live
        .exec("c1", "timeout")
        .args(["60", "/usr/bin/python3", "-c", CLIENT, &vip, &ca])
        .stdin(Stdio::null())
        .output()
        .expect("python3");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim_end() == "ok",
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Stored in clear on the servers, wherever the keys live.
    let stored = ["s1", "s2", "s3"]
        .iter()
        .filter(|s| server_value(&live, s, "swtls:7").is_some())
        .count();
    assert_eq!(stored, 1, "swtls:7 should be on exactly one server");

    // A client in clear gets no answer and is counted as a failed handshake.
    let plain = live
        .exec("c2", "timeout")
        .args([
            "10",
            "/usr/bin/python3",
            "-c",
            "import sys\nfrom pymemcache.client.base import Client\n\
             c = Client((sys.argv[1], 11211), connect_timeout=3, timeout=3)\n\
             try:\n    c.get('swtls:7')\n    print('answered')\nexcept Exception as e:\n    print('refused', type(e).__name__)",
            &vip,
        ])
        .stdin(Stdio::null())
        .output()
        .expect("python3");
    let said = String::from_utf8_lossy(&plain.stdout).into_owned();
    assert!(said.starts_with("refused"), "{said}");
    let text = metrics(&live);
    let failed = text
        .lines()
        .find_map(|l| l.strip_prefix("kvswitch_proxy_tls_handshakes_total{outcome=\"failed\"} "))
        .and_then(|v| v.trim().parse::<f64>().ok());
    assert!(failed.is_some_and(|n| n >= 1.0), "{text}");
    live.down().expect("down");
}

/// `kvswitch run --check` loads the TLS files the configuration names: one that is not there
/// is named before anything starts (no root, no testbed needed).
#[test]
fn run_check_names_a_tls_file_that_does_not_load() {
    let example = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/switch.toml"),
    )
    .unwrap()
    .replace("tcp = \"splice\"", "tcp = \"proxy\"")
    .replace("# tls_cert = \"vip.crt\"", "tls_cert = \"missing.crt\"")
    .replace("# tls_key = \"vip.key\"", "tls_key = \"vip.key\"");
    let scratch = testbed::local::TempDir::new("kvswitch-switch-check").expect("scratch");
    let dir = scratch.path();
    std::fs::write(dir.join("switch.toml"), example).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvswitch"))
        .args(["run", "--check", "--config"])
        .arg(dir.join("switch.toml"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("missing.crt: cannot read"), "{said}");
}
