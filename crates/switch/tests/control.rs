//! The control plane on a switch driven with frames: tables created, filled and emptied
//! through the same calls the API makes, and what frames do as a result. Exact, longest prefix
//! and highest-priority ternary matching; batches that apply whole or not at all; full tables;
//! every refusal leaves the tables as they were; an operator's entry in `acl` in front of the
//! memcached program changes forwarding at once and is gone when deleted; a key pinned to a
//! server through the interface table.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;

use kv::{Distribution, HashFn, Instant};
use serde_json::{json, Value};
use switch::cache::{CacheService, CacheSettings};
use switch::control::{Change, ControlError, EntryDef, ErrorKind, TableDef};
use switch::frame::{udp_frame, UdpEnds};
use switch::pool::Pool;
use switch::spec;
use switch::stats::{self, Drop, Stats};
use switch::{Emit, Fate, Switch, SwitchSpec};
use wire::ethernet::Mac;
use wire::{keymac, mcudp};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 100);
const CLIENT_MAC: Mac = Mac([2, 0, 0, 0, 0, 1]);
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const NOW: Instant = Instant::from_secs(10);

fn server_mac(i: u8) -> Mac {
    Mac([2, 0, 0, 0, 1, i])
}

/// Four ports: the client on 0, server 0 on port 1 and server 1 on port 2, both with MACs
/// configured.
fn rig() -> (Switch, Arc<Stats>) {
    rig_with(|_| {})
}

/// [`rig`] with `change` made to its spec first.
fn rig_with(change: impl FnOnce(&mut SwitchSpec)) -> (Switch, Arc<Stats>) {
    let servers = (0..2u8)
        .map(|i| spec::Server {
            addr: SocketAddrV4::new(Ipv4Addr::new(10, 0, 1, i + 1), 11211),
            mac: Some(server_mac(i)),
        })
        .collect();
    let mut spec = SwitchSpec::new(4, VIP, servers);
    change(&mut spec);
    let pool = Pool::new(spec.pool_spec(Distribution::Ketama, HashFn::Md5)).unwrap();
    let stats = Arc::new(Stats::new(4, 2));
    let mut sw = Switch::new(spec, Arc::new(pool), stats.clone()).unwrap();
    // Teach the switch where the servers are: a frame from each.
    for i in 0..2u8 {
        let mut f = frame_from(
            server_mac(i),
            Ipv4Addr::new(10, 0, 1, i + 1),
            CLIENT_IP,
            b"x",
        );
        let mut emit = Vec::new();
        sw.process(1 + u16::from(i), &mut f, true, NOW, &mut emit);
    }
    (sw, stats)
}

fn frame_from(mac: Mac, ip: Ipv4Addr, dst: Ipv4Addr, payload: &[u8]) -> Vec<u8> {
    let ends = UdpEnds {
        src_mac: mac,
        dst_mac: Mac([2, 0, 0, 0, 0, 0x64]),
        src_ip: ip,
        dst_ip: dst,
        src_port: 40000,
        dst_port: 11211,
    };
    udp_frame(&ends, &[payload])
}

/// A memcached UDP `get key` from the client to the VIP.
fn get(key: &str) -> Vec<u8> {
    let mut payload = vec![0u8; mcudp::LEN];
    mcudp::Header::single(7).emit(&mut payload);
    payload.extend_from_slice(format!("get {key}\r\n").as_bytes());
    frame_from(CLIENT_MAC, CLIENT_IP, VIP, &payload)
}

/// A UDP frame from the client to `dst` (not the VIP) and a MAC nobody has: flooded unless
/// the operator's tables say otherwise.
fn plain(dst: Ipv4Addr) -> Vec<u8> {
    let mut f = frame_from(CLIENT_MAC, CLIENT_IP, dst, b"hello");
    f[..6].copy_from_slice(&[2, 0, 0, 0, 9, 9]);
    f
}

/// Makes interface-table entry `i` lead to `mac` behind `port`, from the VIP's MAC.
fn interface(sw: &mut Switch, i: u16, mac: Mac, port: u16) {
    sw.set_interface(
        i,
        serde_json::from_value(json!({
            "eth_dst": mac.to_string(),
            "eth_src": "02:00:00:00:00:64",
            "port": port,
        }))
        .unwrap(),
    )
    .unwrap();
}

fn send(sw: &mut Switch, mut frame: Vec<u8>) -> Fate {
    let mut emit: Vec<Emit> = Vec::new();
    sw.process(0, &mut frame, true, NOW, &mut emit)
}

fn table(def: Value) -> TableDef {
    serde_json::from_value(def).unwrap()
}

fn add(table: &str, entry: Value) -> Change {
    Change::Add {
        table: table.into(),
        entry: serde_json::from_value::<EntryDef>(entry).unwrap(),
    }
}

fn dump(sw: &Switch) -> String {
    let tables = sw.tables();
    let entries: Vec<_> = tables
        .iter()
        .map(|t| serde_json::to_value(sw.entries(&t.name).unwrap()).unwrap())
        .collect();
    let counters = serde_json::to_value(sw.counters()).unwrap();
    serde_json::to_string(&(serde_json::to_value(&tables).unwrap(), entries, counters)).unwrap()
}

/// Asserts `call` is refused with `kind` naming `field`, and that nothing changed.
fn refused(
    sw: &mut Switch,
    kind: ErrorKind,
    field: &str,
    call: impl FnOnce(&mut Switch) -> Result<(), ControlError>,
) {
    let before = dump(sw);
    let err = call(sw).expect_err("refused");
    assert_eq!((err.kind, err.field.as_str()), (kind, field), "{err}");
    assert_eq!(dump(sw), before, "a refused call changed the tables: {err}");
}

#[test]
fn exact_matching_by_destination() {
    let (mut sw, _) = rig();
    sw.create_table(table(json!({
        "name": "by_dst", "kind": "exact", "key": ["ip_dst"], "miss": ["drop"]
    })))
    .unwrap();
    sw.apply(vec![
        add(
            "acl",
            json!({"match": {"ip_dst": "10.9.0.0", "ethertype": "0x0800"},
                          "actions": [{"goto": "by_dst"}]}),
        ),
        add(
            "by_dst",
            json!({"match": {"ip_dst": "10.9.0.0"}, "actions": [{"output": 3}]}),
        ),
    ])
    .unwrap();
    assert_eq!(
        send(&mut sw, plain(Ipv4Addr::new(10, 9, 0, 0))),
        Fate::Out(3)
    );
    // The acl entry only sends 10.9.0.0 there; anything else is the program's.
    assert_eq!(
        send(&mut sw, plain(Ipv4Addr::new(10, 9, 0, 1))),
        Fate::Flood
    );
    let t = sw.table("by_dst").unwrap();
    assert_eq!((t.entries, t.hits, t.owner.as_str()), (1, 1, "operator"));
    assert_eq!(sw.entries("by_dst").unwrap()[0].hits, 1);
}

