//! `kvswitch testbed up` and `down` through the binary, as a user runs them: a testbed whose
//! state file was put elsewhere with `--state` is found and removed by `down --prefix` alone,
//! and `down` of a prefix with nothing behind it fails. Needs root; prefix `kvtdn` and its
//! own subnet.

use std::path::Path;
use std::process::{Command, Output};

const PREFIX: &str = "kvtdn";

fn kvswitch(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvswitch"))
        .args(args)
        .output()
        .expect("running kvswitch")
}

/// Namespaces and links named `<PREFIX>-*`.
fn names_with_prefix() -> Vec<String> {
    let tag = format!("{PREFIX}-");
    let mut found = Vec::new();
    for dir in ["/var/run/netns", "/sys/class/net"] {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with(&tag) {
                    found.push(format!("{dir}/{name}"));
                }
            }
        }
    }
    found
}

fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(") ")
            .is_some_and(|(_, r)| r.starts_with('Z')),
        Err(_) => false,
    }
}

#[test]
fn down_by_prefix_finds_a_testbed_whose_state_was_put_elsewhere() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "needs root (namespaces)");
    let dir = std::env::temp_dir().join(format!("kvtdn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.join("elsewhere.json");
    // Whatever an interrupted run left.
    let _ = testbed::down(&state);
    let _ = testbed::down_prefix(PREFIX);

    let subnet = testbed::Subnet::for_prefix(PREFIX);
    let topology = dir.join("topology.toml");
    std::fs::write(
        &topology,
        format!(
            "subnet = \"{subnet}\"\n\n[[hosts]]\nname = \"c1\"\nrole = \"client\"\n\n\
             [[hosts]]\nname = \"s1\"\nrole = \"server\"\n"
        ),
    )
    .unwrap();

    let up = kvswitch(&[
        "testbed",
        "up",
        topology.to_str().unwrap(),
        "--prefix",
        PREFIX,
        "--state",
        state.to_str().unwrap(),
        "--no-nutcracker",
    ]);
    assert!(
        up.status.success(),
        "up failed: {}",
        String::from_utf8_lossy(&up.stderr)
    );
    let live = testbed::State::load(&state).expect("the state file is where --state said");
    let pids: Vec<u32> = live.procs.iter().map(|p| p.pid).collect();
    assert!(pids.len() >= 2, "memcached and kvswitch run: {pids:?}");
    assert!(pids.iter().all(|&p| alive(p)));
    assert!(!names_with_prefix().is_empty());

    let down = kvswitch(&["testbed", "down", "--prefix", PREFIX]);
    assert!(
        down.status.success(),
        "down failed: {}",
        String::from_utf8_lossy(&down.stderr)
    );
    assert_eq!(names_with_prefix(), Vec::<String>::new());
    for &pid in &pids {
        assert!(!alive(pid), "pid {pid} still alive");
    }
    assert!(!state.exists(), "state file left behind");
    assert!(!live.work_dir.exists(), "work directory left behind");
    assert!(
        !testbed::pointer_path(PREFIX).exists(),
        "pointer left behind"
    );

    // Nothing of the prefix is left: `down` says so and fails.
    let again = kvswitch(&["testbed", "down", "--prefix", PREFIX]);
    assert!(!again.status.success(), "down of nothing succeeded");
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(err.contains("no testbed") && err.contains(PREFIX), "{err}");
    let missing = kvswitch(&[
        "testbed",
        "down",
        "--state",
        dir.join("missing.json").to_str().unwrap(),
    ]);
    assert!(
        !missing.status.success(),
        "down of a missing state file succeeded"
    );
    let _ = std::fs::remove_dir_all(Path::new(&dir));
}
