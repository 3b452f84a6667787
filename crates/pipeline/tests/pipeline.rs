//! Table-driven pipeline tests: each case names a pipeline, an input frame, metadata, the
//! expected verdict and the expected output bytes.

mod common;

use common::*;
use pipeline::reason::{self, USER_BASE};
use pipeline::{
    Action, Choose, Entry, Error, Field, Interface, MatchKind, Member, Meta, Pipeline, TableId,
    TableSpec, Verdict, MAX_GROUPS, MAX_GROUP_MEMBERS, MAX_INTERFACES, MAX_TABLES, MAX_TABLE_IDS,
    NUM_REGS, NUM_USER_REGS,
};

const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];
/// The switch's own MAC, answering for the virtual IP.
const VIP_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xfe];
const VIP: [u8; 4] = [10, 0, 0, 100];
const BACKENDS: [([u8; 6], [u8; 4], u16); 2] = [
    ([0x02, 0, 0, 0, 1, 0], [10, 0, 1, 1], 10),
    ([0x02, 0, 0, 0, 2, 0], [10, 0, 1, 2], 11),
];
const NO_ROUTE: u16 = USER_BASE + 1;
const ARP_FOR_VIP: u16 = USER_BASE + 2;

/// Picks `key_hash % n`: a stand-in for a ketama ring.
struct Modulo(usize);
impl Choose for Modulo {
    fn choose(&self, key_hash: u32) -> Option<usize> {
        (self.0 != 0).then(|| key_hash as usize % self.0)
    }
}

/// Always picks the same index, valid or not.
struct Fixed(usize);
impl Choose for Fixed {
    fn choose(&self, _: u32) -> Option<usize> {
        Some(self.0)
    }
}

fn exact(name: &str, key: Vec<Field>, miss: Vec<Action>) -> TableSpec {
    TableSpec {
        name: name.into(),
        kind: MatchKind::Exact,
        key,
        miss,
    }
}

fn bytes(offset: u16, len: u8) -> Field {
    Field::Bytes { offset, len }
}

/// The memcached lookup key: ethertype, IP protocol, destination IP, UDP destination port.
fn mc_key() -> Vec<Field> {
    vec![bytes(12, 2), bytes(23, 1), bytes(30, 4), bytes(36, 2)]
}

fn mc_key_bytes(dst: [u8; 4], port: u16) -> Vec<u8> {
    let mut k = vec![0x08, 0x00, PROTO_UDP];
    k.extend_from_slice(&dst);
    k.extend_from_slice(&port.to_be_bytes());
    k
}

/// The switch as the daemon would program it: L2 forwarding on the destination MAC, frames to
/// the switch's own MAC go to the memcached router, which picks a backend by key hash.
fn switch_with(chooser: Box<dyn Choose>) -> Pipeline {
    let mut p = Pipeline::new();
    let l2 = p
        .add_table(exact("l2", vec![bytes(0, 6)], vec![Action::Flood]))
        .unwrap();
    let mc = TableId(1);
    p.insert(l2, Entry::exact(MAC_A, vec![Action::Output(1)]))
        .unwrap();
    p.insert(l2, Entry::exact(MAC_B, vec![Action::Output(2)]))
        .unwrap();
    p.insert(l2, Entry::exact(VIP_MAC, vec![Action::Goto(mc)]))
        .unwrap();
    let members = BACKENDS
        .iter()
        .map(|(mac, ip, port)| {
            vec![
                Action::SetEthSrc(VIP_MAC),
                Action::SetEthDst(*mac),
                Action::SetIpv4Dst(*ip),
                Action::Output(*port),
            ]
        })
        .collect();
    let sel = p.add_selector(members, chooser).unwrap();
    let c = p.add_counter("mc_requests");
    assert_eq!(
        p.add_table(exact("mc", mc_key(), vec![Action::Drop(NO_ROUTE)]))
            .unwrap(),
        mc
    );
    p.insert(
        mc,
        Entry::exact(
            mc_key_bytes(VIP, 11211),
            vec![Action::Count(c), Action::Select(sel)],
        ),
    )
    .unwrap();
    p
}

fn switch() -> Pipeline {
    switch_with(Box::new(Modulo(BACKENDS.len())))
}

/// Answers ARP requests for the virtual IP by sending them to the CPU.
fn arp() -> Pipeline {
    let mut p = Pipeline::new();
    let t = p
        .add_table(exact(
            "arp",
            vec![bytes(12, 2), bytes(20, 2), bytes(38, 4)],
            vec![Action::Flood],
        ))
        .unwrap();
    let mut key = vec![0x08, 0x06, 0, 1];
    key.extend_from_slice(&VIP);
    p.insert(t, Entry::exact(key, vec![Action::ToCpu(ARP_FOR_VIP)]))
        .unwrap();
    p
}

/// Routes by destination IP, longest prefix first.
fn lpm() -> Pipeline {
    let mut p = Pipeline::new();
    let t = p
        .add_table(TableSpec {
            name: "routes".into(),
            kind: MatchKind::Lpm,
            key: vec![bytes(30, 4)],
            miss: vec![Action::Drop(NO_ROUTE)],
        })
        .unwrap();
    for (ip, len, port) in [
        ([10, 0, 0, 0], 8, 1),
        ([10, 1, 0, 0], 16, 2),
        ([10, 1, 2, 3], 32, 3),
        ([0, 0, 0, 0], 0, 9),
    ] {
        p.insert(t, Entry::lpm(ip, len, vec![Action::Output(port)]))
            .unwrap();
    }
    p
}

/// Classifies on (IP protocol, destination port) by priority.
fn acl() -> Pipeline {
    let mut p = Pipeline::new();
    let t = p
        .add_table(TableSpec {
            name: "acl".into(),
            kind: MatchKind::Ternary,
            key: vec![bytes(23, 1), bytes(36, 2)],
            miss: vec![],
        })
        .unwrap();
    // Inserted lowest priority first so order of insertion cannot explain the result.
    p.insert(
        t,
        Entry::ternary([0, 0, 0], [0, 0, 0], 5, vec![Action::Output(3)]),
    )
    .unwrap();
    p.insert(
        t,
        Entry::ternary([17, 0, 0], [0xff, 0, 0], 10, vec![Action::Output(1)]),
    )
    .unwrap();
    p.insert(
        t,
        Entry::ternary([17, 0x2b, 0xcb], [0xff; 3], 20, vec![Action::Output(2)]),
    )
    .unwrap();
    p
}

/// Two tables chained by metadata: table 0 tags the frame with its ingress port in a register,
/// table 1 matches on the register and TTL handling.
fn chained() -> Pipeline {
    let mut p = Pipeline::new();
    let t0 = p
        .add_table(exact(
            "tag",
            vec![Field::InPort],
            vec![Action::Output(1), Action::Goto(TableId(1))],
        ))
        .unwrap();
    p.insert(
        t0,
        Entry::exact(
            7u16.to_be_bytes(),
            vec![Action::SetReg(2, 0xbeef), Action::Goto(TableId(1))],
        ),
    )
    .unwrap();
    let t1 = p
        .add_table(exact("by_reg", vec![Field::Reg(2)], vec![]))
        .unwrap();
    p.insert(
        t1,
        Entry::exact(
            0xbeefu32.to_be_bytes(),
            vec![
                Action::DecTtl,
                Action::SetIpv4Src([192, 0, 2, 1]),
                Action::Output(4),
            ],
        ),
    )
    .unwrap();
    p
}

