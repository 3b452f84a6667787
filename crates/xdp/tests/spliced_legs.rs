//! Spliced TCP legs through the XDP program (needs root, through `BPF_PROG_TEST_RUN`): two
//! switches with the same seed see the same connection, one handing its legs to the program
//! between requests (`Switch::set_leg_offload`), the other keeping them. Every reply segment
//! the program sends on must be the segment the other switch sends the client; every segment
//! it passes up must be unchanged; and once the first switch takes its leg back, both must
//! go on exactly alike, byte for byte, so nothing the program sent was booked wrong.
#![cfg(feature = "bpf")]

use testkit::table::*;
use wire::tcp::{flag, Ends, Repr, Segment};

/// The switch's ports and local port, as interfaces the program may send to.
fn stand_in_ports() -> Vec<(u16, u32, bool)> {
    (0..=PORTS as u16)
        .map(|p| (p, 1000 + u32::from(p), true))
        .collect()
}

/// A switch with the splice on (a local port, `switch.tcp` left at its default).
fn spliced() -> Rig {
    let mut rig = Rig::with(config_text(Mode::L3, "local_port = \"lp\"", ""), PORTS + 1);
    assert!(
        rig.sw.fast_tables().tcp_splice.is_some(),
        "the configuration splices"
    );
    rig
}

const CLIENT_PORT: u16 = 45_000;

fn client_ends() -> Ends {
    Ends {
        src_mac: CLIENT.mac,
        dst_mac: VIP_MAC,
        src_ip: CLIENT.ip,
        dst_ip: VIP,
    }
}

/// The pair of switches, the program, and the connection's numbers as the test learns them.
struct Pair {
    off: Rig,
    kept: Rig,
    fp: xdp::FastPath,
    /// The client's next sequence number, and the switch's next (the client's ack).
    seq: u32,
    ack: u32,
    /// The leg: its port, the switch's next sequence number on it, the server's next.
    leg_port: u16,
    leg_next: u32,
    server_next: u32,
    server: usize,
}

/// Both switches process `frame` from `port`: they must send the same frames.
fn both(pair: &mut Pair, port: u16, frame: &[u8], what: &str) -> Vec<Emit> {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let fa = pair.off.process(port, &mut frame.to_vec(), &mut a);
    let fb = pair.kept.process(port, &mut frame.to_vec(), &mut b);
    assert_eq!(fa, fb, "{what}: the same fate");
    assert_eq!(a.len(), b.len(), "{what}: as many frames sent");
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.dest, y.dest, "{what}: sent the same way");
        assert_eq!(x.frame, y.frame, "{what}: the same bytes");
    }
    b
}

fn to_client(emits: &[Emit]) -> Vec<Segment<'_>> {
    emits
        .iter()
        .filter(|e| e.dest == Dest::Port(CLIENT.port))
        .map(|e| Segment::parse(&e.frame).expect("a segment"))
        .collect()
}

/// A segment from the client to the VIP.
fn from_client(pair: &Pair, flags: u8, payload: &[u8]) -> Vec<u8> {
    Repr::plain(CLIENT_PORT, MC_PORT, pair.seq, pair.ack, flags, 512).frame(&client_ends(), payload)
}

/// A segment from the leg's server to the leg.
fn from_server(pair: &Pair, seq: u32, payload: &[u8]) -> Vec<u8> {
    let s = &SERVERS[pair.server];
    let ends = Ends {
        src_mac: s.mac,
        dst_mac: CLIENT.mac,
        src_ip: s.ip,
        dst_ip: CLIENT.ip,
    };
    Repr::plain(
        MC_PORT,
        pair.leg_port,
        seq,
        pair.leg_next,
        flag::ACK | flag::PSH,
        1000,
    )
    .frame(&ends, payload)
}