#[test]
fn the_longest_prefix_wins() {
    let (mut sw, _) = rig();
    sw.create_table(table(
        json!({"name": "routes", "kind": "lpm", "key": ["ip_dst"]}),
    ))
    .unwrap();
    sw.apply(vec![
        add(
            "acl",
            json!({"match": {"ethertype": "0x0800", "ip_dst":
            {"value": "10.9.0.0", "mask": "255.255.0.0"}}, "actions": [{"goto": "routes"}]}),
        ),
        add(
            "routes",
            json!({"match": {"ip_dst": "10.9.0.0"}, "prefix_len": 16,
                             "actions": [{"output": 1}]}),
        ),
        add(
            "routes",
            json!({"match": {"ip_dst": "10.9.8.0"}, "prefix_len": 24,
                             "actions": [{"output": 2}]}),
        ),
        add(
            "routes",
            json!({"match": {"ip_dst": "10.9.8.7"}, "prefix_len": 32,
                             "actions": [{"output": 3}]}),
        ),
    ])
    .unwrap();
    assert_eq!(
        send(&mut sw, plain(Ipv4Addr::new(10, 9, 1, 1))),
        Fate::Out(1)
    );
    assert_eq!(
        send(&mut sw, plain(Ipv4Addr::new(10, 9, 8, 1))),
        Fate::Out(2)
    );
    assert_eq!(
        send(&mut sw, plain(Ipv4Addr::new(10, 9, 8, 7))),
        Fate::Out(3)
    );
}

#[test]
fn the_highest_priority_ternary_entry_wins_then_the_oldest() {
    let (mut sw, _) = rig();
    let ids = sw
        .apply(vec![
            add(
                "acl",
                json!({"match": {"ip_dst": {"value": "10.9.0.0", "mask": "255.255.0.0"}},
                              "priority": 1, "actions": [{"output": 1}]}),
            ),
            add(
                "acl",
                json!({"match": {"ip_dst": {"value": "10.9.8.0", "mask": "255.255.255.0"}},
                              "priority": 5, "actions": [{"output": 2}]}),
            ),
            add(
                "acl",
                json!({"match": {"ip_dst": {"value": "10.9.8.0", "mask": "255.255.255.0"}},
                              "priority": 5, "actions": [{"output": 3}]}),
            ),
        ])
        .unwrap();
    assert_eq!(
        send(&mut sw, plain(Ipv4Addr::new(10, 9, 1, 1))),
        Fate::Out(1)
    );
    assert_eq!(
        send(&mut sw, plain(Ipv4Addr::new(10, 9, 8, 1))),
        Fate::Out(2)
    );
    sw.apply(vec![Change::Delete {
        table: "acl".into(),
        id: ids[1],
    }])
    .unwrap();
    assert_eq!(
        send(&mut sw, plain(Ipv4Addr::new(10, 9, 8, 1))),
        Fate::Out(3)
    );
    sw.apply(vec![Change::Modify {
        table: "acl".into(),
        id: ids[2],
        actions: serde_json::from_value(json!(["drop"])).unwrap(),
    }])
    .unwrap();
    assert_eq!(
        send(&mut sw, plain(Ipv4Addr::new(10, 9, 8, 1))),
        Fate::Consumed
    );
}

#[test]
fn a_batch_applies_whole_or_not_at_all() {
    let (mut sw, _) = rig();
    sw.create_table(table(
        json!({"name": "t", "kind": "exact", "key": ["l4_dst"]}),
    ))
    .unwrap();
    let first = sw
        .apply(vec![add(
            "t",
            json!({"match": {"l4_dst": 1}, "actions": ["flood"]}),
        )])
        .unwrap()[0];
    // Deletes, modifies and adds, then a duplicate key: all of it is taken back, the deleted
    // entry returning under its id.
    refused(
        &mut sw,
        ErrorKind::Conflict,
        "changes[3].entry.match",
        |sw| {
            sw.apply(vec![
                Change::Delete {
                    table: "t".into(),
                    id: first,
                },
                add("t", json!({"match": {"l4_dst": 2}, "actions": ["flood"]})),
                add(
                    "t",
                    json!({"match": {"l4_dst": 1}, "actions": [{"output": 2}]}),
                ),
                add("t", json!({"match": {"l4_dst": 2}, "actions": ["flood"]})),
            ])
            .map(drop)
        },
    );
    assert_eq!(sw.entries("t").unwrap()[0].id, first);
}

#[test]
fn a_full_table_refuses_more() {
    let (mut sw, _) = rig();
    sw.create_table(table(
        json!({"name": "small", "kind": "exact", "key": ["l4_dst"], "size": 2}),
    ))
    .unwrap();
    sw.apply(vec![
        add(
            "small",
            json!({"match": {"l4_dst": 1}, "actions": ["flood"]}),
        ),
        add(
            "small",
            json!({"match": {"l4_dst": 2}, "actions": ["flood"]}),
        ),
    ])
    .unwrap();
    refused(&mut sw, ErrorKind::Full, "changes[0].entry", |sw| {
        sw.apply(vec![add(
            "small",
            json!({"match": {"l4_dst": 3}, "actions": ["flood"]}),
        )])
        .map(drop)
    });
}

