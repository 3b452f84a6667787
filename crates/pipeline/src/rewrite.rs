//! In-place header rewrites with checksum repair.
//!
//! Only Ethernet II frames carrying IPv4 (ethertype 0x0800, no VLAN tag) are rewritten at L3;
//! every function checks bounds first and reports "not applicable" rather than panicking.

/// Length of an Ethernet II header.
const ETH_LEN: usize = 14;
const ETHERTYPE_IPV4: [u8; 2] = [0x08, 0x00];
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;

/// Byte offsets inside an IPv4 header.
mod ip {
    pub const TOS: usize = 1;
    pub const FRAG: usize = 6;
    pub const TTL: usize = 8;
    pub const PROTO: usize = 9;
    pub const CHECKSUM: usize = 10;
    pub const SRC: usize = 12;
    pub const DST: usize = 16;
    pub const MIN_LEN: usize = 20;
}

/// Which IPv4 address to rewrite.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Addr {
    Src,
    Dst,
}

/// Outcome of [`dec_ttl`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ttl {
    Decremented,
    Expired,
    NotIpv4,
}

/// Adds `data` as big-endian 16-bit words (odd tail padded with zero) to `sum`.
fn sum_words(data: &[u8], mut sum: u32) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for w in &mut chunks {
        sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    // Fold now and then so a jumbo frame cannot overflow the accumulator.
    fold(sum)
}

/// Folds the carries of a one's-complement sum into 16 bits.
fn fold(mut sum: u32) -> u32 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum
}

fn read16(frame: &[u8], at: usize) -> Option<u16> {
    let b = frame.get(at..at + 2)?;
    Some(u16::from_be_bytes([b[0], b[1]]))
}

fn write16(frame: &mut [u8], at: usize, v: u16) {
    if let Some(b) = frame.get_mut(at..at + 2) {
        b.copy_from_slice(&v.to_be_bytes());
    }
}

/// Incremental checksum update for a 32-bit field changing from `old` to `new` (RFC 1624, eqn. 3).
fn update(hc: u16, old: [u8; 4], new: [u8; 4]) -> u16 {
    let mut sum = u32::from(!hc);
    for i in [0, 2] {
        sum += u32::from(!u16::from_be_bytes([old[i], old[i + 1]]));
        sum += u32::from(u16::from_be_bytes([new[i], new[i + 1]]));
    }
    // `fold` returns at most 0xffff, so the truncation is exact.
    !(fold(sum) as u16)
}

/// Length of the IPv4 header if `frame` is Ethernet II / IPv4 with a header that fits.
fn ipv4_header_len(frame: &[u8]) -> Option<usize> {
    if frame.get(12..14)? != ETHERTYPE_IPV4 {
        return None;
    }
    let vihl = *frame.get(ETH_LEN)?;
    let ihl = usize::from(vihl & 0x0f) * 4;
    if vihl >> 4 != 4 || ihl < ip::MIN_LEN || ETH_LEN + ihl > frame.len() {
        return None;
    }
    Some(ihl)
}

/// Recomputes the IPv4 header checksum from scratch. `ihl` must come from [`ipv4_header_len`].
fn fill_ipv4_checksum(frame: &mut [u8], ihl: usize) {
    write16(frame, ETH_LEN + ip::CHECKSUM, 0);
    let sum = sum_words(&frame[ETH_LEN..ETH_LEN + ihl], 0);
    write16(frame, ETH_LEN + ip::CHECKSUM, !(sum as u16));
}

/// Writes `mac` at `offset` (0 = destination, 6 = source). Returns `false` if the frame is too
/// short to hold an Ethernet header.
pub(crate) fn set_mac(frame: &mut [u8], offset: usize, mac: [u8; 6]) -> bool {
    if frame.len() < ETH_LEN {
        return false;
    }
    frame[offset..offset + 6].copy_from_slice(&mac);
    true
}

