//! Building a testbed: namespaces, veth pairs, memcached, nutcracker and kvswitch, recording each
//! piece in the state file before it exists so a crash half-way can be undone by `down`.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use switch::control::{ActionDef, EntryDef, InterfaceDef, Value, ACL};

use crate::config;
use crate::down;
use crate::host::{
    answers_version, control_key_file, create_host, exited, free_port, new_token, prefix_byte,
    random_hex, record_file, record_proc, server_name, start_server, write_file, write_secret,
    CONTROL_PORT, DAEMON_READY, LOG_TAIL,
};
use crate::netns::{in_netns, ip};
use crate::probe;
use crate::process;
use crate::state::{HostState, NutcrackerState, State};
use crate::topology::{
    check_prefix, Mode, Role, Subnet, Topology, MAX_IFNAME, MEMCACHED_PORT, REDIS_PORT,
};
use crate::{default_state_path, pointer_path, ServerProgram, UpOptions};

/// nutcracker's listen port inside the first client's namespace.
pub const NUTCRACKER_PORT: u16 = 22121;
/// nutcracker's stats port inside the same namespace.
pub const NUTCRACKER_STATS_PORT: u16 = 22222;
/// The kvswitch API must answer within this long after start.
const KVSWITCH_READY: Duration = Duration::from_secs(10);
/// The longest lease a testbed's backends may wait out before serving (see `start_caches`).
const BACKEND_LEASE_WAIT: Duration = Duration::from_secs(10);

/// Builds the whole testbed and returns its state, or tears down whatever was built and fails.
pub(crate) fn up(topo: &Topology, opts: &UpOptions) -> anyhow::Result<State> {
    check_prefix(&opts.prefix)?;
    for h in &topo.hosts {
        let name = if_name(&opts.prefix, &h.name);
        if name.len() > MAX_IFNAME {
            bail!("interface name {name:?} is longer than {MAX_IFNAME} characters");
        }
    }
    let state_path = opts
        .state_path
        .clone()
        .unwrap_or_else(|| default_state_path(&opts.prefix));
    if state_path.exists() {
        bail!(
            "testbed state {} already exists; tear that testbed down first",
            state_path.display()
        );
    }
    // A state file elsewhere is found by the prefix through a pointer at the default place.
    let state_path = std::path::absolute(&state_path)
        .with_context(|| format!("resolving {}", state_path.display()))?;
    let pointer = pointer_path(&opts.prefix);
    let default = default_state_path(&opts.prefix);
    for other in [Some(default.clone()), down::pointed_to(&pointer)]
        .into_iter()
        .flatten()
    {
        if other != state_path && other.exists() {
            bail!(
                "a testbed with prefix {:?} already exists (state {}); tear it down first",
                opts.prefix,
                other.display()
            );
        }
    }
    let leftovers = crate::sweep::leftovers(&opts.prefix)?;
    if !leftovers.is_empty() {
        bail!(
            "namespaces or links with prefix \"{}-\" already exist ({}); \
             another testbed uses this prefix or a previous one was not torn down",
            opts.prefix,
            leftovers.join(", ")
        );
    }
    if opts.servers == ServerProgram::Redis && topo.caches().next().is_some() {
        bail!(
            "cache hosts (SwitchKV's cache nodes) serve memcached: they cannot front redis-server"
        );
    }
    if matches!(opts.servers, ServerProgram::Node { .. }) && topo.mode != Mode::L3 {
        bail!("servers running `kvswitch node` need mode = \"l3\" (a node listens on its host address only)");
    }
    let caches = topo.caches().next().is_some();
    if caches
        && !(matches!(opts.servers, ServerProgram::Node { .. })
            && opts.kvswitch_bin.is_some()
            && opts.local_port
            && topo.mode == Mode::L3)
    {
        bail!(
            "cache hosts (SwitchKV's cache nodes) need servers running `kvswitch node` (their \
             backends), kvswitch with its local port (the cache nodes reach its API and proxy \
             through it) and mode = \"l3\""
        );
    }
    if opts.local_port && opts.kvswitch_bin.is_some() && topo.fabric.is_none() {
        check_root_namespace(&topo.subnet)?;
    }
    let api = match opts.api {
        Some(api) => api,
        // Cache nodes reach the API on the VIP, through the local port: it listens on every
        // address of the root namespace, with a token.
        None if caches => SocketAddr::from((Ipv4Addr::UNSPECIFIED, free_port()?.port())),
        None => free_port()?,
    };

    let mut state = plan(topo, opts, state_path.clone(), api)?;
    if topo.fabric.is_some() {
        crate::fabric::plan(&mut state, topo, &opts.prefix)?;
    }
    if state_path != default {
        // Listed with the generated files, so `down` removes it with them.
        state.files.push(pointer.clone());
    }
    state.save()?;
    if state_path != default {
        let written = std::fs::create_dir_all(crate::STATE_DIR)
            .and_then(|()| std::fs::write(&pointer, format!("{}\n", state_path.display())));
        if let Err(e) = written {
            let _ = down::down(&state_path);
            return Err(e).with_context(|| format!("writing {}", pointer.display()));
        }
    }
    let built = match topo.fabric {
        Some(_) => crate::fabric::build(&mut state, topo, opts),
        None => build(&mut state, topo, opts),
    };
    match built {
        Ok(()) => Ok(state),
        Err(err) => {
            if let Err(cleanup) = down::down(&state_path) {
                tracing::warn!("tearing down the failed testbed: {cleanup:#}");
                return Err(err.context(format!("testbed cleanup also failed: {cleanup:#}")));
            }
            Err(err)
        }
    }
}

