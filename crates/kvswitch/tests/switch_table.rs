//! Table-driven tests of the switch application (katran's fixtures in spirit): each case is a
//! frame and the port it arrives on, and says what must happen — the fate, the frame as it
//! leaves, the frames the switch originates and the one counter that moves. The switch does no
//! I/O, so it is driven directly, as the run loop drives it. The cases, the rig and the frame
//! builders are `testkit::table`'s, which the XDP program's comparison also runs
//! (`crates/xdp/tests/fast_path.rs`).

use testkit::table::*;

#[test]
fn fixture_keys_land_where_the_table_says() {
    let fx = Fx::new();
    let ring = ring();
    for (s, keys) in fx.key_on.iter().enumerate() {
        for k in keys {
            assert_eq!(ring.locate(k.as_bytes()), s, "{k}");
        }
    }
    assert_eq!(fx.long_key.0.len(), 250);
    assert_eq!(
        fx.long_key.1, LONG_KEY_SERVER,
        "the 250-byte key moved; update LONG_KEY_SERVER"
    );
}

/// Plain switching never sends a frame back out of the port it came from, whatever its
/// addresses; only a request the key router rewrote may hairpin.
#[test]
fn plain_frame_between_backends_behind_one_port_is_not_sent_back() {
    let mut rig = Rig::new(Mode::L3);
    let mut frame = udp_frame(
        SERVERS[1].mac,
        SERVERS[2].mac,
        (SERVERS[1].ip, 5000),
        (SERVERS[2].ip, 6000),
        b"hello",
    );
    let before = snapshot(&rig.stats);
    let mut emit = Vec::new();
    assert_eq!(
        rig.process(SERVERS[1].port, &mut frame, &mut emit),
        Fate::Consumed
    );
    assert_counts(
        "same port",
        &rig.stats,
        &before,
        &[Count::Drop(Drop::SamePort)],
    );
}

#[test]
fn l3_table() {
    run(Mode::L3, &l3_cases());
}

#[test]
fn l3_local_port_table() {
    run_on(Mode::L3, Rig::local, &local_cases(VIP));
}

#[test]
fn l2_local_port_table() {
    let mut cases = local_cases(AGENT);
    cases.extend([
        Case {
            name: "a server's ARP reply to the agent address goes out of the local port",
            in_port: SERVERS[1].port,
            input: |_| arp_reply_to(1, AGENT),
            fate: Fate::Out(LOCAL),
            output: None,
            emits: nothing,
            counts: &[Count::Switched],
        },
        Case {
            name: "a server's TCP to the VIP (which it owns) does not reach the host",
            in_port: SERVERS[0].port,
            input: |_| server_tcp_to(0, VIP),
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::VipUnhandled)],
        },
        Case {
            name: "the host's TCP from the agent address to a server is not rewritten",
            in_port: LOCAL,
            input: |_| from_host(SERVERS[0].mac, (AGENT, 40001), (SERVERS[0].ip, MC_PORT)),
            fate: Fate::Out(SERVERS[0].port),
            output: None,
            emits: nothing,
            counts: &[Count::Switched],
        },
        Case {
            name: "ARP for the agent address is answered by the switch",
            in_port: SERVERS[2].port,
            input: |_| arp_request(&SERVERS[2], AGENT),
            fate: Fate::Consumed,
            output: None,
            emits: |_| {
                let s = &SERVERS[2];
                vec![Emit {
                    dest: Dest::Port(s.port),
                    frame: arp_frame(
                        s.mac,
                        &arp::Repr {
                            operation: arp::Operation::Reply,
                            sender_mac: VIP_MAC,
                            sender_ip: AGENT,
                            target_mac: s.mac,
                            target_ip: s.ip,
                        },
                    ),
                }]
            },
            counts: &[Count::ArpReplies],
        },
    ]);
    run_on(Mode::L2, Rig::local, &cases);
}

/// The host's stack may leave the TCP checksum to offload (a veth with transmit checksumming
/// on): the port marks such frames and the switch completes the checksum before they leave.
#[test]
fn unfinished_tcp_checksum_from_the_host_is_completed() {
    let mut rig = Rig::local(Mode::L3);
    let done = from_host(CLIENT.mac, (VIP, MC_PORT), (CLIENT.ip, CLIENT_UDP_PORT));
    let mut partial = done.clone();
    // What offload leaves in the field: the pseudo-header sum, not complemented.
    let len = (done.len() - UDP_AT) as u16;
    let pseudo = wire::checksum::pseudo_header_v4(VIP, CLIENT.ip, 6, len);
    partial[UDP_AT + 16..UDP_AT + 18]
        .copy_from_slice(&(!wire::checksum::fold(pseudo)).to_be_bytes());
    assert_ne!(partial, done);
    let mut emit = Vec::new();
    let fate = rig
        .sw
        .process(LOCAL, &mut partial, false, rig.now, &mut emit);
    assert_eq!(fate, Fate::Out(CLIENT.port));
    assert_bytes("completed", &partial, &done);
    assert_checksums("completed", &partial);
}

/// Without enough ports for the local port after the configured ones, the switch refuses.
#[test]
fn a_local_port_needs_a_port_number() {
    let stats = Arc::new(Stats::new(PORTS, SERVERS.len()));
    let e = new_switch(&config_local(Mode::L3), PORTS, stats)
        .err()
        .expect("too few ports");
    assert!(e.to_string().contains("local port"), "{e}");
}

#[test]
fn l2_table() {
    run(Mode::L2, &l2_cases());
}

