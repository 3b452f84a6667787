//! What the tests that are not one frame each drive: split gets and replicated writes, random
//! frames, sources the switch refuses, and the switch built from a configuration file.

use super::*;

// ---------------------------------------------------------------------------------------------
// Split multi-key gets: a sequence of frames, not one.

/// A datagram from `server`'s memcached port to the split agent (the VIP, in l3 mode).
pub fn to_agent(server: usize, request_id: u16, seq: u16, total: u16, body: &[u8]) -> Vec<u8> {
    let s = &SERVERS[server];
    udp_frame(
        s.mac,
        VIP_MAC,
        (s.ip, MC_PORT),
        (VIP, AGENT_PORT),
        &mc(request_id, seq, total, body),
    )
}

/// The sub-request the switch must send `server` for `keys`, given the id it chose.
pub fn sub_request(server: usize, request_id: u16, keys: &[&str]) -> Vec<u8> {
    let s = &SERVERS[server];
    udp_frame(
        VIP_MAC,
        s.mac,
        (VIP, AGENT_PORT),
        (s.ip, MC_PORT),
        &mc(
            request_id,
            0,
            1,
            format!("get {}\r\n", keys.join(" ")).as_bytes(),
        ),
    )
}

/// Starts a split get of `keys` from the client and checks the sub-requests: one per server,
/// from the VIP's agent port, each out of its server's port. Returns each server's
/// sub-request id.
/// Sends a get for `keys` and checks the sub-requests: one single-key get per distinct key,
/// to the key's server, in the client's order. Returns each distinct key's sub-request id.
pub fn start_split(
    rig: &mut Rig,
    request_id: u16,
    keys: &[&str],
) -> std::collections::HashMap<String, u16> {
    let ring = ring();
    let mut frame = to_vip_raw(&mc(
        request_id,
        0,
        1,
        format!("get {}\r\n", keys.join(" ")).as_bytes(),
    ));
    let mut emit = Vec::new();
    let before = snapshot(&rig.stats);
    assert_eq!(
        rig.process(CLIENT.port, &mut frame, &mut emit),
        Fate::Consumed
    );
    let mut distinct: Vec<&str> = Vec::new();
    for k in keys {
        if !distinct.contains(k) {
            distinct.push(k);
        }
    }
    assert_eq!(
        emit.len(),
        distinct.len(),
        "one sub-request per distinct key"
    );
    let mut ids = std::collections::HashMap::new();
    for (e, key) in emit.iter().zip(&distinct) {
        let server = ring.locate(key.as_bytes());
        let (header, _) = mcudp::Header::parse(&e.frame[PAYLOAD_AT..]).expect("frame header");
        assert_eq!(e.dest, Dest::Port(SERVERS[server].port));
        assert_bytes(
            &format!("sub-request for {key}"),
            &e.frame,
            &sub_request(server, header.request_id, &[key]),
        );
        assert_checksums("sub-request", &e.frame);
        ids.insert(key.to_string(), header.request_id);
    }
    let mut expected = vec![Count::KvSplit];
    expected.extend(
        distinct
            .iter()
            .map(|k| Count::Requests(ring.locate(k.as_bytes()))),
    );
    assert_counts("split start", &rig.stats, &before, &expected);
    let unique: std::collections::HashSet<u16> = ids.values().copied().collect();
    assert_eq!(unique.len(), distinct.len(), "sub-request ids are distinct");
    ids
}

/// The server of `key` on the test ring.
pub fn server_of(key: &str) -> usize {
    ring().locate(key.as_bytes())
}

/// A datagram from the agent port to `server`'s memcached port carrying `body`.
pub fn to_server(server: usize, request_id: u16, body: &[u8]) -> Vec<u8> {
    let s = &SERVERS[server];
    udp_frame(
        VIP_MAC,
        s.mac,
        (VIP, AGENT_PORT),
        (s.ip, MC_PORT),
        &mc(request_id, 0, 1, body),
    )
}

/// A switch whose pool keeps each key on two servers.
pub fn replicated() -> Rig {
    let mut cfg = config(Mode::L3);
    cfg.replicas = 2;
    Rig::with(cfg, PORTS)
}

/// The two replicas of `key` on the test ring, owner first.
pub fn replicas_of(key: &str) -> [usize; 2] {
    let servers: Vec<Server> = SERVER_NAMES.iter().map(|n| Server::new(*n, 1)).collect();
    let ring = Ring::new_stable(HashFn::Md5, &servers).expect("ring");
    let mut out = Vec::new();
    ring.replicas_hash(ring.key_hash(key.as_bytes()), 2, &mut out);
    [out[0], out[1]]
}

