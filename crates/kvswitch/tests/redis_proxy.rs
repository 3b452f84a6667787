//! The proxy in front of Redis (`redis: true` in a nutcracker file): answers as one
//! redis-server holding every key answers, byte for byte; puts every key where nutcracker puts
//! it; serves redis-cli, redis-benchmark and redis-py; gives the pool's password and database
//! to its servers; refuses what it cannot serve by key with an error and keeps the connection.
//! Every redis-server here is Debian's, started on loopback and killed by PID.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::proxy::{cache_cli, free_port, listening};
use testbed::local::{self, Proc, TempDir};
use testbed::resp_differential::{compare, exchange};
use wire::resp::{encode_command, ReplyFramer};

/// The proxy's refusal of keys on several servers.
const CROSS_SERVER: &str = "the keys of this command lie on different servers";

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A redis-server on a free loopback port; killed by PID when dropped.
struct Redis {
    addr: SocketAddr,
    proc: Option<Proc>,
}

impl Redis {
    fn start(extra: &[&str]) -> Redis {
        let bin = local::require("redis-server").expect("redis-server (scripts/setup.sh)");
        let mut last = None;
        for _ in 0..5 {
            let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
            match local::redis_server(&bin, addr, extra) {
                Ok(proc) => {
                    return Redis {
                        addr,
                        proc: Some(proc),
                    }
                }
                Err(e) => last = Some(e),
            }
        }
        panic!("redis-server did not start: {last:?}");
    }

    fn kill(&mut self) {
        self.proc = None;
    }
}

/// `kvswitch proxy --nutcracker-config` (or nutcracker itself) on a Redis pool of `servers`.
struct Front {
    addr: SocketAddr,
    _proc: Proc,
    dir: TempDir,
}

/// The pool's YAML: `extra` adds pool keys (`redis_auth: x`), one per line.
fn yaml(listen: SocketAddr, servers: &[&Redis], extra: &str) -> String {
    let mut out = format!(
        "alpha:\n  listen: {listen}\n  hash: fnv1a_64\n  hash_tag: \"{{}}\"\n  \
         distribution: ketama\n  redis: true\n  timeout: 2000\n{extra}  servers:\n"
    );
    for (i, s) in servers.iter().enumerate() {
        out.push_str(&format!("   - {}:1 r{i}\n", s.addr));
    }
    out
}

impl Front {
    fn kvswitch(servers: &[&Redis], extra: &str) -> Front {
        Front::kvswitch_with(servers, extra, &[])
    }

    /// `kvswitch proxy` with more arguments (`--api ADDR`).
    fn kvswitch_with(servers: &[&Redis], extra: &str, args: &[String]) -> Front {
        Front::start(servers, extra, |conf, _| {
            let mut c = Command::new(env!("CARGO_BIN_EXE_kvswitch"));
            c.arg("proxy")
                .arg("--nutcracker-config")
                .arg(conf)
                .args(["--workers", "2"])
                .args(args)
                .env("RUST_LOG", "warn");
            c
        })
    }

    fn nutcracker(servers: &[&Redis]) -> Front {
        Front::start(servers, "", |conf, dir| {
            let bin = local::require("nutcracker").expect("nutcracker");
            local::nutcracker_command(&bin, conf, dir, free_port())
        })
    }

    fn start(servers: &[&Redis], extra: &str, command: impl Fn(&Path, &Path) -> Command) -> Front {
        let dir = TempDir::new("kvswitch-redis-test").expect("a scratch directory");
        for _ in 0..3 {
            let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let conf = dir.path().join("pool.yml");
            std::fs::write(&conf, yaml(addr, servers, extra)).expect("write the pool");
            let log = dir.path().join("front.log");
            let proc = Proc::spawn_logged("front", &mut command(&conf, dir.path()), &log)
                .expect("start the front");
            let deadline = Instant::now() + Duration::from_secs(10);
            while !listening(addr) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if listening(addr) {
                return Front {
                    addr,
                    _proc: proc,
                    dir,
                };
            }
        }
        panic!("the front did not start");
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("front.log")).unwrap_or_default()
    }
}

/// A client connection speaking RESP, every read bounded in time.
struct Conn(TcpStream, Vec<u8>);

impl Conn {
    fn open(addr: SocketAddr) -> Conn {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.set_nodelay(true).unwrap();
        Conn(s, Vec::new())
    }

    /// Sends one command and reads its reply.
    fn call(&mut self, args: &[&str]) -> String {
        let mut out = Vec::new();
        encode_command(args, &mut out);
        self.0.write_all(&out).expect("send");
        let reply = self.reply();
        assert!(self.1.is_empty(), "more than one reply: {:?}", self.1);
        reply
    }

