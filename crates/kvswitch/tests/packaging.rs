//! What an operator installs beside the binary: the example files, the systemd units, the shell
//! completions and manual pages, JSON logs, the Grafana dashboard and the container image.

mod common;

use common::Running;
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::proxy::{free_port, until_listening};

const BIN: &str = env!("CARGO_BIN_EXE_kvswitch");

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn kvswitch(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(root())
        .output()
        .expect("kvswitch runs")
}

/// Every file of examples/: what its command prints as its example (so the two never drift
/// apart), and a file the command's `--check` takes.
#[test]
fn every_example_file_is_its_commands_own_and_passes_its_check() {
    let cases: [(&str, &[&str], &[&str]); 6] = [
        (
            "switch.toml",
            &["run", "--example-config"],
            &["run", "--check", "--config"],
        ),
        (
            "proxy.toml",
            &["proxy", "--example-config"],
            &["proxy", "--check", "--config"],
        ),
        (
            "nutcracker.yml",
            &[],
            &["proxy", "--check", "--nutcracker-config"],
        ),
        (
            "controller.toml",
            &["controller", "--example-config"],
            &["controller", "--check", "--config"],
        ),
        (
            "fabric.toml",
            &["fabric", "run", "--example-config"],
            &["fabric", "run", "--switch", "root0", "--check", "--config"],
        ),
        (
            "portland.toml",
            &["nf", "portland", "--example-layout"],
            &["nf", "portland", "--check", "--layout"],
        ),
    ];
    let dir = root().join("examples");
    let mut listed: BTreeSet<String> = std::fs::read_dir(&dir)
        .expect("examples/")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    listed.remove("README.md");
    let tested: BTreeSet<String> = cases.iter().map(|(f, _, _)| f.to_string()).collect();
    assert_eq!(listed, tested, "every file of examples/ is checked here");
    for (file, print, check) in cases {
        let path = dir.join(file);
        let text = std::fs::read_to_string(&path).expect("the example");
        if !print.is_empty() {
            let printed = kvswitch(print);
            assert!(printed.status.success(), "{print:?}");
            assert_eq!(
                String::from_utf8_lossy(&printed.stdout),
                text,
                "examples/{file} is not what `kvswitch {}` prints",
                print.join(" ")
            );
        }
        let mut args = check.to_vec();
        let path_text = path.to_string_lossy().into_owned();
        args.push(&path_text);
        let checked = kvswitch(&args);
        assert!(
            checked.status.success(),
            "kvswitch {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&checked.stderr)
        );
    }
    // A mistake is refused with the file and the key named, and a failing exit.
    let scratch = testbed::local::TempDir::new("kvswitch-examples").expect("scratch");
    let bad = scratch.path().join("controller.toml");
    let text = std::fs::read_to_string(dir.join("controller.toml")).unwrap();
    std::fs::write(
        &bad,
        text.replace("down_after = 3", "down_after = \"three\""),
    )
    .unwrap();
    let refused = kvswitch(&["controller", "--check", "--config", &bad.to_string_lossy()]);
    assert_eq!(refused.status.code(), Some(1));
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        why.contains("controller.toml") && why.contains("down_after"),
        "{why}"
    );
}

/// The units of packaging/systemd pass `systemd-analyze verify`: their keys, their commands
/// (the binary installed where the units say), and the manual page they name.
#[test]
fn the_systemd_units_pass_systemd_analyze_verify() {
    if !common::installed("systemd-analyze") {
        eprintln!("skipped: systemd-analyze is not installed");
        return;
    }
    let scratch = testbed::local::TempDir::new("kvswitch-units").expect("scratch");
    let man = scratch.path().join("man/man1");
    let made = kvswitch(&["man", "--out-dir", &man.to_string_lossy()]);
    assert!(made.status.success());
    let mut units = Vec::new();
    for entry in std::fs::read_dir(root().join("packaging/systemd")).expect("packaging/systemd") {
        let path = entry.expect("an entry").path();
        if path.extension().is_some_and(|e| e == "service") {
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(
                text.contains("/usr/local/bin/kvswitch"),
                "{}",
                path.display()
            );
            let copy = scratch.path().join(path.file_name().unwrap());
            std::fs::write(&copy, text.replace("/usr/local/bin/kvswitch", BIN)).unwrap();
            units.push(copy);
        }
    }
    assert_eq!(
        units.len(),
        3,
        "the switch's, the proxy's and the controller's"
    );
    let verified = Command::new("systemd-analyze")
        .arg("verify")
        .args(&units)
        .env("MANPATH", scratch.path().join("man"))
        .output()
        .expect("systemd-analyze runs");
    let said = String::from_utf8_lossy(&verified.stderr);
    assert!(verified.status.success(), "{said}");
    assert!(
        !said.contains(".service:"),
        "systemd-analyze found fault: {said}"
    );
}