#[test]
fn every_refusal_names_its_field_and_changes_nothing() {
    let (mut sw, _) = rig();
    sw.create_table(table(
        json!({"name": "t", "kind": "exact", "key": ["ip_dst", "l4_dst"]}),
    ))
    .unwrap();
    let mut cases: Vec<(ErrorKind, &str, Vec<Change>)> = vec![
        (
            ErrorKind::NotFound,
            "changes[0].table",
            vec![add("nope", json!({"actions": []}))],
        ),
        // A counter named by a refused batch is not made.
        (
            ErrorKind::NotFound,
            "changes[1].table",
            vec![
                add(
                    "acl",
                    json!({"match": {"l4_dst": 9}, "actions": [{"count": "leak"}]}),
                ),
                add("nope", json!({"actions": []})),
            ],
        ),
        (
            ErrorKind::Invalid,
            "changes[0].entry.actions[1]",
            vec![add(
                "acl",
                json!({"match": {"l4_dst": 9}, "actions": [{"count": "leak"}, {"output": 99}]}),
            )],
        ),
        (
            ErrorKind::Conflict,
            "changes[0].table",
            vec![add("l2", json!({"match": {"f0": "0x01"}, "actions": []}))],
        ),
        (
            ErrorKind::Invalid,
            "changes[0].entry.match.l4_dst",
            vec![add(
                "t",
                json!({"match": {"ip_dst": "10.0.0.1", "l4_dst": 70000}, "actions": []}),
            )],
        ),
        (
            ErrorKind::Invalid,
            "changes[0].entry.match.ip_dst",
            vec![add(
                "t",
                json!({"match": {"ip_dst": "10.0.0", "l4_dst": 1}, "actions": []}),
            )],
        ),
        (
            ErrorKind::Invalid,
            "changes[0].entry.match.l4_dst",
            vec![add(
                "t",
                json!({"match": {"ip_dst": "10.0.0.1"}, "actions": []}),
            )],
        ),
        (
            ErrorKind::Invalid,
            "changes[0].entry.match.vlan",
            vec![add("t", json!({"match": {"vlan": 1}, "actions": []}))],
        ),
        (
            ErrorKind::Invalid,
            "changes[0].entry.match.ip_dst",
            vec![add(
                "t",
                json!({"match": {"ip_dst": {"value": "10.0.0.1", "mask": "0xffffffff"},
                                            "l4_dst": 1}, "actions": []}),
            )],
        ),
        (
            ErrorKind::Invalid,
            "changes[0].entry.actions[0]",
            vec![add(
                "t",
                json!({"match": {"ip_dst": "10.0.0.1", "l4_dst": 1},
                                 "actions": [{"output": 9}]}),
            )],
        ),
        (
            ErrorKind::Invalid,
            "changes[0].entry.actions[0]",
            vec![add(
                "t",
                json!({"match": {"ip_dst": "10.0.0.1", "l4_dst": 1},
                                 "actions": [{"goto": "acl"}]}),
            )],
        ),
        (
            ErrorKind::Invalid,
            "changes[0].entry.prefix_len",
            vec![add(
                "t",
                json!({"match": {"ip_dst": "10.0.0.1", "l4_dst": 1},
                                 "prefix_len": 8, "actions": []}),
            )],
        ),
        (
            ErrorKind::NotFound,
            "changes[1].id",
            vec![
                add(
                    "t",
                    json!({"match": {"ip_dst": "10.0.0.1", "l4_dst": 1}, "actions": []}),
                ),
                Change::Delete {
                    table: "t".into(),
                    id: 12345,
                },
            ],
        ),
    ];
    for (kind, field, changes) in cases.drain(..) {
        refused(&mut sw, kind, field, |sw| sw.apply(changes).map(drop));
    }
    refused(&mut sw, ErrorKind::Conflict, "name", |sw| {
        sw.create_table(table(
            json!({"name": "t", "kind": "exact", "key": ["ip_dst"]}),
        ))
        .map(drop)
    });
    refused(&mut sw, ErrorKind::Invalid, "key[1]", |sw| {
        sw.create_table(table(
            json!({"name": "u", "kind": "exact", "key": ["ip_dst", "nope"]}),
        ))
        .map(drop)
    });
    refused(&mut sw, ErrorKind::Invalid, "key[0].len", |sw| {
        sw.create_table(table(json!({"name": "u", "kind": "exact",
                                     "key": [{"name": "b", "offset": 3, "len": 0}]})))
            .map(drop)
    });
    refused(&mut sw, ErrorKind::Invalid, "name", |sw| {
        sw.create_table(table(
            json!({"name": "Bad Name", "kind": "exact", "key": ["ip_dst"]}),
        ))
        .map(drop)
    });
    refused(&mut sw, ErrorKind::Conflict, "table", |sw| {
        sw.delete_table("l2")
    });
    // A table something jumps to stays.
    sw.apply(vec![add(
        "acl",
        json!({"match": {"l4_dst": 9}, "actions": [{"goto": "t"}]}),
    )])
    .unwrap();
    refused(&mut sw, ErrorKind::Conflict, "", |sw| sw.delete_table("t"));
}

#[test]
fn an_operator_entry_ahead_of_the_program_works_at_once_and_goes_when_deleted() {
    let (mut sw, stats) = rig();
    // The program routes the key to a server.
    let Fate::Out(server_port) = send(&mut sw, get("user:1")) else {
        panic!("a get is routed");
    };
    let ids = sw
        .apply(vec![add("acl", json!({
            "match": {"ip_dst": "10.0.0.100", "l4_dst": 11211, "mc_request": {"text": "get user:"}},
            "priority": 10,
            "actions": ["drop"]
        }))])
        .unwrap();
    assert_eq!(send(&mut sw, get("user:1")), Fate::Consumed);
    assert_eq!(stats::get(&stats.drops[Drop::Operator as usize]), 1);
    // Other keys still go to their servers.
    assert!(matches!(send(&mut sw, get("item:1")), Fate::Out(_)));
    sw.apply(vec![Change::Delete {
        table: "acl".into(),
        id: ids[0],
    }])
    .unwrap();
    assert_eq!(send(&mut sw, get("user:1")), Fate::Out(server_port));

    // Mirror: forwarded as before, and a copy of the frame as it left waits for the CPU with
    // its in-port.
    sw.apply(vec![add(
        "acl",
        json!({"match": {"l4_dst": 11211}, "actions": ["mirror"]}),
    )])
    .unwrap();
    assert_eq!(send(&mut sw, get("user:1")), Fate::Out(server_port));
    let copies = sw.take_cpu(10).unwrap();
    assert_eq!(copies.len(), 1);
    assert_eq!((copies[0].in_port, copies[0].reason), (0, "mirror"));
    let copy = &copies[0].frame;
    assert_eq!(
        switch::control::unhex(&copies[0].view().frame).unwrap(),
        *copy
    );
    assert_eq!(copy.len(), get("user:1").len());
    assert!(copy.ends_with(b"get user:1\r\n"));
}

#[test]
fn an_operator_pins_a_key_to_a_server_through_an_interface() {
    let (mut sw, _) = rig();
    let Fate::Out(owner) = send(&mut sw, get("user:1")) else {
        panic!("a get is routed");
    };
    let neighbour = send(&mut sw, get("user:10"));
    assert!(matches!(neighbour, Fate::Out(_)));
    // The other server: ports 1 and 2 hold servers 0 and 1.
    let other = if owner == 1 { 1u8 } else { 0u8 };
    let other_ip = Ipv4Addr::new(10, 0, 1, other + 1);
    interface(&mut sw, 9, server_mac(other), 1 + u16::from(other));
    let ids = sw
        .apply(vec![add(
            "acl",
            json!({
                "match": {"ip_dst": VIP.to_string(), "l4_dst": 11211,
                          "mc_request": {"text": "get user:1\r\n"}},
                "priority": 10,
                "actions": [{"set_ipv4_dst": other_ip.to_string()}, {"interface": 9}]
            }),
        )])
        .unwrap();
    let mut frame = get("user:1");
    let fate = sw.process(0, &mut frame, true, NOW, &mut Vec::new());
    assert_eq!(fate, Fate::Out(1 + u16::from(other)));
    assert_eq!(&frame[0..6], &server_mac(other).0[..]);
    assert_eq!(&frame[30..34], &other_ip.octets()[..]);
    // Only that key: its neighbours keep their owners.
    assert_eq!(send(&mut sw, get("user:10")), neighbour);
    sw.apply(vec![Change::Delete {
        table: "acl".into(),
        id: ids[0],
    }])
    .unwrap();
    assert_eq!(send(&mut sw, get("user:1")), Fate::Out(owner));
    sw.delete_interface(9).unwrap();
}

