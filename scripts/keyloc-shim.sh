#!/usr/bin/env bash
# Builds the key-location shim (keyloc/keyloc_preload.c), an LD_PRELOAD library that attaches
# kvswitch's key-location header to the UDP datagrams an unchanged program sends to a keyed
# port, and prints its path. Usage: scripts/keyloc-shim.sh [OUTPUT]
# (default target/keyloc/libkvswitch_keyloc.so). Rebuilds only when the source is newer.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/target/keyloc/libkvswitch_keyloc.so}"
src="$root/keyloc/keyloc_preload.c"
if [ ! -f "$out" ] || [ "$src" -nt "$out" ]; then
    mkdir -p "$(dirname "$out")"
    cc="${CC:-clang}"
    "$cc" -O2 -Wall -Werror -shared -fPIC -o "$out.tmp" "$src" -ldl
    mv "$out.tmp" "$out"
fi
echo "$out"