/// Opens the connection with `get <key>` as its first request, to the key's server on a leg.
fn open(key: &str, server: usize) -> Pair {
    let mut fp = xdp::FastPath::load().expect("the XDP program loads (needs root)");
    fp.set_ports(&stand_in_ports()).expect("ports");
    let (mut off, kept) = (spliced(), spliced());
    off.sw.set_fast_path(true);
    assert!(off
        .sw
        .set_leg_offload(Box::new(fp.leg_map().expect("fp_legs maps"))));
    let mut pair = Pair {
        off,
        kept,
        fp,
        seq: 7_000,
        ack: 0,
        leg_port: 0,
        leg_next: 0,
        server_next: 90_000,
        server,
    };
    let syn = Repr {
        mss: Some(1460),
        wscale: Some(7),
        ..Repr::plain(CLIENT_PORT, MC_PORT, pair.seq, 0, flag::SYN, 64_000)
    }
    .frame(&client_ends(), &[]);
    let sent = both(&mut pair, CLIENT.port, &syn, "SYN");
    let cookie = to_client(&sent)[0].seq();
    pair.seq += 1;
    pair.ack = cookie.wrapping_add(1);
    let request = format!("get {key}\r\n");
    let first = from_client(&pair, flag::ACK | flag::PSH, request.as_bytes());
    let sent = both(&mut pair, CLIENT.port, &first, "the first request");
    pair.seq += request.len() as u32;
    let leg_syn = sent
        .iter()
        .find(|e| e.dest == Dest::Port(SERVERS[server].port))
        .expect("a SYN to the key's server");
    let leg_syn = Segment::parse(&leg_syn.frame).unwrap();
    assert!(leg_syn.has(flag::SYN));
    pair.leg_port = leg_syn.src_port();
    pair.leg_next = leg_syn.seq().wrapping_add(1);
    let s = &SERVERS[server];
    let syn_ack = Repr {
        mss: Some(1460),
        wscale: Some(7),
        ..Repr::plain(
            MC_PORT,
            pair.leg_port,
            pair.server_next - 1,
            pair.leg_next,
            flag::SYN | flag::ACK,
            2000,
        )
    }
    .frame(
        &Ends {
            src_mac: s.mac,
            dst_mac: CLIENT.mac,
            src_ip: s.ip,
            dst_ip: CLIENT.ip,
        },
        &[],
    );
    let sent = both(&mut pair, s.port, &syn_ack, "the server's SYN-ACK");
    let given: usize = sent
        .iter()
        .filter(|e| e.dest == Dest::Port(s.port))
        .map(|e| Segment::parse(&e.frame).unwrap().payload().len())
        .sum();
    assert_eq!(given, request.len(), "the request went to the leg");
    pair.leg_next = pair.leg_next.wrapping_add(given as u32);
    // The program learns the server as a sender of the switch's and is enabled.
    let tables = pair.off.sw.fast_tables();
    assert_eq!(tables.disabled, None);
    pair.fp.sync(&tables).expect("tables");
    pair
}

/// The program's frame `got` is the segment `want` the switch sends: the same ends, numbers,
/// flags, window and payload, with a right checksum (the IP headers' other fields are each
/// sender's own).
fn same_segment(got: &[u8], want: &Segment<'_>, what: &str) {
    let got = Segment::parse(got).expect("a segment");
    assert!(got.verify_checksum(), "{what}: the checksum holds");
    assert_eq!(
        (got.src_mac(), got.dst_mac(), got.src_ip(), got.dst_ip()),
        (want.src_mac(), want.dst_mac(), want.src_ip(), want.dst_ip()),
        "{what}: addresses"
    );
    assert_eq!(
        (got.src_port(), got.dst_port(), got.seq(), got.ack()),
        (want.src_port(), want.dst_port(), want.seq(), want.ack()),
        "{what}: ports, sequence and acknowledgement"
    );
    assert_eq!(
        (got.flags(), got.window(), got.payload()),
        (want.flags(), want.window(), want.payload()),
        "{what}: flags, window, payload"
    );
}

/// A reply segment the program must send on as the other switch does.
fn sent_on(pair: &mut Pair, seq: u32, payload: &[u8], what: &str) {
    let frame = from_server(pair, seq, payload);
    let port = SERVERS[pair.server].port;
    let run = pair.fp.test_run(&frame, port).expect("test run");
    assert_eq!(
        run.verdict,
        xdp::Verdict::Redirect,
        "{what}: sent on by XDP"
    );
    assert_eq!(
        run.out_port,
        Some(CLIENT.port),
        "{what}: to the client's port"
    );
    let mut b = Vec::new();
    pair.kept.process(port, &mut frame.clone(), &mut b);
    let want = to_client(&b);
    assert_eq!(want.len(), 1, "{what}: the switch sends one segment");
    same_segment(&run.frame, &want[0], what);
}

