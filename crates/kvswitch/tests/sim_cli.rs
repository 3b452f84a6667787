//! `kvswitch sim` from the command line: a shipped scenario's small version writes its files
//! and plots, the same seed writes the same bytes, and a bad scenario is refused with the
//! field named.

use std::path::Path;
use std::process::Command;

fn sim(args: &[&str], out: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kvswitch"))
        .arg("sim")
        .args(args)
        .arg("--out")
        .arg(out)
        .output()
        .expect("running kvswitch sim")
}

fn read(dir: &Path, file: &str) -> Vec<u8> {
    std::fs::read(dir.join(file)).unwrap_or_else(|e| panic!("{}: {e}", dir.join(file).display()))
}

#[test]
fn a_shipped_scenario_runs_and_repeats_byte_for_byte() {
    let scenario = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scenarios/switchkv-fig10.toml"
    );
    let base = std::env::temp_dir().join(format!("kvswitch-sim-cli-{}", std::process::id()));
    let (a, b, c) = (base.join("a"), base.join("b"), base.join("c"));
    for (dir, seed) in [(&a, "3"), (&b, "3"), (&c, "4")] {
        let out = sim(&[scenario, "--short", "--seed", seed], dir);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("switchkv-fig10: 4 run(s)") && stdout.contains("events"),
            "{stdout}"
        );
    }
    for run in ["switchkv_skew_0.99", "no_cache_skew_0"] {
        for file in ["summary.json", "series.csv", "backends.csv"] {
            let f = format!("{run}/{file}");
            assert_eq!(read(&a, &f), read(&b, &f), "{f}");
        }
    }
    assert_eq!(read(&a, "runs.csv"), read(&b, "runs.csv"));
    assert_ne!(read(&a, "runs.csv"), read(&c, "runs.csv"));
    // The plots the scenario asks for, each as PNG and SVG.
    for plot in ["throughput", "hit_ratio", "imbalance"] {
        assert!(read(&a, &format!("{plot}.png")).starts_with(b"\x89PNG"));
        assert!(String::from_utf8(read(&a, &format!("{plot}.svg")))
            .unwrap()
            .contains("<svg"));
    }
    let runs = String::from_utf8(read(&a, "runs.csv")).unwrap();
    assert_eq!(runs.lines().count(), 5, "{runs}");
    let _ = std::fs::remove_dir_all(base);
}

#[test]
fn a_bad_scenario_or_setting_is_refused_with_the_field_named() {
    let dir = std::env::temp_dir().join(format!("kvswitch-sim-cli-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let scenario = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scenarios/switchkv-fig10.toml"
    );
    let out = sim(
        &[scenario, "--short", "--set", "backends.count=0"],
        &dir.join("o"),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("backends.count must be 1 to 65536"), "{err}");
    let out = sim(&[scenario, "--set", "nonsense"], &dir.join("o"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected KEY=VALUE"));
    let missing = dir.join("missing.toml");
    let out = sim(&[missing.to_str().unwrap()], &dir.join("o"));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.toml"));
    let _ = std::fs::remove_dir_all(dir);
}
