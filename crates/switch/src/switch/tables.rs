//! The switch's behaviour as match-action tables, and the choosers of the ring selector.

use super::*;

/// The pool's ring, as the pipeline's hash selector sees it: a key hash to a server.
pub(super) struct RingChooser(pub(super) Arc<View>);

impl Choose for RingChooser {
    fn choose(&self, key_hash: u32) -> Option<usize> {
        // Only reads are routed on the ring in a replicated pool: writes go to every replica.
        self.0.read_locate_hash(key_hash)
    }
}

pub(super) fn bytes_field(offset: u16, len: u8) -> Field {
    Field::Bytes { offset, len }
}

/// The switch's behaviour as tables, after `acl` (ternary, empty: the operator's, whose miss
/// goes on to the program), `kv_cache` (with the cache) and `kv_steer` (exact on a read's
/// one-read mark and key hash, empty: the operator's, for reads steered to a cache node),
/// `kv_backend` (a SwitchKV client's queries to the backend at their destination IP):
/// 0 `arp_vip`: ARP requests for the VIP (or agent address) go to the CPU; ARP replies to the
///   addresses of the host's end of the local port go out of the local port;
/// 1 `kv_route`: UDP to the VIP's memcached port is hashed by key onto the ring, and so is UDP
///   to its keyed ports (by the key its key-location header points at, which is removed); TCP
///   to the memcached port goes out of the local port, to the proxy;
/// 2 `local_in`: TCP from a server's memcached port to the proxy's source address (the servers'
///   side of the proxy's connections) goes out of the local port;
/// 3 `vip_reply` (l3): replies from a backend's memcached port (or a keyed port) leave with the
///   VIP as source;
/// 4 `l2`: learned destination MAC → port, otherwise flood.
pub(super) fn build_tables(p: &mut Pipeline, spec: &SwitchSpec) -> Result<Tables, pipeline::Error> {
    let local = spec.local.as_ref().map(|l| l.port);
    let e = |e: pipeline::Error| e;
    let acl_key = crate::control::ACL_KEY
        .iter()
        .map(|name| {
            crate::control::NAMED_FIELDS
                .iter()
                .find(|(n, _, _)| n == name)
                .map(|(_, f, _)| *f)
                .unwrap_or(Field::InPort)
        })
        .collect();
    let acl = p
        .add_table(TableSpec {
            name: crate::control::ACL.into(),
            kind: MatchKind::Ternary,
            key: acl_key,
            miss: vec![],
        })
        .map_err(e)?;
    p.set_limit(acl, Some(crate::control::TERNARY_TABLE_SIZE))
        .map_err(e)?;
    // First, so that a read the cache may answer meets it before any other table.
    let cache_t = match spec.cache {
        true => Some(
            p.add_table(TableSpec {
                name: "kv_cache".into(),
                kind: MatchKind::Exact,
                key: vec![Field::Reg(REG_CACHE as u8), Field::KeyHash],
                miss: vec![],
            })
            .map_err(e)?,
        ),
        false => None,
    };
    // Reads of one key that an operator sends elsewhere (a SwitchKV cache node): exact on the
    // one-read mark and the key hash, written through the control API; empty, it is skipped.
    let steer_t = p
        .add_table(TableSpec {
            name: crate::control::STEER.into(),
            kind: MatchKind::Exact,
            key: vec![Field::Reg(REG_CACHE as u8), Field::KeyHash],
            miss: vec![],
        })
        .map_err(e)?;
    // A SwitchKV client's queries that no steering entry took: to the backend at their
    // destination IP (an entry per server, kept by `install_members`).
    let backend_t = p
        .add_table(TableSpec {
            name: "kv_backend".into(),
            kind: MatchKind::Exact,
            key: vec![Field::Flags, bytes_field(OFF_IP_DST, 4)],
            miss: vec![],
        })
        .map_err(e)?;
    let arp_t = p
        .add_table(TableSpec {
            name: "arp_vip".into(),
            kind: MatchKind::Exact,
            key: vec![
                bytes_field(OFF_ETHERTYPE, 2),
                bytes_field(OFF_ARP_OP, 2),
                bytes_field(OFF_ARP_TARGET_IP, 4),
            ],
            miss: vec![],
        })
        .map_err(e)?;
    let route_t = p
        .add_table(TableSpec {
            name: "kv_route".into(),
            kind: MatchKind::Exact,
            key: vec![
                Field::Flags,
                bytes_field(OFF_IP_PROTO, 1),
                bytes_field(OFF_IP_DST, 4),
                bytes_field(OFF_L4_DST, 2),
            ],
            miss: vec![],
        })
        .map_err(e)?;
    let local_t = p
        .add_table(TableSpec {
            name: "local_in".into(),
            kind: MatchKind::Exact,
            key: vec![
                Field::Flags,
                bytes_field(OFF_IP_PROTO, 1),
                bytes_field(OFF_IP_SRC, 4),
                bytes_field(OFF_L4_SRC, 2),
                bytes_field(OFF_IP_DST, 4),
            ],
            miss: vec![],
        })
        .map_err(e)?;
    let reply_t = p
        .add_table(TableSpec {
            name: "vip_reply".into(),
            kind: MatchKind::Exact,
            key: vec![
                Field::Flags,
                bytes_field(OFF_IP_PROTO, 1),
                bytes_field(OFF_IP_SRC, 4),
                bytes_field(OFF_L4_SRC, 2),
            ],
            miss: vec![],
        })
        .map_err(e)?;
    let l2 = p
        .add_table(TableSpec {
            name: "l2".into(),
            kind: MatchKind::Exact,
            key: vec![bytes_field(0, 6)],
            miss: vec![Action::Flood],
        })
        .map_err(e)?;
    // Misses fall through to the next table.
    let program = cache_t.unwrap_or(steer_t);
    p.set_miss(acl, vec![Action::Goto(program)]).map_err(e)?;
    if let Some(cache_t) = cache_t {
        p.set_miss(cache_t, vec![Action::Goto(steer_t)])
            .map_err(e)?;
    }
    p.set_miss(steer_t, vec![Action::Goto(backend_t)])
        .map_err(e)?;
    p.set_miss(backend_t, vec![Action::Goto(arp_t)])
        .map_err(e)?;
    p.set_miss(arp_t, vec![Action::Goto(route_t)]).map_err(e)?;
    p.set_miss(route_t, vec![Action::Goto(local_t)])
        .map_err(e)?;
    p.set_miss(local_t, vec![Action::Goto(reply_t)])
        .map_err(e)?;
    p.set_miss(reply_t, vec![Action::Goto(l2)]).map_err(e)?;

    let arp_key = |op: u16, ip: Ipv4Addr| {
        let mut key = Vec::with_capacity(8);
        key.extend_from_slice(&EtherType::ARP.0.to_be_bytes());
        key.extend_from_slice(&op.to_be_bytes());
        key.extend_from_slice(&ip.octets());
        key
    };
    let mut targets = vec![spec.vip.ip];
    if let Some(a) = spec.agent_ip {
        if a != spec.vip.ip {
            targets.push(a);
        }
    }
    for ip in targets {
        p.insert(
            arp_t,
            Entry::exact(arp_key(ARP_REQUEST, ip), vec![Action::ToCpu(CPU_ARP)]),
        )
        .map_err(e)?;
    }

    let ring = p.add_selector(vec![], Box::new(NoChoice)).map_err(e)?;
    // Flags, IP protocol, destination address and port, as `kv_route` matches them.
    let to_vip_port = |flags: u32, proto: ipv4::Protocol, port: u16| {
        let mut key = Vec::with_capacity(11);
        key.extend_from_slice(&flags.to_be_bytes());
        key.push(proto.0);
        key.extend_from_slice(&spec.vip.ip.octets());
        key.extend_from_slice(&port.to_be_bytes());
        key
    };
    // memcached over UDP; a Redis pool's port speaks TCP only (the parser stage drops UDP to it).
    if !spec.redis {
        p.insert(
            route_t,
            Entry::exact(
                to_vip_port(FLAG_PLAIN_UDP, ipv4::Protocol::UDP, spec.vip.port),
                vec![Action::Select(ring)],
            ),
        )
        .map_err(e)?;
    }
    // The keyed ports: the parser stage placed the key its header points at; the header goes.
    for &port in &spec.keyed_ports {
        p.insert(
            route_t,
            Entry::exact(
                to_vip_port(FLAG_PLAIN_UDP, ipv4::Protocol::UDP, port),
                vec![
                    Action::StripUdpPayload(wire::keyloc::LEN as u16),
                    Action::Select(ring),
                ],
            ),
        )
        .map_err(e)?;
    }

    if let Some(local) = local {
        // The host's end has the VIP's MAC: frames sent there need no rewrite. Its own ARP
        // requests are switched like anyone's; the answers are addressed to it.
        for &ip in spec.local.iter().flat_map(|l| &l.addrs) {
            p.insert(
                arp_t,
                Entry::exact(arp_key(ARP_REPLY, ip), vec![Action::Output(local)]),
            )
            .map_err(e)?;
        }
        p.insert(
            route_t,
            Entry::exact(
                to_vip_port(FLAG_PLAIN_TCP, ipv4::Protocol::TCP, spec.vip.port),
                vec![Action::Output(local)],
            ),
        )
        .map_err(e)?;
    }
    let tables = Tables {
        l2,
        ring,
        cache: cache_t,
        steer: steer_t,
        backend: backend_t,
        acl,
        program,
        local_in: local_t,
        vip_reply: reply_t,
    };
    for b in &spec.servers {
        server_entries(p, spec, &tables, b.addr);
    }
    // Frames for the VIP's MAC that no table above claimed are not flooded.
    p.insert(
        l2,
        Entry::exact(
            spec.vip.mac.0.to_vec(),
            vec![Action::Drop(Drop::VipUnhandled.code())],
        ),
    )
    .map_err(e)?;
    Ok(tables)
}

