//! Generated configuration files: kvswitch's TOML and nutcracker's YAML pool.
//!
//! Pure text rendering from the [`State`]; writing the files is the caller's job. All names and
//! values were validated by the topology, so none of them needs quoting beyond plain strings.

use std::fmt::Write;

use crate::state::State;

/// The kvswitch daemon config, with `vip` added verbatim to its `[vip]` table, `pool` to its
/// `[pool]` table (before the servers, which TOML would otherwise take it to belong to) and
/// `switch` to its `[switch]` table, `datapath` as `switch.datapath`, and `extra` appended
/// verbatim.
pub fn kvswitch_config(
    state: &State,
    vip: Option<&str>,
    pool: Option<&str>,
    datapath: Option<&str>,
    switch: Option<&str>,
    extra: Option<&str>,
) -> String {
    let mut out = String::new();
    let ports: Vec<String> = state
        .hosts
        .iter()
        .map(|h| format!("{:?}", h.switch_if))
        .collect();
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "# kvswitch testbed {:?} ({})",
        state.prefix, state.name
    );
    let _ = writeln!(out, "[switch]");
    let _ = writeln!(out, "ports = [{}]", ports.join(", "));
    let _ = writeln!(out, "mode = {:?}", state.mode.as_str());
    let _ = writeln!(out, "api = \"{}\"", state.api);
    if let Some(token) = &state.api_token_file {
        let _ = writeln!(out, "api_token_file = {:?}", token.display().to_string());
    }
    // Every host's address is accepted on its own port only: what a switch exposed to
    // untrusted hosts should run with, and so what the tests and benchmarks run with.
    let _ = writeln!(out, "source_check = true");
    if let Some(datapath) = datapath {
        let _ = writeln!(out, "datapath = {datapath:?}");
    }
    if let Some(switch) = switch {
        out.push_str(switch);
        if !switch.ends_with('\n') {
            out.push('\n');
        }
    }
    match (&state.local_port, &state.local_peer) {
        (Some(port), Some(peer)) => {
            let _ = writeln!(out, "local_port = {port:?}");
            let _ = writeln!(out, "local_peer = {peer:?}");
            let _ = writeln!(out, "proxy = {}", state.proxy);
        }
        _ => {
            let _ = writeln!(out, "local_port = \"\"");
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "[vip]");
    let _ = writeln!(out, "ip = \"{}\"", state.vip);
    let _ = writeln!(out, "mac = {:?}", state.vip_mac);
    let _ = writeln!(out, "port = {}", state.vip_port);
    if let Some(len) = state.subnet.split_once('/').map(|(_, len)| len) {
        let _ = writeln!(out, "prefix_len = {len}");
    }
    if let Some(agent) = state.agent_ip {
        let _ = writeln!(out, "agent_ip = \"{agent}\"");
    }
    if let Some(vip) = vip {
        out.push_str(vip);
        if !vip.ends_with('\n') {
            out.push('\n');
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "[pool]");
    let _ = writeln!(out, "distribution = {:?}", state.distribution);
    let _ = writeln!(out, "hash = {:?}", state.hash);
    if state.redis {
        let _ = writeln!(out, "redis = true");
    }
    if let Some(pool) = pool {
        out.push_str(pool);
        if !pool.ends_with('\n') {
            out.push('\n');
        }
    }
    for s in state.servers() {
        let _ = writeln!(out);
        let _ = writeln!(out, "[[pool.servers]]");
        let _ = writeln!(out, "addr = \"{}:{}\"", s.ip, state.vip_port);
        let _ = writeln!(out, "mac = {:?}", s.mac);
        let _ = writeln!(out, "weight = {}", s.weight);
        let _ = writeln!(out, "name = {:?}", s.name);
    }
    if let Some(extra) = extra {
        let _ = writeln!(out);
        out.push_str(extra);
        if !extra.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// nutcracker's pool: the same servers, weights, hash and distribution as kvswitch. Servers are
/// named after their hosts because ketama places `name`, not `ip:port`, on the ring when a name
/// is given, and kvswitch's ring does the same.
pub fn nutcracker_config(state: &State, listen: std::net::SocketAddr) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}:", state.prefix);
    let _ = writeln!(out, "  listen: {listen}");
    let _ = writeln!(out, "  hash: {}", state.hash);
    let _ = writeln!(out, "  distribution: {}", state.distribution);
    let _ = writeln!(out, "  timeout: 1000");
    let _ = writeln!(out, "  auto_eject_hosts: false");
    if state.redis {
        let _ = writeln!(out, "  redis: true");
    }
    let _ = writeln!(out, "  servers:");
    for s in state.servers() {
        let _ = writeln!(
            out,
            "   - {}:{}:{} {}",
            s.ip, state.vip_port, s.weight, s.name
        );
    }
    out
}
