//! Consistent updates across two switches in series, through the controller: probes from a
//! client cross switch A (where they enter the fabric and are stamped) and switch B (which
//! hands them to its CPU) while the controller replaces both switches' routes again and again.
//! Each version's entries leave a mark: A's rewrites the IPv4 source to an address naming the
//! version, B's the destination. Every probe must show one version at both switches, and the
//! version it was stamped with. A failed update (a switch refusing, a switch down) must leave
//! the old version in force on every switch. Prints how long one update took, by phase.
//!
//! Needs root (a network namespace, veth pairs). Names start with `kver`.

mod common;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use api::Client;
use common::proxy::free_port;
use common::require_root;
use serde_json::{json, Value};
use testbed::in_netns;

const PREFIX: &str = "kver";
const CLIENT_NS: &str = "kver-c";
/// A's port to the client, A's port to B, B's port to A (the last two joined by a veth pair).
const A_EDGE: &str = "kver-a0";
const A_LINK: &str = "kver-a1";
const B_LINK: &str = "kver-b0";
/// The MAC the client sends the probes to (nobody's: the switches route them by IP).
const NEXT_HOP_MAC: &str = "02:6b:76:00:00:fe";
const PROBE_PORT: u16 = 9999;

/// Runs a command to its end; an error carries its stderr.
fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!(
            "`{program} {}`: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    run("ip", args)
}

fn have_ipv6() -> bool {
    Path::new("/proc/sys/net/ipv6").exists()
}

fn no_ipv6(ns: Option<&str>, dev: &str) {
    if have_ipv6() {
        let key = format!("net.ipv6.conf.{dev}.disable_ipv6=1");
        let done = match ns {
            Some(ns) => ip(&["netns", "exec", ns, "sysctl", "-q", "-w", &key]),
            None => run("sysctl", &["-q", "-w", &key]),
        };
        done.expect("IPv6 off");
    }
}

/// The testbed is built once at a time: the tests share its names.
static BED: Mutex<()> = Mutex::new(());

fn host(last: u8) -> Ipv4Addr {
    let base = testbed::Subnet::for_prefix(PREFIX).base.octets();
    Ipv4Addr::new(base[0], base[1], base[2], last)
}

/// Where the probes go.
fn target() -> Ipv4Addr {
    host(200)
}

/// A's mark of version `mark` (the source it writes) and B's (the destination).
fn a_mark(mark: u8) -> Ipv4Addr {
    host(10 + mark)
}
fn b_mark(mark: u8) -> Ipv4Addr {
    host(50 + mark)
}

/// Two kvswitch processes, the client's namespace and the links; all removed on drop.
struct Bed {
    switches: Vec<Child>,
    apis: Vec<SocketAddr>,
    dir: PathBuf,
}