/// `kvswitch completions` gives a script the shell takes, naming the commands; `kvswitch man`
/// a page for kvswitch and each command.
#[test]
fn completions_and_manual_pages_come_from_the_command_line() {
    let bash = kvswitch(&["completions", "bash"]);
    assert!(bash.status.success());
    let script = String::from_utf8(bash.stdout).expect("UTF-8");
    for command in ["proxy", "controller", "testbed", "completions"] {
        assert!(script.contains(command), "{command}");
    }
    let scratch = testbed::local::TempDir::new("kvswitch-man").expect("scratch");
    let file = scratch.path().join("kvswitch.bash");
    std::fs::write(&file, &script).unwrap();
    let parsed = Command::new("bash").arg("-n").arg(&file).output().unwrap();
    assert!(
        parsed.status.success(),
        "{}",
        String::from_utf8_lossy(&parsed.stderr)
    );
    for shell in ["zsh", "fish"] {
        let out = kvswitch(&["completions", shell]);
        assert!(out.status.success() && !out.stdout.is_empty(), "{shell}");
    }
    let refused = kvswitch(&["completions", "tcsh"]);
    assert_eq!(refused.status.code(), Some(2), "clap's usage error");

    let page = kvswitch(&["man"]);
    let page = String::from_utf8(page.stdout).unwrap();
    assert!(page.contains(".TH kvswitch 1"), "{page}");
    let dir = scratch.path().join("pages");
    assert!(kvswitch(&["man", "--out-dir", &dir.to_string_lossy()])
        .status
        .success());
    for command in ["run", "proxy", "controller", "ctl", "nf", "bench"] {
        let page = std::fs::read_to_string(dir.join(format!("kvswitch-{command}.1")))
            .unwrap_or_else(|e| panic!("kvswitch-{command}.1: {e}"));
        assert!(
            page.contains(&format!(".TH kvswitch-{command} 1")),
            "{page}"
        );
    }
}

/// `--log-format json` writes each log line as one JSON object, with its level, message and
/// fields.
#[test]
fn json_logs_are_one_object_a_line() {
    let scratch = testbed::local::TempDir::new("kvswitch-json-logs").expect("scratch");
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let config = scratch.path().join("proxy.toml");
    std::fs::write(
        &config,
        format!("[proxy]\nlisten = \"{listen}\"\n\n[[pool.servers]]\naddr = \"127.0.0.1:1\"\n"),
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["--log-format", "json", "proxy", "--config"])
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the proxy");
    let stderr = child.stderr.take().expect("stderr");
    let proxy = Running(child);
    until_listening(&[listen], "proxy");
    let first = BufReader::new(stderr)
        .lines()
        .next()
        .expect("a log line")
        .expect("readable");
    drop(proxy);
    let line: serde_json::Value =
        serde_json::from_str(&first).unwrap_or_else(|e| panic!("{first}: {e}"));
    assert_eq!(line["level"], "INFO", "{first}");
    assert_eq!(line["message"], "proxy listening", "{first}");
    assert_eq!(line["listen"], listen.to_string(), "{first}");
    assert!(line["timestamp"].is_string(), "{first}");
}

/// The families one `/metrics` declares.
fn families(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_string)
        .collect()
}

/// The metric names a PromQL expression reads (`kvswitch_*` and `process_*`), a histogram's
/// series under their family's name.
fn names_in(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let starts = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
        let rest = &expr[i..];
        if starts && (rest.starts_with("kvswitch_") || rest.starts_with("process_")) {
            let len = rest
                .bytes()
                .take_while(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_')
                .count();
            let name = &rest[..len];
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            names.push(family.to_string());
            i += len;
        } else {
            i += 1;
        }
    }
    names
}

