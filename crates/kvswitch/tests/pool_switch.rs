//! The switch's pool changed through the control API while it runs, on the testbed (`l3`,
//! three memcached servers): the UDP path and the built-in proxy change over together. After
//! each change every key written over UDP or TCP is on the server the new ring names, and on
//! no other; once a server's removal is acknowledged no UDP request reaches it; a server added
//! at run time (here the removed one, under a new name, so it takes a new place in the pool)
//! is found with ARP and served over both transports; a new weight moves keys as ketama says;
//! both paths count their requests on the ring's arcs and route by a placement of the arcs.

mod common;

use api::Client;
use common::*;
use serde_json::json;

/// The testbed's prefix, with a subnet of its own.
const PREFIX: &str = "kpl";
const ALL: [&str; 3] = ["s1", "s2", "s3"];
const KEYS: usize = 24;
const UDP_TRIES: usize = 5;

/// The ring over (name, weight), built independently of kvswitch.
fn ring(servers: &[(&str, u32)]) -> kv::Ring {
    let servers: Vec<kv::Server> = servers
        .iter()
        .map(|(n, w)| kv::Server::new(*n, *w))
        .collect();
    kv::Ring::new(kv::Distribution::Ketama, kv::HashFn::Md5, &servers).expect("ring")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn udp(live: &testbed::Live, request: &str) -> String {
    (0..UDP_TRIES)
        .find_map(|_| {
            udp_call(
                live,
                "c1",
                vip(live),
                request.as_bytes(),
                std::time::Duration::from_secs(1),
            )
            .map(|r| text(&r.body))
        })
        .unwrap_or_else(|| panic!("no UDP reply to {request:?}\n{}", log_tail(live, 30)))
}

fn tcp(live: &testbed::Live, request: &str) -> String {
    text(&tcp_call(live, "c2", vip(live), request.as_bytes(), |b| {
        b.ends_with(b"\r\n")
    }))
}

/// Writes every key over UDP and then over TCP, each time checking it landed on the server
/// `ring` names (by `names`, whose hosts are `hosts`) and on no other.
fn placed_by(live: &testbed::Live, step: &str, ring: &kv::Ring, names: &[&str], hosts: &[&str]) {
    for i in 0..KEYS {
        let key = format!("{step}:{i}");
        let want = hosts[ring.locate(key.as_bytes())];
        for (transport, value) in [("udp", format!("u{i}")), ("tcp", format!("t{i}"))] {
            let request = format!("set {key} 0 0 {}\r\n{value}\r\n", value.len());
            let reply = match transport {
                "udp" => udp(live, &request),
                _ => tcp(live, &request),
            };
            assert_eq!(reply, "STORED\r\n", "{step}: {transport} set {key}");
            let holders: Vec<&str> = ALL
                .iter()
                .copied()
                .filter(|s| server_value(live, s, &key).as_deref() == Some(value.as_bytes()))
                .collect();
            assert_eq!(
                holders,
                vec![want],
                "{step}: {key} over {transport} (ring {names:?})"
            );
        }
    }
}

#[test]
fn servers_added_removed_and_reweighted_while_both_paths_route() {
    require_root();
    let live = testbed(PREFIX, "l3", false);
    let api = Client::new(live.api(), None);
    placed_by(
        &live,
        "start",
        &ring(&[("s1", 1), ("s2", 1), ("s3", 1)]),
        &["s1", "s2", "s3"],
        &["s1", "s2", "s3"],
    );

    let removed = api
        .call("DELETE", "/api/v1/pool/servers/s2", None)
        .expect("remove s2");
    assert_eq!(removed["server"], 1);
    let before = udp_in_datagrams(&live, "s2");
    placed_by(
        &live,
        "removed",
        &ring(&[("s1", 1), ("s3", 1)]),
        &["s1", "s3"],
        &["s1", "s3"],
    );
    assert_eq!(
        udp_in_datagrams(&live, "s2"),
        before,
        "a UDP request reached s2 after its removal was acknowledged"
    );

    // The same memcached, added as a new server: a new place in the pool, found with ARP.
    let s2 = ip_of(&live, "s2");
    let added = api
        .call(
            "POST",
            "/api/v1/pool/servers",
            Some(&json!({"addr": format!("{s2}:11211"), "name": "s2b"})),
        )
        .expect("add s2b");
    assert_eq!(added["server"], 3, "{added}");
    placed_by(
        &live,
        "added",
        &ring(&[("s1", 1), ("s3", 1), ("s2b", 1)]),
        &["s1", "s3", "s2b"],
        &["s1", "s3", "s2"],
    );

    // Arcs are counted once asked for, on every ring after, each from 0.
    api.call("GET", "/api/v1/pool/arcs", None).expect("arcs");
    api.call(
        "PUT",
        "/api/v1/pool/servers/s1",
        Some(&json!({"weight": 3})),
    )
    .expect("reweight s1");
    placed_by(
        &live,
        "weighted",
        &ring(&[("s1", 3), ("s3", 1), ("s2b", 1)]),
        &["s1", "s3", "s2b"],
        &["s1", "s3", "s2"],
    );

    let pool = api.call("GET", "/api/v1/pool", None).expect("pool");
    let servers: Vec<(String, u64)> = pool["pools"][0]["servers"]
        .as_array()
        .expect("servers")
        .iter()
        .map(|s| {
            (
                s["label"].as_str().unwrap_or("").to_string(),
                s["weight"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        servers,
        [("s1".into(), 3), ("s3".into(), 1), ("s2b".into(), 1)],
        "{pool}"
    );
    // Both paths count what they route on the ring's arcs, and route by a placement of them:
    // every arc to s3.
    let arcs = api.call("GET", "/api/v1/pool/arcs", None).expect("arcs");
    let counted: u64 = arcs["counts"]
        .as_array()
        .expect("counts")
        .iter()
        .map(|c| c.as_u64().unwrap())
        .sum();
    assert!(
        counted >= 2 * KEYS as u64,
        "{counted} of the weighted step's writes counted"
    );
    place_every_arc(&api, &arcs, "s3");
    let weighted = ring(&[("s1", 3), ("s3", 1), ("s2b", 1)]);
    let to_s3 = weighted
        .with_owners(&vec![1; weighted.continuum_len()])
        .expect("every arc to s3");
    placed_by(
        &live,
        "placed",
        &to_s3,
        &["s1", "s3", "s2b"],
        &["s1", "s3", "s2"],
    );

    let m = metrics(&live);
    assert!(
        m.contains("kvswitch_backend_requests_total{backend=\"s2b\"}"),
        "{m}"
    );
    assert!(
        !m.contains("kvswitch_backend_requests_total{backend=\"s2\"}"),
        "{m}"
    );
}