/// `<prefix>-<host>`: both the namespace and the switch-side interface.
pub(crate) fn if_name(prefix: &str, host: &str) -> String {
    format!("{prefix}-{host}")
}

/// The host's end of kvswitch's local port puts the VIP and a route to the subnet into the
/// root namespace; refuses a subnet the root namespace already has an address or a route in
/// (another testbed's, or a real network), since the two would steal each other's traffic.
fn check_root_namespace(subnet: &Subnet) -> anyhow::Result<()> {
    let clash = |what: &str, net: &str| {
        anyhow!(
            "subnet {subnet} is already reached from the root namespace ({what} {net}); \
             another testbed with a local port may use it: choose another subnet \
             (Subnet::for_prefix, or `subnet =` in the topology file)"
        )
    };
    // "4: eth0    inet 192.0.2.2/24 brd ..." per address.
    for line in ip(&["-o", "-4", "addr", "show"])?.lines() {
        let mut words = line.split_whitespace();
        let dev = words.nth(1).unwrap_or("?").to_string();
        let Some(net) = words.skip_while(|w| *w != "inet").nth(1) else {
            continue;
        };
        let addr = net
            .split('/')
            .next()
            .and_then(|a| a.parse::<Ipv4Addr>().ok());
        if addr.is_some_and(|a| u32::from(a) & mask(subnet.len) == u32::from(subnet.base)) {
            return Err(clash(&format!("address on {dev}:"), net));
        }
    }
    // "10.77.0.0/24 dev kvs-local-h proto kernel ..." per route; "default" and shorter
    // prefixes that merely cover the subnet are left alone (ours is more specific).
    for line in ip(&["-o", "-4", "route", "show", "table", "all"])?.lines() {
        let Some(first) = line
            .split_whitespace()
            .find(|w| *w != "local" && *w != "broadcast")
        else {
            continue;
        };
        if let Some(n) = parse_net(first) {
            if n.len >= subnet.len && subnet.overlaps(&n) {
                return Err(clash("route to", first));
            }
        }
    }
    Ok(())
}

/// `a.b.c.d/len` or `a.b.c.d` (a /32) as a network with its host bits cleared.
fn parse_net(text: &str) -> Option<Subnet> {
    let (addr, len) = match text.split_once('/') {
        Some((a, l)) => (a, l.parse::<u8>().ok()?),
        None => (text, 32),
    };
    let addr: Ipv4Addr = addr.parse().ok()?;
    if len > 32 {
        return None;
    }
    Some(Subnet {
        base: Ipv4Addr::from(u32::from(addr) & mask(len)),
        len,
    })
}

fn mask(len: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0)
}

/// Locally administered MAC `02:6b:76:XX:00:NN`; XX separates testbeds, NN is the host number.
pub(crate) fn mac(prefix: &str, nn: u8) -> String {
    format!("02:6b:76:{:02x}:00:{nn:02x}", prefix_byte(prefix))
}

/// The VIP MAC ends in 0x64 (100), above every host number.
const VIP_MAC_BYTE: u8 = 0x64;

