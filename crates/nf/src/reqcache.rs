//! Caching by request id (ServerSwitch, section 6.1), built from the control API and an agent
//! on the CPU path.
//!
//! The protocol: UDP requests to one port whose payload starts with an 8-byte request id; the
//! server's reply comes from that port and starts with the same id. A reply names its content
//! once and for all (the id is the content's name), so a cached reply is never stale.
//!
//! - One `acl` entry copies every reply to the CPU (`mirror`) as it goes on to its client.
//! - The agent keeps the reply and adds an `acl` entry matching its id exactly (protocol, port
//!   and `l4_payload`) that sends its requests to the CPU.
//! - The agent answers those from its copy, out of the port the request came in on. A request
//!   that finds no copy (evicted between the lookup and the answer) goes out of the port the
//!   server's replies came from.
//! - Everything else never reaches the agent: misses go on to the memcached program untouched.

use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;

use wire::frame::{emit_udp_headers, parse_udp, PAYLOAD_OFFSET};

/// The request id's length: the first bytes of the UDP payload.
pub const ID_LEN: usize = 8;

/// What the agent does with one frame the switch handed it.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// A reply to keep: install an entry for `id` (after evicting `evict`'s, if any).
    Keep {
        id: [u8; ID_LEN],
        evict: Option<u64>,
    },
    /// A frame to send out of `port`.
    Send { port: u16, frame: Vec<u8> },
    /// Nothing to do (already cached, not ours, malformed), with why.
    Ignore(&'static str),
}

struct Item {
    reply: Vec<u8>,
    /// The `acl` entry that sends this id's requests to the CPU, once installed.
    entry: Option<u64>,
}

/// The agent's copies, oldest first out.
pub struct ReqCache {
    port: u16,
    capacity: usize,
    items: HashMap<[u8; ID_LEN], Item>,
    order: VecDeque<[u8; ID_LEN]>,
    /// The servers whose replies are kept, and the port each one's replies came in on (for
    /// requests that find no copy).
    servers: HashMap<Ipv4Addr, Option<u16>>,
    /// Entries of replies evicted whose removal failed, removed again at the end.
    orphans: Vec<u64>,
    pub stats: Stats,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    pub hits: u64,
    pub kept: u64,
    pub evicted: u64,
    /// Requests sent to the CPU that found no copy, sent on to the server.
    pub passed: u64,
    pub ignored: u64,
}

fn id_of(payload: &[u8]) -> Option<[u8; ID_LEN]> {
    payload.get(..ID_LEN)?.try_into().ok()
}

impl ReqCache {
    /// A cache of at most `capacity` replies for requests to UDP `port` of `servers`: only
    /// their replies are kept, so no other host can plant one.
    pub fn new(port: u16, capacity: usize, servers: &[Ipv4Addr]) -> ReqCache {
        ReqCache {
            port,
            capacity: capacity.max(1),
            items: HashMap::new(),
            order: VecDeque::new(),
            servers: servers.iter().map(|&ip| (ip, None)).collect(),
            orphans: Vec::new(),
            stats: Stats::default(),
        }
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The `acl` entry ids installed, for removal.
    pub fn entries(&self) -> impl Iterator<Item = u64> + '_ {
        self.items
            .values()
            .filter_map(|i| i.entry)
            .chain(self.orphans.iter().copied())
    }

    /// An evicted reply's entry could not be removed: it is tried again at the end.
    pub fn orphaned(&mut self, entry: u64) {
        self.orphans.push(entry);
    }

    /// Records the entry installed for `id`; false when `id` left meanwhile.
    pub fn installed(&mut self, id: [u8; ID_LEN], entry: u64) -> bool {
        match self.items.get_mut(&id) {
            Some(item) => {
                item.entry = Some(entry);
                true
            }
            None => false,
        }
    }

    /// Forgets `id` (its entry could not be installed).
    pub fn forget(&mut self, id: [u8; ID_LEN]) {
        self.items.remove(&id);
        self.order.retain(|i| *i != id);
    }

    /// One frame from the switch: a mirrored reply (from the port) or a request sent to the
    /// CPU (to the port), which came in on `in_port`.
    pub fn take(&mut self, in_port: u16, frame: &[u8]) -> Step {
        let step = self.step(in_port, frame);
        if matches!(step, Step::Ignore(_)) {
            self.stats.ignored += 1;
        }
        step
    }