/// Sends `body` (one write) to the VIP and checks that it goes, unchanged, to both replicas of
/// `key` from the agent port. Returns the sub-request ids, owner first.
pub fn start_replicated(rig: &mut Rig, key: &str, body: &[u8]) -> Vec<u16> {
    let mut frame = to_vip_raw(&mc(0x5151, 0, 1, body));
    let mut emit = Vec::new();
    let before = snapshot(&rig.stats);
    assert_eq!(
        rig.process(CLIENT.port, &mut frame, &mut emit),
        Fate::Consumed
    );
    let replicas = replicas_of(key);
    assert_eq!(emit.len(), 2, "one copy per replica");
    let mut ids = Vec::new();
    for (e, server) in emit.iter().zip(replicas) {
        let (header, _) = mcudp::Header::parse(&e.frame[PAYLOAD_AT..]).expect("frame header");
        assert_eq!(e.dest, Dest::Port(SERVERS[server].port));
        assert_bytes(
            "copy of the write",
            &e.frame,
            &to_server(server, header.request_id, body),
        );
        assert_checksums("copy of the write", &e.frame);
        ids.push(header.request_id);
    }
    assert_counts(
        "replicated write",
        &rig.stats,
        &before,
        &[
            Count::KvReplicated,
            Count::Requests(replicas[0]),
            Count::Requests(replicas[1]),
        ],
    );
    ids
}

/// A binary request (magic 0x80) or response (0x81) with `extras`, `key` and `value`.
pub fn bin(magic: u8, op: u8, status: u16, opaque: u32, parts: [&[u8]; 3]) -> Vec<u8> {
    let [extras, key, value] = parts;
    let mut out = vec![magic, op];
    out.extend_from_slice(&(key.len() as u16).to_be_bytes());
    out.extend_from_slice(&[extras.len() as u8, 0]);
    out.extend_from_slice(&status.to_be_bytes());
    let body = extras.len() + key.len() + value.len();
    out.extend_from_slice(&(body as u32).to_be_bytes());
    out.extend_from_slice(&opaque.to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 5]);
    out.extend_from_slice(extras);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
    out
}

/// Sends the pipelined requests in `body` and checks the sub-requests: `subs[n]` is the
/// server and payload of the `n`th, byte for byte. Returns their request ids, in order.
pub fn start_pipelined_split(
    rig: &mut Rig,
    request_id: u16,
    body: &[u8],
    subs: &[(usize, Vec<u8>)],
) -> Vec<u16> {
    let mut frame = to_vip_raw(&mc(request_id, 0, 1, body));
    let mut emit = Vec::new();
    let before = snapshot(&rig.stats);
    assert_eq!(
        rig.process(CLIENT.port, &mut frame, &mut emit),
        Fate::Consumed
    );
    assert_eq!(emit.len(), subs.len(), "one sub-request per get");
    let mut ids = Vec::new();
    for (n, (e, (server, payload))) in emit.iter().zip(subs).enumerate() {
        let (header, _) = mcudp::Header::parse(&e.frame[PAYLOAD_AT..]).expect("frame header");
        assert_eq!(e.dest, Dest::Port(SERVERS[*server].port), "sub-request {n}");
        assert_bytes(
            &format!("sub-request {n}"),
            &e.frame,
            &to_server(*server, header.request_id, payload),
        );
        assert_checksums("sub-request", &e.frame);
        ids.push(header.request_id);
    }
    let mut expected = vec![Count::KvSplit];
    expected.extend(subs.iter().map(|(s, _)| Count::Requests(*s)));
    assert_counts("pipelined split start", &rig.stats, &before, &expected);
    ids
}