/// The state with every name decided and nothing created yet.
pub(crate) fn plan(
    topo: &Topology,
    opts: &UpOptions,
    state_path: PathBuf,
    api: SocketAddr,
) -> anyhow::Result<State> {
    let stem = state_path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| format!("{}-testbed", opts.prefix));
    let work_dir = state_path
        .parent()
        .unwrap_or(Path::new("."))
        .join(format!("{stem}.d"));
    let hosts = topo
        .hosts
        .iter()
        .enumerate()
        .map(|(i, h)| HostState {
            name: h.name.clone(),
            role: h.role,
            netns: if_name(&opts.prefix, &h.name),
            ip: topo.host_ip(i),
            prefix_len: topo.subnet.len,
            mac: mac(&opts.prefix, i as u8 + 1),
            switch_if: if_name(&opts.prefix, &h.name),
            weight: h.weight,
            pids: Vec::new(),
            log: None,
        })
        .collect();
    let agent_ip = match topo.mode {
        Mode::L3 => None,
        Mode::L2 => Some(topo.agent_ip().ok_or_else(|| {
            anyhow!(
                "subnet {} has no address left for the switch's agent (l2 mode needs one)",
                topo.subnet
            )
        })?),
    };
    let local = |end: &str| opts.local_port.then(|| format!("{}-{end}", opts.prefix));
    Ok(State {
        prefix: opts.prefix.clone(),
        name: topo.name.clone(),
        mode: topo.mode,
        subnet: topo.subnet.to_string(),
        vip: topo.vip,
        vip_port: match opts.servers {
            ServerProgram::Redis => REDIS_PORT,
            _ => MEMCACHED_PORT,
        },
        redis: opts.servers == ServerProgram::Redis,
        vip_mac: mac(&opts.prefix, VIP_MAC_BYTE),
        agent_ip,
        local_port: local("local"),
        local_peer: local("local-h"),
        proxy: opts.local_port && opts.proxy,
        distribution: topo.distribution.clone(),
        hash: topo.hash.clone(),
        api,
        state_path,
        // Cache nodes install their rules with it; a fabric's switches want it for a change.
        api_token_file: (topo.caches().next().is_some() || topo.fabric.is_some())
            .then(|| work_dir.join("api-token")),
        config_path: work_dir.join("kvswitch.toml"),
        kvswitch_log: work_dir.join("kvswitch.log"),
        work_dir,
        kvswitch_pid: None,
        hosts,
        nutcracker: None,
        procs: Vec::new(),
        files: Vec::new(),
        complete: false,
        fabric: None,
    })
}

