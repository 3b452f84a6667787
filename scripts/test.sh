#!/usr/bin/env bash
# Sets up a fresh machine and runs the whole test suite: formatting, lints, unit tests and the
# end-to-end tests on real memcached, nutcracker, namespaces and veth pairs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace --release 2>&1 | tee target/test.log
# One summary line for the whole run.
awk '/^test result:/ { p += $4; f += $6; i += $8 } END { printf "%d passed, %d failed, %d skipped\n", p, f, i }' target/test.log