/// Feeds `replies` (server, request id, body) in the order given and checks that only the
/// last one brings the merged reply `merged` to the client, as request `request_id`.
pub fn finish_split(
    rig: &mut Rig,
    replies: &[(usize, u16, Vec<u8>)],
    request_id: u16,
    merged: &[u8],
) {
    for (i, (server, id, body)) in replies.iter().enumerate() {
        let mut frame = to_agent(*server, *id, 0, 1, body);
        let before = snapshot(&rig.stats);
        let mut emit = Vec::new();
        assert_eq!(
            rig.process(SERVERS[*server].port, &mut frame, &mut emit),
            Fate::Consumed,
            "reply {i}"
        );
        if i + 1 < replies.len() {
            assert!(emit.is_empty(), "reply {i}: nothing before the last part");
            assert_counts(
                &format!("reply {i}"),
                &rig.stats,
                &before,
                &[Count::Replies(*server)],
            );
            continue;
        }
        let want = from_vip_id(request_id, merged);
        assert_eq!(emit.len(), 1, "one merged reply");
        assert_eq!(emit[0].dest, want.dest);
        assert_bytes("merged reply", &emit[0].frame, &want.frame);
        assert_checksums("merged reply", &emit[0].frame);
        assert_counts(
            "merged reply",
            &rig.stats,
            &before,
            &[Count::Replies(*server), Count::Answer(Answer::MergedGet)],
        );
    }
    assert_eq!(rig.sw.snapshot().splits_in_flight, 0);
}

pub const GETK: u8 = 0x0c;
pub const GETKQ: u8 = 0x0d;
pub const NOOP: u8 = 0x0a;

// ---------------------------------------------------------------------------------------------
// Robustness: arbitrary bytes never panic and never produce a bad fate.

/// A 64-bit linear congruential generator (Knuth's MMIX constants): deterministic, seeded.
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next_u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }

    pub fn below(&mut self, n: usize) -> usize {
        self.next_u32() as usize % n
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            *b = self.next_u32() as u8;
        }
    }
}

pub fn check_sane(what: &str, ports: usize, fate: Fate, emit: &[Emit]) {
    if let Fate::Out(p) = fate {
        assert!(usize::from(p) < ports, "{what}: out of port {p}");
    }
    for e in emit {
        if let Dest::Port(p) = e.dest {
            assert!(usize::from(p) < ports, "{what}: emitted to port {p}");
        }
        assert!(
            e.frame.len() >= ethernet::HEADER_LEN,
            "{what}: emitted a runt"
        );
        assert_checksums(what, &e.frame);
    }
}

// ---------------------------------------------------------------------------------------------
// Servers whose port is not known yet.

/// A switch that has heard from the client only: the servers' MACs are configured, but no
/// frame from them has told the switch which port they are behind (right after start).
pub fn fresh_switch(cfg: Config) -> (Switch, Arc<Stats>, Instant) {
    let stats = Arc::new(Stats::new(PORTS, SERVERS.len()));
    let mut sw = new_switch(&cfg, PORTS, stats.clone()).expect("switch");
    let now = Instant::from_secs(1_000);
    let mut emit = Vec::new();
    let mut f = arp_request(&CLIENT, Ipv4Addr::new(10, 0, 0, 250));
    assert_eq!(
        sw.process(CLIENT.port, &mut f, true, now, &mut emit),
        Fate::Flood
    );
    (sw, stats, now)
}

/// The ARP request the switch floods to find server `s`: from the VIP's MAC and the agent
/// address (the VIP in l3 mode).
pub fn arp_for_server(s: usize) -> Emit {
    Emit {
        dest: Dest::Flood,
        frame: arp_frame(
            Mac::BROADCAST,
            &arp::Repr {
                operation: arp::Operation::Request,
                sender_mac: VIP_MAC,
                sender_ip: VIP,
                target_mac: Mac::ZERO,
                target_ip: SERVERS[s].ip,
            },
        ),
    }
}

pub fn assert_emits(what: &str, got: &[Emit], want: &[Emit]) {
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: frames emitted: {:?}",
        got.iter().map(|e| e.dest).collect::<Vec<_>>()
    );
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.dest, w.dest, "{what}: emit {i} destination");
        assert_bytes(&format!("{what}: emit {i}"), &g.frame, &w.frame);
    }
}

// ---------------------------------------------------------------------------------------------
// Sources no host sends from, and the source-address check.

/// A request to the VIP from `src`, arriving from the client's MAC.
pub fn to_vip_from(src: (Ipv4Addr, u16)) -> Vec<u8> {
    udp_frame(
        CLIENT.mac,
        VIP_MAC,
        src,
        (VIP, MC_PORT),
        &mc(REQ_ID, 0, 1, b"get key:0\r\n"),
    )
}