/// A client's segment the program must send on to the leg as the other switch does.
fn request_sent_on(pair: &mut Pair, frame: &[u8], what: &str) {
    let run = pair.fp.test_run(frame, CLIENT.port).expect("test run");
    assert_eq!(
        run.verdict,
        xdp::Verdict::Redirect,
        "{what}: sent on by XDP"
    );
    let port = SERVERS[pair.server].port;
    assert_eq!(run.out_port, Some(port), "{what}: to the server's port");
    let mut b = Vec::new();
    pair.kept.process(CLIENT.port, &mut frame.to_vec(), &mut b);
    assert_eq!(b.len(), 1, "{what}: the switch sends one segment");
    assert_eq!(
        b[0].dest,
        Dest::Port(port),
        "{what}: the switch sends it there too"
    );
    same_segment(
        &run.frame,
        &Segment::parse(&b[0].frame).expect("a segment"),
        what,
    );
}

/// A reply segment the program must pass up unchanged; both switches then handle it alike.
fn passed_up(pair: &mut Pair, seq: u32, payload: &[u8], what: &str) {
    let frame = from_server(pair, seq, payload);
    let port = SERVERS[pair.server].port;
    let run = pair.fp.test_run(&frame, port).expect("test run");
    assert_eq!(run.verdict, xdp::Verdict::Pass, "{what}: passed up");
    assert_eq!(run.frame, frame, "{what}: unchanged");
    both(pair, port, &frame, what);
}

