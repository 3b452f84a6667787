#!/usr/bin/env bash
# Sets up a fresh machine and runs the whole test suite: formatting, lints, unit tests and the
# end-to-end tests on real memcached, nutcracker, namespaces and veth pairs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# Every test binary runs, whatever an earlier one did, so one run shows every failure.
status=0
cargo test --workspace --release --no-fail-fast 2>&1 | tee target/test.log || status=$?
# One summary line for the whole run.
awk '/^test result:/ { p += $4; f += $6; i += $8 } END { printf "%d passed, %d failed, %d skipped\n", p, f, i }' target/test.log
exit "$status"