    /// The next reply (of several pipelined, those after it kept for the next call).
    fn reply(&mut self) -> String {
        let mut framer = ReplyFramer::default();
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(n) = framer.reply_len(&self.1).expect("a RESP reply") {
                let reply: Vec<u8> = self.1.drain(..n).collect();
                return String::from_utf8_lossy(&reply).into_owned();
            }
            let n = self.0.read(&mut chunk).expect("a reply in time");
            assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&self.1));
            self.1.extend_from_slice(&chunk[..n]);
        }
    }
}

fn fleet(n: usize, extra: &[&str]) -> Vec<Redis> {
    (0..n).map(|_| Redis::start(extra)).collect()
}

#[test]
fn the_proxy_answers_every_stream_as_one_redis_server_does() {
    let seed = env_u64("KVSWITCH_DIFF_SEED", 0x7ed15);
    let cases = env_u64("KVSWITCH_DIFF_CASES", 400);
    let reference = Redis::start(&[]);
    let servers = fleet(3, &[]);
    let front = Front::kvswitch(&servers.iter().collect::<Vec<_>>(), "");
    let (proxy, direct) = (front.addr, reference.addr);
    let found = compare(seed, 0..cases, 4, direct, CROSS_SERVER, |c| {
        exchange(proxy, c)
    });
    let failures = &found.failures;
    assert!(
        failures.is_empty(),
        "{} of {cases} streams differ:\n{}\n{}",
        failures.len(),
        failures
            .iter()
            .take(8)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n"),
        front.log()
    );
    let refused = found.refused;
    assert!(
        refused <= cases / 20,
        "{refused} of {cases} streams refused as cross-server"
    );
    // The keys went to every server, not to one.
    for s in &servers {
        let mut c = Conn::open(s.addr);
        assert_ne!(
            c.call(&["DBSIZE"]),
            ":0\r\n",
            "server {} holds no key",
            s.addr
        );
    }
}

/// Which server holds each key, asked of the servers themselves.
fn placement(servers: &[Redis]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for (i, s) in servers.iter().enumerate() {
        let mut c = Conn::open(s.addr);
        let keys = c.call(&["KEYS", "*"]);
        for line in keys.split("\r\n").filter(|l| !l.starts_with(['*', '$'])) {
            if !line.is_empty() {
                out.insert(line.to_string(), i);
            }
        }
        assert_eq!(c.call(&["FLUSHALL"]), "+OK\r\n");
    }
    out
}

#[test]
fn every_key_lands_where_nutcracker_puts_it() {
    let servers = fleet(3, &[]);
    let refs: Vec<&Redis> = servers.iter().collect();
    let keys: Vec<String> = (0..300)
        .map(|i| match i % 3 {
            0 => format!("user:{i}"),
            1 => format!("{{tag{}}}:item:{i}", i % 7),
            _ => format!("k{i}"),
        })
        .collect();
    let mut placements = Vec::new();
    for front in [Front::nutcracker(&refs), Front::kvswitch(&refs, "")] {
        let mut c = Conn::open(front.addr);
        for key in &keys {
            assert_eq!(c.call(&["SET", key, "v"]), "+OK\r\n", "{}", front.log());
        }
        placements.push(placement(&servers));
    }
    assert_eq!(placements[0].len(), keys.len());
    assert_eq!(
        placements[0], placements[1],
        "kvswitch places keys otherwise"
    );
    let used: std::collections::BTreeSet<_> = placements[0].values().collect();
    assert_eq!(used.len(), 3, "the keys spread over every server");
}

#[test]
fn refused_commands_say_why_and_leave_the_connection_usable() {
    let servers = fleet(3, &[]);
    let front = Front::kvswitch(&servers.iter().collect::<Vec<_>>(), "");
    let mut c = Conn::open(front.addr);
    assert_eq!(c.call(&["SET", "{t}a", "1"]), "+OK\r\n");
    for (command, says) in [
        (&["MULTI"][..], "MULTI is not served through kvswitch"),
        (&["BLPOP", "a", "0"], "blocking"),
        (&["SUBSCRIBE", "ch"], "pub/sub"),
        (&["KEYS", "*"], "names no key"),
        (&["FLUSHALL"], "names no key"),
        (&["CLIENT", "LIST"], "server connection"),
        (&["SELECT", "4"], "database 0"),
        (&["HELLO", "4"], "NOPROTO"),
    ] {
        let reply = c.call(command);
        assert!(
            reply.starts_with('-') && reply.contains(says),
            "{command:?}: {reply}"
        );
    }
    // Keys on different servers, for a command that cannot be split.
    let (a, b) = keys_on_two_servers(&servers, &front);
    let reply = c.call(&["SUNION", &a, &b]);
    assert!(reply.contains("different servers"), "{reply}");
    // Options that name other keys cannot be routed by the first.
    for command in [
        &["SORT", "{t}l", "STORE", "elsewhere"][..],
        &["SORT", "{t}l", "BY", "weight_*"],
        &[
            "GEORADIUS",
            "{t}g",
            "0",
            "0",
            "1",
            "km",
            "STORE",
            "elsewhere",
        ],
    ] {
        let reply = c.call(command);
        assert!(reply.contains("STORE, BY or GET"), "{command:?}: {reply}");
    }
    assert_eq!(c.call(&["SORT", "{t}l", "BY", "nosort"]), "*0\r\n");
    assert_eq!(
        c.call(&["MSETNX", "{t}x", "1", "other"]),
        "-ERR wrong number of arguments for 'msetnx' command\r\n"
    );
    // Keys on one server by their tag are served.
    assert_eq!(c.call(&["SUNIONSTORE", "{t}b", "{t}c"]), ":0\r\n");
    assert_eq!(c.call(&["GET", "{t}a"]), "$1\r\n1\r\n");
    assert_eq!(c.call(&["PING"]), "+PONG\r\n");
}