#[test]
fn reads_of_a_steered_key_go_to_the_cache_node_and_nothing_else_does() {
    let (mut sw, stats) = rig();
    let Fate::Out(owner) = send(&mut sw, get("hot")) else {
        panic!("a get is routed");
    };
    // The cache node sits behind port 3.
    let cache_mac = Mac([2, 0, 0, 0, 9, 9]);
    let cache_ip = Ipv4Addr::new(10, 0, 1, 9);
    interface(&mut sw, 5, cache_mac, 3);
    let hash = HashFn::Md5.hash(b"hot");
    let ids = sw
        .apply(vec![add(
            switch::control::STEER,
            json!({
                "match": {"one_read": 1, "key_hash": hash},
                "actions": [{"set_ipv4_dst": cache_ip.to_string()}, {"interface": 5}]
            }),
        )])
        .unwrap();
    let requests = |i: u16| stats::get(&stats.backends[usize::from(i) - 1].requests);
    let before = requests(owner);
    let mut frame = get("hot");
    assert_eq!(
        sw.process(0, &mut frame, true, NOW, &mut Vec::new()),
        Fate::Out(3)
    );
    assert_eq!(&frame[0..6], &cache_mac.0[..]);
    assert_eq!(&frame[30..34], &cache_ip.octets()[..]);
    // The cache node answers it: no request of the key's server.
    assert_eq!(requests(owner), before);
    // A write of the key and a read of another key go to their owners.
    let mut payload = vec![0u8; mcudp::LEN];
    mcudp::Header::single(8).emit(&mut payload);
    payload.extend_from_slice(b"set hot 0 0 1\r\nx\r\n");
    let write = frame_from(CLIENT_MAC, CLIENT_IP, VIP, &payload);
    assert_eq!(send(&mut sw, write), Fate::Out(owner));
    assert_eq!(requests(owner), before + 1);
    assert!(matches!(send(&mut sw, get("cold")), Fate::Out(p) if p != 3));
    // Its table is the switch's: entries come and go, the table stays.
    refused(&mut sw, ErrorKind::Conflict, "table", |sw| {
        sw.delete_table(switch::control::STEER)
    });
    sw.apply(vec![Change::Delete {
        table: switch::control::STEER.into(),
        id: ids[0],
    }])
    .unwrap();
    assert_eq!(send(&mut sw, get("hot")), Fate::Out(owner));
}

/// A SwitchKV client's query for `key` of `kind` to server `server`'s address: the key's
/// hash in the destination MAC, the request in the payload.
fn encoded(kind: keymac::Kind, key: &str, server: u8, request: &str) -> Vec<u8> {
    let mut payload = vec![0u8; mcudp::LEN];
    mcudp::Header::single(7).emit(&mut payload);
    payload.extend_from_slice(request.as_bytes());
    let server_ip = Ipv4Addr::new(10, 0, 1, server + 1);
    let mut f = frame_from(CLIENT_MAC, CLIENT_IP, server_ip, &payload);
    f[..6].copy_from_slice(&keymac::encode(kind, HashFn::Md5.hash(key.as_bytes())).0);
    f
}

#[test]
fn a_switchkv_clients_queries_go_to_the_cache_node_of_their_key_or_their_backend() {
    let (mut sw, stats) = rig();
    let cache_mac = Mac([2, 0, 0, 0, 9, 9]);
    let cache_ip = Ipv4Addr::new(10, 0, 1, 9);
    interface(&mut sw, 5, cache_mac, 3);
    sw.apply(vec![add(
        switch::control::STEER,
        json!({
            "match": {"one_read": 1, "key_hash": HashFn::Md5.hash(b"hot")},
            "actions": [{"set_ipv4_dst": cache_ip.to_string()}, {"interface": 5}]
        }),
    )])
    .unwrap();
    // A read of a steered key goes to the cache node, rewritten for it.
    let mut frame = encoded(keymac::Kind::Get, "hot", 1, "get hot\r\n");
    assert_eq!(
        sw.process(0, &mut frame, true, NOW, &mut Vec::new()),
        Fate::Out(3)
    );
    assert_eq!(&frame[0..6], &cache_mac.0[..]);
    assert_eq!(&frame[30..34], &cache_ip.octets()[..]);
    // The other prefix (a write, or a read the cache node sends on) goes to the backend the
    // client named, with its MAC; so does a read of a key nobody steers.
    for (kind, key, server) in [
        (keymac::Kind::Other, "hot", 1u8),
        (keymac::Kind::Get, "cold", 1),
        (keymac::Kind::Get, "cold", 0),
    ] {
        let mut frame = encoded(kind, key, server, "get x\r\n");
        let fate = sw.process(0, &mut frame, true, NOW, &mut Vec::new());
        assert_eq!(fate, Fate::Out(1 + u16::from(server)), "{kind:?} {key}");
        assert_eq!(&frame[0..6], &server_mac(server).0[..]);
        assert_eq!(&frame[30..34], &[10, 0, 1, server + 1]);
    }
    assert_eq!(stats::get(&stats.switchkv_gets), 3);
    assert_eq!(stats::get(&stats.switchkv_others), 1);
    // A query MAC on a frame to an address that is no server's, to a server's other port, or
    // from port 0, is no query: dropped and counted, never flooded.
    let misaddressed = || stats::get(&stats.drops[Drop::SwitchkvMisaddressed as usize]);
    let mut stray = encoded(keymac::Kind::Get, "hot", 7, "get hot\r\n");
    assert_eq!(send(&mut sw, stray.clone()), Fate::Consumed);
    stray = encoded(keymac::Kind::Get, "hot", 1, "get hot\r\n");
    stray[36..38].copy_from_slice(&11212u16.to_be_bytes());
    assert_eq!(send(&mut sw, stray), Fate::Consumed);
    stray = encoded(keymac::Kind::Other, "hot", 1, "get hot\r\n");
    stray[34..36].copy_from_slice(&0u16.to_be_bytes());
    assert_eq!(send(&mut sw, stray), Fate::Consumed);
    assert_eq!(misaddressed(), 3);
    assert_eq!(stats::get(&stats.switchkv_gets), 3);
    // A read the cache node sends back to the VIP with the other prefix (a key it does not
    // hold) goes to the key's server, not to the cache node again.
    let Fate::Out(owner) = send(&mut sw, get("hot")) else {
        panic!("a get is routed");
    };
    assert_eq!(owner, 3, "a client's read of the key is steered");
    let mut back = get("hot");
    back[..6].copy_from_slice(&keymac::encode(keymac::Kind::Other, 0).0);
    let fate = sw.process(3, &mut back, true, NOW, &mut Vec::new());
    assert!(matches!(fate, Fate::Out(1 | 2)), "{fate:?}");
    assert_eq!(&back[30..34], &[10, 0, 1, 1 + (fate == Fate::Out(2)) as u8]);
}

