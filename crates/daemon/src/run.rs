//! `kvswitch run`: makes the local port, opens the ports, starts the API and the TCP proxy, and
//! runs the switch loop on one thread until SIGINT or SIGTERM; then stops the proxy and removes
//! the local port.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Context;
use dataplane::{Driver, RunOptions};
use kvio::{AfPacket, AfPacketOptions, Port};

use crate::api::pools::Reloader;
use crate::api::{self, Exporter, Shared};
use crate::cache::CacheService;
use crate::local::LocalPort;
use config::Config;
use proxy::{self, Pool, Proxy};
use switch::stats::Stats;
use switch::Switch;

pub fn run(cfg: Config) -> anyhow::Result<()> {
    kvio::signal::install_stop_handlers();
    // Before anything is changed: a port another switch owns is refused, not shared.
    let _claims = claim_ports(&cfg.ports, &cfg.path)?;
    // First, so that a port that fails to open below does not leave it behind (dropping it
    // removes it).
    let local = match &cfg.local {
        Some(l) => Some(LocalPort::create(&cfg, l)?),
        None => None,
    };
    let mut ports: Vec<Box<dyn Port>> = Vec::with_capacity(cfg.ports.len() + 1);
    let mut port_names = cfg.ports.clone();
    // With `switch.datapath = "af_xdp"`: each port's AF_XDP socket, for the program's map.
    let mut xsks = Vec::new();
    for name in &cfg.ports {
        // The host's own stack sees every frame of a port too. With the default `arp_ignore`
        // it would answer ARP for any of the host's addresses on it, the VIP included once the
        // local port holds it, and a client that took that answer would send its requests to
        // the host instead of the switch.
        if let Err(e) = kvio::link::set_ipv4_conf(name, "arp_ignore", "1") {
            tracing::warn!(port = %name, "cannot keep the host from answering ARP on it: {e}");
        }
        if cfg.datapath == config::Datapath::AfXdp {
            let port = open_af_xdp(name).with_context(|| {
                format!(
                    "{}: `switch.datapath = \"af_xdp\"`: cannot open port `{name}`",
                    cfg.path.display()
                )
            })?;
            xsks.push((ports.len() as u16, port.socket()));
            ports.push(Box::new(port));
            continue;
        }
        let port = AfPacket::open(name, &AfPacketOptions::default()).with_context(|| {
            format!(
                "{}: `switch.ports`: cannot open port `{name}`",
                cfg.path.display()
            )
        })?;
        ports.push(Box::new(port));
    }
    if let Some(l) = &local {
        // Numbered after the configured ports, as the switch expects.
        let port = AfPacket::open(l.port(), &AfPacketOptions::default())
            .with_context(|| format!("cannot open the local port `{}`", l.port()))?;
        ports.push(Box::new(port));
        port_names.push(l.port().to_string());
    }
    let port_count = ports.len();
    let stats = Arc::new(Stats::new(port_count, cfg.servers.len()));
    let cache = match cfg.cache.enabled {
        true => Some(CacheService::new(
            cfg.cache.clone(),
            cfg.servers.len(),
            kvio::clock::now(),
        )?),
        false => None,
    };
    let pool = Arc::new(cfg.pool()?);
    // Servers added at run time must be what the configuration would take.
    pool.set_rules(cfg.server_rules());
    let spec = cfg.switch_spec(ports.len(), seed());
    let mut switch = Switch::new(spec, pool.clone(), stats.clone())?;
    if let Some(cache) = &cache {
        switch.set_cache(cache.clone())?;
    }
    let local_index = switch.local_port().map(usize::from);
    let shared = Arc::new(Shared {
        config: cfg.clone(),
        port_names,
        port_macs: ports
            .iter()
            .map(|p| wire::ethernet::Mac(p.mac()).to_string())
            .collect(),
        stats: stats.clone(),
        snapshot: Mutex::new(switch.snapshot()),
        started: Instant::now(),
        proxy: std::sync::OnceLock::new(),
        cache: cache.clone(),
        pool: pool.clone(),
        steer: Arc::default(),
        fast: Arc::default(),
        cpu: Arc::default(),
    });
    watch_hangups(
        reloader(&cfg, pool.clone(), shared.caches()),
        shared.clone(),
    )?;
    let token = api::api_token(cfg.api_token_file.as_deref(), cfg.api)
        .with_context(|| format!("{}: `switch.api`", cfg.path.display()))?;
    let listener = std::net::TcpListener::bind(cfg.api).with_context(|| {
        format!(
            "{}: `switch.api`: cannot listen on {}",
            cfg.path.display(),
            cfg.api
        )
    })?;
    let (remote, inbox) = dataplane::remote::<Switch>()?;
    // The cache nodes that steering entries lead to are reached through the local port.
    match (cfg.steer_check, switch.local_port()) {
        (Some(every), Some(local_port)) => {
            let check = crate::steer::SteerCheck {
                port: cfg.vip_port,
                local_port,
                local_source: cfg.local_source(),
                every,
                failures: cfg.steer_check_failures,
            };
            crate::steer::watch(
                remote.clone(),
                check,
                shared.steer.clone(),
                kvio::signal::stop_requested,
            )?;
        }
        (Some(_), None) => {
            tracing::info!("no local port: the cache nodes of kv_steer entries are not probed")
        }
        (None, _) => {}
    }
    let egress = dataplane::EgressSettings::new(port_count);
    for &(p, rate, depth) in &cfg.egress {
        let _ = egress.set(p, rate, depth);
    }
    let fast_ports = crate::fast::FastPorts {
        ports: cfg
            .ports
            .iter()
            .enumerate()
            .map(|(i, name)| (i as u16, name.clone(), ports[i].ifindex()))
            .collect(),
        count: port_count,
        xsks,
    };
    let mut fast = crate::fast::start(
        &cfg,
        fast_ports,
        remote.clone(),
        egress.clone(),
        pool.clone(),
        cache.clone(),
        shared.fast.clone(),
        kvio::signal::stop_requested,
    )?;
    // The switch remembers the senders the program may then switch itself.
    switch.set_fast_path(fast.is_some());
    // Replies on spliced legs are sent on by the program where the splice hands them over.
    if let Some(legs) = fast.as_mut().and_then(|f| f.legs.take()) {
        switch.set_leg_offload(legs);
    }
    // Before the API, so that its status names the channel from its first answer.
    let mut channel = match &cfg.cpu_socket {
        config::CpuSocket::Off => None,
        config::CpuSocket::At(path) => Some(
            crate::cpu::Channel::bind(path, token.clone(), shared.cpu.clone())
                .with_context(|| format!("{}: `switch.cpu_socket`", cfg.path.display()))?,
        ),
        // Where none is configured, a switch that cannot listen at the default place runs
        // without one: its agents use the API.
        config::CpuSocket::Default => {
            let swept = crate::cpu::sweep_stale(std::path::Path::new(crate::cpu::DEFAULT_DIR));
            if swept > 0 {
                tracing::info!(
                    swept,
                    "removed the CPU channel sockets of switches that are gone"
                );
            }
            match crate::cpu::Channel::bind(
                &crate::cpu::default_path(),
                token.clone(),
                shared.cpu.clone(),
            ) {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::warn!("no CPU channel: {e:#}; set switch.cpu_socket");
                    None
                }
            }
        }
    };
    let api_addr = api::serve(
        listener,
        api::Api {
            exporter: shared.clone(),
            switch: Some(remote),
            token,
            pools: vec![pool.clone()],
            egress: Some(egress.clone()),
            reload: Some(reloader(&cfg, pool.clone(), shared.caches())),
            serving: cfg.api_serving.clone(),
        },
    )?;
    // After the ports are open, so that the proxy's first frames (ARP, connections to the
    // servers) wait in the local port's ring until the loop below forwards them. The proxy
    // must therefore not wait for a server while it starts: its traffic only flows once the
    // loop runs.
    let proxy = start_proxy(&cfg, pool.clone(), cache.clone())?;
    if let Some(p) = &proxy {
        let _ = shared.proxy.set(p.stats());
    }
    tracing::info!(
        ports = ?cfg.ports, local_port = ?local.as_ref().map(|l| l.port()),
        proxy = proxy.is_some(), cache = cache.is_some(), vip = %cfg.vip, mode = ?cfg.mode,
        servers = cfg.servers.len(), api = %api_addr, tcp = cfg.tcp_path().0.name(),
        cpu_channel = ?channel.as_ref().map(|c| c.path()),
        datapath = if fast.is_some() { "xdp" } else { "af_packet" }, "kvswitch running"
    );
    if let (path, Some(why)) = cfg.tcp_path() {
        tracing::warn!(tcp = path.name(), "TCP to the VIP is not spliced: {why}");
    }

    let options = RunOptions {
        busy_poll: cfg.busy_poll,
        ..RunOptions::default()
    };
    let mut driver = Driver::new(ports, switch, local_index, stats.clone()).with_egress(egress);
    let snapshot = &shared.snapshot;
    driver.run_with(
        &options,
        Some(&inbox),
        channel
            .as_mut()
            .map(|c| c as &mut dyn dataplane::Side<Switch>),
        &kvio::signal::stop_requested,
        &mut |switch| {
            if let Ok(mut s) = snapshot.lock() {
                *s = switch.snapshot();
            }
        },
    )?;
    tracing::info!("kvswitch stopping");
    // The proxy first, so that nothing listens on the VIP once its address is gone; then the
    // ports, then the pair itself.
    if let Some(p) = proxy {
        p.stop();
    }
    drop(driver);
    if let Some(attached) = fast {
        // It sees the stop too, and detaches the program as it ends.
        let _ = attached.thread.join();
    }
    if let Some(l) = local {
        l.remove()?;
    }
    Ok(())
}