#[test]
fn a_resp3_client_gets_what_one_redis_server_sends_it() {
    let reference = Redis::start(&[]);
    let servers = fleet(3, &[]);
    let front = Front::kvswitch(&servers.iter().collect::<Vec<_>>(), "");
    let script: &[&[&str]] = &[
        &["SET", "key:1", "1"],
        &["GET", "r3:missing"],
        &["HSET", "r3:h", "f", "v", "g", "w"],
        &["HGETALL", "r3:h"],
        &["SADD", "r3:s", "x"],
        &["SMEMBERS", "r3:s"],
        &["ZADD", "r3:z", "1.5", "m"],
        &["ZSCORE", "r3:z", "m"],
        &["MSET", "key:2", "2", "key:3", "3", "key:4", "4"],
        &["MGET", "key:1", "r3:missing", "key:2", "key:3", "key:4"],
        &["EXISTS", "key:1", "key:2", "key:5"],
        &["HELLO", "2"],
        &["GET", "r3:missing"],
        &["HGETALL", "r3:h"],
    ];
    let mut replies = Vec::new();
    for addr in [reference.addr, front.addr] {
        let mut c = Conn::open(addr);
        let hello = c.call(&["HELLO", "3"]);
        assert!(
            hello.starts_with("%7\r\n") && hello.contains(":3\r\n"),
            "{hello}"
        );
        replies.push(script.iter().map(|cmd| c.call(cmd)).collect::<Vec<_>>());
    }
    assert_eq!(replies[0][1], "_\r\n", "RESP3's null");
    assert!(replies[0][3].starts_with("%2"), "a map: {}", replies[0][3]);
    // The keys were spread: the MGET was split and merged.
    let holding = servers
        .iter()
        .filter(|s| Conn::open(s.addr).call(&["DBSIZE"]) != ":0\r\n")
        .count();
    assert!(holding > 1, "every key on one server");
    for (i, cmd) in script.iter().enumerate() {
        if cmd[0] == "HELLO" {
            continue;
        }
        assert_eq!(replies[1][i], replies[0][i], "{cmd:?}");
    }
}

#[test]
fn concurrent_clients_read_nothing_stale_while_a_server_dies() {
    history_with_a_server_killed(false);
}

#[test]
fn with_the_cache_on_concurrent_clients_read_nothing_stale_while_a_server_dies() {
    history_with_a_server_killed(true);
}