#[test]
fn with_kvswitchs_cache_on_switchkv_queries_are_refused_and_a_read_sent_back_is_not_steered() {
    let (mut sw, stats) = rig_with(|spec| spec.cache = true);
    let mut settings = CacheSettings {
        enabled: true,
        ..Default::default()
    };
    settings.cache.items = 16;
    sw.set_cache(CacheService::new(settings, 2, NOW).unwrap())
        .unwrap();
    let cache_mac = Mac([2, 0, 0, 0, 9, 9]);
    interface(&mut sw, 5, cache_mac, 3);
    sw.apply(vec![add(
        switch::control::STEER,
        json!({
            "match": {"one_read": 1, "key_hash": HashFn::Md5.hash(b"hot")},
            "actions": [{"set_ipv4_dst": "10.0.1.9"}, {"interface": 5}]
        }),
    )])
    .unwrap();
    // The cache answers only what it parsed and sees every write it must: a SwitchKV
    // client's queries, which it would never read, are dropped and counted.
    for kind in [keymac::Kind::Get, keymac::Kind::Other] {
        assert_eq!(
            send(&mut sw, encoded(kind, "hot", 1, "get hot\r\n")),
            Fate::Consumed
        );
    }
    assert_eq!(stats::get(&stats.drops[Drop::SwitchkvCacheOn as usize]), 2);
    // A client's read of the key misses the cache and is steered to the cache node.
    assert_eq!(send(&mut sw, get("hot")), Fate::Out(3));
    // The cache node sends it back with the other prefix: to the key's server, not to the
    // cache node again (which would send it back again, and so on).
    let mut back = get("hot");
    back[..6].copy_from_slice(&keymac::encode(keymac::Kind::Other, 0).0);
    back[6..12].copy_from_slice(&cache_mac.0);
    let fate = sw.process(3, &mut back, true, NOW, &mut Vec::new());
    assert!(matches!(fate, Fate::Out(1 | 2)), "{fate:?}");
}

#[test]
fn with_the_source_check_only_a_steered_next_hop_may_send_a_read_back_in_its_clients_name() {
    let (mut sw, stats) = rig_with(|spec| {
        spec.source_check = Some(spec::SourceCheck {
            age: std::time::Duration::from_secs(60),
            table_size: 64,
            prefixes: Vec::new(),
        })
    });
    let cache_mac = Mac([2, 0, 0, 0, 9, 9]);
    // The client is learned on port 0.
    assert!(matches!(send(&mut sw, get("k")), Fate::Out(1 | 2)));
    let back = |src: Mac| {
        let mut f = get("k");
        f[..6].copy_from_slice(&keymac::encode(keymac::Kind::Other, 0).0);
        f[6..12].copy_from_slice(&src.0);
        f
    };
    let spoofed = || stats::get(&stats.drops[Drop::SourceSpoofed as usize]);
    // No next hop behind port 3 yet: the client's address from there is spoofed.
    assert_eq!(
        sw.process(3, &mut back(cache_mac), true, NOW, &mut Vec::new()),
        Fate::Consumed
    );
    assert_eq!(spoofed(), 1);
    // An interface-table entry behind port 3 that no steering entry uses is not enough.
    interface(&mut sw, 5, cache_mac, 3);
    assert_eq!(
        sw.process(3, &mut back(cache_mac), true, NOW, &mut Vec::new()),
        Fate::Consumed
    );
    assert_eq!(spoofed(), 2);
    let steer = |sw: &mut Switch, change: Change| sw.apply(vec![change]).unwrap()[0];
    let id = steer(
        &mut sw,
        add(
            switch::control::STEER,
            json!({
                "match": {"one_read": 1, "key_hash": 77},
                "actions": [{"set_ipv4_dst": "10.0.1.9"}, {"interface": 5}]
            }),
        ),
    );
    // The cache node's read sent back goes to the key's server; another MAC on its port, or
    // the client prefix, is still checked.
    let fate = sw.process(3, &mut back(cache_mac), true, NOW, &mut Vec::new());
    assert!(matches!(fate, Fate::Out(1 | 2)), "{fate:?}");
    let other = Mac([2, 0, 0, 0, 9, 8]);
    assert_eq!(
        sw.process(3, &mut back(other), true, NOW, &mut Vec::new()),
        Fate::Consumed
    );
    let mut get_prefix = back(cache_mac);
    get_prefix[..6].copy_from_slice(&keymac::encode(keymac::Kind::Get, 0).0);
    assert_eq!(
        sw.process(3, &mut get_prefix, true, NOW, &mut Vec::new()),
        Fate::Consumed
    );
    assert_eq!(spoofed(), 4);
    // The client's address was not learned on port 3: it still sends from port 0.
    assert!(matches!(send(&mut sw, get("k")), Fate::Out(1 | 2)));
    assert_eq!(spoofed(), 4);
    // Once no steering entry leads there, the exemption ends.
    steer(
        &mut sw,
        Change::Delete {
            table: switch::control::STEER.into(),
            id,
        },
    );
    assert_eq!(
        sw.process(3, &mut back(cache_mac), true, NOW, &mut Vec::new()),
        Fate::Consumed
    );
    assert_eq!(spoofed(), 5);
}

#[test]
fn a_frame_goes_out_of_the_port_it_is_sent_to() {
    let (mut sw, _) = rig();
    let mut emit = Vec::new();
    sw.send_frame(2, plain(Ipv4Addr::new(10, 9, 9, 9)), &mut emit)
        .unwrap();
    assert_eq!(emit.len(), 1);
    assert_eq!(emit[0].dest, switch::Dest::Port(2));
    assert!(sw.send_frame(4, plain(VIP), &mut emit).is_err());
    assert!(sw.send_frame(0, vec![0; 5], &mut emit).is_err());
    assert_eq!(emit.len(), 1);
}

#[test]
fn the_program_tables_are_listed_read_only() {
    let (sw, _) = rig();
    let tables = sw.tables();
    let names: Vec<&str> = tables.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "acl",
            "kv_steer",
            "kv_backend",
            "arp_vip",
            "kv_route",
            "local_in",
            "vip_reply",
            "l2"
        ]
    );
    // `acl` and `kv_steer` take the operator's entries; the program's own tables do not.
    assert!(tables[0].writable && tables[1].writable);
    assert!(tables[2..].iter().all(|t| !t.writable));
    // One `kv_backend` entry per server.
    assert_eq!(sw.entries("kv_backend").unwrap().len(), 2);
    let route = sw.entries("kv_route").unwrap();
    assert_eq!(route.len(), 1);
    assert_eq!(
        serde_json::to_value(&route[0].actions).unwrap(),
        json!([{"program": "select a server on the ring"}])
    );
}