/// An AF_XDP port on `name`, with the interface's MAC read from sysfs (the daemon runs in the
/// namespace that holds its ports).
/// Claims every port in `names` for this process ([`kvio::PortClaim`]), held until the claims
/// are dropped; `path` is the configuration file the ports come from, for the message.
pub fn claim_ports(
    names: &[String],
    path: &std::path::Path,
) -> anyhow::Result<Vec<kvio::PortClaim>> {
    names
        .iter()
        .map(|name| {
            kvio::PortClaim::take(name)
                .with_context(|| format!("{}: cannot take port `{name}`", path.display()))
        })
        .collect()
}

fn open_af_xdp(name: &str) -> anyhow::Result<kvio::AfXdp> {
    let text = std::fs::read_to_string(format!("/sys/class/net/{name}/address"))
        .with_context(|| format!("reading the MAC of {name}"))?;
    let mac: wire::ethernet::Mac = text
        .trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("{name} has no Ethernet address: {text:?}"))?;
    Ok(kvio::AfXdp::open(name, mac.0)?)
}

/// Reads the configuration file again and changes the pool's servers and weights to its;
/// anything else that differs needs a restart, and refuses the reload.
fn reloader(cfg: &Config, pool: Arc<Pool>, caches: Vec<(String, Arc<CacheService>)>) -> Reloader {
    let path = cfg.path.clone();
    Arc::new(move || {
        let new = Config::load(&path)?;
        api::pools::apply(
            std::slice::from_ref(&pool),
            &[new.switch_pool_spec()],
            &caches,
        )
    })
}