/// Six clients record a history on 24 hot keys through the proxy (with its cache, every key
/// pinned in it, when `cache`) while one of three servers is killed: no read may return a
/// value older than an acknowledged write, on the keys of the servers that stayed.
fn history_with_a_server_killed(cache: bool) {
    use testbed::history_load::{self, Client, Clock, Load, Mix, Transport};
    let mut servers = fleet(3, &[]);
    let api = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let args = match cache {
        true => vec!["--cache".to_string(), "--api".to_string(), api.to_string()],
        false => Vec::new(),
    };
    let front = Front::kvswitch_with(
        &servers.iter().collect::<Vec<_>>(),
        "  auto_eject_hosts: true\n  server_failure_limit: 1\n  server_retry_timeout: 60000\n",
        &args,
    );
    // Hot keys on every server: where each lies, asked of the servers.
    let keys: Vec<String> = (0..24).map(|i| format!("user:{i}")).collect();
    let mut c = Conn::open(front.addr);
    for key in &keys {
        assert_eq!(c.call(&["SET", key, "0"]), "+OK\r\n");
        if cache {
            cache_cli(api, &["pin", key]);
        }
    }
    let home = placement(&servers);
    let victim = home[&keys[0]];
    let lost: Vec<&String> = keys.iter().filter(|k| home[*k] == victim).collect();
    assert!(!lost.is_empty() && lost.len() < keys.len(), "{home:?}");
    let clients: Vec<Client> = (1..=6)
        .map(|id| Client {
            id,
            transport: Transport::Redis,
            target: front.addr,
            timeout: Duration::from_secs(3),
            netns: None,
        })
        .collect();
    let load = Load {
        keys: keys.clone(),
        // More than a client does in the time: the run lasts its duration, the kill inside it.
        ops_per_client: 50_000,
        duration: Duration::from_secs(4),
        mix: Mix::default(),
        seed: 0x4ed15,
    };
    let recorded = std::thread::scope(|scope| {
        let run = scope.spawn(|| history_load::run(&clients, &load, Clock::start()));
        std::thread::sleep(Duration::from_millis(1500));
        servers[victim].kill();
        run.join().expect("the load").expect("the clients ran")
    });
    common::recorded_ok(&recorded);
    assert!(recorded.ops.len() > 1000, "{} ops", recorded.ops.len());
    assert!(
        recorded.server_errors() > 0,
        "the dead server was never seen"
    );
    if cache {
        let answered = proxy_metric(api, "kvswitch_proxy_cache_replies_total");
        assert!(answered > 0, "the cache answered no read: {}", front.log());
    }
    // The dead server's keys lost what it held; every other key must read as one server.
    let survivors: Vec<_> = recorded
        .ops
        .iter()
        .filter(|op| !lost.contains(&&op.key))
        .cloned()
        .collect();
    common::no_stale_read(&survivors);
    // Once ejected, the dead server's keys were served by the others.
    let late = recorded
        .ops
        .iter()
        .rev()
        .take(200)
        .filter(|op| lost.contains(&&op.key));
    assert!(
        late.clone()
            .any(|op| !matches!(op.kind, testbed::history::Kind::Failed)),
        "the dead server's keys were never served again"
    );
}

/// A counter of the proxy's pool `alpha`, from its `/metrics`.
fn proxy_metric(api: SocketAddr, name: &str) -> u64 {
    let (status, body) = testbed::http_get(api, "/metrics").expect("metrics");
    assert_eq!(status, 200);
    let series = format!("{name}{{pool=\"alpha\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{body}"))
}

/// One command straight to a server, bypassing the proxy.
fn direct(server: &Redis, args: &[&str]) -> String {
    Conn::open(server.addr).call(args)
}

#[test]
fn the_cache_answers_hot_gets_and_every_write_through_the_proxy_drops_the_value() {
    let servers = fleet(3, &[]);
    let api = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let args = ["--cache".to_string(), "--api".to_string(), api.to_string()];
    let front = Front::kvswitch_with(&servers.iter().collect::<Vec<_>>(), "", &args);
    let mut c = Conn::open(front.addr);
    assert_eq!(c.call(&["SET", "k", "one"]), "+OK\r\n");
    // Where `k` lies (the servers are emptied by the asking).
    let home = placement(&servers);
    assert_eq!(c.call(&["SET", "k", "one"]), "+OK\r\n");
    let answered = || proxy_metric(api, "kvswitch_proxy_cache_replies_total");
    // `key` cached: the next GET fills it from its server, the one after is the cache's. The
    // server is then changed behind the proxy's back: the cache still answers the old value,
    // which shows that it answers.
    let cached = |c: &mut Conn, key: &str, want: &str| {
        cache_cli(api, &["pin", key]);
        assert_eq!(c.call(&["GET", key]), want, "{key}: the fill");
        let before = answered();
        assert_eq!(c.call(&["GET", key]), want, "{key}: from the cache");
        assert_eq!(answered(), before + 1, "{key}: answered by the cache");
        let server = &servers[home[key]];
        assert_eq!(direct(server, &["SET", key, "behind"]), "+OK\r\n");
        assert_eq!(c.call(&["GET", key]), want, "{key}: the cache's copy");
    };
    let bulk = |v: &str| format!("${}\r\n{v}\r\n", v.len());
    // Each write through the proxy drops the cached value: the next GET reads what the server
    // holds (the value written behind the proxy's back, where the write failed on it).
    let writes: &[&[&str]] = &[
        &["SET", "k", "two"],
        &["APPEND", "k", "+"],
        &["SETRANGE", "k", "0", "B"],
        &["GETSET", "k", "three"],
        &["MSET", "k", "four", "other", "x"],
        &["SET", "k", "5"],
        &["INCR", "k"],
        &["SETBIT", "k", "1", "0"],
        // Last: a script leaves its keys uncached until a write gives them an expiry the
        // cache can place (the `SET` below).
        &[
            "EVAL",
            "return redis.call('SET', KEYS[1], 'scripted')",
            "1",
            "k",
        ],
    ];
    let mut value = "one".to_string();
    for command in writes {
        cached(&mut c, "k", &bulk(&value));
        c.call(command);
        // What the server holds now, asked of it: the proxy must answer the same.
        let now = direct(&servers[home["k"]], &["GET", "k"]);
        assert_eq!(c.call(&["GET", "k"]), now, "GET after {command:?}");
        assert_ne!(now, bulk(&value), "{command:?} changed nothing");
        value = bulk_value(&now).to_string();
    }
    // Deleted, renamed over, expired: gone at once, or when the server says.
    for (command, then) in [
        (&["DEL", "k"][..], "$-1\r\n".to_string()),
        (&["UNLINK", "k"], "$-1\r\n".to_string()),
        (&["GETDEL", "k"], "$-1\r\n".to_string()),
        (&["RENAME", "{k}src", "k"], bulk("renamed")),
    ] {
        assert_eq!(c.call(&["SET", "k", &value]), "+OK\r\n");
        assert_eq!(c.call(&["SET", "{k}src", "renamed"]), "+OK\r\n");
        cached(&mut c, "k", &bulk(&value));
        c.call(command);
        assert_eq!(c.call(&["GET", "k"]), then, "GET after {command:?}");
    }
    assert_eq!(c.call(&["SET", "k", "brief", "PX", "300"]), "+OK\r\n");
    cache_cli(api, &["pin", "k"]);
    assert_eq!(c.call(&["GET", "k"]), bulk("brief"));
    assert_eq!(c.call(&["GET", "k"]), bulk("brief"));
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(c.call(&["GET", "k"]), "$-1\r\n", "served past its expiry");
    // A value of another type is never cached, and its error reaches the client.
    assert_eq!(c.call(&["RPUSH", "list", "a"]), ":1\r\n");
    cache_cli(api, &["pin", "list"]);
    for _ in 0..2 {
        assert!(c.call(&["GET", "list"]).starts_with("-WRONGTYPE"));
    }
}

