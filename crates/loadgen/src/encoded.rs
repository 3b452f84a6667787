//! SwitchKV's clients (its section 3.1.1): each request leaves as a whole frame, written on
//! an `AF_PACKET` socket, with its key's hash in the destination MAC behind the get or the
//! other prefix ([`wire::keymac`]) and its backend's address as the destination. The switch
//! sends a read of a key it has a rule for to the key's cache node, and everything else to
//! the backend. The source is the requester's UDP socket, where every reply comes back (from
//! the VIP, the backend or the cache node); the request id says which request it answers.
//!
//! The keyspace's placement comes from the kvswitch configuration the switch runs with: the
//! pool's hash, hash tag, distribution and servers, as a SwitchKV client tracks them.

use std::io;
use std::net::{SocketAddr, SocketAddrV4};
use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use wire::ethernet::Mac;
use wire::frame::{UdpEnds, PAYLOAD_OFFSET};
use wire::keymac::{self, Kind};

/// Where keys live: the hash the pool places a key by and the address of its backend, as the
/// switch's pool places it with every server in.
#[derive(Debug)]
pub struct Placement {
    view: Arc<switch::pool::View>,
    servers: Vec<SocketAddrV4>,
}

impl Placement {
    /// The placement of the pool a kvswitch configuration file describes.
    pub fn from_config(path: &Path) -> anyhow::Result<Placement> {
        let cfg = config::Config::load(path)
            .map_err(|e| anyhow!("{e}"))
            .with_context(|| format!("--switchkv: reading {}", path.display()))?;
        Placement::new(cfg.switch_pool_spec())
    }

    /// The placement of `spec`'s pool; its servers must have IPv4 addresses.
    pub fn new(spec: switch::pool::PoolSpec) -> anyhow::Result<Placement> {
        let servers = spec
            .servers
            .iter()
            .map(|s| match s.addr {
                SocketAddr::V4(a) => Ok(a),
                SocketAddr::V6(a) => bail!("--switchkv: server {a} is not IPv4"),
            })
            .collect::<anyhow::Result<_>>()?;
        // Every server in, as the pool stands before any health check.
        let view = switch::pool::Pool::new(spec)
            .map_err(|e| anyhow!("--switchkv: the pool has no ring: {e}"))?
            .view(kv::Instant::ZERO);
        Ok(Placement { view, servers })
    }

    /// The hash that places `key` and the address of the server that holds it.
    pub fn place(&self, key: &[u8]) -> (u32, SocketAddrV4) {
        let hash = self.view.key_hash(key);
        // A pool just built has every server in: its ring always answers.
        let at = self.view.locate_hash(hash).unwrap_or(0);
        (hash, self.servers[at])
    }
}

/// One requester's raw sender: a packet socket on the interface of its UDP socket's address.
pub struct Encoder {
    sender: kvio::FrameSender,
    local: SocketAddrV4,
    placement: Arc<Placement>,
    frame: Vec<u8>,
    key: Vec<u8>,
}

impl Encoder {
    /// Opens the sender for requests from `local` (the requester's UDP socket's address);
    /// needs `CAP_NET_RAW`.
    pub fn open(local: SocketAddrV4, placement: Arc<Placement>) -> anyhow::Result<Encoder> {
        let sender = kvio::FrameSender::on_address(*local.ip())
            .with_context(|| format!("--switchkv sends raw frames from {}", local.ip()))?;
        Ok(Encoder {
            sender,
            local,
            placement,
            frame: Vec::with_capacity(2048),
            key: Vec::with_capacity(64),
        })
    }

    /// Sends `payload` (a memcached UDP frame header and request) for key `prefix<index>` as
    /// a query of `kind` to the key's backend.
    pub fn send(&mut self, kind: Kind, prefix: &str, index: u64, payload: &[u8]) -> io::Result<()> {
        self.key.clear();
        crate::text::write_key(&mut self.key, prefix, index);
        let (hash, backend) = self.placement.place(&self.key);
        let ends = UdpEnds {
            src_mac: Mac(self.sender.mac()),
            dst_mac: keymac::encode(kind, hash),
            src_ip: *self.local.ip(),
            dst_ip: *backend.ip(),
            src_port: self.local.port(),
            dst_port: backend.port(),
        };
        let f = &mut self.frame;
        f.clear();
        f.resize(PAYLOAD_OFFSET, 0);
        f.extend_from_slice(payload);
        if !wire::frame::emit_udp_headers(f, &ends) {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        self.sender.send(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kv::{Distribution, HashFn};
    use std::net::Ipv4Addr;

    #[test]
    fn a_key_is_placed_as_the_switch_places_it() {
        let servers: Vec<SocketAddrV4> = (1..=4)
            .map(|i| SocketAddrV4::new(Ipv4Addr::new(10, 0, 1, i), 11211))
            .collect();
        let spec = switch::SwitchSpec::new(
            6,
            Ipv4Addr::new(10, 0, 0, 100),
            servers
                .iter()
                .map(|&addr| switch::spec::Server { addr, mac: None })
                .collect(),
        )
        .pool_spec(Distribution::Ketama, HashFn::Md5);
        let pool = switch::pool::Pool::new(spec.clone()).expect("pool");
        let view = pool.view(kv::Instant::ZERO);
        let placement = Placement::new(spec).expect("placement");
        let mut owners = std::collections::HashSet::new();
        for i in 0..200 {
            let key = format!("key:{i}");
            let (hash, at) = placement.place(key.as_bytes());
            assert_eq!(hash, view.key_hash(key.as_bytes()));
            let owner = view.locate_hash(hash).expect("a server");
            assert_eq!(at, servers[owner]);
            owners.insert(owner);
        }
        assert_eq!(owners.len(), 4);
    }
}