#[test]
fn split_get_merges_replies_in_client_order() {
    let fx = Fx::new();
    let mut rig = Rig::new(Mode::L3);
    // Keys on every server, interleaved; b is a miss; a is asked twice.
    let (a, b, c, d, e) = (
        fx.key(0, 0),
        fx.key(1, 0),
        fx.key(2, 0),
        fx.key(0, 1),
        fx.key(1, 1),
    );
    let ids = start_split(&mut rig, 0x4242, &[a, b, c, d, e, a]);
    let id = |k: &str| ids[k];

    // Each single-key get is answered with one message; c's spans two datagrams that arrive
    // last piece first, and the replies arrive in no particular order.
    let item_a = format!("VALUE {a} 0 2\r\nA0\r\n");
    let item_d = format!("VALUE {d} 5 3\r\nDDD\r\n");
    let item_c = format!("VALUE {c} 0 1\r\nC\r\n");
    let item_e = format!("VALUE {e} 9 1\r\nE\r\n");
    let reply_c = format!("{item_c}END\r\n");
    let (c_head, c_tail) = reply_c.as_bytes().split_at(7);
    let replies = vec![
        to_agent(
            server_of(d),
            id(d),
            0,
            1,
            format!("{item_d}END\r\n").as_bytes(),
        ),
        to_agent(server_of(c), id(c), 1, 2, c_tail),
        to_agent(server_of(b), id(b), 0, 1, b"END\r\n"),
        to_agent(
            server_of(e),
            id(e),
            0,
            1,
            format!("{item_e}END\r\n").as_bytes(),
        ),
        to_agent(server_of(c), id(c), 0, 2, c_head),
        to_agent(
            server_of(a),
            id(a),
            0,
            1,
            format!("{item_a}END\r\n").as_bytes(),
        ),
    ];
    let last = replies.len() - 1;
    for (i, mut frame) in replies.into_iter().enumerate() {
        let server = SERVERS
            .iter()
            .position(|s| s.mac.0 == frame[6..12])
            .expect("from a server");
        let before = snapshot(&rig.stats);
        let mut emit = Vec::new();
        assert_eq!(
            rig.process(SERVERS[server].port, &mut frame, &mut emit),
            Fate::Consumed,
            "reply {i}"
        );
        if i < last {
            assert!(emit.is_empty(), "reply {i}: nothing before the last part");
            assert_counts(
                &format!("reply {i}"),
                &rig.stats,
                &before,
                &[Count::Replies(server)],
            );
            continue;
        }
        let merged = format!("{item_a}{item_c}{item_d}{item_e}{item_a}END\r\n");
        let want = from_vip_id(0x4242, merged.as_bytes());
        assert_eq!(emit.len(), 1, "one merged reply");
        assert_eq!(emit[0].dest, want.dest);
        assert_bytes("merged reply", &emit[0].frame, &want.frame);
        assert_checksums("merged reply", &emit[0].frame);
        assert_counts(
            "merged reply",
            &rig.stats,
            &before,
            &[Count::Replies(server), Count::Answer(Answer::MergedGet)],
        );
    }
    assert_eq!(rig.sw.snapshot().splits_in_flight, 0);
}

#[test]
fn split_get_passes_on_a_server_error() {
    let fx = Fx::new();
    let mut rig = Rig::new(Mode::L3);
    let (k0, k2) = (fx.key(0, 0), fx.key(2, 0));
    let ids = start_split(&mut rig, 7, &[k0, k2]);
    let mut emit = Vec::new();
    let mut f = to_agent(0, ids[k0], 0, 1, b"END\r\n");
    assert_eq!(rig.process(1, &mut f, &mut emit), Fate::Consumed);
    let mut f = to_agent(2, ids[k2], 0, 1, b"SERVER_ERROR out of memory\r\n");
    assert_eq!(rig.process(2, &mut f, &mut emit), Fate::Consumed);
    assert_eq!(
        emit,
        vec![from_vip_id(7, b"SERVER_ERROR out of memory\r\n")]
    );
}

#[test]
fn split_get_times_out_and_late_replies_are_stale() {
    let fx = Fx::new();
    let mut rig = Rig::new(Mode::L3);
    let (k0, k1) = (fx.key(0, 0), fx.key(1, 0));
    let ids = start_split(&mut rig, 9, &[k0, k1]);
    let mut emit = Vec::new();
    let mut f = to_agent(0, ids[k0], 0, 1, b"END\r\n");
    assert_eq!(rig.process(1, &mut f, &mut emit), Fate::Consumed);

    let before = snapshot(&rig.stats);
    rig.sw.tick(rig.now + Duration::from_millis(500), &mut emit);
    assert_counts("before the deadline", &rig.stats, &before, &[]);
    rig.sw.tick(rig.now + Duration::from_secs(2), &mut emit);
    assert_counts(
        "after the deadline",
        &rig.stats,
        &before,
        &[Count::Drop(Drop::SplitTimeout)],
    );
    // Every backend MAC is configured, so the tick asks nobody for theirs.
    assert!(emit.is_empty());
    assert_eq!(stats::get(&rig.stats.splits_in_flight), 0);

    let before = snapshot(&rig.stats);
    let mut f = to_agent(1, ids[k1], 0, 1, b"END\r\n");
    assert_eq!(rig.process(2, &mut f, &mut emit), Fate::Consumed);
    assert!(emit.is_empty());
    assert_counts(
        "late reply",
        &rig.stats,
        &before,
        &[Count::Replies(1), Count::Drop(Drop::StaleReply)],
    );
}

