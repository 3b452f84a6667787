#!/usr/bin/env bash
# Installs what kvswitch needs on a fresh Debian machine: memcached and nutcracker (the peers it
# is measured against and tested with), iproute2 and ethtool (the testbed's hosts and links,
# and the tests' checks of the interfaces kvswitch sets up), and libmemcached's command-line
# clients (the ordinary TCP client the tests talk to the VIP with, and memcslap, the second
# client of `kvswitch bench proxy`), pymemcache and pylibmc (Python's memcached clients, which
# the TCP splice's tests run through the VIP),
# redis-server, redis-tools and redis-py (the Redis pools' servers, their reference in the
# differential tests, and the clients the tests run through the proxy), dnsmasq and dig (the
# unchanged DNS service and client the keyed ports' test shards by name),
# the DejaVu fonts the bench's plots are lettered in, openssl, curl and saslpasswd2 (the TLS
# tests' certificates, their HTTPS client, and the SASL test's password database), etcd (where several controllers keep
# their pool and elect a leader), Chromium (the dashboard's tests load it headless), and clang,
# libbpf, libelf, zlib and bpftool (the XDP fast path is compiled, linked and inspected with
# them).
# Needs root. Rust (cargo) must already be installed.
set -euo pipefail
# shellcheck source=scripts/cargo-path.sh
. "$(dirname "$0")/cargo-path.sh"

if [ "$(id -u)" -ne 0 ]; then
    echo "setup: run as root (the testbed creates network namespaces)" >&2
    exit 1
fi

need=()
for cmd in memcached nutcracker ethtool ip python3 ps ping memccp memcslap etcd chromium clang \
    bpftool pkg-config redis-server redis-cli redis-benchmark dnsmasq dig openssl curl saslpasswd2; do
    command -v "$cmd" >/dev/null 2>&1 || need+=("$cmd")
done
for module in pymemcache pylibmc redis; do
    /usr/bin/python3 -c "import $module" >/dev/null 2>&1 || need+=("python3-$module")
done
if [ ! -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]; then
    need+=("DejaVuSans.ttf")
fi
for header in /usr/include/bpf/bpf_helpers.h /usr/include/libelf.h /usr/include/zlib.h; do
    [ -f "$header" ] || need+=("$header")
done
# SASL's PLAIN mechanism, which memcached -S offers (libsasl2-modules).
compgen -G "/usr/lib/*/sasl2/libplain.so*" >/dev/null || need+=("libplain.so")
if [ "${#need[@]}" -gt 0 ]; then
    echo "setup: installing memcached, nutcracker, iproute2, ethtool, python3, procps," \
        "iputils-ping, libmemcached-tools, fonts-dejavu-core, etcd-server, chromium, clang," \
        "libbpf-dev, libelf-dev, zlib1g-dev, bpftool, pkg-config, python3-pymemcache, python3-pylibmc," \
        "redis-server, redis-tools, python3-redis, dnsmasq-base, bind9-dnsutils, openssl, curl," \
        "sasl2-bin, libsasl2-modules"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends \
        memcached nutcracker iproute2 ethtool python3 procps iputils-ping \
        libmemcached-tools fonts-dejavu-core etcd-server chromium clang libbpf-dev \
        libelf-dev zlib1g-dev bpftool pkg-config linux-libc-dev python3-pymemcache \
        python3-pylibmc redis-server redis-tools python3-redis dnsmasq-base bind9-dnsutils \
        openssl curl sasl2-bin libsasl2-modules >/dev/null
fi
# Debian starts memcached as a service on install; the testbed runs its own.
if command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now memcached >/dev/null 2>&1 || true
    systemctl disable --now etcd >/dev/null 2>&1 || true
    systemctl disable --now redis-server >/dev/null 2>&1 || true
fi

if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo not found (on PATH, in ~/.cargo/bin or the sudo user's); install Rust" \
        "(stable, https://rustup.rs) first" >&2
    exit 1
fi
echo "setup: memcached $(memcached -V | awk '{print $2}'), $(nutcracker -V 2>&1 | head -1), $(cargo --version)"
