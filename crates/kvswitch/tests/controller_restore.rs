//! A switch that restarts gets back from the controller what operators put on it: a real
//! `kvswitch run` is given an operator's table and its entries, an `acl` entry into it, an
//! interface, a multicast group, a user register, an egress rate and the controller's
//! versioned routes; it is killed and started again, and the controller puts everything
//! back, as a dump of the switch before and after shows. Then with the controller stopped the
//! switch restarts again (and the dump shows what it lost), and a new controller reading the
//! same state file puts it all back.
//!
//! Needs root (veth pairs). Names start with `krst`.

mod common;

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use api::Client;
use common::proxy::free_port;
use common::require_root;
use serde_json::{json, Value};

const PREFIX: &str = "krst";
/// The switch's two ports, the ends of one veth pair.
const PORT_A: &str = "krst-a0";
const PORT_B: &str = "krst-a1";

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    match out.status.success() {
        true => Ok(()),
        false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

fn host(last: u8) -> Ipv4Addr {
    let base = testbed::Subnet::for_prefix(PREFIX).base.octets();
    Ipv4Addr::new(base[0], base[1], base[2], last)
}

fn remove_link() {
    if Path::new("/sys/class/net").join(PORT_A).exists() {
        let _ = ip(&["link", "del", PORT_A]);
    }
}

/// One switch process on the veth pair, started again at will; removed on drop.
struct Bed {
    switch: Option<Child>,
    api: SocketAddr,
    dir: PathBuf,
}

impl Drop for Bed {
    fn drop(&mut self) {
        self.kill();
        remove_link();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Bed {
    fn up() -> Bed {
        require_root();
        remove_link();
        let dir = std::env::temp_dir().join(format!("{PREFIX}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a work directory");
        ip(&[
            "link", "add", PORT_A, "type", "veth", "peer", "name", PORT_B,
        ])
        .expect("the link");
        for link in [PORT_A, PORT_B] {
            let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{link}/disable_ipv6"), "1");
            ip(&["link", "set", "dev", link, "up"]).expect("link up");
        }
        let api = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let config = format!(
            "[switch]\nports = [{PORT_A:?}, {PORT_B:?}]\nmode = \"l3\"\napi = \"{api}\"\n\
             local_port = \"\"\n\n\
             [vip]\nip = \"{}\"\nmac = \"02:6b:76:00:00:64\"\nport = 11211\nprefix_len = 24\n\n\
             [pool]\ndistribution = \"ketama\"\nhash = \"md5\"\n\
             [[pool.servers]]\naddr = \"{}:11211\"\nname = \"s1\"\n",
            host(100),
            host(11),
        );
        std::fs::write(dir.join("switch.toml"), config).expect("switch config");
        let mut bed = Bed {
            switch: None,
            api,
            dir,
        };
        bed.start();
        bed
    }

    /// Starts the switch and waits for its API.
    fn start(&mut self) {
        let log = std::fs::File::create(self.dir.join("switch.log")).expect("log");
        let child = Command::new(env!("CARGO_BIN_EXE_kvswitch"))
            .args(["run", "--config"])
            .arg(self.dir.join("switch.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("kvswitch starts");
        self.switch = Some(child);
        let started = Instant::now();
        while !matches!(testbed::http_get(self.api, "/api/v1/status"), Ok((200, _))) {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "the switch did not start: {}",
                std::fs::read_to_string(self.dir.join("switch.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills the switch (SIGKILL: it keeps nothing).
    fn kill(&mut self) {
        if let Some(mut c) = self.switch.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn client(&self) -> Client {
        Client::new(self.api, None)
    }

    /// A controller of the switch, keeping its state in the bed's state file.
    fn controller(&self) -> (controller::Running, Client) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let api = listener.local_addr().unwrap();
        let text = format!(
            "[controller]\napi = \"{api}\"\nprobe_interval_ms = 100\nsync_interval_ms = 100\n\
             state_file = \"{}\"\n\
             [[switches]]\nname = \"sw\"\napi = \"{}\"\n\
             [pool]\ndistribution = \"ketama\"\nhash = \"md5\"\n\
             [[pool.servers]]\naddr = \"{}:11211\"\nname = \"s1\"\n\
             [routes]\nmatch = {{ ethertype = \"0x0800\", ip_dst = \"{}\" }}\ndrain_ms = 20\n\
             [routes.edge_ports]\nsw = [0]\n",
            self.dir.join("state.json").display(),
            self.api,
            host(11),
            host(200),
        );
        let file = config::controller::parse(&text, Path::new("controller.toml")).unwrap();
        let running = controller::start(file, listener, None, None, None).unwrap();
        (running, Client::new(api, None))
    }
}

/// What operators put on the switch, as it lists it, without entry ids or counts.
fn dump(sw: &Client) -> Value {
    let tables: Vec<Value> = sw
        .tables()
        .expect("tables")
        .iter()
        .map(|t| {
            let mut entries: Vec<String> = sw
                .table_entries(&t.name)
                .expect("entries")
                .iter()
                .map(|e| json!(controller::restore::entry_def(e)).to_string())
                .collect();
            entries.sort();
            json!({"table": controller::restore::table_def(t), "entries": entries})
        })
        .collect();
    let registers: Vec<Value> = sw
        .registers()
        .expect("registers")
        .into_iter()
        .filter(|r| r.writable)
        .map(|r| json!([r.name, r.value]))
        .collect();
    let egress: Vec<Value> = sw
        .ports()
        .expect("ports")
        .into_iter()
        .map(|p| json!([p.port, p.egress_rate_bps, p.egress_depth_bytes]))
        .collect();
    json!({
        "tables": tables,
        "interfaces": sw.interfaces().expect("interfaces"),
        "groups": sw.groups().expect("groups"),
        "registers": registers,
        "egress": egress,
    })
}

/// What the controller says of the switch's copy.
fn kept(ctl: &Client) -> Value {
    let status = ctl.call("GET", "/api/v1/status", None).expect("status");
    status["switches"][0]["kept"].clone()
}

/// Waits until the controller's copy is of the switch as it is now, with `restores`.
fn until_kept(ctl: &Client, sw: &Client, restores: u64) {
    let started = Instant::now();
    loop {
        let status = sw
            .call("GET", "/api/v1/status", None)
            .expect("switch status");
        let k = kept(ctl);
        if k["instance"] == status["instance"]
            && k["changes"] == status["control_changes"]
            && k["restores"] == restores
        {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the controller's copy never caught up: {k} against the switch's {} / {}",
            status["instance"],
            status["control_changes"]
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An operator's table, entries into and in it, an interface, a group, a register, an
/// egress rate; then routes through the controller.
fn configure(sw: &Client, ctl: &Client) {
    let steps: [(&str, String, Value); 8] = [
        (
            "PUT",
            "/api/v1/interfaces/3".into(),
            json!({"eth_dst": "02:6b:00:00:00:03", "eth_src": "02:6b:00:00:00:fe", "port": 1}),
        ),
        (
            "PUT",
            "/api/v1/groups/2".into(),
            json!({"members": [{"port": 1}, {"interface": 3}]}),
        ),
        (
            "POST",
            "/api/v1/tables".into(),
            json!({"name": "krst_ops", "kind": "exact", "key": ["l4_dst"], "miss": ["drop"]}),
        ),
        (
            "POST",
            "/api/v1/tables/krst_ops/entries".into(),
            json!({"match": {"l4_dst": 7}, "actions": [{"output": 1}]}),
        ),
        (
            "POST",
            "/api/v1/tables/krst_ops/entries".into(),
            json!({"match": {"l4_dst": 9}, "actions": [{"multicast": 2}]}),
        ),
        (
            "POST",
            "/api/v1/tables/acl/entries".into(),
            json!({"match": {"ethertype": "0x0800", "ip_dst": host(77).to_string()},
                   "priority": 5, "actions": [{"goto": "krst_ops"}]}),
        ),
        (
            "PUT",
            "/api/v1/registers/user5".into(),
            json!({"value": 42}),
        ),
        (
            "PUT",
            "/api/v1/ports/1/egress".into(),
            json!({"rate_bps": 100_000_000u64, "depth_bytes": 65536}),
        ),
    ];
    for (method, path, body) in steps {
        sw.call(method, &path, Some(&body))
            .unwrap_or_else(|e| panic!("{method} {path}: {e:#}"));
    }
    let routes = json!({ "switches": { "sw": [
        { "match": { "ip_dst": host(200).to_string() }, "priority": 1,
          "actions": [{ "output": 1 }] }
    ]}});
    let reply = ctl
        .call("PUT", "/api/v1/routes", Some(&routes))
        .expect("routes");
    assert_eq!(reply["ok"], true, "{reply}");
}

#[test]
fn a_restarted_switch_gets_back_every_table_entry_and_route_from_the_controller() {
    let mut bed = Bed::up();
    let sw = bed.client();
    let (running, ctl) = bed.controller();
    configure(&sw, &ctl);
    until_kept(&ctl, &sw, 0);
    let before = dump(&sw);
    let tables = before["tables"].as_array().unwrap();
    assert!(
        tables.iter().any(|t| t["table"]["name"] == "krst_ops")
            && tables.iter().any(|t| t["table"]["name"] == "ctl_routes"),
        "{before}"
    );

    // Restarted under the running controller.
    bed.kill();
    bed.start();
    until_kept(&ctl, &sw, 1);
    assert_eq!(dump(&sw), before, "after a restart under the controller");
    let k = kept(&ctl);
    assert!(k["last_restore_put"].as_u64().unwrap() >= 8, "{k}");
    let (code, metrics) = testbed::http_get(running.api, "/metrics").expect("metrics");
    assert_eq!(code, 200);
    assert!(
        metrics.contains("kvswitch_controller_switch_restores_total{switch=\"sw\"} 1"),
        "{metrics}"
    );

    // Restarted while no controller runs: it comes back bare ...
    drop(running);
    bed.kill();
    bed.start();
    let bare = dump(&sw);
    assert_ne!(bare, before);
    assert!(
        !bare["tables"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["table"]["name"] == "krst_ops"),
        "{bare}"
    );
    // ... and a new controller puts it all back from the state file.
    let (_running, ctl) = bed.controller();
    until_kept(&ctl, &sw, 1);
    assert_eq!(
        dump(&sw),
        before,
        "after a restart with the controller stopped"
    );
}