#[test]
fn a_replicated_write_reaches_every_replica_and_is_answered_once_all_have() {
    let fx = Fx::new();
    let mut rig = replicated();
    let key = fx.key(1, 0);
    let [owner, second] = replicas_of(key);
    let body = format!("set {key} 0 0 2\r\nhi\r\n");
    let ids = start_replicated(&mut rig, key, body.as_bytes());

    // The first answer is held; the second completes the write and the client gets one reply.
    let mut emit = Vec::new();
    let mut f = to_agent(owner, ids[0], 0, 1, b"STORED\r\n");
    assert_eq!(
        rig.process(SERVERS[owner].port, &mut f, &mut emit),
        Fate::Consumed
    );
    assert!(emit.is_empty(), "no reply before every replica answered");
    let before = snapshot(&rig.stats);
    let mut f = to_agent(second, ids[1], 0, 1, b"STORED\r\n");
    assert_eq!(
        rig.process(SERVERS[second].port, &mut f, &mut emit),
        Fate::Consumed
    );
    assert_eq!(emit, vec![from_vip_id(0x5151, b"STORED\r\n")]);
    assert_counts(
        "the last replica's answer",
        &rig.stats,
        &before,
        &[
            Count::Replies(second),
            Count::Answer(Answer::ReplicatedWrite),
        ],
    );

    // Replicas that disagree: an error wins over the owner's answer.
    let ids = start_replicated(&mut rig, key, body.as_bytes());
    let mut emit = Vec::new();
    let mut f = to_agent(second, ids[1], 0, 1, b"SERVER_ERROR out of memory\r\n");
    rig.process(SERVERS[second].port, &mut f, &mut emit);
    let mut f = to_agent(owner, ids[0], 0, 1, b"STORED\r\n");
    rig.process(SERVERS[owner].port, &mut f, &mut emit);
    assert_eq!(
        emit,
        vec![from_vip_id(0x5151, b"SERVER_ERROR out of memory\r\n")]
    );

    // A replica that never answers: no reply, the write times out.
    let ids = start_replicated(&mut rig, key, body.as_bytes());
    let mut emit = Vec::new();
    let mut f = to_agent(owner, ids[0], 0, 1, b"STORED\r\n");
    rig.process(SERVERS[owner].port, &mut f, &mut emit);
    let before = snapshot(&rig.stats);
    rig.sw.tick(rig.now + Duration::from_secs(2), &mut emit);
    assert!(emit.is_empty());
    assert_counts(
        "a replica that never answers",
        &rig.stats,
        &before,
        &[Count::Drop(Drop::SplitTimeout)],
    );

    // Reads go to the owner alone, as without replicas.
    let mut frame = to_vip(format!("get {key}\r\n").as_bytes());
    let before = snapshot(&rig.stats);
    assert_eq!(
        rig.process(CLIENT.port, &mut frame, &mut emit),
        Fate::Out(SERVERS[owner].port)
    );
    assert_counts(
        "a read",
        &rig.stats,
        &before,
        &[Count::KvForwarded, Count::Switched, Count::Requests(owner)],
    );

    // A cas cannot be checked against one unique on every replica: refused.
    let mut frame = to_vip(format!("cas {key} 0 0 2 77\r\nhi\r\n").as_bytes());
    let before = snapshot(&rig.stats);
    let mut emit = Vec::new();
    assert_eq!(
        rig.process(CLIENT.port, &mut frame, &mut emit),
        Fate::Consumed
    );
    assert_eq!(
        emit,
        vec![from_vip(
            b"SERVER_ERROR cas is not supported by a replicated pool\r\n"
        )]
    );
    assert_counts(
        "a cas",
        &rig.stats,
        &before,
        &[Count::Answer(Answer::ClientError)],
    );

    // A write in a datagram with other requests is refused, counted.
    let mut frame = to_vip(format!("{body}get {key}\r\n").as_bytes());
    let before = snapshot(&rig.stats);
    assert_eq!(
        rig.process(CLIENT.port, &mut frame, &mut emit),
        Fate::Consumed
    );
    assert_counts(
        "a pipelined write",
        &rig.stats,
        &before,
        &[Count::Drop(Drop::ReplicatedPipeline)],
    );
}

#[test]
fn a_udp_write_to_a_key_of_a_warming_server_deletes_it_where_it_was() {
    let fx = Fx::new();
    let mut rig = Rig::new(Mode::L3);
    // s3 leaves and comes back warming up: its keys were on s1 and s2 meanwhile.
    let s3 = rig.pool.spec().servers[2].clone();
    rig.pool.remove_server(2).unwrap();
    let until = rig.now + Duration::from_secs(60);
    assert_eq!(rig.pool.add_warming(s3, Some(until)).unwrap().server, 2);
    let without: Vec<Server> = SERVER_NAMES[..2]
        .iter()
        .map(|n| Server::new(*n, 1))
        .collect();
    let cold = Ring::new(Distribution::Ketama, HashFn::Md5, &without).unwrap();
    let key = fx.key(2, 0);
    let before = cold.locate(key.as_bytes());

    let body = format!("set {key} 0 0 2\r\nhi\r\n");
    let mut frame = to_vip(body.as_bytes());
    let mut emit = Vec::new();
    assert_eq!(
        rig.process(CLIENT.port, &mut frame, &mut emit),
        Fate::Out(SERVERS[2].port),
        "the write goes to the warming owner"
    );
    let mut delete = vec![0x80, 0x14, 0, key.len() as u8, 0, 0, 0, 0];
    delete.extend_from_slice(&(key.len() as u32).to_be_bytes());
    delete.extend_from_slice(&[0; 12]);
    delete.extend_from_slice(key.as_bytes());
    assert_eq!(emit.len(), 1, "{emit:?}");
    assert_eq!(emit[0].dest, Dest::Port(SERVERS[before].port));
    assert_bytes(
        "the delete where it was",
        &emit[0].frame,
        &to_server(before, 0, &delete),
    );

    // A read, or a write of a key no warming server owns, sends nothing more.
    for body in [
        format!("get {key}\r\n"),
        format!("set {} 0 0 1\r\nx\r\n", fx.key(0, 0)),
    ] {
        let mut frame = to_vip(body.as_bytes());
        let mut emit = Vec::new();
        rig.process(CLIENT.port, &mut frame, &mut emit);
        assert!(emit.is_empty(), "{body:?}: {emit:?}");
    }
    // Warm: nothing more either.
    rig.now = until;
    let mut frame = to_vip(body.as_bytes());
    let mut emit = Vec::new();
    rig.process(CLIENT.port, &mut frame, &mut emit);
    assert!(emit.is_empty(), "{emit:?}");
}