/// Rewrites an IPv4 address and repairs the IPv4, UDP and TCP checksums (see
/// [`Action::SetIpv4Dst`](crate::Action::SetIpv4Dst)). Returns `false`, changing nothing, if the
/// frame is not Ethernet II / IPv4.
pub(crate) fn set_ipv4(frame: &mut [u8], which: Addr, new: [u8; 4]) -> bool {
    let Some(ihl) = ipv4_header_len(frame) else {
        return false;
    };
    let at = ETH_LEN
        + match which {
            Addr::Src => ip::SRC,
            Addr::Dst => ip::DST,
        };
    let mut old = [0u8; 4];
    old.copy_from_slice(&frame[at..at + 4]);
    frame[at..at + 4].copy_from_slice(&new);
    // Incremental updates (RFC 1624) keep a checksum that was wrong before the rewrite wrong
    // after it, so a corrupted frame is still caught by its receiver.
    if let Some(hc) = read16(frame, ETH_LEN + ip::CHECKSUM) {
        write16(frame, ETH_LEN + ip::CHECKSUM, update(hc, old, new));
    }
    fix_l4(frame, ihl, old, new);
    true
}

/// Repairs the UDP or TCP checksum after an address change from `old` to `new`, incrementally
/// (RFC 1624): the checksum covers the pseudo header, so only the address's contribution
/// changes, and a checksum that was wrong stays wrong.
fn fix_l4(frame: &mut [u8], ihl: usize, old: [u8; 4], new: [u8; 4]) {
    let h = ETH_LEN;
    let frag = read16(frame, h + ip::FRAG).unwrap_or(0);
    if frag & 0x1fff != 0 {
        return; // a non-first fragment: no L4 header here
    }
    let l4 = h + ihl;
    match frame[h + ip::PROTO] {
        PROTO_UDP => {
            let Some(csum) = read16(frame, l4 + 6) else {
                return;
            };
            if csum == 0 {
                return; // no checksum was computed by the sender; keep it absent
            }
            let fixed = update(csum, old, new);
            // 0 means "absent" in UDP; its one's-complement twin 0xffff means zero.
            write16(frame, l4 + 6, if fixed == 0 { 0xffff } else { fixed });
        }
        PROTO_TCP => {
            if let Some(csum) = read16(frame, l4 + 16) {
                write16(frame, l4 + 16, update(csum, old, new));
            }
        }
        _ => {}
    }
}

/// Where the first `n` bytes (even) of an IPv4 UDP datagram's payload start, and the sum of
/// their 16-bit words complemented (what removing them takes out of the UDP checksum); `None`
/// when the frame has no such datagram: not IPv4 with a whole UDP header, a fragment, lengths
/// that disagree with each other or the frame, or fewer than `n` payload bytes. Reads only:
/// the caller removes the bytes, then calls [`stripped_udp_headers`].
pub(crate) fn udp_strip_at(frame: &[u8], n: u16) -> Option<(usize, u32)> {
    let ihl = ipv4_header_len(frame)?;
    let h = ETH_LEN;
    if frame[h + ip::PROTO] != PROTO_UDP || read16(frame, h + ip::FRAG)? & 0x3fff != 0 {
        return None;
    }
    let total = usize::from(read16(frame, h + 2)?);
    let l4 = h + ihl;
    let udp_len = usize::from(read16(frame, l4 + 4)?);
    let n = usize::from(n);
    if total != ihl + udp_len || h + total > frame.len() || udp_len < 8 + n || n % 2 == 1 {
        return None;
    }
    let at = l4 + 8;
    let mut removed = 0u32;
    for w in frame[at..at + n].chunks_exact(2) {
        removed = fold(removed + u32::from(!u16::from_be_bytes([w[0], w[1]])));
    }
    Some((at, removed))
}

