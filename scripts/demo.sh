#!/usr/bin/env bash
# Sets up a fresh machine and runs the demo on the built-in default testbed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --bin kvswitch
exec ./target/release/kvswitch demo "$@"
