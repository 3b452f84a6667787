//! Redis through the switch: the testbed's servers run redis-server, kvswitch's pool is a
//! Redis pool, and clients speak to the VIP's port 6379. The switch splices each connection
//! command by command: a command whose keys lie on one server goes there on a leg of its own,
//! what no one server answers goes to the proxy behind the local port.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::proxy::free_port;
use common::*;
use testbed::local::{self, Proc};
use testbed::resp_differential::{compare, exchange};

const CROSS_SERVER: &str = "the keys of this command lie on different servers";

/// A testbed whose servers run redis-server, in l3 mode, with `pool` added to the pool.
fn redis_testbed(prefix: &str, nutcracker: bool, pool: &str) -> testbed::Live {
    let pool = pool.to_string();
    testbed_with(prefix, "l3", nutcracker, move |o| {
        o.servers = testbed::ServerProgram::Redis;
        if !pool.is_empty() {
            o.pool_config = Some(pool);
        }
    })
}

/// A counter of the switch's `/metrics`, by its whole series name.
fn metric(live: &testbed::Live, series: &str) -> u64 {
    let body = metrics(live);
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in /metrics"))
}

/// `redis-cli` run in `host`'s namespace against `addr`; its output.
fn cli(live: &testbed::Live, host: &str, addr: SocketAddr, args: &[&str]) -> String {
    let out = live
        .exec(host, "redis-cli")
        .args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
        .args(args)
        .output()
        .expect("redis-cli runs (scripts/setup.sh installs redis-tools)");
    assert!(out.status.success(), "redis-cli {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A reference redis-server in the root namespace.
fn reference() -> (SocketAddr, Proc) {
    let bin = local::require("redis-server").expect("redis-server (scripts/setup.sh)");
    let mut last = None;
    for _ in 0..5 {
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        match local::redis_server(&bin, addr, &[]) {
            Ok(proc) => return (addr, proc),
            Err(e) => last = Some(e),
        }
    }
    panic!("redis-server did not start: {last:?}");
}

/// Seeded valid and mutated RESP streams, each on a fresh connection to the VIP from c1 and to
/// one redis-server: the same bytes back, and the same close, for every stream. The splice
/// carried commands to the servers itself, and the proxy took the rest.
#[test]
fn every_stream_through_the_vip_reads_as_one_redis_server() {
    let cases = std::env::var("KVSWITCH_DIFF_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200u64);
    let seed = 0x7ed15;
    let live = redis_testbed("krv1", false, "");
    let (direct, _reference) = reference();
    let vip = vip(&live);
    let spliced_before = metric(&live, "kvswitch_tcp_requests_total");
    // KVSWITCH_DIFF_FIRST: start at this case (to replay one).
    let first = std::env::var("KVSWITCH_DIFF_FIRST")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0u64);
    let found = compare(seed, first..first + cases, 3, direct, CROSS_SERVER, |c| {
        live.in_host("c1", || exchange(vip, c)).expect("c1")
    });
    let failures = &found.failures;
    assert!(
        failures.is_empty(),
        "{} of {cases} streams differ:\n{}\n{}",
        failures.len(),
        failures
            .iter()
            .take(6)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n"),
        log_tail(&live, 30)
    );
    // The switch hashes whole keys (no hash tag), so the cases' tagged pairs of keys, which one
    // server serves together, lie on two servers about as often as any two keys.
    let refused = found.refused;
    assert!(
        refused <= cases / 4,
        "{refused} of {cases} refused as cross-server"
    );
    let spliced = metric(&live, "kvswitch_tcp_requests_total") - spliced_before;
    let proxied = metric(&live, "kvswitch_tcp_connections_total{path=\"proxied\"}")
        + metric(
            &live,
            "kvswitch_tcp_connections_total{path=\"handed_over\"}",
        );
    println!("{spliced} commands spliced to their servers; {proxied} connections took the proxy");
    assert!(
        spliced > cases,
        "only {spliced} commands went to a server on a leg"
    );
    assert!(proxied > 0, "no stream needed the proxy");
    assert_eq!(drops(&live, "tcp_replies_lost"), 0, "a reply was misread");
}

/// redis-cli, redis-benchmark and redis-py through the VIP; every key where nutcracker (with
/// `redis: true` on the same servers) finds it; UDP to the port dropped and counted.
#[test]
fn redis_clients_work_through_the_vip_and_keys_lie_where_nutcracker_finds_them() {
    let live = redis_testbed("krv2", true, "");
    let vip = vip(&live);
    let nutcracker = SocketAddr::from(([127, 0, 0, 1], testbed::NUTCRACKER_PORT));

    // redis-cli: writes through the VIP, read back through nutcracker and the VIP.
    for i in 0..40 {
        let (k, v) = (format!("vip:{i}"), format!("value-{i}"));
        assert_eq!(cli(&live, "c1", vip, &["SET", &k, &v]), "OK");
    }
    let keys: Vec<String> = (0..40).map(|i| format!("vip:{i}")).collect();
    let mut args = vec!["MGET"];
    args.extend(keys.iter().map(String::as_str));
    let through_nutcracker = cli(&live, "c1", nutcracker, &args);
    let through_vip = cli(&live, "c2", vip, &args);
    let want: Vec<String> = (0..40).map(|i| format!("value-{i}")).collect();
    assert_eq!(through_nutcracker.lines().collect::<Vec<_>>(), want);
    assert_eq!(through_vip.lines().collect::<Vec<_>>(), want);
    // Every server holds some of them: the keys were routed, not sent to one.
    for host in ["s1", "s2", "s3"] {
        let addr = SocketAddr::new(ip_of(&live, host).into(), 6379);
        let n: u64 = cli(&live, host, addr, &["DBSIZE"])
            .parse()
            .expect("a count");
        assert!(n > 0, "{host} holds no key");
    }
    assert_eq!(cli(&live, "c1", vip, &["INCR", "vip:n"]), "1");
    assert!(cli(&live, "c1", vip, &["MULTI"]).contains("is not served through kvswitch"));

    // redis-benchmark: random keys, pipelined and not.
    for pipeline in ["1", "16"] {
        let out = live
            .exec("c2", "redis-benchmark")
            .args([
                "-h",
                &vip.ip().to_string(),
                "-p",
                "6379",
                "-q",
                "-t",
                "set,get",
            ])
            .args(["-n", "3000", "-c", "4", "-r", "1000", "-P", pipeline])
            .output()
            .expect("redis-benchmark runs");
        let text = String::from_utf8_lossy(&out.stdout).replace('\r', "\n");
        assert!(
            out.status.success(),
            "redis-benchmark -P {pipeline}: {out:?}"
        );
        for test in ["SET:", "GET:"] {
            assert!(
                text.lines()
                    .any(|l| l.starts_with(test) && l.contains("requests per second")),
                "redis-benchmark -P {pipeline} did not finish {test}\n{text}"
            );
        }
    }

    // redis-py: a pipeline of writes and reads on many keys, and a multi-key read.
    let script = format!(
        r#"
import redis
r = redis.Redis(host="{ip}", port=6379, socket_timeout=5)
p = r.pipeline(transaction=False)
for i in range(200):
    p.set("py:%d" % i, "v%d" % i)
    p.get("py:%d" % i)
out = p.execute()
assert out[0::2] == [True] * 200, out[:6]
assert out[1::2] == [b"v%d" % i for i in range(200)], out[:6]
assert r.mget(["py:%d" % i for i in range(50)]) == [b"v%d" % i for i in range(50)]
assert r.delete("py:1", "py:2", "py:3") == 3
assert r.hset("py:h", mapping={{"a": "1", "b": "2"}}) == 2 and r.hgetall("py:h") == {{b"a": b"1", b"b": b"2"}}
print("ok")
"#,
        ip = vip.ip()
    );
    let out = live
        .exec("c1", "/usr/bin/python3")
        .args(["-c", &script])
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok",
        "redis-py through the VIP: {out:?}"
    );

    // QUIT ends the connection where one server would: nothing sent after it is answered,
    // whichever servers its keys lie on.
    let after_quit = live
        .in_host("c1", || {
            use std::io::{Read, Write};
            let mut c = std::net::TcpStream::connect(vip).expect("connect");
            c.set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            let mut out = b"SET quit:0 x\r\nQUIT\r\n".to_vec();
            for i in 0..8 {
                out.extend_from_slice(format!("GET quit:{i}\r\n").as_bytes());
            }
            c.write_all(&out).expect("write");
            let mut got = Vec::new();
            let mut buf = [0u8; 256];
            // The close may come as a reset (the GETs were never read), which can take
            // the last bytes with it: what did come must be the two `+OK`s' start.
            let closed = loop {
                match c.read(&mut buf) {
                    Ok(0) => break true,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    Err(e) => break e.kind() == std::io::ErrorKind::ConnectionReset,
                }
            };
            (got, closed)
        })
        .expect("c1");
    let text = String::from_utf8_lossy(&after_quit.0).to_string();
    assert!(
        after_quit.1 && "+OK\r\n+OK\r\n".starts_with(&text),
        "after QUIT: {text:?}, closed: {}",
        after_quit.1
    );

    // The splice carried commands itself, and nothing it read was lost.
    assert!(metric(&live, "kvswitch_tcp_requests_total") > 3000);
    assert_eq!(drops(&live, "tcp_replies_lost"), 0);

    // UDP to a Redis pool's port is nobody's: dropped, counted.
    let before = drops(&live, "udp_to_redis");
    live.in_host("c1", || {
        let sock = std::net::UdpSocket::bind("0.0.0.0:0").expect("a socket");
        for _ in 0..3 {
            sock.send_to(&datagram(1, "get vip:1\r\n"), vip)
                .expect("send");
        }
    })
    .expect("c1");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while drops(&live, "udp_to_redis") < before + 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "UDP to the Redis port was not counted"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Six clients record a history through the VIP on 24 keys while one of three servers is
/// killed: no read may return a value older than an acknowledged write on the keys of the
/// servers that stayed, and the dead server's keys are served again once it is ejected.
#[test]
fn history_through_the_vip_reads_nothing_stale_while_a_server_dies() {
    use testbed::history_load::{self, Client, Clock, Load, Mix, Transport};
    let live = redis_testbed(
        "krv3",
        false,
        "auto_eject_hosts = true\nserver_failure_limit = 1\nserver_retry_timeout_ms = 60000\n",
    );
    let vip = vip(&live);
    let keys: Vec<String> = (0..24).map(|i| format!("user:{i}")).collect();
    for key in &keys {
        assert_eq!(cli(&live, "c1", vip, &["SET", key, "0"]), "OK");
    }
    // Where each key lies, asked of the servers.
    let hosts = ["s1", "s2", "s3"];
    let home = |key: &str| {
        hosts
            .iter()
            .position(|h| {
                let addr = SocketAddr::new(ip_of(&live, h).into(), 6379);
                cli(&live, h, addr, &["EXISTS", key]) == "1"
            })
            .expect("every key is on a server")
    };
    let victim = home(&keys[0]);
    let lost: Vec<String> = keys.iter().filter(|k| home(k) == victim).cloned().collect();
    assert!(lost.len() < keys.len());
    // The history starts from absent keys.
    for key in &keys {
        assert_eq!(cli(&live, "c1", vip, &["DEL", key]), "1");
    }
    let netns = live.host("c1").expect("c1").netns.clone();
    let clients: Vec<Client> = (1..=6)
        .map(|id| Client {
            id,
            transport: Transport::Redis,
            target: vip,
            timeout: Duration::from_secs(3),
            netns: Some(netns.clone()),
        })
        .collect();
    let load = Load {
        keys: keys.clone(),
        ops_per_client: 50_000,
        duration: Duration::from_secs(4),
        mix: Mix::default(),
        seed: 0x4ed16,
    };
    let recorded = std::thread::scope(|scope| {
        let run = scope.spawn(|| history_load::run(&clients, &load, Clock::start()));
        std::thread::sleep(Duration::from_millis(1500));
        live.kill_server(hosts[victim])
            .expect("the server is killed");
        run.join().expect("the load").expect("the clients ran")
    });
    common::recorded_ok(&recorded);
    assert!(recorded.ops.len() > 500, "{} ops", recorded.ops.len());
    let survivors: Vec<_> = recorded
        .ops
        .iter()
        .filter(|op| !lost.contains(&op.key))
        .cloned()
        .collect();
    common::no_stale_read(&survivors);
    let late = recorded
        .ops
        .iter()
        .rev()
        .take(200)
        .filter(|op| lost.contains(&op.key));
    assert!(
        late.clone()
            .any(|op| !matches!(op.kind, testbed::history::Kind::Failed)),
        "the dead server's keys were never served again"
    );
    assert!(metric(&live, "kvswitch_tcp_requests_total") > 100);
}

/// memtier_benchmark `--protocol=redis` through the VIP (from c1, the splice) and to the proxy
/// alone (from the root namespace, where the VIP is the proxy's address behind the local port),
/// where it is installed. It is not a Debian package: without it the test says so and checks
/// nothing.
#[test]
fn memtier_benchmark_over_redis_through_the_vip_and_the_proxy_where_installed() {
    if !memtier_installed() {
        return;
    }
    let live = redis_testbed("krv4", false, "");
    let vip = vip(&live);
    let args = |cmd: &mut std::process::Command| {
        cmd.args(["120", "memtier_benchmark", "--protocol=redis", "-s"])
            .arg(vip.ip().to_string())
            .args(["-p", "6379", "--threads", "1", "--clients", "8"])
            .args([
                "--requests",
                "2000",
                "--ratio",
                "1:4",
                "--key-maximum",
                "5000",
            ])
            .arg("--hide-histogram")
            .stdin(std::process::Stdio::null());
    };
    let mut through_vip = live.exec("c1", "timeout");
    args(&mut through_vip);
    let mut to_proxy = std::process::Command::new("timeout");
    args(&mut to_proxy);
    for (what, mut cmd) in [("the VIP", through_vip), ("the proxy", to_proxy)] {
        let out = cmd.output().expect("memtier_benchmark");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("Totals"),
            "memtier_benchmark through {what}: {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(metric(&live, "kvswitch_tcp_requests_total") > 1000);
}