    fn step(&mut self, in_port: u16, frame: &[u8]) -> Step {
        let Some((u, payload)) = parse_udp(frame) else {
            return Step::Ignore("not IPv4 UDP");
        };
        let Some(id) = id_of(payload) else {
            return Step::Ignore("shorter than a request id");
        };
        if u.src_port == self.port && u.dst_port != self.port {
            let Some(seen) = self.servers.get_mut(&u.src_ip) else {
                return Step::Ignore("a reply from a host that is not a server");
            };
            *seen = Some(in_port);
            if self.items.contains_key(&id) {
                return Step::Ignore("already cached");
            }
            let evict = if self.items.len() >= self.capacity {
                self.order.pop_front().and_then(|old| {
                    self.stats.evicted += 1;
                    self.items.remove(&old).and_then(|i| i.entry)
                })
            } else {
                None
            };
            self.items.insert(
                id,
                Item {
                    reply: payload.to_vec(),
                    entry: None,
                },
            );
            self.order.push_back(id);
            self.stats.kept += 1;
            return Step::Keep { id, evict };
        }
        if u.dst_port != self.port {
            return Step::Ignore("not the request id port");
        }
        let Some(item) = self.items.get(&id) else {
            return match self.servers.get(&u.dst_ip).copied().flatten() {
                Some(port) => {
                    self.stats.passed += 1;
                    Step::Send {
                        port,
                        frame: frame.to_vec(),
                    }
                }
                None => Step::Ignore("no copy, and no reply seen from that server"),
            };
        };
        // The server's reply, from the server's addresses to the client's.
        let ends = u.reversed();
        let mut reply = vec![0u8; PAYLOAD_OFFSET + item.reply.len()];
        reply[PAYLOAD_OFFSET..].copy_from_slice(&item.reply);
        if !emit_udp_headers(&mut reply, &ends) {
            return Step::Ignore("reply too long");
        }
        self.stats.hits += 1;
        Step::Send {
            port: in_port,
            frame: reply,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use wire::ethernet::Mac;
    use wire::frame::UdpEnds;

    const PORT: u16 = 9100;

    fn frame(src: (u8, u16), dst: (u8, u16), payload: &[u8]) -> Vec<u8> {
        let ends = UdpEnds {
            src_mac: Mac([2, 0, 0, 0, 0, src.0]),
            dst_mac: Mac([2, 0, 0, 0, 0, dst.0]),
            src_ip: Ipv4Addr::new(10, 0, 0, src.0),
            dst_ip: Ipv4Addr::new(10, 0, 0, dst.0),
            src_port: src.1,
            dst_port: dst.1,
        };
        let mut f = vec![0u8; PAYLOAD_OFFSET + payload.len()];
        f[PAYLOAD_OFFSET..].copy_from_slice(payload);
        assert!(emit_udp_headers(&mut f, &ends));
        f
    }

    #[test]
    fn a_kept_reply_answers_its_id_byte_for_byte_as_the_server_did() {
        let mut c = ReqCache::new(PORT, 2, &[Ipv4Addr::new(10, 0, 0, 9)]);
        let id = *b"object-1";
        let reply = frame((9, PORT), (1, 40000), b"object-1 the content");
        assert_eq!(c.take(3, &reply), Step::Keep { id, evict: None });
        assert!(c.installed(id, 77));
        assert_eq!(c.take(3, &reply), Step::Ignore("already cached"));
        let request = frame((1, 40000), (9, PORT), b"object-1");
        assert_eq!(
            c.take(0, &request),
            Step::Send {
                port: 0,
                frame: reply
            }
        );
        assert_eq!(c.entries().collect::<Vec<_>>(), [77]);
    }

    #[test]
    fn the_oldest_goes_first_and_a_request_without_a_copy_goes_to_the_server() {
        let mut c = ReqCache::new(PORT, 2, &[Ipv4Addr::new(10, 0, 0, 9)]);
        for (n, entry) in [(1u8, 10u64), (2, 11)] {
            let id = [b'0' + n; ID_LEN];
            let step = c.take(3, &frame((9, PORT), (1, 40000), &id));
            assert_eq!(step, Step::Keep { id, evict: None });
            c.installed(id, entry);
        }
        let third = [b'3'; ID_LEN];
        assert_eq!(
            c.take(3, &frame((9, PORT), (1, 40000), &third)),
            Step::Keep {
                id: third,
                evict: Some(10)
            }
        );
        let request = frame((1, 40000), (9, PORT), &[b'1'; ID_LEN]);
        assert_eq!(
            c.take(0, &request),
            Step::Send {
                port: 3,
                frame: request.clone()
            }
        );
        assert_eq!((c.stats.evicted, c.stats.passed), (1, 1));
    }

    #[test]
    fn what_is_not_a_request_or_reply_of_the_port_is_ignored_and_counted() {
        let mut c = ReqCache::new(PORT, 2, &[Ipv4Addr::new(10, 0, 0, 9)]);
        let cases: Vec<Vec<u8>> = vec![
            vec![],
            vec![0; 13],
            frame((1, 40000), (9, 53), b"12345678"),
            frame((9, PORT), (1, 40000), b"short"),
            // A request before any reply: no copy, no server port.
            frame((1, 40000), (9, PORT), b"12345678"),
        ];
        for f in &cases {
            assert!(matches!(c.take(0, f), Step::Ignore(_)));
            for len in 0..f.len() {
                assert!(matches!(c.take(0, &f[..len]), Step::Ignore(_)));
            }
        }
        // A reply from a host that is not a server, or to the port itself, is not kept.
        assert!(matches!(
            c.take(0, &frame((7, PORT), (1, 40000), b"12345678")),
            Step::Ignore(_)
        ));
        assert!(matches!(
            c.take(0, &frame((9, PORT), (1, PORT), b"12345678")),
            Step::Ignore(_)
        ));
        assert!(c.is_empty());
        assert!(c.stats.ignored >= cases.len() as u64);
    }
}