/// Selector members that go nowhere sensible.
fn bad_selector_goto() -> Pipeline {
    let mut p = Pipeline::new();
    let back = p
        .add_selector(vec![vec![Action::Goto(TableId(0))]], Box::new(Fixed(0)))
        .unwrap();
    let t = p
        .add_table(exact("t", vec![Field::KeyHash], vec![Action::Select(back)]))
        .unwrap();
    let missing = p
        .add_selector(vec![vec![Action::Goto(TableId(9))]], Box::new(Fixed(0)))
        .unwrap();
    p.insert(
        t,
        Entry::exact(1u32.to_be_bytes(), vec![Action::Select(missing)]),
    )
    .unwrap();
    p
}

struct Case {
    desc: &'static str,
    pipeline: fn() -> Pipeline,
    frame: fn() -> Vec<u8>,
    meta: Meta,
    verdict: Verdict,
    /// Expected frame after processing; `None` means unchanged.
    output: Option<fn() -> Vec<u8>>,
}

fn meta(in_port: u16, key_hash: u32) -> Meta {
    Meta {
        in_port,
        key_hash,
        ..Meta::default()
    }
}

fn to_a() -> Vec<u8> {
    Ipv4Frame {
        dst_mac: MAC_A,
        ..client()
    }
    .build()
}

fn backend_frame(i: usize, udp_checksum: bool) -> Vec<u8> {
    let (mac, ip, _) = BACKENDS[i];
    Ipv4Frame {
        dst_mac: mac,
        src_mac: VIP_MAC,
        dst_ip: ip,
        udp_checksum,
        ..client()
    }
    .build()
}

fn to_ip(ip: [u8; 4]) -> Vec<u8> {
    Ipv4Frame {
        dst_ip: ip,
        ..client()
    }
    .build()
}

fn to_port(proto: u8, dport: u16) -> Vec<u8> {
    Ipv4Frame {
        proto,
        dport,
        ..client()
    }
    .build()
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            desc: "l2: known destination MAC is forwarded unchanged",
            pipeline: switch,
            frame: to_a,
            meta: meta(3, 0),
            verdict: Verdict::Output(1),
            output: None,
        },
        Case {
            desc: "l2: unknown destination MAC floods",
            pipeline: switch,
            frame: || {
                Ipv4Frame {
                    dst_mac: [0x02, 9, 9, 9, 9, 9],
                    ..client()
                }
                .build()
            },
            meta: meta(3, 0),
            verdict: Verdict::Flood,
            output: None,
        },
        Case {
            desc: "l2: a runt frame misses and floods",
            pipeline: switch,
            frame: || MAC_A[..5].to_vec(),
            meta: meta(3, 0),
            verdict: Verdict::Flood,
            output: None,
        },
        Case {
            desc: "mc: request to the VIP goes to backend 0 with MACs, IP and checksums rewritten",
            pipeline: switch,
            frame: || client().build(),
            meta: meta(3, 0x1000),
            verdict: Verdict::Output(10),
            output: Some(|| backend_frame(0, true)),
        },
        Case {
            desc: "mc: another key hash goes to backend 1",
            pipeline: switch,
            frame: || client().build(),
            meta: meta(3, 0x1001),
            verdict: Verdict::Output(11),
            output: Some(|| backend_frame(1, true)),
        },
        Case {
            desc: "mc: a UDP checksum of 0 stays 0 after the rewrite",
            pipeline: switch,
            frame: || {
                Ipv4Frame {
                    udp_checksum: false,
                    ..client()
                }
                .build()
            },
            meta: meta(3, 0),
            verdict: Verdict::Output(10),
            output: Some(|| backend_frame(0, false)),
        },
        Case {
            desc: "mc: other UDP port on the VIP takes the miss",
            pipeline: switch,
            frame: || to_port(PROTO_UDP, 53),
            meta: meta(3, 0),
            verdict: Verdict::Drop(NO_ROUTE),
            output: None,
        },
        Case {
            desc: "mc: frame cut before the UDP port reads as absent and misses",
            pipeline: switch,
            frame: || client().build()[..36].to_vec(),
            meta: meta(3, 0),
            verdict: Verdict::Drop(NO_ROUTE),
            output: None,
        },
        Case {
            desc: "mc: chooser with no members drops with a pipeline reason",
            pipeline: || switch_with(Box::new(Modulo(0))),
            frame: || client().build(),
            meta: meta(3, 0),
            verdict: Verdict::Drop(reason::NO_SELECTOR_MEMBER),
            output: None,
        },
        Case {
            desc: "mc: chooser index past the members drops",
            pipeline: || switch_with(Box::new(Fixed(5))),
            frame: || client().build(),
            meta: meta(3, 0),
            verdict: Verdict::Drop(reason::SELECTOR_OUT_OF_RANGE),
            output: None,
        },
        Case {
            desc: "arp: request for the VIP goes to the CPU",
            pipeline: arp,
            frame: || arp_request(MAC_A, [10, 0, 0, 1], VIP),
            meta: meta(1, 0),
            verdict: Verdict::ToCpu(ARP_FOR_VIP),
            output: None,
        },
        Case {
            desc: "arp: request for another IP floods",
            pipeline: arp,
            frame: || arp_request(MAC_A, [10, 0, 0, 1], [10, 0, 0, 2]),
            meta: meta(1, 0),
            verdict: Verdict::Flood,
            output: None,
        },
        Case {
            desc: "lpm: /32 beats /16 and /8",
            pipeline: lpm,
            frame: || to_ip([10, 1, 2, 3]),
            meta: Meta::default(),
            verdict: Verdict::Output(3),
            output: None,
        },
        Case {
            desc: "lpm: /16 beats /8",
            pipeline: lpm,
            frame: || to_ip([10, 1, 9, 9]),
            meta: Meta::default(),
            verdict: Verdict::Output(2),
            output: None,
        },
        Case {
            desc: "lpm: /8",
            pipeline: lpm,
            frame: || to_ip([10, 200, 0, 1]),
            meta: Meta::default(),
            verdict: Verdict::Output(1),
            output: None,
        },
        Case {
            desc: "lpm: default route /0",
            pipeline: lpm,
            frame: || to_ip([192, 168, 1, 1]),
            meta: Meta::default(),
            verdict: Verdict::Output(9),
            output: None,
        },
        Case {
            desc: "lpm: frame too short for the destination IP misses",
            pipeline: lpm,
            frame: || to_ip([10, 1, 2, 3])[..32].to_vec(),
            meta: Meta::default(),
            verdict: Verdict::Drop(NO_ROUTE),
            output: None,
        },
        Case {
            desc: "ternary: exact proto and port at priority 20 wins",
            pipeline: acl,
            frame: || to_port(PROTO_UDP, 11211),
            meta: Meta::default(),
            verdict: Verdict::Output(2),
            output: None,
        },
        Case {
            desc: "ternary: any UDP port at priority 10",
            pipeline: acl,
            frame: || to_port(PROTO_UDP, 53),
            meta: Meta::default(),
            verdict: Verdict::Output(1),
            output: None,
        },
        Case {
            desc: "ternary: wildcard at priority 5 catches TCP",
            pipeline: acl,
            frame: || to_port(PROTO_TCP, 11211),
            meta: Meta::default(),
            verdict: Verdict::Output(3),
            output: None,
        },
        Case {
            desc: "ternary: miss with no actions has no verdict",
            pipeline: acl,
            frame: || vec![0; 20],
            meta: Meta::default(),
            verdict: Verdict::Drop(reason::NO_VERDICT),
            output: None,
        },
        Case {
            desc: "chain: register set in table 0 matched in table 1; TTL and source rewritten",
            pipeline: chained,
            frame: || client().build(),
            meta: meta(7, 0),
            verdict: Verdict::Output(4),
            output: Some(|| {
                Ipv4Frame {
                    ttl: 63,
                    src_ip: [192, 0, 2, 1],
                    ..client()
                }
                .build()
            }),
        },
        Case {
            desc:
                "chain: the last terminal action wins (table 1 miss has none, so Output(1) stands)",
            pipeline: chained,
            frame: || client().build(),
            meta: meta(8, 0),
            verdict: Verdict::Output(1),
            output: None,
        },
        Case {
            desc: "chain: TTL 1 expires, frame untouched",
            pipeline: chained,
            frame: || Ipv4Frame { ttl: 1, ..client() }.build(),
            meta: meta(7, 0),
            verdict: Verdict::Drop(reason::TTL_EXPIRED),
            output: None,
        },
        Case {
            desc: "chain: DecTtl and SetIpv4Src on ARP are skipped",
            pipeline: chained,
            frame: || arp_request(MAC_A, [10, 0, 0, 1], VIP),
            meta: meta(7, 0),
            verdict: Verdict::Output(4),
            output: None,
        },
        Case {
            desc: "selector member goto backwards drops",
            pipeline: bad_selector_goto,
            frame: || vec![0; 60],
            meta: meta(0, 0),
            verdict: Verdict::Drop(reason::BAD_GOTO),
            output: None,
        },
        Case {
            desc: "goto to a table that was never created drops",
            pipeline: bad_selector_goto,
            frame: || vec![0; 60],
            meta: meta(0, 1),
            verdict: Verdict::Drop(reason::BAD_GOTO),
            output: None,
        },
        Case {
            desc: "empty pipeline drops",
            pipeline: Pipeline::new,
            frame: || client().build(),
            meta: Meta::default(),
            verdict: Verdict::Drop(reason::NO_TABLES),
            output: None,
        },
    ]
}