fn build(state: &mut State, topo: &Topology, opts: &UpOptions) -> anyhow::Result<()> {
    std::fs::create_dir_all(&state.work_dir)
        .with_context(|| format!("creating {}", state.work_dir.display()))?;
    for i in 0..state.hosts.len() {
        let h = state.hosts[i].clone();
        create_host(state, &h).with_context(|| format!("creating host {:?}", h.name))?;
    }

    // SwitchKV: each server is a backend of one cache node, in turn (SwitchKV section 3.4),
    // their control messages sealed under a key of this testbed's own.
    let caches: Vec<Ipv4Addr> = state.caches().map(|h| h.ip).collect();
    if !caches.is_empty() {
        write_control_key(state)?;
    }
    let mut servers = Vec::new();
    for (i, host) in topo.hosts.iter().enumerate() {
        if host.role == Role::Server {
            let cache = (!caches.is_empty()).then(|| caches[servers.len() % caches.len()]);
            servers.push((
                i,
                start_server(state, i, &host.memcached_args, &opts.servers, cache)?,
            ));
        }
    }
    // A backend serves once its cache node acknowledged its start or a lease has passed; the
    // cache nodes start after kvswitch, so the backends wait out their lease.
    let ready = match caches.is_empty() {
        true => DAEMON_READY,
        false => DAEMON_READY + BACKEND_LEASE_WAIT,
    };
    for (i, child) in servers {
        answers_version(state, i, child, ready, server_name(&opts.servers))?;
        // memcached binds its TCP port before its UDP port: a test's first datagram must not
        // come before the second.
        if matches!(opts.servers, ServerProgram::Memcached) {
            let h = &state.hosts[i];
            let addr = SocketAddr::V4(SocketAddrV4::new(h.ip, MEMCACHED_PORT));
            probe::wait_for(
                ready,
                || None,
                || in_netns(&h.netns, || probe::memcached_udp_version(addr))?,
            )
            .with_context(|| format!("memcached on {:?} did not answer over UDP", h.name))?;
        }
    }

    if opts.start_nutcracker {
        if let Some(i) = state.hosts.iter().position(|h| h.role == Role::Client) {
            start_nutcracker(state, i)?;
        }
    }

    if let Some(path) = state.api_token_file.clone() {
        write_secret(state, &path, &format!("{}\n", new_token()?))?;
    }
    // The API's port was free when it was picked; another socket may take it before kvswitch
    // listens there. Then kvswitch exits at once, and a port picked again is tried (a port
    // the caller gave is not changed).
    let mut attempts = 0;
    loop {
        let switch: String = opts
            .tcp
            .iter()
            .map(|tcp| format!("tcp = {tcp:?}\n"))
            .chain(opts.switch_config.clone())
            .collect();
        let text = config::kvswitch_config(
            state,
            opts.vip_config.as_deref(),
            opts.pool_config.as_deref(),
            opts.datapath.as_deref(),
            Some(&switch).filter(|s| !s.is_empty()).map(String::as_str),
            opts.extra_config.as_deref(),
        );
        write_file(state, &state.config_path.clone(), &text)?;
        let Some(bin) = &opts.kvswitch_bin else {
            break;
        };
        attempts += 1;
        match start_kvswitch(state, bin) {
            Ok(()) => break,
            Err(e)
                if opts.api.is_none()
                    && attempts < 3
                    && format!("{e:#}").contains("Address already in use") =>
            {
                tracing::warn!(api = %state.api, "the API's port was taken; picking another");
                state.api = SocketAddr::new(state.api.ip(), free_port()?.port());
            }
            Err(e) => return Err(e),
        }
    }
    if let Some(bin) = &opts.kvswitch_bin {
        if !caches.is_empty() {
            start_caches(state, bin, &opts.cache_args, opts.steer_to_caches)?;
        }
    }

    state.complete = true;
    state.save()
}

fn start_nutcracker(state: &mut State, i: usize) -> anyhow::Result<()> {
    let h = state.hosts[i].clone();
    let listen = SocketAddr::from((Ipv4Addr::LOCALHOST, NUTCRACKER_PORT));
    let conf = state.work_dir.join("nutcracker.yml");
    let log = state.work_dir.join("nutcracker.log");
    let pidfile = state.work_dir.join("nutcracker.pid");
    write_file(state, &conf, &config::nutcracker_config(state, listen))?;
    record_file(state, &log)?;
    record_file(state, &pidfile)?;
    state.nutcracker = Some(NutcrackerState {
        host: h.name.clone(),
        listen,
        stats_port: NUTCRACKER_STATS_PORT,
        config: conf.clone(),
        log: log.clone(),
        pid: None,
    });
    state.save()?;

    let argv: Vec<String> = vec![
        "nutcracker".into(),
        "-c".into(),
        conf.display().to_string(),
        "-o".into(),
        log.display().to_string(),
        "-p".into(),
        pidfile.display().to_string(),
        "-s".into(),
        NUTCRACKER_STATS_PORT.to_string(),
    ];
    // Its own log goes to -o; the spawn log only catches early failures.
    let mut child = process::spawn(Some(&h.netns), &argv, &log)?;
    record_proc(state, &child, "nutcracker", Some(&h.netns), argv)?;
    state.hosts[i].pids.push(child.id());
    if let Some(n) = state.nutcracker.as_mut() {
        n.pid = Some(child.id());
    }
    state.save()?;

    probe::wait_for(
        DAEMON_READY,
        || exited(&mut child),
        || {
            in_netns(&h.netns, || {
                TcpStream::connect_timeout(&listen, Duration::from_millis(300))
                    .map(drop)
                    .map_err(|e| anyhow!("connecting to {listen}: {e}"))
            })?
        },
    )
    .with_context(|| {
        format!(
            "nutcracker on {:?} is not listening on {listen}; log:\n{}",
            h.name,
            process::tail(&log, LOG_TAIL)
        )
    })
}

