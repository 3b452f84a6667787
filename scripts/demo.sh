#!/usr/bin/env bash
# Sets up a fresh machine and runs the demo on the built-in default testbed.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
-h | --help)
    cat <<'EOF'
Usage: scripts/demo.sh [OPTIONS]

Installs what kvswitch needs (scripts/setup.sh, as root), builds it, and runs `kvswitch demo`
with OPTIONS: a testbed of namespaces with memcached servers, kvswitch and nutcracker, the
three compared side by side, then torn down. `kvswitch demo --help` lists the options once
kvswitch is built.
EOF
    exit 0
    ;;
esac
# shellcheck source=scripts/cargo-path.sh
. scripts/cargo-path.sh
bash scripts/setup.sh
cargo build --release --bin kvswitch
exec ./target/release/kvswitch demo "$@"