#[test]
fn binary_getkq_pipeline_across_servers_is_split_and_merged() {
    let fx = Fx::new();
    let mut rig = Rig::new(Mode::L3);
    let keys = [fx.key(2, 0), fx.key(0, 0), fx.key(1, 0)];
    let mut body = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        body.extend(bin(
            0x80,
            GETKQ,
            0,
            0x100 + i as u32,
            [b"", key.as_bytes(), b""],
        ));
    }
    body.extend(bin(0x80, NOOP, 0, 0xabcd, [b"", b"", b""]));
    // Each get goes alone, made GETK so that a miss answers, with the client's opaque.
    let subs: Vec<(usize, Vec<u8>)> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| {
            let get = bin(0x80, GETK, 0, 0x100 + i as u32, [b"", key.as_bytes(), b""]);
            (server_of(key), get)
        })
        .collect();
    let ids = start_pipelined_split(&mut rig, 0x5151, &body, &subs);
    // The middle key misses; replies arrive last first.
    let flags = [0u8, 0, 0, 3];
    let hit = |i: usize, op: u8| {
        let value = format!("value-{i}");
        bin(
            0x81,
            op,
            0,
            0x100 + i as u32,
            [&flags, keys[i].as_bytes(), value.as_bytes()],
        )
    };
    let miss = bin(0x81, GETK, 1, 0x101, [b"", keys[1].as_bytes(), b""]);
    let replies = [
        (server_of(keys[2]), ids[2], hit(2, GETK)),
        (server_of(keys[1]), ids[1], miss),
        (server_of(keys[0]), ids[0], hit(0, GETK)),
    ];
    let mut merged = hit(0, GETKQ);
    merged.extend(hit(2, GETKQ));
    merged.extend([0x81, NOOP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xab, 0xcd]);
    merged.extend([0; 8]);
    finish_split(&mut rig, &replies, 0x5151, &merged);
}

#[test]
fn meta_quiet_mg_pipeline_across_servers_is_split_and_merged() {
    let fx = Fx::new();
    let mut rig = Rig::new(Mode::L3);
    let keys = [fx.key(1, 1), fx.key(2, 1), fx.key(0, 1)];
    let body: String = keys
        .iter()
        .map(|k| format!("mg {k} s v q k\r\n"))
        .chain(["mn\r\n".to_string()])
        .collect();
    // Sent without `q`, so that a miss answers.
    let subs: Vec<(usize, Vec<u8>)> = keys
        .iter()
        .map(|k| (server_of(k), format!("mg {k} s v k\r\n").into_bytes()))
        .collect();
    let ids = start_pipelined_split(&mut rig, 0x6161, body.as_bytes(), &subs);
    let hit = |i: usize| format!("VA 2 s2 k{}\r\nv{i}\r\n", keys[i]).into_bytes();
    let replies = [
        (server_of(keys[0]), ids[0], hit(0)),
        (server_of(keys[2]), ids[2], hit(2)),
        (
            server_of(keys[1]),
            ids[1],
            format!("EN k{}\r\n", keys[1]).into_bytes(),
        ),
    ];
    // The quiet miss is left out; the switch answers `mn` last.
    let merged = [hit(0), hit(2), b"MN\r\n".to_vec()].concat();
    finish_split(&mut rig, &replies, 0x6161, &merged);
}

#[test]
fn pipelined_gets_mixed_with_other_commands_are_not_split() {
    let fx = Fx::new();
    let mut rig = Rig::new(Mode::L3);
    let (a, b) = (fx.key(0, 0), fx.key(1, 0));
    for body in [
        format!("mg {a} v\r\nmd {b} q\r\nmn\r\n"),
        format!("mg {a} v\r\nmn\r\nmg {b} v\r\n"),
        format!("mg {a} v\r\nget {b}\r\n"),
    ] {
        let mut frame = to_vip(body.as_bytes());
        let mut emit = Vec::new();
        let before = snapshot(&rig.stats);
        assert_eq!(
            rig.process(CLIENT.port, &mut frame, &mut emit),
            Fate::Consumed
        );
        assert!(emit.is_empty(), "{body}");
        assert_counts(
            &body,
            &rig.stats,
            &before,
            &[Count::Drop(Drop::PipelinedMultiServer)],
        );
    }
}

#[test]
fn split_reply_without_a_frame_header_is_dropped() {
    let mut rig = Rig::new(Mode::L3);
    let s = &SERVERS[0];
    let mut f = udp_frame(s.mac, VIP_MAC, (s.ip, MC_PORT), (VIP, AGENT_PORT), b"END");
    let before = snapshot(&rig.stats);
    let mut emit = Vec::new();
    assert_eq!(rig.process(s.port, &mut f, &mut emit), Fate::Consumed);
    assert!(emit.is_empty());
    assert_counts(
        "short split reply",
        &rig.stats,
        &before,
        &[Count::Replies(0), Count::Drop(Drop::BadFrameHeader)],
    );
}

#[test]
fn short_random_frames_never_panic() {
    let mut rng = Lcg(0x5eed_0001);
    let mut rig = Rig::new(Mode::L3);
    for len in 0..=60 {
        for round in 0..64 {
            let mut frame = vec![0u8; len];
            rng.fill(&mut frame);
            // Half of them addressed to the VIP as IPv4, so they get past the first checks.
            if round % 2 == 0 && len >= 14 {
                frame[..6].copy_from_slice(&VIP_MAC.0);
                frame[12..14].copy_from_slice(&EtherType::IPV4.0.to_be_bytes());
                if len > 14 {
                    frame[14] = 0x45;
                }
            }
            let mut emit = Vec::new();
            let in_port = rng.below(PORTS) as u16;
            let fate = rig
                .sw
                .process(in_port, &mut frame, round % 3 != 0, rig.now, &mut emit);
            check_sane(&format!("{len} random bytes"), PORTS, fate, &emit);
        }
    }
}

