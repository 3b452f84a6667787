//! The pure crates stay pure: what the wire formats, the pipeline, the key-value algorithms,
//! the switch application, the coherence checker, memcached's item store and the simulator
//! build on is a short, reviewed list, and
//! nothing on it does I/O, reads a clock or starts a runtime. A crate that gains a dependency
//! fails here until the list below is changed on purpose.

use std::collections::BTreeSet;
use std::process::Command;

/// Every crate a pure crate may have in its normal dependency tree, and why it is harmless.
const ALLOWED: &[&str] = &[
    // The workspace's own pure crates.
    "kvswitch-wire",
    "kvswitch-pipeline",
    "kvswitch-kv",
    "kvswitch-switch",
    "kvswitch-history",
    "kvswitch-store",
    "kvswitch-sim",
    // md5 for ketama and nutcracker's md5 hash, and what it is made of.
    "md-5",
    "digest",
    "block-buffer",
    "crypto-common",
    "generic-array",
    "typenum",
    "cfg-if",
    // Error enums (a derive macro and what it is built with).
    "thiserror",
    "thiserror-impl",
    "proc-macro2",
    "quote",
    "syn",
    "unicode-ident",
    // Log events; a subscriber (which writes them out) belongs to the binary.
    "tracing",
    "tracing-core",
    "tracing-attributes",
    "once_cell",
    "pin-project-lite",
];

/// Crates that must never appear below a pure crate, whatever the list above says: I/O,
/// runtimes, file formats, plotting, the operating system's randomness.
const FORBIDDEN: &[&str] = &[
    "tokio",
    "mio",
    "libc",
    "anyhow",
    // switch::control's types derive Serialize and Deserialize only under the switch's
    // `serde` feature, which the API's crate turns on; kv's popularity changes and the
    // simulator's scenarios and summaries likewise, under features the config crate turns on.
    "serde",
    "serde_json",
    "toml",
    "serde_yaml",
    "serde_norway",
    "plotters",
    "getrandom",
    "rand",
    "tracing-subscriber",
    "hyper",
    "kvswitch-io",
];

const PURE: &[&str] = &[
    "kvswitch-wire",
    "kvswitch-pipeline",
    "kvswitch-kv",
    "kvswitch-switch",
    "kvswitch-history",
    "kvswitch-store",
    "kvswitch-sim",
];

/// The names of every crate in `package`'s normal dependency tree (itself included).
fn tree(package: &str) -> BTreeSet<String> {
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "-e",
            "normal",
            "--prefix",
            "none",
            "-p",
        ])
        .arg(package)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree -p {package} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn pure_crates_depend_only_on_reviewed_crates() {
    for &package in PURE {
        let names = tree(package);
        assert!(
            names.contains(package),
            "{package} is not in its own tree: {names:?}"
        );
        for name in &names {
            assert!(
                !FORBIDDEN.contains(&name.as_str()),
                "{package} depends on {name}, which does I/O or belongs at the edge"
            );
            assert!(
                ALLOWED.contains(&name.as_str()),
                "{package} gained the dependency {name}: review it, and add it to ALLOWED in \
                 this test only if it does no I/O, reads no clock and starts no runtime"
            );
        }
    }
}

/// The check itself can fail: the binary's crate has the edge's dependencies.
#[test]
fn the_check_sees_edge_dependencies() {
    let names = tree("kvswitch");
    for edge in ["tokio", "serde", "libc"] {
        assert!(
            names.contains(edge),
            "kvswitch's tree lacks {edge}: {names:?}"
        );
    }
}

/// The crates that run in production: none of them may reach into the testbed or the bench,
/// which set up namespaces and measure, at run time.
const EDGE: &[&str] = &[
    "kvswitch-api",
    "kvswitch-daemon",
    "kvswitch-controller",
    "kvswitch-nf",
    "kvswitch-proxy",
    "kvswitch-dataplane",
    "kvswitch-io",
    "kvswitch-node",
    "kvswitch-config",
];

#[test]
fn edge_crates_do_not_reach_into_the_testbed_or_the_bench() {
    for &package in EDGE {
        let names = tree(package);
        assert!(
            names.contains(package),
            "{package} is not in its own tree: {names:?}"
        );
        for tool in ["kvswitch-testbed", "kvswitch-bench", "kvswitch-loadgen"] {
            assert!(
                !names.contains(tool),
                "{package} depends on {tool}: the testbed, the bench and the load generator \
                 are tools around kvswitch, not parts of it"
            );
        }
    }
}

/// The modules `crates/kvswitch/src` may hold: the command line, one file per subcommand's
/// arguments and glue. Anything else has a crate of its own (the switch as a program in
/// `daemon`, the controller, the network functions, the API client and server helpers), so a
/// new file here fails this test until it is added on purpose.
const COMMAND_LINE: &[&str] = &[
    "main.rs",
    "lib.rs",
    "cache_cli.rs",
    "ctl.rs",
    "demo.rs",
    "fabric.rs",
    "inc_cli.rs",
    "proxy_cli.rs",
    "sim_cli.rs",
];

/// The most lines a file of the command line may have: past it, logic is growing there that
/// belongs in a crate of its own.
const COMMAND_FILE_LINES: usize = 1_200;

#[test]
fn the_command_crate_holds_only_the_command_line() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(&src).expect("src is readable") {
        let entry = entry.expect("a directory entry");
        let name = entry.file_name().to_string_lossy().into_owned();
        assert!(
            entry.file_type().expect("a file type").is_file(),
            "crates/kvswitch/src/{name} is a directory: a module of several files is a crate \
             of its own, not part of the command line"
        );
        assert!(
            COMMAND_LINE.contains(&name.as_str()),
            "crates/kvswitch/src/{name} is not one of the command line's files {COMMAND_LINE:?}"
        );
        let lines = std::fs::read_to_string(entry.path())
            .expect("a source file")
            .lines()
            .count();
        assert!(
            lines <= COMMAND_FILE_LINES,
            "crates/kvswitch/src/{name} has {lines} lines, more than {COMMAND_FILE_LINES}"
        );
        seen.push(name);
    }
    assert!(
        seen.iter().any(|n| n == "main.rs"),
        "no main.rs among {seen:?}"
    );
}
