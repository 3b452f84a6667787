//! SwitchKV's clients (its section 3.1.1): each request leaves as a whole frame, written on
//! an `AF_PACKET` socket, with its key's hash in the destination MAC behind the get or the
//! other prefix ([`wire::keymac`]) and its backend's address as the destination. The switch
//! sends a read of a key it has a rule for to the key's cache node, and everything else to
//! the backend. The source is the requester's UDP socket, where every reply comes back (from
//! the VIP, the backend or the cache node); the request id says which request it answers.
//!
//! The keyspace's placement comes from the kvswitch configuration the switch runs with: the
//! pool's hash, hash tag, distribution and servers, as a SwitchKV client tracks them.

use std::ffi::CStr;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use wire::ethernet::{self, EtherType, Mac};
use wire::keymac::{self, Kind};
use wire::{ipv4, udp};

/// Where keys live: the hash the pool places a key by and the address of its backend, as the
/// switch's pool places it with every server in.
#[derive(Debug)]
pub struct Placement {
    spec: switch::pool::PoolSpec,
    ring: kv::Ring,
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
        let ring = spec
            .ring()
            .map_err(|e| anyhow!("--switchkv: the pool has no ring: {e}"))?;
        let servers = spec
            .servers
            .iter()
            .map(|s| match s.addr {
                SocketAddr::V4(a) => Ok(a),
                SocketAddr::V6(a) => bail!("--switchkv: server {a} is not IPv4"),
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Placement {
            spec,
            ring,
            servers,
        })
    }

    /// The hash that places `key` and the address of the server that holds it.
    pub fn place(&self, key: &[u8]) -> (u32, SocketAddrV4) {
        let hashed = self.spec.hashed_key(key);
        let hash = match hashed.is_empty() {
            true => 0,
            false => self.ring.key_hash(hashed),
        };
        (hash, self.servers[self.ring.locate_hash(hash)])
    }
}

/// One requester's raw sender: its `AF_PACKET` socket on the interface of its UDP socket's
/// address, which sends and never receives.
pub struct Encoder {
    fd: OwnedFd,
    ifindex: i32,
    src_mac: Mac,
    local: SocketAddrV4,
    placement: Arc<Placement>,
    frame: Vec<u8>,
}

const IP_OFFSET: usize = ethernet::HEADER_LEN;
const UDP_OFFSET: usize = IP_OFFSET + ipv4::HEADER_LEN;
const PAYLOAD_OFFSET: usize = UDP_OFFSET + udp::HEADER_LEN;

