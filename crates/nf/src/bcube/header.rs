//! The BCube header: a packet wrapped in it and read back, the control messages the cards
//! exchange, and the available-bandwidth query's body.

use super::*;

/// A BCube header, read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: u8,
    /// The route in the order travelled.
    pub route: Vec<u8>,
    /// The payload's IP protocol.
    pub inner: u8,
}

/// The IP packet `packet` (IPv4, no options) as a BCube packet along `route`: protocol
/// [`PROTO`], TTL `route.len() + 1`, the header in front of its payload. `None` for a packet
/// that is not plain IPv4, a route longer than [`MAX_HOPS`] or an empty one.
pub fn encapsulate(packet: &[u8], route: &[u8], kind: u8) -> Option<Vec<u8>> {
    if packet.len() < 20 || packet[0] != 0x45 || route.is_empty() || route.len() > MAX_HOPS {
        return None;
    }
    let total = u16::from_be_bytes([packet[2], packet[3]]) as usize;
    if total < 20 || total > packet.len() || total + HEADER_LEN > u16::MAX as usize {
        return None;
    }
    let mut out = Vec::with_capacity(total + HEADER_LEN);
    out.extend_from_slice(&packet[..20]);
    out.extend_from_slice(&header_bytes(route, kind, packet[9]));
    out.extend_from_slice(&packet[20..total]);
    out[2..4].copy_from_slice(&((total + HEADER_LEN) as u16).to_be_bytes());
    out[8] = route.len() as u8 + 1;
    out[9] = PROTO;
    fill_ip_checksum(&mut out);
    Some(out)
}

/// Reads the header of a BCube packet (IPv4, no options, protocol [`PROTO`]).
pub fn header(packet: &[u8]) -> Option<Header> {
    if packet.len() < 20 + HEADER_LEN || packet[0] != 0x45 || packet[9] != PROTO {
        return None;
    }
    let h = &packet[20..20 + HEADER_LEN];
    let hops = h[9] as usize;
    if hops > MAX_HOPS {
        return None;
    }
    Some(Header {
        kind: h[8],
        route: h[..hops].iter().rev().copied().collect(),
        inner: h[10],
    })
}

/// The IP packet a BCube data packet carries: the header removed, the payload's protocol
/// restored, the TTL set to 64 (the hops used it as an index).
pub fn decapsulate(packet: &[u8]) -> Option<Vec<u8>> {
    let h = header(packet)?;
    let total = u16::from_be_bytes([packet[2], packet[3]]) as usize;
    if h.kind != kind::DATA || total < 20 + HEADER_LEN || total > packet.len() {
        return None;
    }
    let mut out = Vec::with_capacity(total - HEADER_LEN);
    out.extend_from_slice(&packet[..20]);
    out.extend_from_slice(&packet[20 + HEADER_LEN..total]);
    out[2..4].copy_from_slice(&((total - HEADER_LEN) as u16).to_be_bytes());
    out[8] = 64;
    out[9] = h.inner;
    fill_ip_checksum(&mut out);
    Some(out)
}

/// The 12 header bytes for `route` (in the order travelled): its NHAs last hop first, the kind,
/// the hop count and the payload's protocol.
pub(super) fn header_bytes(route: &[u8], kind: u8, inner: u8) -> [u8; HEADER_LEN] {
    let mut header = [0u8; HEADER_LEN];
    for (slot, &nha) in route.iter().rev().enumerate() {
        header[slot] = nha;
    }
    header[8] = kind;
    header[9] = route.len() as u8;
    header[10] = inner;
    header
}

pub(super) fn fill_ip_checksum(packet: &mut [u8]) {
    wire::ipv4::Packet::new_unchecked(&mut packet[..]).fill_checksum();
}

/// A BCube control message: an IP packet from `src` to `dst` carrying `body` after the
/// header, in an Ethernet frame.
pub(super) fn control_frame(
    eth: (Mac, Mac),
    src: Ipv4Addr,
    dst: Ipv4Addr,
    ttl: u8,
    h: &Header,
    body: &[u8],
) -> Vec<u8> {
    let total = 20 + HEADER_LEN + body.len();
    let mut f = Vec::with_capacity(14 + total);
    f.extend_from_slice(&eth.0 .0);
    f.extend_from_slice(&eth.1 .0);
    f.extend_from_slice(&[0x08, 0x00]);
    f.extend_from_slice(&[0x45, 0, 0, 0, 0, 0, 0x40, 0, ttl, PROTO, 0, 0]);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    f.extend_from_slice(&header_bytes(&h.route, h.kind, h.inner));
    f.extend_from_slice(body);
    f[16..18].copy_from_slice(&(total as u16).to_be_bytes());
    fill_ip_checksum(&mut f[14..34]);
    f
}

/// An available-bandwidth query's body: the asker's sequence number and path, and the least
/// bandwidth left on the hops so far, kilobits a second.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Query {
    pub seq: u32,
    pub path: u8,
    pub kbps: u32,
}

pub(super) const QUERY_LEN: usize = 9;

impl Query {
    pub(super) fn bytes(&self) -> [u8; QUERY_LEN] {
        let mut b = [0u8; QUERY_LEN];
        b[..4].copy_from_slice(&self.seq.to_be_bytes());
        b[4] = self.path;
        b[5..].copy_from_slice(&self.kbps.to_be_bytes());
        b
    }

    pub(super) fn read(b: &[u8]) -> Option<Query> {
        let b = b.get(..QUERY_LEN)?;
        Some(Query {
            seq: u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            path: b[4],
            kbps: u32::from_be_bytes([b[5], b[6], b[7], b[8]]),
        })
    }
}