/// The entries one server needs besides its place in the ring: its TCP replies to the proxy's
/// source address go out of the local port (only the servers' memcached ports are reachable
/// through the VIP), and in l3 mode its UDP replies leave with the VIP as source. An entry
/// that exists already (two servers may share an address) is kept.
pub(super) fn server_entries(p: &mut Pipeline, spec: &SwitchSpec, t: &Tables, addr: SocketAddrV4) {
    for (table, key, actions) in server_entry_defs(spec, t, addr) {
        let _ = p.insert(table, Entry::exact(key, actions));
    }
}

/// Removes the `vip_reply` entries [`server_entries`] made for `addr`: a server out of the
/// pool may no longer send UDP in the VIP's name. Those of the keyed ports, which are by
/// address alone, stay with `keep_keyed` (another server at the address is in the pool). Its
/// `local_in` entry stays: the proxy closes its connections to the server once it is out, and
/// the last segments of those closes come back to the proxy's address (they reach nothing
/// else; the host's stack answers anything more with a reset).
pub(super) fn remove_server_entries(
    p: &mut Pipeline,
    spec: &SwitchSpec,
    t: &Tables,
    addr: SocketAddrV4,
    keep_keyed: bool,
) {
    for (table, key, _) in server_entry_defs(spec, t, addr) {
        if table != t.vip_reply {
            continue;
        }
        let port = u16::from_be_bytes([key[key.len() - 2], key[key.len() - 1]]);
        if keep_keyed && port != addr.port() {
            continue;
        }
        if let Some(id) = p.lookup_exact(table, &key) {
            let _ = p.remove(table, id);
        }
    }
}