impl Encoder {
    /// Opens the sender for requests from `local` (the requester's UDP socket's address);
    /// needs `CAP_NET_RAW`.
    pub fn open(local: SocketAddrV4, placement: Arc<Placement>) -> anyhow::Result<Encoder> {
        let ifname = interface_of(*local.ip())?;
        // Protocol 0: the socket receives nothing.
        // SAFETY: plain socket(2) call; the descriptor is owned at once.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            let e = io::Error::last_os_error();
            return Err(e)
                .context("--switchkv sends raw frames: an AF_PACKET socket needs CAP_NET_RAW");
        }
        // SAFETY: `raw` is a new descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let (ifindex, src_mac) = interface_info(&fd, &ifname)?;
        Ok(Encoder {
            fd,
            ifindex,
            src_mac,
            local,
            placement,
            frame: Vec::with_capacity(2048),
        })
    }

    /// Sends `payload` (a memcached UDP frame header and request) for `key` as a query of
    /// `kind` to the key's backend.
    pub fn send(&mut self, kind: Kind, key: &[u8], payload: &[u8]) -> io::Result<()> {
        let (hash, backend) = self.placement.place(key);
        let udp_len = udp::HEADER_LEN + payload.len();
        if ipv4::HEADER_LEN + udp_len > usize::from(u16::MAX) {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        let f = &mut self.frame;
        f.clear();
        f.resize(PAYLOAD_OFFSET, 0);
        f.extend_from_slice(payload);
        ethernet::Repr {
            src: self.src_mac,
            dst: keymac::encode(kind, hash),
            ethertype: EtherType::IPV4,
        }
        .emit(&mut f[..]);
        ipv4::Repr {
            src: *self.local.ip(),
            dst: *backend.ip(),
            protocol: ipv4::Protocol::UDP,
            payload_len: udp_len as u16,
            ttl: 64,
        }
        .emit(&mut f[IP_OFFSET..]);
        udp::Repr {
            src_port: self.local.port(),
            dst_port: backend.port(),
            payload_len: payload.len() as u16,
        }
        .emit(&mut f[UDP_OFFSET..]);
        if let Ok(mut u) = udp::Packet::new_checked(&mut f[UDP_OFFSET..]) {
            u.fill_checksum(*self.local.ip(), *backend.ip());
        }
        // SAFETY: a zeroed sockaddr_ll is valid; the fields set are plain integers.
        let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        to.sll_family = libc::AF_PACKET as u16;
        to.sll_ifindex = self.ifindex;
        to.sll_halen = 6;
        to.sll_addr[..6].copy_from_slice(&f[..6]);
        // SAFETY: the buffer and the address outlive the call; lengths are theirs.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                f.as_ptr().cast(),
                f.len(),
                0,
                (&to as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// The name of the interface that holds `ip`.
fn interface_of(ip: Ipv4Addr) -> anyhow::Result<String> {
    let mut addrs: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `addrs`, freed below.
    if unsafe { libc::getifaddrs(&mut addrs) } != 0 {
        return Err(io::Error::last_os_error()).context("--switchkv: listing interfaces");
    }
    let mut found = None;
    let mut at = addrs;
    while !at.is_null() {
        // SAFETY: `at` walks the list getifaddrs returned, which is valid until freed.
        let a = unsafe { &*at };
        at = a.ifa_next;
        if a.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: the address is non-null; its family says which sockaddr it is.
        if i32::from(unsafe { (*a.ifa_addr).sa_family }) != libc::AF_INET {
            continue;
        }
        // SAFETY: an AF_INET address is a sockaddr_in.
        let sin = unsafe { &*(a.ifa_addr as *const libc::sockaddr_in) };
        if Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)) == ip {
            // SAFETY: ifa_name is a NUL-terminated string owned by the list.
            found = Some(
                unsafe { CStr::from_ptr(a.ifa_name) }
                    .to_string_lossy()
                    .into_owned(),
            );
            break;
        }
    }
    // SAFETY: freed once, after the last use of the list.
    unsafe { libc::freeifaddrs(addrs) };
    found.ok_or_else(|| anyhow!("--switchkv: no interface holds {ip}, the requests' source"))
}

/// The index and MAC address of interface `name`, through `fd`.
fn interface_info(fd: &OwnedFd, name: &str) -> anyhow::Result<(i32, Mac)> {
    // SAFETY: a zeroed ifreq is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let bytes = name.as_bytes();
    if bytes.len() >= req.ifr_name.len() {
        bail!("--switchkv: interface name {name} is too long");
    }
    for (d, s) in req.ifr_name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: `req` names the interface; the ioctl fills the index.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFINDEX, &mut req) } < 0 {
        return Err(io::Error::last_os_error()).with_context(|| format!("index of {name}"));
    }
    // SAFETY: SIOCGIFINDEX wrote the index into the union.
    let ifindex = unsafe { req.ifr_ifru.ifru_ifindex };
    // SAFETY: as above; SIOCGIFHWADDR fills the hardware address.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFHWADDR, &mut req) } < 0 {
        return Err(io::Error::last_os_error()).with_context(|| format!("MAC of {name}"));
    }
    // SAFETY: SIOCGIFHWADDR wrote a sockaddr into the union.
    let data = unsafe { req.ifr_ifru.ifru_hwaddr.sa_data };
    let mut mac = [0u8; 6];
    for (d, s) in mac.iter_mut().zip(data.iter()) {
        *d = *s as u8;
    }
    Ok((ifindex, Mac(mac)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kv::{Distribution, HashFn};

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