#[test]
fn table_driven() {
    for case in cases() {
        let mut p = (case.pipeline)();
        let input = (case.frame)();
        let mut frame = input.clone();
        let mut meta = case.meta;
        let verdict = p.process(&mut frame, &mut meta);
        assert_eq!(verdict, case.verdict, "{}", case.desc);
        let expected = case.output.map_or(input, |f| f());
        assert_eq!(frame, expected, "{}", case.desc);
        assert!(checksums_ok(&frame), "{}: checksums", case.desc);
        assert_eq!(p.stats().packets, 1, "{}", case.desc);
        if let Verdict::Drop(code) = verdict {
            if code < USER_BASE {
                assert_eq!(p.stats().drops(code), 1, "{}", case.desc);
            }
        }
    }
}

#[test]
fn rewrite_on_non_ipv4_is_counted() {
    let mut p = chained();
    let mut f = arp_request(MAC_A, [10, 0, 0, 1], VIP);
    p.process(&mut f, &mut meta(7, 0));
    assert_eq!(p.stats().rewrite_skipped, 2);
}

/// A version stamp as a controller writes it: the first switch sets the DSCP on frames from
/// an edge port, and a later table matches it with a byte range of the ToS byte (offset 15)
/// under the DSCP's mask, whatever the ECN bits say.
#[test]
fn a_dscp_written_is_matched_by_a_byte_range_under_its_mask() {
    let mut p = Pipeline::new();
    let stamp = p
        .add_table(TableSpec {
            name: "stamp".into(),
            kind: MatchKind::Ternary,
            key: vec![Field::InPort],
            miss: vec![Action::Goto(TableId(1))],
        })
        .unwrap();
    let routes = p
        .add_table(TableSpec {
            name: "routes".into(),
            kind: MatchKind::Ternary,
            key: vec![bytes(15, 1)],
            miss: vec![Action::Drop(NO_ROUTE)],
        })
        .unwrap();
    p.insert(
        stamp,
        Entry::ternary([0, 1], [0xff, 0xff], 1, {
            vec![Action::SetDscp(5), Action::Goto(routes)]
        }),
    )
    .unwrap();
    for (v, port) in [(5u8, 2u16), (6, 3)] {
        p.insert(
            routes,
            Entry::ternary([v << 2], [0xfc], 0, vec![Action::Output(port)]),
        )
        .unwrap();
    }
    // From the edge port 1: stamped 5, routed by version 5.
    let mut f = client().build();
    assert_eq!(p.process(&mut f, &mut meta(1, 0)), Verdict::Output(2));
    assert_eq!(f[15], 5 << 2);
    assert!(checksums_ok(&f));
    // From another port, already stamped 6 by an earlier switch: left as it is.
    let mut g = client().build();
    g[15] = (6 << 2) | 0x01; // ECN bits set: the mask leaves them out
    assert_eq!(p.process(&mut g, &mut meta(4, 0)), Verdict::Output(3));
    // Unstamped from another port: no version routes it.
    let mut h = client().build();
    assert_eq!(p.process(&mut h, &mut meta(4, 0)), Verdict::Drop(NO_ROUTE));
    // A DSCP takes 6 bits.
    assert_eq!(
        p.insert(
            routes,
            Entry::ternary([0], [0xfc], 0, vec![Action::SetDscp(64)])
        ),
        Err(Error::BadDscp(64))
    );
    // On ARP the stamp is skipped and counted.
    let mut a = arp_request(MAC_A, [10, 0, 0, 1], VIP);
    p.process(&mut a, &mut meta(1, 0));
    assert_eq!(p.stats().rewrite_skipped, 1);
}

#[test]
fn selector_spreads_and_can_be_replaced() {
    let mut p = switch();
    for h in 0..100u32 {
        let mut f = client().build();
        p.process(&mut f, &mut meta(3, h));
    }
    let snap = p.describe();
    assert_eq!(snap.selectors[0].member_hits, vec![50, 50]);
    let sel = snap.selectors[0].id;
    p.set_selector(sel, vec![vec![Action::Output(42)]], Box::new(Fixed(0)))
        .unwrap();
    let mut f = client().build();
    assert_eq!(p.process(&mut f, &mut meta(3, 1)), Verdict::Output(42));
    assert_eq!(p.describe().selectors[0].member_hits, vec![1]);
    // Nested selection is refused, and nothing changes.
    assert_eq!(
        p.set_selector(sel, vec![vec![Action::Select(sel)]], Box::new(Fixed(0))),
        Err(Error::NestedSelect)
    );
}

#[test]
fn goto_backwards_is_rejected() {
    let mut p = Pipeline::new();
    let t0 = p.add_table(exact("a", vec![bytes(0, 1)], vec![])).unwrap();
    let t1 = p.add_table(exact("b", vec![bytes(0, 1)], vec![])).unwrap();
    for (t, to) in [(t1, t0), (t1, t1), (t0, t0)] {
        assert_eq!(
            p.insert(t, Entry::exact([1], vec![Action::Goto(to)])),
            Err(Error::GotoNotForward { from: t, to })
        );
        assert_eq!(
            p.set_miss(t, vec![Action::Goto(to)]),
            Err(Error::GotoNotForward { from: t, to })
        );
    }
    assert_eq!(
        p.add_table(exact("c", vec![bytes(0, 1)], vec![Action::Goto(t1)])),
        Err(Error::GotoNotForward {
            from: TableId(2),
            to: t1
        })
    );
    assert_eq!(
        p.insert(
            t0,
            Entry::exact([1], vec![Action::Goto(t1), Action::Output(1)])
        ),
        Err(Error::GotoNotLast)
    );
    assert!(p
        .insert(t0, Entry::exact([1], vec![Action::Goto(t1)]))
        .is_ok());
    assert_eq!(p.len(t0), Ok(1));
    assert_eq!(p.len(t1), Ok(0));
}

