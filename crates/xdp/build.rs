//! Compiles the XDP program with clang and turns the limits of its ABI header into Rust
//! constants, so the program and the loader share one definition of each.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-changed=bpf/fastpath.c");
    println!("cargo:rerun-if-changed=bpf/fastpath.h");
    // The program itself only with the `bpf` feature: a build without it needs no clang.
    if env::var_os("CARGO_FEATURE_BPF").is_some() {
        compile(&out);
    }
    let header = fs::read_to_string("bpf/fastpath.h").expect("bpf/fastpath.h");
    let mut consts = String::from("// Generated from bpf/fastpath.h by build.rs.\n");
    for line in header.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("#define") {
            continue;
        }
        let (Some(name), Some(value)) = (words.next(), words.next()) else {
            continue;
        };
        let Some(name) = name.strip_prefix("FP_") else {
            continue;
        };
        let value = value.trim_end_matches('u');
        let parsed = match value.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => value.parse::<u64>(),
        };
        if let Ok(v) = parsed {
            writeln!(consts, "pub const {name}: u32 = {v};").expect("writing to a String");
        }
    }
    fs::write(out.join("abi.rs"), consts).expect("writing abi.rs");
}

/// Compiles the XDP programs into `out`.
fn compile(out: &std::path::Path) {
    let object = out.join("fastpath.o");
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_owned());
    let status = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
        // Debian keeps asm/types.h under the multiarch directory.
        .arg("-I/usr/include/x86_64-linux-gnu")
        .arg("-I/usr/include/aarch64-linux-gnu")
        .args(["-c", "bpf/fastpath.c", "-o"])
        .arg(&object)
        .status()
        .unwrap_or_else(|e| {
            panic!("cannot run {clang} to build the XDP program ({e}); run scripts/setup.sh, which installs clang and libbpf-dev")
        });
    assert!(status.success(), "{clang} failed to build bpf/fastpath.c");
    println!("cargo:rerun-if-changed=bpf/impair.c");
    let status = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
        .arg("-I/usr/include/x86_64-linux-gnu")
        .arg("-I/usr/include/aarch64-linux-gnu")
        .args(["-c", "bpf/impair.c", "-o"])
        .arg(out.join("impair.o"))
        .status()
        .unwrap_or_else(|e| panic!("cannot run {clang} to build bpf/impair.c ({e})"));
    assert!(status.success(), "{clang} failed to build bpf/impair.c");
}
