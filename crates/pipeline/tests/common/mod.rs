//! Frame builders and checksum verifiers shared by the pipeline tests. Checksums here are
//! computed independently of the pipeline, from scratch.
#![allow(dead_code)]

pub const ETH_IPV4: u16 = 0x0800;
pub const ETH_ARP: u16 = 0x0806;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_TCP: u8 = 6;

/// An Ethernet II / IPv4 / UDP (or TCP) frame description.
#[derive(Clone)]
pub struct Ipv4Frame {
    pub dst_mac: [u8; 6],
    pub src_mac: [u8; 6],
    pub src_ip: [u8; 4],
    pub dst_ip: [u8; 4],
    pub proto: u8,
    pub ttl: u8,
    pub sport: u16,
    pub dport: u16,
    pub payload: &'static [u8],
    /// Whether to fill the UDP checksum (false leaves it 0 = absent).
    pub udp_checksum: bool,
}

/// A memcached UDP request: 8-byte frame header then the command.
pub const MC_GET: &[u8] = b"\x00\x01\x00\x00\x00\x01\x00\x00get foo\r\n";

pub fn client() -> Ipv4Frame {
    Ipv4Frame {
        dst_mac: [0x02, 0, 0, 0, 0, 0xfe],
        src_mac: [0x02, 0, 0, 0, 0, 0x01],
        src_ip: [10, 0, 0, 1],
        dst_ip: [10, 0, 0, 100],
        proto: PROTO_UDP,
        ttl: 64,
        sport: 40000,
        dport: 11211,
        payload: MC_GET,
        udp_checksum: true,
    }
}

pub fn fold(mut s: u32) -> u16 {
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

pub fn sum(data: &[u8]) -> u32 {
    data.chunks(2)
        .map(|c| u32::from(c[0]) << 8 | u32::from(*c.get(1).unwrap_or(&0)))
        .sum()
}

impl Ipv4Frame {
    pub fn build(&self) -> Vec<u8> {
        let mut l4 = Vec::new();
        l4.extend_from_slice(&self.sport.to_be_bytes());
        l4.extend_from_slice(&self.dport.to_be_bytes());
        if self.proto == PROTO_UDP {
            l4.extend_from_slice(&((8 + self.payload.len()) as u16).to_be_bytes());
            l4.extend_from_slice(&[0, 0]);
        } else {
            l4.extend_from_slice(&[0; 8]);
            l4.extend_from_slice(&[0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0]);
        }
        l4.extend_from_slice(self.payload);
        let mut ip = vec![0x45, 0];
        ip.extend_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
        ip.extend_from_slice(&[0x12, 0x34, 0x40, 0x00, self.ttl, self.proto, 0, 0]);
        ip.extend_from_slice(&self.src_ip);
        ip.extend_from_slice(&self.dst_ip);
        let c = !fold(sum(&ip));
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        if self.proto == PROTO_UDP && self.udp_checksum {
            let c = l4_checksum(&self.src_ip, &self.dst_ip, self.proto, &l4);
            l4[6..8].copy_from_slice(&(if c == 0 { 0xffff } else { c }).to_be_bytes());
        }
        let mut f = eth(self.dst_mac, self.src_mac, ETH_IPV4);
        f.extend_from_slice(&ip);
        f.extend_from_slice(&l4);
        f
    }
}

/// Checksum over pseudo header and segment (with its checksum field as given).
pub fn l4_checksum(src: &[u8; 4], dst: &[u8; 4], proto: u8, seg: &[u8]) -> u16 {
    let mut s = sum(src) + sum(dst) + u32::from(proto) + seg.len() as u32;
    s += sum(seg);
    !fold(s)
}

pub fn eth(dst: [u8; 6], src: [u8; 6], ethertype: u16) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f
}

/// A broadcast ARP request asking who has `target`.
pub fn arp_request(src_mac: [u8; 6], src_ip: [u8; 4], target: [u8; 4]) -> Vec<u8> {
    let mut f = eth([0xff; 6], src_mac, ETH_ARP);
    f.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&src_ip);
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&target);
    f
}

/// Verifies the IPv4 header checksum and, for UDP with a checksum present, the UDP checksum,
/// recomputing both from scratch. Returns false on any mismatch.
pub fn checksums_ok(f: &[u8]) -> bool {
    if f.len() < 34 || f[12..14] != ETH_IPV4.to_be_bytes() {
        return true;
    }
    if fold(sum(&f[14..34])) != 0xffff {
        return false;
    }
    if f[23] == PROTO_UDP && f.len() >= 42 {
        let csum = u16::from_be_bytes([f[40], f[41]]);
        if csum == 0 {
            return true;
        }
        let mut seg = f[34..].to_vec();
        seg[6] = 0;
        seg[7] = 0;
        let src: [u8; 4] = f[26..30].try_into().unwrap();
        let dst: [u8; 4] = f[30..34].try_into().unwrap();
        let c = l4_checksum(&src, &dst, PROTO_UDP, &seg);
        return csum == if c == 0 { 0xffff } else { c };
    }
    true
}

/// A deterministic linear congruential generator (Knuth's MMIX constants).
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }
}