/// Three masters of one Redis Cluster on loopback, the slots spread over them by redis-cli.
struct Cluster {
    nodes: Vec<Redis>,
    _dir: TempDir,
}

fn redis_cluster() -> Cluster {
    let dir = TempDir::new("kvswitch-redis-cluster").expect("a scratch directory");
    let nodes: Vec<Redis> = (0..3)
        .map(|i| {
            let conf = dir.path().join(format!("nodes-{i}.conf"));
            let (conf, path) = (conf.to_string_lossy(), dir.path().to_string_lossy());
            // A node's bus port is its port + 10000: Redis::start tries other ports when that
            // does not fit.
            Redis::start(&[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &conf,
                "--cluster-node-timeout",
                "5000",
                "--dir",
                &path,
            ])
        })
        .collect();
    let mut args = vec!["--cluster".to_string(), "create".into()];
    args.extend(nodes.iter().map(|n| n.addr.to_string()));
    args.extend(["--cluster-replicas", "0", "--cluster-yes"].map(String::from));
    run(
        "redis-cli",
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    for n in &nodes {
        while !Conn::open(n.addr)
            .call(&["CLUSTER", "INFO"])
            .contains("cluster_state:ok")
        {
            assert!(Instant::now() < deadline, "the cluster did not come up");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Cluster { nodes, _dir: dir }
}

/// The value of a bulk string reply.
fn bulk_value(reply: &str) -> &str {
    reply
        .split_once("\r\n")
        .map_or("", |(_, value)| value.trim_end_matches("\r\n"))
}

#[test]
fn a_redis_cluster_serves_clients_that_know_nothing_of_it_while_slots_move() {
    let cluster = redis_cluster();
    // Only the first node is named: the proxy learns the others from it.
    let api = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let front = Front::kvswitch_with(
        &[&cluster.nodes[0]],
        "  redis_cluster: true\n",
        &["--api".into(), api.to_string()],
    );
    let mut c = Conn::open(front.addr);
    let keys: Vec<String> = (0..300).map(|i| format!("cluster:{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(
            c.call(&["SET", key, &i.to_string()]),
            "+OK\r\n",
            "{}",
            front.log()
        );
    }
    let mut args = vec!["MGET"];
    args.extend(keys.iter().take(60).map(String::as_str));
    let values = c.call(&args);
    assert!(
        values.starts_with("*60\r\n") && values.contains("$2\r\n59\r\n"),
        "{values}"
    );
    assert_eq!(
        c.call(&["SUNION", "cluster:1", "cluster:2"])
            .split(' ')
            .next(),
        Some("-CROSSSLOT")
    );
    assert_eq!(
        c.call(&["EXISTS", "{t}a", "{t}b", "cluster:7", "cluster:8"]),
        ":2\r\n"
    );
    // Every key is on the node that holds its slot: the nodes hold all of them, each some.
    let sizes: Vec<usize> = cluster
        .nodes
        .iter()
        .map(|n| {
            let size = Conn::open(n.addr).call(&["DBSIZE"]);
            size.trim_start_matches(':')
                .trim()
                .parse::<usize>()
                .unwrap()
        })
        .collect();
    assert_eq!(sizes.iter().sum::<usize>(), keys.len(), "{sizes:?}");
    assert!(sizes.iter().all(|&n| n > 0), "{sizes:?}");

    // Clients write and read their own keys while 2000 slots move from the first node to
    // the second.
    let ids: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| bulk_value(&Conn::open(n.addr).call(&["CLUSTER", "MYID"])).to_string())
        .collect();
    let moving = std::sync::atomic::AtomicBool::new(true);
    let errors = Mutex::new(Vec::new());
    let done = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for client in 0..4 {
            let (moving, errors, done, addr) = (&moving, &errors, &done, front.addr);
            scope.spawn(move || {
                let mut c = Conn::open(addr);
                let started = Instant::now();
                let mut round = 0u64;
                while moving.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(60)
                {
                    for k in 0..50 {
                        let key = format!("moving:{client}:{k}");
                        let value = format!("{round}");
                        let set = c.call(&["SET", &key, &value]);
                        let got = c.call(&["GET", &key]);
                        if set != "+OK\r\n" || bulk_value(&got) != value {
                            errors
                                .lock()
                                .unwrap()
                                .push(format!("{key}: {set:?} then {got:?}"));
                        }
                        done.fetch_add(2, Ordering::Relaxed);
                    }
                    round += 1;
                }
            });
        }
        std::thread::sleep(Duration::from_millis(300));
        run(
            "redis-cli",
            &[
                "--cluster",
                "reshard",
                &cluster.nodes[0].addr.to_string(),
                "--cluster-from",
                &ids[0],
                "--cluster-to",
                &ids[1],
                "--cluster-slots",
                "2000",
                "--cluster-yes",
            ],
        );
        std::thread::sleep(Duration::from_millis(300));
        moving.store(false, Ordering::Relaxed);
    });
    let errors = errors.into_inner().unwrap();
    assert!(
        errors.is_empty(),
        "{} errors, first: {:?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );
    assert!(done.load(Ordering::Relaxed) > 400, "the clients hardly ran");
    // The keys written before the move read back through the proxy.
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(bulk_value(&c.call(&["GET", key])), i.to_string(), "{key}");
    }
    // One slot moved step by step under a client: a key written while its slot is migrating
    // goes where the cluster asks (ASK), a key already moved is read there, and once the slot
    // is the other node's, the next command learns it (MOVED).
    let tag = "{step}";
    let slot = wire::resp::key_slot(b"step").to_string();
    let (old, new) = (format!("{tag}:old"), format!("{tag}:new"));
    assert_eq!(c.call(&["SET", &old, "before"]), "+OK\r\n");
    let from = (0..3)
        .find(|&i| Conn::open(cluster.nodes[i].addr).call(&["EXISTS", &old]) == ":1\r\n")
        .expect("a node holds the key");
    let to = (from + 1) % 3;
    let (source, target) = (&cluster.nodes[from], &cluster.nodes[to]);
    let mut at_source = Conn::open(source.addr);
    let mut at_target = Conn::open(target.addr);
    assert_eq!(
        at_target.call(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &ids[from]]),
        "+OK\r\n"
    );
    assert_eq!(
        at_source.call(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &ids[to]]),
        "+OK\r\n"
    );
    assert_eq!(c.call(&["SET", &new, "during"]), "+OK\r\n");
    assert_eq!(bulk_value(&c.call(&["GET", &old])), "before");
    let (host, port) = (target.addr.ip().to_string(), target.addr.port().to_string());
    let migrated = at_source.call(&["MIGRATE", &host, &port, &old, "0", "5000"]);
    assert_eq!(migrated, "+OK\r\n");
    assert_eq!(bulk_value(&c.call(&["GET", &old])), "before");
    for n in &cluster.nodes {
        let reply = Conn::open(n.addr).call(&["CLUSTER", "SETSLOT", &slot, "NODE", &ids[to]]);
        assert_eq!(reply, "+OK\r\n");
    }
    assert_eq!(bulk_value(&c.call(&["GET", &new])), "during");
    assert_eq!(bulk_value(&c.call(&["GET", &old])), "before");
    // Redirections were followed, both kinds.
    let (status, metrics) = testbed::http_get(api, "/metrics").expect("the API answers");
    assert_eq!(status, 200);
    for kind in ["moved", "asks"] {
        let series = format!("kvswitch_proxy_redis_{kind}_total{{pool=\"alpha\"}}");
        let n: f64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(series.as_str())?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{metrics}"));
        assert!(n > 0.0, "{series} {n}");
    }
}

