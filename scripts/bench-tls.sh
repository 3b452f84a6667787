#!/usr/bin/env bash
# TLS's cost to the proxy, side by side in one run on loopback: memcached direct in clear,
# memcached's own TLS (`memcached -Z`) direct, `kvswitch proxy` in clear, and `kvswitch proxy`
# with TLS for its clients (to memcached in clear). Each is loaded with `kvswitch load` (TCP,
# GETs of 1,000 preloaded 100-byte values, CONNS connections, 1 s warm-up and 4 s measured);
# the CPU per request is the server's or the proxy's own (/proc), over warm-up and
# measurement. Prints each run, then the medians.
#
#   bash scripts/bench-tls.sh [RUNS] [CONNS]      (defaults: 3 runs, 16 connections)
#
# Needs memcached and openssl; builds kvswitch first. Listens on 127.0.0.1:24101-24113.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/cargo-path.sh
runs=${1:-3}
conns=${2:-16}
cargo build --quiet --release --bin kvswitch
kvs=$PWD/target/release/kvswitch
dir=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
cd "$dir"
# An authority and a certificate for 127.0.0.1 that it signed.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=bench-ca -keyout ca.key -out ca.crt 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=bench \
    -keyout s.key -out s.csr 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >s.ext
openssl x509 -req -in s.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile s.ext \
    -out s.crt 2>/dev/null
user=()
[ "$(id -u)" -eq 0 ] && user=(-u root)
memcached "${user[@]}" -U 0 -t 1 -l 127.0.0.1:24101 & pids+=($!)
# memcached -Z, with a listener in clear for the preload (memcached leaves pipelined TLS
# requests unread at times; the load itself keeps one request in flight per connection).
memcached "${user[@]}" -U 0 -t 1 -Z -o ssl_chain_cert=s.crt,ssl_key=s.key \
    -l 127.0.0.1:24102 -l notls:127.0.0.1:24103 & pids+=($!)
proxy_file() { # listen, extra lines
    printf '[proxy]\nlisten = "%s"\nworkers = 1\n%s\n[pool]\n[[pool.servers]]\naddr = "127.0.0.1:24101"\n' "$1" "$2"
}
proxy_file 127.0.0.1:24111 "" >plain.toml
proxy_file 127.0.0.1:24112 $'tls_cert = "s.crt"\ntls_key = "s.key"' >tls.toml
"$kvs" proxy --config plain.toml 2>/dev/null & pids+=($!)
"$kvs" proxy --config tls.toml 2>/dev/null & pids+=($!)
sleep 1
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
# name, target, pid, tls arguments, preload target
one() {
    local preload=(--preload)
    if [ -n "$5" ]; then
        "$kvs" load --target "$5" --proto tcp --concurrency 1 --duration 0.2 --preload \
            --keys 1000 --value-size 100 >/dev/null 2>&1
        preload=()
    fi
    local before after out
    before=$(ticks "$3")
    # shellcheck disable=SC2086
    out=$("$kvs" load --target "$2" --proto tcp $4 --get-ratio 1 --concurrency "$conns" \
        --warmup 1 --duration 4 "${preload[@]}" --keys 1000 --value-size 100 --json run.json 2>/dev/null)
    after=$(ticks "$3")
    python3 - "$1" "$before" "$after" "$hz" <<'PY'
import json, sys
name, before, after, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
r = json.load(open("run.json"))
rate = r["throughput_rps"]
errors = r["errors"] + r["timeouts"]
cpu_us = (after - before) / hz * 1e6 / (rate * 5)
print(f"{name} {rate:.0f} {r['latency_us']['p50']} {r['latency_us']['p99']} {cpu_us:.2f} {errors}")
PY
}
printf '%-13s %9s %6s %6s %9s %6s\n' "" "GET/s" "p50" "p99" "CPU µs/req" "errors"
: >all.txt
for run in $(seq "$runs"); do
    for args in \
        "memcached 127.0.0.1:24101 ${pids[0]} -" \
        "memcached-tls 127.0.0.1:24102 ${pids[1]} --tls-ca=ca.crt 127.0.0.1:24103" \
        "proxy 127.0.0.1:24111 ${pids[2]} -" \
        "proxy-tls 127.0.0.1:24112 ${pids[3]} --tls-ca=ca.crt"; do
        read -r name target pid tls pre <<<"$args"
        [ "$tls" = "-" ] && tls=""
        line=$(one "$name" "$target" "$pid" "$tls" "${pre:-}")
        echo "$line" >>all.txt
        echo "run $run: $line"
    done
done
echo "medians of $runs runs, $conns connections:"
python3 - <<'PY'
import statistics
rows = {}
for line in open("all.txt"):
    name, *vals = line.split()
    rows.setdefault(name, []).append([float(v) for v in vals])
for name, runs in rows.items():
    med = [statistics.median(c) for c in zip(*runs)]
    print(f"{name:<13} {med[0]:9.0f} {med[1]:6.0f} {med[2]:6.0f} {med[3]:9.2f} {med[4]:6.0f}")
PY
