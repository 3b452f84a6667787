//! The simulator against the testbed: `kvswitch bench skew` on real namespaces, kvswitch
//! nodes of limited capacity and SwitchKV's cache node, and the simulator given the same
//! settings, agree on throughput within 15%.

mod common;

use std::process::Command;

use common::require_root;

#[test]
fn the_simulator_and_the_testbed_agree_on_skewed_throughput() {
    require_root();
    let out = std::env::temp_dir().join(format!("kvswitch-sim-agreement-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    // A fresh cache at the only skew point; long enough for two rounds of periodic reports.
    let result = Command::new(env!("CARGO_BIN_EXE_kvswitch"))
        .args([
            "bench",
            "skew",
            "--short",
            "--duration",
            "2.5",
            "--systems",
            "kvswitch_udp,switchkv_udp",
            "--skews",
            "0.99",
            "--cache-sizes",
            "1000",
            "--write-ratios",
            "0.1",
            "--latency-loads",
            "0.5",
            "--prefix",
            "kvsa",
            "--out",
        ])
        .arg(&out)
        .output()
        .expect("running kvswitch bench skew");
    assert!(
        result.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&result.stdout),
        String::from_utf8_lossy(&result.stderr)
    );
    let text = std::fs::read_to_string(out.join("results.json")).expect("results.json");
    let json: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let settings = &json["settings"];
    let testbed = |system: &str| {
        json["medians"]
            .as_array()
            .expect("medians")
            .iter()
            .find(|p| p["system"] == system && p["sweep"] == "skew")
            .and_then(|p| p["get_rps"].as_f64())
            .unwrap_or_else(|| panic!("no {system} in {text}"))
    };
    // The same system in the simulator: as many backends of the same capacity and burst,
    // the same offered load, keyspace, skew and cache size, the bench's warm-up before the
    // measured window, and its cache node's reports (the paper's 640 hot keys a segment
    // shared among the backends).
    let servers = settings["servers"].as_u64().unwrap();
    let scenario = format!(
        r#"
name = "agreement"
duration_s = {duration}
warmup_s = 0.5
[workload]
keys = {keys}
skew = 0.99
[clients]
model = "open"
rate = {rate}
[backends]
count = {servers}
capacity = {capacity}
queue = {burst}
[cache]
items = 1000
top_k = {top_k}
[[variant]]
name = "switchkv_udp"
[[variant]]
name = "kvswitch_udp"
remove = ["cache"]
"#,
        duration = settings["duration_s"].as_f64().unwrap() + 0.5,
        keys = settings["keys"],
        rate = settings["offered_rps"],
        capacity = settings["capacity_rps"],
        burst = settings["burst"],
        top_k = (5 * 128u64).div_ceil(servers),
    );
    let file = sim::parse(&scenario).expect("scenario");
    for run in &file.runs {
        let simulated = sim::run(run, 1, &mut |_| {})
            .expect("simulation")
            .summary
            .throughput;
        let real = testbed(&run.variant);
        let ratio = simulated / real;
        eprintln!(
            "{}: testbed {real:.0} gets/s, simulator {simulated:.0} ({ratio:.3}x)",
            run.variant
        );
        assert!(
            (ratio - 1.0).abs() <= 0.15,
            "{}: testbed {real:.0}, simulator {simulated:.0}",
            run.variant
        );
    }
    // The cache must matter in both, or agreeing proves little.
    assert!(testbed("switchkv_udp") > 2.0 * testbed("kvswitch_udp"));
    let _ = std::fs::remove_dir_all(out);
}