#[test]
fn validation_errors() {
    let mut p = Pipeline::new();
    assert_eq!(
        p.add_table(exact("e", vec![], vec![])),
        Err(Error::EmptyKey)
    );
    assert!(matches!(
        p.add_table(exact("z", vec![bytes(0, 0)], vec![])),
        Err(Error::BadField(_))
    ));
    assert!(matches!(
        p.add_table(exact("r", vec![Field::Reg(NUM_REGS as u8)], vec![])),
        Err(Error::BadField(_))
    ));
    assert_eq!(
        p.add_table(exact(
            "long",
            vec![bytes(0, 60), Field::KeyHash, Field::InPort],
            vec![]
        )),
        Err(Error::KeyTooLong(66))
    );
    let t = p.add_table(exact("t", vec![bytes(0, 2)], vec![])).unwrap();
    assert_eq!(
        p.add_table(exact("t", vec![bytes(0, 2)], vec![])),
        Err(Error::DuplicateTableName("t".into()))
    );
    assert_eq!(p.table_id("t"), Some(t));
    assert_eq!(
        p.insert(t, Entry::exact([1], vec![])),
        Err(Error::KeyLength {
            expected: 2,
            got: 1
        })
    );
    assert_eq!(
        p.insert(t, Entry::exact([1, 2], vec![Action::Drop(7)])),
        Err(Error::ReservedReason(7))
    );
    assert_eq!(
        p.insert(t, Entry::exact([1, 2], vec![Action::SetReg(9, 0)])),
        Err(Error::BadRegister(9))
    );
    assert_eq!(
        p.insert(
            t,
            Entry::exact([1, 2], vec![Action::Count(pipeline::CounterId(3))])
        ),
        Err(Error::UnknownCounter(pipeline::CounterId(3)))
    );
    assert_eq!(
        p.insert(
            t,
            Entry::exact([1, 2], vec![Action::Select(pipeline::SelectorId(0))])
        ),
        Err(Error::UnknownSelector(pipeline::SelectorId(0)))
    );
    assert_eq!(
        p.insert(t, Entry::exact([1, 2], vec![Action::Flood; 65])),
        Err(Error::TooManyActions(65))
    );
    assert_eq!(
        p.insert(TableId(9), Entry::exact([1, 2], vec![])),
        Err(Error::UnknownTable(TableId(9)))
    );
    let first = p.insert(t, Entry::exact([1, 2], vec![])).unwrap();
    assert_eq!(
        p.insert(t, Entry::exact([1, 2], vec![Action::Flood])),
        Err(Error::DuplicateKey(first))
    );
    assert_eq!(p.len(t), Ok(1));
    // Errors render as sentences.
    assert!(Error::GotoNotLast.to_string().contains("last"));
}

#[test]
fn counters_count_packets_and_bytes() {
    let mut p = switch();
    let mut total = 0u64;
    for len_cut in [0usize, 0, 3] {
        let mut f = client().build();
        f.truncate(f.len() - len_cut);
        total += f.len() as u64;
        p.process(&mut f, &mut meta(3, 0));
    }
    // A frame that misses the memcached table is not counted.
    p.process(&mut to_port(PROTO_UDP, 53), &mut meta(3, 0));
    let c = p.describe().counters[0].clone();
    assert_eq!(c.name, "mc_requests");
    assert_eq!(p.counter(c.id), Some((3, total)));
    assert_eq!((c.packets, c.bytes), (3, total));
    assert_eq!(p.counter(pipeline::CounterId(99)), None);
}

#[test]
fn stats_and_describe() {
    let mut p = switch();
    p.process(&mut to_a(), &mut meta(3, 0));
    p.process(&mut client().build(), &mut meta(3, 0));
    p.process(&mut [0u8; 4], &mut meta(3, 0));
    let s = p.describe();
    assert_eq!(s.tables.len(), 2);
    let l2 = &s.tables[0];
    assert_eq!(
        (l2.name.as_str(), l2.kind, l2.key_len),
        ("l2", MatchKind::Exact, 6)
    );
    assert_eq!((l2.entries, l2.hits, l2.misses, l2.absent), (3, 2, 1, 1));
    let mc = &s.tables[1];
    assert_eq!((mc.entries, mc.hits, mc.misses), (1, 1, 0));
    assert_eq!(s.stats.packets, 3);
    let l2_id = p.table_id("l2").unwrap();
    let hits: Vec<u64> = {
        let mut v: Vec<_> = p.entries(l2_id).unwrap().map(|e| e.hits).collect();
        v.sort();
        v
    };
    assert_eq!(hits, vec![0, 1, 1]);
    let a = p.lookup_exact(l2_id, &MAC_A).unwrap();
    assert_eq!(p.entry(l2_id, a).unwrap().hits, 1);
    assert_eq!(p.table_snapshot(l2_id).unwrap(), *l2);
}

#[test]
fn remove_and_modify() {
    // Exact: a learned MAC moves port, then ages out.
    let mut p = switch();
    let l2 = TableId(0);
    let a = p.lookup_exact(l2, &MAC_A).unwrap();
    p.set_actions(l2, a, vec![Action::Output(5)]).unwrap();
    assert_eq!(p.process(&mut to_a(), &mut meta(3, 0)), Verdict::Output(5));
    let removed = p.remove(l2, a).unwrap();
    assert_eq!(removed.key, MAC_A);
    assert_eq!(p.process(&mut to_a(), &mut meta(3, 0)), Verdict::Flood);
    assert_eq!(p.remove(l2, a), Err(Error::UnknownEntry(l2, a)));
    assert_eq!(p.lookup_exact(l2, &MAC_A), None);
    assert_eq!(p.len(l2), Ok(2));

    // LPM: removing the /32 exposes the /16; removing the last /16 exposes the /8.
    let mut p = lpm();
    let t = TableId(0);
    let ip = [10, 1, 2, 3];
    let host = p.lookup(t, &ip).unwrap().unwrap();
    assert_eq!(p.entry(t, host).unwrap().entry.prefix_len, Some(32));
    p.remove(t, host).unwrap();
    assert_eq!(
        p.process(&mut to_ip(ip), &mut Meta::default()),
        Verdict::Output(2)
    );
    let net = p.lookup(t, &ip).unwrap().unwrap();
    p.remove(t, net).unwrap();
    assert_eq!(
        p.process(&mut to_ip(ip), &mut Meta::default()),
        Verdict::Output(1)
    );
    // Host bits are cleared on insert; the same prefix again is a duplicate.
    let again = p
        .insert(t, Entry::lpm([10, 1, 7, 7], 16, vec![Action::Output(6)]))
        .unwrap();
    assert_eq!(p.entry(t, again).unwrap().entry.key, vec![10, 1, 0, 0]);
    assert_eq!(
        p.insert(t, Entry::lpm([10, 1, 0, 0], 16, vec![])),
        Err(Error::DuplicateKey(again))
    );
    assert_eq!(
        p.process(&mut to_ip(ip), &mut Meta::default()),
        Verdict::Output(6)
    );

    // Ternary: removing the top row falls through to the next priority.
    let mut p = acl();
    let t = TableId(0);
    let key = [17, 0x2b, 0xcb];
    let top = p.lookup(t, &key).unwrap().unwrap();
    p.remove(t, top).unwrap();
    assert_eq!(
        p.process(&mut to_port(PROTO_UDP, 11211), &mut Meta::default()),
        Verdict::Output(1)
    );
    assert_eq!(p.len(t), Ok(2));
    assert_eq!(p.lookup_exact(t, &key), None, "not an exact table");
}

