//! TCP to the VIP over a faulty link made by the switch's own `impair` action (this kernel has
//! no netem): segments both ways between the clients and the switch's splice (and the proxy,
//! for what it answers) are dropped, duplicated, reordered and delayed, seeded. Clients over TCP
//! and UDP run a history-checked load with the cache on meanwhile: every reply is one
//! memcached would give, no read is stale, and the load goes on.

mod common;

use std::time::Duration;

use api::Client as Api;
use common::*;
use serde_json::json;
use testbed::history_load::{self, Clock, Load, Mix, Transport};

#[test]
fn tcp_through_the_vip_survives_loss_duplication_and_reordering() {
    let live = testbed_with("ktf", "l3", false, |o| {
        o.extra_config = Some("[cache]\nlease_ms = 2000\n".into());
    });
    let api = Api::new(live.api(), None);
    // Every TCP segment to or from a memcached port, in both directions: client to VIP,
    // proxy to server, and the replies.
    let impair = json!({"impair": {
        "drop_ppm": 20_000, "duplicate_ppm": 10_000, "reorder_ppm": 20_000,
        "reorder_us": 2_000, "delay_us": 100
    }});
    for field in ["l4_dst", "l4_src"] {
        api.call(
            "POST",
            "/api/v1/tables/acl/entries",
            Some(&json!({
                "match": {"ip_proto": 6, field: 11211},
                "actions": [impair.clone()],
            })),
        )
        .expect("an impair entry");
    }
    let entries = api
        .call("GET", "/api/v1/tables/acl/entries", None)
        .expect("acl entries");
    assert!(
        entries.to_string().contains("\"reorder_us\":2000"),
        "{entries}"
    );
    let before = drops(&live, "impaired");
    let clients = history_clients(
        &live,
        &["c1", "c2"],
        &[Transport::Tcp, Transport::Tcp, Transport::Udp],
        Duration::from_secs(2),
    );
    let load = Load {
        keys: (0..16).map(|i| format!("tf:{i}")).collect(),
        ops_per_client: 20_000,
        duration: Duration::from_secs(5),
        mix: Mix::default(),
        seed: 35,
    };
    let recorded = history_load::run(&clients, &load, Clock::start()).expect("load");
    recorded_ok(&recorded);
    no_stale_read(&recorded.ops);
    let impaired = drops(&live, "impaired") - before;
    let text = metrics(&live);
    let duplicated: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("kvswitch_impaired_duplicated_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no duplicates counted in {text}"));
    println!("tcp faults: {impaired} segments dropped, {duplicated} sent twice");
    assert!(impaired > 10, "{impaired} dropped");
    assert!(duplicated > 5.0, "{duplicated} sent twice");
    assert!(
        recorded.ops_over(Transport::Tcp) > 200,
        "too little TCP traffic went through"
    );
    // The TCP clients were spliced: the switch carried their connections itself.
    let tcp = status(&live)["tcp"].clone();
    assert!(
        tcp["connections"]["spliced"].as_u64().unwrap_or(0) > 0,
        "{tcp}"
    );
    assert!(tcp["requests"].as_u64().unwrap_or(0) > 100, "{tcp}");
    // Once the entries go, nothing is impaired any more.
    let doc = api
        .call("GET", "/api/v1/tables/acl/entries", None)
        .expect("acl entries");
    for id in doc["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["id"].as_u64())
    {
        api.call("DELETE", &format!("/api/v1/tables/acl/entries/{id}"), None)
            .expect("delete");
    }
    let still = drops(&live, "impaired");
    for i in 0..20 {
        let key = format!("tf:after:{i}");
        let set = format!("set {key} 0 0 1\r\nx\r\n");
        let reply = tcp_call(&live, "c1", vip(&live), set.as_bytes(), |r| {
            r.ends_with(b"\r\n")
        });
        assert_eq!(reply, b"STORED\r\n");
    }
    assert_eq!(drops(&live, "impaired"), still);
    live.down().expect("down");
}