#[test]
fn mutated_frames_never_panic() {
    let fx = Fx::new();
    let templates: Vec<Vec<u8>> = vec![
        to_vip(format!("get {}\r\n", fx.key(0, 0)).as_bytes()),
        to_vip(format!("get {} {} {}\r\n", fx.key(0, 0), fx.key(1, 0), fx.key(2, 0)).as_bytes()),
        to_vip(format!("gat 10 {} {}\r\n", fx.key(0, 0), fx.key(1, 0)).as_bytes()),
        to_vip(format!("set {} 0 0 3\r\nabc\r\n", fx.key(1, 0)).as_bytes()),
        to_vip(format!("mg {} v\r\n", fx.key(2, 0)).as_bytes()),
        to_vip(b"version\r\n"),
        to_vip(&[0x80, 0x0c, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, b'k']),
        backend_reply(0, SERVERS[0].ip, MC_PORT),
        to_agent(1, 1, 0, 1, b"VALUE x 0 1\r\nX\r\nEND\r\n"),
        arp_request(&CLIENT, VIP),
        tcp_to_vip(),
        server_tcp_to(1, VIP),
        server_tcp_to(1, AGENT),
        arp_reply_to(0, VIP),
        arp_reply_to(0, AGENT),
        from_host(SERVERS[1].mac, (VIP, 40001), (SERVERS[1].ip, MC_PORT)),
    ];
    let mut rng = Lcg(0x5eed_0002);
    let mut rig = Rig::new(Mode::L3);
    let mut l2 = Rig::new(Mode::L2);
    let mut rigs_local = [Rig::local(Mode::L3), Rig::local(Mode::L2)];
    let mut now = rig.now;
    for i in 0..5000 {
        let mut frame = templates[rng.below(templates.len())].clone();
        match rng.below(4) {
            // Flip a few bytes anywhere.
            0 | 1 => {
                for _ in 0..1 + rng.below(6) {
                    let at = rng.below(frame.len());
                    frame[at] = rng.next_u32() as u8;
                }
            }
            // Flip a byte in the headers and fix nothing; or cut the frame short.
            2 => {
                let at = rng.below(PAYLOAD_AT.min(frame.len()));
                frame[at] ^= 1 << rng.below(8);
                frame.truncate(rng.below(frame.len() + 1).max(at));
            }
            // Replace the memcached payload with random bytes, checksums fixed.
            _ => {
                if frame.len() > PAYLOAD_AT && frame[12..14] == EtherType::IPV4.0.to_be_bytes() {
                    let mut payload = vec![0u8; rng.below(300)];
                    rng.fill(&mut payload);
                    let eth = ethernet::Frame::new_checked(&frame[..]).expect("template");
                    let ip = ipv4::Packet::new_checked(eth.payload()).expect("template");
                    let u = udp::Packet::new_checked(ip.payload());
                    if let Ok(u) = u {
                        frame = udp_frame(
                            eth.src(),
                            eth.dst(),
                            (ip.src(), u.src_port()),
                            (ip.dst(), u.dst_port()),
                            &payload,
                        );
                    }
                }
            }
        }
        let in_port = rng.below(PORTS) as u16;
        let csum_ready = rng.below(4) != 0;
        let mut emit = Vec::new();
        let mut copy = frame.clone();
        let fate = rig
            .sw
            .process(in_port, &mut frame, csum_ready, now, &mut emit);
        check_sane(&format!("l3 frame {i}"), PORTS, fate, &emit);
        let fate = l2
            .sw
            .process(in_port, &mut copy, csum_ready, now, &mut emit);
        check_sane(&format!("l2 frame {i}"), PORTS, fate, &emit);
        // With a local port, frames may come from it too.
        let in_port = rng.below(PORTS + 1) as u16;
        for (m, r) in rigs_local.iter_mut().enumerate() {
            let mut copy = frame.clone();
            let fate = r.sw.process(in_port, &mut copy, csum_ready, now, &mut emit);
            check_sane(&format!("local {m} frame {i}"), PORTS + 1, fate, &emit);
        }
        if i % 500 == 499 {
            now += Duration::from_millis(700);
            rig.sw.tick(now, &mut emit);
            l2.sw.tick(now, &mut emit);
            for r in rigs_local.iter_mut() {
                r.sw.tick(now, &mut emit);
            }
        }
    }
}