fn start_kvswitch(state: &mut State, bin: &Path) -> anyhow::Result<()> {
    let log = state.kvswitch_log.clone();
    record_file(state, &log)?;
    let argv = vec![
        bin.display().to_string(),
        "run".into(),
        "--config".into(),
        state.config_path.display().to_string(),
    ];
    let mut child = process::spawn(None, &argv, &log)?;
    record_proc(state, &child, "kvswitch", None, argv)?;
    state.kvswitch_pid = Some(child.id());
    state.save()?;

    let api = state.api;
    probe::wait_for(
        KVSWITCH_READY,
        || exited(&mut child),
        || match probe::http_get(api, "/api/v1/status")? {
            (200, _) => Ok(()),
            (code, body) => bail!("GET /api/v1/status answered {code}: {}", body.trim()),
        },
    )
    .with_context(|| {
        format!(
            "kvswitch did not become ready on http://{api}/api/v1/status; log {}:\n{}",
            log.display(),
            process::tail(&log, LOG_TAIL)
        )
    })
}

/// Writes a fresh random key (32 bytes, as 64 hex digits) to [`control_key_file`], readable
/// by its owner alone.
fn write_control_key(state: &mut State) -> anyhow::Result<()> {
    let path = control_key_file(state);
    let key = random_hex::<32>().context("reading /dev/urandom for the SwitchKV control key")?;
    write_secret(state, &path, &format!("{key}\n"))
}