#[test]
fn xdp_sends_a_legs_replies_on_as_the_switch_does() {
    let fx = Fx::new();
    let (key, key2) = (fx.key(0, 0).to_string(), fx.key(0, 1).to_string());
    let mut pair = open(&key, 0);
    let counted = pair.fp.counters().tcp_replies;

    // A value over three segments; the last cuts `END` in two, which the program cannot
    // frame: it hands that segment, and the next, to the switch.
    let value: Vec<u8> = (0..3000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let mut reply = format!("VALUE {key} 0 {}\r\n", value.len()).into_bytes();
    reply.extend_from_slice(&value);
    reply.extend_from_slice(b"\r\nEND\r\n");
    let cut = reply.len() - 3;
    let (one, two, three) = (&reply[..1400], &reply[1400..cut], &reply[cut..]);
    let s0 = pair.server_next;
    sent_on(&mut pair, s0, one, "the first segment");
    // Sent again (the client did not acknowledge it): the same rewrite.
    sent_on(&mut pair, s0, one, "the first segment again");
    let s1 = s0.wrapping_add(one.len() as u32);
    passed_up(&mut pair, s1, two, "a segment that cuts END");
    let s2 = s1.wrapping_add(two.len() as u32);
    passed_up(&mut pair, s2, three, "the rest of END");
    pair.server_next = s2.wrapping_add(three.len() as u32);
    assert_eq!(pair.fp.counters().tcp_replies - counted, 2);

    // The client acknowledges the reply and asks for another key of that server: the program
    // sends the request on to the leg as the other switch does, and its miss back.
    pair.ack = pair.ack.wrapping_add(reply.len() as u32);
    let counted_in = pair.fp.counters().tcp_requests;
    for n in 0..3 {
        let request = format!("get {key2}\r\n");
        let next = from_client(&pair, flag::ACK | flag::PSH, request.as_bytes());
        request_sent_on(&mut pair, &next, &format!("request {n}"));
        pair.seq += request.len() as u32;
        pair.leg_next = pair.leg_next.wrapping_add(request.len() as u32);
        let sn = pair.server_next;
        sent_on(&mut pair, sn, b"END\r\n", &format!("miss {n}"));
        pair.server_next = sn.wrapping_add(5);
        pair.ack = pair.ack.wrapping_add(5);
    }
    // The client's acknowledgement of the last miss alone moves the leg on.
    let ack = from_client(&pair, flag::ACK, &[]);
    request_sent_on(&mut pair, &ack, "an acknowledgement");
    assert_eq!(pair.fp.counters().tcp_requests - counted_in, 4);
    // A key of another server is the switch's to place: passed up unchanged.
    let other = format!("get {}\r\n", fx.key(1, 0));
    let frame = from_client(&pair, flag::ACK | flag::PSH, other.as_bytes());
    let run = pair.fp.test_run(&frame, CLIENT.port).expect("test run");
    assert_eq!(
        run.verdict,
        xdp::Verdict::Pass,
        "another server's key goes up"
    );
    assert_eq!(run.frame, frame);
    let two_gets = format!("get {key}\r\nget {key2}\r\n");
    let next = from_client(&pair, flag::ACK | flag::PSH, two_gets.as_bytes());
    both(&mut pair, CLIENT.port, &next, "two requests in one segment");
    pair.seq += two_gets.len() as u32;
    pair.leg_next = pair.leg_next.wrapping_add(two_gets.len() as u32);
    let mut answers = format!("VALUE {key} 0 3\r\nabc\r\nEND\r\n").into_bytes();
    answers.extend_from_slice(b"END\r\n");
    let sn = pair.server_next;
    sent_on(&mut pair, sn, &answers, "two replies in one segment");
    pair.server_next = sn.wrapping_add(answers.len() as u32);

    // More bytes than were asked for: the program passes them up, and the switch ends the
    // flow as it would have.
    let sn = pair.server_next;
    passed_up(&mut pair, sn, b"END\r\n", "a reply nobody asked for");

    assert_eq!(pair.fp.counters().tcp_replies - counted, 6);

    // And the flows' ends agree: the client's reset is handled alike.
    pair.ack = pair.ack.wrapping_add(answers.len() as u32);
    let rst = from_client(&pair, flag::RST, &[]);
    both(&mut pair, CLIENT.port, &rst, "the client's reset");
}

#[test]
fn xdp_passes_up_what_a_leg_handed_over_does_not_frame() {
    let fx = Fx::new();
    let key = fx.key(1, 0).to_string();
    let mut pair = open(&key, 1);
    let sn = pair.server_next;
    // Bad value lines, an error, a line cut short: each passed up, unchanged, and the switch
    // left to judge it (a copy of the pair is opened for each, as the switch's judgement ends
    // flows).
    for (n, bad) in [
        b"VALUE k 0 x\r\n".as_slice(),
        b"VALUE k  0 3\r\nabc\r\nEND\r\n",
        b"VALUE k 0 3\nabc\r\nEND\r\n",
        b"SERVER_ERROR out of memory\r\n",
        b"VALUE k 0 3",
        b"VALUE k 0 12345678901\r\n",
    ]
    .iter()
    .enumerate()
    {
        let frame = from_server(&pair, sn, bad);
        let run = pair.fp.test_run(&frame, SERVERS[1].port).expect("test run");
        assert_eq!(run.verdict, xdp::Verdict::Pass, "case {n}: passed up");
        assert_eq!(run.frame, frame, "case {n}: unchanged");
    }
    // A segment with a bad checksum, and one from another MAC, go up unchanged too.
    let mut corrupt = from_server(&pair, sn, b"END\r\n");
    let last = corrupt.len() - 3;
    corrupt[last] ^= 0x20;
    let run = pair.fp.test_run(&corrupt, SERVERS[1].port).unwrap();
    assert_eq!(run.verdict, xdp::Verdict::Pass, "a bad checksum goes up");
    let mut forged = from_server(&pair, sn, b"END\r\n");
    forged[6..12].copy_from_slice(&STRANGER.0);
    let run = pair.fp.test_run(&forged, SERVERS[1].port).unwrap();
    assert_eq!(run.verdict, xdp::Verdict::Pass, "another sender goes up");
    // The server's own reply arriving on another port goes up too.
    let right = from_server(&pair, sn, b"END\r\n");
    let run = pair.fp.test_run(&right, CLIENT.port).unwrap();
    assert_eq!(
        run.verdict,
        xdp::Verdict::Pass,
        "a server's reply on another port"
    );
    // Hosts that lie in the client's name: its address and port, the next sequence number,
    // a `get` of the leg's server, but another MAC, or the client's MAC on another port.
    let get = format!("get {key}\r\n");
    let mut lying = from_client(&pair, flag::ACK | flag::PSH, get.as_bytes());
    lying[6..12].copy_from_slice(&STRANGER.0);
    let run = pair.fp.test_run(&lying, CLIENT.port).unwrap();
    assert_eq!(
        run.verdict,
        xdp::Verdict::Pass,
        "another MAC in the client's name"
    );
    assert_eq!(run.frame, lying);
    let elsewhere = from_client(&pair, flag::ACK | flag::PSH, get.as_bytes());
    let run = pair.fp.test_run(&elsewhere, SERVERS[1].port).unwrap();
    assert_eq!(
        run.verdict,
        xdp::Verdict::Pass,
        "the client's MAC on another port"
    );
    // The right reply is still sent on: nothing above moved the leg.
    sent_on(&mut pair, sn, b"END\r\n", "the miss after them");
}