#[test]
fn labels_pushed_swapped_and_popped_through_the_api_leave_as_the_switchs_own_frames() {
    // Three switches in a line, each written through the control calls alone: the first
    // pushes the route [7, 9] (7 on top) onto traffic for 10.9.0.0/16 and sends it by its top
    // label; the second swaps 9 for 11; the last pops both labels and delivers the frame.
    let (mut ingress, _) = rig();
    let (mut middle, _) = rig();
    let (mut egress, egress_stats) = rig();
    let labels = |sw: &mut Switch, routes: Value| {
        sw.create_table(table(
            json!({"name": "labels", "kind": "ternary", "key": ["mpls"]}),
        ))
        .unwrap();
        let mut changes = vec![add(
            "acl",
            json!({"match": {"ethertype": "0x8847"}, "actions": [{"goto": "labels"}]}),
        )];
        for (label, actions) in routes.as_object().unwrap() {
            let label: u32 = label.parse().unwrap();
            changes.push(add(
                "labels",
                json!({"match": {"mpls": {"value": label << 12, "mask": "0xfffff000"}},
                       "actions": actions}),
            ));
        }
        sw.apply(changes).unwrap();
    };
    labels(
        &mut ingress,
        json!({"7": [{"pop_label": null}, {"output": 3}]}),
    );
    ingress
        .apply(vec![add(
            "acl",
            json!({"match": {"ip_dst": {"value": "10.9.0.0", "mask": "255.255.0.0"}},
                   "priority": 5,
                   "actions": [{"push_label": 9}, {"push_label": 7}, {"goto": "labels"}]}),
        )])
        .unwrap();
    labels(
        &mut middle,
        json!({"9": [{"swap_label": 11}, {"output": 2}]}),
    );
    labels(&mut egress, json!({"11": ["pop_label", {"output": 1}]}));

    let original = plain(Ipv4Addr::new(10, 9, 1, 1));
    let mut frame = original.clone();
    let mut path = Vec::new();
    for (name, sw) in [
        ("ingress", &mut ingress),
        ("middle", &mut middle),
        ("egress", &mut egress),
    ] {
        let mut emit = Vec::new();
        let fate = sw.process(0, &mut frame, true, NOW, &mut emit);
        match (fate, emit.as_slice()) {
            // The middle switch rewrites in place; the others change the length.
            (Fate::Out(p), []) => path.push(p),
            (
                Fate::Consumed,
                [Emit {
                    dest: switch::Dest::Port(p),
                    frame: f,
                }],
            ) => {
                path.push(*p);
                frame = f.clone();
            }
            other => panic!("{name}: {other:?}"),
        }
        if name != "egress" {
            assert_eq!(&frame[12..14], &[0x88, 0x47], "{name} leaves it labelled");
        }
    }
    assert_eq!(path, [3, 2, 1]);
    assert_eq!(frame, original, "it leaves unlabelled, as it came in");

    // A pop on a frame with no label is a counted drop.
    egress
        .apply(vec![add(
            "acl",
            json!({"match": {"ip_dst": "10.8.0.1"}, "priority": 9,
                   "actions": ["pop_label", {"output": 1}]}),
        )])
        .unwrap();
    assert_eq!(
        send(&mut egress, plain(Ipv4Addr::new(10, 8, 0, 1))),
        Fate::Consumed
    );
    assert_eq!(stats::get(&egress_stats.drops[Drop::Label as usize]), 1);

    // The entries read back as they were written.
    let listed = serde_json::to_value(ingress.entries("acl").unwrap()).unwrap();
    let pushes: Vec<&Value> = listed
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|e| e["actions"].as_array().unwrap())
        .filter(|a| a.get("push_label").is_some())
        .collect();
    assert_eq!(
        pushes,
        [&json!({"push_label": 9}), &json!({"push_label": 7})]
    );
    // A label takes 20 bits.
    refused(
        &mut middle,
        ErrorKind::Invalid,
        "changes[0].entry.actions[0]",
        |sw| {
            sw.apply(vec![add(
                "labels",
                json!({"match": {"mpls": 0}, "actions": [{"swap_label": 1 << 20}]}),
            )])
            .map(|_| ())
        },
    );
}

#[test]
fn a_byte_range_keeps_the_name_it_was_given_even_where_a_named_field_lies() {
    let (mut sw, _) = rig();
    // The ToS byte is also the named field `ip_tos`; the table calls it `tos`.
    sw.create_table(table(json!({"name": "t", "kind": "ternary",
                                 "key": ["ip_dst", {"name": "tos", "offset": 15, "len": 1}]})))
        .unwrap();
    sw.apply(vec![add(
        "t",
        json!({"match": {"tos": {"value": 8, "mask": "0xfc"}}, "actions": [{"output": 2}]}),
    )])
    .unwrap();
    let listed = serde_json::to_value(sw.table("t").unwrap()).unwrap();
    assert_eq!(listed["key"][1]["name"], "tos", "{listed}");
    let entries = serde_json::to_value(sw.entries("t").unwrap()).unwrap();
    assert!(entries[0]["match"].get("tos").is_some(), "{entries}");
}

/// `frame` with `shim` put in after the Ethernet addresses under `ethertype`: VLAN tags (each
/// tag's TCI, then the next tag's ethertype; the last tag's is the frame's own), or an MPLS
/// label stack, which replaces the IPv4 ethertype the labels' payload no longer carries.
fn tagged(frame: &[u8], ethertype: u16, shim: &[u8]) -> Vec<u8> {
    let mut out = frame[..12].to_vec();
    out.extend(ethertype.to_be_bytes());
    out.extend(shim);
    let rest = if ethertype == 0x8847 { 14 } else { 12 };
    out.extend(&frame[rest..]);
    out
}

/// An MPLS label stack entry: label 100 + `i`, the bottom-of-stack bit when `bottom`, TTL 64.
fn label(i: u32, bottom: bool) -> [u8; 4] {
    (((100 + i) << 12) | (u32::from(bottom) << 8) | 64).to_be_bytes()
}

#[test]
fn with_the_source_check_an_address_behind_vlan_tags_or_mpls_labels_is_checked_too() {
    let (mut sw, stats) = rig_with(|spec| {
        spec.source_check = Some(spec::SourceCheck {
            age: std::time::Duration::from_secs(60),
            table_size: 64,
            prefixes: Vec::new(),
        })
    });
    let spoofed = || stats::get(&stats.drops[Drop::SourceSpoofed as usize]);
    let from = |sw: &mut Switch, port: u16, mut frame: Vec<u8>| {
        sw.process(port, &mut frame, true, NOW, &mut Vec::new())
    };
    // The client is learned on port 0.
    assert!(matches!(send(&mut sw, get("k")), Fate::Out(1 | 2)));
    let plain = get("k");
    let one_tag = tagged(&plain, 0x8100, &[0, 5]);
    let two_tags = tagged(&plain, 0x88a8, &[0, 7, 0x81, 0x00, 0, 5]);
    let one_label = tagged(&plain, 0x8847, &label(0, true));
    let three_labels = tagged(
        &plain,
        0x8847,
        &[label(0, false), label(1, false), label(2, true)].concat(),
    );
    let in_disguise = [one_tag, two_tags, one_label, three_labels];
    // From another port, the client's address is refused however it is wrapped.
    for (i, frame) in in_disguise.iter().enumerate() {
        assert_eq!(from(&mut sw, 3, frame.clone()), Fate::Consumed, "frame {i}");
        assert_eq!(spoofed(), i as u64 + 1, "frame {i}");
    }
    // From its own port it is no forgery.
    for frame in &in_disguise {
        from(&mut sw, 0, frame.clone());
    }
    assert_eq!(spoofed(), 4);
    // A new address first seen behind a label is bound to that port like any other.
    let stranger = frame_from(CLIENT_MAC, Ipv4Addr::new(10, 0, 0, 7), VIP, b"x");
    from(&mut sw, 3, tagged(&stranger, 0x8847, &label(0, true)));
    assert_eq!(spoofed(), 4);
    assert_eq!(from(&mut sw, 0, stranger), Fate::Consumed);
    assert_eq!(spoofed(), 5);
    // A label stack that never ends carries no address to check; it is not counted as one.
    let endless = tagged(&plain, 0x8847, &[label(0, false), label(1, false)].concat());
    from(&mut sw, 3, endless);
    assert_eq!(spoofed(), 5);
}