/// The table, key and actions of each entry a server at `addr` needs.
fn server_entry_defs(
    spec: &SwitchSpec,
    t: &Tables,
    addr: SocketAddrV4,
) -> Vec<(TableId, Vec<u8>, Vec<Action>)> {
    let mut defs = Vec::with_capacity(2);
    if let Some(local) = &spec.local {
        let mut key = Vec::with_capacity(15);
        key.extend_from_slice(&FLAG_PLAIN_TCP.to_be_bytes());
        key.push(ipv4::Protocol::TCP.0);
        key.extend_from_slice(&addr.ip().octets());
        key.extend_from_slice(&addr.port().to_be_bytes());
        key.extend_from_slice(&local.source.octets());
        defs.push((t.local_in, key, vec![Action::Output(local.port)]));
    }
    if spec.mode == Mode::L3 {
        // Its memcached port, and the keyed ports its services answer from.
        let memcached = (!spec.redis).then_some(addr.port());
        for port in memcached
            .into_iter()
            .chain(spec.keyed_ports.iter().copied())
        {
            let mut key = Vec::with_capacity(11);
            key.extend_from_slice(&FLAG_PLAIN_UDP.to_be_bytes());
            key.push(ipv4::Protocol::UDP.0);
            key.extend_from_slice(&addr.ip().octets());
            key.extend_from_slice(&port.to_be_bytes());
            defs.push((
                t.vip_reply,
                key,
                vec![Action::SetIpv4Src(spec.vip.ip.octets()), Action::Goto(t.l2)],
            ));
        }
    }
    defs
}

/// Placeholder chooser until the ring is installed.
pub(super) struct NoChoice;

impl Choose for NoChoice {
    fn choose(&self, _: u32) -> Option<usize> {
        None
    }
}