/// Requests to the VIP from sources nothing can answer are dropped, each reason counted;
/// whether or not the source check is on.
pub fn bad_source_cases() -> Vec<Case> {
    let case = |name, input: Input, reason| Case {
        name,
        in_port: CLIENT.port,
        input,
        fate: Fate::Consumed,
        output: None,
        emits: nothing,
        counts: match reason {
            Drop::SourcePortZero => &[Count::Drop(Drop::SourcePortZero)],
            Drop::SourceUnspecified => &[Count::Drop(Drop::SourceUnspecified)],
            Drop::SourceBroadcast => &[Count::Drop(Drop::SourceBroadcast)],
            Drop::SourceMulticast => &[Count::Drop(Drop::SourceMulticast)],
            Drop::SourceLoopback => &[Count::Drop(Drop::SourceLoopback)],
            _ => &[Count::Drop(Drop::SourceVip)],
        },
    };
    vec![
        case(
            "UDP to the VIP from source port 0",
            |_| to_vip_from((CLIENT.ip, 0)),
            Drop::SourcePortZero,
        ),
        case(
            "UDP to the VIP from 0.0.0.0",
            |_| to_vip_from((Ipv4Addr::UNSPECIFIED, CLIENT_UDP_PORT)),
            Drop::SourceUnspecified,
        ),
        case(
            "UDP to the VIP from 255.255.255.255",
            |_| to_vip_from((Ipv4Addr::BROADCAST, CLIENT_UDP_PORT)),
            Drop::SourceBroadcast,
        ),
        case(
            "UDP to the VIP from the VIP network's broadcast address",
            |_| to_vip_from((Ipv4Addr::new(10, 0, 0, 255), CLIENT_UDP_PORT)),
            Drop::SourceBroadcast,
        ),
        case(
            "UDP to the VIP from a multicast address",
            |_| to_vip_from((Ipv4Addr::new(224, 0, 0, 1), CLIENT_UDP_PORT)),
            Drop::SourceMulticast,
        ),
        case(
            "UDP to the VIP from a loopback address",
            |_| to_vip_from((Ipv4Addr::LOCALHOST, CLIENT_UDP_PORT)),
            Drop::SourceLoopback,
        ),
        case(
            "UDP to the VIP from the VIP itself, on a client's port",
            |_| to_vip_from((VIP, CLIENT_UDP_PORT)),
            Drop::SourceVip,
        ),
        case(
            "a split reply to the agent port from port 0",
            |_| {
                udp_frame(
                    SERVERS[0].mac,
                    VIP_MAC,
                    (SERVERS[0].ip, 0),
                    (VIP, AGENT_PORT),
                    &mc(1, 0, 1, b"END\r\n"),
                )
            },
            Drop::SourcePortZero,
        ),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, mut c)| {
        // The split reply comes from the server's port.
        if i == 7 {
            c.in_port = SERVERS[0].port;
        }
        c
    })
    .collect()
}

/// The switch with `switch.source_check` on and no local port; every host has sent one ARP
/// request from its own port, so its address is bound there.
pub fn checked(mode: Mode) -> Rig {
    Rig::with(
        config_text(mode, "local_port = \"\"\nsource_check = true", ""),
        PORTS,
    )
}

/// The same with a local port (port 3).
pub fn checked_local(mode: Mode) -> Rig {
    let agent = match mode {
        Mode::L3 => String::new(),
        Mode::L2 => format!("agent_ip = \"{AGENT}\"\n"),
    };
    Rig::with(
        config_text(
            mode,
            "local_port = \"lp\"\ntcp = \"proxy\"\nsource_check = true\nsource_age_s = 5",
            &agent,
        ),
        PORTS + 1,
    )
}

// ---------------------------------------------------------------------------------------------
// The limit on reply bytes per client.

/// A reply of `len` payload bytes from server `s`'s memcached port to `client`.
pub fn big_reply(s: usize, client: Ipv4Addr, len: usize) -> Vec<u8> {
    let mut body = b"VALUE k 0 0\r\n".to_vec();
    body.resize(len, b'x');
    udp_frame(
        SERVERS[s].mac,
        CLIENT.mac,
        (SERVERS[s].ip, MC_PORT),
        (client, CLIENT_UDP_PORT),
        &mc(REQ_ID, 0, 1, &body),
    )
}

/// Payload bytes of a reply whose frame is 2048 bytes long.
pub const REPLY: usize = 2048 - PAYLOAD_AT - mcudp::LEN;

/// The switch a configuration file describes, as the daemon builds it (seed 0).
pub fn new_switch(
    cfg: &Config,
    ports: usize,
    stats: Arc<Stats>,
) -> Result<Switch, switch::SpecError> {
    let pool = Arc::new(cfg.pool().expect("the pool builds"));
    Switch::new(cfg.switch_spec(ports, 0), pool, stats)
}