#[test]
fn tens_of_thousands_of_exact_entries() {
    const N: u32 = 50_000;
    let mut p = Pipeline::new();
    let t = p
        .add_table(exact("l2", vec![bytes(0, 6)], vec![Action::Flood]))
        .unwrap();
    let mac = |i: u32| {
        let b = i.to_be_bytes();
        [0x02, 0, b[0], b[1], b[2], b[3]]
    };
    for i in 0..N {
        p.insert(
            t,
            Entry::exact(mac(i), vec![Action::Output((i % 48) as u16)]),
        )
        .unwrap();
    }
    assert_eq!(p.len(t), Ok(N as usize));
    for i in (0..N).step_by(997) {
        let mut f = Ipv4Frame {
            dst_mac: mac(i),
            ..client()
        }
        .build();
        assert_eq!(
            p.process(&mut f, &mut Meta::default()),
            Verdict::Output((i % 48) as u16)
        );
    }
    for i in 0..N / 2 {
        let id = p.lookup_exact(t, &mac(i)).unwrap();
        p.remove(t, id).unwrap();
    }
    assert_eq!(p.len(t), Ok((N / 2) as usize));
    let mut f = Ipv4Frame {
        dst_mac: mac(1),
        ..client()
    }
    .build();
    assert_eq!(p.process(&mut f, &mut Meta::default()), Verdict::Flood);
}

