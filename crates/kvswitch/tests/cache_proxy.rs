//! The cache on the proxy's TCP path: reads of cached keys are answered by the proxy, byte for
//! byte as memcached answers them, in all three protocols; writes and `flush_all` are never
//! followed by a stale read; `kvswitch cache` steers it and `/metrics` shows it.

mod common;

use common::Running;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::proxy::{cache_cli, free_port, keys_on, until_listening, Conn, Memcached};
use testbed::replies::{ends_with_sentinel, SENTINEL};

struct Setup {
    servers: Vec<Memcached>,
    proxy: SocketAddr,
    api: SocketAddr,
    _running: Running,
    _dir: testbed::local::TempDir,
}

fn start(cache_table: &str) -> Setup {
    let servers = vec![Memcached::start(), Memcached::start()];
    let proxy = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let api = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let dir = testbed::local::TempDir::new("kvswitch-cache-proxy").expect("scratch directory");
    let mut config = format!("[proxy]\nworkers = 2\napi = \"{api}\"\n\n{cache_table}\n[pool]\n");
    for (i, s) in servers.iter().enumerate() {
        config.push_str(&format!(
            "\n[[pool.servers]]\naddr = \"{}\"\nname = \"s{}\"\n",
            s.addr(),
            i + 1
        ));
    }
    let path = dir.path().join("proxy.toml");
    std::fs::write(&path, config).expect("write the configuration");
    let running = Running(
        Command::new(env!("CARGO_BIN_EXE_kvswitch"))
            .args([
                "proxy",
                "--cache",
                "--listen",
                &proxy.to_string(),
                "--config",
            ])
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the proxy"),
    );
    until_listening(&[proxy, api], "proxy");
    Setup {
        servers,
        proxy,
        api,
        _running: running,
        _dir: dir,
    }
}

fn metric(api: SocketAddr, name: &str) -> u64 {
    let (status, body) = testbed::http_get(api, "/metrics").expect("metrics");
    assert_eq!(status, 200);
    let series = format!("{name}{{pool=\"default\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{body}"))
}

/// A text or meta exchange closed by `mn`: the reply up to (not including) `MN`.
fn text(conn: &mut Conn, request: &[u8]) -> Vec<u8> {
    let mut bytes = request.to_vec();
    bytes.extend_from_slice(b"mn\r\n");
    let reply = conn
        .try_call(&bytes, |b| b.ends_with(b"MN\r\n"))
        .expect("a complete reply");
    reply[..reply.len() - 4].to_vec()
}

fn binary_request(op: u8, key: &[u8], opaque: u32) -> Vec<u8> {
    let mut out = Vec::new();
    wire::memcache::binary::write_request(op, key, b"", b"", opaque, 0, &mut out);
    out
}

/// A binary exchange closed by a NOOP: the packets before the NOOP's reply.
fn binary(conn: &mut Conn, request: &[u8]) -> Vec<u8> {
    let mut bytes = request.to_vec();
    let mut noop = Vec::new();
    wire::memcache::binary::write_request(
        wire::memcache::binary::opcode::NOOP,
        b"",
        b"",
        b"",
        SENTINEL,
        0,
        &mut noop,
    );
    bytes.extend_from_slice(&noop);
    let reply = conn
        .try_call(&bytes, ends_with_sentinel)
        .expect("a complete reply");
    reply[..reply.len() - 24].to_vec()
}

enum Form {
    Text(Vec<u8>),
    Binary(Vec<u8>),
}

/// A text and a binary connection to one place: memcached fixes a connection's protocol with
/// its first byte.
struct Pair {
    text: Conn,
    binary: Conn,
}

impl Pair {
    fn open(addr: SocketAddr) -> Pair {
        Pair {
            text: Conn::open(addr),
            binary: Conn::open(addr),
        }
    }

    fn call(&mut self, form: &Form) -> Vec<u8> {
        match form {
            Form::Text(r) => text(&mut self.text, r),
            Form::Binary(r) => binary(&mut self.binary, r),
        }
    }
}