#[test]
fn a_counter_is_deleted_once_nothing_feeds_it_and_comes_back_from_zero() {
    let (mut sw, _) = rig();
    sw.create_table(table(
        json!({"name": "t", "kind": "exact", "key": ["l4_dst"]}),
    ))
    .unwrap();
    let entry = json!({"match": {"l4_dst": 40000}, "actions": [{"count": "seen"}, "flood"]});
    let id = sw.apply(vec![add("t", entry.clone())]).unwrap()[0];
    let counted = |sw: &Switch| {
        sw.counters()
            .iter()
            .map(|c| (c.name.clone(), c.packets))
            .collect::<Vec<_>>()
    };
    let missing = sw.delete_counter("nope").unwrap_err();
    assert_eq!(missing.kind, ErrorKind::NotFound, "{missing:?}");
    let busy = sw.delete_counter("seen").unwrap_err();
    assert_eq!(busy.kind, ErrorKind::Conflict, "{busy:?}");
    assert!(busy.error.contains("fed by a count action"), "{busy:?}");
    sw.apply(vec![Change::Delete {
        table: "t".into(),
        id,
    }])
    .unwrap();
    sw.delete_counter("seen").unwrap();
    assert_eq!(counted(&sw), []);
    assert_eq!(
        sw.delete_counter("seen").unwrap_err().kind,
        ErrorKind::NotFound
    );
    // Named again, it counts from zero.
    sw.apply(vec![add("t", entry)]).unwrap();
    assert_eq!(counted(&sw), [("seen".to_string(), 0)]);
}

/// `n` gets of distinct keys from the client through the switch at `now`, with the frames the
/// switch sent (the frames it forwards in place are copied out, in order).
fn gets_through(sw: &mut Switch, n: usize, now: Instant) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for i in 0..n {
        let mut frame = get(&format!("k:{i}"));
        let mut emit = Vec::new();
        if let Fate::Out(_) = sw.process(0, &mut frame, true, now, &mut emit) {
            out.push(frame);
        }
        out.extend(emit.into_iter().map(|e| e.frame));
    }
    out
}

#[test]
fn an_impair_action_drops_duplicates_and_delays_as_its_seed_draws() {
    let impaired = |actions: Value| {
        let (mut sw, stats) = rig();
        sw.apply(vec![add(
            "acl",
            json!({"match": {"ip_dst": "10.0.0.100", "l4_dst": 11211}, "actions": actions}),
        )])
        .unwrap();
        (sw, stats)
    };
    // A third dropped, a tenth sent twice, of 3,000 reads.
    let (mut sw, stats) = impaired(json!([
        {"impair": {"drop_ppm": 333_333, "duplicate_ppm": 100_000}}, {"output": 3}
    ]));
    let sent = gets_through(&mut sw, 3000, NOW);
    let dropped = stats::get(&stats.drops[Drop::Impaired as usize]);
    let twice = stats::get(&stats.impaired_duplicated);
    assert!((850..1150).contains(&dropped), "{dropped} dropped");
    assert!((200..400).contains(&twice), "{twice} twice");
    assert_eq!(sent.len() as u64, 3000 - dropped + twice);
    // The same seed draws the same again.
    let (mut again, stats_again) = impaired(json!([
        {"impair": {"drop_ppm": 333_333, "duplicate_ppm": 100_000}}, {"output": 3}
    ]));
    assert_eq!(gets_through(&mut again, 3000, NOW), sent);
    assert_eq!(
        stats::get(&stats_again.drops[Drop::Impaired as usize]),
        dropped
    );

    // Delayed: nothing leaves until the delay has passed, then everything in its order; a
    // share reordered leaves later than the frames behind it.
    let (mut sw, stats) = impaired(json!([
        {"impair": {"delay_us": 500, "reorder_ppm": 200_000, "reorder_us": 1000}},
        {"output": 3}
    ]));
    assert!(gets_through(&mut sw, 100, NOW).is_empty());
    assert_eq!(stats::get(&stats.impaired_held), 100);
    let mut emit = Vec::new();
    sw.tick(NOW + std::time::Duration::from_micros(500), &mut emit);
    let first = emit.len();
    assert!((65..95).contains(&first), "{first} on time");
    sw.tick(NOW + std::time::Duration::from_micros(1500), &mut emit);
    assert_eq!(emit.len(), 100);
    assert_eq!(stats::get(&stats.impaired_held), 0);
    // The held-back frames are of keys sent before some that left at once.
    let key_of = |f: &[u8]| -> usize {
        let text = String::from_utf8_lossy(f);
        let at = text.rfind("k:").expect("a key");
        text[at + 2..].trim_end().parse().expect("the key's number")
    };
    let on_time: Vec<usize> = emit[..first].iter().map(|e| key_of(&e.frame)).collect();
    let late: Vec<usize> = emit[first..].iter().map(|e| key_of(&e.frame)).collect();
    assert!(on_time.windows(2).all(|w| w[0] < w[1]), "{on_time:?}");
    assert!(late.windows(2).all(|w| w[0] < w[1]), "{late:?}");
    assert!(late.iter().any(|k| k < on_time.last().unwrap()), "{late:?}");
    let mut all: Vec<usize> = on_time.iter().chain(&late).copied().collect();
    all.sort_unstable();
    assert_eq!(all, (0..100).collect::<Vec<_>>(), "every frame once");

    // The entry reads back as written, and a bad one is refused with its reason.
    let entries = serde_json::to_value(sw.entries("acl").unwrap()).unwrap();
    assert!(
        entries.to_string().contains("\"reorder_us\":1000"),
        "{entries}"
    );
    for (bad, says) in [
        (
            json!({"drop_ppm": 600_000, "duplicate_ppm": 500_000}),
            "a million",
        ),
        (json!({"delay_us": 2_000_000}), "a second"),
        (json!({"reorder_ppm": 10}), "reorder_us"),
    ] {
        let e = sw
            .apply(vec![add(
                "acl",
                json!({"match": {"l4_dst": 9}, "actions": [{"impair": bad}, "flood"]}),
            )])
            .unwrap_err();
        assert!(e.to_string().contains(says), "{e}");
    }

    // Profiles are bounded while entries name them, and freed once none does.
    let (mut sw, _) = rig();
    let entry = |delay: u32| {
        add(
            "acl",
            json!({"match": {"l4_dst": 9}, "priority": delay,
                   "actions": [{"impair": {"delay_us": delay}}, "flood"]}),
        )
    };
    let ids: Vec<u64> = (1..=256)
        .map(|d| sw.apply(vec![entry(d)]).unwrap()[0])
        .collect();
    let e = sw.apply(vec![entry(999)]).unwrap_err();
    assert!(e.to_string().contains("256"), "{e}");
    sw.apply(
        ids.iter()
            .map(|&id| Change::Delete {
                table: "acl".into(),
                id,
            })
            .collect(),
    )
    .unwrap();
    sw.apply(vec![entry(999)])
        .expect("a profile once the others are gone");
}