/// After `n` bytes whose complemented word sum is `removed` ([`udp_strip_at`]) were taken
/// from the front of the UDP payload: the IPv4 total length and UDP length shrink by `n` and
/// both checksums are updated incrementally (RFC 1624: a removed word is a word changed to 0;
/// the UDP length counts twice, in the header and the pseudo header), so a checksum that was
/// wrong stays wrong and an absent one stays absent.
pub(crate) fn stripped_udp_headers(frame: &mut [u8], n: u16, removed: u32) {
    let Some(ihl) = ipv4_header_len(frame) else {
        return;
    };
    let h = ETH_LEN;
    let l4 = h + ihl;
    let (Some(total), Some(hc), Some(udp_len), Some(csum)) = (
        read16(frame, h + 2),
        read16(frame, h + ip::CHECKSUM),
        read16(frame, l4 + 4),
        read16(frame, l4 + 6),
    ) else {
        return;
    };
    let (new_total, new_udp_len) = (total.wrapping_sub(n), udp_len.wrapping_sub(n));
    write16(frame, h + 2, new_total);
    let ip_sum = u32::from(!hc) + u32::from(!total) + u32::from(new_total);
    write16(frame, h + ip::CHECKSUM, !(fold(ip_sum) as u16));
    write16(frame, l4 + 4, new_udp_len);
    if csum != 0 {
        let mut sum = u32::from(!csum) + removed;
        sum += 2 * (u32::from(!udp_len) + u32::from(new_udp_len));
        let fixed = !(fold(sum) as u16);
        write16(frame, l4 + 6, if fixed == 0 { 0xffff } else { fixed });
    }
}

/// [`udp_strip_at`], the bytes removed, then [`stripped_udp_headers`], on a frame of the
/// tests' own.
#[cfg(test)]
fn strip_udp_payload(frame: &mut Vec<u8>, n: u16) -> Option<usize> {
    let (at, removed) = udp_strip_at(frame, n)?;
    frame.drain(at..at + usize::from(n));
    stripped_udp_headers(frame, n, removed);
    Some(at)
}

/// The UDP checksum of the `udp_len`-byte datagram at `l4`, computed from scratch. The caller
/// guarantees the datagram and an IPv4 header lie within `frame`.
#[cfg(test)]
fn udp_checksum(frame: &mut [u8], l4: usize, udp_len: usize) -> u16 {
    write16(frame, l4 + 6, 0);
    let h = ETH_LEN;
    let mut sum = sum_words(&frame[h + ip::SRC..h + ip::DST + 4], 0);
    sum += u32::from(PROTO_UDP);
    sum += udp_len as u32; // at most 0xffff: it came from a 16-bit field
    sum = sum_words(&frame[l4..l4 + udp_len], sum);
    !(fold(sum) as u16)
}

/// Writes the DSCP (the top 6 bits of the IPv4 ToS byte, keeping the 2 ECN bits) and repairs
/// the header checksum incrementally (RFC 1624, eqn. 3, on the 16-bit word holding version,
/// IHL and ToS), so a header checksum that was wrong stays wrong. `dscp` is at most
/// [`MAX_DSCP`](crate::MAX_DSCP); higher bits are ignored. Returns `false`, changing nothing, if the frame is
/// not Ethernet II / IPv4.
pub(crate) fn set_dscp(frame: &mut [u8], dscp: u8) -> bool {
    if ipv4_header_len(frame).is_none() {
        return false;
    }
    let at = ETH_LEN + ip::TOS;
    let old_word = [frame[ETH_LEN], frame[at]];
    frame[at] = (dscp << 2) | (frame[at] & 0x03);
    let new_word = [frame[ETH_LEN], frame[at]];
    if let Some(hc) = read16(frame, ETH_LEN + ip::CHECKSUM) {
        let mut sum = u32::from(!hc);
        sum += u32::from(!u16::from_be_bytes(old_word));
        sum += u32::from(u16::from_be_bytes(new_word));
        // `fold` returns at most 0xffff, so the truncation is exact.
        write16(frame, ETH_LEN + ip::CHECKSUM, !(fold(sum) as u16));
    }
    true
}