/// A request carrying a client's data goes to its server or nowhere: before the switch knows
/// the server's port it is dropped and counted, never flooded; the switch asks for its servers
/// with ARP out of every port at its first tick and again while one is unknown; once the
/// server has answered, the request leaves by exactly the server's port.
#[test]
fn routed_request_is_never_flooded_before_its_servers_port_is_known() {
    let fx = Fx::new();
    let (mut sw, stats, now) = fresh_switch(config(Mode::L3));
    let mut emit = Vec::new();
    let input = to_vip(format!("set {} 0 0 6\r\nhunter\r\n", fx.key(1, 0)).as_bytes());

    let before = snapshot(&stats);
    let mut frame = input.clone();
    assert_eq!(
        sw.process(CLIENT.port, &mut frame, true, now, &mut emit),
        Fate::Consumed,
        "a routed request whose server's port is unknown must not leave"
    );
    assert!(emit.is_empty());
    // Held, not dropped: it leaves once its server is heard from.
    assert_counts("set before learning", &stats, &before, &[]);
    assert_eq!(stats::get(&stats.route_held), 1);
    // One for a server that never answers is dropped once held too long.
    let mut lost = to_vip(format!("set {} 0 0 1\r\nx\r\n", fx.key(0, 1)).as_bytes());
    assert_eq!(
        sw.process(CLIENT.port, &mut lost, true, now, &mut emit),
        Fate::Consumed
    );
    assert!(emit.is_empty());

    // A get split across servers sends no part anywhere either.
    let before = snapshot(&stats);
    let mut split = to_vip(format!("get {} {}\r\n", fx.key(0, 0), fx.key(1, 1)).as_bytes());
    assert_eq!(
        sw.process(CLIENT.port, &mut split, true, now, &mut emit),
        Fate::Consumed
    );
    assert!(emit.is_empty(), "no sub-request is flooded");
    assert_counts(
        "split before learning",
        &stats,
        &before,
        &[Count::Drop(Drop::RoutePortUnknown)],
    );

    // The first tick asks for every server; not again before the retry interval, and again
    // after it for those still unknown.
    sw.tick(now, &mut emit);
    assert_emits(
        "first tick",
        &emit,
        &[arp_for_server(0), arp_for_server(1), arp_for_server(2)],
    );
    emit.clear();
    sw.tick(now + Duration::from_millis(10), &mut emit);
    assert!(emit.is_empty(), "asked again too soon");

    let mut answer = arp_reply_to(1, VIP);
    assert_eq!(
        sw.process(SERVERS[1].port, &mut answer, true, now, &mut emit),
        Fate::Consumed
    );
    // The held set goes out of exactly the server's port, rewritten as any routed request.
    assert_eq!(emit.len(), 1, "the held request is released");
    assert_eq!(emit[0].dest, Dest::Port(SERVERS[1].port));
    assert_bytes("held set", &emit[0].frame, &routed(&input, Mode::L3, 1));
    emit.clear();
    let drops_before = stats::get(&stats.drops[Drop::RoutePortUnknown as usize]);
    sw.tick(now + Duration::from_secs(1), &mut emit);
    assert_eq!(
        stats::get(&stats.drops[Drop::RoutePortUnknown as usize]),
        drops_before + 1,
        "the request for the silent server is dropped after a second"
    );
    assert_emits(
        "tick after s2 answered",
        &emit,
        &[arp_for_server(0), arp_for_server(2)],
    );
    emit.clear();

    let before = snapshot(&stats);
    let mut frame = input.clone();
    assert_eq!(
        sw.process(CLIENT.port, &mut frame, true, now, &mut emit),
        Fate::Out(SERVERS[1].port)
    );
    assert_bytes("set after learning", &frame, &routed(&input, Mode::L3, 1));
    assert!(emit.is_empty());
    assert_counts(
        "set after learning",
        &stats,
        &before,
        &[Count::KvForwarded, Count::Switched, Count::Requests(1)],
    );
}

/// A quiet server's port is asked for again before its station would age out, so its
/// requests never meet a MAC table that has forgotten it.
#[test]
fn quiet_servers_are_asked_for_before_they_age_out() {
    let mut rig = Rig::new(Mode::L3);
    let mut emit = Vec::new();
    rig.sw.tick(rig.now + Duration::from_secs(1), &mut emit);
    assert!(emit.is_empty(), "every server was heard from just now");
    // The default ageing time is 300 s: past half of it, each server is asked again.
    rig.sw.tick(rig.now + Duration::from_secs(151), &mut emit);
    assert_emits(
        "half-way to ageing",
        &emit,
        &[arp_for_server(0), arp_for_server(1), arp_for_server(2)],
    );
}

#[test]
fn requests_from_impossible_sources_are_dropped() {
    run(Mode::L3, &bad_source_cases());
    run(Mode::L2, &bad_source_cases()[..7]);
    run_on(Mode::L3, checked, &bad_source_cases());
    // TCP to the VIP (the proxy's traffic) from port 0 does not reach the host either.
    run_on(
        Mode::L3,
        Rig::local,
        &[Case {
            name: "TCP to the VIP from source port 0",
            in_port: CLIENT.port,
            input: |_| tcp_frame(CLIENT.mac, VIP_MAC, (CLIENT.ip, 0), (VIP, MC_PORT), b""),
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::SourcePortZero)],
        }],
    );
}

/// With the check on, everything legitimate works as before: the whole l3, l2 and local-port
/// tables pass unchanged (the host's stack behind the local port sends from the VIP, servers in
/// l2 mode from the VIP they own).
#[test]
fn source_check_lets_legitimate_traffic_through() {
    run_on(Mode::L3, checked, &l3_cases());
    run_on(Mode::L3, checked_local, &local_cases(VIP));
    run_on(Mode::L2, checked_local, &local_cases(AGENT));
}