/// Two keys the pool puts on different servers.
fn keys_on_two_servers(servers: &[Redis], front: &Front) -> (String, String) {
    let mut c = Conn::open(front.addr);
    let mut first: Option<(String, usize)> = None;
    for i in 0..200 {
        let key = format!("spread:{i}");
        assert_eq!(c.call(&["SET", &key, "x"]), "+OK\r\n");
        let at = servers
            .iter()
            .position(|s| Conn::open(s.addr).call(&["EXISTS", &key]) == ":1\r\n")
            .expect("the key is on a server");
        match &first {
            None => first = Some((key, at)),
            Some((k, s)) if *s != at => return (k.clone(), key),
            Some(_) => {}
        }
    }
    panic!("200 keys on one server");
}

#[test]
fn an_argument_past_the_proxys_limit_is_refused_as_a_server_refuses_one() {
    let servers = fleet(1, &[]);
    let front = Front::kvswitch(&servers.iter().collect::<Vec<_>>(), "");
    let mut c = Conn::open(front.addr);
    assert_eq!(c.call(&["SET", "big", "x"]), "+OK\r\n");
    // 70 MB announced: a server takes it (up to 512 MB), the proxy refuses it at once.
    c.0.write_all(b"*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n$70000000\r\n")
        .unwrap();
    assert_eq!(c.reply(), "-ERR Protocol error: invalid bulk length\r\n");
    let mut rest = Vec::new();
    assert_eq!(
        c.0.read_to_end(&mut rest).map(|_| rest.len()).ok(),
        Some(0),
        "closed"
    );
    assert_eq!(Conn::open(front.addr).call(&["GET", "big"]), "$1\r\nx\r\n");
}