/// Every expression of packaging/grafana/kvswitch.json reads only metrics that a running
/// switch, proxy or controller declares on its `/metrics`.
#[test]
fn the_dashboard_names_only_metrics_kvswitch_exports() {
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("packaging/grafana/kvswitch.json"))
            .expect("the dashboard"),
    )
    .expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    collect_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() > 20, "{} expressions", exprs.len());

    let mut exported = BTreeSet::new();
    // A switch on a testbed (with its proxy for TCP to the VIP).
    let live = common::testbed("kpkg", "l3", false);
    exported.extend(families(&common::metrics(&live)));
    drop(live);
    // The proxy alone, after one request of each kind so that its by-command series exist.
    let scratch = testbed::local::TempDir::new("kvswitch-dashboard").expect("scratch");
    let server = common::proxy::Memcached::start();
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let api = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let config = scratch.path().join("proxy.toml");
    std::fs::write(
        &config,
        format!(
            "[proxy]\nlisten = \"{listen}\"\napi = \"{api}\"\n\n[[pool.servers]]\naddr = \"{}\"\n",
            server.addr()
        ),
    )
    .unwrap();
    let proxy = Running(
        Command::new(BIN)
            .args(["proxy", "--config"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the proxy"),
    );
    until_listening(&[listen, api], "proxy");
    let (_, text) = testbed::http_get(api, "/metrics").expect("the proxy's metrics");
    exported.extend(families(&text));
    drop(proxy);
    // The controller, keeping a fabric's registration table too.
    let ctl_api = SocketAddr::from(([127, 0, 0, 1], free_port()));
    for file in ["controller.toml", "fabric.toml"] {
        std::fs::copy(
            root().join("examples").join(file),
            scratch.path().join(file),
        )
        .unwrap();
    }
    std::fs::write(scratch.path().join("fabric.token"), "a-token\n").unwrap();
    let controller = scratch.path().join("controller.toml");
    let text = std::fs::read_to_string(&controller).unwrap().replace(
        "api = \"127.0.0.1:9200\"",
        &format!("api = \"{ctl_api}\"\nfabric = \"fabric.toml\""),
    );
    std::fs::write(&controller, text).unwrap();
    let running = Running(
        Command::new(BIN)
            .args(["controller", "--config"])
            .arg(&controller)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the controller"),
    );
    until_listening(&[ctl_api], "controller");
    // The fabric's families appear once its switches have been probed.
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let (_, text) = testbed::http_get(ctl_api, "/metrics").expect("the controller's metrics");
        if text.contains("kvswitch_controller_fabric_switch_up") || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    exported.extend(families(&text));
    drop(running);

    let mut unknown = BTreeSet::new();
    for expr in &exprs {
        let names = names_in(expr);
        assert!(!names.is_empty(), "an expression reads no metric: {expr}");
        unknown.extend(names.into_iter().filter(|n| !exported.contains(n)));
    }
    assert!(
        unknown.is_empty(),
        "the dashboard reads metrics nothing exports: {unknown:?}"
    );
}

fn collect_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    _ => collect_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}

#[test]
fn names_are_read_from_an_expression() {
    assert_eq!(
        names_in(
            "histogram_quantile(0.99, sum by (le) (rate(kvswitch_proxy_server_request_seconds_bucket[5m]))) / process_open_fds"
        ),
        ["kvswitch_proxy_server_request_seconds", "process_open_fds"]
    );
    assert!(names_in("sum(rate(up[1m]))").is_empty());
    assert_eq!(
        names_in("x_kvswitch_y + kvswitch_a_total"),
        ["kvswitch_a_total"]
    );
}

/// The Dockerfile builds an image whose kvswitch runs as a user other than root, where a
/// container engine runs on this machine.
#[test]
fn the_container_image_builds_where_docker_runs() {
    let engine = ["docker", "podman"].into_iter().find(|e| {
        Command::new(e)
            .arg("info")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    let Some(engine) = engine else {
        eprintln!("skipped: no docker or podman daemon answers on this machine");
        return;
    };
    let tag = format!("kvswitch-test:{}", std::process::id());
    let built = Command::new(engine)
        .args(["build", "-t", &tag, "."])
        .current_dir(root())
        .output()
        .expect("the engine runs");
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let run = |args: &[&str]| {
        Command::new(engine)
            .args(["run", "--rm", "--entrypoint", ""])
            .arg(&tag)
            .args(args)
            .output()
            .expect("the engine runs")
    };
    let help = run(&["kvswitch", "proxy", "--help"]);
    let user = run(&["id", "-u"]);
    let _ = Command::new(engine).args(["rmi", "-f", &tag]).output();
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("--nutcracker-config"));
    assert_eq!(String::from_utf8_lossy(&user.stdout).trim(), "10001");
}
