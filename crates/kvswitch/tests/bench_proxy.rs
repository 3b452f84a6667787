//! `kvswitch bench proxy` in its shortest form: it starts memcached, nutcracker and the proxy,
//! measures each with both clients, writes well-formed figures, and leaves nothing running.
//! Needs memcached, nutcracker and memcslap (scripts/setup.sh installs them); no root.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

const SYSTEMS: [&str; 3] = ["direct", "nutcracker", "kvswitch"];
const CLIENTS: [&str; 2] = ["loadgen", "memcslap"];

fn num(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("`{key}` is not a number in {v}"))
}

#[test]
fn short_run_measures_every_system_with_every_client() {
    let dir = testbed::local::TempDir::new("kvswitch-bench-test").expect("a scratch directory");
    let json = dir.path().join("bench.json");
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_kvswitch"))
        .args(["bench", "proxy", "--runs", "1", "--duration", "1"])
        .args(["--concurrency", "2", "--json"])
        .arg(&json)
        .output()
        .expect("run kvswitch bench proxy");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the short mode took {:?}",
        started.elapsed()
    );

    let figures: Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("the JSON was written"))
            .expect("well-formed JSON");
    assert_eq!(figures["scenario"], "proxy");
    assert_eq!(figures["settings"]["runs"], 1);
    assert_eq!(figures["settings"]["concurrency"], 2);
    let runs = figures["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 1);
    for group in [&runs[0]["samples"], &figures["medians"]] {
        let samples = group.as_array().expect("samples");
        assert_eq!(samples.len(), SYSTEMS.len() * CLIENTS.len(), "{group}");
        for system in SYSTEMS {
            for client in CLIENTS {
                let s = samples
                    .iter()
                    .find(|s| s["system"] == system && s["client"] == client)
                    .unwrap_or_else(|| panic!("no {system} under {client} in {group}"));
                assert!(num(s, "get_rps") > 0.0, "{s}");
                assert!(s["requests"].as_u64().is_some_and(|n| n > 0), "{s}");
                // Latency from the project's client only; CPU time for the proxies only.
                assert_eq!(s["p99_us"].is_number(), client == "loadgen", "{s}");
                assert_eq!(
                    s["cpu_us_per_request"].is_number(),
                    system != "direct",
                    "{s}"
                );
            }
        }
    }
    let targets = figures["targets"].as_array().expect("targets");
    assert_eq!(targets.len(), 5, "{targets:?}");
    assert!(targets.iter().all(|t| t["met"].is_boolean()));

    // The report names every system and says whether each target was met.
    for name in [
        "memcached direct",
        "nutcracker",
        "kvswitch proxy",
        "memcslap",
    ] {
        assert!(stdout.contains(name), "{stdout}");
    }
    assert!(
        stdout.contains("| met |") || stdout.contains("not met"),
        "{stdout}"
    );

    // The proxies the bench started are gone: both name the bench's scratch directory (their
    // configuration file) on their command lines.
    let leftovers: Vec<String> = std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains("kvswitch-bench-proxy-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// `kvswitch bench redis` in its shortest form: every system measured at each depth, the
/// figures and plots written, nothing left running.
#[test]
fn short_redis_run_measures_every_system_at_every_depth() {
    let dir = testbed::local::TempDir::new("kvswitch-bench-redis-test").expect("a directory");
    let out = Command::new(env!("CARGO_BIN_EXE_kvswitch"))
        .args([
            "bench",
            "redis",
            "--runs",
            "1",
            "--requests",
            "2000",
            "--clients",
            "2",
        ])
        .args(["--pipeline", "1,4", "--out"])
        .arg(dir.path())
        .output()
        .expect("run kvswitch bench redis");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let figures: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("redis.json")).expect("the JSON was written"),
    )
    .expect("well-formed JSON");
    let medians = figures["medians"].as_array().expect("medians");
    assert_eq!(medians.len(), 3 * 2 * 2, "{figures}");
    for system in ["direct", "twemproxy", "kvswitch"] {
        for test in ["GET", "SET"] {
            for depth in [1, 4] {
                let m = medians
                    .iter()
                    .find(|m| m["system"] == system && m["test"] == test && m["pipeline"] == depth)
                    .unwrap_or_else(|| panic!("no {system} {test} -P {depth}"));
                assert!(num(m, "rps") > 0.0, "{m}");
                assert_eq!(
                    m["cpu_us_per_request"].is_number(),
                    system != "direct",
                    "{m}"
                );
            }
        }
    }
    assert_eq!(figures["targets"].as_array().map(Vec::len), Some(8));
    for plot in ["redis-rate.png", "redis-cpu.svg"] {
        assert!(dir.path().join(plot).is_file(), "{plot} missing: {stdout}");
    }
    let leftovers: Vec<String> = std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains("kvswitch-bench-redis-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}