fn remove_links() {
    // Deleting one end of a veth pair deletes both; the namespace takes its own end with it.
    for link in [A_EDGE, A_LINK] {
        if Path::new("/sys/class/net").join(link).exists() {
            let _ = ip(&["link", "del", link]);
        }
    }
    if Path::new("/var/run/netns").join(CLIENT_NS).exists() {
        let _ = ip(&["netns", "del", CLIENT_NS]);
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        for c in &mut self.switches {
            let _ = c.kill();
            let _ = c.wait();
        }
        remove_links();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn root_end(link: &str) {
    no_ipv6(None, link);
    ip(&["link", "set", "dev", link, "up"]).expect("link up");
    let _ = run("ethtool", &["-K", link, "gro", "off", "tx", "off"]);
}

fn switch_config(ports: &[&str], api: SocketAddr) -> String {
    let quoted: Vec<String> = ports.iter().map(|p| format!("{p:?}")).collect();
    format!(
        "[switch]\nports = [{}]\nmode = \"l3\"\napi = \"{api}\"\nlocal_port = \"\"\n\n\
         [vip]\nip = \"{}\"\nmac = \"02:6b:76:00:00:64\"\nport = 11211\nprefix_len = 24\n\n\
         [pool]\ndistribution = \"ketama\"\nhash = \"md5\"\n\
         [[pool.servers]]\naddr = \"{}:11211\"\nname = \"s1\"\n",
        quoted.join(", "),
        host(100),
        host(11),
    )
}

impl Bed {
    fn up() -> Bed {
        require_root();
        remove_links();
        let dir = std::env::temp_dir().join(format!("{PREFIX}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a work directory");
        let mut bed = Bed {
            switches: Vec::new(),
            apis: Vec::new(),
            dir,
        };
        ip(&["netns", "add", CLIENT_NS]).expect("the client's namespace");
        // Before eth0 exists, so that it is born without IPv6 and sends no solicitations.
        no_ipv6(Some(CLIENT_NS), "all");
        no_ipv6(Some(CLIENT_NS), "default");
        ip(&[
            "link", "add", A_EDGE, "type", "veth", "peer", "name", "eth0", "netns", CLIENT_NS,
        ])
        .expect("the client's link");
        ip(&[
            "link", "add", A_LINK, "type", "veth", "peer", "name", B_LINK,
        ])
        .expect("A to B");
        for link in [A_EDGE, A_LINK, B_LINK] {
            root_end(link);
        }
        let cidr = format!("{}/24", host(1));
        ip(&["-n", CLIENT_NS, "addr", "add", &cidr, "dev", "eth0"]).expect("client address");
        // The kernel would leave the UDP checksum to a "hardware" a veth does not have.
        let _ = ip(&[
            "netns", "exec", CLIENT_NS, "ethtool", "-K", "eth0", "tx", "off",
        ]);
        ip(&["-n", CLIENT_NS, "link", "set", "dev", "eth0", "up"]).expect("client up");
        let next = target().to_string();
        ip(&[
            "-n",
            CLIENT_NS,
            "neigh",
            "add",
            &next,
            "lladdr",
            NEXT_HOP_MAC,
            "dev",
            "eth0",
        ])
        .expect("the next hop's MAC");

        for (name, ports) in [("a", vec![A_EDGE, A_LINK]), ("b", vec![B_LINK])] {
            let api = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let config = bed.dir.join(format!("{name}.toml"));
            std::fs::write(&config, switch_config(&ports, api)).expect("switch config");
            let log = std::fs::File::create(bed.dir.join(format!("{name}.log"))).expect("log");
            let child = Command::new(env!("CARGO_BIN_EXE_kvswitch"))
                .args(["run", "--config"])
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .spawn()
                .expect("kvswitch starts");
            bed.switches.push(child);
            bed.apis.push(api);
        }
        for (i, api) in bed.apis.clone().into_iter().enumerate() {
            let started = Instant::now();
            while !matches!(testbed::http_get(api, "/api/v1/status"), Ok((200, _))) {
                assert!(
                    started.elapsed() < Duration::from_secs(20),
                    "switch {i} did not start: {}",
                    std::fs::read_to_string(bed.dir.join(if i == 0 { "a.log" } else { "b.log" }))
                        .unwrap_or_default()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        bed
    }

    fn controller(&self, drain_ms: u64) -> (controller::Running, Client) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let api = listener.local_addr().unwrap();
        let text = self.controller_file(api, drain_ms);
        let file = config::controller::parse(&text, Path::new("controller.toml")).unwrap();
        let running = controller::start(file, listener, None, None, None).unwrap();
        (running, Client::new(api, None))
    }

    /// The file of a controller of both switches whose API is `api`.
    fn controller_file(&self, api: SocketAddr, drain_ms: u64) -> String {
        format!(
            "[controller]\napi = \"{api}\"\n\
             [[switches]]\nname = \"sw_a\"\napi = \"{}\"\n\
             [[switches]]\nname = \"sw_b\"\napi = \"{}\"\n\
             [pool]\ndistribution = \"ketama\"\nhash = \"md5\"\n\
             [[pool.servers]]\naddr = \"{}:11211\"\nname = \"s1\"\n\
             [routes]\nmatch = {{ ethertype = \"0x0800\", ip_dst = \"{}\" }}\ndrain_ms = {drain_ms}\n\
             [routes.edge_ports]\nsw_a = [0]\n",
            self.apis[0],
            self.apis[1],
            host(11),
            target(),
        )
    }

    fn switch(&self, i: usize) -> Client {
        Client::new(self.apis[i], None)
    }
}

/// Routes of version `mark`: A marks the source and sends to B; B marks the destination
/// and hands the frame to its CPU.
fn routes(mark: u8) -> Value {
    let to = target().to_string();
    json!({ "switches": {
        "sw_a": [{ "match": { "ip_dst": to }, "priority": 1,
                   "actions": [{ "set_ipv4_src": a_mark(mark).to_string() }, { "output": 1 }] }],
        "sw_b": [{ "match": { "ip_dst": to }, "priority": 1,
                   "actions": [{ "set_ipv4_dst": b_mark(mark).to_string() }, "to_cpu"] }],
    }})
}

/// What one probe met: (A's mark, B's mark, the version stamped on it).
type Met = (u8, u8, u8);

/// The probes B handed to its CPU, as (sequence, what it met).
fn read_probe(frame: &Value) -> Option<(u64, Met)> {
    let bytes = switch::control::unhex(frame["frame"].as_str()?).ok()?;
    if bytes.len() < 42 || bytes[12..14] != [0x08, 0x00] || bytes[23] != 17 {
        return None;
    }
    let payload = &bytes[42..];
    let seq: u64 = std::str::from_utf8(payload.strip_prefix(b"kver ")?)
        .ok()?
        .parse()
        .ok()?;
    let (src, dst) = (bytes[29], bytes[33]);
    Some((
        seq,
        (src.wrapping_sub(10), dst.wrapping_sub(50), bytes[15] >> 2),
    ))
}

/// Sends probes from the client until `stop` (at most `max` of them, one a millisecond).
fn send_probes(stop: Arc<AtomicBool>, max: u64) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        in_netns(CLIENT_NS, move || {
            let sock = UdpSocket::bind("0.0.0.0:0").expect("a socket in the client");
            let to = SocketAddr::new(target().into(), PROBE_PORT);
            let mut sent = 0;
            while sent < max && !stop.load(Ordering::Relaxed) {
                let _ = sock.send_to(format!("kver {sent}").as_bytes(), to);
                sent += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            sent
        })
        .expect("the client's namespace")
    })
}

/// Reads B's CPU frames until `stop` and then `ms` of quiet; bounded by `limit`.
fn collect(
    b: Client,
    stop: Arc<AtomicBool>,
    limit: Duration,
) -> std::thread::JoinHandle<Vec<(u64, Met)>> {
    std::thread::spawn(move || {
        let started = Instant::now();
        let mut out = Vec::new();
        let mut quiet_rounds = 0;
        while started.elapsed() < limit && quiet_rounds < 2 {
            let before = out.len();
            let _ = b.stream("/api/v1/packets/stream?ms=300", |doc| {
                if let Some(p) = read_probe(&doc) {
                    out.push(p);
                }
                true
            });
            if stop.load(Ordering::Relaxed) && out.len() == before {
                quiet_rounds += 1;
            }
        }
        out
    })
}

fn put(ctl: &Client, body: &Value) -> anyhow::Result<Value> {
    ctl.call_within("PUT", "/api/v1/routes", Some(body), Duration::from_secs(20))
}

/// The versions (by `dscp`) of the entries of a switch's routes table.
fn installed(sw: &Client) -> Vec<u8> {
    let doc = sw
        .call("GET", "/api/v1/tables/ctl_routes/entries", None)
        .expect("the routes table");
    doc["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| (e["match"]["dscp"]["value"].as_u64().unwrap_or(0) >> 2) as u8)
        .collect()
}

/// What A's edge port stamps.
fn stamped(a: &Client) -> Vec<u64> {
    let doc = a
        .call("GET", "/api/v1/tables/ctl_stamp/entries", None)
        .expect("the stamp table");
    doc["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["actions"][0]["set_dscp"].as_u64())
        .collect()
}

#[test]
fn every_probe_meets_one_version_while_the_controller_updates_both_switches() {
    let _one = BED.lock().unwrap_or_else(|p| p.into_inner());
    let bed = Bed::up();
    let (_controller, ctl) = bed.controller(100);
    let mut version_of_mark: BTreeMap<u8, u8> = BTreeMap::new();
    let first = put(&ctl, &routes(1)).expect("the first version");
    version_of_mark.insert(1, first["version"].as_u64().unwrap() as u8);

    let stop = Arc::new(AtomicBool::new(false));
    let reader = collect(bed.switch(1), stop.clone(), Duration::from_secs(60));
    let sender = send_probes(stop.clone(), 30_000);
    let mut took = Vec::new();
    for mark in 2..=5u8 {
        std::thread::sleep(Duration::from_millis(300));
        let reply = put(&ctl, &routes(mark)).expect("an update under traffic");
        assert_eq!(reply["ok"], true, "{reply}");
        version_of_mark.insert(mark, reply["version"].as_u64().unwrap() as u8);
        took.push(reply);
    }
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let sent = sender.join().expect("the sender");
    let probes = reader.join().expect("the reader");

    // Every probe met one version, at both switches, and was stamped with it.
    let mut seen: BTreeMap<u8, usize> = BTreeMap::new();
    for (seq, (a, b, dscp)) in &probes {
        assert_eq!(
            (a, Some(dscp)),
            (b, version_of_mark.get(a)),
            "probe {seq} met A's version of mark {a}, B's of mark {b}, stamped {dscp} \
             (versions by mark: {version_of_mark:?})"
        );
        *seen.entry(*a).or_default() += 1;
    }
    eprintln!(
        "{sent} probes sent, {} came through, by the mark of their version: {seen:?}",
        probes.len()
    );
    assert!(
        seen.len() >= 2,
        "the updates happened under traffic: probes of several versions, not {seen:?}"
    );
    // After the last update, only the newest version is installed, and it is stamped.
    let last = version_of_mark[&5];
    for i in 0..2 {
        assert_eq!(installed(&bed.switch(i)), [last], "switch {i}");
    }
    assert_eq!(stamped(&bed.switch(0)), [u64::from(last)]);
    assert!(stamped(&bed.switch(1)).is_empty(), "B has no edge port");
    let status = ctl.call("GET", "/api/v1/status", None).unwrap();
    assert_eq!(status["routes"]["version"], last, "{status}");
    let metrics = ctl.call("GET", "/metrics", None).unwrap();
    let metrics = metrics.as_str().unwrap_or_default();
    assert!(
        metrics.contains(&format!("kvswitch_controller_routes_version {last}")),
        "{metrics}"
    );
    for reply in &took {
        eprintln!(
            "update to version {} across 2 switches: {:.1} ms ({})",
            reply["version"],
            reply["total_ms"].as_f64().unwrap_or(0.0),
            reply["phases"]
        );
    }
}

#[test]
fn a_failed_update_leaves_the_old_version_on_every_switch() {
    let _one = BED.lock().unwrap_or_else(|p| p.into_inner());
    let mut bed = Bed::up();
    let (_controller, ctl) = bed.controller(20);
    let old = put(&ctl, &routes(1)).expect("the first version")["version"]
        .as_u64()
        .unwrap() as u8;

    // B refuses an entry (a port it does not have): nothing changes anywhere.
    let mut bad = routes(2);
    bad["switches"]["sw_b"][0]["actions"] = json!([{ "output": 7 }]);
    let e = put(&ctl, &bad).expect_err("refused").to_string();
    assert!(
        e.contains("409") && e.contains("sw_b") && e.contains("port 7"),
        "{e}"
    );
    for i in 0..2 {
        assert_eq!(
            installed(&bed.switch(i)),
            [old],
            "switch {i} after a refusal"
        );
    }
    assert_eq!(stamped(&bed.switch(0)), [u64::from(old)]);
    // The old version still routes.
    let stop = Arc::new(AtomicBool::new(false));
    let reader = collect(bed.switch(1), stop.clone(), Duration::from_secs(20));
    let sender = send_probes(stop.clone(), 50);
    sender.join().expect("the sender");
    stop.store(true, Ordering::Relaxed);
    let probes = reader.join().expect("the reader");
    assert!(!probes.is_empty(), "probes pass after a refused update");
    for (seq, met) in &probes {
        assert_eq!(*met, (1, 1, old), "probe {seq}");
    }

    // B down: the update stops before the flip and A keeps the old version alone.
    let mut b = bed.switches.remove(1);
    let _ = b.kill();
    let _ = b.wait();
    let e = put(&ctl, &routes(3)).expect_err("B is down").to_string();
    assert!(e.contains("502") && e.contains("sw_b"), "{e}");
    assert_eq!(installed(&bed.switch(0)), [old], "A after B was down");
    assert_eq!(stamped(&bed.switch(0)), [u64::from(old)]);
    let status = ctl.call("GET", "/api/v1/status", None).unwrap();
    assert_eq!(status["routes"]["version"], old, "{status}");
    assert_eq!(status["routes"]["last_update"]["ok"], false, "{status}");
    assert_eq!(
        status["routes"]["last_update"]["switch"], "sw_b",
        "{status}"
    );
}

/// The role each controller's status gives (`None` for one that does not answer).
fn roles(ctls: &[Client]) -> Vec<Option<String>> {
    ctls.iter()
        .map(|c| {
            c.call("GET", "/api/v1/status", None)
                .ok()
                .and_then(|s| s["role"].as_str().map(str::to_string))
        })
        .collect()
}

/// The one leader among `ctls` (skipping `not`), within `limit`.
fn leader(ctls: &[Client], not: Option<usize>, limit: Duration) -> usize {
    let started = Instant::now();
    loop {
        let r = roles(ctls);
        let leading: Vec<usize> = (0..ctls.len())
            .filter(|&i| Some(i) != not && r[i].as_deref() == Some("leader"))
            .collect();
        if let [one] = leading[..] {
            return one;
        }
        assert!(started.elapsed() < limit, "no single leader: {r:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_leader_killed_in_the_middle_of_an_update_leaves_it_to_the_next_to_finish() {
    let _one = BED.lock().unwrap_or_else(|p| p.into_inner());
    let bed = Bed::up();
    let dir = testbed::local::TempDir::new("kver-etcd").unwrap();
    let (_etcd, etcd_addr) = common::fleet::etcd(&dir);
    // A long drain: the leader is killed while it waits there, after every switch holds both
    // versions and every edge port stamps the new one.
    const DRAIN_MS: u64 = 3000;
    let mut procs = Vec::new();
    let mut ctls = Vec::new();
    for i in 0..2 {
        let api = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let path = dir.path().join(format!("controller{i}.toml"));
        std::fs::write(&path, bed.controller_file(api, DRAIN_MS)).unwrap();
        let proc = testbed::local::Proc::spawn_logged(
            "kvswitch controller",
            Command::new(env!("CARGO_BIN_EXE_kvswitch"))
                .arg("controller")
                .arg("--config")
                .arg(&path)
                .arg("--store")
                .arg(format!("etcd://{etcd_addr}")),
            &dir.path().join(format!("controller{i}.log")),
        )
        .unwrap();
        procs.push(Some(proc));
        ctls.push(Client::new(api, None));
    }
    let first = leader(&ctls, None, Duration::from_secs(20));
    let old = put(&ctls[first], &routes(1)).expect("the first version")["version"]
        .as_u64()
        .unwrap() as u8;

    // The next update, killed in its drain.
    let updating = {
        let ctl = ctls[first].clone();
        std::thread::spawn(move || put(&ctl, &routes(2)))
    };
    let started = Instant::now();
    let new = loop {
        let stamps = stamped(&bed.switch(0));
        if let [v] = stamps[..] {
            if v != u64::from(old) {
                break v as u8;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the update never flipped: {stamps:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    procs[first] = None;
    let killed = Instant::now();
    assert!(
        updating.join().unwrap().is_err(),
        "the killed leader answered"
    );
    for i in 0..2 {
        let mut both = installed(&bed.switch(i));
        both.sort();
        assert_eq!(
            both,
            [old, new],
            "switch {i} holds both versions mid-update"
        );
    }

    // The standby leads, finds the update half done, and finishes it: the new version
    // alone, stamped, and its entries known.
    let next = leader(&ctls, Some(first), Duration::from_secs(20));
    loop {
        let a = installed(&bed.switch(0));
        let b = installed(&bed.switch(1));
        if a == [new] && b == [new] {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "the update was not finished: A holds {a:?}, B {b:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let finished = killed.elapsed();
    assert_eq!(stamped(&bed.switch(0)), [u64::from(new)]);
    let shown = ctls[next]
        .call("GET", "/api/v1/routes", None)
        .expect("the routes");
    assert_eq!(shown["version"], new, "{shown}");
    assert_eq!(
        shown["switches"]["sw_a"]["entries"][0]["actions"],
        routes(2)["switches"]["sw_a"][0]["actions"],
        "{shown}"
    );
    let status = ctls[next].call("GET", "/api/v1/status", None).unwrap();
    assert_eq!(status["routes"]["resumed"]["forward"], 1, "{status}");
    assert_eq!(status["routes"]["pending"], Value::Null, "{status}");
    // And the next update goes on from there.
    let after = put(&ctls[next], &routes(3)).expect("an update after the takeover");
    assert_eq!(after["ok"], true, "{after}");
    eprintln!("the update left half done was finished {finished:?} after the leader's death");
}
