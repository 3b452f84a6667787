#!/usr/bin/env bash
# Sets up a fresh machine and runs the whole test suite: formatting, lints, unit tests and the
# end-to-end tests on real memcached, nutcracker, namespaces and veth pairs.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/cargo-path.sh
. scripts/cargo-path.sh
bash scripts/setup.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# The proxy-only install, as README's "Installing" gives it: no XDP, so neither clang (CLANG
# names nothing, and the build must not need it) nor libbpf. It builds in target/, beside the
# suite's own build.
CARGO_TARGET_DIR=target CLANG=/nonexistent cargo install --quiet --locked --force \
    --path crates/kvswitch --no-default-features --root target/proxy-only
target/proxy-only/bin/kvswitch proxy --help >/dev/null
echo "proxy-only install: ok (target/proxy-only/bin/kvswitch)"
# Every test binary runs, whatever an earlier one did, so one run shows every failure.
status=0
cargo test --workspace --release --no-fail-fast 2>&1 | tee target/test.log || status=$?
# One summary line for the whole run.
awk '/^test result:/ { p += $4; f += $6; i += $8 } END { printf "%d passed, %d failed, %d skipped\n", p, f, i }' target/test.log
exit "$status"