#[test]
fn cached_reads_are_answered_as_memcached_answers_them() {
    let s = start("[cache]\nlease_ms = 60000\n");
    let ring = ring_of(&s);
    // Keys on both servers; values with bytes a text parser could trip on.
    let keys = [keys_on(&ring, 0, "hot", 2), keys_on(&ring, 1, "hot", 2)].concat();
    let values: Vec<Vec<u8>> = vec![
        b"plain".to_vec(),
        b"with\r\nEND\r\ninside".to_vec(),
        (0..=255u8).collect(),
        vec![b'x'; 100_000],
    ];
    let mut client = Conn::open(s.proxy);
    for (i, (key, value)) in keys.iter().zip(&values).enumerate() {
        let mut set = format!("set {key} {} 0 {}\r\n", 7 + i * 1000, value.len()).into_bytes();
        set.extend_from_slice(value);
        set.extend_from_slice(b"\r\n");
        assert_eq!(text(&mut client, &set), b"STORED\r\n");
        let pinned = cache_cli(s.api, &["pin", key]);
        assert!(pinned.contains("\"cached\": true"), "{pinned}");
    }
    let mut direct: Vec<Pair> = s.servers.iter().map(|m| Pair::open(m.addr())).collect();
    let mut pair = Pair::open(s.proxy);
    let owner = |key: &str| ring.locate(key.as_bytes());

    let mut checked = 0;
    for key in &keys {
        let k = key.as_bytes();
        let forms = [
            Form::Text(format!("get {key}\r\n").into_bytes()),
            Form::Text(format!("gets {key}\r\n").into_bytes()),
            Form::Text(format!("mg {key} v\r\n").into_bytes()),
            Form::Text(format!("mg {key} s f v c\r\n").into_bytes()),
            Form::Text(format!("mg {key} k v O77 q\r\n").into_bytes()),
            Form::Text(format!("mg {key} f\r\n").into_bytes()),
            Form::Binary(binary_request(0x00, k, 11)),
            Form::Binary(binary_request(0x09, k, 12)),
            Form::Binary(binary_request(0x0c, k, 13)),
            Form::Binary(binary_request(0x0d, k, 14)),
        ];
        for form in &forms {
            let want = direct[owner(key)].call(form);
            // The first read may miss and fill; the second must be answered by the proxy.
            let first = pair.call(form);
            assert_eq!(first, want, "first read of {key}");
            let hits = metric(s.api, "kvswitch_cache_hits_total");
            let second = pair.call(form);
            assert_eq!(second, want, "cached read of {key}");
            assert_eq!(
                metric(s.api, "kvswitch_cache_hits_total"),
                hits + 1,
                "the second read of {key} was answered from the cache"
            );
            checked += 1;
        }
    }
    // A multi-key get whose keys are all cached is answered whole; one with a key that is not
    // cached goes to the servers and still reads right.
    let all = format!("get {} {} {}\r\n", keys[0], keys[2], keys[0]).into_bytes();
    let hits = metric(s.api, "kvswitch_cache_hits_total");
    let reply = text(&mut client, &all);
    assert_eq!(metric(s.api, "kvswitch_cache_hits_total"), hits + 3);
    let mut want = text(
        &mut direct[owner(&keys[0])].text,
        format!("get {}\r\n", keys[0]).as_bytes(),
    );
    want.truncate(want.len() - 5);
    let mut second = text(
        &mut direct[owner(&keys[2])].text,
        format!("get {}\r\n", keys[2]).as_bytes(),
    );
    second.truncate(second.len() - 5);
    let expected = [want.clone(), second, want, b"END\r\n".to_vec()].concat();
    assert_eq!(reply, expected);
    // Hits and misses in one multi-get: the cached keys come from the cache, the others from
    // their servers, merged in the client's order.
    let uncached = "notcached";
    let on_server = owner(uncached);
    let set = format!("set {uncached} 5 0 2\r\nnc\r\n");
    assert_eq!(text(&mut client, set.as_bytes()), b"STORED\r\n");
    let mixed = format!(
        "get {} nothere {uncached} {} {}\r\n",
        keys[1], keys[3], keys[1]
    )
    .into_bytes();
    let item = |conn: &mut Conn, key: &str| {
        let mut r = text(conn, format!("get {key}\r\n").as_bytes());
        r.truncate(r.len() - 5);
        r
    };
    let one = item(&mut direct[owner(&keys[1])].text, &keys[1]);
    let expected = [
        one.clone(),
        item(&mut direct[on_server].text, uncached),
        item(&mut direct[owner(&keys[3])].text, &keys[3]),
        one,
        b"END\r\n".to_vec(),
    ]
    .concat();
    let hits = metric(s.api, "kvswitch_cache_hits_total");
    assert_eq!(text(&mut client, &mixed), expected);
    assert_eq!(metric(s.api, "kvswitch_cache_hits_total"), hits + 3);
    assert!(checked >= 40);

    let shown = cache_cli(s.api, &["show"]);
    let doc: serde_json::Value = serde_json::from_str(&shown).expect("show prints JSON");
    assert_eq!(doc["pools"][0]["entries"], 4, "{shown}");
    assert_eq!(doc["pools"][0]["filled"], 4, "{shown}");
}