/// A client on another port sending with the client's address (to have the reply, up to
/// thousands of times the request's size, land on the client) is dropped and counted, and
/// teaches the switch nothing.
#[test]
fn spoofed_sources_are_dropped() {
    let fx = Fx::new();
    let mut cases = vec![
        Case {
            name: "a request to the VIP from the client's address on a server's port",
            in_port: SERVERS[1].port,
            input: |fx| {
                udp_frame(
                    STRANGER,
                    VIP_MAC,
                    (CLIENT.ip, CLIENT_UDP_PORT),
                    (VIP, MC_PORT),
                    &mc(
                        REQ_ID,
                        0,
                        1,
                        format!("get {}\r\n", fx.long_key.0).as_bytes(),
                    ),
                )
            },
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::SourceSpoofed)],
        },
        Case {
            name: "an ARP reply claiming the client's address from another port",
            in_port: SERVERS[2].port,
            input: |_| {
                arp_frame(
                    SERVERS[0].mac,
                    &arp::Repr {
                        operation: arp::Operation::Reply,
                        sender_mac: STRANGER,
                        sender_ip: CLIENT.ip,
                        target_mac: SERVERS[0].mac,
                        target_ip: SERVERS[0].ip,
                    },
                )
            },
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::SourceSpoofed)],
        },
        Case {
            name: "a server's address from the client's port",
            in_port: CLIENT.port,
            input: |_| {
                udp_frame(
                    CLIENT.mac,
                    SERVERS[2].mac,
                    (SERVERS[0].ip, 5000),
                    (SERVERS[2].ip, 6000),
                    b"hello",
                )
            },
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::SourceSpoofed)],
        },
        Case {
            name: "the VIP as a source on a client's port, to anyone",
            in_port: CLIENT.port,
            input: |_| {
                udp_frame(
                    CLIENT.mac,
                    SERVERS[0].mac,
                    (VIP, MC_PORT),
                    (SERVERS[0].ip, 6000),
                    b"hello",
                )
            },
            fate: Fate::Consumed,
            output: None,
            emits: nothing,
            counts: &[Count::Drop(Drop::SourceVip)],
        },
        Case {
            name: "the client's own request is still routed",
            in_port: CLIENT.port,
            input: |fx| to_vip(format!("get {}\r\n", fx.key(1, 0)).as_bytes()),
            fate: Fate::Out(SERVERS[1].port),
            output: Some(|_, input| routed(input, Mode::L3, 1)),
            emits: nothing,
            counts: &[Count::KvForwarded, Count::Switched, Count::Requests(1)],
        },
        Case {
            name: "a server's reply still reaches the client from the VIP",
            in_port: SERVERS[0].port,
            input: |_| backend_reply(0, SERVERS[0].ip, MC_PORT),
            fate: Fate::Out(CLIENT.port),
            output: Some(|_, input| rewritten(input, None, Some(VIP), None)),
            emits: nothing,
            counts: &[Count::Switched, Count::Replies(0)],
        },
    ];
    run_on(Mode::L3, checked, &cases);
    cases.truncate(3);
    run_on(Mode::L3, checked_local, &cases);

    // The forged frame's MAC was not learned: a frame for it is still flooded.
    let mut rig = checked(Mode::L3);
    let mut emit = Vec::new();
    let mut forged = udp_frame(
        STRANGER,
        VIP_MAC,
        (CLIENT.ip, CLIENT_UDP_PORT),
        (VIP, MC_PORT),
        &mc(REQ_ID, 0, 1, format!("get {}\r\n", fx.key(0, 0)).as_bytes()),
    );
    assert_eq!(
        rig.process(SERVERS[1].port, &mut forged, &mut emit),
        Fate::Consumed
    );
    let mut to_stranger = udp_frame(
        CLIENT.mac,
        STRANGER,
        (CLIENT.ip, 5000),
        (Ipv4Addr::new(10, 0, 0, 99), 6000),
        b"hi",
    );
    assert_eq!(
        rig.process(CLIENT.port, &mut to_stranger, &mut emit),
        Fate::Flood
    );
}

/// Addresses are learned where first seen, held while seen, and may move once silent for the
/// ageing time (5 s here); a port's configured prefixes bind their addresses from the start.
#[test]
fn source_bindings_are_learned_held_and_aged() {
    let mut rig = checked_local(Mode::L3);
    let newcomer = Host {
        mac: mac(0x50),
        ip: Ipv4Addr::new(10, 0, 0, 50),
        port: 2,
    };
    let mut emit = Vec::new();
    let t0 = rig.now;
    let mut at = |rig: &mut Rig, port: u16, host: &Host, secs: u64| {
        let mut f = arp_request(host, Ipv4Addr::new(10, 0, 0, 250));
        let before = snapshot(&rig.stats);
        let fate = rig.sw.process(
            port,
            &mut f,
            true,
            t0 + Duration::from_secs(secs),
            &mut emit,
        );
        let spoofed = Count::Drop(Drop::SourceSpoofed).read(&rig.stats)
            - before
                .iter()
                .find(|(c, _)| *c == Count::Drop(Drop::SourceSpoofed))
                .map_or(0, |(_, n)| *n);
        (fate, spoofed)
    };
    // First seen on port 2: bound there.
    assert_eq!(at(&mut rig, 2, &newcomer, 0), (Fate::Flood, 0));
    assert_eq!(at(&mut rig, 0, &newcomer, 1), (Fate::Consumed, 1));
    // Seen on port 2 every 3 s: held past the ageing time.
    for t in [3, 6, 9] {
        assert_eq!(at(&mut rig, 2, &newcomer, t), (Fate::Flood, 0));
    }
    assert_eq!(at(&mut rig, 0, &newcomer, 10), (Fate::Consumed, 1));
    // Silent on port 2 for more than 5 s: it has moved, and port 2 is now the wrong one.
    assert_eq!(at(&mut rig, 0, &newcomer, 15), (Fate::Flood, 0));
    assert_eq!(at(&mut rig, 2, &newcomer, 16), (Fate::Consumed, 1));
    // The tick forgets silent addresses too.
    rig.sw.tick(t0 + Duration::from_secs(30), &mut emit);
    assert_eq!(rig.sw.snapshot().source_table, 0);

    // Configured: the client's port alone may send from 10.0.0.0/30, before anything is seen.
    let text = "local_port = \"\"\nsource_check = true\n\n[switch.source_prefixes]\n\
                p0 = [\"10.0.0.0/30\"]";
    let cfg = config_text(Mode::L3, text, "");
    let stats = Arc::new(Stats::new(PORTS, SERVERS.len()));
    let mut sw = new_switch(&cfg, PORTS, stats.clone()).expect("switch");
    let mut f = to_vip_from((Ipv4Addr::new(10, 0, 0, 2), CLIENT_UDP_PORT));
    assert_eq!(sw.process(1, &mut f, true, t0, &mut emit), Fate::Consumed);
    assert_eq!(stats::get(&stats.drops[Drop::SourceSpoofed as usize]), 1);
    // ... and nothing else: a server's address on the client's port is refused.
    let mut f = arp_request(&SERVERS[0], VIP);
    assert_eq!(sw.process(0, &mut f, true, t0, &mut emit), Fate::Consumed);
    assert_eq!(stats::get(&stats.drops[Drop::SourceSpoofed as usize]), 2);
}

