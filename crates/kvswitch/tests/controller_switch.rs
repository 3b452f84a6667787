//! The controller driving a real switch on the testbed (`l3`, three memcached servers, the
//! built-in proxy behind the local port): a memcached killed while a client reads its keys
//! over UDP is taken out of the switch's pool by the controller, after which every UDP and
//! TCP request for those keys is answered (by the servers they move to). Prints the time from
//! the death to the last unanswered UDP request.
//!
//! Needs root (network namespaces) and memcached.

mod common;

use std::time::{Duration, Instant};

use api::Client;
use common::fleet::{in_pool, testbed_controller};
use common::*;

const VICTIM: &str = "s2";

#[test]
fn a_dead_server_leaves_the_switchs_udp_path_and_proxy_through_the_controller() {
    // The testbed's prefix, with a subnet of its own.
    dead_server_leaves("kctl", "");
}

/// The same with the change staged and taken at an instant (`pool_changes = "together"`):
/// the switch's UDP path, fast path and proxy take the staged pool.
#[test]
fn a_dead_server_leaves_the_switch_in_a_change_taken_together() {
    dead_server_leaves("kctt", "pool_changes = \"together\"");
}

fn dead_server_leaves(prefix: &str, settings: &str) {
    require_root();
    let live = testbed(prefix, "l3", false);
    let switch_api = Client::new(live.api(), None);
    let names = ["s1", "s2", "s3"];
    let (_controller, _ctl) = testbed_controller(&live, &names, settings);

    // Keys of the victim, by a ring built apart from kvswitch.
    let ring = kv::Ring::new(
        kv::Distribution::Ketama,
        kv::HashFn::Md5,
        &names.map(|n| kv::Server::new(n, 1)),
    )
    .unwrap();
    let keys: Vec<String> = (0..1000)
        .map(|i| format!("victim:{i}"))
        .filter(|k| ring.locate(k.as_bytes()) == 1)
        .take(8)
        .collect();
    let get = |key: &str, wait: Duration| {
        udp_call(
            &live,
            "c1",
            vip(&live),
            format!("get {key}\r\n").as_bytes(),
            wait,
        )
    };
    assert!(
        get(&keys[0], Duration::from_secs(1)).is_some(),
        "no UDP reply before the kill"
    );

    let killed = Instant::now();
    live.kill_server(VICTIM).expect("kill the victim");
    let mut last_unanswered = None;
    let mut i = 0;
    while in_pool(&switch_api, VICTIM) {
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "{VICTIM} still in the switch's pool 10 s after its death"
        );
        let asked = killed.elapsed();
        if get(&keys[i % keys.len()], Duration::from_millis(200)).is_none() {
            last_unanswered = Some(asked);
        }
        i += 1;
    }
    let out = killed.elapsed();
    // Out of the pool: every key is answered, over UDP and TCP.
    for key in &keys {
        let reply = get(key, Duration::from_secs(1))
            .unwrap_or_else(|| panic!("no UDP reply for {key} after the removal"));
        assert_eq!(reply.body, b"END\r\n", "{key}");
        let reply = tcp_call(
            &live,
            "c2",
            vip(&live),
            format!("get {key}\r\n").as_bytes(),
            |b| b.ends_with(b"END\r\n"),
        );
        assert_eq!(reply, b"END\r\n", "{key} over TCP");
    }
    eprintln!(
        "{VICTIM} killed ({settings:?}): out of the switch's pool after {out:?}; the last \
         unanswered UDP get was sent {last_unanswered:?} after the death"
    );
    if !settings.is_empty() {
        let pool = switch_api.call("GET", "/api/v1/pool", None).unwrap();
        let staged = &pool["pools"][0]["staged"];
        assert!(staged["taken_unix_ms"].is_number(), "{pool}");
        assert!(
            staged["taken_unix_ms"].as_f64() >= staged["at_unix_ms"].as_f64(),
            "{pool}"
        );
    }
}