#[test]
fn a_clients_pipeline_stays_in_order_over_several_server_connections() {
    let servers = fleet(2, &[]);
    let front = Front::kvswitch(
        &servers.iter().collect::<Vec<_>>(),
        "  server_connections: 4\n",
    );
    // Several clients at once, each writing then reading its own keys in one pipeline: a
    // read that overtook its write would see the value before.
    std::thread::scope(|scope| {
        for client in 0..4 {
            let addr = front.addr;
            scope.spawn(move || {
                let mut c = Conn::open(addr);
                let mut pipeline = Vec::new();
                for i in 0..300 {
                    let key = format!("order:{client}:{}", i % 7);
                    encode_command(&["SET", &key, &i.to_string()], &mut pipeline);
                    encode_command(&["GET", &key], &mut pipeline);
                }
                c.0.write_all(&pipeline).unwrap();
                for i in 0..300 {
                    assert_eq!(c.reply(), "+OK\r\n");
                    let value = i.to_string();
                    assert_eq!(c.reply(), format!("${}\r\n{value}\r\n", value.len()));
                }
            });
        }
    });
}

#[test]
fn hello_reads_every_option_before_it_authenticates() {
    let servers = fleet(1, &["--requirepass", "pw"]);
    let front = Front::kvswitch(&servers.iter().collect::<Vec<_>>(), "  redis_auth: pw\n");
    let mut c = Conn::open(front.addr);
    let reply = c.call(&["HELLO", "3", "AUTH", "default", "pw", "SETNAME"]);
    assert_eq!(reply, "-ERR Syntax error in HELLO option 'SETNAME'\r\n");
    assert_eq!(
        c.call(&["GET", "k"]),
        "-NOAUTH Authentication required.\r\n"
    );
    let reply = c.call(&[
        "HELLO", "2", "AUTH", "default", "no", "AUTH", "default", "pw",
    ]);
    assert!(
        reply.starts_with("*14\r\n"),
        "the last AUTH counts: {reply}"
    );
    assert_eq!(c.call(&["GET", "k"]), "$-1\r\n");
}

#[test]
fn the_pools_password_and_database_reach_the_servers() {
    let servers = fleet(2, &["--requirepass", "s3cret"]);
    let front = Front::kvswitch(
        &servers.iter().collect::<Vec<_>>(),
        "  redis_auth: s3cret\n  redis_db: 3\n",
    );
    let mut c = Conn::open(front.addr);
    assert_eq!(
        c.call(&["GET", "a"]),
        "-NOAUTH Authentication required.\r\n"
    );
    assert!(c.call(&["AUTH", "wrong"]).starts_with("-WRONGPASS"));
    assert_eq!(c.call(&["AUTH", "s3cret"]), "+OK\r\n");
    assert_eq!(c.call(&["SELECT", "3"]), "+OK\r\n");
    let mut keys = Vec::new();
    for i in 0..40 {
        let key = format!("auth:{i}");
        assert_eq!(
            c.call(&["SET", &key, &i.to_string()]),
            "+OK\r\n",
            "{}",
            front.log()
        );
        keys.push(key);
    }
    let mut args = vec!["MGET"];
    args.extend(keys.iter().map(String::as_str));
    let values = c.call(&args);
    assert!(
        values.starts_with("*40\r\n") && values.contains("$2\r\n39\r\n"),
        "{values}"
    );
    // Every key is in database 3 of its server, none in database 0.
    let mut held = 0;
    for s in &servers {
        let mut direct = Conn::open(s.addr);
        assert_eq!(direct.call(&["AUTH", "s3cret"]), "+OK\r\n");
        assert_eq!(direct.call(&["DBSIZE"]), ":0\r\n");
        assert_eq!(direct.call(&["SELECT", "3"]), "+OK\r\n");
        let size = direct.call(&["DBSIZE"]);
        held += size
            .trim_start_matches(':')
            .trim()
            .parse::<usize>()
            .unwrap();
    }
    assert_eq!(held, 40);
}