#[test]
fn a_multicast_entry_sends_a_copy_to_each_member_and_follows_its_group() {
    let (mut sw, stats) = rig();
    interface(&mut sw, 4, Mac([2, 0, 0, 0, 7, 7]), 2);
    let group = |members: Value| serde_json::from_value(json!({ "members": members })).unwrap();
    // An entry may not name a group that is not there, nor a group a port or an
    // interface that is not.
    refused(
        &mut sw,
        ErrorKind::Invalid,
        "changes[0].entry.actions[0]",
        |sw| {
            sw.apply(vec![add(
                "acl",
                json!({"match": {"ip_dst": "10.9.9.9"}, "actions": [{"multicast": 1}]}),
            )])
            .map(drop)
        },
    );
    for (members, why) in [
        (json!([]), "1 to 64 members"),
        (json!([{"port": 4}]), "port 4 does not exist"),
        (json!([{"interface": 5}]), "no interface 5"),
    ] {
        let err = sw.set_group(1, group(members)).expect_err(why);
        assert_eq!(err.kind, ErrorKind::Invalid, "{err}");
        assert!(err.to_string().contains(why), "{err}");
    }
    assert!(sw.groups().is_empty());
    // Ports 0 (the ingress: no copy), 1 and 3 as the frame is; interface 4 with its MACs.
    sw.set_group(
        1,
        group(json!([{"port": 0}, {"port": 1}, {"interface": 4}, {"port": 3}])),
    )
    .unwrap();
    sw.apply(vec![add(
        "acl",
        json!({"match": {"ip_dst": "10.9.9.9"}, "actions": [{"multicast": 1}]}),
    )])
    .unwrap();
    assert_eq!(sw.groups()[0].used_by, 1);
    let frame = plain(Ipv4Addr::new(10, 9, 9, 9));
    let mut emit: Vec<Emit> = Vec::new();
    let fate = sw.process(0, &mut frame.clone(), true, NOW, &mut emit);
    assert_eq!(fate, Fate::Consumed);
    let sent: Vec<(switch::Dest, Vec<u8>)> = emit.into_iter().map(|e| (e.dest, e.frame)).collect();
    let mut through_interface = frame.clone();
    through_interface[..6].copy_from_slice(&[2, 0, 0, 0, 7, 7]);
    through_interface[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 0x64]);
    assert_eq!(
        sent,
        vec![
            (switch::Dest::Port(1), frame.clone()),
            (switch::Dest::Port(2), through_interface),
            (switch::Dest::Port(3), frame.clone()),
        ]
    );
    assert_eq!(stats::get(&stats.multicast), 1);
    assert_eq!(stats::get(&stats.multicast_copies), 3);
    // Each member once.
    let err = sw
        .set_group(2, group(json!([{"port": 1}, {"port": 1}])))
        .expect_err("a member twice");
    assert!(err.to_string().contains("port 1 is named twice"), "{err}");
    // The interface counts the group among its users.
    let it = sw.interfaces().into_iter().find(|i| i.id == 4).unwrap();
    assert_eq!(it.used_by, 1);
    // A change of the group changes what the entry does from the next frame on.
    sw.set_group(1, group(json!([{"port": 2}]))).unwrap();
    let mut emit: Vec<Emit> = Vec::new();
    sw.process(0, &mut frame.clone(), true, NOW, &mut emit);
    let ports: Vec<switch::Dest> = emit.iter().map(|e| e.dest).collect();
    assert_eq!(ports, vec![switch::Dest::Port(2)]);
    // A group whose only member is the ingress port makes no copy: dropped, counted.
    sw.set_group(1, group(json!([{"port": 0}]))).unwrap();
    let same_port = stats::get(&stats.drops[Drop::SamePort as usize]);
    let mut emit: Vec<Emit> = Vec::new();
    sw.process(0, &mut frame.clone(), true, NOW, &mut emit);
    assert!(emit.is_empty());
    assert_eq!(
        stats::get(&stats.drops[Drop::SamePort as usize]),
        same_port + 1
    );
    assert_eq!(stats::get(&stats.multicast), 2, "not counted as copied");
    // An impairment in the entry's actions acts on each copy: dropping all, none leaves.
    sw.set_group(1, group(json!([{"port": 1}, {"port": 2}])))
        .unwrap();
    let impaired = sw
        .apply(vec![add(
            "acl",
            json!({"match": {"ip_dst": "10.9.9.9"}, "priority": 5,
                   "actions": [{"impair": {"drop_ppm": 1_000_000}}, {"multicast": 1}]}),
        )])
        .unwrap();
    let mut emit: Vec<Emit> = Vec::new();
    sw.process(0, &mut frame.clone(), true, NOW, &mut emit);
    assert!(emit.is_empty(), "every copy dropped: {:?}", emit.len());
    assert_eq!(stats::get(&stats.drops[Drop::Impaired as usize]), 2);
    sw.apply(vec![Change::Delete {
        table: "acl".into(),
        id: impaired[0],
    }])
    .unwrap();
    // A frame that grew (an MPLS label pushed) is copied as it leaves the pipeline.
    let pushed = sw
        .apply(vec![add(
            "acl",
            json!({"match": {"ip_dst": "10.9.9.9"}, "priority": 5,
                   "actions": [{"push_label": 7}, {"multicast": 1}]}),
        )])
        .unwrap();
    let mut emit: Vec<Emit> = Vec::new();
    sw.process(0, &mut frame.clone(), true, NOW, &mut emit);
    assert_eq!(emit.len(), 2);
    for e in &emit {
        assert_eq!(e.frame.len(), frame.len() + 4, "the label's 4 bytes");
        assert_eq!(&e.frame[12..14], &[0x88, 0x47]);
    }
    sw.apply(vec![Change::Delete {
        table: "acl".into(),
        id: pushed[0],
    }])
    .unwrap();
    // Neither the group nor the interface it named goes while named.
    sw.set_group(1, group(json!([{"interface": 4}]))).unwrap();
    let err = sw.delete_group(1).expect_err("named by the entry");
    assert_eq!(err.kind, ErrorKind::Conflict, "{err}");
    let err = sw.delete_interface(4).expect_err("named by the group");
    assert_eq!(err.kind, ErrorKind::Conflict, "{err}");
    assert!(err.to_string().contains("multicast group 1"), "{err}");
    // The entry is described as it was written.
    let entries = serde_json::to_value(sw.entries("acl").unwrap()).unwrap();
    assert!(
        entries.to_string().contains(r#"{"multicast":1}"#),
        "{entries}"
    );
    let id = sw.entries("acl").unwrap()[0].id;
    sw.apply(vec![Change::Delete {
        table: "acl".into(),
        id,
    }])
    .unwrap();
    sw.delete_group(1).unwrap();
    assert_eq!(
        sw.delete_group(1).expect_err("gone").kind,
        ErrorKind::NotFound
    );
    sw.delete_interface(4).unwrap();
}