/// Decrements the IPv4 TTL and recomputes the header checksum. A TTL of 0 or 1 is left alone
/// and reported as expired.
pub(crate) fn dec_ttl(frame: &mut [u8]) -> Ttl {
    let Some(ihl) = ipv4_header_len(frame) else {
        return Ttl::NotIpv4;
    };
    let ttl = frame[ETH_LEN + ip::TTL];
    if ttl <= 1 {
        return Ttl::Expired;
    }
    frame[ETH_LEN + ip::TTL] = ttl - 1;
    fill_ipv4_checksum(frame, ihl);
    Ttl::Decremented
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ethernet + the classic IPv4 header example (checksum 0xb861) + UDP header + 4 bytes.
    fn frame(proto: u8, frag: u16, l4: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&ETHERTYPE_IPV4);
        let total = (20 + l4.len()) as u16;
        f.extend_from_slice(&[0x45, 0x00]);
        f.extend_from_slice(&total.to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(&frag.to_be_bytes());
        f.extend_from_slice(&[0x40, proto, 0, 0, 192, 168, 0, 1, 192, 168, 0, 199]);
        f.extend_from_slice(l4);
        let ihl = ipv4_header_len(&f).unwrap();
        fill_ipv4_checksum(&mut f, ihl);
        f
    }

    fn verify_ip(f: &[u8]) -> bool {
        fold(sum_words(&f[14..34], 0)) == 0xffff
    }

    #[test]
    fn ipv4_checksum_known_value() {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&ETHERTYPE_IPV4);
        f.extend_from_slice(&[
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0, 0, 0xc0, 0xa8, 0x00,
            0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ]);
        fill_ipv4_checksum(&mut f, 20);
        assert_eq!(&f[24..26], &[0xb8, 0x61]);
        assert!(verify_ip(&f));
    }

    #[test]
    fn a_stripped_datagram_has_the_checksums_of_one_sent_without_the_bytes() {
        for payload in [
            &b"kvlHEADERxyzping"[..],
            b"kvlHEADERxyzpin",
            b"kvlHEADERxyz",
        ] {
            let mut udp = vec![0x30, 0x39, 0x2b, 0xcb, 0, 0, 0, 0];
            udp.extend_from_slice(payload);
            let len = udp.len();
            udp[4..6].copy_from_slice(&(len as u16).to_be_bytes());
            let mut f = frame(PROTO_UDP, 0, &udp);
            let c = udp_checksum(&mut f, 34, len);
            write16(&mut f, 40, c);
            let mut want_udp = udp[..8].to_vec();
            want_udp.extend_from_slice(&payload[12..]);
            want_udp[4..6].copy_from_slice(&((len - 12) as u16).to_be_bytes());
            let mut want = frame(PROTO_UDP, 0, &want_udp);
            let c = udp_checksum(&mut want, 34, len - 12);
            write16(&mut want, 40, if c == 0 { 0xffff } else { c });
            let at = strip_udp_payload(&mut f, 12).expect("a datagram to strip");
            assert_eq!(at, 42);
            assert_eq!(f, want, "{payload:?}");
            // Without a checksum, none is made up.
            let mut f = frame(PROTO_UDP, 0, &udp);
            assert!(strip_udp_payload(&mut f, 12).is_some());
            assert_eq!(read16(&f, 40), Some(0));
            assert!(verify_ip(&f));
        }
        // A checksum that was wrong stays wrong.
        let mut udp = vec![0x30, 0x39, 0x2b, 0xcb, 0, 24, 0, 0];
        udp.extend_from_slice(b"kvlHEADERxyzping");
        let mut bad = frame(PROTO_UDP, 0, &udp);
        let c = udp_checksum(&mut bad, 34, 24);
        write16(&mut bad, 40, c ^ 0x0100);
        strip_udp_payload(&mut bad, 12).unwrap();
        let stored = read16(&bad, 40).unwrap();
        assert_ne!(stored, udp_checksum(&mut bad.clone(), 34, 12));
        // What has no such datagram is left alone.
        for (mut f, n) in [
            (frame(PROTO_TCP, 0, &udp), 12),
            (frame(PROTO_UDP, 0x2000, &udp), 12),
            (frame(PROTO_UDP, 0, &udp), 18),
            (frame(PROTO_UDP, 0, &udp[..6]), 2),
        ] {
            let before = f.clone();
            assert_eq!(strip_udp_payload(&mut f, n), None);
            assert_eq!(f, before);
        }
    }

    #[test]
    fn udp_full_and_incremental_agree() {
        let udp = [0x30, 0x39, 0x2b, 0xcb, 0, 12, 0, 0, b'p', b'i', b'n', b'g'];
        let mut a = frame(PROTO_UDP, 0, &udp);
        let c = udp_checksum(&mut a, 34, 12);
        write16(&mut a, 40, c);
        let mut b = a.clone();
        // Full recompute (complete datagram) ...
        assert!(set_ipv4(&mut a, Addr::Dst, [10, 0, 0, 7]));
        // ... must equal the incremental update used for a first fragment with the same bytes.
        write16(&mut b, 20, 0x2000);
        let ihl = ipv4_header_len(&b).unwrap();
        fill_ipv4_checksum(&mut b, ihl);
        assert!(set_ipv4(&mut b, Addr::Dst, [10, 0, 0, 7]));
        assert_eq!(a[40..42], b[40..42]);
        assert!(verify_ip(&a) && verify_ip(&b));
    }

    #[test]
    fn rewrite_matches_recompute_and_keeps_errors_visible() {
        let udp = [0x30, 0x39, 0x2b, 0xcb, 0, 12, 0, 0, b'p', b'i', b'n', b'g'];
        let mut good = frame(PROTO_UDP, 0, &udp);
        let c = udp_checksum(&mut good, 34, 12);
        write16(&mut good, 40, c);
        let mut bad = good.clone();
        bad[45] ^= 0x01; // one payload bit flipped on the way: the checksum no longer matches
        assert!(set_ipv4(&mut good, Addr::Dst, [10, 0, 0, 7]));
        assert!(set_ipv4(&mut bad, Addr::Dst, [10, 0, 0, 7]));
        let stored = read16(&good, 40).unwrap();
        assert_eq!(stored, udp_checksum(&mut good.clone(), 34, 12));
        let stored_bad = read16(&bad, 40).unwrap();
        assert_ne!(stored_bad, udp_checksum(&mut bad.clone(), 34, 12));
        // A header whose checksum was wrong stays wrong too.
        let mut ip_bad = frame(PROTO_UDP, 0, &udp);
        ip_bad[24] ^= 0x10;
        assert!(!verify_ip(&ip_bad));
        assert!(set_ipv4(&mut ip_bad, Addr::Src, [10, 0, 0, 9]));
        assert!(!verify_ip(&ip_bad));
    }

    #[test]
    fn udp_zero_checksum_stays_zero() {
        let udp = [0x30, 0x39, 0x2b, 0xcb, 0, 8, 0, 0];
        let mut f = frame(PROTO_UDP, 0, &udp);
        assert!(set_ipv4(&mut f, Addr::Src, [1, 2, 3, 4]));
        assert_eq!(&f[40..42], &[0, 0]);
        assert_eq!(&f[26..30], &[1, 2, 3, 4]);
    }

    #[test]
    fn tcp_incremental() {
        // TCP header with a checksum over pseudo header + header (no payload).
        let mut tcp = [0u8; 20];
        tcp[12] = 0x50;
        let mut f = frame(PROTO_TCP, 0, &tcp);
        let tcp_sum = |f: &[u8]| {
            let mut s = sum_words(&f[26..34], 0);
            s += u32::from(PROTO_TCP) + 20;
            fold(sum_words(&f[34..54], s))
        };
        let c = !(tcp_sum(&f) as u16);
        write16(&mut f, 50, c);
        assert_eq!(tcp_sum(&f), 0xffff);
        assert!(set_ipv4(&mut f, Addr::Dst, [172, 16, 9, 200]));
        assert_eq!(tcp_sum(&f), 0xffff);
        assert!(verify_ip(&f));
    }

    #[test]
    fn non_first_fragment_only_fixes_ip() {
        let payload = [0xde, 0xad, 0xbe, 0xef, 0, 0, 0x12, 0x34];
        let mut f = frame(PROTO_UDP, 0x0010, &payload);
        assert!(set_ipv4(&mut f, Addr::Dst, [9, 9, 9, 9]));
        assert_eq!(&f[34..], &payload);
        assert!(verify_ip(&f));
    }

    #[test]
    fn ttl() {
        let mut f = frame(PROTO_UDP, 0, &[0; 8]);
        assert_eq!(dec_ttl(&mut f), Ttl::Decremented);
        assert_eq!(f[22], 0x3f);
        assert!(verify_ip(&f));
        f[22] = 1;
        assert_eq!(dec_ttl(&mut f), Ttl::Expired);
        assert_eq!(dec_ttl(&mut [0u8; 13]), Ttl::NotIpv4);
    }

    #[test]
    fn dscp_keeps_ecn_and_a_valid_checksum() {
        let mut f = frame(PROTO_UDP, 0, &[0; 8]);
        f[15] = 0x02; // ECN: ECT(0)
        let ihl = ipv4_header_len(&f).unwrap();
        fill_ipv4_checksum(&mut f, ihl);
        let before = f.clone();
        for dscp in [1, 46, 63, 0] {
            assert!(set_dscp(&mut f, dscp));
            assert_eq!(f[15], (dscp << 2) | 0x02, "dscp {dscp}");
            assert!(verify_ip(&f), "dscp {dscp}");
            let mut full = f.clone();
            fill_ipv4_checksum(&mut full, ihl);
            assert_eq!(
                f[24..26],
                full[24..26],
                "incremental = recomputed, dscp {dscp}"
            );
        }
        // Back at 0 the frame is what it was.
        assert_eq!(f, before);
        // A header that was wrong stays wrong.
        let mut bad = before.clone();
        bad[24] ^= 0x10;
        assert!(set_dscp(&mut bad, 9));
        assert!(!verify_ip(&bad));
    }

    #[test]
    fn dscp_skips_what_is_not_ipv4() {
        let mut arp = vec![0u8; 42];
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        let before = arp.clone();
        assert!(!set_dscp(&mut arp, 5));
        assert_eq!(arp, before);
        assert!(!set_dscp(&mut [0u8; 14], 5));
    }

    #[test]
    fn short_or_foreign_frames_are_left_alone() {
        let mut arp = vec![0u8; 42];
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        let before = arp.clone();
        assert!(!set_ipv4(&mut arp, Addr::Dst, [1, 1, 1, 1]));
        assert_eq!(arp, before);
        let mut short = frame(PROTO_UDP, 0, &[]);
        short.truncate(30);
        assert!(!set_ipv4(&mut short, Addr::Dst, [1, 1, 1, 1]));
        assert!(!set_mac(&mut [0u8; 13], 0, [1; 6]));
        // UDP header cut short: IP is fixed, nothing past the end is touched.
        let mut cut = frame(PROTO_UDP, 0, &[0, 1, 0, 2, 0, 8]);
        assert!(set_ipv4(&mut cut, Addr::Dst, [1, 1, 1, 1]));
        assert!(verify_ip(&cut));
    }
}