#[test]
fn a_wrong_password_in_the_file_is_an_error_on_every_command_not_a_hang() {
    let servers = fleet(1, &["--requirepass", "right"]);
    let front = Front::kvswitch(&servers.iter().collect::<Vec<_>>(), "  redis_auth: wrong\n");
    let mut c = Conn::open(front.addr);
    assert_eq!(c.call(&["AUTH", "wrong"]), "+OK\r\n");
    let reply = c.call(&["GET", "a"]);
    assert!(
        reply.starts_with("-ERR server refused AUTH: WRONGPASS"),
        "{reply}"
    );
}

#[test]
fn a_dead_server_fails_its_keys_and_no_others() {
    let mut servers = fleet(3, &[]);
    let front = Front::kvswitch(&servers.iter().collect::<Vec<_>>(), "");
    let (a, b) = keys_on_two_servers(&servers, &front);
    let victim = servers
        .iter()
        .position(|s| Conn::open(s.addr).call(&["EXISTS", &a]) == ":1\r\n")
        .unwrap();
    servers[victim].kill();
    let mut c = Conn::open(front.addr);
    let started = Instant::now();
    let reply = c.call(&["GET", &a]);
    assert!(reply.starts_with("-ERR "), "{reply}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(c.call(&["GET", &b]), "$1\r\nx\r\n");
    // A split command with a key on the dead server fails as a whole.
    let reply = c.call(&["MGET", &b, &a]);
    assert!(reply.starts_with("-ERR "), "{reply}");
}

fn run(program: &str, args: &[&str]) -> String {
    let bin = local::require(program).unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(bin).args(args).output().expect("run");
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn redis_cli_redis_benchmark_and_redis_py_work_through_the_proxy() {
    let servers = fleet(3, &[]);
    let front = Front::kvswitch(&servers.iter().collect::<Vec<_>>(), "");
    let port = front.addr.port().to_string();
    let cli = |args: &[&str]| {
        let mut all = vec!["-h", "127.0.0.1", "-p", &port];
        all.extend_from_slice(args);
        run("redis-cli", &all).trim().to_string()
    };
    assert_eq!(cli(&["SET", "cli:a", "hello"]), "OK");
    assert_eq!(
        cli(&["MSET", "cli:b", "2", "cli:c", "3", "cli:d", "4"]),
        "OK"
    );
    assert_eq!(
        cli(&["MGET", "cli:a", "cli:b", "cli:x", "cli:d"]),
        "hello\n2\n\n4"
    );
    assert_eq!(cli(&["DEL", "cli:a", "cli:b", "cli:x"]), "2");
    assert_eq!(cli(&["INCRBY", "cli:c", "5"]), "8");

    let out = run(
        "redis-benchmark",
        &[
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-t",
            "set,get,mset,incr",
            "-n",
            "3000",
            "-c",
            "8",
            "-P",
            "8",
            "-r",
            "1000",
            "-q",
        ],
    );
    for test in ["SET", "GET", "MSET (10 keys)", "INCR"] {
        assert!(
            out.contains(&format!("{test}: ")) && !out.contains("error"),
            "{test}: {out}"
        );
    }
    // The benchmark's keys were spread over the servers.
    for s in &servers {
        assert_ne!(Conn::open(s.addr).call(&["DBSIZE"]), ":0\r\n");
    }

    let script = format!(
        r#"
import redis
r = redis.Redis(host="127.0.0.1", port={port})
assert r.ping()
for i in range(200):
    r.set(f"py:{{i}}", i)
keys = [f"py:{{i}}" for i in range(200)]
assert r.mget(keys) == [str(i).encode() for i in range(200)]
p = r.pipeline(transaction=False)
for i in range(200):
    p.incr(f"py:{{i}}")
assert p.execute() == [i + 1 for i in range(200)]
assert r.delete(*keys[:50]) == 50
assert r.exists(*keys) == 150
r.hset("py:h", mapping={{"a": 1, "b": 2}})
assert r.hgetall("py:h") == {{b"a": b"1", b"b": b"2"}}
try:
    r.keys("*")
    raise SystemExit("KEYS was served")
except redis.ResponseError as e:
    assert "names no key" in str(e), e
assert r.get("py:199") == b"200"
print("redis-py ok")
"#
    );
    let out = Command::new("/usr/bin/python3")
        .args(["-c", &script])
        .output()
        .expect("python3");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("redis-py ok"),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