/// A pipeline using every table kind, every action and every field, for the random frames.
fn everything() -> Pipeline {
    let mut p = switch();
    let c = p.add_counter("all");
    let sel = p
        .add_selector(
            vec![
                vec![Action::SetIpv4Src([1, 2, 3, 4]), Action::Goto(TableId(3))],
                vec![Action::DecTtl, Action::Output(2)],
            ],
            Box::new(Modulo(3)), // index 2 is out of range on purpose
        )
        .unwrap();
    let lpm = p
        .add_table(TableSpec {
            name: "lpm".into(),
            kind: MatchKind::Lpm,
            key: vec![bytes(26, 4), bytes(60, 1)],
            miss: vec![Action::Count(c), Action::Select(sel)],
        })
        .unwrap();
    p.insert(lpm, Entry::lpm([10, 0, 0, 0, 0], 8, vec![Action::DecTtl]))
        .unwrap();
    p.insert(
        lpm,
        Entry::lpm(
            [0; 5],
            1,
            vec![Action::SetIpv4Dst([9, 9, 9, 9]), Action::Flood],
        ),
    )
    .unwrap();
    let tern = p
        .add_table(TableSpec {
            name: "tern".into(),
            kind: MatchKind::Ternary,
            key: vec![bytes(12, 2), bytes(23, 1), Field::Flags, Field::Reg(0)],
            miss: vec![
                Action::SetEthDst([7; 6]),
                Action::SetDscp(46),
                Action::DecTtl,
            ],
        })
        .unwrap();
    p.insert(
        tern,
        Entry::ternary(
            [8, 0, 6, 0, 0, 0, 0, 0, 0, 0, 0],
            [0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0],
            3,
            vec![Action::SetIpv4Dst([5, 6, 7, 8]), Action::ToCpu(300)],
        ),
    )
    .unwrap();
    p.set_interface(
        0,
        Interface {
            eth_dst: MAC_B,
            eth_src: VIP_MAC,
            port: 9,
        },
    )
    .unwrap();
    p.insert(
        tern,
        Entry::ternary(
            [8, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            [0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            2,
            vec![
                Action::AddReg(1, 3),
                Action::LoadReg(1, 1),
                Action::Interface(0),
            ],
        ),
    )
    .unwrap();
    // Route unknown destinations through the LPM table instead of flooding.
    p.set_miss(TableId(0), vec![Action::SetReg(0, 1), Action::Goto(lpm)])
        .unwrap();
    p
}

#[test]
fn random_frames_never_panic() {
    let mut p = everything();
    let mut rng = Lcg(0x6b76_7377);
    let templates = [
        client().build(),
        Ipv4Frame {
            dst_mac: [1; 6],
            proto: PROTO_TCP,
            ..client()
        }
        .build(),
        Ipv4Frame {
            dst_mac: [3; 6],
            ..client()
        }
        .build(),
        arp_request(MAC_A, [10, 0, 0, 1], VIP),
    ];
    let n = 5000;
    for i in 0..n {
        let mut frame = if i % 2 == 0 {
            // Pure noise of any length up to 128 bytes.
            let len = rng.next() as usize % 129;
            (0..len).map(|_| rng.next() as u8).collect::<Vec<_>>()
        } else {
            // A real frame, truncated and with a few bytes flipped.
            let mut f = templates[rng.next() as usize % templates.len()].clone();
            let keep = rng.next() as usize % (f.len() + 1);
            f.truncate(keep);
            for _ in 0..rng.next() % 4 {
                if !f.is_empty() {
                    let at = rng.next() as usize % f.len();
                    f[at] ^= rng.next() as u8;
                }
            }
            f
        };
        let mut m = Meta {
            in_port: rng.next() as u16,
            key_hash: rng.next(),
            flags: rng.next() % 2,
            regs: [0; NUM_REGS],
        };
        let len = frame.len();
        let _ = p.process(&mut frame, &mut m);
        assert_eq!(frame.len(), len);
    }
    let s = p.describe();
    assert_eq!(s.stats.packets, n);
    assert!(s.tables.iter().all(|t| t.hits + t.misses > 0), "{s:?}");
    // Intact frames through the same pipeline keep valid checksums.
    for t in &templates {
        let mut f = t.clone();
        for h in 0..3 {
            p.process(&mut f, &mut meta(1, h));
            assert!(checksums_ok(&f));
        }
    }
}

#[test]
fn pipeline_is_send() {
    fn send<T: Send>() {}
    send::<Pipeline>();
}

#[test]
fn a_full_table_refuses_entries_until_one_goes() {
    let mut p = Pipeline::new();
    let t = p
        .add_table(exact("t", vec![Field::Bytes { offset: 0, len: 1 }], vec![]))
        .unwrap();
    p.set_limit(t, Some(2)).unwrap();
    let a = p.insert(t, Entry::exact([1], vec![Action::Flood])).unwrap();
    p.insert(t, Entry::exact([2], vec![Action::Flood])).unwrap();
    assert_eq!(
        p.insert(t, Entry::exact([3], vec![Action::Flood])),
        Err(Error::TableFull { table: t, limit: 2 })
    );
    assert_eq!(p.len(t).unwrap(), 2);
    p.remove(t, a).unwrap();
    p.insert(t, Entry::exact([3], vec![Action::Flood])).unwrap();
}

#[test]
fn a_removed_table_is_gone_but_not_while_something_jumps_to_it() {
    let mut p = Pipeline::new();
    let first = p
        .add_table(exact(
            "first",
            vec![Field::InPort],
            vec![Action::Goto(TableId(1))],
        ))
        .unwrap();
    let second = p
        .add_table(exact(
            "second",
            vec![Field::InPort],
            vec![Action::Output(2)],
        ))
        .unwrap();
    assert_eq!(
        p.remove_table(second),
        Err(Error::TableInUse {
            table: second,
            by: first
        })
    );
    let mut frame = [0u8; 14];
    assert_eq!(p.process(&mut frame, &mut Meta::new(1)), Verdict::Output(2));
    p.set_miss(first, vec![Action::Flood]).unwrap();
    p.remove_table(second).unwrap();
    assert_eq!(p.table_id("second"), None);
    assert_eq!(p.len(second), Err(Error::UnknownTable(second)));
    assert_eq!(p.describe().tables.len(), 1);
    // The name is free again, under a new id.
    let again = p
        .add_table(exact("second", vec![Field::InPort], vec![]))
        .unwrap();
    assert_ne!(again, second);
    // A frame that still reaches the old id is dropped.
    p.set_miss(first, vec![Action::Goto(second)]).unwrap();
    assert_eq!(
        p.process(&mut frame, &mut Meta::new(1)),
        Verdict::Drop(reason::BAD_GOTO)
    );
}

#[test]
fn a_taken_entry_comes_back_with_its_id_hits_and_place() {
    let mut p = Pipeline::new();
    let t = p
        .add_table(TableSpec {
            name: "t".into(),
            kind: MatchKind::Ternary,
            key: vec![Field::InPort],
            miss: vec![],
        })
        .unwrap();
    let first = p
        .insert(
            t,
            Entry::ternary([0, 0], [0, 0], 5, vec![Action::Output(1)]),
        )
        .unwrap();
    p.insert(
        t,
        Entry::ternary([0, 0], [0, 0], 5, vec![Action::Output(2)]),
    )
    .unwrap();
    let mut frame = [0u8; 14];
    assert_eq!(p.process(&mut frame, &mut Meta::new(0)), Verdict::Output(1));
    let taken = p.take(t, first).unwrap();
    assert_eq!(taken.hits(), 1);
    assert_eq!(p.process(&mut frame, &mut Meta::new(0)), Verdict::Output(2));
    assert!(p.restore(t, first, taken));
    // First again: it keeps its place among equal priorities.
    assert_eq!(p.process(&mut frame, &mut Meta::new(0)), Verdict::Output(1));
    assert_eq!(p.entry(t, first).unwrap().hits, 2);
    assert_eq!(pipeline::EntryId::from_u64(first.to_u64()), first);
}

#[test]
fn an_interface_rewrites_and_outputs_and_a_change_to_it_applies_to_every_entry_naming_it() {
    let mut p = Pipeline::new();
    let t = p
        .add_table(exact("by_ip", vec![bytes(30, 4)], vec![Action::Flood]))
        .unwrap();
    // An entry may not name an interface that is not there.
    assert_eq!(
        p.insert(t, Entry::exact([10, 0, 0, 1], vec![Action::Interface(3)])),
        Err(Error::UnknownInterface(3))
    );
    assert_eq!(
        p.set_interface(
            MAX_INTERFACES as u16,
            Interface {
                eth_dst: MAC_B,
                eth_src: VIP_MAC,
                port: 1
            }
        ),
        Err(Error::UnknownInterface(MAX_INTERFACES as u16))
    );
    let first = Interface {
        eth_dst: MAC_B,
        eth_src: VIP_MAC,
        port: 4,
    };
    p.set_interface(3, first).unwrap();
    for ip in [[10, 0, 0, 1], [10, 0, 0, 2]] {
        p.insert(t, Entry::exact(ip, vec![Action::Interface(3)]))
            .unwrap();
    }
    let frame = |ip: [u8; 4]| to_ip(ip);
    let mut f = frame([10, 0, 0, 1]);
    assert_eq!(p.process(&mut f, &mut meta(0, 0)), Verdict::Output(4));
    assert_eq!((&f[0..6], &f[6..12]), (&MAC_B[..], &VIP_MAC[..]));
    // One change moves both entries' traffic.
    p.set_interface(
        3,
        Interface {
            eth_dst: MAC_A,
            eth_src: VIP_MAC,
            port: 5,
        },
    )
    .unwrap();
    for ip in [[10, 0, 0, 1], [10, 0, 0, 2]] {
        let mut f = frame(ip);
        assert_eq!(p.process(&mut f, &mut meta(0, 0)), Verdict::Output(5));
        assert_eq!(&f[0..6], &MAC_A[..]);
    }
    // Not removed while named; removed once nothing names it.
    assert!(matches!(
        p.remove_interface(3),
        Err(Error::InterfaceInUse { interface: 3, .. })
    ));
    let ids: Vec<_> = p.entries(t).unwrap().map(|e| e.id).collect();
    for id in ids {
        p.remove(t, id).unwrap();
    }
    assert_eq!(p.remove_interface(3).map(|it| it.port), Ok(5));
    assert_eq!(p.interface(3), None);
    assert_eq!(p.remove_interface(3), Err(Error::UnknownInterface(3)));
}

#[test]
fn a_multicast_group_is_checked_named_by_entries_and_kept_while_named() {
    let mut p = Pipeline::new();
    let t = p
        .add_table(exact("by_ip", vec![bytes(30, 4)], vec![Action::Flood]))
        .unwrap();
    // An entry may not name a group that is not there.
    assert_eq!(
        p.insert(t, Entry::exact([10, 0, 0, 1], vec![Action::Multicast(7)])),
        Err(Error::UnknownGroup(7))
    );
    // A group's id, size and interfaces are checked.
    assert_eq!(
        p.set_group(MAX_GROUPS as u16, vec![Member::Port(1)]),
        Err(Error::UnknownGroup(MAX_GROUPS as u16))
    );
    assert_eq!(p.set_group(7, vec![]), Err(Error::BadGroupSize(0)));
    assert_eq!(
        p.set_group(7, vec![Member::Port(1); MAX_GROUP_MEMBERS + 1]),
        Err(Error::BadGroupSize(MAX_GROUP_MEMBERS + 1))
    );
    assert_eq!(
        p.set_group(7, vec![Member::Port(1), Member::Interface(2)]),
        Err(Error::UnknownInterface(2))
    );
    assert_eq!(
        p.set_group(7, vec![Member::Port(1), Member::Port(3), Member::Port(1)]),
        Err(Error::DuplicateMember(Member::Port(1)))
    );
    let it = Interface {
        eth_dst: MAC_B,
        eth_src: VIP_MAC,
        port: 4,
    };
    p.set_interface(2, it).unwrap();
    p.set_group(7, vec![Member::Port(1), Member::Interface(2)])
        .unwrap();
    assert_eq!(
        p.group(7),
        Some(&[Member::Port(1), Member::Interface(2)][..])
    );
    // The verdict names the group, and the last terminal action still wins.
    p.insert(t, Entry::exact([10, 0, 0, 1], vec![Action::Multicast(7)]))
        .unwrap();
    p.insert(
        t,
        Entry::exact([10, 0, 0, 2], vec![Action::Multicast(7), Action::Output(3)]),
    )
    .unwrap();
    let mut f = to_ip([10, 0, 0, 1]);
    let before = f.clone();
    assert_eq!(p.process(&mut f, &mut meta(0, 0)), Verdict::Multicast(7));
    assert_eq!(f, before, "the pipeline leaves the copies to the caller");
    let mut f = to_ip([10, 0, 0, 2]);
    assert_eq!(p.process(&mut f, &mut meta(0, 0)), Verdict::Output(3));
    assert_eq!(p.group_uses(7), 2);
    // Neither the group nor an interface it names goes while named.
    assert!(matches!(
        p.remove_group(7),
        Err(Error::GroupInUse { group: 7, .. })
    ));
    assert!(matches!(
        p.remove_interface(2),
        Err(Error::InterfaceInUse { interface: 2, by }) if by == "multicast group 7"
    ));
    let ids: Vec<_> = p.entries(t).unwrap().map(|e| e.id).collect();
    for id in ids {
        p.remove(t, id).unwrap();
    }
    assert_eq!(
        p.remove_group(7),
        Ok(vec![Member::Port(1), Member::Interface(2)])
    );
    assert_eq!(p.group(7), None);
    assert_eq!(p.groups().count(), 0);
    assert_eq!(p.remove_group(7), Err(Error::UnknownGroup(7)));
    assert_eq!(p.remove_interface(2).map(|it| it.port), Ok(4));
}

#[test]
fn user_registers_outlive_frames_and_feed_later_tables() {
    let mut p = Pipeline::new();
    // Table 0 counts every frame in user register 5 and loads user register 9 into metadata
    // register 3; table 1 outputs by that register.
    let t0 = p
        .add_table(exact(
            "first",
            vec![bytes(0, 1)],
            vec![
                Action::AddReg(5, 2),
                Action::LoadReg(3, 9),
                Action::Goto(TableId(1)),
            ],
        ))
        .unwrap();
    let t1 = p
        .add_table(exact("mode", vec![Field::Reg(3)], vec![Action::Output(1)]))
        .unwrap();
    p.insert(t1, Entry::exact([0, 0, 0, 7], vec![Action::Output(7)]))
        .unwrap();
    let mut f = to_a();
    assert_eq!(p.process(&mut f, &mut meta(0, 0)), Verdict::Output(1));
    p.set_register(9, 0x1_0000_0007).unwrap();
    assert_eq!(p.process(&mut f, &mut meta(0, 0)), Verdict::Output(7));
    assert_eq!(p.register(5), Some(4));
    assert_eq!(p.registers().len(), NUM_USER_REGS);
    assert_eq!(
        p.set_register(NUM_USER_REGS as u8, 1),
        Err(Error::BadUserRegister(NUM_USER_REGS as u8))
    );
    assert_eq!(
        p.insert(
            t0,
            Entry::exact([1], vec![Action::AddReg(NUM_USER_REGS as u8, 1)])
        ),
        Err(Error::BadUserRegister(NUM_USER_REGS as u8))
    );
    assert_eq!(
        p.insert(
            t0,
            Entry::exact([1], vec![Action::LoadReg(NUM_REGS as u8, 0)])
        ),
        Err(Error::BadRegister(NUM_REGS as u8))
    );
    assert_eq!(p.len(t0), Ok(0));
}

#[test]
fn tables_made_and_removed_again_and_again_do_not_use_up_the_limit() {
    let mut p = Pipeline::new();
    p.add_table(exact("first", vec![bytes(0, 1)], vec![Action::Flood]))
        .unwrap();
    for round in 0..(MAX_TABLES * 2) {
        let t = p
            .add_table(exact("again", vec![bytes(0, 1)], vec![]))
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        p.insert(t, Entry::exact([1], vec![Action::Output(1)]))
            .unwrap();
        p.remove_table(t).unwrap();
    }
    // Still at most MAX_TABLES at once.
    for i in 1..MAX_TABLES {
        p.add_table(exact(&format!("t{i}"), vec![bytes(0, 1)], vec![]))
            .unwrap();
    }
    assert_eq!(
        p.add_table(exact("one_more", vec![bytes(0, 1)], vec![])),
        Err(Error::TooManyTables)
    );
    let mut f = to_a();
    assert_eq!(p.process(&mut f, &mut meta(0, 0)), Verdict::Flood);
}

#[test]
fn a_removed_tables_id_is_given_again_only_once_every_id_was_used() {
    let mut p = Pipeline::new();
    let first = p
        .add_table(exact("first", vec![bytes(0, 1)], vec![Action::Flood]))
        .unwrap();
    let mut ids = std::collections::HashSet::new();
    let mut last = first;
    // Every id once: none is given twice while fresh ones remain.
    for round in 1..MAX_TABLE_IDS {
        let t = p
            .add_table(exact("again", vec![bytes(0, 1)], vec![]))
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert!(ids.insert(t), "id {t:?} given twice in round {round}");
        p.remove_table(t).unwrap();
        last = t;
    }
    assert_eq!(usize::from(last.0), MAX_TABLE_IDS - 1);
    // Then the removed ones, oldest first; the live one is never taken.
    let next = p
        .add_table(exact("later", vec![bytes(0, 1)], vec![]))
        .unwrap();
    assert_ne!(next, first);
    assert_eq!(p.table_id("later"), Some(next));
    assert_eq!(p.table_id("first"), Some(first));
}

/// A switch that routes labelled frames by their top label (popping it, as a source route
/// is read hop by hop), and pushes a stack of labels onto frames from its edge port 0.
fn label_router(routes: &[(u32, Vec<Action>)], push: &[u32]) -> Pipeline {
    let mut p = Pipeline::new();
    let edge = p
        .add_table(TableSpec {
            name: "edge".into(),
            kind: MatchKind::Exact,
            key: vec![Field::InPort],
            miss: vec![Action::Goto(TableId(1))],
        })
        .unwrap();
    let by_label = p
        .add_table(TableSpec {
            name: "by_label".into(),
            kind: MatchKind::Ternary,
            key: vec![bytes(12, 2), bytes(14, 3)],
            miss: vec![Action::Drop(NO_ROUTE)],
        })
        .unwrap();
    if !push.is_empty() {
        let mut actions: Vec<Action> = push.iter().rev().map(|&l| Action::PushLabel(l)).collect();
        actions.push(Action::Goto(by_label));
        p.insert(edge, Entry::exact(0u16.to_be_bytes(), actions))
            .unwrap();
    }
    for (label, actions) in routes {
        let top = (label << 4).to_be_bytes();
        p.insert(
            by_label,
            Entry::ternary(
                [0x88, 0x47, top[1], top[2], top[3]],
                [0xff, 0xff, 0xff, 0xff, 0xf0],
                0,
                actions.clone(),
            ),
        )
        .unwrap();
    }
    p
}

#[test]
fn a_labelled_frame_follows_its_label_stack_and_leaves_unlabelled() {
    // Ingress pushes the route 7, 9, 3 (7 on top) and sends by its first label; the next
    // switches pop one label each and send by the next.
    let ingress = label_router(
        &[(7, vec![Action::PopLabel, Action::Output(2)])],
        &[7, 9, 3],
    );
    let middle = label_router(&[(9, vec![Action::PopLabel, Action::Output(5)])], &[]);
    let egress = label_router(&[(3, vec![Action::PopLabel, Action::Output(1)])], &[]);
    let original = client().build();
    let mut path = Vec::new();
    let mut frame = original.clone();
    for (hop, mut p) in [ingress, middle, egress].into_iter().enumerate() {
        let in_port = if hop == 0 { 0 } else { 4 };
        let verdict = p.process(&mut frame, &mut meta(in_port, 0));
        let out = p.resized().expect("a pop changes the length").to_vec();
        if let Verdict::Output(port) = verdict {
            path.push(port);
        } else {
            panic!("hop {hop}: {verdict:?}");
        }
        frame = out;
        if hop < 2 {
            assert_eq!(
                &frame[12..14],
                &[0x88, 0x47],
                "hop {hop} leaves it labelled"
            );
        }
    }
    assert_eq!(path, [2, 5, 1]);
    assert_eq!(frame, original, "unlabelled, byte for byte as it came in");
    assert!(checksums_ok(&frame));
}

#[test]
fn label_push_swap_and_pop_write_rfc_3032_entries() {
    let mut p = Pipeline::new();
    let t = p
        .add_table(exact(
            "t",
            vec![Field::InPort],
            vec![Action::Drop(NO_ROUTE)],
        ))
        .unwrap();
    for (port, actions) in [
        (0u16, vec![Action::PushLabel(0xabcde), Action::Output(1)]),
        (1, vec![Action::SwapLabel(42), Action::Output(2)]),
        (2, vec![Action::PopLabel, Action::Output(3)]),
        (
            3,
            vec![
                Action::PushLabel(5),
                Action::PushLabel(6),
                Action::Output(4),
            ],
        ),
    ] {
        p.insert(t, Entry::exact(port.to_be_bytes(), actions))
            .unwrap();
    }
    let ip = client().build();
    let ttl = ip[22];
    // Push on IPv4: one entry, bottom of stack, the IP TTL copied.
    let mut f = ip.clone();
    assert_eq!(p.process(&mut f, &mut meta(0, 0)), Verdict::Output(1));
    let pushed = p.resized().unwrap().to_vec();
    assert_eq!(pushed.len(), ip.len() + 4);
    assert_eq!(&pushed[12..18], &[0x88, 0x47, 0xab, 0xcd, 0xe1, ttl]);
    assert_eq!(&pushed[18..], &ip[14..]);
    assert_eq!(pipeline::label::top(&pushed), Some(0xabcde));
    // Swap keeps the class and the bottom bit and decrements the TTL, in place.
    let mut g = pushed.clone();
    assert_eq!(p.process(&mut g, &mut meta(1, 0)), Verdict::Output(2));
    assert_eq!(p.resized(), None);
    assert_eq!(&g[14..18], &[0x00, 0x02, 0xa1, ttl - 1]);
    // A label whose TTL runs out is dropped, as a label switch in a loop would.
    let mut dying = pushed.clone();
    dying[17] = 1;
    assert_eq!(
        p.process(&mut dying, &mut meta(1, 0)),
        Verdict::Drop(reason::TTL_EXPIRED)
    );
    // Pop of the bottom label: IPv4 again.
    assert_eq!(p.process(&mut g, &mut meta(2, 0)), Verdict::Output(3));
    assert_eq!(p.resized().unwrap(), &ip[..]);
    // Two pushes: the second goes on top, not the bottom, with the first's TTL.
    let mut h = ip.clone();
    assert_eq!(p.process(&mut h, &mut meta(3, 0)), Verdict::Output(4));
    let two = p.resized().unwrap().to_vec();
    assert_eq!(&two[14..22], &[0, 0, 0x60, ttl, 0, 0, 0x51, ttl]);
    // A pop above the bottom keeps the MPLS ethertype.
    let mut k = two.clone();
    assert_eq!(p.process(&mut k, &mut meta(2, 0)), Verdict::Output(3));
    assert_eq!(
        &p.resized().unwrap()[12..18],
        &[0x88, 0x47, 0, 0, 0x51, ttl]
    );
}

#[test]
fn label_actions_on_frames_without_labels_are_counted_drops() {
    let mut p = Pipeline::new();
    let t = p
        .add_table(exact(
            "t",
            vec![Field::InPort],
            vec![Action::Drop(NO_ROUTE)],
        ))
        .unwrap();
    p.insert(
        t,
        Entry::exact(
            0u16.to_be_bytes(),
            vec![Action::PopLabel, Action::Output(1)],
        ),
    )
    .unwrap();
    p.insert(
        t,
        Entry::exact(
            1u16.to_be_bytes(),
            vec![Action::SwapLabel(3), Action::Output(1)],
        ),
    )
    .unwrap();
    p.insert(
        t,
        Entry::exact(
            2u16.to_be_bytes(),
            vec![Action::PushLabel(3), Action::Output(1)],
        ),
    )
    .unwrap();
    let mut f = client().build();
    assert_eq!(
        p.process(&mut f, &mut meta(0, 0)),
        Verdict::Drop(reason::NO_LABEL)
    );
    assert_eq!(
        p.process(&mut f, &mut meta(1, 0)),
        Verdict::Drop(reason::NO_LABEL)
    );
    // The bottom label over a payload that is not IP: its ethertype is unknown.
    let mut arp = arp_request(MAC_A, [10, 0, 0, 1], VIP);
    assert_eq!(p.process(&mut arp, &mut meta(2, 0)), Verdict::Output(1));
    let mut labelled = p.resized().unwrap().to_vec();
    assert_eq!(
        p.process(&mut labelled, &mut meta(0, 0)),
        Verdict::Drop(reason::LABEL_PAYLOAD_UNKNOWN)
    );
    assert_eq!(p.stats().drops[usize::from(reason::NO_LABEL) - 1], 2);
    // Truncated labelled frames never panic.
    for len in 0..labelled.len() {
        let mut cut = labelled[..len].to_vec();
        for port in 0..3u16 {
            p.process(&mut cut, &mut meta(port, 0));
        }
    }
    // A push past the longest frame.
    let mut long = vec![0u8; pipeline::MAX_FRAME_LEN - 2];
    assert_eq!(
        p.process(&mut long, &mut meta(2, 0)),
        Verdict::Drop(reason::FRAME_TOO_LONG)
    );
    assert_eq!(
        p.insert(
            t,
            Entry::exact(3u16.to_be_bytes(), vec![Action::PushLabel(1 << 20)])
        ),
        Err(Error::BadLabel(1 << 20))
    );
}

/// `strip_udp_payload` on a frame run through the tables twice (as the switch runs a read
/// the cache could not answer): each run gives the same shorter frame, with the lengths and
/// checksums of one sent without the stripped bytes, and the caller's frame stays as it came.
#[test]
fn a_strip_leaves_the_callers_frame_and_gives_the_frame_sent_without_the_bytes() {
    let mut p = Pipeline::new();
    let t = p
        .add_table(TableSpec {
            name: "strip".into(),
            kind: MatchKind::Exact,
            key: vec![Field::InPort],
            miss: vec![Action::Drop(NO_ROUTE)],
        })
        .unwrap();
    p.insert(
        t,
        Entry::exact(
            0u16.to_be_bytes(),
            vec![Action::StripUdpPayload(8), Action::Output(1)],
        ),
    )
    .unwrap();
    let input = client().build();
    let want = Ipv4Frame {
        payload: &MC_GET[8..],
        ..client()
    }
    .build();
    let mut frame = input.clone();
    for run in 0..2 {
        let mut meta = Meta::default();
        assert_eq!(
            p.process(&mut frame, &mut meta),
            Verdict::Output(1),
            "run {run}"
        );
        assert_eq!(p.resized(), Some(&want[..]), "run {run}");
        assert!(checksums_ok(p.resized().unwrap()));
        assert_eq!(frame, input, "run {run}: the caller's frame");
    }
    // Refused where it does not apply: an odd length at insertion, a short payload at run.
    assert!(matches!(
        p.insert(
            t,
            Entry::exact(1u16.to_be_bytes(), vec![Action::StripUdpPayload(3)])
        ),
        Err(Error::BadStrip(3))
    ));
    let mut short = Ipv4Frame {
        payload: b"abcd",
        ..client()
    }
    .build();
    let mut meta = Meta::default();
    assert_eq!(
        p.process(&mut short, &mut meta),
        Verdict::Drop(reason::NO_UDP_PAYLOAD)
    );
}
