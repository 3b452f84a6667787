# syntax=docker/dockerfile:1
#
# kvswitch in a container.
#
#   docker build -t kvswitch .
#
# The image runs as the unprivileged user `kvswitch` (uid 10001), which is all the proxy
# needs. By default it runs the proxy on /etc/kvswitch/proxy.toml; mount your own, listening
# on an address reachable from outside the container (0.0.0.0):
#
#   kvswitch proxy --example-config > proxy.toml      # then set [proxy] listen = "0.0.0.0:22121"
#   docker run -d -p 22121:22121 -v "$PWD/proxy.toml:/etc/kvswitch/proxy.toml:ro" kvswitch
#
# A twemproxy file serves as it is:
#   docker run ... -v "$PWD/nutcracker.yml:/etc/kvswitch/nutcracker.yml:ro" kvswitch \
#       proxy --nutcracker-config /etc/kvswitch/nutcracker.yml
# An API ([proxy] api) listening beyond loopback needs a token: -e KVSWITCH_API_TOKEN=...
#
# The switch (`kvswitch run`) works on the host's interfaces as root:
#
#   docker run -d --user 0 --network host \
#       --cap-add NET_ADMIN --cap-add NET_RAW --cap-add BPF --cap-add PERFMON \
#       --cap-add SYS_ADMIN --cap-add IPC_LOCK --cap-add SYS_RESOURCE --ulimit memlock=-1 \
#       --security-opt systempaths=unconfined --security-opt apparmor=unconfined \
#       -v /etc/kvswitch/switch.toml:/etc/kvswitch/switch.toml:ro \
#       kvswitch run --config /etc/kvswitch/switch.toml
#
#   --user 0                  the switch runs as root (with only the capabilities below)
#   --network host            its ports are the host's interfaces, and it creates its local
#                             veth pair and the VIP's route in the host's namespace
#   NET_ADMIN                 links, addresses and routes over rtnetlink, the ethtool ioctl,
#                             attaching the XDP program to the ports
#   NET_RAW                   AF_PACKET and AF_XDP sockets on the ports
#   BPF, PERFMON              loading the XDP program and its maps (kernel 5.8 and later)
#   SYS_ADMIN                 bpf() on kernels before 5.8, and the BPF calls that still need it
#   IPC_LOCK, SYS_RESOURCE,   memory the kernel locks for AF_XDP umems, rings and, before
#   --ulimit memlock=-1       5.11, BPF maps
#   systempaths=unconfined    Docker mounts /proc/sys read-only; the switch writes the sysctls
#                             of the interfaces it sets up (arp_ignore, arp_announce,
#                             disable_ipv6)
#   apparmor=unconfined       Docker's default AppArmor profile denies those writes too (only
#                             on hosts that use AppArmor)
#
# kvswitch pins nothing in /sys/fs/bpf, so bpffs need not be mounted. Where these options
# are not available, `--privileged --network host` runs the switch too, with far more power.

# The workspace needs Rust 1.85 or later (rust-version in Cargo.toml); rust:1 is the newest
# stable release.
FROM rust:1-bookworm AS build
# clang compiles the XDP programs (crates/xdp/bpf) to BPF objects; libbpf-dev gives their
# headers; libelf, zlib and pkg-config are what the libbpf that libbpf-sys builds links to.
RUN apt-get update \
    && apt-get install -y --no-install-recommends clang libbpf-dev libelf-dev zlib1g-dev pkg-config \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p kvswitch \
    && install -m755 target/release/kvswitch /usr/local/bin/kvswitch

FROM debian:bookworm-slim
# The binary links libelf and zlib dynamically (zlib1g is already in the base image).
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates libelf1 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin kvswitch \
    && install -d -m755 /etc/kvswitch
COPY --from=build /usr/local/bin/kvswitch /usr/local/bin/kvswitch
USER kvswitch
# The ports of the example proxy file (`kvswitch proxy --example-config`): clients on 22121,
# the API (/metrics, /api/v1/status) on 9111 once `[proxy] api` is set. kvswitch has no
# default for either; the file decides.
EXPOSE 22121 9111
ENTRYPOINT ["kvswitch"]
CMD ["proxy", "--config", "/etc/kvswitch/proxy.toml"]