/// Handles SIGHUP on a thread of its own until the switch stops: a reload reads a file, which
/// the forwarding thread must not wait for.
fn watch_hangups(reload: Reloader, shared: Arc<api::Shared>) -> anyhow::Result<()> {
    kvio::signal::install_reload_handler();
    std::thread::Builder::new()
        .name("reload".into())
        .spawn(move || {
            while !kvio::signal::stop_requested() {
                if kvio::signal::reload_requested() {
                    api::pools::reload_on_hangup(&reload);
                    ::api::server::reload_tls();
                    if let Some(proxy) = shared.proxy.get() {
                        proxy.reload_secrets();
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        })?;
    Ok(())
}

/// The switch's seed: from the operating system's randomness, so that what the switch draws
/// from it (the ids of split sub-requests) cannot be guessed from a restart; the clock and the
/// process id if that cannot be read.
fn seed() -> u64 {
    let mut bytes = [0u8; 8];
    match std::fs::File::open("/dev/urandom").and_then(|mut f| {
        use std::io::Read;
        f.read_exact(&mut bytes)
    }) {
        Ok(()) => u64::from_le_bytes(bytes),
        Err(_) => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            nanos ^ (u64::from(std::process::id()) << 32)
        }
    }
}

/// Starts the built-in proxy on the VIP's port if the configuration asks for it (a local port
/// and `switch.proxy`).
///
/// A failure is a startup error: whoever configured the proxy asked for TCP on the VIP, and a
/// switch running without it would refuse TCP clients while looking healthy. The local port
/// and the ports are removed and closed as `run` returns.
fn start_proxy(
    cfg: &Config,
    pool: Arc<Pool>,
    cache: Option<Arc<CacheService>>,
) -> anyhow::Result<Option<Proxy>> {
    if cfg.local.is_none() || !cfg.proxy {
        return Ok(None);
    }
    let listen = SocketAddr::new(cfg.vip.into(), cfg.vip_port);
    let secrets = proxy::Secrets::load(
        cfg.tls.as_ref(),
        cfg.server_tls.as_ref(),
        cfg.server_sasl.as_ref(),
    )
    .with_context(|| format!("{}: TLS and SASL", cfg.path.display()))?;
    let settings = proxy::Settings {
        pools: vec![pool],
        workers: cfg.proxy_workers,
        // The servers answer the proxy through the switch, which sends what comes from their
        // memcached ports to this address out of the local port.
        source: Some(cfg.local_source().into()),
        limits: proxy::Limits::default(),
        // One cache for both paths: a write on either invalidates what the other serves.
        caches: vec![cache],
        tls: secrets.tls,
        server_tls: secrets.server_tls,
        server_sasl: secrets.sasl,
    };
    let proxy = Proxy::start(settings).with_context(|| {
        format!(
            "{}: the TCP proxy on {listen} did not start (`switch.proxy = false` runs the \
             switch without it)",
            cfg.path.display()
        )
    })?;
    tracing::info!(%listen, workers = cfg.proxy_workers, "TCP proxy running");
    Ok(Some(proxy))
}