/// SwitchKV's cache nodes: the API opened to the hosts on the VIP (an `acl` entry sends TCP
/// to its port out of the local port), an interface-table entry per cache node (the steering
/// rules' way there, numbered from 1 in host order), and `kvswitch node --role cache` on each,
/// its rules installed through that API.
fn start_caches(
    state: &mut State,
    bin: &Path,
    extra: &[String],
    steer: bool,
) -> anyhow::Result<()> {
    let local_port = state.hosts.len();
    let switch = api::Client::new(state.api, state.api_token()?);
    let to_api = EntryDef {
        fields: BTreeMap::from([
            ("ip_dst".to_string(), Value::Text(state.vip.to_string())),
            ("ip_proto".to_string(), Value::Number(6)),
            ("l4_dst".to_string(), Value::Number(state.api.port().into())),
        ]),
        priority: 1000,
        prefix_len: None,
        actions: vec![ActionDef::Output(local_port as u16)],
    };
    switch
        .add_entry(ACL, &to_api)
        .context("opening kvswitch's API to the cache nodes")?;
    let token = state
        .api_token_file
        .clone()
        .context("a testbed with cache nodes has an API token")?;
    let caches: Vec<usize> = (0..state.hosts.len())
        .filter(|&i| state.hosts[i].role == Role::Cache)
        .collect();
    let mut started = Vec::new();
    for (k, &i) in caches.iter().enumerate() {
        let h = state.hosts[i].clone();
        let interface = k as u16 + 1;
        let entry = InterfaceDef {
            eth_dst: h.mac.clone(),
            eth_src: state.vip_mac.clone(),
            port: i as u16,
        };
        switch
            .set_interface(interface, &entry)
            .with_context(|| format!("the interface entry to cache node {:?}", h.name))?;
        let mut argv = vec![
            bin.display().to_string(),
            "node".to_string(),
            "--role".to_string(),
            "cache".to_string(),
            "--listen".to_string(),
            format!("{}:{MEMCACHED_PORT}", h.ip),
            "--upstream".to_string(),
            format!("{}:{}", state.vip, state.vip_port),
            // Its backends: the pool's servers, on their control port, under the testbed's key.
            "--pool-config".to_string(),
            state.config_path.display().to_string(),
            "--backend-control-port".to_string(),
            CONTROL_PORT.to_string(),
            "--control-key-file".to_string(),
            control_key_file(state).display().to_string(),
        ];
        if steer {
            argv.extend([
                "--switch-api".to_string(),
                format!("{}:{}", state.vip, state.api.port()),
                "--switch-token-file".to_string(),
                token.display().to_string(),
                "--steer-interface".to_string(),
                interface.to_string(),
                "--vip".to_string(),
                state.vip.to_string(),
                "--hash".to_string(),
                state.hash.clone(),
            ]);
        }
        argv.extend(extra.iter().cloned());
        let log = state.work_dir.join(format!("cache-{}.log", h.name));
        record_file(state, &log)?;
        state.hosts[i].log = Some(log.clone());
        let child = process::spawn(Some(&h.netns), &argv, &log)?;
        record_proc(state, &child, "kvswitch node (cache)", Some(&h.netns), argv)?;
        state.hosts[i].pids.push(child.id());
        state.save()?;
        started.push((i, child));
    }
    for (i, child) in started {
        answers_version(state, i, child, DAEMON_READY, "cache node")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_are_deterministic_and_distinct() {
        assert_eq!(mac("kvs", 1), mac("kvs", 1));
        assert!(mac("kvs", 3).starts_with("02:6b:76:"));
        assert!(mac("kvs", 3).ends_with(":00:03"));
        assert!(mac("kvs", VIP_MAC_BYTE).ends_with(":00:64"));
        assert_ne!(prefix_byte("tb1"), prefix_byte("tb2"));
    }

    #[test]
    fn networks_from_addresses_and_routes() {
        let n = parse_net("10.77.0.100/24").unwrap();
        assert_eq!(n.to_string(), "10.77.0.0/24");
        assert_eq!(parse_net("10.77.0.3").unwrap().len, 32);
        assert_eq!(parse_net("default"), None);
        assert_eq!(parse_net("10.0.0.0/33"), None);
        assert_eq!(parse_net("0.0.0.0/0").unwrap().len, 0);
    }

    #[test]
    fn plan_names_everything() {
        let topo = Topology::default_topology();
        let opts = UpOptions::default();
        let api: SocketAddr = "127.0.0.1:9110".parse().unwrap();
        let s = plan(&topo, &opts, "/run/kvswitch/kvs-testbed.json".into(), api).unwrap();
        assert_eq!(s.hosts[2].netns, "kvs-s1");
        assert_eq!(s.hosts[2].ip, Ipv4Addr::new(10, 77, 0, 3));
        assert_eq!(s.work_dir, Path::new("/run/kvswitch/kvs-testbed.d"));
        let conf = config::kvswitch_config(
            &s,
            Some("keyed_ports = [5300]"),
            Some("auto_eject_hosts = true"),
            Some("af_packet"),
            Some("tcp = \"proxy\"\ntcp_idle_s = 5"),
            Some("[extra]\nx = 1"),
        );
        let parsed: toml::Value = toml::from_str(&conf).unwrap();
        assert_eq!(parsed["switch"]["tcp"].as_str(), Some("proxy"));
        assert_eq!(parsed["switch"]["tcp_idle_s"].as_integer(), Some(5));
        assert_eq!(parsed["vip"]["keyed_ports"][0].as_integer(), Some(5300));
        assert_eq!(parsed["switch"]["ports"].as_array().unwrap().len(), 5);
        assert_eq!(
            parsed["pool"]["servers"][0]["addr"].as_str(),
            Some("10.77.0.3:11211")
        );
        assert_eq!(parsed["pool"]["servers"][2]["name"].as_str(), Some("s3"));
        assert_eq!(parsed["vip"]["port"].as_integer(), Some(11211));
        assert_eq!(parsed["extra"]["x"].as_integer(), Some(1));
        assert_eq!(parsed["pool"]["auto_eject_hosts"].as_bool(), Some(true));
        assert_eq!(parsed["switch"]["datapath"].as_str(), Some("af_packet"));
        assert_eq!(parsed["switch"]["local_port"].as_str(), Some("kvs-local"));
        assert_eq!(parsed["switch"]["local_peer"].as_str(), Some("kvs-local-h"));
        assert_eq!(parsed["switch"]["proxy"].as_bool(), Some(true));
        assert_eq!(parsed["switch"]["source_check"].as_bool(), Some(true));
        assert_eq!(parsed["vip"]["prefix_len"].as_integer(), Some(24));
        assert!(parsed["vip"].get("agent_ip").is_none());

        // l2: an agent address; no local port when asked for none.
        let mut l2 = topo.clone();
        l2.mode = Mode::L2;
        let opts = UpOptions {
            local_port: false,
            ..UpOptions::default()
        };
        let s = plan(&l2, &opts, "/run/kvswitch/kvs-testbed.json".into(), api).unwrap();
        let parsed: toml::Value =
            toml::from_str(&config::kvswitch_config(&s, None, None, None, None, None)).unwrap();
        assert_eq!(parsed["vip"]["agent_ip"].as_str(), Some("10.77.0.254"));
        assert_eq!(parsed["switch"]["local_port"].as_str(), Some(""));
        assert!(parsed["switch"].get("local_peer").is_none());
        let yaml = config::nutcracker_config(&s, "127.0.0.1:22121".parse().unwrap());
        assert!(yaml.contains("   - 10.77.0.4:11211:1 s2\n"));
    }
}
