//! The cache on the switch's UDP path: a read of a cached key is answered by kvswitch from the
//! VIP, byte for byte as the key's memcached answers it (values over several datagrams
//! included), in the text, meta and binary protocols; a write over TCP through the proxy is seen
//! by the next UDP read; and the `kv_cache` table follows the cache's rules.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(2);

/// Waits until the cache's hits reach `want` (reads answered by the XDP program's copy of
/// the cache reach the counter within 50 ms), then checks they stay there.
fn wait_hits(live: &testbed::Live, want: u64, what: &str) {
    let start = std::time::Instant::now();
    while hits(live) < want && start.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(hits(live), want, "{what}");
}

fn hits(live: &testbed::Live) -> u64 {
    let body = metrics(live);
    body.lines()
        .find_map(|l| {
            l.strip_prefix("kvswitch_cache_hits_total{pool=\"default\"} ")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no cache hits in\n{body}"))
}

fn cache_cli(live: &testbed::Live, args: &[&str]) -> String {
    common::proxy::cache_cli(live.api(), args)
}

fn binary_get(op: u8, key: &[u8], opaque: u32) -> Vec<u8> {
    let mut out = Vec::new();
    wire::memcache::binary::write_request(op, key, b"", b"", opaque, 0, &mut out);
    out
}

/// A client's very first datagram to the VIP reaches the switch: the host's own stack, which
/// holds the VIP on the local port, must not answer ARP for it on the switch's ports.
fn check_first_request(live: &testbed::Live) {
    let vip = vip(live);
    let r = udp_call(live, "c2", vip, b"set first 0 0 1\r\nx\r\n", T)
        .expect("the first request to the VIP is answered");
    assert_eq!(r.body, b"STORED\r\n");
    for port in live.state.hosts.iter().map(|h| &h.switch_if) {
        let path = format!("/proc/sys/net/ipv4/conf/{port}/arp_ignore");
        let value = std::fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(value.trim(), "1", "{path}");
    }
}

fn check_served_from_cache(live: &testbed::Live, multi_get: bool) {
    check_first_request(live);
    let vip = vip(live);
    let ring = default_ring();
    let keys = keys_spanning_servers(&ring, "cached", 1);
    let values: Vec<Vec<u8>> = vec![
        b"small".to_vec(),
        (0..=255u8).collect(),
        // Longer than one datagram: memcached sends it in pieces, and so must the cache.
        (0..5000u32).map(|i| b'a' + (i % 26) as u8).collect(),
    ];
    for (i, (key, value)) in keys.iter().zip(&values).enumerate() {
        let mut set = format!("set {key} {} 0 {}\r\n", 40 + i, value.len()).into_bytes();
        set.extend_from_slice(value);
        set.extend_from_slice(b"\r\n");
        // Over TCP: a request must fit one datagram, and 5000 bytes do not.
        let reply = tcp_call(live, "c1", vip, &set, ends_with_line);
        assert_eq!(reply, b"STORED\r\n");
        let pinned = cache_cli(live, &["pin", key]);
        assert!(pinned.contains("\"cached\": true"), "{pinned}");
    }
    // The switch installs the rules at its next tick.
    std::thread::sleep(Duration::from_millis(100));
    let servers = ["s1", "s2", "s3"];
    let mut checked = 0;
    for key in &keys {
        let owner = servers[ring.locate(key.as_bytes())];
        let direct = SocketAddr::new(ip_of(live, owner).into(), 11211);
        let k = key.as_bytes();
        let forms: Vec<Vec<u8>> = vec![
            format!("get {key}\r\n").into_bytes(),
            format!("gets {key}\r\n").into_bytes(),
            format!("mg {key} v\r\n").into_bytes(),
            format!("mg {key} s f v c\r\n").into_bytes(),
            format!("mg {key} k v O9\r\n").into_bytes(),
            binary_get(0x00, k, 21),
            binary_get(0x09, k, 22),
            binary_get(0x0c, k, 23),
            binary_get(0x0d, k, 24),
        ];
        for form in &forms {
            let want = udp_call(live, "c2", direct, form, T).expect("direct reply");
            let first = udp_call(live, "c1", vip, form, T).expect("first reply");
            assert_eq!(first.body, want.body, "first read of {key}: {form:?}");
            let before = hits(live);
            let second = udp_call(live, "c1", vip, form, T).expect("cached reply");
            assert_eq!(
                second.body,
                want.body,
                "cached read of {key}: {:?}",
                String::from_utf8_lossy(form)
            );
            assert_eq!(second.from, vip, "the cache answers from the VIP");
            assert_eq!(
                second.datagrams, want.datagrams,
                "as many datagrams as memcached"
            );
            wait_hits(
                live,
                before + 1,
                &format!("answered from the cache: {form:?}"),
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 27);

    // A write over TCP, through the proxy, is seen by the next UDP read, and the read after it
    // is answered from the cache again with the new value.
    let key = &keys[0];
    let reply = tcp_call(
        live,
        "c2",
        vip,
        format!("set {key} 3 0 3\r\nnew\r\n").as_bytes(),
        ends_with_line,
    );
    assert_eq!(reply, b"STORED\r\n");
    let want = format!("VALUE {key} 3 3\r\nnew\r\nEND\r\n").into_bytes();
    let r = udp_call(live, "c1", vip, format!("get {key}\r\n").as_bytes(), T).expect("get");
    assert_eq!(r.body, want);
    let before = hits(live);
    let r = udp_call(live, "c1", vip, format!("get {key}\r\n").as_bytes(), T).expect("get");
    assert_eq!(r.body, want);
    wait_hits(live, before + 1, "the new value from the cache");
    // A UDP delete, then the key reads as missing.
    let r = udp_call(live, "c2", vip, format!("delete {key}\r\n").as_bytes(), T).expect("del");
    assert_eq!(r.body, b"DELETED\r\n");
    let r = udp_call(live, "c1", vip, format!("get {key}\r\n").as_bytes(), T).expect("get");
    assert_eq!(r.body, b"END\r\n");

    // A multi-get across servers mixes cached keys and a key read from its server.
    if multi_get {
        let plain = &keys[2];
        let on_server = "uncached";
        let r = udp_call(
            live,
            "c1",
            vip,
            format!("set {on_server} 9 0 2\r\nus\r\n").as_bytes(),
            T,
        )
        .expect("set");
        assert_eq!(r.body, b"STORED\r\n");
        let one = |key: &str| {
            let owner = servers[ring.locate(key.as_bytes())];
            let direct = SocketAddr::new(ip_of(live, owner).into(), 11211);
            let mut r = udp_call(live, "c2", direct, format!("get {key}\r\n").as_bytes(), T)
                .expect("direct get")
                .body;
            r.truncate(r.len() - 5);
            r
        };
        let expected = [
            one(plain),
            one(on_server),
            one(&keys[1]),
            b"END\r\n".to_vec(),
        ]
        .concat();
        let request = format!("get {plain} {on_server} nothere {}\r\n", keys[1]);
        let before = hits(live);
        let r = udp_call(live, "c1", vip, request.as_bytes(), T).expect("multi-get");
        assert_eq!(r.body, expected);
        wait_hits(live, before + 2, "the two cached keys came from the cache");
        // All cached: answered at once.
        let request = format!("get {} {plain}\r\n", keys[1]);
        let r = udp_call(live, "c1", vip, request.as_bytes(), T).expect("multi-get");
        assert_eq!(
            r.body,
            [one(&keys[1]), one(plain), b"END\r\n".to_vec()].concat()
        );
    }

    // The rules: one `kv_cache` entry per cached key (the three pinned, and any other read
    // long enough to be admitted, which a slow machine reaches); evicting removes it.
    let doc: serde_json::Value =
        serde_json::from_str(&cache_cli(live, &["show"])).expect("show prints JSON");
    let pool = &doc["pools"][0];
    let top = pool["top"].as_array().expect("the cache's top keys");
    let pinned: Vec<&serde_json::Value> = top.iter().filter(|e| e["pinned"] == true).collect();
    assert_eq!(pinned.len(), 3, "{doc}");
    assert!(pinned.iter().all(|e| e["rule"] == true), "{doc}");
    let with_rule = top.iter().filter(|e| e["rule"] == true).count();
    assert_eq!(pool["rules_installed"], with_rule, "{doc}");
    cache_cli(live, &["evict", &keys[1]]);
    std::thread::sleep(Duration::from_millis(100));
    let before = hits(live);
    let form = format!("get {}\r\n", keys[1]).into_bytes();
    let r = udp_call(live, "c1", vip, &form, T).expect("get");
    assert!(r
        .body
        .starts_with(format!("VALUE {} 41 256", keys[1]).as_bytes()));
    wait_hits(live, before, "an evicted key is read from its server");
    let tables = status(live)["tables"].to_string();
    assert!(tables.contains("kv_cache"), "{tables}");
}

#[test]
fn cached_reads_over_udp_l3() {
    let live = testbed_with("kcsw", "l3", false, |o| {
        o.extra_config = Some("[cache]\nlease_ms = 60000\n".into())
    });
    check_served_from_cache(&live, true);
    live.down().expect("down");
}

#[test]
fn cached_reads_over_udp_l2() {
    let live = testbed_with("kcs2", "l2", false, |o| {
        o.extra_config = Some("[cache]\nlease_ms = 60000\n".into())
    });
    // Split multi-gets need a source address of their own, which l2 mode leaves unset here.
    check_served_from_cache(&live, false);
    live.down().expect("down");
}