#[test]
fn writes_and_flushes_are_never_followed_by_a_stale_read() {
    let s = start("[cache]\nlease_ms = 60000\nrule_rate = 400\n");
    let mut a = Conn::open(s.proxy);
    let mut a_binary = Conn::open(s.proxy);
    let mut b = Conn::open(s.proxy);
    let key = "coherent";
    cache_cli(s.api, &["pin", key]);
    // Wait for the rule (400 per second: at once, but released by the proxy's tick).
    std::thread::sleep(Duration::from_millis(50));
    for round in 0..200 {
        let value = format!("v{round}");
        let set = format!("set {key} 0 0 {}\r\n{value}\r\n", value.len());
        let op = round % 5;
        let expect = match op {
            // Plain set.
            0 | 1 => {
                assert_eq!(text(&mut a, set.as_bytes()), b"STORED\r\n");
                Some(value)
            }
            // Binary set.
            2 => {
                let mut req = Vec::new();
                wire::memcache::binary::write_request(
                    0x01,
                    key.as_bytes(),
                    &[0, 0, 0, 0, 0, 0, 0, 0],
                    value.as_bytes(),
                    1,
                    0,
                    &mut req,
                );
                let reply = binary(&mut a_binary, &req);
                assert_eq!(&reply[6..8], &[0, 0], "binary set stored");
                Some(value)
            }
            // Meta set, then a noreply set over it.
            3 => {
                let ms = format!("ms {key} {} T0\r\n{value}\r\n", value.len());
                assert_eq!(text(&mut a, ms.as_bytes()), b"HD\r\n");
                let quiet = format!("set {key} 0 0 {} noreply\r\n{value}!\r\n", value.len() + 1);
                assert_eq!(text(&mut a, quiet.as_bytes()), b"");
                Some(format!("{value}!"))
            }
            // Delete.
            _ => {
                assert_eq!(
                    text(&mut a, format!("set {key} 0 0 1\r\nx\r\n").as_bytes()),
                    b"STORED\r\n"
                );
                assert_eq!(
                    text(&mut a, format!("delete {key}\r\n").as_bytes()),
                    b"DELETED\r\n"
                );
                None
            }
        };
        // Read twice from the other connection: the first may fill, the second may hit; both
        // must show the write.
        for _ in 0..2 {
            let reply = text(&mut b, format!("get {key}\r\n").as_bytes());
            let want = match &expect {
                Some(v) => format!("VALUE {key} 0 {}\r\n{v}\r\nEND\r\n", v.len()),
                None => "END\r\n".to_string(),
            };
            assert_eq!(String::from_utf8_lossy(&reply), want, "round {round}");
        }
    }
    assert!(metric(s.api, "kvswitch_cache_hits_total") >= 100);
    assert!(metric(s.api, "kvswitch_cache_invalidations_total") >= 100);
    // flush_all empties the cache.
    assert_eq!(
        text(&mut a, format!("set {key} 0 0 1\r\nz\r\n").as_bytes()),
        b"STORED\r\n"
    );
    text(&mut b, format!("get {key}\r\n").as_bytes());
    assert_eq!(text(&mut a, b"flush_all\r\n"), b"OK\r\n");
    assert_eq!(
        text(&mut b, format!("get {key}\r\n").as_bytes()),
        b"END\r\n"
    );
    // Evicted, the key is read from its server.
    cache_cli(s.api, &["evict", key]);
    let hits = metric(s.api, "kvswitch_cache_hits_total");
    assert_eq!(
        text(&mut a, format!("set {key} 0 0 1\r\ny\r\n").as_bytes()),
        b"STORED\r\n"
    );
    for _ in 0..3 {
        assert_eq!(
            text(&mut b, format!("get {key}\r\n").as_bytes()),
            format!("VALUE {key} 0 1\r\ny\r\nEND\r\n").as_bytes()
        );
    }
    assert_eq!(metric(s.api, "kvswitch_cache_hits_total"), hits);
}