#[test]
fn source_check_keys_are_validated() {
    for (extra, key) in [
        ("source_age_s = 0", "switch.source_age_s"),
        ("source_table_size = 0", "switch.source_table_size"),
        (
            "[switch.source_prefixes]\nnope = [\"10.0.0.0/8\"]",
            "switch.source_prefixes.nope",
        ),
        (
            "[switch.source_prefixes]\np1 = [\"10.0.0.0/40\"]",
            "switch.source_prefixes.p1",
        ),
        (
            "udp_reply_burst_bytes = 1500",
            "switch.udp_reply_burst_bytes",
        ),
    ] {
        let text = format!(
            "[switch]\nports = [\"p0\", \"p1\"]\nlocal_port = \"\"\n{extra}\n\n[vip]\nip = \"{VIP}\"\n\
             mac = \"{VIP_MAC}\"\n\n[pool]\n[[pool.servers]]\naddr = \"10.0.0.11:11211\"\n"
        );
        let e = Config::parse(&text, Path::new("t.toml"))
            .err()
            .unwrap_or_else(|| panic!("{extra}: accepted"))
            .to_string();
        assert!(e.contains(key), "{extra}: {e}");
    }
}

/// At 1000 bytes a second with a 64 KiB burst, a client gets its burst of server replies and
/// then about 1000 bytes a second; further replies are dropped and counted, the switch's own
/// answers included; another client is not affected.
#[test]
fn udp_reply_bytes_are_limited_per_client() {
    let cfg = config_text(
        Mode::L3,
        "local_port = \"\"\nudp_reply_bytes_per_sec = 1000\nudp_reply_burst_bytes = 65536",
        "",
    );
    let mut rig = Rig::with(cfg, PORTS);
    let mut emit = Vec::new();
    let frame_len = big_reply(0, CLIENT.ip, REPLY).len();
    assert_eq!(65536 % frame_len, 0, "replies fill the burst exactly");
    let fits = 65536 / frame_len;
    for i in 0..fits {
        let mut f = big_reply(0, CLIENT.ip, REPLY);
        assert_eq!(
            rig.process(SERVERS[0].port, &mut f, &mut emit),
            Fate::Out(CLIENT.port),
            "reply {i} within the burst"
        );
    }
    let before = snapshot(&rig.stats);
    let mut f = big_reply(0, CLIENT.ip, REPLY);
    assert_eq!(
        rig.process(SERVERS[0].port, &mut f, &mut emit),
        Fate::Consumed
    );
    assert_counts(
        "over the limit",
        &rig.stats,
        &before,
        &[Count::Replies(0), Count::Drop(Drop::ReplyRateLimited)],
    );
    // The switch's own answer to that client is held to the same limit.
    let before = snapshot(&rig.stats);
    let mut version = to_vip(b"version\r\n");
    assert_eq!(
        rig.process(CLIENT.port, &mut version, &mut emit),
        Fate::Consumed
    );
    assert!(emit.is_empty());
    assert_counts(
        "own answer over the limit",
        &rig.stats,
        &before,
        &[
            Count::Answer(Answer::Local),
            Count::Drop(Drop::ReplyRateLimited),
        ],
    );
    // Another client has its own bucket.
    let other = Ipv4Addr::new(10, 0, 0, 2);
    let mut f = big_reply(0, other, REPLY);
    assert_eq!(
        rig.process(SERVERS[0].port, &mut f, &mut emit),
        Fate::Out(CLIENT.port)
    );
    // Three seconds later the first client may have 3000 bytes more: one reply, not two.
    rig.now += Duration::from_secs(3);
    let mut f = big_reply(0, CLIENT.ip, REPLY);
    assert_eq!(
        rig.process(SERVERS[0].port, &mut f, &mut emit),
        Fate::Out(CLIENT.port)
    );
    let mut f = big_reply(0, CLIENT.ip, REPLY);
    assert_eq!(
        rig.process(SERVERS[0].port, &mut f, &mut emit),
        Fate::Consumed
    );
    assert_eq!(rig.sw.snapshot().reply_buckets, 2);
    // Limit 0 turns it off.
    let cfg = config_text(
        Mode::L3,
        "local_port = \"\"\nudp_reply_bytes_per_sec = 0",
        "",
    );
    let mut rig = Rig::with(cfg, PORTS);
    for _ in 0..2 * fits {
        let mut f = big_reply(0, CLIENT.ip, REPLY);
        assert_eq!(
            rig.process(SERVERS[0].port, &mut f, &mut emit),
            Fate::Out(CLIENT.port)
        );
    }
}

#[test]
fn keyed_ports_route_by_the_key_location_header_and_drop_bad_headers() {
    run_on(Mode::L3, Rig::keyed, &keyed_cases(Mode::L3));
    run_on(Mode::L2, Rig::keyed, &keyed_cases(Mode::L2));
    // Without keyed ports, the same datagrams are no business of the key router's.
    let fx = Fx::new();
    let mut rig = Rig::new(Mode::L3);
    let mut frame = lookup(fx.key(1, 0));
    let before = snapshot(&rig.stats);
    let fate = rig.process(CLIENT.port, &mut frame, &mut Vec::new());
    assert_eq!(fate, Fate::Consumed);
    assert_counts(
        "a keyed datagram to a port that is not keyed",
        &rig.stats,
        &before,
        &[Count::Drop(Drop::VipUnhandled)],
    );
}