#[test]
fn hot_keys_are_found_and_cached_without_being_pinned() {
    let s = start("[cache]\nlease_ms = 60000\nitems = 10\n");
    let mut c = Conn::open(s.proxy);
    for i in 0..50 {
        let set = format!("set cold{i} 0 0 1\r\nc\r\n");
        assert_eq!(text(&mut c, set.as_bytes()), b"STORED\r\n");
    }
    assert_eq!(text(&mut c, b"set burst 0 0 3\r\nhot\r\n"), b"STORED\r\n");
    // Nine reads of one key among the last 200: the circular log admits it at once.
    for i in 0..9 {
        text(&mut c, format!("get cold{i}\r\n").as_bytes());
        text(&mut c, b"get burst\r\n");
    }
    let doc: serde_json::Value = serde_json::from_str(&cache_cli(s.api, &["show"])).expect("JSON");
    let top = doc["pools"][0]["top"].as_array().expect("top").clone();
    assert!(
        top.iter().any(|e| e["key"] == "burst"),
        "burst is cached: {doc}"
    );
    assert!(metric(s.api, "kvswitch_cache_instant_reports_total") >= 1);
    // After it filled, it is answered from the cache.
    let hits = metric(s.api, "kvswitch_cache_hits_total");
    text(&mut c, b"get burst\r\n");
    text(&mut c, b"get burst\r\n");
    assert!(metric(s.api, "kvswitch_cache_hits_total") > hits);
    // A bad control request gets a clear error.
    let out = Command::new(env!("CARGO_BIN_EXE_kvswitch"))
        .args(["cache", "pin", "", "--api", &s.api.to_string()])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("key"));
}

/// The test's pool as the proxy places keys: s1 and s2, ketama over md5.
fn ring_of(s: &Setup) -> kv::Ring {
    assert_eq!(s.servers.len(), 2);
    let servers: Vec<kv::Server> = ["s1", "s2"]
        .iter()
        .map(|n| kv::Server {
            name: n.to_string(),
            weight: 1,
        })
        .collect();
    kv::Ring::new(kv::Distribution::Ketama, kv::HashFn::Md5, &servers).expect("ring")
}

/// A cached item keeps the expiry its write gave it: once memcached would answer `END`, so
/// does the cache, however long its lease; and an item set to expire within a second is
/// never served from the cache at all.
#[test]
fn a_cached_item_is_never_served_past_its_expiry() {
    let s = start("[cache]\nlease_ms = 60000\n");
    let mut conn = Conn::open(s.proxy);
    let key = "expiring";
    cache_cli(s.api, &["pin", key]);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        text(&mut conn, format!("set {key} 0 3 2\r\nhi\r\n").as_bytes()),
        b"STORED\r\n"
    );
    let set_at = Instant::now();
    let get = format!("get {key}\r\n");
    let hits = || metric(s.api, "kvswitch_cache_hits_total");
    // Filled by the first read, served from the cache by the next.
    assert_eq!(
        text(&mut conn, get.as_bytes()),
        b"VALUE expiring 0 2\r\nhi\r\nEND\r\n"
    );
    let before = hits();
    assert_eq!(
        text(&mut conn, get.as_bytes()),
        b"VALUE expiring 0 2\r\nhi\r\nEND\r\n"
    );
    assert!(hits() > before, "the cache answered");
    // memcached drops it 2 to 3 seconds after the set (its clock moves in seconds); ask
    // until then and a little after: once it is gone, it stays gone.
    let mut gone = false;
    while set_at.elapsed() < Duration::from_millis(3_500) {
        let reply = text(&mut conn, get.as_bytes());
        if reply == b"END\r\n" {
            gone = true;
        } else {
            assert!(!gone, "served again after memcached dropped it");
            assert!(
                set_at.elapsed() < Duration::from_secs(3),
                "served {:?} after a 3 s expiry",
                set_at.elapsed()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(gone, "the item never expired");
    // With an exptime of 1 second the cache never answers it.
    assert_eq!(
        text(&mut conn, format!("set {key} 0 1 2\r\nho\r\n").as_bytes()),
        b"STORED\r\n"
    );
    let before = hits();
    for _ in 0..5 {
        let reply = text(&mut conn, get.as_bytes());
        assert!(reply == b"VALUE expiring 0 2\r\nho\r\nEND\r\n" || reply == b"END\r\n");
    }
    assert_eq!(
        hits(),
        before,
        "an item about to expire was served from the cache"
    );
}
